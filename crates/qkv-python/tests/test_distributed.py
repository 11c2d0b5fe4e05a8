"""Context-parallel attention on 4 processes (gloo, 127.0.0.1) against single-process attention,
forward and backward, causal (zig-zag) and not, float64 and float32."""

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp

import cp_worker
import qkv.distributed as cp

WORLD_SIZE = 4
# Largest difference allowed from PyTorch's float64 SDPA, per dtype.
TOLERANCE = {"float64": 1e-12, "float32": 2e-5}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_four_processes_match_one(tmp_path):
    mp.spawn(cp_worker.run, args=(WORLD_SIZE, free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(WORLD_SIZE)]
    assert sorted(ranks[0]) == sorted(f"causal={c} {d}" for c, d in cp_worker.CASES)
    for name in ranks[0]:
        worst = {k: max(r[name][k] for r in ranks) for k in ranks[0][name]}
        print(f"{name}: largest differences from single-process float64 SDPA {worst}")
        assert all(d <= TOLERANCE[name.split()[-1]] for d in worst.values()), (name, worst)


def test_zig_zag_shards_balance_causal_work_and_cover_the_sequence():
    x = torch.arange(16).reshape(1, 16, 1)
    shards = [cp.shard(x, rank, 4, is_causal=True, dim=1).flatten().tolist() for rank in range(4)]
    # Rank r holds chunks r and 7 - r of 8: each rank the same number of causal (query, key) pairs.
    assert shards[0] == [0, 1, 14, 15] and shards[3] == [6, 7, 8, 9]
    assert sorted(sum(shards, [])) == list(range(16))
    work = [sum(p + 1 for p in s) for s in shards]
    assert len(set(work)) == 1, work
    assert cp.shard(x, 1, 4, dim=1).flatten().tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="does not split into 8 equal chunks"):
        cp.shard(x[:, :12], 0, 4, is_causal=True, dim=1)
