//! A windowed KV cache (a ring buffer of `window + largest step - 1` slots) against full
//! attention over the whole history with the same window: `multi_head_attention` and the f64
//! reference with a bottom-right causal mask and `SlidingWindow::new(window - 1, 0)`, at every
//! SIMD level, for decoding steps and chunks of random sizes, many times round the ring, with
//! every cache option; bf16 storage; clear and reuse; and the errors.

use ndarray::{Array2, Array3, Axis, s};
use qkv::half::bf16;
use qkv::{
    Alibi, AttentionOptions, CacheOptions, CacheShape, CausalMask, KeepMask, KvCache, SimdLevel,
    SlidingWindow, Storage,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{assert_close, error_bound, levels};

/// A windowed cache's sizes: each query sees `window` positions, a step has at most
/// `largest_step` queries.
#[derive(Debug, Clone, Copy)]
struct Ring {
    kv_heads: usize,
    group: usize,
    key_dim: usize,
    value_dim: usize,
    window: usize,
    largest_step: usize,
}

impl Ring {
    fn shape(&self) -> CacheShape {
        let capacity = self.window + self.largest_step - 1;
        CacheShape::new(2, self.kv_heads, capacity, self.key_dim, self.value_dim)
    }
}

/// What a step asks for besides the ring's window.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Extras {
    None,
    /// A scale, ALiBi, soft-capping, a keep mask and the ring's window given explicitly.
    Every,
}

/// Steps of 1 and of random sizes up to the ring's largest, `len` positions in all.
fn random_chunks(rng: &mut ChaCha8Rng, largest_step: usize, len: usize) -> Vec<usize> {
    let mut chunks = Vec::new();
    let mut total = 0;
    while total < len {
        let n = if rng.random_bool(0.5) { 1 } else { rng.random_range(1..=largest_step) };
        chunks.push(n);
        total += n;
    }
    chunks
}

/// Appends `chunks` positions at a time to a windowed cache of `E` at `level` (f32 queries) and
/// after each append attends with the queries of the positions just appended (the last
/// `largest_step` of them at most); each output must match the reference and
/// `multi_head_attention_with_lse` over the whole history so far, and each logsumexp the
/// latter's, the keys and values rounded to `E` as the cache holds them. With `clear_half`, the
/// cache runs the first half of the chunks, is cleared and runs them all, with the same inputs.
fn check_ring<E: Storage>(
    level: SimdLevel,
    ring: Ring,
    chunks: &[usize],
    extras: Extras,
    clear_half: bool,
    seed: u64,
) {
    let shape = ring.shape();
    let query_heads = ring.kv_heads * ring.group;
    let total: usize = chunks.iter().sum();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let tensor = |heads, d, rng: &mut ChaCha8Rng| {
        Array3::from_shape_simple_fn((heads, total, d), || rng.random_range(-1.5_f32..1.5))
    };
    let q = tensor(query_heads, ring.key_dim, &mut rng);
    let k = tensor(ring.kv_heads, ring.key_dim, &mut rng).mapv(E::from_f32);
    let v = tensor(ring.kv_heads, ring.value_dim, &mut rng).mapv(E::from_f32);
    let (k32, v32) = (k.mapv(E::to_f32), v.mapv(E::to_f32));
    let slopes: Vec<f32> = (0..query_heads).map(|h| 0.05 + 0.3 * h as f32 / query_heads as f32).collect();
    let sinks = crate::cache_options::test_sinks(query_heads);
    let window = SlidingWindow::new(ring.window - 1, 0);
    let mut cache = KvCache::<E>::with_window_for_level(shape, ring.window, level).unwrap();
    let first_round = if clear_half { &chunks[..chunks.len() / 2] } else { &[] };
    for (round, chunks) in [first_round, chunks].into_iter().enumerate() {
        if round == 1 {
            cache.clear();
        }
        let mut layer = cache.layer(1).unwrap();
        let mut len = 0;
        for &n_new in chunks {
            let new = s![.., len..len + n_new, ..];
            layer.append(k.slice(new), v.slice(new)).unwrap();
            len += n_new;
            let held = len.min(shape.capacity);
            assert_eq!((layer.len(), layer.held()), (len, held), "{level} {ring:?}");
            // Until the ring wraps every position is held, and a step may take them all.
            let n_q = if len <= shape.capacity { n_new } else { n_new.min(ring.largest_step) };
            let q = q.slice(s![.., len - n_q..len, ..]);
            // The keep mask over the positions held, each row keeping its own position unless it
            // sees nothing (every 5th); over the whole history the older positions, outside
            // every window, are kept.
            let keep = Array2::from_shape_fn((n_q, held), |(i, j)| {
                i % 5 != 3 && (j == held - n_q + i || rng.random_bool(0.6))
            });
            let whole_keep = Array2::from_shape_fn((n_q, len), |(i, c)| {
                if c + held >= len { keep[[i, c + held - len]] } else { true }
            });
            let (options, dense) = match extras {
                Extras::None => (CacheOptions::new(), AttentionOptions::new()),
                Extras::Every => (
                    CacheOptions::new()
                        .scale(0.8)
                        .sliding_window(window)
                        .alibi(&slopes)
                        .logit_softcap(3.0)
                        .sinks(&sinks)
                        .keep_mask(keep.view()),
                    AttentionOptions::new()
                        .scale(0.8)
                        .logit_softcap(3.0)
                        .keep_mask(KeepMask::new(whole_keep.view())),
                ),
            };
            let dense = dense.causal(CausalMask::BottomRight).sliding_window(window).simd(level);
            // Pre-filled with NaN: an element the step forgets to write fails the comparison.
            let mut got = Array3::from_elem((query_heads, n_q, ring.value_dim), f32::NAN);
            let mut lse = Array2::from_elem((query_heads, n_q), f32::NAN);
            layer.attend_with_into(q, &options, got.view_mut(), Some(lse.view_mut())).unwrap();
            let (kp, vp) = (k32.slice(s![.., ..len, ..]), v32.slice(s![.., ..len, ..]));
            let all_heads = match extras {
                Extras::None => dense.clone(),
                Extras::Every => dense.clone().alibi(Alibi::new(&slopes)).sinks(&sinks),
            };
            let full = qkv::multi_head_attention_with_lse(
                q.insert_axis(Axis(0)),
                kp.insert_axis(Axis(0)),
                vp.insert_axis(Axis(0)),
                &all_heads,
            )
            .unwrap();
            for h in 0..query_heads {
                let ctx = format!("{level} {} {extras:?} {ring:?}, {n_q} new of {len}, head {h}", E::NAME);
                let kv_head = h / ring.group;
                let (qh, kh, vh) =
                    (q.slice(s![h, .., ..]), kp.slice(s![kv_head, .., ..]), vp.slice(s![kv_head, .., ..]));
                let head_options = match extras {
                    Extras::None => dense.clone(),
                    Extras::Every => dense.clone().alibi(Alibi::new(&slopes[h..=h])).sinks(&sinks[h..=h]),
                };
                let want = qkv::reference::attention(qh, kh, vh, &head_options).unwrap();
                let (weights_bound, bound) = error_bound(&want, &vh.to_owned());
                let got_head = got.slice(s![h, .., ..]).to_owned();
                assert_close(&format!("ring vs reference {ctx}"), &got_head, &want.output, bound);
                let full_head = full.output.slice(s![0, h, .., ..]).mapv(f64::from);
                assert_close(&format!("ring vs multi_head_attention {ctx}"), &got_head, &full_head, bound);
                for (i, (&g, &w)) in
                    lse.slice(s![h, ..]).iter().zip(full.logsumexp.slice(s![0, h, ..])).enumerate()
                {
                    let close = if w == f32::NEG_INFINITY {
                        g == f32::NEG_INFINITY
                    } else {
                        f64::from(g - w).abs() <= 2e-5 * (weights_bound + held as f64)
                    };
                    assert!(close, "logsumexp {ctx} row {i}: got {g}, want {w}");
                }
            }
        }
    }
}

/// Random windows and step sizes at every level, with awkward widths (d_k != d_v, 1, not a
/// whole vector), each run three times round its ring, cleared and run again. Each level runs
/// every width once, with or without the options, turning with the level.
#[test]
fn a_windowed_cache_matches_full_attention_with_the_window_many_times_round() {
    let widths = [(1, 1, 1, 1), (2, 2, 16, 24), (3, 1, 17, 5)];
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut seed = 500;
    for (l, level) in levels().into_iter().enumerate() {
        for (w, &(kv_heads, group, key_dim, value_dim)) in widths.iter().enumerate() {
            seed += 1;
            let extras = if (l + w) % 2 == 0 { Extras::Every } else { Extras::None };
            let window = rng.random_range(1..=32);
            let largest_step = if w == 0 { 1 } else { rng.random_range(2..=12) };
            let ring = Ring { kv_heads, group, key_dim, value_dim, window, largest_step };
            let chunks = random_chunks(&mut rng, largest_step, 3 * ring.shape().capacity);
            check_ring::<f32>(level, ring, &chunks, extras, true, seed);
        }
    }
}

/// Windows at the edges: one position (each query sees itself), a ring of whole key panels
/// whose wrap point crosses them, and a window wider than a key block (128).
#[test]
fn edge_windows_match_full_attention() {
    let mut seed = 600;
    for level in levels() {
        for (window, largest_step, chunks) in [
            (1, 1, vec![1; 4]),
            (64, 1, vec![1; 140]),
            (150, 9, [vec![150, 9], vec![1; 8], vec![9; 18]].concat()),
        ] {
            seed += 1;
            let ring = Ring { kv_heads: 1, group: 2, key_dim: 8, value_dim: 12, window, largest_step };
            check_ring::<f32>(level, ring, &chunks, Extras::Every, false, seed);
        }
    }
}

/// A ring of 2048 slots: a step with few rows splits its keys (two splits of 1024), and after
/// an append longer than the ring (only its last 2048 positions are written) the wrap point
/// falls inside the first split.
#[test]
fn a_ring_long_enough_to_split_its_keys_still_matches() {
    for level in levels() {
        let ring = Ring { kv_heads: 1, group: 4, key_dim: 16, value_dim: 8, window: 2047, largest_step: 2 };
        check_ring::<f32>(level, ring, &[3000, 1, 2], Extras::Every, false, 700);
    }
}

#[test]
fn a_bf16_ring_matches_full_attention_over_the_rounded_values() {
    let mut rng = ChaCha8Rng::seed_from_u64(8);
    for level in levels() {
        let ring = Ring { kv_heads: 2, group: 2, key_dim: 16, value_dim: 8, window: 20, largest_step: 5 };
        let chunks = random_chunks(&mut rng, 5, 80);
        check_ring::<bf16>(level, ring, &chunks, Extras::Every, false, 800);
    }
}

#[test]
fn bad_windows_and_steps_are_errors_naming_the_argument() {
    let shape = CacheShape::new(2, 1, 6, 2, 3);
    let err = |e: qkv::AttentionError| e.to_string();
    for window in [0, 7] {
        assert_eq!(
            err(KvCache::<f32>::with_window(shape, window).err().unwrap()),
            format!(
                "a KV cache's window of {window} positions must be at least 1 and at most its capacity, \
                 6: the ring holds the window and a step's new positions (capacity = window + the \
                 largest step - 1)"
            )
        );
    }
    let mut cache = KvCache::<f32>::with_window(shape, 4).unwrap();
    let mut layer = cache.layer(1).unwrap();
    layer.append(Array3::zeros((1, 10, 2)).view(), Array3::zeros((1, 10, 3)).view()).unwrap();
    // One query too many, and a prefill longer than the ring holds, which is refused for the
    // ring's limit rather than sent to append.
    for n_q in [4, 10] {
        assert_eq!(
            err(layer.attend(Array3::<f32>::zeros((2, n_q, 2)).view()).unwrap_err()),
            format!(
                "layer 1 of the KV cache takes queries of shape [2, at most 3, 2], not [2, {n_q}, 2]: a windowed \
                 cache that has wrapped holds the windows of at most capacity - sink_tokens - window + 1 new \
                 queries (an append of more wrote over keys its first positions' windows need): append and \
                 attend in chunks of at most that many, or make the capacity larger"
            )
        );
    }
    let q = Array3::<f32>::zeros((2, 3, 2));
    let wider = CacheOptions::new().sliding_window(SlidingWindow::new(4, 0));
    assert_eq!(
        err(layer.attend_with(q.view(), &wider).unwrap_err()),
        "layer 1 of the KV cache keeps a window of 4 positions, so its sliding_window option is \
         SlidingWindow::new(3, 0) or none (the cache's window then applies), not SlidingWindow::new(4, 0)"
    );
    let keep = Array2::from_elem((3, 10), true);
    assert_eq!(
        err(layer.attend_with(q.view(), &CacheOptions::new().keep_mask(keep.view())).unwrap_err()),
        "layer 1 of the KV cache takes keep_mask of shape [3, 6], not [3, 10]: one row per new query, one \
         column per position held"
    );
    let same = CacheOptions::new().sliding_window(SlidingWindow::new(3, 0));
    assert_eq!(layer.attend_with(q.view(), &same).unwrap(), layer.attend(q.view()).unwrap());
}

/// A wrapped ring of 2100 slots, a decoding step and a chunk of 40 (both split their keys and
/// read both runs), on 1, 2 and 3 threads: the same bits.
#[test]
fn ring_results_do_not_depend_on_the_thread_count() {
    let shape = CacheShape::new(1, 2, 2100, 32, 16);
    let mut rng = ChaCha8Rng::seed_from_u64(900);
    let mut tensor =
        |heads, n, d| Array3::from_shape_simple_fn((heads, n, d), || rng.random_range(-1.0_f32..1.0));
    let (k, v, q) = (tensor(2, 5000, 32), tensor(2, 5000, 16), tensor(8, 40, 32));
    let mut outputs = Vec::new();
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut cache = KvCache::<f32>::with_window(shape, 2048).unwrap();
        let mut layer = cache.layer(0).unwrap();
        layer.append(k.view(), v.view()).unwrap();
        let step = pool.install(|| layer.attend(q.slice(s![.., 39.., ..])).unwrap());
        let chunk = pool.install(|| layer.attend(q.view()).unwrap());
        outputs.push((step, chunk));
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]), "1, 2 and 3 threads give the same bits");
}
