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
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};
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

/// Runs `work` (one call of the engine) on the threads this process has: PyTorch's team where
/// the package set one, else rayon's pool; in a process forked from one that had them, on threads
/// of its own (`in_forked_child`).
pub(crate) fn run<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    if FORKED.load(Ordering::Relaxed) {
        return in_forked_child(work);
    }
    match TEAM.get() {
        Some(team) => qkv::with_thread_team(team.clone(), work),
        None => work(),
    }
}

/// Set in a process forked from this one's (`forked`, which the package registers with
/// `os.register_at_fork`), and in the processes forked from that.
static FORKED: AtomicBool = AtomicBool::new(false);

/// Notes that this process is a forked child (`os.register_at_fork(after_in_child=...)`).
#[pyfunction]
fn forked() {
    FORKED.store(true, Ordering::Relaxed);
}

/// A forked child has only the thread that forked: rayon's pool and an OpenMP runtime's team still
/// count the parent's threads, and a call shared with them would wait forever (a NumPy user's
/// `multiprocessing` child hung so). So a child runs its calls as many threads wide as the parent
/// would have (PyTorch's count, which `DataLoader` workers set to 1, or rayon's default,
/// `RAYON_NUM_THREADS` or the CPUs), on a pool it starts for itself; one thread is the calling
/// thread alone.
fn in_forked_child<R: Send>(work: impl FnOnce() -> R + Send) -> R {
    let threads = TEAM.get().map(|team| team.threads());
    if threads == Some(1) {
        static ALONE: OnceLock<Arc<dyn qkv::ThreadTeam>> = OnceLock::new();
        return qkv::with_thread_team(ALONE.get_or_init(|| Arc::new(CallerAlone)).clone(), work);
    }
    child_pool(threads.unwrap_or(0)).install(work)
}

/// A team of the calling thread alone.
struct CallerAlone;

impl qkv::ThreadTeam for CallerAlone {
    fn threads(&self) -> usize {
        1
    }

    fn run(&self, _threads: usize, work: &(dyn Fn() + Sync)) {
        work();
    }
}

/// A pool started in a forked process, and that process's id: a process forked from the child
/// inherits the pointer but not the threads, and starts one of its own.
struct ChildPool {
    pid: u32,
    pool: rayon::ThreadPool,
}

/// The pool of this forked process (`threads` wide, 0 for rayon's default), started on first use.
static CHILD_POOL: AtomicPtr<ChildPool> = AtomicPtr::new(std::ptr::null_mut());

fn child_pool(threads: usize) -> &'static rayon::ThreadPool {
    let pid = std::process::id();
    let current = CHILD_POOL.load(Ordering::Acquire);
    // SAFETY: a non-null pointer here came from `Box::into_raw` below and is never freed (the
    // pool of a parent that forked is leaked with it: its threads are not in this process).
    if let Some(pool) = unsafe { current.as_ref() }
        && pool.pid == pid
    {
        return &pool.pool;
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a forked process starts its own threads");
    let ours = Box::into_raw(Box::new(ChildPool { pid, pool }));
    match CHILD_POOL.compare_exchange(current, ours, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: `ours` is now the static's, never freed.
        Ok(_) => unsafe { &(*ours).pool },
        Err(theirs) => {
            // Another thread of this process started one first: ours stops, theirs serves.
            // SAFETY: `ours` was never shared; `theirs` came from `Box::into_raw` in this process.
            drop(unsafe { Box::from_raw(ours) });
            unsafe { &(*theirs).pool }
        }
    }
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
    module.add_function(wrap_pyfunction!(forked, module)?)?;
    Ok(())
}
