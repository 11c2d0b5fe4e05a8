//! Masks and options: which keys each query may see, extra score terms, and the scale.
//!
//! Masking is written once, in [`MaskSet::apply_row`]; the reference and every fast path call it
//! (or, for whole blocks, [`MaskSet::visible_keys`]), so they cannot disagree about what is hidden.
//! Options are checked once per call against the scores of every (batch, head) ([`HeadMasks`]);
//! each head then takes its own [`MaskSet`], which holds only that head's slices.

use std::ops::Range;

use ndarray::{ArrayBase, ArrayView1, ArrayView2, ArrayView4, Axis, Ix1, Ix2, Ix4, ViewRepr};

use crate::error::{AttentionError, Dims};
use crate::real::Real;
use crate::shape::Shape;
use crate::simd::SimdLevel;

/// Causal masking: a query may not see keys that come after it.
///
/// With as many queries as keys both alignments agree: query `i` sees keys `0..=i`. When there
/// are fewer queries than keys they differ:
/// - [`CausalMask::BottomRight`] treats the queries as the *last* `n_queries` positions of the
///   key sequence (decoding with a cache of earlier keys): query `i` sees keys
///   `0..=i + n_keys - n_queries`. The last query sees every key.
/// - [`CausalMask::TopLeft`] treats the queries as the *first* positions: query `i` sees keys
///   `0..=i` (PyTorch's `is_causal`).
///
/// With more queries than keys, bottom-right alignment hides every key from the first
/// `n_queries - n_keys` queries; those rows follow the fully-masked-row rule (all-zero weights,
/// zero output).
///
/// [`SlidingWindow`] and [`Alibi`] place queries among the keys by the same two alignments.
///
/// ```
/// let k = ndarray::Array2::<f64>::zeros((4, 1));
/// let q = ndarray::Array2::<f64>::zeros((2, 1));
/// let options = qkv::AttentionOptions::new().causal(qkv::CausalMask::BottomRight);
/// let r = qkv::attention_with_weights(q.view(), k.view(), k.view(), &options)?;
/// assert_eq!(r.weights.row(0).to_vec(), vec![1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0, 0.0]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CausalMask {
    /// Align the last query with the last key (the default).
    #[default]
    BottomRight,
    /// Align the first query with the first key.
    TopLeft,
}

impl CausalMask {
    /// The key position query `query_idx` stands at under this alignment (negative for the first
    /// queries when there are more queries than keys, bottom-right).
    fn position(self, query_idx: usize, shape: &Shape) -> isize {
        match self {
            CausalMask::TopLeft => query_idx as isize,
            CausalMask::BottomRight => query_idx as isize + shape.n_keys as isize - shape.n_queries as isize,
        }
    }
}

/// `ArrayView<'a, E, D>` spelled with its element type: ndarray's alias leaves the element type
/// to a projection, which makes every struct holding one invariant in `'a`, and then a mask set
/// could not be passed along with views of shorter lifetimes.
type View<'a, E, D> = ArrayBase<ViewRepr<&'a E>, D, E>;

/// A mask or bias over the scores of every (batch, head), kept as a 4-D view whatever shape it
/// was given in: a shared `[n_q, n_k]` is `[1, 1, n_q, n_k]`, a key padding `[batch, n_k]` is
/// `[batch, 1, 1, n_k]`. An axis of length 1 applies to every batch element or head.
#[derive(Debug, Clone)]
struct Broadcast<'a, E> {
    view: View<'a, E, Ix4>,
    /// The shape the caller passed, for messages.
    given: GivenShape,
}

/// The shape of a view as the caller passed it (at most 4 axes), kept inline: a cache step wraps
/// its keep mask on every call, and a `Dims` would allocate each time.
#[derive(Debug, Clone, Copy)]
struct GivenShape {
    axes: [usize; 4],
    rank: usize,
}

impl GivenShape {
    fn of(shape: &[usize]) -> GivenShape {
        let mut axes = [0; 4];
        axes[..shape.len()].copy_from_slice(shape);
        GivenShape { axes, rank: shape.len() }
    }

    /// The shape, for an error.
    fn dims(&self) -> Dims {
        Dims(self.axes[..self.rank].to_vec())
    }
}

impl<'a, E> Broadcast<'a, E> {
    /// The `[n_q, n_k]` (or `[1, n_k]`) slice that batch element `b`, head `h` takes.
    fn head(&self, b: usize, h: usize) -> ArrayView2<'a, E> {
        let [batches, heads, _, _] = *self.view.shape() else { unreachable!("4-D view") };
        let pick = |i: usize, len: usize| if len == 1 { 0 } else { i };
        self.view.index_axis_move(Axis(0), pick(b, batches)).index_axis_move(Axis(0), pick(h, heads))
    }

    /// Whether heads of one batch element may take different slices.
    fn varies_by_head(&self) -> bool {
        self.view.shape()[1] > 1
    }
}

/// A boolean mask over (query, key) pairs: `true` where the query may attend to the key.
#[derive(Debug, Clone)]
pub struct KeepMask<'a>(Broadcast<'a, bool>);

impl<'a> KeepMask<'a> {
    /// Wraps a `[n_queries, n_keys]` view, shared by every batch element and head; `true` keeps a
    /// (query, key) pair.
    ///
    /// ```
    /// let keep = ndarray::array![[true, false], [true, true]];
    /// let options = qkv::AttentionOptions::<f32>::new().keep_mask(qkv::KeepMask::new(keep.view()));
    /// # let _ = options;
    /// ```
    pub fn new(keep: ArrayView2<'a, bool>) -> Self {
        let given = GivenShape::of(keep.shape());
        KeepMask(Broadcast { view: keep.insert_axis(Axis(0)).insert_axis(Axis(0)), given })
    }

    /// Wraps a `[batch, heads, n_queries, n_keys]` view for
    /// [`multi_head_attention`](crate::multi_head_attention): `batch` may be 1 (shared by every
    /// sequence) and `heads` may be 1 (shared by the heads of a sequence), as PyTorch broadcasts.
    ///
    /// ```
    /// // Two sequences, the same mask for every head of a sequence.
    /// let keep = ndarray::Array4::from_elem((2, 1, 3, 5), true);
    /// let mask = qkv::KeepMask::batched(keep.view());
    /// # let _ = mask;
    /// ```
    pub fn batched(keep: ArrayView4<'a, bool>) -> Self {
        KeepMask(Broadcast { given: GivenShape::of(keep.shape()), view: keep })
    }
}

/// A boolean mask over keys: `false` marks padding that no query may see.
#[derive(Debug, Clone)]
pub struct KeyPadding<'a>(Broadcast<'a, bool>);

impl<'a> KeyPadding<'a> {
    /// Wraps a `[n_keys]` view shared by every sequence; `true` marks a real key, `false` padding.
    ///
    /// ```
    /// let real = ndarray::array![true, true, false];
    /// let options = qkv::AttentionOptions::<f32>::new().key_padding(qkv::KeyPadding::new(real.view()));
    /// # let _ = options;
    /// ```
    pub fn new(real_keys: ArrayView1<'a, bool>) -> Self {
        let given = GivenShape::of(real_keys.shape());
        let view = real_keys.insert_axis(Axis(0)).insert_axis(Axis(0)).insert_axis(Axis(0));
        KeyPadding(Broadcast { view, given })
    }

    /// Wraps a `[batch, n_keys]` view: each sequence of a padded batch its own padding.
    ///
    /// ```
    /// // Sequence 0 has 3 real keys, sequence 1 has 2.
    /// let real = ndarray::array![[true, true, true], [true, true, false]];
    /// let padding = qkv::KeyPadding::batched(real.view());
    /// # let _ = padding;
    /// ```
    pub fn batched(real_keys: ArrayView2<'a, bool>) -> Self {
        let given = GivenShape::of(real_keys.shape());
        KeyPadding(Broadcast { view: real_keys.insert_axis(Axis(1)).insert_axis(Axis(1)), given })
    }
}

/// An additive term added to the scaled scores (relative-position biases). `-inf` hides the pair,
/// exactly like a mask; NaN and `+inf` are errors.
#[derive(Debug, Clone)]
pub struct AdditiveBias<'a, T>(Broadcast<'a, T>);

impl<'a, T: Real> AdditiveBias<'a, T> {
    /// Wraps a `[n_queries, n_keys]` view of terms added after scaling, shared by every batch
    /// element and head.
    ///
    /// ```
    /// let bias = ndarray::array![[0.0_f32, -1.0], [f32::NEG_INFINITY, 0.0]];
    /// let options = qkv::AttentionOptions::new().bias(qkv::AdditiveBias::new(bias.view()));
    /// # let _ = options;
    /// ```
    pub fn new(bias: ArrayView2<'a, T>) -> Self {
        let given = GivenShape::of(bias.shape());
        AdditiveBias(Broadcast { view: bias.insert_axis(Axis(0)).insert_axis(Axis(0)), given })
    }

    /// Wraps a `[batch, heads, n_queries, n_keys]` view; `batch` or `heads` may be 1 to share a
    /// slice, as in [`KeepMask::batched`].
    ///
    /// ```
    /// let bias = ndarray::Array4::<f32>::zeros((1, 8, 4, 4)); // one slice per head
    /// let bias = qkv::AdditiveBias::batched(bias.view());
    /// # let _ = bias;
    /// ```
    pub fn batched(bias: ArrayView4<'a, T>) -> Self {
        AdditiveBias(Broadcast { given: GivenShape::of(bias.shape()), view: bias })
    }
}

/// Sliding-window (local) attention: the query at key position `p` (placed by `align`, as the
/// causal mask places it) sees keys `p - before ..= p + after`.
///
/// This is flash-attn's `window_size = (before, after)`; `after = 0` is a causal sliding window
/// (Mistral's, with `before = window - 1`). A side of [`SlidingWindow::UNBOUNDED`] (flash-attn's
/// `-1`), or of any size at least the number of keys, has no limit: the window's ends saturate,
/// never wrap. Tiles of keys wholly outside every window of a block of queries are skipped, never
/// computed.
///
/// ```
/// use qkv::SlidingWindow;
/// // Each query sees itself and the two keys before it.
/// let window = SlidingWindow::new(2, 0);
/// let options = qkv::AttentionOptions::<f32>::new().sliding_window(window);
/// // Each query sees the two keys before it and every key after it.
/// let forward = SlidingWindow::new(2, SlidingWindow::UNBOUNDED);
/// # let _ = (options, forward);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlidingWindow {
    /// How many keys before the query's position it sees.
    pub before: usize,
    /// How many keys after the query's position it sees.
    pub after: usize,
    /// Where the queries stand among the keys.
    pub align: CausalMask,
}

impl SlidingWindow {
    /// A side with no limit: every key on that side of the query is in the window.
    pub const UNBOUNDED: usize = usize::MAX;

    /// A window of `before` keys back and `after` keys forward, bottom-right aligned.
    pub fn new(before: usize, after: usize) -> Self {
        SlidingWindow { before, after, align: CausalMask::BottomRight }
    }

    /// The same window with the queries placed by `align`.
    pub fn aligned(self, align: CausalMask) -> Self {
        SlidingWindow { align, ..self }
    }

    /// Keys visible from key position `p`, before clamping to the keys there are. A side too
    /// large for `isize` saturates: a side of 2^63 or more cast to `isize` would turn negative
    /// and hide every key.
    fn around(&self, p: isize) -> Range<isize> {
        let side = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        p.saturating_sub(side(self.before))..p.saturating_add(side(self.after)).saturating_add(1)
    }
}

/// ALiBi (Press et al., "Train short, test long"): query head `h` adds `slopes[h] · (j - p)` to the
/// score of key `j`, where `p` is the query's key position (placed by `align`, as the causal mask
/// places it). That is the paper's `m · (j - i)`, a penalty growing with the distance back; keys
/// after the query (without a causal mask) get a positive term. Computed from the indices, never
/// stored as a matrix.
///
/// ```
/// let slopes = qkv::alibi_slopes::<f32>(8);
/// let options = qkv::AttentionOptions::new()
///     .causal(qkv::CausalMask::BottomRight)
///     .alibi(qkv::Alibi::new(&slopes));
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Alibi<'a, T> {
    slopes: &'a [T],
    align: CausalMask,
}

impl<'a, T: Real> Alibi<'a, T> {
    /// One slope per query head (one for single-head [`attention`](crate::attention)), bottom-right
    /// aligned. [`alibi_slopes`] gives the paper's.
    pub fn new(slopes: &'a [T]) -> Self {
        Alibi { slopes, align: CausalMask::BottomRight }
    }

    /// The same slopes with the queries placed by `align`.
    pub fn aligned(self, align: CausalMask) -> Self {
        Alibi { align, ..self }
    }
}

/// The ALiBi paper's slopes for `heads` heads: the geometric sequence `2^(-8/n), 2^(-16/n), …` for
/// `n = heads` a power of two; otherwise those of the power of two below, then every other slope of
/// the power of two above (the paper's code, and BLOOM's).
///
/// ```
/// assert_eq!(qkv::alibi_slopes::<f64>(4), vec![0.25, 0.0625, 0.015625, 0.00390625]);
/// assert_eq!(qkv::alibi_slopes::<f64>(3).len(), 3);
/// ```
pub fn alibi_slopes<T: Real>(heads: usize) -> Vec<T> {
    let geometric = |n: usize| -> Vec<f64> {
        let start = 2f64.powf(-8.0 / n as f64);
        (1..=n).map(|i| start.powi(i as i32)).collect()
    };
    if heads == 0 {
        return Vec::new();
    }
    let below = 1 << heads.ilog2();
    let mut slopes = geometric(below);
    slopes.extend(geometric(2 * below).into_iter().step_by(2).take(heads - below));
    slopes.into_iter().map(T::from_f64_round).collect()
}

/// How to run attention: the scale and any masks. All masks combine: a pair is kept only if
/// every mask keeps it.
///
/// A query whose keys are all hidden gets all-zero weights and a zero output (never NaN): it has
/// nothing to attend to, and zero is what a sum over no values is. Its logsumexp is `-inf`.
///
/// A key that no query sees (hidden from every query by the boolean masks, key lengths, the
/// causal mask or window, or a `-inf` bias) is never used, so its key and value rows may hold
/// anything, NaN included: inference caches keep garbage in their padding. A non-finite element in
/// a key or value that some query sees is an error naming it.
///
/// ```
/// use qkv::{AttentionOptions, CausalMask, SlidingWindow};
/// let options = AttentionOptions::<f32>::new().causal(CausalMask::BottomRight).sliding_window(SlidingWindow::new(4, 0));
/// # let _ = options;
/// ```
#[derive(Debug, Clone)]
pub struct AttentionOptions<'a, T> {
    scale: Option<T>,
    causal: Option<CausalMask>,
    window: Option<SlidingWindow>,
    keep: Option<KeepMask<'a>>,
    padding: Option<KeyPadding<'a>>,
    key_lengths: Option<&'a [usize]>,
    bias: Option<AdditiveBias<'a, T>>,
    alibi: Option<Alibi<'a, T>>,
    softcap: Option<T>,
    simd: Option<SimdLevel>,
}

impl<T> Default for AttentionOptions<'_, T> {
    fn default() -> Self {
        AttentionOptions {
            scale: None,
            causal: None,
            window: None,
            keep: None,
            padding: None,
            key_lengths: None,
            bias: None,
            alibi: None,
            softcap: None,
            simd: None,
        }
    }
}

impl<'a, T: Real> AttentionOptions<'a, T> {
    /// No masks, scale `1 / sqrt(d_k)`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Multiplies raw dot products by `scale` instead of `1 / sqrt(d_k)`.
    pub fn scale(mut self, scale: T) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Hides keys after each query, aligned as [`CausalMask`] describes.
    pub fn causal(mut self, mask: CausalMask) -> Self {
        self.causal = Some(mask);
        self
    }

    /// Lets each query see only the keys in its window.
    pub fn sliding_window(mut self, window: SlidingWindow) -> Self {
        self.window = Some(window);
        self
    }

    /// Keeps only the (query, key) pairs that `mask` marks `true`.
    pub fn keep_mask(mut self, mask: KeepMask<'a>) -> Self {
        self.keep = Some(mask);
        self
    }

    /// Hides padding keys from every query.
    pub fn key_padding(mut self, padding: KeyPadding<'a>) -> Self {
        self.padding = Some(padding);
        self
    }

    /// Sequence `b` of the batch has `lengths[b]` real keys, the first ones: keys from
    /// `lengths[b]` on are hidden from its queries and never read. One length per batch element
    /// (one for single-head [`attention`](crate::attention)). The same as a key padding of
    /// `j < lengths[b]`; masks and alignments still count every key of the tensor.
    ///
    /// ```
    /// let lengths = [5, 3]; // a padded batch of two sequences
    /// let options = qkv::AttentionOptions::<f32>::new().key_lengths(&lengths);
    /// # let _ = options;
    /// ```
    pub fn key_lengths(mut self, lengths: &'a [usize]) -> Self {
        self.key_lengths = Some(lengths);
        self
    }

    /// Adds `bias` to the scaled scores.
    pub fn bias(mut self, bias: AdditiveBias<'a, T>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Adds ALiBi's linear distance penalty to the scaled scores (see [`Alibi`]).
    pub fn alibi(mut self, alibi: Alibi<'a, T>) -> Self {
        self.alibi = Some(alibi);
        self
    }

    /// Caps the scaled scores smoothly at `±cap` (logit soft-capping, Gemma 2): each score `s`
    /// becomes `cap · tanh(s / cap)` before any bias or ALiBi term is added and before masking,
    /// the order of Gemma 2's reference code (`softcap(Q·Kᵀ · scale) + mask`). `cap` must be
    /// finite and positive ([`AttentionError::InvalidSoftcap`]). The backward differentiates
    /// through it (`1 - tanh²(s / cap)`).
    ///
    /// ```
    /// let q = ndarray::array![[100.0_f64]];
    /// let k = ndarray::array![[1.0], [0.0]];
    /// let v = ndarray::array![[1.0], [0.0]];
    /// let options = qkv::AttentionOptions::new().scale(1.0).logit_softcap(1.0);
    /// let out = qkv::attention(q.view(), k.view(), v.view(), &options)?;
    /// // Scores 100 and 0 become tanh(100) ≈ 1 and 0: weights e/(e+1), not almost 1.
    /// let e = 1f64.exp();
    /// assert!((out[[0, 0]] - e / (e + 1.0)).abs() < 1e-12);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn logit_softcap(mut self, cap: T) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Runs the fast path's kernels at `level` instead of the dispatched one ([`SimdLevel::dispatched`]):
    /// for tests that cover every level, and for reproducing another machine's rounding. A level
    /// this CPU does not run makes the call fail with [`AttentionError::UnsupportedSimdLevel`].
    pub fn simd(mut self, level: SimdLevel) -> Self {
        self.simd = Some(level);
        self
    }

    /// The SIMD level asked for with [`Self::simd`], if any.
    pub(crate) fn simd_level(&self) -> Option<SimdLevel> {
        self.simd
    }

    /// Checks every mask against the scores of one head and resolves the scale.
    pub(crate) fn resolve(&self, shape: &Shape) -> Result<MaskSet<'a, T>, AttentionError> {
        Ok(self.resolve_heads(shape, None)?.head(0, 0))
    }

    /// Checks every mask against the scores of `heads = (batch, query heads)` heads of one shape
    /// (`None` for a single-head call, whose errors then name `[n_q, n_k]` scores).
    pub(crate) fn resolve_heads(
        &self,
        shape: &Shape,
        heads: Option<(usize, usize)>,
    ) -> Result<HeadMasks<'_, 'a, T>, AttentionError> {
        let layout = ScoreLayout { shape: *shape, heads };
        let (batch, n_heads) = heads.unwrap_or((1, 1));
        if let Some(KeepMask(keep)) = &self.keep {
            layout.check_pairs("keep_mask", keep)?;
        }
        if let Some(KeyPadding(padding)) = &self.padding {
            layout.check_padding(padding)?;
        }
        if let Some(lengths) = self.key_lengths {
            if lengths.len() != batch {
                return Err(layout.mismatch("key_lengths", lengths.len(), "one length per sequence", batch));
            }
            if let Some((index, &length)) = lengths.iter().enumerate().find(|(_, l)| **l > shape.n_keys) {
                return Err(AttentionError::KeyLength { index, length, n_keys: shape.n_keys });
            }
        }
        let mut bias_magnitude = 0.0;
        if let Some(AdditiveBias(bias)) = &self.bias {
            layout.check_pairs("bias", bias)?;
            bias_magnitude = bias_magnitude_checked(bias)?;
        }
        if let Some(alibi) = &self.alibi {
            if alibi.slopes.len() != n_heads {
                return Err(layout.mismatch(
                    "alibi slopes",
                    alibi.slopes.len(),
                    "one slope per query head",
                    n_heads,
                ));
            }
            if let Some((i, s)) = alibi.slopes.iter().enumerate().find(|(_, s)| !s.is_finite()) {
                return Err(AttentionError::NonFinite {
                    argument: "alibi slopes",
                    index: Dims(vec![i]),
                    value: s.to_f64_exact(),
                });
            }
            // The distance between a query's position and a key is below n_q + n_k.
            let steepest = alibi.slopes.iter().fold(0.0_f64, |m, s| m.max(s.to_f64_exact().abs()));
            bias_magnitude += steepest * (shape.n_queries + shape.n_keys) as f64;
        }
        let scale = match self.scale {
            Some(s) if !s.is_finite() => {
                return Err(AttentionError::InvalidScale { value: s.to_f64_exact() });
            }
            Some(s) => s.to_f64_exact(),
            None => 1.0 / (shape.key_dim as f64).sqrt(),
        };
        let softcap = match self.softcap {
            Some(cap) if !(cap.is_finite() && cap > T::zero()) => {
                return Err(AttentionError::InvalidSoftcap { value: cap.to_f64_exact() });
            }
            cap => cap.map(T::to_f64_exact),
        };
        Ok(HeadMasks { options: self, shape: *shape, scale, softcap, bias_magnitude })
    }
}

/// The scores a call's masks apply to, for checking their shapes and naming them in errors.
struct ScoreLayout {
    shape: Shape,
    /// `(batch, query heads)` of a multi-head call.
    heads: Option<(usize, usize)>,
}

impl ScoreLayout {
    /// The scores' shape as the caller thinks of it.
    fn scores(&self) -> Dims {
        let (n_q, n_k) = (self.shape.n_queries, self.shape.n_keys);
        match self.heads {
            None => Dims(vec![n_q, n_k]),
            Some((batch, heads)) => Dims(vec![batch, heads, n_q, n_k]),
        }
    }

    /// Checks a `[n_q, n_k]` or `[batch | 1, heads | 1, n_q, n_k]` mask or bias.
    fn check_pairs<E>(&self, argument: &'static str, mask: &Broadcast<'_, E>) -> Result<(), AttentionError> {
        let (n_q, n_k) = (self.shape.n_queries, self.shape.n_keys);
        let (batch, heads) = self.heads.unwrap_or((1, 1));
        let [b, h, q, k] = *mask.view.shape() else { unreachable!("4-D view") };
        if (b == 1 || b == batch) && (h == 1 || h == heads) && q == n_q && k == n_k {
            return Ok(());
        }
        let needs = match self.heads {
            None => format!("n_q = {n_q}, n_k = {n_k}"),
            Some(_) => format!(
                "shared [{n_q}, {n_k}], per sequence [{batch}, 1, {n_q}, {n_k}] or per head \
                 [{batch}, {heads}, {n_q}, {n_k}]"
            ),
        };
        Err(AttentionError::MaskShape { argument, found: mask.given.dims(), scores: self.scores(), needs })
    }

    /// Checks a `[n_k]` or `[batch, n_k]` key padding.
    fn check_padding(&self, padding: &Broadcast<'_, bool>) -> Result<(), AttentionError> {
        let n_k = self.shape.n_keys;
        let (batch, _) = self.heads.unwrap_or((1, 1));
        let [b, _, _, k] = *padding.view.shape() else { unreachable!("4-D view") };
        if (b == 1 || b == batch) && k == n_k {
            return Ok(());
        }
        let needs = match self.heads {
            None => format!("n_k = {n_k}"),
            Some(_) => format!("shared [{n_k}] or per sequence [{batch}, {n_k}]"),
        };
        Err(AttentionError::MaskShape {
            argument: "key_padding",
            found: padding.given.dims(),
            scores: self.scores(),
            needs,
        })
    }

    /// A per-sequence or per-head list of the wrong length.
    fn mismatch(&self, argument: &'static str, len: usize, what: &str, needed: usize) -> AttentionError {
        AttentionError::MaskShape {
            argument,
            found: Dims(vec![len]),
            scores: self.scores(),
            needs: format!("{what}: [{needed}]"),
        }
    }
}

/// The largest finite `|term|` of a bias, or the error naming its first NaN or `+inf` term.
fn bias_magnitude_checked<T: Real>(bias: &Broadcast<'_, T>) -> Result<f64, AttentionError> {
    // One pass finds the largest finite |bias| (the fast path bounds its scores with it) and
    // whether any term is NaN or +inf; only then is the index looked up.
    let view = &bias.view;
    let (bad, largest) = match view.as_slice_memory_order() {
        Some(terms) => scan_bias(terms),
        None => scan_bias(&view.iter().copied().collect::<Vec<_>>()),
    };
    if bad {
        let (index, &b) = view
            .indexed_iter()
            .find(|(_, b)| b.is_nan() || **b == T::infinity())
            .expect("a bad term was seen");
        // Name the term in the shape the caller passed.
        let index = [index.0, index.1, index.2, index.3];
        return Err(AttentionError::NonFinite {
            argument: "bias",
            index: Dims(index[4 - bias.given.rank..].to_vec()),
            value: b.to_f64_exact(),
        });
    }
    Ok(largest.to_f64_exact())
}

/// Whether any bias term is NaN or `+inf`, and the largest finite `|term|`: sixteen independent
/// lanes, so that the pass over `n_q × n_k` terms vectorises.
fn scan_bias<T: Real>(terms: &[T]) -> (bool, T) {
    let scan = |(bad, largest): (bool, T), &b: &T| {
        // NaN and +inf are errors; -inf (a hidden pair) counts as 0.
        let magnitude = if b.is_finite() { b.abs() } else { T::zero() };
        (bad | b.is_nan() | (b == T::infinity()), if magnitude > largest { magnitude } else { largest })
    };
    let mut lanes = [(false, T::zero()); 16];
    let chunks = terms.chunks_exact(16);
    let tail = chunks.remainder().iter().fold((false, T::zero()), scan);
    for chunk in chunks {
        for (lane, b) in lanes.iter_mut().zip(chunk) {
            *lane = scan(*lane, b);
        }
    }
    lanes.iter().fold(tail, |(bad, largest), &(b, l)| (bad | b, if l > largest { l } else { largest }))
}

/// Options checked against the scores of every (batch, query head) of a call: every index inside
/// is in range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadMasks<'o, 'a, T> {
    options: &'o AttentionOptions<'a, T>,
    shape: Shape,
    /// The score multiplier, in f64; paths narrow it to their element type.
    scale: f64,
    /// The logit soft-cap, checked finite and positive.
    softcap: Option<f64>,
    /// The largest finite `|bias|` of any head, ALiBi's included (0 without a bias).
    bias_magnitude: f64,
}

impl<'a, T: Real> HeadMasks<'_, 'a, T> {
    /// The masks of batch element `b`, query head `h`.
    pub(crate) fn head(&self, b: usize, h: usize) -> MaskSet<'a, T> {
        let o = self.options;
        MaskSet {
            shape: self.shape,
            causal: o.causal,
            window: o.window,
            key_length: o.key_lengths.map_or(self.shape.n_keys, |lengths| lengths[b]),
            keep: o.keep.as_ref().map(|KeepMask(m)| m.head(b, h)),
            padding: o.padding.as_ref().map(|KeyPadding(p)| p.head(b, 0).index_axis_move(Axis(0), 0)),
            bias: o.bias.as_ref().map(|AdditiveBias(m)| m.head(b, h)),
            alibi: o.alibi.map(|a| (a.slopes[h].to_f64_exact(), a.align)),
            scale: self.scale,
            softcap: self.softcap,
            bias_magnitude: self.bias_magnitude,
        }
    }

    /// Whether the query heads of one batch element may have different masks, so that heads
    /// sharing a key/value head cannot run as the rows of one problem.
    pub(crate) fn vary_by_head(&self) -> bool {
        let o = self.options;
        o.alibi.is_some()
            || o.keep.as_ref().is_some_and(|KeepMask(m)| m.varies_by_head())
            || o.bias.as_ref().is_some_and(|AdditiveBias(m)| m.varies_by_head())
    }
}

/// The masks of one (batch element, query head), checked against its [`Shape`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct MaskSet<'a, T> {
    shape: Shape,
    causal: Option<CausalMask>,
    window: Option<SlidingWindow>,
    /// Keys from here on are hidden (`n_keys` without key lengths).
    key_length: usize,
    keep: Option<View<'a, bool, Ix2>>,
    padding: Option<View<'a, bool, Ix1>>,
    bias: Option<View<'a, T, Ix2>>,
    /// This head's ALiBi slope, and where its queries stand.
    alibi: Option<(f64, CausalMask)>,
    /// The logit soft-cap: scores become `cap · tanh(s / cap)` before anything is added or hidden.
    softcap: Option<f64>,
    /// The score multiplier, in f64; paths narrow it to their element type.
    pub(crate) scale: f64,
    /// The largest finite `|bias|` (0 without a bias), for bounding the scores.
    pub(crate) bias_magnitude: f64,
}

impl<T: Real> MaskSet<'_, T> {
    /// Whether only the scale applies (no mask, no bias), so a path may skip [`Self::apply_row`].
    pub(crate) fn is_unmasked(&self) -> bool {
        !self.has_elementwise_masks()
            && self.causal.is_none()
            && self.window.is_none()
            && self.key_length == self.shape.n_keys
    }

    /// Whether a causal mask applies (block costs then grow along the queries).
    pub(crate) fn is_causal(&self) -> bool {
        self.causal.is_some()
    }

    /// Whether a mask or term that is not a range of keys per query (keep-mask, padding, bias,
    /// ALiBi, soft-capping) applies, so that a tile inside the visible range still needs
    /// [`Self::apply_row`].
    pub(crate) fn has_elementwise_masks(&self) -> bool {
        self.keep.is_some()
            || self.padding.is_some()
            || self.bias.is_some()
            || self.alibi.is_some()
            || self.softcap.is_some()
    }

    /// The derivative of the soft-cap at each of the scaled scores `raw` (before the cap), in
    /// place: `d(cap · tanh(s / cap)) / ds = 1 - tanh²(s / cap)`; 1 without a cap. The backward
    /// multiplies the scores' gradient by it before it reaches `Q` and `K` (a bias, added after
    /// the cap, takes the gradient unchanged).
    pub(crate) fn softcap_derivative<U: Real>(&self, raw: &mut [U]) {
        match self.softcap {
            Some(cap) => {
                let cap = U::from_f64_round(cap);
                raw.iter_mut().for_each(|s| {
                    let t = (*s / cap).tanh();
                    *s = U::one() - t * t;
                });
            }
            None => raw.fill(U::one()),
        }
    }

    /// Whether the scores are soft-capped, so the backward needs [`Self::softcap_derivative`].
    pub(crate) fn is_softcapped(&self) -> bool {
        self.softcap.is_some()
    }

    /// Keys that the causal mask, the window and the key length leave visible to query
    /// `query_idx` (all keys without them): a range whose ends never decrease as `query_idx`
    /// grows. Other masks may hide more inside it.
    pub(crate) fn visible_keys(&self, query_idx: usize) -> Range<usize> {
        let mut visible = 0..self.key_length as isize;
        if let Some(causal) = self.causal {
            visible.end = visible.end.min(causal.position(query_idx, &self.shape) + 1);
        }
        if let Some(window) = self.window {
            let around = window.around(window.align.position(query_idx, &self.shape));
            visible = visible.start.max(around.start)..visible.end.min(around.end);
        }
        let n_keys = self.shape.n_keys as isize;
        let end = visible.end.clamp(0, n_keys) as usize;
        (visible.start.clamp(0, n_keys) as usize).min(end)..end
    }

    /// Applies the soft-cap, every mask and the bias to query `query_idx`'s scaled scores over
    /// keys `keys.start..keys.end` (`row[j]` belongs to key `keys.start + j`, every score finite):
    /// caps the scores, adds the bias and writes `-inf` where a pair is hidden. Returns whether
    /// any key in the row stays visible.
    pub(crate) fn apply_row<U: Real>(&self, query_idx: usize, keys: Range<usize>, row: &mut [U]) -> bool {
        debug_assert_eq!(row.len(), keys.len());
        // The cap comes first, on the scaled scores alone (Gemma 2 caps `Q·Kᵀ · scale`, then adds
        // its mask): a bias or ALiBi term added after it is not capped, and capping a hidden
        // pair's `-inf` would make it visible (`cap · tanh(-inf) = -cap`).
        if let Some(cap) = self.softcap {
            let cap = U::from_f64_round(cap);
            row.iter_mut().for_each(|s| *s = cap * (*s / cap).tanh());
        }
        // Each mask in turn over the whole segment (a pass per mask runs far faster than checking
        // every mask per pair). A hidden pair ends at -inf whichever mask hides it; adding a
        // finite bias term to -inf leaves it there.
        let visible = self.visible_keys(query_idx);
        let (lo, hi) = (visible.start.clamp(keys.start, keys.end), visible.end.clamp(keys.start, keys.end));
        row[..lo - keys.start].fill(U::neg_infinity());
        row[hi - keys.start..].fill(U::neg_infinity());
        let hide_where_false = |row: &mut [U], keep: ArrayView1<bool>| match keep.as_slice() {
            Some(keep) => {
                row.iter_mut().zip(keep).filter(|(_, k)| !**k).for_each(|(s, _)| *s = U::neg_infinity())
            }
            None => row.iter_mut().zip(keep).filter(|(_, k)| !**k).for_each(|(s, _)| *s = U::neg_infinity()),
        };
        if let Some(m) = &self.keep {
            hide_where_false(row, m.slice(ndarray::s![query_idx, keys.clone()]));
        }
        if let Some(p) = &self.padding {
            hide_where_false(row, p.slice(ndarray::s![keys.clone()]));
        }
        if let Some(b) = &self.bias {
            let add = |(s, &b): (&mut U, &T)| {
                *s = if b == T::neg_infinity() {
                    U::neg_infinity()
                } else {
                    *s + U::from_f64_round(b.to_f64_exact())
                };
            };
            let terms = b.slice(ndarray::s![query_idx, keys.clone()]);
            match terms.as_slice() {
                Some(terms) => row.iter_mut().zip(terms).for_each(add),
                None => row.iter_mut().zip(terms).for_each(add),
            }
        }
        if let Some((slope, align)) = self.alibi {
            // slope · (j - p), in f64 and rounded once, as a bias matrix would hold it.
            let p = align.position(query_idx, &self.shape) as f64;
            for (j, s) in keys.clone().zip(row.iter_mut()) {
                *s = *s + U::from_f64_round(slope * (j as f64 - p));
            }
        }
        row.iter().any(|s| *s != U::neg_infinity())
    }

    /// Whether each key is seen by at least one query: a key no query sees is never used, so its
    /// key and value rows may hold anything.
    pub(crate) fn seen_keys(&self) -> Vec<bool> {
        let n_keys = self.shape.n_keys;
        let mut seen = vec![false; n_keys];
        let mut row = vec![0.0_f64; n_keys];
        for i in 0..self.shape.n_queries {
            row.fill(0.0);
            self.apply_row(i, 0..n_keys, &mut row);
            for (seen, s) in seen.iter_mut().zip(&row) {
                *seen |= *s != f64::NEG_INFINITY;
            }
        }
        seen
    }
}

impl<T> AttentionOptions<'_, T> {
    /// Whether an additive bias is set, whose gradient the backward then returns.
    pub(crate) fn has_bias(&self) -> bool {
        self.bias.is_some()
    }
}
