"""qkv: fast scaled dot-product attention on the CPU, from Python.

``qkv.scaled_dot_product_attention`` takes PyTorch's arguments and returns what
``torch.nn.functional.scaled_dot_product_attention`` returns, on torch tensors (with autograd,
and under ``torch.compile`` as an opaque operator) or NumPy arrays. The engine is the Rust crate
``qkv``; see ``qkv.simd_report()`` for the kernels this CPU runs. Once it has seen a torch tensor,
it runs on PyTorch's own OpenMP threads where PyTorch runs on OpenMP (as many as
``torch.get_num_threads()``; ``QKV_TORCH_THREADS=0`` keeps qkv on threads of its own).
Context parallelism on ``torch.distributed`` is a module of its own, which imports torch:
``import qkv.distributed``.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Optional, Tuple, Union

from . import _core
from ._cache import KvCache, PagedKvCache, Rotary
from ._qkv import __version__, alibi_slopes, simd_report

if TYPE_CHECKING:
    from ._typing import Array, Offsets, PerHead, Scale, Window

__all__ = [
    "scaled_dot_product_attention",
    "attention_with_lse",
    "merge",
    "varlen_attention",
    "flash_attn_varlen_func",
    "KvCache",
    "PagedKvCache",
    "Rotary",
    "alibi_slopes",
    "simd_report",
]


_ops_module = None


def _torch_ops():
    """The torch operators (imported on first use, so that NumPy users need no torch; kept in a
    global so that torch.compile, which will not trace an import, reads it)."""
    global _ops_module
    if _ops_module is None:
        _ops_module = importlib.import_module("qkv._ops")
    return _ops_module


def _needs_op(query, key, value, attn_mask, sinks):
    """Whether a torch call must go through the registered operator, or in eager mode its
    ``torch.autograd.Function`` (``_operator``): to be differentiated, or wherever the operator
    itself must be seen (``_dispatched``). Otherwise the direct call skips autograd's overhead."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(query, torch.Tensor):
        return False
    tensors = (query, key, value, attn_mask, sinks)
    if torch.is_grad_enabled():
        for t in tensors:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                return True
    return _dispatched(torch, tensors)


def _dispatched(torch, tensors):
    """Whether the call must reach torch's dispatcher as the operator: where a graph is traced
    (torch.compile, torch.export, torch.jit.trace: a direct call would leave the engine's writes
    out of the graph), for tensors whose memory is not here (meta and fake tensors, other
    devices, subclasses: the fake implementation gives their shapes), and under a dispatch mode
    (which watches the operators it sees)."""
    # Plain loops: this runs on every call, and a generator's frame costs more than the checks.
    # A Parameter (learned sinks, weights) is a plain tensor here.
    plain = (torch.Tensor, torch.nn.Parameter)
    for t in tensors:
        if isinstance(t, torch.Tensor) and (type(t) not in plain or not t.is_cpu):
            return True
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    transform = torch._C._functorch.peek_interpreter_stack()
    if transform is not None:
        # Inside torch.func's transforms: vmap runs the operator once per batch element
        # (PyTorch's fallback); the others have no formula to run through.
        if transform.key() != torch._C._functorch.TransformType.Vmap:
            raise RuntimeError("torch.func's grad, jacrev, jacfwd and jvp do not reach through qkv's attention: "
                               "differentiate it with torch.autograd (loss.backward(), torch.autograd.grad); "
                               "torch.vmap works")
        return True
    return torch.utils._python_dispatch._get_current_dispatch_mode() is not None


def _operator(torch, operator, eager, tensors):
    """``eager`` (an operator's ``torch.autograd.Function``, without the dispatcher) for plain CPU
    tensors in eager mode; ``operator`` where the dispatcher must see it (``_dispatched``)."""
    return operator if _dispatched(torch, tensors) else eager


def _attend(query, key, value, attn_mask, is_causal, scale, enable_gqa, extensions, with_lse):
    """The direct call, or the operator (``_operator``) when autograd or torch.compile needs it."""
    _core.check_arguments((("is_causal", is_causal), ("enable_gqa", enable_gqa)), scale)
    window, alibi, softcap, sinks = extensions
    if _needs_op(query, key, value, attn_mask, sinks):
        window = _core.sliding_window(window)
        window = None if window is None else list(window)
        torch = sys.modules["torch"]
        heads = query.shape[-3] if query.dim() > 2 else 1
        alibi = _op_slopes(torch, alibi, lambda: _core.per_head("alibi_slopes", "slopes", alibi, heads))
        if sinks is not None and not isinstance(sinks, torch.Tensor):
            # The operator takes a tensor (a list or an array has no gradient to return).
            sinks = torch.as_tensor(sinks, dtype=torch.float64, device=query.device)
        ops = _torch_ops()
        attention = _operator(torch, ops.attention, ops.EagerAttention.apply, (query, key, value, attn_mask, sinks))
        out, lse = attention(query, key, value, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap, sinks)
        return (out, lse) if with_lse else out
    return _core.attend(query, key, value, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap, sinks,
                        with_lse)


def _op_slopes(torch, slopes, checked):
    """ALiBi slopes as the operators take them: a tensor, read only when the operator runs (under
    torch.compile, values read here would break the graph); a list or an array ``checked()``
    first, so that its errors name it. Slopes are constants, as in flash-attn: a tensor that
    requires grad is refused rather than left without a gradient."""
    if slopes is None:
        return None
    if not isinstance(slopes, torch.Tensor):
        return torch.as_tensor(checked(), dtype=torch.float64, device="cpu")
    if slopes.requires_grad and torch.is_grad_enabled():
        raise ValueError("alibi_slopes requires grad: ALiBi slopes are constants here (flash-attn's too) and get no "
                         "gradient; pass alibi_slopes.detach()")
    return slopes


def scaled_dot_product_attention(
    query: Array,
    key: Array,
    value: Array,
    attn_mask: Optional[Array] = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: Optional[Scale] = None,
    enable_gqa: bool = False,
    *,
    sliding_window: Optional[Window] = None,
    alibi_slopes: Optional[PerHead] = None,
    softcap: Optional[float] = None,
    sinks: Optional[PerHead] = None,
) -> Array:
    """``softmax(query · keyᵀ · scale + mask) · value``, as PyTorch's
    ``torch.nn.functional.scaled_dot_product_attention`` computes it.

    Arguments are PyTorch's: ``query`` ``[..., L, E]``, ``key`` ``[..., S, E]``, ``value``
    ``[..., S, Ev]`` (the same leading dimensions; with ``enable_gqa`` the key/value heads, the
    third dimension from the end, may divide the query heads); ``attn_mask`` boolean (``True``
    takes part in attention) or additive (float32 or the query's dtype, as PyTorch takes it),
    broadcast to ``[..., L, S]``;
    ``is_causal`` hides the keys after each query, aligned top-left; ``scale`` defaults to
    ``1 / sqrt(E)``. Torch tensors or NumPy arrays, float32, float64, bfloat16 or float16 (half
    precision is computed in float32 and rounded once, but for bfloat16 on a CPU with AMX or
    AVX512-BF16, whose products round the weights to bfloat16 before they meet the values, as
    PyTorch's bfloat16 kernel does; ``qkv.simd_report()`` names the level). Returns ``[..., L,
    Ev]`` in the inputs' dtype and library. Contiguous inputs are read in place, and the engine runs with the GIL
    released.

    qkv's extensions, keyword-only: ``sliding_window=(before, after)`` (each query sees the keys
    from ``before`` before its position to ``after`` after it; -1 or None for no limit),
    ``alibi_slopes`` (one per query head; ``qkv.alibi_slopes(heads)`` gives the paper's; head
    ``h`` adds ``slope_h · (j - i)`` to query ``i``'s score of key ``j``, the paper's form, which
    favours keys after the query where no causal mask hides them), ``softcap`` (scores become
    ``softcap · tanh(score / softcap)`` before masks and ALiBi; None for no cap), ``sinks`` (one logit ``s_h`` per query head, not scaled: attention sinks as gpt-oss learns
    them; each row's softmax gets ``exp(s_h)`` as one more term of its denominator, a weight that
    takes no value, so a row may put less than all its weight on the keys; a 1-D torch tensor that
    requires grad gets its gradient; ``-inf`` is no sink). Windows and ALiBi place the queries
    top-left, as ``is_causal`` does.

    Where qkv differs from PyTorch:

    - a query whose keys are all masked gets an output of 0, whatever the mask's kind (PyTorch
      2.15 on the CPU agrees; other versions and backends give NaN);
    - queries and keys of width 0, or values of width 0, raise ``ValueError`` (PyTorch returns the
      mean of the values, or an empty output);
    - ``dropout_p`` other than 0 raises ``ValueError``: qkv has no dropout;
    - ``attn_mask`` together with ``is_causal`` raises ``ValueError`` (as PyTorch does);
    - inputs must be finite: a query, or a key or value that some query sees, that is NaN or
      infinite, an additive mask with NaN or ``+inf`` (``-inf`` hides a key), and scores past
      float32's range raise ``ValueError`` naming the element or the query, where PyTorch returns
      NaN (so an fp16 forward that overflows stops the loop rather than reaching a
      ``GradScaler``); a gradient coming back that is not finite gives gradients of NaN, as
      PyTorch's does;
    - the leading dimensions of query, key and value must be equal (PyTorch broadcasts a batch of
      1 against a larger one), with at least one head (PyTorch returns an empty output for none);
    - a 1-D ``attn_mask`` (``[S]``) broadcasts over the queries (PyTorch raises);
    - ``torch.autocast`` does not apply: the call computes in its inputs' dtype;
    - there is no double backward: a second derivative through qkv (``create_graph=True``,
      ``gradgradcheck``) raises ``RuntimeError`` saying so, as do ``torch.func``'s ``grad``,
      ``jacrev``, ``jacfwd`` and ``jvp``; ``torch.vmap`` runs the call once per batch element.

    Errors in shapes and arguments raise ``ValueError`` with the engine's message.
    """
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p is {dropout_p}: qkv has no dropout; pass 0.0 (PyTorch's default, and what a "
                         "model passes in eval mode)")
    extensions = (sliding_window, alibi_slopes, softcap, sinks)
    return _attend(query, key, value, attn_mask, is_causal, scale, enable_gqa, extensions, with_lse=False)


def attention_with_lse(
    query: Array,
    key: Array,
    value: Array,
    attn_mask: Optional[Array] = None,
    is_causal: bool = False,
    scale: Optional[Scale] = None,
    enable_gqa: bool = False,
    *,
    sliding_window: Optional[Window] = None,
    alibi_slopes: Optional[PerHead] = None,
    softcap: Optional[float] = None,
    sinks: Optional[PerHead] = None,
) -> Tuple[Array, Array]:
    """Like ``scaled_dot_product_attention``, also returning each row's logsumexp
    ``ln Σ_j exp(score_ij)`` (``[..., L]``, float64 for float64 inputs, float32 otherwise; ``-inf``
    for a row that sees no key; with ``sinks`` the sum has ``exp(s_h)`` too): ``(out, lse)``.
    Attention over disjoint sets of keys merges into attention over their union with
    ``qkv.merge`` (pass ``sinks`` to one part's call only; ``qkv.merge`` is not differentiable,
    a merge written in torch is). On torch tensors both are differentiable; a row that sees no key
    gets no gradient through its ``-inf``."""
    extensions = (sliding_window, alibi_slopes, softcap, sinks)
    return _attend(query, key, value, attn_mask, is_causal, scale, enable_gqa, extensions, with_lse=True)


def varlen_attention(
    query: Array,
    key: Array,
    value: Array,
    cu_seqlens_q: Offsets,
    cu_seqlens_k: Offsets,
    *,
    is_causal: bool = False,
    scale: Optional[Scale] = None,
    sliding_window: Optional[Window] = None,
    alibi_slopes: Optional[PerHead] = None,
    softcap: Optional[float] = None,
    sinks: Optional[PerHead] = None,
    return_lse: bool = False,
) -> Union[Array, Tuple[Array, Array]]:
    """Attention over a packed batch of sequences of different lengths, with no padding, in
    flash-attn's ``flash_attn_varlen_func`` layout: ``query`` ``[total_q, heads, E]``, ``key``
    ``[total_k, kv_heads, E]``, ``value`` ``[total_k, kv_heads, Ev]`` (``kv_heads`` dividing
    ``heads``: grouped-query attention). Sequence ``i``'s queries are rows
    ``cu_seqlens_q[i]:cu_seqlens_q[i + 1]`` and it attends to its own keys, rows
    ``cu_seqlens_k[i]:cu_seqlens_k[i + 1]``, only; the offsets (a list, an array or an integer
    tensor) start at 0 and end at the packed length. Returns ``[total_q, heads, Ev]`` in the
    inputs' dtype and library, and with ``return_lse`` also each row's logsumexp ``[heads,
    total_q]`` (flash-attn's ``softmax_lse`` layout; float64 for float64 inputs, float32
    otherwise; for a query of a sequence with no keys, whose output is 0, ``-inf`` or its head's
    sink logit).

    The options are ``scaled_dot_product_attention``'s extensions, applied to each sequence over
    its own queries and keys; ``is_causal``, the window and ALiBi are aligned bottom-right within
    each sequence, as flash-attn aligns them (the last query sees the last key; the same as
    top-left where a sequence has as many queries as keys). ALiBi is the paper's
    ``slope · (j - i)``: with ``is_causal`` flash-attn's weights, but without it flash-attn adds
    ``-slope · |j - i|`` instead. ``qkv.flash_attn_varlen_func`` takes flash-attn's own
    arguments and applies its ALiBi. Torch tensors or NumPy arrays, float32
    or float64 computed in place; bfloat16 and float16 from a float32 copy. Every element must be
    finite.

    On torch tensors the output and the logsumexp are differentiable (query, key, value and a
    ``sinks`` tensor that requires grad): the engine's backward runs each sequence over its own
    rows, one sequence after another, and returns the gradients in the inputs' layout and dtype
    (half precision computed in float32 and rounded once). An incoming gradient that is not
    finite (the overflow a ``GradScaler`` looks for) gives gradients of NaN, as PyTorch's own
    backward would; there is no double backward (``create_graph=True`` through it raises when the
    second backward runs). Under ``torch.compile`` the call is an opaque operator that reads the
    offsets only when it runs: pass them as integer tensors, as flash-attn's callers do, and one
    graph serves packed batches of any layout (a list is part of the graph: a new layout
    recompiles).
    """
    _core.check_arguments((("is_causal", is_causal),), scale)
    options = (is_causal, scale, sliding_window, alibi_slopes, softcap, sinks)
    return _varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, options, return_lse)


def _varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, options, with_lse):
    """The packed call, through the operator (``_operator``) when autograd or torch.compile needs
    it."""
    is_causal, scale, window, alibi, softcap, sinks = options
    if not _needs_op(query, key, value, None, sinks):
        return _core.varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, options, with_lse)
    torch = sys.modules["torch"]
    # The operator takes the offsets as tensors, read only when it runs: under torch.compile a
    # graph then holds any packed layout, as flash-attn's does (a list would be a guard on its
    # length and values, a recompile for each new number of sequences).
    offsets = []
    for name, given in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if isinstance(given, torch.Tensor):
            _core.integer_offsets(name, given)
            offsets.append(given)
        else:
            # On the CPU by name, whatever device context is active: the operator reads them there.
            offsets.append(torch.tensor(_core.offset_list(name, given), dtype=torch.int64, device="cpu"))
    window = _core.sliding_window(window)
    window = None if window is None else list(window)
    # ALiBi as the operator takes it: slopes, how many rows of them, flash-attn's form or the paper's.
    # flash-attn's slopes were checked by flash_attn_alibi (one row for every sequence, or one).
    flash = isinstance(alibi, _core.FlashAttnAlibi)
    slopes, sequences, symmetric = alibi if flash else (alibi, 1, False)
    slopes = _op_slopes(torch, slopes,
                        lambda: slopes if flash else _core.per_head("alibi_slopes", "slopes", slopes, query.shape[1]))
    if sinks is not None and not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(sinks, dtype=torch.float64, device=query.device)
    ops = _torch_ops()
    varlen = _operator(torch, ops.varlen_attention, ops.EagerVarlenAttention.apply, (query, key, value, *offsets, sinks))
    out, lse = varlen(
        query, key, value, *offsets, bool(is_causal), scale, window, slopes, sequences, symmetric, softcap, sinks
    )
    return (out, lse) if with_lse else out


def flash_attn_varlen_func(
    q: Array,
    k: Array,
    v: Array,
    cu_seqlens_q: Offsets,
    cu_seqlens_k: Offsets,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: Optional[Scale] = None,
    causal: bool = False,
    window_size: Tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: Optional[Array] = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
    block_table: None = None,
) -> Union[Array, Tuple[Array, Array, None]]:
    """flash-attn's ``flash_attn_varlen_func`` (flash-attn 2.6's arguments, in its order), on the
    CPU: porting a call is changing its import. ``varlen_attention`` with flash-attn's spelling:
    ``softmax_scale``, ``causal`` (bottom-right), ``window_size=(left, right)`` (-1 unbounded),
    ``softcap`` (0.0 for none), ``alibi_slopes`` ``(nheads,)`` or ``(batch, nheads)`` applied as
    flash-attn applies them (``-slope · |j - p|`` without ``causal``). Returns ``out``, or with
    ``return_attn_probs`` ``(out, softmax_lse, None)``, the logsumexp ``[nheads, total_q]`` in
    float32 (float64 for float64 inputs).

    Differentiable (see ``varlen_attention``). Where it differs: ``softmax_lse`` is differentiable
    too (flash-attn's backward drops its gradient: a loss through it, a z-loss or a merge of
    parts, moves the inputs here and not there); ``dropout_p`` must be 0 and ``block_table`` None (``qkv.PagedKvCache`` holds paged keys);
    ``deterministic`` changes nothing (qkv always is); a query whose sequence has no key gets a
    logsumexp of ``-inf`` (flash-attn writes ``+inf``); with ``causal`` and ALiBi flash-attn adds
    ``slope · j``, the same weights, so its logsumexp is larger by ``slope · p`` than this one,
    the logsumexp of the scores as the paper biases them. ``max_seqlen_q`` and ``max_seqlen_k``
    must be at least the longest sequence's lengths, as flash-attn needs them to be (not checked
    under ``torch.compile``, where reading the offsets would break the graph; qkv does not use
    them)."""
    if dropout_p != 0:
        raise ValueError(f"dropout_p is {dropout_p}: qkv has no dropout (pass 0.0, as flash-attn's inference does)")
    if block_table is not None:
        raise ValueError("block_table: qkv's paged keys and values live in qkv.PagedKvCache, not in block tables")
    _core.check_arguments((("causal", causal),), softmax_scale, "softmax_scale")
    torch = sys.modules.get("torch")
    # Under torch.compile the offsets' values are not read here (that would break the graph):
    # the lengths are not checked against max_seqlen, which qkv does not use.
    compiling = torch is not None and torch.compiler.is_compiling()
    for name, given, longest in (("q", cu_seqlens_q, max_seqlen_q), ("k", cu_seqlens_k, max_seqlen_k)):
        if compiling:
            # Not even looked at: a max_seqlen that changes between calls is symbolic there.
            break
        if hasattr(longest, "item") and getattr(longest, "ndim", 1) == 0:
            longest = longest.item()  # a 0-d tensor
        if not _core.whole(longest):
            raise ValueError(f"max_seqlen_{name} is {longest!r}: it is a whole number, the longest sequence's length")
        offsets = _core.offset_list(f"cu_seqlens_{name}", given)
        lengths = [b - a for a, b in zip(offsets, offsets[1:])]
        if lengths and max(lengths) > longest:
            raise ValueError(f"max_seqlen_{name} is {longest}, but a sequence of cu_seqlens_{name} has {max(lengths)} "
                             "positions: it is at least the longest sequence's length")
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        raise ValueError(f"window_size is {window_size!r}: it is (left, right), -1 for no limit on a side")
    left, right = window_size
    window = None if left < 0 and right < 0 else (left, right)
    alibi = None
    if alibi_slopes is not None:
        sequences = len(cu_seqlens_q) - 1
        alibi = _core.flash_attn_alibi(alibi_slopes, q.shape[1], sequences)
    options = (causal, softmax_scale, window, alibi, None if softcap == 0 else softcap, None)
    with _core.named_as_passed(_FLASH_NAMES):
        result = _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, options, return_attn_probs)
    return (*result, None) if return_attn_probs else result


# What flash_attn_varlen_func's arguments are called in the errors of the calls it makes: `query`
# as the subject of a message or an element's name (not in "query heads").
_FLASH_NAMES = {
    "sliding_window": "window_size",
    "scale": "softmax_scale",
    **{rf"{ours}(?=\[| has| have| and| need| \(| \d|,)": flash for ours, flash in (("query", "q"), ("key", "k"), ("value", "v"))},
}


def merge(out_a: Array, lse_a: Array, out_b: Array, lse_b: Array) -> Tuple[Array, Array]:
    """Attention over two disjoint sets of keys (``(out, lse)`` each, from ``attention_with_lse``)
    merged exactly into attention over both: ``(out, lse)``. A row that sees no key in one part
    takes the other's. Not differentiable: an input that requires grad, with grad mode on, raises
    ``ValueError`` (the same merge written in torch operations is differentiable)."""
    return _core.merge(out_a, lse_a, out_b, lse_b)


class _RegisterWithTorch:
    """A finder on ``sys.meta_path`` that registers qkv's operators as soon as ``import torch``
    has run, when qkv was imported first (``import qkv`` before ``import torch``, as isort orders
    them): torch.compile will not trace the import a first call would make (a graph break, or
    with ``fullgraph`` an error), and ``torch.export.load`` finds only operators already
    registered. NumPy users, who never import torch, never import it through qkv."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        # Stays in place until torch has run: a spec asked for and not imported
        # (`importlib.util.find_spec("torch")`, as libraries check for torch) imports nothing.
        for finder in sys.meta_path:
            find = None if finder is self else getattr(finder, "find_spec", None)
            spec = None if find is None else find(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _ThenRegister(spec.loader, self)
                return spec
        return None


class _ThenRegister:
    """torch's own loader, registering qkv's operators once torch's module has run."""

    def __init__(self, loader, finder):
        self._loader, self._finder = loader, finder

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        # torch keeps its own loader, as if qkv had never been in the way.
        module.__loader__ = module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        if self._finder in sys.meta_path:
            sys.meta_path.remove(self._finder)
        _torch_ops()

    def __getattr__(self, name):
        # Everything else (resources, source, code) is the loader's own.
        return getattr(self._loader, name)


if "torch" in sys.modules:
    # Registered now so that torch.compile finds the operators before its first trace.
    _torch_ops()
else:
    sys.meta_path.insert(0, _RegisterWithTorch())
