//! Timing (median of several runs after a warm-up, alone or taking turns with a peer) and peak
//! memory (heap bytes allocated during the warm-up run above those live before it, counted by
//! `alloc::Counting`).

use std::time::{Duration, Instant};

use ndarray::Array4;

/// What one implementation measured on one case.
pub struct Measurement {
    /// The median of the timed runs, in seconds.
    pub median: f64,
    /// Peak heap bytes during the warm-up run above those live before it (the inputs), in MB;
    /// the output is included.
    pub peak_mb: Option<f64>,
    pub output: Array4<f32>,
}

/// A run, boxed as the runners hold it.
pub type Run<'a> = dyn FnMut() -> anyhow::Result<Array4<f32>> + Send + 'a;

/// How many timed runs a call of `once` seconds gets: about 3 s of runs (0.3 s with `--quick`), at
/// least 7 (5) and at most 51, or 3 of a run over 2 s. A short row's median then rests on many
/// runs, which a noisy host needs, at little cost. `peers.py`'s `run_count` is the same rule.
pub fn run_count(once: f64, quick: bool) -> usize {
    let (budget, least) = if quick { (0.3, 5) } else { (3.0, 7) };
    if once > 2.0 { 3 } else { ((budget / once.max(1e-4)) as usize).clamp(least, 51) }
}

/// Runs `run` once to warm up (measuring peak memory), then several times, and keeps the median.
pub fn median(run: &mut Run<'_>, quick: bool) -> anyhow::Result<Measurement> {
    let warm = warm_up(run)?;
    let times = timed(run, run_count(warm.seconds, quick))?;
    Ok(warm.measured(median_of(times)))
}

/// Turns of a paired measurement ([`paired`]).
const TURNS: usize = 5;

/// Each side's turn lasts at least this long in timed calls, so that a short call's turn is not
/// over before the CPUs have come out of the idle that the pause put them in.
const TURN: Duration = Duration::from_millis(20);

/// Untimed calls at the start of each turn, for at least this long (and at least one call where
/// a call is shorter than [`WARM_BELOW`]): the threads of the side whose turn it is have slept
/// through the other's turn, and a caller calling back to back finds them awake.
const WARM: Duration = Duration::from_millis(5);

/// Calls at least this long take no untimed call at the start of a turn.
const WARM_BELOW: Duration = Duration::from_millis(100);

/// The pause before each turn: the other side's threads keep spinning for a while after its last
/// call (libgomp's, under PyTorch, for about 10 ms) and would take a CPU from the side whose turn
/// it is.
const SETTLE: Duration = Duration::from_millis(20);

/// `run` and a peer timed in turns, so that both see the same spells of a shared machine: each
/// side's runs (counted by [`run_count`] from a first call, `peer_once` seconds for the peer's,
/// and at least [`TURN`] of them a turn) are split over five turns, the side going first
/// alternating. `peer(runs, warm)` times `runs` calls of the peer after untimed ones for `warm`
/// seconds (at least one if `warm > 0`), and returns their seconds. Returns `run`'s measurement
/// and the peer's median in seconds.
pub fn paired(
    run: &mut Run<'_>,
    quick: bool,
    peer_once: f64,
    peer: &mut dyn FnMut(usize, f64) -> anyhow::Result<Vec<f64>>,
) -> anyhow::Result<(Measurement, f64)> {
    let warm = warm_up(run)?;
    let (ours, theirs) = (run_count(warm.seconds, quick), run_count(peer_once, quick));
    let turns = TURNS.min(ours).min(theirs);
    // `total` runs over the turns, the first `total % turns` taking one more, and at least a turn's.
    let share = |total: usize, once: f64, turn: usize| {
        let turn_runs = (TURN.as_secs_f64() / once.max(1e-6)).ceil() as usize;
        (total / turns + usize::from(turn < total % turns)).max(turn_runs)
    };
    let warming = |once: f64| if once < WARM_BELOW.as_secs_f64() { WARM.as_secs_f64() } else { 0.0 };
    let (mut our_times, mut their_times) = (Vec::with_capacity(ours), Vec::with_capacity(theirs));
    for turn in 0..turns {
        let ours_first = turn % 2 == 0;
        for our_turn in [ours_first, !ours_first] {
            std::thread::sleep(SETTLE);
            if our_turn {
                let start = Instant::now();
                while start.elapsed().as_secs_f64() < warming(warm.seconds) {
                    std::hint::black_box(run()?);
                }
                our_times.extend(timed(run, share(ours, warm.seconds, turn))?);
            } else {
                their_times.extend(peer(share(theirs, peer_once, turn), warming(peer_once))?);
            }
        }
    }
    Ok((warm.measured(median_of(our_times)), median_of(their_times)))
}

/// The warm-up call: its output, its seconds, and the heap it took.
struct WarmUp {
    output: Array4<f32>,
    seconds: f64,
    peak_mb: Option<f64>,
}

impl WarmUp {
    fn measured(self, median: f64) -> Measurement {
        Measurement { median, peak_mb: self.peak_mb, output: self.output }
    }
}

fn warm_up(run: &mut Run<'_>) -> anyhow::Result<WarmUp> {
    let before = crate::alloc::reset_peak();
    let start = Instant::now();
    let output = std::hint::black_box(run()?);
    let seconds = start.elapsed().as_secs_f64();
    let peak_mb = Some(crate::alloc::peak().saturating_sub(before) as f64 / (1024.0 * 1024.0));
    Ok(WarmUp { output, seconds, peak_mb })
}

/// The seconds of each of `runs` calls.
fn timed(run: &mut Run<'_>, runs: usize) -> anyhow::Result<Vec<f64>> {
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(run()?);
            Ok(start.elapsed().as_secs_f64())
        })
        .collect()
}

/// The median of `times` (the upper one of an even count, as `times[len / 2]` after sorting).
pub fn median_of(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The largest elementwise difference of two outputs.
pub fn max_abs_diff(a: &Array4<f32>, b: &Array4<f32>) -> f32 {
    if a.shape() != b.shape() {
        return f32::INFINITY;
    }
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}
