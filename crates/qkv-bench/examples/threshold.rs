//! Times small problems, to choose the size below which the engine keeps its work on the calling
//! thread (`SHARE_ABOVE_US` in `crates/qkv/src/work.rs`). Build it twice, once sharing every
//! problem with the pool and once sharing none, and compare the columns:
//!
//! ```sh
//! QKV_SHARE_ABOVE_US=0 cargo run --release -p qkv-bench --example threshold > /tmp/share.txt
//! QKV_SHARE_ABOVE_US=1000000000 cargo run --release -p qkv-bench --example threshold > /tmp/inline.txt
//! paste /tmp/share.txt /tmp/inline.txt
//! ```
//!
//! Each line: the shape, its FLOPs, and the median of many calls in microseconds (and the
//! fastest tenth, which shows the calls where the second thread was awake in time). Before each
//! call the program works for `PAUSE_US` microseconds (the first argument, 200 by default; a
//! spin, as a program computing something else between calls), so that the pool's threads may
//! have gone back to sleep; `threshold PAUSE_US sleep` sleeps instead (a program waiting between
//! calls, with Linux's timer slack of about 50 µs on top), and `threshold 0` times calls back to
//! back, with the threads still awake.

use ndarray::{Array2, Array4};
use qkv::AttentionOptions;

/// One timed shape: its label, its FLOPs, and a call.
type Shape = (String, usize, Box<dyn Fn()>);

fn main() {
    let pause: u64 = std::env::args().nth(1).map_or(200, |a| a.parse().expect("PAUSE_US, a whole number"));
    let sleep = std::env::args().nth(2).is_some_and(|a| a == "sleep");
    let d = 64;
    let value = |i: usize, j: usize| (((i * 31 + j * 17) % 29) as f32 - 14.0) / 14.0;
    let single = |n_q: usize, n_k: usize| {
        let (q, k, v) = (
            Array2::from_shape_fn((n_q, d), |(i, j)| value(i, j)),
            Array2::from_shape_fn((n_k, d), |(i, j)| value(i + 1, j)),
            Array2::from_shape_fn((n_k, d), |(i, j)| value(i + 2, j)),
        );
        move || {
            std::hint::black_box(
                qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).expect("valid"),
            );
        }
    };
    let heads = |h: usize, n: usize| {
        let t = || Array4::from_shape_fn((1, h, n, d), |(_, h, i, j)| value(i + h, j));
        let (q, k, v) = (t(), t(), t());
        move || {
            let out = qkv::multi_head_attention(q.view(), k.view(), v.view(), &AttentionOptions::new());
            std::hint::black_box(out.expect("valid"));
        }
    };
    let flops = |h: usize, n_q: usize, n_k: usize| 4 * h * n_q * n_k * d;
    let mut shapes: Vec<Shape> = Vec::new();
    for n in [64, 96, 128, 192, 256, 384, 512] {
        shapes.push((format!("n={n}"), flops(1, n, n), Box::new(single(n, n))));
    }
    for n_k in [1024, 2048, 4096, 8192, 16384] {
        shapes.push((format!("decode 1x{n_k}"), flops(1, 1, n_k), Box::new(single(1, n_k))));
    }
    for (h, n) in [(8, 64), (8, 128), (8, 256)] {
        shapes.push((format!("{h}h n={n}"), flops(h, n, n), Box::new(heads(h, n))));
    }
    for (label, flops, run) in &shapes {
        run();
        let once = std::time::Instant::now();
        run();
        // About half a second per shape.
        let calls = (0.5 / once.elapsed().as_secs_f64().max(1e-6)).clamp(20.0, 2000.0) as usize;
        let mut times: Vec<f64> = (0..calls)
            .map(|_| {
                if sleep {
                    std::thread::sleep(std::time::Duration::from_micros(pause));
                } else {
                    let paused = std::time::Instant::now();
                    while paused.elapsed().as_micros() < u128::from(pause) {
                        std::hint::spin_loop();
                    }
                }
                let start = std::time::Instant::now();
                run();
                start.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        println!(
            "{label:<16} {flops:>11} FLOP  median {:>9.1} us  fastest tenth {:>9.1} us",
            times[calls / 2],
            times[calls / 10]
        );
    }
}
