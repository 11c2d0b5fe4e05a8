//! The public entry points for one attention problem, and the results they return.

use std::ops::Deref;

use ndarray::{Array2, ArrayView2, ArrayViewMut2};

use crate::blocked;
use crate::error::{AttentionError, Dims};
use crate::flash;
use crate::mask::AttentionOptions;
use crate::real::Real;
use crate::shape::{Magnitudes, Shape, finite_magnitude};
use crate::simd;

/// Scaled scores `S = Q·Kᵀ · scale (+ bias)`, `[n_queries, n_keys]`; `-inf` where a pair is hidden.
#[derive(Debug, Clone, PartialEq)]
pub struct Scores<T>(pub(crate) Array2<T>);

/// Attention weights `P = softmax(S)` by rows, `[n_queries, n_keys]`.
///
/// Each row sums to 1, except a row whose keys are all hidden, which is all 0.
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionWeights<T>(pub(crate) Array2<T>);

macro_rules! matrix_newtype {
    ($name:ident) => {
        impl<T> $name<T> {
            /// The matrix itself.
            pub fn into_inner(self) -> Array2<T> {
                self.0
            }
        }

        impl<T> Deref for $name<T> {
            type Target = Array2<T>;

            fn deref(&self) -> &Array2<T> {
                &self.0
            }
        }
    };
}
matrix_newtype!(Scores);
matrix_newtype!(AttentionWeights);

/// Attention with its intermediate matrices, for teaching and figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Attention<T> {
    /// The scaled scores `S`.
    pub scores: Scores<T>,
    /// The weights `P`.
    pub weights: AttentionWeights<T>,
    /// The output `O = P·V`, `[n_queries, d_v]`.
    pub output: Array2<T>,
}

/// Scaled dot-product attention, output only: `softmax(Q·Kᵀ · scale + mask) · V`.
///
/// `q` is `[n_queries, d_k]`, `k` is `[n_keys, d_k]`, `v` is `[n_keys, d_v]`; the result is
/// `[n_queries, d_v]`. No `n_queries × n_keys` matrix is kept: memory beyond the inputs and
/// output is a few blocks per thread.
///
/// ```
/// use ndarray::array;
/// let q = array![[0.0_f32, 1.0]];
/// let k = array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let v = array![[2.0], [6.0], [4.0]];
/// let out = qkv::attention(q.view(), k.view(), v.view(), &qkv::AttentionOptions::new())?;
/// assert!((out[[0, 0]] - 4.4067).abs() < 1e-4);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<Array2<T>, AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let mut out = Array2::zeros((shape.n_queries, shape.value_dim));
    attend_output(&shape, q, k, v, options, out.view_mut())?;
    Ok(out)
}

/// Like [`attention`], writing the output into `out` (`[n_queries, d_v]`) without allocating it.
/// If the call fails, `out` may hold anything.
pub fn attention_into<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
    out: ArrayViewMut2<T>,
) -> Result<(), AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    if out.shape() != [shape.n_queries, shape.value_dim] {
        return Err(AttentionError::OutputShape {
            expected: Dims(vec![shape.n_queries, shape.value_dim]),
            found: out.shape().into(),
        });
    }
    attend_output(&shape, q, k, v, options, out)
}

/// Output-only attention for a problem whose shapes are checked. Decoding checks its keys and
/// values as it reads them (see [`decode_checked`]); everything else checks its inputs first.
fn attend_output<T: Real>(
    shape: &Shape,
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
    mut out: ArrayViewMut2<T>,
) -> Result<(), AttentionError> {
    if flash::decodes(shape.n_queries, &k) {
        let queries = finite_magnitude("queries", &q)?;
        let masks = options.resolve(shape)?;
        let kernels = simd::kernels_for(options.simd_level())?;
        let measured =
            flash::attend(kernels, shape, 1, vec![flash::Head { q, k, v, out: out.view_mut() }], &masks);
        if decode_checked(shape, queries, measured, &masks) {
            return Ok(());
        }
    }
    let magnitudes = Magnitudes::measure(&q, &k, &v)?;
    run(shape, &magnitudes, q, k, v, options, out, None)
}

/// Whether a decoding step's result stands: every key and value it read was finite, and with the
/// magnitudes it measured no intermediate could have overflowed ([`flash::stays_finite`]).
/// Otherwise the caller checks the inputs in full, which names a non-finite one, and runs the
/// path that suits them, overwriting the output.
///
/// Decoding reads each key and value once, so checking them in the same pass, rather than in a
/// pass of their own beforehand, halves its memory traffic.
pub(crate) fn decode_checked<T: Real>(
    shape: &Shape,
    queries: f64,
    measured: Option<flash::Measured<T>>,
    masks: &crate::mask::MaskSet<'_, '_, T>,
) -> bool {
    let Some(measured) = measured else { return false };
    let magnitudes =
        Magnitudes { queries, keys: measured.keys.to_f64_exact(), values: measured.values.to_f64_exact() };
    magnitudes.keys.is_finite()
        && magnitudes.values.is_finite()
        && flash::stays_finite(shape, &magnitudes, masks)
}

/// Scaled dot-product attention that also returns the scores and the weight matrix.
pub fn attention_with_weights<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<Attention<T>, AttentionError> {
    let (shape, magnitudes) = Shape::check_measured(&q, &k, &v)?;
    let mut out = Array2::zeros((shape.n_queries, shape.value_dim));
    let mut scores = Array2::zeros((shape.n_queries, shape.n_keys));
    let mut weights = Array2::zeros((shape.n_queries, shape.n_keys));
    let matrices = Some((scores.view_mut(), weights.view_mut()));
    run(&shape, &magnitudes, q, k, v, options, out.view_mut(), matrices)?;
    Ok(Attention { scores: Scores(scores), weights: AttentionWeights(weights), output: out })
}

/// Resolves the masks, then hands a checked problem to a path.
#[allow(clippy::too_many_arguments)] // one checked problem, passed through unchanged
pub(crate) fn run<T: Real>(
    shape: &Shape,
    magnitudes: &Magnitudes,
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
    out: ArrayViewMut2<T>,
    matrices: Option<(ArrayViewMut2<T>, ArrayViewMut2<T>)>,
) -> Result<(), AttentionError> {
    let masks = options.resolve(shape)?;
    let kernels = simd::kernels_for(options.simd_level())?;
    match matrices {
        // Output only: the tiled path, unless an intermediate could overflow (then the blocked
        // path runs, which also names the query whose score overflows).
        None if flash::stays_finite(shape, magnitudes, &masks) => {
            flash::attend(kernels, shape, 1, vec![flash::Head { q, k, v, out }], &masks);
            Ok(())
        }
        // The weights are an `n_q × n_k` matrix by definition: the blocked path fills it.
        _ => blocked::attend(shape, q, k, v, &masks, out, matrices),
    }
}
