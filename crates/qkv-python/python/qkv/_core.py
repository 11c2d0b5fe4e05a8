"""Torch tensors and NumPy arrays as the extension module takes them, and the checks, reshapes
and allocations around its calls.

The extension (``qkv._qkv``) takes each tensor as ``(address, dtype code, shape, strides in
elements)`` and views that memory in place: nothing is copied on the way in, and outputs are
allocated here, in the caller's library, and written by the engine.
"""

import contextlib
import math
import re
import sys

from . import _qkv, _threads

_CODES = {"float32": 0, "float64": 1, "bfloat16": 2, "float16": 3, "bool": 4}
FLOATS = ("float32", "float64", "bfloat16", "float16")


class _Torch:
    """How to read, reshape and allocate torch tensors."""

    def __init__(self, torch):
        self.torch = torch
        self.names = {getattr(torch, n): n for n in _CODES}

    def dtype_name(self, t):
        return self.names.get(t.dtype, str(t.dtype).replace("torch.", ""))

    def readable(self, t):
        """``t`` as memory the engine reads as it is: a tensor with torch's lazy negation (a
        complex tensor's conjugate's imaginary part) is materialised; any other is itself."""
        return t.resolve_neg() if t.is_neg() else t

    def raw(self, t):
        if t.is_neg():
            raise RuntimeError("qkv: internal error (please report it): a tensor with torch's negative bit "
                               "reached the engine unresolved")
        return (t.data_ptr(), _CODES[self.names[t.dtype]], t.shape, t.stride())

    # Outputs on the CPU by name: under a device context (``with torch.device("meta")``) a
    # factory without one would allocate them there, where the engine cannot write.
    def empty(self, shape, dtype_name):
        return self.torch.empty(shape, dtype=getattr(self.torch, dtype_name), device="cpu")

    def zeros(self, shape, dtype_name):
        return self.torch.zeros(shape, dtype=getattr(self.torch, dtype_name), device="cpu")

    def broadcast(self, t, shape):
        return t.expand(shape)

    def cast(self, t, dtype_name):
        return t.to(getattr(self.torch, dtype_name))

    def with_column(self, t, column):
        """``t`` with ``column`` (a number, or a tensor of ``t``'s shape but the last axis) as one
        more last column."""
        column = self.torch.as_tensor(column, dtype=t.dtype, device=t.device).expand(t.shape[:-1])
        return self.torch.cat([t, column.unsqueeze(-1)], -1)

    def check_device(self, argument, t):
        if t.device.type != "cpu":
            raise ValueError(f"{argument} is on {t.device}: qkv runs on the CPU")


class _NumPy:
    """How to read, reshape and allocate NumPy arrays (and ml_dtypes' bfloat16)."""

    def __init__(self, np):
        self.np = np

    def dtype_name(self, a):
        return a.dtype.name

    def readable(self, a):
        """``a`` as memory the engine reads as it is: an array with negative strides or strides
        that are not whole elements is copied (the engine reads forward, whole elements); the
        caller keeps the copy alive for the call."""
        return self.np.ascontiguousarray(a) if self._unreadable(a) else a

    @staticmethod
    def _unreadable(a):
        return any(s < 0 or s % a.itemsize for s in a.strides)

    def raw(self, a):
        if self._unreadable(a):
            raise RuntimeError(f"qkv: internal error (please report it): an array of strides {a.strides} reached "
                               "the engine unread")
        return (a.__array_interface__["data"][0], _CODES[a.dtype.name], a.shape,
                tuple(s // a.itemsize for s in a.strides))

    def empty(self, shape, dtype_name):
        return self.np.empty(shape, dtype=self._dtype(dtype_name))

    def zeros(self, shape, dtype_name):
        return self.np.zeros(shape, dtype=self._dtype(dtype_name))

    def _dtype(self, name):
        if name == "bfloat16":
            try:
                import ml_dtypes
            except ModuleNotFoundError:
                raise ModuleNotFoundError("NumPy has no bfloat16 of its own: qkv uses ml_dtypes' for NumPy arrays "
                                          "(pip install ml_dtypes)") from None
            return ml_dtypes.bfloat16
        return self.np.dtype(name)

    def broadcast(self, a, shape):
        return self.np.broadcast_to(a, shape)

    def cast(self, a, dtype_name):
        return a.astype(self._dtype(dtype_name))

    def check_device(self, argument, a):
        pass


_backends = {}

# torch's dtypes to the extension's codes, and "type": torch.Tensor, once torch is in use (for
# ``fast_forward``).
TORCH_CODES = {}


def _library(t):
    """``"torch"`` for a torch tensor (of any subclass), ``"numpy"`` for a NumPy array, else the
    module its type comes from."""
    for kind, base in (("torch", "Tensor"), ("numpy", "ndarray")):
        module = sys.modules.get(kind)
        if module is not None and isinstance(t, getattr(module, base)):
            return kind
    return type(t).__module__.split(".")[0]


def backend(*tensors):
    """The library the tensors belong to (all of them the same one)."""
    first = tensors[0]
    kind = _library(first)
    for t in tensors[1:]:
        if t is not None and _library(t) != kind:
            raise TypeError(f"mixed tensor types: {type(first).__name__} and {type(t).__name__}; pass one library's")
    if kind not in _backends:
        if kind == "torch":
            torch = sys.modules["torch"]
            _threads.use_torch_threads(torch)
            _backends[kind] = _Torch(torch)
            TORCH_CODES.update({getattr(torch, n): c for n, c in _CODES.items()}, type=torch.Tensor)
        elif kind == "numpy":
            _backends[kind] = _NumPy(sys.modules["numpy"])
        else:
            raise TypeError(f"qkv takes torch tensors or NumPy arrays, not {type(first).__name__}")
    return _backends[kind]


def no_extension(window, alibi, softcap, sinks):
    """Whether a dense call uses none of qkv's extensions (the common call's first condition)."""
    return window is None and alibi is None and softcap is None and sinks is None


def attend(query, key, value, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap, sinks, with_lse):
    """A dense call's output, and with ``with_lse`` its logsumexp: the common call straight from
    the tensors (``fast_forward``), any other through ``Call``."""
    if no_extension(window, alibi, softcap, sinks):
        result = fast_forward(query, key, value, attn_mask, is_causal, scale, enable_gqa, with_lse)
        if result is not None:
            return result
    call = Call(query, key, value, attn_mask, is_causal, scale, enable_gqa, window, alibi, softcap, sinks)
    return call.forward(with_lse)


def fast_forward(query, key, value, attn_mask, is_causal, scale, enable_gqa, with_lse):
    """The common call (3-D or 4-D CPU torch tensors of one dtype, no extension, and no mask or
    one the engine reads as it is: boolean or float32 (float64 for float64 inputs), broadcasting
    to the scores), checked just enough to hand to the engine, which checks the rest (the
    extension's ``forward_torch``, which reads the tensors itself): the output, with
    ``with_lse`` ``(output, logsumexp)``; None for anything else, which ``Call`` checks in full
    (and words the errors for). Saves most of the Python side's cost per call."""
    if not TORCH_CODES or type(query) is not TORCH_CODES["type"]:
        return None
    try:
        return _qkv.forward_torch(query, key, value, attn_mask, bool(is_causal),
                                  None if scale is None else float(scale), bool(enable_gqa), TORCH_CODES, with_lse)
    except ValueError as error:
        raise renamed(error, SDPA_NAMES) from None


def fast_backward(grad_out, query, key, value, out, lse, attn_mask, is_causal, scale, enable_gqa):
    """``(dq, dk, dv)`` of the common call in float32 or float64 (see ``fast_forward``, whose
    ``out`` and ``lse`` these are; the mask gets no gradient), from the tensors as they are (the
    extension's ``backward_torch``); None for anything else, which ``Call.backward`` takes."""
    if not TORCH_CODES or type(query) is not TORCH_CODES["type"]:
        return None
    return _qkv.backward_torch(grad_out, query, key, value, out, lse, attn_mask, bool(is_causal),
                               None if scale is None else float(scale), bool(enable_gqa), TORCH_CODES)


def check_arguments(flags, scale=None, scale_name="scale"):
    """PyTorch's rules for the arguments that are not tensors: each of ``flags`` (``(name,
    value)`` pairs) a ``bool`` (``is_causal="no"`` would otherwise read as true), and the scale
    None, a real number, or a tensor of one element that does not require grad (a scale that
    requires grad would get no gradient: qkv's scale is a constant). Raises ``TypeError`` as
    PyTorch does."""
    for name, value in flags:
        if value is not True and value is not False:
            raise TypeError(f"argument '{name}' must be bool, not {_type_name(value)}")
    if scale is None or isinstance(scale, (int, float)):
        return
    if hasattr(scale, "requires_grad"):
        if scale.requires_grad:
            raise TypeError(f"argument '{scale_name}' must be float, not a tensor that requires grad: qkv's scale "
                            f"is a constant and gets no gradient; pass {scale_name}.item()")
        if scale.numel() != 1:
            raise TypeError(f"argument '{scale_name}' must be float, not a tensor of {scale.numel()} elements")
        return
    if isinstance(scale, (str, bytes)) or not hasattr(scale, "__float__"):
        raise TypeError(f"argument '{scale_name}' must be float, not {_type_name(scale)}")


def _type_name(value):
    """A value's type as a message names it: ``str``, ``numpy.bool`` (whose own name is ``bool``)."""
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def compute_dtype(name):
    """The dtype the engine computes in, and returns the logsumexp in."""
    return "float64" if name == "float64" else "float32"


def per_head(argument, noun, values, heads):
    """One float per query head (ALiBi slopes, sink logits: ``noun``) from a list, a NumPy array or
    a torch tensor, as the extension takes them; None stays None."""
    if values is None:
        return None
    shape = tuple(values.shape) if hasattr(values, "shape") else None
    if shape is not None and len(shape) != 1:
        raise ValueError(f"{argument} has shape {shape}: it is one value per query head, [{heads}]")
    values = values.tolist() if hasattr(values, "tolist") else values
    try:
        values = [float(x) for x in values]
    except (TypeError, ValueError):
        raise ValueError(f"{argument} is {values!r}: it is one number per query head") from None
    if len(values) != heads:
        raise ValueError(f"{argument} has {len(values)} {noun} for {heads} query heads: one per head")
    return values


def checked_dtype(xp, tensors, rank_fits, needs, on_cpu=True):
    """The one dtype of ``(query, key, value)``, each checked: on the CPU (unless ``on_cpu`` is
    False), of a rank ``rank_fits`` takes (``needs`` says which, in the error) and of a floating
    dtype qkv takes."""
    for argument, t in zip(("query", "key", "value"), tensors):
        if on_cpu:
            xp.check_device(argument, t)
        if not rank_fits(t.ndim):
            raise ValueError(f"{argument} has shape {tuple(t.shape)}: {needs}")
        if xp.dtype_name(t) not in FLOATS:
            raise ValueError(f"{argument} has dtype {xp.dtype_name(t)}: qkv takes {', '.join(FLOATS)}")
    dtype, key, value = (xp.dtype_name(t) for t in tensors)
    if key != dtype or value != dtype:
        raise ValueError(f"query, key and value have dtypes {dtype}, {key} and {value}: they need one dtype "
                         "(torch.autocast does not cast qkv's inputs: convert them, as with key.to(query.dtype))")
    return dtype


def spec(is_causal, scale, window, alibi, softcap, sinks, heads):
    """The options as the extension takes them (its ``Spec``), checked: ``(is_causal, scale,
    window, ALiBi, soft-cap, sink logits)``; ALiBi as ``(slopes, sequences, symmetric)``: one
    slope per head, the paper's form, or an ``alibi`` made by ``flash_attn_alibi``."""
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"scale is {scale}: it must be finite")
    if isinstance(alibi, FlashAttnAlibi):
        values, rows, symmetric = alibi
        values = values.tolist() if hasattr(values, "tolist") else values
        alibi = ([float(x) for x in values], rows, symmetric)
    else:
        slopes = per_head("alibi_slopes", "slopes", alibi, heads)
        alibi = None if slopes is None else (slopes, 1, False)
    return (bool(is_causal), None if scale is None else float(scale), sliding_window(window), alibi,
            cap(softcap), per_head("sinks", "logits", sinks, heads))


class FlashAttnAlibi(tuple):
    """ALiBi as flash-attn applies it: ``(slopes, sequences, True)``, the slopes flat (a list, or a
    tensor or an array ``spec`` reads)."""


def flash_attn_alibi(alibi_slopes, heads, sequences):
    """flash-attn's ``alibi_slopes`` (``(nheads,)`` or ``(batch, nheads)``) checked, as the
    extension takes them: flash-attn's form, ``-slope · |j - p|`` (under a causal mask the same
    weights as the paper's), one row of slopes for every sequence or one for all."""
    shape = tuple(alibi_slopes.shape) if hasattr(alibi_slopes, "shape") else (len(alibi_slopes),)
    if shape not in ((heads,), (sequences, heads)):
        raise ValueError(f"alibi_slopes has shape {shape}: it is ({heads},) or ({sequences}, {heads}), one slope per "
                         "query head, for all sequences or for each")
    if hasattr(alibi_slopes, "reshape"):
        # A tensor or an array, read when the call runs (under torch.compile, inside the operator).
        flat = alibi_slopes.reshape(-1)
    else:
        flat = [float(x) for row in alibi_slopes for x in (row if isinstance(row, (list, tuple)) else [row])]
    return FlashAttnAlibi((flat, shape[0] if len(shape) == 2 else 1, True))


def cap(softcap):
    """The soft-cap as the extension takes it (the engine checks it is finite and positive), with
    flash-attn's spelling of no cap, 0.0, refused with a hint rather than as a bad cap."""
    if softcap is None:
        return None
    if softcap == 0:
        raise ValueError("softcap is 0: the cap must be finite and positive; pass softcap=None for no cap "
                         "(flash-attn's 0.0)")
    return float(softcap)


def whole(x):
    """Whether ``x`` is a whole number the extension can take as a 64-bit integer."""
    try:
        return int(x) == x and -(2**63) <= x < 2**63
    except (TypeError, ValueError, OverflowError):
        return False


def sliding_window(window):
    """``(before, after)`` as the extension takes it, checked: -1 for no limit on a side (None or
    any negative number asks for that too); None stays None."""
    if window is None:
        return None
    try:
        sides = tuple(window)
    except TypeError:
        sides = ()  # one number, say: which side it limits is the caller's to say
    if len(sides) != 2 or not all(side is None or whole(side) for side in sides):
        raise ValueError(
            f"sliding_window is {window!r}: it is (before, after), whole numbers below 2**63, -1 or None for no limit"
        )
    return tuple(-1 if side is None or side < 0 else int(side) for side in sides)


def integer_offsets(argument, offsets):
    """Refuses offsets held in an array or a tensor of a type other than integers (what flash-attn
    refuses too), by their dtype alone: under torch.compile their values are not read here."""
    dtype = str(getattr(offsets, "dtype", "int"))
    if "int" not in dtype:
        raise ValueError(f"{argument} has dtype {dtype}: offsets are integers (flash-attn takes int32)")


def offset_list(argument, offsets):
    """``cu_seqlens`` (a list, an array or a tensor of integers) as a list of ints."""
    integer_offsets(argument, offsets)
    # NumPy 2's arrays have a device too, the string "cpu".
    if getattr(getattr(offsets, "device", None), "type", None) == "meta":
        # A meta tensor holds no numbers to read (torch's own error names no argument).
        raise ValueError(f"{argument} is on meta: qkv reads the offsets, on the CPU")
    values = offsets.tolist() if hasattr(offsets, "tolist") else list(offsets)
    if not all(whole(x) and x >= 0 for x in values):
        raise ValueError(f"{argument} is {values}: offsets are whole numbers from 0 to 2**63 - 1")
    return [int(x) for x in values]


class _Packed:
    """A packed batch's inputs in flash-attn's layout (``[total, heads, d]``), checked, and the
    engine's ``[heads, total, d]`` views of them in the compute dtype: strided views, no copy
    (but for half precision, which the packed path computes from a float32 copy)."""

    def __init__(self, query, key, value, cu_seqlens_q, cu_seqlens_k, options):
        xp = self.xp = backend(query, key, value)
        self.dtype = checked_dtype(xp, (query, key, value), lambda rank: rank == 3,
                                   "a packed batch is [total, heads, d]")
        self.compute = compute_dtype(self.dtype)
        # Checked here, in the caller's layout: the engine would name its own [1, heads, total, d].
        qs, ks, vs = (tuple(t.shape) for t in (query, key, value))
        shapes = _Shapes(qs, ks, vs)
        if qs[2] != ks[2]:
            raise ValueError(f"query and key have widths {qs[2]} and {ks[2]}: they need the same {shapes}")
        if ks[:2] != vs[:2]:
            raise ValueError(f"key and value need the same shape but for their width {shapes}")
        if ks[1] == 0 or qs[1] % ks[1]:
            raise ValueError(f"query has {qs[1]} heads and key {ks[1]}: the key/value heads must divide the query "
                             f"heads {shapes}")
        self.total_q, self.heads, self.d_v = query.shape[0], query.shape[1], value.shape[2]
        self.q, self.k, self.v = (self.widened(xp.readable(t)).swapaxes(0, 1) for t in (query, key, value))
        self.offsets = (offset_list("cu_seqlens_q", cu_seqlens_q), offset_list("cu_seqlens_k", cu_seqlens_k))
        self.spec = spec(*options, self.heads)

    def widened(self, t):
        return t if self.xp.dtype_name(t) == self.compute else self.xp.cast(t, self.compute)

    def narrowed(self, t):
        return t if self.dtype == self.compute else self.xp.cast(t, self.dtype)

    def raws(self, q=None, k=None, v=None):
        """The engine's views of the inputs, any of them replaced."""
        return tuple(self.xp.raw(x if x is not None else y) for x, y in ((q, self.q), (k, self.k), (v, self.v)))

    @contextlib.contextmanager
    def named_as_passed(self):
        """The engine's errors with the names the caller passed, an element named by its index in
        the caller's ``[total, heads, d]`` tensor (the engine's is in its ``[heads, total, d]``
        views)."""
        names = {"query_offsets": "cu_seqlens_q", "key_offsets": "cu_seqlens_k", "logit_softcap": "softcap"}
        try:
            with named_as_passed(names):
                yield
        except ValueError as error:
            message = str(error)
            element = re.match(r"(queries|keys|values)\[(\d+), (\d+), (\d+)\]", message)
            if element:
                argument, head, row, column = element.groups()
                ours = {"queries": "query", "keys": "key", "values": "value"}[argument]
                raise ValueError(f"{ours}[{row}, {head}, {column}]" + message[element.end():]) from None
            raise


def varlen(query, key, value, cu_seqlens_q, cu_seqlens_k, options, with_lse):
    """A packed batch's attention in flash-attn's layout (``[total, heads, d]`` in and out);
    ``options`` are ``spec``'s arguments but for the heads."""
    packed = _Packed(query, key, value, cu_seqlens_q, cu_seqlens_k, options)
    xp = packed.xp
    out = xp.empty((packed.total_q, packed.heads, packed.d_v), packed.compute)
    lse = xp.empty((packed.heads, packed.total_q), packed.compute) if with_lse else None
    with packed.named_as_passed():
        _qkv.varlen(packed.raws(), packed.offsets, packed.spec, xp.raw(out.swapaxes(0, 1)),
                    None if lse is None else xp.raw(lse))
    out = packed.narrowed(out)
    return (out, lse) if with_lse else out


def varlen_backward(query, key, value, cu_seqlens_q, cu_seqlens_k, options, out, lse, grad_out, grad_lse=None):
    """``(dq, dk, dv, dsinks)`` of a packed batch (torch tensors in flash-attn's layout; ``dsinks``
    ``[heads]`` in the compute dtype, or None without sinks) from the forward's ``out`` and ``lse``
    (``[heads, total_q]``), the output's gradient and, if given, the logsumexp's."""
    packed = _Packed(query, key, value, cu_seqlens_q, cu_seqlens_k, options)
    xp = packed.xp
    out, lse, grad_out = (xp.readable(t) for t in (out, lse, grad_out))
    v, out, grad_out = packed.v, packed.widened(out), packed.widened(grad_out)
    if grad_lse is not None:
        g = lse_gradient(xp, lse, packed.widened(xp.readable(grad_lse)))
        v = xp.with_column(v, 0)
        out, grad_out = xp.with_column(out, 1), xp.with_column(grad_out, -g.transpose(0, 1))
    dq, dk, dv = (xp.zeros(tuple(t.swapaxes(0, 1).shape), packed.compute) for t in (packed.q, packed.k, v))
    dsinks = None if packed.spec[5] is None else xp.zeros((packed.heads,), packed.compute)
    heads_first = (lambda t: xp.raw(t.swapaxes(0, 1)))
    # An incoming gradient that is not finite gives gradients of NaN (the extension's backward).
    with packed.named_as_passed():
        _qkv.varlen_backward(
            packed.raws(v=v),
            packed.offsets,
            packed.spec,
            (heads_first(out), xp.raw(lse), heads_first(grad_out)),
            (heads_first(dq), heads_first(dk), heads_first(dv), None, None if dsinks is None else xp.raw(dsinks)),
        )
    if grad_lse is not None:
        dv = dv[..., :-1]
    return packed.narrowed(dq), packed.narrowed(dk), packed.narrowed(dv), dsinks


class _Shapes:
    """The inputs' shapes for a message, formatted only if one is raised."""

    def __init__(self, *shapes):
        self.shapes = shapes

    def __format__(self, spec):
        return "(query {}, key {}, value {})".format(*self.shapes)


def one_device(named):
    """Checks that the tensors of ``named`` (``(argument, tensor or None)`` pairs, the query's
    first) lie on one device, as a fake implementation sees them (a CPU query with its keys on
    ``meta`` would otherwise get an output of the query's device that nothing writes)."""
    (first_name, first), *rest = named
    for argument, t in rest:
        device = getattr(t, "device", None)
        if device is not None and device != first.device:
            raise ValueError(f"{argument} is on {device} and {first_name} on {first.device}: qkv needs one device, "
                             "the CPU")


def dense_shapes(xp, query, key, value, attn_mask, is_causal, enable_gqa, on_cpu=True):
    """A dense call's tensors checked against each other, on the CPU unless ``on_cpu`` is False
    (a fake implementation's, which checks shapes only): ``(dtype, lead dimensions, query heads,
    key/value heads)``."""
    dtype = checked_dtype(xp, (query, key, value), lambda rank: rank >= 2, "it needs at least [n, d]", on_cpu)
    qs, ks, vs = tuple(query.shape), tuple(key.shape), tuple(value.shape)
    if not (len(qs) == len(ks) == len(vs)):
        raise ValueError(f"query {qs}, key {ks} and value {vs} need the same number of dimensions")
    shapes = _Shapes(qs, ks, vs)
    if qs[-1] != ks[-1]:
        raise ValueError(f"query and key have widths {qs[-1]} and {ks[-1]}: they need the same {shapes}")
    if ks[:-1] != vs[:-1]:
        raise ValueError(f"key and value need the same shape but for their width {shapes}")
    lead = qs[:-2]
    if lead[:-1] != ks[:-3]:
        raise ValueError(f"query and key need the same batch dimensions (all but the last three) {shapes}")
    heads, kv_heads = (lead[-1], ks[-3]) if lead else (1, 1)
    if enable_gqa:
        if kv_heads == 0 or heads % kv_heads:
            raise ValueError(
                f"enable_gqa: query heads ({heads}) must be a multiple of key/value heads ({kv_heads}) {shapes}"
            )
    elif heads != kv_heads:
        raise ValueError(
            f"query has {heads} heads and key {kv_heads}: pass enable_gqa=True for grouped-query attention {shapes}"
        )
    if is_causal and attn_mask is not None:
        raise ValueError("attn_mask and is_causal are both set: pass one (PyTorch refuses both too)")
    if attn_mask is not None:
        if on_cpu:
            xp.check_device("attn_mask", attn_mask)
        name = xp.dtype_name(attn_mask)
        # PyTorch's rule: float32 whatever the query's dtype.
        if name not in ("bool", "float32", dtype):
            raise ValueError(f"attn_mask has dtype {name}: it is bool, float32 or the query's dtype ({dtype})")
        scores = lead + (qs[-2], ks[-2])
        ms = tuple(attn_mask.shape)
        padded = (1,) * (len(scores) - len(ms)) + ms
        if len(ms) > len(scores) or any(m not in (1, s) for m, s in zip(padded, scores)):
            raise ValueError(f"attn_mask has shape {ms}, which does not broadcast to the scores' shape {scores}")
    return dtype, lead, heads, kv_heads


class Call:
    """One dense call's inputs, checked and viewed as ``[batch, heads, n, d]``."""

    def __init__(
        self, query, key, value, attn_mask, is_causal, scale, enable_gqa, window=None, alibi=None, softcap=None,
        sinks=None,
    ):
        xp = backend(query, key, value, attn_mask)
        self.xp = xp
        dtype, lead, heads, kv_heads = dense_shapes(xp, query, key, value, attn_mask, is_causal, enable_gqa)
        query, key, value = (xp.readable(t) for t in (query, key, value))
        attn_mask = None if attn_mask is None else xp.readable(attn_mask)
        batch = math.prod(lead[:-1])
        self.dtype, self.lead, self.n_q, self.n_k = dtype, lead, query.shape[-2], key.shape[-2]
        self.q = self._four(query, batch, heads)
        self.k = self._four(key, batch, kv_heads)
        self.v = self._four(value, batch, kv_heads)
        self.mask = None if attn_mask is None else self._mask(attn_mask, batch, heads)
        self.out_shape = (batch, heads, query.shape[-2], value.shape[-1])
        self.spec = spec(is_causal, scale, window, alibi, softcap, sinks, heads)
        self.sinks = self.spec[5]

    def _four(self, t, batch, heads):
        return t if t.ndim == 4 else t.reshape(batch, heads, t.shape[-2], t.shape[-1])

    def _mask(self, mask, batch, heads):
        """The mask (checked by ``dense_shapes``) broadcast to ``[shared, head, n_q, n_k]``."""
        xp = self.xp
        name = xp.dtype_name(mask)
        scores = self.lead + (self.n_q, self.n_k)
        ms = tuple(mask.shape)
        padded = (1,) * (len(scores) - len(ms)) + ms
        outer = padded[: max(len(self.lead) - 1, 0)]
        head = padded[len(self.lead) - 1] if self.lead else 1
        if any(d != 1 for d in outer) and outer != self.lead[:-1]:
            # Broadcast over some batch dimensions but not others: only this case copies.
            mask = xp.broadcast(mask.reshape(padded), self.lead[:-1] + padded[len(outer):])
            outer = self.lead[:-1]
        shared = 1 if all(d == 1 for d in outer) else batch
        mask = mask.reshape(shared, head, padded[-2], padded[-1])
        # An additive mask in the compute dtype, as the engine reads it.
        if name != "bool" and name != compute_dtype(self.dtype):
            mask = xp.cast(mask, compute_dtype(self.dtype))
        # Rows and columns of length 1 broadcast as zero strides: no copy.
        return xp.broadcast(mask, (shared, head, self.n_q, self.n_k))

    def raws(self):
        xp = self.xp
        return (xp.raw(self.q), xp.raw(self.k), xp.raw(self.v))

    def forward(self, with_lse):
        """The output as ``lead + [n_q, d_v]``, and with ``with_lse`` the logsumexp ``lead + [n_q]``."""
        xp = self.xp
        out = xp.empty(self.out_shape, self.dtype)
        lse = xp.empty(self.out_shape[:3], compute_dtype(self.dtype)) if with_lse else None
        mask = None if self.mask is None else xp.raw(self.mask)
        with named_as_passed(SDPA_NAMES):
            _qkv.forward(self.raws(), mask, self.spec, xp.raw(out), None if lse is None else xp.raw(lse))
        out = out.reshape(self.lead + out.shape[2:])
        return (out, lse.reshape(self.lead + (self.n_q,))) if with_lse else out

    def backward(self, out, lse, grad_out, mask_grad, grad_lse=None):
        """``(dq, dk, dv, dmask, dsinks)`` shaped as the inputs (``dmask`` as ``[batch, heads, n_q,
        n_k]``, or None; ``dsinks`` ``[heads]`` in the compute dtype, or None without sinks), from
        the forward's ``out`` and ``lse`` (over every key), the output's gradient and, if given,
        the logsumexp's (torch tensors)."""
        xp = self.xp
        compute = compute_dtype(self.dtype)
        as_compute = (lambda t: t) if compute == self.dtype else (lambda t: xp.cast(t, compute))
        q, k, v = (as_compute(t) for t in (self.q, self.k, self.v))
        out, grad_out = (as_compute(self._four(xp.readable(t), *self.out_shape[:2])) for t in (out, grad_out))
        lse = xp.readable(lse).reshape(self.out_shape[:3])
        if grad_lse is not None:
            g = lse_gradient(xp, lse, as_compute(xp.readable(grad_lse).reshape(self.out_shape[:3])))
            v, out, grad_out = xp.with_column(v, 0), xp.with_column(out, 1), xp.with_column(grad_out, -g)
        dq, dk, dv = (xp.zeros(t.shape, compute) for t in (q, k, v))
        dmask = xp.zeros(self.out_shape[:3] + (self.n_k,), compute) if mask_grad else None
        dsinks = None if self.sinks is None else xp.zeros((self.out_shape[1],), compute)
        raw = (lambda t: None if t is None else xp.raw(t))
        # An incoming gradient that is not finite gives gradients of NaN (the extension's backward).
        with named_as_passed(SDPA_NAMES):
            _qkv.backward(
                (xp.raw(q), xp.raw(k), xp.raw(v)),
                raw(self.mask),
                self.spec,
                (xp.raw(out), xp.raw(lse), xp.raw(grad_out)),
                (xp.raw(dq), xp.raw(dk), xp.raw(dv), raw(dmask), raw(dsinks)),
            )
        if grad_lse is not None:
            dv = dv[..., :-1]
        if compute != self.dtype:
            dq, dk, dv = (xp.cast(t, self.dtype) for t in (dq, dk, dv))
        return dq, dk, dv, dmask, dsinks


def lse_gradient(xp, lse, g):
    """The logsumexp's gradient ``g`` (torch tensors shaped as ``lse``) as the backward takes it:
    it reaches the scores as ``dS = P ∘ (dP - (δ - g))``, beside the output's ``δ = rowsum(dO ∘
    O)``, the backward's only use of ``O``, so a column of ones in ``O`` against ``-g`` in ``dO``,
    over a column of zeros in ``V`` (``dP`` unchanged), carries it exactly."""
    # A row that sees no key (lse -inf) has no weights for g to reach: a loss that is -inf or NaN
    # there (lse², exp(lse - max)) changes nothing, as autograd's own would.
    torch = xp.torch
    return torch.where(torch.isneginf(lse), 0, g)


def merge(out_a, lse_a, out_b, lse_b):
    """Attention over two disjoint sets of keys, merged exactly into attention over both."""
    refuse_grad("qkv.merge", "write the merge in torch operations to differentiate it",
                (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)))
    xp = backend(out_a, lse_a, out_b, lse_b)
    dtype = xp.dtype_name(out_a)
    compute = compute_dtype(dtype)
    for argument, t in (("out_a", out_a), ("lse_a", lse_a), ("out_b", out_b), ("lse_b", lse_b)):
        xp.check_device(argument, t)
    outs = [xp.readable(xp.cast(o, compute) if xp.dtype_name(o) != compute else o) for o in (out_a, out_b)]
    lses = [xp.readable(xp.cast(x, compute) if xp.dtype_name(x) != compute else x) for x in (lse_a, lse_b)]
    out, lse = xp.empty(tuple(out_a.shape), compute), xp.empty(tuple(lse_a.shape), compute)
    _qkv.merge((xp.raw(outs[0]), xp.raw(lses[0])), (xp.raw(outs[1]), xp.raw(lses[1])), (xp.raw(out), xp.raw(lse)))
    return (out if dtype == compute else xp.cast(out, dtype)), lse


def refuse_grad(function, instead, named):
    """Raises ``ValueError`` where one of ``named`` (``(name, value)`` pairs) is a torch tensor
    that needs a gradient, with grad mode on: ``function`` has no backward, and an output autograd
    cannot differentiate would drop the gradient without a word."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.is_grad_enabled():
        return
    needs = [name for name, t in named if isinstance(t, torch.Tensor) and t.requires_grad]
    if needs:
        verb = "requires" if len(needs) == 1 else "require"
        raise ValueError(f"{', '.join(needs)} {verb} grad, and {function} has no backward: call it under "
                         f"torch.no_grad(), or {instead}")


@contextlib.contextmanager
def named_as_passed(names):
    """Re-raises the engine's ``ValueError`` with its argument names (keys of ``names``: the Rust
    API's, such as ``bias``) replaced by those the caller passed (``attn_mask``)."""
    try:
        yield
    except ValueError as error:
        raise renamed(error, names) from None


def renamed(error, names):
    """The engine's ``ValueError`` ``error`` with its argument names replaced as
    ``named_as_passed`` replaces them (``error`` itself if it names none of them)."""
    message = text = str(error)
    for engine, ours in names.items():
        text = re.sub(rf"\b{engine}\b", ours, text)
    return error if text == message else ValueError(text)


# What scaled_dot_product_attention's arguments are called in the engine's errors.
SDPA_NAMES = {"bias": "attn_mask", "keep_mask": "attn_mask", "logit_softcap": "softcap"}
