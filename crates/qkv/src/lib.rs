//! qkv: scaled dot-product attention on the CPU.
//!
//! `softmax(Q·Kᵀ / sqrt(d_k) + mask) · V` for one head ([`attention`](fn@attention),
//! [`attention_with_weights`]), many heads with grouped-query sharing ([`multi_head_attention`]),
//! and self-attention from embeddings ([`Projections`]); causal, sliding-window, boolean, padding, key-length, additive
//! and ALiBi masks, per sequence or per head ([`AttentionOptions`]); each row's logsumexp and the
//! exact merge of results over disjoint keys ([`attention_with_lse`], [`PartialAttention::merge`]);
//! logit soft-capping ([`AttentionOptions::logit_softcap`]); attention sinks, one logit per query
//! head with its gradient ([`AttentionOptions::sinks`]); a KV cache for decoding ([`KvCache`],
//! f32, bf16 or f16 storage, or int8 with a scale per position and head ([`Q8`]), under f32
//! queries) whose steps take the same options
//! ([`CacheOptions`]) and allocate nothing once warm; bf16 and f16 inputs for one head or many
//! ([`attention_half`], [`multi_head_attention_half`]) and bf16 or f16 outputs on request (their
//! `_into` forms and the caches' [`attend_into`](CacheLayer::attend_into)), each row computed in
//! f32 and rounded once; the backward, `dQ`, `dK`, `dV` (and a bias's and the sinks' gradients)
//! from the saved logsumexp ([`attention_backward`], [`multi_head_attention_backward`], and
//! [`attention_backward_half`], [`multi_head_attention_backward_half`] for bf16 and f16 inputs);
//! a worked trace of one query ([`trace_query`]) and of its tiled online softmax
//! ([`trace_tiled`]). Inputs are `ndarray` views of `f32` or `f64`
//! (this crate's `ndarray` is re-exported as [`qkv::ndarray`](ndarray), so an embedder on another
//! version can build views with it); [`matrix`] and [`tensor`] view flat slices, and
//! [`matrix_mut`] and [`tensor_mut`] let the `_into` functions write into them.
//!
//! For inference, [`KvCache`] holds one sequence's keys and values packed for the kernels (or,
//! made [`with_window`](KvCache::with_window), a ring buffer of a sliding window's, which can
//! keep its first positions as sink tokens, [`with_sink_tokens`](KvCache::with_sink_tokens)), and
//! [`PagedKvCache`] many sequences in fixed-size blocks of one pool (fork with copy on write,
//! truncate, evict what a sliding window left behind, free), attending with a whole ragged batch's new queries in one call; a warm
//! batched decoding step allocates nothing. Both caches can turn keys and queries by a rotary
//! position embedding as they store and attend ([`Rotary`]: Hugging Face Llama's half-split
//! pairs, or GPT-J's [`interleaved`](Rotary::interleaved) ones), by absolute position. Two
//! kinds of "sinks" are different things: [`AttentionOptions::sinks`] are learned logits (gpt-oss),
//! [`KvCache::with_sink_tokens`] keeps a sequence's first positions (StreamingLLM). The caches,
//! their ids and the errors are `Send` and `Sync`; every change and every step takes `&mut`, so
//! threads that share a cache share it behind one lock (or each owns its own). Walk-throughs:
//! `examples/tiny_decoder.rs` (a decoder over a [`KvCache`]) and `examples/serve_batch.rs` (a
//! ragged batch over a [`PagedKvCache`]) in the crate's repository. [`varlen_attention`] runs a packed batch of
//! sequences of different lengths without padding (flash-attn's `cu_seqlens`), in one call, and
//! [`varlen_attention_backward`] its gradients.
//!
//! Every path is checked against [`reference`](mod@reference), a plain f64 implementation. Results do not depend
//! on the number of threads. The engine does no I/O.
//!
//! The work runs on the caller's current rayon thread pool: the global pool, or inside
//! [`rayon::ThreadPool::install`](https://docs.rs/rayon/latest/rayon/struct.ThreadPool.html#method.install)
//! the pool you chose (a pool of one thread runs everything on the calling thread), or, inside
//! [`with_thread_team`], on threads another library already keeps ([`ThreadTeam`]: the Python
//! package runs qkv on PyTorch's OpenMP threads this way).
//!
//! ```
//! use qkv::ndarray::array;
//! use qkv::{AttentionOptions, CausalMask};
//!
//! // "I love NLP": keys and values for three tokens, queries for all three (self-attention).
//! let k = array![[1.0_f64, 0.0], [0.0, 1.0], [1.0, 1.0]];
//! let v = array![[2.0], [6.0], [4.0]];
//! let result = qkv::attention_with_weights(k.view(), k.view(), v.view(), &AttentionOptions::new())?;
//! assert!((result.weights[[1, 0]] - 0.1978).abs() < 1e-4); // "love" looking at "I"
//!
//! // With a causal mask the first token can only see itself.
//! let causal = AttentionOptions::new().causal(CausalMask::BottomRight);
//! let out = qkv::attention(k.view(), k.view(), v.view(), &causal)?;
//! assert_eq!(out[[0, 0]], 2.0);
//! # Ok::<(), qkv::AttentionError>(())
//! ```

// `unsafe` lives in the kernels, where a detected CPU feature makes it sound, in the work
// sharing's two scheduler calls (`work/cpu.rs`), and where fresh outputs are taken as written
// (`fresh.rs`).
#![deny(unsafe_code)]

mod attention;
mod backward;
mod blocked;
mod element;
mod error;
mod finite;
mod flash;
#[allow(unsafe_code)]
mod fresh;
mod half_precision;
mod inputs;
#[cfg(all(debug_assertions, not(test)))]
mod instances;
#[allow(unsafe_code)]
mod kernels;
mod kv_cache;
mod level;
mod mask;
mod masking;
mod multi_head;
mod options;
mod paged;
mod partial;
mod projection;
pub mod reference;
mod rotary;
mod shape;
mod simd;
mod softmax;
mod spare;
mod step;
mod varlen;
mod work;

/// The `ndarray` this crate takes and returns, so that an embedder on another version of
/// `ndarray` can name the same types (`qkv::ndarray::ArrayView2`).
pub use ndarray;

/// The `half` crate this one stores bf16 and f16 in (with its `num-traits` feature on), so that
/// an embedder can name `qkv::half::bf16` without a `half` dependency of their own.
pub use half;

pub use attention::{
    Attention, AttentionWeights, Scores, attention, attention_into, attention_with_lse,
    attention_with_weights,
};
pub use backward::{
    Gradients, GradientsMut, attention_backward, attention_backward_half, attention_backward_into,
    multi_head_attention_backward, multi_head_attention_backward_half, multi_head_attention_backward_into,
};
pub use element::{CacheStorage, Half, Q8, Real, Storage};
pub use error::{AttentionError, Dims};
pub use half_precision::{
    attention_half, attention_half_into, attention_half_with_lse, multi_head_attention_half,
    multi_head_attention_half_into, multi_head_attention_half_with_lse,
};
#[cfg(all(debug_assertions, not(test)))]
#[doc(hidden)]
pub use instances::entry_points;
pub use kv_cache::{CacheLayer, CacheShape, KvCache};
pub use level::SimdLevel;
pub use mask::{AdditiveBias, Alibi, CausalMask, KeepMask, KeyPadding, SlidingWindow, alibi_slopes};
pub use multi_head::{multi_head_attention, multi_head_attention_into, multi_head_attention_with_lse};
pub use options::{AttentionOptions, CacheOptions};
pub use paged::{PagedKvCache, PagedLayer, PagedShape, SequenceId};
pub use partial::{Part, PartialAttention};
pub use projection::{Projected, Projections};
pub use reference::{QueryTrace, TiledBlock, TiledTrace, trace_query, trace_tiled};
pub use rotary::{Rotary, RotaryPairing};
pub use shape::Shape;
pub use simd::simd_report;
pub use varlen::{
    varlen_attention, varlen_attention_backward, varlen_attention_backward_into, varlen_attention_into,
    varlen_attention_with_lse,
};
pub use work::{ThreadTeam, with_thread_team};

/// Views a flat row-major slice as a `[rows, cols]` matrix, for embedders that hold plain slices.
/// The slice must hold exactly `rows · cols` elements; `argument` names it in the error if not.
///
/// ```
/// let data = [1.0_f32, 0.0, 0.0, 1.0, 1.0, 1.0];
/// let keys = qkv::matrix("keys", &data, 3, 2)?;
/// assert_eq!(keys[[2, 1]], 1.0);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn matrix<'a, T>(
    argument: &'static str,
    data: &'a [T],
    rows: usize,
    cols: usize,
) -> Result<ndarray::ArrayView2<'a, T>, AttentionError> {
    exact_length(argument, data.len(), &[rows, cols])?;
    Ok(ndarray::ArrayView2::from_shape((rows, cols), data).expect("the length fits"))
}

/// Views a flat row-major slice as a writable `[rows, cols]` matrix: the output of
/// [`attention_into`] in a plain slice.
///
/// ```
/// let mut data = vec![0.0_f32; 6];
/// qkv::matrix_mut("out", &mut data, 2, 3)?[[1, 2]] = 5.0;
/// assert_eq!(data[5], 5.0);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn matrix_mut<'a, T>(
    argument: &'static str,
    data: &'a mut [T],
    rows: usize,
    cols: usize,
) -> Result<ndarray::ArrayViewMut2<'a, T>, AttentionError> {
    exact_length(argument, data.len(), &[rows, cols])?;
    Ok(ndarray::ArrayViewMut2::from_shape((rows, cols), data).expect("the length fits"))
}

/// Views a flat row-major slice as a `[batch, heads, n, d]` tensor, for
/// [`multi_head_attention`].
///
/// ```
/// let data = vec![0.5_f32; 2 * 4 * 3 * 8];
/// let q = qkv::tensor("q", &data, [2, 4, 3, 8])?;
/// assert_eq!(q.shape(), [2, 4, 3, 8]);
/// assert!(qkv::tensor("q", &data, [2, 4, 3, 7]).is_err());
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn tensor<'a, T>(
    argument: &'static str,
    data: &'a [T],
    shape: [usize; 4],
) -> Result<ndarray::ArrayView4<'a, T>, AttentionError> {
    exact_length(argument, data.len(), &shape)?;
    Ok(ndarray::ArrayView4::from_shape(shape, data).expect("the length fits"))
}

/// Views a flat row-major slice as a writable `[batch, heads, n, d]` tensor: the output of
/// [`multi_head_attention_into`] in a plain slice.
///
/// ```
/// let mut data = vec![0.0_f32; 2 * 3];
/// let out = qkv::tensor_mut("out", &mut data, [1, 2, 1, 3])?;
/// assert_eq!(out.shape(), [1, 2, 1, 3]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn tensor_mut<'a, T>(
    argument: &'static str,
    data: &'a mut [T],
    shape: [usize; 4],
) -> Result<ndarray::ArrayViewMut4<'a, T>, AttentionError> {
    exact_length(argument, data.len(), &shape)?;
    Ok(ndarray::ArrayViewMut4::from_shape(shape, data).expect("the length fits"))
}

/// Fails unless a slice of `len` elements holds exactly a row-major array of shape `shape`: a
/// longer slice is as likely a mistake as a shorter one.
fn exact_length(argument: &'static str, len: usize, shape: &[usize]) -> Result<(), AttentionError> {
    match shape.iter().try_fold(1_usize, |n, &d| n.checked_mul(d)) {
        Some(n) if n == len => Ok(()),
        _ => Err(AttentionError::SliceLength { argument, len, shape: shape.into() }),
    }
}

/// The crate's own README (its crates.io page), compiled and run as a doctest so it cannot rot.
/// Only files inside the package may be included: the packaged crate is tested without the
/// workspace (the workspace README's example is `qkv-course`'s doctest).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct CrateReadmeExample;
