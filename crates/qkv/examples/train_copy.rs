//! Training one attention layer with qkv's backward: learning to copy the token `OFFSET`
//! positions back.
//!
//! Each position's input is its token and its position, one-hot side by side (`x`, `TOKENS +
//! LENGTH` wide). One causal attention layer maps them to queries, keys and values
//! (`Q = x·W_q`, `K = x·W_k`, `V = x·W_v`, the values `TOKENS` wide), and its output should be
//! the one-hot of the token `OFFSET` positions back; the loss is the mean squared difference over
//! the positions that have such a token. The weights start small and random, and plain SGD on the
//! gradients from `multi_head_attention_backward` (a batch of sequences, one head each) teaches
//! the queries and keys to point from each position to the one `OFFSET` before it.
//!
//! The first step's gradients are checked against central finite differences of the loss.
//!
//! `cargo run -p qkv --example train_copy --release`; `cargo test -p qkv --example train_copy`
//! runs the training as a test.

use ndarray::{Array2, Array4, s};
use qkv::{AttentionError, AttentionOptions, CausalMask};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TOKENS: usize = 6;
const LENGTH: usize = 10;
const OFFSET: usize = 2;
const WIDTH: usize = TOKENS + LENGTH;
/// Queries and keys per position.
const KEY_DIM: usize = 8;
const BATCH: usize = 16;
const STEPS: usize = 400;
const LEARNING_RATE: f64 = 1.0;

/// The layer's weights, applied to row vectors from the right.
#[derive(Clone)]
struct Weights {
    w_q: Array2<f64>,
    w_k: Array2<f64>,
    w_v: Array2<f64>,
}

/// A batch of sequences: the inputs `[BATCH, 1, LENGTH, WIDTH]` and the targets
/// `[BATCH, 1, LENGTH, TOKENS]` (zero where no token is `OFFSET` back).
struct Batch {
    x: Array4<f64>,
    target: Array4<f64>,
}

impl Batch {
    fn random(rng: &mut ChaCha8Rng) -> Batch {
        let mut x = Array4::zeros((BATCH, 1, LENGTH, WIDTH));
        let mut target = Array4::zeros((BATCH, 1, LENGTH, TOKENS));
        for b in 0..BATCH {
            let tokens: Vec<usize> = (0..LENGTH).map(|_| rng.random_range(0..TOKENS)).collect();
            for (i, &token) in tokens.iter().enumerate() {
                x[[b, 0, i, token]] = 1.0;
                x[[b, 0, i, TOKENS + i]] = 1.0;
                if i >= OFFSET {
                    target[[b, 0, i, tokens[i - OFFSET]]] = 1.0;
                }
            }
        }
        Batch { x, target }
    }

    /// The positions the loss counts.
    fn counted() -> f64 {
        (BATCH * (LENGTH - OFFSET)) as f64
    }
}

/// `x · w` for every sequence: `[BATCH, 1, LENGTH, WIDTH]` times `[WIDTH, d]`.
fn project(x: &Array4<f64>, w: &Array2<f64>) -> Array4<f64> {
    let rows = x.view().into_shape_with_order((BATCH * LENGTH, WIDTH)).expect("contiguous");
    rows.dot(w).into_shape_with_order((BATCH, 1, LENGTH, w.ncols())).expect("as many rows")
}

/// `Σ_b x_bᵀ · g_b`: the gradient of a projection's weights from its outputs' gradient.
fn weight_gradient(x: &Array4<f64>, g: &Array4<f64>) -> Array2<f64> {
    let x = x.view().into_shape_with_order((BATCH * LENGTH, WIDTH)).expect("contiguous");
    let g = g.view().into_shape_with_order((BATCH * LENGTH, g.shape()[3])).expect("contiguous");
    x.t().dot(&g)
}

fn options() -> AttentionOptions<'static, f64> {
    AttentionOptions::new().causal(CausalMask::BottomRight)
}

/// The loss and the output's gradient `∂L/∂O` (zero at the first `OFFSET` positions).
fn loss_and_gradient(output: &Array4<f64>, batch: &Batch) -> (f64, Array4<f64>) {
    let mut difference = output - &batch.target;
    difference.slice_mut(s![.., .., ..OFFSET, ..]).fill(0.0);
    let loss = difference.iter().map(|d| d * d).sum::<f64>() / Batch::counted();
    (loss, difference * (2.0 / Batch::counted()))
}

/// The loss of `weights` on `batch`, and its gradients with respect to each weight matrix.
fn step(weights: &Weights, batch: &Batch) -> Result<(f64, Weights), AttentionError> {
    let (q, k, v) =
        (project(&batch.x, &weights.w_q), project(&batch.x, &weights.w_k), project(&batch.x, &weights.w_v));
    let forward = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options())?;
    let (loss, d_output) = loss_and_gradient(&forward.output, batch);
    let g = qkv::multi_head_attention_backward(
        q.view(),
        k.view(),
        v.view(),
        &forward,
        d_output.view(),
        &options(),
    )?;
    let gradients = Weights {
        w_q: weight_gradient(&batch.x, &g.dq),
        w_k: weight_gradient(&batch.x, &g.dk),
        w_v: weight_gradient(&batch.x, &g.dv),
    };
    Ok((loss, gradients))
}

/// The loss alone, from the forward.
fn loss(weights: &Weights, batch: &Batch) -> Result<f64, AttentionError> {
    let (q, k, v) =
        (project(&batch.x, &weights.w_q), project(&batch.x, &weights.w_k), project(&batch.x, &weights.w_v));
    let output = qkv::multi_head_attention(q.view(), k.view(), v.view(), &options())?;
    Ok(loss_and_gradient(&output, batch).0)
}

/// The largest difference between the backward's gradients and central finite differences of
/// the loss, relative to the largest gradient, over every weight.
fn gradient_check(weights: &Weights, batch: &Batch) -> Result<f64, AttentionError> {
    let (_, gradients) = step(weights, batch)?;
    let h = 1e-5;
    let mut worst: f64 = 0.0;
    let mut largest: f64 = 0.0;
    for which in 0..3 {
        let analytic = [&gradients.w_q, &gradients.w_k, &gradients.w_v][which];
        for (index, &g) in analytic.indexed_iter() {
            let perturbed = |delta: f64| {
                let mut w = weights.clone();
                [&mut w.w_q, &mut w.w_k, &mut w.w_v][which][index] += delta;
                loss(&w, batch)
            };
            let numeric = (perturbed(h)? - perturbed(-h)?) / (2.0 * h);
            worst = worst.max((numeric - g).abs());
            largest = largest.max(g.abs());
        }
    }
    Ok(worst / largest)
}

/// Trains from seed `seed`; returns the first step's gradient check and the loss at every step.
fn train(seed: u64) -> Result<(f64, Vec<f64>), AttentionError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut matrix =
        |cols: usize| Array2::from_shape_simple_fn((WIDTH, cols), || rng.random_range(-0.1..0.1));
    let mut weights = Weights { w_q: matrix(KEY_DIM), w_k: matrix(KEY_DIM), w_v: matrix(TOKENS) };
    let mut rng = ChaCha8Rng::seed_from_u64(seed + 1);
    let check = gradient_check(&weights, &Batch::random(&mut rng))?;
    let mut losses = Vec::with_capacity(STEPS);
    for _ in 0..STEPS {
        let batch = Batch::random(&mut rng);
        let (loss, gradients) = step(&weights, &batch)?;
        losses.push(loss);
        for (w, g) in [
            (&mut weights.w_q, gradients.w_q),
            (&mut weights.w_k, gradients.w_k),
            (&mut weights.w_v, gradients.w_v),
        ] {
            w.scaled_add(-LEARNING_RATE, &g);
        }
    }
    Ok((check, losses))
}

fn main() -> Result<(), AttentionError> {
    println!("qkv kernels: {}", qkv::simd_report());
    let (check, losses) = train(1)?;
    println!("first step: largest gradient difference from finite differences {check:.1e} (relative)");
    for (i, loss) in losses.iter().enumerate().filter(|(i, _)| i % 50 == 0 || *i == STEPS - 1) {
        println!("step {:>4}: loss {loss:.4}", i + 1);
    }
    Ok(())
}

#[test]
fn the_loss_falls_and_the_first_gradients_match_finite_differences() {
    let (check, losses) = train(1).unwrap();
    assert!(check < 1e-6, "gradients differ from finite differences by {check:e} (relative)");
    let (first, last) = (losses[0], losses[STEPS - 1]);
    assert!(last < first / 10.0, "the loss fell from {first} to {last} only");
}
