#!/usr/bin/env python3
"""qkv calls between PyTorch operations, as a model runs them, in one process: how long a PyTorch
operation takes right after a qkv call, and a qkv call right after a PyTorch operation, each
against the same call after a pause. Both libraries keep threads of their own (qkv rayon's, PyTorch
OpenMP's), and each library's idle threads wait for a while before they sleep; on few cores a
waiting thread can hold up the other library's.

    pip install ./crates/qkv-python
    python crates/qkv-bench/python/interleave.py [--rounds N]

Rows: a 384 × 384 float32 matrix product (PyTorch), after a pause of 2 ms or right after
``qkv.scaled_dot_product_attention`` on 8 heads × 256 queries, d = 64; that attention after a
pause or right after the product; and ``qkv.varlen_attention`` on 8 packed causal prefills (GQA
8/2), after a pause of 300 ms or right after a PyTorch 512 × 512 matrix product. Each row gives
the median, the slowest and how many calls took more than twice the median, over ``--rounds``
calls. A single head of those, after a product, by qkv and by PyTorch's SDPA (and qkv's after a
pause of 50 ms, when PyTorch's threads have gone to sleep). Last, a model's loop: 12 layers of a
product, the attention and a product, with the attention by qkv and by PyTorch's SDPA,
alternating. qkv runs on PyTorch's OpenMP threads, or with
``QKV_TORCH_THREADS=0`` on its own (``RAYON_NUM_THREADS``); environment variables that change how
the threads wait (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) apply as usual.
"""

import argparse
import statistics
import time

import torch

import qkv


def timed_ms(call):
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def row(name, before, call, rounds):
    times = []
    for _ in range(rounds):
        before()
        times.append(timed_ms(call))
    median = statistics.median(times)
    slow = sum(t > 2 * median for t in times)
    print(f"  {name:34s} median {median:7.3f} ms  slowest {max(times):7.3f} ms  {slow:3d} over twice the median")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    rounds = parser.parse_args().rounds
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {qkv.simd_report()}")
    qkv.scaled_dot_product_attention(*(torch.randn(1, 1, 1, 8) for _ in range(3)))
    print("qkv on " + ("PyTorch's OpenMP threads" if qkv._qkv.uses_openmp() else "its own threads"))
    with torch.no_grad():
        a, b = torch.randn(384, 384), torch.randn(512, 512)
        q, k, v = (torch.randn(1, 8, 256, 64) for _ in range(3))
        lengths = [866, 673, 560, 343, 377, 136, 167, 114]
        offsets = [0]
        for n in lengths:
            offsets.append(offsets[-1] + n)
        pq, pk, pv = torch.randn(offsets[-1], 8, 64), torch.randn(offsets[-1], 2, 64), torch.randn(offsets[-1], 2, 64)

        def torch_op():
            return a @ a

        def qkv_attention():
            return qkv.scaled_dot_product_attention(q, k, v)

        def torch_attention():
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

        def single_heads(attend):
            return lambda: attend(q[:, :1], k[:, :1], v[:, :1])

        def layers(attention):
            def run():
                for _ in range(12):
                    a @ a
                    attention()
                    a @ a

            return run

        def packed():
            return qkv.varlen_attention(pq, pk, pv, offsets, offsets, is_causal=True)

        for warm in (torch_op, qkv_attention, torch_attention, packed):
            warm()
        print("a PyTorch 384 x 384 matrix product")
        row("after a pause of 2 ms", lambda: time.sleep(0.002), torch_op, rounds)
        row("right after a qkv call", qkv_attention, torch_op, rounds)
        print("qkv.scaled_dot_product_attention, 8 heads x 256")
        row("after a pause of 2 ms", lambda: time.sleep(0.002), qkv_attention, rounds)
        row("right after a PyTorch matrix product", torch_op, qkv_attention, rounds)
        print("one head x 256 right after a PyTorch matrix product, and qkv's after a pause of 50 ms")
        row("qkv", torch_op, single_heads(qkv.scaled_dot_product_attention), rounds)
        row("PyTorch SDPA", torch_op, single_heads(torch.nn.functional.scaled_dot_product_attention), rounds)
        row("qkv after a pause of 50 ms", lambda: time.sleep(0.05), single_heads(qkv.scaled_dot_product_attention),
            min(rounds, 40))
        print("qkv.varlen_attention, 8 packed prefills")
        row("after a pause of 300 ms", lambda: time.sleep(0.3), packed, min(rounds, 10))
        row("right after a PyTorch matrix product", lambda: b @ b, packed, rounds)
        print("12 layers of a product, attention and a product")
        loops = {"qkv": [], "PyTorch SDPA": []}
        for _ in range(rounds):
            loops["qkv"].append(timed_ms(layers(qkv_attention)))
            loops["PyTorch SDPA"].append(timed_ms(layers(torch_attention)))
        for name, times in loops.items():
            print(f"  attention by {name:21s} median {statistics.median(times):7.3f} ms  slowest {max(times):7.3f} ms")


if __name__ == "__main__":
    main()
