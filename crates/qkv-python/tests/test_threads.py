"""qkv's calls on torch tensors run on PyTorch's OpenMP threads where PyTorch runs on OpenMP
(``qkv/_threads.py``): the same results as on qkv's own threads, whatever the thread count, and a
forked worker that gives PyTorch one thread (as PyTorch's DataLoader does) runs them."""

import multiprocessing
import os
import subprocess
import sys

import pytest
import torch

import qkv
import threads_worker

ON_OPENMP = "parallel backend: OpenMP" in torch.__config__.parallel_info()


def results_in_a_process(tmp_path, name, threads, **environment):
    """`threads_worker.calls()` in a fresh process with `environment` (and `threads` PyTorch threads
    unless 0), loaded back."""
    path = tmp_path / f"{name}.pt"
    env = {**os.environ, **environment}
    worker = os.path.join(os.path.dirname(__file__), "threads_worker.py")
    subprocess.run([sys.executable, worker, str(path), str(threads)], env=env, check=True, timeout=300)
    return torch.load(path)


def test_calls_run_on_pytorchs_threads_where_pytorch_runs_on_openmp():
    qkv.scaled_dot_product_attention(*(torch.randn(1, 2, 4, 8) for _ in range(3)))
    assert qkv._qkv.uses_openmp() == (ON_OPENMP and os.environ.get("QKV_TORCH_THREADS") != "0")


def test_results_do_not_depend_on_whose_threads_run_them(tmp_path):
    own = results_in_a_process(tmp_path, "own", 0, QKV_TORCH_THREADS="0")
    assert not own.pop("uses openmp")
    assert own.pop("openmp regions") == 0
    own.pop("torch threads")
    for threads in (0, 1, 3):
        torch_threads = results_in_a_process(tmp_path, f"torch{threads}", threads, QKV_TORCH_THREADS="1")
        assert bool(torch_threads.pop("uses openmp")) == ON_OPENMP
        # The calls spread over PyTorch's threads where it has more than one, and never otherwise.
        regions, team = torch_threads.pop("openmp regions"), torch_threads.pop("torch threads")
        assert (regions > 0) == (ON_OPENMP and team > 1), f"{regions} regions on {team} threads"
        assert sorted(torch_threads) == sorted(own)
        for name, result in own.items():
            assert torch.equal(torch_threads[name], result), f"{name}: {threads} PyTorch threads"


def forked_worker(query):
    """What PyTorch's DataLoader worker does first (one thread), then a qkv call."""
    torch.set_num_threads(1)
    return qkv.scaled_dot_product_attention(query, query, query)


@pytest.mark.skipif(
    not ON_OPENMP or sys.platform != "linux" or os.environ.get("QKV_TORCH_THREADS") == "0",
    reason="qkv on PyTorch's OpenMP threads, processes forked",
)
def test_a_forked_worker_with_one_pytorch_thread_runs_qkv():
    query = torch.randn(2, 8, 300, 64)
    want = qkv.scaled_dot_product_attention(query, query, query)  # the parent's threads at work first
    with multiprocessing.get_context("fork").Pool(2) as pool:
        got = pool.map_async(forked_worker, [query] * 2).get(timeout=120)
    assert all(torch.equal(g, want) for g in got)
