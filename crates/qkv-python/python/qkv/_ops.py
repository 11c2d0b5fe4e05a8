"""qkv as PyTorch operators: ``qkv::attention`` and its backward ``qkv::attention_backward``, and
the packed batch's ``qkv::varlen_attention`` and ``qkv::varlen_attention_backward``, registered
with ``torch.library.custom_op`` so that autograd differentiates through the engine's own
backward and ``torch.compile`` treats them as opaque calls (their fake implementations give the
output shapes).

In eager mode the same functions and the same autograd formulas run as ``torch.autograd.Function``
classes (``EagerAttention``, ``EagerVarlenAttention``) on plain CPU tensors: a custom operator's
dispatch and its autograd wrapper took about 100 µs of a small training step's 370 (``[1, 8, 8,
64]``, GQA 8/2, Zen 4). The operators serve everything else: graphs traced by torch.compile,
torch.export or torch.jit.trace, meta and fake tensors (whose shapes their fake implementations
give), tensor subclasses, and dispatch modes that watch the calls they see."""

from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import _core


def _attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Optional[Tensor],
    is_causal: bool,
    scale: Optional[float],
    enable_gqa: bool,
    window: Optional[List[int]],
    alibi: Optional[Tensor],
    softcap: Optional[float],
    sinks: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """The output ``[..., L, Ev]`` and each row's logsumexp ``[..., L]``."""
    return _core.attend(query, key, value, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap, sinks,
                        with_lse=True)


attention = torch.library.custom_op("qkv::attention", _attention, mutates_args=())


@attention.register_fake
def _(query, key, value, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap, sinks):
    # The checks a real call makes of the shapes (ALiBi's slopes stay on the CPU, read when it runs).
    _core.one_device((("query", query), ("key", key), ("value", value), ("attn_mask", attn_mask), ("sinks", sinks)))
    _core.dense_shapes(_core.backend(query), query, key, value, attn_mask, is_causal, enable_gqa, on_cpu=False)
    lead, n_q = query.shape[:-2], query.shape[-2]
    out = query.new_empty((*lead, n_q, value.shape[-1]))
    lse = query.new_empty((*lead, n_q), dtype=torch.float64 if query.dtype == torch.float64 else torch.float32)
    return out, lse


def _like(gradient, input):
    """The gradient laid out as its input (``torch.empty_like``'s strides), as the fake
    implementation promises and torch.compile's compiled backward checks."""
    gradient = gradient.reshape(input.shape)
    if gradient.stride() == input.stride():
        return gradient
    return torch.empty_like(input).copy_(gradient)


def _attention_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    lse: Tensor,
    attn_mask: Optional[Tensor],
    is_causal: bool,
    scale: Optional[float],
    enable_gqa: bool,
    window: Optional[List[int]],
    alibi: Optional[Tensor],
    softcap: Optional[float],
    sinks: Optional[Tensor],
    mask_grad: bool,
    grad_lse: Optional[Tensor] = None,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dmask, dsinks)``; ``dmask`` is empty unless ``mask_grad``, ``dsinks``
    without sinks. ``grad_lse``: the logsumexp's gradient, when it has one."""
    gradients = None
    if grad_lse is None and not mask_grad and _core.no_extension(window, alibi, softcap, sinks):
        # The common call straight from the tensors.
        gradients = _core.fast_backward(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale,
                                        enable_gqa)
        if gradients is not None:
            gradients = (*gradients, None, None)
    if gradients is None:
        call = _core.Call(query, key, value, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap, sinks)
        gradients = call.backward(out, lse, grad_out, mask_grad, grad_lse)
    dq, dk, dv, dmask, dsinks = gradients
    dq, dk, dv = (_like(g, t) for g, t in ((dq, query), (dk, key), (dv, value)))
    dsinks = query.new_empty(0) if dsinks is None else dsinks.to(sinks.dtype)
    if dmask is None:
        return dq, dk, dv, query.new_empty(0), dsinks
    # A mask shared along some axes gets the sum of its slices' gradients.
    scores = (*call.lead, call.n_q, call.n_k)
    dmask = dmask.reshape(scores).sum_to_size(attn_mask.shape).to(attn_mask.dtype)
    return dq, dk, dv, _like(dmask, attn_mask), dsinks


attention_backward = torch.library.custom_op("qkv::attention_backward", _attention_backward, mutates_args=())


@attention_backward.register_fake
def _(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap,
      sinks, mask_grad, grad_lse=None):
    dmask = torch.empty_like(attn_mask) if mask_grad else query.new_empty(0)
    dsinks = query.new_empty(0) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), dmask, dsinks


def _setup_context(ctx, inputs, output):
    query, key, value, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap, sinks = inputs
    out, lse = output
    # The slopes as they were (a copy of a few numbers, which the caller may change before the
    # backward runs).
    alibi = None if alibi is None else alibi.clone()
    ctx.save_for_backward(query, key, value, out, lse, attn_mask, alibi, sinks)
    ctx.options = (is_causal, scale, enable_gqa, window), softcap
    ctx.mask_grad = attn_mask is not None and attn_mask.requires_grad
    ctx.sinks_grad = sinks is not None and sinks.requires_grad
    # An output nothing differentiates through gets None, not zeros: a backward for the output
    # alone (the common case) then costs nothing for the logsumexp.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_out, grad_lse, differentiate=attention_backward):
    """The autograd formula: the engine's backward through ``differentiate`` (the operator, or in
    eager mode a function without the dispatcher)."""
    query, key, value, out, lse, attn_mask, alibi, sinks = ctx.saved_tensors
    (is_causal, scale, enable_gqa, window), softcap = ctx.options
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    options = (is_causal, scale, enable_gqa, window, alibi, softcap)
    dq, dk, dv, dmask, dsinks = differentiate(
        grad_out, query, key, value, out, lse, attn_mask, *options, sinks, ctx.mask_grad, grad_lse
    )
    dmask = dmask if ctx.mask_grad else None
    dsinks = dsinks if ctx.sinks_grad else None
    return dq, dk, dv, dmask, None, None, None, None, None, None, dsinks


attention.register_autograd(_backward, setup_context=_setup_context)


def eager_function(name, function, setup_context, backward, differentiate):
    """A ``torch.autograd.Function`` named ``name`` that runs an operator's ``function`` and its
    autograd formula (``setup_context``, ``backward``) without the dispatcher, for eager mode;
    ``differentiate`` is ``(the backward's operator, its function)``. The backward runs the
    function, but the operator where autograd records the backward for a double backward
    (``create_graph``): the operator's own backward then says there is none."""

    def forward(ctx, *inputs):
        output = function(*inputs)
        # The context set up here, not in a ``setup_context`` of the class: that form binds the
        # arguments through ``inspect.signature`` on every call (25 µs).
        setup_context(ctx, inputs, output)
        return output

    def backward_(ctx, grad_out, grad_lse):
        operator, plain = differentiate
        return backward(ctx, grad_out, grad_lse, operator if torch.is_grad_enabled() else plain)

    doc = f"``{function.__name__}`` and its autograd formula without the dispatcher (``eager_function``)."
    body = {"forward": staticmethod(forward), "backward": staticmethod(backward_), "__doc__": doc}
    return type(name, (torch.autograd.Function,), body)


EagerAttention = eager_function(
    "EagerAttention", _attention, _setup_context, _backward, (attention_backward, _attention_backward)
)


def _no_second_derivative(ctx, *grads):
    raise RuntimeError("qkv's attention backward has no backward of its own: there are no second derivatives "
                       "through qkv (create_graph=True, gradgradcheck, gradient penalties); use PyTorch's SDPA where "
                       "a double backward is needed")


# The backward's own backward, called only by a double backward: an error that says so, where
# PyTorch's own ("no autograd formula was registered") points at register_autograd.
attention_backward.register_autograd(_no_second_derivative)


def _varlen_options(is_causal, scale, window, alibi, alibi_sequences, alibi_symmetric, softcap, sinks):
    """The options as ``_core.varlen`` takes them, ALiBi rebuilt from the operator's plain
    arguments: the paper's slopes per head, or flash-attn's form (``_core.FlashAttnAlibi``), a
    tensor read only when the operator runs."""
    if alibi is not None and alibi_symmetric:
        alibi = _core.FlashAttnAlibi((alibi, alibi_sequences, True))
    return (is_causal, scale, window, alibi, softcap, sinks)


def _varlen_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    is_causal: bool,
    scale: Optional[float],
    window: Optional[List[int]],
    alibi: Optional[Tensor],
    alibi_sequences: int,
    alibi_symmetric: bool,
    softcap: Optional[float],
    sinks: Optional[Tensor],
) -> Tuple[Tensor, Tensor]:
    """A packed batch's output ``[total_q, heads, Ev]`` and logsumexp ``[heads, total_q]``."""
    options = _varlen_options(is_causal, scale, window, alibi, alibi_sequences, alibi_symmetric, softcap, sinks)
    return _core.varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, options, True)


varlen_attention = torch.library.custom_op("qkv::varlen_attention", _varlen_attention, mutates_args=())


@varlen_attention.register_fake
def _(query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window, alibi, alibi_sequences,
      alibi_symmetric, softcap, sinks):
    _core.one_device((("query", query), ("key", key), ("value", value), ("sinks", sinks)))
    _core.checked_dtype(_core.backend(query), (query, key, value), lambda rank: rank == 3,
                        "a packed batch is [total, heads, d]", on_cpu=False)
    total_q, heads = query.shape[0], query.shape[1]
    out = query.new_empty((total_q, heads, value.shape[-1]))
    lse = query.new_empty((heads, total_q), dtype=torch.float64 if query.dtype == torch.float64 else torch.float32)
    return out, lse


def _varlen_attention_backward(
    grad_out: Tensor,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    is_causal: bool,
    scale: Optional[float],
    window: Optional[List[int]],
    alibi: Optional[Tensor],
    alibi_sequences: int,
    alibi_symmetric: bool,
    softcap: Optional[float],
    sinks: Optional[Tensor],
    grad_lse: Optional[Tensor],
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dsinks)``, ``dsinks`` empty without sinks."""
    options = _varlen_options(is_causal, scale, window, alibi, alibi_sequences, alibi_symmetric, softcap, sinks)
    dq, dk, dv, dsinks = _core.varlen_backward(
        query, key, value, cu_seqlens_q, cu_seqlens_k, options, out, lse, grad_out, grad_lse
    )
    dq, dk, dv = (_like(g, t) for g, t in ((dq, query), (dk, key), (dv, value)))
    return dq, dk, dv, query.new_empty(0) if dsinks is None else dsinks.to(sinks.dtype)


varlen_attention_backward = torch.library.custom_op(
    "qkv::varlen_attention_backward", _varlen_attention_backward, mutates_args=()
)


@varlen_attention_backward.register_fake
def _(grad_out, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window, alibi,
      alibi_sequences, alibi_symmetric, softcap, sinks, grad_lse):
    dsinks = query.new_empty(0) if sinks is None else torch.empty_like(sinks)
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), dsinks


def _varlen_setup_context(ctx, inputs, output):
    query, key, value, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window, alibi, *rest, sinks = inputs
    out, lse = output
    # Copies of the offsets and slopes (a few numbers): a caller may refill its offsets' buffer
    # with the next batch's before this backward runs.
    layout = [None if t is None else t.clone() for t in (cu_seqlens_q, cu_seqlens_k, alibi)]
    ctx.save_for_backward(query, key, value, out, lse, *layout, sinks)
    ctx.options = (is_causal, scale, window), rest
    ctx.sinks_grad = sinks is not None and sinks.requires_grad
    ctx.set_materialize_grads(False)


def _varlen_backward(ctx, grad_out, grad_lse, differentiate=varlen_attention_backward):
    """The packed call's autograd formula (see ``_backward``)."""
    query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k, alibi, sinks = ctx.saved_tensors
    (is_causal, scale, window), rest = ctx.options
    if grad_out is None:
        grad_out = torch.zeros_like(out)
    dq, dk, dv, dsinks = differentiate(
        grad_out, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_k, is_causal, scale, window, alibi, *rest,
        sinks, grad_lse,
    )
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, dsinks if ctx.sinks_grad else None


varlen_attention.register_autograd(_varlen_backward, setup_context=_varlen_setup_context)
varlen_attention_backward.register_autograd(_no_second_derivative)


EagerVarlenAttention = eager_function(
    "EagerVarlenAttention",
    _varlen_attention,
    _varlen_setup_context,
    _varlen_backward,
    (varlen_attention_backward, _varlen_attention_backward),
)
