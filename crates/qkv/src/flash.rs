//! The fast output-only path: FlashAttention-2-style tiling with an online softmax.
//!
//! Queries are cut into blocks of [`QUERY_BLOCK`] rows and keys into blocks of [`KEY_BLOCK`].
//! For one query block the key blocks are visited in order: scores `S = Q_b·K_jᵀ` (the scale is
//! folded into the packed queries), masks where a tile needs them, then the online softmax: the
//! running row maximum `m` and sum `l`, the rescale `α = exp(m_old - m_new)` of the output
//! accumulator, and `O += P·V`. Each row is divided by its `l` once, at the end. No
//! `n_q × n_k` matrix exists: beyond the inputs and the output, memory is the packed keys and
//! values (`n_k · (d_k + d_v)` scalars) and a few tiles per task.
//!
//! Work is split into independent (query block, key split) items and never over a reduction.
//! Keys are split only when there are few query blocks (decoding), into a number of splits that
//! depends on the problem size alone, and the partial softmax states are merged in a fixed order:
//! results are the same bit for bit whatever the number of threads.
//!
//! The SIMD arithmetic lives in `kernels`; this module owns the tiling, the masking decisions, the
//! online softmax and the work split.

use std::ops::Range;

use ndarray::{ArrayView2, ArrayViewMut2, Axis};
use rayon::prelude::*;

use crate::kernels::{self, KEY_VECTORS, V, Vector};
use crate::mask::MaskSet;
use crate::real::Real;
use crate::shape::{Magnitudes, Shape};

/// Queries per block: one task's rows. Its scores tile (`QUERY_BLOCK × KEY_BLOCK`), packed
/// queries and output accumulator stay in L1/L2 while the key blocks stream past.
pub(crate) const QUERY_BLOCK: usize = 64;
/// Keys per block: a multiple of the key panel width (64 keys for f32, 32 for f64). 128 measured
/// about 10% faster than 64 (the per-row work of the online softmax is spread over more keys).
pub(crate) const KEY_BLOCK: usize = 128;
/// Problems with fewer query blocks than this also split their keys, so that every core works.
const SPLIT_BELOW_BLOCKS: usize = 4;
/// Problems with at most this many queries take their scores straight from the key rows.
const DIRECT_ROWS: usize = 4;
/// The fewest keys one split handles.
const SPLIT_KEYS: usize = 1024;
/// The most splits a query block is cut into.
const MAX_SPLITS: usize = 16;

/// Whether the fast path can run a problem without any intermediate overflowing: every score
/// (at most `scale · d · max |q| · max |k| + max |bias|`, by Cauchy-Schwarz) and every
/// unnormalised output sum (at most `n_k · max |v|`) stays far below the type's largest value.
/// Otherwise the blocked path runs, which normalises before it multiplies by `V` and reports a
/// score that overflows.
pub(crate) fn stays_finite<T: Real>(
    shape: &Shape,
    magnitudes: &Magnitudes,
    masks: &MaskSet<'_, '_, T>,
) -> bool {
    let limit = T::max_value().to_f64_exact() / 16.0;
    let d = shape.key_dim as f64;
    let score = masks.scale.abs() * d * magnitudes.queries * magnitudes.keys + masks.bias_magnitude;
    let value = magnitudes.values * shape.n_keys as f64;
    score <= limit && value <= limit
}

/// Computes attention for a checked problem into `out` (`[n_q, d_v]`).
pub(crate) fn attend<T: Real>(
    shape: &Shape,
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    masks: &MaskSet<'_, '_, T>,
    mut out: ArrayViewMut2<T>,
) {
    // Decoding (a few queries, contiguous key rows): scores straight from the key rows.
    let direct = shape.n_queries <= DIRECT_ROWS && (k.ncols() == 1 || k.strides()[1] == 1);
    let problem = Problem { shape: *shape, q, k, direct, masks };
    let splits = key_splits(shape);
    let mut blocks: Vec<ArrayViewMut2<T>> = out.axis_chunks_iter_mut(Axis(0), QUERY_BLOCK).collect();
    if let [keys] = splits.as_slice() {
        let packed = Packed::new(k, v, keys.clone(), !direct);
        // Zig-zag pairs: block i runs with block n-1-i, so that under a causal mask (where block
        // i's cost grows with i) every item costs about the same; items are taken one at a time
        // (`with_max_len(1)`) so both cores stay busy to the end.
        let n = blocks.len();
        let (front, back) = blocks.split_at_mut(n.div_ceil(2));
        let mut partners = back.iter_mut().rev();
        let pairs: Vec<_> =
            front.iter_mut().enumerate().map(|(i, block)| (i, block, partners.next())).collect();
        pairs.into_par_iter().with_max_len(1).for_each(|(i, block, partner)| {
            for (b, out_block) in std::iter::once((i, block)).chain(partner.map(|p| (n - 1 - i, p))) {
                let state = problem.attend_block(&packed, b * QUERY_BLOCK, out_block.nrows(), keys.clone());
                state.write(out_block);
            }
        });
        return;
    }
    let rows = |b: usize| QUERY_BLOCK.min(shape.n_queries - b * QUERY_BLOCK);
    let items: Vec<(usize, Range<usize>)> =
        (0..blocks.len()).flat_map(|b| splits.iter().map(move |keys| (b, keys.clone()))).collect();
    let states: Vec<State<T>> = items
        .into_par_iter()
        .with_max_len(1)
        .map(|(b, keys)| {
            // Each task packs its own keys: they are read by few query rows, and a small buffer
            // per task stays in cache where one large one per call would not.
            let packed = Packed::new(k, v, keys.clone(), !direct);
            problem.attend_block(&packed, b * QUERY_BLOCK, rows(b), keys)
        })
        .collect();
    let mut states = states.into_iter();
    for out_block in &mut blocks {
        // Merged in split order, the same whichever thread computed each part.
        let mut merged = states.next().expect("one state per split");
        for part in states.by_ref().take(splits.len() - 1) {
            merged.merge(&part);
        }
        merged.write(out_block);
    }
}

/// The key ranges each query block is split into: one unless the queries are few, and then a
/// number fixed by `n_k` alone, each a whole number of key blocks.
fn key_splits(shape: &Shape) -> Vec<Range<usize>> {
    let n_keys = shape.n_keys;
    let splits = if shape.n_queries.div_ceil(QUERY_BLOCK) >= SPLIT_BELOW_BLOCKS {
        1
    } else {
        (n_keys / SPLIT_KEYS).clamp(1, MAX_SPLITS)
    };
    let len = n_keys.div_ceil(splits).next_multiple_of(KEY_BLOCK);
    (0..n_keys).step_by(len).map(|start| start..(start + len).min(n_keys)).collect()
}

/// Keys and values `first_key ..` in the layouts the kernels read.
struct Packed<'v, T: Real> {
    first_key: usize,
    /// Key panels (see `kernels::pack_key_panel`), zero-padded to whole panels.
    keys: Vec<V<T>>,
    /// Value rows, `value_vectors` vectors each.
    values: Values<'v, T>,
    value_vectors: usize,
}

/// The values as the `P·V` kernel reads them: the caller's own rows when they are contiguous and
/// a whole number of vectors wide, otherwise a zero-padded copy.
enum Values<'v, T: Real> {
    Borrowed(&'v [T]),
    Packed(Vec<V<T>>),
}

impl<'v, T: Real> Packed<'v, T> {
    fn new(k: ArrayView2<T>, v: ArrayView2<'v, T>, keys: Range<usize>, pack_keys: bool) -> Self {
        let first_key = keys.start;
        let (k, v) = (k.slice(ndarray::s![keys.clone(), ..]), v.slice_move(ndarray::s![keys, ..]));
        let width = kernels::key_panel_width::<T>();
        let panel_len = k.ncols() * KEY_VECTORS;
        let panels = if pack_keys { k.nrows().div_ceil(width) } else { 0 };
        let mut keys = vec![V::<T>::default(); panels * panel_len];
        // Two panels (128 keys) per task, so that even a small problem (n = 256: 4 panels) hands
        // half its packing to another thread: that thread is then awake when the query blocks
        // are handed out. At 8 panels per task, n = 256 packed on one thread and its second
        // thread woke too late to take a block (2 threads ran no faster than 1).
        keys.par_chunks_mut(panel_len)
            .with_min_len(2)
            .enumerate()
            .for_each(|(p, panel)| kernels::pack_key_panel(k, p * width, panel));
        let value_vectors = kernels::vectors_for::<T>(v.ncols());
        if v.ncols() % V::<T>::LANES == 0
            && let Some(values) = v.to_slice()
        {
            return Packed { first_key, keys, values: Values::Borrowed(values), value_vectors };
        }
        let mut values = vec![V::<T>::default(); v.nrows() * value_vectors];
        // Chunks of rows, so that each task does a useful amount of copying.
        const ROWS: usize = 256;
        values.par_chunks_mut(ROWS * value_vectors).enumerate().for_each(|(c, chunk)| {
            for (r, out) in chunk.chunks_exact_mut(value_vectors).enumerate() {
                kernels::pack_value_row(v.row(c * ROWS + r), out);
            }
        });
        Packed { first_key, keys, values: Values::Packed(values), value_vectors }
    }

    /// The values of key `key` onwards, as scalars.
    fn values_from(&self, key: usize) -> &[T] {
        let offset = (key - self.first_key) * self.value_vectors * V::<T>::LANES;
        match &self.values {
            Values::Borrowed(values) => &values[offset..],
            Values::Packed(values) => &V::<T>::scalars(values)[offset..],
        }
    }
}

/// Everything a task reads.
struct Problem<'p, 'o, 'a, T: Real> {
    shape: Shape,
    q: ArrayView2<'p, T>,
    k: ArrayView2<'p, T>,
    /// Scores from the key rows themselves (`kernels::direct_scores`), no packed keys.
    direct: bool,
    masks: &'p MaskSet<'o, 'a, T>,
}

/// The online-softmax state of a block of query rows over some keys: running maximum `m`, running
/// sum `l` of `exp(s - m)`, and the unnormalised output `o = Σ exp(s - m) · v`.
struct State<T: Real> {
    m: Vec<T>,
    l: Vec<T>,
    o: Vec<V<T>>,
    value_vectors: usize,
}

impl<T: Real> Problem<'_, '_, '_, T> {
    /// The state of queries `first .. first + rows` over the keys in `keys` (whole key blocks
    /// from a block boundary, except at the end).
    fn attend_block(&self, packed: &Packed<T>, first: usize, rows: usize, keys: Range<usize>) -> State<T> {
        let (d, dv) = (self.shape.key_dim, packed.value_vectors);
        let masks = self.masks;
        let width = kernels::key_panel_width::<T>();
        let s_stride = kernels::vectors_for::<T>(KEY_BLOCK);
        let mut state = State {
            m: vec![T::neg_infinity(); rows],
            l: vec![T::zero(); rows],
            o: vec![V::<T>::default(); rows * dv],
            value_vectors: dv,
        };
        // Causal: keys from `reach` on are hidden from every row of the block, so their blocks
        // are skipped; blocks ending by `clean_below` are visible to every row and need no mask.
        let reach = masks.visible_keys(first + rows - 1).end.min(keys.end);
        let elementwise = masks.has_elementwise_masks();
        let clean_below = if elementwise { 0 } else { masks.visible_keys(first).end };
        if keys.start >= reach {
            return state;
        }
        let mut q = vec![T::zero(); rows * d];
        let scale = T::from_f64_round(masks.scale);
        if self.direct {
            kernels::pack_query_rows(self.q, first, rows, scale, &mut q);
        } else {
            kernels::pack_queries(self.q, first, rows, scale, &mut q);
        }
        let mut s = vec![V::<T>::default(); rows * s_stride];
        let mut row_max = vec![V::<T>::default(); rows];
        let (mut m_prev, mut sums, mut alpha) =
            (vec![T::zero(); rows], vec![T::zero(); rows], vec![T::one(); rows]);
        for start in (keys.start..reach).step_by(KEY_BLOCK) {
            let n_keys = KEY_BLOCK.min(reach - start);
            let panels = n_keys.div_ceil(width);
            let panel0 = (start - packed.first_key) / width * d * KEY_VECTORS;
            if self.direct {
                let k = self.k.slice(ndarray::s![start..start + n_keys, ..]);
                kernels::direct_scores(&q, rows, k, &mut s, s_stride);
            } else {
                let keys = &packed.keys[panel0..];
                // A causal tile on the diagonal: each group of rows needs the keys up to its
                // last row's visible end; the scores past it are hidden below.
                let trim = !elementwise && start + n_keys > clean_below;
                let group_keys = |g: usize| {
                    if trim {
                        let last = first + (g + kernels::SCORE_ROWS).min(rows) - 1;
                        masks.visible_keys(last).end.saturating_sub(start)
                    } else {
                        usize::MAX
                    }
                };
                kernels::scores(&q, d, rows, keys, panels, &mut s, s_stride, &mut row_max, group_keys);
            }
            let used = kernels::vectors_for::<T>(n_keys);
            let clean = start + n_keys <= clean_below;
            // The maxima the score kernel folded are exact for a tile without masks whose panels
            // hold only its own keys; otherwise masked pairs, padding or keys past `reach` are in
            // them, and the row is scanned again.
            let fused_max = !self.direct && clean && n_keys == panels * width;
            for r in 0..rows {
                let row = &mut s[r * s_stride..r * s_stride + used];
                let scalars = V::<T>::scalars_mut(row);
                // Lanes past the block's last key (padding in the packed keys) take no part.
                scalars[n_keys..].fill(T::neg_infinity());
                if elementwise {
                    masks.apply_row(first + r, start..start + n_keys, &mut scalars[..n_keys]);
                } else if !clean {
                    // Causal alone: hide the keys past the row's visible range, without the
                    // per-pair checks of `apply_row` (same rule, from `visible_keys`).
                    let end = masks.visible_keys(first + r).end.clamp(start, start + n_keys);
                    scalars[end - start..n_keys].fill(T::neg_infinity());
                }
                let tile_max = if fused_max { row_max[r].reduce_max() } else { kernels::row_max(row) };
                m_prev[r] = state.m[r];
                state.m[r] = m_prev[r].max(tile_max);
                if state.m[r] == T::neg_infinity() {
                    // Nothing visible yet: the row contributes nothing and its state stays empty.
                    row.fill(V::<T>::default());
                    sums[r] = T::zero();
                } else {
                    sums[r] = kernels::exp_and_sum(row, state.m[r]);
                }
            }
            kernels::exp_differences(&m_prev, &state.m, &mut alpha);
            for r in 0..rows {
                if state.m[r] == T::neg_infinity() {
                    alpha[r] = T::one();
                }
                state.l[r] = state.l[r] * alpha[r] + sums[r];
            }
            let values = packed.values_from(start);
            if clean || elementwise {
                let weights = kernels::Weights { p: &s, stride: s_stride, rows, n_keys };
                kernels::accumulate_values(weights, &alpha, values, dv, &mut state.o);
            } else {
                // A causal tile on the diagonal: each group of rows stops at the last key its
                // last row sees. The weights past it are exact zeros, so the sums are unchanged
                // and about half of the diagonal's `P·V` work is skipped.
                for g in (0..rows).step_by(kernels::VALUE_ROWS) {
                    let mr = kernels::VALUE_ROWS.min(rows - g);
                    let end = masks.visible_keys(first + g + mr - 1).end.clamp(start, start + n_keys);
                    let weights = kernels::Weights {
                        p: &s[g * s_stride..],
                        stride: s_stride,
                        rows: mr,
                        n_keys: end - start,
                    };
                    let o = &mut state.o[g * dv..(g + mr) * dv];
                    kernels::accumulate_values(weights, &alpha[g..g + mr], values, dv, o);
                }
            }
        }
        state
    }
}

impl<T: Real> State<T> {
    /// Folds `other` (the same rows over other keys) into `self`: both are rescaled to the larger
    /// maximum before their sums and outputs are added.
    fn merge(&mut self, other: &State<T>) {
        let dv = self.value_vectors;
        for r in 0..self.m.len() {
            let m = self.m[r].max(other.m[r]);
            if m == T::neg_infinity() {
                continue;
            }
            let (a, b) = ((self.m[r] - m).exp(), (other.m[r] - m).exp());
            self.l[r] = self.l[r] * a + other.l[r] * b;
            self.m[r] = m;
            let (va, vb) = (V::<T>::splat(a), V::<T>::splat(b));
            for (x, &y) in self.o[r * dv..(r + 1) * dv].iter_mut().zip(&other.o[r * dv..(r + 1) * dv]) {
                *x = y.mul_add(vb, x.mul(va));
            }
        }
    }

    /// Writes `o / l` into `out`; a row with nothing visible (`l = 0`) gets zeros.
    fn write(&self, out: &mut ArrayViewMut2<T>) {
        let dv = self.value_vectors;
        for (r, mut out_row) in out.rows_mut().into_iter().enumerate() {
            let l = self.l[r];
            let o = V::<T>::scalars(&self.o[r * dv..(r + 1) * dv]);
            let divide = |(x, &acc): (&mut T, &T)| *x = if l > T::zero() { acc / l } else { T::zero() };
            // A contiguous row as a slice, so that the divisions vectorise.
            match out_row.as_slice_mut() {
                Some(row) => row.iter_mut().zip(o).for_each(divide),
                None => out_row.iter_mut().zip(o).for_each(divide),
            }
        }
    }
}

#[cfg(test)]
mod tests;
