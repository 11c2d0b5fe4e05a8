//! The engine's typed errors: each names the argument at fault and the shapes involved.

use std::fmt;

/// A shape, printed as `[3, 2]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dims(pub Vec<usize>);

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl From<&[usize]> for Dims {
    fn from(dims: &[usize]) -> Self {
        Dims(dims.to_vec())
    }
}

/// `1 row`, `3 rows`: messages read as sentences.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Everything that can be wrong with a call into the engine.
///
/// Messages are sentences meant for the person who wrote the call: they name the argument, say
/// what was found and what was expected, and why the engine needs it.
///
/// ```
/// let q = qkv::ndarray::Array2::<f32>::zeros((4, 8));
/// let kv = qkv::ndarray::Array2::<f32>::zeros((6, 8));
/// let padding = qkv::ndarray::Array1::from_elem(5, true);
/// let options = qkv::AttentionOptions::new().key_padding(qkv::KeyPadding::new(padding.view()));
/// let err = qkv::attention(q.view(), kv.view(), kv.view(), &options).unwrap_err();
/// let message = "key_padding has shape [5] but the scores it applies to have shape [4, 6] (n_k = 6)";
/// assert_eq!(err.to_string(), message);
/// ```
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum AttentionError {
    /// Keys and queries have different widths, so `q · k` is undefined. This is also what scoring
    /// a query against values of another width (the lesson's "common trap") runs into.
    #[error(
        "keys have width {key_width} but queries have width {query_width}: each key is compared \
         with a query by a dot product, so both need the same width (queries {queries}, keys {keys})"
    )]
    KeyWidth {
        /// Width of each query (`d_k` as the queries see it).
        query_width: usize,
        /// Width of each key.
        key_width: usize,
        /// Full shape of the queries.
        queries: Dims,
        /// Full shape of the keys.
        keys: Dims,
    },
    /// Values and keys come in pairs; their counts differ.
    #[error(
        "values have {} but keys have {key_rows}: every key needs exactly one value \
         to hand over (keys {keys}, values {values})",
        count(*value_rows, "row", "rows")
    )]
    ValueRows {
        /// Number of keys.
        key_rows: usize,
        /// Number of values.
        value_rows: usize,
        /// Full shape of the keys.
        keys: Dims,
        /// Full shape of the values.
        values: Dims,
    },
    /// An argument with nothing in it where something is needed.
    #[error("{argument} {shape} is empty: {why}")]
    Empty {
        /// Which argument.
        argument: &'static str,
        /// Its shape.
        shape: Dims,
        /// Why it may not be empty.
        why: &'static str,
    },
    /// An input element that is NaN or infinite.
    #[error("{argument}{index} is {value}: attention needs finite inputs")]
    NonFinite {
        /// Which argument.
        argument: &'static str,
        /// Where, printed as `[row, column]`.
        index: Dims,
        /// The value found.
        value: f64,
    },
    /// A key that is finite but leaves the cache's storage type's range once rotated: RoPE turns
    /// each pair of components, and a component can grow up to √2 times.
    #[error(
        "keys{index} is finite, but rotated by RoPE it overflows {storage} (a rotation can grow a component up to √2 times): keep keys smaller, or store them in a wider type"
    )]
    RotatedKeyOverflow {
        /// Where the rotated key left the range, printed as `[head, position, component]`.
        index: Dims,
        /// The cache's storage type (`"f16"`).
        storage: &'static str,
    },
    /// A mask, bias or per-sequence list whose shape does not match the scores it applies to.
    #[error("{argument} has shape {found} but the scores it applies to have shape {scores} ({needs})")]
    MaskShape {
        /// Which mask.
        argument: &'static str,
        /// The shape it has.
        found: Dims,
        /// The shape of the scores: `[n_q, n_k]`, or `[batch, heads, n_q, n_k]` for multi-head.
        scores: Dims,
        /// The shapes it may have, or the sizes they come from.
        needs: String,
    },
    /// A key length longer than the keys.
    #[error("key_lengths[{index}] is {length} but there are {}", count(*n_keys, "key", "keys"))]
    KeyLength {
        /// The batch element.
        index: usize,
        /// Its length.
        length: usize,
        /// Keys in the tensor.
        n_keys: usize,
    },
    /// Query heads cannot be shared out evenly over key/value heads (grouped-query attention).
    #[error(
        "{query_heads} query heads cannot share {kv_heads} key/value heads: the number of query \
         heads must be a positive multiple of the number of key/value heads"
    )]
    HeadCount {
        /// Heads in the queries.
        query_heads: usize,
        /// Heads in the keys and values.
        kv_heads: usize,
    },
    /// Two multi-head arguments disagree on an axis they must share.
    #[error("{argument} has shape {found} but must agree with {other} {other_shape} on the {axis} axis")]
    AxisMismatch {
        /// The argument at fault.
        argument: &'static str,
        /// Its shape.
        found: Dims,
        /// The argument it must agree with.
        other: &'static str,
        /// That argument's shape.
        other_shape: Dims,
        /// The axis, by name (`batch`, `n_keys`, ...).
        axis: &'static str,
    },
    /// A projection matrix whose shape does not fit the embeddings or the other projections.
    #[error("{argument} has shape {found} but must be {expected}: {why}")]
    ProjectionShape {
        /// Which projection.
        argument: &'static str,
        /// The shape it needs (`0` stands for "any").
        expected: String,
        /// The shape it has.
        found: Dims,
        /// Why.
        why: &'static str,
    },
    /// A query index outside the queries (for [`trace_query`](crate::trace_query)).
    #[error("query_idx {index} is out of range for {}", count(*n_queries, "query", "queries"))]
    QueryIndex {
        /// The index asked for.
        index: usize,
        /// How many queries there are.
        n_queries: usize,
    },
    /// A size that is zero where at least one is needed (the `block` of
    /// [`trace_tiled`](crate::reference::trace_tiled)).
    #[error("{argument} is 0: {why}")]
    Zero {
        /// Which argument.
        argument: &'static str,
        /// Why it may not be zero.
        why: &'static str,
    },
    /// A causal mask and a sliding window that place the queries among the keys differently.
    #[error(
        "the causal mask is {causal:?} but the sliding window is {window:?}-aligned: the two would put each query \
         at two different key positions (with more keys than queries a window can hide every key the causal mask \
         leaves a row); align them alike, as `SlidingWindow::new(before, after).aligned(CausalMask::{causal:?})`"
    )]
    WindowAlignment {
        /// The causal mask's alignment.
        causal: crate::CausalMask,
        /// The window's.
        window: crate::CausalMask,
    },
    /// A scale that is NaN or infinite.
    #[error("scale is {value}: the score multiplier must be finite")]
    InvalidScale {
        /// The scale given.
        value: f64,
    },
    /// A logit soft-cap that is not a finite positive number
    /// ([`AttentionOptions::logit_softcap`](crate::AttentionOptions::logit_softcap)).
    #[error("logit_softcap is {value}: the cap must be finite and positive (Gemma 2 uses 50)")]
    InvalidSoftcap {
        /// The cap given.
        value: f64,
    },
    /// A flat slice whose length does not match the shape it is said to have.
    #[error(
        "{argument} has {len} elements but a {} {} needs {}",
        shape.0.iter().map(usize::to_string).collect::<Vec<_>>().join(" × "),
        if shape.0.len() == 2 { "matrix" } else { "tensor" },
        shape.0.iter().map(|&d| d as u128).product::<u128>()
    )]
    SliceLength {
        /// Which argument.
        argument: &'static str,
        /// Its length.
        len: usize,
        /// The shape claimed.
        shape: Dims,
    },
    /// An output buffer of the wrong shape (for [`attention_into`](crate::attention_into)).
    #[error("output has shape {found} but the attention result has shape {expected}")]
    OutputShape {
        /// The shape the result has.
        expected: Dims,
        /// The buffer's shape.
        found: Dims,
    },
    /// An argument of the backward (the saved forward, the output's gradient, or a gradient
    /// buffer of an `_into` form) whose shape does not fit the problem.
    #[error("{argument} has shape {found} but the problem's {what} has shape {expected}")]
    GradientShape {
        /// Which argument (`output`, `logsumexp`, `d_output`, `dq`, `dk`, `dv`, `dbias`).
        argument: &'static str,
        /// Its shape.
        found: Dims,
        /// The shape it needs.
        expected: Dims,
        /// What it must match (`output`, `queries`, `scores`, ...).
        what: &'static str,
    },
    /// Two partial results that cannot be merged (see
    /// [`PartialAttention::merge`](crate::PartialAttention::merge)).
    #[error("cannot merge shapes {first} and {second}: a merge takes {what}")]
    MergeShape {
        /// The first shape.
        first: Dims,
        /// The second shape.
        second: Dims,
        /// What the merge needs.
        what: &'static str,
    },
    /// A part handed to [`PartialAttention::merge`](crate::PartialAttention::merge) that no
    /// attention could have produced: a NaN or `+inf` logsumexp, or a non-finite output element.
    #[error("cannot merge: the {part} part's {argument}{index} is {value}; {why}")]
    MergeValue {
        /// Which part: `first` (the receiver) or `second` (the argument).
        part: &'static str,
        /// `logsumexp` or `output`.
        argument: &'static str,
        /// Where, printed as `[row]` or `[row, column]` (with any leading axes).
        index: Dims,
        /// The value found.
        value: f64,
        /// What the element may hold.
        why: &'static str,
    },
    /// A score that overflowed the element type although every input was finite.
    #[error(
        "the scaled score of query {query_idx}{} overflowed {ty}: its inputs and the scale are finite but \
         their scaled dot product is too large for it; compute in f64, or scale the inputs (or the scale) down",
        head.map_or(String::new(), |(b, h)| format!(" in batch {b}, head {h}"))
    )]
    ScoreOverflow {
        /// The first query whose scores overflowed.
        query_idx: usize,
        /// `(batch, query head)` of a multi-head call.
        head: Option<(usize, usize)>,
        /// The element type.
        ty: &'static str,
    },
    /// A backward whose inputs are finite but so large that an f32 score or gradient could
    /// overflow (the forward takes a slower exact path for such inputs; the backward has none).
    #[error(
        "the inputs of the attention backward are finite but large enough that a {ty} score or \
         gradient could overflow; scale the inputs down{}",
        if *ty == "f32" { " or compute in f64" } else { "" }
    )]
    GradientOverflow {
        /// The element type.
        ty: &'static str,
    },
    /// A SIMD level that this CPU does not run was asked for.
    #[error(
        "{by} asks for the {requested} SIMD level, which this CPU does not run (the best it runs is \
         {supported}): ask for {supported} or a lower level, or leave the choice to the engine"
    )]
    UnsupportedSimdLevel {
        /// The level asked for.
        requested: crate::level::SimdLevel,
        /// The best level this CPU runs.
        supported: crate::level::SimdLevel,
        /// Who asked: `QKV_SIMD` or `AttentionOptions::simd`.
        by: &'static str,
    },
    /// A layer index outside a [`KvCache`](crate::KvCache).
    #[error("layer {layer} is out of range: the KV cache has {}", count(*layers, "layer", "layers"))]
    CacheLayer {
        /// The layer asked for.
        layer: usize,
        /// Layers in the cache.
        layers: usize,
    },
    /// An append that does not fit in the room left in a layer of a [`KvCache`](crate::KvCache).
    #[error(
        "layer {layer} of the KV cache holds {len} of its {capacity} positions: appending {appended} \
         more would pass its capacity; make the cache larger, or clear it for a new sequence"
    )]
    CacheFull {
        /// The layer appended to.
        layer: usize,
        /// Positions it holds.
        len: usize,
        /// Positions appended.
        appended: usize,
        /// Positions it can hold.
        capacity: usize,
    },
    /// An argument of a [`KvCache`](crate::KvCache) layer's append or attend whose shape does not fit.
    #[error("layer {layer} of the KV cache takes {argument} of shape {expected}, not {found}: {why}")]
    CacheInput {
        /// The layer.
        layer: usize,
        /// Which argument (`keys`, `values`, `queries`, `output`).
        argument: &'static str,
        /// Its shape.
        found: Dims,
        /// The shape it needs.
        expected: String,
        /// Why.
        why: &'static str,
    },
    /// A [`KvCache`](crate::KvCache) whose storage cannot be allocated: its size overflows, or
    /// the allocator refused it.
    #[error(
        "KvCache shape {shape} (layers, kv_heads, capacity, key_dim, value_dim) needs {} of {storage} \
         storage, {why}: ask for a smaller capacity",
        bytes.map_or("more than usize::MAX bytes".to_string(), |b| format!("{b} bytes"))
    )]
    CacheTooLarge {
        /// The cache's shape, `[layers, kv_heads, capacity, key_dim, value_dim]`.
        shape: Dims,
        /// The storage type (`f32`, `bf16`, `f16`).
        storage: &'static str,
        /// The bytes it needs, `None` if that overflows `usize`.
        bytes: Option<usize>,
        /// Why it cannot be allocated.
        why: &'static str,
    },
    /// A windowed [`KvCache`](crate::KvCache) whose window does not fit its capacity.
    #[error(
        "a KV cache's window of {window} positions must be at least 1 and at most its capacity, \
         {capacity}: the ring holds the window and a step's new positions (capacity = window + the \
         largest step - 1)"
    )]
    CacheWindow {
        /// The window asked for, in positions.
        window: usize,
        /// The cache's capacity, in positions.
        capacity: usize,
    },
    /// Sink tokens ([`KvCache::with_sink_tokens`](crate::KvCache::with_sink_tokens)) asked of a
    /// cache that cannot keep them.
    #[error("a KV cache cannot keep its first {sink_tokens} positions as sink tokens: {why}")]
    CacheSinkTokens {
        /// The sink tokens asked for.
        sink_tokens: usize,
        /// Why not.
        why: String,
    },
    /// A step over a windowed [`KvCache`](crate::KvCache) whose `sliding_window` option is not
    /// the window the cache keeps.
    #[error(
        "layer {layer} of the KV cache keeps a window of {window} positions, so its sliding_window \
         option is SlidingWindow::new({}, 0) or none (the cache's window then applies), not {found}",
        window - 1
    )]
    CacheWindowOption {
        /// The layer.
        layer: usize,
        /// The window option given.
        found: crate::mask::SlidingWindow,
        /// The cache's window, in positions.
        window: usize,
    },
    /// An option that a cache step decides itself, asked for in the options of a
    /// [`KvCache`](crate::KvCache) or [`PagedKvCache`](crate::PagedKvCache) step
    /// ([`CacheOptions`](crate::CacheOptions)).
    #[error("a KV cache step takes no {option} option: {why}")]
    CacheOption {
        /// The option (`causal`, `key_padding`, `key_lengths`, `bias`, `simd`, `TopLeft-aligned
        /// sliding_window`).
        option: &'static str,
        /// Why the cache decides it.
        why: &'static str,
    },
    /// A step over a [`KvCache`](crate::KvCache) layer whose inputs are too large for f32.
    #[error(
        "layer {layer} of the KV cache: its keys and values with these queries could overflow an f32 \
         score or sum; scale the inputs down (positions already appended with huge keys or values stay \
         until truncate cuts them)"
    )]
    CacheOverflow {
        /// The layer.
        layer: usize,
    },
    /// A [`PagedKvCache`](crate::PagedKvCache) whose pool cannot be allocated: its size
    /// overflows, or the allocator refused it.
    #[error(
        "PagedKvCache shape {shape} (layers, kv_heads, key_dim, value_dim, block_size, blocks) needs {} \
         of {storage} storage, {why}: ask for fewer or smaller blocks",
        bytes.map_or("more than usize::MAX bytes".to_string(), |b| format!("{b} bytes"))
    )]
    PagedTooLarge {
        /// The pool's shape, `[layers, kv_heads, key_dim, value_dim, block_size, blocks]`.
        shape: Dims,
        /// The storage type (`f32`, `bf16`, `f16`).
        storage: &'static str,
        /// The bytes it needs, `None` if that overflows `usize`.
        bytes: Option<usize>,
        /// Why it cannot be allocated.
        why: &'static str,
    },
    /// An append to a [`PagedKvCache`](crate::PagedKvCache) that needs more blocks than the pool
    /// has free.
    #[error(
        "appending {appended} positions to sequence {sequence} (layer {layer}, holding {len}) needs \
         {needed} free blocks but the pool has {free} of its {blocks}: free finished sequences, or \
         make the pool larger"
    )]
    PoolFull {
        /// The sequence appended to.
        sequence: usize,
        /// The layer appended to.
        layer: usize,
        /// Positions that layer holds.
        len: usize,
        /// Positions appended.
        appended: usize,
        /// Blocks the append needs: new ones, and copies of shared blocks it writes into.
        needed: usize,
        /// Blocks free.
        free: usize,
        /// Blocks in the pool.
        blocks: usize,
    },
    /// A sequence that a [`PagedKvCache`](crate::PagedKvCache) does not hold.
    #[error("sequence {sequence} is not in the paged KV cache: {why}")]
    UnknownSequence {
        /// The sequence's index.
        sequence: usize,
        /// Why: another cache's id, or a freed sequence's (whose slot may hold a later one).
        why: &'static str,
    },
    /// A sequence listed twice in one [`PagedLayer`](crate::PagedLayer) step: its queries are
    /// its last positions, one run of them a step.
    #[error(
        "sequences[{index}] repeats sequences[{first}] (sequence {sequence}): a step takes each sequence \
         once, its queries the last positions it holds"
    )]
    RepeatedSequence {
        /// Its place in the step's list.
        index: usize,
        /// Its first place there.
        first: usize,
        /// The sequence's index.
        sequence: usize,
    },
    /// A [`PagedLayer`](crate::PagedLayer) step whose sliding window reaches positions that
    /// [`evict_before`](crate::PagedKvCache::evict_before) let go.
    #[error(
        "sequences[{index}] (sequence {sequence}): the sliding window of its query at position {position} \
         reaches back to position {reaches}, but the positions before {first_held} were evicted: evict only \
         the positions no query will see again (before the next query's position - window.before)"
    )]
    WindowEvicted {
        /// Its place in the step's list.
        index: usize,
        /// The sequence's index.
        sequence: usize,
        /// The step's first query's position.
        position: usize,
        /// The first position its window sees.
        reaches: usize,
        /// The first position the sequence holds.
        first_held: usize,
    },
    /// A truncation past the end of a sequence.
    #[error(
        "sequence {sequence} holds {len} positions: it cannot be truncated to {requested} (truncation \
         only removes positions)"
    )]
    TruncateLength {
        /// The sequence's index.
        sequence: usize,
        /// Positions it holds (its longest layer).
        len: usize,
        /// The length asked for.
        requested: usize,
    },
    /// A [`PagedKvCache::truncate`](crate::PagedKvCache::truncate) to fewer positions than
    /// eviction left the sequence holding.
    #[error(
        "sequence {sequence} no longer holds position {position}: the positions before {first_held} \
         were evicted"
    )]
    Evicted {
        /// The sequence's index.
        sequence: usize,
        /// The position asked for.
        position: usize,
        /// The first position it holds.
        first_held: usize,
    },
    /// A [`PagedKvCache::evict_before`](crate::PagedKvCache::evict_before) past what a layer of
    /// the sequence holds.
    #[error(
        "sequence {sequence} cannot evict the positions before {position}: a layer of it holds only \
         {held} (evict what every layer holds)"
    )]
    EvictBeyond {
        /// The sequence's index.
        sequence: usize,
        /// The position asked for.
        position: usize,
        /// Positions its shortest layer holds.
        held: usize,
    },
    /// A [`Rotary`](crate::Rotary) that does not fit the rows it would turn.
    #[error("rotary embedding (base {base}, {dims} rotated components) over rows of {width}: {why}")]
    InvalidRotary {
        /// The base.
        base: f64,
        /// The components it would rotate.
        dims: usize,
        /// The rows' width.
        width: usize,
        /// What is wrong.
        why: &'static str,
    },
    /// A rotary embedding given to a cache that already holds positions, appended unrotated.
    #[error(
        "a KV cache takes its rotary embedding before its first append: the positions it holds were stored unrotated"
    )]
    RotaryAfterAppend,
    /// A [`KvCache::truncate`](crate::KvCache::truncate) that cannot be done.
    #[error("the KV cache holds {len} positions: it cannot be truncated to {requested}: {why}")]
    CacheTruncate {
        /// Positions its longest layer holds.
        len: usize,
        /// The length asked for.
        requested: usize,
        /// Why not.
        why: &'static str,
    },
    /// An argument of a [`PagedKvCache`](crate::PagedKvCache) layer's append or attend whose
    /// shape does not fit.
    #[error("layer {layer} of the paged KV cache takes {argument} of shape {expected}, not {found}: {why}")]
    PagedInput {
        /// The layer.
        layer: usize,
        /// Which argument (`keys`, `values`, `queries`, `output`, or one sequence's queries).
        argument: String,
        /// Its shape.
        found: Dims,
        /// The shape it needs.
        expected: String,
        /// Why.
        why: &'static str,
    },
    /// The offsets of a packed batch (flash-attn's `cu_seqlens`) that do not cut the packed rows
    /// into one run per sequence.
    #[error(
        "{argument} {offsets} do not fit {} and {}: {why}",
        count(*sequences, "sequence", "sequences"),
        count(*rows, "packed row", "packed rows")
    )]
    PackedOffsets {
        /// `query_offsets` or `key_offsets`.
        argument: &'static str,
        /// The offsets given.
        offsets: Dims,
        /// Sequences in the batch.
        sequences: usize,
        /// Rows along the packed axis.
        rows: usize,
        /// What they must be.
        why: &'static str,
    },
    /// The query and key offsets of a packed batch (flash-attn's `cu_seqlens_q` and `cu_seqlens_k`)
    /// that count different numbers of sequences: which one is wrong only the caller knows.
    #[error(
        "query_offsets {query_offsets} and key_offsets {key_offsets} differ in length ({} and {}): \
         each has one offset per sequence of the batch and one for the end",
        query_offsets.0.len(),
        key_offsets.0.len()
    )]
    PackedOffsetCounts {
        /// The query offsets given.
        query_offsets: Dims,
        /// The key offsets given.
        key_offsets: Dims,
    },
    /// An option that a packed call ([`varlen_attention`](crate::varlen_attention)) does not
    /// take.
    #[error("a packed (varlen) call takes no {option} option: {why}")]
    PackedOption {
        /// The option (`keep_mask`, `bias`, `key_padding`, `key_lengths`).
        option: &'static str,
        /// Why.
        why: &'static str,
    },
    /// A SIMD level name that is not one (from `QKV_SIMD`).
    #[error("{value:?} is not a SIMD level: QKV_SIMD takes amx, avx512bf16, avx512, avx2 or baseline")]
    UnknownSimdLevel {
        /// The text given.
        value: String,
    },
}
