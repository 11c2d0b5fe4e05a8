//! Multi-head attention over `[batch, heads, n, d]` tensors, with grouped-query attention
//! (several query heads sharing one key/value head; multi-query attention is one shared head).

use ndarray::{Array2, Array3, Array4, ArrayView4, ArrayViewMut2, s};

use crate::attention::{decode_checked, run};
use crate::error::AttentionError;
use crate::flash;
use crate::kernels::Isa;
use crate::mask::{AttentionOptions, MaskSet};
use crate::real::Real;
use crate::shape::{Magnitudes, Shape, finite_magnitude};
use crate::simd;
use crate::work;

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
    options.resolve(&shape)?;
    let mut heads: Vec<_> = out.outer_iter_mut().collect();
    let work = shape.flops() * heads.len() as f64;
    let attend_head = |(index, out_head): (usize, &mut ArrayViewMut2<T>)| {
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
    };
    let items: Vec<(usize, &mut ArrayViewMut2<T>)> = heads.iter_mut().enumerate().collect();
    // In head order, so that the error reported is the same whichever thread found it first.
    let decoding = flash::decodes(n_queries, &k.slice(s![0, 0, .., ..]));
    work::map_items(items, work::worth_sharing(work, decoding), attend_head)
        .into_iter()
        .collect::<Result<(), _>>()?;
    drop(heads);
    Ok(into_heads(out, batch, query_heads))
}

/// The `[batch · heads, n, d_v]` slabs as `[batch, heads, n, d_v]`.
fn into_heads<T>(out: Array3<T>, batch: usize, heads: usize) -> Array4<T> {
    let (_, n, d_v) = out.dim();
    out.into_shape_with_order((batch, heads, n, d_v)).expect("same length")
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
    let step = |(b, kv): (usize, usize)| {
        let heads = kv * group..(kv + 1) * group;
        let stacked =
            Array2::from_shape_fn((rows, d_k), |(r, c)| q[[b, heads.start + r % group, r / group, c]]);
        let mut stacked_out = Array2::zeros((rows, shape.value_dim));
        let measured = flash::attend(
            kernels,
            shape,
            stacked.view(),
            group,
            k.slice(s![b, kv, .., ..]),
            v.slice(s![b, kv, .., ..]),
            masks,
            stacked_out.view_mut(),
        );
        (stacked_out, decode_checked(shape, queries, measured, masks))
    };
    let steps: Vec<(usize, usize)> = (0..batch).flat_map(|b| (0..kv_heads).map(move |kv| (b, kv))).collect();
    let share = work::worth_sharing(shape.flops() * (batch * query_heads) as f64, true);
    let results = work::map_items(steps.clone(), share, step);
    for (&(b, kv), (stacked_out, _)) in steps.iter().zip(&results) {
        for (r, row) in stacked_out.outer_iter().enumerate() {
            out.slice_mut(s![b * query_heads + kv * group + r % group, r / group, ..]).assign(&row);
        }
    }
    results.iter().all(|(_, stands)| *stands)
}
