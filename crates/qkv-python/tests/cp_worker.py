"""One process of the context-parallel test (``test_distributed.py``): builds the whole problem
from a shared seed, runs its slice with ``qkv.distributed`` on a gloo group over 127.0.0.1, and
writes the largest differences from single-process attention to ``<out_dir>/<rank>.json``, one
entry per case (causal or not, float64 or float32): one group of processes runs them all, since
starting the processes (and importing torch in each) costs more than the cases."""

import json
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import qkv.distributed as cp


CASES = [(is_causal, dtype) for is_causal in (False, True) for dtype in ("float64", "float32")]


def run(rank, world_size, port, out_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results = {f"causal={c} {d}": case(rank, world_size, c, d) for c, d in CASES}
        results["group of one"] = group_of_one(rank, world_size)
        results["misuse"] = misuse(rank, world_size)
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def case(rank, world_size, is_causal, dtype_name):
    """The largest differences of this rank's slice of output and gradients."""
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(1234)
    # GQA (4 query heads over 2), widths 16 and 8, 40 positions: 8 chunks of 5 when causal.
    shapes = {"q": (2, 4, 40, 16), "k": (2, 2, 40, 16), "v": (2, 2, 40, 8), "w": (2, 4, 40, 8), "u": (2, 4, 40)}
    full = {n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}
    # The reference: PyTorch's SDPA in float64 in this one process, and the logsumexp of the
    # same scores; gradients by autograd, through both (the loss weighs each by its own weights).
    ref_in = [full[n].clone().requires_grad_() for n in "qkv"]
    ref_out = F.scaled_dot_product_attention(*ref_in, is_causal=is_causal, enable_gqa=True)
    scores = ref_in[0] @ ref_in[1].repeat_interleave(2, 1).transpose(-1, -2) / 4
    if is_causal:
        scores = scores.masked_fill(torch.ones(40, 40, dtype=torch.bool).triu(1), float("-inf"))
    ref_lse = scores.logsumexp(-1)
    ((ref_out * full["w"]).sum() + (ref_lse * full["u"]).sum()).backward()

    def mine(t, dim=-2):
        return cp.shard(t, rank, world_size, is_causal, dim=dim)

    local = [mine(full[n]).to(dtype).requires_grad_() for n in "qkv"]
    out, lse = cp.context_parallel_attention(*local, is_causal=is_causal, enable_gqa=True, return_lse=True)
    ((out * mine(full["w"]).to(dtype)).sum() + (lse * mine(full["u"], -1).to(lse.dtype)).sum()).backward()
    differences = {
        "out": (out.double() - mine(ref_out.detach())).abs().max().item(),
        "lse": (lse.double() - mine(ref_lse.detach(), -1)).abs().max().item(),
        **{f"d{n}": (t.grad.double() - mine(r.grad)).abs().max().item() for n, t, r in zip("qkv", local, ref_in)},
    }
    # The slices put back together are the whole output.
    whole = cp.unshard(out.detach(), world_size, is_causal)
    differences["unsharded"] = (whole.double() - ref_out.detach()).abs().max().item()
    return differences


def group_of_one(rank, world_size):
    """Each rank alone in a group of its own: attention over its own slice, forward and backward
    (a ring of one has no neighbour to pass slices to), against float64 SDPA."""
    groups = [dist.new_group([r]) for r in range(world_size)]  # every rank makes every group
    generator = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    out = cp.context_parallel_attention(*mine, is_causal=True, group=groups[rank])
    out.sum().backward()
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    F.scaled_dot_product_attention(*ref, is_causal=True).sum().backward()
    return {"out": (out - F.scaled_dot_product_attention(q, k, v, is_causal=True)).abs().max().item(),
            **{f"d{n}": (a.grad - b.grad).abs().max().item() for n, a, b in zip("qkv", mine, ref)}}


def misuse(rank, world_size):
    """The error each misuse raises on this rank (every rank raises, none waits for another):
    rank 0's slice a position short, rank 1's key float32 beside float64, a causal slice of odd
    length on every rank, a call by ranks outside the group it names, a NaN in rank 2's query,
    and inputs that need a gradient on rank 3 alone."""
    messages = {}

    def attempt(name, *args, **kwargs):
        try:
            cp.context_parallel_attention(*args, **kwargs)
            messages[name] = None
        except ValueError as error:
            messages[name] = str(error)

    x = torch.randn(1, 2, 8, 4, dtype=torch.float64)
    short = x[:, :, :7] if rank == 0 else x
    attempt("shapes differ", short, short, short)
    key = x.float() if rank == 1 else x
    attempt("one rank mixes dtypes", x, key, x)
    odd = x[:, :, :7]
    attempt("odd causal slice", odd, odd, odd, is_causal=True)
    attempt("outside the group", x, x, x, group=dist.new_group([0, 1]))  # works on ranks 0 and 1
    poisoned = x.clone()
    if rank == 2:
        poisoned[0, 1, 2, 3] = float("nan")
    attempt("a NaN on rank 2", poisoned, x, x)
    # Only rank 3 would run the backward (a collective): the others would never join it.
    attempt("only rank 3 differentiates", x.clone().requires_grad_(rank == 3), x, x)
    return messages
