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
    with pytest.raises(ValueError, match=r"alibi_slopes has shape \(2, 4\): it is one value per query head"):
        qkv.varlen_attention(q, k, v, cu_q, cu_k, alibi_slopes=torch.ones(2, 4))
    # Through the operator (inputs that need a gradient), the same errors by the same names.
    with pytest.raises(ValueError, match=r"^cu_seqlens_k \[0, 1, 6\] do not fit 2 sequences and 5 packed rows"):
        qkv.varlen_attention(q.requires_grad_(), k, v, cu_q, [0, 1, 6])
    bad = v.detach().clone()
    bad[3, 1, 2] = math.nan
    with pytest.raises(ValueError, match=r"^value\[3, 1, 2\] is NaN"):
        qkv.varlen_attention(q, k, bad.requires_grad_(), cu_q, cu_k)
    with pytest.raises(ValueError, match=r"^query and key have widths 8 and 7: they need the same \(query \(5, 4, 8\), "
                       r"key \(5, 2, 7\), value \(5, 2, 6\)\)"):
        qkv.varlen_attention(q, k[..., :7], v, cu_q, cu_k)
    with pytest.raises(ValueError, match=r"^query has 4 heads and key 3: the key/value heads must divide"):
        qkv.varlen_attention(q, k[:, [0, 1, 1]], v[:, [0, 1, 1]], cu_q, cu_k)
    with pytest.raises(ValueError, match=r"^key and value need the same shape but for their width"):
        qkv.varlen_attention(q, k, v[:4], cu_q, cu_k)
    for offsets in (torch.tensor([0.0, 2.0, 5.0]), np.array([0.0, 2.0, 5.0])):
        with pytest.raises(ValueError, match=r"^cu_seqlens_q has dtype .*float.*: offsets are integers"):
            qkv.varlen_attention(q, k, v, offsets, cu_k)
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"^cu_seqlens_q has dtype .*float.*: offsets are integers"):
            qkv.varlen_attention(q, k, v, torch.tensor([0.0, 2.0, 5.0]), cu_k)
        # Offsets on meta hold no numbers (torch's own error named no argument).
        with pytest.raises(ValueError, match=r"^cu_seqlens_k is on meta"):
            qkv.varlen_attention(q, k, v, cu_q, torch.tensor([0, 4, 5], device="meta"))


def test_a_gradient_that_is_not_finite_gives_gradients_of_nan():
    """An overflow in the incoming gradient (what a GradScaler looks for in the gradients it gets
    back) propagates as NaN, as PyTorch's own backward propagates it, rather than raise."""
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS, torch.float16)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    out, lse = qkv.varlen_attention(*inputs, cu_q, cu_k, is_causal=True, return_lse=True)
    grad = torch.zeros_like(out)
    grad[4, 2, 5] = math.inf
    out.backward(grad, retain_graph=True)
    assert all(torch.isnan(t.grad).all() for t in inputs)
    for t in inputs:
        t.grad = None
    lse.backward(torch.full_like(lse, math.nan))
    assert all(torch.isnan(t.grad).all() for t in inputs[:2])
    # Dense attention too, and its sinks' gradient.
    sinks = torch.zeros(4, requires_grad=True)
    dense = [t.detach().transpose(0, 1)[:, :5].requires_grad_() for t in (q, k, v)]
    out = qkv.scaled_dot_product_attention(*dense, sinks=sinks, enable_gqa=True)
    out.backward(torch.full_like(out, math.nan))
    assert all(torch.isnan(t.grad).all() for t in [*dense, sinks])


def test_there_is_no_double_backward_and_the_error_says_so():
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS)
    q.requires_grad_()
    for call in (lambda: qkv.varlen_attention(q, k, v, cu_q, cu_k),
                 lambda: qkv.scaled_dot_product_attention(q.transpose(0, 1)[:, :5], k.transpose(0, 1)[:, :5],
                                                          v.transpose(0, 1)[:, :5], enable_gqa=True)):
        (grad,) = torch.autograd.grad(call().square().sum(), q, create_graph=True)
        with pytest.raises(RuntimeError, match="qkv's attention backward has no backward of its own"):
            grad.sum().backward()


def flash_attn_reference(q, k, v, cu_q, cu_k, scale, causal, window, softcap, slopes):
    """flash-attn 2.6's varlen forward as its kernel computes it, in float64, sequence by
    sequence (GQA by repeating key/value heads): scaled scores, soft-cap, then its ALiBi
    ``-slope · |j - p|`` (``p`` the query's bottom-right position), the causal mask and the window
    ``p - left ..= p + right``. Returns the output and, where a row sees keys, the logsumexp."""
    out = torch.zeros(q.shape[0], HEADS, D_V, dtype=torch.float64)
    lse = torch.full((HEADS, q.shape[0]), -math.inf, dtype=torch.float64)
    for i in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        qi = q[rows].double().transpose(0, 1)
        ki, vi = (t[keys].double().transpose(0, 1).repeat_interleave(HEADS // KV_HEADS, 0) for t in (k, v))
        s = qi @ ki.transpose(-1, -2) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        n_q, n_k = qi.shape[1], ki.shape[1]
        p = torch.arange(n_q).unsqueeze(-1) + n_k - n_q
        j = torch.arange(n_k)
        if slopes is not None:
            per_head = slopes[i] if slopes.dim() == 2 else slopes
            s = s - per_head.double().reshape(-1, 1, 1) * (j - p).abs()
        visible = torch.ones(n_q, n_k, dtype=torch.bool)
        if causal:
            visible &= j <= p
        left, right = (math.inf if w < 0 else w for w in window)
        visible &= (j >= p - left) & (j <= p + right)
        s = s.masked_fill(~visible, -math.inf)
        row_lse = torch.logsumexp(s, -1)
        weights = torch.nan_to_num(torch.exp(s - row_lse.unsqueeze(-1)), nan=0.0)
        out[rows] = (weights @ vi).transpose(0, 1)
        lse[:, rows] = row_lse
    return out, lse


FLASH_CASES = {
    "plain": {},
    "causal": dict(causal=True, softmax_scale=0.6),
    "alibi, not causal": dict(alibi_slopes=torch.tensor(qkv.alibi_slopes(HEADS))),
    "alibi per sequence, window": dict(window_size=(3, 2), alibi_slopes=torch.rand(len(Q_LENS), HEADS)),
    "causal alibi, window, softcap": dict(causal=True, window_size=(4, -1), softcap=3.0,
                                          alibi_slopes=torch.tensor(qkv.alibi_slopes(HEADS))),
}


@pytest.mark.parametrize("case", FLASH_CASES)
def test_flash_attn_varlen_func_takes_flash_attns_call(case):
    kwargs = FLASH_CASES[case]
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS)
    cu_q, cu_k = (torch.tensor(c, dtype=torch.int32) for c in (cu_q, cu_k))
    out, lse, probs = qkv.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(Q_LENS), max(K_LENS),
                                                 return_attn_probs=True, **kwargs)
    want, want_lse = flash_attn_reference(
        q, k, v, cu_q.tolist(), cu_k.tolist(), kwargs.get("softmax_scale", D_K**-0.5), kwargs.get("causal", False),
        kwargs.get("window_size", (-1, -1)), kwargs.get("softcap", 0.0), kwargs.get("alibi_slopes"),
    )
    assert probs is None
    assert (out - want).abs().max().item() <= 1e-12, case
    if not (kwargs.get("causal") and "alibi_slopes" in kwargs):
        # With causal ALiBi flash-attn adds slope · j: the same weights, another logsumexp.
        seen = torch.isfinite(want_lse)
        assert torch.equal(seen, torch.isfinite(lse))
        assert (lse[seen] - want_lse[seen]).abs().max().item() <= 1e-12, case
    assert torch.equal(qkv.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(Q_LENS), max(K_LENS), **kwargs), out)


def test_flash_attn_varlen_func_says_what_it_does_not_do():
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS)
    call = qkv.flash_attn_varlen_func
    with pytest.raises(ValueError, match="qkv has no dropout"):
        call(q, k, v, cu_q, cu_k, 70, 130, dropout_p=0.1)
    with pytest.raises(ValueError, match="PagedKvCache"):
        call(q, k, v, cu_q, cu_k, 70, 130, block_table=torch.zeros(1, 1, dtype=torch.int32))
    with pytest.raises(ValueError, match="max_seqlen_k is 100, but a sequence of cu_seqlens_k has 130"):
        call(q, k, v, cu_q, cu_k, 70, 100)
    with pytest.raises(ValueError, match=r"alibi_slopes has shape \(2, 4\): it is \(4,\) or \(6, 4\)"):
        call(q, k, v, cu_q, cu_k, 70, 130, alibi_slopes=torch.ones(2, 4))
    with pytest.raises(ValueError, match="max_seqlen_q is nan: it is a whole number"):
        call(q, k, v, cu_q, cu_k, math.nan, 130)
    # Errors name flash-attn's arguments.
    with pytest.raises(ValueError, match=r"^window_size is \(nan, 0\)"):
        call(q, k, v, cu_q, cu_k, 70, 130, window_size=(math.nan, 0))
    with pytest.raises(ValueError, match=r"^softmax_scale is nan"):
        call(q, k, v, cu_q, cu_k, 70, 130, softmax_scale=math.nan)
    with pytest.raises(ValueError, match=r"^window_size is \(2,\): it is \(left, right\)"):
        call(q, k, v, cu_q, cu_k, 70, 130, window_size=(2,))
    # q, k and v by flash-attn's names, shapes as passed; elements by their index in them.
    with pytest.raises(ValueError, match=r"^q and k have widths 8 and 7: they need the same \(q \(86, 4, 8\), "
                       r"k \(150, 2, 7\), v \(150, 2, 6\)\)"):
        call(q, k[..., :7], v, cu_q, cu_k, 70, 130)
    bad = v.clone()
    bad[3, 1, 2] = math.nan
    with pytest.raises(ValueError, match=r"^v\[3, 1, 2\] is NaN"):
        call(q, k, bad, cu_q, cu_k, 70, 130)
    with pytest.raises(ValueError, match=r"^q has dtype int64"):
        call(q.long(), k, v, cu_q, cu_k, 70, 130)
    with pytest.raises(ValueError, match=r"^q, k and v have dtypes float64, float32 and float64: they need one dtype"):
        call(q, k.float(), v, cu_q, cu_k, 70, 130)
    with pytest.raises(ValueError, match=r"^q has 4 heads and k 3: the key/value heads must divide"):
        call(q, k[:, [0, 1, 1]], v[:, [0, 1, 1]], cu_q, cu_k, 70, 130)
    # ALiBi slopes are constants, as flash-attn's: slopes that require grad are refused, not left
    # without one; a list of slopes is named when wrong, through the operator too.
    slopes = torch.ones(HEADS, requires_grad=True)
    with pytest.raises(ValueError, match=r"^alibi_slopes requires grad: ALiBi slopes are constants"):
        qkv.varlen_attention(q.clone().requires_grad_(), k, v, cu_q, cu_k, alibi_slopes=slopes)
    with pytest.raises(ValueError, match=r"^alibi_slopes is \['x', 'x', 'x', 'x'\]: it is one number per query head"):
        qkv.varlen_attention(q.clone().requires_grad_(), k, v, cu_q, cu_k, alibi_slopes=["x"] * 4)
    with pytest.raises(ValueError, match=r"^alibi_slopes requires grad"):
        qkv.scaled_dot_product_attention(q.transpose(0, 1).clone().requires_grad_(), k.transpose(0, 1),
                                         v.transpose(0, 1), enable_gqa=True, alibi_slopes=slopes)
    # max_seqlen as a 0-d tensor, as some callers hold it.
    assert call(q, k, v, cu_q, cu_k, torch.tensor(70), torch.tensor(130)).shape == (86, HEADS, D_V)


def packed_formula(q, k, v, cu_q, cu_k, sinks=None, **kwargs):
    """A packed batch through ``explicit``, sequence by sequence (bottom-right), differentiable:
    ``(out [total_q, heads, D_V], lse [heads, total_q])``."""
    outs, lses = [], []
    for i in range(len(cu_q) - 1):
        rows, keys = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
        out, lse = explicit(
            *(t.transpose(0, 1) for t in (q[rows], k[keys], v[keys])),
            is_causal=kwargs.get("is_causal", False), scale=kwargs.get("scale"), window=kwargs.get("sliding_window"),
            alibi=kwargs.get("alibi_slopes"), softcap=kwargs.get("softcap"), sinks=sinks, bottom_right=True,
        )
        outs.append(out.transpose(0, 1))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, 1)


def packed_gradients(attend, q, k, v, sinks, loss, cast):
    """The gradients of ``q``, ``k``, ``v`` (and ``sinks``) in float64 of a loss of ``attend``'s
    output and logsumexp (``loss`` names which), a row's ``-inf`` logsumexp left out."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(q.shape[0], HEADS, D_V, generator=gen, dtype=torch.float64)
    u = torch.randn(HEADS, q.shape[0], generator=gen, dtype=torch.float64)
    inputs = [cast(t).detach().requires_grad_() for t in (q, k, v)]
    learned = None if sinks is None else cast(torch.tensor(sinks, dtype=torch.float64)).requires_grad_()
    out, lse = attend(*inputs, learned)
    terms = 0
    if "output" in loss:
        terms = terms + (out.double() * w).sum()
    if "logsumexp" in loss:
        terms = terms + (lse.double().masked_fill(torch.isinf(lse), 0) * u).sum()
    terms.backward()
    # Alone, the logsumexp does not depend on the values: autograd leaves their gradient None.
    grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in inputs]
    return [g.double() for g in grads] + ([] if learned is None else [learned.grad.double()])


@pytest.mark.parametrize("loss", ["output", "output and logsumexp", "logsumexp"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-4), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("case", CASES)
def test_a_packed_batch_is_differentiable(case, dtype, tolerance, loss):
    """Gradients of the output and the logsumexp, as autograd's through the float64 formula run
    on each sequence alone; with sinks, a sequence with no keys (whose logsumexp is the sink's
    logit) and one with no queries among them."""
    kwargs = dict(CASES[case])
    sinks = kwargs.pop("sinks", None)
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS)

    def ours(q, k, v, sinks):
        out, lse = qkv.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, sinks=sinks, **kwargs)
        assert out.dtype == dtype
        return out, lse

    got = packed_gradients(ours, q, k, v, sinks, loss, lambda t: t.to(dtype))
    want = packed_gradients(lambda *t: packed_formula(*t[:3], cu_q, cu_k, t[3], **kwargs), q, k, v, sinks, loss,
                            lambda t: t)
    if sinks is not None:
        # A -inf logit is no sink: its gradient is 0 (the formula's is NaN over the rows of the
        # sequence with no keys, whose logsumexp is then -inf too).
        no_sink = torch.isinf(torch.tensor(sinks))
        assert torch.all(got[3][no_sink] == 0) and torch.all(torch.isnan(want[3][no_sink]))
        got[3], want[3] = got[3][~no_sink], want[3][~no_sink]
    for name, g, r in zip(["dq", "dk", "dv", "dsinks"], got, want):
        difference = (g - r).abs().max().item()
        assert difference <= tolerance * max(1.0, r.abs().max().item()), (case, name, difference)


@pytest.mark.parametrize("case", [*FLASH_CASES, "softcap"])
def test_flash_attn_varlen_func_is_differentiable_as_flash_attn_is(case):
    """The output's and ``softmax_lse``'s gradients, as autograd's through flash-attn's kernel
    arithmetic written out in float64 (its ALiBi too; under a causal mask its logsumexp is larger
    by a constant per row, which moves no gradient)."""
    kwargs = dict(causal=True, window_size=(4, -1), softcap=3.0) if case == "softcap" else FLASH_CASES[case]
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS)

    def ours(q, k, v, _):
        out, lse, _ = qkv.flash_attn_varlen_func(q, k, v, torch.tensor(cu_q, dtype=torch.int32), cu_k, max(Q_LENS),
                                                 max(K_LENS), return_attn_probs=True, **kwargs)
        return out, lse

    def theirs(q, k, v, _):
        return flash_attn_reference(
            q, k, v, cu_q, cu_k, kwargs.get("softmax_scale", D_K**-0.5), kwargs.get("causal", False),
            kwargs.get("window_size", (-1, -1)), kwargs.get("softcap", 0.0), kwargs.get("alibi_slopes"),
        )

    got = packed_gradients(ours, q, k, v, None, "output and logsumexp", lambda t: t)
    want = packed_gradients(theirs, q, k, v, None, "output and logsumexp", lambda t: t)
    for name, g, r in zip(["dq", "dk", "dv"], got, want):
        assert (g - r).abs().max().item() <= 1e-10 * max(1.0, r.abs().max().item()), (case, name)


def test_a_packed_batch_trains_under_torch_compile():
    """A packed batch inside a compiled module: the operator is opaque, its backward the engine's;
    the same output and parameter gradients as eager SDPA run per sequence."""
    lens = [5, 1, 9, 2]
    cu = np.cumsum([0] + lens).tolist()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 3 * HEADS * D_K)

        def forward(self, x, attend):
            q, k, v = self.proj(x).view(x.shape[0], 3, HEADS, D_K).unbind(1)
            return attend(q, k, v)

    def per_sequence(q, k, v):
        outs = [F.scaled_dot_product_attention(*(t[cu[i]:cu[i + 1]].transpose(0, 1) for t in (q, k, v)),
                                               is_causal=True).transpose(0, 1) for i in range(len(lens))]
        return torch.cat(outs)

    torch.manual_seed(0)
    block, x = Block(), torch.randn(sum(lens), 16)
    eager = block(x, per_sequence)
    eager.square().sum().backward()
    want = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x, lambda q, k, v: qkv.varlen_attention(q, k, v, cu, cu, is_causal=True))
    assert (out - eager).abs().max().item() < 1e-5
    out.square().sum().backward()
    for got, p in zip(want, block.parameters()):
        assert (got - p.grad).abs().max().item() < 1e-4


def test_the_packed_operators_pass_torch_library_opcheck():
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS)
    sinks = torch.tensor([0.5, -1.0, 2.0, -math.inf], dtype=torch.float64)
    cu_q, cu_k = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k)
    slopes = torch.tensor(qkv.alibi_slopes(HEADS))
    args = (q.requires_grad_(), k, v, cu_q, cu_k, True, None, [4, 0], slopes, 1, False, None, sinks)
    torch.library.opcheck(torch.ops.qkv.varlen_attention.default, args)
    out, lse = torch.ops.qkv.varlen_attention(*args)
    plain = [t.detach() for t in (q, k, v, out, lse)]
    backward_args = (torch.ones_like(out), *plain, *args[3:12], sinks, None)
    torch.library.opcheck(torch.ops.qkv.varlen_attention_backward.default, backward_args)
    torch.library.opcheck(torch.ops.qkv.varlen_attention_backward.default, (*backward_args[:-1], torch.ones_like(lse)))


def test_the_backward_takes_the_forwards_layout_whatever_the_offsets_buffer_holds_later():
    q, k, v, cu_q, cu_k = packed(Q_LENS, K_LENS)
    cu_q, cu_k = torch.tensor(cu_q, dtype=torch.int32), torch.tensor(cu_k, dtype=torch.int32)
    inputs = [t.requires_grad_() for t in (q, k, v)]
    qkv.varlen_attention(*inputs, cu_q, cu_k, is_causal=True).square().sum().backward()
    want = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    out = qkv.varlen_attention(*inputs, cu_q, cu_k, is_causal=True)
    # The next batch's offsets written into the same buffers before the backward.
    cu_q.copy_(torch.tensor([0, 1, 2, 3, 4, 5, 86])), cu_k.copy_(torch.tensor([0, 1, 2, 3, 4, 5, 150]))
    out.square().sum().backward()
    assert all(torch.equal(t.grad, w) for t, w in zip(inputs, want))


def test_packed_calls_compile_with_offsets_as_tensors():
    """flash-attn's callers hold cu_seqlens as int32 tensors: under torch.compile(fullgraph=True)
    the operator reads them only when it runs, so one graph serves packed batches of any layout
    (as many sequences as they like), its ALiBi slopes a tensor too; forward and backward as eager."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    slopes = torch.tensor(qkv.alibi_slopes(HEADS))

    def step(q, k, v, cu_q, cu_k, longest):
        out, lse, _ = qkv.flash_attn_varlen_func(q, k, v, cu_q, cu_k, longest, longest, causal=True,
                                                 alibi_slopes=slopes, return_attn_probs=True)
        return out.square().sum() + lse.sum()

    compiled = torch.compile(step, fullgraph=True)
    layouts = ([3, 1, 7], [5, 9], [1, 2, 3, 4, 5], [20], [4] * 11, [2, 30, 1])
    for lens in layouts:
        q, k, v, cu, _ = packed(lens, lens)
        cu = torch.tensor(cu, dtype=torch.int32)
        grads = []
        for run in (step, compiled):
            inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
            # flash-attn's callers pass the batch's longest length, which changes every step.
            run(*inputs, cu, cu, max(lens)).backward()
            grads.append([t.grad for t in inputs])
        for got, want in zip(*grads):
            assert (got - want).abs().max().item() <= 1e-10, lens
    # A graph for the first layout and one with its sizes symbolic, not one per layout.
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs < len(layouts) // 2, graphs
