//! The reference backward of scaled dot-product attention: the gradients of the inputs from the
//! gradient of the output, in f64, one formula per line as the textbook writes them.

use ndarray::{Array1, Array2, ArrayView2, Axis};

use super::trace_row;
use crate::backward::{Gradients, check_d_output};
use crate::element::Real;
use crate::error::AttentionError;
use crate::inputs;
use crate::options::AttentionOptions;
use crate::shape::Shape;

/// The gradients of `L` with respect to the queries, keys, values (and the additive bias, if
/// `options` carries one) given `d_output = ∂L/∂O`, computed by the reference in f64:
///
/// - `dV = Pᵀ · dO`
/// - `dP = dO · Vᵀ`
/// - `dS = P ∘ (dP − rowsum(dO ∘ O))` (the softmax's backward, row by row)
/// - `dQ = dS · K · scale`, `dK = dSᵀ · Q · scale`, `dBias = dS`
/// - with an attention sink `s` (a key of no value, so `dP_sink = 0`):
///   `dS_sink = P_sink ∘ (0 − rowsum(dO ∘ O))`, `ds = Σ_i dS_sink,i`, with
///   `P_sink = exp(s − max) / sum` from each row's trace
///
/// Masks mean what they mean in the forward ([`attention`](super::attention)): a hidden pair has
/// `P = 0`, so it adds nothing to any gradient. A row that sees no key has zero gradients, and a
/// key that no query sees gets zero `dK` and `dV` (its inputs are never read, as in the forward).
/// ALiBi slopes, masks and the scale are constants: they get no gradient. Under a soft-cap
/// ([`AttentionOptions::logit_softcap`]) the scores' gradient is `dS ∘ (1 - tanh²(S_raw / cap))`
/// on its way to `dQ` and `dK` (`S_raw` the scaled scores before the cap); `dBias = dS`, the
/// bias being added after the cap.
///
/// ```
/// use qkv::ndarray::array;
/// let q = array![[1.0_f64, 0.0]];
/// let k = array![[1.0, 0.0], [0.0, 1.0]];
/// let v = array![[2.0], [6.0]];
/// let d_out = array![[1.0]];
/// let g = qkv::reference::attention_backward(q.view(), k.view(), v.view(), d_out.view(), &qkv::AttentionOptions::new())?;
/// // The weights sum to one, so dV's column sums to the one output gradient.
/// assert!((g.dv.sum() - 1.0).abs() < 1e-12);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_backward<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    d_output: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<Gradients<f64>, AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let masks = options.resolve(&shape)?;
    let checked = inputs::check(&q, k, v, &|_| masks.seen_keys())?;
    check_d_output(&shape, &d_output)?;
    let (k, v) = (checked.k.view(), checked.v.view());
    let widen = |x: ArrayView2<T>| x.mapv(|x| x.to_f64_exact());
    let (q64, k64, d_out) = (widen(q), widen(k), widen(d_output));
    let mut p = Array2::zeros((shape.n_queries, shape.n_keys));
    let mut o = Array2::zeros((shape.n_queries, shape.value_dim));
    let mut cap_derivative = Array2::zeros((shape.n_queries, shape.n_keys));
    let mut p_sink = Array1::zeros(shape.n_queries);
    for i in 0..shape.n_queries {
        let trace = trace_row(&q, &k, &v, i, &masks);
        if let (Some(sink), Some(max)) = (trace.sink, trace.max) {
            p_sink[i] = (sink - max).exp() / trace.sum;
        }
        p.row_mut(i).assign(&ndarray::aview1(&trace.weights));
        o.row_mut(i).assign(&ndarray::aview1(&trace.output));
        let mut raw: Vec<f64> = trace.dot_products.iter().map(|d| d * masks.scale).collect();
        masks.softcap_derivative(&mut raw);
        cap_derivative.row_mut(i).assign(&ndarray::aview1(&raw));
    }
    let dv = p.t().dot(&d_out);
    let dp = d_out.dot(&widen(v).t());
    let delta = (&d_out * &o).sum_axis(Axis(1)).insert_axis(Axis(1));
    let ds = &p * &(dp - &delta);
    let ds_raw = &ds * &cap_derivative;
    let dq = ds_raw.dot(&k64) * masks.scale;
    let dk = ds_raw.t().dot(&q64) * masks.scale;
    let dsinks = options.sinks.map(|_| Array1::from_elem(1, -(&p_sink * &delta.column(0)).sum()));
    let dbias = options.has_bias().then_some(ds);
    Ok(Gradients { dq, dk, dv, dbias, dsinks })
}
