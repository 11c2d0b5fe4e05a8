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
        with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
            json.dump(results, f)
    finally:
        dist.destroy_process_group()


def case(rank, world_size, is_causal, dtype_name):
    """The largest differences of this rank's slice of output and gradients."""
    dtype = getattr(torch, dtype_name)
    generator = torch.Generator().manual_seed(1234)
    # GQA (4 query heads over 2), widths 16 and 8, 40 positions: 8 chunks of 5 when causal.
    shapes = {"q": (2, 4, 40, 16), "k": (2, 2, 40, 16), "v": (2, 2, 40, 8), "w": (2, 4, 40, 8)}
    full = {n: torch.randn(s, generator=generator, dtype=torch.float64) for n, s in shapes.items()}
    # The reference: PyTorch's SDPA in float64 in this one process, gradients by autograd.
    ref_in = [full[n].clone().requires_grad_() for n in "qkv"]
    ref_out = F.scaled_dot_product_attention(*ref_in, is_causal=is_causal, enable_gqa=True)
    (ref_out * full["w"]).sum().backward()

    def mine(t):
        return cp.shard(t, rank, world_size, is_causal)

    local = [mine(full[n]).to(dtype).requires_grad_() for n in "qkv"]
    out = cp.context_parallel_attention(*local, is_causal=is_causal, enable_gqa=True)
    (out * mine(full["w"]).to(dtype)).sum().backward()
    differences = {
        "out": (out.double() - mine(ref_out.detach())).abs().max().item(),
        **{f"d{n}": (t.grad.double() - mine(r.grad)).abs().max().item() for n, t, r in zip("qkv", local, ref_in)},
    }
    # The slices put back together are the whole output.
    whole = cp.unshard(out.detach(), world_size, is_causal)
    differences["unsharded"] = (whole.double() - ref_out.detach()).abs().max().item()
    return differences
