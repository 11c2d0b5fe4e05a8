//! The scalar f64 reference: plain loops, written for clarity, never for speed.
//!
//! It is the oracle every fast path is tested against, and the source of every number the lesson
//! prints ([`trace_query`]): whatever the element type of the inputs, it widens them to f64 and
//! computes each step exactly as the textbook writes it.

use ndarray::{Array2, ArrayView2};

use crate::attention::{Attention, AttentionWeights, Scores};
use crate::error::AttentionError;
use crate::mask::{AttentionOptions, MaskSet};
use crate::real::Real;
use crate::shape::Shape;

/// Every intermediate of one query's attention, in f64: what a worked example shows step by step.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryTrace {
    /// The query vector.
    pub query: Vec<f64>,
    /// Raw dot products `q · k_i`, one per key.
    pub dot_products: Vec<f64>,
    /// The multiplier applied to every dot product (`1 / sqrt(d_k)` unless overridden).
    pub scale: f64,
    /// Scaled scores `s_i = scale · (q · k_i)` plus any bias; `-inf` where the key is hidden.
    pub scores: Vec<f64>,
    /// `false` where a mask hides the key from this query.
    pub kept: Vec<bool>,
    /// The largest visible score, subtracted before exponentiating; `None` if every key is hidden.
    pub max: Option<f64>,
    /// `s_i - max`; `-inf` where hidden.
    pub shifted: Vec<f64>,
    /// `exp(s_i - max)`; `0` where hidden.
    pub exponentials: Vec<f64>,
    /// The sum of the exponentials (`0` if every key is hidden).
    pub sum: f64,
    /// Attention weights `a_i = exp(s_i - max) / sum`; all `0` if every key is hidden.
    pub weights: Vec<f64>,
    /// The weighted terms `a_i · v_i`, one row per key.
    pub weighted_values: Vec<Vec<f64>>,
    /// The output `Σ a_i v_i`.
    pub output: Vec<f64>,
}

/// Attention for every query, computed by the reference, with scores and weights.
///
/// Accepts `f32` or `f64` inputs and computes in f64 either way.
pub fn attention<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<Attention<f64>, AttentionError> {
    let shape = Shape::check(&q, &k, &v)?;
    let masks = options.resolve(&shape)?;
    let mut scores = Array2::zeros((shape.n_queries, shape.n_keys));
    let mut weights = Array2::zeros((shape.n_queries, shape.n_keys));
    let mut output = Array2::zeros((shape.n_queries, shape.value_dim));
    for i in 0..shape.n_queries {
        let trace = trace_row(&q, &k, &v, i, &masks);
        scores.row_mut(i).assign(&ndarray::aview1(&trace.scores));
        weights.row_mut(i).assign(&ndarray::aview1(&trace.weights));
        output.row_mut(i).assign(&ndarray::aview1(&trace.output));
    }
    Ok(Attention { scores: Scores(scores), weights: AttentionWeights(weights), output })
}

/// The worked trace of query `query_idx` (every intermediate, in f64).
///
/// Masks apply as they would to that query inside the whole batch of queries.
pub fn trace_query<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    query_idx: usize,
    options: &AttentionOptions<T>,
) -> Result<QueryTrace, AttentionError> {
    let shape = Shape::check(&q, &k, &v)?;
    if query_idx >= shape.n_queries {
        return Err(AttentionError::QueryIndex { index: query_idx, n_queries: shape.n_queries });
    }
    let masks = options.resolve(&shape)?;
    Ok(trace_row(&q, &k, &v, query_idx, &masks))
}

fn trace_row<T: Real>(
    q: &ArrayView2<T>,
    k: &ArrayView2<T>,
    v: &ArrayView2<T>,
    i: usize,
    masks: &MaskSet<'_, '_, T>,
) -> QueryTrace {
    let query: Vec<f64> = q.row(i).iter().map(|x| x.to_f64_exact()).collect();
    let dot_products: Vec<f64> = k
        .rows()
        .into_iter()
        .map(|key| query.iter().zip(key).map(|(a, b)| a * b.to_f64_exact()).sum())
        .collect();
    let scale = masks.scale;
    let mut scores: Vec<f64> = dot_products.iter().map(|d| d * scale).collect();
    masks.apply_row(i, 0..scores.len(), &mut scores);
    let kept: Vec<bool> = scores.iter().map(|s| *s != f64::NEG_INFINITY).collect();
    let max = scores.iter().copied().filter(|s| s.is_finite()).reduce(f64::max);
    let shifted: Vec<f64> = scores.iter().map(|s| s - max.unwrap_or(0.0)).collect();
    let exponentials: Vec<f64> = shifted.iter().map(|s| s.exp()).collect();
    let sum: f64 = exponentials.iter().sum();
    let weights: Vec<f64> = exponentials.iter().map(|e| if sum > 0.0 { e / sum } else { 0.0 }).collect();
    let weighted_values: Vec<Vec<f64>> = weights
        .iter()
        .zip(v.rows())
        .map(|(a, value)| value.iter().map(|x| a * x.to_f64_exact()).collect())
        .collect();
    let output = (0..v.ncols()).map(|c| weighted_values.iter().map(|term| term[c]).sum()).collect();
    QueryTrace {
        query,
        dot_products,
        scale,
        scores,
        kept,
        max,
        shifted,
        exponentials,
        sum,
        weights,
        weighted_values,
        output,
    }
}
