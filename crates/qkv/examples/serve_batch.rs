//! Continuous batching over a paged KV cache: the serving walk-through for `PagedKvCache`.
//!
//! A tiny two-layer decoder with random (seeded) weights serves requests that arrive and finish
//! at different steps. Every request starts with the same system prompt: it is prefilled once,
//! into a sequence of its own, and each request forks it (sharing its blocks; the first append
//! copies only the partial last block) and appends its own prompt. Each step is one batch: the
//! prompts of the requests that arrived (packed prefill) and one token of every running request
//! (decoding) go through each layer in one `append` per sequence and one `attend` for all. A
//! request that has its tokens is freed, and its blocks return to the pool.
//!
//! The layers take the options of Gemma 2's (Gemma Team, "Gemma 2: Improving Open Language
//! Models at a Practical Size", 2024): attention logits soft-capped at 50 (`cap · tanh(s / cap)`)
//! in every layer, and local layers (a sliding window, here of 16 positions) between global
//! ones. They go to the paged cache as `CacheOptions` through `PagedLayer::attend_with`.
//!
//! Each layer of each step is checked against dense attention: every sequence's rows against
//! `multi_head_attention` over its own keys with the layer's options as the dense API's
//! (`CacheOptions::dense`: a bottom-right causal mask, the window, the cap), and in a global layer
//! the decoding rows also against one padded `multi_head_attention` call with each sequence's key
//! length.
//!
//! `cargo run -p qkv --example serve_batch --release`; `cargo test -p qkv --example serve_batch`
//! runs the check as a test.

use ndarray::{Array2, Array3, Array4, ArrayView2, Axis, s};
use qkv::{
    AttentionError, AttentionOptions, CacheOptions, PagedKvCache, PagedShape, SequenceId, SimdLevel,
    SlidingWindow,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const VOCAB: usize = 40;
const MODEL_DIM: usize = 32;
const QUERY_HEADS: usize = 4;
const KV_HEADS: usize = 2;
const HEAD_DIM: usize = 8;
const LAYERS: usize = 2;
/// The system prompt every request starts with: 70 tokens, past one block of 64.
const SYSTEM_PROMPT: usize = 70;
/// Gemma 2's soft cap on the attention logits.
const SOFTCAP: f32 = 50.0;
/// The window of the local layers (odd layers): the position itself and the 15 before it.
const WINDOW: usize = 16;

/// The cache options of layer `l`: every layer soft-capped, odd layers local.
fn layer_options(l: usize) -> CacheOptions<'static> {
    let options = CacheOptions::new().logit_softcap(SOFTCAP);
    if l % 2 == 1 { options.sliding_window(SlidingWindow::new(WINDOW - 1, 0)) } else { options }
}

/// A request: the step it arrives at, its own prompt after the system prompt, and how many
/// tokens it wants.
struct Request {
    arrives: usize,
    prompt: &'static [usize],
    tokens: usize,
}

const REQUESTS: [Request; 6] = [
    Request { arrives: 0, prompt: &[5, 9, 2, 33, 1], tokens: 8 },
    Request { arrives: 0, prompt: &[7], tokens: 3 },
    Request { arrives: 1, prompt: &[3, 3, 8, 21, 30, 4, 4, 19, 11], tokens: 6 },
    Request { arrives: 3, prompt: &[12, 6, 0], tokens: 10 },
    Request { arrives: 4, prompt: &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], tokens: 4 },
    Request { arrives: 6, prompt: &[38, 14], tokens: 5 },
];

/// The weights of one layer, applied to row vectors from the right.
struct Layer {
    w_q: Array2<f32>,
    w_k: Array2<f32>,
    w_v: Array2<f32>,
    w_o: Array2<f32>,
}

struct Model {
    embedding: Array2<f32>,
    layers: Vec<Layer>,
    /// The next token's logits from a row: `[MODEL_DIM, VOCAB]`.
    w_out: Array2<f32>,
}

impl Model {
    fn random(seed: u64) -> Model {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut matrix = |rows: usize, cols: usize| {
            let scale = 1.0 / (rows as f32).sqrt();
            Array2::from_shape_simple_fn((rows, cols), || rng.random_range(-1.0..1.0) * scale)
        };
        let embedding = matrix(VOCAB, MODEL_DIM);
        let layers = (0..LAYERS)
            .map(|_| Layer {
                w_q: matrix(MODEL_DIM, QUERY_HEADS * HEAD_DIM),
                w_k: matrix(MODEL_DIM, KV_HEADS * HEAD_DIM),
                w_v: matrix(MODEL_DIM, KV_HEADS * HEAD_DIM),
                w_o: matrix(QUERY_HEADS * HEAD_DIM, MODEL_DIM),
            })
            .collect();
        let w_out = matrix(MODEL_DIM, VOCAB);
        Model { embedding, layers, w_out }
    }
}

/// `[n, heads · d]` rows (as a projection writes them) as `[heads, n, d]`, the layout the cache
/// takes: a view, no copy.
fn heads(x: ArrayView2<f32>, heads: usize) -> ndarray::ArrayView3<f32> {
    let n = x.nrows();
    x.into_shape_with_order((n, heads, HEAD_DIM)).expect("rows of whole heads").permuted_axes([1, 0, 2])
}

/// One sequence in the batch: its cache id, what it holds per layer (keys, values; for the
/// dense check) and the tokens it feeds this step.
struct Running {
    request: usize,
    seq: SequenceId,
    keys: Vec<Array3<f32>>,
    values: Vec<Array3<f32>>,
    feed: Vec<usize>,
    /// Whether this step is its prefill (its queries are its prompt) or a decoding step.
    prefill: bool,
    generated: Vec<usize>,
}

/// What one step did.
struct Step {
    running: usize,
    arrived: usize,
    finished: usize,
    free_blocks: usize,
    /// The largest difference between the paged attend and dense attention, over every layer.
    difference: f32,
}

/// Runs the requests to the end: one `Step` per batch, and the tokens of each request.
fn serve(seed: u64) -> Result<(Vec<Step>, Vec<Vec<usize>>), AttentionError> {
    let model = Model::random(seed);
    let level = SimdLevel::dispatched()?;
    let block_size = 64_usize.next_multiple_of(PagedKvCache::<f32>::block_granularity(level)?);
    let shape = PagedShape::new(LAYERS, KV_HEADS, HEAD_DIM, HEAD_DIM, block_size, 24);
    let mut cache = PagedKvCache::<f32>::new(shape)?;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let system: Vec<usize> = (0..SYSTEM_PROMPT).map(|_| rng.random_range(0..VOCAB)).collect();
    // The system prompt, prefilled once; every request forks it.
    let prefix = cache.add_sequence();
    let mut shared = Running {
        request: usize::MAX,
        seq: prefix,
        keys: vec![Array3::zeros((KV_HEADS, 0, HEAD_DIM)); LAYERS],
        values: vec![Array3::zeros((KV_HEADS, 0, HEAD_DIM)); LAYERS],
        feed: system,
        prefill: true,
        generated: Vec::new(),
    };
    run_batch(&model, &mut cache, std::slice::from_mut(&mut shared))?;
    let mut running: Vec<Running> = Vec::new();
    let mut done: Vec<Vec<usize>> = vec![Vec::new(); REQUESTS.len()];
    let mut steps = Vec::new();
    for step in 0.. {
        let arrivals: Vec<usize> = (0..REQUESTS.len()).filter(|&r| REQUESTS[r].arrives == step).collect();
        for &request in &arrivals {
            running.push(Running {
                request,
                seq: cache.fork(prefix)?,
                keys: shared.keys.clone(),
                values: shared.values.clone(),
                feed: REQUESTS[request].prompt.to_vec(),
                prefill: true,
                generated: Vec::new(),
            });
        }
        if running.is_empty() && step > REQUESTS.iter().map(|r| r.arrives).max().unwrap_or(0) {
            break;
        }
        let difference = run_batch(&model, &mut cache, &mut running)?;
        // Finished requests leave the batch and give their blocks back.
        let before = running.len();
        let mut kept = Vec::new();
        for r in running {
            if r.generated.len() == REQUESTS[r.request].tokens {
                cache.free(r.seq)?;
                done[r.request] = r.generated;
            } else {
                kept.push(r);
            }
        }
        running = kept;
        let finished = before - running.len();
        steps.push(Step {
            running: before,
            arrived: arrivals.len(),
            finished,
            free_blocks: cache.free_blocks(),
            difference,
        });
    }
    Ok((steps, done))
}

/// One batch through every layer: each sequence's fed tokens appended and attended in one call
/// per layer, then each sequence's next token (greedy) from its last row. Returns the largest
/// difference from dense attention.
fn run_batch(
    model: &Model,
    cache: &mut PagedKvCache<f32>,
    batch: &mut [Running],
) -> Result<f32, AttentionError> {
    let mut offsets = vec![0];
    for r in batch.iter() {
        offsets.push(offsets.last().unwrap() + r.feed.len());
    }
    let sequences: Vec<SequenceId> = batch.iter().map(|r| r.seq).collect();
    let tokens: Vec<usize> = batch.iter().flat_map(|r| r.feed.iter().copied()).collect();
    // The packed tokens, one row each: `[n, MODEL_DIM]`.
    let mut x = Array2::from_shape_fn((tokens.len(), MODEL_DIM), |(i, c)| model.embedding[[tokens[i], c]]);
    let mut difference = 0.0_f32;
    for (l, layer) in model.layers.iter().enumerate() {
        let (q, k, v) = (x.dot(&layer.w_q), x.dot(&layer.w_k), x.dot(&layer.w_v));
        let mut paged = cache.layer(l)?;
        for (i, r) in batch.iter_mut().enumerate() {
            let rows = s![offsets[i]..offsets[i + 1], ..];
            let (k, v) = (heads(k.slice(rows), KV_HEADS), heads(v.slice(rows), KV_HEADS));
            paged.append(r.seq, k, v)?;
            r.keys[l] = ndarray::concatenate![Axis(1), r.keys[l], k];
            r.values[l] = ndarray::concatenate![Axis(1), r.values[l], v];
        }
        let out = paged.attend_with(&sequences, &offsets, heads(q.view(), QUERY_HEADS), &layer_options(l))?;
        difference = difference.max(dense_difference(batch, &offsets, &q, &out, l)?);
        // Back to rows, through the output projection, with a residual connection.
        let rows = out.permuted_axes([1, 0, 2]).as_standard_layout().into_owned();
        let rows = rows.into_shape_with_order((tokens.len(), QUERY_HEADS * HEAD_DIM)).expect("whole rows");
        x = (&x + &rows.dot(&layer.w_o)).mapv(f32::tanh);
    }
    for (i, r) in batch.iter_mut().enumerate() {
        let logits = x.row(offsets[i + 1] - 1).dot(&model.w_out);
        let token = (0..VOCAB).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).expect("a vocabulary");
        r.generated.push(token);
        r.feed = vec![token];
        r.prefill = false;
    }
    Ok(difference)
}

/// The largest difference between the batch's paged output at layer `l` and dense attention over
/// what each sequence holds under the layer's options: every sequence alone, and in a global
/// layer the decoding rows as one padded batch with key lengths.
fn dense_difference(
    batch: &[Running],
    offsets: &[usize],
    q: &Array2<f32>,
    out: &Array3<f32>,
    l: usize,
) -> Result<f32, AttentionError> {
    let mut difference = 0.0_f32;
    let mut compare = |got: ndarray::ArrayView3<f32>, want: ndarray::ArrayView3<f32>| {
        difference = got.iter().zip(want).fold(difference, |d, (g, w)| d.max((g - w).abs()));
    };
    let options = layer_options(l);
    let queries_of = |i: usize| heads(q.slice(s![offsets[i]..offsets[i + 1], ..]), QUERY_HEADS);
    for (i, r) in batch.iter().enumerate() {
        let (k, v) = (r.keys[l].view(), r.values[l].view());
        let want = qkv::multi_head_attention(
            queries_of(i).insert_axis(Axis(0)),
            k.insert_axis(Axis(0)),
            v.insert_axis(Axis(0)),
            &options.dense(),
        )?;
        compare(out.slice(s![.., offsets[i]..offsets[i + 1], ..]), want.index_axis(Axis(0), 0));
    }
    let decoding: Vec<usize> = (0..batch.len()).filter(|&i| !batch[i].prefill).collect();
    if decoding.is_empty() || l % 2 == 1 {
        return Ok(difference);
    }
    // A padded batch: each decoding sequence's keys, zeros past its length (never read). One
    // query at the end of its keys sees them all, so the key length is its only mask.
    let lengths: Vec<usize> = decoding.iter().map(|&i| batch[i].keys[l].shape()[1]).collect();
    let longest = lengths.iter().copied().max().unwrap_or(0);
    let mut k = Array4::zeros((decoding.len(), KV_HEADS, longest, HEAD_DIM));
    let mut v = Array4::zeros((decoding.len(), KV_HEADS, longest, HEAD_DIM));
    let mut queries = Array4::zeros((decoding.len(), QUERY_HEADS, 1, HEAD_DIM));
    for (b, &i) in decoding.iter().enumerate() {
        k.slice_mut(s![b, .., ..lengths[b], ..]).assign(&batch[i].keys[l]);
        v.slice_mut(s![b, .., ..lengths[b], ..]).assign(&batch[i].values[l]);
        queries.slice_mut(s![b, .., .., ..]).assign(&queries_of(i));
    }
    let padded = AttentionOptions::new().key_lengths(&lengths).logit_softcap(SOFTCAP);
    let want = qkv::multi_head_attention(queries.view(), k.view(), v.view(), &padded)?;
    for (b, &i) in decoding.iter().enumerate() {
        compare(out.slice(s![.., offsets[i]..offsets[i + 1], ..]), want.index_axis(Axis(0), b));
    }
    Ok(difference)
}

fn main() -> Result<(), AttentionError> {
    println!("qkv kernels: {}", qkv::simd_report());
    println!(
        "{LAYERS} layers (global, then local over {WINDOW} positions; logits soft-capped at {SOFTCAP}), \
         {QUERY_HEADS} query heads over {KV_HEADS} key/value heads of {HEAD_DIM}; a system prompt of \
         {SYSTEM_PROMPT} tokens shared by {} requests",
        REQUESTS.len()
    );
    let (steps, tokens) = serve(3)?;
    println!("step  in batch  arrived  finished  free blocks  largest |paged - dense|");
    for (i, step) in steps.iter().enumerate() {
        println!(
            "{i:>4}  {:>8}  {:>7}  {:>8}  {:>11}  {:.1e}",
            step.running, step.arrived, step.finished, step.free_blocks, step.difference
        );
    }
    for (r, tokens) in tokens.iter().enumerate() {
        println!("request {r}: {tokens:?}");
    }
    Ok(())
}

#[test]
fn every_step_matches_dense_attention_and_every_block_returns() {
    for seed in [3, 4] {
        let (steps, tokens) = serve(seed).unwrap();
        for (i, step) in steps.iter().enumerate() {
            assert!(
                step.difference < 1e-5,
                "seed {seed}, step {i}: paged and dense differ by {}",
                step.difference
            );
        }
        assert!(
            tokens.iter().zip(&REQUESTS).all(|(t, r)| t.len() == r.tokens),
            "every request got its tokens"
        );
        // Only the system prompt's two blocks stay held, by its own sequence.
        assert_eq!(steps.last().map(|s| s.free_blocks), Some(24 - 2));
        assert!(steps.iter().any(|s| s.running >= 4), "requests overlap");
    }
}
