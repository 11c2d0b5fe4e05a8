//! A tiny decoder, step by step: the embedding walk-through for qkv's KV cache.
//!
//! Two decoder layers with random (seeded) weights: grouped-query self-attention (8 query heads
//! sharing 2 key/value heads, 16 components each) and a small MLP, each with RMS normalisation
//! and a residual connection; an output layer gives the next token's logits. No positional
//! encoding: the causal mask alone orders the tokens.
//!
//! The prompt goes through as one chunk (chunked prefill: its keys and values fill the cache of
//! every layer), then 16 tokens are sampled, one decoding step each: a step appends
//! one position's keys and values per layer and attends with one query per query head. Each step
//! is checked against recomputing the whole sequence with `multi_head_attention` and a causal
//! mask, the work the cache saves.
//!
//! `cargo run -p qkv --example tiny_decoder --release`; `cargo test -p qkv --example tiny_decoder`
//! runs the check as a test.

use ndarray::{Array1, Array2, Array3, ArrayView2, ArrayView3, Axis, s};
use qkv::{AttentionError, AttentionOptions, CacheShape, CausalMask, KvCache};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const VOCAB: usize = 48;
const MODEL_DIM: usize = 64;
const QUERY_HEADS: usize = 8;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 16;
const LAYERS: usize = 2;
const PROMPT: [usize; 5] = [3, 14, 15, 9, 26];
const STEPS: usize = 16;

/// The weights of one decoder layer, applied to row vectors from the right.
struct Layer {
    w_q: Array2<f32>,
    w_k: Array2<f32>,
    w_v: Array2<f32>,
    w_o: Array2<f32>,
    w_up: Array2<f32>,
    w_down: Array2<f32>,
}

struct Decoder {
    /// `[VOCAB, MODEL_DIM]`: one row per token.
    embedding: Array2<f32>,
    layers: Vec<Layer>,
    /// `[MODEL_DIM, VOCAB]`: the last state to the next token's logits.
    w_out: Array2<f32>,
}

/// Attention for one layer: `(layer, q [QUERY_HEADS, n, HEAD_DIM], k, v [KV_HEADS, n, HEAD_DIM])`
/// to the output `[QUERY_HEADS, n, HEAD_DIM]` of the `n` new positions.
type Attend<'a> = dyn FnMut(usize, ArrayView3<f32>, ArrayView3<f32>, ArrayView3<f32>) -> Result<Array3<f32>, AttentionError>
    + 'a;

impl Decoder {
    fn random(seed: u64) -> Decoder {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        // Uniform with variance 1 / fan_in, so activations keep their size through each product.
        let mut matrix = |rows: usize, cols: usize| {
            let bound = (3.0 / rows as f32).sqrt();
            Array2::from_shape_simple_fn((rows, cols), || rng.random_range(-bound..bound))
        };
        let embedding = matrix(VOCAB, MODEL_DIM) * (VOCAB as f32).sqrt();
        let w_out = matrix(MODEL_DIM, VOCAB);
        let layers = (0..LAYERS)
            .map(|_| Layer {
                w_q: matrix(MODEL_DIM, QUERY_HEADS * HEAD_DIM),
                w_k: matrix(MODEL_DIM, KV_HEADS * HEAD_DIM),
                w_v: matrix(MODEL_DIM, KV_HEADS * HEAD_DIM),
                w_o: matrix(QUERY_HEADS * HEAD_DIM, MODEL_DIM),
                w_up: matrix(MODEL_DIM, 4 * MODEL_DIM),
                w_down: matrix(4 * MODEL_DIM, MODEL_DIM),
            })
            .collect();
        Decoder { embedding, layers, w_out }
    }

    /// The logits of the token after `tokens`, the last positions of the sequence (all of it, or
    /// those the cache behind `attend` does not hold yet).
    fn next_logits(&self, tokens: &[usize], attend: &mut Attend) -> Result<Array1<f32>, AttentionError> {
        let mut x = Array2::from_shape_fn((tokens.len(), MODEL_DIM), |(i, c)| self.embedding[[tokens[i], c]]);
        for (l, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(x.view());
            let heads = |w: &Array2<f32>, count: usize| {
                let flat = h.dot(w);
                // [n, heads · HEAD_DIM] → [heads, n, HEAD_DIM]
                let split = flat.into_shape_with_order((tokens.len(), count, HEAD_DIM)).expect("whole heads");
                split.permuted_axes([1, 0, 2]).as_standard_layout().into_owned()
            };
            let (q, k, v) =
                (heads(&layer.w_q, QUERY_HEADS), heads(&layer.w_k, KV_HEADS), heads(&layer.w_v, KV_HEADS));
            let o = attend(l, q.view(), k.view(), v.view())?;
            // [QUERY_HEADS, n, HEAD_DIM] → [n, QUERY_HEADS · HEAD_DIM]
            let o = o.permuted_axes([1, 0, 2]).as_standard_layout().into_owned();
            let o = o.into_shape_with_order((tokens.len(), QUERY_HEADS * HEAD_DIM)).expect("whole heads");
            x = x + o.dot(&layer.w_o);
            let up = rms_norm(x.view()).dot(&layer.w_up).mapv(|u| u.max(0.0));
            x = x + up.dot(&layer.w_down);
        }
        let last = rms_norm(x.slice(s![tokens.len() - 1.., ..]));
        Ok(last.row(0).dot(&self.w_out))
    }
}

/// Each row divided by its root mean square.
fn rms_norm(x: ArrayView2<f32>) -> Array2<f32> {
    let mut out = x.to_owned();
    for mut row in out.rows_mut() {
        let rms = (row.mapv(|v| v * v).mean().unwrap_or(0.0) + 1e-6).sqrt();
        row /= rms;
    }
    out
}

/// The token that `u` (uniform in `[0, 1)`) picks from `softmax(logits)`, and its probability.
fn sample(logits: &Array1<f32>, u: f32) -> (usize, f32) {
    let max = logits.fold(f32::NEG_INFINITY, |m, &z| m.max(z));
    let weights = logits.mapv(|z| (z - max).exp());
    let total = weights.sum();
    let mut below = 0.0;
    for (token, &w) in weights.iter().enumerate() {
        below += w / total;
        if u < below {
            return (token, w / total);
        }
    }
    (VOCAB - 1, weights[VOCAB - 1] / total)
}

/// One generated token, with the same step recomputed from scratch.
struct Step {
    token: usize,
    probability: f32,
    /// The token recomputing the whole sequence without a cache picks.
    full_token: usize,
    /// The largest difference between the two paths' logits.
    logit_difference: f32,
}

/// Samples `STEPS` tokens after `PROMPT` with a KV cache, and recomputes each step with full
/// attention over the whole sequence (both paths pick with the same random number).
fn generate(seed: u64) -> Result<Vec<Step>, AttentionError> {
    let decoder = Decoder::random(seed);
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
    let shape = CacheShape::new(LAYERS, KV_HEADS, PROMPT.len() + STEPS, HEAD_DIM, HEAD_DIM);
    let mut cache = KvCache::<f32>::new(shape)?;
    let mut cached = |l: usize, q: ArrayView3<f32>, k: ArrayView3<f32>, v: ArrayView3<f32>| {
        let mut layer = cache.layer(l)?;
        layer.append(k, v)?;
        layer.attend(q)
    };
    let mut full = |_: usize, q: ArrayView3<f32>, k: ArrayView3<f32>, v: ArrayView3<f32>| {
        let options = AttentionOptions::new().causal(CausalMask::BottomRight);
        let (q, k, v) = (q.insert_axis(Axis(0)), k.insert_axis(Axis(0)), v.insert_axis(Axis(0)));
        let out = qkv::multi_head_attention(q, k, v, &options)?;
        Ok(out.index_axis_move(Axis(0), 0))
    };
    let mut tokens = PROMPT.to_vec();
    // Prefill: the whole prompt in one chunk; then one new position per step.
    let mut new = PROMPT.len();
    let mut steps = Vec::new();
    for _ in 0..STEPS {
        let logits = decoder.next_logits(&tokens[tokens.len() - new..], &mut cached)?;
        let full_logits = decoder.next_logits(&tokens, &mut full)?;
        let u = rng.random_range(0.0..1.0);
        let (token, probability) = sample(&logits, u);
        let logit_difference = (&logits - &full_logits).iter().fold(0.0_f32, |m, d| m.max(d.abs()));
        steps.push(Step { token, probability, full_token: sample(&full_logits, u).0, logit_difference });
        tokens.push(token);
        new = 1;
    }
    Ok(steps)
}

fn main() -> Result<(), AttentionError> {
    println!("qkv kernels: {}", qkv::simd_report());
    println!(
        "{LAYERS} layers, {QUERY_HEADS} query heads over {KV_HEADS} key/value heads of {HEAD_DIM}; prompt {PROMPT:?}"
    );
    println!("step  position  token  probability  full recompute: token, largest |logit difference|");
    for (i, step) in generate(7)?.iter().enumerate() {
        println!(
            "{:>4}  {:>8}  {:>5}  {:>11.3}  {:>21}, {:.1e}",
            i + 1,
            PROMPT.len() + i,
            step.token,
            step.probability,
            step.full_token,
            step.logit_difference
        );
    }
    Ok(())
}

#[test]
fn cached_steps_match_recomputing_the_whole_sequence() {
    for seed in [7, 8] {
        for (i, step) in generate(seed).unwrap().iter().enumerate() {
            assert_eq!(step.token, step.full_token, "seed {seed}, step {i}");
            assert!(
                step.logit_difference < 1e-3,
                "seed {seed}, step {i}: logits differ by {}",
                step.logit_difference
            );
        }
    }
}
