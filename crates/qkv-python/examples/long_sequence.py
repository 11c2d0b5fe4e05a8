#!/usr/bin/env python3
"""A sequence too long for one process's memory, attended over four (``qkv.distributed``).

    python crates/qkv-python/examples/long_sequence.py [--n 8192] [--heads 32] [--dim 128] [--budget-mib 448]

Every process gets ``--budget-mib`` of data memory beyond what importing torch took (a
``RLIMIT_DATA`` limit, so an allocation past it fails; in the engine, an allocation failure
aborts the process). The whole problem, queries, keys, values
and output in float32, needs ``4 · n · heads · dim · 4`` bytes (512 MiB at the defaults): one
process with the budget cannot hold them. Four processes on a gloo group over
127.0.0.1 each hold a quarter (zig-zag slices, causal), pass key/value slices around the ring,
and produce their quarter of the output (each holds its queries, the key/value slice it works on
and the one arriving, and the partial results: at the defaults a peak of about 310 MiB resident
beyond torch's own, measured, against 512 MiB for the whole problem; a smaller share on more
processes); the first chunk's rows, which see only that chunk's
keys, are checked against ``qkv.scaled_dot_product_attention`` on that chunk alone.
"""

import argparse
import os
import resource
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import qkv
import qkv.distributed as cp


def status(field):
    """A field of /proc/self/status in bytes: VmData (heap and private anonymous mappings, what
    RLIMIT_DATA limits), VmRSS, VmHWM (peak resident)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def limit_memory(budget_mib):
    """Allows ``budget_mib`` more of data memory (none: no limit); returns the resident memory now,
    to report the peak beyond it."""
    if budget_mib:
        limit = status("VmData") + budget_mib * 2**20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    return status("VmRSS")


def chunk(index, chunks, args):
    """Chunk ``index`` of the whole sequence's queries, keys and values, from its own seed, so
    that a process makes its chunks without the rest."""
    gen = torch.Generator().manual_seed(index)
    n = args.n // chunks
    return [torch.randn(1, args.heads, n, args.dim, generator=gen) for _ in range(3)]


def one_process(rank, args, results):
    limit_memory(args.budget_mib)
    try:
        q, k, v = (torch.empty(1, args.heads, args.n, args.dim) for _ in range(3))
        size = args.n // 8
        for i in range(8):
            for whole, part in zip((q, k, v), chunk(i, 8, args)):
                whole[:, :, i * size : (i + 1) * size] = part
        qkv.scaled_dot_product_attention(q, k, v, is_causal=True)
        results.put("one process: ran (raise --n or lower --budget-mib)")
    except (RuntimeError, MemoryError) as error:
        results.put(f"one process: {type(error).__name__}: {str(error).splitlines()[0][:120]}")


def four_processes(rank, args, port, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    resident = limit_memory(args.budget_mib)
    # Zig-zag: chunks rank and 7 - rank of 8.
    mine = [chunk(i, 8, args) for i in (rank, 7 - rank)]
    q, k, v = (torch.cat([c[j] for c in mine], 2) for j in range(3))
    first_chunk = mine[0] if rank == 0 else None
    del mine
    start = time.perf_counter()
    out = cp.context_parallel_attention(q, k, v, is_causal=True)
    elapsed = time.perf_counter() - start
    check = ""
    if rank == 0:
        first = qkv.scaled_dot_product_attention(*first_chunk, is_causal=True)
        check = f", chunk 0 against one-chunk attention: {(out[:, :, : first.shape[2]] - first).abs().max().item():.1e}"
    peak = (status("VmHWM") - resident) / 2**20
    results.put(f"rank {rank}: {tuple(out.shape)} in {elapsed:.1f} s, peak resident beyond torch's {peak:.0f} MiB{check}")
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--budget-mib", type=int, default=448, help="0: no limit")
    args = parser.parse_args()
    # glibc keeps freed blocks below its (growing) mmap threshold in its arenas, where they still
    # count against RLIMIT_DATA: blocks of 1 MiB and more go back to the system when freed.
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(2**20))
    whole = 4 * args.n * args.heads * args.dim * 4 / 2**20
    print(f"n = {args.n}, {args.heads} heads of {args.dim}, causal: {whole:.0f} MiB of inputs and output; "
          f"{args.budget_mib} MiB per process")
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(one_process, args=(args, results), nprocs=1)
    print(results.get())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(four_processes, args=(args, port, results), nprocs=4)
    for _ in range(4):
        print(results.get())


if __name__ == "__main__":
    main()
