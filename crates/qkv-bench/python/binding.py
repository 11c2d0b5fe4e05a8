#!/usr/bin/env python3
"""qkv from Python against PyTorch's ``scaled_dot_product_attention``, in one process, on the
shapes of ``cargo xtask bench`` (``peers.CASES``), and the binding's own cost per call.

    pip install ./crates/qkv-python
    python crates/qkv-bench/python/binding.py [--quick] [--only TEXT] [--rust FILE.json] [--threads 1]

Both sides run on the same torch tensors with their default threads: ``qkv.scaled_dot_product_
attention`` (a KV-cache case: a step of ``qkv.KvCache`` holding the keys and values; a backward
case: ``out.backward(d_out)`` through qkv's operator) and ``F.scaled_dot_product_attention``.
With ``--rust`` (a ``cargo xtask bench --python PYTHON --json FILE`` result of the same sitting)
the table adds the Rust bench's torch/qkv ratio for the same rows, which the Python ratio should
keep when the binding costs nothing. Paged ragged cases are left out (no PyTorch counterpart
here). ``--threads 1`` runs both on one thread (``RAYON_NUM_THREADS=1``,
``torch.set_num_threads(1)``) and reads the Rust bench's one-thread rows: on a machine shared with
other work, one thread each is the steadier comparison (PyTorch's OpenMP threads wait for each
other at every parallel region).

A training step (forward and backward, ``out.backward(d_out)``, causal, 8 query heads over 2
key/value heads, d = 64, float32) is timed at three small shapes, where autograd's and the
binding's own costs are much of the step: the per-call overhead a model with many small
attention calls pays.

The binding's cost is timed on a problem too small to measure the engine by: one query, one key,
d = 8, calls in a tight loop. ``qkv call`` is the whole Python call; ``entry point`` the
extension's ``forward`` with the tensors already described; ``dry run`` the same call doing
everything but the engine's work (arguments, views, options, releasing the GIL). The binding's own
cost is the call less the engine's work: ``qkv call - (entry point - dry run)``. The same call
with a boolean mask is timed beside PyTorch's.
"""

import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import peers  # noqa: E402  (the bench's shapes and timing loop, beside this folder)

import qkv  # noqa: E402
from qkv import _core, _qkv  # noqa: E402


def tensors(c):
    dtype = torch.bfloat16 if c["precision"] == "bf16" else torch.float32
    shape = lambda heads, n: (c["batch"], heads, n, c["d"])  # noqa: E731
    q, k, v = ((torch.rand(shape(h, n)) * 2 - 1).to(dtype) for h, n in
               ((c["heads"], c["n_q"]), (c["kv_heads"], c["n_k"]), (c["kv_heads"], c["n_k"])))
    return q, k, v


def forward_runs(c, q, k, v):
    kwargs = {"is_causal": c["causal"], "enable_gqa": c["heads"] != c["kv_heads"]}
    if c["cache"]:
        cache = qkv.KvCache(1, c["kv_heads"], c["n_k"], c["d"], dtype=q.dtype)
        cache.append(0, k[0], v[0])
        step = q[0].float()  # f32 queries over the cache, as the Rust bench's step

        def ours():
            return cache.attend(0, step)
    else:

        def ours():
            return qkv.scaled_dot_product_attention(q, k, v, **kwargs)

    def theirs():
        with torch.inference_mode():
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    return ours, theirs


def backward_runs(c, q, k, v):
    kwargs = {"is_causal": c["causal"]}
    runs = []
    for attend in (qkv.scaled_dot_product_attention, F.scaled_dot_product_attention):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        out = attend(*inputs, **kwargs)
        d_out = torch.rand_like(out) * 2 - 1

        def run(inputs=inputs, out=out, d_out=d_out):
            for x in inputs:
                x.grad = None
            out.backward(d_out, retain_graph=True)

        runs.append(run)
    return runs


def rust_ratios(path, threads):
    """torch/qkv per shape from the Rust bench's JSON, at its default threads: qkv's first row of
    a shape (its own implementation: ``qkv``, ``qkv KvCache<f32>``, ``qkv attention_backward``,
    ...; the reference and the peers it lists after) against the torch row."""
    import json

    with open(path) as f:
        rows = json.load(f)
    threads = threads or max(r["threads"] for r in rows)
    qkv_ms, torch_ms = {}, {}
    for r in rows:
        name = r["implementation"]
        if r["threads"] != threads:
            continue
        if name.startswith("qkv") and "reference" not in name:
            qkv_ms.setdefault(r["shape"], r["median_ms"])
        elif name.startswith("torch"):
            torch_ms[r["shape"]] = r["median_ms"]
    return {s: torch_ms[s] / qkv_ms[s] for s in qkv_ms if s in torch_ms}


def binding_cost(calls=20000):
    """Microseconds per call: the whole qkv call, and the engine's entry point alone."""
    q = torch.rand(1, 1, 1, 8)
    out = torch.empty(1, 1, 1, 8)
    call = _core.Call(q, q, q, None, False, None, False)
    raws, out_raw = call.raws(), _core.backend(q).raw(out)

    def per_call(fn):
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - start) / calls * 1e6)
        return statistics.median(samples)

    whole = per_call(lambda: qkv.scaled_dot_product_attention(q, q, q))
    entry = per_call(lambda: _qkv.forward(raws, None, call.spec, out_raw))
    dry = per_call(lambda: _qkv.forward(raws, None, call.spec, out_raw, dry_run=True))
    torch_call = per_call(lambda: F.scaled_dot_product_attention(q, q, q))
    # A padding mask's call (boolean, [1, 1]), which a model on padded batches makes every time.
    keep = torch.ones(1, 1, dtype=torch.bool)
    masked = per_call(lambda: qkv.scaled_dot_product_attention(q, q, q, keep))
    torch_masked = per_call(lambda: F.scaled_dot_product_attention(q, q, q, keep))
    return whole, entry, dry, torch_call, masked, torch_masked


# Training steps' shapes: (batch, query heads, n, d); 2 key/value heads.
TRAINING_SHAPES = ((1, 8, 8, 64), (1, 8, 128, 64), (4, 8, 256, 64))


def training_steps(shape, reps=7):
    """Microseconds per forward and backward (causal, GQA 8/2) of qkv's SDPA and PyTorch's, the
    median of ``reps`` rounds, after checking that their gradients agree."""
    batch, heads, n, d = shape
    q = torch.randn(batch, heads, n, d, requires_grad=True)
    k, v = (torch.randn(batch, 2, n, d, requires_grad=True) for _ in range(2))
    d_out = torch.randn(batch, heads, n, d)

    def step(attend):
        def run():
            for t in (q, k, v):
                t.grad = None
            attend(q, k, v, is_causal=True, enable_gqa=True).backward(d_out)
            return [t.grad for t in (q, k, v)]
        return run

    ours, theirs = step(qkv.scaled_dot_product_attention), step(F.scaled_dot_product_attention)
    for got, want in zip(ours(), [g.clone() for g in theirs()]):
        assert (got - want).abs().max().item() < 1e-4
    calls = max(20, 40000 // (batch * n))

    def per_call(fn):
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - start) / calls * 1e6)
        return statistics.median(samples)

    return per_call(ours), per_call(theirs)


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    value = lambda name: args[args.index(name) + 1] if name in args else None  # noqa: E731
    only, rust = value("--only"), value("--rust")
    threads = int(value("--threads") or 0)
    if threads:
        # Before the engine's first call, which starts rayon's pool.
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        torch.set_num_threads(threads)
    ratios = rust_ratios(rust, threads) if rust else {}
    cases = [peers.as_case(c) for c in peers.CASES]
    cases = [c for c in cases if not c.get("ragged") and (only is None or only in c["label"])]
    if quick:
        cases = [c for c in cases if c["n_q"] * c["n_k"] <= 4096 * 4096]
    torch.manual_seed(0)
    qkv_threads = os.environ.get("RAYON_NUM_THREADS", os.cpu_count())
    print(f"qkv {qkv.simd_report()}, {qkv_threads} threads; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"| shape | qkv from Python (ms) | torch SDPA (ms) | torch/qkv | Rust bench torch/qkv |")
    print("|---|---:|---:|---:|---:|")
    for c in cases:
        q, k, v = tensors(c)
        ours, theirs = backward_runs(c, q, k, v) if c["backward"] else forward_runs(c, q, k, v)
        a, b = peers.median_seconds(ours, quick), peers.median_seconds(theirs, quick)
        rust_ratio = f"{ratios[c['label']]:.2f}" if c["label"] in ratios else ""
        print(f"| {c['label']} | {a * 1e3:.3f} | {b * 1e3:.3f} | {b / a:.2f} | {rust_ratio} |", flush=True)
    print("\n| training step, causal, GQA 8/2, float32 | qkv (us) | torch SDPA (us) | torch/qkv |")
    print("|---|---:|---:|---:|")
    for shape in TRAINING_SHAPES:
        a, b = training_steps(shape)
        print(f"| {list(shape)} | {a:.0f} | {b:.0f} | {b / a:.2f} |", flush=True)
    whole, entry, dry, torch_call, masked, torch_masked = binding_cost()
    print(f"\nper call, 1 query x 1 key, d = 8: qkv call {whole:.2f} us, entry point {entry:.2f} us, dry run "
          f"{dry:.2f} us: the binding's own cost {whole - (entry - dry):.2f} us, the engine's {entry - dry:.2f} us; "
          f"torch SDPA call {torch_call:.2f} us; with a boolean mask qkv {masked:.2f} us, torch {torch_masked:.2f} us")


if __name__ == "__main__":
    main()
