//! Runs one attention shape many times, for profilers: `repeat N_Q N_K MASK REPS`, MASK 0 = none,
//! 1 = causal, 2 = key padding (the last tenth of the keys), 3 = an additive bias (zeros).
//! With `perf stat -e cycles:u` and `RAYON_NUM_THREADS=1` it gives FLOPs per cycle, a figure other
//! processes on the machine do not disturb the way they disturb wall-clock time.

use ndarray::Array1;
use ndarray::Array2;
use qkv::{AdditiveBias, AttentionOptions, CausalMask, KeyPadding};

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).map(|a| a.parse().expect("numbers")).collect();
    let [n_q, n_k, mask, reps] = args[..] else {
        panic!("usage: repeat N_Q N_K MASK(0..=3) REPS");
    };
    let d = 64;
    let m = |rows, salt: usize| {
        Array2::from_shape_fn((rows, d), |(i, j)| (((i * 31 + j * 17 + salt) % 29) as f32 - 14.0) / 14.0)
    };
    let (q, k, v) = (m(n_q, 1), m(n_k, 2), m(n_k, 3));
    let padding = Array1::from_shape_fn(n_k, |j| j < n_k - n_k / 10);
    let bias = Array2::<f32>::zeros((n_q, n_k));
    let options = match mask {
        0 => AttentionOptions::new(),
        1 => AttentionOptions::new().causal(CausalMask::BottomRight),
        2 => AttentionOptions::new().key_padding(KeyPadding::new(padding.view())),
        _ => AttentionOptions::new().bias(AdditiveBias::new(bias.view())),
    };
    let start = std::time::Instant::now();
    for _ in 0..reps {
        std::hint::black_box(qkv::attention(q.view(), k.view(), v.view(), &options).expect("valid"));
    }
    let flops = 4.0 * (n_q * n_k * d) as f64 * reps as f64 / if mask == 1 { 2.0 } else { 1.0 };
    println!("{flops:e} flops in {:.3} s", start.elapsed().as_secs_f64());
}
