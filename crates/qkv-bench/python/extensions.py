#!/usr/bin/env python3
"""qkv's Python calls that PyTorch's SDPA has no argument for, against what a PyTorch user writes
instead, in one process on the same tensors (float32, default threads):

- attention sinks (``sinks=``, gpt-oss's learned per-head logits): qkv with and without them,
  PyTorch's SDPA without them, and gpt-oss's eager form with them (scores, the sink column,
  softmax, the column dropped, weights times values); 8 heads, n = 1024, d = 64, causal;
- a packed batch (``qkv.varlen_attention``, flash-attn's layout): 8 causal prefills of 114 to 866
  tokens, and 64 decoding steps (one query each) over 200 to 1999 keys, 8 query heads over 2
  key/value heads, d = 64, against a call per sequence of qkv's and of PyTorch's SDPA;
- ``qkv.merge`` of two parts' ``(out, lse)`` (8 heads, n = 2048, d = 64), against the same merge
  written in torch (``logaddexp`` and two weighted sums);
- the backward through ``qkv.attention_with_lse``'s output alone and through the output and the
  logsumexp (8 heads, n = 1024, d = 64, causal; forward and backward);
- training on a packed batch: forward and backward of the 8 causal prefills above through
  ``qkv.varlen_attention``, against a call per sequence of PyTorch's SDPA and of qkv's (the
  gradients checked against PyTorch's first).

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


# The lengths of 8 prefills of a packed batch.
PREFILLS = (866, 673, 560, 343, 377, 136, 167, 114)


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


def packed(lengths, is_causal):
    """A packed batch of sequences of ``lengths`` (queries, keys) each, GQA 8/2."""
    query_offsets, key_offsets = [0], [0]
    for n_q, n_k in lengths:
        query_offsets.append(query_offsets[-1] + n_q)
        key_offsets.append(key_offsets[-1] + n_k)
    heads, kv_heads, d = 8, 2, 64
    q = torch.randn(query_offsets[-1], heads, d)
    k, v = torch.randn(key_offsets[-1], kv_heads, d), torch.randn(key_offsets[-1], kv_heads, d)

    def per_sequence(attend):
        slices = zip(query_offsets, query_offsets[1:], key_offsets, key_offsets[1:])
        outs = [attend(q[a:b].transpose(0, 1), k[c:e].transpose(0, 1), v[c:e].transpose(0, 1),
                       is_causal=is_causal, enable_gqa=True)
                for a, b, c, e in slices]
        return torch.cat([o.transpose(0, 1) for o in outs])

    def ours():
        return qkv.varlen_attention(q, k, v, query_offsets, key_offsets, is_causal=is_causal)

    assert (ours() - per_sequence(F.scaled_dot_product_attention)).abs().max().item() < 1e-5
    return {
        "qkv.varlen_attention": (ours, 10),
        "qkv sdpa per sequence": (lambda: per_sequence(qkv.scaled_dot_product_attention), 10),
        "torch sdpa per sequence": (lambda: per_sequence(F.scaled_dot_product_attention), 5),
    }


def packed_training(lengths):
    """Forward and backward of a packed batch of causal prefills (``lengths`` tokens each, GQA
    8/2, d = 64, float32), against a call per sequence of PyTorch's SDPA and of qkv's."""
    offsets = [0]
    for n in lengths:
        offsets.append(offsets[-1] + n)
    heads, kv_heads, d = 8, 2, 64
    q = torch.randn(offsets[-1], heads, d, requires_grad=True)
    k, v = (torch.randn(offsets[-1], kv_heads, d, requires_grad=True) for _ in range(2))
    d_out = torch.randn(offsets[-1], heads, d)

    def per_sequence(attend):
        outs = [attend(*(t[a:b].transpose(0, 1) for t in (q, k, v)), is_causal=True, enable_gqa=True)
                for a, b in zip(offsets, offsets[1:])]
        return torch.cat([o.transpose(0, 1) for o in outs])

    def step(forward):
        def call():
            for t in (q, k, v):
                t.grad = None
            forward().backward(d_out)
            return [t.grad.clone() for t in (q, k, v)]
        return call

    ours = step(lambda: qkv.varlen_attention(q, k, v, offsets, offsets, is_causal=True))
    theirs = step(lambda: per_sequence(F.scaled_dot_product_attention))
    for got, want in zip(ours(), theirs()):
        assert (got - want).abs().max().item() < 1e-4
    return {
        "qkv.varlen_attention": (ours, 5),
        "qkv sdpa per sequence": (step(lambda: per_sequence(qkv.scaled_dot_product_attention)), 5),
        "torch sdpa per sequence": (theirs, 3),
    }


def merges():
    q, k1, v1, k2, v2 = (torch.randn(1, 8, 2048, 64) for _ in range(5))
    (oa, la), (ob, lb) = qkv.attention_with_lse(q, k1, v1), qkv.attention_with_lse(q, k2, v2)

    def in_torch():
        lse = torch.logaddexp(la, lb)
        return oa * torch.exp(la - lse)[..., None] + ob * torch.exp(lb - lse)[..., None], lse

    assert (qkv.merge(oa, la, ob, lb)[0] - in_torch()[0]).abs().max().item() < 1e-5
    return {"qkv.merge": (lambda: qkv.merge(oa, la, ob, lb), 20), "merge in torch": (in_torch, 20)}


def logsumexp_gradient():
    q, k, v = (torch.randn(1, 8, 1024, 64, requires_grad=True) for _ in range(3))

    def step(with_lse):
        out, lse = qkv.attention_with_lse(q, k, v, is_causal=True)
        (out.sum() + (lse.sum() if with_lse else 0)).backward()

    return {"output alone": (lambda: step(False), 5), "output and logsumexp": (lambda: step(True), 5)}


def show(title, rows):
    print(title)
    for name, (call, reps) in rows.items():
        print(f"  {name:26s} {median_ms(call, reps):9.3f} ms")


def main():
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {qkv.simd_report()}")
    with torch.no_grad():
        prefills = [(n, n) for n in PREFILLS]
        # One query each sees every key: no mask (PyTorch's causal mask is aligned top-left).
        steps = [(1, 200 + i * 1799 // 63) for i in range(64)]
        show("attention sinks, 8 heads, n = 1024, causal", sinks())
        show("8 packed causal prefills, GQA 8/2", packed(prefills, True))
        show("64 packed decoding steps over 200 to 1999 keys, GQA 8/2", packed(steps, False))
        show("merge of two parts, 8 heads, n = 2048", merges())
    show("forward and backward, 8 heads, n = 1024, causal", logsumexp_gradient())
    show("forward and backward of 8 packed causal prefills, GQA 8/2", packed_training(PREFILLS))


if __name__ == "__main__":
    main()
