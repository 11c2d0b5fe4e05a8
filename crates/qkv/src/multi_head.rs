//! Multi-head attention over `[batch, heads, n, d]` tensors, with grouped-query attention
//! (several query heads sharing one key/value head; multi-query attention is one shared head),
//! and masks per sequence or per head.

use ndarray::{Array2, Array3, Array4, ArrayView4, ArrayViewMut3, ArrayViewMut4, Ix4, s};

use crate::attention::decode_checked;
use crate::blocked;
use crate::error::{AttentionError, Dims};
use crate::flash;
use crate::inputs;
use crate::kernels::{Element, Isa};
use crate::mask::{AttentionOptions, HeadMasks};
use crate::partial::PartialAttention;
use crate::real::Real;
use crate::shape::{Shape, finite_magnitude};
use crate::simd;

/// Attention for every (batch, query head) pair.
///
/// `q` is `[batch, query_heads, n_queries, d_k]`, `k` is `[batch, kv_heads, n_keys, d_k]`, `v` is
/// `[batch, kv_heads, n_keys, d_v]`; `query_heads` must be a multiple of `kv_heads`, and query head
/// `h` reads key/value head `h / (query_heads / kv_heads)`. Returns
/// `[batch, query_heads, n_queries, d_v]`.
///
/// Masks in `options` apply per sequence or per head as their shapes say: a
/// [`KeepMask`](crate::KeepMask) or [`AdditiveBias`](crate::AdditiveBias) of `[n_q, n_k]` applies
/// to every head, `[batch, 1, n_q, n_k]` to every head of its sequence, `[batch, heads, n_q, n_k]`
/// to one head; a [`KeyPadding`](crate::KeyPadding) is `[n_k]` or `[batch, n_k]`;
/// [`key_lengths`](AttentionOptions::key_lengths) has one length per sequence and
/// [`Alibi`](crate::Alibi) one slope per query head.
///
/// ```
/// use ndarray::Array4;
/// use qkv::{AttentionOptions, CausalMask};
/// // Two sequences, 8 query heads sharing 2 key/value heads, 5 tokens, head width 16.
/// let q = Array4::<f32>::from_elem((2, 8, 5, 16), 0.1);
/// let kv = Array4::<f32>::from_elem((2, 2, 5, 16), 0.2);
/// // The second sequence is padding after its third token.
/// let lengths = [5, 3];
/// let options = AttentionOptions::new().causal(CausalMask::BottomRight).key_lengths(&lengths);
/// let out = qkv::multi_head_attention(q.view(), kv.view(), kv.view(), &options)?;
/// assert_eq!(out.shape(), [2, 8, 5, 16]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention<T: Real>(
    q: ArrayView4<T>,
    k: ArrayView4<T>,
    v: ArrayView4<T>,
    options: &AttentionOptions<T>,
) -> Result<Array4<T>, AttentionError> {
    output(q, k, v, options)
}

/// Like [`multi_head_attention`], writing the output into `out`
/// (`[batch, query_heads, n_queries, d_v]`) without allocating it. If the call fails, `out` may
/// hold anything. For a plain row-major slice, view it with [`tensor_mut`](crate::tensor_mut).
///
/// ```
/// let q = ndarray::Array4::<f32>::zeros((1, 4, 2, 8));
/// let kv = ndarray::Array4::<f32>::ones((1, 1, 3, 8));
/// let mut buffer = vec![0.0_f32; 4 * 2 * 8];
/// let out = qkv::tensor_mut("out", &mut buffer, [1, 4, 2, 8])?;
/// qkv::multi_head_attention_into(q.view(), kv.view(), kv.view(), &qkv::AttentionOptions::new(), out)?;
/// assert!(buffer.iter().all(|&x| x == 1.0));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention_into<T: Real>(
    q: ArrayView4<T>,
    k: ArrayView4<T>,
    v: ArrayView4<T>,
    options: &AttentionOptions<T>,
    out: ArrayViewMut4<T>,
) -> Result<(), AttentionError> {
    output_into(q, k, v, options, out)
}

/// Like [`multi_head_attention`], also returning each row's logsumexp, `[batch, query_heads,
/// n_queries]` (see [`PartialAttention`]), so that results over disjoint sets of keys can be
/// [merged](PartialAttention::merge) exactly.
///
/// ```
/// let q = ndarray::Array4::<f32>::zeros((1, 2, 3, 4));
/// let kv = ndarray::Array4::<f32>::zeros((1, 2, 5, 4));
/// let r = qkv::multi_head_attention_with_lse(q.view(), kv.view(), kv.view(), &qkv::AttentionOptions::new())?;
/// // Five equal scores of 0: ln 5.
/// assert!(r.logsumexp.iter().all(|&l| (l - 5.0_f32.ln()).abs() < 1e-6));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention_with_lse<T: Real>(
    q: ArrayView4<T>,
    k: ArrayView4<T>,
    v: ArrayView4<T>,
    options: &AttentionOptions<T>,
) -> Result<PartialAttention<T, Ix4>, AttentionError> {
    output_with_lse(q, k, v, options)
}

/// [`multi_head_attention`] over inputs stored as `E`: `T` itself, or a half-precision format
/// under f32.
pub(crate) fn output<T: Real, E: Element<Compute = T>>(
    q: ArrayView4<E>,
    k: ArrayView4<E>,
    v: ArrayView4<E>,
    options: &AttentionOptions<T>,
) -> Result<Array4<T>, AttentionError> {
    let shape = check_heads(&q, &k, &v)?;
    let [batch, query_heads, n_queries, _] = *q.shape() else { unreachable!("4-D view") };
    let mut out = Array4::zeros((batch, query_heads, n_queries, shape.value_dim));
    attend_heads(&shape, q, k, v, options, out.view_mut(), None)?;
    Ok(out)
}

/// [`multi_head_attention_into`] over inputs stored as `E` into an output stored as `O`.
pub(crate) fn output_into<T: Real, E: Element<Compute = T>, O: Element<Compute = T>>(
    q: ArrayView4<E>,
    k: ArrayView4<E>,
    v: ArrayView4<E>,
    options: &AttentionOptions<T>,
    out: ArrayViewMut4<O>,
) -> Result<(), AttentionError> {
    let shape = check_heads(&q, &k, &v)?;
    let [batch, query_heads, n_queries, _] = *q.shape() else { unreachable!("4-D view") };
    let expected = [batch, query_heads, n_queries, shape.value_dim];
    if out.shape() != expected {
        return Err(AttentionError::OutputShape {
            expected: Dims(expected.to_vec()),
            found: out.shape().into(),
        });
    }
    attend_heads(&shape, q, k, v, options, out, None)
}

/// [`multi_head_attention_with_lse`] over inputs stored as `E`.
pub(crate) fn output_with_lse<T: Real, E: Element<Compute = T>>(
    q: ArrayView4<E>,
    k: ArrayView4<E>,
    v: ArrayView4<E>,
    options: &AttentionOptions<T>,
) -> Result<PartialAttention<T, Ix4>, AttentionError> {
    let shape = check_heads(&q, &k, &v)?;
    let [batch, query_heads, n_queries, _] = *q.shape() else { unreachable!("4-D view") };
    let mut output = Array4::zeros((batch, query_heads, n_queries, shape.value_dim));
    let mut logsumexp = Array3::zeros((batch, query_heads, n_queries));
    attend_heads(&shape, q, k, v, options, output.view_mut(), Some(logsumexp.view_mut()))?;
    Ok(PartialAttention { output, logsumexp })
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

/// Attention for every head of checked tensors into `out` (and `lse`): inputs stored as `E` and
/// the output as `O`, each `T` itself or a half-precision format under `T = f32` (see
/// `attention.rs`'s `attend_output`, which does the same for one head).
fn attend_heads<T: Real, E: Element<Compute = T>, O: Element<Compute = T>>(
    shape: &Shape,
    q: ArrayView4<E>,
    k: ArrayView4<E>,
    v: ArrayView4<E>,
    options: &AttentionOptions<T>,
    mut out: ArrayViewMut4<O>,
    mut lse: Option<ArrayViewMut3<T>>,
) -> Result<(), AttentionError> {
    let [batch, query_heads, _, _] = *q.shape() else { unreachable!("4-D view") };
    let group = query_heads / k.shape()[1];
    let masks = options.resolve_heads(shape, Some((batch, query_heads)))?;
    let kernels = simd::kernels_for(options.simd_level())?;
    if out.is_empty() {
        return Ok(());
    }
    // Heads that share a key/value head and their masks run as the rows of one problem.
    let stack = if masks.vary_by_head() { 1 } else { group };
    if flash::decodes(shape.n_queries * stack, &k.slice(s![0, 0, .., ..])) {
        let queries = finite_magnitude("queries", &q)?;
        let step = Decoding { kernels, shape, q, k, v, masks: &masks, group, stack };
        if step.run(&mut out, lse.as_mut(), queries) {
            return Ok(());
        }
    }
    let checked = inputs::check(&q, k, v, &|index| seen_by_group(&masks, group, index))?;
    let (k, v) = (checked.k.view(), checked.v.view());
    let mut lse_heads = lse.map(|lse| lse.into_outer_iter_mut().flat_map(|b| b.into_outer_iter_mut()));
    let heads =
        out.into_outer_iter_mut().flat_map(|b| b.into_outer_iter_mut()).enumerate().map(|(index, out)| {
            let (b, h) = (index / query_heads, index % query_heads);
            let lse = lse_heads.as_mut().map(|heads| heads.next().expect("one logsumexp row per head"));
            let (k, v) = (k.slice(s![b, h / group, .., ..]), v.slice(s![b, h / group, .., ..]));
            flash::Head { q: q.slice(s![b, h, .., ..]), k, v, out, lse, masks: masks.head(b, h) }
        });
    if flash::stays_finite(shape, &checked.magnitudes, &masks.head(0, 0)) {
        // Every head on the tiled path in one call, whose work items span all the heads.
        flash::attend(kernels, shape, 1, heads.collect());
        return Ok(());
    }
    // The blocked path copes with scores that may overflow, and names the query whose does. It
    // computes in `T` alone, so half-precision inputs are widened for it.
    for (index, flash::Head { q, k, v, out, lse, masks }) in heads.enumerate() {
        let (q, k, v) = (E::computed(q), E::computed(k), E::computed(v));
        blocked::attend(shape, q.view(), k.view(), v.view(), &masks, out, lse, None).map_err(|error| {
            match error {
                AttentionError::ScoreOverflow { query_idx, ty, .. } => AttentionError::ScoreOverflow {
                    query_idx,
                    head: Some((index / query_heads, index % query_heads)),
                    ty,
                },
                error => error,
            }
        })?;
    }
    Ok(())
}

/// A decoding step over every (batch, stack of query heads): the `stack` query heads that share
/// a key/value head (and their masks) are stacked as rows of one problem (query-major: row
/// `i · stack + g` is query `i` of the stack's head `g`), so that its keys and values are read
/// once for all of them, and checked as they are read (see [`decode_checked`]).
struct Decoding<'a, 'm, 'o, T: Real, E> {
    kernels: Isa,
    shape: &'a Shape,
    q: ArrayView4<'a, E>,
    k: ArrayView4<'a, E>,
    v: ArrayView4<'a, E>,
    masks: &'m HeadMasks<'o, 'a, T>,
    /// Query heads per key/value head.
    group: usize,
    /// Query heads per problem: `group`, or 1 when heads have masks of their own.
    stack: usize,
}

impl<T: Real, E: Element<Compute = T>> Decoding<'_, '_, '_, T, E> {
    /// Runs the step into `out` (each row rounded once to `O`) and `lse`. Returns whether the
    /// result stands; if not, the caller checks the inputs in full and computes `out` again.
    fn run<O: Element<Compute = T>>(
        &self,
        out: &mut ArrayViewMut4<O>,
        lse: Option<&mut ArrayViewMut3<T>>,
        queries: f64,
    ) -> bool {
        let Decoding { kernels, shape, q, k, v, masks, group, stack } = *self;
        let [batch, query_heads, n_queries, d_k] = *q.shape() else { unreachable!("4-D view") };
        let rows = n_queries * stack;
        let steps: Vec<(usize, usize)> =
            (0..batch).flat_map(|b| (0..query_heads).step_by(stack).map(move |h| (b, h))).collect();
        let stacked: Vec<Array2<E>> = steps
            .iter()
            .map(|&(b, h)| Array2::from_shape_fn((rows, d_k), |(r, c)| q[[b, h + r % stack, r / stack, c]]))
            .collect();
        let mut stacked_out: Vec<(Array2<T>, ndarray::Array1<T>)> = steps
            .iter()
            .map(|_| (Array2::zeros((rows, shape.value_dim)), ndarray::Array1::zeros(rows)))
            .collect();
        let heads = steps
            .iter()
            .zip(&stacked)
            .zip(&mut stacked_out)
            .map(|((&(b, h), q), (out, lse))| flash::Head {
                q: q.view(),
                k: k.slice(s![b, h / group, .., ..]),
                v: v.slice(s![b, h / group, .., ..]),
                out: out.view_mut(),
                lse: Some(lse.view_mut()),
                masks: masks.head(b, h),
            })
            .collect();
        let measured = flash::attend(kernels, shape, stack, heads);
        let mut lse = lse;
        for (&(b, h), (stacked_out, stacked_lse)) in steps.iter().zip(&stacked_out) {
            for (r, row) in stacked_out.outer_iter().enumerate() {
                out.slice_mut(s![b, h + r % stack, r / stack, ..])
                    .zip_mut_with(&row, |o, &x| *o = O::narrow(x));
                if let Some(lse) = lse.as_mut() {
                    lse[[b, h + r % stack, r / stack]] = stacked_lse[r];
                }
            }
        }
        decode_checked(shape, queries, measured, &masks.head(0, 0))
    }
}
