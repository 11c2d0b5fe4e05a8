//! Timing (median of several runs after a warm-up) and peak memory (heap bytes allocated during
//! the warm-up run above those live before it, counted by `alloc::Counting`).

use std::time::Instant;

use ndarray::Array4;

/// What one implementation measured on one case.
pub struct Measurement {
    pub median_ms: f64,
    pub gflops: f64,
    /// Peak heap bytes during the warm-up run above those live before it (the inputs), in MB;
    /// the output is included.
    pub peak_mb: Option<f64>,
    pub output: Array4<f32>,
}

/// Runs `run` once to warm up (measuring peak memory), then several times, and keeps the median.
pub fn median(
    run: &mut (dyn FnMut() -> anyhow::Result<Array4<f32>> + Send),
    flops: f64,
    quick: bool,
) -> anyhow::Result<Measurement> {
    let before = crate::alloc::reset_peak();
    let start = Instant::now();
    let output = std::hint::black_box(run()?);
    let warm_up = start.elapsed().as_secs_f64();
    let peak_mb = Some(crate::alloc::peak().saturating_sub(before) as f64 / (1024.0 * 1024.0));
    // About 3 s of runs (0.3 s with `--quick`), at least 7 (5) and at most 51, or 3 of a run
    // over 2 s: a short row's median then rests on many runs, which a noisy host needs, at little
    // cost. `peers.py`'s `median_seconds` follows the same rule.
    let (budget, least) = if quick { (0.3, 5) } else { (3.0, 7) };
    let runs = if warm_up > 2.0 { 3 } else { ((budget / warm_up.max(1e-4)) as usize).clamp(least, 51) };
    let mut times = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        std::hint::black_box(run()?);
        times.push(start.elapsed().as_secs_f64());
    }
    times.sort_by(f64::total_cmp);
    let median = times[runs / 2];
    Ok(Measurement { median_ms: median * 1e3, gflops: flops / median / 1e9, peak_mb, output })
}

/// The largest elementwise difference of two outputs.
pub fn max_abs_diff(a: &Array4<f32>, b: &Array4<f32>) -> f32 {
    if a.shape() != b.shape() {
        return f32::INFINITY;
    }
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}
