//! Another library's threads as the ones a call shares its work with ([`ThreadTeam`]).
//!
//! Two libraries in one process each keep threads of their own, and each library's idle threads
//! wait for a while, spinning, before they sleep. On few cores they then hold each other up: in a
//! PyTorch model's loop (a PyTorch product, a qkv call, a product, layer after layer) PyTorch's
//! OpenMP threads spin for milliseconds after every product, on the CPUs where qkv's helpers would
//! run, and qkv's calls ran at one thread's speed. Calls made inside [`with_thread_team`] share
//! their work with the given team instead, whose threads are the ones spinning.

use std::any::Any;
use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Arc, Mutex, PoisonError};

/// Threads that qkv's calls can share their work with in place of its own (rayon's) pool: for
/// an embedder whose process already keeps a pool of threads, such as an OpenMP runtime's.
///
/// qkv asks [`run`](Self::run) for at most [`threads`](Self::threads) threads and hands them its
/// items through a shared counter, so the results do not depend on how many threads the team
/// really starts, nor on which of them takes which item; a team that runs `work` fewer times
/// (the calling thread takes what is left once `run` returns), or one call after another, only
/// runs slower.
pub trait ThreadTeam: Send + Sync {
    /// How many threads [`run`](Self::run) would start now, the calling thread included (0 counts
    /// as 1, and a team of one runs every call on the calling thread; calls plan for at most
    /// 4096).
    fn threads(&self) -> usize;

    /// Calls `work` once on each of `threads` threads at the same time, one of them the calling
    /// thread, and returns when every call has returned. `work` never unwinds.
    fn run(&self, threads: usize, work: &(dyn Fn() + Sync));
}

thread_local! {
    /// The team of [`with_thread_team`] on this thread, if any.
    static TEAM: RefCell<Option<Arc<dyn ThreadTeam>>> = const { RefCell::new(None) };
}

/// Runs `f`, and shares the work of every qkv call that `f` makes on this thread with `team`
/// instead of qkv's rayon pool (calls of the pool's own threads, and of other threads, are not
/// affected). Nested, the innermost team holds; the one before it is back when `f` returns or
/// unwinds.
///
/// ```
/// use std::sync::Arc;
///
/// /// A team that is only the calling thread: the calls in it never share their work.
/// struct Alone;
///
/// impl qkv::ThreadTeam for Alone {
///     fn threads(&self) -> usize {
///         1
///     }
///
///     fn run(&self, _threads: usize, work: &(dyn Fn() + Sync)) {
///         work()
///     }
/// }
///
/// let q = qkv::ndarray::Array2::<f32>::ones((300, 64));
/// let options = qkv::AttentionOptions::new();
/// let attend = || qkv::attention(q.view(), q.view(), q.view(), &options);
/// assert_eq!(qkv::with_thread_team(Arc::new(Alone), attend)?, attend()?);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn with_thread_team<R>(team: Arc<dyn ThreadTeam>, f: impl FnOnce() -> R) -> R {
    /// Puts the team that was there back, also when `f` unwinds.
    struct Restore(Option<Arc<dyn ThreadTeam>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            TEAM.with(|team| *team.borrow_mut() = self.0.take());
        }
    }
    let _restore = Restore(TEAM.with(|current| current.borrow_mut().replace(team)));
    f()
}

/// The team of [`with_thread_team`] on this thread, if any.
pub(super) fn current() -> Option<Arc<dyn ThreadTeam>> {
    TEAM.with(|team| team.borrow().clone())
}

/// Whether this thread is inside [`with_thread_team`] (without taking the team).
pub(super) fn active() -> bool {
    TEAM.with(|team| team.borrow().is_some())
}

/// Runs `work` on `threads` threads of `team`. A panic on any of them is caught there (it never
/// unwinds through the team's own code, which may be another language's) and resumed on the
/// calling thread once every thread has returned.
pub(super) fn run(team: &dyn ThreadTeam, threads: usize, work: &(dyn Fn() + Sync)) {
    let panic: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);
    team.run(threads, &|| {
        if let Err(payload) = catch_unwind(AssertUnwindSafe(work)) {
            panic.lock().unwrap_or_else(PoisonError::into_inner).get_or_insert(payload);
        }
    });
    if let Some(payload) = panic.into_inner().unwrap_or_else(PoisonError::into_inner) {
        resume_unwind(payload);
    }
}
