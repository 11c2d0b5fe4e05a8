"""Shared helpers: the float64 reference (PyTorch's own SDPA on float64 copies) and tolerances."""

import math

import pytest
import torch
import torch.nn.functional as F

# Largest difference from the float64 reference per input dtype (outputs of unit scale): float64
# agrees to rounding, float32 to its epsilon times a few sums, half precision to its rounding of
# the inputs and the output.
TOLERANCE = {
    torch.float64: 1e-12,
    torch.float32: 2e-5,
    torch.float16: 5e-3,
    torch.bfloat16: 4e-2,
}


def reference(query, key, value, attn_mask=None, **kwargs):
    """PyTorch's SDPA on float64 copies of the inputs."""
    wide = [t.double() for t in (query, key, value)]
    if attn_mask is not None and attn_mask.dtype != torch.bool:
        attn_mask = attn_mask.double()
    return F.scaled_dot_product_attention(*wide, attn_mask=attn_mask, **kwargs)


def assert_close(got, want, dtype, what=""):
    got = torch.as_tensor(got).double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    difference = (got - want).abs().max().item() if got.numel() else 0.0
    assert difference <= TOLERANCE[dtype], f"{what}: differs by {difference} (tolerance {TOLERANCE[dtype]})"


@pytest.fixture
def generator():
    return torch.Generator().manual_seed(0)


def explicit(query, key, value, *, is_causal=False, scale=None, window=None, alibi=None, softcap=None, keep=None,
             bottom_right=False, sinks=None):
    """Attention written out in float64 with qkv's extensions, for what PyTorch has no argument
    for: ``softcap · tanh(s / softcap)``, then ALiBi's ``slope_h · (j - p)``, then the masks (the
    causal one, the window ``p - before ..= p + after``, ``keep``); a row with no key left is 0.
    ``p`` is query ``i``'s position: ``i``, or ``i + n_k - n_q`` with ``bottom_right``. With
    ``sinks`` (one logit per head), gpt-oss's reference form: each head's logit joins its score
    rows as one more column, the softmax runs over both, and that column's weight is dropped.
    Returns the output and the logsumexp."""
    q, k, v = (t.double() for t in (query, key, value))
    n_q, n_k = q.shape[-2], k.shape[-2]
    if q.dim() > 2 and q.shape[-3] != k.shape[-3]:
        group = q.shape[-3] // k.shape[-3]
        k, v = k.repeat_interleave(group, -3), v.repeat_interleave(group, -3)
    scale = 1 / k.shape[-1] ** 0.5 if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    p = torch.arange(n_q).unsqueeze(-1) + (n_k - n_q if bottom_right else 0)
    j = torch.arange(n_k)
    if alibi is not None:
        slopes = torch.tensor(alibi, dtype=torch.float64).reshape(-1, 1, 1)
        s = s + slopes * (j - p)
    visible = torch.ones(n_q, n_k, dtype=torch.bool)
    if is_causal:
        visible &= j <= p
    if window is not None:
        before, after = (math.inf if w in (None, -1) else w for w in window)
        visible &= (j >= p - before) & (j <= p + after)
    if keep is not None:
        visible = visible & keep
    s = s.masked_fill(~visible, -math.inf)
    if sinks is not None:
        per_head = (-1, 1, 1) if s.dim() > 2 else (1, 1)
        column = torch.as_tensor(sinks).double().reshape(per_head).expand(*s.shape[:-1], 1)
        s = torch.cat([s, column], -1)
    lse = torch.logsumexp(s, -1)
    weights = torch.nan_to_num(torch.exp(s - lse.unsqueeze(-1)), nan=0.0)
    if sinks is not None:
        weights = weights[..., :-1]
    return weights @ v, lse
