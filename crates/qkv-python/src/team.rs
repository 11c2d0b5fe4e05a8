//! PyTorch's OpenMP threads as the engine's thread team (`qkv::ThreadTeam`).
//!
//! PyTorch's operators run on OpenMP threads, which spin for a while after each operator before
//! they sleep; qkv's own (rayon) helpers, woken on the same few CPUs, waited behind them, and in a
//! model's loop of PyTorch products and qkv attention every qkv call ran at one thread's speed.
//! Run on PyTorch's team instead (the runtime's `GOMP_parallel`, which GNU libgomp, LLVM's libomp
//! and Intel's libiomp5 all export), a call finds those threads awake, and follows
//! `torch.set_num_threads`. The package finds the runtime PyTorch loaded and hands its two entry
//! points here (`python/qkv/_threads.py`).

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// `GOMP_parallel(fn, data, num_threads, flags)`: runs `fn(data)` on a team of `num_threads`
/// threads (0: the runtime's current setting), the calling thread one of them, and returns when
/// all have.
type GompParallel = unsafe extern "C" fn(extern "C" fn(*mut c_void), *mut c_void, c_uint, c_uint);
/// `omp_get_max_threads()`: how many threads the next parallel region would have.
type OmpGetMaxThreads = unsafe extern "C" fn() -> c_int;

/// An OpenMP runtime's team, through its entry points.
struct OpenMp {
    parallel: GompParallel,
    max_threads: OmpGetMaxThreads,
}

impl qkv::ThreadTeam for OpenMp {
    fn threads(&self) -> usize {
        // SAFETY: the address of the runtime's `omp_get_max_threads` (`use_openmp`).
        let threads = unsafe { (self.max_threads)() };
        usize::try_from(threads).unwrap_or(1).max(1)
    }

    fn run(&self, threads: usize, work: &(dyn Fn() + Sync)) {
        /// Each team thread's entry: `data` is `run`'s `work`.
        extern "C" fn on_each_thread(data: *mut c_void) {
            // SAFETY: `data` points at `work`, which outlives `GOMP_parallel`'s return, and `work`
            // is `Sync`. It never unwinds (`qkv::ThreadTeam::run`).
            let work = unsafe { &*data.cast::<&(dyn Fn() + Sync)>() };
            work();
        }
        REGIONS.fetch_add(1, Ordering::Relaxed);
        let data = std::ptr::from_ref(&work).cast_mut().cast::<c_void>();
        let threads = c_uint::try_from(threads).unwrap_or(c_uint::MAX);
        // SAFETY: the address of the runtime's `GOMP_parallel` (`use_openmp`); `data` lives
        // until it returns.
        unsafe { (self.parallel)(on_each_thread, data, threads, 0) }
    }
}

/// The team of `use_openmp`, once set.
static TEAM: OnceLock<Arc<dyn qkv::ThreadTeam>> = OnceLock::new();

/// How many calls shared their work on the team (`openmp_regions`).
static REGIONS: AtomicU64 = AtomicU64::new(0);

/// The team every call runs on, if the package set one.
pub(crate) fn current() -> Option<Arc<dyn qkv::ThreadTeam>> {
    TEAM.get().cloned()
}

/// Runs the engine's calls on the OpenMP runtime whose `GOMP_parallel` and `omp_get_max_threads`
/// are at these addresses (the package's own call, with the addresses it read through `ctypes`
/// from the runtime PyTorch loaded; any other address crashes the process). Returns whether this
/// call set the team (a second call changes nothing).
#[pyfunction]
fn use_openmp(parallel: usize, max_threads: usize) -> PyResult<bool> {
    if parallel == 0 || max_threads == 0 {
        return Err(PyValueError::new_err("use_openmp takes the addresses of two functions, not 0"));
    }
    // SAFETY: the package passes the addresses of these two functions of a loaded OpenMP runtime
    // (the documented contract of this private function).
    let team = unsafe {
        OpenMp {
            parallel: std::mem::transmute::<*const (), GompParallel>(std::ptr::with_exposed_provenance(
                parallel,
            )),
            max_threads: std::mem::transmute::<*const (), OmpGetMaxThreads>(
                std::ptr::with_exposed_provenance(max_threads),
            ),
        }
    };
    Ok(TEAM.set(Arc::new(team)).is_ok())
}

/// Whether the engine's calls run on an OpenMP team (`use_openmp`).
#[pyfunction]
fn uses_openmp() -> bool {
    TEAM.get().is_some()
}

/// How many of the engine's calls have shared their work on the OpenMP team so far, in this
/// process (for tests and benchmarks: whether calls really spread over PyTorch's threads).
#[pyfunction]
fn openmp_regions() -> u64 {
    REGIONS.load(Ordering::Relaxed)
}

/// Adds this module's functions to `qkv._qkv`.
pub(crate) fn register(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(use_openmp, module)?)?;
    module.add_function(wrap_pyfunction!(uses_openmp, module)?)?;
    module.add_function(wrap_pyfunction!(openmp_regions, module)?)?;
    Ok(())
}
