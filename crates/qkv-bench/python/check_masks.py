#!/usr/bin/env python3
"""Compares qkv's batched masks, sliding windows, ALiBi (the paper's form and flash-attn's
symmetric one, slopes per head or per sequence and head), rotary embeddings, packed sequences,
logsumexp and NaN-in-masked-position handling with PyTorch's scaled_dot_product_attention.
Outside CI (PyTorch is not there):

    cargo run --release -p qkv-bench --example mask_cases -- /tmp/cases.json
    /root/torch-venv/bin/python crates/qkv-bench/python/check_masks.py /tmp/cases.json

The cases carry their masks as parameters (lengths, windows, slopes, ...); this script builds its
own masks from them, runs SDPA in float32 and float64, and prints the largest absolute
differences: qkv (f32) against torch f64, torch f32 against torch f64 for scale, and the
logsumexp against torch.logsumexp of the masked scores. Rows that see no key are compared apart:
qkv gives 0 and a logsumexp of -inf there, torch gives NaN. It exits non-zero if a difference
from torch f64 exceeds BOUND (or is NaN), naming the cases.

Rotary cases carry unrotated queries and keys and the embedding's parameters; qkv rotated them
(Rotary::rotate, or a KvCache::with_rotary as it appended keys and took queries), and this script
rotates them with its own code written from the definitions (`rotate` below) before SDPA. A
cache case is the cache's steps (chunks of prefill, then one position at a time) written as the
one bottom-right causal call over the whole sequence that they add up to.

Packed (varlen) cases run SDPA per sequence in float64 and float32, each sequence's masks aligned
within it and its own row of ALiBi slopes; PyTorch's own packed attention,
torch.nn.attention.varlen.varlen_attn, runs on CUDA only, so it is not used.
"""

import json
import sys

import torch
import torch.nn.functional as F

# The largest difference from torch float64 allowed (qkv computes in f32: 1e-7 to 1e-6 is usual).
BOUND = 1e-5


def tensor(t, dtype):
    return torch.tensor(t["data"], dtype=dtype).reshape(t["shape"])


def positions(n_q, n_k, align):
    """The key position each query stands at, as qkv's CausalMask places it."""
    offset = n_k - n_q if align == "bottom_right" else 0
    return torch.arange(n_q, dtype=torch.float64)[:, None] + offset


def rotate(x, first, rotary):
    """x (`[..., n, d]`, row i at position first + i) under the rotary embedding `rotary`, from
    the definitions: pair i of the first `dims` components turns by
    position · position_scale · base^(-2i / dims) radians (qkv's position_scale multiplies the
    position: linear interpolation by a factor f, Hugging Face's `t / f`, is position_scale 1 / f).
    Half-split pairs are (i, i + dims / 2), GPT-NeoX's and LLaMA's `rotate_half`; interleaved pairs
    are (2i, 2i + 1), GPT-J's `rotate_every_two`. The remaining components pass through. Angles
    are computed in float64 and their cosines and sines rounded to x's dtype."""
    n, d = x.shape[-2:]
    dims = rotary["dims"] or d
    at = (torch.arange(n, dtype=torch.float64) + first) * rotary["position_scale"]
    inv_freq = rotary["base"] ** (-torch.arange(0, dims, 2, dtype=torch.float64) / dims)
    angles = at[:, None] * inv_freq[None, :]  # [n, dims / 2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    turned, rest = x[..., :dims], x[..., dims:]
    if rotary["pairing"] == "half_split":
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
        first_half, second_half = turned[..., : dims // 2], turned[..., dims // 2 :]
        partner = torch.cat([-second_half, first_half], dim=-1)
    else:
        cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        even, odd = turned[..., 0::2], turned[..., 1::2]
        partner = torch.stack([-odd, even], dim=-1).flatten(-2)
    return torch.cat([turned * cos + partner * sin, rest], dim=-1)


def rotated(case, q, k):
    """q and k as the case's rotary embedding turns them (as they are without one)."""
    r = case["rotary"]
    if not r:
        return q, k
    return rotate(q, r["query_first"], r), rotate(k, r["key_first"], r)


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
        a = case["alibi"]
        # [1 | batch, heads]: one slope per head, or per (sequence, head).
        slopes = tensor(a["slopes"], torch.float64)[:, :, None, None]
        distance = j - positions(n_q, n_k, a["align"])
        # The paper's slope · (j - p), or flash-attn's symmetric -slope · |j - p|.
        bias = bias + (-slopes * distance.abs() if a["symmetric"] else slopes * distance)
    return allowed, bias


def attend(case, q, k, v, dtype):
    """SDPA over one batch of (already rotated) q, k, v: output, logsumexp, rows that see a key."""
    b, hq, n_q, _ = q.shape
    n_k = k.shape[2]
    group = hq // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    allowed, bias = masks(case, b, hq, n_q, n_k)
    mask = torch.where(allowed, bias, torch.tensor(float("-inf"), dtype=torch.float64)).to(dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=case["scale"])
    scores = q @ k.transpose(-1, -2) * case["scale"] + mask
    return out, torch.logsumexp(scores, dim=-1), allowed.any(dim=-1)


def sequence(case, i):
    """Sequence i of a packed case as a case of its own (its row of per-sequence ALiBi slopes)."""
    a = case["alibi"]
    if not a or a["slopes"]["shape"][0] == 1:
        return case
    heads = a["slopes"]["shape"][1]
    row = {"shape": [1, heads], "data": a["slopes"]["data"][i * heads : (i + 1) * heads]}
    return dict(case, alibi=dict(a, slopes=row))


def varlen(case, dtype):
    """A packed case, sequence by sequence: `[heads, total_q, ...]` outputs and logsumexps."""
    q, k, v = (tensor(case[x], dtype) for x in "qkv")
    query_offsets, key_offsets = case["varlen"]["query_offsets"], case["varlen"]["key_offsets"]
    hq, total_q = q.shape[:2]
    out = torch.zeros(hq, total_q, v.shape[2], dtype=dtype)
    lse = torch.full((hq, total_q), float("-inf"), dtype=dtype)
    seen = torch.zeros(hq, total_q, dtype=torch.bool)
    for i in range(len(query_offsets) - 1):
        queries = slice(query_offsets[i], query_offsets[i + 1])
        keys = slice(key_offsets[i], key_offsets[i + 1])
        if queries.start == queries.stop or keys.start == keys.stop:
            continue  # no rows, or rows that see nothing (0, -inf)
        o, l, s = attend(sequence(case, i), q[None, :, queries], k[None, :, keys], v[None, :, keys], dtype)
        out[:, queries], lse[:, queries], seen[:, queries] = o[0], l[0], s[0]
    return out, lse, seen


def sdpa(case, dtype, poison=False):
    if case["varlen"]:
        return varlen(case, dtype)
    q, k, v = (tensor(case[x], dtype) for x in "qkv")
    if poison:
        for b, h, j in case["nan_rows"]:
            k[b, h, j] = float("nan")
            v[b, h, j] = float("nan")
    q, k = rotated(case, q, k)
    return attend(case, q, k, v, dtype)


def largest(x):
    """The largest |x|, NaN if any is (Python's max would drop a NaN)."""
    return float("nan") if torch.isnan(x).any() else (x.abs().max().item() if x.numel() else 0.0)


def main(path):
    with open(path) as f:
        cases = json.load(f)
    print(f"qkv kernels: {cases['simd']}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"{'case':52} {'qkv-t64 out':>12} {'t32-t64 out':>12} {'qkv-t64 lse':>12} {'empty rows':>10}")
    worst, failed = 0.0, []
    for case in cases["cases"]:
        out64, lse64, seen = sdpa(case, torch.float64)
        out32, _, _ = sdpa(case, torch.float32)
        ours = tensor(case["qkv_output"], torch.float64)
        lse_data = [float("-inf") if x is None else x for x in case["qkv_logsumexp"]["data"]]
        our_lse = torch.tensor(lse_data, dtype=torch.float64).reshape(case["qkv_logsumexp"]["shape"])
        empty = ~seen
        # Rows that see nothing: qkv's convention (0, -inf) where torch has NaN.
        assert torch.all(ours[empty] == 0) and torch.all(our_lse[empty] == float("-inf")), case["name"]
        out_err = largest((ours - out64)[seen])
        torch_err = largest((out32.double() - out64)[seen])
        lse_err = largest((our_lse - lse64)[seen])
        if not (out_err <= BOUND and lse_err <= BOUND):
            failed.append(case["name"])
        worst = max([worst] + [e for e in (out_err, lse_err) if e == e])
        print(f"{case['name']:52} {out_err:12.2e} {torch_err:12.2e} {lse_err:12.2e} {int(empty.sum()):10}")
        if case["nan_rows"]:
            poisoned, _, _ = sdpa(case, torch.float32, poison=True)
            nan_rows = int(torch.isnan(poisoned).any(dim=-1).sum())
            print(f"{'':52} torch with NaN in those rows: {nan_rows} of {seen.numel()} output rows NaN")
    print(f"largest difference from torch float64: {worst:.2e} (bound {BOUND:.0e})")
    for name in failed:
        print(f"FAILED: {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "cases.json"))
