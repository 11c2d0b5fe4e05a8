//! The AVX-512F level (with DQ, for the exponent's `vreduceps`): 16 f32 or 8 f64 lanes in 32 `zmm`
//! registers.

use std::arch::x86_64::*;

use super::simd::Load;
use super::x86::{sum4_pd, sum4_ps, x86_simd};
use super::{Q8, level_kernels};

/// Proof that this CPU runs AVX-512F and DQ: only [`Avx512::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub struct Avx512(());

impl Avx512 {
    /// `Some` if the CPU has AVX-512F and DQ (`is_x86_feature_detected!`).
    pub(crate) fn detect() -> Option<Avx512> {
        (is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512dq")).then_some(Avx512(()))
    }
}

impl Load<f32, half::bf16> for Avx512 {
    /// A bf16 is the top half of an f32: widen the sixteen 16-bit patterns and shift them up.
    #[inline(always)]
    fn load_stored(self, s: &[half::bf16]) -> __m512 {
        let s = &s[..16];
        // SAFETY: `self` proves AVX-512F (its `detect`); `s` holds exactly 16 elements, the 32
        // bytes read.
        unsafe {
            let bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(s.as_ptr().cast()));
            _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits))
        }
    }
}

impl Load<f32, Q8> for Avx512 {
    /// Sixteen int8 sign-extended to 32 bits and converted (exactly) to f32.
    #[inline(always)]
    fn load_stored(self, s: &[Q8]) -> __m512 {
        let s = &s[..16];
        // SAFETY: `self` proves AVX-512F (its `detect`); `s` holds exactly 16 elements, the 16
        // bytes read.
        unsafe { _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(s.as_ptr().cast()))) }
    }
}

impl Load<f32, half::f16> for Avx512 {
    #[inline(always)]
    fn load_stored(self, s: &[half::f16]) -> __m512 {
        let s = &s[..16];
        // SAFETY: `self` proves AVX-512F (its `detect`), which has the 512-bit `vcvtph2ps`; `s`
        // holds exactly 16 elements, the 32 bytes read.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr().cast())) }
    }
}

/// The two 256-bit halves of `x` added: 8 lanes with the sums of its 16.
///
/// # Safety
/// The CPU must run AVX-512F (the caller holds an [`Avx512`] token).
#[inline(always)]
unsafe fn fold_ps(x: __m512) -> __m256 {
    // SAFETY: the caller guarantees AVX-512F.
    unsafe {
        _mm256_add_ps(
            _mm512_castps512_ps256(x),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))),
        )
    }
}

/// The two 256-bit halves of `x` added (see [`fold_ps`]).
///
/// # Safety
/// The CPU must run AVX-512F (the caller holds an [`Avx512`] token).
#[inline(always)]
unsafe fn fold_pd(x: __m512d) -> __m256d {
    // SAFETY: the caller guarantees AVX-512F.
    unsafe { _mm256_add_pd(_mm512_castpd512_pd256(x), _mm512_extractf64x4_pd::<1>(x)) }
}

x86_simd!(
    Avx512, f32, __m512, lanes = 16;
    zero = _mm512_setzero_ps, splat = _mm512_set1_ps, load = _mm512_loadu_ps, store = _mm512_storeu_ps,
    mul_add = _mm512_fmadd_ps, mul = _mm512_mul_ps, add = _mm512_add_ps, sub = _mm512_sub_ps,
    max = _mm512_max_ps,
    fold_magnitude = |acc, x| {
        let magnitude = _mm512_and_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x7fff_ffff));
        _mm512_castsi512_ps(_mm512_max_epu32(_mm512_castps_si512(acc), magnitude))
    },
    reduce_add = |v| _mm512_reduce_add_ps(v),
    reduce_max = |v| _mm512_reduce_max_ps(v),
    // Each vector folded to 256 bits, then the AVX2 horizontal adds.
    reduce_add4 = |v| sum4_ps([fold_ps(v[0]), fold_ps(v[1]), fold_ps(v[2]), fold_ps(v[3])]),
    exp2 = (reduce = _mm512_reduce_ps, compare = _mm512_cmp_ps_mask, scale = _mm512_maskz_scalef_ps),
);

x86_simd!(
    Avx512, f64, __m512d, lanes = 8;
    zero = _mm512_setzero_pd, splat = _mm512_set1_pd, load = _mm512_loadu_pd, store = _mm512_storeu_pd,
    mul_add = _mm512_fmadd_pd, mul = _mm512_mul_pd, add = _mm512_add_pd, sub = _mm512_sub_pd,
    max = _mm512_max_pd,
    fold_magnitude = |acc, x| {
        let magnitude = _mm512_and_si512(_mm512_castpd_si512(x), _mm512_set1_epi64(0x7fff_ffff_ffff_ffff));
        _mm512_castsi512_pd(_mm512_max_epu64(_mm512_castpd_si512(acc), magnitude))
    },
    reduce_add = |v| _mm512_reduce_add_pd(v),
    reduce_max = |v| _mm512_reduce_max_pd(v),
    reduce_add4 = |v| sum4_pd([fold_pd(v[0]), fold_pd(v[1]), fold_pd(v[2]), fold_pd(v[3])]),
    exp2 = (reduce = _mm512_reduce_pd, compare = _mm512_cmp_pd_mask, scale = _mm512_maskz_scalef_pd),
);

// 6 rows × 4 vectors (64 f32 keys) of scores: 24 accumulators, 4 key vectors and the broadcast
// leave 3 of the 32 registers (the shape of the `gemm` crate's AVX-512 kernel). P·V the same; a
// single row takes 8 vectors.
// Over long keys and values (`flash::LONG_KEYS_BYTES`) blocks of 96 rows, as at AVX2: on an Intel
// family 6 model 207 (2 MiB of L2 a core) two threads ran n = 16384 5% faster and one thread
// 2048 queries over 16384 keys 7% (bench README, 2026-12-05); bf16 storage, forced to this level,
// within noise (0.986).
level_kernels!(Avx512, f32, stored = f32, features = "avx512f,avx512dq";
    score_tile = 6 x 4, value_tile = 6 x 4, one_row_value_vectors = 8, query_block = 48,
    long_query_block = 96);
level_kernels!(Avx512, f32, stored = half::bf16, features = "avx512f,avx512dq";
    score_tile = 6 x 4, value_tile = 6 x 4, one_row_value_vectors = 8, query_block = 48,
    long_query_block = 96);
level_kernels!(Avx512, f32, stored = half::f16, features = "avx512f,avx512dq";
    score_tile = 6 x 4, value_tile = 6 x 4, one_row_value_vectors = 8, query_block = 48,
    long_query_block = 96);
level_kernels!(Avx512, f32, stored = Q8, features = "avx512f,avx512dq";
    score_tile = 6 x 4, value_tile = 6 x 4, one_row_value_vectors = 8, query_block = 48);
level_kernels!(Avx512, f64, stored = f64, features = "avx512f,avx512dq";
    score_tile = 6 x 4, value_tile = 6 x 4, one_row_value_vectors = 8, query_block = 48);
