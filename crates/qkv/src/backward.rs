//! The backward of attention: the gradients of the queries, keys, values (and an additive bias)
//! from the gradient of the output and what the forward saved (its output and logsumexp).
//!
//! The public entry points (for f32 and f64 inputs, and the `_half` ones for bf16 and f16,
//! widened as the tiled path packs them) check their arguments here, once, as the forward's do;
//! the tiled algorithm is `backward/tiled.rs`, and the f64 oracle `reference::attention_backward`.

mod tiled;

use ndarray::{
    Array, Array1, ArrayBase, ArrayView, ArrayView2, ArrayView4, ArrayViewMut, ArrayViewMut1, Axis, Data,
    Dimension, Ix2, Ix3, Ix4, RawData,
};

use crate::element::{Half, Real};
use crate::error::{AttentionError, Dims};
use crate::finite::finite_magnitude;
use crate::inputs;
use crate::inputs::{check_heads, seen_by_group};
use crate::kernels::Element;
use crate::options::AttentionOptions;
use crate::partial::PartialAttention;
use crate::shape::Shape;
use crate::simd;

/// The gradients of a loss `L` with respect to attention's inputs: `dq = ∂L/∂Q`, `dk = ∂L/∂K`,
/// `dv = ∂L/∂V`, each shaped as its input, and `dbias = ∂L/∂S`, the gradient of an additive bias
/// (`[n_q, n_k]`, or `[batch, query_heads, n_q, n_k]` for multi-head: one slice per head), present
/// when the options carry an [`AdditiveBias`](crate::AdditiveBias).
///
/// A bias shared by several heads or sequences (a `[n_q, n_k]` or `[batch, 1, n_q, n_k]` bias in a
/// multi-head call) has as its gradient the sum of `dbias` over the axes it is shared along.
/// `dsinks = ∂L/∂s`, one per query head, is there when the options carry attention sinks
/// ([`AttentionOptions::sinks`]): `-Σ exp(s_h - lse_i) · rowsum(dO ∘ O)_i` over every row `i` of
/// head `h` (of every sequence: a sink is shared by the batch).
///
/// ```
/// use qkv::ndarray::array;
/// let q = array![[1.0_f64, 0.0]];
/// let k = array![[1.0, 0.0], [0.0, 1.0]];
/// let v = array![[2.0], [6.0]];
/// let options = qkv::AttentionOptions::new();
/// let forward = qkv::attention_with_lse(q.view(), k.view(), v.view(), &options)?;
/// let d_out = array![[1.0]];
/// let g = qkv::attention_backward(q.view(), k.view(), v.view(), &forward, d_out.view(), &options)?;
/// assert_eq!(g.dq.shape(), [1, 2]);
/// assert!(g.dbias.is_none());
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Gradients<T, D: Dimension = Ix2> {
    /// `∂L/∂Q`, shaped as the queries.
    pub dq: Array<T, D>,
    /// `∂L/∂K`, shaped as the keys.
    pub dk: Array<T, D>,
    /// `∂L/∂V`, shaped as the values.
    pub dv: Array<T, D>,
    /// `∂L/∂S`, the gradient of an additive bias, when the options carry one.
    pub dbias: Option<Array<T, D>>,
    /// `∂L/∂s`, the gradient of the attention sinks (one per query head), when the options carry
    /// them.
    pub dsinks: Option<Array1<T>>,
}

/// Where the `_into` forms write the gradients (see [`Gradients`]): `dbias`, `[.., n_q, n_k]`,
/// is written only if given (whether or not the options carry a bias: without one it is `dS`, the
/// gradient of the scores).
///
/// ```
/// let (mut dq, mut dk, mut dv) = (vec![0.0_f32; 2 * 4], vec![0.0_f32; 3 * 4], vec![0.0_f32; 3 * 8]);
/// let into = qkv::GradientsMut::new(
///     qkv::matrix_mut("dq", &mut dq, 2, 4)?,
///     qkv::matrix_mut("dk", &mut dk, 3, 4)?,
///     qkv::matrix_mut("dv", &mut dv, 3, 8)?,
/// );
/// # let _ = into;
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct GradientsMut<'a, T, D: Dimension = Ix2> {
    /// `∂L/∂Q`, shaped as the queries.
    pub dq: ArrayViewMut<'a, T, D>,
    /// `∂L/∂K`, shaped as the keys.
    pub dk: ArrayViewMut<'a, T, D>,
    /// `∂L/∂V`, shaped as the values.
    pub dv: ArrayViewMut<'a, T, D>,
    /// `∂L/∂S`, `[.., n_q, n_k]`, when wanted.
    pub dbias: Option<ArrayViewMut<'a, T, D>>,
    /// `∂L/∂s` of the attention sinks, `[query_heads]`, when wanted (zeros without sinks).
    pub dsinks: Option<ArrayViewMut1<'a, T>>,
}

impl<'a, T, D: Dimension> GradientsMut<'a, T, D> {
    /// Where to write `dQ`, `dK` and `dV`, shaped as the queries, keys and values.
    pub fn new(dq: ArrayViewMut<'a, T, D>, dk: ArrayViewMut<'a, T, D>, dv: ArrayViewMut<'a, T, D>) -> Self {
        GradientsMut { dq, dk, dv, dbias: None, dsinks: None }
    }

    /// These, and `dS` (`[.., n_q, n_k]`) written into `dbias`.
    pub fn with_dbias(self, dbias: ArrayViewMut<'a, T, D>) -> Self {
        GradientsMut { dbias: Some(dbias), ..self }
    }

    /// These, and the attention sinks' gradient (`[query_heads]`, one for a single head) written
    /// into `dsinks`.
    pub fn with_dsinks(self, dsinks: ArrayViewMut1<'a, T>) -> Self {
        GradientsMut { dsinks: Some(dsinks), ..self }
    }
}

/// The gradients of attention's inputs (see [`Gradients`]) from `d_output = ∂L/∂O` and what the
/// forward [`attention_with_lse`](crate::attention_with_lse) returned for the same inputs and
/// options.
///
/// The weights are recomputed tile by tile from `Q`, `K` and the saved logsumexp
/// (FlashAttention-2's backward), never stored: memory beyond the inputs and the gradients is
/// linear in the sequence lengths. The calling thread keeps that memory for its next call, up to
/// 16 MiB a thread (freed when the thread ends), so that a warm call does not take it from the
/// OS again page by page. Masks mean what they mean in the forward; a row that sees no
/// key has zero gradients, and a key that no query sees has zero `dk` and `dv` (its key and value
/// rows are never read). Results do not depend on the number of threads. Soft-capped scores
/// ([`AttentionOptions::logit_softcap`]) are differentiated through the cap.
///
/// ```
/// use qkv::ndarray::array;
/// use qkv::{AttentionOptions, CausalMask};
/// let x = array![[1.0_f32, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let options = AttentionOptions::new().causal(CausalMask::BottomRight);
/// let forward = qkv::attention_with_lse(x.view(), x.view(), x.view(), &options)?;
/// let d_out = qkv::ndarray::Array2::ones((3, 2));
/// let g = qkv::attention_backward(x.view(), x.view(), x.view(), &forward, d_out.view(), &options)?;
/// // The first query sees only itself: its weight is 1 whatever its score, so dq is 0 there.
/// assert_eq!(g.dq.row(0).to_vec(), vec![0.0, 0.0]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_backward<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    forward: &PartialAttention<T>,
    d_output: ArrayView2<T>,
    options: &AttentionOptions<T>,
) -> Result<Gradients<T>, AttentionError> {
    single_head(q, k, v, forward, d_output, options)
}

/// [`attention_backward`] over inputs stored as `E` and computed in `T` (`E` is `T`, or a
/// half-precision format computed in f32).
fn single_head<T: Real, E: Element<Compute = T>>(
    q: ArrayView2<E>,
    k: ArrayView2<E>,
    v: ArrayView2<E>,
    forward: &PartialAttention<T>,
    d_output: ArrayView2<E>,
    options: &AttentionOptions<T>,
) -> Result<Gradients<T>, AttentionError> {
    // The shapes are checked before the gradients are allocated.
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let mut gradients = Gradients::zeros(&q, &k, &v, shape.n_keys, options);
    let (output, lse) = (forward.output.view(), forward.logsumexp.view());
    backward(&shape, None, q, k, v, output, lse, d_output, options, gradients.view_mut())?;
    Ok(gradients)
}

/// Like [`attention_backward`], writing the gradients into `gradients` without allocating them.
/// If the call fails, the buffers may hold anything.
///
/// ```
/// use qkv::ndarray::{Array2, array};
/// let x = array![[1.0_f32, 0.0], [0.0, 1.0]];
/// let options = qkv::AttentionOptions::new();
/// let forward = qkv::attention_with_lse(x.view(), x.view(), x.view(), &options)?;
/// let d_out = Array2::ones((2, 2));
/// let (mut dq, mut dk, mut dv) = (Array2::zeros((2, 2)), Array2::zeros((2, 2)), Array2::zeros((2, 2)));
/// let into = qkv::GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
/// qkv::attention_backward_into(x.view(), x.view(), x.view(), &forward, d_out.view(), &options, into)?;
/// // Every output row's weights sum to 1, so dV's rows sum to the output gradient's.
/// assert!((dv.sum() - 4.0).abs() < 1e-6);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_backward_into<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    forward: &PartialAttention<T>,
    d_output: ArrayView2<T>,
    options: &AttentionOptions<T>,
    gradients: GradientsMut<T>,
) -> Result<(), AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let (output, lse) = (forward.output.view(), forward.logsumexp.view());
    backward(&shape, None, q, k, v, output, lse, d_output, options, gradients)?;
    Ok(())
}

/// The gradients of multi-head attention's inputs (see [`Gradients`]; `[batch, heads, n, d]`
/// tensors as [`multi_head_attention`](crate::multi_head_attention) takes them) from
/// `d_output` (`[batch, query_heads, n_q, d_v]`) and what
/// [`multi_head_attention_with_lse`](crate::multi_head_attention_with_lse) returned.
///
/// With grouped-query attention the gradient of a shared key/value head is the sum over the query
/// heads that read it, added in the order of the heads (whatever the number of threads). Working
/// memory is kept between calls as [`attention_backward`] says.
///
/// ```
/// use qkv::ndarray::Array4;
/// let q = Array4::<f32>::from_elem((1, 4, 3, 8), 0.1);
/// let kv = Array4::<f32>::from_elem((1, 2, 5, 8), 0.2);
/// let options = qkv::AttentionOptions::new();
/// let forward = qkv::multi_head_attention_with_lse(q.view(), kv.view(), kv.view(), &options)?;
/// let d_out = Array4::ones((1, 4, 3, 8));
/// let g = qkv::multi_head_attention_backward(q.view(), kv.view(), kv.view(), &forward, d_out.view(), &options)?;
/// assert_eq!(g.dk.shape(), [1, 2, 5, 8]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention_backward<T: Real>(
    q: ArrayView4<T>,
    k: ArrayView4<T>,
    v: ArrayView4<T>,
    forward: &PartialAttention<T, Ix4>,
    d_output: ArrayView4<T>,
    options: &AttentionOptions<T>,
) -> Result<Gradients<T, Ix4>, AttentionError> {
    multi_head(q, k, v, forward, d_output, options)
}

/// [`multi_head_attention_backward`] over inputs stored as `E` and computed in `T`.
fn multi_head<T: Real, E: Element<Compute = T>>(
    q: ArrayView4<E>,
    k: ArrayView4<E>,
    v: ArrayView4<E>,
    forward: &PartialAttention<T, Ix4>,
    d_output: ArrayView4<E>,
    options: &AttentionOptions<T>,
) -> Result<Gradients<T, Ix4>, AttentionError> {
    let shape = check_heads(&q, &k, &v)?;
    let heads = Some((q.shape()[0], q.shape()[1]));
    let mut gradients = Gradients::zeros(&q, &k, &v, shape.n_keys, options);
    let into = gradients.view_mut();
    let (output, lse) = (forward.output.view(), forward.logsumexp.view());
    backward(&shape, heads, q, k, v, output, lse, d_output, options, into)?;
    Ok(gradients)
}

/// Like [`multi_head_attention_backward`], writing the gradients into `gradients` without
/// allocating them. If the call fails, the buffers may hold anything.
///
/// ```
/// use qkv::ndarray::Array4;
/// let x = Array4::<f32>::from_elem((1, 2, 3, 4), 0.5);
/// let options = qkv::AttentionOptions::new();
/// let forward = qkv::multi_head_attention_with_lse(x.view(), x.view(), x.view(), &options)?;
/// let d_out = Array4::ones((1, 2, 3, 4));
/// let (mut dq, mut dk, mut dv) = (x.clone(), x.clone(), x.clone());
/// let into = qkv::GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
/// qkv::multi_head_attention_backward_into(x.view(), x.view(), x.view(), &forward, d_out.view(), &options, into)?;
/// // Equal scores: every weight is 1/3 and dS is 0, so only the values get a gradient.
/// assert!(dq.iter().all(|&g| g.abs() < 1e-6));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention_backward_into<T: Real>(
    q: ArrayView4<T>,
    k: ArrayView4<T>,
    v: ArrayView4<T>,
    forward: &PartialAttention<T, Ix4>,
    d_output: ArrayView4<T>,
    options: &AttentionOptions<T>,
    gradients: GradientsMut<T, Ix4>,
) -> Result<(), AttentionError> {
    let shape = check_heads(&q, &k, &v)?;
    let heads = Some((q.shape()[0], q.shape()[1]));
    let (output, lse) = (forward.output.view(), forward.logsumexp.view());
    backward(&shape, heads, q, k, v, output, lse, d_output, options, gradients)?;
    Ok(())
}

/// The gradients of attention's half-precision inputs (see [`attention_backward`]), in f32, from
/// `d_output = ∂L/∂O` stored as the inputs are and what
/// [`attention_half_with_lse`](crate::attention_half_with_lse) returned for the same inputs and
/// options.
///
/// Computed as the f32 backward computes: the inputs are widened to f32 exactly as they are
/// packed for the kernels (no widened copy of a whole input is made), the weights are
/// recomputed in f32 from the saved logsumexp, and every product is summed in f32. At the vector
/// levels the gradients are those of the f32 backward on the widened inputs, bit for bit. bf16
/// inputs at the AMX level take the scores `Q·Kᵀ` and `dO·Vᵀ` from the stored bf16 on the tile
/// unit, and at the AVX512-BF16 level from `vdpbf16ps` on AMD's CPUs (on Intel's that level runs
/// AVX-512 here, where it measured faster): each product of two bf16 is exact in f32, so
/// those scores differ from the f32 backward's only in the order of their f32 sums, and the
/// weights, `dS` and the gradients' sums stay in f32 (PyTorch's bf16 backward rounds them to
/// bf16). Round the gradients with `mapv(bf16::from_f32)` where a model keeps bf16 gradients (as
/// PyTorch's bf16 backward returns them).
///
/// ```
/// use qkv::half::bf16;
/// use qkv::ndarray::array;
/// let x = array![[1.0_f32, 0.0], [0.0, 1.0], [1.0, 1.0]].mapv(bf16::from_f32);
/// let options = qkv::AttentionOptions::new();
/// let forward = qkv::attention_half_with_lse(x.view(), x.view(), x.view(), &options)?;
/// let d_out = qkv::ndarray::Array2::from_elem((3, 2), bf16::ONE);
/// let g = qkv::attention_backward_half(x.view(), x.view(), x.view(), &forward, d_out.view(), &options)?;
/// // Every row's weights sum to 1, so dV's elements sum to dO's (3 rows × 2 columns of 1).
/// assert!((g.dv.sum() - 6.0).abs() < 1e-5);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_backward_half<H: Half>(
    q: ArrayView2<H>,
    k: ArrayView2<H>,
    v: ArrayView2<H>,
    forward: &PartialAttention<f32>,
    d_output: ArrayView2<H>,
    options: &AttentionOptions<f32>,
) -> Result<Gradients<f32>, AttentionError> {
    single_head(q, k, v, forward, d_output, options)
}

/// The gradients of multi-head attention's half-precision inputs (`[batch, heads, n, d]`, see
/// [`multi_head_attention_backward`]), in f32, from `d_output` (`[batch, query_heads, n_q, d_v]`,
/// stored as the inputs are) and what
/// [`multi_head_attention_half_with_lse`](crate::multi_head_attention_half_with_lse) returned.
/// Computed as [`attention_backward_half`] computes; a shared key/value head's gradient is summed
/// over its query heads in their order.
///
/// ```
/// use qkv::half::bf16;
/// use qkv::ndarray::Array4;
/// let q = Array4::from_elem((1, 4, 3, 8), bf16::from_f32(0.125));
/// let kv = Array4::from_elem((1, 2, 5, 8), bf16::from_f32(0.25));
/// let options = qkv::AttentionOptions::new();
/// let forward = qkv::multi_head_attention_half_with_lse(q.view(), kv.view(), kv.view(), &options)?;
/// let d_out = Array4::from_elem((1, 4, 3, 8), bf16::ONE);
/// let g = qkv::multi_head_attention_backward_half(q.view(), kv.view(), kv.view(), &forward, d_out.view(), &options)?;
/// assert_eq!(g.dk.shape(), [1, 2, 5, 8]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn multi_head_attention_backward_half<H: Half>(
    q: ArrayView4<H>,
    k: ArrayView4<H>,
    v: ArrayView4<H>,
    forward: &PartialAttention<f32, Ix4>,
    d_output: ArrayView4<H>,
    options: &AttentionOptions<f32>,
) -> Result<Gradients<f32, Ix4>, AttentionError> {
    multi_head(q, k, v, forward, d_output, options)
}

impl<T: Real, D: Dimension> Gradients<T, D> {
    /// Zero gradients for inputs shaped as `q`, `k`, `v`, with a bias gradient and the sinks'
    /// if `options` carry them.
    fn zeros<S: Data>(
        q: &ArrayBase<S, D>,
        k: &ArrayBase<S, D>,
        v: &ArrayBase<S, D>,
        n_keys: usize,
        options: &AttentionOptions<T>,
    ) -> Self {
        let dbias = options.has_bias().then(|| Array::zeros(scores_dim(q.raw_dim(), n_keys)));
        let query_heads = if q.ndim() == 4 { q.shape()[1] } else { 1 };
        let dsinks = options.sinks.map(|_| Array1::zeros(query_heads));
        Gradients {
            dq: Array::zeros(q.raw_dim()),
            dk: Array::zeros(k.raw_dim()),
            dv: Array::zeros(v.raw_dim()),
            dbias,
            dsinks,
        }
    }

    fn view_mut(&mut self) -> GradientsMut<'_, T, D> {
        GradientsMut {
            dq: self.dq.view_mut(),
            dk: self.dk.view_mut(),
            dv: self.dv.view_mut(),
            dbias: self.dbias.as_mut().map(|b| b.view_mut()),
            dsinks: self.dsinks.as_mut().map(|s| s.view_mut()),
        }
    }
}

/// `dims` with its last axis set to `n`.
fn scores_dim<D: Dimension>(mut dims: D, n: usize) -> D {
    let last = dims.ndim() - 1;
    dims[last] = n;
    dims
}

/// Fails unless `found` is `expected`, naming `argument` and what it must match.
pub(crate) fn expect_shape(
    argument: &'static str,
    found: &[usize],
    expected: &[usize],
    what: &'static str,
) -> Result<(), AttentionError> {
    if found == expected {
        return Ok(());
    }
    Err(AttentionError::GradientShape { argument, found: found.into(), expected: expected.into(), what })
}

/// Checks that `d_output` has the shape of the output of `shape` and is finite (the reference's
/// check, too).
pub(crate) fn check_d_output<T: Real>(shape: &Shape, d_output: &ArrayView2<T>) -> Result<(), AttentionError> {
    let expected = [shape.n_queries, shape.value_dim];
    expect_shape("d_output", d_output.shape(), &expected, "output")?;
    finite_magnitude("d_output", d_output).map(|_| ())
}

/// The backward of a checked shape, single-head (`D = Ix2`, `heads = None`) or multi-head
/// (`Ix4`, `heads = (batch, query heads)`): checks the saved forward, the output's gradient and
/// the buffers, then runs the tiled path. Returns the sinks' gradient in f64 too (one sum per
/// query head over the sequences of the batch, in their order; zeros without sinks), for a
/// caller that adds more sequences to it before rounding (a packed batch's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Real, E: Element<Compute = T>, D: Dimension>(
    shape: &Shape,
    heads: Option<(usize, usize)>,
    q: ArrayView<E, D>,
    k: ArrayView<E, D>,
    v: ArrayView<E, D>,
    output: ArrayView<T, D>,
    logsumexp: ArrayView<T, D::Smaller>,
    d_output: ArrayView<E, D>,
    options: &AttentionOptions<T>,
    gradients: GradientsMut<T, D>,
) -> Result<Vec<f64>, AttentionError> {
    let out_dim = scores_dim(q.raw_dim(), shape.value_dim);
    expect_shape("output", output.shape(), out_dim.slice(), "output")?;
    expect_shape("logsumexp", logsumexp.shape(), &q.shape()[..q.ndim() - 1], "queries")?;
    expect_shape("d_output", d_output.shape(), out_dim.slice(), "output")?;
    let GradientsMut { dq, dk, dv, dbias, dsinks } = gradients;
    expect_shape("dq", dq.shape(), q.shape(), "queries")?;
    expect_shape("dk", dk.shape(), k.shape(), "keys")?;
    expect_shape("dv", dv.shape(), v.shape(), "values")?;
    if let Some(dbias) = &dbias {
        expect_shape("dbias", dbias.shape(), scores_dim(q.raw_dim(), shape.n_keys).slice(), "scores")?;
    }
    let query_heads = heads.map_or(1, |(_, query_heads)| query_heads);
    if let Some(dsinks) = &dsinks {
        expect_shape("dsinks", dsinks.shape(), &[query_heads], "query heads")?;
    }
    let masks = options.resolve_heads(shape, heads)?;
    let kernels = simd::kernels_for(options.simd_level())?;
    let group = heads.map_or(1, |(_, query_heads)| query_heads / k.shape()[1]);
    let checked = inputs::check(&q, k, v, &|index| seen_by_group(&masks, group, index))?;
    let gradient = finite_magnitude("d_output", &d_output)?;
    let outputs = finite_magnitude("output", &output)?;
    check_logsumexp(&logsumexp)?;
    if !tiled::stays_finite(shape, &checked.magnitudes, gradient.max(outputs), &masks.head(0, 0)) {
        return Err(AttentionError::GradientOverflow { ty: T::NAME });
    }
    // Half-precision inputs are read as they are stored: the tiled path widens them as it packs
    // them into its own layouts (bf16 stays bf16 for the score products of a pair level).
    let four = leading_axes::<_, D, Ix4>;
    let four_mut = leading_axes::<_, D, Ix4>;
    let lse = leading_axes::<_, D::Smaller, Ix3>(logsumexp);
    let (q, k, v) = (four(q), four(checked.k.view()), four(checked.v.view()));
    let (output, d_output) = (leading_axes::<_, D, Ix4>(output), four(d_output));
    let [batch, query_heads, _, _] = *q.shape() else { unreachable!("4-D view") };
    let kv_heads = k.shape()[1];
    let mut dq_heads = four_mut(dq).into_outer_iter_mut().flat_map(|b| b.into_outer_iter_mut());
    let mut dbias_heads =
        dbias.map(|b| four_mut(b).into_outer_iter_mut().flat_map(|b| b.into_outer_iter_mut()));
    let mut query_heads_of = Vec::with_capacity(batch * query_heads);
    for b in 0..batch {
        for h in 0..query_heads {
            query_heads_of.push(tiled::QueryHead {
                q: q.slice_move(ndarray::s![b, h, .., ..]),
                output: output.slice_move(ndarray::s![b, h, .., ..]),
                logsumexp: lse.slice_move(ndarray::s![b, h, ..]),
                d_output: d_output.slice_move(ndarray::s![b, h, .., ..]),
                masks: masks.head(b, h),
                kv: b * kv_heads + h / group,
                dq: dq_heads.next().expect("one dq per head"),
                dbias: dbias_heads.as_mut().map(|heads| heads.next().expect("one dbias per head")),
            });
        }
    }
    let (dk, dv) = (four_mut(dk), four_mut(dv));
    let kv = dk
        .into_outer_iter_mut()
        .flat_map(|b| b.into_outer_iter_mut())
        .zip(dv.into_outer_iter_mut().flat_map(|b| b.into_outer_iter_mut()))
        .enumerate()
        .map(|(index, (dk, dv))| {
            let (b, g) = (index / kv_heads, index % kv_heads);
            let (k, v) = (k.slice_move(ndarray::s![b, g, .., ..]), v.slice_move(ndarray::s![b, g, .., ..]));
            tiled::KvHead { k, v, dk, dv }
        })
        .collect();
    let sink_gradients = tiled::backward(kernels.backward(), shape, query_heads_of, kv);
    // Each head's sum over the sequences of the batch, in their order.
    let sums: Vec<f64> =
        (0..query_heads).map(|h| (0..batch).map(|b| sink_gradients[b * query_heads + h]).sum()).collect();
    if let Some(mut dsinks) = dsinks {
        dsinks.iter_mut().zip(&sums).for_each(|(dsink, &sum)| *dsink = T::from_f64_round(sum));
    }
    Ok(sums)
}

/// Fails on a saved logsumexp that is NaN or `+inf`: a row that saw no key has `-inf`, and any
/// other must be finite.
pub(crate) fn check_logsumexp<T: Real, D: Dimension>(
    logsumexp: &ArrayView<T, D>,
) -> Result<(), AttentionError> {
    if let Some((index, &lse)) = logsumexp.indexed_iter().find(|(_, l)| l.is_nan() || **l == T::infinity()) {
        let index = Dims(ndarray::IntoDimension::into_dimension(index).slice().to_vec());
        return Err(AttentionError::NonFinite { argument: "logsumexp", index, value: lse.to_f64_exact() });
    }
    Ok(())
}

/// `x` with leading axes of length 1 added up to `E`'s number of axes: a single head as a batch
/// of one sequence of one head.
fn leading_axes<S: RawData, D: Dimension, E: Dimension>(x: ArrayBase<S, D>) -> ArrayBase<S, E> {
    let mut x = x.into_dyn();
    while Some(x.ndim()) < E::NDIM {
        x.insert_axis_inplace(Axis(0));
    }
    x.into_dimensionality::<E>().expect("as many axes as E")
}
