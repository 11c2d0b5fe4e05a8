//! A KV cache: the keys and values of one sequence, for every layer and key/value head, stored as
//! they arrive in the layout the fast path's kernels read, so that a decoding step packs nothing
//! and reads each key and value once.
//!
//! Each (layer, key/value head) owns two buffers allocated once, at [`KvCache::new`], for the
//! whole capacity: the keys as packed key panels (a panel holds `KEY_PANEL` keys side by side,
//! component after component: `kernels::pack_key_panel`'s layout, which `flash.rs` would
//! otherwise build on every call) and the values one row per position, padded to whole vectors.
//! An append writes the new positions into their panel lanes and rows and checks them then, once;
//! old positions are never touched again, and no storage is allocated after the cache is built
//! (`new`, or [`KvCache::with_sink_tokens`], which pads an empty cache's storage). A step's own
//! buffers (the stacked queries and outputs, the fast path's states and scratch) are kept in the
//! cache too, grown by the first step of a shape, so that later steps allocate nothing.
//!
//! A windowed cache ([`KvCache::with_window`]) is a ring buffer of the same layout: position `p`
//! lives in slot `p % capacity`, so a long generation runs in the window's memory (`ring.rs`).
//!
//! # int8
//!
//! A `KvCache<Q8>` keeps the same layout in int8: key panels and value rows of integers, one
//! byte each, and beside them one f32 scale per slot for its key and one for its value (each
//! head's `key_scales` and `value_scales`), so a position of a head costs `d_k + d_v + 8` bytes.
//! An append takes f32 rows (keys after their rotation) and stores each row `x` as
//! `q = round(x / s)`, `s = max |x| / 127` (0 for a row of zeros, whose integers are 0). One scale
//! per row rather than per block of 32 components (`q8_0`'s) keeps the kernels' loads plain: a
//! key's scale multiplies its score, `s_k · (Q · q_k)`, and a value's its weight, `p · s_v`,
//! after the softmax's sums took `p` (`kernels::Kernels::scale_columns`), so the kernels read
//! the integers as they read any storage type, widened to f32 as they load them, and nothing is
//! dequantized into a copy. Any width works: a row is one block, whatever `d`.
//!
//! Error: each stored element is within `s / 2 = max |x| / 254` of the appended one (up to f32
//! rounding, a relative 2^-16 of that), so a score moves by at most
//! `δ = |scale| · ‖q‖₁ · max |k| / 254` (soft-capping only shrinks it), each weight by a factor
//! within `e^{±2δ}`, and an output by at most `(e^{2δ} - 1) · max |v| + max |v| / 254`, beyond
//! f32 attention over the stored values (`tests/engine/quantized.rs` checks both, at every
//! level).

use std::collections::TryReserveError;
use std::ops::Range;

use ndarray::{Array2, Array3, ArrayView3, ArrayViewMut2, ArrayViewMut3, Axis, Ix3, s};

use crate::element::{CacheStorage, Storage, checked_key_magnitude, row_scale};
use crate::error::{AttentionError, Dims};
use crate::finite::finite_magnitude;
use crate::flash::{self, CachedKeys, CachedLayout, LayoutOf, Scales, StoredKeys};
use crate::kernels::{self, Buffer, Element, Isa};
use crate::level::SimdLevel;
use crate::options::CacheOptions;
use crate::partial::PartialAttention;
use crate::rotary::{Rotary, rotation_growth, stored_keys};
use crate::shape::{Magnitudes, Shape, with_fields};
use crate::simd;
use crate::step::{self, ShapeMismatch, Step};

mod ring;

use ring::Ring;

/// The sizes of a [`KvCache`]: `layers` × `kv_heads` sequences of at most `capacity` positions,
/// each position a key of `key_dim` and a value of `value_dim` elements.
///
/// ```
/// let shape = qkv::CacheShape::new(2, 8, 4096, 128, 128);
/// assert_eq!(shape.kv_heads * shape.capacity, 32768);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheShape {
    /// Decoder layers, each with keys and values of its own.
    pub layers: usize,
    /// Key/value heads per layer; the queries may have any multiple of it (grouped-query attention).
    pub kv_heads: usize,
    /// The most positions (tokens) a layer holds: of a windowed cache
    /// ([`KvCache::with_window`]), the window and the new positions of its largest step but one
    /// (`window + n_q - 1`), and its sink tokens if it keeps any
    /// ([`KvCache::with_sink_tokens`]).
    pub capacity: usize,
    /// Width of queries and keys (`d_k`).
    pub key_dim: usize,
    /// Width of values and of the output (`d_v`).
    pub value_dim: usize,
}

impl CacheShape {
    /// `layers` × `kv_heads` sequences of at most `capacity` positions, each a key of `key_dim`
    /// and a value of `value_dim` elements. (The shape is built by this and the `with_` methods
    /// rather than as a literal, so that a later field is no breaking change.)
    pub const fn new(
        layers: usize,
        kv_heads: usize,
        capacity: usize,
        key_dim: usize,
        value_dim: usize,
    ) -> Self {
        CacheShape { layers, kv_heads, capacity, key_dim, value_dim }
    }
}

with_fields!(CacheShape:
    with_layers(layers), "This shape with `layers` layers.";
    with_kv_heads(kv_heads), "This shape with `kv_heads` key/value heads.";
    with_capacity(capacity), "This shape with room for `capacity` positions.";
    with_key_dim(key_dim), "This shape with keys of `key_dim`.";
    with_value_dim(value_dim), "This shape with values of `value_dim`.";
);

/// The keys and values of one sequence for every layer of a decoder, preallocated for
/// `capacity` positions, in the layout the kernels of one SIMD level read; elements stored as
/// `E` ([`CacheStorage`]: f32, `half::bf16`, `half::f16`, or int8 with a scale per position and
/// head, [`Q8`](crate::Q8), appended as f32), computed in f32.
///
/// A decoding step appends the new position's keys and values to a layer ([`CacheLayer::append`])
/// and attends with its queries ([`CacheLayer::attend`]): the queries are the last positions of
/// the cached prefix, so each sees the keys up to its own position (a causal mask aligned
/// bottom-right). Results equal [`multi_head_attention`](crate::multi_head_attention) over the
/// same prefix with `CausalMask::BottomRight`, within rounding.
///
/// ```
/// use qkv::ndarray::Array3;
/// use qkv::{CacheShape, KvCache};
///
/// // One layer, 2 key/value heads, 4 query heads (2 per group), widths 8.
/// let shape = CacheShape::new(1, 2, 16, 8, 8);
/// let mut cache = KvCache::<f32>::new(shape)?;
/// let mut layer = cache.layer(0)?;
/// for step in 0..3 {
///     let k = Array3::from_elem((2, 1, 8), 0.1 * step as f32);
///     let v = Array3::from_elem((2, 1, 8), step as f32);
///     layer.append(k.view(), v.view())?;
///     let q = Array3::from_elem((4, 1, 8), 1.0);
///     let out = layer.attend(q.view())?; // [4 query heads, 1 query, 8]
///     assert_eq!(out.shape(), [4, 1, 8]);
/// }
/// assert_eq!(layer.len(), 3);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
///
/// A windowed cache ([`KvCache::with_window`]) keeps only the last positions a sliding window
/// needs, in a ring buffer that never fills: its steps equal attention over the whole history
/// with the window.
///
/// ```
/// use qkv::ndarray::{Array3, Axis, s};
/// use qkv::{AttentionOptions, CacheShape, CausalMask, KvCache, SlidingWindow};
///
/// // Each query sees 4 positions (its own and 3 back), steps of up to 2 queries: 5 slots.
/// let shape = CacheShape::new(1, 1, 5, 2, 2);
/// let mut cache = KvCache::<f32>::with_window(shape, 4)?;
/// let mut layer = cache.layer(0)?;
/// let history = Array3::from_shape_fn((1, 20, 2), |(_, p, c)| ((p * 7 + c * 3) % 5) as f32 / 4.0);
/// for end in (2..=20).step_by(2) {
///     let new = history.slice(s![.., end - 2..end, ..]);
///     layer.append(new, new)?;
///     let out = layer.attend(new)?; // the chunk's own positions as its queries
///     let window = AttentionOptions::new().causal(CausalMask::BottomRight).sliding_window(SlidingWindow::new(3, 0));
///     let seen = history.slice(s![.., ..end, ..]).insert_axis(Axis(0));
///     let full = qkv::multi_head_attention(new.insert_axis(Axis(0)), seen, seen, &window)?;
///     assert!(out.iter().zip(full.iter()).all(|(a, b)| (a - b).abs() < 1e-6));
/// }
/// assert_eq!((layer.len(), layer.held()), (20, 5));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub struct KvCache<E: CacheStorage = f32> {
    shape: CacheShape,
    level: SimdLevel,
    isa: Isa,
    layout: CachedLayout,
    /// A windowed cache's ring; `None` holds every position up to the capacity.
    ring: Option<Ring>,
    layers: Vec<LayerStore<E>>,
    /// Keys are rotated as they are appended, queries as a step stacks them.
    rotary: Option<Rotary>,
    step: StepBuffers,
}

/// What a step keeps between calls so that, once warm, it allocates nothing: the step's own
/// buffers (see [`step::StepBuffers`]) and a ring's keep mask over its slots. Each grows to the
/// largest step seen and never shrinks.
#[derive(Default)]
struct StepBuffers {
    step: step::StepBuffers<f32>,
    /// A keep mask over a ring's slots (`Ring::keep_by_slot`).
    keep_by_slot: Vec<bool>,
}

/// The largest size of one allocation (Rust's limit for any object).
const ISIZE_MAX: usize = isize::MAX as usize;

/// One layer: how many positions were appended to it, and what they measured.
struct LayerStore<E: Element> {
    /// Positions appended since the last clear (of a ring, more than it holds).
    len: usize,
    /// Of a ring, the oldest position it holds (`Ring::oldest_after_append`): a truncation does
    /// not give back what the positions it cut wrote over.
    oldest: usize,
    /// The largest `|k|` and `|v|` appended since the last clear, or measured in what is held
    /// when a step found that too large: they bound every score and sum (see
    /// `flash::stays_finite`), so that no step has to measure the keys again.
    keys: f64,
    values: f64,
    heads: Vec<HeadStore<E>>,
}

/// One (layer, key/value head): keys as packed panels, values as padded rows, and of an int8
/// cache each slot's key and value scale (empty otherwise).
struct HeadStore<E: Element> {
    panels: Buffer<E>,
    values: Buffer<E>,
    key_scales: Vec<f32>,
    value_scales: Vec<f32>,
}

impl<E: CacheStorage> LayerStore<E> {
    /// The largest `|k|` and `|v|` in `slots` of every head, as the kernels read them.
    fn held_magnitudes(
        &self,
        slots: [&Range<usize>; 2],
        layout: CachedLayout,
        key_dim: usize,
        value_dim: usize,
    ) -> (f64, f64) {
        let measured = self.heads.iter().flat_map(|head| {
            slots.map(|slots| {
                head.keys(slots, layout, key_dim).magnitudes(
                    slots.len(),
                    key_dim,
                    value_dim,
                    layout.key_panel,
                )
            })
        });
        measured.fold((0.0, 0.0), |(k, v), (key, value)| (k.max(key), v.max(value)))
    }
}

impl<E: CacheStorage> HeadStore<E> {
    /// The keys and values of `slots` (from a panel's first slot) as a step reads them: the key
    /// panels from `slots.start` on, and the value rows and scales of `slots`.
    fn keys(&self, slots: &Range<usize>, layout: CachedLayout, key_dim: usize) -> CachedKeys<'_, E> {
        let value_stride = layout.value_stride;
        CachedKeys {
            panels: &self.panels[slots.start * key_dim..],
            values: &self.values[slots.start * value_stride..slots.end * value_stride],
            value_stride,
            scales: E::SCALED.then(|| Scales {
                keys: &self.key_scales[slots.clone()],
                values: &self.value_scales[slots.clone()],
            }),
        }
    }
}

impl<E: CacheStorage> KvCache<E> {
    /// An empty cache of `shape` for the SIMD level the engine dispatches to
    /// ([`SimdLevel::dispatched`]), all its memory allocated now. A shape whose storage overflows
    /// the address space, or that the allocator cannot provide, is an error
    /// ([`AttentionError::CacheTooLarge`]), not an abort.
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(1, 1, 8, 4, 4);
    /// let cache = qkv::KvCache::<qkv::half::bf16>::new(shape)?;
    /// assert_eq!(cache.shape(), shape);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn new(shape: CacheShape) -> Result<KvCache<E>, AttentionError> {
        KvCache::for_level(shape, SimdLevel::dispatched()?)
    }

    /// An empty cache of `shape` laid out for the kernels of `level`, which every step runs (the
    /// layout differs between levels). Fails if this CPU does not run `level`.
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(1, 1, 8, 4, 4);
    /// let cache = qkv::KvCache::<f32>::for_level(shape, qkv::SimdLevel::Baseline)?;
    /// assert_eq!(cache.simd_level(), qkv::SimdLevel::Baseline);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn for_level(shape: CacheShape, level: SimdLevel) -> Result<KvCache<E>, AttentionError> {
        let CacheShape { layers, kv_heads, capacity, key_dim, value_dim } = shape;
        if layers == 0 || kv_heads == 0 || capacity == 0 || key_dim == 0 || value_dim == 0 {
            return Err(AttentionError::Empty {
                argument: "the KV cache's shape [layers, kv_heads, capacity, key_dim, value_dim]",
                shape: Dims(vec![layers, kv_heads, capacity, key_dim, value_dim]),
                why: "a cache needs at least one layer, key/value head and position, and keys and values \
                      at least one component wide",
            });
        }
        // The tiles' layouts are not a cache's: caches run the level's vectors.
        let isa = simd::kernels_for(Some(level))?.vectors();
        let too_large = |bytes, why| AttentionError::CacheTooLarge {
            shape: Dims(vec![layers, kv_heads, capacity, key_dim, value_dim]),
            storage: E::NAME,
            bytes,
            why,
        };
        let address_space = "which is more than an address space holds (isize::MAX bytes)";
        let layout = isa.run::<E, _>(LayoutOf { value_dim }).ok_or_else(|| too_large(None, address_space))?;
        // Each head's two buffers, in elements, and the whole cache in bytes, bookkeeping
        // included: a capacity the caller chose may overflow any of them.
        let panels = capacity.checked_next_multiple_of(layout.key_panel).and_then(|c| c.checked_mul(key_dim));
        let values = capacity.checked_mul(layout.value_stride);
        // An int8 cache's scales: a key's and a value's per slot.
        let scales = if E::SCALED { capacity } else { 0 };
        let bytes = panels.zip(values).and_then(|(panels, values)| {
            let head = panels
                .checked_add(values)?
                .checked_mul(size_of::<E>())?
                .checked_add(scales.checked_mul(2 * size_of::<f32>())?)?
                .checked_add(size_of::<HeadStore<E>>())?;
            head.checked_mul(kv_heads)?.checked_add(size_of::<LayerStore<E>>())?.checked_mul(layers)
        });
        let (Some(panels), Some(values), Some(bytes @ ..=ISIZE_MAX)) = (panels, values, bytes) else {
            return Err(too_large(bytes, address_space));
        };
        let refused = |_| too_large(Some(bytes), "which the allocator refused");
        // The whole size is asked for once before any buffer is written: a cache larger than the
        // memory there is fails here, rather than after its first buffers were filled with zeros
        // (past the memory there is, Linux kills the process instead of failing an allocation).
        Vec::<u8>::new().try_reserve_exact(bytes).map_err(refused)?;
        let zeros = |len| -> Result<Vec<f32>, TryReserveError> {
            let mut zeros = Vec::new();
            zeros.try_reserve_exact(len)?;
            zeros.resize(len, 0.0);
            Ok(zeros)
        };
        let head = || -> Result<HeadStore<E>, TryReserveError> {
            Ok(HeadStore {
                panels: Buffer::try_zeros(panels)?,
                values: Buffer::try_zeros(values)?,
                key_scales: zeros(scales)?,
                value_scales: zeros(scales)?,
            })
        };
        let layer = || {
            let heads = (0..kv_heads).map(|_| head()).collect::<Result<_, _>>()?;
            Ok(LayerStore { len: 0, oldest: 0, keys: 0.0, values: 0.0, heads })
        };
        let layers = (0..layers).map(|_| layer()).collect::<Result<_, _>>().map_err(refused)?;
        Ok(KvCache {
            shape,
            level,
            isa,
            layout,
            ring: None,
            layers,
            rotary: None,
            step: StepBuffers::default(),
        })
    }

    /// An empty windowed cache of `shape` for the dispatched SIMD level: a ring buffer of
    /// `shape.capacity` slots per layer whose queries each see the last `window` positions up to
    /// their own (Mistral's `sliding_window`, Gemma 2's local layers; `window - 1` back, as
    /// `SlidingWindow::new(window - 1, 0)` has it). Appends never run out of room: a position
    /// takes the slot of the one `capacity` before it. A step of `n_q` queries needs the window
    /// of its first query and its own positions, so `capacity = window + n_q - 1` for the largest
    /// step (`window` for decoding alone) once the ring has wrapped; until it first does, a step
    /// may take every position held. `window` must be at least 1 and at most the capacity
    /// ([`AttentionError::CacheWindow`]).
    ///
    /// A separate constructor rather than a field of [`CacheShape`]: the window is how the layers
    /// attend, the shape what they store. A model with
    /// global and windowed layers (Gemma 2) keeps one cache of each kind.
    ///
    /// Each step applies the window by absolute position: results equal
    /// [`multi_head_attention`](crate::multi_head_attention) over the whole history with a
    /// bottom-right causal mask and `SlidingWindow::new(window - 1, 0)`, within rounding.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// use qkv::{CacheShape, KvCache};
    ///
    /// // A window of 4 positions, steps of up to 3 queries: 6 slots.
    /// let shape = CacheShape::new(1, 1, 6, 2, 1);
    /// let mut cache = KvCache::<f32>::with_window(shape, 4)?;
    /// let mut layer = cache.layer(0)?;
    /// for position in 0..100 {
    ///     let (k, v) = (Array3::zeros((1, 1, 2)), Array3::from_elem((1, 1, 1), position as f32));
    ///     layer.append(k.view(), v.view())?;
    ///     let out = layer.attend(Array3::<f32>::zeros((1, 1, 2)).view())?;
    ///     // Equal scores: the mean of the last 4 positions' values.
    ///     let first = position.max(3) - 3;
    ///     let mean = (first..=position).sum::<usize>() as f32 / (position - first + 1) as f32;
    ///     assert_eq!(out[[0, 0, 0]], mean);
    /// }
    /// assert_eq!((layer.len(), layer.held()), (100, 6)); // RoPE takes position len() - 1
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn with_window(shape: CacheShape, window: usize) -> Result<KvCache<E>, AttentionError> {
        KvCache::with_window_for_level(shape, window, SimdLevel::dispatched()?)
    }

    /// [`with_window`](Self::with_window) laid out for the kernels of `level`, as
    /// [`for_level`](Self::for_level) does.
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(1, 1, 8, 4, 4);
    /// let cache = qkv::KvCache::<f32>::with_window_for_level(shape, 8, qkv::SimdLevel::Baseline)?;
    /// assert_eq!(cache.window(), Some(8));
    /// let too_wide = qkv::KvCache::<f32>::with_window_for_level(shape, 9, qkv::SimdLevel::Baseline);
    /// assert!(too_wide.err().unwrap().to_string().starts_with("a KV cache's window of 9 positions"));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn with_window_for_level(
        shape: CacheShape,
        window: usize,
        level: SimdLevel,
    ) -> Result<KvCache<E>, AttentionError> {
        let capacity = shape.capacity;
        if window == 0 || window > capacity {
            return Err(AttentionError::CacheWindow { window, capacity });
        }
        let cache = KvCache::for_level(shape, level)?;
        Ok(KvCache { ring: Some(Ring::new(window, capacity)), ..cache })
    }

    /// The sizes the cache was made with.
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(3, 2, 8, 4, 6);
    /// assert_eq!(qkv::KvCache::<f32>::new(shape)?.shape().layers, 3);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn shape(&self) -> CacheShape {
        self.shape
    }

    /// The SIMD level whose kernels the cache is laid out for.
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(1, 1, 8, 4, 4);
    /// let cache = qkv::KvCache::<f32>::new(shape)?;
    /// assert_eq!(cache.simd_level(), qkv::SimdLevel::dispatched()?);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn simd_level(&self) -> SimdLevel {
        self.level
    }

    /// The window of a windowed cache ([`with_window`](Self::with_window)), `None` for a cache
    /// that holds every position.
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(1, 1, 8, 4, 4);
    /// assert_eq!(qkv::KvCache::<f32>::new(shape)?.window(), None);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn window(&self) -> Option<usize> {
        self.ring.map(|ring| ring.window)
    }

    /// This windowed cache keeping its first `sink_tokens` positions for good (StreamingLLM's
    /// attention sinks): each query then sees those positions (up to its own) and the last
    /// `window` up to its own, and nothing between. The sink tokens take `sink_tokens` of the
    /// capacity's slots and the ring the rest, which must still hold the window: a step of `n_q`
    /// queries needs `capacity >= sink_tokens + window + n_q - 1`, on every SIMD level (the cache
    /// pads the sink tokens' slots to whole key panels of its level itself, at most 63 slots more
    /// per head: [`PagedKvCache::block_granularity`](crate::PagedKvCache::block_granularity)).
    /// Positions, for rotary embeddings too, stay absolute. Steps equal
    /// [`multi_head_attention`](crate::multi_head_attention) over the whole history with a
    /// bottom-right causal mask and a keep mask of `j < sink_tokens || j > i - window` (query
    /// position `i`, key position `j`), within rounding. Such a cache takes no keep mask option.
    ///
    /// Fails ([`AttentionError::CacheSinkTokens`]) on a cache without a window, one that already
    /// holds positions, or one whose ring would no longer hold its window; and
    /// ([`AttentionError::CacheTooLarge`], naming the padded capacity) if the padded storage,
    /// allocated in place of the cache's own, cannot be.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// use qkv::{CacheShape, KvCache};
    /// // Keep the first position, and a window of 4 positions: 5 slots.
    /// let shape = CacheShape::new(1, 1, 5, 2, 1);
    /// let mut cache = KvCache::<f32>::with_window(shape, 4)?.with_sink_tokens(1)?;
    /// let mut layer = cache.layer(0)?;
    /// for position in 0..100 {
    ///     let (k, v) = (Array3::zeros((1, 1, 2)), Array3::from_elem((1, 1, 1), position as f32));
    ///     layer.append(k.view(), v.view())?;
    ///     let out = layer.attend(Array3::<f32>::zeros((1, 1, 2)).view())?;
    ///     // Equal scores: the mean of position 0's value and the last 4 positions' (position 0
    ///     // once, while it is in the window too).
    ///     let window: Vec<usize> = (position.max(3) - 3..=position).filter(|&p| p > 0).collect();
    ///     let mean = window.iter().sum::<usize>() as f32 / (window.len() + 1) as f32;
    ///     assert!((out[[0, 0, 0]] - mean).abs() < 1e-5);
    /// }
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn with_sink_tokens(mut self, sink_tokens: usize) -> Result<Self, AttentionError> {
        let refuse = |why: String| Err(AttentionError::CacheSinkTokens { sink_tokens, why });
        let Some(ring) = self.ring else {
            return refuse(
                "it has no window (KvCache::with_window), and it keeps every position anyway".into(),
            );
        };
        if self.layers.iter().any(|layer| layer.len > 0) {
            return refuse("it already holds positions".into());
        }
        let capacity = self.shape.capacity;
        let Some(ring_capacity) = capacity.checked_sub(sink_tokens).filter(|&c| c >= ring.window) else {
            return refuse(format!(
                "they take {sink_tokens} of the capacity's {capacity} slots, and the window of {} positions \
                 must still fit in the rest",
                ring.window
            ));
        };
        // The ring's keys start a key panel of their own: the sink tokens' slots are padded to
        // whole panels, in storage of that many more slots. The cache is empty (checked above),
        // so its storage is let go of before the padded one is allocated, never both at once.
        let first_slot = sink_tokens.next_multiple_of(self.layout.key_panel);
        if first_slot != sink_tokens {
            let padded = CacheShape { capacity: first_slot + ring_capacity, ..self.shape };
            drop(std::mem::take(&mut self.layers));
            self.layers = KvCache::<E>::for_level(padded, self.level)?.layers;
        }
        self.ring = Some(Ring { capacity: ring_capacity, sink_tokens, first_slot, ..ring });
        Ok(self)
    }

    /// How many of its first positions a windowed cache keeps as sink tokens
    /// ([`with_sink_tokens`](Self::with_sink_tokens)); 0 for every other cache.
    pub fn sink_tokens(&self) -> usize {
        self.ring.map_or(0, |ring| ring.sink_tokens)
    }

    /// Layer `layer`, to append to and attend over. Fails if there is no such layer.
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(2, 1, 8, 4, 4);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// assert!(cache.layer(1)?.is_empty());
    /// assert_eq!(cache.layer(2).err().unwrap().to_string(), "layer 2 is out of range: the KV cache has 2 layers");
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn layer(&mut self, layer: usize) -> Result<CacheLayer<'_, E>, AttentionError> {
        let layers = self.layers.len();
        if layer >= layers {
            return Err(AttentionError::CacheLayer { layer, layers });
        }
        Ok(CacheLayer { cache: self, index: layer })
    }
    /// This cache with a rotary position embedding (RoPE): each key is rotated by its absolute
    /// position as it is appended and each query of a step by its own as the step takes it (a
    /// windowed cache's too, by position, never by slot), so that callers pass unrotated keys
    /// and queries, as to flash-attn's `flash_attn_with_kvcache` with `rotary_cos`/`rotary_sin`.
    /// An append then allocates its rotated keys. Fails if the embedding does not fit the keys,
    /// or if the cache already holds positions (they were appended unrotated).
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::CacheShape::new(1, 1, 8, 2, 1);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?.with_rotary(qkv::Rotary::new(10_000.0))?;
    /// let mut layer = cache.layer(0)?;
    /// // The same key at positions 0 and 1, then a query at position 2 equal to that key: the
    /// // score falls with the distance, so the nearer key weighs more.
    /// let k = Array3::from_shape_vec((1, 3, 2), vec![1.0, 0.0, 1.0, 0.0, 0.0, 0.0]).unwrap();
    /// let v = Array3::from_shape_vec((1, 3, 1), vec![0.0, 1.0, 0.5]).unwrap();
    /// layer.append(k.view(), v.view())?;
    /// let q = Array3::from_shape_vec((1, 1, 2), vec![1.0_f32, 0.0]).unwrap();
    /// let out = layer.attend(q.view())?;
    /// assert!(out[[0, 0, 0]] > 0.5);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn with_rotary(mut self, rotary: Rotary) -> Result<Self, AttentionError> {
        rotary.check(self.shape.key_dim)?;
        if self.layers.iter().any(|layer| layer.len > 0) {
            return Err(AttentionError::RotaryAfterAppend);
        }
        self.rotary = Some(rotary);
        Ok(self)
    }

    /// The rotary embedding its keys and queries take, if any.
    pub fn rotary(&self) -> Option<Rotary> {
        self.rotary
    }

    /// Empties every layer for a new sequence, keeping the memory.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::CacheShape::new(1, 1, 8, 4, 4);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// let kv = Array3::zeros((1, 3, 4));
    /// cache.layer(0)?.append(kv.view(), kv.view())?;
    /// cache.clear();
    /// assert_eq!(cache.layer(0)?.len(), 0);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn clear(&mut self) {
        for layer in &mut self.layers {
            (layer.len, layer.oldest, layer.keys, layer.values) = (0, 0, 0.0, 0.0);
        }
    }

    /// Rolls the cache back to its first `len` positions (every layer holding more is cut to
    /// `len`): a speculative draft's rejected tokens, say. Nothing is copied; the next append
    /// writes over what was cut. Fails, changing nothing, if the longest layer holds fewer than
    /// `len`, or if a windowed cache ([`KvCache::with_window`]) no longer holds what the window
    /// of the next position needs: its ring has written over the positions `capacity` back from
    /// the furthest it has written (positions a truncation cut count too, until appends write
    /// over them in turn), so it can roll back at most `capacity - sink_tokens - window + 1`
    /// positions from there, in one truncation or several (any number, where the next window
    /// needs no position of the ring: a window of 1, or one within the sink tokens). Right after
    /// a truncation a step may also take fewer queries ([`CacheLayer::attend`]).
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::CacheShape::new(1, 1, 8, 1, 1);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// let v = Array3::from_shape_vec((1, 4, 1), vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    /// cache.layer(0)?.append(Array3::zeros((1, 4, 1)).view(), v.view())?;
    /// cache.truncate(2)?; // positions 2 and 3 were a rejected draft
    /// let mut layer = cache.layer(0)?;
    /// assert_eq!(layer.len(), 2);
    /// // The last position held (value 2) sees positions 0 and 1 under equal scores.
    /// assert_eq!(layer.attend(Array3::<f32>::zeros((1, 1, 1)).view())?[[0, 0, 0]], 1.5);
    /// assert!(cache.truncate(3).is_err());
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn truncate(&mut self, len: usize) -> Result<(), AttentionError> {
        let held = self.layers.iter().map(|layer| layer.len).max().unwrap_or(0);
        let refuse = |why| Err(AttentionError::CacheTruncate { len: held, requested: len, why });
        if len > held {
            return refuse("truncation only removes positions");
        }
        if let Some(ring) = self.ring {
            // The next position's window reaches back to `len + 1 - window`.
            if self.layers.iter().any(|layer| layer.len > len && !ring.holds_window_of(layer.oldest, len)) {
                return refuse("the ring has written over positions the window of the next one needs");
            }
        }
        for layer in &mut self.layers {
            // The magnitudes stay: they bound what is held, the more loosely the more was cut
            // (a step they would refuse measures what is held instead).
            layer.len = layer.len.min(len);
            // What the cut positions wrote over stays lost; what they were is no longer held.
            layer.oldest = layer.oldest.min(len);
        }
        Ok(())
    }
}

/// One layer of a [`KvCache`] ([`KvCache::layer`]): where a decoder layer appends each new
/// position's keys and values and attends with its queries.
///
/// ```
/// use qkv::half::bf16;
/// use qkv::ndarray::Array3;
/// let shape = qkv::CacheShape::new(4, 2, 32, 16, 16);
/// let mut cache = qkv::KvCache::<bf16>::new(shape)?;
/// let mut layer = cache.layer(3)?;
/// let kv = Array3::from_elem((2, 5, 16), bf16::from_f32(0.5)); // a prompt of 5 positions
/// layer.append(kv.view(), kv.view())?;
/// let q = Array3::from_elem((8, 5, 16), bf16::ONE); // 8 query heads: 4 per key/value head
/// assert!(layer.attend(q.view())?.iter().all(|&x| x == 0.5));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub struct CacheLayer<'c, E: CacheStorage> {
    cache: &'c mut KvCache<E>,
    index: usize,
}

impl<E: CacheStorage> CacheLayer<'_, E> {
    /// Positions appended since the cache was made or cleared: the position of the next one,
    /// what RoPE needs. Of a windowed cache, more than it holds ([`held`](Self::held)).
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(1, 1, 8, 4, 4);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// assert_eq!(cache.layer(0)?.len(), 0);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn len(&self) -> usize {
        self.store().len
    }

    /// Whether the layer holds no position.
    ///
    /// ```
    /// let shape = qkv::CacheShape::new(1, 1, 8, 4, 4);
    /// assert!(qkv::KvCache::<f32>::new(shape)?.layer(0)?.is_empty());
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Positions held: [`len`](Self::len), except that a windowed cache holds at most its
    /// capacity, the last positions appended (fewer after a truncation: the positions it cut had
    /// written over older ones). A keep mask's columns are these positions, oldest first.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::CacheShape::new(1, 1, 4, 2, 2);
    /// let mut cache = qkv::KvCache::<f32>::with_window(shape, 4)?;
    /// let mut layer = cache.layer(0)?;
    /// layer.append(Array3::zeros((1, 7, 2)).view(), Array3::zeros((1, 7, 2)).view())?;
    /// assert_eq!((layer.len(), layer.held()), (7, 4));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn held(&self) -> usize {
        let len = self.len();
        self.cache.ring.map_or(len, |ring| ring.held(len, self.store().oldest))
    }

    fn store(&self) -> &LayerStore<E> {
        &self.cache.layers[self.index]
    }

    /// Appends the keys `k` (`[kv_heads, n_new, d_k]`) and values `v` (`[kv_heads, n_new, d_v]`) of
    /// `n_new` positions, of the cache's storage type (f32 for an int8 cache, which quantizes
    /// each row as it stores it, see [`Q8`](crate::Q8)). Checks the shapes, the capacity and
    /// that every element is finite before it writes anything, so a failed append leaves the
    /// layer as it was. A windowed
    /// cache has no end: each position overwrites the one `capacity` before it (of an append
    /// longer than the capacity, only the last `capacity` positions are written). Once it has
    /// wrapped, an append of more than `capacity - sink_tokens - window + 1` positions writes
    /// over keys its own first positions' windows need, and a step then attends only its last
    /// that many: a model's top layer, whose earlier rows nothing reads, may do so; a chunked
    /// prefill appends and attends chunks of at most that many.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::CacheShape::new(1, 2, 4, 3, 5);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// let mut layer = cache.layer(0)?;
    /// layer.append(Array3::zeros((2, 3, 3)).view(), Array3::zeros((2, 3, 5)).view())?;
    /// let full = layer.append(Array3::zeros((2, 2, 3)).view(), Array3::zeros((2, 2, 5)).view());
    /// assert!(full.unwrap_err().to_string().starts_with("layer 0 of the KV cache holds 3 of its 4 positions"));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn append(
        &mut self,
        k: ArrayView3<E::Appended>,
        v: ArrayView3<E::Appended>,
    ) -> Result<(), AttentionError> {
        let CacheShape { kv_heads, capacity, key_dim, value_dim, .. } = self.cache.shape;
        let n_new = k.shape()[1];
        step::check_appended(k.shape(), v.shape(), kv_heads, key_dim, value_dim)
            .map_err(|mismatch| self.shape_error(mismatch))?;
        let len = self.len();
        let ring = self.cache.ring;
        if ring.is_none() && len + n_new > capacity {
            return Err(AttentionError::CacheFull { layer: self.index, len, appended: n_new, capacity });
        }
        let values = finite_magnitude("values", &v)?;
        let (k, keys) = stored_keys(self.cache.rotary.as_ref(), k, len)?;
        let k = k.view();
        let CachedLayout { key_panel, value_stride } = self.cache.layout;
        let store = &mut self.cache.layers[self.index];
        for (head, (k, v)) in store.heads.iter_mut().zip(k.outer_iter().zip(v.outer_iter())) {
            for (j, (key, value)) in k.outer_iter().zip(v.outer_iter()).enumerate() {
                // A ring would overwrite the positions before the last `capacity` within this append.
                if ring.is_some_and(|ring| ring.overwritten(len + j, len + n_new)) {
                    continue;
                }
                let slot = ring.map_or(len + j, |ring| ring.slot(len + j));
                let (key_scale, value_scale) = (row_scale::<E>(key), row_scale::<E>(value));
                if E::SCALED {
                    (head.key_scales[slot], head.value_scales[slot]) = (key_scale, value_scale);
                }
                let panel = &mut head.panels[slot / key_panel * key_panel * key_dim..][..key_panel * key_dim];
                kernels::write_key_lane(key, key_scale, slot % key_panel, key_panel, panel);
                kernels::store_row(value, value_scale, head.values[slot * value_stride..].iter_mut());
            }
        }
        if let Some(ring) = ring {
            store.oldest = ring.oldest_after_append(store.oldest, store.len, n_new);
        }
        store.len += n_new;
        store.keys = store.keys.max(keys);
        store.values = store.values.max(values);
        Ok(())
    }

    /// Attention of queries `q` (`[query_heads, n_q, d_k]`, `query_heads` a multiple of the
    /// cache's `kv_heads`) over every position held: one decoding step (`n_q = 1`) or a chunk of
    /// prefill (`n_q > 1`). The queries are the last `n_q` positions held (append their keys and
    /// values first), so query `i` sees positions `0 ..= len - n_q + i`; of a windowed cache,
    /// the last `window` of those, and once the ring has wrapped (written over a position) `n_q`
    /// is at most `capacity - sink_tokens - window + 1` (fewer right after a
    /// [`truncate`](KvCache::truncate), until appends pass the positions it cut); before, a step
    /// may take every position held. Query head `h`
    /// reads key/value head `h / (query_heads / kv_heads)`. Returns `[query_heads, n_q, d_v]` in
    /// f32.
    ///
    /// The queries may be f32 or the cache's storage type, whatever that is (a bf16 cache takes
    /// f32 queries, as llama.cpp keeps f32 queries over an f16 cache); they are computed in f32.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::CacheShape::new(1, 1, 4, 2, 1);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// let mut layer = cache.layer(0)?;
    /// let (k, v) = (Array3::zeros((1, 2, 2)), Array3::from_shape_vec((1, 2, 1), vec![2.0, 4.0]).unwrap());
    /// layer.append(k.view(), v.view())?;
    /// // Two queries, the last two positions: the first sees position 0, the second both.
    /// let out = layer.attend(Array3::<f32>::zeros((1, 2, 2)).view())?;
    /// assert_eq!(out.into_raw_vec_and_offset().0, vec![2.0, 3.0]);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend<Q: Storage>(&mut self, q: ArrayView3<Q>) -> Result<Array3<f32>, AttentionError> {
        self.attend_with(q, &CacheOptions::new())
    }

    /// Like [`attend`](Self::attend), writing the output into `out` (`[query_heads, n_q, d_v]`)
    /// of f32, bf16 or f16 ([`Storage`]): each row is computed in f32 and rounded once to `O`
    /// (as `O::from_f32` rounds), never accumulated in half precision.
    /// If the call fails, `out` may hold anything. After a first step of the same shape, a step
    /// allocates nothing on the heap: not when it runs on the calling thread alone (a small step
    /// that does not follow another closely, or a pool of one thread), nor when it shares its
    /// work with the pool from a thread of the pool (inside `ThreadPool::install`). Shared from
    /// outside the pool, it allocates the job rayon boxes for each helper thread (and, once in
    /// 63 jobs, a block of rayon's queue), and nothing else.
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// let shape = qkv::CacheShape::new(1, 1, 4, 2, 3);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// let mut layer = cache.layer(0)?;
    /// layer.append(Array3::zeros((1, 1, 2)).view(), Array3::ones((1, 1, 3)).view())?;
    /// let mut out = Array3::<f32>::zeros((2, 1, 3));
    /// layer.attend_into(Array3::<f32>::zeros((2, 1, 2)).view(), out.view_mut())?;
    /// assert!(out.iter().all(|&x| x == 1.0));
    /// // The same step into a bf16 output, as the next layer of a bf16 model takes it.
    /// let mut half_out = Array3::<qkv::half::bf16>::zeros((2, 1, 3));
    /// layer.attend_into(Array3::<f32>::zeros((2, 1, 2)).view(), half_out.view_mut())?;
    /// assert_eq!(half_out, out.mapv(qkv::half::bf16::from_f32));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend_into<Q: Storage, O: Storage>(
        &mut self,
        q: ArrayView3<Q>,
        out: ArrayViewMut3<O>,
    ) -> Result<(), AttentionError> {
        self.attend_with_into(q, &CacheOptions::new(), out, None)
    }

    /// [`attend`](Self::attend) with `options`: a scale, a sliding window, ALiBi, logit
    /// soft-capping and a keep mask over the positions held ([`CacheOptions`]).
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// use qkv::{CacheOptions, SlidingWindow};
    /// let shape = qkv::CacheShape::new(1, 1, 8, 2, 1);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// let mut layer = cache.layer(0)?;
    /// let v = Array3::from_shape_vec((1, 4, 1), vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    /// layer.append(Array3::zeros((1, 4, 2)).view(), v.view())?;
    /// // The last query sees itself and one position back: the mean of 3 and 4.
    /// let window = CacheOptions::new().sliding_window(SlidingWindow::new(1, 0));
    /// let out = layer.attend_with(Array3::<f32>::zeros((1, 1, 2)).view(), &window)?;
    /// assert_eq!(out[[0, 0, 0]], 3.5);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend_with<Q: Storage>(
        &mut self,
        q: ArrayView3<Q>,
        options: &CacheOptions,
    ) -> Result<Array3<f32>, AttentionError> {
        let mut out = Array3::zeros(self.output_shape(&q));
        self.attend_with_into(q, options, out.view_mut(), None)?;
        Ok(out)
    }

    /// [`attend_with`](Self::attend_with), also returning each row's logsumexp (`[query_heads,
    /// n_q]`, in the scaled-score domain, see [`PartialAttention`]): attention over two caches
    /// that hold disjoint positions of a sequence merges into attention over both
    /// ([`PartialAttention::merge`]). Each part places its queries at its own end, so the merge
    /// is exact for a decoding step (one query, which sees every position of both parts) without
    /// a window or ALiBi, which place the queries by position, nor [`KvCache::with_rotary`]: each
    /// cache numbers its positions from 0, so a part holding a later span must rotate its keys
    /// itself ([`Rotary::rotate`](crate::Rotary::rotate), from their absolute positions).
    ///
    /// ```
    /// use qkv::ndarray::Array3;
    /// use qkv::CacheOptions;
    /// let shape = qkv::CacheShape::new(2, 1, 4, 2, 1);
    /// let mut cache = qkv::KvCache::<f32>::new(shape)?;
    /// let k = Array3::from_shape_vec((1, 3, 2), vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0]).unwrap();
    /// let v = Array3::from_shape_vec((1, 3, 1), vec![2.0, 6.0, 4.0]).unwrap();
    /// let q = Array3::from_shape_vec((1, 1, 2), vec![0.5_f32, 2.0]).unwrap();
    /// // Layer 0 holds all three positions; layer 1 the first one, then the last two.
    /// cache.layer(0)?.append(k.view(), v.view())?;
    /// let whole = cache.layer(0)?.attend_with_lse(q.view(), &CacheOptions::new())?;
    /// let mut part = cache.layer(1)?;
    /// part.append(k.slice(qkv::ndarray::s![.., ..1, ..]), v.slice(qkv::ndarray::s![.., ..1, ..]))?;
    /// let first = part.attend_with_lse(q.view(), &CacheOptions::new())?;
    /// cache.clear();
    /// let mut part = cache.layer(1)?;
    /// part.append(k.slice(qkv::ndarray::s![.., 1.., ..]), v.slice(qkv::ndarray::s![.., 1.., ..]))?;
    /// let merged = first.merge(&part.attend_with_lse(q.view(), &CacheOptions::new())?)?;
    /// assert!((merged.output[[0, 0, 0]] - whole.output[[0, 0, 0]]).abs() < 1e-6);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend_with_lse<Q: Storage>(
        &mut self,
        q: ArrayView3<Q>,
        options: &CacheOptions,
    ) -> Result<PartialAttention<f32, Ix3>, AttentionError> {
        let shape = self.output_shape(&q);
        let (mut output, mut logsumexp) = (Array3::zeros(shape), Array2::zeros((shape.0, shape.1)));
        self.attend_with_into(q, options, output.view_mut(), Some(logsumexp.view_mut()))?;
        Ok(PartialAttention { output, logsumexp })
    }

    /// [`attend_with`](Self::attend_with) into `out` (`[query_heads, n_q, d_v]`, of f32, bf16 or
    /// f16, each row rounded once from f32 as in [`attend_into`](Self::attend_into)), and each
    /// row's logsumexp into `lse` (`[query_heads, n_q]`, f32) when given. Allocates as
    /// [`attend_into`](Self::attend_into) does: nothing, after a first step of the same shape, on
    /// the calling thread. Every option is checked against the layer (the keep mask's shape
    /// against the queries and the positions held, one ALiBi slope per query head, a finite
    /// scale, a finite positive cap; over a windowed cache, no window but its own,
    /// [`AttentionError::CacheWindowOption`]) before anything is computed; if the call fails,
    /// `out` and `lse` may hold anything.
    ///
    /// Over a windowed cache every option sees absolute positions: ALiBi's distances, the
    /// window, and the keep mask's columns, which are the positions held, oldest first
    /// (position `len - held + c` is column `c`), whatever slots they occupy.
    ///
    /// ```
    /// use qkv::ndarray::{Array2, Array3};
    /// use qkv::CacheOptions;
    /// let shape = qkv::CacheShape::new(1, 2, 8, 4, 4);
    /// let mut cache = qkv::KvCache::<qkv::half::bf16>::new(shape)?;
    /// let mut layer = cache.layer(0)?;
    /// let kv = Array3::from_elem((2, 3, 4), qkv::half::bf16::from_f32(0.5));
    /// layer.append(kv.view(), kv.view())?;
    /// // f32 queries over the bf16 cache, 4 query heads, scores capped at 20.
    /// let q = Array3::<f32>::ones((4, 1, 4));
    /// let (mut out, mut lse) = (Array3::<f32>::zeros((4, 1, 4)), Array2::zeros((4, 1)));
    /// let options = CacheOptions::new().logit_softcap(20.0);
    /// layer.attend_with_into(q.view(), &options, out.view_mut(), Some(lse.view_mut()))?;
    /// assert!(out.iter().all(|&x| x == 0.5));
    /// // Three equal scores of 1 (0.5 · 4 / sqrt 4), capped: ln 3 + 20 · tanh(1 / 20).
    /// assert!((lse[[0, 0]] - (3f32.ln() + 20.0 * (0.05f32).tanh())).abs() < 1e-5);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn attend_with_into<Q: Storage, O: Storage>(
        &mut self,
        q: ArrayView3<Q>,
        options: &CacheOptions,
        out: ArrayViewMut3<O>,
        lse: Option<ArrayViewMut2<f32>>,
    ) -> Result<(), AttentionError> {
        let CacheShape { kv_heads, key_dim, value_dim, .. } = self.cache.shape;
        let [query_heads, n_queries, _] = *q.shape() else { unreachable!("3-D view") };
        let lse_shape = lse.as_ref().map(|lse| lse.shape());
        step::check_step(q.shape(), out.shape(), lse_shape, kv_heads, key_dim, value_dim)
            .map_err(|mismatch| self.shape_error(mismatch))?;
        let (len, held) = (self.len(), self.held());
        // A ring's own limit first: a prefill longer than it is refused for that, even when it is
        // longer than the ring holds too ("append first" would send the caller the wrong way).
        let ring = self.cache.ring;
        if let Some(ring) = ring {
            let largest = ring.largest_step(len, self.store().oldest);
            if n_queries > largest {
                return Err(AttentionError::CacheInput {
                    layer: self.index,
                    argument: "queries",
                    found: q.shape().into(),
                    expected: format!("[{query_heads}, at most {largest}, {key_dim}]"),
                    // Fewer than a ring that was never truncated takes (holding from `len - capacity` on).
                    why: if largest < ring.largest_step(len, len.saturating_sub(ring.capacity)) {
                        "right after a truncation a windowed cache holds the windows of fewer queries \
                         (the positions it cut wrote over older ones): append first, or attend in smaller steps"
                    } else {
                        "a windowed cache that has wrapped holds the windows of at most capacity - sink_tokens \
                         - window + 1 new queries (an append of more wrote over keys its first positions' \
                         windows need): append and attend in chunks of at most that many, or make the capacity \
                         larger"
                    },
                });
            }
            if let Some(found) = options.window
                && found != ring.sliding_window()
            {
                return Err(AttentionError::CacheWindowOption {
                    layer: self.index,
                    found,
                    window: ring.window,
                });
            }
        }
        if n_queries > held {
            return Err(AttentionError::CacheInput {
                layer: self.index,
                argument: "queries",
                found: q.shape().into(),
                expected: format!("[{query_heads}, at most {held}, {key_dim}]"),
                why: "the queries are the last positions held, so append their keys and values first",
            });
        }
        let level = self.cache.level;
        step::check_cache_options(options, level, query_heads, n_queries, held)?
            .map_err(|mismatch| self.shape_error(mismatch))?;
        let shape = Shape { n_queries, n_keys: held, key_dim, value_dim };
        let KvCache { layout, isa, layers, rotary, step, .. } = &mut *self.cache;
        let StepBuffers { step: buffers, keep_by_slot } = step;
        // A plain cache is one problem over the positions held. A ring is one part per run of
        // slots, each placing its slots among keys of its own, with the ring's window, and the
        // keep mask's columns moved to the slots (see `ring.rs`); its sink tokens, if it keeps
        // any, are a third part, at their own positions under the causal mask alone.
        let (dense, runs, lengths, by_slot, ring_options, sink_length, sink_options);
        let heads = match ring {
            None => {
                dense = options.dense();
                let whole = dense.resolve_heads(&shape, Some((1, query_heads)))?;
                // One part: the other entries are never read.
                [whole, whole, whole]
            }
            Some(ring) => {
                if ring.sink_tokens > 0 && options.keep.is_some() {
                    return Err(AttentionError::CacheOption {
                        option: "keep_mask",
                        why: "a cache that keeps sink tokens places them apart from its ring",
                    });
                }
                runs = ring.runs(len);
                lengths = runs.map(|run| [run.key_length]);
                by_slot =
                    options.keep.as_ref().map(|keep| ring.keep_by_slot(len, keep.0.head(0, 0), keep_by_slot));
                ring_options = [0, 1].map(|part| {
                    let options =
                        options.dense().sliding_window(ring.sliding_window()).key_lengths(&lengths[part]);
                    match by_slot {
                        Some(keep) => options.keep_mask(keep.slice_move(s![.., ..runs[part].n_keys])),
                        None => options,
                    }
                });
                let run = |part: usize| {
                    let shape = Shape { n_keys: runs[part].n_keys, ..shape };
                    ring_options[part].resolve_heads(&shape, Some((1, query_heads)))
                };
                // The sink tokens' key `j` is position `j`, among keys as many as the positions
                // appended, so that the bottom-right causal mask places the queries where they are.
                sink_length = [len.min(ring.sink_tokens)];
                sink_options =
                    CacheOptions { window: None, keep: None, ..options.dense() }.key_lengths(&sink_length);
                let sinks =
                    sink_options.resolve_heads(&Shape { n_keys: len, ..shape }, Some((1, query_heads)))?;
                [run(0)?, run(1)?, sinks]
            }
        };
        let parts = match ring {
            None => 1,
            Some(ring) if ring.sink_tokens == 0 => 2,
            Some(_) => 3,
        };
        if n_queries == 0 {
            return Ok(());
        }
        let rotary = *rotary;
        let query_magnitude = finite_magnitude("queries", &q)? * rotation_growth(rotary.as_ref());
        // The slots each part reads, and as many keys as the largest part's: a ring's from its
        // first slot on, its sink tokens' from slot 0.
        let (ring_slots, sink_slots) = match ring {
            None => (0..held, 0..0),
            Some(ring) => {
                let ring_held = ring.ring_len(len).min(ring.capacity);
                (ring.first_slot..ring.first_slot + ring_held, 0..len.min(ring.sink_tokens))
            }
        };
        let fits = |keys, values| {
            let magnitudes =
                Magnitudes { queries: query_magnitude, keys: checked_key_magnitude::<E>(keys), values };
            heads[..parts].iter().all(|heads| flash::stays_finite(&shape, &magnitudes, &heads.head(0, 0)))
        };
        let store = &mut layers[self.index];
        if !fits(store.keys, store.values) {
            // The bound kept since the last clear counts keys truncated or written over since:
            // what is held now may be smaller (one huge key no longer blocks every later step).
            (store.keys, store.values) =
                store.held_magnitudes([&ring_slots, &sink_slots], *layout, key_dim, value_dim);
            if !fits(store.keys, store.values) {
                return Err(AttentionError::CacheOverflow { layer: self.index });
            }
        }
        let store = &*store;
        let problem_keys = ring_slots.len().max(sink_slots.len());
        let keys = |_: usize, part: usize, kv: usize| {
            let slots = if part == 2 { &sink_slots } else { &ring_slots };
            StoredKeys::Contiguous(store.heads[kv].keys(slots, *layout, key_dim))
        };
        let first_query = |_: usize| len - n_queries;
        let step = Step {
            isa: *isa,
            q: q.insert_axis(Axis(0)),
            kv_heads,
            value_dim,
            members: 1,
            member: &|_| (0, 0..n_queries),
            n_keys: &|_| problem_keys,
            keys: &keys,
            parts,
            masks: &|_, part, head| heads[part].head(0, head),
            heads_differ: heads[0].vary_by_head(),
            rotary: rotary.as_ref().map(|rotary| (rotary, &first_query as &(dyn Fn(usize) -> usize + Sync))),
        };
        let lse = lse.map(|lse| lse.insert_axis(Axis(0)));
        step::attend(&step, out.insert_axis(Axis(0)), lse, buffers);
        Ok(())
    }

    /// `[query_heads, n_q, d_v]` for queries `q`: the output of a step.
    fn output_shape<Q>(&self, q: &ArrayView3<Q>) -> (usize, usize, usize) {
        let [query_heads, n_queries, _] = *q.shape() else { unreachable!("3-D view") };
        (query_heads, n_queries, self.cache.shape.value_dim)
    }

    /// [`AttentionError::CacheInput`] of this layer for `mismatch`.
    fn shape_error(&self, mismatch: ShapeMismatch) -> AttentionError {
        let ShapeMismatch { argument, found, expected, why } = mismatch;
        AttentionError::CacheInput { layer: self.index, argument, found, expected, why }
    }
}

#[cfg(test)]
mod tests;
