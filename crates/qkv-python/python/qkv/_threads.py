"""qkv's calls on PyTorch's own threads.

PyTorch runs its operators on OpenMP threads, which spin for a while after each operator before
they sleep. qkv's own helper threads, woken on the same few CPUs, waited behind them: in a model's
loop (a PyTorch product, qkv's attention, a product, layer after layer) every qkv call ran at one
thread's speed. So where PyTorch runs on OpenMP, the package hands the engine that runtime's
``GOMP_parallel`` (exported by GNU libgomp, LLVM's libomp and Intel's libiomp5 alike), and qkv's
calls on torch tensors run on PyTorch's threads, as many as ``torch.get_num_threads()``.
``QKV_TORCH_THREADS=0`` in the environment keeps qkv on its own threads (``RAYON_NUM_THREADS``).
"""

import ctypes
import glob
import os
import re

from . import _qkv

_RUNTIME = re.compile(r"^lib(g|i)?omp5?[-.]")


def _candidates(torch):
    """Paths of the OpenMP runtimes that may be loaded: those mapped into this process (Linux), then
    those PyTorch ships (every platform)."""
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            paths = [fields[5] for fields in map(str.split, maps) if len(fields) > 5]
    except OSError:
        pass
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    paths += glob.glob(os.path.join(lib, "*omp*"))
    seen = set()
    for path in paths:
        if _RUNTIME.match(os.path.basename(path)) and path not in seen:
            seen.add(path)
            yield path


def use_torch_threads(torch):
    """Runs qkv's calls on the OpenMP runtime PyTorch has loaded, if it runs on one; otherwise (or
    with ``QKV_TORCH_THREADS=0``) qkv keeps its own threads. Returns whether calls run on PyTorch's."""
    if _qkv.uses_openmp():
        return True
    no_load = getattr(os, "RTLD_NOLOAD", None)
    if os.environ.get("QKV_TORCH_THREADS") == "0" or no_load is None:
        return False
    try:
        if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
            return False
    except (AttributeError, RuntimeError):
        return False
    for path in _candidates(torch):
        try:
            # RTLD_NOLOAD: only a runtime already loaded; a second OpenMP runtime is never loaded.
            runtime = ctypes.CDLL(path, mode=no_load | os.RTLD_LAZY)
            parallel, max_threads = runtime.GOMP_parallel, runtime.omp_get_max_threads
        except (OSError, AttributeError):
            continue
        address = lambda f: ctypes.cast(f, ctypes.c_void_p).value  # noqa: E731
        _qkv.use_openmp(address(parallel), address(max_threads))
        return True
    return False
