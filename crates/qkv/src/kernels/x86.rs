//! What the two x86-64 intrinsic levels share: their [`Simd`](super::simd::Simd) implementations
//! are the same code but for the intrinsics' names, written once in [`x86_simd!`], and the
//! four-way horizontal sums.

use std::arch::x86_64::*;

/// Implements `Simd<$t>` for a level token with the given intrinsics. Every primitive is an
/// `unsafe` intrinsic call, sound for the same two reasons: the token exists only after its
/// features were detected (see its `detect`), and loads and stores go through a slice reslice of
/// exactly `LANES` scalars, which panics rather than read or write out of bounds. `2^t`
/// ([`Simd::exp2`](super::simd::Simd::exp2)) comes either from `exponent`, the integer shift that
/// [`exp2_by_rounding`](super::simd::exp2_by_rounding) builds `2^n` with, or from `exp2`'s three
/// AVX-512 instructions.
macro_rules! x86_simd {
    (
        $token:ty, $t:ty, $v:ty, lanes = $lanes:literal;
        zero = $zero:path, splat = $splat:path, load = $load:path, store = $store:path,
        mul_add = $mul_add:path, mul = $mul:path, add = $add:path, sub = $sub:path, max = $max:path,
        fold_magnitude = |$acc:ident, $x:ident| $fold_magnitude:expr,
        reduce_add = |$ra:ident| $reduce_add:expr, reduce_max = |$rm:ident| $reduce_max:expr,
        reduce_add4 = |$r4:ident| $reduce_add4:expr,
        $(exponent = |$ex:ident| $exponent:expr,)?
        $(exp2 = (reduce = $reduce:ident, compare = $compare:ident, scale = $scale:ident),)?
    ) => {
        impl $crate::kernels::simd::Simd<$t> for $token {
            type V = $v;
            const LANES: usize = $lanes;

            #[inline(always)]
            fn zero(self) -> $v {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $zero() }
            }

            #[inline(always)]
            fn splat(self, x: $t) -> $v {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $splat(x) }
            }

            #[inline(always)]
            fn load(self, s: &[$t]) -> $v {
                let s = &s[..$lanes];
                // SAFETY: `self` proves the level's features; `s` holds exactly `LANES` scalars.
                unsafe { $load(s.as_ptr()) }
            }

            #[inline(always)]
            fn store(self, v: $v, s: &mut [$t]) {
                let s = &mut s[..$lanes];
                // SAFETY: `self` proves the level's features; `s` holds exactly `LANES` scalars.
                unsafe { $store(s.as_mut_ptr(), v) }
            }

            #[inline(always)]
            fn mul_add(self, a: $v, b: $v, c: $v) -> $v {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $mul_add(a, b, c) }
            }

            #[inline(always)]
            fn mul(self, a: $v, b: $v) -> $v {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $mul(a, b) }
            }

            #[inline(always)]
            fn add(self, a: $v, b: $v) -> $v {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $add(a, b) }
            }

            #[inline(always)]
            fn sub(self, a: $v, b: $v) -> $v {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $sub(a, b) }
            }

            #[inline(always)]
            fn max(self, a: $v, b: $v) -> $v {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $max(a, b) }
            }

            #[inline(always)]
            fn fold_magnitude(self, $acc: $v, $x: $v) -> $v {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $fold_magnitude }
            }

            #[inline(always)]
            fn reduce_add(self, $ra: $v) -> $t {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $reduce_add }
            }

            #[inline(always)]
            fn reduce_max(self, $rm: $v) -> $t {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $reduce_max }
            }

            #[inline(always)]
            fn reduce_add4(self, $r4: [$v; 4]) -> [$t; 4] {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $reduce_add4 }
            }

            $(
                #[inline(always)]
                fn exp2(self, t: $v) -> $v {
                    $crate::kernels::simd::exp2_by_rounding::<$t, _>(self, t, |$ex| {
                        // SAFETY: `self` proves the level's features (its `detect`).
                        unsafe { $exponent }
                    })
                }
            )?
            $(
                #[inline(always)]
                fn exp2(self, t: $v) -> $v {
                    use ::std::arch::x86_64::{_CMP_GE_OQ, _MM_FROUND_NO_EXC, _MM_FROUND_TO_NEAREST_INT};
                    use $crate::kernels::simd::{Exp2, exp2_polynomial};
                    // Four instructions where `exp2_by_rounding` takes six: `f` from `vreduce`
                    // (`t` less its nearest integer; 0 for `-inf`), `n = t - f`, and `2^n` applied
                    // by `vscalef`, masked to keep the zeros below `FLOOR + 1/2`.
                    // SAFETY: `self` proves the level's features (its `detect`).
                    unsafe {
                        let f = $reduce::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(t);
                        let kept = $compare::<_CMP_GE_OQ>(t, $splat(<$t as Exp2>::FLOOR + 0.5));
                        $scale(kept, exp2_polynomial::<$t, _>(self, f), $sub(t, f))
                    }
                }
            )?
        }
    };
}
pub(super) use x86_simd;

/// The lane sums of four 256-bit f32 vectors, with horizontal adds: the AVX2 level's
/// `reduce_add4`, and the AVX-512 level's once it has folded each vector to 256 bits.
///
/// # Safety
/// The CPU must run AVX (both callers hold a token that proves it).
#[inline(always)]
pub(super) unsafe fn sum4_ps([a, b, c, d]: [__m256; 4]) -> [f32; 4] {
    // SAFETY: the caller guarantees AVX.
    unsafe {
        let sums = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
        let sums = _mm_add_ps(_mm256_castps256_ps128(sums), _mm256_extractf128_ps::<1>(sums));
        std::mem::transmute::<__m128, [f32; 4]>(sums)
    }
}

/// The lane sums of four 256-bit f64 vectors (see [`sum4_ps`]).
///
/// # Safety
/// The CPU must run AVX (both callers hold a token that proves it).
#[inline(always)]
pub(super) unsafe fn sum4_pd([a, b, c, d]: [__m256d; 4]) -> [f64; 4] {
    // SAFETY: the caller guarantees AVX.
    unsafe {
        let (ab, cd) = (_mm256_hadd_pd(a, b), _mm256_hadd_pd(c, d));
        let sums =
            _mm256_add_pd(_mm256_permute2f128_pd::<0x20>(ab, cd), _mm256_permute2f128_pd::<0x31>(ab, cd));
        std::mem::transmute::<__m256d, [f64; 4]>(sums)
    }
}
