//! The masks a caller can ask for: which keys each query may see ([`CausalMask`],
//! [`SlidingWindow`], [`KeepMask`], [`KeyPadding`]) and extra score terms ([`AdditiveBias`],
//! [`Alibi`]). They are applied in `masking.rs`.

use std::ops::Range;

use ndarray::{ArrayBase, ArrayView1, ArrayView2, ArrayView4, Axis, Ix2, Ix4, ViewRepr};

use crate::element::Real;

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
/// let k = qkv::ndarray::Array2::<f64>::zeros((4, 1));
/// let q = qkv::ndarray::Array2::<f64>::zeros((2, 1));
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

/// `ArrayView<'a, E, D>` spelled with its element type: ndarray's alias leaves the element type
/// to a projection, which makes every struct holding one invariant in `'a`, and then a mask set
/// could not be passed along with views of shorter lifetimes.
pub(crate) type View<'a, E, D> = ArrayBase<ViewRepr<&'a E>, D, E>;

/// A mask or bias over the scores of every (batch, head), kept as a 4-D view whatever shape it
/// was given in: a shared `[n_q, n_k]` is `[1, 1, n_q, n_k]`, a key padding `[batch, n_k]` is
/// `[batch, 1, 1, n_k]`. An axis of length 1 applies to every batch element or head.
#[derive(Debug, Clone)]
pub(crate) struct Broadcast<'a, E> {
    pub(crate) view: View<'a, E, Ix4>,
    /// The shape the caller passed, for messages.
    pub(crate) given: GivenShape,
}

/// The shape of a view as the caller passed it (at most 4 axes), kept inline: a cache step wraps
/// its keep mask on every call, and a `Dims` would allocate each time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GivenShape {
    pub(crate) axes: [usize; 4],
    pub(crate) rank: usize,
}

impl GivenShape {
    pub(crate) fn of(shape: &[usize]) -> GivenShape {
        let mut axes = [0; 4];
        axes[..shape.len()].copy_from_slice(shape);
        GivenShape { axes, rank: shape.len() }
    }
}

impl<'a, E> Broadcast<'a, E> {
    /// The `[n_q, n_k]` (or `[1, n_k]`) slice that batch element `b`, head `h` takes.
    pub(crate) fn head(&self, b: usize, h: usize) -> ArrayView2<'a, E> {
        let [batches, heads, _, _] = *self.view.shape() else { unreachable!("4-D view") };
        let pick = |i: usize, len: usize| if len == 1 { 0 } else { i };
        self.view.index_axis_move(Axis(0), pick(b, batches)).index_axis_move(Axis(0), pick(h, heads))
    }

    /// Whether heads of one batch element may take different slices.
    pub(crate) fn varies_by_head(&self) -> bool {
        self.view.shape()[1] > 1
    }
}

/// A boolean mask over (query, key) pairs: `true` where the query may attend to the key.
#[derive(Debug, Clone)]
pub struct KeepMask<'a>(pub(crate) Broadcast<'a, bool>);

impl<'a> From<ArrayView2<'a, bool>> for KeepMask<'a> {
    /// [`KeepMask::new`]: one `[n_q, n_k]` mask shared by every batch element and head.
    fn from(keep: ArrayView2<'a, bool>) -> Self {
        KeepMask::new(keep)
    }
}

impl<'a> KeepMask<'a> {
    /// Wraps a `[n_queries, n_keys]` view, shared by every batch element and head; `true` keeps a
    /// (query, key) pair.
    ///
    /// ```
    /// let keep = qkv::ndarray::array![[true, false], [true, true]];
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
    /// let keep = qkv::ndarray::Array4::from_elem((2, 1, 3, 5), true);
    /// let mask = qkv::KeepMask::batched(keep.view());
    /// # let _ = mask;
    /// ```
    pub fn batched(keep: ArrayView4<'a, bool>) -> Self {
        KeepMask(Broadcast { given: GivenShape::of(keep.shape()), view: keep })
    }
}

/// A boolean mask over keys: `false` marks padding that no query may see.
#[derive(Debug, Clone)]
pub struct KeyPadding<'a>(pub(crate) Broadcast<'a, bool>);

impl<'a> KeyPadding<'a> {
    /// Wraps a `[n_keys]` view shared by every sequence; `true` marks a real key, `false` padding.
    ///
    /// ```
    /// let real = qkv::ndarray::array![true, true, false];
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
    /// let real = qkv::ndarray::array![[true, true, true], [true, true, false]];
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
pub struct AdditiveBias<'a, T>(pub(crate) Broadcast<'a, T>);

impl<'a, T: Real> AdditiveBias<'a, T> {
    /// Wraps a `[n_queries, n_keys]` view of terms added after scaling, shared by every batch
    /// element and head.
    ///
    /// ```
    /// let bias = qkv::ndarray::array![[0.0_f32, -1.0], [f32::NEG_INFINITY, 0.0]];
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
    /// let bias = qkv::ndarray::Array4::<f32>::zeros((1, 8, 4, 4)); // one slice per head
    /// let bias = qkv::AdditiveBias::batched(bias.view());
    /// # let _ = bias;
    /// ```
    pub fn batched(bias: ArrayView4<'a, T>) -> Self {
        AdditiveBias(Broadcast { given: GivenShape::of(bias.shape()), view: bias })
    }
}

/// Sliding-window (local) attention: the query at key position `p` (placed by `align`, as the
/// causal mask places it) sees keys `p - before ..= p + after`. Beside a causal mask the window
/// takes the mask's alignment (an error otherwise): [`SlidingWindow::new`] is bottom-right, so
/// a top-left causal mask (PyTorch's `is_causal`) needs `.aligned(CausalMask::TopLeft)`.
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

/// As it is written: `SlidingWindow::new(4, 0)`, with `.aligned(CausalMask::TopLeft)` when it
/// is top-left aligned.
impl std::fmt::Display for SlidingWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |n: usize| {
            if n == Self::UNBOUNDED { "SlidingWindow::UNBOUNDED".to_string() } else { n.to_string() }
        };
        write!(f, "SlidingWindow::new({}, {})", side(self.before), side(self.after))?;
        match self.align {
            CausalMask::BottomRight => Ok(()),
            CausalMask::TopLeft => f.write_str(".aligned(CausalMask::TopLeft)"),
        }
    }
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
    pub(crate) fn around(&self, p: isize) -> Range<isize> {
        let side = |n: usize| isize::try_from(n).unwrap_or(isize::MAX);
        p.saturating_sub(side(self.before))..p.saturating_add(side(self.after)).saturating_add(1)
    }
}

/// ALiBi (Press et al., "Train short, test long"): query head `h` adds `slopes[h] · (j - p)` to the
/// score of key `j`, where `p` is the query's key position (placed by `align`, as the causal mask
/// places it). That is the paper's `m · (j - i)`, a penalty growing with the distance back; keys
/// after the query (without a causal mask) get a positive term. [`Alibi::symmetric`] is
/// flash-attn's non-causal form instead, `-slopes[h] · |j - p|`, a penalty growing with the
/// distance either way. Computed from the indices, never stored as a matrix.
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
    /// `[1 | batch, heads]`: one slope per query head, shared by the batch or per sequence.
    pub(crate) slopes: View<'a, T, Ix2>,
    /// The shape the caller passed, for messages.
    pub(crate) given: GivenShape,
    pub(crate) align: CausalMask,
    pub(crate) symmetric: bool,
}

impl<'a, T> From<&'a [T]> for Alibi<'a, T> {
    /// [`Alibi::new`]: the slopes, bottom-right aligned.
    fn from(slopes: &'a [T]) -> Self {
        let given = GivenShape::of(&[slopes.len()]);
        let slopes = ArrayView1::from(slopes).insert_axis(Axis(0));
        Alibi { slopes, given, align: CausalMask::BottomRight, symmetric: false }
    }
}

impl<'a, T> From<&'a Vec<T>> for Alibi<'a, T> {
    fn from(slopes: &'a Vec<T>) -> Self {
        Alibi::from(slopes.as_slice())
    }
}

impl<'a, T, const N: usize> From<&'a [T; N]> for Alibi<'a, T> {
    fn from(slopes: &'a [T; N]) -> Self {
        Alibi::from(slopes.as_slice())
    }
}

impl<'a, T: Real> Alibi<'a, T> {
    /// One slope per query head (one for single-head [`attention`](fn@crate::attention)), bottom-right
    /// aligned. [`alibi_slopes`] gives the paper's.
    pub fn new(slopes: &'a [T]) -> Self {
        Alibi::from(slopes)
    }

    /// One slope per (sequence, query head) of a multi-head call: `slopes` is `[batch, heads]`
    /// (flash-attn's `alibi_slopes` of shape `(batch, nheads)`), bottom-right aligned.
    ///
    /// ```
    /// let slopes = qkv::ndarray::array![[0.5_f32, 0.25], [0.125, 0.0625]]; // 2 sequences, 2 heads
    /// let options = qkv::AttentionOptions::new().alibi(qkv::Alibi::batched(slopes.view()));
    /// # let _ = options;
    /// ```
    pub fn batched(slopes: ArrayView2<'a, T>) -> Self {
        let given = GivenShape::of(slopes.shape());
        Alibi { slopes, given, align: CausalMask::BottomRight, symmetric: false }
    }

    /// The same slopes with the queries placed by `align`.
    pub fn aligned(self, align: CausalMask) -> Self {
        Alibi { align, ..self }
    }

    /// The same slopes as flash-attn applies them without a causal mask: `-slope · |j - p|`,
    /// hiding nothing, penalising keys after the query as much as keys before it. Under a causal
    /// mask (every visible key at or before `p`) both forms are the same.
    ///
    /// ```
    /// let q = qkv::ndarray::array![[0.0_f64]];
    /// let kv = qkv::ndarray::array![[0.0], [0.0], [1.0]];
    /// // One query at position 2 (bottom-right) over keys 0, 1, 2: terms -1, -0.5, 0.
    /// let slopes = [0.5];
    /// let options = qkv::AttentionOptions::new().alibi(qkv::Alibi::new(&slopes).symmetric());
    /// let r = qkv::attention_with_weights(q.view(), kv.view(), kv.view(), &options)?;
    /// let e = |x: f64| x.exp();
    /// assert!((r.weights[[0, 0]] - e(-1.0) / (e(-1.0) + e(-0.5) + 1.0)).abs() < 1e-12);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn symmetric(self) -> Self {
        Alibi { symmetric: true, ..self }
    }
}

impl<'a, T> Alibi<'a, T> {
    /// The slopes of sequence `b` alone (`[1, heads]`), for a call over that sequence by itself.
    pub(crate) fn of_sequence(&self, b: usize) -> Alibi<'a, T> {
        let row = if self.slopes.nrows() == 1 { 0 } else { b };
        let slopes = self.slopes.slice_move(ndarray::s![row..row + 1, ..]);
        Alibi {
            slopes,
            given: GivenShape::of(&[slopes.ncols()]),
            align: self.align,
            symmetric: self.symmetric,
        }
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
