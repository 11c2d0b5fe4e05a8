"""The engine's KV caches for decoding: ``KvCache`` (one sequence) and ``PagedKvCache`` (many
sequences in blocks of one pool), over torch tensors or NumPy arrays.

A cache holds state between calls, which torch.compile does not trace: under ``torch.compile``
its calls run eagerly between graphs (a graph break; ``fullgraph=True`` refuses them). A cache is
one thread's at a time: a call while another thread is inside one says so."""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence, Tuple, Union

from . import _core, _qkv

if TYPE_CHECKING:
    from ._typing import Array, PerHead, Scale, Window


class Rotary(NamedTuple):
    """A rotary position embedding (RoFormer) for a cache to apply: keys as they are appended,
    queries as they attend, each by its absolute position (the engine's ``Rotary``). Pair ``i``
    of the first ``dims`` components (all with None) turns by ``position · position_scale ·
    base^(-2i / dims)`` radians; pairs are ``i`` and ``i + dims / 2`` (Hugging Face's LLaMA and
    Mistral, ``rotate_half``), or ``2i`` and ``2i + 1`` with ``interleaved`` (GPT-J; Meta's and
    Mistral's reference code). ``position_scale`` below 1 is linear position interpolation."""

    base: float = 10000.0
    interleaved: bool = False
    dims: Optional[int] = None
    position_scale: float = 1.0

    def _spec(self):
        """As the extension takes it, checked: ``(base, interleaved, dims, position_scale)``."""
        _core.check_arguments((("interleaved", self.interleaved),))
        for name in ("base", "position_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"Rotary's {name} is {value!r}: it is a number")
        return (float(self.base), self.interleaved, _whole("Rotary's dims", self.dims), float(self.position_scale))


def _rotary(rotary):
    """``rotary`` (a ``Rotary`` or None) as the extension takes it."""
    if rotary is None:
        return None
    if not isinstance(rotary, Rotary):
        raise TypeError(f"rotary is {rotary!r}: it is a qkv.Rotary, as qkv.Rotary(10000.0)")
    return rotary._spec()


def _dtype_name(dtype):
    """``"float32"`` from a string, a torch dtype or a NumPy dtype."""
    if isinstance(dtype, str):
        return dtype
    text = str(dtype)
    if text.startswith("torch."):
        return text[len("torch."):]
    import numpy

    return numpy.dtype(dtype).name


def _spec(xp, query, scale, sliding_window, alibi_slopes, softcap, keep, sinks):
    heads = query.shape[0]
    alibi = _core.per_head("alibi_slopes", "slopes", alibi_slopes, heads)
    keep = None if keep is None else xp.raw(keep)
    _core.check_arguments((), scale)
    return (None if scale is None else float(scale), _core.sliding_window(sliding_window), alibi,
            _core.cap(softcap), keep, _core.per_head("sinks", "logits", sinks, heads))


# What the caches' `attend` arguments are called in the engine's errors.
_CACHE_NAMES = {"keep_mask": "keep", "logit_softcap": "softcap", "query_offsets": "offsets"}


def _whole(argument, value):
    """``value`` as an int of 0 or more (None stays None), or an error naming ``argument``: the
    extension's own says only "can't convert negative int to unsigned"."""
    if value is None:
        return None
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{argument} is {value!r}: it is a whole number") from None
    if number < 0:
        raise ValueError(f"{argument} is {number}: layers, positions, sizes and sequence handles count from 0 "
                         "(no negative indexing)")
    if number >= 1 << 64:
        raise ValueError(f"{argument} is {number}: more than a 64-bit count holds")
    return number


def _refuse_grad(function, *named):
    """A cache keeps no gradient: see ``_core.refuse_grad`` (``named``: ``(name, value)`` pairs)."""
    instead = "use qkv.scaled_dot_product_attention over the keys and values to differentiate"
    _core.refuse_grad(function, instead, named)


def _one_thread_at_a_time(cls):
    """Wraps every public method and property of a cache class so that a call made while another
    thread is inside one of the cache's calls (the engine runs with the GIL released) says so,
    rather than PyO3's "Already borrowed". A cache is one thread's at a time: hold a lock around
    its calls to share it."""

    def guarded(f):
        @functools.wraps(f)
        def call(self, *args, **kwargs):
            try:
                return f(self, *args, **kwargs)
            except RuntimeError as e:
                if str(e) not in ("Already borrowed", "Already mutably borrowed"):
                    raise
                raise RuntimeError(f"this {type(self).__name__} is in a call on another thread: a cache is one "
                                   "thread's at a time (hold a lock around its calls to share it)") from None
        return call

    for name, member in list(vars(cls).items()):
        if name.startswith("_") or isinstance(member, (staticmethod, classmethod)):
            continue
        if isinstance(member, property):
            setattr(cls, name, property(guarded(member.fget), doc=member.__doc__))
        elif callable(member):
            setattr(cls, name, guarded(member))
    return cls


class _Cache:
    """What both caches share: the storage dtype and converting keys, values and queries to what
    the engine takes (the storage dtype; float32 for int8, which quantizes as it appends)."""

    def __init__(self, inner, dtype):
        self._inner, self.dtype = inner, dtype
        self._appended = "float32" if dtype == "int8" else dtype
        # Queries in float32 or the storage dtype (any for int8), others cast to float32.
        self._queries = ("float32", "bfloat16", "float16") if dtype == "int8" else ("float32", dtype)

    @staticmethod
    def _input(xp, argument, t, takes):
        """``t`` checked (on the CPU; a floating dtype, not cast from integers as if they were
        numbers the model made), in one of the dtypes ``takes`` (cast to the first otherwise), as
        memory the engine reads as it is (``readable``: the caller keeps it alive for the call)."""
        xp.check_device(argument, t)
        name = xp.dtype_name(t)
        if name not in takes and name not in _core.FLOATS:
            raise ValueError(f"{argument} has dtype {name}: the cache takes {', '.join(_core.FLOATS)}")
        return xp.readable(t if name in takes else xp.cast(t, takes[0]))

    @staticmethod
    def _keep(xp, keep):
        """The keep mask checked (on the CPU, boolean) and readable as it is, or None."""
        if keep is None:
            return None
        xp.check_device("keep", keep)
        if xp.dtype_name(keep) != "bool":
            raise ValueError(f"keep has dtype {xp.dtype_name(keep)}: it is a boolean mask, True where a query sees a "
                             "position")
        return xp.readable(keep)

    def _appends(self, xp, key, value):
        """``key`` and ``value`` as the engine appends them, in the storage dtype (float32 for int8)."""
        return (self._input(xp, argument, t, (self._appended,)) for argument, t in (("key", key), ("value", value)))

    def __copy__(self):
        raise TypeError(f"a {type(self).__name__} cannot be copied: a copy would share its memory with the "
                        "original (for a branch of a sequence, use PagedKvCache.fork)")

    def __deepcopy__(self, memo):
        self.__copy__()

    def __reduce__(self):
        raise TypeError(f"a {type(self).__name__} cannot be pickled: its keys and values live in the engine's "
                        "memory, laid out for this CPU's kernels")

    def _outputs(self, xp, query, value_dim, return_lse):
        heads, n_q = query.shape[0], query.shape[1]
        out = xp.empty((heads, n_q, value_dim), "float32")
        lse = xp.empty((heads, n_q), "float32") if return_lse else None
        return out, lse


@_one_thread_at_a_time
class KvCache(_Cache):
    """The keys and values of one sequence for every layer of a decoder (the engine's
    ``KvCache``), stored as ``dtype`` (float32, bfloat16, float16 or int8) and computed in float32.
    An int8 cache keeps one float32 scale per position and head for its key row and for its value
    row (``max |x| / 127``), takes its keys and values in float32 (any dtype is cast), and reads
    float32, bfloat16 or float16 queries; each element is within ``max |x| / 254`` of what was
    appended.

    ``append(layer, key, value)`` adds positions (``[kv_heads, n_new, key_dim]``), and
    ``attend(layer, query)`` (``[query_heads, n_q, key_dim]``, the last ``n_q`` positions held,
    causal bottom-right) returns ``[query_heads, n_q, value_dim]`` in float32. With ``window`` the
    cache is a ring buffer of the last positions a sliding window of that many keys needs, and
    ``capacity`` is the window plus the largest step but one (until the ring first wraps, a step may
    take every position held); with ``sink_tokens`` as well it keeps
    its first ``sink_tokens`` positions for good, beside the window (StreamingLLM's attention
    sinks), at their own positions, in ``sink_tokens`` slots of their own, so ``capacity`` is
    ``sink_tokens`` plus the window plus the largest step but one, on every CPU.

    With ``rotary`` (a ``qkv.Rotary``) the cache applies a rotary position embedding: keys as they
    are appended, queries as they attend, by absolute position (the sink tokens' too); pass them
    unrotated.

    A cache is one thread's at a time (hold a lock around its calls to share it); it cannot be
    copied or pickled.
    """

    def __init__(self, layers: int, kv_heads: int, capacity: int, key_dim: int, value_dim: Optional[int] = None,
                 dtype: Any = "float32", window: Optional[int] = None, sink_tokens: Optional[int] = None,
                 rotary: Optional[Rotary] = None) -> None:
        dtype = _dtype_name(dtype)
        value_dim = key_dim if value_dim is None else value_dim
        sizes = {"layers": layers, "kv_heads": kv_heads, "capacity": capacity, "key_dim": key_dim,
                 "value_dim": value_dim, "window": window, "sink_tokens": sink_tokens}
        sizes = [_whole(name, size) for name, size in sizes.items()]
        inner = _qkv.KvCache(*sizes[:5], dtype, *sizes[5:], _rotary(rotary))
        super().__init__(inner, dtype)

    def append(self, layer: int, key: Array, value: Array) -> None:
        """Appends ``key`` ``[kv_heads, n_new, key_dim]`` and ``value`` to layer ``layer`` (inference
        only: see ``attend``)."""
        _refuse_grad("KvCache.append", ("key", key), ("value", value))
        xp = _core.backend(key, value)
        key, value = self._appends(xp, key, value)
        self._inner.append(_whole("layer", layer), xp.raw(key), xp.raw(value))

    def attend(self, layer: int, query: Array, *, scale: Optional[Scale] = None,
               sliding_window: Optional[Window] = None, alibi_slopes: Optional[PerHead] = None,
               softcap: Optional[float] = None, keep: Optional[Array] = None, sinks: Optional[PerHead] = None,
               return_lse: bool = False) -> Union[Array, Tuple[Array, Array]]:
        """Attention of ``query`` over layer ``layer``: ``out`` (and ``(out, lse)`` with
        ``return_lse``). ``keep`` is a boolean ``[n_q, held]`` mask on top of the causal one;
        ``sinks`` one logit per query head, as ``qkv.scaled_dot_product_attention`` takes them.
        Inference only: a query or sinks that need a gradient, with grad mode on, raise
        ``ValueError``."""
        _refuse_grad("KvCache.attend", ("query", query), ("sinks", sinks))
        xp = _core.backend(query, keep)
        query, keep = self._input(xp, "query", query, self._queries), self._keep(xp, keep)
        out, lse = self._outputs(xp, query, self.shape[4], return_lse)
        spec = _spec(xp, query, scale, sliding_window, alibi_slopes, softcap, keep, sinks)
        with _core.named_as_passed(_CACHE_NAMES):
            self._inner.attend(_whole("layer", layer), xp.raw(query), spec,
                               (xp.raw(out), None if lse is None else xp.raw(lse)))
        return (out, lse) if return_lse else out

    def length(self, layer: int) -> int:
        """Positions appended to layer ``layer`` since the cache was made or cleared."""
        return self._inner.len(_whole("layer", layer))

    def held(self, layer: int) -> int:
        """Positions layer ``layer`` holds (a windowed cache holds at most its capacity)."""
        return self._inner.held(_whole("layer", layer))

    def clear(self) -> None:
        """Empties every layer."""
        self._inner.clear()

    def truncate(self, length: int) -> None:
        """Rolls the cache back to its first ``length`` positions (every layer holding more is cut
        to ``length``): a speculative draft's rejected tokens, say; the next ``append`` writes over
        what was cut. Raises ``ValueError``, changing nothing, if no layer holds ``length``
        positions, or if a windowed cache's ring has already written over what the window of the
        next position needs (it rolls back at most ``capacity - sink_tokens - window + 1`` positions
        from the furthest it has written, in one truncation or several: positions it cut stay
        written over until appends pass them)."""
        self._inner.truncate(_whole("length", length))

    @property
    def shape(self) -> Tuple[int, int, int, int, int]:
        """``(layers, kv_heads, capacity, key_dim, value_dim)``."""
        return self._inner.shape

    @property
    def window(self) -> Optional[int]:
        """The window of a windowed cache, else None."""
        return self._inner.window


@_one_thread_at_a_time
class PagedKvCache(_Cache):
    """Many sequences' keys and values in blocks of ``block_size`` positions from one pool of
    ``blocks`` (the engine's ``PagedKvCache``), stored as ``dtype`` (float32, bfloat16, float16, or
    int8 as ``KvCache`` stores it; queries in float32 or the storage dtype, as ``KvCache`` takes
    them).

    Sequences are integer handles: ``add_sequence()``, ``fork(seq)`` (shares the prefix, copied
    on write), ``truncate(seq, length)``, ``evict_before(seq, position)``, ``free(seq)``.
    ``attend(layer, sequences, offsets, query)`` runs a whole ragged batch: ``sequences[i]`` with
    the queries ``offsets[i] .. offsets[i + 1]`` of ``query`` ``[query_heads, n_queries,
    key_dim]``, which are that sequence's last positions appended (causal, bottom-right), each
    sequence listed once. A block holds ``block_size`` positions of every layer and key/value
    head. ``length(seq)`` is the position the next append takes; after ``evict_before`` the
    sequence holds ``first_held(seq) .. length(seq)``, positions keeping their numbers, and a
    ``sliding_window`` that reaches a position let go is an error. Errors name sequences by their
    handles. With ``rotary`` (a ``qkv.Rotary``) the cache applies a rotary position embedding, as
    ``KvCache`` does. A cache is one thread's at a time (hold a lock around its calls to share it); it
    cannot be copied or pickled.
    """

    def __init__(self, layers: int, kv_heads: int, key_dim: int, value_dim: Optional[int] = None,
                 block_size: int = 64, blocks: int = 256, dtype: Any = "float32",
                 rotary: Optional[Rotary] = None) -> None:
        dtype = _dtype_name(dtype)
        value_dim = key_dim if value_dim is None else value_dim
        sizes = {"layers": layers, "kv_heads": kv_heads, "key_dim": key_dim, "value_dim": value_dim,
                 "block_size": block_size, "blocks": blocks}
        sizes = [_whole(name, size) for name, size in sizes.items()]
        super().__init__(_qkv.PagedKvCache(*sizes, dtype, _rotary(rotary)), dtype)

    @staticmethod
    def block_granularity() -> int:
        """Block sizes that are a multiple of this waste no memory on this CPU (any size works)."""
        return _qkv.PagedKvCache.block_granularity()

    def add_sequence(self) -> int:
        """A new, empty sequence's handle."""
        return self._inner.add_sequence()

    def fork(self, seq: int) -> int:
        """A new sequence sharing ``seq``'s positions."""
        return self._inner.fork(_whole("seq", seq))

    def truncate(self, seq: int, length: int) -> None:
        """Keeps ``seq``'s first ``length`` positions."""
        self._inner.truncate(_whole("seq", seq), _whole("length", length))

    def free(self, seq: int) -> None:
        """Returns ``seq``'s blocks to the pool."""
        self._inner.free(_whole("seq", seq))

    def length(self, seq: int, layer: int = 0) -> int:
        """Positions appended to ``seq`` at layer ``layer``: the position its next append takes
        (it holds those from ``first_held(seq)`` on)."""
        return self._inner.len(_whole("seq", seq), _whole("layer", layer))

    def evict_before(self, seq: int, position: int) -> None:
        """Returns to the pool ``seq``'s blocks that lie wholly before ``position`` (what a sliding
        window has left behind), at every layer. Positions keep their numbers: causal alignment,
        ALiBi distances and rotary angles count from 0 as before."""
        self._inner.evict_before(_whole("seq", seq), _whole("position", position))

    def first_held(self, seq: int) -> int:
        """The first position ``seq`` still holds (0 unless blocks were evicted)."""
        return self._inner.first_held(_whole("seq", seq))

    def free_blocks(self) -> int:
        """Blocks no sequence holds."""
        return self._inner.free_blocks()

    def append(self, layer: int, seq: int, key: Array, value: Array) -> None:
        """Appends ``key`` ``[kv_heads, n_new, key_dim]`` and ``value`` to ``seq`` at ``layer``
        (inference only, as ``KvCache.append`` is)."""
        _refuse_grad("PagedKvCache.append", ("key", key), ("value", value))
        xp = _core.backend(key, value)
        key, value = self._appends(xp, key, value)
        self._inner.append(_whole("layer", layer), _whole("seq", seq), xp.raw(key), xp.raw(value))

    def attend(self, layer: int, sequences: Sequence[int], offsets: Sequence[int], query: Array, *,
               scale: Optional[Scale] = None, sliding_window: Optional[Window] = None,
               alibi_slopes: Optional[PerHead] = None, softcap: Optional[float] = None,
               keep: Optional[Array] = None, sinks: Optional[PerHead] = None,
               return_lse: bool = False) -> Union[Array, Tuple[Array, Array]]:
        """Attention for a batch of sequences, ``[query_heads, n_queries, value_dim]`` in float32
        packed as ``query`` is (and the logsumexp with ``return_lse``); ``sinks`` as in
        ``KvCache.attend``; inference only, as ``KvCache.attend`` is."""
        _refuse_grad("PagedKvCache.attend", ("query", query), ("sinks", sinks))
        xp = _core.backend(query, keep)
        query, keep = self._input(xp, "query", query, self._queries), self._keep(xp, keep)
        out, lse = self._outputs(xp, query, self.shape[3], return_lse)
        spec = _spec(xp, query, scale, sliding_window, alibi_slopes, softcap, keep, sinks)
        batch = ([_whole(f"sequences[{i}]", s) for i, s in enumerate(sequences)],
                 [_whole(f"offsets[{i}]", o) for i, o in enumerate(offsets)])
        with _core.named_as_passed(_CACHE_NAMES):
            self._inner.attend(_whole("layer", layer), batch, xp.raw(query), spec,
                               (xp.raw(out), None if lse is None else xp.raw(lse)))
        return (out, lse) if return_lse else out

    @property
    def shape(self) -> Tuple[int, int, int, int, int, int]:
        """``(layers, kv_heads, key_dim, value_dim, block_size, blocks)``."""
        return self._inner.shape
