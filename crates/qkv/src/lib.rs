//! qkv: scaled dot-product attention on the CPU.
//!
//! `softmax(Q·Kᵀ / sqrt(d_k) + mask) · V` for one head ([`attention`], [`attention_with_weights`]),
//! many heads with grouped-query sharing ([`multi_head_attention`]), and self-attention from
//! embeddings ([`Projections`]); causal, boolean, padding and additive masks
//! ([`AttentionOptions`]); a worked trace of one query ([`trace_query`]). Inputs are `ndarray`
//! views of `f32` or `f64`; [`matrix`] views a flat slice.
//!
//! Every path is checked against [`reference`](mod@reference), a plain f64 implementation. Results do not depend
//! on the number of threads. The engine does no I/O.
//!
//! ```
//! use ndarray::array;
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

mod attention;
mod blocked;
mod error;
mod flash;
mod half;
mod kernels;
mod kv_cache;
mod mask;
mod multi_head;
mod projection;
mod real;
pub mod reference;
mod shape;
mod simd;
mod work;

pub use attention::{Attention, AttentionWeights, Scores, attention, attention_into, attention_with_weights};
pub use error::{AttentionError, Dims};
pub use half::{Half, Storage, attention_half};
pub use kv_cache::{CacheLayer, CacheShape, KvCache};
pub use mask::{AdditiveBias, AttentionOptions, CausalMask, KeepMask, KeyPadding};
pub use multi_head::multi_head_attention;
pub use projection::{Projected, Projections};
pub use real::Real;
pub use reference::{QueryTrace, trace_query};
pub use shape::Shape;
pub use simd::{SimdLevel, simd_report};

/// Views a flat row-major slice as a `[rows, cols]` matrix, for embedders that hold plain slices.
/// `argument` names the slice in the error if its length does not fit.
pub fn matrix<'a, T>(
    argument: &'static str,
    data: &'a [T],
    rows: usize,
    cols: usize,
) -> Result<ndarray::ArrayView2<'a, T>, AttentionError> {
    ndarray::ArrayView2::from_shape((rows, cols), data).map_err(|_| AttentionError::SliceLength {
        argument,
        len: data.len(),
        rows,
        cols,
    })
}

/// The workspace README's embedding example, compiled and run as a doctest so it cannot rot.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeExample;
