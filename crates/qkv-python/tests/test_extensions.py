"""qkv's extensions to PyTorch's signature (sliding windows, ALiBi, soft-capping), the logsumexp
and the merge, against attention written out in float64."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TOLERANCE, assert_close, explicit

import qkv


def qkv_inputs(shape_q, shape_k, d_v, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=gen, dtype=torch.float64).to(dtype)
    k = torch.randn(shape_k, generator=gen, dtype=torch.float64).to(dtype)
    v = torch.randn(shape_k[:-1] + (d_v,), generator=gen, dtype=torch.float64).to(dtype)
    return q, k, v


def test_the_explicit_reference_is_pytorchs_sdpa():
    q, k, v = qkv_inputs((2, 3, 5, 4), (2, 3, 7, 4), 6)
    out, lse = explicit(q, k, v, is_causal=True, scale=0.7)
    assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.7), torch.float64)


CASES = {
    "window": dict(sliding_window=(2, 1)),
    "causal window": dict(is_causal=True, sliding_window=(3, 0)),
    "one-sided window": dict(sliding_window=(None, 0)),
    "alibi": dict(alibi_slopes=qkv.alibi_slopes(4)),
    "causal alibi": dict(is_causal=True, alibi_slopes=qkv.alibi_slopes(4)),
    "softcap": dict(softcap=0.8, scale=2.0),
    "everything": dict(is_causal=True, sliding_window=(4, 0), alibi_slopes=[0.3, 0.1, 0.2, 0.05], softcap=5.0),
    # A large logit, a small one, 0, and -inf (no sink for that head).
    "sinks": dict(sinks=[4.0, -3.0, 0.0, -math.inf]),
    "causal window, sinks": dict(is_causal=True, sliding_window=(2, 0), sinks=[0.5, 2.0, -1.0, 1.0]),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("n_q, n_k", [(9, 9), (1, 6), (5, 11), (12, 4)])
def test_extensions_match_the_float64_formula(case, dtype, n_q, n_k):
    kwargs = CASES[case]
    q, k, v = qkv_inputs((2, 4, n_q, 8), (2, 2, n_k, 8), 5, dtype)
    out, lse = qkv.attention_with_lse(q, k, v, enable_gqa=True, **kwargs)
    want_out, want_lse = explicit(
        q, k, v, is_causal=kwargs.get("is_causal", False), scale=kwargs.get("scale"),
        window=kwargs.get("sliding_window"), alibi=kwargs.get("alibi_slopes"), softcap=kwargs.get("softcap"),
        sinks=kwargs.get("sinks"),
    )
    assert_close(out, want_out, dtype, case)
    assert lse.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    hidden = torch.isinf(want_lse)
    assert torch.equal(torch.isinf(lse), hidden)
    assert_close(lse.masked_fill(hidden, 0), want_lse.masked_fill(hidden, 0), dtype, f"{case} lse")


@pytest.mark.parametrize("loss", ["output and logsumexp", "logsumexp alone"])
@pytest.mark.parametrize("dtype, tolerance", [(torch.float64, 1e-10), (torch.float32, 1e-4)])
@pytest.mark.parametrize("case", CASES)
def test_the_logsumexp_is_differentiable(case, dtype, tolerance, loss):
    """A loss of the logsumexp (a z-loss, or a merge of parts written in torch) gets its gradient:
    the same as autograd's through the float64 formula."""
    kwargs = CASES[case]
    q, k, v = qkv_inputs((2, 4, 5, 8), (2, 2, 11, 8), 5)
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(2, 4, 5, 5, generator=gen, dtype=torch.float64)
    u = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64)

    def gradients(attend, cast):
        inputs = [cast(t).detach().requires_grad_() for t in (q, k, v)]
        sinks = kwargs.get("sinks")
        sinks = None if sinks is None else cast(torch.tensor(sinks, dtype=torch.float64)).detach().requires_grad_()
        out, lse = attend(*inputs, {**kwargs, "sinks": sinks})
        terms = (lse.double() * u).sum()
        if loss == "output and logsumexp":
            terms = terms + (out.double() * w).sum()
        terms.backward()
        # Alone, the logsumexp does not depend on the values: autograd leaves their gradient None.
        grads = [torch.zeros_like(t) if t.grad is None else t.grad for t in inputs]
        return [g.double() for g in grads] + ([] if sinks is None else [sinks.grad.double()])

    def formula(q, k, v, options):
        return explicit(
            q, k, v, is_causal=options.get("is_causal", False), scale=options.get("scale"),
            window=options.get("sliding_window"), alibi=options.get("alibi_slopes"), softcap=options.get("softcap"),
            sinks=options["sinks"],
        )

    got = gradients(lambda q, k, v, o: qkv.attention_with_lse(q, k, v, enable_gqa=True, **o), lambda t: t.to(dtype))
    want = gradients(formula, lambda t: t)
    for name, g, r in zip(["dq", "dk", "dv", "dsinks"], got, want):
        difference = (g - r).abs().max().item()
        assert difference <= tolerance * max(1.0, r.abs().max().item()), (case, name, difference)


def test_a_row_that_sees_no_key_takes_no_gradient_through_its_logsumexp():
    # A window of the query's own position only: queries 3 to 6 see no key (lse -inf), and
    # lse² sends them a gradient of -inf, which reaches no weight.
    q, k, v = qkv_inputs((2, 4, 7, 8), (2, 2, 3, 8), 5)
    mine = [t.clone().requires_grad_() for t in (q, k, v)]
    _, lse = qkv.attention_with_lse(*mine, enable_gqa=True, sliding_window=(0, 0))
    (lse**2).sum().backward()
    ref = [t.clone().requires_grad_() for t in (q, k, v)]
    _, want = explicit(*ref, window=(0, 0))
    hidden = torch.isinf(want)
    assert hidden[..., 3:].all() and not hidden[..., :3].any()
    (want.masked_fill(hidden, 0) ** 2).sum().backward()
    for name, a, b in zip("qk", mine, ref):
        assert (a.grad - b.grad).abs().max().item() <= 1e-10, name
    # A gradient that is not finite where a row sees keys (an overflow, which a GradScaler looks
    # for) gives gradients of NaN, as autograd's own would.
    q2, k2 = q.clone().requires_grad_(), k.clone().requires_grad_()
    _, lse = qkv.attention_with_lse(q2, k2, v, enable_gqa=True)
    (lse * math.nan).sum().backward()
    assert torch.isnan(q2.grad).all() and torch.isnan(k2.grad).all()


def test_alibi_slopes_are_the_papers():
    assert qkv.alibi_slopes(4) == [0.25, 0.0625, 0.015625, 0.00390625]
    assert len(qkv.alibi_slopes(12)) == 12


@pytest.mark.parametrize("library", ["torch", "numpy"])
@pytest.mark.parametrize("split", [1, 5, 12])
def test_merging_two_halves_of_the_keys_is_attention_over_all(library, split):
    q, k, v = qkv_inputs((3, 4, 6), (3, 13, 6), 5)
    if library == "numpy":
        q, k, v = (t.numpy() for t in (q, k, v))
    first = qkv.attention_with_lse(q, k[:, :split], v[:, :split])
    second = qkv.attention_with_lse(q, k[:, split:], v[:, split:])
    out, lse = qkv.merge(*first, *second)
    full_out, full_lse = qkv.attention_with_lse(q, k, v)
    assert_close(torch.as_tensor(out), torch.as_tensor(full_out).double(), torch.float64)
    assert_close(torch.as_tensor(lse), torch.as_tensor(full_lse).double(), torch.float64)


def test_merging_with_a_part_that_sees_nothing_keeps_the_other():
    q, k, v = qkv_inputs((2, 4), (3, 4), 2)
    part = qkv.attention_with_lse(q, k, v)
    empty = qkv.attention_with_lse(q, k, v, torch.zeros(2, 3, dtype=torch.bool))
    assert torch.isinf(empty[1]).all() and torch.equal(empty[0], torch.zeros(2, 2, dtype=torch.float64))
    out, lse = qkv.merge(*empty, *part)
    assert torch.equal(out, part[0]) and torch.equal(lse, part[1])


def test_merge_of_bfloat16_outputs_keeps_their_dtype():
    q, k, v = qkv_inputs((2, 4), (6, 4), 2, torch.bfloat16)
    a, b = qkv.attention_with_lse(q, k[:3], v[:3]), qkv.attention_with_lse(q, k[3:], v[3:])
    out, lse = qkv.merge(*a, *b)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert_close(out, explicit(q, k, v)[0], torch.bfloat16)


def test_bad_merges_raise_the_engines_errors():
    q, k, v = qkv_inputs((2, 4), (3, 4), 2)
    out, lse = qkv.attention_with_lse(q, k, v)
    with pytest.raises(ValueError, match="same shape"):
        qkv.merge(out, lse, out[:1], lse[:1])
    with pytest.raises(ValueError, match="logsumexp"):
        qkv.merge(out, lse, out, torch.full_like(lse, math.nan))
    with pytest.raises(ValueError, match="output"):
        qkv.merge(out, lse, torch.full_like(out, math.inf), lse)


def test_simd_report_names_a_level():
    report = qkv.simd_report()
    assert report.split()[0] in ("baseline", "avx2", "avx512", "avx512bf16", "amx"), report


def test_numpy_extensions_agree_with_torch():
    q, k, v = qkv_inputs((4, 7, 8), (4, 9, 8), 3)
    kwargs = dict(is_causal=True, sliding_window=(2, 0), softcap=3.0, alibi_slopes=qkv.alibi_slopes(4))
    from_numpy = qkv.scaled_dot_product_attention(q.numpy(), k.numpy(), v.numpy(), **kwargs)
    assert isinstance(from_numpy, np.ndarray)
    assert_close(torch.from_numpy(from_numpy), qkv.scaled_dot_product_attention(q, k, v, **kwargs), torch.float64)


@pytest.mark.parametrize("library", ["torch", "numpy"])
def test_a_sink_takes_the_weight_of_a_row_that_sees_nothing(library):
    q, k, v = qkv_inputs((2, 3, 4), (2, 5, 4), 3)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1] = False
    sinks = [1.5, -2.0]
    if library == "numpy":
        q, k, v, keep = (t.numpy() for t in (q, k, v, keep))
        sinks = np.array(sinks)
    out, lse = qkv.attention_with_lse(q, k, v, keep, sinks=sinks)
    out, lse = torch.as_tensor(out), torch.as_tensor(lse)
    # The hidden row: output 0, logsumexp the sink's logit alone.
    assert torch.equal(out[:, 1], torch.zeros(2, 3, dtype=torch.float64))
    assert lse[:, 1].tolist() == [1.5, -2.0]
    want_out, want_lse = explicit(*(torch.as_tensor(t) for t in (q, k, v)), keep=torch.as_tensor(keep), sinks=sinks)
    assert_close(out, want_out, torch.float64)
    assert_close(lse, want_lse, torch.float64)


def test_sinks_shift_the_weights_as_one_more_key_of_zero_value_would():
    # Independent of the formula above: a sink s is a key whose score is s for every query and
    # whose value is 0. With a scale of 1 and a query of ones, a key of s / d scores exactly s.
    q, k, v = qkv_inputs((1, 6, 4), (1, 7, 4), 5)
    q = torch.ones_like(q)
    sink = 0.75
    extra_key = torch.full((1, 1, 4), sink / 4, dtype=torch.float64)
    want = F.scaled_dot_product_attention(
        q, torch.cat([k, extra_key], 1), torch.cat([v, torch.zeros(1, 1, 5, dtype=torch.float64)], 1), scale=1.0
    )
    got = qkv.scaled_dot_product_attention(q, k, v, scale=1.0, sinks=[sink])
    assert_close(got, want, torch.float64)


def test_bad_sinks_raise_errors_that_name_them():
    q, k, v = qkv_inputs((2, 3, 4), (2, 5, 4), 3)
    with pytest.raises(ValueError, match=r"sinks has 3 logits for 2 query heads"):
        qkv.scaled_dot_product_attention(q, k, v, sinks=[0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"sinks has shape \(2, 1\)"):
        qkv.scaled_dot_product_attention(q, k, v, sinks=torch.zeros(2, 1))
    with pytest.raises(ValueError, match="sink"):
        qkv.scaled_dot_product_attention(q, k, v, sinks=[0.0, math.nan])
    with pytest.raises(ValueError, match="sink"):
        qkv.scaled_dot_product_attention(q, k, v, sinks=[math.inf, 0.0])
    with pytest.raises(ValueError, match="sinks is 'ab': it is one number per query head"):
        qkv.scaled_dot_product_attention(q, k, v, sinks="ab")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("option", ["sinks", "alibi_slopes", "scale", "softcap"])
def test_options_past_the_compute_types_range_raise_errors_that_name_them(option, dtype):
    # float32 (bf16's compute type too) holds at most 3.4e38: 1e39 would become infinity.
    q, k, v = qkv_inputs((2, 3, 4), (2, 5, 4), 3, dtype)
    per_head = option in ("sinks", "alibi_slopes")
    value, name = ([0.5, 1e39], f"{option}\\[1\\]") if per_head else (1e39, option)
    message = rf"^{name} is 1e39: float32, the type these inputs compute in, holds at most 3.4028234663852886e38$"
    with pytest.raises(ValueError, match=message):
        qkv.scaled_dot_product_attention(q, k, v, **{option: value})
    cu = [0, 3]
    with pytest.raises(ValueError, match=message):
        qkv.varlen_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), cu, [0, 5], **{option: value})
    # float64 holds it.
    q, k, v = qkv_inputs((2, 3, 4), (2, 5, 4), 3)
    assert torch.isfinite(qkv.scaled_dot_product_attention(q, k, v, **{option: value})).all()


@pytest.mark.parametrize("window", [(2**63, 0), (0, 2**64), (1.5, 0), (math.nan, 0), ("2", 0)])
def test_windows_no_64_bit_integer_holds_raise_value_errors(window):
    q, k, v = qkv_inputs((2, 3, 4), (2, 5, 4), 3)
    with pytest.raises(ValueError, match=r"sliding_window is .*whole numbers below 2\*\*63"):
        qkv.scaled_dot_product_attention(q, k, v, sliding_window=window)


def test_the_widest_window_is_no_window():
    q, k, v = qkv_inputs((2, 3, 4), (2, 5, 4), 3)
    widest = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, sliding_window=(2**63 - 1, 2**63 - 1))
    assert torch.equal(widest, qkv.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("kind", ["list", "numpy", "torch"])
def test_per_head_arguments_take_lists_arrays_and_tensors(kind):
    q, k, v = qkv_inputs((1, 4, 6, 8), (1, 4, 6, 8), 8)
    slopes, sinks = qkv.alibi_slopes(4), [0.5, -1.0, 2.0, 0.0]
    convert = {"list": list, "numpy": np.array, "torch": torch.tensor}[kind]
    out = qkv.scaled_dot_product_attention(q, k, v, alibi_slopes=convert(slopes), sinks=convert(sinks))
    assert_close(out, explicit(q, k, v, alibi=slopes, sinks=sinks)[0], torch.float64, kind)
