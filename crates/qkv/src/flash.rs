//! The fast output-only path: FlashAttention-2-style tiling with an online softmax.
//!
//! Queries are cut into blocks of at most the kernel level's `QUERY_BLOCK` rows
//! (`LONG_QUERY_BLOCK` over long keys and values: `long_keys`; as many blocks for each thread,
//! sized evenly: `query_blocks`) and keys into blocks of the level's `KEY_BLOCK`. For one query
//! block the key blocks are visited in order: scores `S = Q_b·K_jᵀ`
//! (the scale is folded into the packed queries), masks where a tile needs them, then the online
//! softmax: the running row maximum `m` and sum `l`, the rescale `α = exp(m_old - m_new)` of the
//! output accumulator, and `O += P·V`. Each row is divided by its `l` once, at the end. No
//! `n_q × n_k` matrix exists: beyond the inputs and the output, memory is the packed keys and
//! values (`n_k · (d_k + d_v)` scalars) and a few tiles per task.
//!
//! Work is split into independent (query block, key split) items and never over a reduction.
//! Keys are split only when there are few query blocks (decoding), into a number of splits that
//! depends on the problem size alone, and the partial softmax states are merged in a fixed order:
//! results are the same bit for bit whatever the number of threads. Small problems run on the
//! calling thread (`work::worth_sharing`). Each block walks its key tiles one at a time (`Walk`),
//! so that decoding problems whose key rows interleave in one tensor (a sequence's key/value
//! heads in flash-attn's layout) can share a work item and take their tiles in turn, each still
//! computing its own tiles in its own order.
//!
//! The SIMD arithmetic lives in `kernels`, behind [`Kernels`]; this module is written once for
//! every level and owns the tiling, the masking decisions, the online softmax and the work split.

use std::ops::Range;
use std::sync::{Mutex, MutexGuard};

use crate::element::Real;
use crate::fresh::Output;
use crate::kernels::{self, Element, Isa, Job, Kernels, Layout, OutRows, REFERENCE_HEADROOM};
use crate::mask::View;
use crate::masking::MaskSet;
use crate::shape::{Magnitudes, Shape};
use crate::work;
use ndarray::{ArrayView2, ArrayViewMut, ArrayViewMut1, ArrayViewMut2, Axis, Dimension, Ix2};

mod packed;
mod walk;

use packed::Packed;
pub(crate) use walk::{BlockKeys, aligned_prefix, mask_tile, prefix};
use walk::{Problem, Scratch, State, Walk};

/// Problems with fewer query blocks than this also split their keys, so that every core works.
const SPLIT_BELOW_BLOCKS: usize = 4;
/// Problems with at most this many queries take their scores straight from the key rows.
const DIRECT_ROWS: usize = 4;
/// The fewest keys one split handles.
const SPLIT_KEYS: usize = 1024;
/// The most splits a query block is cut into.
const MAX_SPLITS: usize = 16;
/// The most decoding problems that take their key tiles in turn (see `AttendCached::run`).
const IN_TURN: usize = 8;
/// Decoding problems take their key tiles in turn only in calls left with at least this many
/// items a thread.
const ITEMS_PER_THREAD_IN_TURN: usize = 4;
/// Calls with at least this many heads per thread make each head's query blocks one work item,
/// all but the last head per thread (see `Attend::run`). At 8 heads of 256 on two threads (Intel
/// family 6 model 207) that was 8% faster than blocks of one head on both threads, back to back
/// and with pauses between calls.
const WHOLE_HEADS_PER_THREAD: usize = 4;
/// Keys of a head of at most this many bytes are packed by each thread that reads them, for
/// itself (see `Attend::run`). On two threads of an Intel family 6 model 207, one head of 256
/// keys of d = 64 in f32 (64 KiB) ran 3–5% faster; with the bound at 256 KiB causal n = 1024 ran
/// 4% faster and n = 1024 level. Kept small, where a helper that arrives late has little to pack
/// again.
const OWN_PACKING_BYTES: usize = 64 << 10;
/// Keys and values of a head above this many bytes are long: its query blocks take the level's
/// `LONG_QUERY_BLOCK` rows. On Zen 3, 4 MiB (8192 keys of d = 64 in f32) ran as fast in blocks
/// of 48 rows as of 96; 8 MiB and more, faster in 96. On an Intel family 6 model 207 (AVX-512,
/// 2 MiB of L2 a core), 96 rows over 2 and 4 MiB gained 2–4%, within that session's noise.
const LONG_KEYS_BYTES: usize = 4 << 20;

/// Whether `n_keys` keys and values of `row_elements` (`d_k + d_v`) elements of `element_bytes`
/// each are long (see [`LONG_KEYS_BYTES`]); sizes past `usize` are long.
fn long_keys(n_keys: usize, row_elements: usize, element_bytes: usize) -> bool {
    n_keys.saturating_mul(row_elements).saturating_mul(element_bytes) > LONG_KEYS_BYTES
}

/// Whether the fast path can run a problem without any intermediate overflowing: every score
/// (at most `scale · d · max |q| · max |k| + max |bias|`, by Cauchy-Schwarz) and every
/// unnormalised output sum (at most `n_k · max |v|` against each row's maximum, and
/// [`REFERENCE_HEADROOM`] times that at a level that raises references lazily) stays far below
/// the type's largest value, whatever the level. Otherwise the blocked path runs, which
/// normalises before it multiplies by `V` and reports a score that overflows.
pub(crate) fn stays_finite<T: Real>(shape: &Shape, magnitudes: &Magnitudes, masks: &MaskSet<'_, T>) -> bool {
    let limit = T::max_value().to_f64_exact() / 16.0;
    let d = shape.key_dim as f64;
    let score = masks.scale.abs() * d * magnitudes.queries * magnitudes.keys + masks.bias_magnitude;
    let value = magnitudes.values * shape.n_keys as f64 * REFERENCE_HEADROOM;
    score <= limit && value <= limit
}

/// Whether a decoding step's result stands: every key and value it read was finite, and with the
/// magnitudes it measured no intermediate could have overflowed ([`stays_finite`]).
/// Otherwise the caller checks the inputs in full, which names a non-finite one, and runs the
/// path that suits them, overwriting the output.
///
/// Decoding reads each key and value once, so checking them in the same pass, rather than in a
/// pass of their own beforehand, halves its memory traffic.
pub(crate) fn decode_checked<T: Real>(
    shape: &Shape,
    queries: f64,
    measured: Option<Measured<T>>,
    masks: &MaskSet<'_, T>,
) -> bool {
    let Some(measured) = measured else { return false };
    let magnitudes =
        Magnitudes { queries, keys: measured.keys.to_f64_exact(), values: measured.values.to_f64_exact() };
    magnitudes.keys.is_finite() && magnitudes.values.is_finite() && stays_finite(shape, &magnitudes, masks)
}

/// Computes attention for heads of one checked shape with the kernels of `isa`: each head's
/// output (`[q.nrows(), d_v]`, and each row's logsumexp when asked) from its queries, keys, values
/// and masks. The heads' work items are shared out together, so that many small heads keep every
/// core busy to the end.
///
/// Each head's `q` holds `rows_per_query` rows per query: row `r` belongs to query
/// `r / rows_per_query` and takes its masks. This stacks query heads that share one key/value
/// head (grouped-query attention), so that a decoding step reads each key and value once for all
/// of them.
///
/// Decoding (see [`decodes`]) reads every key and value exactly once, and measures them as it
/// does: when every head decodes, this returns their largest magnitudes
/// ([`Kernels::magnitude`]: non-finite if any input is), so that the caller can check them
/// afterwards instead of in a pass of its own. Otherwise it returns `None`, and the inputs need
/// checking beforehand.
///
/// Inputs stored as `E` (a half-precision format, say) are widened to `T` as the kernels load
/// them; everything else is computed in `T`. Each output row is stored as `O` once it is
/// finished (normalised in `T`, then rounded once).
pub(crate) fn attend<T: Real, E: Element<Compute = T>, O: Element<Compute = T>>(
    isa: Isa,
    shape: &Shape,
    rows_per_query: usize,
    heads: Vec<Head<'_, '_, T, E, O>>,
) -> Option<Measured<T>> {
    // Decoding reads key rows and value rows as they are, which the tiles do not.
    let n_rows = shape.n_queries * rows_per_query;
    let isa = if heads.iter().any(|head| decodes(n_rows, &head.k)) { isa.vectors() } else { isa };
    let heads = heads
        .into_iter()
        .map(|Head { q, k, v, out, lse, masks }| Operands { q, k, v, out: out.rows(), lse, masks })
        .collect();
    isa.run(Attend { shape: *shape, rows_per_query, heads })
}

/// [`attend`] for the problems of `call`, whose queries are in the compute type and whose keys
/// and values are already in the layout the kernels of `isa` read (a KV cache's, or a paged
/// cache's blocks: nothing is packed or measured), or rows read as they are (the dense decoding
/// step: they are measured as [`attend`] measures them, and when every problem decodes, their
/// magnitudes are returned). The problems' outputs follow one
/// another in `out`, each `n_rows = n_queries · rows_per_query` rows of `d_v` of its own shape
/// (problem `p`'s from row `p · n_rows` on when every problem has the same shape), and so do
/// their logsumexps in `lse`, when asked for.
///
/// Each problem's work items (query block × part × key split) follow its own shape alone, so a
/// problem gets the same bits whatever the other problems of the call are (a sequence of a paged
/// batch, alone or beside any others).
///
/// Every buffer of the call lives in `workspace` and is reused, so that a call for a shape seen
/// before allocates nothing when it runs on the calling thread alone (see [`Workspace`]).
pub(crate) fn attend_cached<T: Real, E: Element<Compute = T>>(
    isa: Isa,
    call: CachedCall<'_, '_, T, E>,
    out: &mut [T],
    lse: Option<&mut [T]>,
    workspace: &mut Workspace<T>,
) -> Option<Measured<T>> {
    // The caches' layouts, and decoding, are the vector levels'.
    isa.vectors().run(AttendCached { call, out, lse, workspace })
}

/// The problems of a call to [`attend_cached`]: `problem(p, part)` gives the operands of part
/// `part < parts` of problem `p < n_problems`, each of `rows_per_query` rows per query, and
/// `shape(p)` its shape: its queries, the keys its parts store (which its key splits cover) and
/// the widths, the same for every problem. Problems may differ in queries and keys (the
/// sequences of a paged batch, each under masks resolved against its own shape). The parts of a
/// problem are its query rows over disjoint keys, each under masks of its own (a ring buffer's
/// two runs of positions, see `kv_cache`); their softmax states are merged in part order into
/// the problem's output. A plain problem has one part.
pub(crate) struct CachedCall<'p, 'c, T, E: Element> {
    pub(crate) rows_per_query: usize,
    pub(crate) n_problems: usize,
    pub(crate) parts: usize,
    pub(crate) shape: &'c (dyn Fn(usize) -> Shape + Sync),
    pub(crate) problem: &'c (dyn Fn(usize, usize) -> CachedProblem<'p, T, E> + Sync),
}

/// A work item of the key-split path: head, the query block's first row and its rows, and the
/// keys of the split.
type SplitItem = (usize, usize, usize, Range<usize>);

/// A work item of the tiled path: head `.0`'s query blocks.
type HeadBlocks<'b, 'out, T> = (usize, Vec<&'b mut OutBlock<'out, T>>);

/// What a thread of [`Attend::run`] keeps from item to item: its scratch, its softmax state, and
/// the packings it made for itself (indexed as the call's packings, made as first needed).
type ThreadScratch<'p, T, E> = (Scratch<T>, State<T>, Vec<Option<Packed<'p, E>>>);

/// One head of a call to [`attend`]: inputs stored as `E`, the output stored as `O` (both `T`
/// itself, or a half-precision format), computed in `T`.
pub(crate) struct Head<'p, 'out, T, E = T, O = T> {
    pub(crate) q: ArrayView2<'p, E>,
    pub(crate) k: ArrayView2<'p, E>,
    pub(crate) v: ArrayView2<'p, E>,
    pub(crate) out: Output<'out, O, Ix2>,
    /// Each row's logsumexp `m + ln l`, when asked for.
    pub(crate) lse: Option<ArrayViewMut1<'out, T>>,
    pub(crate) masks: MaskSet<'p, T>,
}
/// One problem of a call to [`attend_cached`]: `n_queries · rows_per_query` query rows, already
/// in the compute type (a bf16 cache takes f32 queries), over a cache's keys and values.
pub(crate) struct CachedProblem<'p, T, E: Element> {
    pub(crate) q: ArrayView2<'p, T>,
    pub(crate) kv: StoredKeys<'p, E>,
    pub(crate) masks: MaskSet<'p, T>,
}

/// Where a cached problem's keys and values lie: in the kernels' layout already, or as rows.
#[derive(Clone, Copy)]
pub(crate) enum StoredKeys<'p, E: Element> {
    /// The caller's rows (the dense decoding step's), read as they are. Spelled as [`View`]s so
    /// that the keys stay covariant in `'p`, as the other variants are.
    Rows {
        k: View<'p, E, Ix2>,
        v: View<'p, E, Ix2>,
        /// The caller's whole value tensor, when it lies in one slice (in any axis order): `v`'s
        /// rows are then read in place from it even where they are not side by side (a head of
        /// flash-attn's `[total, heads, d]`), rather than copied.
        v_tensor: Option<&'p [E]>,
    },
    /// Side by side (a `KvCache`'s).
    Contiguous(CachedKeys<'p, E>),
    /// In blocks of a pool (a paged cache's).
    Paged(PagedKeys<'p, E>),
}

/// The buffers of [`attend_cached`], kept between calls: a scratch per thread that takes work
/// items (see `work::for_each_index`), the softmax state of every item, and where each problem's
/// items start, grown as needed and never shrunk. A call reads nothing that an earlier call left
/// in them (each state is reset before its item runs, scratch is written before it is read, and
/// the item starts are laid out anew). The locks are never contended: each state belongs to one
/// item and each scratch to one thread.
pub(crate) struct Workspace<T: Real> {
    scratches: Vec<Mutex<Scratch<T>>>,
    states: Vec<Mutex<State<T>>>,
    /// Problem `p`'s items are `item_starts[p] .. item_starts[p + 1]`.
    item_starts: Vec<usize>,
    /// The problems run together and where their items start (see `AttendCached::run`).
    runs: Vec<(usize, usize)>,
}

impl<T: Real> Default for Workspace<T> {
    fn default() -> Self {
        Workspace { scratches: Vec::new(), states: Vec::new(), item_starts: Vec::new(), runs: Vec::new() }
    }
}

/// What a level's kernels need of the cached layout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CachedLayout {
    /// Keys per packed panel.
    pub(crate) key_panel: usize,
    /// Elements from one value row to the next: `value_dim` rounded up to whole vectors.
    pub(crate) value_stride: usize,
}

/// Asks a level's kernels for their layout.
pub(crate) struct LayoutOf {
    pub(crate) value_dim: usize,
}

impl<E: Element> Job<E> for LayoutOf {
    /// `None` when the padded value row would not fit a `usize`.
    type Output = Option<CachedLayout>;

    fn run<K: Kernels<E::Compute, E>>(self, _: K) -> Option<CachedLayout> {
        let value_stride = self.value_dim.checked_next_multiple_of(K::LANES)?;
        Some(CachedLayout { key_panel: K::KEY_PANEL, value_stride })
    }
}

/// Keys and values already laid out for one level's kernels, as `Packed` would lay them out:
/// `panels` holds the packed key panels of every key from the first (see
/// `kernels::pack_key_panel`; panel `p` covers keys `p · KEY_PANEL ..` and is `KEY_PANEL · d_k`
/// scalars), and `values` one row of `value_stride` scalars per key (`d_v` rounded up to whole
/// vectors of the level). Quantized keys and values (an int8 cache's) come with their scales.
#[derive(Clone, Copy)]
pub(crate) struct CachedKeys<'p, E: Element> {
    pub(crate) panels: &'p [E],
    pub(crate) values: &'p [E],
    pub(crate) value_stride: usize,
    pub(crate) scales: Option<Scales<'p, E::Compute>>,
}

impl<T: Real, E: Element<Compute = T>> CachedKeys<'_, E> {
    /// The largest `|k|` and `|v|` of the first `n_keys` keys and values, as the kernels read
    /// them (widened, and scaled where quantized), `key_panel` keys to a panel. A cache keeps a
    /// running bound of what it was given since its last clear and measures what it holds with
    /// this only when that bound fails [`stays_finite`]: truncated or overwritten keys no longer
    /// count, and lanes past `n_keys` are masked before any use (`mask_tile`). (An int8 cache's
    /// check also floors the keys at 127: `element::checked_key_magnitude`.)
    pub(crate) fn magnitudes(
        &self,
        n_keys: usize,
        key_dim: usize,
        value_dim: usize,
        key_panel: usize,
    ) -> (f64, f64) {
        let scale = |scales: Option<&[T]>, j: usize| scales.map_or(1.0, |s| s[j].to_f64_exact().abs());
        let largest = |row: &mut dyn Iterator<Item = &E>| {
            row.map(|&x| x.widen().to_f64_exact().abs()).fold(0.0, f64::max)
        };
        let (mut keys, mut values) = (0.0_f64, 0.0_f64);
        for j in 0..n_keys {
            let panel = &self.panels[j / key_panel * key_panel * key_dim..][..key_panel * key_dim];
            let key = largest(&mut panel[j % key_panel..].iter().step_by(key_panel));
            keys = keys.max(key * scale(self.scales.map(|s| s.keys), j));
            let value = largest(&mut self.values[j * self.value_stride..][..value_dim].iter());
            values = values.max(value * scale(self.scales.map(|s| s.values), j));
        }
        (keys, values)
    }
}

/// The scales of quantized keys and values, one per key for each: key `j` stands for
/// `keys[j] · K_j` (its stored integers `K_j`) and its value for `values[j] · V_j`. The
/// kernels read the integers as they are, and the scales are applied to each tile's scores and
/// weights (`Kernels::scale_columns`).
#[derive(Clone, Copy)]
pub(crate) struct Scales<'p, T> {
    pub(crate) keys: &'p [T],
    pub(crate) values: &'p [T],
}

/// A head's queries: stored as its keys are (the dense paths), or already in the compute type
/// (a cache's, whose keys may be stored in half precision under f32 queries).
#[derive(Clone, Copy)]
enum Queries<'p, T, E> {
    Stored(ArrayView2<'p, E>),
    Computed(ArrayView2<'p, T>),
}

impl<T: Real, E: Element<Compute = T>> Queries<'_, T, E> {
    /// Packs rows `first .. first + rows`, times `scale`, row after row for the direct scores
    /// (`direct`) or for the score tile of `tiles` (rows per tile, layout; see
    /// `kernels::pack_queries`). Returns the factor the scores still take.
    fn pack(
        &self,
        direct: bool,
        first: usize,
        rows: usize,
        scale: T,
        tiles: (usize, Layout),
        out: &mut [T],
    ) -> T {
        match *self {
            Queries::Stored(q) if direct => kernels::pack_query_rows(q, first, rows, scale, out),
            Queries::Stored(q) => return kernels::pack_queries(q, first, rows, scale, tiles, out),
            Queries::Computed(q) if direct => kernels::pack_query_rows(q, first, rows, scale, out),
            Queries::Computed(q) => return kernels::pack_queries(q, first, rows, scale, tiles, out),
        }
        T::one()
    }
}

impl<E: Element> StoredKeys<'_, E> {
    /// Key splits are whole multiples of this many keys, so that each split starts a tile where
    /// one may start: at a key block (`key_block` keys, a whole number of `key_panel`s), and in
    /// a paged cache whose blocks are not whole panels at a block too.
    fn split_unit(&self, key_panel: usize, key_block: usize) -> usize {
        match self {
            StoredKeys::Paged(paged) if paged.block_size % key_panel != 0 => {
                let (mut a, mut b) = (key_block, paged.block_size);
                while b != 0 {
                    (a, b) = (b, a % b);
                }
                key_block / a * paged.block_size
            }
            _ => key_block,
        }
    }

    /// Whether `other`'s key rows are the same tokens' as `self`'s, in one tensor: as many rows,
    /// as far apart, each from less than a row's stride after `self`'s (another key/value head
    /// of flash-attn's `[total, heads, d]`) or from the same place.
    fn interleaves(&self, other: &Self) -> bool {
        let (StoredKeys::Rows { k: a, .. }, StoredKeys::Rows { k: b, .. }) = (self, other) else {
            return false;
        };
        let stride = usize::try_from(a.strides()[0]).unwrap_or(0).saturating_mul(size_of::<E>());
        let offset = b.as_ptr().addr().wrapping_sub(a.as_ptr().addr());
        a.dim() == b.dim() && a.strides() == b.strides() && offset < stride
    }

    /// Whether both are the same rows of the caller's (the same elements, as the heads of a
    /// group share their key/value head), so that one packing serves both.
    fn same_rows(&self, other: &Self) -> bool {
        let same = |a: &ArrayView2<E>, b: &ArrayView2<E>| {
            a.as_ptr() == b.as_ptr() && a.shape() == b.shape() && a.strides() == b.strides()
        };
        match (self, other) {
            (StoredKeys::Rows { k, v, .. }, StoredKeys::Rows { k: k2, v: v2, .. }) => {
                same(k, k2) && same(v, v2)
            }
            _ => false,
        }
    }
}

/// One (sequence, key/value head)'s keys and values in fixed-size blocks of a pool: entry `b` of
/// `table` is the pool block holding positions `b · block_size ..`, and each block holds this
/// head's positions as [`CachedKeys`] of `block_size` keys, its key panels padded to whole
/// panels (`key_lanes` keys' room, `block_size` rounded up to the level's `KEY_PANEL`). A tile
/// of keys starts at a whole panel of its block and ends at the block's end at the latest.
#[derive(Clone, Copy)]
pub(crate) struct PagedKeys<'p, E: Element> {
    /// Every block of the pool, `block_stride` scalars apart.
    pub(crate) storage: &'p [E],
    pub(crate) block_stride: usize,
    /// The sequence's blocks, in position order.
    pub(crate) table: &'p [u32],
    pub(crate) block_size: usize,
    /// Room for keys in a block's panels: `block_size` rounded up to whole panels.
    pub(crate) key_lanes: usize,
    /// Where this head's key panels (`key_lanes · d_k` scalars) and value rows (`block_size`
    /// rows of `value_stride`) start inside a block.
    pub(crate) panels_at: usize,
    pub(crate) values_at: usize,
    pub(crate) key_dim: usize,
    pub(crate) value_stride: usize,
    /// Quantized keys' and values' scales (an int8 pool's; empty otherwise): every block's,
    /// `scales_stride` apart, this head's `block_size` key scales from `scales_at` inside a
    /// block, then its value scales.
    pub(crate) scales: &'p [E::Compute],
    pub(crate) scales_stride: usize,
    pub(crate) scales_at: usize,
}

impl<T: Real, E: Element<Compute = T>> PagedKeys<'_, E> {
    /// [`CachedKeys::magnitudes`] of the sequence's first `n_keys` positions held, block by block.
    pub(crate) fn magnitudes(&self, n_keys: usize, value_dim: usize, key_panel: usize) -> (f64, f64) {
        let blocks = (0..n_keys.div_ceil(self.block_size)).map(|b| {
            let in_block = self.block_size.min(n_keys - b * self.block_size);
            self.block(b).magnitudes(in_block, self.key_dim, value_dim, key_panel)
        });
        blocks.fold((0.0, 0.0), |(k, v), (key, value)| (k.max(key), v.max(value)))
    }
}

impl<'p, E: Element> PagedKeys<'p, E> {
    /// The keys and values of entry `b` of the block table.
    fn block(&self, b: usize) -> CachedKeys<'p, E> {
        let block = &self.storage[self.table[b] as usize * self.block_stride..][..self.block_stride];
        CachedKeys {
            panels: &block[self.panels_at..][..self.key_lanes * self.key_dim],
            values: &block[self.values_at..][..self.block_size * self.value_stride],
            value_stride: self.value_stride,
            scales: (!self.scales.is_empty()).then(|| {
                let size = self.block_size;
                let scales = &self.scales[self.table[b] as usize * self.scales_stride + self.scales_at..];
                Scales { keys: &scales[..size], values: &scales[size..2 * size] }
            }),
        }
    }
}

/// One head's operands inside a call to [`attend`], its output as the caller stores it.
struct Operands<'p, 'out, T, E> {
    q: ArrayView2<'p, E>,
    k: ArrayView2<'p, E>,
    v: ArrayView2<'p, E>,
    out: OutRows<'out, T>,
    lse: Option<ArrayViewMut1<'out, T>>,
    masks: MaskSet<'p, T>,
}

impl<'out, T: Real> OutRows<'out, T> {
    fn nrows(&self) -> usize {
        match self {
            OutRows::Computed(out) => out.nrows(),
            OutRows::Bf16(out) => out.nrows(),
            OutRows::F16(out) => out.nrows(),
            OutRows::Fresh(out) => out.nrows(),
        }
    }

    /// The rows in consecutive blocks of `lens` rows.
    fn blocks(self, lens: &[usize]) -> Vec<OutRows<'out, T>> {
        match self {
            OutRows::Computed(out) => split_rows(out, lens).into_iter().map(OutRows::Computed).collect(),
            OutRows::Bf16(out) => split_rows(out, lens).into_iter().map(OutRows::Bf16).collect(),
            OutRows::F16(out) => split_rows(out, lens).into_iter().map(OutRows::F16).collect(),
            OutRows::Fresh(out) => split_rows(out, lens).into_iter().map(OutRows::Fresh).collect(),
        }
    }
}

/// `a` cut along its rows into consecutive blocks of `lens` rows.
fn split_rows<'a, A, D: Dimension>(
    mut a: ArrayViewMut<'a, A, D>,
    lens: &[usize],
) -> Vec<ArrayViewMut<'a, A, D>> {
    let mut blocks = Vec::with_capacity(lens.len());
    for &len in lens {
        let (block, rest) = a.split_at(Axis(0), len);
        blocks.push(block);
        a = rest;
    }
    // Every row is in a block: the blocks of an engine-allocated output are all that is written.
    assert_eq!(a.len_of(Axis(0)), 0, "the blocks cover every row");
    blocks
}

/// The output rows of one query block, and their logsumexp when asked for.
struct OutBlock<'out, T> {
    /// The block's first row in its head.
    first: usize,
    out: OutRows<'out, T>,
    lse: Option<ArrayViewMut1<'out, T>>,
    /// Whether its rows were written ([`State::write`]): every block is, before [`attend`]
    /// returns, since fresh memory is taken as written once it has (see `fresh.rs`).
    written: bool,
}

/// Whether a problem of `rows` query rows (queries times stacked heads) over keys `k` takes the
/// decoding path: few rows, and key rows that are contiguous each (side by side, or a head's rows
/// of a `[total, heads, d]` tensor), which the scores read directly.
pub(crate) fn decodes<E>(rows: usize, k: &ArrayView2<E>) -> bool {
    rows <= DIRECT_ROWS && (k.ncols() <= 1 || k.strides()[1] == 1)
}

/// The largest magnitudes of the keys and values, as decoding measured them (non-finite if any
/// element is).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Measured<T> {
    pub(crate) keys: T,
    pub(crate) values: T,
}

impl<T: Real> Measured<T> {
    /// Nothing read yet.
    fn nothing() -> Measured<T> {
        Measured { keys: T::zero(), values: T::zero() }
    }

    fn combine(self, other: Measured<T>) -> Measured<T> {
        Measured {
            keys: kernels::larger_magnitude(self.keys, other.keys),
            values: kernels::larger_magnitude(self.values, other.values),
        }
    }
}

/// One call's operands, waiting for its kernels.
struct Attend<'p, 'out, T: Real, E> {
    shape: Shape,
    rows_per_query: usize,
    heads: Vec<Operands<'p, 'out, T, E>>,
}

impl<'p, T: Real, E: Element<Compute = T>> Job<E> for Attend<'p, '_, T, E> {
    type Output = Option<Measured<T>>;

    fn run<K: Kernels<T, E>>(self, kernels: K) -> Option<Measured<T>> {
        let Attend { shape, rows_per_query, heads } = self;
        let n_rows = shape.n_queries * rows_per_query;
        let mut problems = Vec::with_capacity(heads.len());
        let mut blocks: Vec<Vec<OutBlock<T>>> = Vec::with_capacity(heads.len());
        // Each head's key splits follow its own rows and keys.
        let mut splits: Vec<KeySplits> = Vec::with_capacity(heads.len());
        let long = long_keys(shape.n_keys, shape.key_dim + shape.value_dim, size_of::<E>());
        let query_block = if long { K::LONG_QUERY_BLOCK } else { K::QUERY_BLOCK };
        for Operands { q, k, v, out, lse, masks } in heads {
            splits.push(key_splits(out.nrows(), k.nrows(), query_block, K::KEY_BLOCK));
            let key_rows = decodes(n_rows, &k).then_some(k);
            let source = StoredKeys::Rows { k, v, v_tensor: None };
            problems.push(Problem { shape, q: Queries::Stored(q), rows_per_query, source, key_rows, masks });
            let lens = query_blocks(out.nrows(), K::TILE_ROWS, query_block, work::threads());
            let firsts = lens.iter().scan(0, |first, &len| Some(std::mem::replace(first, *first + len)));
            let mut lse = lse.map(|lse| split_rows(lse, &lens).into_iter());
            let outs = out.blocks(&lens).into_iter().zip(firsts);
            blocks.push(
                outs.map(|(out, first)| OutBlock {
                    first,
                    out,
                    lse: lse.as_mut().and_then(Iterator::next),
                    written: false,
                })
                .collect(),
            );
        }
        let decoding = problems.iter().all(|p| p.key_rows.is_some());
        let parallel =
            work::worth_sharing(shape.flops() * (rows_per_query * problems.len()) as f64, decoding, K::LANES);
        let mut measured = Measured::nothing();
        if splits.iter().all(|splits| splits.count == 1) {
            let keys: Vec<Range<usize>> = splits.iter().map(|splits| splits.range(0)).collect();
            // The query heads of a group read one key/value head, and follow one another: a
            // head reading what the head before it reads shares its packing. `packings` holds the
            // first head of each packing, `packed_of` each head's packing.
            let mut packings: Vec<usize> = Vec::new();
            let mut packed_of: Vec<usize> = Vec::with_capacity(problems.len());
            for (h, (p, range)) in problems.iter().zip(&keys).enumerate() {
                let shared = h > 0 && problems[h - 1].source.same_rows(&p.source) && keys[h - 1] == *range;
                if !shared {
                    packings.push(h);
                }
                packed_of.push(packings.len() - 1);
            }
            let pack = |i: usize| problems[packings[i]].packed::<K>(keys[packings[i]].clone());
            // Small keys are packed by each thread for itself, as it first needs them: threads on
            // blocks of one head neither wait on each other's packing nor read it from the other
            // core's cache. Larger ones are packed once, block by block, by whichever thread first
            // needs a block.
            let own_packing = shape.n_keys.saturating_mul(shape.key_dim).saturating_mul(size_of::<E>())
                <= OWN_PACKING_BYTES;
            let shared: Vec<Packed<E>> =
                if own_packing { Vec::new() } else { (0..packings.len()).map(pack).collect() };
            // Under a causal mask block i's cost grows with i, so items are zig-zag pairs: block i
            // with block n-1-i, every pair costing about the same. Otherwise every block is an
            // item of its own, the finest split. Items are taken one at a time, so both cores stay
            // busy to the end.
            //
            // With heads enough to keep every thread busy, a head's blocks are one item instead:
            // one thread packs its keys and reads them while they are in cache, where threads on
            // blocks of one head would wait on each other's packing. The last head per thread
            // stays in blocks, so that a helper that arrives late still finds a fine-grained tail
            // to share (whole heads only, 8 of 256 on Zen 3 ran 1.42× slower). Whichever item a
            // block is in, it is computed the same way, so results do not depend on the number of
            // threads.
            let threads = work::threads();
            let whole_heads =
                if problems.len() >= WHOLE_HEADS_PER_THREAD * threads { problems.len() - threads } else { 0 };
            let mut items: Vec<HeadBlocks<T>> = Vec::new();
            for (h, blocks) in blocks.iter_mut().enumerate() {
                let n = blocks.len();
                if h < whole_heads {
                    items.push((h, blocks.iter_mut().collect()));
                } else if problems[h].masks.is_causal() {
                    let (front, back) = blocks.split_at_mut(n.div_ceil(2));
                    let mut partners = back.iter_mut().rev();
                    for block in front {
                        items.push((h, std::iter::once(block).chain(partners.next()).collect()));
                    }
                } else {
                    items.extend(blocks.iter_mut().map(|block| (h, vec![block])));
                }
            }
            // Each thread keeps one softmax state and reuses it block after block: a state is
            // written out as soon as its block is done.
            let attend_item = |(scratch, state, own): &mut ThreadScratch<'p, T, E>,
                               (h, item): HeadBlocks<T>| {
                let mut measured = Measured::nothing();
                let packed = if own_packing {
                    own.resize_with(packings.len(), || None);
                    own[packed_of[h]].get_or_insert_with(|| pack(packed_of[h]))
                } else {
                    &shared[packed_of[h]]
                };
                for out_block in item {
                    let first = out_block.first;
                    let query_rows = first..first + out_block.out.nrows();
                    problems[h].attend_block_into(
                        kernels,
                        packed,
                        query_rows,
                        keys[h].clone(),
                        scratch,
                        state,
                    );
                    let problem = &problems[h];
                    state.write(out_block, &|r| problem.sink(first + r));
                    measured = measured.combine(state.measured);
                }
                measured
            };
            let new_scratch = || (Scratch::default(), State::empty(), Vec::new());
            for part in work::map_items(items, parallel, new_scratch, attend_item) {
                measured = measured.combine(part);
            }
            assert!(blocks.iter().flatten().all(|b| b.written), "every block of output rows written");
            return decoding.then_some(measured);
        }
        let splits = &splits;
        // Each item with its block's rows: heads may have different numbers of rows and keys
        // (the sequences of a paged batch).
        let items: Vec<SplitItem> = blocks
            .iter()
            .enumerate()
            .flat_map(|(h, blocks)| {
                blocks.iter().flat_map(move |block| {
                    splits[h].ranges().map(move |keys| (h, block.first, block.out.nrows(), keys))
                })
            })
            .collect();
        let attend_item = |scratch: &mut Scratch<T>, (h, first, rows, keys): SplitItem| {
            // Each task packs its own keys: they are read by few query rows, and a small buffer
            // per task stays in cache where one large one per call would not.
            let packed = problems[h].packed::<K>(keys.clone());
            problems[h].attend_block(kernels, &packed, first, rows, keys, scratch)
        };
        let mut states = work::map_items(items, parallel, Scratch::default, attend_item).into_iter();
        for (h, out_block, splits) in blocks
            .iter_mut()
            .zip(splits)
            .enumerate()
            .flat_map(|(h, (b, s))| b.iter_mut().map(move |block| (h, block, s)))
        {
            // Merged in split order, the same whichever thread computed each part; the sink joins
            // the merged row.
            let mut merged = states.next().expect("one state per split");
            for part in states.by_ref().take(splits.count - 1) {
                merged.merge(&part);
            }
            let first = out_block.first;
            merged.write(out_block, &|r| problems[h].sink(first + r));
            measured = measured.combine(merged.measured);
        }
        assert!(blocks.iter().flatten().all(|b| b.written), "every block of output rows written");
        decoding.then_some(measured)
    }
}

/// The row counts of the query blocks `n_rows` rows are cut into: as few blocks as `query_block`
/// rows each allow, their number rounded up to a multiple of `threads` (while each keeps a tile
/// of rows), and the tiles of `tile_rows` rows shared out evenly, the larger blocks first, so
/// that every block but the last is whole tiles. Blocks are items of work taken one at a time:
/// 256 rows in 48-row blocks are 8, 8, 8, 8, 8 and 3 tiles (24 tiles for one of two threads,
/// 19 for the other); evenly, 8, 7, 7, 7, 7 and 7 (22 and 21). A row's result does not depend on
/// its block, so neither do the results on the number of threads.
fn query_blocks(n_rows: usize, tile_rows: usize, query_block: usize, threads: usize) -> Vec<usize> {
    if n_rows == 0 {
        return Vec::new();
    }
    let tiles = n_rows.div_ceil(tile_rows);
    let count = n_rows.div_ceil(query_block).next_multiple_of(threads.max(1)).min(tiles);
    let mut lens: Vec<usize> =
        (0..count).map(|b| (tiles / count + usize::from(b < tiles % count)) * tile_rows).collect();
    // The last tile may be short.
    if let Some(last) = lens.last_mut() {
        *last -= tiles * tile_rows - n_rows;
    }
    lens
}

/// The key ranges each query block (of `query_block` rows, of `n_rows` in all) is split into: one
/// unless the rows are few, and then a number fixed by `n_keys` alone, each a whole number of
/// `unit` keys (see [`StoredKeys::split_unit`]).
fn key_splits(n_rows: usize, n_keys: usize, query_block: usize, unit: usize) -> KeySplits {
    if n_keys == 0 {
        // No keys: one empty split, whose state is that of a fully masked row.
        return KeySplits { n_keys, count: 1, len: 0 };
    }
    let splits = if n_rows.div_ceil(query_block) >= SPLIT_BELOW_BLOCKS {
        1
    } else {
        (n_keys / SPLIT_KEYS).clamp(1, MAX_SPLITS)
    };
    let len = n_keys.div_ceil(splits).next_multiple_of(unit);
    KeySplits { n_keys, count: n_keys.div_ceil(len), len }
}

/// Consecutive key ranges of `len` keys (the last one shorter), `count` of them.
struct KeySplits {
    n_keys: usize,
    count: usize,
    len: usize,
}

impl KeySplits {
    /// Split `i`.
    fn range(&self, i: usize) -> Range<usize> {
        i * self.len..((i + 1) * self.len).min(self.n_keys)
    }

    fn ranges(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.count).map(|i| self.range(i))
    }
}

/// A problem of a work item of [`attend_cached`], with its keys and values as the kernels read them.
type ReadyProblem<'p, T, E> = (Problem<'p, T, E>, Packed<'p, E>);

/// The operands of [`attend_cached`], waiting for its kernels.
struct AttendCached<'p, 'c, T: Real, E: Element> {
    call: CachedCall<'p, 'c, T, E>,
    out: &'c mut [T],
    lse: Option<&'c mut [T]>,
    workspace: &'c mut Workspace<T>,
}

impl<T: Real, E: Element<Compute = T>> Job<E> for AttendCached<'_, '_, T, E> {
    type Output = Option<Measured<T>>;

    fn run<K: Kernels<T, E>>(self, kernels: K) -> Option<Measured<T>> {
        let AttendCached { call, out, lse, workspace } = self;
        let CachedCall { rows_per_query, n_problems, parts, shape, problem } = call;
        let n_rows = |p: usize| shape(p).n_queries * rows_per_query;
        let splits_of = |p: usize| {
            let unit = problem(p, 0).kv.split_unit(K::KEY_PANEL, K::KEY_BLOCK);
            key_splits(n_rows(p), shape(p).n_keys, K::QUERY_BLOCK, unit)
        };
        let rows = |p: usize, b: usize| K::QUERY_BLOCK.min(n_rows(p) - b * K::QUERY_BLOCK);
        // Each problem's items are (query block, part, key split), split fastest, one after
        // another: each computes one state, and the states of a block are then merged in part
        // and split order, whichever thread ran them.
        let Workspace { scratches, states, item_starts, runs } = workspace;
        item_starts.clear();
        let (mut n_items, mut flops, mut largest, mut key_dim) = (0, 0.0, 0, 0);
        for p in 0..n_problems {
            item_starts.push(n_items);
            n_items += n_rows(p).div_ceil(K::QUERY_BLOCK) * parts * splits_of(p).count;
            flops += shape(p).flops() * rows_per_query as f64;
            largest = largest.max(K::QUERY_BLOCK.min(n_rows(p)));
            key_dim = key_dim.max(shape(p).key_dim);
        }
        item_starts.push(n_items);
        if states.len() < n_items {
            states.resize_with(n_items, || Mutex::new(State::empty()));
        }
        let states = &mut states[..n_items];
        let item_starts = &*item_starts;
        let decoding = (0..n_problems)
            .all(|p| matches!(problem(p, 0).kv, StoredKeys::Rows { k, .. } if decodes(n_rows(p), &k)));
        // Decoding problems whose key rows interleave in one tensor (a sequence's key/value heads
        // in flash-attn's `[total, heads, d]`) run as one, a tile of each in turn: each reads the
        // rows between its own soon after the problem before it, where alone it would leave them
        // for a read of their own later (`varlen --flash-layout decode64` in qkv-bench, Zen 4: 0.68
        // of the time at two threads, 0.84 at one). Each still computes its own tiles in its own
        // order, so its bits are those it gets alone. Runs are the calls' items: problem
        // `runs[r].0`'s items from the `runs[r].1`-th on, each taking the same item of the
        // problems up to the next run's first. Only calls left with items enough for every thread
        // group their problems.
        runs.clear();
        let (mut n_runs, mut widest) = (0, 1);
        // The call keeps items enough for every thread; runs of two problems at least halve
        // them, so a call with fewer does not look.
        let enough = ITEMS_PER_THREAD_IN_TURN * work::threads();
        let may_join = decoding && parts == 1 && n_items >= 2 * enough;
        // The current run's first problem and its keys, each problem's built once.
        let mut first: Option<(usize, StoredKeys<E>)> = None;
        for p in 0..n_problems {
            let kv = may_join.then(|| problem(p, 0).kv);
            match (first, kv) {
                (Some((f, first_kv)), Some(kv))
                    if p - f < IN_TURN && shape(p) == shape(f) && first_kv.interleaves(&kv) =>
                {
                    widest = widest.max(p + 1 - f);
                }
                _ => {
                    runs.push((p, n_runs));
                    n_runs += item_starts[p + 1] - item_starts[p];
                    first = kv.map(|kv| (p, kv));
                }
            }
        }
        if n_runs < enough {
            runs.clear();
            runs.extend((0..n_problems).map(|p| (p, item_starts[p])));
            (n_runs, widest) = (n_items, 1);
        }
        runs.push((n_problems, n_runs));
        let runs = &*runs;
        let shared_states = &*states;
        let attend_run = |scratch: &mut Scratch<T>, item: usize| {
            // The last run whose items start at or before `item` (problems without rows have
            // none), and its problems.
            let r = runs.partition_point(|&(_, start)| start <= item) - 1;
            let (first_problem, local) = (runs[r].0, item - runs[r].1);
            let problems = first_problem..runs[r + 1].0;
            let splits = splits_of(first_problem);
            let b = local / (parts * splits.count);
            let (part, split) = (local / splits.count % parts, local % splits.count);
            let keys = splits.range(split);
            let mut operands: [Option<ReadyProblem<T, E>>; IN_TURN] = [const { None }; IN_TURN];
            let mut states: [Option<MutexGuard<State<T>>>; IN_TURN] = [const { None }; IN_TURN];
            for ((operands, state), p) in operands.iter_mut().zip(&mut states).zip(problems) {
                let CachedProblem { q, kv, masks } = problem(p, part);
                let shape = shape(p);
                let (source, key_rows, packed_keys) = match kv {
                    // Rows are packed for this item's keys alone (decoding packs only values that
                    // are not whole vectors wide or lie apart outside one tensor), and decoded
                    // straight from the key rows.
                    StoredKeys::Rows { k, .. } => {
                        let key_rows = decodes(n_rows(p), &k).then_some(k);
                        (kv, key_rows, keys.clone())
                    }
                    kv => (kv, None, 0..shape.n_keys),
                };
                let problem =
                    Problem { shape, q: Queries::Computed(q), rows_per_query, source, key_rows, masks };
                let packed = problem.packed::<K>(packed_keys);
                *operands = Some((problem, packed));
                *state = Some(shared_states[item_starts[p] + local].lock().expect("no task panicked"));
            }
            let first = b * K::QUERY_BLOCK;
            let query_rows = first..first + rows(first_problem, b);
            let (p0, _) = operands[0].as_ref().expect("a run has a problem");
            let padded = p0.padded_rows::<K>(query_rows.len());
            let count = runs[r + 1].0 - first_problem;
            let (mut queries, mut tile) =
                scratch.fit::<E, K>((count, padded, query_rows.len()), p0.shape.key_dim);
            let mut walks: [Option<Walk<T, E>>; IN_TURN] = [const { None }; IN_TURN];
            let operands = operands.iter().flatten().zip(states.iter_mut().flatten());
            for (walk, ((problem, packed), state)) in walks.iter_mut().zip(operands) {
                let q;
                (q, queries) = std::mem::take(&mut queries).split_at_mut(padded * problem.shape.key_dim);
                *walk = problem.walk::<K>(packed, query_rows.clone(), keys.clone(), q, state);
            }
            // Every walk takes its next tile, until none has one left.
            while walks
                .iter_mut()
                .flatten()
                .fold(false, |more, walk| walk.next_tile(kernels, &mut tile) | more)
            {}
        };
        // Every scratch a thread may take is grown here, on the calling thread, for the call's
        // largest block: a helper that joins a step for the first time allocates nothing then.
        let fit = |scratch: &mut Scratch<T>| {
            scratch.fit::<E, K>((widest, largest.next_multiple_of(K::TILE_ROWS), largest), key_dim);
        };
        let share = work::worth_sharing(flops, decoding, K::LANES);
        work::for_each_index(n_runs, share, scratches, fit, attend_run);
        let mut lse = lse;
        let mut measured = Measured::nothing();
        let mut first_row = 0;
        for p in 0..n_problems {
            let d_v = shape(p).value_dim;
            let per_block = parts * splits_of(p).count;
            let problem_states = &mut states[item_starts[p]..item_starts[p + 1]];
            for (b, block_states) in problem_states.chunks_exact_mut(per_block).enumerate() {
                let (merged, rest) = block_states.split_first_mut().expect("one state per split");
                let merged = merged.get_mut().expect("no task panicked");
                for part in rest.iter_mut() {
                    merged.merge(part.get_mut().expect("no task panicked"));
                }
                let (first, rows) = (first_row + b * K::QUERY_BLOCK, rows(p, b));
                let out = ArrayViewMut2::from_shape((rows, d_v), &mut out[first * d_v..(first + rows) * d_v]);
                let lse = lse.as_deref_mut().map(|lse| ArrayViewMut1::from(&mut lse[first..first + rows]));
                // Every part of a problem takes its head's sinks; the merged row takes them once.
                let masks = problem(p, 0).masks;
                let sink = |r: usize| masks.sink((b * K::QUERY_BLOCK + r) % rows_per_query);
                merged.write(
                    &mut OutBlock {
                        first,
                        out: OutRows::Computed(out.expect("the rows fit")),
                        lse,
                        written: false,
                    },
                    &sink,
                );
                measured = measured.combine(merged.measured);
            }
            first_row += n_rows(p);
        }
        decoding.then_some(measured)
    }
}

#[cfg(test)]
mod tests;
