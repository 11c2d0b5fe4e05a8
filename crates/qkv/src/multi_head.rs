//! Multi-head attention over `[batch, heads, n, d]` tensors, with grouped-query attention
//! (several query heads sharing one key/value head; multi-query attention is one shared head).

use ndarray::{Array2, Array3, Array4, ArrayView4, s};

use crate::attention::{decode_checked, run};
use crate::error::AttentionError;
use crate::flash;
use crate::kernels::Isa;
use crate::mask::{AttentionOptions, MaskSet};
use crate::real::Real;
use crate::shape::{Magnitudes, Shape, finite_magnitude};
use crate::simd;

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
    let group = query_heads / kv_heads;
    // One `[n_queries, d_v]` slab per (batch, query head), in the output's own order.
    let mut out = Array3::zeros((batch * query_heads, n_queries, shape.value_dim));
    if flash::decodes(n_queries * group, &k.slice(s![0, 0, .., ..])) {
        let queries = finite_magnitude("queries", &q)?;
        let masks = options.resolve(&shape)?;
        let kernels = simd::kernels_for(options.simd_level())?;
        if decode_stacked(kernels, &shape, q, k, v, &masks, &mut out, queries) {
            return Ok(into_heads(out, batch, query_heads));
        }
    }
    let magnitudes = Magnitudes::measure(&q, &k, &v)?;
    let masks = options.resolve(&shape)?;
    let kernels = simd::kernels_for(options.simd_level())?;
    let head_views = |index: usize| {
        let (b, h) = (index / query_heads, index % query_heads);
        (q.slice(s![b, h, .., ..]), k.slice(s![b, h / group, .., ..]), v.slice(s![b, h / group, .., ..]))
    };
    if flash::stays_finite(&shape, &magnitudes, &masks) {
        // Every head on the tiled path in one call, whose work items span all the heads.
        let heads = out
            .outer_iter_mut()
            .enumerate()
            .map(|(index, out)| {
                let (q, k, v) = head_views(index);
                flash::Head { q, k, v, out }
            })
            .collect();
        flash::attend(kernels, &shape, 1, heads, &masks);
    } else {
        // The blocked path copes with scores that may overflow, and names the query whose does.
        for (index, out_head) in out.outer_iter_mut().enumerate() {
            let (q, k, v) = head_views(index);
            run(&shape, &magnitudes, q, k, v, options, out_head, None)?;
        }
    }
    Ok(into_heads(out, batch, query_heads))
}

/// A decoding step over every (batch, key/value head): the query heads that share a key/value
/// head are stacked as rows of one problem (query-major: row `i · group + g` is query `i` of the
/// group's head `g`), so that its keys and values are read once for all of them, and checked as
/// they are read (see [`decode_checked`]). Returns whether the result stands; if not, the caller
/// checks the inputs in full and computes `out` again.
#[allow(clippy::too_many_arguments)] // one checked problem, passed through unchanged
fn decode_stacked<T: Real>(
    kernels: Isa,
    shape: &Shape,
    q: ArrayView4<T>,
    k: ArrayView4<T>,
    v: ArrayView4<T>,
    masks: &MaskSet<'_, '_, T>,
    out: &mut Array3<T>,
    queries: f64,
) -> bool {
    let [batch, query_heads, n_queries, d_k] = *q.shape() else { unreachable!("4-D view") };
    let kv_heads = k.shape()[1];
    let group = query_heads / kv_heads;
    let rows = n_queries * group;
    let steps: Vec<(usize, usize)> = (0..batch).flat_map(|b| (0..kv_heads).map(move |kv| (b, kv))).collect();
    let stacked: Vec<Array2<T>> = steps
        .iter()
        .map(|&(b, kv)| {
            Array2::from_shape_fn((rows, d_k), |(r, c)| q[[b, kv * group + r % group, r / group, c]])
        })
        .collect();
    let mut stacked_out: Vec<Array2<T>> =
        steps.iter().map(|_| Array2::zeros((rows, shape.value_dim))).collect();
    let heads = steps
        .iter()
        .zip(&stacked)
        .zip(&mut stacked_out)
        .map(|((&(b, kv), q), out)| flash::Head {
            q: q.view(),
            k: k.slice(s![b, kv, .., ..]),
            v: v.slice(s![b, kv, .., ..]),
            out: out.view_mut(),
        })
        .collect();
    let measured = flash::attend(kernels, shape, group, heads, masks);
    for (&(b, kv), stacked_out) in steps.iter().zip(&stacked_out) {
        for (r, row) in stacked_out.outer_iter().enumerate() {
            out.slice_mut(s![b * query_heads + kv * group + r % group, r / group, ..]).assign(&row);
        }
    }
    decode_checked(shape, queries, measured, masks)
}

/// The `[batch · heads, n, d_v]` slabs as `[batch, heads, n, d_v]`.
fn into_heads<T>(out: Array3<T>, batch: usize, heads: usize) -> Array4<T> {
    let (_, n, d_v) = out.dim();
    out.into_shape_with_order((batch, heads, n, d_v)).expect("same length")
}
