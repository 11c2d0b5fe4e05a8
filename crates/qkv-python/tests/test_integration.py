"""How qkv meets the rest of a PyTorch program: the import order, devices, arguments that are not
tensors, tensor subclasses, torch.func's transforms, a cache shared by threads, and forked
processes. Each case is one a user met: before its fix it failed, hung or gave wrong numbers."""

import importlib
import multiprocessing
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import qkv
from conftest import assert_close, reference


def run_python(program):
    """``program`` in a fresh interpreter: its standard output, or the failure with its errors."""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


# isort orders `import qkv` before `import torch`: the operators must be registered all the same
# before torch.compile's first trace (which will not trace an import) and before
# torch.export.load (which finds only registered operators).
IMPORT_QKV_FIRST = """
import importlib.util
import qkv
assert importlib.util.find_spec("torch") is not None  # as libraries check for torch
import torch
assert hasattr(torch.ops.qkv, "attention"), "registered as torch was imported"
assert not type(torch.__spec__.loader).__module__.startswith("qkv"), torch.__spec__.loader
q = torch.randn(1, 2, 8, 16, dtype=torch.float64, requires_grad=True)
f = lambda q: qkv.scaled_dot_product_attention(q, q, q, is_causal=True)
compiled = torch.compile(f, fullgraph=True)
compiled(q).sum().backward()
explained = torch._dynamo.explain(f)(q)
print(explained.graph_count, explained.graph_break_count)
"""


def test_import_before_torch_registers_the_operators_with_torch():
    assert run_python(IMPORT_QKV_FIRST).split() == ["1", "0"]


TYPED_PROGRAM = """
import torch
import qkv

q = torch.randn(1, 2, 4, 8)
out: torch.Tensor = qkv.scaled_dot_product_attention(q, q, q, is_causal=True)
cache = qkv.KvCache(1, 2, 16, 8)
held: int = cache.length(0)
qkv.scaled_dot_product_attention(q, q, q, is_causal="no")
qkv.PagedKvCache(1, 2, 8).fork("first")
"""


def test_a_type_checker_reads_the_packages_signatures(tmp_path):
    # Under CI mypy is installed (.ci/run); elsewhere the test needs it.
    api = importlib.import_module("mypy.api") if "CI" in os.environ else pytest.importorskip("mypy.api")
    (tmp_path / "user.py").write_text(TYPED_PROGRAM)
    # torch's own annotations are not what is checked here, and take a minute to read.
    (tmp_path / "mypy.ini").write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n"
                                       "[mypy-numpy.*]\nfollow_imports = skip\n")
    stdout, _, status = api.run(["--python-executable", sys.executable, "--no-incremental",
                                 "--config-file", str(tmp_path / "mypy.ini"), str(tmp_path / "user.py")])
    errors = [line.split(": error: ")[1] for line in stdout.splitlines() if ": error: " in line]
    assert status == 1 and errors == [
        'Argument "is_causal" to "scaled_dot_product_attention" has incompatible type "str"; expected "bool"  '
        "[arg-type]",
        'Argument 1 to "fork" of "PagedKvCache" has incompatible type "str"; expected "int"  [arg-type]',
    ], stdout


def test_numpy_users_import_no_torch():
    assert run_python("import sys, qkv, numpy; print('torch' in sys.modules)").strip() == "False"


@pytest.mark.parametrize("argument", ["key", "value", "attn_mask", "sinks"])
def test_a_tensor_on_another_device_is_an_error_naming_it(argument):
    q = torch.randn(1, 2, 4, 8)
    tensors = {"key": q.clone(), "value": q.clone(), "attn_mask": torch.zeros(4, 4), "sinks": torch.zeros(2)}
    tensors[argument] = tensors[argument].to("meta")
    key, value = tensors.pop("key"), tensors.pop("value")
    with pytest.raises(ValueError, match=f"^{argument} is on meta and query on cpu: qkv needs one device"):
        qkv.scaled_dot_product_attention(q, key, value, **tensors)


def test_meta_tensors_are_checked_as_a_real_call_checks_them():
    q, k = torch.empty(1, 2, 4, 8, device="meta"), torch.empty(1, 2, 4, 16, device="meta")
    with pytest.raises(ValueError, match="query and key have widths 8 and 16"):
        qkv.scaled_dot_product_attention(q, k, k)
    with pytest.raises(ValueError, match="attn_mask has shape"):
        qkv.scaled_dot_product_attention(q, q, q, attn_mask=torch.empty(3, 4, device="meta"))
    assert qkv.scaled_dot_product_attention(q, q, k).shape == (1, 2, 4, 16)


@pytest.mark.parametrize("arguments, message", [
    ({"is_causal": "no"}, "argument 'is_causal' must be bool, not str"),
    ({"is_causal": 1}, "argument 'is_causal' must be bool, not int"),
    ({"is_causal": np.bool_(True)}, "argument 'is_causal' must be bool, not numpy.bool"),
    ({"enable_gqa": "no"}, "argument 'enable_gqa' must be bool, not str"),
    ({"scale": torch.tensor([0.5, 0.25])}, "argument 'scale' must be float, not a tensor of 2 elements"),
    ({"scale": "0.5"}, "argument 'scale' must be float, not str"),
    ({"scale": torch.tensor(0.5, requires_grad=True)}, "argument 'scale' must be float, not a tensor that requires"),
])
def test_arguments_that_are_not_tensors_are_checked_on_every_call_as_pytorch_checks_them(arguments, message):
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(TypeError):
        F.scaled_dot_product_attention(q, q, q, **arguments)
    # The first call and the later ones (which take a shorter path) alike.
    for _ in range(3):
        with pytest.raises(TypeError, match=message):
            qkv.scaled_dot_product_attention(q, q, q, **arguments)


def test_scales_pytorch_takes_are_taken():
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64)
    for scale in (1, 0.5, np.float32(0.5), torch.tensor(0.5)):
        want = reference(q, q, q, scale=float(scale))
        assert_close(qkv.scaled_dot_product_attention(q, q, q, scale=scale), want, torch.float64, f"scale {scale!r}")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_float32_mask_serves_a_query_of_any_dtype_as_pytorchs_does(dtype, generator):
    q = torch.randn(2, 3, 5, 8, generator=generator).to(dtype)
    mask = torch.randn(5, 5, generator=generator).requires_grad_()
    want = reference(q, q, q, attn_mask=mask.detach())
    out = qkv.scaled_dot_product_attention(q, q, q, attn_mask=mask)
    assert out.dtype == dtype
    assert_close(out, want, dtype)
    out.float().sum().backward()
    assert mask.grad is not None and mask.grad.dtype == torch.float32


class Tagged(torch.Tensor):
    """A tensor subclass of the user's own."""


def test_tensor_subclasses_are_served_as_pytorch_serves_them():
    q = torch.randn(1, 2, 4, 8, dtype=torch.float64).as_subclass(Tagged).requires_grad_()
    out = qkv.scaled_dot_product_attention(q, q, q)
    assert type(out) is type(F.scaled_dot_product_attention(q, q, q))
    assert_close(out, reference(q, q, q), torch.float64)
    out.sum().backward()
    assert q.grad is not None and q.grad.shape == q.shape


def test_vmap_runs_and_the_other_transforms_say_they_do_not_reach_through():
    q, k = torch.randn(3, 2, 4, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    got = torch.vmap(lambda q: qkv.scaled_dot_product_attention(q, k, k))(q)
    assert_close(got, reference(q, k.expand(3, 2, 4, 8), k.expand(3, 2, 4, 8)), torch.float64)
    for transform in (torch.func.grad, torch.func.jacrev):
        with pytest.raises(RuntimeError, match="torch.func's grad, jacrev, jacfwd and jvp do not reach through"):
            transform(lambda q: qkv.scaled_dot_product_attention(q, q, q).sum())(q)


def test_a_cache_in_a_call_on_another_thread_says_so():
    cache = qkv.KvCache(1, 2, 1 << 15, 64)
    cache.append(0, torch.randn(2, 1 << 14, 64), torch.randn(2, 1 << 14, 64))
    errors, stop = [], threading.Event()

    def attend():
        while not stop.is_set():
            cache.attend(0, torch.randn(8, 64, 64))

    attending = threading.Thread(target=attend)
    attending.start()
    try:
        for _ in range(2000):
            try:
                cache.length(0)
                cache.append(0, torch.randn(2, 1, 64), torch.randn(2, 1, 64))
            except RuntimeError as e:
                errors.append(str(e))
                break
    finally:
        stop.set()
        attending.join()
    assert errors, "two threads never met in the cache's calls"
    assert errors[0].startswith("this KvCache is in a call on another thread: a cache is one thread's at a time")
    assert qkv.PagedKvCache.block_granularity() >= 1


def attend_in_child(connection, q):
    """A forked child's call: its result, sent back as an array (torch's own pickling of a tensor
    shares its memory with operations of its own, which hang in a forked child as PyTorch's do)."""
    connection.send(np.asarray(qkv.scaled_dot_product_attention(q, q, q, is_causal=True)))


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_forked_child_of_a_process_that_shared_work_runs_its_calls(library):
    # Large enough to be shared between threads in the parent, whose pool the child has not.
    rng = np.random.default_rng(0)
    q = rng.standard_normal((8, 512, 64)).astype(np.float32)
    q = q if library == "numpy" else torch.from_numpy(q)
    want = qkv.scaled_dot_product_attention(q, q, q, is_causal=True)
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=attend_in_child, args=(send, q))
    child.start()
    try:
        assert receive.poll(120), "the forked child's call did not return"
        got = receive.recv()
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    assert (np.asarray(got) == np.asarray(want)).all()
