"""The package without PyTorch: a NumPy user imports it and calls every NumPy entry point in a
process where importing torch fails (``pyproject.toml`` lists no dependency)."""

import subprocess
import sys
import textwrap

# Runs in a fresh interpreter: torch cannot be imported there, whatever the venv holds.
PROGRAM = textwrap.dedent(
    """
    import importlib.abc
    import sys

    attempts = []

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == "torch" or name.startswith("torch."):
                attempts.append(name)
                raise ImportError("torch is not installed here")

    sys.meta_path.insert(0, NoTorch())

    import numpy as np
    import qkv

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 2, 5, 4)).astype(np.float32)
    k = rng.standard_normal((1, 2, 7, 4)).astype(np.float32)
    v = rng.standard_normal((1, 2, 7, 3)).astype(np.float32)

    # Causal from the top left, as SDPA's is_causal: query i sees keys 0..=i.
    s = np.einsum("bhqd,bhkd->bhqk", q.astype(np.float64), k.astype(np.float64)) / 2.0
    s = np.where(np.tril(np.ones((5, 7), bool)), s, -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    want = np.exp(s - lse[..., None]) @ v.astype(np.float64)

    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert isinstance(out, np.ndarray) and out.dtype == np.float32, (type(out), out.dtype)
    assert np.abs(out - want).max() < 2e-6, np.abs(out - want).max()
    out, got_lse = qkv.attention_with_lse(q, k, v, is_causal=True)
    assert np.abs(got_lse - lse).max() < 2e-6, np.abs(got_lse - lse).max()

    cache = qkv.KvCache(1, 2, 16, 4, 3)
    cache.append(0, k[0], v[0])
    last = cache.attend(0, q[0, :, -1:])
    # The cache's one query is the last position: it sees all 7 keys (bottom-right).
    s_last = np.einsum("hd,hkd->hk", q[0, :, -1].astype(np.float64), k[0].astype(np.float64)) / 2.0
    p_last = np.exp(s_last - s_last.max(-1, keepdims=True))
    p_last /= p_last.sum(-1, keepdims=True)
    want_last = np.einsum("hk,hkd->hd", p_last, v[0].astype(np.float64))
    assert np.abs(last[:, 0] - want_last).max() < 2e-6, np.abs(last[:, 0] - want_last).max()

    packed = rng.standard_normal((9, 2, 4)).astype(np.float32)
    cu = np.array([0, 4, 9], np.int32)
    assert qkv.varlen_attention(packed, packed, packed, cu, cu, is_causal=True).shape == (9, 2, 4)

    assert not attempts, f"the NumPy entry points tried to import {attempts}"
    try:
        import qkv.distributed  # noqa: F401
    except ImportError:
        assert attempts == ["torch"], attempts
    else:
        raise AssertionError("qkv.distributed imported without torch")
    print("ok")
    """
)


def test_numpy_users_need_no_torch():
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
