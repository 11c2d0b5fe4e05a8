//! The machine the numbers come from: its CPU model, and the read bandwidth a plain streaming
//! read reaches, the bound of a decoding step.

use std::time::Instant;

use rayon::prelude::*;

/// The CPU as `/proc/cpuinfo` names it: `AMD EPYC (family 25, model 1)`; `unknown CPU` where
/// there is no such file.
pub fn cpu_model() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let field = |name: &str| {
        info.lines()
            .find(|line| line.split(':').next().is_some_and(|key| key.trim() == name))
            .and_then(|line| line.split_once(':'))
            .map(|(_, value)| value.trim().to_string())
    };
    match (field("model name"), field("cpu family"), field("model")) {
        (Some(name), Some(family), Some(model)) => format!("{name} (family {family}, model {model})"),
        (Some(name), _, _) => name,
        _ => "unknown CPU".to_string(),
    }
}

/// The median rate, in GB/s, at which all threads together read a buffer of `bytes` that they
/// have read before (so it sits in whatever cache it fits, as a decoding step's keys and values
/// do between steps): a sum over 32 independent lanes, so that the adds keep up with memory.
pub fn read_bandwidth(bytes: usize, quick: bool) -> f64 {
    let data: Vec<f32> = (0..bytes / size_of::<f32>()).map(|i| (i % 7) as f32).collect();
    // Chunks of 256 KiB: many more than threads, few enough that handing them out costs nothing.
    let read = || {
        data.par_chunks(64 * 1024)
            .map(|chunk| {
                let mut lanes = [0.0_f32; 32];
                for block in chunk.chunks_exact(32) {
                    for (lane, &x) in lanes.iter_mut().zip(block) {
                        *lane += x;
                    }
                }
                lanes.iter().sum::<f32>()
            })
            .sum::<f32>()
    };
    std::hint::black_box(read());
    let runs = if quick { 5 } else { 11 };
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(read());
            start.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    bytes as f64 / times[runs / 2] / 1e9
}
