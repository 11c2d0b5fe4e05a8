"""qkv.scaled_dot_product_attention against PyTorch's SDPA in float64, on torch tensors and NumPy
arrays, over random shapes (the awkward ones included) and every bad input."""

import math
import random
import threading
import time
import tracemalloc

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TOLERANCE, assert_close, reference

import qkv

DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


def random_case(seed):
    """A random problem: 0 to 3 leading dimensions, GQA or not, n from 1, d_k != d_v, a mask of a
    random broadcast shape (bool or additive, some rows wholly hidden) or is_causal, a scale."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    batch = tuple(rng.randint(1, 3) for _ in range(rng.randint(0, 2)))
    leading = rng.randint(0, 1) if not batch else 1
    kv_heads = rng.randint(1, 3)
    group = rng.choice([1, 1, 2, 3]) if leading else 1
    heads = kv_heads * group
    n_q, n_k = rng.choice([1, rng.randint(1, 40)]), rng.choice([1, rng.randint(1, 70)])
    d_k, d_v = rng.randint(1, 20), rng.randint(1, 20)
    lead_q = batch + ((heads,) if leading else ())
    lead_k = batch + ((kv_heads,) if leading else ())
    query = torch.randn(lead_q + (n_q, d_k), generator=gen, dtype=torch.float64)
    key = torch.randn(lead_k + (n_k, d_k), generator=gen, dtype=torch.float64)
    value = torch.randn(lead_k + (n_k, d_v), generator=gen, dtype=torch.float64)
    kwargs = {"enable_gqa": group > 1}
    if rng.random() < 0.5:
        kwargs["scale"] = rng.uniform(0.05, 1.0)
    choice = rng.choice(["none", "causal", "bool", "additive"])
    if choice == "causal":
        kwargs["is_causal"] = True
    elif choice != "none":
        scores = lead_q + (n_q, n_k)
        # Broadcast: drop some leading axes, and make any axis 1.
        shape = [1 if rng.random() < 0.3 else s for s in scores[rng.randint(0, len(scores) - 2):]]
        if choice == "bool":
            mask = torch.rand(shape, generator=gen) > 0.3
            if shape[-2] > 1:
                mask[..., 0, :] = False  # a row that sees no key
        else:
            mask = torch.randn(shape, generator=gen, dtype=torch.float64)
            mask[torch.rand(shape, generator=gen) < 0.2] = -math.inf
        kwargs["attn_mask"] = mask
    return query, key, value, kwargs


def cast(kwargs, dtype):
    mask = kwargs.get("attn_mask")
    if mask is not None and mask.dtype != torch.bool:
        return {**kwargs, "attn_mask": mask.to(dtype)}
    return kwargs


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("dtype", DTYPES)
def test_random_shapes_match_pytorch_float64(seed, dtype):
    query, key, value, kwargs = random_case(seed)
    inputs = [t.to(dtype) for t in (query, key, value)]
    kwargs = cast(kwargs, dtype)
    got = qkv.scaled_dot_product_attention(*inputs, **kwargs)
    assert got.dtype == dtype
    want = reference(*inputs, **kwargs)
    # A row that sees no key is 0 in qkv; PyTorch's float64 agrees in this version.
    assert_close(got, torch.nan_to_num(want, nan=0.0), dtype, f"seed {seed}")


@pytest.mark.parametrize("seed", range(40))
def test_float32_is_as_accurate_as_pytorch_float32(seed):
    query, key, value, kwargs = random_case(seed)
    inputs = [t.float() for t in (query, key, value)]
    kwargs = cast(kwargs, torch.float32)
    want = reference(*inputs, **kwargs)
    ours = (qkv.scaled_dot_product_attention(*inputs, **kwargs).double() - want).abs().max().item()
    theirs = (F.scaled_dot_product_attention(*inputs, **kwargs).double() - want).abs().max().item()
    assert ours <= max(4 * theirs, 1e-6), (ours, theirs)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_numpy_arrays_match_pytorch_float64(seed, dtype):
    query, key, value, kwargs = random_case(seed)
    arrays = [t.numpy().astype(dtype) for t in (query, key, value)]
    mask = kwargs.get("attn_mask")
    if mask is not None:
        kwargs = {**kwargs, "attn_mask": mask.numpy() if mask.dtype == torch.bool else mask.numpy().astype(dtype)}
    got = qkv.scaled_dot_product_attention(*arrays, **kwargs)
    assert isinstance(got, np.ndarray) and got.dtype == dtype
    torch_kwargs = {k: torch.from_numpy(np.asarray(v)) if k == "attn_mask" else v for k, v in kwargs.items()}
    want = reference(*(torch.from_numpy(a) for a in arrays), **torch_kwargs)
    assert_close(torch.from_numpy(got.astype(np.float64)), want, torch.from_numpy(arrays[0]).dtype)


def test_strided_inputs_are_read_in_place():
    # [batch, n, heads, d] as a projection writes it, viewed as [batch, heads, n, d]; a reversed
    # NumPy view too.
    x = torch.randn(2, 7, 3, 8, dtype=torch.float64).transpose(1, 2)
    assert_close(qkv.scaled_dot_product_attention(x, x, x), reference(x, x, x), torch.float64)
    a = np.random.default_rng(0).standard_normal((3, 5, 4))[:, ::-1]
    got = qkv.scaled_dot_product_attention(a, a, a)
    t = torch.from_numpy(a.copy())
    assert_close(torch.from_numpy(got), reference(t, t, t), torch.float64)


def test_inputs_whose_memory_is_not_their_values_are_read_as_their_values():
    """NumPy arrays with negative strides (read from a copy, which must live through the call)
    and torch tensors with the lazy negation bit (a complex tensor's conjugate's imaginary part),
    on the direct path and the full one (a mask), each input separately."""
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal((2, 3, 6, 4))[:, :, ::-1] for _ in range(3)]
    mask = (rng.standard_normal((6, 6)) > -1)[::-1, ::-1]
    for kwargs in ({}, {"attn_mask": mask}):
        got = qkv.scaled_dot_product_attention(*arrays, **kwargs)
        torch_kwargs = {k: torch.from_numpy(m.copy()) for k, m in kwargs.items()}
        want = reference(*(torch.from_numpy(a.copy()) for a in arrays), **torch_kwargs)
        assert_close(torch.from_numpy(got), want, torch.float64)
    negated = [torch.randn(2, 3, 6, 4, dtype=torch.complex128).conj().imag for _ in range(3)]
    assert all(t.is_neg() for t in negated)
    plain = [t.clone().resolve_neg() for t in negated]
    mask = torch.from_numpy(mask.copy())
    for kwargs in ({}, {"is_causal": True}, {"attn_mask": mask}):
        for i in range(3):
            inputs = [negated[j] if j == i else plain[j] for j in range(3)]
            got = qkv.scaled_dot_product_attention(*inputs, **kwargs)
            assert_close(got, reference(*plain, **kwargs), torch.float64)
    # A gradient coming back lazily negated, into the dense and the packed backward.
    packed = [t[0].transpose(0, 1).contiguous().requires_grad_() for t in plain]
    grad = torch.randn(2, 3, 6, 4, dtype=torch.complex128).conj().imag
    for attend, inputs, grad in (
        (qkv.scaled_dot_product_attention, [t.detach().requires_grad_() for t in plain], grad),
        (lambda q, k, v: qkv.varlen_attention(q, k, v, [0, 2, 6], [0, 2, 6]), packed, grad[0].transpose(0, 1)),
    ):
        attend(*inputs).backward(grad)
        got = [t.grad for t in inputs]
        for t in inputs:
            t.grad = None
        attend(*inputs).backward(grad.resolve_neg())
        assert all(torch.equal(g, t.grad) for g, t in zip(got, inputs))


def test_contiguous_numpy_inputs_are_not_copied():
    # NumPy's allocations are traced: a call may allocate its output, not copies of the inputs.
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((4, 2048, 64), dtype=np.float32) for _ in range(3))
    qkv.scaled_dot_product_attention(q, k, v)  # warm
    tracemalloc.start()
    out = qkv.scaled_dot_product_attention(q, k, v)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < out.nbytes + (1 << 16), (peak, q.nbytes)


def test_the_gil_is_released_while_the_engine_runs():
    q = torch.randn(1, 4096, 64)
    qkv.scaled_dot_product_attention(q, q, q)
    ticks, running = [0], [True]

    def count():
        while running[0]:
            ticks[0] += 1
            time.sleep(0.0005)

    thread = threading.Thread(target=count)
    thread.start()
    time.sleep(0.01)
    before = ticks[0]
    start = time.perf_counter()
    for _ in range(3):
        qkv.scaled_dot_product_attention(q, q, q, is_causal=False)
    elapsed = time.perf_counter() - start
    during = ticks[0] - before
    running[0] = False
    thread.join()
    # Holding the GIL for the call would leave the counter where it was.
    assert elapsed > 0.02 and during >= 5, (elapsed, during)


def test_a_fully_masked_row_is_zero():
    q, k, v = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out = qkv.scaled_dot_product_attention(q, k, v, mask)
    assert torch.equal(out[1], torch.zeros(2))
    additive = torch.zeros(3, 5)
    additive[2] = -math.inf
    assert torch.equal(qkv.scaled_dot_product_attention(q, k, v, additive)[2], torch.zeros(2))


def test_no_keys_gives_zero_and_no_queries_an_empty_output():
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 0, 4), torch.randn(2, 0, 5)
    assert torch.equal(qkv.scaled_dot_product_attention(q, k, v), torch.zeros(2, 3, 5))
    assert qkv.scaled_dot_product_attention(q[:, :0], q, q).shape == (2, 0, 4)


def bad(call, match, error=ValueError):
    with pytest.raises(error, match=match):
        call()


def test_bad_inputs_raise_errors_naming_them():
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 3)
    sdpa = qkv.scaled_dot_product_attention
    bad(lambda: sdpa(q, k, v, dropout_p=0.1), "dropout_p is 0.1")
    bad(lambda: sdpa(q, k.double(), v), "dtypes float32, float64")
    bad(lambda: sdpa(q.int(), k.int(), v.int()), "query has dtype int32")
    bad(lambda: sdpa(q, k[..., :7], v), "widths 8 and 7")
    bad(lambda: sdpa(q, k, v[..., :5, :]), "key and value need the same shape")
    bad(lambda: sdpa(q, k[0], v[0]), "same number of dimensions")
    bad(lambda: sdpa(q, k[:1], v[:1]), "same batch dimensions")
    bad(lambda: sdpa(q, k[:, :3], v[:, :3]), "enable_gqa=True")
    bad(lambda: sdpa(q, k[:, :3], v[:, :3], enable_gqa=True), r"4 query heads.*3 key/value heads|query heads \(4\).*key/value heads \(3\)")
    bad(lambda: sdpa(q[0, 0, 0], k[0, 0, 0], v[0, 0, 0]), "at least")
    bad(lambda: sdpa(q, k, v, torch.ones(5, 7, dtype=torch.bool)), r"does not broadcast to the scores' shape")
    bad(lambda: sdpa(q, k, v, torch.ones(5, 6, dtype=torch.int32)), "attn_mask has dtype int32")
    bad(lambda: sdpa(q, k, v, torch.ones(5, 6).double()), "attn_mask has dtype float64")
    bad(lambda: sdpa(q, k, v, torch.ones(5, 6, dtype=torch.bool), is_causal=True), "both set")
    bad(lambda: sdpa(q, k, v, scale=math.inf), "scale is inf")
    bad(lambda: sdpa(q, k, v, sliding_window=(1, 2, 3)), "sliding_window")
    bad(lambda: sdpa(q, k, v, alibi_slopes=[0.5]), "1 slopes for 4 query heads")
    bad(lambda: sdpa(q.numpy(), k, v), "mixed tensor types", TypeError)
    bad(lambda: sdpa([[1.0]], [[1.0]], [[1.0]]), "torch tensors or NumPy arrays", TypeError)
    # The engine's own checks, with its messages.
    nan_keys = k.clone()
    nan_keys[1, 2, 3, 4] = math.nan
    bad(lambda: sdpa(q, nan_keys, v), r"keys\[1, 2, 3, 4\] is NaN: attention needs finite inputs")
    # Named as passed (the engine calls them logit_softcap and bias).
    bad(lambda: sdpa(q, k, v, softcap=-1.0), r"^softcap is -1: the cap must be finite and positive")
    # A scale float32 rounds to 0 would make every weight equal without a word.
    bad(lambda: sdpa(q, k, v, scale=1e-300), r"^scale is 1e-300: float32, the type these inputs compute in, rounds it to 0")
    # flash-attn spells no cap 0.0: the message says how qkv spells it.
    bad(lambda: sdpa(q, k, v, softcap=0.0), r"^softcap is 0: .*pass softcap=None for no cap")
    bad(lambda: sdpa(q[..., :0], k[..., :0], v), "is empty")
    bad(lambda: sdpa(q, k, v[..., :0]), "is empty")
    bias = torch.zeros(5, 6)
    bias[0, 0] = math.nan
    bad(lambda: sdpa(q, k, v, bias), r"^attn_mask\[0, 0, 0, 0\] is NaN")


def test_hidden_keys_may_hold_anything():
    # A key no query sees is never read, so NaN there is no error (inference caches' padding).
    q, k, v = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 2)
    k[4], v[4] = math.nan, math.nan
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[:, 4] = False
    want = reference(q, k[:4], v[:4])
    assert_close(qkv.scaled_dot_product_attention(q, k, v, mask), want, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_the_direct_call_reads_the_tensors_as_the_full_path_does(dtype):
    """The common call is read by the extension itself (``forward_torch``); every other call by
    ``_core.Call``. Both must give the same bits, GQA, causal and scale included."""
    from qkv import _core

    torch.manual_seed(3)
    q = torch.randn(2, 4, 5, 8).to(dtype)
    k = torch.randn(2, 2, 7, 8).to(dtype)
    v = torch.randn(2, 2, 7, 3).to(dtype)
    # A view with strides of its own: every fourth query row of a larger tensor.
    strided = torch.randn(2, 4, 20, 8).to(dtype)[:, :, ::4]
    for query, kwargs in ((q, {}), (q, {"is_causal": True}), (strided, {"scale": 0.3}), (q[1], {"keys": 1})):
        # Three dimensions too: [heads, n, d], a batch of one.
        key, value = (k[1], v[1]) if kwargs.pop("keys", None) else (k, v)
        direct = qkv.scaled_dot_product_attention(query, key, value, enable_gqa=True, **kwargs)
        full = _core.Call(query, key, value, None, kwargs.get("is_causal", False), kwargs.get("scale"), True)
        assert direct.dtype == dtype and direct.shape == query.shape[:-1] + (3,)
        assert torch.equal(direct, full.forward(False))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_direct_call_reads_masks_as_the_full_path_does(dtype):
    """A boolean mask, or an additive one in the dtype the engine computes in, is read by the
    extension as it is (``forward_torch``), broadcast by strides of 0; any other mask by
    ``_core.Call``, which casts it. Both must give the same bits, forward and backward (the mask
    constant), and the same errors."""
    from qkv import _core

    torch.manual_seed(4)
    q = torch.randn(2, 4, 5, 8).to(dtype)
    k = torch.randn(2, 2, 7, 8).to(dtype)
    v = torch.randn(2, 2, 7, 3).to(dtype)
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    keep = torch.rand(2, 4, 5, 7) > 0.3
    keep[0, 1, 2] = False  # a row that sees no key
    additive = torch.randn(2, 4, 5, 7).to(compute)
    masks = [keep, keep[1], keep[0, 0], keep[0, 0, 0], keep[:, :1], keep[:1, :, :1], keep[..., :1].expand(2, 4, 5, 7),
             keep.transpose(-1, -2).contiguous().transpose(-1, -2), additive, additive[:, 2:3, :, :],
             additive.masked_fill(~keep, -math.inf), additive.to(dtype), additive.float()]
    for mask in masks:
        for query, key, value in ((q, k, v), (q[1], k[1], v[1])):
            if mask.dim() > query.dim():
                continue
            direct = qkv.scaled_dot_product_attention(query, key, value, mask, enable_gqa=True)
            call = _core.Call(query, key, value, mask, False, None, True)
            assert torch.equal(direct, call.forward(False)), (tuple(mask.shape), mask.dtype, query.dim())
            direct_path = mask.dtype in (torch.bool, compute)
            assert (_core.fast_forward(query, key, value, mask, False, None, True, False) is not None) == direct_path
            if dtype == torch.bfloat16:
                continue
            out, lse = call.forward(True)
            grad = torch.randn(out.shape, dtype=dtype)
            fast = _core.fast_backward(grad, query, key, value, out, lse, mask, False, None, True)
            assert (fast is not None) == direct_path
            if fast is not None:
                full = call.backward(out, lse, grad, False)[:3]
                # Call's gradients are [batch, heads, n, d], the caller's shape for 4-D inputs.
                assert all(torch.equal(a, b.reshape(a.shape)) for a, b in zip(fast, full))
    # The engine's errors name the mask as the caller passed it.
    bad = additive.clone()
    bad[1, 0, 3, 4] = math.nan
    with pytest.raises(ValueError, match=r"attn_mask\[1, 0, 3, 4\]"):
        qkv.scaled_dot_product_attention(q, k, v, bad, enable_gqa=True)
    with pytest.raises(ValueError, match="does not broadcast"):
        qkv.scaled_dot_product_attention(q, k, v, keep[..., :6], enable_gqa=True)
    with pytest.raises(ValueError, match="is_causal"):
        qkv.scaled_dot_product_attention(q, k, v, keep, is_causal=True, enable_gqa=True)


def test_calls_the_direct_path_declines_get_the_full_paths_answer():
    k = torch.randn(1, 2, 7, 8)
    with pytest.raises(ValueError, match="enable_gqa"):
        qkv.scaled_dot_product_attention(torch.randn(1, 4, 5, 8), k, k)
    with pytest.raises(ValueError, match="dtype"):
        qkv.scaled_dot_product_attention(torch.randn(1, 2, 5, 8).double(), k, k)
    with pytest.raises(ValueError, match="bool"):
        qkv.scaled_dot_product_attention(torch.ones(1, 2, 5, 8, dtype=torch.bool), k, k)
    with pytest.raises(ValueError, match="scale"):
        qkv.scaled_dot_product_attention(torch.randn(1, 2, 5, 8), k, k, scale=float("nan"))
    # Two dimensions, and ranks that differ: the full path, as PyTorch takes them.
    two = qkv.scaled_dot_product_attention(torch.randn(5, 8), torch.randn(7, 8), torch.randn(7, 3))
    assert two.shape == (5, 3)
    with pytest.raises(ValueError, match="the same number of dimensions"):
        qkv.scaled_dot_product_attention(torch.randn(2, 5, 8), k, k)


def test_the_package_says_its_version():
    import importlib.metadata

    assert qkv.__version__ == importlib.metadata.version("qkv")
