//! How to run attention ([`AttentionOptions`]): the scale, the masks, soft-capping and the SIMD
//! level, declared once for every path: dense calls, the backward, and the KV caches' steps
//! ([`CacheOptions`] is the same type, in f32).

use crate::element::Real;
use crate::level::SimdLevel;
use crate::mask::{AdditiveBias, Alibi, CausalMask, KeepMask, KeyPadding, SlidingWindow};

/// How to run attention: the scale and any masks. All masks combine: a pair is kept only if
/// every mask keeps it.
///
/// A query whose keys are all hidden gets all-zero weights and a zero output (never NaN): it has
/// nothing to attend to, and zero is what a sum over no values is. Its logsumexp is `-inf` (with
/// an attention sink, [`Self::sinks`], the sink's logit).
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
    pub(crate) scale: Option<T>,
    pub(crate) causal: Option<CausalMask>,
    pub(crate) window: Option<SlidingWindow>,
    pub(crate) keep: Option<KeepMask<'a>>,
    pub(crate) padding: Option<KeyPadding<'a>>,
    pub(crate) key_lengths: Option<&'a [usize]>,
    pub(crate) bias: Option<AdditiveBias<'a, T>>,
    pub(crate) alibi: Option<Alibi<'a, T>>,
    pub(crate) softcap: Option<T>,
    /// One attention-sink logit per query head.
    pub(crate) sinks: Option<&'a [T]>,
    pub(crate) simd: Option<SimdLevel>,
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
            sinks: None,
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

    /// Keeps only the (query, key) pairs that `mask` marks `true`: a [`KeepMask`], or a plain
    /// `[n_q, n_k]` boolean view shared by every batch element and head.
    pub fn keep_mask(mut self, mask: impl Into<KeepMask<'a>>) -> Self {
        self.keep = Some(mask.into());
        self
    }

    /// Hides padding keys from every query.
    pub fn key_padding(mut self, padding: KeyPadding<'a>) -> Self {
        self.padding = Some(padding);
        self
    }

    /// Sequence `b` of the batch has `lengths[b]` real keys, the first ones: keys from
    /// `lengths[b]` on are hidden from its queries and never read. One length per batch element
    /// (one for single-head [`attention`](fn@crate::attention)). The same as a key padding of
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

    /// Adds ALiBi's linear distance penalty to the scaled scores: an [`Alibi`], or the slopes
    /// alone (one per query head, bottom-right aligned).
    pub fn alibi(mut self, alibi: impl Into<Alibi<'a, T>>) -> Self {
        self.alibi = Some(alibi.into());
        self
    }

    /// Caps the scaled scores smoothly at `±cap` (logit soft-capping, Gemma 2): each score `s`
    /// becomes `cap · tanh(s / cap)` before any bias or ALiBi term is added and before masking,
    /// the order of Gemma 2's reference code (`softcap(Q·Kᵀ · scale) + mask`). `cap` must be
    /// finite and positive ([`AttentionError::InvalidSoftcap`](crate::AttentionError::InvalidSoftcap)). The backward differentiates
    /// through it (`1 - tanh²(s / cap)`).
    ///
    /// ```
    /// let q = qkv::ndarray::array![[100.0_f64]];
    /// let k = qkv::ndarray::array![[1.0], [0.0]];
    /// let v = qkv::ndarray::array![[1.0], [0.0]];
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

    /// Attention sinks (gpt-oss; StreamingLLM's learned form): one logit `s_h` per query head (one
    /// for single-head [`attention`](fn@crate::attention)) that joins every row's softmax as one more
    /// key with no value. Row `i`'s weights become `exp(S_ij) / (exp(s_h) + Σ_k exp(S_ik))`, so they
    /// sum to less than one and the output is `Σ_j P_ij · v_j`; its logsumexp is
    /// `ln(exp(s_h) + Σ_k exp(S_ik))`. A row that sees no key has output 0 (the sink takes every
    /// weight) and logsumexp `s_h`. The sink counts once per row whatever the path: key splits,
    /// a ring cache's two runs and paged blocks are merged first, and the sink joins the merged
    /// row once, where it is finished.
    ///
    /// Each logit is finite or `-inf` (no sink for that head: the same bits as without the option);
    /// NaN or `+inf` is [`AttentionError::NonFinite`](crate::AttentionError::NonFinite), a length
    /// other than the number of query heads [`AttentionError::MaskShape`](crate::AttentionError::MaskShape).
    /// The backward returns their gradient ([`Gradients::dsinks`](crate::Gradients::dsinks)).
    ///
    /// [`PartialAttention::merge`](crate::PartialAttention::merge) adds parts up, and a part's
    /// logsumexp includes its sink: when the keys are split into parts, pass the sinks to the
    /// call of one part only (a part that sees no key then carries the sink alone: output 0,
    /// logsumexp `s_h`).
    ///
    /// ```
    /// let q = qkv::ndarray::array![[0.0_f64]];
    /// let kv = qkv::ndarray::array![[1.0], [1.0]];
    /// let options = qkv::AttentionOptions::new().sinks(&[0.0]);
    /// let r = qkv::attention_with_lse(q.view(), kv.view(), kv.view(), &options)?;
    /// // Two keys with score 0 and a sink of 0: each key weighs 1/3.
    /// assert!((r.output[[0, 0]] - 2.0 / 3.0).abs() < 1e-12);
    /// assert!((r.logsumexp[0] - 3f64.ln()).abs() < 1e-12);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn sinks(mut self, sinks: &'a [T]) -> Self {
        self.sinks = Some(sinks);
        self
    }

    /// Runs the fast path's kernels at `level` instead of the dispatched one ([`SimdLevel::dispatched`]):
    /// for tests that cover every level, and for reproducing another machine's rounding. A level
    /// this CPU does not run makes the call fail with [`AttentionError::UnsupportedSimdLevel`](crate::AttentionError::UnsupportedSimdLevel).
    pub fn simd(mut self, level: SimdLevel) -> Self {
        self.simd = Some(level);
        self
    }

    /// The SIMD level asked for with [`Self::simd`], if any.
    pub(crate) fn simd_level(&self) -> Option<SimdLevel> {
        self.simd
    }
}

impl<T> AttentionOptions<'_, T> {
    /// Whether an additive bias is set, whose gradient the backward then returns.
    pub(crate) fn has_bias(&self) -> bool {
        self.bias.is_some()
    }
}

/// How to attend over a KV cache ([`CacheLayer::attend_with`](crate::CacheLayer::attend_with),
/// [`PagedLayer::attend_with`](crate::PagedLayer::attend_with)): [`AttentionOptions`] in f32,
/// the one declaration of every option. A cache step is causal, its queries the last positions
/// held (aligned bottom-right), and its key lengths are what each sequence holds; of the options
/// it takes a scale, a sliding window, ALiBi, logit soft-capping, attention sinks (one per query
/// head) and a keep mask (`[n_q, held]`:
/// the new queries over every position held, oldest first, their own included). A causal mask
/// other than bottom-right, key padding, key lengths, a bias or a SIMD level other than the
/// cache's own are the cache's to decide, and asking for them is an error
/// ([`AttentionError::CacheOption`]).
///
/// The result equals [`multi_head_attention`](crate::multi_head_attention) over the positions
/// held with [`AttentionOptions::dense`]'s options, within rounding.
///
/// [`AttentionError::CacheOption`]: crate::AttentionError::CacheOption
///
/// ```
/// use qkv::{CacheOptions, SlidingWindow};
/// let slopes = qkv::alibi_slopes::<f32>(8);
/// // Gemma 2's local layers: a window of 4096 positions, scores capped at 50.
/// let options = CacheOptions::new()
///     .sliding_window(SlidingWindow::new(4095, 0))
///     .logit_softcap(50.0)
///     .alibi(&slopes);
/// # let _ = options;
/// ```
pub type CacheOptions<'a> = AttentionOptions<'a, f32>;

impl<T: Real> AttentionOptions<'_, T> {
    /// These options as a dense call computes a cache step with them: with the bottom-right
    /// causal mask every cache step has, for comparing a cache's step with
    /// [`multi_head_attention`](crate::multi_head_attention) over the positions it holds.
    ///
    /// ```
    /// let options = qkv::CacheOptions::new().logit_softcap(30.0).dense();
    /// # let _: qkv::AttentionOptions<f32> = options;
    /// ```
    pub fn dense(&self) -> Self {
        self.clone().causal(CausalMask::BottomRight)
    }
}
