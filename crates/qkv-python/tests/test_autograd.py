"""Autograd through the engine's backward: gradcheck in float64, PyTorch's gradients in float32,
half precision, and torch.compile with qkv as an opaque operator."""

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import explicit

import qkv
from qkv import _core

CONFIGS = {
    "plain": ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 6, 4), {}),
    "n=1, d_k != d_v": ((1, 1, 1, 3), (1, 1, 1, 3), (1, 1, 1, 7), {}),
    "causal gqa": ((1, 4, 5, 3), (1, 2, 5, 3), (1, 2, 5, 2), {"is_causal": True, "enable_gqa": True}),
    "bool mask, a hidden row": ((2, 4, 3), (2, 5, 3), (2, 5, 3), {"attn_mask": "bool"}),
    "additive mask": ((2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 4), {"attn_mask": "additive"}),
    "2-d, scale": ((4, 3), (6, 3), (6, 2), {"scale": 0.3}),
    "window, softcap": ((1, 2, 6, 3), (1, 2, 6, 3), (1, 2, 6, 3), {"sliding_window": (2, 1), "softcap": 1.5}),
    "alibi": ((1, 2, 4, 3), (1, 2, 5, 3), (1, 2, 5, 3), {"alibi_slopes": [0.5, 0.25]}),
    "sinks, causal gqa": ((2, 4, 5, 3), (2, 2, 5, 3), (2, 2, 5, 2), {"is_causal": True, "enable_gqa": True,
                                                                     "sinks": "learned"}),
    "sinks, a hidden row": ((3, 4, 3), (3, 5, 3), (3, 5, 3), {"attn_mask": "bool", "sinks": "learned"}),
}


def inputs(config, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    qs, ks, vs, kwargs = CONFIGS[config]
    tensors = [torch.randn(s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_() for s in (qs, ks, vs)]
    kwargs = dict(kwargs)
    scores = qs[:-1] + (ks[-2],)
    if kwargs.get("attn_mask") == "bool":
        mask = torch.rand(scores, generator=gen) > 0.3
        mask[..., 1, :] = False
        kwargs["attn_mask"] = mask
    elif kwargs.get("attn_mask") == "additive":
        # One bias per query and key shared by the heads: its gradient sums over them.
        kwargs["attn_mask"] = torch.randn(scores[-2:], generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    if kwargs.get("sinks") == "learned":
        # One logit per query head, a parameter as in gpt-oss: its gradient is wanted too.
        heads = qs[-3] if len(qs) > 2 else 1
        kwargs["sinks"] = torch.randn(heads, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    return tensors, kwargs


def differentiated(kwargs):
    """The names of the keyword arguments that need a gradient (an additive mask, learned sinks),
    taken out of ``kwargs``, and their tensors."""
    names = [n for n in ("attn_mask", "sinks") if isinstance(kwargs.get(n), torch.Tensor) and kwargs[n].requires_grad]
    return names, [kwargs.pop(n) for n in names]


@pytest.mark.parametrize("config", CONFIGS)
def test_gradcheck_float64(config):
    tensors, kwargs = inputs(config)
    # Differentiated with respect to an additive mask and learned sinks too.
    names, extra = differentiated(kwargs)

    def f(q, k, v, *rest):
        return qkv.scaled_dot_product_attention(q, k, v, **kwargs, **dict(zip(names, rest)))

    assert torch.autograd.gradcheck(f, (*tensors, *extra))


# PyTorch has no sliding window, soft-cap, ALiBi or sinks argument: gradcheck covers those.
EXTENSIONS = {"sliding_window", "softcap", "alibi_slopes", "sinks"}
PYTORCH_CONFIGS = [c for c, (*_, kwargs) in CONFIGS.items() if not EXTENSIONS & set(kwargs)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", PYTORCH_CONFIGS)
def test_gradients_match_pytorch(config, dtype):
    tensors, kwargs = inputs(config, dtype)
    mask = kwargs.get("attn_mask")
    leaves = tensors + ([mask] if mask is not None and mask.requires_grad else [])
    weights = torch.randn(qkv.scaled_dot_product_attention(*tensors, **kwargs).shape, dtype=torch.float64)
    (qkv.scaled_dot_product_attention(*tensors, **kwargs).double() * weights).sum().backward()
    ours = [t.grad.double() for t in leaves]
    wide = [t.detach().double().requires_grad_() for t in leaves]
    wide_kwargs = dict(kwargs, attn_mask=wide[3]) if len(wide) == 4 else kwargs
    (F.scaled_dot_product_attention(*wide[:3], **wide_kwargs) * weights).sum().backward()
    tolerance = 1e-4 if dtype == torch.float32 else 6e-2
    for name, got, want in zip(["dq", "dk", "dv", "dmask"], ours, wide):
        assert got.shape == want.shape
        assert (got - want.grad).abs().max().item() <= tolerance, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("config", [c for c in CONFIGS if "sinks" in c])
def test_sink_gradients_match_the_float64_formula(config, dtype):
    # The engine's dq, dk, dv and dsinks against autograd through the concatenated-column form.
    tensors, kwargs = inputs(config, dtype)
    sinks = kwargs["sinks"]
    weights = torch.randn(qkv.scaled_dot_product_attention(*tensors, **kwargs).shape, dtype=torch.float64)
    (qkv.scaled_dot_product_attention(*tensors, **kwargs).double() * weights).sum().backward()
    wide = [t.detach().double().requires_grad_() for t in (*tensors, sinks)]
    mask = kwargs.get("attn_mask")
    out, _ = explicit(*wide[:3], is_causal=kwargs.get("is_causal", False), keep=mask, sinks=wide[3])
    (out * weights).sum().backward()
    tolerance = 1e-4 if dtype == torch.float32 else 6e-2
    assert sinks.grad.dtype == dtype and sinks.grad.shape == sinks.shape
    for name, got, want in zip(["dq", "dk", "dv", "dsinks"], (*tensors, sinks), wide):
        assert (got.grad.double() - want.grad).abs().max().item() <= tolerance, name


def test_a_backward_of_the_output_alone_runs_without_the_logsumexp_gradient():
    # The logsumexp's gradient is None then (not materialised zeros): the plain backward runs.
    (q, k, v), _ = inputs("plain")
    out, lse = qkv.attention_with_lse(q, k, v)
    assert out.requires_grad
    out.sum().backward()
    assert q.grad is not None


def through_the_operator(q, k, v, is_causal=False, scale=None):
    """SDPA through the registered operator and its autograd (what torch.compile traces), whose
    backward reads every call through ``_core.Call``."""
    return torch.ops.qkv.attention(q, k, v, None, is_causal, scale, True, None, None, None, None)[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_the_eager_training_step_gives_the_operators_gradients(dtype):
    """In eager mode a differentiated call runs as a ``torch.autograd.Function`` without the
    dispatcher (a custom operator's dispatch and autograd wrapper took about 100 µs of a small
    step's 370), and
    the common call's forward and backward read the tensors in the extension (``forward_torch``,
    ``backward_torch``). Both must give the operator's bits: GQA, causal, a scale, strided
    queries, 3-D inputs, an incoming gradient of any strides (a sum's, expanded) and one of NaN (an overflow a
    GradScaler looks for), which gives gradients of NaN."""
    torch.manual_seed(5)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 3)
    strided = torch.randn(2, 4, 20, 8)[:, :, ::4]
    cases = ((torch.randn(2, 4, 5, 8), {}), (torch.randn(2, 4, 5, 8), {"is_causal": True}), (strided, {"scale": 0.3}),
             (torch.randn(4, 5, 8), {"is_causal": True, "three": True}))
    losses = (lambda out: out.sum(), lambda out: (out * out).sum(), lambda out: (out * math.nan).sum())
    for query, kwargs in cases:
        # Three dimensions too: [heads, n, d], a batch of one.
        key, value = (k[0], v[0]) if kwargs.pop("three", None) else (k, v)
        for loss in losses:
            gradients = []
            for attend in (lambda *t, **kw: qkv.scaled_dot_product_attention(*t, enable_gqa=True, **kw),
                           through_the_operator):
                tensors = [t.to(dtype).detach().requires_grad_() for t in (query, key, value)]
                loss(attend(*tensors, **kwargs)).backward()
                gradients.append([t.grad for t in tensors])
            for eager, operator in zip(*gradients):
                assert eager.dtype == dtype and torch.equal(eager.isnan(), operator.isnan())
                assert torch.equal(eager.nan_to_num(), operator.nan_to_num())
        if dtype != torch.bfloat16:
            # The common call's direct paths took these, a sum's expanded gradient included.
            tensors = [t.to(dtype) for t in (query, key, value)]
            out, lse = _core.fast_forward(*tensors, None, kwargs.get("is_causal", False), kwargs.get("scale"), True,
                                          True)
            grad = torch.ones(()).to(dtype).expand(out.shape)
            assert _core.fast_backward(grad, *tensors, out, lse, None, kwargs.get("is_causal", False),
                                       kwargs.get("scale"), True) is not None


def test_a_call_with_only_some_inputs_needing_a_gradient_gets_theirs():
    (q, k, v), _ = inputs("causal gqa", torch.float32)
    for needs in ((True, False, False), (False, False, True)):
        tensors = [t.detach().requires_grad_(n) for t, n in zip((q, k, v), needs)]
        qkv.scaled_dot_product_attention(*tensors, is_causal=True, enable_gqa=True).square().sum().backward()
        wide = [t.detach().double().requires_grad_(n) for t, n in zip((q, k, v), needs)]
        F.scaled_dot_product_attention(*wide, is_causal=True, enable_gqa=True).square().sum().backward()
        for t, w, n in zip(tensors, wide, needs):
            assert (t.grad is None) == (not n)
            if n:
                assert (t.grad.double() - w.grad).abs().max().item() < 1e-5


def test_meta_tensors_and_dispatch_modes_meet_the_operators():
    """Tensors that are not plain CPU ones (meta, fake: a pipeline's shape inference) get their
    shapes from the operators' fake implementations, and a dispatch mode sees the operators."""
    q = torch.empty(2, 4, 5, 8, device="meta", requires_grad=True)
    kv = torch.empty(2, 2, 7, 8, device="meta")
    out = qkv.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    assert out.shape == (2, 4, 5, 8) and out.device.type == "meta"
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.add(str(func))
            return func(*args, **(kwargs or {}))

    (q, k, v), _ = inputs("causal gqa", torch.float32)
    with Seen() as seen:
        qkv.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).sum().backward()
    assert {"qkv.attention.default", "qkv.attention_backward.default"} <= seen.ops, seen.ops


def test_calls_without_a_gradient_meet_the_operators_where_they_must():
    """Without any gradient: torch.jit.trace records the operator (a direct call would leave the
    engine's writes out of the graph, which would return uninitialised memory), and meta and fake
    tensors get their shapes from the fake implementations."""
    x = torch.randn(3, 2, 4, 8)
    traced = torch.jit.trace(lambda t: qkv.scaled_dot_product_attention(t, t, t), (x,), check_trace=False)
    assert "qkv::attention" in str(traced.graph)
    y = torch.randn(3, 2, 4, 8)
    assert torch.equal(traced(y), qkv.scaled_dot_product_attention(y, y, y))
    packed = torch.randn(5, 2, 8)
    traced = torch.jit.trace(lambda t: qkv.varlen_attention(t, t, t, torch.tensor([0, 2, 5]), torch.tensor([0, 2, 5])),
                             (packed,), check_trace=False)
    assert "qkv::varlen_attention" in str(traced.graph)
    with torch.no_grad():
        q, k, v = (torch.empty(shape, device="meta") for shape in ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 3)))
        out = qkv.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        assert out.shape == (2, 4, 5, 3) and out.device.type == "meta"
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        f = torch.empty(2, 3, 4, 8)
        assert qkv.scaled_dot_product_attention(f, f, f, is_causal=True).shape == (2, 3, 4, 8)


def test_a_device_context_leaves_cpu_calls_on_the_cpu():
    """Under ``with torch.device("meta")`` (a model built for shape inference) a call on CPU
    tensors still computes on the CPU: its outputs and the options it makes tensors of (sinks,
    ALiBi slopes, offsets) are allocated there by name."""
    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    mask = torch.rand(3, 3) > 0.3
    calls = [
        lambda: qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        lambda: qkv.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=[0.5, -0.5], alibi_slopes=[0.5, 0.25]),
        lambda: qkv.varlen_attention(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), [0, 1, 3],
                                     [0, 1, 3]),
    ]
    want = [call() for call in calls]
    with torch.device("meta"):
        got = [call() for call in calls]
    for g, w in zip(got, want):
        assert g.device.type == "cpu" and torch.equal(g, w)
    q.requires_grad_()
    with torch.device("meta"):
        out = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, sinks=[0.5, -0.5])
        out.sum().backward()
    assert q.grad.device.type == "cpu" and torch.isfinite(q.grad).all()


def test_a_call_without_gradients_takes_parameters_directly():
    """Learned sinks (an ``nn.Parameter``) at inference: the direct call, not the operator."""
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    sinks = torch.nn.Parameter(torch.zeros(2))
    assert qkv._needs_op(q, k, k, None, sinks)
    with torch.no_grad():
        assert not qkv._needs_op(q, k, k, None, sinks)
        assert not qkv._needs_op(torch.nn.Parameter(q), k, k, None, None)


def test_merge_refuses_what_needs_a_gradient():
    q = torch.randn(1, 2, 3, 4, requires_grad=True)
    first, second = qkv.attention_with_lse(q, q, q), qkv.attention_with_lse(q, 2 * q, q)
    with pytest.raises(ValueError, match="qkv.merge has no backward"):
        qkv.merge(*first, *second)
    with torch.no_grad():
        out, lse = qkv.merge(*first, *second)
    want = qkv.attention_with_lse(q.detach(), torch.cat([q, 2 * q], 2).detach(), torch.cat([q, q], 2).detach())
    assert torch.allclose(out, want[0], atol=1e-6) and torch.allclose(lse, want[1], atol=1e-6)


def test_eager_calls_skip_the_dispatcher():
    (q, k, v), _ = inputs("causal gqa", torch.float32)
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert type(out.grad_fn).__name__ == "EagerAttentionBackward"
    packed = [t[0].transpose(0, 1).detach().requires_grad_() for t in (q, k, v)]
    out = qkv.varlen_attention(*packed, [0, 2, 5], [0, 2, 5], is_causal=True)
    assert type(out.grad_fn).__name__ == "EagerVarlenAttentionBackward"


def test_torch_compile_runs_qkv_as_an_opaque_operator():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 48)

        def forward(self, x, attend):
            q, k, v = self.proj(x).view(2, 6, 3, 4, 4).permute(2, 0, 3, 1, 4)
            return attend(q, k, v, is_causal=True).sum(dim=1)

    torch.manual_seed(0)
    block, x = Block(), torch.randn(2, 6, 16)
    eager = block(x, F.scaled_dot_product_attention)
    compiled = torch.compile(block, fullgraph=True)
    out = compiled(x, qkv.scaled_dot_product_attention)
    assert (out - eager).abs().max().item() < 1e-5
    out.square().sum().backward()
    ours = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    eager.square().sum().backward()
    for got, p in zip(ours, block.parameters()):
        assert (got - p.grad).abs().max().item() < 1e-4


def test_backward_without_a_float64_or_float32_path_is_float32():
    # float16 inputs: the backward runs in float32 and returns float16 gradients.
    (q, k, v), _ = inputs("plain", torch.float16)
    qkv.scaled_dot_product_attention(q, k, v).sum().backward()
    assert q.grad.dtype == torch.float16 and math.isfinite(q.grad.float().abs().max().item())


@pytest.mark.parametrize("config", ["plain", "causal gqa", "additive mask", "sinks, causal gqa"])
def test_the_operators_pass_torch_library_opcheck(config):
    # Schema, fake (meta) implementation against the real one, autograd registration.
    (q, k, v), kwargs = inputs(config)
    mask, sinks = kwargs.get("attn_mask"), kwargs.get("sinks")
    args = (q, k, v, mask, kwargs.get("is_causal", False), None, kwargs.get("enable_gqa", False), None, None, None,
            sinks)
    torch.library.opcheck(torch.ops.qkv.attention.default, args)
    out, lse = torch.ops.qkv.attention(*args)
    # The backward has no backward of its own (no second derivatives): checked on plain tensors.
    plain = [None if t is None else t.detach() for t in (q, k, v, out, lse, mask)]
    options = (*args[4:10], None if sinks is None else sinks.detach())
    backward_args = (torch.ones_like(out), *plain, *options, mask is not None)
    torch.library.opcheck(torch.ops.qkv.attention_backward.default, backward_args)
    # With the logsumexp's gradient too.
    torch.library.opcheck(torch.ops.qkv.attention_backward.default, (*backward_args, torch.ones_like(lse)))


def test_torch_compile_learns_sinks_through_qkv():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(16, 48)
            self.sinks = torch.nn.Parameter(torch.tensor([0.5, -1.0, 2.0, 0.0]))

        def forward(self, x):
            q, k, v = self.proj(x).view(2, 6, 3, 4, 4).permute(2, 0, 3, 1, 4)
            return qkv.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=self.sinks).sum(dim=1)

    torch.manual_seed(0)
    block, x = Block(), torch.randn(2, 6, 16)
    eager = block(x)
    eager.square().sum().backward()
    want = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    out = torch.compile(block, fullgraph=True)(x)
    assert (out - eager).abs().max().item() < 1e-6
    out.square().sum().backward()
    assert block.sinks.grad.abs().max().item() > 0
    for got, p in zip(want, block.parameters()):
        assert (got - p.grad).abs().max().item() < 1e-5


def test_torch_compile_takes_alibi_slopes_as_a_tensor():
    # Slopes held as a tensor (a buffer of the module) are read only when the operator runs:
    # torch.compile(fullgraph=True) traces the call, forward and backward as eager.
    (q, k, v), _ = inputs("plain")
    slopes = torch.tensor(qkv.alibi_slopes(q.shape[1]))

    def loss(q, k, v):
        return qkv.scaled_dot_product_attention(q, k, v, is_causal=True, alibi_slopes=slopes).square().sum()

    grads = []
    for run in (loss, torch.compile(loss, fullgraph=True)):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        run(*leaves).backward()
        grads.append([t.grad for t in leaves])
    for got, want in zip(*grads):
        assert (got - want).abs().max().item() <= 1e-12
