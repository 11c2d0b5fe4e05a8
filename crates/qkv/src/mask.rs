//! Masks and options: which keys each query may see, extra score terms, and the scale.
//!
//! Masking is written once, in [`MaskSet::apply_row`]; the reference and every fast path call it
//! (or, for whole blocks, [`MaskSet::visible_keys`]), so they cannot disagree about what is hidden.

use std::ops::Range;

use ndarray::{ArrayView1, ArrayView2};

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CausalMask {
    /// Align the last query with the last key (the default).
    #[default]
    BottomRight,
    /// Align the first query with the first key.
    TopLeft,
}

/// A boolean `[n_queries, n_keys]` mask: `true` where the query may attend to the key.
#[derive(Debug, Clone)]
pub struct KeepMask<'a>(ArrayView2<'a, bool>);

impl<'a> KeepMask<'a> {
    /// Wraps a `[n_queries, n_keys]` view; `true` keeps a (query, key) pair.
    pub fn new(keep: ArrayView2<'a, bool>) -> Self {
        KeepMask(keep)
    }
}

/// A boolean `[n_keys]` mask over keys: `false` marks padding that no query may see.
#[derive(Debug, Clone)]
pub struct KeyPadding<'a>(ArrayView1<'a, bool>);

impl<'a> KeyPadding<'a> {
    /// Wraps a `[n_keys]` view; `true` marks a real key, `false` padding.
    pub fn new(real_keys: ArrayView1<'a, bool>) -> Self {
        KeyPadding(real_keys)
    }
}

/// An additive `[n_queries, n_keys]` term added to the scaled scores (relative-position biases,
/// ALiBi). `-inf` hides the pair, exactly like a mask; NaN and `+inf` are errors.
#[derive(Debug, Clone)]
pub struct AdditiveBias<'a, T>(ArrayView2<'a, T>);

impl<'a, T: Real> AdditiveBias<'a, T> {
    /// Wraps a `[n_queries, n_keys]` view of terms added after scaling.
    pub fn new(bias: ArrayView2<'a, T>) -> Self {
        AdditiveBias(bias)
    }
}

/// How to run attention: the scale and any masks. All masks combine: a pair is kept only if
/// every mask keeps it.
///
/// A query whose keys are all hidden gets all-zero weights and a zero output (never NaN): it has
/// nothing to attend to, and zero is what a sum over no values is.
#[derive(Debug, Clone)]
pub struct AttentionOptions<'a, T> {
    scale: Option<T>,
    causal: Option<CausalMask>,
    keep: Option<KeepMask<'a>>,
    padding: Option<KeyPadding<'a>>,
    bias: Option<AdditiveBias<'a, T>>,
    simd: Option<SimdLevel>,
}

impl<T> Default for AttentionOptions<'_, T> {
    fn default() -> Self {
        AttentionOptions { scale: None, causal: None, keep: None, padding: None, bias: None, simd: None }
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

    /// Adds `bias` to the scaled scores.
    pub fn bias(mut self, bias: AdditiveBias<'a, T>) -> Self {
        self.bias = Some(bias);
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

    /// Whether no mask or bias is set (only the scale may differ from the default).
    pub(crate) fn is_unmasked(&self) -> bool {
        self.causal.is_none() && self.keep.is_none() && self.padding.is_none() && self.bias.is_none()
    }

    /// Checks every mask against the score shape and resolves the scale.
    pub(crate) fn resolve(&self, shape: &Shape) -> Result<MaskSet<'_, 'a, T>, AttentionError> {
        let scores = Dims(vec![shape.n_queries, shape.n_keys]);
        let check2 = |argument, dims: &[usize]| {
            if dims == scores.0.as_slice() {
                Ok(())
            } else {
                Err(AttentionError::MaskShape { argument, expected: scores.clone(), found: dims.into() })
            }
        };
        if let Some(KeepMask(keep)) = &self.keep {
            check2("keep_mask", keep.shape())?;
        }
        if let Some(KeyPadding(padding)) = &self.padding
            && padding.len() != shape.n_keys
        {
            return Err(AttentionError::MaskShape {
                argument: "key_padding",
                expected: Dims(vec![shape.n_keys]),
                found: padding.shape().into(),
            });
        }
        let mut bias_magnitude = 0.0;
        if let Some(AdditiveBias(bias)) = &self.bias {
            check2("bias", bias.shape())?;
            // One pass finds the largest finite |bias| (the fast path bounds its scores with it)
            // and whether any term is NaN or +inf; only then is the index looked up.
            let (bad, largest) = match bias.as_slice_memory_order() {
                Some(terms) => scan_bias(terms),
                None => scan_bias(&bias.iter().copied().collect::<Vec<_>>()),
            };
            if bad {
                let ((i, j), &b) = bias
                    .indexed_iter()
                    .find(|(_, b)| b.is_nan() || **b == T::infinity())
                    .expect("a bad term was seen");
                return Err(AttentionError::NonFinite {
                    argument: "bias",
                    index: Dims(vec![i, j]),
                    value: b.to_f64_exact(),
                });
            }
            bias_magnitude = largest.to_f64_exact();
        }
        let scale = match self.scale {
            Some(s) if !s.is_finite() => {
                return Err(AttentionError::InvalidScale { value: s.to_f64_exact() });
            }
            Some(s) => s.to_f64_exact(),
            None => 1.0 / (shape.key_dim as f64).sqrt(),
        };
        Ok(MaskSet { options: self, shape: *shape, scale, bias_magnitude })
    }
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

/// Options checked against a [`Shape`]: every index inside is in range.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MaskSet<'o, 'a, T> {
    options: &'o AttentionOptions<'a, T>,
    shape: Shape,
    /// The score multiplier, in f64; paths narrow it to their element type.
    pub(crate) scale: f64,
    /// The largest finite `|bias|` (0 without a bias), for bounding the scores.
    pub(crate) bias_magnitude: f64,
}

impl<T: Real> MaskSet<'_, '_, T> {
    /// Whether only the scale applies (no mask, no bias), so a path may skip [`Self::apply_row`].
    pub(crate) fn is_unmasked(&self) -> bool {
        self.options.is_unmasked()
    }

    /// Whether a causal mask applies (block costs then grow along the queries).
    pub(crate) fn is_causal(&self) -> bool {
        self.options.causal.is_some()
    }

    /// Whether a mask beyond the causal one (keep-mask, padding, bias) applies, so that a tile
    /// inside the causal range still needs [`Self::apply_row`].
    pub(crate) fn has_elementwise_masks(&self) -> bool {
        let o = self.options;
        o.keep.is_some() || o.padding.is_some() || o.bias.is_some()
    }

    /// Keys that the causal mask leaves visible to query `query_idx` (all keys without one).
    /// Other masks may hide more inside this range.
    pub(crate) fn visible_keys(&self, query_idx: usize) -> Range<usize> {
        let n_keys = self.shape.n_keys;
        let last = match self.options.causal {
            None => return 0..n_keys,
            Some(CausalMask::TopLeft) => query_idx as isize,
            Some(CausalMask::BottomRight) => {
                query_idx as isize + n_keys as isize - self.shape.n_queries as isize
            }
        };
        0..((last + 1).clamp(0, n_keys as isize) as usize)
    }

    /// Applies every mask and the bias to query `query_idx`'s scaled scores over keys
    /// `keys.start..keys.end` (`row[j]` belongs to key `keys.start + j`): adds the bias and writes
    /// `-inf` where a pair is hidden. Returns whether any key in the row stays visible.
    pub(crate) fn apply_row<U: Real>(&self, query_idx: usize, keys: Range<usize>, row: &mut [U]) -> bool {
        debug_assert_eq!(row.len(), keys.len());
        let o = self.options;
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
        if let Some(KeepMask(m)) = &o.keep {
            hide_where_false(row, m.slice(ndarray::s![query_idx, keys.clone()]));
        }
        if let Some(KeyPadding(p)) = &o.padding {
            hide_where_false(row, p.slice(ndarray::s![keys.clone()]));
        }
        if let Some(AdditiveBias(b)) = &o.bias {
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
        row.iter().any(|s| *s != U::neg_infinity())
    }
}
