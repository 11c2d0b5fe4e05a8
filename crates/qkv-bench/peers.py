#!/usr/bin/env python3
"""qkv's Python peers: NumPy (matmul, softmax, matmul) and, when installed, PyTorch's fused
``scaled_dot_product_attention``, timed on the shapes of ``cargo xtask bench`` (f32 and bf16;
d = 64 unless a case says otherwise) and printed with the same columns. A KV-cache case is a
decoding step over keys and values already in memory: SDPA takes those tensors as they are. A
backward case times ``out.backward(d_out)`` alone, after one forward with ``requires_grad``.

    python3 crates/qkv-bench/peers.py [--quick] [--json FILE] [--cases FILE]

Run alone, it times the cases of ``CASES`` below (the same list as
``crates/qkv-bench/src/cases.rs``, or those of ``--cases FILE``: a JSON list of objects with
label, batch, heads, kv_heads, n_q, n_k, d, causal, precision, cache, backward).
``cargo xtask bench --python PYTHON`` instead starts it as a server per library (``--serve numpy``,
``--serve torch``) and asks it for runs of one case at a time, so that qkv's runs and PyTorch's
take turns within a row (see ``serve``).

Each library runs in its own child process: NumPy's with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE
removed from the environment (they may be set on this machine and would pin OpenBLAS to a slower
kernel), PyTorch's with the environment as it is.
"""

import importlib.util
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
    ("4x8h n=16", 4, 8, 8, 16, 16, False),
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


def run_count(once, quick):
    """The rule of the Rust side's `measure::run_count`: about 3 s of runs (0.3 s quick), at least
    7 (5), at most 51, or 3 of a run over 2 s."""
    budget, least = (0.3, 5) if quick else (3.0, 7)
    return 3 if once > 2.0 else max(least, min(51, int(budget / max(once, 1e-4))))


def times(fn, runs):
    """Seconds of each of `runs` calls of `fn`."""
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def median_seconds(fn, quick):
    fn()  # warm-up
    return statistics.median(times(fn, run_count(times(fn, 1)[0], quick)))


def numpy_runner(c, quick):
    """NumPy's unfused attention on `c` as (name, fn), or None where NumPy has nothing to compare:
    no bf16, no gradients, no KV cache (those are PyTorch's)."""
    import numpy as np

    b, h, kv, n_q, n_k, causal, d = (c[f] for f in ("batch", "heads", "kv_heads", "n_q", "n_k", "causal", "d"))
    if (quick and n_q * n_k > 4096 * 4096) or c["precision"] != "f32" or c["cache"] or c["backward"]:
        return None
    rng = np.random.default_rng(0)
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

    return "numpy unfused", run


def torch_runner(c, threads):
    """PyTorch's SDPA on `c` with `threads` threads as (name, fn), or None without PyTorch."""
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return None
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    b, h, kv, n_q, n_k, causal, d = (c[f] for f in ("batch", "heads", "kv_heads", "n_q", "n_k", "causal", "d"))
    dtype = torch.bfloat16 if c["precision"] == "bf16" else torch.float32
    q = (torch.rand(b, h, n_q, d) * 2 - 1).to(dtype)
    k = (torch.rand(b, kv, n_k, d) * 2 - 1).to(dtype)
    v = (torch.rand(b, kv, n_k, d) * 2 - 1).to(dtype)
    # Bottom-right causal alignment, as qkv's default (is_causal is top-left; equal when n_q = n_k).
    kwargs = {"is_causal": causal}
    if h != kv:
        kwargs["enable_gqa"] = True
    name = f"torch {torch.__version__} sdpa" + (" bf16" if dtype == torch.bfloat16 else "")
    if c["backward"]:
        # The forward once, outside the timing; then out.backward(d_out) alone, the gradients
        # reset before each run.
        for x in (q, k, v):
            x.requires_grad_()
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
        d_out = torch.rand_like(out) * 2 - 1

        def run():
            for x in (q, k, v):
                x.grad = None
            out.backward(d_out, retain_graph=True)

        return name + " backward", run

    def run():
        with torch.inference_mode():
            return F.scaled_dot_product_attention(q, k, v, **kwargs)

    return name, run


def runner(kind, c, threads, quick):
    return numpy_runner(c, quick) if kind == "numpy" else torch_runner(c, threads)


def torch_missing(kind):
    """Whether `kind` is PyTorch and it does not import here (said on stderr)."""
    missing = kind == "torch" and importlib.util.find_spec("torch") is None
    if missing:
        print(f"PyTorch is not installed for {sys.executable}: skipping scaled_dot_product_attention", file=sys.stderr)
    return missing


def worker(kind, cases, quick):
    """Every case at all threads and, where it is not too long, at one (PyTorch only)."""
    rows = []
    if torch_missing(kind):
        cases = []
    all_threads = os.cpu_count()
    if kind == "torch" and cases:
        import torch

        # PyTorch's own default (one thread per physical core), read before a case sets it to one.
        all_threads = torch.get_num_threads()
    for c in cases:
        for threads in (all_threads, 1):
            if threads == 1 and (kind == "numpy" or quick or c["n_q"] * c["n_k"] > 4096 * 4096):
                continue
            found = runner(kind, c, threads, quick)
            if found is None:
                continue
            name, run = found
            rows.append(row(c, name, threads, median_seconds(run, quick)))
    json.dump(rows, sys.stdout)


def serve(kind, quick):
    """Times calls on request, so that the benchmark can take turns with it in one sitting: each
    line of stdin is {"case": CASE, "threads": T, "runs": N, "warm": SECONDS}; the reply, one line,
    is {"implementation": NAME, "seconds": [...]} after untimed calls for "warm" seconds (at least
    one if it is positive or the case is new), or {"implementation": null} where `kind` has
    nothing for the case."""
    prepared = {}
    torch_missing(kind)
    for line in sys.stdin:
        request = json.loads(line)
        c, threads = {**DEFAULTS, **request["case"]}, request["threads"]
        key = (c["label"], threads)
        new = key not in prepared
        if new:
            prepared.clear()  # one case at a time: the last one's tensors are freed
            prepared[key] = runner(kind, c, threads, quick)
        found = prepared[key]
        if found is None:
            reply = {"implementation": None}
        else:
            name, run = found
            warm, start = request.get("warm", 0.0), time.perf_counter()
            if new or warm > 0:
                run()
            while time.perf_counter() - start < warm:
                run()
            reply = {"implementation": name, "seconds": times(run, request["runs"])}
        print(json.dumps(reply), flush=True)


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


def main():
    args = sys.argv[1:]
    quick = "--quick" in args
    value = lambda name: args[args.index(name) + 1] if name in args else None
    cases_path = value("--cases")
    cases = load_cases(cases_path) if cases_path else [as_case(c) for c in CASES]
    if "--serve" in args:
        serve(value("--serve"), quick)
        return
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
