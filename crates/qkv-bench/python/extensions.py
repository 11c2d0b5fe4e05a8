#!/usr/bin/env python3
"""qkv's Python calls that PyTorch's SDPA has no argument for, against what a PyTorch user writes
instead, in one process on the same tensors (float32, default threads):

- attention sinks (``sinks=``, gpt-oss's learned per-head logits): qkv with and without them,
  PyTorch's SDPA without them, and gpt-oss's eager form with them (scores, the sink column,
  softmax, the column dropped, weights times values); 8 heads, n = 1024, d = 64, causal;
- a packed batch (``qkv.varlen_attention``, flash-attn's layout): 8 causal prefills of 114 to 866
  tokens, 8 query heads over 2 key/value heads, d = 64, against a call per sequence of qkv's and
  of PyTorch's SDPA.

    pip install ./crates/qkv-python
    python crates/qkv-bench/python/extensions.py

Each figure is the median of seven rounds of calls (one warm-up call first); each output is
checked against PyTorch's before it is timed.
"""

import statistics
import time

import torch
import torch.nn.functional as F

import qkv


def median_ms(call, reps):
    call()
    rounds = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(reps):
            call()
        rounds.append((time.perf_counter() - start) / reps)
    return statistics.median(rounds) * 1e3


def sinks():
    heads, n, d = 8, 1024, 64
    q, k, v = (torch.randn(1, heads, n, d) for _ in range(3))
    s = torch.randn(heads)
    mask = torch.triu(torch.full((n, n), -float("inf")), diagonal=1)

    def eager():
        scores = q @ k.transpose(-1, -2) * d**-0.5 + mask
        column = s.reshape(1, heads, 1, 1).expand(1, heads, n, 1)
        return torch.softmax(torch.cat([scores, column], -1), -1)[..., :-1] @ v

    ours = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=s)
    assert (ours - eager()).abs().max().item() < 1e-5
    return {
        "qkv, sinks": (lambda: qkv.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=s), 20),
        "qkv, no sinks": (lambda: qkv.scaled_dot_product_attention(q, k, v, is_causal=True), 20),
        "torch sdpa, no sinks": (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), 20),
        "torch eager, sinks": (eager, 3),
    }


def packed():
    lengths = [866, 673, 560, 343, 377, 136, 167, 114]
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    total, heads, kv_heads, d = offsets[-1], 8, 2, 64
    q, k, v = torch.randn(total, heads, d), torch.randn(total, kv_heads, d), torch.randn(total, kv_heads, d)

    def per_sequence(attend):
        slices = zip(offsets, offsets[1:])
        outs = [attend(*(t[a:b].transpose(0, 1) for t in (q, k, v)), is_causal=True, enable_gqa=True)
                for a, b in slices]
        return torch.cat([o.transpose(0, 1) for o in outs])

    ours = qkv.varlen_attention(q, k, v, offsets, offsets, is_causal=True)
    assert (ours - per_sequence(F.scaled_dot_product_attention)).abs().max().item() < 1e-5
    return {
        "qkv.varlen_attention": (lambda: qkv.varlen_attention(q, k, v, offsets, offsets, is_causal=True), 10),
        "qkv sdpa per sequence": (lambda: per_sequence(qkv.scaled_dot_product_attention), 10),
        "torch sdpa per sequence": (lambda: per_sequence(F.scaled_dot_product_attention), 5),
    }


def main():
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {qkv.simd_report()}")
    with torch.no_grad():
        for title, rows in (("attention sinks, 8 heads, n = 1024, causal", sinks()),
                            ("8 packed causal prefills, GQA 8/2", packed())):
            print(title)
            for name, (call, reps) in rows.items():
                print(f"  {name:26s} {median_ms(call, reps):9.3f} ms")


if __name__ == "__main__":
    main()
