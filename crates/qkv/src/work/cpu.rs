//! Keeping a helper off its caller's CPU.
//!
//! Linux can leave a pool thread queued on the CPU where the calling thread computes while
//! another CPU idles: rayon's idle threads yield for a while before they sleep, so a thread that
//! landed beside the caller stays runnable there, and the scheduler does not move a task that ran
//! a moment ago (it counts it cache-hot). The helper then gets the CPU only when the caller is
//! done, and shared work runs at one thread's speed, call after call, until the scheduler moves
//! it. Measured on a 2-vCPU Zen 3 (2026-12-03): a single head of 256 queries took 0.21 ms when
//! the pool's two threads were on different CPUs and 0.31–0.35 ms (its one-thread time) in the
//! pools where both were on one; pinning the threads by hand made every pool fast.
//!
//! So the caller, as it starts on its share, yields its CPU once: a helper queued behind it runs
//! at once, and a helper that starts on its caller's CPU moves itself off it. It narrows its
//! allowed CPUs to exclude that one, which makes the kernel migrate it at once, and then restores
//! the set it had, so the move leaves no lasting pin. A thread allowed on one CPU only stays where
//! it is; on a platform without these calls nothing is done.

use std::thread::ThreadId;

/// Where the thread that shares out a call's work runs, recorded before it hands work out.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Caller {
    thread: ThreadId,
    cpu: Option<usize>,
}

impl Caller {
    /// The calling thread and the CPU it is on now.
    pub(crate) fn here() -> Caller {
        Caller { thread: std::thread::current().id(), cpu: current_cpu() }
    }

    /// Whether this is the thread that runs now.
    pub(crate) fn is_current(self) -> bool {
        std::thread::current().id() == self.thread
    }

    /// Called by every thread as it starts on the caller's work. The caller gives up its CPU
    /// once, so that a helper queued behind it runs now rather than when the caller is done; a
    /// helper that finds itself on the caller's CPU moves to another CPU it may run on. (The
    /// yield alone made things worse: the helper then ran beside the caller on one CPU.)
    pub(crate) fn arrive(self) {
        let Some(cpu) = self.cpu else { return };
        if self.is_current() {
            std::thread::yield_now();
        } else if current_cpu() == Some(cpu) {
            leave(cpu);
        }
    }
}

/// The CPU this thread is running on, where the platform says.
#[cfg(target_os = "linux")]
fn current_cpu() -> Option<usize> {
    // SAFETY: `sched_getcpu` takes no arguments and only reads the calling thread's state.
    let cpu = unsafe { libc::sched_getcpu() };
    usize::try_from(cpu).ok()
}

#[cfg(not(target_os = "linux"))]
fn current_cpu() -> Option<usize> {
    None
}

/// Moves this thread off `cpu` to another CPU it is allowed on, and allows it `cpu` again.
#[cfg(target_os = "linux")]
fn leave(cpu: usize) {
    use std::mem::{size_of, zeroed};
    // SAFETY: `cpu_set_t` is plain data, all zeros an empty set; the calls read and write only
    // the sets passed, with their true size, for the calling thread (pid 0). `CPU_ISSET` and
    // `CPU_CLR` are given a CPU below `CPU_SETSIZE`, checked first.
    unsafe {
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        let mut allowed: libc::cpu_set_t = zeroed();
        if libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut allowed) != 0
            || !libc::CPU_ISSET(cpu, &allowed)
        {
            return;
        }
        let mut elsewhere = allowed;
        libc::CPU_CLR(cpu, &mut elsewhere);
        if libc::CPU_COUNT(&elsewhere) == 0 {
            return;
        }
        if libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &elsewhere) == 0 {
            libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &allowed);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn leave(_cpu: usize) {}

#[cfg(all(test, target_os = "linux"))]
mod tests;
