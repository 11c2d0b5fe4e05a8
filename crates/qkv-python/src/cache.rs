//! The engine's KV caches for Python: [`KvCache`] (one sequence, optionally a sliding-window
//! ring) and [`PagedKvCache`] (many sequences in blocks of one pool), each storing f32, bf16,
//! f16 or int8 (`qkv::Q8`: appends take f32), with the options of `qkv::CacheOptions`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use ndarray::{Ix2, Ix3};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use qkv::half::{bf16, f16};
use qkv::{
    CacheOptions, CacheShape, CacheStorage, PagedShape, Q8, Rotary, SequenceId, SimdLevel, SlidingWindow,
    Storage,
};

use crate::dense::{narrowed, per_head_values, side};
use crate::raw::{Dtype, Element, Raw};
use crate::{detached, value_error};

/// A cache's options as `python/qkv/_cache.py` packs them: `(scale, window (before, after; -1
/// unbounded), ALiBi slopes, soft-cap, keep mask [n_q, held], sink logits)`. Windows are aligned
/// bottom-right: the queries are the last positions held.
#[derive(Debug, Clone, FromPyObject)]
pub struct CacheSpec(
    Option<f64>,
    Option<(i64, i64)>,
    Option<Vec<f64>>,
    Option<f64>,
    Option<Raw>,
    Option<Vec<f64>>,
);

/// A cache's ALiBi slopes and sink logits in f32, kept alive for the options that borrow them.
type PerHead = (Option<Vec<f32>>, Option<Vec<f32>>);

impl CacheSpec {
    /// The slopes and the sinks in f32, each checked to fit it.
    fn per_head(&self) -> PyResult<PerHead> {
        Ok((per_head_values("alibi_slopes", &self.2)?, per_head_values("sinks", &self.5)?))
    }

    /// The engine's options, borrowing the slopes and the sinks (`per_head`) and the keep mask.
    ///
    /// # Safety
    /// The keep mask must describe live memory for `'a` (see [`Raw::view`]).
    unsafe fn options<'a>(&'a self, (slopes, sinks): &'a PerHead) -> PyResult<CacheOptions<'a>> {
        let mut options = CacheOptions::new();
        if let Some(scale) = self.0 {
            options = options.scale(narrowed("scale", scale)?);
        }
        if let Some((before, after)) = self.1 {
            options = options.sliding_window(SlidingWindow::new(side(before), side(after)));
        }
        if let Some(slopes) = slopes {
            options = options.alibi(slopes);
        }
        if let Some(cap) = self.3 {
            options = options.logit_softcap(narrowed("softcap", cap)?);
        }
        if let Some(keep) = &self.4 {
            // SAFETY: the caller vouches for the mask's memory.
            options = options.keep_mask(unsafe { keep.view::<bool, Ix2>("keep")? });
        }
        if let Some(sinks) = sinks {
            options = options.sinks(sinks);
        }
        Ok(options)
    }
}

/// `body` with the type names `e` and `q` standing for types `E` and `Q`.
macro_rules! typed {
    ($e:ident = $E:ty, $q:ident = $Q:ty => $body:expr) => {{
        type $e = $E;
        type $q = $Q;
        $body
    }};
}

/// A cache of any storage type: `$each!(value, c => expr)` runs `expr` with `c` the typed cache;
/// `$by_query!(value, query, c, E, Q => expr)` with `E` its storage type and `Q` the type it takes
/// queries of dtype `query` in: f32, or its own half-precision type (an int8 cache takes all
/// three), as the engine's caches take them.
macro_rules! storage_enum {
    ($name:ident, $inner:ident, $each:ident, $by_query:ident) => {
        enum $name {
            F32(qkv::$inner<f32>),
            Bf16(qkv::$inner<bf16>),
            F16(qkv::$inner<f16>),
            Int8(qkv::$inner<Q8>),
        }

        macro_rules! $each {
            ($value:expr, $c:ident => $body:expr) => {
                match $value {
                    $name::F32($c) => $body,
                    $name::Bf16($c) => $body,
                    $name::F16($c) => $body,
                    $name::Int8($c) => $body,
                }
            };
        }

        macro_rules! $by_query {
                    ($value:expr, $query:expr, $c:ident, $e:ident, $q:ident => $body:expr) => {{
                        let query = $query;
                        match $value {
                            $name::F32($c) => typed!($e = f32, $q = f32 => $body),
                            $name::Bf16($c) if query == Dtype::Bf16 => typed!($e = bf16, $q = bf16 => $body),
                            $name::Bf16($c) => typed!($e = bf16, $q = f32 => $body),
                            $name::F16($c) if query == Dtype::F16 => typed!($e = f16, $q = f16 => $body),
                            $name::F16($c) => typed!($e = f16, $q = f32 => $body),
                            $name::Int8($c) if query == Dtype::Bf16 => typed!($e = Q8, $q = bf16 => $body),
                            $name::Int8($c) if query == Dtype::F16 => typed!($e = Q8, $q = f16 => $body),
                            $name::Int8($c) => typed!($e = Q8, $q = f32 => $body),
                        }
                    }};
                }
    };
}
storage_enum!(AnyKvCache, KvCache, each_kv, by_query_kv);
storage_enum!(AnyPaged, PagedKvCache, each_paged, by_query_paged);

/// What a cache stores.
#[derive(Debug, Clone, Copy)]
enum Stored {
    F32,
    Bf16,
    F16,
    Int8,
}

/// The storage type named by `dtype` (`float32`, `bfloat16`, `float16`, `int8`).
fn storage(dtype: &str) -> PyResult<Stored> {
    match dtype {
        "float32" => Ok(Stored::F32),
        "bfloat16" => Ok(Stored::Bf16),
        "float16" => Ok(Stored::F16),
        "int8" => Ok(Stored::Int8),
        other => Err(PyValueError::new_err(format!(
            "dtype is {other:?}: a cache stores float32, bfloat16, float16 or int8"
        ))),
    }
}

/// The keys and values of one sequence for every layer of a decoder (`qkv::KvCache`); with a
/// window, a ring buffer of the last positions a sliding window needs.
#[pyclass(module = "qkv._qkv")]
pub struct KvCache {
    inner: AnyKvCache,
}

/// Appends `k`, `v` to layer `layer` of a typed cache.
///
/// # Safety
/// The tensors must describe live memory for the call.
unsafe fn kv_append<E: CacheStorage>(
    cache: &mut qkv::KvCache<E>,
    layer: usize,
    k: &Raw,
    v: &Raw,
) -> PyResult<()>
where
    E::Appended: Element,
{
    // SAFETY: the caller vouches for the memory.
    let (k, v) = unsafe { (k.view::<E::Appended, Ix3>("key")?, v.view::<E::Appended, Ix3>("value")?) };
    cache.layer(layer).and_then(|mut l| l.append(k, v)).map_err(value_error)
}

/// One step of a typed cache with queries of type `Q`.
///
/// # Safety
/// As [`kv_append`]; the outputs fresh.
unsafe fn kv_attend<E: CacheStorage, Q: Storage + Element>(
    cache: &mut qkv::KvCache<E>,
    layer: usize,
    q: &Raw,
    spec: &CacheSpec,
    (out, lse): &(Raw, Option<Raw>),
) -> PyResult<()> {
    let per_head = spec.per_head()?;
    // SAFETY (every view): the caller vouches for the memory.
    let options = unsafe { spec.options(&per_head)? };
    let q = unsafe { q.view::<Q, Ix3>("query")? };
    let out = unsafe { out.view_mut::<f32, Ix3>("out")? };
    let lse = unsafe { lse.as_ref().map(|l| l.view_mut::<f32, Ix2>("lse")).transpose()? };
    cache.layer(layer).and_then(|mut l| l.attend_with_into(q, &options, out, lse)).map_err(value_error)
}

#[pymethods]
impl KvCache {
    /// A cache of `layers` × `kv_heads` sequences of at most `capacity` positions (of a windowed
    /// cache, the window and the new positions of the largest step but one).
    ///
    /// With `sink_tokens`, a windowed cache also keeps its first positions for good
    /// (StreamingLLM's attention sinks; `qkv::KvCache::with_sink_tokens`).
    ///
    /// With `rotary`, the cache turns keys as it stores them and queries as they attend
    /// (`qkv::KvCache::with_rotary`).
    #[new]
    #[pyo3(signature = (layers, kv_heads, capacity, key_dim, value_dim, dtype, window=None, sink_tokens=None, rotary=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        layers: usize,
        kv_heads: usize,
        capacity: usize,
        key_dim: usize,
        value_dim: usize,
        dtype: &str,
        window: Option<usize>,
        sink_tokens: Option<usize>,
        rotary: Option<RotarySpec>,
    ) -> PyResult<KvCache> {
        let shape = CacheShape::new(layers, kv_heads, capacity, key_dim, value_dim);
        let rotary = rotary.map(RotarySpec::rotary);
        fn make<E: CacheStorage>(
            shape: CacheShape,
            window: Option<usize>,
            sink_tokens: Option<usize>,
            rotary: Option<Rotary>,
        ) -> Result<qkv::KvCache<E>, qkv::AttentionError> {
            let mut cache = match window {
                Some(w) => qkv::KvCache::with_window(shape, w)?,
                None => qkv::KvCache::new(shape)?,
            };
            if let Some(k) = sink_tokens {
                cache = cache.with_sink_tokens(k)?;
            }
            match rotary {
                Some(rotary) => cache.with_rotary(rotary),
                None => Ok(cache),
            }
        }
        let inner = match storage(dtype)? {
            Stored::F32 => AnyKvCache::F32(make(shape, window, sink_tokens, rotary).map_err(value_error)?),
            Stored::Bf16 => AnyKvCache::Bf16(make(shape, window, sink_tokens, rotary).map_err(value_error)?),
            Stored::F16 => AnyKvCache::F16(make(shape, window, sink_tokens, rotary).map_err(value_error)?),
            Stored::Int8 => AnyKvCache::Int8(make(shape, window, sink_tokens, rotary).map_err(value_error)?),
        };
        Ok(KvCache { inner })
    }

    /// Appends keys `k` (`[kv_heads, n_new, key_dim]`) and values `v` to layer `layer`.
    fn append(&mut self, py: Python<'_>, layer: usize, k: Raw, v: Raw) -> PyResult<()> {
        let inner = &mut self.inner;
        // SAFETY: the package passes tensors it holds for the call.
        detached(py, move || each_kv!(inner, c => unsafe { kv_append(c, layer, &k, &v) }))
    }

    /// Attention of `q` (`[query_heads, n_q, key_dim]`, f32 or the cache's dtype, and any of f32,
    /// bf16 and f16 over int8; the last `n_q` positions held) into `out` (f32) and each row's
    /// logsumexp into `lse` if given.
    fn attend(
        &mut self,
        py: Python<'_>,
        layer: usize,
        q: Raw,
        spec: CacheSpec,
        into: (Raw, Option<Raw>),
    ) -> PyResult<()> {
        let inner = &mut self.inner;
        detached(py, move || {
            // SAFETY: the package passes tensors it holds for the call, outputs fresh.
            by_query_kv!(inner, q.dtype("query")?, c, E, Q => unsafe {
                kv_attend::<E, Q>(c, layer, &q, &spec, &into)
            })
        })
    }

    /// Positions appended to layer `layer` since the cache was made or cleared.
    fn len(&mut self, layer: usize) -> PyResult<usize> {
        each_kv!(&mut self.inner, c => c.layer(layer).map(|l| l.len()).map_err(value_error))
    }

    /// Positions layer `layer` holds (of a windowed cache, at most its capacity).
    fn held(&mut self, layer: usize) -> PyResult<usize> {
        each_kv!(&mut self.inner, c => c.layer(layer).map(|l| l.held()).map_err(value_error))
    }

    /// Empties every layer.
    fn clear(&mut self) {
        each_kv!(&mut self.inner, c => c.clear())
    }

    /// Rolls every layer back to its first `len` positions (`qkv::KvCache::truncate`).
    fn truncate(&mut self, len: usize) -> PyResult<()> {
        each_kv!(&mut self.inner, c => c.truncate(len)).map_err(value_error)
    }

    /// `(layers, kv_heads, capacity, key_dim, value_dim)`.
    #[getter]
    fn shape(&self) -> (usize, usize, usize, usize, usize) {
        let CacheShape { layers, kv_heads, capacity, key_dim, value_dim, .. } =
            each_kv!(&self.inner, c => c.shape());
        (layers, kv_heads, capacity, key_dim, value_dim)
    }

    /// The window of a windowed cache.
    #[getter]
    fn window(&self) -> Option<usize> {
        each_kv!(&self.inner, c => c.window())
    }

    /// The SIMD level the cache's layout is for.
    #[getter]
    fn simd_level(&self) -> String {
        each_kv!(&self.inner, c => c.simd_level()).to_string()
    }
}

/// A rotary embedding as `python/qkv/_cache.py`'s `Rotary` packs it: `(base, interleaved, dims,
/// position_scale)`.
#[derive(Debug, Clone, Copy, FromPyObject)]
pub struct RotarySpec(f64, bool, Option<usize>, f64);

impl RotarySpec {
    /// The engine's [`Rotary`] (which the cache checks against its widths).
    fn rotary(self) -> Rotary {
        let RotarySpec(base, interleaved, dims, scale) = self;
        let rotary = Rotary::new(base).position_scale(scale);
        let rotary = if interleaved { rotary.interleaved() } else { rotary };
        dims.map_or(rotary, |dims| rotary.dims(dims))
    }
}

/// Many sequences' keys and values in fixed-size blocks of one pool (`qkv::PagedKvCache`).
/// Sequences are integer handles, never reused once freed and distinct across the process's
/// caches, so that another cache refuses one.
#[pyclass(module = "qkv._qkv")]
pub struct PagedKvCache {
    inner: AnyPaged,
    sequences: HashMap<u64, SequenceId>,
}

/// Appends to `seq` (known to the caller as `handle`) at layer `layer` of a typed cache.
///
/// # Safety
/// As [`kv_append`].
unsafe fn paged_append<E: CacheStorage>(
    cache: &mut qkv::PagedKvCache<E>,
    layer: usize,
    (seq, handle): (SequenceId, u64),
    k: &Raw,
    v: &Raw,
) -> PyResult<()>
where
    E::Appended: Element,
{
    // SAFETY: the caller vouches for the memory.
    let (k, v) = unsafe { (k.view::<E::Appended, Ix3>("key")?, v.view::<E::Appended, Ix3>("value")?) };
    cache.layer(layer).and_then(|mut l| l.append(seq, k, v)).map_err(PagedKvCache::error(&[(seq, handle)]))
}

/// One batched step of a typed cache, with queries of the type its appends take (f32 for int8).
///
/// # Safety
/// As [`kv_attend`].
unsafe fn paged_attend<E: CacheStorage, Q: Storage + Element>(
    cache: &mut qkv::PagedKvCache<E>,
    layer: usize,
    (sequences, handles, offsets): (&[SequenceId], &[u64], &[usize]),
    q: &Raw,
    spec: &CacheSpec,
    (out, lse): &(Raw, Option<Raw>),
) -> PyResult<()> {
    let named: Vec<(SequenceId, u64)> = sequences.iter().copied().zip(handles.iter().copied()).collect();
    let per_head = spec.per_head()?;
    // SAFETY (every view): the caller vouches for the memory.
    let options = unsafe { spec.options(&per_head)? };
    let q = unsafe { q.view::<Q, Ix3>("query")? };
    let out = unsafe { out.view_mut::<f32, Ix3>("out")? };
    let lse = unsafe { lse.as_ref().map(|l| l.view_mut::<f32, Ix2>("lse")).transpose()? };
    cache
        .layer(layer)
        .and_then(|mut l| l.attend_with_into(sequences, offsets, q, &options, out, lse))
        .map_err(PagedKvCache::error(&named))
}

/// `message` (the engine's) with each "sequence N" that names the engine's slot of one of
/// `named` (`(id, handle)` pairs) naming its handle instead: the number the caller holds. One
/// pass, so that a slot that is another sequence's handle is not renamed twice.
fn by_handle(message: &str, named: &[(SequenceId, u64)]) -> String {
    const WORD: &str = "sequence ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(WORD) {
        let (before, after) = rest.split_at(at + WORD.len());
        out.push_str(before);
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let handle = after[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|slot| named.iter().find(|(id, _)| id.index() == slot))
            .map(|&(_, handle)| handle);
        match handle {
            Some(handle) => out.push_str(&handle.to_string()),
            None => out.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

impl PagedKvCache {
    /// The engine's `error` about the sequences of `named` (`(id, handle)` pairs), as a
    /// `ValueError` that names each by its handle ([`by_handle`]).
    fn error(named: &[(SequenceId, u64)]) -> impl Fn(qkv::AttentionError) -> PyErr + '_ {
        move |error| PyValueError::new_err(by_handle(&error.to_string(), named))
    }

    /// The engine's id of handle `seq`.
    fn id(&self, seq: u64) -> PyResult<SequenceId> {
        self.sequences.get(&seq).copied().ok_or_else(|| {
            PyValueError::new_err(format!(
                "sequence {seq} is not in this cache (freed, never added, or another cache's)"
            ))
        })
    }

    /// A new handle for `id`.
    fn handle(&mut self, id: SequenceId) -> u64 {
        static HANDLES: AtomicU64 = AtomicU64::new(0);
        let handle = HANDLES.fetch_add(1, Ordering::Relaxed);
        self.sequences.insert(handle, id);
        handle
    }
}

#[pymethods]
impl PagedKvCache {
    /// A pool of `blocks` blocks of `block_size` positions (any number; a multiple of
    /// `block_granularity()` wastes no memory) for `layers` × `kv_heads` heads.
    /// With `rotary`, the cache turns keys as it stores them and queries as they attend
    /// (`qkv::PagedKvCache::with_rotary`).
    #[new]
    #[pyo3(signature = (layers, kv_heads, key_dim, value_dim, block_size, blocks, dtype, rotary=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        layers: usize,
        kv_heads: usize,
        key_dim: usize,
        value_dim: usize,
        block_size: usize,
        blocks: usize,
        dtype: &str,
        rotary: Option<RotarySpec>,
    ) -> PyResult<PagedKvCache> {
        let shape = PagedShape::new(layers, kv_heads, key_dim, value_dim, block_size, blocks);
        fn make<E: CacheStorage>(
            shape: PagedShape,
            rotary: Option<Rotary>,
        ) -> Result<qkv::PagedKvCache<E>, qkv::AttentionError> {
            let cache = qkv::PagedKvCache::new(shape)?;
            match rotary {
                Some(rotary) => cache.with_rotary(rotary),
                None => Ok(cache),
            }
        }
        let rotary = rotary.map(RotarySpec::rotary);
        let inner = match storage(dtype)? {
            Stored::F32 => AnyPaged::F32(make(shape, rotary).map_err(value_error)?),
            Stored::Bf16 => AnyPaged::Bf16(make(shape, rotary).map_err(value_error)?),
            Stored::F16 => AnyPaged::F16(make(shape, rotary).map_err(value_error)?),
            Stored::Int8 => AnyPaged::Int8(make(shape, rotary).map_err(value_error)?),
        };
        Ok(PagedKvCache { inner, sequences: HashMap::new() })
    }

    /// The block sizes must be a multiple of this, on this CPU.
    #[staticmethod]
    fn block_granularity() -> PyResult<usize> {
        let level = SimdLevel::dispatched().map_err(value_error)?;
        qkv::PagedKvCache::<f32>::block_granularity(level).map_err(value_error)
    }

    /// A new, empty sequence.
    fn add_sequence(&mut self) -> u64 {
        let id = each_paged!(&mut self.inner, c => c.add_sequence());
        self.handle(id)
    }

    /// A new sequence sharing `seq`'s positions (copied on write).
    fn fork(&mut self, seq: u64) -> PyResult<u64> {
        let id = self.id(seq)?;
        let forked = each_paged!(&mut self.inner, c => c.fork(id)).map_err(Self::error(&[(id, seq)]))?;
        Ok(self.handle(forked))
    }

    /// Keeps the first `len` positions of `seq` at every layer.
    fn truncate(&mut self, seq: u64, len: usize) -> PyResult<()> {
        let id = self.id(seq)?;
        each_paged!(&mut self.inner, c => c.truncate(id, len)).map_err(Self::error(&[(id, seq)]))
    }

    /// Frees `seq`'s blocks; the handle names nothing afterwards.
    fn free(&mut self, seq: u64) -> PyResult<()> {
        let id = self.id(seq)?;
        each_paged!(&mut self.inner, c => c.free(id)).map_err(Self::error(&[(id, seq)]))?;
        self.sequences.remove(&seq);
        Ok(())
    }

    /// Positions `seq` holds at layer `layer`.
    fn len(&mut self, seq: u64, layer: usize) -> PyResult<usize> {
        let id = self.id(seq)?;
        each_paged!(&mut self.inner, c => c.layer(layer).and_then(|l| l.len(id)))
            .map_err(Self::error(&[(id, seq)]))
    }

    /// Returns to the pool the blocks of `seq` that lie wholly before `position` (at every
    /// layer); positions keep their numbers.
    fn evict_before(&mut self, seq: u64, position: usize) -> PyResult<()> {
        let id = self.id(seq)?;
        each_paged!(&mut self.inner, c => c.evict_before(id, position)).map_err(Self::error(&[(id, seq)]))
    }

    /// The first position `seq` still holds (0 unless blocks were evicted).
    fn first_held(&self, seq: u64) -> PyResult<usize> {
        let id = self.id(seq)?;
        each_paged!(&self.inner, c => c.first_held(id)).map_err(Self::error(&[(id, seq)]))
    }

    /// Blocks not held by any sequence.
    fn free_blocks(&self) -> usize {
        each_paged!(&self.inner, c => c.free_blocks())
    }

    /// Appends keys `k` (`[kv_heads, n_new, key_dim]`, the cache's dtype; f32 for int8) and
    /// values `v` to sequence `seq` at layer `layer`.
    fn append(&mut self, py: Python<'_>, layer: usize, seq: u64, k: Raw, v: Raw) -> PyResult<()> {
        let id = self.id(seq)?;
        let inner = &mut self.inner;
        // SAFETY: the package passes tensors it holds for the call.
        detached(py, move || each_paged!(inner, c => unsafe { paged_append(c, layer, (id, seq), &k, &v) }))
    }

    /// Attention for a batch of sequences: `sequences[i]` attends with the queries
    /// `offsets[i] .. offsets[i + 1]` of `q` (`[query_heads, n_queries, key_dim]`, the cache's
    /// dtype; f32 for int8), into `out` (f32) and `lse` if given.
    fn attend(
        &mut self,
        py: Python<'_>,
        layer: usize,
        batch: (Vec<u64>, Vec<usize>),
        q: Raw,
        spec: CacheSpec,
        into: (Raw, Option<Raw>),
    ) -> PyResult<()> {
        let ids = batch.0.iter().map(|&s| self.id(s)).collect::<PyResult<Vec<_>>>()?;
        let (handles, offsets) = batch;
        let inner = &mut self.inner;
        detached(py, move || {
            // SAFETY: the package passes tensors it holds for the call, outputs fresh.
            by_query_paged!(inner, q.dtype("query")?, c, E, Q => unsafe {
                paged_attend::<E, Q>(c, layer, (&ids, &handles, &offsets), &q, &spec, &into)
            })
        })
    }

    /// `(layers, kv_heads, key_dim, value_dim, block_size, blocks)`.
    #[getter]
    fn shape(&self) -> (usize, usize, usize, usize, usize, usize) {
        let PagedShape { layers, kv_heads, key_dim, value_dim, block_size, blocks, .. } =
            each_paged!(&self.inner, c => c.shape());
        (layers, kv_heads, key_dim, value_dim, block_size, blocks)
    }
}

/// Adds the cache classes.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<KvCache>()?;
    module.add_class::<PagedKvCache>()?;
    Ok(())
}
