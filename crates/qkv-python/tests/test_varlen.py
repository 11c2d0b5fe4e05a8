"""qkv.varlen_attention: a packed batch of sequences of different lengths in flash-attn's layout,
against attention written out in float64 for each sequence alone (bottom-right aligned)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import assert_close, explicit

import qkv

HEADS, KV_HEADS, D_K, D_V = 4, 2, 8, 6
# Queries and keys per sequence: more keys than queries, one query, a sequence with no queries,
# one with no keys, and one longer than a key block of every level.
Q_LENS, K_LENS = [3, 1, 7, 0, 5, 70], [3, 6, 7, 4, 0, 130]
# Decoding steps alone (and keys without queries), which the engine's step measures as it reads
# them, straight from the strided rows of this layout; one over more keys than a key block.
BATCHES = {"mixed": (Q_LENS, K_LENS), "decoding": ([1, 1, 0, 1, 1], [6, 300, 4, 1, 130])}


def packed(q_lens, k_lens, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), HEADS, D_K, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(sum(k_lens), KV_HEADS, D_K, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(sum(k_lens), KV_HEADS, D_V, generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v, np.cumsum([0] + q_lens).tolist(), np.cumsum([0] + k_lens).tolist()


CASES = {
    "plain": {},
    "causal": dict(is_causal=True),
    "window": dict(sliding_window=(3, 1), scale=0.6),
    "everything": dict(is_causal=True, sliding_window=(4, 0), alibi_slopes=qkv.alibi_slopes(HEADS), softcap=3.0,
                       sinks=[0.5, -1.0, 2.0, -math.inf]),
}


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
def test_each_sequence_attends_to_its_own_keys(case, dtype, batch):
    kwargs = CASES[case]
    q_lens, k_lens = BATCHES[batch]
    q, k, v, cu_q, cu_k = packed(q_lens, k_lens, dtype)
    # flash-attn passes the offsets as int32 tensors.
    out, lse = qkv.varlen_attention(q, k, v, torch.tensor(cu_q, dtype=torch.int32), cu_k, return_lse=True, **kwargs)
    assert out.shape == (sum(q_lens), HEADS, D_V) and out.dtype == dtype
    assert lse.shape == (HEADS, sum(q_lens))
    for i in range(len(q_lens)):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        want, want_lse = explicit(
            *(t.transpose(0, 1) for t in (q[rows], k[keys], v[keys])),
            is_causal=kwargs.get("is_causal", False), scale=kwargs.get("scale"), window=kwargs.get("sliding_window"),
            alibi=kwargs.get("alibi_slopes"), softcap=kwargs.get("softcap"), sinks=kwargs.get("sinks"),
            bottom_right=True,
        )
        assert_close(out[rows].transpose(0, 1), want, dtype, f"sequence {i}")
        hidden = torch.isinf(want_lse)
        assert torch.equal(torch.isinf(lse[:, rows]), hidden), f"sequence {i}"
        assert_close(lse[:, rows].masked_fill(hidden, 0), want_lse.masked_fill(hidden, 0), dtype, f"sequence {i} lse")


def test_a_packed_batch_equals_pytorchs_sdpa_per_sequence():
    # Prefill: each sequence has as many queries as keys, so flash-attn's bottom-right causal mask
    # is PyTorch's top-left one.
    lens = [5, 1, 9, 2]
    q, k, v, cu, _ = packed(lens, lens)
    out = qkv.varlen_attention(q, k, v, cu, cu, is_causal=True)
    for i in range(len(lens)):
        rows = slice(cu[i], cu[i + 1])
        want = F.scaled_dot_product_attention(*(t[rows].transpose(0, 1) for t in (q, k, v)), is_causal=True,
                                              enable_gqa=True)
        assert_close(out[rows].transpose(0, 1), want, torch.float64, f"sequence {i}")


@pytest.mark.parametrize("argument", ["query", "key", "value"])
@pytest.mark.parametrize("batch", BATCHES)
def test_an_element_that_is_not_finite_is_named_by_its_index_in_the_packed_tensor(argument, batch):
    q_lens, k_lens = BATCHES[batch]
    q, k, v, cu_q, cu_k = packed(q_lens, k_lens)
    tensors = {"query": q, "key": k, "value": v}
    at = (tensors[argument].shape[0] - 1, 1, 2)
    tensors[argument][at] = math.nan
    with pytest.raises(ValueError, match=rf"^{argument}\[{at[0]}, 1, 2\] is NaN: attention needs finite inputs$"):
        qkv.varlen_attention(q, k, v, cu_q, cu_k)


def test_numpy_arrays_give_what_tensors_give():
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS)
    kwargs = CASES["everything"]
    from_numpy, lse = qkv.varlen_attention(q.numpy(), k.numpy(), v.numpy(), np.array(cu_q), np.array(cu_k),
                                           return_lse=True, **kwargs)
    assert isinstance(from_numpy, np.ndarray) and isinstance(lse, np.ndarray)
    assert np.array_equal(from_numpy, qkv.varlen_attention(q, k, v, cu_q, cu_k, **kwargs).numpy())


def test_bad_packed_calls_raise_errors_that_name_the_argument():
    q, k, v, cu_q, cu_k = packed([2, 3], [4, 1])
    with pytest.raises(ValueError, match=r"^cu_seqlens_q \[0, 2, 4\] do not fit 2 sequences and 5 packed rows"):
        qkv.varlen_attention(q, k, v, [0, 2, 4], cu_k)
    with pytest.raises(ValueError, match=r"^cu_seqlens_k \[0, 1, 6\] do not fit 2 sequences and 5 packed rows"):
        qkv.varlen_attention(q, k, v, cu_q, [0, 1, 6])
    # Lists of different lengths: neither is blamed, both are named as the caller passed them.
    with pytest.raises(ValueError, match=r"^cu_seqlens_q \[0, 2, 5\] and cu_seqlens_k \[0, 1\] differ in length "
                       r"\(3 and 2\): each has one offset per sequence of the batch and one for the end$"):
        qkv.varlen_attention(q, k, v, cu_q, [0, 1])
    # Offsets no 64-bit integer holds, or not whole numbers: named, never an overflow.
    for offsets in ([0, -1, 5], [0, 2**64, 5], [0, 1e30, 5], [0, math.nan, 5], [0, 2.5, 5], [0, "1", 5]):
        with pytest.raises(ValueError, match="cu_seqlens_k is .*: offsets are whole numbers"):
            qkv.varlen_attention(q, k, v, cu_q, offsets)
    for window in ((2**64, 0), 5, (3,)):
        with pytest.raises(ValueError, match=r"sliding_window is .*: it is \(before, after\)"):
            qkv.varlen_attention(q, k, v, cu_q, cu_k, sliding_window=window)
    with pytest.raises(ValueError, match=r"query has shape \(5, 32\)"):
        qkv.varlen_attention(q.reshape(5, -1), k, v, cu_q, cu_k)
    with pytest.raises(ValueError, match="sinks has 2 logits for 4 query heads"):
        qkv.varlen_attention(q, k, v, cu_q, cu_k, sinks=[0.0, 1.0])
    with pytest.raises(ValueError, match="query, value require grad"):
        qkv.varlen_attention(q.requires_grad_(), k, v.requires_grad_(), cu_q, cu_k)
    with torch.no_grad():
        assert qkv.varlen_attention(q, k, v, cu_q, cu_k).shape == (5, HEADS, D_V)
