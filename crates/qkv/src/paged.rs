//! A paged KV cache: the keys and values of many sequences in fixed-size blocks of one pool, a
//! block table per sequence, and one attention call over a batch of sequences of different
//! lengths.
//!
//! The pool is one buffer of `blocks` blocks, allocated once. A block holds `block_size`
//! consecutive positions of one sequence for every layer and key/value head, each (layer, head)
//! laid out as [`KvCache`](crate::KvCache) lays out a whole sequence: keys as packed key panels
//! (`block_size` is a whole number of the level's panels) and values one padded row per position.
//! So the fast path reads a block as it reads a `KvCache` (`flash::PagedKeys`), and a tile of
//! keys ends at a block's end.
//!
//! Blocks are reference counted: a block's count is the number of sequences whose table holds
//! it. [`PagedKvCache::fork`] copies the parent's table and adds one to each of its blocks; a
//! block returns to the pool when its count falls to zero, through [`PagedKvCache::free`],
//! [`PagedKvCache::truncate`] or copy on write. An append writes only into blocks its sequence
//! holds alone: it first copies each shared block it would write into (the partial last block of
//! a fork, typically) to a free block, and the sequence lets go of the shared one.
//!
//! An int8 pool (`PagedKvCache<Q8>`) quantizes as `KvCache<Q8>` does (see `kv_cache`'s module
//! documentation: one scale per position and head for its key and its value, the same bound)
//! and keeps the scales in a second pool of f32 indexed by the same blocks: a block's scales are
//! each (layer, key/value head)'s `block_size` key scales, then its value scales, and copy on
//! write copies them with the block.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

use ndarray::{Array2, Array3, ArrayView3, ArrayViewMut2, ArrayViewMut3, Axis, Ix3, s};

use crate::element::{CacheStorage, Storage, checked_key_magnitude, row_scale};
use crate::error::{AttentionError, Dims};
use crate::finite::finite_magnitude;
use crate::flash::{self, CachedLayout, LayoutOf, PagedKeys, StoredKeys};
use crate::inputs::check_offsets;
use crate::kernels::{self, Buffer, Isa};
use crate::level::SimdLevel;
use crate::options::CacheOptions;
use crate::partial::PartialAttention;
use crate::rotary::{Rotary, rotation_growth, stored_keys};
use crate::shape::{Magnitudes, Shape, with_fields};
use crate::simd;
use crate::step::{self, ShapeMismatch, Step};

/// The sizes of a [`PagedKvCache`]: a pool of `blocks` blocks of `block_size` positions, each
/// position a key of `key_dim` and a value of `value_dim` elements for each of `kv_heads`
/// key/value heads of each of `layers` layers.
///
/// ```
/// let shape = qkv::PagedShape::new(2, 8, 128, 128, 64, 256);
/// assert_eq!(shape.block_size * shape.blocks, 16384); // positions, over every sequence
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PagedShape {
    /// Decoder layers, each with keys and values of its own.
    pub layers: usize,
    /// Key/value heads per layer; the queries may have any multiple of it (grouped-query attention).
    pub kv_heads: usize,
    /// Width of queries and keys (`d_k`).
    pub key_dim: usize,
    /// Width of values and of the output (`d_v`).
    pub value_dim: usize,
    /// Positions per block: any number at every level (vLLM's 16 included); a multiple of
    /// [`PagedKvCache::block_granularity`] wastes no key memory.
    pub block_size: usize,
    /// Blocks in the pool.
    pub blocks: usize,
}

impl PagedShape {
    /// `layers` × `kv_heads` heads of keys of `key_dim` and values of `value_dim` elements, in a
    /// pool of `blocks` blocks of `block_size` positions. (Built by this and the `with_` methods
    /// rather than as a literal, so that a later field is no breaking change.)
    pub const fn new(
        layers: usize,
        kv_heads: usize,
        key_dim: usize,
        value_dim: usize,
        block_size: usize,
        blocks: usize,
    ) -> Self {
        PagedShape { layers, kv_heads, key_dim, value_dim, block_size, blocks }
    }

    fn dims(&self) -> Dims {
        let PagedShape { layers, kv_heads, key_dim, value_dim, block_size, blocks } = *self;
        Dims(vec![layers, kv_heads, key_dim, value_dim, block_size, blocks])
    }
}

with_fields!(PagedShape:
    with_layers(layers), "This shape with `layers` layers.";
    with_kv_heads(kv_heads), "This shape with `kv_heads` key/value heads.";
    with_key_dim(key_dim), "This shape with keys of `key_dim`.";
    with_value_dim(value_dim), "This shape with values of `value_dim`.";
    with_block_size(block_size), "This shape with blocks of `block_size` positions.";
    with_blocks(blocks), "This shape with a pool of `blocks` blocks.";
);

/// A sequence of a [`PagedKvCache`], from [`PagedKvCache::add_sequence`] or
/// [`PagedKvCache::fork`]. Once the sequence is freed the id names nothing, even after its slot
/// is reused: every call with it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SequenceId {
    /// The cache that made it ([`Sequences::cache`]), so that another cache refuses it.
    cache: u32,
    slot: u32,
    generation: u32,
}

impl SequenceId {
    /// The sequence's slot in its cache, as errors name it. A freed sequence's slot goes to a
    /// later sequence, so two ids may share an index, never at the same time.
    ///
    /// ```
    /// let shape = qkv::PagedShape::new(1, 1, 4, 4, 64, 2);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let (a, b) = (cache.add_sequence(), cache.add_sequence());
    /// assert_eq!((a.index(), b.index()), (0, 1));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn index(self) -> usize {
        self.slot as usize
    }
}

/// The keys and values of many sequences for every layer of a decoder, in fixed-size blocks of
/// one pool allocated at [`PagedKvCache::new`], in the layout the kernels of one SIMD level read;
/// elements stored as `E` ([`CacheStorage`]: a [`Storage`] type, or int8, [`Q8`](crate::Q8),
/// appended as f32), computed in f32.
///
/// Sequences come and go ([`add_sequence`](Self::add_sequence), [`free`](Self::free)), share
/// their prefix ([`fork`](Self::fork), copy on write) and roll back
/// ([`truncate`](Self::truncate)). A layer ([`layer`](Self::layer)) appends each sequence's new
/// positions ([`PagedLayer::append`]) and attends with the new queries of a whole batch of
/// sequences in one call ([`PagedLayer::attend`]). Results equal
/// [`multi_head_attention`](crate::multi_head_attention) over each sequence's prefix with
/// `CausalMask::BottomRight`, within rounding.
///
/// ```
/// use qkv::ndarray::Array3;
/// use qkv::{PagedKvCache, PagedShape};
///
/// // One layer, 2 key/value heads, 4 query heads; blocks of 64 positions.
/// let shape = PagedShape::new(1, 2, 8, 8, 64, 8);
/// let mut cache = PagedKvCache::<f32>::new(shape)?;
/// let prompt = cache.add_sequence();
/// let kv = Array3::from_elem((2, 5, 8), 0.5);
/// cache.layer(0)?.append(prompt, kv.view(), kv.view())?; // a prompt of 5 positions
/// let other = cache.fork(prompt)?; // shares the prompt's block
/// for seq in [prompt, other] {
///     cache.layer(0)?.append(seq, Array3::zeros((2, 1, 8)).view(), Array3::ones((2, 1, 8)).view())?;
/// }
/// // One decoding step for both: one query per query head each, packed along axis 1.
/// let q = Array3::from_elem((4, 2, 8), 1.0);
/// let out = cache.layer(0)?.attend(&[prompt, other], &[0, 1, 2], q.view())?;
/// assert_eq!(out.shape(), [4, 2, 8]);
/// assert_eq!(cache.len(other)?, 6);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub struct PagedKvCache<E: CacheStorage = f32> {
    shape: PagedShape,
    level: SimdLevel,
    isa: Isa,
    block_layout: BlockLayout,
    storage: Buffer<E>,
    /// An int8 pool's scales, `block_layout.scales_stride` per block (empty otherwise).
    scales: Vec<f32>,
    pool: BlockPool,
    sequences: Sequences,
    /// Keys are rotated as they are appended, queries as a step stacks them.
    rotary: Option<Rotary>,
    step: StepBuffers,
}

/// What a batched attend keeps between calls so that, once warm, it allocates nothing (as a
/// `KvCache` keeps its own): the batch's members, the queries stacked by (sequence, key/value
/// head) and widened to f32, the stacked output, and the fast path's own buffers. Each grows to
/// the largest batch seen and never shrinks.
#[derive(Default)]
struct StepBuffers {
    members: Vec<Member>,
    /// By slot: whether the step being checked lists the sequence already (all false between
    /// steps).
    listed: Vec<bool>,
    step: step::StepBuffers<f32>,
}

/// One sequence of a batch: its slot, what it holds at the layer, and its queries' run of the
/// packed axis.
struct Member {
    slot: usize,
    state: LayerState,
    /// The first position the sequence holds (see [`PagedKvCache::evict_before`]).
    first_held: usize,
    queries: Range<usize>,
}

impl Member {
    /// The positions its queries read.
    fn n_keys(&self) -> usize {
        self.state.len - self.first_held
    }
}

/// Where a block keeps what, in scalars.
#[derive(Debug, Clone, Copy)]
struct BlockLayout {
    /// The level's panel width and padded value rows.
    layout: CachedLayout,
    kv_heads: usize,
    key_dim: usize,
    /// Positions per block.
    size: usize,
    /// Room for keys in a block's panels: `size` rounded up to whole panels.
    key_lanes: usize,
    /// Scalars per (layer, key/value head) inside a block: its panels, then its value rows.
    head_stride: usize,
    /// Scalars per block.
    stride: usize,
    /// Scales per block of an int8 pool (0 otherwise): each (layer, key/value head)'s
    /// `size` key scales, then its `size` value scales.
    scales_stride: usize,
}

impl BlockLayout {
    /// Where the panels of (`layer`, key/value head `head`) start inside a block.
    fn panels_at(&self, layer: usize, head: usize) -> usize {
        (layer * self.kv_heads + head) * self.head_stride
    }

    /// Where its value rows start.
    fn values_at(&self, layer: usize, head: usize) -> usize {
        self.panels_at(layer, head) + self.key_lanes * self.key_dim
    }

    /// Where its key scales start inside a block's scales (its value scales follow them).
    fn scales_at(&self, layer: usize, head: usize) -> usize {
        (layer * self.kv_heads + head) * 2 * self.size
    }

    /// The keys and values of (`layer`, key/value head `head`) in the blocks of `table`, in
    /// `pool`'s storage and scales.
    fn keys<'p, E: kernels::Element>(
        &self,
        (storage, scales): (&'p [E], &'p [E::Compute]),
        table: &'p [u32],
        layer: usize,
        head: usize,
    ) -> PagedKeys<'p, E> {
        PagedKeys {
            storage,
            block_stride: self.stride,
            table,
            block_size: self.size,
            key_lanes: self.key_lanes,
            panels_at: self.panels_at(layer, head),
            values_at: self.values_at(layer, head),
            key_dim: self.key_dim,
            value_stride: self.layout.value_stride,
            scales,
            scales_stride: self.scales_stride,
            scales_at: self.scales_at(layer, head),
        }
    }
}

/// Who holds which block.
struct BlockPool {
    /// How many sequences hold each block in their table; 0 for a free block.
    holders: Vec<u32>,
    /// The blocks no sequence holds, the next one to give out last.
    free: Vec<u32>,
}

impl BlockPool {
    /// A free block, now held once. The caller checked that there is one.
    fn take(&mut self) -> u32 {
        let block = self.free.pop().expect("the caller checked for a free block");
        self.holders[block as usize] = 1;
        block
    }

    /// One holder lets go of `block`, which returns to the pool if it was the last.
    fn release(&mut self, block: u32) {
        let holders = &mut self.holders[block as usize];
        *holders -= 1;
        if *holders == 0 {
            self.free.push(block);
        }
    }
}

/// The sequences of one cache, by slot: the ids it hands out name it, so that an id from another
/// cache (which may have the same slot and generation) fails there too.
struct Sequences {
    /// Distinct for every cache a process makes.
    cache: u32,
    slots: Vec<Slot>,
    /// Slots of freed sequences, for the next ones.
    free: Vec<u32>,
}

impl Sequences {
    fn new() -> Sequences {
        static CACHES: AtomicU32 = AtomicU32::new(0);
        Sequences { cache: CACHES.fetch_add(1, Ordering::Relaxed), slots: Vec::new(), free: Vec::new() }
    }

    /// The sequence `id` names, if it is this cache's and still held.
    fn get(&self, id: SequenceId) -> Result<&Sequence, AttentionError> {
        let unknown = |why| AttentionError::UnknownSequence { sequence: id.index(), why };
        if id.cache != self.cache {
            return Err(unknown("the id comes from another cache"));
        }
        match self.slots.get(id.index()) {
            Some(Slot { generation, sequence: Some(sequence) }) if *generation == id.generation => {
                Ok(sequence)
            }
            Some(Slot { sequence: Some(_), .. }) => {
                Err(unknown("it was freed, and its slot now holds a later sequence, under an id of its own"))
            }
            _ => Err(unknown("it was freed")),
        }
    }

    /// [`get`](Self::get), to change the sequence.
    fn get_mut(&mut self, id: SequenceId) -> Result<&mut Sequence, AttentionError> {
        self.get(id)?;
        Ok(self.slots[id.index()].sequence.as_mut().expect("checked above"))
    }

    /// Holds `sequence` in a free slot, or a new one.
    fn insert(&mut self, sequence: Sequence) -> SequenceId {
        let slot = self.free.pop().unwrap_or_else(|| {
            let slot = u32::try_from(self.slots.len()).expect("fewer than 2^32 sequences at once");
            self.slots.push(Slot { generation: 0, sequence: None });
            slot
        });
        let entry = &mut self.slots[slot as usize];
        entry.sequence = Some(sequence);
        SequenceId { cache: self.cache, slot, generation: entry.generation }
    }

    /// Lets go of the sequence `id` names: the id names nothing from now on.
    fn remove(&mut self, id: SequenceId) -> Result<Sequence, AttentionError> {
        self.get(id)?;
        let slot = &mut self.slots[id.index()];
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(id.slot);
        Ok(slot.sequence.take().expect("checked above"))
    }

    /// The sequences held.
    fn iter(&self) -> impl Iterator<Item = &Sequence> {
        self.slots.iter().filter_map(|slot| slot.sequence.as_ref())
    }
}

/// A slot for one sequence; `generation` counts the sequences it has held, so an old id fails.
struct Slot {
    generation: u32,
    sequence: Option<Sequence>,
}

/// One sequence: its blocks in position order, and each layer's length.
struct Sequence {
    /// Made with room for every block of the pool, so that an append that takes a block never
    /// grows it: a decoding step allocates nothing (4 bytes a block, next to the block's own
    /// size, is little). `blocks[i]` holds the positions of block `evicted + i`.
    blocks: Vec<u32>,
    /// Blocks let go of from the front ([`PagedKvCache::evict_before`]): positions before
    /// `evicted · block_size` are no longer held.
    evicted: usize,
    layers: Vec<LayerState>,
}

impl Sequence {
    /// Positions held by the longest layer (a decoder appends layer after layer, so the layers
    /// of a sequence differ by a step while it runs).
    fn len(&self) -> usize {
        self.layers.iter().map(|l| l.len).max().unwrap_or(0)
    }
}

/// One layer of a sequence: positions held, and a bound on its `|k|` and `|v|`: the largest
/// appended, or measured in what is held when a step found that too large (see
/// `flash::stays_finite`; a truncation keeps them, a bound still, looser).
#[derive(Debug, Clone, Copy, Default)]
struct LayerState {
    len: usize,
    keys: f64,
    values: f64,
}

impl<E: CacheStorage> PagedKvCache<E> {
    /// An empty cache of `shape` for the SIMD level the engine dispatches to
    /// ([`SimdLevel::dispatched`]), its whole pool allocated now. A shape whose pool overflows the
    /// address space or that the allocator cannot provide is an error
    /// ([`AttentionError::PagedTooLarge`]). Any block size fits every level: a block's keys are
    /// padded to whole key panels of the level, so a block size that is a multiple of
    /// [`block_granularity`](Self::block_granularity) (64 is one at every level) wastes no
    /// memory, and vLLM's 16 wastes none below AVX-512.
    ///
    /// ```
    /// let shape = qkv::PagedShape::new(1, 1, 4, 4, 64, 4);
    /// let cache = qkv::PagedKvCache::<qkv::half::bf16>::new(shape)?;
    /// assert_eq!(cache.free_blocks(), 4);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn new(shape: PagedShape) -> Result<PagedKvCache<E>, AttentionError> {
        PagedKvCache::for_level(shape, SimdLevel::dispatched()?)
    }

    /// An empty cache of `shape` laid out for the kernels of `level`, which every call runs (the
    /// layout differs between levels). Fails if this CPU does not run `level`.
    ///
    /// ```
    /// let shape = qkv::PagedShape::new(1, 1, 4, 4, 8, 4);
    /// let cache = qkv::PagedKvCache::<f32>::for_level(shape, qkv::SimdLevel::Baseline)?;
    /// assert_eq!(cache.simd_level(), qkv::SimdLevel::Baseline);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn for_level(shape: PagedShape, level: SimdLevel) -> Result<PagedKvCache<E>, AttentionError> {
        let PagedShape { layers, kv_heads, key_dim, value_dim, block_size, blocks } = shape;
        if [layers, kv_heads, key_dim, value_dim, block_size, blocks].contains(&0) {
            return Err(AttentionError::Empty {
                argument: "the paged KV cache's shape [layers, kv_heads, key_dim, value_dim, block_size, blocks]",
                shape: shape.dims(),
                why: "a pool needs at least one layer, key/value head and block, blocks of at least \
                      one position, and keys and values at least one component wide",
            });
        }
        // The tiles' layouts are not a cache's: caches run the level's vectors.
        let isa = simd::kernels_for(Some(level))?.vectors();
        let too_large =
            |bytes, why| AttentionError::PagedTooLarge { shape: shape.dims(), storage: E::NAME, bytes, why };
        let address_space = "which is more than an address space holds (isize::MAX bytes)";
        let layout = isa.run::<E, _>(LayoutOf { value_dim }).ok_or_else(|| too_large(None, address_space))?;
        // A block in scalars, and the pool in bytes, bookkeeping included: sizes the caller chose
        // may overflow any of them.
        let key_lanes = block_size.checked_next_multiple_of(layout.key_panel);
        let keys = key_lanes.and_then(|lanes| lanes.checked_mul(key_dim));
        let head_stride =
            keys.and_then(|keys| layout.value_stride.checked_mul(block_size)?.checked_add(keys));
        let block_stride = head_stride.and_then(|h| h.checked_mul(kv_heads)?.checked_mul(layers));
        let scalars = block_stride.and_then(|b| b.checked_mul(blocks));
        // An int8 pool's scales: a key's and a value's per position of each head of each layer.
        let scales_stride = if E::SCALED {
            kv_heads.checked_mul(layers).and_then(|h| h.checked_mul(2 * block_size))
        } else {
            Some(0)
        };
        let scales = scales_stride.and_then(|s| s.checked_mul(blocks));
        let bytes = scalars.zip(scales).and_then(|(s, scales)| {
            s.checked_mul(size_of::<E>())?
                .checked_add(scales.checked_mul(size_of::<f32>())?)?
                .checked_add(blocks.checked_mul(8)?)
        });
        if u32::try_from(blocks).is_err() {
            // The size is still what the message gives: the limit met is the table's, not memory's.
            let why = "which is more blocks than a block table's u32 entries can name (2^32 - 1 at most)";
            return Err(too_large(bytes, why));
        }
        let (
            Some(head_stride),
            Some(block_stride),
            Some(scalars),
            Some(scales_stride),
            Some(scales),
            Some(bytes @ ..=ISIZE_MAX),
        ) = (head_stride, block_stride, scalars, scales_stride, scales, bytes)
        else {
            return Err(too_large(bytes, address_space));
        };
        let refused = |_| too_large(Some(bytes), "which the allocator refused");
        let storage = Buffer::try_zeros(scalars).map_err(refused)?;
        let mut scales_pool = Vec::new();
        scales_pool.try_reserve_exact(scales).map_err(refused)?;
        scales_pool.resize(scales, 0.0);
        let mut holders = Vec::new();
        holders.try_reserve_exact(blocks).map_err(refused)?;
        holders.resize(blocks, 0);
        let mut free = Vec::new();
        free.try_reserve_exact(blocks).map_err(refused)?;
        // Given out from the end: block 0 first.
        free.extend((0..blocks as u32).rev());
        let pool = BlockPool { holders, free };
        let key_lanes = block_size.next_multiple_of(layout.key_panel);
        let block_layout = BlockLayout {
            layout,
            kv_heads,
            key_dim,
            size: block_size,
            key_lanes,
            head_stride,
            stride: block_stride,
            scales_stride,
        };
        Ok(PagedKvCache {
            shape,
            level,
            isa,
            block_layout,
            storage,
            scales: scales_pool,
            pool,
            sequences: Sequences::new(),
            rotary: None,
            step: StepBuffers::default(),
        })
    }

    /// This cache with a rotary position embedding, as
    /// [`KvCache::with_rotary`](crate::KvCache::with_rotary) takes one: keys rotated by their
    /// position as each sequence appends them, queries by theirs as a step takes them (a fork
    /// shares its prefix's rotated keys, positions and all). Fails if the embedding does not fit
    /// the keys, or if any sequence already holds positions.
    pub fn with_rotary(mut self, rotary: Rotary) -> Result<Self, AttentionError> {
        rotary.check(self.shape.key_dim)?;
        if self.sequences.iter().any(|s| s.len() > 0) {
            return Err(AttentionError::RotaryAfterAppend);
        }
        self.rotary = Some(rotary);
        Ok(self)
    }

    /// The block sizes that waste no key memory for a cache of `E` at `level` are multiples of
    /// this: the level's key panel (8 to 64), to which a block's keys are padded. Any block
    /// size works. Fails if this CPU does not run `level`.
    ///
    /// ```
    /// let multiple = qkv::PagedKvCache::<f32>::block_granularity(qkv::SimdLevel::dispatched()?)?;
    /// assert_eq!(64 % multiple, 0);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn block_granularity(level: SimdLevel) -> Result<usize, AttentionError> {
        // The tiles' layouts are not a cache's: caches run the level's vectors.
        let isa = simd::kernels_for(Some(level))?.vectors();
        let layout = isa.run::<E, _>(LayoutOf { value_dim: 1 }).expect("one value component fits");
        Ok(layout.key_panel)
    }

    /// The sizes the cache was made with.
    pub fn shape(&self) -> PagedShape {
        self.shape
    }

    /// The SIMD level whose kernels the cache is laid out for.
    pub fn simd_level(&self) -> SimdLevel {
        self.level
    }

    /// Blocks that no sequence holds.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::PagedShape::new(1, 1, 4, 4, 64, 4);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let seq = cache.add_sequence();
    /// let kv = Array3::zeros((1, 65, 4));
    /// cache.layer(0)?.append(seq, kv.view(), kv.view())?;
    /// assert_eq!(cache.free_blocks(), 2);
    /// cache.free(seq)?;
    /// assert_eq!(cache.free_blocks(), 4);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn free_blocks(&self) -> usize {
        self.pool.free.len()
    }

    /// A new, empty sequence.
    pub fn add_sequence(&mut self) -> SequenceId {
        let sequence = Sequence {
            blocks: Vec::with_capacity(self.shape.blocks),
            evicted: 0,
            layers: vec![LayerState::default(); self.shape.layers],
        };
        self.sequences.insert(sequence)
    }

    fn sequence(&self, id: SequenceId) -> Result<&Sequence, AttentionError> {
        self.sequences.get(id)
    }

    /// Positions `seq` holds (at its longest layer, while a decoder's layers take their turns).
    pub fn len(&self, seq: SequenceId) -> Result<usize, AttentionError> {
        Ok(self.sequence(seq)?.len())
    }

    /// The pool blocks `seq` holds, in position order: block `i` holds positions
    /// `first_held + i · block_size ..` ([`first_held`](Self::first_held)). A fork's table starts
    /// as its parent's.
    pub fn block_table(&self, seq: SequenceId) -> Result<&[u32], AttentionError> {
        Ok(&self.sequence(seq)?.blocks)
    }

    /// A new sequence holding what `seq` holds, sharing its blocks (each now held once more):
    /// nothing is copied until one of the two appends into a block they share.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::PagedShape::new(1, 1, 4, 4, 64, 4);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let parent = cache.add_sequence();
    /// let kv = Array3::zeros((1, 70, 4)); // one full block and one partial
    /// cache.layer(0)?.append(parent, kv.view(), kv.view())?;
    /// let child = cache.fork(parent)?;
    /// assert_eq!(cache.block_table(child)?, cache.block_table(parent)?);
    /// let one = Array3::zeros((1, 1, 4));
    /// cache.layer(0)?.append(child, one.view(), one.view())?; // copies the partial block
    /// assert_eq!(cache.block_table(child)?[0], cache.block_table(parent)?[0]);
    /// assert_ne!(cache.block_table(child)?[1], cache.block_table(parent)?[1]);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn fork(&mut self, seq: SequenceId) -> Result<SequenceId, AttentionError> {
        let parent = self.sequence(seq)?;
        let mut blocks = Vec::with_capacity(self.shape.blocks);
        blocks.extend_from_slice(&parent.blocks);
        let child = Sequence { blocks, evicted: parent.evicted, layers: parent.layers.clone() };
        for &block in &child.blocks {
            self.pool.holders[block as usize] += 1;
        }
        Ok(self.sequences.insert(child))
    }

    /// Rolls `seq` back to its first `len` positions (every layer holding more is cut to `len`),
    /// and lets go of the blocks past them. Fails if `seq` holds fewer than `len`.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::PagedShape::new(1, 1, 4, 4, 64, 4);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let seq = cache.add_sequence();
    /// let kv = Array3::zeros((1, 130, 4));
    /// cache.layer(0)?.append(seq, kv.view(), kv.view())?;
    /// cache.truncate(seq, 64)?; // rejects the last 66 positions (a speculative draft, say)
    /// assert_eq!((cache.len(seq)?, cache.free_blocks()), (64, 3));
    /// assert!(cache.truncate(seq, 65).is_err());
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn truncate(&mut self, seq: SequenceId, len: usize) -> Result<(), AttentionError> {
        let block_size = self.shape.block_size;
        let sequence = self.sequences.get_mut(seq)?;
        let held = sequence.len();
        if len > held {
            return Err(AttentionError::TruncateLength { sequence: seq.index(), len: held, requested: len });
        }
        let first_held = sequence.evicted * block_size;
        if len < first_held {
            return Err(AttentionError::Evicted { sequence: seq.index(), position: len, first_held });
        }
        for layer in &mut sequence.layers {
            layer.len = layer.len.min(len);
        }
        for block in sequence.blocks.drain(len.div_ceil(block_size) - sequence.evicted..) {
            self.pool.release(block);
        }
        Ok(())
    }

    /// Lets go of the blocks of `seq` that hold only positions before `position`: a sliding
    /// window's keys that no query will see again (vLLM frees them so), so that a long
    /// generation runs in the window's blocks. Positions keep their numbers: [`len`](Self::len)
    /// is unchanged, the sequence holds positions [`first_held`](Self::first_held)`..len` (the
    /// start of `position`'s block on), and a step's queries see those alone, their causal
    /// alignment, ALiBi distances and rotary angles still counted from position 0; a step whose
    /// sliding window reaches a position let go fails ([`AttentionError::WindowEvicted`]), so
    /// evict before the next query's position less the window's `before`. Fails if a
    /// layer of `seq` holds fewer than `position` positions. Evicting before a position already
    /// let go of does nothing.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::PagedShape::new(1, 1, 4, 4, 64, 4);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let seq = cache.add_sequence();
    /// let kv = Array3::zeros((1, 200, 4));
    /// cache.layer(0)?.append(seq, kv.view(), kv.view())?; // blocks of positions 0, 64, 128, 192
    /// cache.evict_before(seq, 200 - 100)?; // a window of 100 keys back from the next query
    /// assert_eq!((cache.first_held(seq)?, cache.len(seq)?, cache.free_blocks()), (64, 200, 1));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn evict_before(&mut self, seq: SequenceId, position: usize) -> Result<(), AttentionError> {
        let block_size = self.shape.block_size;
        let sequence = self.sequences.get_mut(seq)?;
        let shortest = sequence.layers.iter().map(|l| l.len).min().unwrap_or(0);
        if position > shortest {
            return Err(AttentionError::EvictBeyond { sequence: seq.index(), position, held: shortest });
        }
        let keep_from = position / block_size;
        if keep_from > sequence.evicted {
            for block in sequence.blocks.drain(..keep_from - sequence.evicted) {
                self.pool.release(block);
            }
            sequence.evicted = keep_from;
        }
        Ok(())
    }

    /// The first position `seq` still holds: 0 unless [`evict_before`](Self::evict_before) let
    /// blocks go.
    pub fn first_held(&self, seq: SequenceId) -> Result<usize, AttentionError> {
        Ok(self.sequence(seq)?.evicted * self.shape.block_size)
    }

    /// Ends `seq`: its blocks are let go of (those no other sequence holds return to the pool)
    /// and its id names nothing from now on.
    pub fn free(&mut self, seq: SequenceId) -> Result<(), AttentionError> {
        for block in self.sequences.remove(seq)?.blocks {
            self.pool.release(block);
        }
        Ok(())
    }

    /// Layer `layer`, to append to and attend over. Fails if there is no such layer.
    pub fn layer(&mut self, layer: usize) -> Result<PagedLayer<'_, E>, AttentionError> {
        let layers = self.shape.layers;
        if layer >= layers {
            return Err(AttentionError::CacheLayer { layer, layers });
        }
        Ok(PagedLayer { cache: self, index: layer })
    }
}

/// The largest size of one allocation (Rust's limit for any object).
const ISIZE_MAX: usize = isize::MAX as usize;

/// One layer of a [`PagedKvCache`] ([`PagedKvCache::layer`]): where a decoder layer appends each
/// sequence's new positions and attends with a batch of sequences' queries.
pub struct PagedLayer<'c, E: CacheStorage> {
    cache: &'c mut PagedKvCache<E>,
    index: usize,
}

impl<E: CacheStorage> PagedLayer<'_, E> {
    /// Positions `seq` holds at this layer.
    pub fn len(&self, seq: SequenceId) -> Result<usize, AttentionError> {
        Ok(self.cache.sequence(seq)?.layers[self.index].len)
    }

    /// Appends to `seq` the keys `k` (`[kv_heads, n_new, d_k]`) and values `v`
    /// (`[kv_heads, n_new, d_v]`) of `n_new` positions, taking blocks from the pool as it needs
    /// them and first copying any block it shares with another sequence that it would write into.
    /// Checks the shapes, that every element is finite and that the pool has the blocks before it
    /// writes anything, so a failed append leaves the cache as it was.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::PagedShape::new(1, 2, 3, 5, 64, 1);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let seq = cache.add_sequence();
    /// let mut layer = cache.layer(0)?;
    /// layer.append(seq, Array3::zeros((2, 60, 3)).view(), Array3::zeros((2, 60, 5)).view())?;
    /// let full = layer.append(seq, Array3::zeros((2, 5, 3)).view(), Array3::zeros((2, 5, 5)).view());
    /// assert!(full.unwrap_err().to_string().starts_with("appending 5 positions to sequence 0"));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn append(
        &mut self,
        seq: SequenceId,
        k: ArrayView3<E::Appended>,
        v: ArrayView3<E::Appended>,
    ) -> Result<(), AttentionError> {
        let PagedShape { kv_heads, key_dim, value_dim, block_size, blocks, .. } = self.cache.shape;
        let n_new = k.shape()[1];
        step::check_appended(k.shape(), v.shape(), kv_heads, key_dim, value_dim)
            .map_err(|mismatch| self.shape_error(mismatch))?;
        let values = finite_magnitude("values", &v)?;
        let layer = self.index;
        let len = self.cache.sequence(seq)?.layers[layer].len;
        let (k, keys) = stored_keys(self.cache.rotary.as_ref(), k, len)?;
        let k = k.view();
        let cache = &mut *self.cache;
        let (pool, storage, scales, at) =
            (&mut cache.pool, &mut cache.storage, &mut cache.scales, cache.block_layout);
        let sequence = cache.sequences.get_mut(seq)?;
        let len = sequence.layers[layer].len;
        let end = len + n_new;
        // The blocks the new positions land in: those of the table (copied first if shared),
        // then new ones.
        let first = sequence.evicted;
        let written = len / block_size - first..end.div_ceil(block_size) - first;
        let held = sequence.blocks.len();
        let shared = (written.start..written.end.min(held))
            .filter(|&i| pool.holders[sequence.blocks[i] as usize] > 1)
            .count();
        let needed = shared + written.end.saturating_sub(held);
        if needed > pool.free.len() {
            return Err(AttentionError::PoolFull {
                sequence: seq.index(),
                layer,
                len,
                appended: n_new,
                needed,
                free: pool.free.len(),
                blocks,
            });
        }
        for i in written.start..written.end.min(held) {
            let block = sequence.blocks[i];
            if pool.holders[block as usize] > 1 {
                // Copy on write: the whole block, every layer's positions in it included.
                let copy = pool.take();
                let from = block as usize * at.stride;
                storage.copy_within(from..from + at.stride, copy as usize * at.stride);
                let from = block as usize * at.scales_stride;
                scales.copy_within(from..from + at.scales_stride, copy as usize * at.scales_stride);
                pool.release(block);
                sequence.blocks[i] = copy;
            }
        }
        while sequence.blocks.len() < written.end {
            sequence.blocks.push(pool.take());
        }
        let CachedLayout { key_panel, value_stride } = at.layout;
        for (head, (k, v)) in k.outer_iter().zip(v.outer_iter()).enumerate() {
            for (j, (key, value)) in k.outer_iter().zip(v.outer_iter()).enumerate() {
                let position = len + j;
                let within = position % block_size;
                let block = sequence.blocks[position / block_size - first] as usize;
                let (key_scale, value_scale) = (row_scale::<E>(key), row_scale::<E>(value));
                if E::SCALED {
                    let at = block * at.scales_stride + at.scales_at(layer, head) + within;
                    (scales[at], scales[at + block_size]) = (key_scale, value_scale);
                }
                let block = block * at.stride;
                // The key in lane `within % key_panel` of its panel, the value in its row.
                let panel = &mut storage
                    [block + at.panels_at(layer, head) + within / key_panel * key_panel * key_dim..];
                kernels::write_key_lane(
                    key,
                    key_scale,
                    within % key_panel,
                    key_panel,
                    &mut panel[..key_panel * key_dim],
                );
                let row =
                    &mut storage[block + at.values_at(layer, head) + within * value_stride..][..value_dim];
                kernels::store_row(value, value_scale, row.iter_mut());
            }
        }
        let state = &mut sequence.layers[layer];
        state.len = end;
        state.keys = state.keys.max(keys);
        state.values = state.values.max(values);
        Ok(())
    }

    /// Attention for a batch of sequences in one call: `sequences[i]` attends with the queries
    /// `query_offsets[i] .. query_offsets[i + 1]` of `q` (`[query_heads, n_queries, d_k]`, the
    /// queries of every sequence packed along axis 1, flash-attn's `cu_seqlens_q`), which are its
    /// last positions held (append their keys and values first): query `j` of a sequence holding
    /// `len` positions with `n` queries sees positions `0 ..= len - n + j`. One query per
    /// sequence is a batched decoding step; a sequence's whole prompt is its prefill, and prompts
    /// of several sequences go in one call. Query head `h` reads key/value head
    /// `h / (query_heads / kv_heads)`. Returns `[query_heads, n_queries, d_v]` in f32, packed as
    /// `q` is. The queries are f32 or the pool's own type (llama.cpp keeps f32 queries over an
    /// f16 cache): either is widened to f32 once per step.
    ///
    /// The work items (sequence × key/value head × block of queries) of every sequence are shared
    /// out together, so a batch of short sequences keeps every core busy. The results depend on
    /// neither the number of threads nor the batch: a sequence's rows are the same bits alone or
    /// beside any others, since how its keys are split between tasks follows its own length and
    /// queries.
    ///
    /// A token-major batch (`[n_queries, query_heads, d_k]`, as a projection writes it) is
    /// `q.permuted_axes([1, 0, 2])`, with no copy.
    ///
    /// Takes `&mut self` because the step's buffers live in the cache:
    /// [`attend_into`](Self::attend_into) allocates nothing once a batch of the same sequences
    /// has run (see there).
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::PagedShape::new(1, 1, 2, 1, 64, 4);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let (a, b) = (cache.add_sequence(), cache.add_sequence());
    /// let mut layer = cache.layer(0)?;
    /// let k = Array3::zeros((1, 2, 2));
    /// layer.append(a, k.view(), Array3::from_shape_vec((1, 2, 1), vec![2.0, 4.0]).unwrap().view())?;
    /// layer.append(b, k.view(), Array3::from_shape_vec((1, 2, 1), vec![6.0, 8.0]).unwrap().view())?;
    /// // Sequence a: two queries (its prefill); sequence b: one (a decoding step).
    /// let out = layer.attend(&[a, b], &[0, 2, 3], Array3::<f32>::zeros((1, 3, 2)).view())?;
    /// assert_eq!(out.into_raw_vec_and_offset().0, vec![2.0, 3.0, 7.0]);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend<Q: Storage>(
        &mut self,
        sequences: &[SequenceId],
        query_offsets: &[usize],
        q: ArrayView3<Q>,
    ) -> Result<Array3<f32>, AttentionError> {
        self.attend_with(sequences, query_offsets, q, &CacheOptions::new())
    }

    /// Like [`attend`](Self::attend), writing the output into `out`
    /// (`[query_heads, n_queries, d_v]`) of f32, bf16 or f16 ([`Storage`]): each row is computed
    /// in f32 and rounded once to `O` (as `O::from_f32` rounds). If the call fails, `out` may
    /// hold anything.
    ///
    /// A decoding step allocates nothing on the calling thread once warm: the stacked queries,
    /// the output rows and the fast path's states and scratch are kept in the cache and reused,
    /// grown by the first call of a batch and never shrunk. So after a first call with a batch,
    /// a step over the same sequences (each one position longer, its new token appended) makes
    /// no allocation when it runs on the calling thread (a one-thread pool, or a short step that
    /// does not follow another closely); shared from a thread of the pool, none either, and from
    /// outside the pool only the job rayon boxes for each helper thread (and, once in 63 jobs,
    /// a block of rayon's queue). A batch whose sequences need more work items
    /// than the cache has kept grows its buffers once.
    ///
    /// ```
    /// use qkv::half::bf16;
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::PagedShape::new(1, 1, 2, 1, 64, 2);
    /// let mut cache = qkv::PagedKvCache::<bf16>::new(shape)?;
    /// let seq = cache.add_sequence();
    /// let mut layer = cache.layer(0)?;
    /// let v = Array3::from_shape_fn((1, 3, 1), |(_, j, _)| bf16::from_f32(j as f32 + 0.1));
    /// layer.append(seq, Array3::from_elem((1, 3, 2), bf16::ZERO).view(), v.view())?;
    /// let q = Array3::from_elem((1, 1, 2), bf16::ZERO);
    /// let mut out = Array3::<bf16>::zeros((1, 1, 1));
    /// layer.attend_into(&[seq], &[0, 1], q.view(), out.view_mut())?;
    /// // The mean of the three values, computed in f32 and rounded once.
    /// assert_eq!(out[[0, 0, 0]], bf16::from_f32(layer.attend(&[seq], &[0, 1], q.view())?[[0, 0, 0]]));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend_into<Q: Storage, O: Storage>(
        &mut self,
        sequences: &[SequenceId],
        query_offsets: &[usize],
        q: ArrayView3<Q>,
        out: ArrayViewMut3<O>,
    ) -> Result<(), AttentionError> {
        self.attend_with_into(sequences, query_offsets, q, &CacheOptions::new(), out, None)
    }

    /// [`attend`](Self::attend) under `options` (see [`attend_with_into`](Self::attend_with_into)).
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// use qkv::{CacheOptions, SlidingWindow};
    /// let shape = qkv::PagedShape::new(1, 1, 1, 1, 64, 2);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let seq = cache.add_sequence();
    /// let mut layer = cache.layer(0)?;
    /// let v = Array3::from_shape_vec((1, 4, 1), vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    /// layer.append(seq, Array3::zeros((1, 4, 1)).view(), v.view())?;
    /// // The last position sees itself and one position back: the mean of 3 and 4.
    /// let window = CacheOptions::new().sliding_window(SlidingWindow::new(1, 0));
    /// let out = layer.attend_with(&[seq], &[0, 1], Array3::<f32>::zeros((1, 1, 1)).view(), &window)?;
    /// assert_eq!(out[[0, 0, 0]], 3.5);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend_with<Q: Storage>(
        &mut self,
        sequences: &[SequenceId],
        query_offsets: &[usize],
        q: ArrayView3<Q>,
        options: &CacheOptions,
    ) -> Result<Array3<f32>, AttentionError> {
        let [query_heads, n_queries, _] = *q.shape() else { unreachable!("3-D view") };
        let mut out = Array3::zeros((query_heads, n_queries, self.cache.shape.value_dim));
        self.attend_with_into(sequences, query_offsets, q, options, out.view_mut(), None)?;
        Ok(out)
    }

    /// [`attend_with`](Self::attend_with), also returning each row's logsumexp
    /// (`[query_heads, n_queries]`, packed as `q` is, in the scaled-score domain, see
    /// [`PartialAttention`]), as [`KvCache`](crate::KvCache)'s `attend_with_lse`: a step over
    /// part of a sequence's positions that another part's step merges with.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::PagedShape::new(1, 1, 1, 1, 64, 2);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let seq = cache.add_sequence();
    /// let mut layer = cache.layer(0)?;
    /// let v = Array3::from_shape_vec((1, 2, 1), vec![1.0, 3.0]).unwrap();
    /// layer.append(seq, Array3::zeros((1, 2, 1)).view(), v.view())?;
    /// let q = Array3::<f32>::zeros((1, 1, 1));
    /// let part = layer.attend_with_lse(&[seq], &[0, 1], q.view(), &qkv::CacheOptions::new())?;
    /// // Two scores of 0: the mean, and ln(e^0 + e^0).
    /// assert_eq!((part.output[[0, 0, 0]], part.logsumexp[[0, 0]]), (2.0, 2f32.ln()));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend_with_lse<Q: Storage>(
        &mut self,
        sequences: &[SequenceId],
        query_offsets: &[usize],
        q: ArrayView3<Q>,
        options: &CacheOptions,
    ) -> Result<PartialAttention<f32, Ix3>, AttentionError> {
        let [query_heads, n_queries, _] = *q.shape() else { unreachable!("3-D view") };
        let mut output = Array3::zeros((query_heads, n_queries, self.cache.shape.value_dim));
        let mut logsumexp = Array2::zeros((query_heads, n_queries));
        self.attend_with_into(
            sequences,
            query_offsets,
            q,
            options,
            output.view_mut(),
            Some(logsumexp.view_mut()),
        )?;
        Ok(PartialAttention { output, logsumexp })
    }

    /// [`attend_into`](Self::attend_into) under `options` (a scale, a sliding window, ALiBi,
    /// soft-capping, a keep mask: [`CacheOptions`], as a [`KvCache`](crate::KvCache) takes
    /// them), with each row's logsumexp written into `lse` (`[query_heads, n_queries]`, f32,
    /// packed as `q` is) when given. Each sequence's options see its own positions: ALiBi's
    /// distances and the window count from its queries' positions, and a keep mask
    /// (`[n_queries, longest]`, `longest` the most positions any sequence of the call holds) gives
    /// a query of a sequence that holds `len` positions the columns `0 .. len` of its row, column
    /// `p` for position `p`, the others unread (after [`evict_before`](PagedKvCache::evict_before),
    /// the columns of the positions let go are unread too, and a window that reaches them is an
    /// error). A sequence is listed at most once a step. A [`KvCache`](crate::KvCache)'s
    /// columns are the positions it holds instead, oldest first: a windowed one's start at its
    /// oldest held. Every option is checked before anything is computed; allocates as
    /// [`attend_into`](Self::attend_into) does.
    ///
    /// ```
    /// use qkv::ndarray::{Array2, Array3, array};
    /// let shape = qkv::PagedShape::new(1, 1, 1, 1, 64, 4);
    /// let mut cache = qkv::PagedKvCache::<f32>::new(shape)?;
    /// let (a, b) = (cache.add_sequence(), cache.add_sequence());
    /// let mut layer = cache.layer(0)?;
    /// let values = |v: Vec<f32>| Array3::from_shape_vec((1, v.len(), 1), v).unwrap();
    /// layer.append(a, Array3::zeros((1, 3, 1)).view(), values(vec![1.0, 2.0, 3.0]).view())?;
    /// layer.append(b, Array3::zeros((1, 2, 1)).view(), values(vec![5.0, 7.0]).view())?;
    /// // One query each; a keeps positions 0 and 2, b position 1 (its third column unread).
    /// let keep = array![[true, false, true], [false, true, false]];
    /// let options = qkv::CacheOptions::new().keep_mask(keep.view());
    /// let (mut out, mut lse) = (Array3::<f32>::zeros((1, 2, 1)), Array2::zeros((1, 2)));
    /// layer.attend_with_into(&[a, b], &[0, 1, 2], Array3::<f32>::zeros((1, 2, 1)).view(), &options, out.view_mut(), Some(lse.view_mut()))?;
    /// assert_eq!(out.into_raw_vec_and_offset().0, vec![2.0, 7.0]);
    /// // Two equal scores of 0, then one.
    /// assert_eq!(lse.into_raw_vec_and_offset().0, vec![2f32.ln(), 0.0]);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend_with_into<Q: Storage, O: Storage>(
        &mut self,
        sequences: &[SequenceId],
        query_offsets: &[usize],
        q: ArrayView3<Q>,
        options: &CacheOptions,
        out: ArrayViewMut3<O>,
        lse: Option<ArrayViewMut2<f32>>,
    ) -> Result<(), AttentionError> {
        let PagedShape { kv_heads, key_dim, value_dim, block_size, .. } = self.cache.shape;
        let [query_heads, n_queries, _] = *q.shape() else { unreachable!("3-D view") };
        let lse_shape = lse.as_ref().map(|lse| lse.shape());
        step::check_step(q.shape(), out.shape(), lse_shape, kv_heads, key_dim, value_dim)
            .map_err(|mismatch| self.shape_error(mismatch))?;
        check_offsets("query_offsets", query_offsets, sequences.len(), n_queries)?;
        let layer = self.index;
        let mut longest = 0;
        for &id in sequences {
            longest = longest.max(self.cache.sequence(id)?.layers[layer].len);
        }
        let level = self.cache.level;
        step::check_cache_options(options, level, query_heads, n_queries, longest)?
            .map_err(|mismatch| self.shape_error(mismatch))?;
        let PagedKvCache { isa, block_layout: at, storage, scales, sequences: held, rotary, step, .. } =
            &mut *self.cache;
        let StepBuffers { members, listed, step: buffers } = step;
        let shape_of =
            |m: &Member| Shape { n_queries: m.queries.len(), n_keys: m.n_keys(), key_dim, value_dim };
        // Each sequence with its queries, checked against what it holds at this layer.
        members.clear();
        listed.resize(held.slots.len(), false);
        let checked = (|| {
            for (i, &id) in sequences.iter().enumerate() {
                let sequence = held.get(id)?;
                if std::mem::replace(&mut listed[id.index()], true) {
                    let first = sequences.iter().position(|&other| other == id).expect("listed before");
                    return Err(AttentionError::RepeatedSequence { index: i, first, sequence: id.index() });
                }
                let (state, first_held) = (sequence.layers[layer], sequence.evicted * block_size);
                let queries = query_offsets[i]..query_offsets[i + 1];
                let member = Member { slot: id.index(), state, first_held, queries };
                if member.queries.len() > member.n_keys() {
                    return Err(AttentionError::PagedInput {
                        layer,
                        argument: format!("the queries of sequences[{i}] (sequence {})", id.index()),
                        found: Dims(vec![query_heads, member.queries.len(), key_dim]),
                        expected: format!("[{query_heads}, at most {}, {key_dim}]", member.n_keys()),
                        why: "the queries are the last positions held, so append their keys and values first",
                    });
                }
                check_window(i, &member, options)?;
                if !member.queries.is_empty() {
                    sequence_masks(options, &member)
                        .resolve_heads(&shape_of(&member), Some((1, query_heads)))?;
                    members.push(member);
                }
            }
            Ok(())
        })();
        // Cleared for the next step, whatever this one's checks found.
        for &id in sequences {
            if let Some(listed) = listed.get_mut(id.index()) {
                *listed = false;
            }
        }
        checked?;
        let members = &*members;
        if members.is_empty() {
            return Ok(());
        }
        let masks = |m: &Member, head: usize| {
            let options = sequence_masks(options, m);
            let heads = options.resolve_heads(&shape_of(m), Some((1, query_heads)));
            heads.expect("resolved when the batch was checked").head(0, head)
        };
        let queries = finite_magnitude("queries", &q)? * rotation_growth(rotary.as_ref());
        // One shape bounds every sequence; each problem's masks confine it to its own sequence.
        let n_queries_bound = members.iter().map(|m| m.queries.len()).max().unwrap_or(0);
        let n_keys = members.iter().map(Member::n_keys).max().unwrap_or(0);
        let bound = Shape { n_queries: n_queries_bound, n_keys, key_dim, value_dim };
        let largest = |f: &dyn Fn(&Member) -> f64| members.iter().map(f).fold(0.0, f64::max);
        // Every head of the longest sequence bounds the scores of every other (ALiBi's biases
        // grow with the distance, and the scale and the cap are the call's).
        let longest_member = members.iter().max_by_key(|m| m.state.len).expect("a member");
        let fits = |keys, values| {
            let magnitudes = Magnitudes { queries, keys: checked_key_magnitude::<E>(keys), values };
            (0..query_heads).all(|h| flash::stays_finite(&bound, &magnitudes, &masks(longest_member, h)))
        };
        let pool = (&**storage, &scales[..]);
        if !fits(largest(&|m| m.state.keys), largest(&|m| m.state.values)) {
            // The bounds kept since each sequence began count keys truncated since: what is held
            // now may be smaller (one huge key no longer blocks every later step).
            let mut measured = (0.0_f64, 0.0_f64);
            for m in members {
                let sequence = held.slots[m.slot].sequence.as_mut().expect("a member's sequence was checked");
                let (keys, values) = (0..kv_heads)
                    .map(|kv| {
                        at.keys(pool, &sequence.blocks, layer, kv).magnitudes(
                            m.n_keys(),
                            value_dim,
                            at.layout.key_panel,
                        )
                    })
                    .fold((0.0, 0.0), |(k, v), (key, value)| (f64::max(k, key), f64::max(v, value)));
                (sequence.layers[layer].keys, sequence.layers[layer].values) = (keys, values);
                measured = (measured.0.max(keys), measured.1.max(values));
            }
            if !fits(measured.0, measured.1) {
                return Err(AttentionError::CacheOverflow { layer });
            }
        }
        let first_heads = sequence_masks(options, &members[0]);
        let first_heads = first_heads.resolve_heads(&shape_of(&members[0]), Some((1, query_heads)))?;
        let slots = &held.slots;
        let keys = |m: usize, _: usize, kv: usize| {
            let sequence = slots[members[m].slot].sequence.as_ref().expect("a member's sequence was checked");
            StoredKeys::Paged(at.keys(pool, &sequence.blocks, layer, kv))
        };
        // A sequence's queries are its last positions held.
        let first_query = |m: usize| members[m].state.len - members[m].queries.len();
        let step = Step {
            isa: *isa,
            q: q.insert_axis(Axis(0)),
            kv_heads,
            value_dim,
            members: members.len(),
            member: &|m| (0, members[m].queries.clone()),
            n_keys: &|m| members[m].n_keys(),
            keys: &keys,
            parts: 1,
            masks: &|m, _, head| masks(&members[m], head),
            heads_differ: first_heads.vary_by_head(),
            rotary: rotary.as_ref().map(|rotary| (rotary, &first_query as &(dyn Fn(usize) -> usize + Sync))),
        };
        let lse = lse.map(|lse| lse.insert_axis(Axis(0)));
        step::attend(&step, out.insert_axis(Axis(0)), lse, buffers);
        Ok(())
    }

    /// [`AttentionError::PagedInput`] of this layer for `mismatch` (the argument's name is made a
    /// `String` only then: a decoding step checks its shapes on every call).
    fn shape_error(&self, mismatch: ShapeMismatch) -> AttentionError {
        let ShapeMismatch { argument, found, expected, why } = mismatch;
        AttentionError::PagedInput { layer: self.index, argument: argument.into(), found, expected, why }
    }
}

/// Checks that the window of `options`, if any, reaches no position eviction let go for member
/// `m`, `sequences[index]` of its step (its queries would see fewer keys than the window says,
/// without a word).
fn check_window(index: usize, m: &Member, options: &CacheOptions) -> Result<(), AttentionError> {
    let Some(window) = options.window else { return Ok(()) };
    // The first query sees furthest back.
    let position = m.state.len - m.queries.len();
    let reaches = position.saturating_sub(window.before);
    if m.queries.is_empty() || reaches >= m.first_held {
        return Ok(());
    }
    let (sequence, first_held) = (m.slot, m.first_held);
    Err(AttentionError::WindowEvicted { index, sequence, position, reaches, first_held })
}

/// The options of member `m`'s queries over its keys: `options` with the bottom-right causal
/// mask ([`AttentionOptions::dense`](crate::AttentionOptions::dense)), its keep mask cut to the
/// member's rows and the positions it holds.
fn sequence_masks<'a>(options: &CacheOptions<'a>, m: &Member) -> CacheOptions<'a> {
    match &options.keep {
        Some(keep) => {
            let keep = keep.0.head(0, 0).slice_move(s![m.queries.clone(), m.first_held..m.state.len]);
            options.clone().keep_mask(keep).dense()
        }
        None => options.dense(),
    }
}

#[cfg(test)]
mod tests;
