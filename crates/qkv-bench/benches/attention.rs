//! `cargo bench -p qkv-bench`: the engine's output-only path on the main shapes, with divan
//! reporting throughput in FLOPs (4 · n_q · n_k · d per head, half when causal).

use divan::counter::ItemsCount;
use ndarray::Array2;
use qkv::{AttentionOptions, CausalMask};

fn main() {
    divan::main();
}

fn inputs(n_q: usize, n_k: usize, d: usize) -> (Array2<f32>, Array2<f32>, Array2<f32>) {
    let m = |rows, salt: usize| {
        Array2::from_shape_fn((rows, d), |(i, j)| (((i * 31 + j * 17 + salt) % 29) as f32 - 14.0) / 14.0)
    };
    (m(n_q, 1), m(n_k, 2), m(n_k, 3))
}

fn run(bencher: divan::Bencher, n_q: usize, n_k: usize, causal: bool) {
    let d = 64;
    let (q, k, v) = inputs(n_q, n_k, d);
    let options = if causal {
        AttentionOptions::new().causal(CausalMask::BottomRight)
    } else {
        AttentionOptions::new()
    };
    let flops = 4 * n_q * n_k * d / if causal { 2 } else { 1 };
    bencher
        .counter(ItemsCount::new(flops))
        .bench(|| qkv::attention(q.view(), k.view(), v.view(), &options).expect("valid problem"));
}

#[divan::bench(args = [256, 1024, 4096])]
fn full(bencher: divan::Bencher, n: usize) {
    run(bencher, n, n, false);
}

#[divan::bench(args = [1024, 4096])]
fn causal(bencher: divan::Bencher, n: usize) {
    run(bencher, n, n, true);
}

#[divan::bench]
fn decode_one_query_16384_keys(bencher: divan::Bencher) {
    run(bencher, 1, 16384, false);
}
