//! How a row of the softmax is finished, written once: the rule the fast paths, the blocked path,
//! the merge of partial results and the f64 reference all follow. A row's state is its largest
//! visible score `m` and the sum `l = Σ exp(s_j - m)` over its visible keys (with the unnormalised
//! output `Σ exp(s_j - m) · v_j` beside them); `l = 0` exactly when the row sees no key, since
//! the maximum itself adds `exp(0) = 1`. Such a row's weights and output are zeros, never NaN,
//! and its logsumexp is `-inf`.

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
