//! How the fast path shares its independent work items between the calling thread and the
//! thread pool, and when it is worth sharing at all.
//!
//! A call from outside the pool that hands its items to the pool (`into_par_iter`) waits on the
//! pool's threads waking up, and on a virtual machine a sleeping thread can take tens of
//! microseconds to wake: a job of a few hundred microseconds then ran no faster on two cores
//! than on one. Here the calling thread starts on the items at once and the pool's threads join
//! in as they wake, each taking the next item from a shared counter, so a late thread costs
//! nothing but the items it did not take. A helper that Linux queued on the caller's own CPU
//! would take none: it moves off that CPU as it starts (`cpu`).
//!
//! A helper whose CPU another program keeps busy is the exception: the caller waits for it
//! however little it takes. Helpers note how late they start (`contention`), and for a while
//! after a late one only work that outlasts such a wait is shared.
//!
//! Inside [`with_thread_team`] the helpers are another library's threads instead of rayon's
//! (`team`), handed the same items the same way; their late starts are noted apart from rayon's.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use contention::Contention;
use cpu::Caller;

// Two calls into the OS's scheduler, each sound for the calling thread alone.
#[allow(unsafe_code)]
mod cpu;

mod contention;
mod team;

pub use team::{ThreadTeam, with_thread_team};

/// Work that one thread would finish in less than this many microseconds runs on the calling
/// thread (unless it comes right after another call, [`SHARE_BACK_TO_BACK_ABOVE_US`]): a pool
/// thread woken for it arrives too late to take a share worth its wake-up, and the caller then
/// waits for it at the end. Measured with
/// `crates/qkv-bench/examples/threshold.rs` (see its doc); a build with the environment variable
/// `QKV_SHARE_ABOVE_US` set to a whole number uses that instead, for that measurement.
const SHARE_ABOVE_US: f64 = match option_env!("QKV_SHARE_ABOVE_US") {
    Some(us) => parse_whole_number(us) as f64,
    None => 200.0,
};

/// Work of at least this many microseconds on one thread (and below [`SHARE_ABOVE_US`]) is shared
/// when the call comes right after another ([`BACK_TO_BACK_US`]): the pool's threads, busy a
/// moment ago, are still awake, and the wake-up that makes sharing small work lose is not paid.
/// A single head of 256 queries, d = 64, on an Intel Xeon (family 6 model 207, AVX-512): 72 µs
/// shared back to back against 102 µs on the calling thread; 128 queries (30 µs) gained nothing
/// (`examples/threshold.rs`, 2026-12-05). A build with `QKV_SHARE_ABOVE_US` uses that for both.
const SHARE_BACK_TO_BACK_ABOVE_US: f64 = match option_env!("QKV_SHARE_ABOVE_US") {
    Some(us) => parse_whole_number(us) as f64,
    None => 60.0,
};

/// A call that starts within this many microseconds of the end of the one before it comes back
/// to back: an idle rayon thread yields its CPU 32 times before it sleeps (rayon-core's
/// `ROUNDS_UNTIL_SLEEPY`). Shared n = 256 took 72 µs back to back, 72 and 76 after busy pauses
/// of 10 and 30 µs, and 90 after sleeping 200 µs (the host of [`SHARE_BACK_TO_BACK_ABOVE_US`]).
const BACK_TO_BACK_US: u64 = 50;

/// One thread's rate on the tiled path (FLOPs per microsecond) per lane of the kernels' vectors
/// (of the type they compute in), to estimate a problem's time: one Zen 3 core reaches about
/// 70e3 in f32 with AVX2's 8 lanes, and one Intel Xeon core about 140e3 with AVX-512's 16 (and
/// half that in f64, 8 lanes). Counting too slow a rate shares work
/// too small to gain: a single head of 256 queries, d = 64, took 0.137 ms on one AVX-512 thread
/// and 0.154 ms shared between two (2026-12-02).
const TILED_FLOPS_PER_US_PER_LANE: f64 = 70e3 / 8.0;
/// One thread's rate when decoding, which reads every key and value once and is bound by memory
/// more than by arithmetic.
const DECODING_FLOPS_PER_US: f64 = 15e3;

/// `text` as a whole number, at compile time; a build with anything else fails.
const fn parse_whole_number(text: &str) -> u64 {
    let bytes = text.as_bytes();
    assert!(!bytes.is_empty(), "QKV_SHARE_ABOVE_US must be a whole number");
    let (mut value, mut i) = (0_u64, 0);
    while i < bytes.len() {
        assert!(bytes[i].is_ascii_digit(), "QKV_SHARE_ABOVE_US must be a whole number");
        value = value * 10 + (bytes[i] - b'0') as u64;
        i += 1;
    }
    value
}

/// While helpers are kept off their CPUs ([`kept_waiting_us`]), work is shared only if one thread
/// would take at least this many times as long as the last late helper waited to start: one that
/// starts after its caller has done every item only holds the caller up. With a thread spinning
/// beside them on an Intel Xeon (family 6 model 167, 2 vCPUs), helpers started 2 to 5 ms late;
/// 8 prefills in calls of about 1 ms took 55 ms shared against 17 ms on the calling thread, and
/// 64 decoding steps in one call (7.8 ms on one thread) 4.5 to 6 ms shared. Twice the wait kept
/// most of those steps home: 5 to 7.7 ms (`examples/varlen.rs --beside-spinner`, 2026-12-06).
const SHARE_CONTENDED_TIMES_LATENESS: f64 = 1.0;

/// Whether work of `flops` (on the decoding path if `decoding`) is worth sharing with the pool,
/// on kernels of `lanes` lanes.
pub(crate) fn worth_sharing(flops: f64, decoding: bool, lanes: usize) -> bool {
    let rate = if decoding { DECODING_FLOPS_PER_US } else { TILED_FLOPS_PER_US_PER_LANE * lanes as f64 };
    let now = since_start();
    shares(flops / rate, kept_waiting_us(now), back_to_back(now))
}

/// Whether work of `us` microseconds on one thread is shared, while the last late helper waited
/// `kept_waiting_us` to start or with helpers on time (`None`), and right after another call
/// (`back_to_back`) or not.
fn shares(us: f64, kept_waiting_us: Option<f64>, back_to_back: bool) -> bool {
    if let Some(late_us) = kept_waiting_us {
        return us >= SHARE_CONTENDED_TIMES_LATENESS * late_us;
    }
    us >= SHARE_ABOVE_US || (us >= SHARE_BACK_TO_BACK_ABOVE_US && back_to_back)
}

/// A pass over memory (an input check, a merge) of at least this many elements is shared with
/// the pool, in pieces of [`PASS_PIECE`] ([`worth_sharing_a_pass`]): the input checks run on the
/// calling thread before any other work is shared out, and at 32 heads × 128 queries, d = 64,
/// they were 6.5% of a call's time on two threads while the helper waited.
pub(crate) const PASS_SHARE_FROM: usize = 1 << 17;
/// Elements a piece of a shared pass: small enough that a helper that arrives late costs the
/// caller little.
pub(crate) const PASS_PIECE: usize = 1 << 14;

/// Whether a pass over inputs is worth sharing: not while helpers are kept waiting, as a pass is
/// short.
pub(crate) fn worth_sharing_a_pass() -> bool {
    kept_waiting_us(since_start()).is_none()
}

/// What rayon's helpers have seen of their CPUs, process-wide.
static CONTENTION: Contention = Contention::new();

/// What the threads of [`ThreadTeam`]s have seen of theirs, apart from rayon's: a call runs on one
/// or the other. A team's thread kept off its CPU holds its caller up the more, as the team's
/// `run` (an OpenMP region) returns only once every thread has run: with a thread spinning beside
/// PyTorch's two OpenMP threads on a Zen 4 (2 vCPUs), 8 causal heads of 512 queries took a median
/// 5.5 ms shared on them, up to 40 ms, against 3.6–4.1 ms on qkv's own threads.
static TEAM_CONTENTION: Contention = Contention::new();

/// While helpers are kept off their CPUs at `now` ([`since_start`]; `contention`), how long the
/// last late one waited to start, in microseconds: the helpers of the threads this thread's calls
/// share with, its [`ThreadTeam`]'s or rayon's.
fn kept_waiting_us(now: u64) -> Option<f64> {
    contention().kept_waiting(now).map(|late| late.as_secs_f64() * 1e6)
}

/// The late starts that hold this thread's calls: its [`ThreadTeam`]'s threads', or rayon's.
fn contention() -> &'static Contention {
    if team::active() { &TEAM_CONTENTION } else { &CONTENTION }
}

/// Work handed out by `caller` at `at_ns` ([`since_start`]).
#[derive(Clone, Copy)]
struct HandOut {
    caller: Caller,
    at_ns: u64,
}

impl HandOut {
    /// Work handed out now, by this thread.
    fn now() -> HandOut {
        HandOut { caller: Caller::here(), at_ns: since_start() }
    }

    /// Called by every thread of rayon's as it starts on the work: a helper moves off its caller's
    /// CPU ([`Caller::arrive`]) and notes how late it starts (`contention`).
    fn arrive(self) {
        self.caller.arrive();
        self.note_lateness(&CONTENTION);
    }

    /// Called by every thread of a [`ThreadTeam`] as it starts on the work: a helper notes how
    /// late it starts. It stays where the team put it (an OpenMP runtime may bind its threads).
    fn arrive_on_team(self) {
        self.note_lateness(&TEAM_CONTENTION);
    }

    /// Notes in `contention` how late this thread starts, unless it is the caller.
    fn note_lateness(self, contention: &Contention) {
        if !self.caller.is_current() {
            let now = since_start();
            contention.arrived(Duration::from_nanos(now.saturating_sub(self.at_ns)), now);
        }
    }
}

/// When the last call through [`map_items`] or [`for_each_index`] ended, in nanoseconds from
/// [`since_start`]'s start (0: none yet).
static LAST_END_NS: AtomicU64 = AtomicU64::new(0);

/// Nanoseconds since the first time it was asked, never 0.
fn since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1)
}

/// Whether a call ended less than [`BACK_TO_BACK_US`] before `now` ([`since_start`]), on any
/// thread.
fn back_to_back(now: u64) -> bool {
    follows_closely(LAST_END_NS.load(Ordering::Relaxed), now)
}

/// Whether `now` is less than [`BACK_TO_BACK_US`] after `last_end` (0: no call yet); a `last_end`
/// after `now` (another thread's call ended meanwhile) is 0 ago.
fn follows_closely(last_end: u64, now: u64) -> bool {
    last_end != 0 && now.saturating_sub(last_end) < BACK_TO_BACK_US * 1000
}

/// Notes, when dropped, that a call ended (for [`back_to_back`]).
struct CallEnd;

impl Drop for CallEnd {
    fn drop(&mut self) {
        LAST_END_NS.store(since_start(), Ordering::Relaxed);
    }
}

/// The longest a thread that finds no item left waits for the others ([`Progress`]): longer than
/// a small call's items take, and a few times what waking a sleeping thread costs, which is all
/// the wait saves. Past it the thread leaves, and a longer item pays that wake-up in proportion.
const WAIT_FOR_THE_REST: Duration = Duration::from_micros(100);

/// The items of one shared call: the next to take, and how many are done.
///
/// A thread that finds no item left to take waits, spinning, until the others have finished
/// theirs, so that the threads leave together. A helper that left while its caller still worked
/// went idle, and rayon puts an idle thread to sleep after it has yielded its CPU 32 times (a few
/// tens of microseconds); back-to-back calls then found it asleep, waking it took tens of
/// microseconds, and it took fewer items and left early again. A single head of 256 queries on an
/// Intel Xeon (family 6 model 167) held in that state took 0.11–0.12 ms, its one-thread time,
/// against 0.07 ms with the helper awake (`qkv-bench --only n=256`). The wait never delays the
/// call, whose caller waits for every item anyway: it only keeps busy a CPU that would idle, so
/// threads wait only where that holds ([`waiting_pays`]).
struct Progress {
    count: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Whether a thread with no item left waits for the others.
    wait: bool,
}

impl Progress {
    fn new(count: usize, wait: bool) -> Progress {
        Progress { count, next: AtomicUsize::new(0), done: AtomicUsize::new(0), wait }
    }

    /// The next item's index, `None` when all are taken.
    fn take(&self) -> Option<usize> {
        let i = self.next.fetch_add(1, Ordering::Relaxed);
        (i < self.count).then_some(i)
    }

    /// Counts an item done.
    fn finished_one(&self) {
        self.done.fetch_add(1, Ordering::Release);
    }

    /// Returns once every item is done, or after [`WAIT_FOR_THE_REST`] (a panicking item is never
    /// done); at once if this call's threads do not wait.
    fn wait_for_the_rest(&self) {
        if !self.wait {
            return;
        }
        let start = Instant::now();
        while self.done.load(Ordering::Acquire) < self.count && start.elapsed() < WAIT_FOR_THE_REST {
            std::hint::spin_loop();
        }
    }
}

/// How many threads a call made now on this thread can share its work between: its
/// [`ThreadTeam`]'s, or else its rayon pool's.
pub(crate) fn threads() -> usize {
    pool_threads(team::current().as_deref())
}

/// The most threads of a [`ThreadTeam`] a call plans for: a team's count is another library's
/// word, and the plans multiply it (a team of `usize::MAX` would overflow them).
const MAX_TEAM_THREADS: usize = 4096;

/// How many threads `team` has (1 to [`MAX_TEAM_THREADS`]), or else the current rayon pool.
fn pool_threads(team: Option<&dyn ThreadTeam>) -> usize {
    team.map_or_else(rayon::current_num_threads, |team| team.threads().clamp(1, MAX_TEAM_THREADS))
}

/// Whether the `threads` threads of a call shared at `now` ([`since_start`]) wait for each other
/// at the end ([`Progress`]): not when there are more of them than the process has CPUs, where a spinning
/// thread holds a CPU that a thread still on an item waits for (4 threads on 2 vCPUs of an Intel
/// Xeon, family 6 model 167: a single head of 256 queries took 1.16 times as long, 1024 queries
/// 1.08), nor while helpers are kept off their CPUs by another program's threads, which the spin
/// would keep off theirs longer.
fn waiting_pays(threads: usize, now: u64) -> bool {
    static CPUS: OnceLock<usize> = OnceLock::new();
    let cpus = *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from));
    threads <= cpus && kept_waiting_us(now).is_none()
}

/// `f` of every item, in item order. With `share`, the calling thread and the pool's threads
/// take the items one at a time as they come free; otherwise the calling thread does them all.
/// Either way each item's result is computed by `f` alone, so the results do not depend on which
/// thread took which item.
///
/// Each thread that takes items makes one `scratch` with `new_scratch` and lends it to `f` for
/// every item it takes, so that buffers an item only borrows are allocated once per thread, not
/// once per item (for small items that allocation was a fifth of their work). `f` must not let a
/// result depend on what an earlier item left in it.
pub(crate) fn map_items<I: Send, R: Send, S>(
    items: Vec<I>,
    share: bool,
    new_scratch: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, I) -> R + Sync,
) -> Vec<R> {
    let _end = CallEnd;
    let team = team::current();
    let pool = pool_threads(team.as_deref());
    let helpers = pool.min(items.len()).saturating_sub(1);
    if !share || helpers == 0 {
        let mut scratch = new_scratch();
        return items.into_iter().map(|item| f(&mut scratch, item)).collect();
    }
    let count = items.len();
    let items: Vec<Mutex<Option<I>>> = items.into_iter().map(|item| Mutex::new(Some(item))).collect();
    let results: Vec<Mutex<Option<R>>> = (0..count).map(|_| Mutex::new(None)).collect();
    let hand_out = HandOut::now();
    let progress = Progress::new(count, waiting_pays(pool, hand_out.at_ns));
    let take_items = || {
        let mut scratch = None;
        while let Some(i) = progress.take() {
            let item = items[i].lock().expect("no task panicked").take().expect("each item is taken once");
            let result = f(scratch.get_or_insert_with(&new_scratch), item);
            *results[i].lock().expect("no task panicked") = Some(result);
            progress.finished_one();
        }
        progress.wait_for_the_rest();
    };
    if let Some(team) = team {
        team::run(&*team, helpers + 1, &|| {
            hand_out.arrive_on_team();
            take_items();
        });
        // Whatever a team that started fewer threads than asked left (nothing, usually).
        take_items();
    } else {
        let arrive_and_take = || {
            hand_out.arrive();
            take_items();
        };
        rayon::in_place_scope(|scope| {
            for _ in 0..helpers {
                scope.spawn(|_| arrive_and_take());
            }
            arrive_and_take();
        });
    }
    results.into_iter().map(|r| r.into_inner().expect("no task panicked").expect("every item ran")).collect()
}

/// `f(scratch, i)` for every `i < count`, shared out as [`map_items`] shares its items (with
/// `share`, the calling thread and the pool's threads take the next index as they come free),
/// each thread lending `f` a scratch of `scratches`: on rayon's threads the calling thread the
/// first and helper `h` the `h`-th, on a [`ThreadTeam`]'s each thread the next free one; made
/// the first time there are that many. So a call after a first one as large
/// allocates nothing of its own: on the calling thread alone nothing at all; shared from a
/// thread of the pool nothing either (`rayon::join` puts the helpers' jobs on the stack); shared
/// from outside the pool only the job rayon boxes for each helper (`Scope::spawn`). `f` writes
/// its results itself. `prepare` readies each scratch the pool may lend, on the calling thread,
/// even when this call is not shared (so that a helper lent a scratch for the first time, in a
/// later call, finds it ready too).
pub(crate) fn for_each_index<S: Default + Send>(
    count: usize,
    share: bool,
    scratches: &mut Vec<Mutex<S>>,
    prepare: impl Fn(&mut S),
    f: impl Fn(&mut S, usize) + Sync,
) {
    let _end = CallEnd;
    // Every scratch the pool could lend is readied, shared or not: whether a call is shared can
    // depend on how soon it follows the last (`worth_sharing`), and the first call to share then
    // finds its helpers' scratches ready.
    let team = team::current();
    let pool = pool_threads(team.as_deref()).min(count).max(1);
    let threads = if share { pool } else { 1 };
    if scratches.len() < pool {
        scratches.resize_with(pool, Default::default);
    }
    for scratch in &mut scratches[..pool] {
        prepare(scratch.get_mut().expect("no task panicked"));
    }
    if threads == 1 {
        let scratch = scratches[0].get_mut().expect("no task panicked");
        (0..count).for_each(|i| f(scratch, i));
        return;
    }
    let hand_out = HandOut::now();
    let progress = Progress::new(count, waiting_pays(threads, hand_out.at_ns));
    let take_indices = |scratch: &Mutex<S>| {
        let mut scratch = scratch.lock().expect("no task panicked");
        while let Some(i) = progress.take() {
            f(&mut scratch, i);
            progress.finished_one();
        }
        progress.wait_for_the_rest();
    };
    let scratches = &scratches[..threads];
    if let Some(team) = team {
        // Each of the team's threads takes the next scratch; one beyond them takes nothing.
        let next = AtomicUsize::new(0);
        team::run(&*team, threads, &|| {
            hand_out.arrive_on_team();
            if let Some(scratch) = scratches.get(next.fetch_add(1, Ordering::Relaxed)) {
                take_indices(scratch);
            }
        });
        // Whatever a team that started fewer threads than asked left (nothing, usually).
        take_indices(&scratches[0]);
        return;
    }
    let take_indices = &|scratch: &Mutex<S>| {
        hand_out.arrive();
        take_indices(scratch);
    };
    if rayon::current_thread_index().is_some() {
        join_over(scratches, take_indices);
        return;
    }
    // From outside the pool `join` would wait for the pool to run both halves: spawning lets the
    // calling thread start on the indices at once.
    let (mine, helpers) = scratches.split_first().expect("one scratch per thread");
    rayon::in_place_scope(|scope| {
        for scratch in helpers {
            scope.spawn(move |_| take_indices(scratch));
        }
        take_indices(mine);
    });
}

/// `take(scratch)` for every scratch of `scratches` on a thread of the pool, the first at once on
/// this thread and the others as `rayon::join` jobs that idle threads steal (run here, they find
/// nothing left to take).
fn join_over<S: Send>(scratches: &[Mutex<S>], take: &(impl Fn(&Mutex<S>) + Sync)) {
    match scratches {
        [] => {}
        [only] => take(only),
        _ => {
            let (front, back) = scratches.split_at(scratches.len().div_ceil(2));
            rayon::join(|| join_over(front, take), || join_over(back, take));
        }
    }
}

#[cfg(test)]
mod tests;
