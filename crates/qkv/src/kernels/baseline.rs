//! The baseline level: the target's own 128-bit vectors through `wide` (SSE2 on x86-64, NEON on
//! aarch64, plain scalars elsewhere), chosen when `wide` is compiled, so it runs on every CPU of
//! the target. 4 f32 or 2 f64 lanes in 16 registers (x86-64), no FMA on SSE2.

use wide::{f32x4, f64x2, i32x4, i64x2, u32x4, u64x2};

use super::level_kernels;
use super::simd::{Load, Simd, exp2_by_rounding};
use super::{Element, Q8};

/// The baseline level needs no proof: its instructions are the target's own.
#[derive(Debug, Clone, Copy)]
pub struct Baseline;

/// The primitives of one `wide` vector type: the same code for f32 and f64 but for the names.
macro_rules! wide_simd {
    ($t:ty, $v:ident, $int:ident, $bits:ident, $abs_mask:literal, $lanes:literal, $mantissa:literal) => {
        impl Simd<$t> for Baseline {
            type V = $v;
            const LANES: usize = $lanes;

            #[inline(always)]
            fn zero(self) -> $v {
                $v::ZERO
            }

            #[inline(always)]
            fn splat(self, x: $t) -> $v {
                $v::splat(x)
            }

            #[inline(always)]
            fn load(self, s: &[$t]) -> $v {
                let lanes: [$t; $lanes] = s[..$lanes].try_into().expect("a full vector of lanes");
                $v::from(lanes)
            }

            #[inline(always)]
            fn store(self, v: $v, s: &mut [$t]) {
                s[..$lanes].copy_from_slice(&v.to_array());
            }

            #[inline(always)]
            fn mul_add(self, a: $v, b: $v, c: $v) -> $v {
                a.mul_add(b, c)
            }

            #[inline(always)]
            fn mul(self, a: $v, b: $v) -> $v {
                a * b
            }

            #[inline(always)]
            fn add(self, a: $v, b: $v) -> $v {
                a + b
            }

            #[inline(always)]
            fn sub(self, a: $v, b: $v) -> $v {
                a - b
            }

            #[inline(always)]
            fn max(self, a: $v, b: $v) -> $v {
                a.fast_max(b)
            }

            #[inline(always)]
            fn fold_magnitude(self, acc: $v, x: $v) -> $v {
                let magnitude: $bits = wide::bytemuck::cast::<$v, $bits>(x) & $bits::splat($abs_mask);
                wide::bytemuck::cast(wide::bytemuck::cast::<$v, $bits>(acc).max(magnitude))
            }

            #[inline(always)]
            fn reduce_add(self, v: $v) -> $t {
                v.reduce_add()
            }

            #[inline(always)]
            fn reduce_max(self, v: $v) -> $t {
                v.to_array().into_iter().fold(<$t>::NEG_INFINITY, <$t>::max)
            }

            #[inline(always)]
            fn exp2(self, t: $v) -> $v {
                exp2_by_rounding::<$t, _>(self, t, |rounded| {
                    let bits: $int = wide::bytemuck::cast(rounded);
                    wide::bytemuck::cast(bits << $mantissa)
                })
            }
        }
    };
}
wide_simd!(f32, f32x4, i32x4, u32x4, 0x7fff_ffff, 4, 23_u32);
wide_simd!(f64, f64x2, i64x2, u64x2, 0x7fff_ffff_ffff_ffff, 2, 52_u32);

/// Four stored half-precision or int8 elements in f32 lanes, through `half`'s portable
/// conversions (a shift for bf16; for f16, whatever the target has when `half` is compiled) or
/// an integer conversion.
#[inline(always)]
fn widened<E: Element<Compute = f32>>(s: &[E]) -> f32x4 {
    let lanes: [E; 4] = s[..4].try_into().expect("a full vector of lanes");
    f32x4::from(lanes.map(E::widen))
}

impl Load<f32, half::bf16> for Baseline {
    #[inline(always)]
    fn load_stored(self, s: &[half::bf16]) -> f32x4 {
        widened(s)
    }
}

impl Load<f32, half::f16> for Baseline {
    #[inline(always)]
    fn load_stored(self, s: &[half::f16]) -> f32x4 {
        widened(s)
    }
}

impl Load<f32, Q8> for Baseline {
    #[inline(always)]
    fn load_stored(self, s: &[Q8]) -> f32x4 {
        widened(s)
    }
}

// 6 × 8 f32 scores (12 of the 16 registers), 6 × 2 vectors of P·V; one row of P·V takes 8 vectors.
level_kernels!(Baseline, f32, stored = f32; score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48);
level_kernels!(Baseline, f32, stored = half::bf16; score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48);
level_kernels!(Baseline, f32, stored = half::f16; score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48);
level_kernels!(Baseline, f32, stored = Q8; score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48);
level_kernels!(Baseline, f64, stored = f64; score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48);
