#!/usr/bin/env python3
"""qkv's Python peers: NumPy (matmul, softmax, matmul) and, when installed, PyTorch's fused
``scaled_dot_product_attention``, timed on the shapes of ``cargo xtask bench`` (f32 and bf16;
d = 64 unless a case says otherwise) and printed with the same columns. A KV-cache case is a
decoding step over keys and values already in memory: SDPA takes those tensors as they are. A
backward case times ``out.backward(d_out)`` alone, after one forward with ``requires_grad``.

    python3 crates/qkv-bench/peers.py [--quick] [--json FILE] [--cases FILE]

``cargo xtask bench --python PYTHON`` runs this script itself and hands it its cases with
``--cases`` (a JSON list of objects with label, batch, heads, kv_heads, n_q, n_k, d, causal,
precision, cache, backward), so
that both sides measure the same shapes; run alone, it uses ``CASES`` below, the same list as
``crates/qkv-bench/src/cases.rs``.

Each library runs in its own child process: NumPy's with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
removed from the environment (they may be set on this machine and would pin OpenBLAS to a slower
kernel), PyTorch's with the environment as it is.
"""

import json
import os
import statistics
import subprocess
import sys
import time

# (label, batch, heads, kv_heads, n_q, n_k, causal[, d, precision, cache, backward]): the cases of
# crates/qkv-bench/src/cases.rs.
CASES = [
    ("n=256", 1, 1, 1, 256, 256, False),
    ("n=1024", 1, 1, 1, 1024, 1024, False),
    ("n=1024 causal", 1, 1, 1, 1024, 1024, True),
    ("n=4096", 1, 1, 1, 4096, 4096, False),
    ("n=4096 causal", 1, 1, 1, 4096, 4096, True),
    ("n=16384", 1, 1, 1, 16384, 16384, False),
    ("n=16384 causal", 1, 1, 1, 16384, 16384, True),
    ("8h n=256", 1, 8, 8, 256, 256, False),
    ("4x8h n=128", 4, 8, 8, 128, 128, False),
    ("8h n=1024", 1, 8, 8, 1024, 1024, False),
    ("8h n=1024 causal", 1, 8, 8, 1024, 1024, True),
    ("gqa 8/2 n=1024", 1, 8, 2, 1024, 1024, False),
    ("decode 1x1024", 1, 1, 1, 1, 1024, False),
    ("decode 1x16384", 1, 1, 1, 1, 16384, False),
    ("decode 1x131072", 1, 1, 1, 1, 131072, False),
    ("gqa 32/8 decode 1x4096", 1, 32, 8, 1, 4096, False),
    ("gqa 32/8 decode 1x16384", 1, 32, 8, 1, 16384, False),
    ("n=4096 bf16", 1, 1, 1, 4096, 4096, False, 64, "bf16", False),
] + [
    (f"cache gqa 32/8 decode 1x{n_k} d=128{' bf16' if p == 'bf16' else ''}", 1, 32, 8, 1, n_k, False, 128, p, True)
    for n_k in (1024, 8192, 32768)
    for p in ("f32", "bf16")
] + [
    (f"n={n}{' causal' if causal else ''}{'' if d == 64 else f' d={d}'} backward", 1, 1, 1, n, n, causal, d, "f32", False, True)
    for n in (1024, 4096, 16384)
    for d in (64, 128)
    for causal in (False, True)
] + [
    (f"n={n} bf16 backward", 1, 1, 1, n, n, False, 64, "bf16", False, True)
    for n in (1024, 4096)
]
FIELDS = ("label", "batch", "heads", "kv_heads", "n_q", "n_k", "causal", "d", "precision", "cache", "backward")
DEFAULTS = {"d": 64, "precision": "f32", "cache": False, "backward": False}


def as_case(values):
    """A CASES tuple as a case object, the optional fields at their defaults."""
    return {**DEFAULTS, **dict(zip(FIELDS, values))}


def load_cases(path):
    """The cases the benchmark binary wrote, as case objects."""
    with open(path) as f:
        return [{**DEFAULTS, **c} for c in json.load(f)]


def flops(c):
    """As the benchmark counts them; a backward 2.5 times its forward (FlashAttention-2's count)."""
    full = 4.0 * c["batch"] * c["heads"] * c["n_q"] * c["n_k"] * c["d"] * (2.5 if c["backward"] else 1.0)
    return full / 2 if c["causal"] else full


def median_seconds(fn, quick):
    fn()  # warm-up
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    # The rule of the Rust side's `measure::median`: about 3 s of runs (0.3 s quick), at least 7
    # (5), at most 51, or 3 of a run over 2 s.
    budget, least = (0.3, 5) if quick else (3.0, 7)
    runs = 3 if once > 2.0 else max(least, min(51, int(budget / max(once, 1e-4))))
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def numpy_rows(cases, quick):
    import numpy as np

    rng = np.random.default_rng(0)
    rows = []
    for c in cases:
        b, h, kv, n_q, n_k, causal, d = (c[f] for f in ("batch", "heads", "kv_heads", "n_q", "n_k", "causal", "d"))
        # NumPy has no bf16 and no gradients; the KV-cache steps are PyTorch's to compare with.
        if (quick and n_q * n_k > 4096 * 4096) or c["precision"] != "f32" or c["cache"] or c["backward"]:
            continue
        q = rng.uniform(-1, 1, (b, h, n_q, d)).astype(np.float32)
        k = rng.uniform(-1, 1, (b, kv, n_k, d)).astype(np.float32)
        v = rng.uniform(-1, 1, (b, kv, n_k, d)).astype(np.float32)
        k, v = np.repeat(k, h // kv, axis=1), np.repeat(v, h // kv, axis=1)
        mask = None
        if causal:
            mask = np.triu(np.full((n_q, n_k), -np.inf, dtype=np.float32), k=n_k - n_q + 1)
        scale = np.float32(1.0 / np.sqrt(d))

        def run():
            s = (q @ np.swapaxes(k, -1, -2)) * scale
            if mask is not None:
                s += mask
            s -= s.max(axis=-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
            return s @ v

        t = median_seconds(run, quick)
        rows.append(row(c, "numpy unfused", os.cpu_count(), t))
    return rows


def torch_rows(cases, quick):
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        print("PyTorch is not installed: skipping scaled_dot_product_attention", file=sys.stderr)
        return []
    rows = []
    torch.manual_seed(0)
    for threads in (torch.get_num_threads(), 1):
        torch.set_num_threads(threads)
        for c in cases:
            b, h, kv, n_q, n_k, causal, d = (c[f] for f in ("batch", "heads", "kv_heads", "n_q", "n_k", "causal", "d"))
            if threads == 1 and (quick or n_q * n_k > 4096 * 4096):
                continue
            dtype = torch.bfloat16 if c["precision"] == "bf16" else torch.float32
            q = (torch.rand(b, h, n_q, d) * 2 - 1).to(dtype)
            k = (torch.rand(b, kv, n_k, d) * 2 - 1).to(dtype)
            v = (torch.rand(b, kv, n_k, d) * 2 - 1).to(dtype)
            gqa = h != kv
            # Bottom-right causal alignment, as qkv's default (is_causal is top-left; equal when n_q = n_k).
            kwargs = {"is_causal": causal}
            if gqa:
                kwargs["enable_gqa"] = True

            if c["backward"]:
                # The forward once, outside the timing; then out.backward(d_out) alone, the
                # gradients reset before each run.
                for x in (q, k, v):
                    x.requires_grad_()
                out = F.scaled_dot_product_attention(q, k, v, **kwargs)
                d_out = torch.rand_like(out) * 2 - 1

                def run():
                    for x in (q, k, v):
                        x.grad = None
                    out.backward(d_out, retain_graph=True)
            else:

                def run():
                    with torch.inference_mode():
                        return F.scaled_dot_product_attention(q, k, v, **kwargs)

            t = median_seconds(run, quick)
            name = f"torch {torch.__version__} sdpa" + (" bf16" if dtype == torch.bfloat16 else "")
            name += " backward" if c["backward"] else ""
            rows.append(row(c, name, threads, t))
    return rows


def row(c, implementation, threads, seconds):
    fields = {f: c[f] for f in FIELDS if f != "label"}
    return {
        "shape": c["label"],
        "implementation": implementation,
        **fields,
        "threads": threads,
        "median_ms": seconds * 1e3,
        "gflops": flops(c) / seconds / 1e9,
    }


def worker(kind, cases, quick):
    rows = numpy_rows(cases, quick) if kind == "numpy" else torch_rows(cases, quick)
    json.dump(rows, sys.stdout)


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    value = lambda name: args[args.index(name) + 1] if name in args else None
    cases_path = value("--cases")
    cases = load_cases(cases_path) if cases_path else [as_case(c) for c in CASES]
    if "--worker" in args:
        worker(value("--worker"), cases, quick)
        return
    json_path = value("--json")
    rows = []
    for kind in ("numpy", "torch"):
        env = dict(os.environ)
        if kind == "numpy":
            env.pop("OPENBLAS_CORETYPE", None)
            env.pop("OPENBLAS_L2_SIZE", None)
        command = [sys.executable, __file__, "--worker", kind] + (["--quick"] if quick else [])
        command += ["--cases", cases_path] if cases_path else []
        out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        sys.stderr.write(out.stderr)
        rows += json.loads(out.stdout)
    print(f"| {'shape (d = 64 unless named)':<38} | {'implementation':<38} | {'threads':>7} | {'median ms':>10} | {'GFLOP/s':>8} |")
    print(f"|{':':-<40}|{':':-<40}|{':':->9}|{':':->12}|{':':->10}|")
    order = [c["label"] for c in cases]
    for r in sorted(rows, key=lambda r: order.index(r["shape"])):
        print(f"| {r['shape']:<38} | {r['implementation']:<38} | {r['threads']:>7} | {r['median_ms']:>10.3f} | {r['gflops']:>8.1f} |")
    if json_path:
        with open(json_path, "w") as f:
            json.dump(rows, f, indent=2)
        print(f"wrote {json_path}")


if __name__ == "__main__":
    main()
