//! The AVX2 + FMA level: 8 f32 or 4 f64 lanes in 16 `ymm` registers, two FMA ports on most
//! CPUs that have it (Intel since Haswell, AMD since Zen). It also asks for F16C, which every CPU
//! with AVX2 and FMA has, to widen f16 keys and values as it loads them.

use std::arch::x86_64::*;

use super::simd::Load;
use super::x86::{sum4_pd, sum4_ps, x86_simd};
use super::{Q8, level_kernels};

/// Proof that this CPU runs AVX2, FMA and F16C: only [`Avx2::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub struct Avx2(());

impl Avx2 {
    /// `Some` if the CPU has AVX2, FMA and F16C (`is_x86_feature_detected!`).
    pub(crate) fn detect() -> Option<Avx2> {
        (is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        .then_some(Avx2(()))
    }
}

impl Load<f32, half::bf16> for Avx2 {
    /// A bf16 is the top half of an f32: widen the eight 16-bit patterns and shift them up.
    #[inline(always)]
    fn load_stored(self, s: &[half::bf16]) -> __m256 {
        let s = &s[..8];
        // SAFETY: `self` proves AVX2 (its `detect`); `s` holds exactly 8 elements, the 16 bytes read.
        unsafe {
            let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(s.as_ptr().cast()));
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
        }
    }
}

impl Load<f32, half::f16> for Avx2 {
    #[inline(always)]
    fn load_stored(self, s: &[half::f16]) -> __m256 {
        let s = &s[..8];
        // SAFETY: `self` proves F16C (its `detect`); `s` holds exactly 8 elements, the 16 bytes read.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(s.as_ptr().cast())) }
    }
}

impl Load<f32, Q8> for Avx2 {
    /// Eight int8 sign-extended to 32 bits and converted (exactly) to f32.
    #[inline(always)]
    fn load_stored(self, s: &[Q8]) -> __m256 {
        let s = &s[..8];
        // SAFETY: `self` proves AVX2 (its `detect`); `s` holds exactly 8 elements, the 8 bytes read.
        unsafe { _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(s.as_ptr().cast()))) }
    }
}

x86_simd!(
    Avx2, f32, __m256, lanes = 8;
    zero = _mm256_setzero_ps, splat = _mm256_set1_ps, load = _mm256_loadu_ps, store = _mm256_storeu_ps,
    mul_add = _mm256_fmadd_ps, mul = _mm256_mul_ps, add = _mm256_add_ps, sub = _mm256_sub_ps,
    max = _mm256_max_ps,
    fold_magnitude = |acc, x| {
        let magnitude = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7fff_ffff));
        _mm256_castsi256_ps(_mm256_max_epu32(_mm256_castps_si256(acc), magnitude))
    },
    reduce_add = |v| {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    },
    reduce_max = |v| {
        let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps::<1>(s, s)))
    },
    reduce_add4 = |v| sum4_ps(v),
    exponent = |r| _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_castps_si256(r))),
);

x86_simd!(
    Avx2, f64, __m256d, lanes = 4;
    zero = _mm256_setzero_pd, splat = _mm256_set1_pd, load = _mm256_loadu_pd, store = _mm256_storeu_pd,
    mul_add = _mm256_fmadd_pd, mul = _mm256_mul_pd, add = _mm256_add_pd, sub = _mm256_sub_pd,
    max = _mm256_max_pd,
    // AVX2 has no 64-bit integer maximum: compare and blend (the bits are non-negative as i64).
    fold_magnitude = |acc, x| {
        let (acc, magnitude) = (
            _mm256_castpd_si256(acc),
            _mm256_and_si256(_mm256_castpd_si256(x), _mm256_set1_epi64x(0x7fff_ffff_ffff_ffff)),
        );
        _mm256_castsi256_pd(_mm256_blendv_epi8(acc, magnitude, _mm256_cmpgt_epi64(magnitude, acc)))
    },
    reduce_add = |v| {
        let s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
        _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)))
    },
    reduce_max = |v| {
        let s = _mm_max_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd::<1>(v));
        _mm_cvtsd_f64(_mm_max_sd(s, _mm_unpackhi_pd(s, s)))
    },
    reduce_add4 = |v| sum4_pd(v),
    exponent = |r| _mm256_castsi256_pd(_mm256_slli_epi64::<52>(_mm256_castpd_si256(r))),
);

// 6 rows × 2 vectors (16 f32 keys) of scores: 12 accumulators, 2 key vectors and the broadcast
// query scalar fill 15 of the 16 registers (the classic 6 × 16 sgemm tile). P·V the same shape;
// a single row of P·V takes 8 vectors (d_v = 64 at once). Half-precision and int8 keys and values
// take the f32 tiles: they are widened into the same registers.
// Over long keys and values (`flash::LONG_KEYS_BYTES`) blocks of 96 rows read them from beyond
// L2 half as often: on Zen 3 (512 KiB of L2 a core, an L3 shared with other guests) one thread
// ran 2048 queries over 16384 and 65536 keys 10% and 9% faster, bf16 over 65536 keys 7%; over
// 4096 and 8192 keys, which keep 48, two threads gained nothing (bench README, 2026-12-04).
level_kernels!(Avx2, f32, stored = f32, features = "avx2,fma,f16c";
    score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48,
    long_query_block = 96);
level_kernels!(Avx2, f32, stored = half::bf16, features = "avx2,fma,f16c";
    score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48,
    long_query_block = 96);
level_kernels!(Avx2, f32, stored = half::f16, features = "avx2,fma,f16c";
    score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48,
    long_query_block = 96);
level_kernels!(Avx2, f32, stored = Q8, features = "avx2,fma,f16c";
    score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48);
level_kernels!(Avx2, f64, stored = f64, features = "avx2,fma,f16c";
    score_tile = 6 x 2, value_tile = 6 x 2, one_row_value_vectors = 8, query_block = 48);
