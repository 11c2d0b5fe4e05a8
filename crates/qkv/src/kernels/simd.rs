//! The per-level SIMD primitives the microkernels are written in: one register of `T` lanes and
//! the dozen operations on it, among them the softmax's `2^t`, built here once from the others
//! ([`exp2_by_rounding`]) or, at AVX-512, from instructions that split and scale its argument.

/// One instruction-set level's vector of `T`, as a zero-sized token that proves the level runs on
/// this CPU (see `Isa` in `kernels.rs`): every method takes `self`, so no primitive can be
/// reached without the proof.
///
/// Implementations are `#[inline(always)]` wrappers of one or two instructions each. Called from
/// a level's `#[target_feature]` entry function (the kernels are `#[inline(always)]` too), they
/// inline into it and compile to that level's instructions.
pub(crate) trait Simd<T: Exp2>: Copy + 'static {
    /// One register of `LANES` scalars.
    type V: Copy;
    /// Scalars per register.
    const LANES: usize;
    /// All lanes zero.
    fn zero(self) -> Self::V;
    /// Every lane set to `x`.
    fn splat(self, x: T) -> Self::V;
    /// The first `LANES` scalars of `s` (any alignment); panics if `s` is shorter.
    fn load(self, s: &[T]) -> Self::V;
    /// Writes the lanes to the first `LANES` scalars of `s`; panics if `s` is shorter.
    fn store(self, v: Self::V, s: &mut [T]);
    /// `a · b + c`, fused where the level has FMA.
    fn mul_add(self, a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    /// Lane-wise product.
    fn mul(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise sum.
    fn add(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise difference `a - b`.
    fn sub(self, a: Self::V, b: Self::V) -> Self::V;
    /// Lane-wise maximum (inputs are never NaN here, so the fast form is exact).
    fn max(self, a: Self::V, b: Self::V) -> Self::V;
    /// Folds `|x|` into `acc` lane-wise, comparing the bit patterns of the absolute values: for
    /// non-negative floats bit order is value order, and NaN and infinity lie above every finite
    /// value, so a non-finite element always survives (a float maximum can drop a NaN).
    fn fold_magnitude(self, acc: Self::V, x: Self::V) -> Self::V;
    /// The sum of the lanes.
    fn reduce_add(self, v: Self::V) -> T;
    /// The largest lane.
    fn reduce_max(self, v: Self::V) -> T;
    /// The sums of the lanes of four vectors: the levels with horizontal adds share the work of
    /// the four reductions.
    #[inline(always)]
    fn reduce_add4(self, v: [Self::V; 4]) -> [T; 4] {
        v.map(|v| self.reduce_add(v))
    }
    /// `2^t` lane-wise for `t` at most `ln(REFERENCE_HEADROOM) · log2(e)` (the softmax's range),
    /// to [`Exp2::COEFFICIENTS`]' precision: `t = n + f` with `n` the nearest integer, `2^f` the
    /// polynomial ([`exp2_polynomial`]). A `t` below `T::FLOOR + 1/2` (and `-inf`) gives exactly
    /// 0, so that results deep in the subnormal range, slow on some CPUs, never reach the sums and
    /// `P·V`. Most levels build `2^n` in the exponent bits ([`exp2_by_rounding`]); AVX-512 splits
    /// `t` and scales by `2^n` with instructions of its own.
    fn exp2(self, t: Self::V) -> Self::V;
}

/// Loading `LANES` stored elements of type `E` into one register of `T`: the only place the
/// kernels meet the format keys and values are stored in. Storing them as `T` is a plain load
/// (the blanket implementation); each level implements its half-precision formats, widened to
/// f32 as they are loaded, so that a kernel reading them reads half the bytes.
pub(crate) trait Load<T: Exp2, E>: Simd<T> {
    /// The first `LANES` elements of `s`, widened to `T`; panics if `s` is shorter.
    fn load_stored(self, s: &[E]) -> Self::V;
}

impl<T: Exp2, S: Simd<T>> Load<T, T> for S {
    #[inline(always)]
    fn load_stored(self, s: &[T]) -> Self::V {
        self.load(s)
    }
}

/// The constants of the softmax's `2^t` for one element type.
pub trait Exp2: Copy + 'static {
    /// `log2(e)`.
    const LOG2_E: Self;
    /// The smallest `t` kept: `2^FLOOR` has the bit pattern 0, so lower arguments (and `-inf`) give
    /// exactly 0.
    const FLOOR: Self;
    /// `1.5 · 2^MANTISSA_BITS + exponent bias`: adding it rounds `t` to the nearest integer `n`
    /// (ties to even) and leaves `n + bias` in the low mantissa bits.
    const ROUNDING: Self;
    /// Taylor coefficients of `2^f` on `|f| <= 1/2`, highest degree first (Horner order).
    const COEFFICIENTS: &'static [Self];
}

/// Taylor coefficients of `2^f = Σ (ln 2)^i / i! · f^i`, highest degree first. On `|f| <= 1/2`
/// `N` terms leave a relative error below `(ln 2 / 2)^N / N! · √2`: seven terms give 1.7e-7 (about
/// one f32 ulp), twelve give 5e-15 for f64. `kernels/tests.rs` measures them.
const fn exp2_taylor<const N: usize>() -> [f64; N] {
    let mut c = [1.0; N];
    let mut i = 1;
    while i < N {
        c[N - 1 - i] = c[N - i] * std::f64::consts::LN_2 / i as f64;
        i += 1;
    }
    c
}

/// [`exp2_taylor`] rounded to f32.
const fn exp2_taylor_f32<const N: usize>() -> [f32; N] {
    let wide = exp2_taylor::<N>();
    let mut c = [0.0; N];
    let mut i = 0;
    while i < N {
        c[i] = wide[i] as f32;
        i += 1;
    }
    c
}

const EXP2_F64: [f64; 12] = exp2_taylor::<12>();
const EXP2_F32: [f32; 7] = exp2_taylor_f32::<7>();
/// For weights that are rounded to bf16 (the pair levels'): a quartic for `2^f` on `0 <= f < 1`
/// with the constant term 1 (so that `exp(0)`, a row's largest weight, is exactly 1) and the
/// others fitted for the least largest relative error: 3.0e-6 evaluated in f32, where bf16's half
/// ulp is 2^-9 = 2.0e-3 and Taylor's five terms gave 5.9e-5. Two terms fewer than f32's. A cubic
/// (1.0e-4) moved the logsumexp, which the weights' sums make and which stays f32, past the f32
/// tolerance of the engine tests.
pub(crate) const EXP2_FOR_BF16: [f32; 5] = [0.013_426_605, 0.052_242_603, 0.241_280_14, 0.693_044_84, 1.0];

impl Exp2 for f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const FLOOR: f32 = -127.0;
    const ROUNDING: f32 = 12_582_912.0 + 127.0;
    const COEFFICIENTS: &'static [f32] = &EXP2_F32;
}

impl Exp2 for f64 {
    const LOG2_E: f64 = std::f64::consts::LOG2_E;
    const FLOOR: f64 = -1023.0;
    const ROUNDING: f64 = 6_755_399_441_055_744.0 + 1023.0;
    const COEFFICIENTS: &'static [f64] = &EXP2_F64;
}

/// `exp(x - shift)` lane-wise, for `x <= shift` (the softmax's range); `-inf` gives exactly 0.
///
/// `exp(x) = 2^t` with `t = x · log2(e)` ([`Simd::exp2`], which gives exactly 0 for `t` below
/// `T::FLOOR + 1/2`).
#[inline(always)]
pub(crate) fn exp_shifted<T: Exp2, S: Simd<T>>(simd: S, x: S::V, shift: S::V) -> S::V {
    simd.exp2(simd.mul(simd.sub(x, shift), simd.splat(T::LOG2_E)))
}

/// `2^f` for `|f| <= 1/2`: [`Exp2::COEFFICIENTS`] in Horner's order.
#[inline(always)]
pub(crate) fn exp2_polynomial<T: Exp2, S: Simd<T>>(simd: S, f: S::V) -> S::V {
    let (&highest, rest) = T::COEFFICIENTS.split_first().expect("a polynomial");
    let mut p = simd.splat(highest);
    for &c in rest {
        p = simd.mul_add(p, f, simd.splat(c));
    }
    p
}

/// [`Simd::exp2`] from the primitives: `t` clamped at `T::FLOOR`, where `2^n`'s bit pattern is 0;
/// `T::ROUNDING` added rounds it to `n` in the low mantissa bits, from which `f` follows; and
/// `exponent_from_rounded` (the level's integer shift left by the mantissa width: 23 bits for
/// f32, 52 for f64) turns `T::ROUNDING + n` into `2^n`.
#[inline(always)]
pub(crate) fn exp2_by_rounding<T: Exp2, S: Simd<T>>(
    simd: S,
    t: S::V,
    exponent_from_rounded: impl Fn(S::V) -> S::V,
) -> S::V {
    let t = simd.max(t, simd.splat(T::FLOOR));
    let rounding = simd.splat(T::ROUNDING);
    let rounded = simd.add(t, rounding);
    let f = simd.sub(t, simd.sub(rounded, rounding));
    simd.mul(exp2_polynomial(simd, f), exponent_from_rounded(rounded))
}
