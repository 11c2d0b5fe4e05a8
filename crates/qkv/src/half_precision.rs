//! The half-precision entry points: attention over `half::bf16` and `half::f16` keys, values and
//! queries, widened to f32 as the kernels load them, with f32 scores, softmax and accumulation;
//! outputs in those formats on request, each row rounded once from f32.
//!
//! They are functions of their own rather than a generic `attention` because `attention::<T>`
//! returns `T` and takes its options (masks, bias, scale) in `T`, which a half type cannot be
//! without arithmetic of its own; and embedders keep the signature they know. Inside, a half
//! call takes the f32 call's path, generic over the stored element: only the blocked fallback
//! (for inputs whose f32 scores could overflow) computes in the compute type alone, through
//! `Element::computed`, which gives it a widened f32 copy of each half input.

use ndarray::{Array2, Array4, ArrayView2, ArrayView4, ArrayViewMut2, ArrayViewMut4, Ix4};

use crate::attention;
use crate::element::{Half, Storage};
use crate::error::AttentionError;
use crate::multi_head;
use crate::options::AttentionOptions;
use crate::partial::PartialAttention;

/// Scaled dot-product attention, output only, over half-precision inputs: like
/// [`attention`](fn@crate::attention), with `q`, `k` and `v` stored as bf16 or f16 and computed in
/// f32 (scores, softmax and `P·V` alike). The kernels widen each key and value as they load it,
/// so a step bound by memory reads half the bytes of f32. Masks, bias and scale come in f32.
///
/// At [`SimdLevel::Amx`](crate::SimdLevel::Amx) and
/// [`SimdLevel::Avx512Bf16`](crate::SimdLevel::Avx512Bf16) (chosen by default where the CPU has
/// them) bf16 inputs are multiplied as bf16 instead: the scores are the same exact products
/// summed in f32, but the weights are rounded to bf16 before `P·V`, as PyTorch's bf16 kernel
/// rounds them, so an output may move by up to 2^-8 of the largest `|v|`. Ask for
/// [`SimdLevel::Avx512`](crate::SimdLevel::Avx512) with
/// [`AttentionOptions::simd`](crate::AttentionOptions::simd) to keep f32 weights.
///
/// Inputs are checked as [`attention`](fn@crate::attention) checks them: a non-finite element that
/// no query sees is read as 0, one that is seen is an error naming it. Inputs so large that an
/// f32 score or sum could overflow are widened to f32 and take the checked path, which names the
/// query whose score overflows.
///
/// ```
/// use qkv::half::bf16;
/// use qkv::ndarray::array;
/// let q = array![[0.0_f32, 1.0]].mapv(bf16::from_f32);
/// let k = array![[1.0_f32, 0.0], [0.0, 1.0], [1.0, 1.0]].mapv(bf16::from_f32);
/// let v = array![[2.0_f32], [6.0], [4.0]].mapv(bf16::from_f32);
/// let out = qkv::attention_half(q.view(), k.view(), v.view(), &qkv::AttentionOptions::new())?;
/// assert!((out[[0, 0]] - 4.4067).abs() < 1e-4); // these inputs are exact in bf16
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_half<H: Half>(
    q: ArrayView2<H>,
    k: ArrayView2<H>,
    v: ArrayView2<H>,
    options: &AttentionOptions<f32>,
) -> Result<Array2<f32>, AttentionError> {
    attention::output(q, k, v, options)
}

/// Like [`attention_half`], also returning each row's logsumexp in f32 (see
/// [`PartialAttention`]), so that results over disjoint keys [merge](PartialAttention::merge).
///
/// ```
/// use qkv::half::f16;
/// let q = qkv::ndarray::Array2::from_elem((2, 4), f16::ONE);
/// let kv = qkv::ndarray::Array2::from_elem((3, 4), f16::ZERO);
/// let r = qkv::attention_half_with_lse(q.view(), kv.view(), kv.view(), &qkv::AttentionOptions::new())?;
/// // Three equal scores of 0: ln 3.
/// assert!(r.logsumexp.iter().all(|&l| (l - 3f32.ln()).abs() < 1e-6));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_half_with_lse<H: Half>(
    q: ArrayView2<H>,
    k: ArrayView2<H>,
    v: ArrayView2<H>,
    options: &AttentionOptions<f32>,
) -> Result<PartialAttention<f32>, AttentionError> {
    attention::output_with_lse(q, k, v, options)
}

/// Like [`attention_half`], writing the output into `out` (`[n_queries, d_v]`), whose elements
/// may be f32, bf16 or f16 ([`Storage`]): each row is computed and normalised in f32, then
/// rounded once to `O` (to nearest, ties to even, as `O::from_f32`), so a bf16 output is the
/// f32 output rounded. Nothing is accumulated in half precision. If the call fails, `out` may
/// hold anything.
///
/// ```
/// use qkv::half::bf16;
/// use qkv::ndarray::{Array2, array};
/// let q = array![[0.0_f32, 1.0]].mapv(bf16::from_f32);
/// let k = array![[1.0_f32, 0.0], [0.0, 1.0], [1.0, 1.0]].mapv(bf16::from_f32);
/// let v = array![[2.0_f32], [6.0], [4.0]].mapv(bf16::from_f32);
/// let options = qkv::AttentionOptions::new();
/// let mut out = Array2::<bf16>::zeros((1, 1));
/// qkv::attention_half_into(q.view(), k.view(), v.view(), &options, out.view_mut())?;
/// let f32_out = qkv::attention_half(q.view(), k.view(), v.view(), &options)?;
/// assert_eq!(out[[0, 0]], bf16::from_f32(f32_out[[0, 0]]));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_half_into<H: Half, O: Storage>(
    q: ArrayView2<H>,
    k: ArrayView2<H>,
    v: ArrayView2<H>,
    options: &AttentionOptions<f32>,
    out: ArrayViewMut2<O>,
) -> Result<(), AttentionError> {
    attention::output_into(q, k, v, options, out)
}

/// Multi-head attention over half-precision inputs: like
/// [`multi_head_attention`](crate::multi_head_attention) (`[batch, heads, n, d]` tensors,
/// grouped-query heads, masks per sequence or per head), with `q`, `k` and `v` stored as bf16 or
/// f16 and computed in f32, on the same path as f32: a decoding step stacks the query heads of a
/// group and reads each key and value once, widening it as it loads it. Inputs are checked and
/// widened as in [`attention_half`]. Returns `[batch, query_heads, n_queries, d_v]` in f32.
///
/// ```
/// use qkv::half::bf16;
/// use qkv::ndarray::Array4;
/// // 8 query heads over 2 key/value heads, one decoding query each.
/// let q = Array4::from_elem((1, 8, 1, 16), bf16::from_f32(0.25));
/// let kv = Array4::from_elem((1, 2, 5, 16), bf16::from_f32(0.5));
/// let out = qkv::multi_head_attention_half(q.view(), kv.view(), kv.view(), &qkv::AttentionOptions::new())?;
/// assert_eq!(out.shape(), [1, 8, 1, 16]);
/// assert!(out.iter().all(|&x| x == 0.5));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention_half<H: Half>(
    q: ArrayView4<H>,
    k: ArrayView4<H>,
    v: ArrayView4<H>,
    options: &AttentionOptions<f32>,
) -> Result<Array4<f32>, AttentionError> {
    multi_head::output(q, k, v, options)
}

/// Like [`multi_head_attention_half`], also returning each row's logsumexp in f32, `[batch,
/// query_heads, n_queries]` (see [`PartialAttention`]).
///
/// ```
/// use qkv::half::f16;
/// let q = qkv::ndarray::Array4::from_elem((1, 2, 3, 4), f16::ZERO);
/// let kv = qkv::ndarray::Array4::from_elem((1, 1, 5, 4), f16::ONE);
/// let r = qkv::multi_head_attention_half_with_lse(q.view(), kv.view(), kv.view(), &qkv::AttentionOptions::new())?;
/// assert_eq!(r.logsumexp.shape(), [1, 2, 3]);
/// assert!(r.logsumexp.iter().all(|&l| (l - 5f32.ln()).abs() < 1e-6));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention_half_with_lse<H: Half>(
    q: ArrayView4<H>,
    k: ArrayView4<H>,
    v: ArrayView4<H>,
    options: &AttentionOptions<f32>,
) -> Result<PartialAttention<f32, Ix4>, AttentionError> {
    multi_head::output_with_lse(q, k, v, options)
}

/// Like [`multi_head_attention_half`], writing the output into `out` (`[batch, query_heads,
/// n_queries, d_v]`) of f32, bf16 or f16, each row rounded once from its f32 result (see
/// [`attention_half_into`]). If the call fails, `out` may hold anything.
///
/// ```
/// use qkv::half::bf16;
/// use qkv::ndarray::Array4;
/// let q = Array4::from_elem((2, 4, 1, 8), bf16::from_f32(0.5));
/// let kv = Array4::from_shape_fn((2, 2, 3, 8), |(b, h, j, c)| bf16::from_f32((b + h + j + c) as f32 / 8.0));
/// let options = qkv::AttentionOptions::new();
/// let mut out = Array4::<bf16>::zeros((2, 4, 1, 8));
/// qkv::multi_head_attention_half_into(q.view(), kv.view(), kv.view(), &options, out.view_mut())?;
/// let f32_out = qkv::multi_head_attention_half(q.view(), kv.view(), kv.view(), &options)?;
/// assert_eq!(out, f32_out.mapv(bf16::from_f32));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention_half_into<H: Half, O: Storage>(
    q: ArrayView4<H>,
    k: ArrayView4<H>,
    v: ArrayView4<H>,
    options: &AttentionOptions<f32>,
    out: ArrayViewMut4<O>,
) -> Result<(), AttentionError> {
    multi_head::output_into(q, k, v, options, out, None)
}
