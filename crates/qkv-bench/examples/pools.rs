//! Whether a call's work really runs on two CPUs: times one head of `N` queries (d = 64, 256 by
//! default) in fresh two-thread pools, and says where each pool's threads ended up. Linux can
//! queue a pool thread on the CPU of the thread that calls, and the call then runs at one
//! thread's speed (`crates/qkv/src/work/cpu.rs`, which moves such a thread).
//!
//! ```sh
//! cargo run --release -p qkv-bench --example pools -- 256 8
//! ```
//!
//! One line per run: the one-thread median first, then for each of `POOLS` pools (8 by default)
//! the median of 51 back-to-back calls in milliseconds and the CPUs its two threads were on
//! after them (`[1, 1]`: both on one CPU). To compare two builds, run their binaries in turns on
//! one sitting and count the pools faster than 0.75 of the one-thread time.

use ndarray::Array2;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1).map(|a| a.parse::<usize>().expect("whole numbers"));
    let (n, pools) = (args.next().unwrap_or(256), args.next().unwrap_or(8));
    let value = |i: usize, j: usize| (((i * 31 + j * 17) % 29) as f32 - 14.0) / 14.0;
    let (q, k, v) = (
        Array2::from_shape_fn((n, 64), |(i, j)| value(i, j)),
        Array2::from_shape_fn((n, 64), |(i, j)| value(i + 1, j)),
        Array2::from_shape_fn((n, 64), |(i, j)| value(i + 2, j)),
    );
    let options = qkv::AttentionOptions::new();
    let call =
        || std::hint::black_box(qkv::attention(q.view(), k.view(), v.view(), &options).expect("valid"));
    let mut line = String::new();
    for (threads, count) in [(1, 1), (2, pools)] {
        for _ in 0..count {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("a pool");
            let mut times: Vec<f64> = pool.install(|| {
                call();
                (0..51)
                    .map(|_| {
                        let start = Instant::now();
                        call();
                        start.elapsed().as_secs_f64() * 1e3
                    })
                    .collect()
            });
            times.sort_by(f64::total_cmp);
            let cpus: Vec<i32> = pool.broadcast(|_| cpu());
            line += &format!("{threads}t {:.3}{cpus:?} ", times[25]);
        }
    }
    println!("{}", line.trim_end());
}

/// The CPU the calling thread runs on (-1 where the platform does not say).
fn cpu() -> i32 {
    #[cfg(target_os = "linux")]
    // SAFETY: `sched_getcpu` takes no arguments and reads the calling thread's state.
    return unsafe { libc::sched_getcpu() };
    #[cfg(not(target_os = "linux"))]
    return -1;
}
