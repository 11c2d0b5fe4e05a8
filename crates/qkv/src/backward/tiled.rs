//! The tiled backward (FlashAttention-2's): the weights are recomputed tile by tile from `Q`, `K`
//! and the saved logsumexp, never stored, in two passes of independent blocks.
//!
//! A tile is `QUERY_BLOCK` query rows × `KEY_BLOCK` keys, as in the forward (`flash.rs`): scores
//! `S = Q·Kᵀ · scale` from the same packed panels and score kernel, the same masking
//! (`flash::mask_tile`, `flash::BlockKeys` for the tiles every row skips), then `P = exp(S - lse)`,
//! `dP = dO·Vᵀ` (the score kernel again, on `dO` and the value panels) and
//! `dS = P ∘ (dP - δ)` with `δ = rowsum(dO ∘ O)`.
//!
//! - Pass 1, one work item per (key/value head, key block): `dV_j = Σ_i Pᵀ·dO_i` and
//!   `dK_j = Σ_i dSᵀ·Q_i · scale`, over the query blocks `i` of every query head that reads the
//!   key/value head, in the order of heads and blocks.
//! - Pass 2, one work item per (query head, query block): `dQ_i = Σ_j dS·K_j · scale` over the
//!   key blocks `j` in order, and `dBias = dS` when asked for.
//!
//! Each gradient block is owned by one item, which sums its terms in a fixed order, so nothing
//! is reduced across items and the result is the same bit for bit for any number of threads.
//! The price is computing `S`, `P` and `dP` twice (14 `n²d` FLOPs where a shared `dQ`
//! accumulator would take 10). Memory beyond the inputs and gradients is the packed operands
//! (linear in `n`) and a few tiles per thread.

use std::ops::Range;

use ndarray::{ArrayView1, ArrayView2, ArrayViewMut2, Axis};

use crate::flash::{BlockKeys, aligned_prefix, mask_tile, prefix};
use crate::kernels::{
    self, Buffer, Isa, Job, KEY_BLOCK, Kernels, Rows, RowsMut, ScoreTile, ValueRows, Weights,
};
use crate::mask::MaskSet;
use crate::real::Real;
use crate::shape::{Magnitudes, Shape};
use crate::work;

/// Whether no intermediate of the backward can overflow `T`: the forward's bound on the scores
/// and value sums, and for the gradients `dP = dO·Vᵀ` (at most `d_v · |dO| · |V|`), `δ` (at most
/// `d_v · |dO| · |O|`), and sums of `n` such terms times a query or key.
pub(crate) fn stays_finite<T: Real>(
    shape: &Shape,
    magnitudes: &Magnitudes,
    gradient_or_output: f64,
    masks: &MaskSet<'_, T>,
) -> bool {
    let limit = T::max_value().to_f64_exact() / 16.0;
    let dp = shape.value_dim as f64 * gradient_or_output * (magnitudes.values + gradient_or_output);
    let n = (shape.n_queries + shape.n_keys) as f64;
    let sums = n * dp * (1.0 + masks.scale.abs() * magnitudes.queries.max(magnitudes.keys));
    crate::flash::stays_finite(shape, magnitudes, masks) && sums <= limit
}

/// One query head of a backward call: its queries, the saved forward, the output's gradient, its
/// masks, the key/value head it reads, and where its gradients go.
pub(crate) struct QueryHead<'a, 'out, T> {
    pub(crate) q: ArrayView2<'a, T>,
    pub(crate) output: ArrayView2<'a, T>,
    pub(crate) logsumexp: ArrayView1<'a, T>,
    pub(crate) d_output: ArrayView2<'a, T>,
    pub(crate) masks: MaskSet<'a, T>,
    /// The index of its key/value head in the call's list.
    pub(crate) kv: usize,
    pub(crate) dq: ArrayViewMut2<'out, T>,
    pub(crate) dbias: Option<ArrayViewMut2<'out, T>>,
}

/// One key/value head of a backward call, and where its gradients go.
pub(crate) struct KvHead<'a, 'out, T> {
    pub(crate) k: ArrayView2<'a, T>,
    pub(crate) v: ArrayView2<'a, T>,
    pub(crate) dk: ArrayViewMut2<'out, T>,
    pub(crate) dv: ArrayViewMut2<'out, T>,
}

/// The gradients of every head of a checked problem of shape `shape`, with the kernels of `isa`.
/// Each query head names its key/value head; the work items of all heads are shared out together.
pub(crate) fn backward<'a, 'out, T: Real>(
    isa: Isa,
    shape: &Shape,
    queries: Vec<QueryHead<'a, 'out, T>>,
    kv: Vec<KvHead<'a, 'out, T>>,
) {
    isa.run(Backward { shape: *shape, queries, kv });
}

/// One call's operands, waiting for its kernels.
struct Backward<'a, 'out, T> {
    shape: Shape,
    queries: Vec<QueryHead<'a, 'out, T>>,
    kv: Vec<KvHead<'a, 'out, T>>,
}

/// A query head's operands in the kernels' layouts.
struct QueryOperands<'a, T: Real> {
    masks: MaskSet<'a, T>,
    kv: usize,
    /// Scaled queries packed for the score kernel, block `b` at `b · QUERY_BLOCK · d_k`.
    q_packed: Vec<T>,
    /// `dO` packed the same way (unscaled), block `b` at `b · QUERY_BLOCK · d_v`.
    d_output_packed: Vec<T>,
    /// Query rows, `key_stride` apart: the rows `dK` sums.
    q_rows: Buffer<T>,
    /// `dO` rows, `value_stride` apart: the rows `dV` sums.
    d_output_rows: Buffer<T>,
    logsumexp: Vec<T>,
    /// `δ_i = Σ_c dO[i, c] · O[i, c]`.
    delta: Vec<T>,
}

/// A key/value head's operands in the kernels' layouts.
struct KeyOperands<T: Real> {
    /// Key panels (see `kernels::pack_key_panel`), `d_k` scalars per key.
    k_panels: Buffer<T>,
    /// Value panels, `d_v` scalars per key: the "keys" of `dP = dO·Vᵀ`.
    v_panels: Buffer<T>,
    /// Key rows, `key_stride` apart: the rows `dQ` sums.
    k_rows: Buffer<T>,
}

/// The buffers a work item borrows, one set per thread (see `work::map_items`); every item writes
/// what it reads of them first.
struct Scratch<T: Real> {
    /// Scores, then weights `P`: `KEY_BLOCK` per row.
    s: Buffer<T>,
    /// `dP`, then `dS`.
    dp: Buffer<T>,
    /// The score kernel's lane-wise maxima (unused here, but the kernel writes them).
    row_max: Buffer<T>,
    sums: Vec<T>,
    /// Gradient accumulators.
    first: Buffer<T>,
    second: Buffer<T>,
}

impl<T: Real> Default for Scratch<T> {
    fn default() -> Self {
        let zeros = || Buffer::zeros(0);
        Scratch {
            s: zeros(),
            dp: zeros(),
            row_max: zeros(),
            sums: Vec::new(),
            first: zeros(),
            second: zeros(),
        }
    }
}

/// Rows of `x` packed `stride` scalars apart (zeros past each row's end).
fn rows_buffer<T: Real>(x: ArrayView2<T>, stride: usize) -> Buffer<T> {
    let mut rows = Buffer::zeros(x.nrows() * stride);
    for (row, out) in x.rows().into_iter().zip(rows.chunks_exact_mut(stride)) {
        kernels::pack_value_row(row, out);
    }
    rows
}

/// Every key panel of `x` (`KEY_PANEL` keys of `x.ncols()` scalars each, zero-padded).
fn panels<T: Real>(x: ArrayView2<T>, key_panel: usize) -> Buffer<T> {
    let width = x.ncols();
    let mut panels = Buffer::zeros(x.nrows().div_ceil(key_panel) * key_panel * width);
    for (p, panel) in panels.chunks_exact_mut(key_panel * width).enumerate() {
        kernels::pack_key_panel(x, p * key_panel, key_panel, panel);
    }
    panels
}

/// Queries `x` packed block by block for the score kernel, times `scale`.
fn packed_blocks<T: Real, K: Kernels<T>>(x: ArrayView2<T>, scale: T) -> Vec<T> {
    let (n, d) = (x.nrows(), x.ncols());
    let mut out = vec![T::zero(); n.div_ceil(K::QUERY_BLOCK) * K::QUERY_BLOCK * d];
    for (b, block) in out.chunks_exact_mut(K::QUERY_BLOCK * d).enumerate() {
        let rows = K::QUERY_BLOCK.min(n - b * K::QUERY_BLOCK);
        let padded = rows.next_multiple_of(K::TILE_ROWS);
        kernels::pack_queries(x, b * K::QUERY_BLOCK, rows, scale, K::TILE_ROWS, &mut block[..padded * d]);
    }
    out
}

/// What both passes read: the shape, the strides and every head's operands.
struct Operands<'a, T: Real> {
    shape: Shape,
    key_stride: usize,
    value_stride: usize,
    queries: Vec<QueryOperands<'a, T>>,
    keys: Vec<KeyOperands<T>>,
}

impl<T: Real> Job<T> for Backward<'_, '_, T> {
    type Output = ();

    fn run<K: Kernels<T>>(self, kernels: K) {
        let Backward { shape, queries, kv } = self;
        let key_stride = shape.key_dim.div_ceil(K::LANES) * K::LANES;
        let value_stride = shape.value_dim.div_ceil(K::LANES) * K::LANES;
        let mut query_outputs = Vec::with_capacity(queries.len());
        let query_operands = queries
            .into_iter()
            .map(|head| {
                let QueryHead { q, output, logsumexp, d_output, masks, kv, dq, dbias } = head;
                query_outputs.push((dq, dbias));
                let delta = output
                    .rows()
                    .into_iter()
                    .zip(d_output.rows())
                    .map(|(o, d_o)| {
                        let dot: f64 =
                            o.iter().zip(d_o).map(|(a, b)| a.to_f64_exact() * b.to_f64_exact()).sum();
                        T::from_f64_round(dot)
                    })
                    .collect();
                QueryOperands {
                    masks,
                    kv,
                    q_packed: packed_blocks::<T, K>(q, T::from_f64_round(masks.scale)),
                    d_output_packed: packed_blocks::<T, K>(d_output, T::one()),
                    q_rows: rows_buffer(q, key_stride),
                    d_output_rows: rows_buffer(d_output, value_stride),
                    logsumexp: logsumexp.to_vec(),
                    delta,
                }
            })
            .collect();
        let mut key_outputs = Vec::with_capacity(kv.len());
        let key_operands = kv
            .into_iter()
            .map(|KvHead { k, v, dk, dv }| {
                key_outputs.push((dk, dv));
                KeyOperands {
                    k_panels: panels(k, K::KEY_PANEL),
                    v_panels: panels(v, K::KEY_PANEL),
                    k_rows: rows_buffer(k, key_stride),
                }
            })
            .collect();
        let operands =
            Operands { shape, key_stride, value_stride, queries: query_operands, keys: key_operands };
        // The backward is about 3.5 times the forward's work.
        let flops = 3.5 * shape.flops() * operands.queries.len() as f64;
        let parallel = work::worth_sharing(flops, false);
        operands.key_pass(kernels, key_outputs, parallel);
        operands.query_pass(kernels, query_outputs, parallel);
    }
}

/// A tile's weights `P` (in `s`) and `dS` (in `dp`), `rows` rows of `KEY_BLOCK` scalars over
/// `n_keys` keys.
struct Tile {
    rows: usize,
    n_keys: usize,
}

impl<T: Real> Operands<'_, T> {
    /// Pass 1: `dK` and `dV`, one item per (key/value head, key block), writing its rows of each.
    fn key_pass<K: Kernels<T>>(
        &self,
        kernels: K,
        outputs: Vec<(ArrayViewMut2<T>, ArrayViewMut2<T>)>,
        parallel: bool,
    ) {
        let mut items = Vec::new();
        for (g, (dk, dv)) in outputs.into_iter().enumerate() {
            let blocks = dk
                .into_axis_chunks_iter_mut(Axis(0), KEY_BLOCK)
                .zip(dv.into_axis_chunks_iter_mut(Axis(0), KEY_BLOCK));
            items.extend(blocks.enumerate().map(|(j, (dk, dv))| (g, j, dk, dv)));
        }
        let scale = T::from_f64_round(self.queries.first().map_or(1.0, |h| h.masks.scale));
        let item =
            |scratch: &mut Scratch<T>,
             (g, j, mut dk, mut dv): (usize, usize, ArrayViewMut2<T>, ArrayViewMut2<T>)| {
                let keys = j * KEY_BLOCK..(j * KEY_BLOCK + KEY_BLOCK).min(self.shape.n_keys);
                let n_keys = keys.len();
                let mut dk_sum = std::mem::replace(&mut scratch.first, Buffer::zeros(0));
                let mut dv_sum = std::mem::replace(&mut scratch.second, Buffer::zeros(0));
                let dk_sum_rows = aligned_prefix(&mut dk_sum, n_keys * self.key_stride);
                let dv_sum_rows = aligned_prefix(&mut dv_sum, n_keys * self.value_stride);
                dk_sum_rows.fill(T::zero());
                dv_sum_rows.fill(T::zero());
                for (h, head) in self.queries.iter().enumerate().filter(|(_, head)| head.kv == g) {
                    for b in 0..self.shape.n_queries.div_ceil(K::QUERY_BLOCK) {
                        let Some(tile) = self.tile(kernels, h, b, keys.clone(), scratch) else { continue };
                        let first = b * K::QUERY_BLOCK;
                        let weights = Weights { p: &scratch.s, rows: tile.rows, n_keys };
                        let d_output = self.value_rows::<K>(&head.d_output_rows, first);
                        kernels.accumulate_transposed(weights, d_output, dv_sum_rows);
                        let weights = Weights { p: &scratch.dp, rows: tile.rows, n_keys };
                        let q = ValueRows {
                            v: &head.q_rows[first * self.key_stride..],
                            stride: self.key_stride,
                            vectors: self.key_stride / K::LANES,
                        };
                        kernels.accumulate_transposed(weights, q, dk_sum_rows);
                    }
                }
                write_rows(&mut dk, dk_sum_rows, self.key_stride, scale);
                write_rows(&mut dv, dv_sum_rows, self.value_stride, T::one());
                scratch.first = dk_sum;
                scratch.second = dv_sum;
            };
        work::map_items(items, parallel, Scratch::default, item);
    }

    /// Pass 2: `dQ` (and `dBias`), one item per (query head, query block), writing its rows.
    fn query_pass<K: Kernels<T>>(
        &self,
        kernels: K,
        outputs: Vec<(ArrayViewMut2<T>, Option<ArrayViewMut2<T>>)>,
        parallel: bool,
    ) {
        type Item<'o, T> = (usize, usize, ArrayViewMut2<'o, T>, Option<ArrayViewMut2<'o, T>>);
        let mut items: Vec<Item<T>> = Vec::new();
        for (h, (dq, dbias)) in outputs.into_iter().enumerate() {
            let dq = dq.into_axis_chunks_iter_mut(Axis(0), K::QUERY_BLOCK);
            match dbias {
                Some(dbias) => {
                    let dbias = dbias.into_axis_chunks_iter_mut(Axis(0), K::QUERY_BLOCK);
                    items.extend(dq.zip(dbias).enumerate().map(|(b, (dq, dbias))| (h, b, dq, Some(dbias))));
                }
                None => items.extend(dq.enumerate().map(|(b, dq)| (h, b, dq, None))),
            }
        }
        if self.queries.iter().any(|head| head.masks.is_causal()) {
            // A causal block's cost grows with its index: the costliest go first, so that the
            // threads finish together.
            items.reverse();
        }
        let item = |scratch: &mut Scratch<T>, (h, b, mut dq, mut dbias): Item<T>| {
            let head = &self.queries[h];
            let keys = &self.keys[head.kv];
            let first = b * K::QUERY_BLOCK;
            let rows = dq.nrows();
            let mut dq_sum = std::mem::replace(&mut scratch.first, Buffer::zeros(0));
            let dq_sum_rows = aligned_prefix(&mut dq_sum, rows * self.key_stride);
            dq_sum_rows.fill(T::zero());
            if let Some(dbias) = &mut dbias {
                dbias.fill(T::zero());
            }
            let ones = vec![T::one(); rows];
            let visible = BlockKeys::of(&head.masks, first, first + rows - 1).visible;
            let blocks = visible.start / KEY_BLOCK..visible.end.div_ceil(KEY_BLOCK);
            for j in blocks {
                let start = j * KEY_BLOCK;
                let key_range = start..(start + KEY_BLOCK).min(self.shape.n_keys);
                let Some(tile) = self.tile(kernels, h, b, key_range.clone(), scratch) else { continue };
                let weights = Weights { p: &scratch.dp, rows, n_keys: tile.n_keys };
                let k_rows = ValueRows {
                    v: &keys.k_rows[start * self.key_stride..],
                    stride: self.key_stride,
                    vectors: self.key_stride / K::LANES,
                };
                kernels.accumulate_values(weights, &ones, k_rows, dq_sum_rows);
                if let Some(dbias) = &mut dbias {
                    for (r, mut row) in
                        dbias.slice_mut(ndarray::s![.., key_range.clone()]).rows_mut().into_iter().enumerate()
                    {
                        row.iter_mut().zip(&scratch.dp[r * KEY_BLOCK..]).for_each(|(o, &x)| *o = x);
                    }
                }
            }
            write_rows(&mut dq, dq_sum_rows, self.key_stride, T::from_f64_round(head.masks.scale));
            scratch.first = dq_sum;
        };
        if self.shape.n_queries > 0 {
            work::map_items(items, parallel, Scratch::default, item);
        }
    }

    /// `dO` rows from query `first` on, as the `Pᵀ` tile reads them.
    fn value_rows<'b, K: Kernels<T>>(&self, rows: &'b Buffer<T>, first: usize) -> ValueRows<'b, T> {
        ValueRows {
            v: &rows[first * self.value_stride..],
            stride: self.value_stride,
            vectors: self.value_stride / K::LANES,
        }
    }

    /// Recomputes the tile of query head `h`'s block `b` over keys `keys` into `scratch`: `P` in
    /// `s` and `dS` in `dp`. `None` if the ranges hide every key of the tile from every row.
    fn tile<K: Kernels<T>>(
        &self,
        kernels: K,
        h: usize,
        b: usize,
        keys: Range<usize>,
        scratch: &mut Scratch<T>,
    ) -> Option<Tile> {
        let head = &self.queries[h];
        let operands = &self.keys[head.kv];
        let (d_k, d_v) = (self.shape.key_dim, self.shape.value_dim);
        let first = b * K::QUERY_BLOCK;
        let rows = K::QUERY_BLOCK.min(self.shape.n_queries - first);
        let padded = rows.next_multiple_of(K::TILE_ROWS);
        let block = BlockKeys::of(&head.masks, first, first + rows - 1);
        if keys.is_empty() || keys.end <= block.visible.start || keys.start >= block.visible.end {
            return None;
        }
        let clean = block.clean.start <= keys.start && keys.end <= block.clean.end;
        let n_keys = keys.len();
        let panels = n_keys.div_ceil(K::KEY_PANEL);
        let used = n_keys.next_multiple_of(K::LANES);
        let s = aligned_prefix(&mut scratch.s, padded * KEY_BLOCK);
        let dp = aligned_prefix(&mut scratch.dp, padded * KEY_BLOCK);
        let row_max = aligned_prefix(&mut scratch.row_max, padded * K::LANES);
        let sums = prefix(&mut scratch.sums, rows);
        let tile = ScoreTile {
            q: &head.q_packed[first * d_k..][..padded * d_k],
            d: d_k,
            rows: padded,
            keys: &operands.k_panels[keys.start * d_k..],
            panels,
            s: &mut *s,
            row_max: &mut *row_max,
        };
        kernels.scores(tile, None);
        mask_tile(&head.masks, &|r| first + r, rows, keys.clone(), used, clean, &mut *s);
        let lse = &head.logsumexp[first..first + rows];
        kernels.exp_rows(RowsMut { data: &mut *s, stride: KEY_BLOCK, rows }, used, lse, sums);
        let tile = ScoreTile {
            q: &head.d_output_packed[first * d_v..][..padded * d_v],
            d: d_v,
            rows: padded,
            keys: &operands.v_panels[keys.start * d_v..],
            panels,
            s: &mut *dp,
            row_max,
        };
        kernels.scores(tile, None);
        let p = Rows { data: &*s, stride: KEY_BLOCK, rows };
        kernels.softmax_gradient(
            p,
            RowsMut { data: dp, stride: KEY_BLOCK, rows },
            used,
            &head.delta[first..first + rows],
        );
        Some(Tile { rows, n_keys })
    }
}

/// Writes accumulated rows (`stride` scalars apart) times `factor` into `out`.
fn write_rows<T: Real>(out: &mut ArrayViewMut2<T>, sums: &[T], stride: usize, factor: T) {
    for (mut row, sum) in out.rows_mut().into_iter().zip(sums.chunks_exact(stride)) {
        row.iter_mut().zip(sum).for_each(|(o, &x)| *o = x * factor);
    }
}
