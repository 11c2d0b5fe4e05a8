//! Multi-head attention over `[batch, heads, n, d]` tensors, with grouped-query attention
//! (several query heads sharing one key/value head; multi-query attention is one shared head).

use ndarray::{Array3, Array4, ArrayView4, s};
use rayon::prelude::*;

use crate::attention::run;
use crate::error::AttentionError;
use crate::mask::AttentionOptions;
use crate::real::Real;
use crate::shape::{Magnitudes, Shape};

/// Attention for every (batch, query head) pair.
///
/// `q` is `[batch, query_heads, n_queries, d_k]`, `k` is `[batch, kv_heads, n_keys, d_k]`, `v` is
/// `[batch, kv_heads, n_keys, d_v]`; `query_heads` must be a multiple of `kv_heads`, and query head
/// `h` reads key/value head `h / (query_heads / kv_heads)`. Masks and bias in `options` are
/// `[n_queries, n_keys]` and apply to every batch element and head. Returns
/// `[batch, query_heads, n_queries, d_v]`.
pub fn multi_head_attention<T: Real>(
    q: ArrayView4<T>,
    k: ArrayView4<T>,
    v: ArrayView4<T>,
    options: &AttentionOptions<T>,
) -> Result<Array4<T>, AttentionError> {
    let [batch, query_heads, n_queries, _] = *q.shape() else { unreachable!("4-D view") };
    let [_, kv_heads, _, _] = *k.shape() else { unreachable!("4-D view") };
    for (argument, other, other_shape, axis, a, b) in [
        ("keys", "queries", q.shape(), "batch", k.shape()[0], batch),
        ("values", "keys", k.shape(), "batch", v.shape()[0], batch),
        ("values", "keys", k.shape(), "heads", v.shape()[1], kv_heads),
    ] {
        if a != b {
            let found = if argument == "keys" { k.shape() } else { v.shape() };
            return Err(AttentionError::AxisMismatch {
                argument,
                found: found.into(),
                other,
                other_shape: other_shape.into(),
                axis,
            });
        }
    }
    if kv_heads == 0 || query_heads % kv_heads != 0 {
        return Err(AttentionError::HeadCount { query_heads, kv_heads });
    }
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let magnitudes = Magnitudes::measure(&q, &k, &v)?;
    options.resolve(&shape)?;

    let group = query_heads / kv_heads;
    // One `[n_queries, d_v]` slab per (batch, query head), in the output's own order.
    let mut out = Array3::zeros((batch * query_heads, n_queries, shape.value_dim));
    let mut heads: Vec<_> = out.outer_iter_mut().collect();
    heads.par_iter_mut().enumerate().try_for_each(|(index, out_head)| {
        let (b, h) = (index / query_heads, index % query_heads);
        let kv = h / group;
        run(
            &shape,
            &magnitudes,
            q.slice(s![b, h, .., ..]),
            k.slice(s![b, kv, .., ..]),
            v.slice(s![b, kv, .., ..]),
            options,
            out_head.view_mut(),
            None,
        )
    })?;
    drop(heads);
    Ok(out.into_shape_with_order((batch, query_heads, n_queries, shape.value_dim)).expect("same length"))
}
