//! Attention over a KV cache with options (`CacheOptions`: scale, windows, ALiBi, soft-capping,
//! keep masks, logsumexp) against `multi_head_attention` over the same prefix and the f64
//! reference head by head, at every SIMD level, for decoding steps and prefill chunks; f32
//! queries over bf16 and f16 caches; splitting a cache and merging its parts; and the errors.

use ndarray::{Array2, Array3, Axis, s};
use qkv::half::{bf16, f16};
use qkv::{CacheOptions, CacheShape, KvCache, SimdLevel, SlidingWindow, Storage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{assert_close, error_bound, levels};

/// The options a test step runs with: everything but the keep mask, which depends on the step.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Scale,
    CausalWindow,
    /// A window of a few keys back and unbounded forward (the causal mask bounds it).
    UnboundedForward,
    /// Both sides unbounded: the causal step itself.
    Unbounded,
    Alibi,
    Softcap,
    /// A random keep mask (a tree's ancestors), some rows hiding everything.
    Keep,
    /// Attention sinks, one per query head (`-inf` for every third: no sink).
    Sinks,
    /// Everything at once.
    All,
}

pub const KINDS: [Kind; 9] = [
    Kind::Scale,
    Kind::CausalWindow,
    Kind::UnboundedForward,
    Kind::Unbounded,
    Kind::Alibi,
    Kind::Softcap,
    Kind::Keep,
    Kind::Sinks,
    Kind::All,
];

/// `kind`'s options for a step of `n_q` queries over `len` positions; `slopes` and `sinks` one
/// per query head, `keep` `[n_q, len]`.
pub fn options<'a>(
    kind: Kind,
    slopes: &'a [f32],
    sinks: &'a [f32],
    keep: &'a Array2<bool>,
) -> CacheOptions<'a> {
    let o = CacheOptions::new();
    match kind {
        Kind::Scale => o.scale(0.7),
        Kind::CausalWindow => o.sliding_window(SlidingWindow::new(37, 0)),
        Kind::UnboundedForward => o.sliding_window(SlidingWindow::new(5, SlidingWindow::UNBOUNDED)),
        Kind::Unbounded => {
            o.sliding_window(SlidingWindow::new(SlidingWindow::UNBOUNDED, SlidingWindow::UNBOUNDED))
        }
        Kind::Alibi => o.alibi(slopes),
        Kind::Softcap => o.scale(1.5).logit_softcap(2.0),
        Kind::Keep => o.keep_mask(keep.view()),
        Kind::Sinks => o.sinks(sinks),
        Kind::All => o
            .scale(1.2)
            .sinks(sinks)
            .sliding_window(SlidingWindow::new(150, 0))
            .alibi(slopes)
            .logit_softcap(3.0)
            .keep_mask(keep.view()),
    }
}

/// Appends `chunks` positions at a time to a cache of `E` at `level` and after each append
/// attends with the queries (f32, of every position just appended, at most `most_queries`) under
/// `kind`'s options; each output and logsumexp must match `multi_head_attention_with_lse` and the
/// reference over the prefix held, the keys and values rounded to `E` as the cache holds them.
fn check_steps<E: Storage>(
    level: SimdLevel,
    shape: CacheShape,
    query_heads: usize,
    chunks: &[usize],
    most_queries: usize,
    kind: Kind,
    seed: u64,
) {
    let len: usize = chunks.iter().sum();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let tensor = |heads, d, rng: &mut ChaCha8Rng| {
        Array3::from_shape_simple_fn((heads, len, d), || rng.random_range(-1.5_f32..1.5))
    };
    let q = tensor(query_heads, shape.key_dim, &mut rng);
    // The keys and values as the cache stores them, and widened back for the comparisons.
    let k = tensor(shape.kv_heads, shape.key_dim, &mut rng).mapv(E::from_f32);
    let v = tensor(shape.kv_heads, shape.value_dim, &mut rng).mapv(E::from_f32);
    let (k32, v32) = (k.mapv(E::to_f32), v.mapv(E::to_f32));
    let slopes: Vec<f32> = (0..query_heads).map(|h| 0.05 + 0.3 * h as f32 / query_heads as f32).collect();
    let sinks = test_sinks(query_heads);
    let mut cache = KvCache::<E>::for_level(shape, level).unwrap();
    let mut layer = cache.layer(shape.layers - 1).unwrap();
    let mut held = 0;
    for &n_new in chunks {
        let new = s![.., held..held + n_new, ..];
        layer.append(k.slice(new), v.slice(new)).unwrap();
        held += n_new;
        let n_q = n_new.min(most_queries);
        let q = q.slice(s![.., held - n_q..held, ..]);
        let keep = Array2::from_shape_fn((n_q, held), |(i, j)| {
            // Every row keeps its own position unless it is a row that sees nothing (every 5th).
            (i % 5 != 3) && (j == held - n_q + i || rng.random_bool(0.6))
        });
        let options = options(kind, &slopes, &sinks, &keep);
        // Pre-filled with NaN: an element the step forgets to write fails the comparison.
        let mut got = Array3::from_elem((query_heads, n_q, shape.value_dim), f32::NAN);
        let mut lse = Array2::from_elem((query_heads, n_q), f32::NAN);
        layer.attend_with_into(q, &options, got.view_mut(), Some(lse.view_mut())).unwrap();
        assert_eq!(layer.attend_with(q, &options).unwrap(), got, "attend_with and attend_with_into agree");
        let (kp, vp) = (k32.slice(s![.., ..held, ..]), v32.slice(s![.., ..held, ..]));
        let dense = options.dense().simd(level);
        let full = qkv::multi_head_attention_with_lse(
            q.insert_axis(Axis(0)),
            kp.insert_axis(Axis(0)),
            vp.insert_axis(Axis(0)),
            &dense,
        )
        .unwrap();
        let group = query_heads / shape.kv_heads;
        for h in 0..query_heads {
            let ctx = format!(
                "{level} {} {kind:?} {shape:?} {query_heads} heads, {n_q} new of {held}, head {h}",
                E::NAME
            );
            let (qh, kh, vh) =
                (q.slice(s![h, .., ..]), kp.slice(s![h / group, .., ..]), vp.slice(s![h / group, .., ..]));
            // One head's options: its own ALiBi slope and sink.
            let head_options = match kind {
                Kind::Alibi => options.clone().alibi(&slopes[h..=h]),
                Kind::Sinks => options.clone().sinks(&sinks[h..=h]),
                Kind::All => options.clone().alibi(&slopes[h..=h]).sinks(&sinks[h..=h]),
                _ => options.clone(),
            };
            let head_options = head_options.dense();
            let want = qkv::reference::attention(qh, kh, vh, &head_options).unwrap();
            let want_lse = qkv::reference::attention_with_lse(qh, kh, vh, &head_options).unwrap().logsumexp;
            let (weights_bound, bound) = error_bound(&want, &vh.to_owned());
            let got_head = got.slice(s![h, .., ..]).to_owned();
            assert_close(&format!("cache vs reference {ctx}"), &got_head, &want.output, bound);
            let full_head = full.output.slice(s![0, h, .., ..]).mapv(f64::from);
            assert_close(&format!("cache vs multi_head_attention {ctx}"), &got_head, &full_head, bound);
            for (i, (&g, &w)) in lse.slice(s![h, ..]).iter().zip(&want_lse).enumerate() {
                let close = if w == f64::NEG_INFINITY {
                    g == f32::NEG_INFINITY
                } else {
                    (f64::from(g) - w).abs() <= 2e-5 * (weights_bound + held as f64)
                };
                assert!(close, "logsumexp {ctx} row {i}: got {g}, want {w}");
            }
        }
    }
}

/// One attention-sink logit per query head: every third `-inf` (no sink), the others between -2
/// and 3, about the size of the scores.
pub fn test_sinks(query_heads: usize) -> Vec<f32> {
    (0..query_heads).map(|h| if h % 3 == 1 { f32::NEG_INFINITY } else { -2.0 + 1.3 * h as f32 }).collect()
}

/// Lengths that cross the key panels and the key block off their boundaries.
pub const CHUNKS: [usize; 8] = [1, 1, 15, 113, 1, 130, 7, 1];

/// Each option of `kinds` on two of the three shapes per level, turning with the level and the
/// option: every option meets every shape over the levels (on a CPU with two or more), and every
/// level every shape over the options, in two thirds of the time of all three everywhere.
fn check_options(kinds: &[Kind], mut seed: u64) {
    let shapes = [(1, 1, 1, 1), (2, 3, 16, 24), (3, 2, 17, 5)];
    for (l, level) in levels().into_iter().enumerate() {
        for (k, &kind) in kinds.iter().enumerate() {
            for (kv_heads, group, key_dim, value_dim) in [shapes[(l + k) % 3], shapes[(l + k + 1) % 3]] {
                seed += 1;
                let capacity = CHUNKS.iter().sum::<usize>();
                let shape = CacheShape::new(2, kv_heads, capacity, key_dim, value_dim);
                check_steps::<f32>(level, shape, kv_heads * group, &CHUNKS, usize::MAX, kind, seed);
            }
        }
    }
}

// Two halves of the options, so that the test threads share them.
#[test]
fn every_option_matches_full_attention_at_every_level() {
    check_options(&KINDS[..KINDS.len() / 2], 100);
}

#[test]
fn every_other_option_matches_full_attention_at_every_level() {
    check_options(&KINDS[KINDS.len() / 2..], 150);
}

#[test]
fn f32_queries_over_half_caches_match_the_widened_values() {
    let mut seed = 200;
    for level in levels() {
        for kind in [Kind::Unbounded, Kind::All] {
            seed += 1;
            let shape = CacheShape::new(1, 2, 300, 32, 24);
            check_steps::<bf16>(level, shape, 8, &[1, 130, 1, 60, 1], usize::MAX, kind, seed);
            check_steps::<f16>(level, shape, 8, &[1, 130, 1, 60, 1], usize::MAX, kind, seed);
        }
    }
}

#[test]
fn long_steps_with_options_split_their_keys_and_still_match() {
    // Past 1024 positions a step with few rows splits its keys between tasks and merges them.
    for level in levels() {
        for kind in [Kind::CausalWindow, Kind::All] {
            let shape = CacheShape::new(1, 2, 2200, 32, 16);
            check_steps::<f32>(level, shape, 4, &[2100, 1, 1], 2, kind, 300);
        }
    }
}

#[test]
fn storage_type_queries_still_work_and_agree_with_f32_queries() {
    let shape = CacheShape::new(1, 1, 8, 4, 4);
    let mut cache = KvCache::<bf16>::new(shape).unwrap();
    let mut layer = cache.layer(0).unwrap();
    let kv = Array3::from_shape_fn((1, 5, 4), |(_, i, c)| bf16::from_f32((i * 4 + c) as f32 / 16.0));
    layer.append(kv.view(), kv.view()).unwrap();
    let q = Array3::from_shape_fn((2, 2, 4), |(h, i, c)| bf16::from_f32((h + i + c) as f32 / 4.0));
    let half_queries = layer.attend(q.view()).unwrap();
    let f32_queries = layer.attend(q.mapv(bf16::to_f32).view()).unwrap();
    assert_eq!(half_queries, f32_queries, "bf16 queries are widened exactly");
}

/// Attention over two layers that hold the first `split` positions and the rest merges, with
/// the logsumexp, into attention over a layer holding all of them.
#[test]
fn a_cache_split_in_two_merges_into_the_whole() {
    for level in levels() {
        for (len, split) in [(2, 1), (300, 129), (300, 1), (1500, 700)] {
            let shape = CacheShape::new(3, 2, len, 16, 8);
            let mut rng = ChaCha8Rng::seed_from_u64(len as u64);
            let mut tensor =
                |heads, n, d| Array3::from_shape_simple_fn((heads, n, d), || rng.random_range(-1.0_f32..1.0));
            let (k, v, q) = (tensor(2, len, 16), tensor(2, len, 8), tensor(6, 1, 16));
            let keep_all = Array2::from_elem((1, len), true);
            let mut cache = KvCache::<f32>::for_level(shape, level).unwrap();
            let options = CacheOptions::new().scale(0.9).logit_softcap(4.0);
            let mut whole = cache.layer(0).unwrap();
            whole.append(k.view(), v.view()).unwrap();
            let with_keep = options.clone().keep_mask(keep_all.view());
            let whole = whole.attend_with_lse(q.view(), &with_keep).unwrap();
            let mut first = cache.layer(1).unwrap();
            first.append(k.slice(s![.., ..split, ..]), v.slice(s![.., ..split, ..])).unwrap();
            let first = first.attend_with_lse(q.view(), &options).unwrap();
            let mut rest = cache.layer(2).unwrap();
            rest.append(k.slice(s![.., split.., ..]), v.slice(s![.., split.., ..])).unwrap();
            let rest = rest.attend_with_lse(q.view(), &options).unwrap();
            let merged = first.merge(&rest).unwrap();
            let close = |what: &str, got: &[f32], want: &[f32]| {
                for (g, w) in got.iter().zip(want) {
                    assert!(
                        (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                        "{level} {len}/{split} {what}: {g} vs {w}"
                    );
                }
            };
            close("output", merged.output.as_slice().unwrap(), whole.output.as_slice().unwrap());
            close("logsumexp", merged.logsumexp.as_slice().unwrap(), whole.logsumexp.as_slice().unwrap());
        }
    }
}

#[test]
fn bad_options_are_errors_naming_the_layer_the_argument_and_the_shape() {
    let shape = CacheShape::new(2, 2, 8, 3, 5);
    let mut cache = KvCache::<f32>::new(shape).unwrap();
    let mut layer = cache.layer(1).unwrap();
    layer.append(Array3::zeros((2, 4, 3)).view(), Array3::zeros((2, 4, 5)).view()).unwrap();
    let q = Array3::<f32>::zeros((4, 2, 3));
    let mut err = |options: &CacheOptions| layer.attend_with(q.view(), options).unwrap_err().to_string();
    let keep = Array2::from_elem((2, 3), true);
    assert_eq!(
        err(&CacheOptions::new().keep_mask(keep.view())),
        "layer 1 of the KV cache takes keep_mask of shape [2, 4], not [2, 3]: one row per new query, one \
         column per position held"
    );
    assert_eq!(
        err(&CacheOptions::new().alibi(&[0.5; 2])),
        "layer 1 of the KV cache takes alibi slopes of shape [4], not [2]: one slope per query head"
    );
    assert_eq!(
        err(&CacheOptions::new().alibi(&[0.5, f32::NAN, 0.5, 0.5])),
        "alibi slopes[1] is NaN: attention needs finite inputs"
    );
    for cap in [0.0, -1.0, f32::INFINITY, f32::NAN] {
        assert_eq!(
            err(&CacheOptions::new().logit_softcap(cap)),
            format!("logit_softcap is {cap}: the cap must be finite and positive (Gemma 2 uses 50)")
        );
    }
    assert_eq!(
        err(&CacheOptions::new().scale(f32::NAN)),
        "scale is NaN: the score multiplier must be finite"
    );
    let (mut out, mut lse) = (Array3::<f32>::zeros((4, 2, 5)), Array2::zeros((4, 1)));
    assert_eq!(
        layer
            .attend_with_into(q.view(), &CacheOptions::new(), out.view_mut(), Some(lse.view_mut()))
            .unwrap_err()
            .to_string(),
        "layer 1 of the KV cache takes logsumexp of shape [4, 2], not [4, 1]: one per query row"
    );
}

#[test]
fn options_a_cache_decides_are_errors_on_both_caches() {
    use qkv::{AdditiveBias, CausalMask, KeyPadding, PagedKvCache, PagedShape, SlidingWindow};
    let shape = CacheShape::new(1, 1, 8, 2, 2);
    let mut cache = KvCache::<f32>::new(shape).unwrap();
    let level = cache.simd_level();
    let mut layer = cache.layer(0).unwrap();
    layer.append(Array3::zeros((1, 3, 2)).view(), Array3::zeros((1, 3, 2)).view()).unwrap();
    let paged_shape = PagedShape::new(1, 1, 2, 2, 64, 1);
    let mut paged = PagedKvCache::<f32>::new(paged_shape).unwrap();
    let seq = paged.add_sequence();
    let mut paged_layer = paged.layer(0).unwrap();
    paged_layer.append(seq, Array3::zeros((1, 3, 2)).view(), Array3::zeros((1, 3, 2)).view()).unwrap();
    let q = Array3::<f32>::zeros((1, 1, 2));
    let (padding, lengths, bias) = (ndarray::array![true, true, false], [2], Array2::<f32>::zeros((1, 3)));
    // The level neither cache runs at: a request for it is refused whatever it is.
    let other = if level == SimdLevel::Baseline { SimdLevel::Avx2 } else { SimdLevel::Baseline };
    let cases = [
        (CacheOptions::new().causal(CausalMask::TopLeft), "causal"),
        (CacheOptions::new().key_padding(KeyPadding::new(padding.view())), "key_padding"),
        (CacheOptions::new().key_lengths(&lengths), "key_lengths"),
        (CacheOptions::new().bias(AdditiveBias::new(bias.view())), "bias"),
        (CacheOptions::new().simd(other), "simd"),
        (
            CacheOptions::new().sliding_window(SlidingWindow::new(2, 0).aligned(CausalMask::TopLeft)),
            "TopLeft-aligned sliding_window",
        ),
    ];
    for (options, option) in &cases {
        for message in [
            layer.attend_with(q.view(), options).unwrap_err().to_string(),
            paged_layer.attend_with(&[seq], &[0, 1], q.view(), options).unwrap_err().to_string(),
        ] {
            assert!(message.starts_with(&format!("a KV cache step takes no {option} option: ")), "{message}");
        }
    }
    // What a cache step is anyway is no error: the bottom-right causal mask, its own level.
    let same = CacheOptions::new().causal(CausalMask::BottomRight).simd(level);
    layer.attend_with(q.view(), &same).unwrap();
}
