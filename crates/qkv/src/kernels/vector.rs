//! One SIMD register of `f32` or `f64` lanes (a `wide` type) and the few operations the
//! microkernels need, including the softmax's exponential.

use wide::{f32x16, f64x8, i32x16, i64x8};

/// A vector of `LANES` scalars that the microkernels compute with.
///
/// `wide` picks the instructions when it is compiled: with AVX-512 enabled, `f32x16` and `f64x8`
/// are one `zmm` register each; on older targets they run as several narrower pieces.
pub trait Vector: Copy + Send + Sync + Default + 'static {
    /// The lane type.
    type Scalar: Copy;
    /// How many scalars one vector holds.
    const LANES: usize;
    /// Every lane set to `x`.
    fn splat(x: Self::Scalar) -> Self;
    /// `self · a + b`, fused where the target has FMA.
    fn mul_add(self, a: Self, b: Self) -> Self;
    /// Lane-wise product.
    fn mul(self, a: Self) -> Self;
    /// Lane-wise sum.
    fn add(self, a: Self) -> Self;
    /// Lane-wise maximum (inputs are never NaN here, so the fast form is exact).
    fn max(self, a: Self) -> Self;
    /// The sum of the lanes.
    fn reduce_add(self) -> Self::Scalar;
    /// The largest lane.
    fn reduce_max(self) -> Self::Scalar;
    /// `exp(self - shift)` lane-wise, for `self <= shift` (the softmax's range); `-inf` gives 0.
    fn exp_shifted(self, shift: Self) -> Self;
    /// The first `LANES` scalars of `s` (any alignment).
    fn load(s: &[Self::Scalar]) -> Self;
    /// The lanes of a slice of vectors, in order.
    fn scalars(v: &[Self]) -> &[Self::Scalar];
    /// The lanes of a slice of vectors, in order, for writing.
    fn scalars_mut(v: &mut [Self]) -> &mut [Self::Scalar];
}

/// Taylor coefficients of `2^f = Σ (ln 2)^i / i! · f^i`, lowest first. On `|f| <= 1/2` the first
/// seven terms leave a relative error below `(ln 2 / 2)^7 / 7! · √2 ≈ 1.7e-7` (about one f32 ulp);
/// the first twelve leave `(ln 2 / 2)^12 / 12! · √2 ≈ 5e-15` for f64. `kernels/tests.rs` measures both.
const fn exp2_taylor<const N: usize>() -> [f64; N] {
    let mut c = [1.0; N];
    let mut i = 1;
    while i < N {
        c[i] = c[i - 1] * std::f64::consts::LN_2 / i as f64;
        i += 1;
    }
    c
}

const EXP2_F32: [f64; 7] = exp2_taylor::<7>();
const EXP2_F64: [f64; 12] = exp2_taylor::<12>();

/// The operations whose code is the same for both vector types, but for the names.
macro_rules! common_ops {
    ($vector:ident, $scalar:ident, $lanes:literal) => {
        #[inline(always)]
        fn splat(x: $scalar) -> Self {
            $vector::splat(x)
        }

        #[inline(always)]
        fn mul_add(self, a: Self, b: Self) -> Self {
            $vector::mul_add(self, a, b)
        }

        #[inline(always)]
        fn mul(self, a: Self) -> Self {
            self * a
        }

        #[inline(always)]
        fn add(self, a: Self) -> Self {
            self + a
        }

        #[inline(always)]
        fn max(self, a: Self) -> Self {
            self.fast_max(a)
        }

        #[inline(always)]
        fn reduce_add(self) -> $scalar {
            $vector::reduce_add(self)
        }

        #[inline(always)]
        fn load(s: &[$scalar]) -> Self {
            let lanes: [$scalar; $lanes] = s[..$lanes].try_into().expect("a full vector of lanes");
            $vector::from(lanes)
        }

        fn scalars(v: &[Self]) -> &[$scalar] {
            wide::bytemuck::cast_slice(v)
        }

        fn scalars_mut(v: &mut [Self]) -> &mut [$scalar] {
            wide::bytemuck::cast_slice_mut(v)
        }
    };
}

impl Vector for f32x16 {
    type Scalar = f32;
    const LANES: usize = 16;

    common_ops!(f32x16, f32, 16);

    #[inline(always)]
    fn reduce_max(self) -> f32 {
        let [a, b]: [wide::f32x8; 2] = wide::bytemuck::cast(self);
        let [c, d]: [wide::f32x4; 2] = wide::bytemuck::cast(a.fast_max(b));
        let e = c.fast_max(d).to_array();
        e[0].max(e[1]).max(e[2].max(e[3]))
    }

    #[inline(always)]
    fn exp_shifted(self, shift: Self) -> Self {
        // exp(x) = 2^t with t = x·log2(e) = n + f, n an integer and |f| <= 1/2. Below t = -127 the
        // result is below f32's normal range; clamping there makes 2^n's bit pattern 0, so such
        // lanes (and -inf) give exactly 0.
        let t = (self - shift) * f32x16::splat(std::f32::consts::LOG2_E);
        let t = t.fast_max(f32x16::splat(-127.0));
        let n = t.round_ties_even();
        let f = t - n;
        let mut p = f32x16::splat(EXP2_F32[6] as f32);
        for &c in EXP2_F32[..6].iter().rev() {
            p = p.mul_add(f, f32x16::splat(c as f32));
        }
        let bits: i32x16 = (n.fast_round_int() + i32x16::splat(127)) << 23_u32;
        p * wide::bytemuck::cast::<i32x16, f32x16>(bits)
    }
}

impl Vector for f64x8 {
    type Scalar = f64;
    const LANES: usize = 8;

    common_ops!(f64x8, f64, 8);

    #[inline(always)]
    fn reduce_max(self) -> f64 {
        self.to_array().into_iter().fold(f64::NEG_INFINITY, f64::max)
    }

    #[inline(always)]
    fn exp_shifted(self, shift: Self) -> Self {
        // As for f32, with f64's exponent range: below t = -1023, 2^n's bit pattern is 0.
        let t = (self - shift) * f64x8::splat(std::f64::consts::LOG2_E);
        let t = t.fast_max(f64x8::splat(-1023.0));
        let n = t.round_ties_even();
        let f = t - n;
        let mut p = f64x8::splat(EXP2_F64[11]);
        for &c in EXP2_F64[..11].iter().rev() {
            p = p.mul_add(f, f64x8::splat(c));
        }
        let bits: i64x8 = (n.fast_round_int() + i64x8::splat(1023)) << 52_u32;
        p * wide::bytemuck::cast::<i64x8, f64x8>(bits)
    }
}
