//! Attention over `[batch, heads, n, d]` tensors: the forward (with or without each row's
//! logsumexp), the backward, and the merge of two partial results; and over a packed batch of
//! sequences of different lengths (the forward and the backward).

use ndarray::{ArrayView2, Ix2, Ix3, Ix4, IxDyn};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use qkv::half::{bf16, f16};
use qkv::{
    AdditiveBias, Alibi, AttentionError, AttentionOptions, CausalMask, GradientsMut, KeepMask,
    PartialAttention, Real, SlidingWindow,
};

use crate::raw::{Dtype, Element, Raw};
use crate::{detached, value_error};

/// The options every dense call takes, as `python/qkv/_core.py` packs them: `(is_causal, scale,
/// window (before, after; -1 unbounded), ALiBi, soft-cap, sink logits)`. Causal masks, windows
/// and ALiBi are aligned top-left, as PyTorch's `is_causal` is (bottom-right in a packed batch).
#[derive(Debug, Clone, FromPyObject)]
pub struct Spec(bool, Option<f64>, Option<(i64, i64)>, Option<AlibiSpec>, Option<f64>, Option<Vec<f64>>);

/// ALiBi as `_core.py` packs it: `(slopes, sequences, symmetric)`, the slopes one per query head,
/// or `[sequences, query heads]` row by row (flash-attn's `(batch, nheads)`), and whether they
/// apply as flash-attn's non-causal `-slope · |j - p|` ([`Alibi::symmetric`]).
#[derive(Debug, Clone, FromPyObject)]
pub struct AlibiSpec(Vec<f64>, usize, bool);

/// `(query, key, value)`, each `[batch, heads, n, d]`.
type Inputs = (Raw, Raw, Raw);

/// A packed batch's `(query offsets, key offsets)`: flash-attn's `cu_seqlens_q`, `cu_seqlens_k`.
type Offsets = (Vec<usize>, Vec<usize>);

/// Where the backward writes: `(dq, dk, dv, dbias, dsinks)`, the last two when wanted.
type Gradients = (Raw, Raw, Raw, Option<Raw>, Option<Raw>);

/// A window side as the engine takes it: -1 (flash-attn's spelling) or any negative is unbounded.
pub(crate) fn side(n: i64) -> usize {
    usize::try_from(n).unwrap_or(SlidingWindow::UNBOUNDED)
}

/// The ALiBi slopes and the sink logits, one value per query head each, in the compute type.
type PerHead<T> = (Option<Vec<T>>, Option<Vec<T>>);

/// [`PerHead`] of `spec`, kept alive for the options that borrow them.
fn per_head<T: Real>(spec: &Spec) -> PyResult<PerHead<T>> {
    let slopes = spec.3.as_ref().map(|alibi| alibi.0.clone());
    Ok((per_head_values("alibi_slopes", &slopes)?, per_head_values("sinks", &spec.5)?))
}

/// One value per query head (the option `argument`), each [`narrowed`] to `T`.
pub(crate) fn per_head_values<T: Real>(
    argument: &str,
    values: &Option<Vec<f64>>,
) -> PyResult<Option<Vec<T>>> {
    let narrowed = |(i, &x): (usize, &f64)| narrowed::<T>(&format!("{argument}[{i}]"), x);
    values.as_ref().map(|values| values.iter().enumerate().map(narrowed).collect()).transpose()
}

/// `x` (the option `argument`) rounded to the compute type `T`; a finite value past `T`'s range,
/// or one so small it rounds to 0, is an error naming it, rather than the infinity or 0 the
/// engine would report or use. NaN and infinities pass, for the engine to name.
pub(crate) fn narrowed<T: Real>(argument: &str, x: f64) -> PyResult<T> {
    let y = T::from_f64_round(x);
    let ty = || format!("float{}", 8 * size_of::<T>());
    if x.is_finite() && !y.is_finite() {
        let largest = T::max_value().to_f64_exact();
        return Err(PyValueError::new_err(format!(
            "{argument} is {x:e}: {}, the type these inputs compute in, holds at most {largest:e}",
            ty()
        )));
    }
    if x != 0.0 && y == T::zero() {
        return Err(PyValueError::new_err(format!(
            "{argument} is {x:e}: {}, the type these inputs compute in, rounds it to 0",
            ty()
        )));
    }
    Ok(y)
}

/// The engine's options for `spec` and the mask, if any: a boolean mask keeps what is `true`, a
/// floating one is added to the scores. Both are `[batch or 1, heads or 1, n_q, n_k]`. The causal
/// mask, the window and ALiBi are aligned as `align` says.
///
/// # Safety
/// `mask` must describe live memory for `'a` (see [`Raw::view`]).
unsafe fn options<'a, T: Real + Element>(
    spec: &Spec,
    (slopes, sinks): &'a PerHead<T>,
    mask: Option<&Raw>,
    align: CausalMask,
) -> PyResult<AttentionOptions<'a, T>> {
    let mut options = AttentionOptions::new();
    if spec.0 {
        options = options.causal(align);
    }
    if let Some(scale) = spec.1 {
        options = options.scale(narrowed("scale", scale)?);
    }
    if let Some((before, after)) = spec.2 {
        options = options.sliding_window(SlidingWindow::new(side(before), side(after)).aligned(align));
    }
    if let (Some(slopes), Some(AlibiSpec(_, sequences, symmetric))) = (slopes, &spec.3) {
        let alibi = if *sequences > 1 {
            let per_sequence = ArrayView2::from_shape((*sequences, slopes.len() / sequences), slopes)
                .map_err(|_| PyValueError::new_err("alibi_slopes: as many slopes for every sequence"))?;
            Alibi::batched(per_sequence)
        } else {
            Alibi::new(slopes)
        };
        options = options.alibi(if *symmetric { alibi.symmetric() } else { alibi }.aligned(align));
    }
    if let Some(cap) = spec.4 {
        options = options.logit_softcap(narrowed("softcap", cap)?);
    }
    if let Some(sinks) = sinks {
        options = options.sinks(sinks);
    }
    if let Some(mask) = mask {
        // SAFETY: the caller vouches for the mask's memory.
        options = match mask.dtype("attn_mask")? {
            Dtype::Bool => options.keep_mask(KeepMask::batched(unsafe { mask.view("attn_mask")? })),
            _ => options.bias(AdditiveBias::batched(unsafe { mask.view("attn_mask")? })),
        };
    }
    Ok(options)
}

/// An input element type and how the engine runs on it: `f32` and `f64` as they are, bf16 and
/// f16 computed in f32.
trait Input: Element + Send + Sync {
    /// The type the engine computes (and returns the logsumexp) in.
    type Compute: Real + Element;

    fn attend_into(
        q: ndarray::ArrayView4<Self>,
        k: ndarray::ArrayView4<Self>,
        v: ndarray::ArrayView4<Self>,
        options: &AttentionOptions<Self::Compute>,
        out: ndarray::ArrayViewMut4<Self>,
    ) -> Result<(), AttentionError>;

    fn attend_with_lse(
        q: ndarray::ArrayView4<Self>,
        k: ndarray::ArrayView4<Self>,
        v: ndarray::ArrayView4<Self>,
        options: &AttentionOptions<Self::Compute>,
    ) -> Result<PartialAttention<Self::Compute, Ix4>, AttentionError>;

    /// Rounds a computed element to this type.
    fn round(x: Self::Compute) -> Self;
}

/// [`Input`] for `f32` and `f64`.
macro_rules! real_input {
    ($t:ty) => {
        impl Input for $t {
            type Compute = $t;
            fn attend_into(
                q: ndarray::ArrayView4<$t>,
                k: ndarray::ArrayView4<$t>,
                v: ndarray::ArrayView4<$t>,
                options: &AttentionOptions<$t>,
                out: ndarray::ArrayViewMut4<$t>,
            ) -> Result<(), AttentionError> {
                qkv::multi_head_attention_into(q, k, v, options, out)
            }
            fn attend_with_lse(
                q: ndarray::ArrayView4<$t>,
                k: ndarray::ArrayView4<$t>,
                v: ndarray::ArrayView4<$t>,
                options: &AttentionOptions<$t>,
            ) -> Result<PartialAttention<$t, Ix4>, AttentionError> {
                qkv::multi_head_attention_with_lse(q, k, v, options)
            }
            fn round(x: $t) -> $t {
                x
            }
        }
    };
}
real_input!(f32);
real_input!(f64);

/// [`Input`] for bf16 and f16.
macro_rules! half_input {
    ($t:ty) => {
        impl Input for $t {
            type Compute = f32;
            fn attend_into(
                q: ndarray::ArrayView4<$t>,
                k: ndarray::ArrayView4<$t>,
                v: ndarray::ArrayView4<$t>,
                options: &AttentionOptions<f32>,
                out: ndarray::ArrayViewMut4<$t>,
            ) -> Result<(), AttentionError> {
                qkv::multi_head_attention_half_into(q, k, v, options, out)
            }
            fn attend_with_lse(
                q: ndarray::ArrayView4<$t>,
                k: ndarray::ArrayView4<$t>,
                v: ndarray::ArrayView4<$t>,
                options: &AttentionOptions<f32>,
            ) -> Result<PartialAttention<f32, Ix4>, AttentionError> {
                qkv::multi_head_attention_half_with_lse(q, k, v, options)
            }
            fn round(x: f32) -> $t {
                <$t>::from_f32(x)
            }
        }
    };
}
half_input!(bf16);
half_input!(f16);

/// The forward for inputs of type `E`.
///
/// # Safety
/// Every [`Raw`] must describe live memory for the call, the outputs fresh.
unsafe fn forward_as<E: Input>(
    (q, k, v): &Inputs,
    mask: Option<&Raw>,
    spec: &Spec,
    (out, lse): (&Raw, Option<&Raw>),
    dry_run: bool,
) -> PyResult<()> {
    let per_head = per_head::<E::Compute>(spec)?;
    // SAFETY (every view below): the caller vouches for the memory.
    let options = unsafe { options(spec, &per_head, mask, CausalMask::TopLeft)? };
    let (q, k, v) = unsafe { (q.view("query")?, k.view("key")?, v.view("value")?) };
    let mut out = unsafe { out.view_mut::<E, Ix4>("out")? };
    if dry_run {
        return Ok(());
    }
    match lse {
        None => E::attend_into(q, k, v, &options, out).map_err(value_error),
        Some(lse) => {
            let mut lse = unsafe { lse.view_mut::<E::Compute, Ix3>("lse")? };
            let result = E::attend_with_lse(q, k, v, &options).map_err(value_error)?;
            out.zip_mut_with(&result.output, |o, &x| *o = E::round(x));
            lse.assign(&result.logsumexp);
            Ok(())
        }
    }
}

/// Attention of `inputs` (`[batch, heads, n, d]`, GQA when the key heads divide the query heads)
/// into `out`, and each row's logsumexp into `lse` if given. With `dry_run`, everything but the
/// engine's work (arguments, views, options, releasing the GIL): the binding's own cost, which
/// `crates/qkv-bench/python/binding.py` times.
#[pyfunction]
#[pyo3(signature = (inputs, mask, spec, out, lse=None, dry_run=false))]
fn forward(
    py: Python<'_>,
    inputs: Inputs,
    mask: Option<Raw>,
    spec: Spec,
    out: Raw,
    lse: Option<Raw>,
    dry_run: bool,
) -> PyResult<()> {
    detached(py, move || {
        let (mask, into) = (mask.as_ref(), (&out, lse.as_ref()));
        // SAFETY: the package passes tensors it holds for the call, outputs freshly allocated.
        unsafe {
            match inputs.0.dtype("query")? {
                Dtype::F32 => forward_as::<f32>(&inputs, mask, &spec, into, dry_run),
                Dtype::F64 => forward_as::<f64>(&inputs, mask, &spec, into, dry_run),
                Dtype::Bf16 => forward_as::<bf16>(&inputs, mask, &spec, into, dry_run),
                Dtype::F16 => forward_as::<f16>(&inputs, mask, &spec, into, dry_run),
                Dtype::Bool => {
                    Err(PyValueError::new_err("query has dtype bool where a floating type is needed"))
                }
            }
        }
    })
}

/// The forward's saved `(out, lse)` as the engine takes them: owned arrays, one copy of the
/// output.
///
/// # Safety
/// As [`Raw::view`].
unsafe fn saved<T: Real + Element, D: ndarray::Dimension>(
    out: &Raw,
    lse: &Raw,
) -> PyResult<PartialAttention<T, D>> {
    // SAFETY: the caller vouches for the memory.
    Ok(unsafe {
        PartialAttention {
            output: out.view::<T, D>("out")?.to_owned(),
            logsumexp: lse.view("lse")?.to_owned(),
        }
    })
}

/// Where the backward writes, as the engine takes it: `dq`, `dk`, `dv` and, if given, `dbias` and
/// `dsinks`.
///
/// # Safety
/// As [`Raw::view_mut`].
unsafe fn gradients_into<'a, T: Real + Element, D: ndarray::Dimension>(
    (dq, dk, dv, dbias, dsinks): &Gradients,
) -> PyResult<GradientsMut<'a, T, D>> {
    // SAFETY (every view below): the caller vouches for the memory.
    let mut into = unsafe { GradientsMut::new(dq.view_mut("dq")?, dk.view_mut("dk")?, dv.view_mut("dv")?) };
    if let Some(d) = dbias {
        into = into.with_dbias(unsafe { d.view_mut("dbias")? });
    }
    if let Some(d) = dsinks {
        into = into.with_dsinks(unsafe { d.view_mut("dsinks")? });
    }
    Ok(into)
}

/// The engine backward's `result`, where an incoming gradient that is not finite (the overflow a
/// `GradScaler` looks for in the gradients it gets back) fills `gradients` with NaN, as autograd's
/// own backward propagates it, rather than failing as the engine does on it (`d_output`, its
/// first check of the incoming gradient): no pass of its own looks for one (30 µs of a small
/// call's 100 as a `torch.isfinite` in Python).
///
/// # Safety
/// As [`Raw::view_mut`].
unsafe fn propagating_overflow<T: Real + Element>(
    result: Result<(), AttentionError>,
    (dq, dk, dv, dbias, dsinks): &Gradients,
) -> PyResult<()> {
    match result {
        Err(AttentionError::NonFinite { argument: "d_output", .. }) => {
            for gradient in
                [Some(dq), Some(dk), Some(dv), dbias.as_ref(), dsinks.as_ref()].into_iter().flatten()
            {
                // SAFETY: the caller vouches for the memory.
                unsafe { gradient.view_mut::<T, IxDyn>("gradient")? }.fill(T::nan());
            }
            Ok(())
        }
        result => result.map_err(value_error),
    }
}

/// The backward for `T`.
///
/// # Safety
/// As [`forward_as`].
unsafe fn backward_as<T: Real + Element>(
    (q, k, v): &Inputs,
    mask: Option<&Raw>,
    spec: &Spec,
    (out, lse, d_out): &(Raw, Raw, Raw),
    gradients: &Gradients,
) -> PyResult<()> {
    let per_head = per_head::<T>(spec)?;
    // SAFETY (every view below): the caller vouches for the memory.
    let options = unsafe { options(spec, &per_head, mask, CausalMask::TopLeft)? };
    let (q, k, v) = unsafe { (q.view("query")?, k.view("key")?, v.view("value")?) };
    let (forward, d_out) = unsafe { (saved::<T, Ix4>(out, lse)?, d_out.view("grad_out")?) };
    let into = unsafe { gradients_into(gradients)? };
    let result = qkv::multi_head_attention_backward_into(q, k, v, &forward, d_out, &options, into);
    unsafe { propagating_overflow::<T>(result, gradients) }
}

/// The gradients of `inputs` from the output's gradient and the forward's `out` and `lse` (the
/// logsumexp over every key, so that a part of the keys gets its share of the gradient:
/// context-parallel attention calls it per part), into `dq`, `dk`, `dv` and, if given, the
/// additive mask's `dbias` (`[batch, query_heads, n_q, n_k]`) and the sinks' `dsinks`
/// (`[query_heads]`). f32 or f64.
#[pyfunction]
fn backward(
    py: Python<'_>,
    inputs: Inputs,
    mask: Option<Raw>,
    spec: Spec,
    saved: (Raw, Raw, Raw),
    gradients: Gradients,
) -> PyResult<()> {
    detached(py, move || {
        let mask = mask.as_ref();
        // SAFETY: as in `forward`.
        unsafe {
            match inputs.0.dtype("query")? {
                Dtype::F32 => backward_as::<f32>(&inputs, mask, &spec, &saved, &gradients),
                Dtype::F64 => backward_as::<f64>(&inputs, mask, &spec, &saved, &gradients),
                other => Err(PyValueError::new_err(format!(
                    "the backward takes float32 or float64, not {}",
                    other.name()
                ))),
            }
        }
    })
}

/// The packed forward for `T`.
///
/// # Safety
/// As [`forward_as`].
unsafe fn varlen_as<T: Real + Element>(
    (q, k, v): &Inputs,
    (query_offsets, key_offsets): &Offsets,
    spec: &Spec,
    (out, lse): (&Raw, Option<&Raw>),
) -> PyResult<()> {
    let per_head = per_head::<T>(spec)?;
    // SAFETY (every view below): the caller vouches for the memory.
    let options = unsafe { options(spec, &per_head, None, CausalMask::BottomRight)? };
    let (q, k, v) = unsafe { (q.view("query")?, k.view("key")?, v.view("value")?) };
    let mut out = unsafe { out.view_mut::<T, Ix3>("out")? };
    match lse {
        None => qkv::varlen_attention_into(q, k, v, query_offsets, key_offsets, &options, out)
            .map_err(value_error)?,
        Some(lse) => {
            let result = qkv::varlen_attention_with_lse(q, k, v, query_offsets, key_offsets, &options)
                .map_err(value_error)?;
            out.assign(&result.output);
            unsafe { lse.view_mut::<T, Ix2>("lse")? }.assign(&result.logsumexp);
        }
    }
    Ok(())
}

/// Attention over a packed batch of sequences (`qkv::varlen_attention`): `inputs` as `[heads,
/// total rows, d]` views, sequence `i` rows `offsets.0[i]..offsets.0[i + 1]` of the queries and
/// `offsets.1[i]..offsets.1[i + 1]` of the keys; the causal mask, the window and ALiBi aligned
/// bottom-right within each sequence, as flash-attn's varlen function aligns them. Into `out`
/// (`[heads, total queries, d_v]`) and `lse` if given. f32 or f64.
#[pyfunction]
#[pyo3(signature = (inputs, offsets, spec, out, lse=None))]
fn varlen(
    py: Python<'_>,
    inputs: Inputs,
    offsets: Offsets,
    spec: Spec,
    out: Raw,
    lse: Option<Raw>,
) -> PyResult<()> {
    detached(py, move || {
        let into = (&out, lse.as_ref());
        // SAFETY: as in `forward`.
        unsafe {
            match inputs.0.dtype("query")? {
                Dtype::F32 => varlen_as::<f32>(&inputs, &offsets, &spec, into),
                Dtype::F64 => varlen_as::<f64>(&inputs, &offsets, &spec, into),
                other => Err(PyValueError::new_err(format!(
                    "varlen attention takes float32 or float64, not {}",
                    other.name()
                ))),
            }
        }
    })
}

/// The packed backward for `T`.
///
/// # Safety
/// As [`forward_as`].
unsafe fn varlen_backward_as<T: Real + Element>(
    (q, k, v): &Inputs,
    (query_offsets, key_offsets): &Offsets,
    spec: &Spec,
    (out, lse, d_out): &(Raw, Raw, Raw),
    gradients: &Gradients,
) -> PyResult<()> {
    let per_head = per_head::<T>(spec)?;
    // SAFETY (every view below): the caller vouches for the memory.
    let options = unsafe { options(spec, &per_head, None, CausalMask::BottomRight)? };
    let (q, k, v) = unsafe { (q.view("query")?, k.view("key")?, v.view("value")?) };
    let (forward, d_out) = unsafe { (saved::<T, Ix3>(out, lse)?, d_out.view("grad_out")?) };
    let into = unsafe { gradients_into(gradients)? };
    let result = qkv::varlen_attention_backward_into(
        q,
        k,
        v,
        query_offsets,
        key_offsets,
        &forward,
        d_out,
        &options,
        into,
    );
    unsafe { propagating_overflow::<T>(result, gradients) }
}

/// The gradients of a packed batch's inputs (`qkv::varlen_attention_backward`), laid out as
/// [`varlen`] takes them, from the output's gradient and the forward's `out` and `lse`, into
/// `dq`, `dk`, `dv` and, if given, the sinks' `dsinks` (`[query_heads]`; a packed call has no bias,
/// and the engine refuses a `dbias`). f32 or f64.
#[pyfunction]
fn varlen_backward(
    py: Python<'_>,
    inputs: Inputs,
    offsets: Offsets,
    spec: Spec,
    saved: (Raw, Raw, Raw),
    gradients: Gradients,
) -> PyResult<()> {
    detached(py, move || {
        // SAFETY: as in `forward`.
        unsafe {
            match inputs.0.dtype("query")? {
                Dtype::F32 => varlen_backward_as::<f32>(&inputs, &offsets, &spec, &saved, &gradients),
                Dtype::F64 => varlen_backward_as::<f64>(&inputs, &offsets, &spec, &saved, &gradients),
                other => Err(PyValueError::new_err(format!(
                    "the varlen backward takes float32 or float64, not {}",
                    other.name()
                ))),
            }
        }
    })
}

/// The merge for `T`.
///
/// # Safety
/// As [`forward_as`].
unsafe fn merge_as<T: Real + Element>(parts: &[(Raw, Raw); 2], (out, lse): &(Raw, Raw)) -> PyResult<()> {
    // SAFETY (every view below): the caller vouches for the memory; the parts are read in place.
    let part = |(o, l): &(Raw, Raw)| unsafe {
        PyResult::Ok((o.view::<T, IxDyn>("out")?, l.view::<T, IxDyn>("lse")?))
    };
    let into = unsafe { (out.view_mut::<T, IxDyn>("out")?, lse.view_mut::<T, IxDyn>("lse")?) };
    PartialAttention::merge_into(part(&parts[0])?, part(&parts[1])?, into.0, into.1).map_err(value_error)
}

/// Attention over two disjoint sets of keys (`(out, lse)` each, any leading dimensions) merged
/// into attention over both, written to `into` (`PartialAttention::merge`). f32 or f64.
#[pyfunction]
fn merge(py: Python<'_>, first: (Raw, Raw), second: (Raw, Raw), into: (Raw, Raw)) -> PyResult<()> {
    detached(py, move || {
        let parts = [first, second];
        // SAFETY: as in `forward`.
        unsafe {
            match parts[0].0.dtype("out")? {
                Dtype::F32 => merge_as::<f32>(&parts, &into),
                Dtype::F64 => merge_as::<f64>(&parts, &into),
                other => Err(PyValueError::new_err(format!(
                    "merge takes float32 or float64, not {}",
                    other.name()
                ))),
            }
        }
    })
}

/// A torch tensor's memory as a [`Raw`] of element type `code` and `shape` (its own, read
/// already, or that with leading axes of length 1 added, which take a stride of 0): its address
/// and strides, read through the tensor's own methods.
fn torch_raw(tensor: &Bound<'_, PyAny>, code: u8, shape: Vec<usize>) -> PyResult<Raw> {
    let py = tensor.py();
    let address = tensor.call_method0(pyo3::intern!(py, "data_ptr"))?.extract()?;
    let strides: Vec<isize> = tensor.call_method0(pyo3::intern!(py, "stride"))?.extract()?;
    let added = shape.len().saturating_sub(strides.len());
    Ok(Raw::new(address, code, shape, [vec![0; added], strides].concat()))
}

/// A torch tensor's shape, if it is a CPU tensor of `dtype` whose memory holds its values as they
/// are (not negated lazily, as a complex tensor's conjugate's imaginary part is: the package
/// resolves those).
fn cpu_shape(tensor: &Bound<'_, PyAny>, dtype: &Bound<'_, PyAny>) -> PyResult<Option<Vec<usize>>> {
    let py = tensor.py();
    let same = tensor.getattr(pyo3::intern!(py, "dtype"))?.is(dtype);
    if !same
        || !tensor.getattr(pyo3::intern!(py, "is_cpu"))?.extract::<bool>()?
        || tensor.call_method0(pyo3::intern!(py, "is_neg"))?.extract::<bool>()?
    {
        return Ok(None);
    }
    Ok(Some(tensor.getattr(pyo3::intern!(py, "shape"))?.extract()?))
}

/// A torch tensor's dtype and, if the extension takes it, its code (`codes` maps torch's dtypes to
/// the extension's codes).
fn dtype_code<'py>(
    tensor: &Bound<'py, PyAny>,
    codes: &Bound<'py, pyo3::types::PyDict>,
) -> PyResult<(Bound<'py, PyAny>, Option<u8>)> {
    let dtype = tensor.getattr(pyo3::intern!(tensor.py(), "dtype"))?;
    let code = codes.get_item(&dtype)?.map(|c| c.extract::<u8>()).transpose()?;
    Ok((dtype, code))
}

/// The common call's query, key and value as the engine reads them, with the query's dtype.
struct CommonCall<'py> {
    dtype: Bound<'py, PyAny>,
    code: u8,
    shapes: [Vec<usize>; 3],
    inputs: Inputs,
    /// 1 for 3-D tensors (`[heads, n, d]`, a batch of one), 0 for 4-D.
    added: usize,
}

/// `(query, key, value)` if they make the package's common call: 3-D or 4-D CPU torch tensors of one
/// floating dtype (`codes` maps torch's dtypes to the extension's codes; float32 or float64 alone
/// with `full_precision`) and PyTorch's shape rules (equal batches, query and key widths, key and
/// value heads and lengths; key heads equal to the query heads, or with `enable_gqa` dividing
/// them), a finite
/// scale if any. `None` for any other call, which the package checks in full and words the
/// errors for; the engine checks the rest.
fn common_call<'py>(
    (query, key, value): (&Bound<'py, PyAny>, &Bound<'py, PyAny>, &Bound<'py, PyAny>),
    scale: Option<f64>,
    enable_gqa: bool,
    codes: &Bound<'py, pyo3::types::PyDict>,
    full_precision: bool,
) -> PyResult<Option<CommonCall<'py>>> {
    let (dtype, code) = dtype_code(query, codes)?;
    let takes = |dtype| match dtype {
        Some(Dtype::F32 | Dtype::F64) => true,
        Some(Dtype::Bf16 | Dtype::F16) => !full_precision,
        Some(Dtype::Bool) | None => false,
    };
    let Some(code) = code.filter(|&c| takes(Dtype::from_code(c))) else {
        return Ok(None);
    };
    let (Some(qs), Some(ks), Some(vs)) =
        (cpu_shape(query, &dtype)?, cpu_shape(key, &dtype)?, cpu_shape(value, &dtype)?)
    else {
        return Ok(None);
    };
    let added = 4usize.saturating_sub(qs.len());
    let four = |shape: Vec<usize>| [vec![1; 4usize.saturating_sub(shape.len())], shape].concat();
    let same_rank = qs.len() == ks.len() && ks.len() == vs.len();
    let (qs, ks, vs) = (four(qs), four(ks), four(vs));
    let fits = same_rank
        && added <= 1
        && qs.len() == 4
        && qs[0] == ks[0]
        && qs[3] == ks[3]
        && ks[..3] == vs[..3]
        && (qs[1] == ks[1] || enable_gqa && ks[1] > 0 && qs[1] % ks[1] == 0)
        && scale.is_none_or(f64::is_finite);
    if !fits {
        return Ok(None);
    }
    let inputs = (
        torch_raw(query, code, qs.clone())?,
        torch_raw(key, code, ks.clone())?,
        torch_raw(value, code, vs.clone())?,
    );
    Ok(Some(CommonCall { dtype, code, shapes: [qs, ks, vs], inputs, added }))
}

impl<'py> CommonCall<'py> {
    /// The output's shape as the engine sees it, `[batch, heads, n_q, d_v]`.
    fn out_shape(&self) -> Vec<usize> {
        let [qs, _, vs] = &self.shapes;
        vec![qs[0], qs[1], qs[2], vs[3]]
    }

    /// `attn_mask` as the engine reads it, `[batch or 1, heads or 1, n_q, n_k]`, if the call
    /// takes it as it is: a CPU tensor, boolean or of the dtype the engine computes in (float32,
    /// float64 for float64 inputs), of no more dimensions than the query, broadcasting to the
    /// scores' shape as PyTorch broadcasts it (a row or a column of length 1 is read with a
    /// stride of 0), without `is_causal`. `None` for any other mask, which the package casts,
    /// copies or refuses with its own words.
    fn mask(
        &self,
        mask: &Bound<'py, PyAny>,
        is_causal: bool,
        codes: &Bound<'py, pyo3::types::PyDict>,
    ) -> PyResult<Option<Raw>> {
        if is_causal {
            return Ok(None);
        }
        let (dtype, code) = dtype_code(mask, codes)?;
        let compute = if Dtype::from_code(self.code) == Some(Dtype::F64) { Dtype::F64 } else { Dtype::F32 };
        let Some(code) =
            code.filter(|&c| matches!(Dtype::from_code(c), Some(d) if d == Dtype::Bool || d == compute))
        else {
            return Ok(None);
        };
        let Some(shape) = cpu_shape(mask, &dtype)? else {
            return Ok(None);
        };
        let [qs, ks, _] = &self.shapes;
        let scores = [qs[0], qs[1], qs[2], ks[2]];
        if shape.len() > scores.len() - self.added {
            return Ok(None);
        }
        let padded = [vec![1; scores.len() - shape.len()], shape].concat();
        if padded.iter().zip(&scores).any(|(&m, &s)| m != 1 && m != s) {
            return Ok(None);
        }
        let read = [padded[0], padded[1], scores[2], scores[3]];
        Ok(Some(torch_raw(mask, code, padded)?.expanded(&read)))
    }

    /// The shape a tensor of the engine's `shape` has as the caller passed its inputs.
    fn as_given<'a>(&self, shape: &'a [usize]) -> &'a [usize] {
        &shape[self.added..]
    }

    /// A new tensor like `like` (its dtype and device) of the engine's `shape` (as
    /// [`Self::as_given`]), and the engine's view of it.
    fn new_tensor(&self, like: &Bound<'py, PyAny>, shape: Vec<usize>) -> PyResult<(Bound<'py, PyAny>, Raw)> {
        let py = like.py();
        let given = PyTuple::new(py, self.as_given(&shape))?;
        let tensor = like.call_method1(pyo3::intern!(py, "new_empty"), (given,))?;
        let raw = torch_raw(&tensor, self.code, shape)?;
        Ok((tensor, raw))
    }
}

/// The common call's mask: none, or one [`CommonCall::mask`] reads as it is (`Err(())` for
/// any other, which makes the call another).
fn common_mask<'py>(
    call: &CommonCall<'py>,
    attn_mask: Option<&Bound<'py, PyAny>>,
    is_causal: bool,
    codes: &Bound<'py, pyo3::types::PyDict>,
) -> PyResult<Result<Option<Raw>, ()>> {
    match attn_mask {
        None => Ok(Ok(None)),
        Some(mask) => Ok(call.mask(mask, is_causal, codes)?.map(Some).ok_or(())),
    }
}

/// The package's common call (`_core.fast_forward`, see [`common_call`]; a mask as
/// [`CommonCall::mask`] takes it) on torch tensors as they are: the output (a new tensor), with
/// `with_lse` `(output, logsumexp)` (float32 or float64 inputs only: half precision's logsumexp
/// is float32, which the package allocates), or `None` for any other call. Reading the tensors
/// here rather than in Python took most of a small call's time off.
#[pyfunction]
#[pyo3(signature = (query, key, value, attn_mask, is_causal, scale, enable_gqa, codes, with_lse))]
#[allow(clippy::too_many_arguments)]
fn forward_torch<'py>(
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    attn_mask: Option<&Bound<'py, PyAny>>,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
    codes: &Bound<'py, pyo3::types::PyDict>,
    with_lse: bool,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let py = query.py();
    let Some(call) = common_call((query, key, value), scale, enable_gqa, codes, with_lse)? else {
        return Ok(None);
    };
    let Ok(mask) = common_mask(&call, attn_mask, is_causal, codes)? else {
        return Ok(None);
    };
    let out_shape = call.out_shape();
    let (out, out_raw) = call.new_tensor(query, out_shape.clone())?;
    let lse = with_lse.then(|| call.new_tensor(query, out_shape[..3].to_vec())).transpose()?;
    let spec = Spec(is_causal, scale, None, None, None, None);
    forward(py, call.inputs, mask, spec, out_raw, lse.as_ref().map(|(_, raw)| raw.clone()), false)?;
    match lse {
        Some((lse, _)) => Ok(Some(PyTuple::new(py, [out, lse])?.into_any())),
        None => Ok(Some(out)),
    }
}

/// The common call's backward (`_core.fast_backward`) on torch tensors as autograd hands them:
/// float32 or float64 inputs of the common call (see [`common_call`]; a mask as
/// [`CommonCall::mask`] takes it, which gets no gradient), the forward's `out` and
/// `lse` as [`forward_torch`] made them, `grad_out` of the output's shape and dtype in any strides
/// (a sum's gradient comes expanded). Returns `(dq, dk, dv)`, new tensors, or `None` for any other
/// call; an incoming gradient that is not finite gives gradients of NaN (see [`backward`]).
#[pyfunction]
#[pyo3(signature = (grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa, codes))]
#[allow(clippy::too_many_arguments)]
fn backward_torch<'py>(
    grad_out: &Bound<'py, PyAny>,
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    value: &Bound<'py, PyAny>,
    out: &Bound<'py, PyAny>,
    lse: &Bound<'py, PyAny>,
    attn_mask: Option<&Bound<'py, PyAny>>,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
    codes: &Bound<'py, pyo3::types::PyDict>,
) -> PyResult<Option<Bound<'py, PyTuple>>> {
    let py = query.py();
    let Some(call) = common_call((query, key, value), scale, enable_gqa, codes, true)? else {
        return Ok(None);
    };
    let Ok(mask) = common_mask(&call, attn_mask, is_causal, codes)? else {
        return Ok(None);
    };
    let out_shape = call.out_shape();
    let lse_shape = out_shape[..3].to_vec();
    let given = |t| cpu_shape(t, &call.dtype);
    let expected = |shape| Some(call.as_given(shape).to_vec());
    if (given(grad_out)?, given(out)?, given(lse)?)
        != (expected(&out_shape), expected(&out_shape), expected(&lse_shape))
    {
        return Ok(None);
    }
    let code = call.code;
    let saved = (
        torch_raw(out, code, out_shape.clone())?,
        torch_raw(lse, code, lse_shape)?,
        torch_raw(grad_out, code, out_shape)?,
    );
    let [qs, ks, vs] = call.shapes.clone();
    let ((dq, dq_raw), (dk, dk_raw), (dv, dv_raw)) =
        (call.new_tensor(query, qs)?, call.new_tensor(query, ks)?, call.new_tensor(query, vs)?);
    let spec = Spec(is_causal, scale, None, None, None, None);
    backward(py, call.inputs, mask, spec, saved, (dq_raw, dk_raw, dv_raw, None, None))?;
    Ok(Some(PyTuple::new(py, [dq, dk, dv])?))
}

/// Adds this module's functions.
pub fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(forward, module)?)?;
    module.add_function(wrap_pyfunction!(forward_torch, module)?)?;
    module.add_function(wrap_pyfunction!(backward, module)?)?;
    module.add_function(wrap_pyfunction!(backward_torch, module)?)?;
    module.add_function(wrap_pyfunction!(merge, module)?)?;
    module.add_function(wrap_pyfunction!(varlen, module)?)?;
    module.add_function(wrap_pyfunction!(varlen_backward, module)?)?;
    Ok(())
}
