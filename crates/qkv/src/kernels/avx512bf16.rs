//! The AVX512-BF16 level: bf16 inputs multiplied two by two in vector registers (`vdpbf16ps`:
//! each f32 lane adds the products of a pair of bf16), for CPUs with AVX512-BF16 and no tile
//! unit (AMD Zen 4 and later; Intel since Cooper Lake). The layouts are the AMX level's
//! ([`Layout::Pairs`]): a pair row of a key panel (16 keys × 2 components) is one register, and
//! so is a pair row of 16 value columns; a query's or a weight's pair is one 32-bit broadcast.
//! The weights are rounded to bf16 before `P·V` as at the AMX level; everything between the
//! products is the AVX-512 level's code, and every other element type runs AVX-512 here.
//!
//! Whether it beats AVX-512 depends on the CPU's rate for `vdpbf16ps` (see [`Avx512Bf16::pays`]):
//! each tile's inner loop is 24 `vdpbf16ps` to 6 broadcasts and 4 loads, so the instruction's own
//! rate is the limit. Intel's CPUs run it slower than AVX-512's widened FMA, and the engine then
//! runs AVX-512 unless asked for this level; AMD's run it faster.

use std::arch::x86_64::*;

use half::bf16;

use super::avx512::Avx512;
use super::simd::EXP2_FOR_BF16;
use super::{Layout, REFERENCE_HEADROOM, RowsMut, ScoreTile, ValueRows, Weights, raised_reference};

/// Proof that this CPU runs AVX-512F, BW, DQ and BF16: only [`Avx512Bf16::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub struct Avx512Bf16 {
    vectors: Avx512,
    /// Whether the CPU is AMD's, where `vdpbf16ps` outran f32 FMA in the forward and the backward
    /// and Intel's did not (see [`Avx512Bf16::pays`]).
    amd: bool,
}

/// Keys per block of the tiled loop at this level ([`super::Kernels::KEY_BLOCK`]), as at AMX:
/// the online softmax's work per row and block is spread over more keys. On the AMD EPYC of
/// 2026-12-06 (Zen 5), paired against 128 at two threads: bf16 n = 4096 took 0.93 of the time,
/// causal 0.93, GQA 8/2 n = 1024 0.91, 8 heads × 256 0.96, and one thread at n = 4096 0.94. 256
/// took 0.96 of 128's time, 512 0.97–0.98 of 256's, and 1024 0.98 of 512's (this host's noise).
/// On the AMD EPYC family 25 model 17 (Zen 4) of the same day: n = 4096 0.93 at one and two
/// threads, causal 0.93, GQA 8/2 0.94, 8 heads × 256 0.97. The backward keeps the vector levels'
/// 128.
const KEY_BLOCK: usize = 512;
/// f32 lanes per register, keys per panel, value columns per register.
const LANES: usize = 16;
/// Query rows per register tile, of scores and of `P·V` alike.
const ROWS: usize = 6;
/// Key panels (or value vectors) per register tile: 6 × 4 sums, 4 operands and a broadcast
/// fill 29 of the 32 registers.
const PANELS: usize = 4;

impl Avx512Bf16 {
    /// `Some` if the CPU has AVX-512F, BW, DQ and BF16 (`is_x86_feature_detected!`; every CPU
    /// with BF16 has the other two).
    pub(crate) fn detect() -> Option<Avx512Bf16> {
        let vectors = Avx512::detect()?;
        // CPUID leaf 0 spells the vendor in EBX, EDX, ECX: "Auth", "enti", "cAMD".
        let vendor = __cpuid(0);
        let amd = [vendor.ebx, vendor.edx, vendor.ecx] == [0x6874_7541, 0x6974_6e65, 0x444d_4163];
        (is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
            && is_x86_feature_detected!("avx512bf16"))
        .then_some(Avx512Bf16 { vectors, amd })
    }

    /// The AVX-512 level this one runs its other kernels at.
    pub(crate) fn vectors(self) -> Avx512 {
        self.vectors
    }

    /// Whether this level's `vdpbf16ps` outruns AVX-512's f32 FMA over widened rows, in the forward
    /// and in the backward's score products (the backward takes only those from a pair level):
    /// on AMD's CPUs. On the AMD EPYC of 2026-12-06 (family 26 model 2, Zen 5) the bf16 forward
    /// took 0.57 of AVX-512's time at n = 4096 and two threads, and the bf16 backward 0.82 at
    /// n = 1024, 0.86 at n = 4096 and 0.81 at d = 128 on one thread (`repeat --backward --bf16`,
    /// paired); on the family 25 model 17 (Zen 4) of the same day the forward 0.56 at n = 4096
    /// and 0.54 at GQA 8/2 n = 1024, the backward 0.82 at n = 1024. On Intel's Xeons it is
    /// slower: the forward at n = 4096 took 23.8 ms against 17.4 (family 6 model 207, 2026-12-02)
    /// and 1.26–1.41 times AVX-512's time (model 167, 2026-12-06: n = 4096 and causal, GQA 8/2
    /// n = 1024, 8 heads × 256), and the backward 1.3 times as long (model 207, 2026-12-05:
    /// `vdpbf16ps` took 46% of the samples at n = 1024, where f32 FMA took 31%).
    pub(crate) fn pays(self) -> bool {
        self.amd
    }
}

/// Scalars of f32 storage as 32-bit units, each a pair of bf16 (the first in the low half).
fn pairs(scalars: &[f32]) -> &[u32] {
    wide::bytemuck::cast_slice(scalars)
}

/// `S = scale · Q·Kᵀ` for groups of [`ROWS`] packed query rows (bf16, `[rows][d_even]`) against
/// panels of 16 keys (`[d_even / 2][16][2]`), [`PANELS`] at a time, with the lane-wise row maxima.
///
/// # Safety
/// The CPU must run AVX-512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn scores(tile: ScoreTile<'_, f32, bf16>, group_keys: Option<&dyn Fn(usize) -> usize>) {
    let ScoreTile { q, d, rows, keys, panels, s, stride, row_max, scale, real_rows: _, maxima: _ } = tile;
    assert!(stride >= panels * LANES, "rows of scores hold the tile's keys");
    let half_depth = Layout::Pairs.padded_dim(d) / 2;
    let q = &pairs(q)[..rows * half_depth];
    let panel_len = LANES * 2 * half_depth;
    let keys = &keys[..panels * panel_len];
    assert!(rows % ROWS == 0);
    row_max[..rows * LANES].fill(f32::NEG_INFINITY);
    for g in (0..rows).step_by(ROWS) {
        let needed = match group_keys {
            Some(keys) => keys(g).div_ceil(LANES).min(panels),
            None => panels,
        };
        for first in (0..needed).step_by(PANELS) {
            let keys = &keys[first * panel_len..];
            let group = ScoreGroup { q: &q[g * half_depth..], half_depth, keys, stride, scale };
            let s = &mut s[g * stride + first * LANES..];
            let row_max = &mut row_max[g * LANES..];
            // SAFETY: the caller guarantees the features.
            unsafe {
                match needed - first {
                    1 => group.run::<1>(s, row_max),
                    2 => group.run::<2>(s, row_max),
                    3 => group.run::<3>(s, row_max),
                    _ => group.run::<PANELS>(s, row_max),
                }
            }
        }
    }
}

/// [`ROWS`] query rows against some key panels.
struct ScoreGroup<'a> {
    /// The rows' components two by two, `half_depth` pairs per row.
    q: &'a [u32],
    half_depth: usize,
    /// The panels, from the first of the tile.
    keys: &'a [bf16],
    /// Scalars from one row of scores to the next: the forward's key block, or the backward's.
    stride: usize,
    scale: f32,
}

impl ScoreGroup<'_> {
    /// The scores of `NV` panels, stored at `s` (rows `stride` apart) and folded into the rows'
    /// maxima.
    ///
    /// # Safety
    /// The CPU must run AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn run<const NV: usize>(&self, s: &mut [f32], row_max: &mut [f32]) {
        let panel_len = LANES * 2 * self.half_depth;
        let keys = &self.keys[..NV * panel_len];
        let q = &self.q[..ROWS * self.half_depth];
        let mut acc = [[_mm512_setzero_ps(); NV]; ROWS];
        for i in 0..self.half_depth {
            // SAFETY: the caller guarantees the features; each load reads the 32 bf16 of pair
            // row `i` of panel `v`, inside `keys`.
            unsafe {
                let k: [__m512bh; NV] = std::array::from_fn(|v| {
                    let pair_row = &keys[v * panel_len + i * 2 * LANES..][..2 * LANES];
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(pair_row.as_ptr().cast()))
                });
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        q[r * self.half_depth + i] as i32,
                    ));
                    for (acc, &k) in acc.iter_mut().zip(&k) {
                        *acc = _mm512_dpbf16_ps(*acc, x, k);
                    }
                }
            }
        }
        let factor = _mm512_set1_ps(self.scale);
        for (r, acc) in acc.iter().enumerate() {
            let row = &mut s[r * self.stride..][..NV * LANES];
            let max = &mut row_max[r * LANES..][..LANES];
            // SAFETY: the caller guarantees AVX-512F; `row` holds `NV` vectors and `max` one.
            unsafe {
                let mut m = _mm512_loadu_ps(max.as_ptr());
                for (v, &x) in acc.iter().enumerate() {
                    let scaled = _mm512_mul_ps(x, factor);
                    _mm512_storeu_ps(row[v * LANES..].as_mut_ptr(), scaled);
                    m = _mm512_max_ps(m, scaled);
                }
                _mm512_storeu_ps(max.as_mut_ptr(), m);
            }
        }
    }
}

/// The weights `exp(s - maxima[r])` of the first `len` scores of each row (a multiple of 16),
/// rounded to bf16 and written over the start of the row (two to a scalar: the pairs `P·V`
/// broadcasts, and the AMX level's `A` operand as it lies), with each row's sum of the
/// unrounded weights; a row whose maximum is `-inf` becomes zeros. The pair levels' `exp_rows`.
/// Its `exp` is [`exp_for_bf16`]: a shorter polynomial than f32's ([`EXP2_FOR_BF16`], a relative
/// error below 3e-6), scaled in one instruction.
///
/// # Safety
/// The CPU must run AVX-512F, DQ and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512dq,avx512bf16")]
pub(super) unsafe fn exp_rows(rows: RowsMut<'_, f32>, len: usize, maxima: &[f32], sums: &mut [f32]) {
    for r in 0..rows.rows {
        let mut max = maxima[r];
        // SAFETY: the caller guarantees the features.
        sums[r] = unsafe { exp_row::<false>(&mut rows.data[r * rows.stride..][..len], &mut max) };
    }
}

/// The pair levels' [`Kernels::exp_rows_raising`](super::Kernels::exp_rows_raising): the weights
/// of [`exp_rows`] against each row's running reference, which a score past its headroom raises
/// in the same pass.
///
/// # Safety
/// The CPU must run AVX-512F, DQ and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512dq,avx512bf16")]
pub(super) unsafe fn exp_rows_raising(
    rows: RowsMut<'_, f32>,
    len: usize,
    references: &mut [f32],
    sums: &mut [f32],
) {
    for r in 0..rows.rows {
        // SAFETY: the caller guarantees the features.
        sums[r] = unsafe { exp_row::<true>(&mut rows.data[r * rows.stride..][..len], &mut references[r]) };
    }
}

/// One row of [`exp_rows`] (`RAISE` false: `reference` is the row's maximum) or of
/// [`exp_rows_raising`] (`RAISE`: `reference` is raised, see `raised_reference`, when a chunk
/// holds a score past its headroom); returns the row's sum.
///
/// # Safety
/// The CPU must run AVX-512F, DQ and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512dq,avx512bf16")]
#[inline]
unsafe fn exp_row<const RAISE: bool>(row: &mut [f32], reference: &mut f32) -> f32 {
    let len = row.len();
    if RAISE && *reference == f32::NEG_INFINITY {
        // The row's first visible keys, if any: its maximum is the reference.
        // SAFETY: the caller guarantees AVX-512F.
        *reference = unsafe { largest(row) };
    }
    if *reference == f32::NEG_INFINITY {
        row[..len / 2].fill(0.0);
        return 0.0;
    }
    let headroom = if RAISE { REFERENCE_HEADROOM.ln() as f32 } else { f32::INFINITY };
    let mut limit = _mm512_set1_ps(*reference + headroom);
    let mut shift = _mm512_set1_ps(*reference);
    let mut sum = _mm512_setzero_ps();
    // Each chunk is read whole before its weights are written, and they go to bytes no later than
    // its own: the bf16 of scores `c ..` start at byte `2c`, the scores at `4c`. So when chunk `c`
    // raises the reference, the scores from `c` on are intact and the weights before it written.
    for c in (0..len).step_by(2 * LANES) {
        let whole = c + LANES < len;
        let x = &row[c..][..if whole { 2 * LANES } else { LANES }];
        // SAFETY: the caller guarantees AVX-512F, DQ and BF16; `x` holds the 32 (or 16) scalars
        // loaded, and the 64 (or 32) bytes stored from byte `2c` lie inside the row's scalars
        // from `c / 2`.
        unsafe {
            let low = _mm512_loadu_ps(x.as_ptr());
            let high = if whole { _mm512_loadu_ps(x[LANES..].as_ptr()) } else { low };
            if RAISE {
                let past = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(low, limit)
                    | _mm512_cmp_ps_mask::<_CMP_GT_OQ>(high, limit);
                if past != 0 {
                    let raised = raised_reference(*reference, largest(&row[c..]));
                    // The weights written so far move to the raised reference by a power of two:
                    // exactly, in bf16 as in the f32 sum.
                    let doublings =
                        _mm512_set1_ps(((*reference - raised) * std::f32::consts::LOG2_E).round());
                    rescale_weights(&mut row[..c / 2], doublings);
                    sum = _mm512_scalef_ps(sum, doublings);
                    *reference = raised;
                    (limit, shift) = (_mm512_set1_ps(f32::INFINITY), _mm512_set1_ps(raised));
                }
            }
            let low = exp_for_bf16(low, shift);
            let out = row.as_mut_ptr().cast::<bf16>().add(c);
            sum = _mm512_add_ps(sum, low);
            if whole {
                let high = exp_for_bf16(high, shift);
                sum = _mm512_add_ps(sum, high);
                let rounded = _mm512_cvtne2ps_pbh(high, low);
                _mm512_storeu_si512(out.cast(), std::mem::transmute::<__m512bh, __m512i>(rounded));
            } else {
                let rounded = _mm512_cvtneps_pbh(low);
                _mm256_storeu_si256(out.cast(), std::mem::transmute::<__m256bh, __m256i>(rounded));
            }
        }
    }
    _mm512_reduce_add_ps(sum)
}

/// The largest of `x` (a multiple of 16 scalars long, at least 16).
///
/// # Safety
/// The CPU must run AVX-512F.
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn largest(x: &[f32]) -> f32 {
    let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
    for chunk in x.chunks_exact(LANES) {
        // SAFETY: the caller guarantees AVX-512F; `chunk` holds 16 f32.
        max = _mm512_max_ps(max, unsafe { _mm512_loadu_ps(chunk.as_ptr()) });
    }
    _mm512_reduce_max_ps(max)
}

/// Scales the bf16 weights lying in `weights` (two to a scalar, a multiple of 16 scalars) by
/// `2^doublings` in each lane: exact, but for weights that fall below f32's normal range.
///
/// # Safety
/// The CPU must run AVX-512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
#[inline]
unsafe fn rescale_weights(weights: &mut [f32], doublings: __m512) {
    for chunk in weights.chunks_exact_mut(LANES) {
        // SAFETY: the caller guarantees the features; `chunk` holds 16 scalars: 32 bf16.
        unsafe {
            let bits = _mm512_loadu_si512(chunk.as_ptr().cast());
            let widen =
                |half: __m256i| _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(half)));
            let low = _mm512_scalef_ps(widen(_mm512_castsi512_si256(bits)), doublings);
            let high = _mm512_scalef_ps(widen(_mm512_extracti64x4_epi64::<1>(bits)), doublings);
            let rounded = _mm512_cvtne2ps_pbh(high, low);
            _mm512_storeu_si512(chunk.as_mut_ptr().cast(), std::mem::transmute::<__m512bh, __m512i>(rounded));
        }
    }
}

/// `exp(x - shift)` lane-wise for `x - shift` at most `ln(REFERENCE_HEADROOM)`, to
/// [`EXP2_FOR_BF16`]'s precision: `t = (x - shift) · log2(e)`, its fraction above `floor(t)` in
/// one instruction (`vreduceps`, `f = t - floor(t)` in `[0, 1)`), then `2^f`'s polynomial scaled
/// by `2^floor(t)` in another (`vscalefps`, which floors `t` itself), with none of the masking
/// `exp_shifted`'s AVX-512 arm needs to keep its zeros below `FLOOR` (`x86_simd!`'s `exp2`, four
/// instructions and a longer polynomial). `-inf` needs no clamp: its fraction is
/// 0 and `vscalefps` by `-inf` gives 0, and a `t` too low for a normal result rounds to a
/// subnormal or 0.
#[target_feature(enable = "avx512f,avx512dq")]
#[inline]
fn exp_for_bf16(x: __m512, shift: __m512) -> __m512 {
    let t = _mm512_mul_ps(_mm512_sub_ps(x, shift), _mm512_set1_ps(std::f32::consts::LOG2_E));
    let f = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(t);
    let [highest, rest @ ..] = EXP2_FOR_BF16;
    let mut p = _mm512_set1_ps(highest);
    for c in rest {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    _mm512_scalef_ps(p, t)
}

/// Adds `weight · V_j` to one output row `o` for an odd last key `j` of a tile, whose pair row
/// `key_row` (`2 · o.len()` bf16) holds it in its even halves: the other half, a key no query of
/// the tile may see, is never read. For the pair levels' `P·V`.
///
/// # Safety
/// The CPU must run AVX-512F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn add_odd_key(weight: f32, key_row: &[bf16], o: &mut [f32]) {
    let weight = _mm512_set1_ps(weight);
    for (x, pair) in o.chunks_exact_mut(LANES).zip(key_row.chunks_exact(2 * LANES)) {
        // SAFETY: the caller guarantees AVX-512F; `x` holds 16 f32 and `pair` 32 bf16.
        unsafe {
            let bits = _mm512_loadu_si512(pair.as_ptr().cast());
            let value = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(bits));
            _mm512_storeu_ps(x.as_mut_ptr(), _mm512_fmadd_ps(weight, value, _mm512_loadu_ps(x.as_ptr())));
        }
    }
}

/// `O_r = α_r · O_r + Σ_j P[r, j] · V_j` for groups of [`ROWS`] rows, the weights as
/// [`exp_rows`] leaves them and the value rows in pairs.
///
/// # Safety
/// The CPU must run AVX-512F and AVX512-BF16.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn accumulate_values(
    weights: Weights<'_, f32>,
    alpha: &[f32],
    values: ValueRows<'_, bf16>,
    o: &mut [f32],
) {
    let Weights { p, rows, n_keys } = weights;
    let ValueRows { v, stride, vectors } = values;
    let o_stride = vectors * LANES;
    assert!(rows % ROWS == 0 && o.len() >= rows * o_stride && stride >= o_stride);
    let paired = n_keys & !1;
    let v = &v[..n_keys.div_ceil(2) * 2 * stride];
    let p = &pairs(&p[..rows * KEY_BLOCK]);
    for g in (0..rows).step_by(ROWS) {
        let o = &mut o[g * o_stride..(g + ROWS) * o_stride];
        for first in (0..vectors).step_by(PANELS) {
            let tile = ValueGroup {
                p: &p[g * KEY_BLOCK..],
                alpha: &alpha[g..g + ROWS],
                v,
                stride,
                pairs: paired / 2,
            };
            let o = &mut o[first * LANES..];
            // SAFETY: the caller guarantees the features.
            unsafe {
                match vectors - first {
                    1 => tile.run::<1>(first, o, o_stride),
                    2 => tile.run::<2>(first, o, o_stride),
                    3 => tile.run::<3>(first, o, o_stride),
                    _ => tile.run::<PANELS>(first, o, o_stride),
                }
            }
        }
        if paired < n_keys {
            let key_row = &v[paired * stride..][..2 * o_stride];
            for r in 0..ROWS {
                let weight = bf16::from_bits((p[(g + r) * KEY_BLOCK + paired / 2] & 0xffff) as u16).to_f32();
                // SAFETY: the caller guarantees AVX-512F.
                unsafe { add_odd_key(weight, key_row, &mut o[r * o_stride..(r + 1) * o_stride]) };
            }
        }
    }
}

/// [`ROWS`] rows of weights (pairs, rows of `KEY_BLOCK` units) against some value columns.
struct ValueGroup<'a> {
    p: &'a [u32],
    alpha: &'a [f32],
    v: &'a [bf16],
    stride: usize,
    /// Pairs of keys to add.
    pairs: usize,
}

impl ValueGroup<'_> {
    /// `NC` vectors of columns from vector `first`: the rows of `o` (`o_stride` apart, from that
    /// column) rescaled, the pairs added, stored back.
    ///
    /// # Safety
    /// The CPU must run AVX-512F and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn run<const NC: usize>(&self, first: usize, o: &mut [f32], o_stride: usize) {
        // SAFETY: the caller guarantees the features; the loads and stores are of 16 f32 inside
        // the rows of `o`, and of 32 bf16 inside pair row `i < pairs` of `v` (columns
        // `first · 16 ..`, inside its `2 · stride`); the weights' pairs are inside their rows.
        unsafe {
            let mut acc: [[__m512; NC]; ROWS] = std::array::from_fn(|r| {
                let a = _mm512_set1_ps(self.alpha[r]);
                std::array::from_fn(|c| {
                    _mm512_mul_ps(a, _mm512_loadu_ps(o[r * o_stride + c * LANES..][..LANES].as_ptr()))
                })
            });
            for i in 0..self.pairs {
                let pair_row = &self.v[i * 2 * self.stride + first * 2 * LANES..][..NC * 2 * LANES];
                let values: [__m512bh; NC] = std::array::from_fn(|c| {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        pair_row[c * 2 * LANES..].as_ptr().cast(),
                    ))
                });
                for (r, acc) in acc.iter_mut().enumerate() {
                    let w = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(
                        self.p[r * KEY_BLOCK + i] as i32,
                    ));
                    for (acc, &x) in acc.iter_mut().zip(&values) {
                        *acc = _mm512_dpbf16_ps(*acc, w, x);
                    }
                }
            }
            for (r, acc) in acc.iter().enumerate() {
                for (c, &x) in acc.iter().enumerate() {
                    _mm512_storeu_ps(o[r * o_stride + c * LANES..][..LANES].as_mut_ptr(), x);
                }
            }
        }
    }
}

/// Implements `Kernels<f32, bf16>` for a pair level (`$token`, with a `vectors()` AVX-512 token):
/// its own `scores` and `accumulate_values` (unsafe functions needing the level's features,
/// which the token proves), the pair levels' `exp_rows`, and AVX-512's kernels for the rest.
macro_rules! pair_level_kernels {
    (
        $token:ty, tile_rows = $tile_rows:expr, query_block = $query_block:expr, key_block = $key_block:expr,
        $(score_stride = $score_stride:expr,)? raises_references = $raises:expr
        $(, long_query_block = $long_query_block:expr)?;
        scores = $scores:path, accumulate_values = $accumulate_values:path
    ) => {
        const _: () = assert!($query_block % $tile_rows == 0, "blocks are whole groups of rows");
        $(const _: () = assert!($long_query_block % $tile_rows == 0, "blocks are whole groups of rows");)?

        impl $crate::kernels::Kernels<f32, half::bf16> for $token {
            const LANES: usize = 16;
            const KEY_PANEL: usize = 16;
            const TILE_ROWS: usize = $tile_rows;
            const QUERY_BLOCK: usize = $query_block;
            $(const LONG_QUERY_BLOCK: usize = $long_query_block;)?
            const LAYOUT: $crate::kernels::Layout = $crate::kernels::Layout::Pairs;
            const KEY_BLOCK: usize = $key_block;
            $(const SCORE_STRIDE: usize = $score_stride;)?
            const RAISES_REFERENCES: bool = $raises;
            type Widened = $crate::kernels::avx512::Avx512;

            fn widened(self) -> $crate::kernels::avx512::Avx512 {
                self.vectors()
            }

            fn scores(
                self,
                tile: $crate::kernels::ScoreTile<'_, f32, half::bf16>,
                group_keys: Option<&dyn Fn(usize) -> usize>,
            ) {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $scores(tile, group_keys) }
            }

            fn direct_scores(
                self,
                q: &[f32],
                rows: usize,
                keys: ndarray::ArrayView2<half::bf16>,
                s: &mut [f32],
            ) -> f32 {
                self.vectors().direct_scores(q, rows, keys, s)
            }

            fn magnitude(self, x: &[half::bf16]) -> f32 {
                $crate::kernels::Kernels::<f32, half::bf16>::magnitude(self.vectors(), x)
            }

            fn row_maxima(self, rows: $crate::kernels::Rows<'_, f32>, len: usize, out: &mut [f32]) {
                $crate::kernels::Kernels::<f32, half::bf16>::row_maxima(self.vectors(), rows, len, out)
            }

            fn exp_rows(
                self,
                rows: $crate::kernels::RowsMut<'_, f32>,
                len: usize,
                maxima: &[f32],
                sums: &mut [f32],
            ) {
                // SAFETY: `self` proves AVX-512F, DQ and BF16 (its `detect`).
                unsafe { $crate::kernels::avx512bf16::exp_rows(rows, len, maxima, sums) }
            }

            fn exp_rows_raising(
                self,
                rows: $crate::kernels::RowsMut<'_, f32>,
                len: usize,
                references: &mut [f32],
                sums: &mut [f32],
            ) {
                // SAFETY: `self` proves AVX-512F, DQ and BF16 (its `detect`).
                unsafe { $crate::kernels::avx512bf16::exp_rows_raising(rows, len, references, sums) }
            }

            fn exp_differences(self, a: &[f32], b: &[f32], out: &mut [f32]) {
                $crate::kernels::Kernels::<f32, half::bf16>::exp_differences(self.vectors(), a, b, out)
            }

            fn accumulate_values(
                self,
                weights: $crate::kernels::Weights<'_, f32>,
                alpha: &[f32],
                values: $crate::kernels::ValueRows<'_, half::bf16>,
                o: &mut [f32],
            ) {
                // SAFETY: `self` proves the level's features (its `detect`).
                unsafe { $accumulate_values(weights, alpha, values, o) }
            }

            fn accumulate_transposed(
                self,
                _: $crate::kernels::Weights<'_, f32>,
                _: $crate::kernels::ValueRows<'_, half::bf16>,
                _: &mut [f32],
            ) {
                unreachable!("the backward computes from f32 and f64 inputs, never at a bf16 pair level")
            }

            fn scale_columns(self, rows: $crate::kernels::RowsMut<'_, f32>, scales: &[f32]) {
                $crate::kernels::Kernels::<f32, half::bf16>::scale_columns(self.vectors(), rows, scales)
            }

            fn softmax_gradient(
                self,
                p: $crate::kernels::Rows<'_, f32>,
                dp: $crate::kernels::RowsMut<'_, f32>,
                len: usize,
                delta: &[f32],
            ) {
                $crate::kernels::Kernels::<f32, half::bf16>::softmax_gradient(
                    self.vectors(),
                    p,
                    dp,
                    len,
                    delta,
                )
            }
        }
    };
}
pub(super) use pair_level_kernels;

// Its score kernel folds the maxima into the products, so it takes them (`RAISES_REFERENCES`).
// Blocks of 96 rows over long keys (`flash::LONG_KEYS_BYTES`), as at AVX-512: on the AMD EPYC of
// 2026-12-06 (Zen 5, 32 MiB of L3) `repeat --bf16 4096 262144 0 1` (64 MiB of keys and values)
// took 0.85 of the time with 48, paired at two threads; 8192 × 65536 (16 MiB) 0.98.
pair_level_kernels!(Avx512Bf16, tile_rows = ROWS, query_block = 48, key_block = KEY_BLOCK,
    raises_references = false, long_query_block = 96;
    scores = scores, accumulate_values = accumulate_values);
