"""Shared helpers: the float64 reference (PyTorch's own SDPA on float64 copies) and tolerances."""

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
