//! The public entry points for one attention problem, and the results they return.

use std::fmt;
use std::ops::Deref;

use ndarray::{Array1, Array2, ArrayView2, ArrayViewMut1, ArrayViewMut2, Ix2};

use crate::blocked;
use crate::element::Real;
use crate::error::AttentionError;
use crate::finite::finite_magnitude;
use crate::flash;
use crate::fresh::{FreshArray, Output};
use crate::inputs;
use crate::kernels::Element;
use crate::options::AttentionOptions;
use crate::partial::PartialAttention;
use crate::shape::Shape;
use crate::simd;

/// Scaled scores `S = Q·Kᵀ · scale (+ bias)`, `[n_queries, n_keys]`; `-inf` where a pair is hidden.
///
/// Prints as an aligned matrix, four decimals unless the format asks for others (`{:.2}`).
///
/// ```
/// use qkv::ndarray::array;
/// let k = array![[1.0_f64, 0.0], [0.0, 1.0]];
/// let v = array![[2.0], [6.0]];
/// let causal = qkv::AttentionOptions::new().causal(qkv::CausalMask::TopLeft).scale(1.0);
/// let r = qkv::attention_with_weights(k.view(), k.view(), v.view(), &causal)?;
/// assert_eq!(r.scores.to_string(), "1.0000    -inf\n0.0000  1.0000");
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Scores<T>(pub(crate) Array2<T>);

/// Attention weights `P = softmax(S)` by rows, `[n_queries, n_keys]`.
///
/// Each row sums to 1, except a row whose keys are all hidden, which is all 0. Prints as an
/// aligned matrix, like [`Scores`].
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

        impl<T: Real> fmt::Display for $name<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write_aligned(&self.0, f)
            }
        }
    };
}
matrix_newtype!(Scores);
matrix_newtype!(AttentionWeights);

/// Writes `m` one row per line, each column right-aligned to its widest entry, with the format's
/// precision (four decimals by default).
fn write_aligned<T: Real>(m: &Array2<T>, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let digits = f.precision().unwrap_or(4);
    let cells = m.map(|x| format!("{x:.digits$}"));
    let widths: Vec<usize> =
        cells.columns().into_iter().map(|c| c.iter().map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    for (i, row) in cells.rows().into_iter().enumerate() {
        if i > 0 {
            f.write_str("\n")?;
        }
        for (j, (cell, width)) in row.iter().zip(&widths).enumerate() {
            let gap = if j > 0 { "  " } else { "" };
            write!(f, "{gap}{cell:>width$}")?;
        }
    }
    Ok(())
}

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
/// output is a few blocks per thread. With no keys (`n_keys = 0`) every row is 0, as a fully
/// masked row is.
///
/// ```
/// use qkv::ndarray::array;
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
    output(q, k, v, options)
}

/// Like [`attention`], writing the output into `out` (`[n_queries, d_v]`) without allocating it.
/// If the call fails, `out` may hold anything. For a plain row-major slice, view it with
/// [`matrix_mut`](crate::matrix_mut).
///
/// ```
/// use qkv::ndarray::array;
/// let q = array![[0.0_f32, 1.0], [1.0, 0.0]];
/// let k = array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let v = array![[2.0], [6.0], [4.0]];
/// let mut buffer = vec![0.0_f32; 2]; // [n_q, d_v], row-major
/// let out = qkv::matrix_mut("out", &mut buffer, 2, 1)?;
/// qkv::attention_into(q.view(), k.view(), v.view(), &qkv::AttentionOptions::new(), out)?;
/// assert!((buffer[0] - 4.4067).abs() < 1e-4);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_into<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
    out: ArrayViewMut2<T>,
) -> Result<(), AttentionError> {
    output_into(q, k, v, options, out)
}

/// Like [`attention`], also returning each row's logsumexp (see [`PartialAttention`]), so that
/// results over disjoint sets of keys can be [merged](PartialAttention::merge) exactly. Runs on
/// the fast path: the logsumexp is `m + ln l` of its online softmax.
///
/// ```
/// use qkv::ndarray::array;
/// let q = array![[0.0_f64, 1.0]];
/// let k = array![[1.0, 0.0], [0.0, 1.0]];
/// let v = array![[2.0], [6.0]];
/// let r = qkv::attention_with_lse(q.view(), k.view(), v.view(), &qkv::AttentionOptions::new().scale(1.0))?;
/// // Scores 0 and 1: ln(e^0 + e^1).
/// assert!((r.logsumexp[0] - (1.0 + std::f64::consts::E).ln()).abs() < 1e-12);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_with_lse<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<PartialAttention<T>, AttentionError> {
    output_with_lse(q, k, v, options)
}

/// [`attention`] over inputs stored as `E`: `T` itself, or a half-precision format under f32.
pub(crate) fn output<T: Real, E: Element<Compute = T>>(
    q: ArrayView2<E>,
    k: ArrayView2<E>,
    v: ArrayView2<E>,
    options: &AttentionOptions<T>,
) -> Result<Array2<T>, AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let mut out = FreshArray::new((shape.n_queries, shape.value_dim));
    let written = attend_output(&shape, q, k, v, options, out.output(), None);
    out.written(written)
}

/// [`attention_into`] over inputs stored as `E` into an output stored as `O`.
pub(crate) fn output_into<T: Real, E: Element<Compute = T>, O: Element<Compute = T>>(
    q: ArrayView2<E>,
    k: ArrayView2<E>,
    v: ArrayView2<E>,
    options: &AttentionOptions<T>,
    out: ArrayViewMut2<O>,
) -> Result<(), AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    inputs::check_output_shape(&[shape.n_queries, shape.value_dim], out.shape())?;
    attend_output(&shape, q, k, v, options, Output::Held(out), None)
}

/// [`attention_with_lse`] over inputs stored as `E`.
pub(crate) fn output_with_lse<T: Real, E: Element<Compute = T>>(
    q: ArrayView2<E>,
    k: ArrayView2<E>,
    v: ArrayView2<E>,
    options: &AttentionOptions<T>,
) -> Result<PartialAttention<T>, AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let mut logsumexp = Array1::zeros(shape.n_queries);
    let mut output = FreshArray::new((shape.n_queries, shape.value_dim));
    let written = attend_output(&shape, q, k, v, options, output.output(), Some(logsumexp.view_mut()));
    let output = output.written(written)?;
    Ok(PartialAttention { output, logsumexp })
}

/// Output-only attention for a problem whose shapes are checked, over inputs stored as `E` into
/// an output stored as `O` (each `T` itself, or a half-precision format under `T = f32`).
/// Decoding checks its keys and values as it reads them (see [`flash::decode_checked`]); everything else
/// checks its inputs first, then takes the tiled path, unless an intermediate could overflow:
/// then the blocked path runs (on the inputs in `T`), which also names the query whose score
/// overflows.
fn attend_output<'out, T: Real, E: Element<Compute = T>, O: Element<Compute = T>>(
    shape: &Shape,
    q: ArrayView2<E>,
    k: ArrayView2<E>,
    v: ArrayView2<E>,
    options: &AttentionOptions<T>,
    mut out: Output<'out, O, Ix2>,
    mut lse: Option<ArrayViewMut1<'out, T>>,
) -> Result<(), AttentionError> {
    let masks = options.resolve(shape)?;
    let kernels = simd::kernels_for(options.simd_level())?;
    if flash::decodes(shape.n_queries, &k) {
        let queries = finite_magnitude("queries", &q)?;
        let lse = lse.as_mut().map(|lse| lse.view_mut());
        let head = flash::Head { q, k, v, out: out.reborrow(), lse, masks };
        let measured = flash::attend(kernels, shape, 1, vec![head]);
        if flash::decode_checked(shape, queries, measured, &masks) {
            return Ok(());
        }
    }
    let checked = inputs::check(&q, k, v, &|_| masks.seen_keys())?;
    let (k, v) = (checked.k.view(), checked.v.view());
    if flash::stays_finite(shape, &checked.magnitudes, &masks) {
        flash::attend(kernels, shape, 1, vec![flash::Head { q, k, v, out, lse, masks }]);
        return Ok(());
    }
    let (q, k, v) = (E::computed(q), E::computed(k), E::computed(v));
    blocked::attend(shape, q.view(), k.view(), v.view(), &masks, out.held(), lse, None)
}

/// Scaled dot-product attention that also returns the scores and the weight matrix.
///
/// ```
/// use qkv::ndarray::array;
/// let k = array![[1.0_f64, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let v = array![[2.0], [6.0], [4.0]];
/// let r = qkv::attention_with_weights(k.view(), k.view(), v.view(), &qkv::AttentionOptions::new())?;
/// assert_eq!(
///     format!("{:.2}", r.weights),
///     "0.40  0.20  0.40\n0.20  0.40  0.40\n0.25  0.25  0.50"
/// );
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_with_weights<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<Attention<T>, AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let masks = options.resolve(&shape)?;
    // The blocked path runs no SIMD kernels, but a level the CPU lacks is refused alike.
    simd::kernels_for(options.simd_level())?;
    let checked = inputs::check(&q, k, v, &|_| masks.seen_keys())?;
    let mut out = Array2::zeros((shape.n_queries, shape.value_dim));
    let mut scores = Array2::zeros((shape.n_queries, shape.n_keys));
    let mut weights = Array2::zeros((shape.n_queries, shape.n_keys));
    let matrices = Some((scores.view_mut(), weights.view_mut()));
    let (k, v) = (checked.k.view(), checked.v.view());
    blocked::attend(&shape, q, k, v, &masks, out.view_mut(), None, matrices)?;
    Ok(Attention { scores: Scores(scores), weights: AttentionWeights(weights), output: out })
}
