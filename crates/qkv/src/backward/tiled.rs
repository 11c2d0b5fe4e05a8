//! The tiled backward (FlashAttention-2's): the weights are recomputed tile by tile from `Q`, `K`
//! and the saved logsumexp, never stored, in two passes of independent blocks.
//!
//! A tile is `QUERY_BLOCK` query rows × `KEY_BLOCK` keys, as in the forward (`flash.rs`) at the
//! vector levels, whose kernels the backward computes with (a pair level's `Kernels::Widened`,
//! even where its scores come from the pair level's tiles, in rows of that stride): scores
//! `S = Q·Kᵀ · scale` from the same packed panels and score kernel, the same masking
//! (`flash::mask_tile`, `flash::BlockKeys` for the tiles every row skips), then `P = exp(S - lse)`,
//! `dP = dO·Vᵀ` (the score kernel again, on `dO` and the value panels; at a pair level both
//! read the stored bf16, see [`Tiling`]) and `dS = P ∘ (dP - δ)` with `δ = rowsum(dO ∘ O)`. An
//! attention sink is in the saved logsumexp, so `P` is right as it stands; its own gradient is
//! `-Σ_i exp(s - lse_i) · δ_i`. Under a soft-cap, `dS` is multiplied by the cap's derivative at
//! the raw scores (`MaskSet::softcap_derivative`) after `dBias = dS` is written and before it
//! reaches `dQ` and `dK`.
//!
//! The work items are (key/value head, chunk of key blocks). An item visits its key blocks in
//! order and, for each, the query blocks of every query head that reads the key/value head (in
//! the order of heads and blocks), accumulating `dV_j += Pᵀ·dO_i` and `dK_j += dSᵀ·Q_i · scale`
//! for the key block, which it then writes, and its own part of `dQ_i += dS·K_j · scale` for
//! every query row; `dBias = dS` is written where asked for. The parts of `dQ` are added in chunk
//! order once every item is done. The number of chunks depends on the problem's size alone
//! ([`CHUNKS`] over the call, whole heads once there are that many), so each gradient is summed in
//! the same order whatever the number of threads, and the result is the same bit for bit. Each
//! tile is computed once: 10 `n²d` FLOPs. Memory beyond the inputs and gradients is the packed
//! operands and the parts of `dQ` (linear in `n`) and a few tiles per thread.

use std::ops::Range;

use ndarray::{ArrayView1, ArrayView2, ArrayViewMut2, Axis};

use crate::element::Real;
use crate::flash::{BlockKeys, aligned_prefix, mask_tile, prefix};
use crate::kernels::{
    self, Buffer, Element, Isa, Job, KEY_BLOCK, Kernels, Layout, Rows, RowsMut, ScoreTile, ValueRows, Weights,
};
use crate::masking::MaskSet;
use crate::shape::{Magnitudes, Shape};
use crate::softmax;
use crate::{spare, work};

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

/// One query head of a backward call: its queries and the output's gradient (stored as `E`), the
/// saved forward, its masks, the key/value head it reads, and where its gradients go.
pub(crate) struct QueryHead<'a, 'out, T, E> {
    pub(crate) q: ArrayView2<'a, E>,
    pub(crate) output: ArrayView2<'a, T>,
    pub(crate) logsumexp: ArrayView1<'a, T>,
    pub(crate) d_output: ArrayView2<'a, E>,
    pub(crate) masks: MaskSet<'a, T>,
    /// The index of its key/value head in the call's list.
    pub(crate) kv: usize,
    pub(crate) dq: ArrayViewMut2<'out, T>,
    pub(crate) dbias: Option<ArrayViewMut2<'out, T>>,
}

/// One key/value head of a backward call (stored as `E`), and where its gradients go.
pub(crate) struct KvHead<'a, 'out, T, E> {
    pub(crate) k: ArrayView2<'a, E>,
    pub(crate) v: ArrayView2<'a, E>,
    pub(crate) dk: ArrayViewMut2<'out, T>,
    pub(crate) dv: ArrayViewMut2<'out, T>,
}

/// The gradients of every head of a checked problem of shape `shape`, with the kernels of `isa`.
/// Each query head names its key/value head; the work items of all heads are shared out together.
/// Returns each query head's attention-sink gradient `-Σ_i exp(s - lse_i) · δ_i`, in f64 (0
/// without a sink), in the order of `queries`.
///
/// Inputs stored as `E` (a half-precision format) are widened to `T` as they are packed: the
/// kernels compute from packed operands in `T`, as for `T` inputs, and no widened copy of a whole
/// input is made.
pub(crate) fn backward<'a, 'out, T: Real, E: Element<Compute = T>>(
    isa: Isa,
    shape: &Shape,
    queries: Vec<QueryHead<'a, 'out, T, E>>,
    kv: Vec<KvHead<'a, 'out, T, E>>,
) -> Vec<f64> {
    isa.run(Backward { shape: *shape, queries, kv })
}

/// One call's operands, waiting for its kernels.
struct Backward<'a, 'out, T, E> {
    shape: Shape,
    queries: Vec<QueryHead<'a, 'out, T, E>>,
    kv: Vec<KvHead<'a, 'out, T, E>>,
}

/// A query head's operands in the kernels' layouts.
struct QueryOperands<'a, T: Real> {
    masks: MaskSet<'a, T>,
    kv: usize,
    /// Scaled queries packed for the score kernel, block `b` at `b · QUERY_BLOCK · d_k`.
    q_packed: Buffer<T>,
    /// `dO` packed the same way (unscaled), block `b` at `b · QUERY_BLOCK · d_v`.
    d_output_packed: Buffer<T>,
    /// Query rows, `key_stride` apart: the rows `dK` sums.
    q_rows: Buffer<T>,
    /// `dO` rows, `value_stride` apart: the rows `dV` sums.
    d_output_rows: Buffer<T>,
    logsumexp: Vec<T>,
    /// `δ_i = Σ_c dO[i, c] · O[i, c]`.
    delta: Buffer<T>,
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
    /// Under a soft-cap, its derivative at each raw score of the tile (`KEY_BLOCK` per row).
    cap_derivative: Vec<T>,
    /// The score kernel's lane-wise maxima: never read here (`ScoreTile::maxima` is false), but
    /// the levels that fold them into the products write them.
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
            cap_derivative: Vec::new(),
            row_max: zeros(),
            sums: Vec::new(),
            first: zeros(),
            second: zeros(),
        }
    }
}

/// Packed scalars (of every piece of a call) from which the packing is shared with the pool: a
/// single head at d = 64 packs 56K at n = 128, where sharing it made the backward 8% slower on
/// two AVX-512 threads, and 112K at n = 256, where it made it 11% faster (Intel Xeon family 6
/// model 207, `repeat --backward N N 0 REPS`, calls back to back).
const SHARE_PACKING_FROM: usize = 1 << 16;

/// One input packed for the kernels, a piece of the work shared out before the tiles: each
/// piece zeroes the buffer it fills (taken on the calling thread, which keeps it afterwards).
enum Packing<'a, T: Real, E> {
    /// Blocks for the score kernel ([`packed_blocks`]), times `scale`.
    Blocks { x: ArrayView2<'a, E>, scale: T },
    /// Rows `stride` scalars apart ([`rows_buffer`]).
    Rows { x: ArrayView2<'a, E>, stride: usize },
    /// Key panels ([`panels`]).
    Panels { x: ArrayView2<'a, E> },
    /// `δ_i = Σ_c dO[i, c] · O[i, c]` of every row.
    Delta { output: ArrayView2<'a, T>, d_output: ArrayView2<'a, E> },
}

impl<T: Real, E: Element<Compute = T>> Packing<'_, T, E> {
    /// The scalars this piece writes, for the score products' `tiling`.
    fn len(&self, tiling: &Tiling) -> usize {
        match self {
            // Blocks are whole groups of tile rows: the last one only as many groups as it
            // fills (8 queries pack 12 rows at AVX-512, not a block of 48).
            Packing::Blocks { x, .. } => {
                x.nrows().next_multiple_of(tiling.tile_rows) * tiling.row_scalars(x.ncols())
            }
            Packing::Rows { x, stride } => x.nrows() * stride,
            Packing::Panels { x } => {
                x.nrows().div_ceil(tiling.key_panel) * tiling.key_panel * tiling.row_scalars(x.ncols())
            }
            Packing::Delta { output, .. } => output.nrows(),
        }
    }

    /// This piece, into `into`.
    fn pack(self, tiling: &Tiling, into: spare::Unzeroed<T>) -> Buffer<T> {
        let mut out = into.zeroed();
        match self {
            Packing::Blocks { x, scale } => packed_blocks(x, scale, tiling, &mut out),
            Packing::Rows { x, stride } => rows_buffer(x, stride, &mut out),
            Packing::Panels { x } => panels(x, tiling, &mut out),
            Packing::Delta { output, d_output } => {
                for ((o, d_o), delta) in output.rows().into_iter().zip(d_output.rows()).zip(out.iter_mut()) {
                    *delta = T::from_f64_round(row_dot(o, d_o));
                }
            }
        }
        out
    }
}

/// `Σ_c o[c] · d_o[c]` in f64, in eight running sums where both rows are contiguous: a single
/// chain of additions waits on each one's latency (the δ of one head at n = 1024, d = 128 took
/// 1.8% of its backward that way, on the calling thread).
fn row_dot<T: Real, E: Element<Compute = T>>(o: ArrayView1<T>, d_o: ArrayView1<E>) -> f64 {
    let product = |a: &T, b: &E| a.to_f64_exact() * b.widen().to_f64_exact();
    let (Some(o), Some(d_o)) = (o.as_slice(), d_o.as_slice()) else {
        return o.iter().zip(d_o).map(|(a, b)| product(a, b)).sum();
    };
    let mut sums = [0.0_f64; 8];
    let (o_whole, o_rest) = o.split_at(o.len() / 8 * 8);
    let (d_whole, d_rest) = d_o.split_at(o_whole.len());
    for (a, b) in o_whole.chunks_exact(8).zip(d_whole.chunks_exact(8)) {
        for ((sum, a), b) in sums.iter_mut().zip(a).zip(b) {
            *sum += product(a, b);
        }
    }
    let rest: f64 = o_rest.iter().zip(d_rest).map(|(a, b)| product(a, b)).sum();
    sums.iter().sum::<f64>() + rest
}

/// Rows of `x` widened to `T` into `out` (zeroed), `stride` scalars apart.
fn rows_buffer<T: Real, E: Element<Compute = T>>(x: ArrayView2<E>, stride: usize, out: &mut [T]) {
    for (row, out) in x.rows().into_iter().zip(out.chunks_exact_mut(stride)) {
        // A contiguous row as a slice: ndarray's element iterator is much slower.
        match row.as_slice() {
            Some(row) => out.iter_mut().zip(row).for_each(|(o, &x)| *o = x.widen()),
            None => out.iter_mut().zip(row).for_each(|(o, &x)| *o = x.widen()),
        }
    }
}

/// Every key panel of `x` into `panels` (zeroed), for the score products' `tiling`: in the lane
/// layout `key_panel` keys of `x.ncols()` scalars each, widened to `T` a panel's keys at a time
/// (`Element::computed`, which borrows `T` as it is) so that every panel is packed by `T`'s
/// transposes; in the pair layout as stored, two to a scalar.
fn panels<T: Real, E: Element<Compute = T>>(x: ArrayView2<E>, tiling: &Tiling, panels: &mut [T]) {
    let (n, key_panel) = (x.nrows(), tiling.key_panel);
    let panel_len = key_panel * tiling.row_scalars(x.ncols());
    for (p, panel) in panels.chunks_exact_mut(panel_len).enumerate() {
        let first = p * key_panel;
        match tiling.layout {
            Layout::Lanes => {
                let keys = E::computed(x.slice(ndarray::s![first..(first + key_panel).min(n), ..]));
                kernels::pack_key_panel(keys.view(), 0, key_panel, Layout::Lanes, panel);
            }
            Layout::Pairs => {
                let panel = wide::bytemuck::cast_slice_mut(panel);
                kernels::pack_key_panel(x, first, key_panel, Layout::Pairs, panel);
            }
        }
    }
}

/// Queries `x` packed block by block for the score products' `tiling` into `out` (zeroed), times
/// `scale` (1 in the pair layout, see [`Tiling::query_scale`], so the bf16 are kept as stored).
fn packed_blocks<T: Real, E: Element<Compute = T>>(
    x: ArrayView2<E>,
    scale: T,
    tiling: &Tiling,
    out: &mut [T],
) {
    let (n, width) = (x.nrows(), tiling.row_scalars(x.ncols()));
    let query_block = tiling.query_block;
    for (b, block) in out.chunks_mut(query_block * width).enumerate() {
        let rows = query_block.min(n - b * query_block);
        let padded = rows.next_multiple_of(tiling.tile_rows);
        let tiles = (tiling.tile_rows, tiling.layout);
        let factor =
            kernels::pack_queries(x, b * query_block, rows, scale, tiles, &mut block[..padded * width]);
        debug_assert!(factor == T::one(), "the scores take the scale the tiling gives them");
    }
}

/// How the score products `S = Q·Kᵀ` and `dP = dO·Vᵀ` read their packed operands, and the
/// blocks of query rows the whole backward takes.
///
/// At a lane level every operand is widened to `T` as it is packed, and queries carry the scale.
/// At a pair level (bf16 inputs on the tile unit, or on AVX512-BF16 where `Isa::backward` finds
/// that it pays) those two products read the stored bf16 as the forward's tiles do: each product
/// of two bf16 is exact in f32, so the scores are the lane levels' up to the order of the f32
/// sums, and are scaled afterwards. Everything else (the weights, `dS`, and the three products
/// that sum them) is computed in `T` from widened rows, by the level's [`Kernels::Widened`].
#[derive(Debug, Clone, Copy)]
struct Tiling {
    layout: Layout,
    tile_rows: usize,
    query_block: usize,
    key_panel: usize,
}

impl Tiling {
    /// The tiling of the score products of `K`.
    fn of<T: Real, E: Element<Compute = T>, K: Kernels<T, E>>() -> Tiling {
        match K::LAYOUT {
            Layout::Pairs => Tiling {
                layout: Layout::Pairs,
                tile_rows: K::TILE_ROWS,
                query_block: K::QUERY_BLOCK,
                key_panel: K::KEY_PANEL,
            },
            Layout::Lanes => Tiling {
                layout: Layout::Lanes,
                tile_rows: K::Widened::TILE_ROWS,
                query_block: K::Widened::QUERY_BLOCK,
                key_panel: K::Widened::KEY_PANEL,
            },
        }
    }

    /// Scalars of `T` per packed row of `d` components: `d` widened, or bf16 pairs.
    fn row_scalars(&self, d: usize) -> usize {
        match self.layout {
            Layout::Lanes => d,
            Layout::Pairs => self.layout.padded_dim(d) / 2,
        }
    }

    /// The factor packed queries are multiplied by for scores times `scale`: all of it in the
    /// lane layout, none in the pair layout, whose products apply it (see [`Self::scores`]).
    fn query_scale<T: Real>(&self, scale: T) -> T {
        match self.layout {
            Layout::Lanes => scale,
            Layout::Pairs => T::one(),
        }
    }

    /// `S = Q·Kᵀ · scale` (the lane layout's queries carry `scale` already) for `padded` packed
    /// query rows `q` of `d` components against `n_keys` packed keys `keys[first_key..]` into `s`
    /// (`KEY_BLOCK` per row), the panels that hold them; the scores past them, up to the next
    /// multiple of the lanes, may be left stale (a panel of 64 keys holding 8 computed them all:
    /// most of an 8 × 8-query backward's products, Zen 4).
    fn scores<T: Real, E: Element<Compute = T>, K: Kernels<T, E>>(
        &self,
        kernels: K,
        (q, padded, d): (&[T], usize, usize),
        (keys, first_key, n_keys): (&[T], usize, usize),
        scale: T,
        s: &mut [T],
        row_max: &mut [T],
    ) {
        let (q, keys) = (&q[..padded * self.row_scalars(d)], &keys[first_key * self.row_scalars(d)..]);
        let panels = n_keys.div_ceil(self.key_panel);
        let needed = |_: usize| n_keys;
        let group_keys = (n_keys % self.key_panel != 0).then_some(&needed as &dyn Fn(usize) -> usize);
        match self.layout {
            Layout::Lanes => {
                let tile = ScoreTile {
                    q,
                    scale: T::one(),
                    d,
                    rows: padded,
                    real_rows: padded,
                    keys,
                    panels,
                    s,
                    stride: KEY_BLOCK,
                    row_max,
                    maxima: false,
                };
                kernels.widened().scores(tile, group_keys);
            }
            Layout::Pairs => {
                let keys = wide::bytemuck::cast_slice(keys);
                let (rows, stride) = (padded, KEY_BLOCK);
                let tile = ScoreTile {
                    q,
                    scale,
                    d,
                    rows,
                    real_rows: rows,
                    keys,
                    panels,
                    s,
                    stride,
                    row_max,
                    maxima: false,
                };
                kernels.scores(tile, group_keys);
            }
        }
    }
}

/// What both passes read: the shape, the tiling, the strides and every head's operands.
struct Operands<'a, T: Real> {
    shape: Shape,
    tiling: Tiling,
    key_stride: usize,
    value_stride: usize,
    queries: Vec<QueryOperands<'a, T>>,
    keys: Vec<KeyOperands<T>>,
}

impl<T: Real, E: Element<Compute = T>> Job<E> for Backward<'_, '_, T, E> {
    type Output = Vec<f64>;

    fn run<K: Kernels<T, E>>(self, kernels: K) -> Vec<f64> {
        let Backward { shape, queries, kv } = self;
        assert_eq!(K::Widened::KEY_BLOCK, KEY_BLOCK, "the backward's tiles are the vector levels'");
        let tiling = Tiling::of::<T, E, K>();
        let lanes = K::Widened::LANES;
        let key_stride = shape.key_dim.div_ceil(lanes) * lanes;
        let value_stride = shape.value_dim.div_ceil(lanes) * lanes;
        // The backward is 2.5 times the forward's work.
        let flops = 2.5 * shape.flops() * queries.len() as f64;
        let parallel = work::worth_sharing(flops, false, lanes);
        let mut query_outputs = Vec::with_capacity(queries.len());
        let mut query_heads = Vec::with_capacity(queries.len());
        let mut packings = Vec::new();
        for QueryHead { q, output, logsumexp, d_output, masks, kv, dq, dbias } in queries {
            query_outputs.push((dq, dbias));
            query_heads.push((masks, kv, logsumexp));
            packings.extend([
                Packing::Blocks { x: q, scale: tiling.query_scale(T::from_f64_round(masks.scale)) },
                Packing::Blocks { x: d_output, scale: T::one() },
                Packing::Rows { x: q, stride: key_stride },
                Packing::Rows { x: d_output, stride: value_stride },
                Packing::Delta { output, d_output },
            ]);
        }
        let mut key_outputs = Vec::with_capacity(kv.len());
        for KvHead { k, v, dk, dv } in kv {
            key_outputs.push((dk, dv));
            packings.extend([
                Packing::Panels { x: k },
                Packing::Panels { x: v },
                Packing::Rows { x: k, stride: key_stride },
            ]);
        }
        // The buffers are taken here, on the calling thread, which keeps them for its next call
        // (`spare`); the pieces zero and fill them wherever they run, shared out when they are
        // large enough to pay for a second hand-over to the pool.
        let pieces: Vec<_> = packings.into_iter().map(|p| (spare::take(p.len(&tiling)), p)).collect();
        let scalars: usize = pieces.iter().map(|(into, _)| into.len()).sum();
        let share_packing = parallel && scalars >= SHARE_PACKING_FROM;
        let packed = work::map_items(pieces, share_packing, || (), |_, (into, p)| p.pack(&tiling, into));
        let mut packed = packed.into_iter();
        let mut next = || packed.next().expect("a buffer for every piece");
        let mut sink_gradients = Vec::with_capacity(query_heads.len());
        let query_operands = query_heads
            .into_iter()
            .map(|(masks, kv, logsumexp)| {
                let (q_packed, d_output_packed, q_rows, d_output_rows, delta) =
                    (next(), next(), next(), next(), next());
                // The sink has no value, so its weight's gradient is `P_sink · (0 - δ)` per row.
                let sink = masks.sink(0).map(T::to_f64_exact);
                let sink_gradient = logsumexp.iter().zip(delta.iter()).fold(0.0, |sum, (lse, d)| {
                    sum - softmax::sink_weight(sink, lse.to_f64_exact()) * d.to_f64_exact()
                });
                sink_gradients.push(sink_gradient);
                QueryOperands {
                    masks,
                    kv,
                    q_packed,
                    d_output_packed,
                    q_rows,
                    d_output_rows,
                    logsumexp: logsumexp.to_vec(),
                    delta,
                }
            })
            .collect();
        let key_operands = (0..key_outputs.len())
            .map(|_| KeyOperands { k_panels: next(), v_panels: next(), k_rows: next() })
            .collect();
        let operands =
            Operands { shape, tiling, key_stride, value_stride, queries: query_operands, keys: key_operands };
        operands.run::<E, K>(kernels, key_outputs, query_outputs, parallel);
        operands.keep();
        sink_gradients
    }
}

/// A tile's weights `P` (in `s`) and `dS` (in `dp`): `rows` rows of `KEY_BLOCK` scalars.
struct Tile {
    rows: usize,
}

/// The work items of a call aim at this many chunks of keys in all, so that a single head keeps
/// every core busy; a call of as many key/value heads or more takes each head's keys whole.
const CHUNKS: usize = 4;

/// Rows of `dQ` per piece of its final sum, shared out (a head of 1024 queries in four pieces).
const SUM_ROWS: usize = 256;

/// One work item: key/value head `kv`'s chunk of key blocks `blocks`, with its rows of `dK` and
/// `dV`, and for each query head reading it a buffer for its part of `dQ` (zeroed by the item)
/// and its columns of `dBias` when asked for.
struct Item<'o, T: Real> {
    kv: usize,
    blocks: Range<usize>,
    dk: ArrayViewMut2<'o, T>,
    dv: ArrayViewMut2<'o, T>,
    dq_parts: Vec<spare::Unzeroed<T>>,
    dbias: Vec<Option<ArrayViewMut2<'o, T>>>,
}

impl<T: Real> Operands<'_, T> {
    /// Every gradient, in one pass of items per (key/value head, chunk of key blocks), each
    /// visiting its key blocks in order and, for each, the query blocks of every query head that
    /// reads the key/value head, in the order of heads and blocks. An item writes its rows of `dK`
    /// and `dV` and its columns of `dBias`, and returns its part of `dQ` (every query row, summed
    /// over its keys); the parts are added in chunk order, so that no sum depends on which thread
    /// computed what. The number of chunks depends on the problem's size alone.
    fn run<E: Element<Compute = T>, K: Kernels<T, E>>(
        &self,
        kernels: K,
        key_outputs: Vec<(ArrayViewMut2<T>, ArrayViewMut2<T>)>,
        query_outputs: Vec<(ArrayViewMut2<T>, Option<ArrayViewMut2<T>>)>,
        parallel: bool,
    ) {
        let key_blocks = self.shape.n_keys.div_ceil(KEY_BLOCK);
        let per_chunk = key_blocks.div_ceil(CHUNKS.div_ceil(key_outputs.len().max(1))).max(1);
        let chunks = key_blocks.div_ceil(per_chunk);
        let chunk_keys = per_chunk * KEY_BLOCK;
        let (mut dq_heads, mut dbias_pieces) = (Vec::new(), Vec::new());
        for (dq, dbias) in query_outputs {
            dq_heads.push(dq);
            dbias_pieces.push(dbias.map(|d| d.into_axis_chunks_iter_mut(Axis(1), chunk_keys)));
        }
        let mut items = Vec::with_capacity(key_outputs.len() * chunks);
        for (kv, (dk, dv)) in key_outputs.into_iter().enumerate() {
            let rows = dk
                .into_axis_chunks_iter_mut(Axis(0), chunk_keys)
                .zip(dv.into_axis_chunks_iter_mut(Axis(0), chunk_keys));
            for (c, (dk, dv)) in rows.enumerate() {
                let dbias = self
                    .group(kv)
                    .map(|h| {
                        dbias_pieces[h].as_mut().map(|pieces| pieces.next().expect("one piece per chunk"))
                    })
                    .collect();
                let blocks = c * per_chunk..((c + 1) * per_chunk).min(key_blocks);
                // Taken here, on the calling thread, which keeps them for its next call (`spare`),
                // and zeroed by the item.
                let dq_parts =
                    self.group(kv).map(|_| spare::take(self.shape.n_queries * self.key_stride)).collect();
                items.push(Item { kv, blocks, dk, dv, dq_parts, dbias });
            }
        }
        let parts = work::map_items(items, parallel, Scratch::default, |scratch, item| {
            self.item::<E, K>(kernels, scratch, item)
        });
        // dQ of each query head: the parts of its key/value head's chunks added in chunk order,
        // `SUM_ROWS` rows at a time, shared out.
        let mut pieces = Vec::new();
        for (h, dq) in dq_heads.into_iter().enumerate() {
            let rows = dq.into_axis_chunks_iter_mut(Axis(0), SUM_ROWS);
            pieces.extend(rows.enumerate().map(|(c, rows)| (h, c * SUM_ROWS, rows)));
        }
        let scale = self.scale();
        work::map_items(pieces, parallel, Vec::new, |sum, (h, first, mut dq)| {
            let head = &self.queries[h];
            let index = self.group(head.kv).position(|g| g == h).expect("in its group");
            let Some((part, rest)) = parts[head.kv * chunks..(head.kv + 1) * chunks].split_first() else {
                dq.fill(T::zero()); // no keys
                return;
            };
            let stride = self.key_stride;
            for (r, mut out) in dq.rows_mut().into_iter().enumerate() {
                let row = (first + r) * stride..(first + r + 1) * stride;
                sum.clear();
                sum.extend_from_slice(&part[index][row.clone()]);
                for part in rest {
                    sum.iter_mut().zip(&part[index][row.clone()]).for_each(|(s, &x)| *s = *s + x);
                }
                out.iter_mut().zip(sum.iter()).for_each(|(o, &x)| *o = x * scale);
            }
        });
        parts.into_iter().flatten().for_each(spare::keep);
    }

    /// Hands every packed operand to `spare`, for the calling thread's next call.
    fn keep(self) {
        for head in self.queries {
            [head.q_packed, head.d_output_packed, head.q_rows, head.d_output_rows, head.delta]
                .into_iter()
                .for_each(spare::keep);
        }
        for head in self.keys {
            [head.k_panels, head.v_panels, head.k_rows].into_iter().for_each(spare::keep);
        }
    }

    /// The score multiplier, which every head of a call shares.
    fn scale(&self) -> T {
        T::from_f64_round(self.queries.first().map_or(1.0, |h| h.masks.scale))
    }

    /// The query heads that read key/value head `kv`, in order.
    fn group(&self, kv: usize) -> impl Iterator<Item = usize> + '_ {
        self.queries.iter().enumerate().filter(move |(_, head)| head.kv == kv).map(|(h, _)| h)
    }

    /// One item (see [`Self::run`]): returns its part of `dQ` for each query head of the group,
    /// rows `key_stride` apart, not yet scaled.
    fn item<E: Element<Compute = T>, K: Kernels<T, E>>(
        &self,
        kernels: K,
        scratch: &mut Scratch<T>,
        item: Item<T>,
    ) -> Vec<Buffer<T>> {
        let Item { kv, blocks, mut dk, mut dv, dq_parts, mut dbias } = item;
        let (widened, query_block) = (kernels.widened(), self.tiling.query_block);
        let mut dq_parts: Vec<Buffer<T>> = dq_parts.into_iter().map(spare::Unzeroed::zeroed).collect();
        let scale = self.scale();
        let heads: Vec<usize> = self.group(kv).collect();
        dbias.iter_mut().flatten().for_each(|d| d.fill(T::zero()));
        let ones = vec![T::one(); query_block];
        let (first_block, keys) = (blocks.start, &self.keys[kv]);
        let mut dk_sum = std::mem::replace(&mut scratch.first, Buffer::zeros(0));
        let mut dv_sum = std::mem::replace(&mut scratch.second, Buffer::zeros(0));
        for j in blocks {
            let start = j * KEY_BLOCK;
            let key_range = start..(start + KEY_BLOCK).min(self.shape.n_keys);
            let n_keys = key_range.len();
            let dk_sum_rows = aligned_prefix(&mut dk_sum, n_keys * self.key_stride);
            let dv_sum_rows = aligned_prefix(&mut dv_sum, n_keys * self.value_stride);
            dk_sum_rows.fill(T::zero());
            dv_sum_rows.fill(T::zero());
            let k_rows = ValueRows {
                v: &keys.k_rows[start * self.key_stride..],
                stride: self.key_stride,
                vectors: self.key_stride / K::Widened::LANES,
            };
            for ((&h, dq_part), dbias) in heads.iter().zip(&mut dq_parts).zip(&mut dbias) {
                let head = &self.queries[h];
                for b in 0..self.shape.n_queries.div_ceil(query_block) {
                    let Some(tile) = self.tile(kernels, h, b, key_range.clone(), scratch) else { continue };
                    let (first, rows) = (b * query_block, tile.rows);
                    let weights = Weights { p: &scratch.s, rows, n_keys };
                    widened.accumulate_transposed(
                        weights,
                        self.value_rows::<K::Widened>(&head.d_output_rows, first),
                        dv_sum_rows,
                    );
                    // A bias is added after any cap: its gradient is `dS` as it stands.
                    if let Some(dbias) = dbias {
                        let columns = (j - first_block) * KEY_BLOCK..(j - first_block) * KEY_BLOCK + n_keys;
                        let mut tile_rows = dbias.slice_mut(ndarray::s![first..first + rows, columns]);
                        for (r, mut row) in tile_rows.rows_mut().into_iter().enumerate() {
                            row.iter_mut().zip(&scratch.dp[r * KEY_BLOCK..]).for_each(|(o, &x)| *o = x);
                        }
                    }
                    if head.masks.is_softcapped() {
                        // `Q` and `K` reach the scores through the cap: the chain rule's factor.
                        let derivative = &scratch.cap_derivative[..rows * KEY_BLOCK];
                        for (ds, &factor) in scratch.dp[..rows * KEY_BLOCK].iter_mut().zip(derivative) {
                            *ds = *ds * factor;
                        }
                    }
                    let weights = Weights { p: &scratch.dp, rows, n_keys };
                    let q = ValueRows {
                        v: &head.q_rows[first * self.key_stride..],
                        stride: self.key_stride,
                        vectors: self.key_stride / K::Widened::LANES,
                    };
                    widened.accumulate_transposed(weights, q, dk_sum_rows);
                    let dq_rows = &mut dq_part[first * self.key_stride..(first + rows) * self.key_stride];
                    widened.accumulate_values(weights, &ones[..rows], k_rows, dq_rows);
                }
            }
            let local = (j - first_block) * KEY_BLOCK..(j - first_block) * KEY_BLOCK + n_keys;
            write_rows(
                &mut dk.slice_mut(ndarray::s![local.clone(), ..]),
                dk_sum_rows,
                self.key_stride,
                scale,
            );
            write_rows(&mut dv.slice_mut(ndarray::s![local, ..]), dv_sum_rows, self.value_stride, T::one());
        }
        scratch.first = dk_sum;
        scratch.second = dv_sum;
        dq_parts
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
    fn tile<E: Element<Compute = T>, K: Kernels<T, E>>(
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
        let (tiling, widened, lanes) = (&self.tiling, kernels.widened(), K::Widened::LANES);
        let first = b * tiling.query_block;
        let rows = tiling.query_block.min(self.shape.n_queries - first);
        let padded = rows.next_multiple_of(tiling.tile_rows);
        let block = BlockKeys::of(&head.masks, first, first + rows - 1);
        if keys.is_empty() || keys.end <= block.visible.start || keys.start >= block.visible.end {
            return None;
        }
        let clean = block.clean.start <= keys.start && keys.end <= block.clean.end;
        let n_keys = keys.len();
        let used = n_keys.next_multiple_of(lanes);
        let s = aligned_prefix(&mut scratch.s, padded * KEY_BLOCK);
        let dp = aligned_prefix(&mut scratch.dp, padded * KEY_BLOCK);
        let row_max = aligned_prefix(&mut scratch.row_max, padded * lanes);
        let sums = prefix(&mut scratch.sums, rows);
        let q = &head.q_packed[first * tiling.row_scalars(d_k)..];
        let k = (&operands.k_panels[..], keys.start, n_keys);
        tiling.scores(kernels, (q, padded, d_k), k, self.scale(), &mut *s, &mut *row_max);
        if head.masks.is_softcapped() {
            // The cap's derivative at the raw scores, before `mask_tile` caps them.
            let derivative = prefix(&mut scratch.cap_derivative, rows * KEY_BLOCK);
            derivative.copy_from_slice(&s[..rows * KEY_BLOCK]);
            head.masks.softcap_derivative(derivative);
        }
        let tile = RowsMut { data: &mut *s, stride: KEY_BLOCK, rows };
        mask_tile(&head.masks, &|r| first + r, tile, keys.clone(), used, clean);
        let lse = &head.logsumexp[first..first + rows];
        widened.exp_rows(RowsMut { data: &mut *s, stride: KEY_BLOCK, rows }, used, lse, sums);
        let d_output = &head.d_output_packed[first * tiling.row_scalars(d_v)..];
        let v = (&operands.v_panels[..], keys.start, n_keys);
        tiling.scores(kernels, (d_output, padded, d_v), v, T::one(), &mut *dp, row_max);
        let p = Rows { data: &*s, stride: KEY_BLOCK, rows };
        widened.softmax_gradient(
            p,
            RowsMut { data: dp, stride: KEY_BLOCK, rows },
            used,
            &head.delta[first..first + rows],
        );
        Some(Tile { rows })
    }
}

/// Writes accumulated rows (`stride` scalars apart) times `factor` into `out`.
fn write_rows<T: Real>(out: &mut ArrayViewMut2<T>, sums: &[T], stride: usize, factor: T) {
    for (mut row, sum) in out.rows_mut().into_iter().zip(sums.chunks_exact(stride)) {
        row.iter_mut().zip(sum).for_each(|(o, &x)| *o = x * factor);
    }
}
