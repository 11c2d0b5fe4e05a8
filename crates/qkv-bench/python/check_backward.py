#!/usr/bin/env python3
"""Compares qkv's backward (dQ, dK, dV, and a bias's gradient) with torch.autograd on the cases of
the mask check that have one (not the KV-cache cases: a cache has no backward).
Outside CI (PyTorch is not there):

    cargo run --release -p qkv-bench --example mask_cases -- /tmp/cases.json
    /root/torch-venv/bin/python crates/qkv-bench/python/check_backward.py /tmp/cases.json

The masks are built from their parameters by check_masks.py. The truth is torch.autograd in
float64 through the textbook attention (scores, masked softmax, weights times values), with each
(batch, head)'s float mask a leaf so that its gradient is the bias's per head; rows that see no
key are given weights of 0 (SDPA would give NaN there, and NaN gradients everywhere). The
largest absolute differences are printed: qkv (f32) against that, and, where no row is empty,
torch's own SDPA backward in float32 against it, for scale. It exits non-zero if a difference
from float64 exceeds check_masks.BOUND (or is NaN), naming the cases.

A packed (varlen) case's truth is the same attention run on each sequence alone, its masks
aligned within it and its own row of ALiBi slopes (check_masks.sequence), over slices of the
packed leaves; torch has no packed attention on the CPU to set beside it.

In a rotary case the queries and keys are leaves before their rotation (check_masks.rotate,
inside the graph), so the gradients are the unrotated inputs': qkv's are its backward's turned
back by Rotary::rotate_back.
"""

import sys

import torch
import torch.nn.functional as F

from check_masks import BOUND, largest, masks, rotated, sequence, tensor


def attention(case, q, k, v, dtype, fused):
    """Attention over `[batch, heads, n, d]` (already rotated) q, k, v, differentiable: the
    output, the float mask (a leaf) and whether every row sees a key."""
    b, hq, n_q, _ = q.shape
    n_k = k.shape[2]
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    allowed, bias = masks(case, b, hq, n_q, n_k)
    seen = allowed.any(dim=-1, keepdim=True)
    # Rows that see nothing see everything instead, and their weights are multiplied by 0 below.
    visible = allowed | ~seen
    mask = torch.where(visible, bias, torch.tensor(float("-inf"), dtype=torch.float64)).to(dtype)
    mask.requires_grad_()
    if fused:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case["scale"]), mask, bool(seen.all())
    scores = q @ k.transpose(-1, -2) * case["scale"] + mask
    weights = torch.softmax(scores, dim=-1) * seen
    return weights @ v, mask, bool(seen.all())


def gradients(case, dtype, fused):
    q, k, v = (tensor(case[x], dtype).requires_grad_() for x in "qkv")
    qq, kk = rotated(case, q, k)
    out, mask, full = attention(case, qq, kk, v, dtype, fused)
    out.backward(tensor(case["d_output"], dtype))
    return q.grad, k.grad, v.grad, mask.grad, full


def packed_gradients(case, dtype):
    """A packed case's gradients: each sequence alone over its slices of the packed leaves."""
    q, k, v = (tensor(case[x], dtype).requires_grad_() for x in "qkv")
    d_out = tensor(case["d_output"], dtype)
    query_offsets, key_offsets = case["varlen"]["query_offsets"], case["varlen"]["key_offsets"]
    loss = torch.zeros((), dtype=dtype)
    for i in range(len(query_offsets) - 1):
        rows = slice(query_offsets[i], query_offsets[i + 1])
        keys = slice(key_offsets[i], key_offsets[i + 1])
        if rows.start == rows.stop or keys.start == keys.stop:
            continue  # no rows, or rows that see nothing: no gradient
        out, _, _ = attention(sequence(case, i), q[None, :, rows], k[None, :, keys], v[None, :, keys], dtype, False)
        loss = loss + (out[0] * d_out[:, rows]).sum()
    loss.backward()
    return q.grad, k.grad, v.grad, None, False


def main(path):
    import json

    with open(path) as f:
        cases = json.load(f)
    print(f"qkv kernels: {cases['simd']}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'case':52} {'dq':>9} {'dk':>9} {'dv':>9} {'dbias':>9} {'sdpa f32':>9}")
    worst, failed = 0.0, []
    for case in cases["cases"]:
        if case["qkv_dq"] is None:
            continue
        if case["varlen"]:
            dq, dk, dv, dmask, full = packed_gradients(case, torch.float64)
        else:
            dq, dk, dv, dmask, full = gradients(case, torch.float64, fused=False)
        wanted = [("dq", dq), ("dk", dk), ("dv", dv)] + ([("dbias", dmask)] if case["qkv_dbias"] is not None else [])
        checked = [largest(tensor(case[f"qkv_{name}"], torch.float64) - want) for name, want in wanted]
        if not all(e <= BOUND for e in checked):  # False for NaN too
            failed.append(case["name"])
        worst = max([worst] + [e for e in checked if e == e])
        errors = checked + [float("nan")] * (4 - len(checked))
        torch_err = float("nan")
        if full:
            t32 = gradients(case, torch.float32, fused=True)
            torch_err = max((a.double() - b).abs().max().item() for a, b in zip(t32[:3], (dq, dk, dv)))
        print(f"{case['name']:52} " + " ".join(f"{e:9.2e}" for e in errors) + f" {torch_err:9.2e}")
    print(f"largest difference from torch.autograd float64: {worst:.2e} (bound {BOUND:.0e})")
    for name in failed:
        print(f"FAILED: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cases.json"))
