#!/usr/bin/env python3
"""Compares qkv's batched masks, sliding windows, ALiBi, logsumexp and NaN-in-masked-position
handling with PyTorch's scaled_dot_product_attention. Outside CI (PyTorch is not there):

    cargo run --release -p qkv-bench --example mask_cases -- /tmp/cases.json
    /work/torchenv/bin/python crates/qkv-bench/python/check_masks.py /tmp/cases.json

The cases carry their masks as parameters (lengths, windows, slopes, ...); this script builds its
own masks from them, runs SDPA in float32 and float64, and prints the largest absolute
differences: qkv (f32) against torch f64, torch f32 against torch f64 for scale, and the
logsumexp against torch.logsumexp of the masked scores. Rows that see no key are compared apart:
qkv gives 0 and a logsumexp of -inf there, torch gives NaN.
"""

import json
import sys

import torch
import torch.nn.functional as F


def tensor(t, dtype):
    return torch.tensor(t["data"], dtype=dtype).reshape(t["shape"])


def positions(n_q, n_k, align):
    """The key position each query stands at, as qkv's CausalMask places it."""
    offset = n_k - n_q if align == "bottom_right" else 0
    return torch.arange(n_q, dtype=torch.float64)[:, None] + offset


def masks(case, b, h, n_q, n_k):
    """(allowed [b, h, n_q, n_k] bool, additive bias [b, h, n_q, n_k] float64)."""
    allowed = torch.ones(b, h, n_q, n_k, dtype=torch.bool)
    bias = torch.zeros(b, h, n_q, n_k, dtype=torch.float64)
    j = torch.arange(n_k, dtype=torch.float64)[None, :]
    if case["causal"]:
        allowed &= j <= positions(n_q, n_k, case["causal"])
    if case["window"]:
        w = case["window"]
        p = positions(n_q, n_k, w["align"])
        allowed &= (j >= p - w["before"]) & (j <= p + w["after"])
    if case["key_lengths"]:
        lengths = torch.tensor(case["key_lengths"])[:, None, None, None]
        allowed &= torch.arange(n_k)[None, None, None, :] < lengths
    if case["key_padding"]:
        allowed &= tensor(case["key_padding"], torch.bool)[:, None, None, :]
    if case["keep"]:
        allowed &= tensor(case["keep"], torch.bool)
    if case["bias"]:
        bias = bias + tensor(case["bias"], torch.float64)
    if case["alibi"]:
        slopes = torch.tensor(case["alibi"]["slopes"], dtype=torch.float64)[None, :, None, None]
        bias = bias + slopes * (j - positions(n_q, n_k, case["alibi"]["align"]))
    return allowed, bias


def sdpa(case, dtype, poison=False):
    q, k, v = (tensor(case[x], dtype) for x in "qkv")
    if poison:
        for b, h, j in case["nan_rows"]:
            k[b, h, j] = float("nan")
            v[b, h, j] = float("nan")
    b, hq, n_q, _ = q.shape
    n_k = k.shape[2]
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    allowed, bias = masks(case, b, hq, n_q, n_k)
    mask = torch.where(allowed, bias, torch.tensor(float("-inf"), dtype=torch.float64)).to(dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case["scale"])
    scores = q @ k.transpose(-1, -2) * case["scale"] + mask
    return out, torch.logsumexp(scores, dim=-1), allowed.any(dim=-1)


def main(path):
    with open(path) as f:
        cases = json.load(f)
    print(f"qkv kernels: {cases['simd']}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'case':52} {'qkv-t64 out':>12} {'t32-t64 out':>12} {'qkv-t64 lse':>12} {'empty rows':>10}")
    worst = 0.0
    for case in cases["cases"]:
        out64, lse64, seen = sdpa(case, torch.float64)
        out32, _, _ = sdpa(case, torch.float32)
        ours = tensor(case["qkv_output"], torch.float64)
        lse_data = [float("-inf") if x is None else x for x in case["qkv_logsumexp"]["data"]]
        our_lse = torch.tensor(lse_data, dtype=torch.float64).reshape(case["qkv_logsumexp"]["shape"])
        empty = ~seen
        # Rows that see nothing: qkv's convention (0, -inf) where torch has NaN.
        assert torch.all(ours[empty] == 0) and torch.all(our_lse[empty] == float("-inf")), case["name"]
        out_err = (ours - out64)[seen].abs().max().item()
        torch_err = (out32.double() - out64)[seen].abs().max().item()
        lse_err = (our_lse - lse64)[seen].abs().max().item()
        worst = max(worst, out_err, lse_err)
        print(f"{case['name']:52} {out_err:12.2e} {torch_err:12.2e} {lse_err:12.2e} {int(empty.sum()):10}")
        if case["nan_rows"]:
            poisoned, _, _ = sdpa(case, torch.float32, poison=True)
            nan_rows = int(torch.isnan(poisoned).any(dim=-1).sum())
            print(f"{'':52} torch with NaN in those rows: {nan_rows} of {seen.numel()} output rows NaN")
    print(f"largest difference from torch float64: {worst:.2e}")
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cases.json"))
