//! How a row of the softmax is finished, written once: the rule the fast paths, the blocked path,
//! the merge of partial results and the f64 reference all follow. A row's state is its largest
//! visible score `m` and the sum `l = Σ exp(s_j - m)` over its visible keys (with the unnormalised
//! output `Σ exp(s_j - m) · v_j` beside them); `l = 0` exactly when the row sees no key, since
//! the maximum itself adds `exp(0) = 1`. Such a row's weights and output are zeros, never NaN,
//! and its logsumexp is `-inf`. An attention sink joins the row where it is finished
//! ([`finish`]), once.

use num_traits::Float;

/// `x / l`: an unnormalised sum of row state `l` divided out, or 0 for a row that sees no key.
#[inline(always)]
pub(crate) fn normalised<T: Float>(x: T, l: T) -> T {
    if l > T::zero() { x / l } else { T::zero() }
}

/// The row's logsumexp `m + ln l = ln Σ exp(s_j)`, or `-inf` for a row that sees no key.
#[inline(always)]
pub(crate) fn logsumexp<T: Float>(m: T, l: T) -> T {
    if l > T::zero() { m + l.ln() } else { T::neg_infinity() }
}

/// A row's state `(m, l)` finished: with its attention sink, when it has one, joined as one more
/// visible key that has no value. The sink enters here and nowhere else, once per row, after the
/// row's parts (key splits, a ring's runs) are merged, so that no split or merge counts it twice.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Finished<T> {
    /// The row's maximum, the sink's logit included.
    max: T,
    /// `Σ exp(s_j - max)` over the visible keys and the sink.
    sum: T,
    /// `exp(m - max)`: what the unnormalised output, kept relative to `m`, is multiplied by.
    rescale: T,
}

/// Finishes the row state `(m, l)` with the sink logit `sink` (`None`, or `-inf`: no sink, and
/// the row finishes as it stands).
#[inline(always)]
pub(crate) fn finish<T: Float>(m: T, l: T, sink: Option<T>) -> Finished<T> {
    match sink {
        Some(s) if s != T::neg_infinity() => {
            let max = m.max(s);
            let rescale = (m - max).exp();
            Finished { max, sum: l * rescale + (s - max).exp(), rescale }
        }
        _ => Finished { max: m, sum: l, rescale: T::one() },
    }
}

impl<T: Float> Finished<T> {
    /// The normalised output element of the unnormalised `x` (0 for a row with nothing visible).
    #[inline(always)]
    pub(crate) fn output(&self, x: T) -> T {
        normalised(x * self.rescale, self.sum)
    }

    /// The row's logsumexp, the sink included: the sink's logit for a row that sees no key.
    #[inline(always)]
    pub(crate) fn logsumexp(&self) -> T {
        logsumexp(self.max, self.sum)
    }
}

/// The sink's weight `exp(sink - lse)` in a row of logsumexp `lse` (0 without a sink), for its
/// gradient `-Σ_rows P_sink · rowsum(dO ∘ O)`.
#[inline(always)]
pub(crate) fn sink_weight<T: Float>(sink: Option<T>, lse: T) -> T {
    match sink {
        Some(s) if s != T::neg_infinity() => (s - lse).exp(),
        _ => T::zero(),
    }
}
