"""Context parallelism: one long sequence's attention split over the processes of a
``torch.distributed`` group (gloo on CPUs), exact, forward and backward.

Each process holds a slice of the sequence's queries, keys and values (``shard``). Key/value
slices pass around the ring of processes; each process attends with its queries to every slice
in turn (``qkv.attention_with_lse``) and merges the partial results exactly by their logsumexps
(``qkv.merge``, the engine's ``PartialAttention::merge``). The backward passes the slices around
the ring again, with their key/value gradients travelling along, each part's gradients computed
by the engine's backward from the merged output and logsumexp (FlashAttention-2's backward, split
by keys), so a process never holds more than two slices of keys and values.

With ``is_causal`` a process holding the first slice would see few keys and the last many; the
sequence is cut into ``2 · world_size`` chunks and process ``r`` takes chunks ``r`` and
``2 · world_size - 1 - r`` (zig-zag), so every process does the same work.
"""

from typing import Optional, Tuple, Union

import torch
import torch.distributed as dist

from . import _core

__all__ = ["shard", "unshard", "context_parallel_attention"]


def _chunks(world_size, rank, is_causal):
    """The chunk indices rank ``rank`` holds, in order, and the chunk count."""
    if is_causal:
        return (rank, 2 * world_size - 1 - rank), 2 * world_size
    return (rank,), world_size


def shard(x: torch.Tensor, rank: int, world_size: int, is_causal: bool = False, dim: int = -2) -> torch.Tensor:
    """Rank ``rank``'s slice of ``x`` along the sequence dimension ``dim``: a contiguous slice,
    or with ``is_causal`` the zig-zag pair of chunks. The length must divide evenly."""
    held, count = _chunks(world_size, rank, is_causal)
    n = x.shape[dim]
    if n % count:
        raise ValueError(f"a sequence of {n} positions does not split into {count} equal chunks")
    pieces = x.chunk(count, dim)
    return torch.cat([pieces[i] for i in held], dim).contiguous()


def unshard(local: torch.Tensor, world_size: int, is_causal: bool = False, dim: int = -2,
            group: Optional[dist.ProcessGroup] = None) -> torch.Tensor:
    """The whole sequence from every rank's slice (an all-gather; for checks and small outputs)."""
    gathered = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(gathered, local.contiguous(), group=group)
    count = 2 * world_size if is_causal else world_size
    pieces = [None] * count
    for rank, part in enumerate(gathered):
        held, _ = _chunks(world_size, rank, is_causal)
        for i, piece in zip(held, part.chunk(len(held), dim)):
            pieces[i] = piece
    return torch.cat(pieces, dim)


class _Ring:
    """The ring of a group: this rank, its neighbours' global ranks, and one exchange step."""

    def __init__(self, group):
        self.group = group
        self.rank = dist.get_rank(group)
        if self.rank < 0:
            raise ValueError(f"this process (global rank {dist.get_rank()}) is not in the group it passed: only the "
                             "group's ranks call context_parallel_attention for it")
        self.size = dist.get_world_size(group)
        to_global = (lambda r: r) if group is None else (lambda r: dist.get_global_rank(group, r))
        self.next = to_global((self.rank + 1) % self.size)
        self.previous = to_global((self.rank - 1) % self.size)

    def start(self, tensors):
        """Sends ``tensors`` to the next rank and receives the previous rank's into new buffers;
        returns the buffers and the requests to wait on."""
        received = [torch.empty_like(t) for t in tensors]
        requests = [dist.isend(t, self.next, group=self.group) for t in tensors]
        requests += [dist.irecv(r, self.previous, group=self.group) for r in received]
        return received, requests

    def source(self, step):
        """The rank whose key/value slice this rank holds at ``step``."""
        return (self.rank - step) % self.size


def _pairs(ring, step, is_causal):
    """The (query chunk, key chunk, causal) pairs to compute at ``step``: with zig-zag chunks, a
    key chunk before the query chunk is seen whole, the same chunk causally, a later one not."""
    mine, _ = _chunks(ring.size, ring.rank, is_causal)
    theirs, _ = _chunks(ring.size, ring.source(step), is_causal)
    for qi, q_chunk in enumerate(mine):
        for ki, k_chunk in enumerate(theirs):
            if not is_causal or k_chunk < q_chunk:
                yield qi, ki, False
            elif k_chunk == q_chunk:
                yield qi, ki, True


def _split(t, parts):
    return t.chunk(parts, -2)


_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
_AXES = 8


def _refused(query, key, value, is_causal, scale, enable_gqa):
    """What is wrong with this rank's own inputs, or None: anything the engine would refuse once
    the slices are moving, found first."""
    try:
        # The dense call's own checks: dtypes, ranks, widths, heads, the scale.
        _core.Call(query, key, value, None, False, scale, enable_gqa)
    except ValueError as error:
        return str(error)
    names = ", ".join(f"{n} {tuple(t.shape)}" for n, t in (("query", query), ("key", key), ("value", value)))
    if any(t.dim() > _AXES for t in (query, key, value)):
        return f"{names}: context-parallel attention takes at most {_AXES} dimensions"
    if is_causal and (query.shape[-2] != key.shape[-2] or query.shape[-2] % 2):
        return (f"{names}: with is_causal each rank holds shard(..., is_causal=True)'s two chunks of the same "
                "positions of queries, keys and values, an even number of each")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not bool(torch.isfinite(t).all()):
            return f"{name} holds a NaN or an infinity: attention needs finite inputs"
    return None


def _described(query, key, value, is_causal, scale, enable_gqa, needs_grad, refused):
    """This rank's call as numbers every rank must agree on: each shape padded to ``_AXES`` axes,
    the dtype, the options, whether its backward will run (a collective too), and whether this
    rank refused its own inputs."""
    numbers = []
    for t in (query, key, value):
        shape = list(t.shape)[:_AXES]
        numbers += [t.dim(), *shape, *[-1] * (_AXES - len(shape))]
    dtype = _DTYPES.index(query.dtype) if query.dtype in _DTYPES else -1
    scale_bits = torch.tensor(0.0 if scale is None else float(scale), dtype=torch.float64).view(torch.int64)
    options = [int(is_causal), int(enable_gqa), int(scale is None), int(scale_bits), int(needs_grad)]
    return numbers + [dtype, *options, int(refused)]


def _told(numbers):
    """``_described``'s numbers in words."""
    values = numbers.tolist()
    width = _AXES + 1
    shapes = [tuple(values[width * i + 1: width * i + 1 + min(values[width * i], _AXES)]) for i in range(3)]
    dtype, causal, gqa, no_scale, scale_bits, needs_grad, _ = values[3 * width:]
    scale = None if no_scale else torch.tensor(scale_bits, dtype=torch.int64).view(torch.float64).item()
    dtype = _DTYPES[dtype] if dtype >= 0 else "another dtype"
    grad = "with" if needs_grad else "without"
    return (f"query {shapes[0]}, key {shapes[1]}, value {shapes[2]}, {dtype}, is_causal={bool(causal)}, "
            f"scale={scale}, enable_gqa={bool(gqa)}, {grad} a backward to run")


def _agree(ring, query, key, value, is_causal, scale, enable_gqa):
    """Refuses, on every rank and before any exchange, a call that one rank's inputs cannot make
    (its own ``_refused``) or whose ranks pass different shapes, dtypes or options, or of which
    some ranks will run the backward and others not: otherwise gloo fails on one rank and leaves
    another with an output read from a short buffer, or one rank raises (or skips the backward)
    while the others wait for it. One small all-gather."""
    refused = _refused(query, key, value, is_causal, scale, enable_gqa)
    if ring.size > 1:
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        described = _described(query, key, value, is_causal, scale, enable_gqa, needs_grad, refused is not None)
        mine = torch.tensor(described)
        every = [torch.empty_like(mine) for _ in range(ring.size)]
        dist.all_gather(every, mine, group=ring.group)
        for rank, theirs in enumerate(every):
            if refused is not None:
                break
            if theirs[-1]:
                refused = f"rank {rank} of the group refused its inputs (its error says why), so this rank stops too"
            elif not torch.equal(theirs[:-1], mine[:-1]):
                refused = (f"rank {rank} of the group passes {_told(theirs)}, rank {ring.rank} (this one) "
                           f"{_told(mine)}: every rank passes slices of one shape and dtype, the same "
                           "is_causal, scale and enable_gqa, and runs the backward or not as the others do")
    if refused is not None:
        raise ValueError(refused)


class _ContextParallel(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, is_causal, scale, enable_gqa, group):
        ring = _Ring(group)
        parts = 2 if is_causal else 1
        compute = _core.compute_dtype(_core.backend(query).dtype_name(query))
        as_compute = getattr(torch, compute)
        q_chunks = _split(query.to(as_compute), parts)
        merged = [None] * parts
        k, v = key.to(as_compute).contiguous(), value.to(as_compute).contiguous()
        for step in range(ring.size):
            if step + 1 < ring.size:
                (next_k, next_v), requests = ring.start([k, v])
            k_chunks, v_chunks = _split(k, parts), _split(v, parts)
            for qi, ki, causal in _pairs(ring, step, is_causal):
                call = _core.Call(q_chunks[qi], k_chunks[ki], v_chunks[ki], None, causal, scale, enable_gqa)
                out, lse = call.forward(with_lse=True)
                merged[qi] = (out, lse) if merged[qi] is None else _core.merge(*merged[qi], out, lse)
            if step + 1 < ring.size:
                for r in requests:
                    r.wait()
                k, v = next_k, next_v
        out = torch.cat([m[0] for m in merged], -2)
        lse = torch.cat([m[1] for m in merged], -1)
        ctx.save_for_backward(query, key, value, out, lse)
        # The logsumexp's gradient is None unless something differentiates through it.
        ctx.set_materialize_grads(False)
        ctx.options = (is_causal, scale, enable_gqa, group, compute)
        return out.to(query.dtype), lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        query, key, value, out, lse = ctx.saved_tensors
        is_causal, scale, enable_gqa, group, compute = ctx.options
        ring = _Ring(group)
        parts = 2 if is_causal else 1
        as_compute = lambda t: t.to(getattr(torch, compute)).contiguous()  # noqa: E731
        query = as_compute(query)
        grad_out = torch.zeros_like(out) if grad_out is None else as_compute(grad_out)
        q_chunks, o_chunks, g_chunks = _split(query, parts), _split(out, parts), _split(grad_out, parts)
        l_chunks = lse.chunk(parts, -1)
        gl_chunks = [None] * parts if grad_lse is None else grad_lse.to(lse.dtype).chunk(parts, -1)
        dq = torch.zeros_like(query)
        dq_chunks = _split(dq, parts)
        k, v = as_compute(key), as_compute(value)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for step in range(ring.size):
            k_chunks, v_chunks = _split(k, parts), _split(v, parts)
            dk_chunks, dv_chunks = _split(dk, parts), _split(dv, parts)
            for qi, ki, causal in _pairs(ring, step, is_causal):
                call = _core.Call(q_chunks[qi], k_chunks[ki], v_chunks[ki], None, causal, scale, enable_gqa)
                # The merged output and logsumexp: each part's weights are its share of the whole.
                g_q, g_k, g_v, _, _ = call.backward(o_chunks[qi], l_chunks[qi], g_chunks[qi], False, gl_chunks[qi])
                dq_chunks[qi].add_(g_q.reshape(dq_chunks[qi].shape))
                dk_chunks[ki].add_(g_k.reshape(dk_chunks[ki].shape))
                dv_chunks[ki].add_(g_v.reshape(dv_chunks[ki].shape))
            # The slice moves on with its gradients; after the last step they reach their owner
            # (a group of one holds its own already).
            if ring.size > 1:
                (k, v, dk, dv), requests = ring.start([k, v, dk, dv])
                for r in requests:
                    r.wait()
        return dq.to(ctx.saved_tensors[0].dtype), dk.to(key.dtype), dv.to(value.dtype), None, None, None, None


def context_parallel_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    is_causal: bool = False,
    scale: Optional[float] = None,
    enable_gqa: bool = False,
    group: Optional[dist.ProcessGroup] = None,
    return_lse: bool = False,
) -> Union[torch.Tensor, Tuple[torch.Tensor, torch.Tensor]]:
    """Attention of this rank's slice of a sequence (``query``, ``key``, ``value``, ``[..., n /
    world_size, E]``, each from ``shard`` with the same ``is_causal``) over the whole sequence,
    whose other slices the other ranks of ``group`` hold: this rank's slice of the output
    (and of the logsumexp with ``return_lse``), both differentiable. Every rank of the group
    calls it together, with slices of one shape and dtype and the same options (checked: one
    small all-gather a call), and its backward is a collective too: every rank runs it, or
    none. torch tensors on the CPU, of one dtype; float16 and bfloat16 are computed in float32.
    Nothing checks that the slices came from ``shard`` with the same ``is_causal``: contiguous
    slices passed with ``is_causal=True`` give a wrong result."""
    # Before apply: inside a Function's forward grad mode is off, and whether a backward will run
    # is one of the things the ranks must agree on.
    _core.check_arguments((("is_causal", is_causal), ("enable_gqa", enable_gqa)), scale)
    _agree(_Ring(group), query, key, value, is_causal, scale, enable_gqa)
    out, lse = _ContextParallel.apply(query, key, value, is_causal, scale, enable_gqa, group)
    return (out, lse) if return_lse else out
