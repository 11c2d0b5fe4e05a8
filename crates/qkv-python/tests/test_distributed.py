"""Context-parallel attention on 4 processes (gloo, 127.0.0.1) against single-process attention,
forward and backward through the output and the logsumexp, causal (zig-zag) and not, float64 and
float32; a group of one; and misuse that every rank refuses rather than wait or read short."""

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


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """What each of the 4 processes wrote: one group of processes runs every case."""
    out = tmp_path_factory.mktemp("cp")
    mp.spawn(cp_worker.run, args=(WORLD_SIZE, free_port(), str(out)), nprocs=WORLD_SIZE, join=True)
    return [json.loads((out / f"{rank}.json").read_text()) for rank in range(WORLD_SIZE)]


def test_four_processes_match_one(four_ranks):
    cases = [f"causal={c} {d}" for c, d in cp_worker.CASES]
    for name in cases:
        worst = {k: max(r[name][k] for r in four_ranks) for k in four_ranks[0][name]}
        print(f"{name}: largest differences from single-process float64 SDPA {worst}")
        assert sorted(worst) == ["dk", "dq", "dv", "lse", "out", "unsharded"], worst
        assert all(d <= TOLERANCE[name.split()[-1]] for d in worst.values()), (name, worst)


def test_a_group_of_one_is_attention_over_its_own_slice(four_ranks):
    for rank in four_ranks:
        assert all(d <= 1e-12 for d in rank["group of one"].values()), rank["group of one"]


def test_misuse_raises_on_every_rank(four_ranks):
    said = [r["misuse"] for r in four_ranks]
    # Rank 0's slice is a position short: every rank names it, none waits in a collective.
    assert all("query (1, 2, 7, 4)" in s["shapes differ"] for s in said), said
    assert all("every rank passes slices of one shape and dtype" in s["shapes differ"] for s in said), said
    assert "they need one dtype" in said[1]["one rank mixes dtypes"], said[1]
    for rank in (0, 2, 3):
        assert "rank 1 of the group refused its inputs" in said[rank]["one rank mixes dtypes"], said[rank]
    assert all("an even number of each" in s["odd causal slice"] for s in said), said
    assert said[0]["outside the group"] is None and said[1]["outside the group"] is None
    for rank in (2, 3):
        assert f"global rank {rank}) is not in the group" in said[rank]["outside the group"], said[rank]
    assert "query holds a NaN" in said[2]["a NaN on rank 2"], said[2]
    assert all("rank 2 of the group refused" in said[r]["a NaN on rank 2"] for r in (0, 1, 3)), said
    assert all("a backward to run" in s["only rank 3 differentiates"] for s in said), said


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
