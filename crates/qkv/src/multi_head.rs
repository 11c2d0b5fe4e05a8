//! Multi-head attention over `[batch, heads, n, d]` tensors, with grouped-query attention
//! (several query heads sharing one key/value head; multi-query attention is one shared head),
//! and masks per sequence or per head.

use ndarray::{Array3, Array4, ArrayView4, ArrayViewMut3, ArrayViewMut4, Ix4, s};

use crate::blocked;
use crate::element::Real;
use crate::error::AttentionError;
use crate::finite::finite_magnitude;
use crate::flash;
use crate::flash::StoredKeys;
use crate::fresh::{FreshArray, Output};
use crate::inputs::{self, check_heads, seen_by_group};
use crate::kernels::Element;
use crate::options::AttentionOptions;
use crate::partial::PartialAttention;
use crate::shape::Shape;
use crate::simd;
use crate::step::{self, Step, StepBuffers};

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
/// use qkv::ndarray::Array4;
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
/// let q = qkv::ndarray::Array4::<f32>::zeros((1, 4, 2, 8));
/// let kv = qkv::ndarray::Array4::<f32>::ones((1, 1, 3, 8));
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
    output_into(q, k, v, options, out, None)
}

/// Like [`multi_head_attention`], also returning each row's logsumexp, `[batch, query_heads,
/// n_queries]` (see [`PartialAttention`]), so that results over disjoint sets of keys can be
/// [merged](PartialAttention::merge) exactly.
///
/// ```
/// let q = qkv::ndarray::Array4::<f32>::zeros((1, 2, 3, 4));
/// let kv = qkv::ndarray::Array4::<f32>::zeros((1, 2, 5, 4));
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
    let mut out = FreshArray::new((batch, query_heads, n_queries, shape.value_dim));
    let written = attend_heads(&shape, q, k, v, options, out.output(), None);
    out.written(written)
}

/// [`multi_head_attention_into`] over inputs stored as `E` into an output stored as `O`, and
/// each row's logsumexp into `lse` (`[batch, query_heads, n_queries]`, which the caller shaped)
/// when given.
pub(crate) fn output_into<T: Real, E: Element<Compute = T>, O: Element<Compute = T>>(
    q: ArrayView4<E>,
    k: ArrayView4<E>,
    v: ArrayView4<E>,
    options: &AttentionOptions<T>,
    out: ArrayViewMut4<O>,
    lse: Option<ArrayViewMut3<T>>,
) -> Result<(), AttentionError> {
    let shape = check_heads(&q, &k, &v)?;
    let [batch, query_heads, n_queries, _] = *q.shape() else { unreachable!("4-D view") };
    inputs::check_output_shape(&[batch, query_heads, n_queries, shape.value_dim], out.shape())?;
    attend_heads(&shape, q, k, v, options, Output::Held(out), lse)
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
    let mut logsumexp = Array3::zeros((batch, query_heads, n_queries));
    let mut output = FreshArray::new((batch, query_heads, n_queries, shape.value_dim));
    let written = attend_heads(&shape, q, k, v, options, output.output(), Some(logsumexp.view_mut()));
    let output = output.written(written)?;
    Ok(PartialAttention { output, logsumexp })
}

/// Attention for every head of checked tensors into `out` (and `lse`): inputs stored as `E` and
/// the output as `O`, each `T` itself or a half-precision format under `T = f32` (see
/// `attention.rs`'s `attend_output`, which does the same for one head).
fn attend_heads<'out, T: Real, E: Element<Compute = T>, O: Element<Compute = T>>(
    shape: &Shape,
    q: ArrayView4<E>,
    k: ArrayView4<E>,
    v: ArrayView4<E>,
    options: &AttentionOptions<T>,
    mut out: Output<'out, O, Ix4>,
    mut lse: Option<ArrayViewMut3<'out, T>>,
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
        // Decoding writes the rows it reads the keys for; the output is zeroed for it.
        let mut held = out.held();
        // Decoding reads each key and value once, for every query head of its group, and checks
        // them as it reads them: the inference step the caches take too.
        let queries = finite_magnitude("queries", &q)?;
        let v_tensor = v.to_slice_memory_order();
        let keys = |b: usize, _: usize, kv: usize| StoredKeys::Rows {
            k: k.slice_move(s![b, kv, .., ..]),
            v: v.slice_move(s![b, kv, .., ..]),
            v_tensor,
        };
        let step = Step {
            isa: kernels,
            q,
            kv_heads: k.shape()[1],
            value_dim: shape.value_dim,
            members: batch,
            member: &|b| (b, 0..shape.n_queries),
            n_keys: &|_| shape.n_keys,
            keys: &keys,
            parts: 1,
            masks: &|b, _, h| masks.head(b, h),
            heads_differ: masks.vary_by_head(),
            // Dense callers rotate their queries and keys themselves (`Rotary::rotate`).
            rotary: None,
        };
        let lse = lse.as_mut().map(|lse| lse.view_mut());
        let measured = step::attend(&step, held.view_mut(), lse, &mut StepBuffers::default());
        if flash::decode_checked(shape, queries, measured, &masks.head(0, 0)) {
            return Ok(());
        }
        out = Output::Held(held);
    }
    let checked = inputs::check(&q, k, v, &|index| seen_by_group(&masks, group, index))?;
    let (k, v) = (checked.k.view(), checked.v.view());
    let mut lse_heads = lse.map(|lse| lse.into_outer_iter_mut().flat_map(|b| b.into_outer_iter_mut()));
    let heads = out.into_outer().flat_map(Output::into_outer).enumerate().map(|(index, out)| {
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
    // computes in `T` alone, so half-precision inputs are widened for it, and writes its rows as
    // it goes, so a fresh output is zeroed for it head by head.
    for (index, flash::Head { q, k, v, out, lse, masks }) in heads.enumerate() {
        let (q, k, v) = (E::computed(q), E::computed(k), E::computed(v));
        blocked::attend(shape, q.view(), k.view(), v.view(), &masks, out.held(), lse, None).map_err(
            |error| match error {
                AttentionError::ScoreOverflow { query_idx, ty, .. } => AttentionError::ScoreOverflow {
                    query_idx,
                    head: Some((index / query_heads, index % query_heads)),
                    ty,
                },
                error => error,
            },
        )?;
    }
    Ok(())
}
