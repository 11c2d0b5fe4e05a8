//! Keys and values checked against the masks: one that no query sees may hold anything, and is
//! replaced by zeros before any path reads it; a non-finite one that some query sees is an error
//! naming it.
//!
//! Inference caches keep garbage in their padding, and PyTorch turns a NaN there into NaN outputs
//! everywhere (a hidden weight of 0 times NaN is NaN). Only inputs that fail the plain finiteness
//! check pay for working out which keys are seen, and for the copy.

use ndarray::{ArrayView, ArrayView4, Axis, CowArray, Dimension};

use crate::element::Real;
use crate::error::{AttentionError, Dims};
use crate::finite::finite_magnitude;
use crate::kernels::Element;
use crate::masking::HeadMasks;
use crate::shape::{Magnitudes, Shape};

/// Keys and values as the paths may read them (the caller's own, or copies with the unseen rows
/// zeroed, in the caller's element type), and the largest magnitudes of the inputs.
pub(crate) struct Inputs<'a, T, D: Dimension> {
    pub(crate) k: CowArray<'a, T, D>,
    pub(crate) v: CowArray<'a, T, D>,
    pub(crate) magnitudes: Magnitudes,
}

/// Checks that an output buffer of an `_into` form has the result's shape `expected`.
pub(crate) fn check_output_shape(expected: &[usize], found: &[usize]) -> Result<(), AttentionError> {
    if found != expected {
        return Err(AttentionError::OutputShape { expected: Dims(expected.to_vec()), found: found.into() });
    }
    Ok(())
}

/// Checks `q` (`[.., n_q, d_k]`), `k` (`[.., n_k, d_k]`) and `v` (`[.., n_k, d_v]`): the queries
/// must be finite, the keys and values wherever they are seen. `seen(index)` says which keys of
/// the matrix at leading index `index` (empty for a single head, `[b, kv_head]` for multi-head)
/// some query sees. Elements may be stored in a half-precision format (`E`), measured widened.
pub(crate) fn check<'a, T: Real, E: Element<Compute = T>, D: Dimension>(
    q: &ArrayView<E, D>,
    k: ArrayView<'a, E, D>,
    v: ArrayView<'a, E, D>,
    seen: &dyn Fn(&[usize]) -> Vec<bool>,
) -> Result<Inputs<'a, E, D>, AttentionError> {
    let queries = finite_magnitude("queries", q)?;
    let (k, keys) = seen_rows_finite("keys", k, seen)?;
    let (v, values) = seen_rows_finite("values", v, seen)?;
    Ok(Inputs { k, v, magnitudes: Magnitudes { queries, keys, values } })
}

/// `x` and its largest magnitude if every element is finite; otherwise a copy whose rows no query
/// sees are zero, or the error naming the first non-finite element of a row that is seen.
fn seen_rows_finite<'a, T: Real, E: Element<Compute = T>, D: Dimension>(
    argument: &'static str,
    x: ArrayView<'a, E, D>,
    seen: &dyn Fn(&[usize]) -> Vec<bool>,
) -> Result<(CowArray<'a, E, D>, f64), AttentionError> {
    if let Ok(magnitude) = finite_magnitude(argument, &x) {
        return Ok((CowArray::from(x), magnitude));
    }
    let mut clean = x.to_owned();
    let leading = &x.shape()[..x.ndim() - 2];
    let (rows, cols) = (x.shape()[x.ndim() - 2], x.shape()[x.ndim() - 1]);
    let count = leading.iter().product();
    let mut slabs = clean.view_mut().into_shape_with_order((count, rows, cols)).expect("standard layout");
    for (s, mut slab) in slabs.axis_iter_mut(Axis(0)).enumerate() {
        // Slab `s` unravels against the leading axes, last fastest.
        let mut index = vec![0; leading.len()];
        let mut rest = s;
        for (slot, &len) in index.iter_mut().zip(leading).rev() {
            *slot = rest % len;
            rest /= len;
        }
        let seen = seen(&index);
        for (j, mut row) in slab.axis_iter_mut(Axis(0)).enumerate() {
            if !seen[j] {
                row.fill(E::default());
            } else if let Some((c, value)) = row.iter().enumerate().find(|(_, x)| !x.widen().is_finite()) {
                index.extend([j, c]);
                return Err(AttentionError::NonFinite {
                    argument,
                    index: Dims(index),
                    value: value.widen().to_f64_exact(),
                });
            }
        }
    }
    let magnitude = finite_magnitude(argument, &clean)?;
    Ok((CowArray::from(clean), magnitude))
}

/// Which keys of key/value head `index` (`[batch, kv_head]`; `[]` for a single-head call) some
/// query sees: a key is seen if a query of any of the `group` query heads reading it sees it.
pub(crate) fn seen_by_group<T: Real>(
    masks: &HeadMasks<'_, '_, T>,
    group: usize,
    index: &[usize],
) -> Vec<bool> {
    let (b, kv) = match *index {
        [] => (0, 0),
        [b, kv] => (b, kv),
        _ => unreachable!("[batch, kv_head]"),
    };
    let mut seen = masks.head(b, kv * group).seen_keys();
    for h in kv * group + 1..(kv + 1) * group {
        for (seen, s) in seen.iter_mut().zip(masks.head(b, h).seen_keys()) {
            *seen |= s;
        }
    }
    seen
}

/// Checks that the tensors agree on their batch and head axes, and the shape of one head.
pub(crate) fn check_heads<E>(
    q: &ArrayView4<E>,
    k: &ArrayView4<E>,
    v: &ArrayView4<E>,
) -> Result<Shape, AttentionError> {
    let [batch, query_heads, _, _] = *q.shape() else { unreachable!("4-D view") };
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
    Shape::of_dims(q.shape(), k.shape(), v.shape())
}

/// Checks that `offsets` (the argument `argument`, flash-attn's `cu_seqlens`) cut `rows` packed
/// rows into one run per sequence: `sequences + 1` offsets from 0 to `rows`, never decreasing.
pub(crate) fn check_offsets(
    argument: &'static str,
    offsets: &[usize],
    sequences: usize,
    rows: usize,
) -> Result<(), AttentionError> {
    let why = if offsets.len() != sequences + 1 {
        "one offset per sequence and one for the end"
    } else if offsets.first() != Some(&0) || offsets.last() != Some(&rows) {
        "they start at 0 and end at the number of packed rows"
    } else if offsets.windows(2).any(|w| w[0] > w[1]) {
        "they never decrease"
    } else {
        return Ok(());
    };
    Err(AttentionError::PackedOffsets { argument, offsets: offsets.into(), sequences, rows, why })
}
