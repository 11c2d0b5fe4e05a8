"""qkv's calls on PyTorch's own threads.

PyTorch runs its operators on OpenMP threads, which spin for a while after each operator before
they sleep. qkv's own helper threads, woken on the same few CPUs, waited behind them: in a model's
loop (a PyTorch product, qkv's attention, a product, layer after layer) every qkv call ran at one
thread's speed. So where PyTorch runs on OpenMP, the package hands the engine that runtime's
``GOMP_parallel`` (exported by GNU libgomp, LLVM's libomp and Intel's libiomp5 alike), and qkv's
calls run on PyTorch's threads, as many as ``omp_get_max_threads()`` on the calling thread (what
``torch.set_num_threads`` sets). ``QKV_TORCH_THREADS=0`` in the environment keeps qkv on its own
threads (``RAYON_NUM_THREADS``).

A process forked from one that used either has none of their threads: the extension then starts
threads of its own in the child (``_qkv.forked``, registered below), where a call would otherwise
wait forever for threads that are not there.
"""

import ctypes
import os

from . import _qkv


def use_torch_threads(torch):
    """Runs qkv's calls on the OpenMP runtime PyTorch's own library is linked to, if it runs on
    one; otherwise (or with ``QKV_TORCH_THREADS=0``, or if anything about it is not as expected)
    qkv keeps its own threads. Returns whether calls run on PyTorch's."""
    if _qkv.uses_openmp():
        return True
    no_load = getattr(os, "RTLD_NOLOAD", None)
    if os.environ.get("QKV_TORCH_THREADS") == "0" or no_load is None:
        return False
    try:
        if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
            return False
        # The symbols as torch's extension resolves them: looked up through its handle, dlsym
        # searches the library and the ones it depends on, so this is the runtime PyTorch runs
        # on, never another one loaded beside it. RTLD_NOLOAD: nothing new is loaded.
        runtime = ctypes.CDLL(torch._C.__file__, mode=no_load | os.RTLD_LAZY)
        parallel, max_threads = runtime.GOMP_parallel, runtime.omp_get_max_threads
    except Exception:  # noqa: BLE001 - any surprise leaves qkv on its own threads
        return False

    def address(function):
        return ctypes.cast(function, ctypes.c_void_p).value

    _qkv.use_openmp(address(parallel), address(max_threads))
    return True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_qkv.forked)
