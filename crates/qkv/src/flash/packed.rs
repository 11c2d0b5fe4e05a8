//! Keys and values in the layouts the kernels read: packed from the caller's rows a block at a
//! time by the first task that needs the block, or read as a KV cache or a paged cache stored
//! them.

use std::ops::Range;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{CachedKeys, PagedKeys, Scales};
use crate::element::Real;
use crate::kernels::{self, Buffer, Element, Kernels, Layout, ValueRows};
use ndarray::ArrayView2;

/// Keys and values `first_key ..` in the layouts the kernels read.
pub(super) struct Packed<'a, E: Element> {
    first_key: usize,
    /// Keys per block of the tiled loop, the level's `KEY_BLOCK`.
    block_keys: usize,
    keys: PackedKeys<'a, E>,
    /// Value rows, `value_stride` scalars apart.
    values: Values<'a, E>,
    value_stride: usize,
    /// Vectors per value row.
    pub(super) value_vectors: usize,
}

/// The packed key panels (see `kernels::pack_key_panel`), zero-padded to whole panels.
enum PackedKeys<'a, E: Element> {
    /// Packed from the caller's keys, a block of `block_keys` at a time. The first task that
    /// needs a block packs it, so packing is shared out with the work that uses it, in the same
    /// round of work items (a round of its own would end waiting for a pool thread that was
    /// still waking up). No blocks when decoding.
    Packing {
        /// The keys from `first_key` on, as the caller passed them.
        k: ArrayView2<'a, E>,
        /// Keys per packed panel, the level's `KEY_PANEL`, and the layout of its tiles.
        key_panel: usize,
        layout: Layout,
        blocks: Vec<KeyBlock<E>>,
    },
    /// Every key's panel, packed beforehand (a KV cache's), `d_k` scalars per key, and the
    /// scales of quantized keys and values.
    Cached(&'a [E], Option<Scales<'a, E::Compute>>),
    /// Packed beforehand, block by block.
    Paged(PagedKeys<'a, E>),
}

/// One block of packed key panels, packed by the first task that needs it. A task that finds
/// another packing it waits by spinning rather than sleeping: packing a block takes a few
/// microseconds, and a thread put to sleep on a virtual machine took tens to wake (at 8 heads of
/// 256 queries, a third of a call's context switches were such waits).
struct KeyBlock<E: Element> {
    panels: OnceLock<Buffer<E>>,
    claimed: AtomicBool,
}

impl<E: Element> Default for KeyBlock<E> {
    fn default() -> Self {
        KeyBlock { panels: OnceLock::new(), claimed: AtomicBool::new(false) }
    }
}

impl<E: Element> KeyBlock<E> {
    /// Spins before waiting the ordinary way (which also packs the block if its packer panicked).
    const SPINS: usize = 1 << 16;

    /// The panels, packed with `pack` now if no task has claimed them yet. While another task
    /// packs them, `meanwhile` is called until it returns false (it packs a later block no task
    /// has claimed, work that waiting would otherwise leave for later).
    fn get(&self, pack: impl FnOnce() -> Buffer<E>, mut meanwhile: impl FnMut() -> bool) -> &[E] {
        if let Some(panels) = self.panels.get() {
            return panels;
        }
        if self.claim() {
            return self.panels.get_or_init(pack);
        }
        while self.panels.get().is_none() && meanwhile() {}
        for _ in 0..Self::SPINS {
            if let Some(panels) = self.panels.get() {
                return panels;
            }
            std::hint::spin_loop();
        }
        self.panels.get_or_init(pack)
    }

    /// Whether this task is the first to claim the block (and so must pack it).
    fn claim(&self) -> bool {
        !self.claimed.load(Ordering::Relaxed) && !self.claimed.swap(true, Ordering::AcqRel)
    }
}

/// `v`'s rows in `tensor`, the slice it lies in, read in place: from its first element on, and
/// the scalars from one row to the next; `None` unless each row is contiguous, the rows lie in
/// order at least a row apart, and all of them lie in `tensor`.
fn rows_in<'a, E>(v: ArrayView2<'_, E>, tensor: &'a [E]) -> Option<(&'a [E], usize)> {
    let (rows, width) = v.dim();
    let [row_stride, column_stride] = *v.strides() else { unreachable!("2-D view") };
    let stride = usize::try_from(row_stride).ok().filter(|&s| s >= width)?;
    if rows == 0 || (width > 1 && column_stride != 1) {
        return None;
    }
    let bytes = v.as_ptr().addr().checked_sub(tensor.as_ptr().addr())?;
    let first = (bytes % size_of::<E>() == 0).then_some(bytes / size_of::<E>())?;
    let values = tensor.get(first..)?;
    (values.len() >= (rows - 1) * stride + width && values.as_ptr() == v.as_ptr()).then_some((values, stride))
}

/// The values as the `P·V` kernel reads them: the caller's own rows when they are a whole number
/// of vectors wide and side by side or in place in the caller's tensor (or a cache's), otherwise
/// a zero-padded copy.
enum Values<'v, E: Element> {
    Borrowed(&'v [E]),
    Packed(Buffer<E>),
    /// A paged cache's, in its blocks.
    Paged(PagedKeys<'v, E>),
}

impl<'a, E: Element> Packed<'a, E> {
    /// The caller's keys `k` and values `v` (with the whole tensor `v` lies in, when it is one
    /// slice), from key `keys.start` on; the keys packed block by block as tasks first need them
    /// if `pack_keys`.
    pub(super) fn new<T: Real, K: Kernels<T, E>>(
        k: ArrayView2<'a, E>,
        (v, v_tensor): (ArrayView2<'a, E>, Option<&'a [E]>),
        keys: Range<usize>,
        pack_keys: bool,
    ) -> Self
    where
        E: Element<Compute = T>,
    {
        let first_key = keys.start;
        let (k, v) = (k.slice_move(ndarray::s![keys.clone(), ..]), v.slice_move(ndarray::s![keys, ..]));
        let blocks = if pack_keys { k.nrows().div_ceil(K::KEY_BLOCK) } else { 0 };
        let blocks = (0..blocks).map(|_| KeyBlock::default()).collect();
        let value_vectors = v.ncols().div_ceil(K::LANES);
        let mut value_stride = value_vectors * K::LANES;
        // Rows in place rather than copied: copies of a head's rows of flash-attn's layout took
        // 29% of a batch of decoding steps (`varlen --flash-layout decode64`, one Zen 4 thread).
        let in_place = match v.to_slice() {
            Some(values) => Some((values, value_stride)),
            None => v_tensor.and_then(|tensor| rows_in(v, tensor)),
        };
        let values = match in_place {
            _ if K::LAYOUT == Layout::Pairs => {
                let mut values = Buffer::zeros(v.nrows().div_ceil(2) * 2 * value_stride);
                kernels::pack_value_pairs(v, value_stride, &mut values);
                Values::Packed(values)
            }
            Some((values, stride)) if v.ncols() == value_stride => {
                value_stride = stride;
                Values::Borrowed(values)
            }
            _ => {
                let mut values = Buffer::zeros(v.nrows() * value_stride);
                for (row, out) in v.rows().into_iter().zip(values.chunks_exact_mut(value_stride)) {
                    kernels::pack_value_row(row, out);
                }
                Values::Packed(values)
            }
        };
        let keys = PackedKeys::Packing { k, key_panel: K::KEY_PANEL, layout: K::LAYOUT, blocks };
        Packed { first_key, block_keys: K::KEY_BLOCK, keys, values, value_stride, value_vectors }
    }

    /// A cache's keys and values, in the layout of the kernels of `K` already.
    pub(super) fn cached<T: Real, K: Kernels<T, E>>(cached: CachedKeys<'a, E>, value_dim: usize) -> Self
    where
        E: Element<Compute = T>,
    {
        Packed {
            first_key: 0,
            block_keys: K::KEY_BLOCK,
            keys: PackedKeys::Cached(cached.panels, cached.scales),
            values: Values::Borrowed(cached.values),
            value_stride: cached.value_stride,
            value_vectors: value_dim.div_ceil(K::LANES),
        }
    }

    /// A paged cache's keys and values, in the layout of the kernels of `K` already.
    pub(super) fn paged<T: Real, K: Kernels<T, E>>(paged: PagedKeys<'a, E>, value_dim: usize) -> Self
    where
        E: Element<Compute = T>,
    {
        Packed {
            first_key: 0,
            block_keys: K::KEY_BLOCK,
            keys: PackedKeys::Paged(paged),
            values: Values::Paged(paged),
            value_stride: paged.value_stride,
            value_vectors: value_dim.div_ceil(K::LANES),
        }
    }

    /// Where the first tile of a range of keys from `first` (where a tile may start) starts to
    /// reach key `key`: at a whole key block from `first`, or in a paged cache at the panel of
    /// its block that holds `key`.
    pub(super) fn tile_start(&self, first: usize, key: usize, key_panel: usize) -> usize {
        match &self.keys {
            PackedKeys::Paged(paged) => first.max(key - key % paged.block_size % key_panel),
            PackedKeys::Packing { .. } | PackedKeys::Cached(..) => {
                first + (key - first) / self.block_keys * self.block_keys
            }
        }
    }

    /// How many keys from `start` on lie side by side, panels and values alike: a tile may not
    /// run past them. Only a paged cache's block ends them.
    pub(super) fn contiguous_keys(&self, start: usize) -> usize {
        match &self.keys {
            PackedKeys::Paged(paged) => paged.block_size - start % paged.block_size,
            PackedKeys::Packing { .. } | PackedKeys::Cached(..) => usize::MAX,
        }
    }

    /// The packed panels of the key block starting at key `start` (of width `d`), packed now if
    /// no task has yet.
    pub(super) fn key_block(&self, start: usize, d: usize) -> &[E] {
        let offset = start - self.first_key;
        match &self.keys {
            PackedKeys::Packing { k, key_panel: width, layout, blocks } => {
                let pack = |block: usize| {
                    let offset = block * self.block_keys;
                    let n_keys = self.block_keys.min(k.nrows() - offset);
                    let panel_len = width * layout.padded_dim(d);
                    let mut panels = Buffer::zeros(n_keys.div_ceil(*width) * panel_len);
                    for (p, panel) in panels.chunks_exact_mut(panel_len).enumerate() {
                        kernels::pack_key_panel(*k, offset + p * width, *width, *layout, panel);
                    }
                    panels
                };
                let block = offset / self.block_keys;
                // Blocks are read in order, so the next ones unclaimed are the ones to pack while
                // waiting for this one.
                let mut later = block + 1..blocks.len();
                let pack_a_later_block = || match later.find(|&b| blocks[b].claim()) {
                    Some(b) => {
                        let _ = blocks[b].panels.get_or_init(|| pack(b));
                        true
                    }
                    None => false,
                };
                blocks[block].get(|| pack(block), pack_a_later_block)
            }
            // A block starts at a whole panel: its panels start `d` scalars per key in.
            PackedKeys::Cached(panels, _) => &panels[offset * d..],
            PackedKeys::Paged(paged) => {
                &paged.block(offset / paged.block_size).panels[offset % paged.block_size * d..]
            }
        }
    }

    /// The scales of the `n_keys` keys and values from key `start` on (inside one paged block),
    /// when they are quantized.
    pub(super) fn scales(&self, start: usize, n_keys: usize) -> Option<Scales<'a, E::Compute>> {
        let (scales, from) = match &self.keys {
            PackedKeys::Packing { .. } => return None,
            PackedKeys::Cached(_, scales) => (*scales, start - self.first_key),
            PackedKeys::Paged(paged) => {
                (paged.block(start / paged.block_size).scales, start % paged.block_size)
            }
        };
        let keys = from..from + n_keys;
        scales.map(|scales| Scales { keys: &scales.keys[keys.clone()], values: &scales.values[keys] })
    }

    /// The values of key `key` onwards, as the `P·V` kernel reads them.
    pub(super) fn values_from(&self, key: usize) -> ValueRows<'_, E> {
        let offset = (key - self.first_key) * self.value_stride;
        let v = match &self.values {
            Values::Borrowed(values) => &values[offset..],
            Values::Packed(values) => &values[offset..],
            Values::Paged(paged) => {
                &paged.block(key / paged.block_size).values[key % paged.block_size * self.value_stride..]
            }
        };
        ValueRows { v, stride: self.value_stride, vectors: self.value_vectors }
    }
}
