"""Context-parallel attention on 4 processes (gloo, 127.0.0.1) against single-process attention,
forward and backward, causal (zig-zag) and not, float64 and float32."""

import json
import socket

import torch.multiprocessing as mp

import cp_worker

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
