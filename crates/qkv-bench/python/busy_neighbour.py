#!/usr/bin/env python3
"""qkv's and PyTorch's attention called back to back while other programs keep the CPUs busy:
``--spinners`` processes that spin for ever beside this one (as another job on a shared machine
does), started before the timing and ended after it.

    pip install ./crates/qkv-python
    python crates/qkv-bench/python/busy_neighbour.py [--spinners N] [--calls N]

Times ``qkv.scaled_dot_product_attention`` and PyTorch's SDPA on ``[1, 8, 512, 64]``, causal,
float32, ``--calls`` calls each back to back, and prints per library the mean, the median, the
90th percentile and the slowest call in ms. qkv runs on PyTorch's OpenMP threads, or with
``QKV_TORCH_THREADS=0`` on its own.
"""

import argparse
import statistics
import subprocess
import sys
import time

import torch

import qkv


def timed(f, calls):
    """Per-call times of ``calls`` calls of ``f`` in ms, sorted."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        f()
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spinners", type=int, default=1, help="processes spinning beside this one")
    parser.add_argument("--calls", type=int, default=200, help="calls timed per library")
    args = parser.parse_args()
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 8, 512, 64) for _ in range(3))
    calls = {
        "qkv": lambda: qkv.scaled_dot_product_attention(q, k, v, is_causal=True),
        "PyTorch SDPA": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    for f in calls.values():
        f()
    whose = "PyTorch's OpenMP threads" if qkv._qkv.uses_openmp() else "its own threads"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; qkv on {whose}; "
          f"{args.spinners} spinning process(es) beside")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.spinners)]
    try:
        time.sleep(0.5)
        for name, f in calls.items():
            t = timed(f, args.calls)
            print(f"  {name:13} mean {statistics.mean(t):7.2f}  median {t[len(t) // 2]:7.2f}  "
                  f"p90 {t[len(t) * 9 // 10]:7.2f}  slowest {t[-1]:7.2f} ms")
    finally:
        for s in spinners:
            s.kill()
            s.wait()


if __name__ == "__main__":
    main()
