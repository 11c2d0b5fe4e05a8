"""Run by test_threads.py in a fresh process (whose environment picks qkv's threads): computes a set
of calls large enough for the engine to share their work out, and saves the results."""

import sys

import torch

import qkv


def calls():
    """The calls' results, by name: a prefill, a causal one, a decoding step split over its keys,
    packed decoding steps in flash-attn's layout, a gradient and a cache step."""
    g = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    q, k, v = rand(2, 8, 300, 64), rand(2, 8, 300, 64), rand(2, 8, 300, 64)
    out = {
        "prefill": qkv.scaled_dot_product_attention(q, k, v),
        "causal": qkv.scaled_dot_product_attention(q, k, v, is_causal=True),
        "decode": qkv.scaled_dot_product_attention(rand(1, 4, 1, 64), rand(1, 4, 30000, 64), rand(1, 4, 30000, 64)),
    }
    offsets = [0]
    for n in range(700, 700 + 64 * 13, 13):
        offsets.append(offsets[-1] + n)
    packed_k, packed_v = rand(offsets[-1], 4, 64), rand(offsets[-1], 4, 64)
    out["packed decoding"] = qkv.varlen_attention(rand(64, 8, 64), packed_k, packed_v, list(range(65)), offsets)
    q.requires_grad_(True)
    qkv.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    out["gradient"] = q.grad
    cache = qkv.KvCache(1, 4, 5000, 64)
    cache.append(0, rand(4, 4000, 64), rand(4, 4000, 64))
    out["cache"] = cache.attend(0, rand(8, 3, 64))
    return out


if __name__ == "__main__":
    threads = int(sys.argv[2])
    if threads:
        torch.set_num_threads(threads)
    results = calls()
    results["uses openmp"] = torch.tensor(qkv._qkv.uses_openmp())
    results["openmp regions"] = torch.tensor(qkv._qkv.openmp_regions())
    results["torch threads"] = torch.tensor(torch.get_num_threads())
    torch.save(results, sys.argv[1])
