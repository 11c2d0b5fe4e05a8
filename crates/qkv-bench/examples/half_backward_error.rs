//! Writes one head's bf16 inputs and qkv's bf16 forward and backward at every SIMD level this CPU
//! runs, as JSON for `python/check_half_backward.py`, which measures each level's gradients and
//! PyTorch's bf16 SDPA backward against float64 autograd on the same inputs:
//! `cargo run --release -p qkv-bench --example half_backward_error -- N > cases.json`.
//!
//! N queries and keys, d = 64; queries and keys uniform in [-3, 3] (weights far from uniform),
//! values and the output's gradient in [-1, 1], all rounded to bf16. Each level differentiates
//! its own forward (`attention_half_with_lse`), as a caller of that level does. Never run in CI:
//! PyTorch is not there.

use half::bf16;
use ndarray::Array2;
use qkv::{AttentionOptions, SimdLevel};
use serde_json::{Map, Value, json};

const D: usize = 64;

fn main() {
    let n: usize =
        std::env::args().nth(1).and_then(|n| n.parse().ok()).expect("usage: half_backward_error N");
    // A small xorshift: the values only need to be varied and reproducible.
    let mut state = 0x9E37_79B9_7F4A_7C15_u64;
    let mut uniform = move |range: f32| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 23) as f32 - 1.0) * range
    };
    let mut tensor = |range: f32| Array2::from_shape_simple_fn((n, D), || bf16::from_f32(uniform(range)));
    let (q, k, v, d_output) = (tensor(3.0), tensor(3.0), tensor(1.0), tensor(1.0));
    let flat = |x: &Array2<bf16>| json!(x.iter().map(|x| x.to_f32()).collect::<Vec<_>>());
    let mut cases = Map::new();
    for (name, x) in [("q", &q), ("k", &k), ("v", &v), ("d_output", &d_output)] {
        cases.insert(name.into(), flat(x));
    }
    let mut levels = Map::new();
    for level in SimdLevel::ALL.into_iter().filter(|level| level.is_supported()) {
        let options = AttentionOptions::new().simd(level);
        let forward = qkv::attention_half_with_lse(q.view(), k.view(), v.view(), &options).expect("forward");
        let g =
            qkv::attention_backward_half(q.view(), k.view(), v.view(), &forward, d_output.view(), &options)
                .expect("backward");
        let grads: Vec<Value> =
            [g.dq, g.dk, g.dv].iter().map(|x| json!(x.iter().collect::<Vec<_>>())).collect();
        levels.insert(level.name().into(), Value::Array(grads));
    }
    cases.insert("n".into(), json!(n));
    cases.insert("levels".into(), Value::Object(levels));
    println!("{}", Value::Object(cases));
}
