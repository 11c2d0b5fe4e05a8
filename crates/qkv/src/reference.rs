//! The scalar f64 reference: plain loops, written for clarity, never for speed.
//!
//! It is the oracle every fast path is tested against, and the source of every number the lesson
//! prints ([`trace_query`], and [`trace_tiled`] for the online softmax over blocks of keys):
//! whatever the element type of the inputs, it widens them to f64 and computes each step exactly
//! as the textbook writes it.

mod tiled;

use ndarray::{Array1, Array2, ArrayView2};

use crate::attention::{Attention, AttentionWeights, Scores};
use crate::element::Real;
use crate::error::AttentionError;
use crate::inputs::{self, Inputs};
use crate::masking::MaskSet;
use crate::options::AttentionOptions;
use crate::partial::PartialAttention;
use crate::rotary::{Rotary, RotaryPairing};
use crate::shape::Shape;
use crate::softmax;

pub use tiled::{TiledBlock, TiledTrace, trace_tiled};

/// Every intermediate of one query's attention, in f64: what a worked example shows step by step.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueryTrace {
    /// The query vector.
    pub query: Vec<f64>,
    /// Raw dot products `q · k_i`, one per key.
    pub dot_products: Vec<f64>,
    /// The multiplier applied to every dot product (`1 / sqrt(d_k)` unless overridden).
    pub scale: f64,
    /// Scaled scores `s_i = scale · (q · k_i)`, soft-capped (`cap · tanh(s_i / cap)`) if the
    /// options cap them, plus any bias and ALiBi term; `-inf` where the key is hidden.
    pub scores: Vec<f64>,
    /// `false` where a mask hides the key from this query.
    pub kept: Vec<bool>,
    /// The attention sink's logit ([`AttentionOptions::sinks`]), if the options carry one that
    /// is not `-inf`: one more key in the softmax, with no value.
    pub sink: Option<f64>,
    /// The largest visible score, or the sink's logit if that is larger, subtracted before
    /// exponentiating; `None` if every key is hidden and there is no sink.
    pub max: Option<f64>,
    /// `s_i - max`; `-inf` where hidden.
    pub shifted: Vec<f64>,
    /// `exp(s_i - max)`; `0` where hidden.
    pub exponentials: Vec<f64>,
    /// The sum of the exponentials, and `exp(sink - max)` with a sink (`0` if every key is hidden
    /// and there is no sink).
    pub sum: f64,
    /// Attention weights `a_i = exp(s_i - max) / sum`; all `0` if every key is hidden. With a sink
    /// they sum to `1 - exp(sink - max) / sum`.
    pub weights: Vec<f64>,
    /// The weighted terms `a_i · v_i`, one row per key.
    pub weighted_values: Vec<Vec<f64>>,
    /// The output `Σ a_i v_i`.
    pub output: Vec<f64>,
}

impl QueryTrace {
    /// The row's logsumexp `max + ln(sum) = ln Σ_i exp(s_i)` over the visible keys (and
    /// `exp(sink)`), in the scaled-score domain; `-inf` if every key is hidden and there is no
    /// sink, the sink's logit if every key is hidden.
    ///
    /// ```
    /// let k = qkv::ndarray::array![[1.0_f64, 0.0], [0.0, 1.0]];
    /// let v = qkv::ndarray::array![[2.0], [6.0]];
    /// let options = qkv::AttentionOptions::new().scale(1.0);
    /// let t = qkv::trace_query(k.view(), k.view(), v.view(), 0, &options)?;
    /// assert!((t.logsumexp() - (1.0 + std::f64::consts::E).ln()).abs() < 1e-12);
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn logsumexp(&self) -> f64 {
        softmax::logsumexp(self.max.unwrap_or(f64::NEG_INFINITY), self.sum)
    }
}

/// Attention for every query, computed by the reference, with scores and weights.
///
/// Accepts `f32` or `f64` inputs and computes in f64 either way. Keys and values that no query
/// sees are taken as zeros, whatever they hold (see [`AttentionOptions`]).
///
/// ```
/// let k = qkv::ndarray::array![[1.0_f32, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let v = qkv::ndarray::array![[2.0_f32], [6.0], [4.0]];
/// let r = qkv::reference::attention(k.view(), k.view(), v.view(), &qkv::AttentionOptions::new())?;
/// assert!((r.weights[[1, 0]] - 0.1978).abs() < 1e-4);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<Attention<f64>, AttentionError> {
    let (shape, traces) = traces(q, k, v, options)?;
    let mut scores = Array2::zeros((shape.n_queries, shape.n_keys));
    let mut weights = Array2::zeros((shape.n_queries, shape.n_keys));
    let mut output = Array2::zeros((shape.n_queries, shape.value_dim));
    for (i, trace) in traces.iter().enumerate() {
        scores.row_mut(i).assign(&ndarray::aview1(&trace.scores));
        weights.row_mut(i).assign(&ndarray::aview1(&trace.weights));
        output.row_mut(i).assign(&ndarray::aview1(&trace.output));
    }
    Ok(Attention { scores: Scores(scores), weights: AttentionWeights(weights), output })
}

/// Attention's output and each row's logsumexp, computed by the reference (see
/// [`attention_with_lse`](crate::attention_with_lse)).
///
/// ```
/// let k = qkv::ndarray::array![[1.0_f64, 0.0], [0.0, 1.0]];
/// let v = qkv::ndarray::array![[2.0], [6.0]];
/// let r = qkv::reference::attention_with_lse(k.view(), k.view(), v.view(), &qkv::AttentionOptions::new())?;
/// assert_eq!(r.logsumexp.len(), 2);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_with_lse<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<PartialAttention<f64>, AttentionError> {
    let (shape, traces) = traces(q, k, v, options)?;
    let mut output = Array2::zeros((shape.n_queries, shape.value_dim));
    for (i, trace) in traces.iter().enumerate() {
        output.row_mut(i).assign(&ndarray::aview1(&trace.output));
    }
    let logsumexp = Array1::from_iter(traces.iter().map(QueryTrace::logsumexp));
    Ok(PartialAttention { output, logsumexp })
}

/// `x` (`[n, d]`) under the rotary embedding `rotary`, row `i` standing at position
/// `first_position + i`, in f64: each rotated pair read as a complex number and multiplied by
/// `e^{i·θ}`, with `θ = position · position_scale / base^(2i / dims)`. Written apart from
/// [`Rotary::rotate`], which the caches run, as the oracle it is checked against.
///
/// ```
/// let x = qkv::ndarray::array![[1.0_f64, 0.0, 0.0, 1.0]];
/// let turned = qkv::reference::rotate(x.view(), &qkv::Rotary::new(100.0), 1);
/// // Pairs (0, 2) and (1, 3); frequencies 1 and 1/10.
/// assert!((turned[[0, 0]] - 1f64.cos()).abs() < 1e-15 && (turned[[0, 2]] - 1f64.sin()).abs() < 1e-15);
/// assert!((turned[[0, 1]] + 0.1f64.sin()).abs() < 1e-15 && (turned[[0, 3]] - 0.1f64.cos()).abs() < 1e-15);
/// ```
pub fn rotate<T: Real>(x: ArrayView2<T>, rotary: &Rotary, first_position: usize) -> Array2<f64> {
    let dims = rotary.dims.unwrap_or(x.ncols());
    let pair = |i: usize| match rotary.pairing {
        RotaryPairing::HalfSplit => (i, i + dims / 2),
        RotaryPairing::Interleaved => (2 * i, 2 * i + 1),
    };
    let mut out = x.mapv(|v| v.to_f64_exact());
    for (r, mut row) in out.rows_mut().into_iter().enumerate() {
        let position = (first_position + r) as f64 * rotary.position_scale;
        for i in 0..dims / 2 {
            let theta = position / rotary.base.powf(2.0 * i as f64 / dims as f64);
            let (a, b) = pair(i);
            let (re, im) = (row[a], row[b]);
            row[a] = re * theta.cos() - im * theta.sin();
            row[b] = re * theta.sin() + im * theta.cos();
        }
    }
    out
}

/// The trace of every query, after checking the inputs against the masks.
fn traces<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<(Shape, Vec<QueryTrace>), AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let masks = options.resolve(&shape)?;
    let checked = inputs::check(&q, k, v, &|_| masks.seen_keys())?;
    let (k, v) = (checked.k.view(), checked.v.view());
    Ok((shape, (0..shape.n_queries).map(|i| trace_row(&q, &k, &v, i, &masks)).collect()))
}

/// The worked trace of query `query_idx` (every intermediate, in f64).
///
/// Masks apply as they would to that query inside the whole batch of queries.
///
/// ```
/// use qkv::ndarray::array;
/// let k = array![[1.0_f64, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let v = array![[2.0], [6.0], [4.0]];
/// let love = array![[0.0, 1.0]];
/// let t = qkv::trace_query(love.view(), k.view(), v.view(), 0, &qkv::AttentionOptions::new())?;
/// assert_eq!(t.dot_products, vec![0.0, 1.0, 1.0]);
/// assert!((t.output[0] - 4.4067).abs() < 1e-4);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn trace_query<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    query_idx: usize,
    options: &AttentionOptions<T>,
) -> Result<QueryTrace, AttentionError> {
    let (masks, checked) = check_query(&q, k, v, query_idx, options)?;
    Ok(trace_row(&q, &checked.k.view(), &checked.v.view(), query_idx, &masks))
}

/// The masks of one head and the checked keys and values, for tracing query `query_idx` alone:
/// the masks are resolved against all of `q`, so that the query is masked exactly as it is
/// inside the whole batch of queries.
fn check_query<'a, 'o, T: Real>(
    q: &ArrayView2<T>,
    k: ArrayView2<'a, T>,
    v: ArrayView2<'a, T>,
    query_idx: usize,
    options: &AttentionOptions<'o, T>,
) -> Result<(MaskSet<'o, T>, Inputs<'a, T, ndarray::Ix2>), AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    if query_idx >= shape.n_queries {
        return Err(AttentionError::QueryIndex { index: query_idx, n_queries: shape.n_queries });
    }
    let masks = options.resolve(&shape)?;
    let checked = inputs::check(q, k, v, &|_| masks.seen_keys())?;
    Ok((masks, checked))
}

/// Query `query_idx` widened to f64, its dot products with every key, and its scaled scores with
/// every mask and bias applied (`-inf` where a key is hidden).
fn row_scores<T: Real>(
    q: &ArrayView2<T>,
    k: &ArrayView2<T>,
    query_idx: usize,
    masks: &MaskSet<'_, T>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let query: Vec<f64> = q.row(query_idx).iter().map(|x| x.to_f64_exact()).collect();
    let dot_products: Vec<f64> = k
        .rows()
        .into_iter()
        .map(|key| query.iter().zip(key).map(|(a, b)| a * b.to_f64_exact()).sum())
        .collect();
    let mut scores: Vec<f64> = dot_products.iter().map(|d| d * masks.scale).collect();
    masks.apply_row(query_idx, 0..scores.len(), &mut scores);
    (query, dot_products, scores)
}

/// The largest score of a visible key (`None` if every key is hidden).
fn largest_visible(scores: &[f64]) -> Option<f64> {
    scores.iter().copied().filter(|s| s.is_finite()).reduce(f64::max)
}

fn trace_row<T: Real>(
    q: &ArrayView2<T>,
    k: &ArrayView2<T>,
    v: &ArrayView2<T>,
    i: usize,
    masks: &MaskSet<'_, T>,
) -> QueryTrace {
    let (query, dot_products, scores) = row_scores(q, k, i, masks);
    let scale = masks.scale;
    let kept: Vec<bool> = scores.iter().map(|s| *s != f64::NEG_INFINITY).collect();
    // The sink is one more key in the softmax, with no value.
    let sink = masks.sink(0).map(|s| s.to_f64_exact()).filter(|&s| s != f64::NEG_INFINITY);
    let max = largest_visible(&scores).into_iter().chain(sink).reduce(f64::max);
    let shifted: Vec<f64> = scores.iter().map(|s| s - max.unwrap_or(0.0)).collect();
    let exponentials: Vec<f64> = shifted.iter().map(|s| s.exp()).collect();
    let sink_term = sink.zip(max).map_or(0.0, |(s, m)| (s - m).exp());
    let sum: f64 = exponentials.iter().sum::<f64>() + sink_term;
    let weights: Vec<f64> = exponentials.iter().map(|&e| softmax::normalised(e, sum)).collect();
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
        sink,
        max,
        shifted,
        exponentials,
        sum,
        weights,
        weighted_values,
        output,
    }
}

mod backward;
pub use backward::attention_backward;
