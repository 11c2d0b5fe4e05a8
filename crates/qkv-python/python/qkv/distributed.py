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

import torch
import torch.distributed as dist

from . import _core

__all__ = ["shard", "unshard", "context_parallel_attention"]


def _chunks(world_size, rank, is_causal):
    """The chunk indices rank ``rank`` holds, in order, and the chunk count."""
    if is_causal:
        return (rank, 2 * world_size - 1 - rank), 2 * world_size
    return (rank,), world_size


def shard(x, rank, world_size, is_causal=False, dim=-2):
    """Rank ``rank``'s slice of ``x`` along the sequence dimension ``dim``: a contiguous slice,
    or with ``is_causal`` the zig-zag pair of chunks. The length must divide evenly."""
    held, count = _chunks(world_size, rank, is_causal)
    n = x.shape[dim]
    if n % count:
        raise ValueError(f"a sequence of {n} positions does not split into {count} equal chunks")
    pieces = x.chunk(count, dim)
    return torch.cat([pieces[i] for i in held], dim).contiguous()


def unshard(local, world_size, is_causal=False, dim=-2, group=None):
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
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
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
        # The logsumexp is returned for merging further, not differentiated through.
        ctx.mark_non_differentiable(lse)
        ctx.options = (is_causal, scale, enable_gqa, group, compute)
        return out.to(query.dtype), lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        query, key, value, out, lse = ctx.saved_tensors
        is_causal, scale, enable_gqa, group, compute = ctx.options
        ring = _Ring(group)
        parts = 2 if is_causal else 1
        as_compute = lambda t: t.to(getattr(torch, compute)).contiguous()  # noqa: E731
        query, grad_out = as_compute(query), as_compute(grad_out)
        q_chunks, o_chunks, g_chunks = _split(query, parts), _split(out, parts), _split(grad_out, parts)
        l_chunks = lse.chunk(parts, -1)
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
                g_q, g_k, g_v, _, _ = call.backward(o_chunks[qi], l_chunks[qi], g_chunks[qi], False)
                dq_chunks[qi].add_(g_q.reshape(dq_chunks[qi].shape))
                dk_chunks[ki].add_(g_k.reshape(dk_chunks[ki].shape))
                dv_chunks[ki].add_(g_v.reshape(dv_chunks[ki].shape))
            # The slice moves on with its gradients; after the last step they reach their owner.
            (k, v, dk, dv), requests = ring.start([k, v, dk, dv])
            for r in requests:
                r.wait()
        return dq.to(ctx.saved_tensors[0].dtype), dk.to(key.dtype), dv.to(value.dtype), None, None, None, None


def context_parallel_attention(query, key, value, *, is_causal=False, scale=None, enable_gqa=False, group=None,
                               return_lse=False):
    """Attention of this rank's slice of a sequence (``query``, ``key``, ``value``, ``[..., n /
    world_size, E]``, each from ``shard`` with the same ``is_causal``) over the whole sequence,
    whose other slices the other ranks of ``group`` hold: this rank's slice of the output
    (and of the logsumexp with ``return_lse``), differentiable. Every rank of the group calls it
    together. torch tensors on the CPU; float16 and bfloat16 are computed in float32."""
    out, lse = _ContextParallel.apply(query, key, value, is_causal, scale, enable_gqa, group)
    return (out, lse) if return_lse else out
