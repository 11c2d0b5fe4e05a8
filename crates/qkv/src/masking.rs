//! Masking, written once: options checked against the scores of every (batch, head) of a call
//! ([`HeadMasks`]), each head then taking its own [`MaskSet`], which holds only that head's
//! slices. [`MaskSet::apply_row`] hides what the masks hide and adds what the terms add; the
//! reference and every fast path call it (or, for whole blocks, [`MaskSet::visible_keys`]), so
//! they cannot disagree about what is hidden.

use std::ops::Range;

use ndarray::{ArrayView1, Axis, Ix1, Ix2};

use crate::element::Real;
use crate::error::{AttentionError, Dims};
use crate::mask::{
    AdditiveBias, Broadcast, CausalMask, GivenShape, KeepMask, KeyPadding, SlidingWindow, View,
};
use crate::options::AttentionOptions;
use crate::shape::Shape;

impl<'a, T: Real> AttentionOptions<'a, T> {
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
        if let (Some(causal), Some(window)) = (self.causal, &self.window)
            && causal != window.align
        {
            return Err(AttentionError::WindowAlignment { causal, window: window.align });
        }
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
            let [sequences, heads] = *alibi.slopes.shape() else { unreachable!("2-D view") };
            if alibi.given.rank == 1 && heads != n_heads {
                return Err(layout.mismatch("alibi slopes", heads, "one slope per query head", n_heads));
            }
            if heads != n_heads || (sequences != 1 && sequences != batch) {
                return Err(AttentionError::MaskShape {
                    argument: "alibi slopes",
                    found: alibi.given.dims(),
                    scores: layout.scores(),
                    needs: format!(
                        "one slope per query head [{n_heads}], or per sequence and head [{batch}, {n_heads}]"
                    ),
                });
            }
            if let Some(((b, h), s)) = alibi.slopes.indexed_iter().find(|(_, s)| !s.is_finite()) {
                // Named in the shape the caller passed.
                let index = if alibi.given.rank == 1 { vec![h] } else { vec![b, h] };
                return Err(AttentionError::NonFinite {
                    argument: "alibi slopes",
                    index: Dims(index),
                    value: s.to_f64_exact(),
                });
            }
            // The distance between a query's position and a key is below n_q + n_k.
            let steepest = alibi.slopes.iter().fold(0.0_f64, |m, s| m.max(s.to_f64_exact().abs()));
            bias_magnitude += steepest * (shape.n_queries + shape.n_keys) as f64;
        }
        if let Some(sinks) = self.sinks {
            if sinks.len() != n_heads {
                return Err(layout.mismatch("sinks", sinks.len(), "one logit per query head", n_heads));
            }
            // -inf is a head without a sink.
            if let Some((h, s)) = sinks.iter().enumerate().find(|(_, s)| s.is_nan() || **s == T::infinity()) {
                return Err(AttentionError::NonFinite {
                    argument: "sinks",
                    index: Dims(vec![h]),
                    value: s.to_f64_exact(),
                });
            }
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
            alibi: o.alibi.map(|a| {
                let b = if a.slopes.nrows() == 1 { 0 } else { b };
                Slope { slope: a.slopes[[b, h]].to_f64_exact(), align: a.align, symmetric: a.symmetric }
            }),
            sinks: o.sinks.map(|sinks| &sinks[h..]),
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

/// One query head's ALiBi: its slope, where its queries stand, and whether the term is
/// flash-attn's symmetric `-slope · |j - p|` rather than `slope · (j - p)`.
#[derive(Debug, Clone, Copy)]
struct Slope {
    slope: f64,
    align: CausalMask,
    symmetric: bool,
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
    alibi: Option<Slope>,
    /// The logit soft-cap: scores become `cap · tanh(s / cap)` before anything is added or hidden.
    softcap: Option<f64>,
    /// The attention-sink logits of this query head and of the heads after it (the query heads
    /// stacked on one key/value head follow one another): see [`Self::sink`].
    sinks: Option<&'a [T]>,
    /// The score multiplier, in f64; paths narrow it to their element type.
    pub(crate) scale: f64,
    /// The largest finite `|bias|` (0 without a bias), for bounding the scores.
    pub(crate) bias_magnitude: f64,
}

impl<T: Real> MaskSet<'_, T> {
    /// The attention-sink logit of the query head `stacked` heads after this one (0 for this
    /// head's own): the row of a stacked group (grouped-query attention) knows its head, so a sink
    /// per head does not stop the heads of a group from running as the rows of one problem.
    pub(crate) fn sink(&self, stacked: usize) -> Option<T> {
        self.sinks.map(|sinks| sinks[stacked])
    }

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

    /// Whether every key lies in some query's [`Self::visible_keys`], so that a path that reads
    /// each query's visible keys reads all of them (a causal mask or a window may leave keys that
    /// no query sees).
    pub(crate) fn shows_every_key(&self) -> bool {
        let mut covered = 0;
        for i in 0..self.shape.n_queries {
            let visible = self.visible_keys(i);
            if visible.start > covered {
                return false;
            }
            covered = covered.max(visible.end);
        }
        covered == self.shape.n_keys
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
        if let Some(Slope { slope, align, symmetric }) = self.alibi {
            // slope · (j - p), or -slope · |j - p|, in f64 and rounded once, as a bias matrix
            // would hold it.
            let p = align.position(query_idx, &self.shape) as f64;
            for (j, s) in keys.clone().zip(row.iter_mut()) {
                let distance = j as f64 - p;
                let term = if symmetric { -slope * distance.abs() } else { slope * distance };
                *s = *s + U::from_f64_round(term);
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

impl CausalMask {
    /// The key position query `query_idx` stands at under this alignment (negative for the first
    /// queries when there are more queries than keys, bottom-right).
    pub(crate) fn position(self, query_idx: usize, shape: &Shape) -> isize {
        match self {
            CausalMask::TopLeft => query_idx as isize,
            CausalMask::BottomRight => query_idx as isize + shape.n_keys as isize - shape.n_queries as isize,
        }
    }
}

impl GivenShape {
    /// The shape, for an error.
    pub(crate) fn dims(&self) -> Dims {
        Dims(self.axes[..self.rank].to_vec())
    }
}
