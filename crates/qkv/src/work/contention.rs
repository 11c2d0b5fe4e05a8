//! Whether the pool's helpers are kept off their CPUs by other programs' threads.
//!
//! A caller cannot finish before every helper it handed work to has run, even one that then finds
//! nothing left to take, and a CPU shared with a thread that spins can keep a helper waiting for a
//! scheduler's time slice: OpenMP runtimes' threads spin so for milliseconds after each parallel
//! operation, PyTorch's among them. Measured on a Zen 5 (family 26, 2 vCPUs) with a thread spinning
//! beside a batch of 8 packed prefills (16 shared calls): the calling thread did all but a few
//! items and then waited for its helper 0.7 ms a call, up to 7 ms, and the batch took 22.7 ms on
//! two threads against 10.4 ms on one (with nothing spinning, it waited 0.013 ms a call). From
//! Python, a qkv call right after a PyTorch operation took 14 times as long as after a pause. So
//! helpers note how late they start, and for a while after a late one only work that outlasts
//! such a wait is shared.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// A helper that starts on its share this long after its caller handed the work out was kept off
/// its CPU (a helper that moves off its caller's CPU onto a busy one waits there before it
/// starts), or the pool's threads were busy with other work, where sharing gains nothing either.
/// A helper woken on an idle CPU starts within tens of microseconds.
const KEPT_WAITING_FROM: Duration = Duration::from_millis(1);

/// How long small work stays on the calling thread after a late helper, in nanoseconds: this long
/// after the first, twice as long after a second that comes within [`STREAK_GAP_NS`] of the end
/// of the window before, and so on up to 32 times as long. The host's noise delays a helper now
/// and then (about once a second on a Zen 5, by 3 ms, with nothing else running), which should
/// cost little; a thread that spins beside the caller all the while keeps every helper late, and
/// each call that shares to find out whether it has gone waits for its helper.
const FIRST_WINDOW_NS: u64 = 5_000_000;

/// The longest window is `FIRST_WINDOW_NS << MOST_DOUBLINGS`.
const MOST_DOUBLINGS: u32 = 5;

/// A late helper that starts within this long of the end of the last window finds whatever kept
/// helpers waiting still there, and the window doubles. One later opens the first window again:
/// another program that spins only after each of its operations, in turns with this one, should
/// not hold small work home through the turns that follow (`qkv-bench --python` times PyTorch in
/// such turns).
const STREAK_GAP_NS: u64 = FIRST_WINDOW_NS;

/// What the helpers have seen of their CPUs lately, from their arrivals.
pub(super) struct Contention {
    /// Until when small work stays on the calling thread, in the caller's nanoseconds (0: no streak
    /// of late helpers).
    until_ns: AtomicU64,
    /// How many times the window has doubled since the streak of late helpers began.
    doublings: AtomicU32,
    /// How late the last late helper started, in nanoseconds.
    late_by_ns: AtomicU64,
}

impl Contention {
    /// No helper seen yet.
    pub(super) const fn new() -> Contention {
        Contention {
            until_ns: AtomicU64::new(0),
            doublings: AtomicU32::new(0),
            late_by_ns: AtomicU64::new(0),
        }
    }

    /// Notes a helper that started on its share `late` after its work was handed out, at `now_ns`.
    /// A helper on time after the window has passed ends the streak: whatever kept helpers waiting
    /// has gone (another library's threads spin only for a while after each of its operations).
    /// One on time within the window changes nothing: only large work is shared then, and a
    /// thread that spins now and then may be away for the moment. The hot path stays a comparison.
    pub(super) fn arrived(&self, late: Duration, now_ns: u64) {
        if late < KEPT_WAITING_FROM {
            let until = self.until_ns.load(Ordering::Relaxed);
            if until != 0 && now_ns >= until {
                // Unless another helper opened a window meanwhile.
                if self.until_ns.compare_exchange(until, 0, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
                    self.doublings.store(0, Ordering::Relaxed);
                }
            }
            return;
        }
        self.late_by_ns.store(u64::try_from(late.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
        let last_until = self.until_ns.load(Ordering::Relaxed);
        let in_streak = last_until != 0 && now_ns < last_until.saturating_add(STREAK_GAP_NS);
        let doublings =
            if in_streak { (self.doublings.load(Ordering::Relaxed) + 1).min(MOST_DOUBLINGS) } else { 0 };
        self.doublings.store(doublings, Ordering::Relaxed);
        let until = now_ns.saturating_add(FIRST_WINDOW_NS << doublings);
        self.until_ns.fetch_max(until, Ordering::Relaxed);
    }

    /// While small work should stay on the calling thread at `now_ns`, how late the last late
    /// helper started.
    pub(super) fn kept_waiting(&self, now_ns: u64) -> Option<Duration> {
        self.holds(now_ns).then(|| Duration::from_nanos(self.late_by_ns.load(Ordering::Relaxed)))
    }

    /// Whether small work should stay on the calling thread at `now_ns`.
    fn holds(&self, now_ns: u64) -> bool {
        now_ns < self.until_ns.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
