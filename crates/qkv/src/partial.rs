//! Attention over part of the keys, with each row's logsumexp, and the exact merge of two parts:
//! split-KV across machines, ring attention, a cache split into pages.

use ndarray::{Array, Dimension, IntoDimension, Ix2, Zip};

use crate::element::Real;
use crate::error::{AttentionError, Dims};
use crate::softmax;

/// The output of attention and each row's logsumexp, from
/// [`attention_with_lse`](crate::attention_with_lse) (`D = Ix2`: `output` is `[n_q, d_v]`,
/// `logsumexp` `[n_q]`) or [`multi_head_attention_with_lse`](crate::multi_head_attention_with_lse)
/// (`D = Ix4`: `[batch, heads, n_q, d_v]` and `[batch, heads, n_q]`).
///
/// The logsumexp is in the scaled-score domain, natural log: `lse_i = ln Σ_j exp(S_ij)` with `S`
/// the scaled scores including any bias (what `torch.logsumexp(scores, dim=-1)` gives), over the
/// keys the row sees. A row that sees no key has output 0 and logsumexp `-inf`. With attention
/// sinks ([`AttentionOptions::sinks`](crate::AttentionOptions::sinks)) the sum also holds
/// `exp(s_h)`, as a key with no value would: a row that sees no key then has logsumexp `s_h`.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialAttention<T, D: Dimension = Ix2> {
    /// The output `O = softmax(S) · V` over the keys this part covers.
    pub output: Array<T, D>,
    /// `ln Σ_j exp(S_ij)` per row, over the same keys.
    pub logsumexp: Array<T, D::Smaller>,
}

impl<T: Real, D: Dimension> PartialAttention<T, D> {
    /// Combines attention over two disjoint sets of keys into attention over their union: each
    /// output row is the two rows weighted by their share of the total, `exp(lse_a - lse)` and
    /// `exp(lse_b - lse)` with `lse = ln(exp(lse_a) + exp(lse_b))`. Exact up to rounding, in any
    /// order and grouping; a row that sees no key in one part takes the other's row unchanged.
    /// Both parts need the same shapes, and values attention can produce: a logsumexp that is
    /// NaN or `+inf`, or an output element that is not finite, is an error naming it (the
    /// weighted sum would spread it over the merged row).
    ///
    /// A part computed with attention sinks holds them in its logsumexp, and the merge adds the
    /// parts up, so a sink given to two parts' calls counts twice: give the sinks to one part's
    /// call only (a part is the sink alone where it sees no key; the engine's own key splits and
    /// cache parts add the sink once, after merging).
    ///
    /// ```
    /// use qkv::ndarray::{array, s};
    /// use qkv::AttentionOptions;
    /// let q = array![[1.0_f64, 0.0], [0.5, 2.0]];
    /// let k = array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
    /// let v = array![[2.0], [6.0], [4.0]];
    /// let o = AttentionOptions::new();
    /// let full = qkv::attention_with_lse(q.view(), k.view(), v.view(), &o)?;
    /// let first = qkv::attention_with_lse(q.view(), k.slice(s![..1, ..]), v.slice(s![..1, ..]), &o)?;
    /// let rest = qkv::attention_with_lse(q.view(), k.slice(s![1.., ..]), v.slice(s![1.., ..]), &o)?;
    /// let merged = first.merge(&rest)?;
    /// assert!((&merged.output - &full.output).iter().all(|d| d.abs() < 1e-12));
    /// assert!((&merged.logsumexp - &full.logsumexp).iter().all(|d| d.abs() < 1e-12));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn merge(mut self, other: &PartialAttention<T, D>) -> Result<PartialAttention<T, D>, AttentionError> {
        for part in [&self, other] {
            let rows = &part.output.shape()[..part.output.ndim() - 1];
            if part.logsumexp.shape() != rows {
                return Err(AttentionError::MergeShape {
                    first: part.output.shape().into(),
                    second: part.logsumexp.shape().into(),
                    what: "an output and its logsumexp, whose shape is the output's without its last axis",
                });
            }
        }
        if self.output.shape() != other.output.shape() {
            return Err(AttentionError::MergeShape {
                first: self.output.shape().into(),
                second: other.output.shape().into(),
                what: "two outputs of the same queries, of the same shape",
            });
        }
        self.check_values("first")?;
        other.check_values("second")?;
        let rows = self.output.rows_mut().into_iter().zip(other.output.rows());
        for ((mut mine, theirs), (lse, &their_lse)) in
            rows.zip(self.logsumexp.iter_mut().zip(&other.logsumexp))
        {
            let m = lse.max(their_lse);
            if m == T::neg_infinity() {
                // Neither part sees a key: the row stays empty (zero output, -inf).
                continue;
            }
            let (a, b) = ((*lse - m).exp(), (their_lse - m).exp());
            let total = a + b;
            Zip::from(&mut mine)
                .and(&theirs)
                .for_each(|x, &y| *x = softmax::normalised(*x * a + y * b, total));
            *lse = softmax::logsumexp(m, total);
        }
        Ok(self)
    }

    /// Refuses a NaN or `+inf` logsumexp (`-inf` is a row that sees no key) and a non-finite
    /// output element, naming the first.
    fn check_values(&self, part: &'static str) -> Result<(), AttentionError> {
        let bad = |argument, index: Vec<usize>, value: T, why| AttentionError::MergeValue {
            part,
            argument,
            index: Dims(index),
            value: value.to_f64_exact(),
            why,
        };
        let bad_lse = |l: &T| l.is_nan() || *l == T::infinity();
        // `indexed_iter` builds an index per element (slow for `IxDyn`): only to name a bad one.
        if self.logsumexp.iter().any(bad_lse) {
            let (i, &l) = self.logsumexp.indexed_iter().find(|(_, l)| bad_lse(l)).expect("found above");
            let why = "a logsumexp is finite, or -inf for a row that sees no key";
            return Err(bad("logsumexp", i.into_dimension().slice().to_vec(), l, why));
        }
        if self.output.iter().any(|x| !x.is_finite()) {
            let (i, &x) = self.output.indexed_iter().find(|(_, x)| !x.is_finite()).expect("found above");
            return Err(bad("output", i.into_dimension().slice().to_vec(), x, "an output is finite"));
        }
        Ok(())
    }
}
