//! Runs one attention shape many times, for profilers: `repeat N_Q N_K CAUSAL(0|1) REPS`.
//! With `perf stat -e cycles:u` and `RAYON_NUM_THREADS=1` it gives FLOPs per cycle, a figure other
//! processes on the machine do not disturb the way they disturb wall-clock time.

use ndarray::Array2;
use qkv::{AttentionOptions, CausalMask};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("numbers")).collect();
    let [n_q, n_k, causal, reps] = args[..] else {
        panic!("usage: repeat N_Q N_K CAUSAL(0|1) REPS");
    };
    let d = 64;
    let m = |rows, salt: usize| {
        Array2::from_shape_fn((rows, d), |(i, j)| (((i * 31 + j * 17 + salt) % 29) as f32 - 14.0) / 14.0)
    };
    let (q, k, v) = (m(n_q, 1), m(n_k, 2), m(n_k, 3));
    let options = if causal == 1 {
        AttentionOptions::new().causal(CausalMask::BottomRight)
    } else {
        AttentionOptions::new()
    };
    let start = std::time::Instant::now();
    for _ in 0..reps {
        std::hint::black_box(qkv::attention(q.view(), k.view(), v.view(), &options).expect("valid"));
    }
    let flops = 4.0 * (n_q * n_k * d) as f64 * reps as f64 / if causal == 1 { 2.0 } else { 1.0 };
    println!("{flops:e} flops in {:.3} s", start.elapsed().as_secs_f64());
}
