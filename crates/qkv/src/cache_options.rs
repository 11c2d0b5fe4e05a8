//! The options of attention over a cache ([`CacheOptions`]): what the dense API's
//! [`AttentionOptions`] offers where the keys are a cache's positions and the queries the last of
//! them. Any cache takes them; each checks them against its own sizes and turns them into the
//! dense options every path runs ([`CacheOptions::dense`]).

use ndarray::ArrayView2;

use crate::error::Dims;
use crate::mask::{Alibi, AttentionOptions, CausalMask, KeepMask, SlidingWindow};

/// How to attend over a cache ([`CacheLayer::attend_with`](crate::CacheLayer::attend_with)): a
/// scale, a sliding window, ALiBi, logit soft-capping and a keep mask, on top of the causal mask
/// every cached step has (the queries are the last positions held, aligned bottom-right). Key
/// lengths are the cache's length. [`CacheOptions::new`] is the plain step of
/// [`CacheLayer::attend`](crate::CacheLayer::attend).
///
/// The result equals [`multi_head_attention`](crate::multi_head_attention) over the positions
/// held with [`Self::dense`]'s options, within rounding.
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
#[derive(Debug, Clone, Default)]
pub struct CacheOptions<'a> {
    scale: Option<f32>,
    window: Option<SlidingWindow>,
    alibi: Option<&'a [f32]>,
    softcap: Option<f32>,
    keep: Option<ArrayView2<'a, bool>>,
}

/// An option whose shape does not fit the call, for the cache to report with its own context.
pub(crate) struct OptionShape {
    pub(crate) argument: &'static str,
    pub(crate) found: Dims,
    pub(crate) expected: String,
    pub(crate) why: &'static str,
}

impl<'a> CacheOptions<'a> {
    /// The causal step alone, scale `1 / sqrt(d_k)`.
    pub fn new() -> Self {
        Self::default()
    }

    /// Multiplies raw dot products by `scale` instead of `1 / sqrt(d_k)` (Gemma 2's
    /// `query_pre_attn_scalar^-0.5`, say).
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// Lets each query see only the positions in its window (Mistral's, Gemma 2's local layers:
    /// `SlidingWindow::new(window - 1, 0)`). The window places the queries by its `align`, as the
    /// dense API does: bottom-right, [`SlidingWindow::new`]'s default, puts them at the end of the
    /// cache, where they are. A side of [`SlidingWindow::UNBOUNDED`] has no limit. A windowed
    /// cache ([`KvCache::with_window`](crate::KvCache::with_window)) applies its own window
    /// without it, and takes no other.
    pub fn sliding_window(mut self, window: SlidingWindow) -> Self {
        self.window = Some(window);
        self
    }

    /// Adds ALiBi's distance penalty, one slope per query head ([`crate::alibi_slopes`] gives
    /// the paper's), queries at the end of the cache. Heads with slopes of their own cannot share
    /// a read of their key/value head, so each query head then reads it on its own.
    pub fn alibi(mut self, slopes: &'a [f32]) -> Self {
        self.alibi = Some(slopes);
        self
    }

    /// Caps the scaled scores at `±cap` smoothly, `cap · tanh(s / cap)`, before ALiBi and the
    /// masks (see [`AttentionOptions::logit_softcap`]).
    pub fn logit_softcap(mut self, cap: f32) -> Self {
        self.softcap = Some(cap);
        self
    }

    /// Keeps only the (query, position) pairs that `keep` (`[n_q, held]`: the new queries over
    /// every position held, oldest first, their own included) marks `true`, on top of the causal
    /// mask: a token tree's ancestors for tree or speculative verification. Over a windowed
    /// cache ([`KvCache::with_window`](crate::KvCache::with_window)), column `c` is position
    /// `len - held + c` (see [`CacheLayer::held`](crate::CacheLayer::held)), wherever the ring
    /// keeps it.
    ///
    /// ```
    /// // Two drafted tokens that are siblings after a prompt of 3: neither sees the other.
    /// let keep = ndarray::array![
    ///     [true, true, true, true, false],
    ///     [true, true, true, false, true],
    /// ];
    /// let options = qkv::CacheOptions::new().keep_mask(keep.view());
    /// # let _ = options;
    /// ```
    pub fn keep_mask(mut self, keep: ArrayView2<'a, bool>) -> Self {
        self.keep = Some(keep);
        self
    }

    /// These options as the dense API's, for queries that are the last positions of the keys:
    /// a bottom-right causal mask and everything set here.
    ///
    /// ```
    /// let options = qkv::CacheOptions::new().logit_softcap(30.0).dense();
    /// # let _: qkv::AttentionOptions<f32> = options;
    /// ```
    pub fn dense(&self) -> AttentionOptions<'a, f32> {
        let mut options = AttentionOptions::new().causal(CausalMask::BottomRight);
        if let Some(scale) = self.scale {
            options = options.scale(scale);
        }
        if let Some(window) = self.window {
            options = options.sliding_window(window);
        }
        if let Some(slopes) = self.alibi {
            options = options.alibi(Alibi::new(slopes));
        }
        if let Some(cap) = self.softcap {
            options = options.logit_softcap(cap);
        }
        if let Some(keep) = self.keep {
            options = options.keep_mask(KeepMask::new(keep));
        }
        options
    }

    /// The sliding window asked for, if any.
    pub(crate) fn window(&self) -> Option<SlidingWindow> {
        self.window
    }

    /// The keep mask asked for, if any.
    pub(crate) fn keep(&self) -> Option<ArrayView2<'a, bool>> {
        self.keep
    }

    /// Checks the shapes of the options against a call of `query_heads` heads of `n_queries`
    /// queries over `n_keys` positions; the values (scale, cap, slopes) are checked when
    /// [`Self::dense`]'s options are resolved.
    pub(crate) fn check_shapes(
        &self,
        query_heads: usize,
        n_queries: usize,
        n_keys: usize,
    ) -> Result<(), OptionShape> {
        if let Some(keep) = self.keep
            && keep.shape() != [n_queries, n_keys]
        {
            return Err(OptionShape {
                argument: "keep_mask",
                found: keep.shape().into(),
                expected: Dims(vec![n_queries, n_keys]).to_string(),
                why: "one row per new query, one column per position held",
            });
        }
        if let Some(slopes) = self.alibi
            && slopes.len() != query_heads
        {
            return Err(OptionShape {
                argument: "alibi slopes",
                found: Dims(vec![slopes.len()]),
                expected: Dims(vec![query_heads]).to_string(),
                why: "one slope per query head",
            });
        }
        Ok(())
    }
}
