//! A windowed KV cache that keeps its first positions as sink tokens (StreamingLLM,
//! `KvCache::with_sink_tokens`) against full attention over the whole history with the key set
//! built explicitly (a bottom-right causal mask and a keep mask of the sink tokens and the
//! window): `multi_head_attention_with_lse` and the f64 reference, at every SIMD level, decoding
//! and chunks many times round the ring, appends longer than the ring, every cache option with
//! attention-sink logits, rotary embeddings by absolute position, truncation, and the errors.

use ndarray::{Array2, Array3, Axis, s};
use qkv::{
    Alibi, AttentionOptions, CacheOptions, CacheShape, CausalMask, KeepMask, KvCache, Rotary, SimdLevel,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{assert_close, error_bound, levels};

/// A cache keeping `sink_tokens` positions and a `window`, steps of up to `largest_step`.
#[derive(Debug, Clone, Copy)]
struct Config {
    kv_heads: usize,
    group: usize,
    key_dim: usize,
    value_dim: usize,
    sink_tokens: usize,
    window: usize,
    largest_step: usize,
    /// The most queries a step attends with (at most `largest_step`).
    queries: usize,
    /// A scale, ALiBi, soft-capping and attention-sink logits.
    options: bool,
    rotary: bool,
}

/// The keep mask of the key set a sink-token cache attends to: query `i` of `n_q`, the last
/// positions of `len`, sees key `j` if `j < sink_tokens` or `j` is in its window.
fn key_set(n_q: usize, len: usize, sink_tokens: usize, window: usize) -> Array2<bool> {
    Array2::from_shape_fn((n_q, len), |(i, j)| {
        let position = len - n_q + i;
        j <= position && (j < sink_tokens || j + window > position)
    })
}

/// Appends `chunks` positions at a time at `level`, after each append attending with the queries
/// of the positions just appended (at most `largest_step`); each output and logsumexp must match
/// the reference and `multi_head_attention_with_lse` over the whole history with the explicit
/// key set. With `truncate_at`, after that many chunks the cache rolls back by one position and
/// the history with it.
fn check(level: SimdLevel, c: Config, chunks: &[usize], truncate_at: Option<usize>, seed: u64) {
    let capacity = c.sink_tokens + c.window + c.largest_step - 1;
    let shape = CacheShape::new(1, c.kv_heads, capacity, c.key_dim, c.value_dim);
    let query_heads = c.kv_heads * c.group;
    let total: usize = chunks.iter().sum();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensor =
        |heads, d| Array3::from_shape_simple_fn((heads, total, d), || rng.random_range(-1.5_f32..1.5));
    let (q, mut k, mut v) =
        (tensor(query_heads, c.key_dim), tensor(c.kv_heads, c.key_dim), tensor(c.kv_heads, c.value_dim));
    let slopes: Vec<f32> = (0..query_heads).map(|h| 0.05 + 0.1 * h as f32).collect();
    let sinks = crate::cache_options::test_sinks(query_heads);
    let rotary = Rotary::new(100.0);
    let cache = KvCache::<f32>::with_window_for_level(shape, c.window, level).unwrap();
    let mut cache = cache.with_sink_tokens(c.sink_tokens).unwrap();
    assert_eq!(cache.sink_tokens(), c.sink_tokens);
    if c.rotary {
        cache = cache.with_rotary(rotary).unwrap();
    }
    let (mut len, mut furthest) = (0, 0);
    for (n, &n_new) in chunks.iter().enumerate() {
        if truncate_at == Some(n) && len > 0 {
            // Roll back one position, and take the next one from elsewhere in the inputs.
            cache.truncate(len - 1).unwrap();
            len -= 1;
            let (k_other, v_other) =
                (k.slice(s![.., total - 1, ..]).to_owned(), v.slice(s![.., total - 1, ..]).to_owned());
            k.slice_mut(s![.., len, ..]).assign(&k_other);
            v.slice_mut(s![.., len, ..]).assign(&v_other);
        }
        let mut layer = cache.layer(0).unwrap();
        let new = s![.., len..len + n_new, ..];
        layer.append(k.slice(new), v.slice(new)).unwrap();
        len += n_new;
        furthest = furthest.max(len);
        // Until the ring wraps every position is held, and a step may take them all.
        let n_q = if furthest <= capacity { n_new } else { n_new.min(c.queries) };
        let qs = q.slice(s![.., len - n_q..len, ..]);
        let options = if c.options {
            CacheOptions::new().scale(0.8).alibi(&slopes).logit_softcap(3.0).sinks(&sinks)
        } else {
            CacheOptions::new()
        };
        let mut got = Array3::from_elem((query_heads, n_q, c.value_dim), f32::NAN);
        let mut lse = Array2::from_elem((query_heads, n_q), f32::NAN);
        layer.attend_with_into(qs, &options, got.view_mut(), Some(lse.view_mut())).unwrap();
        // The whole history, rotated by absolute position where the cache rotates.
        let (qs, kp, vp) = if c.rotary {
            let turn = |x: Array3<f32>, first: usize| {
                let mut x = x;
                for mut head in x.outer_iter_mut() {
                    rotary.rotate(head.view_mut(), first).unwrap();
                }
                x
            };
            (
                turn(qs.to_owned(), len - n_q),
                turn(k.slice(s![.., ..len, ..]).to_owned(), 0),
                v.slice(s![.., ..len, ..]).to_owned(),
            )
        } else {
            (qs.to_owned(), k.slice(s![.., ..len, ..]).to_owned(), v.slice(s![.., ..len, ..]).to_owned())
        };
        let keep = key_set(n_q, len, c.sink_tokens, c.window);
        let dense =
            AttentionOptions::new().causal(CausalMask::BottomRight).keep_mask(KeepMask::new(keep.view()));
        let dense = if c.options { dense.scale(0.8).logit_softcap(3.0) } else { dense };
        let all_heads =
            if c.options { dense.clone().alibi(Alibi::new(&slopes)).sinks(&sinks) } else { dense.clone() };
        let full = qkv::multi_head_attention_with_lse(
            qs.view().insert_axis(Axis(0)),
            kp.view().insert_axis(Axis(0)),
            vp.view().insert_axis(Axis(0)),
            &all_heads.simd(level),
        )
        .unwrap();
        for h in 0..query_heads {
            let ctx = format!("{level} {c:?}, {n_q} new of {len}, head {h}");
            let (qh, kh, vh) = (
                qs.slice(s![h, .., ..]),
                kp.slice(s![h / c.group, .., ..]),
                vp.slice(s![h / c.group, .., ..]),
            );
            let head_options = if c.options {
                dense.clone().alibi(Alibi::new(&slopes[h..=h])).sinks(&sinks[h..=h])
            } else {
                dense.clone()
            };
            let want = qkv::reference::attention_with_lse(qh, kh, vh, &head_options).unwrap();
            let scores = qkv::reference::attention(qh, kh, vh, &head_options).unwrap();
            let (weights_bound, bound) = error_bound(&scores, &vh.to_owned());
            let got_head = got.slice(s![h, .., ..]).to_owned();
            assert_close(&format!("sink tokens vs reference {ctx}"), &got_head, &want.output, bound);
            let full_head = full.output.slice(s![0, h, .., ..]).mapv(f64::from);
            assert_close(&format!("sink tokens vs multi_head_attention {ctx}"), &got_head, &full_head, bound);
            for (i, (&g, &w)) in lse.slice(s![h, ..]).iter().zip(&want.logsumexp).enumerate() {
                let close = if w == f64::NEG_INFINITY {
                    g == f32::NEG_INFINITY
                } else {
                    (f64::from(g) - w).abs() <= 2e-5 * (weights_bound + len as f64)
                };
                assert!(close, "logsumexp {ctx} row {i}: got {g}, want {w}");
            }
        }
    }
}

/// Steps of 1 and of random sizes, `len` positions in all.
fn random_chunks(rng: &mut ChaCha8Rng, largest_step: usize, len: usize) -> Vec<usize> {
    let mut chunks = Vec::new();
    while chunks.iter().sum::<usize>() < len {
        chunks.push(if rng.random_bool(0.5) { 1 } else { rng.random_range(1..=largest_step) });
    }
    chunks
}

/// Sink tokens of 1, of a whole key panel and past it, windows narrower and wider than them,
/// several times round the ring, with and without every option, at every level.
#[test]
fn a_cache_with_sink_tokens_matches_full_attention_over_the_explicit_key_set() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut seed = 1000;
    for level in levels() {
        for (sink_tokens, window, largest_step, kv_heads, group, key_dim, value_dim) in
            [(1, 4, 1, 1, 1, 1, 1), (4, 3, 5, 2, 2, 16, 24), (8, 20, 3, 1, 4, 17, 5), (17, 40, 7, 3, 1, 8, 8)]
        {
            for options in [false, true] {
                seed += 1;
                let c = Config {
                    kv_heads,
                    group,
                    key_dim,
                    value_dim,
                    sink_tokens,
                    window,
                    largest_step,
                    queries: largest_step,
                    options,
                    rotary: false,
                };
                let chunks =
                    random_chunks(&mut rng, largest_step, 3 * (sink_tokens + window + largest_step) + 20);
                check(level, c, &chunks, None, seed);
            }
        }
    }
}

/// A prompt longer than the ring in one append (the first positions kept as sink tokens, the
/// ring written past its end within the append), then decoding; with rotary embeddings by
/// absolute position; and a truncation of one position.
#[test]
fn long_appends_rotary_positions_and_truncation_keep_the_sink_tokens() {
    for level in levels() {
        let c = Config {
            kv_heads: 1,
            group: 2,
            key_dim: 8,
            value_dim: 4,
            sink_tokens: 4,
            window: 16,
            largest_step: 2,
            queries: 2,
            options: true,
            rotary: true,
        };
        check(level, c, &[100, 1, 1, 2, 1], None, 1100);
        check(level, c, &[30, 1, 1, 2, 1], Some(3), 1101);
        let c = Config { rotary: false, ..c };
        check(level, c, &[2, 1, 1, 1, 1, 1, 2], Some(2), 1102);
        // Chunks longer than a wrapped ring's step (3 here) while nothing is written over yet:
        // every position is held, so a step takes them all, up to the capacity (12) exactly.
        let c = Config { sink_tokens: 2, window: 8, largest_step: 3, queries: 12, ..c };
        check(level, c, &[5, 5, 2, 1, 3, 1], None, 1103);
    }
}

/// A ring long enough for a step to split its keys (past 2048 slots), its sink tokens in the
/// first split, and a window narrow enough that they weigh.
#[test]
fn sink_tokens_with_split_keys_match() {
    for level in levels() {
        let c = Config {
            kv_heads: 1,
            group: 4,
            key_dim: 16,
            value_dim: 8,
            sink_tokens: 4,
            window: 16,
            largest_step: 2040,
            queries: 2,
            // No ALiBi, whose penalty 3000 positions back would hide the sink tokens anyway.
            options: false,
            rotary: false,
        };
        check(level, c, &[3000, 1, 2], None, 1200);
    }
}

#[test]
fn sink_tokens_a_cache_cannot_keep_are_errors() {
    let shape = CacheShape::new(1, 1, 24, 2, 2);
    let level = SimdLevel::Baseline;
    let err = |e: qkv::AttentionError| e.to_string();
    let plain = KvCache::<f32>::for_level(shape, level).unwrap().with_sink_tokens(4);
    assert_eq!(
        err(plain.err().unwrap()),
        "a KV cache cannot keep its first 4 positions as sink tokens: it has no window \
         (KvCache::with_window), and it keeps every position anyway"
    );
    // The window and the sink tokens fill the capacity exactly, at every level (the cache pads
    // the sink tokens' slots to its level's key panel itself); one more sink token does not fit.
    for level in SimdLevel::ALL.into_iter().filter(|l| l.is_supported()) {
        let windowed = || KvCache::<f32>::with_window_for_level(shape, 20, level).unwrap();
        assert_eq!(windowed().with_sink_tokens(4).unwrap().sink_tokens(), 4, "{level}");
        assert_eq!(
            err(windowed().with_sink_tokens(5).err().unwrap()),
            "a KV cache cannot keep its first 5 positions as sink tokens: they take 5 of the capacity's 24 \
             slots, and the window of 20 positions must still fit in the rest",
            "{level}"
        );
    }
    let mut cache = KvCache::<f32>::with_window_for_level(shape, 8, level).unwrap();
    cache.layer(0).unwrap().append(Array3::zeros((1, 1, 2)).view(), Array3::zeros((1, 1, 2)).view()).unwrap();
    assert_eq!(
        err(cache.with_sink_tokens(2).err().unwrap()),
        "a KV cache cannot keep its first 2 positions as sink tokens: it already holds positions"
    );
    let mut cache =
        KvCache::<f32>::with_window_for_level(shape, 8, level).unwrap().with_sink_tokens(2).unwrap();
    let mut layer = cache.layer(0).unwrap();
    layer.append(Array3::zeros((1, 3, 2)).view(), Array3::zeros((1, 3, 2)).view()).unwrap();
    let keep = Array2::from_elem((1, 3), true);
    let q = Array3::<f32>::zeros((1, 1, 2));
    assert_eq!(
        err(layer.attend_with(q.view(), &CacheOptions::new().keep_mask(keep.view())).unwrap_err()),
        "a KV cache step takes no keep_mask option: a cache that keeps sink tokens places them apart from its ring"
    );
}
