//! Rotary position embeddings: `Rotary::rotate` against the reference's own f64 rotation; the
//! score depending on the distance alone; `KvCache` (plain, and a ring across its wrap-around)
//! and `PagedKvCache` (with a fork) rotating keys at append and queries at each step, against
//! the reference over keys and queries it rotated itself, at every SIMD level; the gradient a
//! dense caller takes back through `rotate_back` against finite differences; and the errors.

use ndarray::{Array2, Array3, ArrayView2, s};
use qkv::half::bf16;
use qkv::{
    AttentionOptions, CacheOptions, CacheShape, CausalMask, KvCache, PagedKvCache, PagedShape, Rotary,
    SlidingWindow, Storage,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{assert_close, error_bound, levels};

fn random(rng: &mut ChaCha8Rng, shape: (usize, usize, usize)) -> Array3<f32> {
    Array3::from_shape_simple_fn(shape, || rng.random_range(-1.0..1.0))
}

/// The embeddings the tests turn rows with: both pairings, a partial one, a scaled one.
fn embeddings() -> [Rotary; 4] {
    [
        Rotary::new(10_000.0),
        Rotary::new(500.0).interleaved(),
        Rotary::new(10_000.0).dims(6),
        Rotary::new(1e6).position_scale(0.25),
    ]
}

#[test]
fn rotate_matches_the_reference_and_rotate_back_undoes_it() {
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let x = random(&mut rng, (1, 9, 10)).index_axis_move(ndarray::Axis(0), 0);
    for rotary in embeddings() {
        for first in [0, 1, 4093] {
            let want = qkv::reference::rotate(x.view(), &rotary, first);
            let mut got = x.clone();
            rotary.rotate(got.view_mut(), first).unwrap();
            // One rounding to f32 per component.
            let worst = got.iter().zip(&want).fold(0.0_f64, |m, (&g, &w)| m.max((f64::from(g) - w).abs()));
            assert!(worst <= 1e-7, "{rotary:?} from {first}: {worst}");
            let mut wide = x.mapv(f64::from);
            rotary.rotate(wide.view_mut(), first).unwrap();
            let worst = wide.iter().zip(&want).fold(0.0_f64, |m, (&g, &w)| m.max((g - w).abs()));
            assert!(worst <= 1e-12, "{rotary:?} f64 from {first}: {worst}");
            rotary.rotate_back(wide.view_mut(), first).unwrap();
            let worst = wide.iter().zip(&x).fold(0.0_f64, |m, (&g, &w)| m.max((g - f64::from(w)).abs()));
            assert!(worst <= 1e-12, "{rotary:?} back from {first}: {worst}");
        }
    }
}

#[test]
fn a_rotated_score_depends_on_the_distance_alone() {
    let mut rng = ChaCha8Rng::seed_from_u64(2);
    let pair = random(&mut rng, (1, 2, 16)).index_axis_move(ndarray::Axis(0), 0);
    let (q, k) = (pair.slice(s![0..1, ..]), pair.slice(s![1..2, ..]));
    for rotary in embeddings() {
        let score = |p: usize, s: usize| {
            let (q, k) = (qkv::reference::rotate(q, &rotary, p), qkv::reference::rotate(k, &rotary, s));
            q.row(0).dot(&k.row(0))
        };
        for (p, s) in [(5, 2), (3, 3), (100, 40)] {
            for shift in [1, 17, 1000] {
                let (a, b) = (score(p, s), score(p + shift, s + shift));
                assert!((a - b).abs() < 1e-9, "{rotary:?} ({p}, {s}) + {shift}: {a} vs {b}");
            }
        }
    }
}

/// The reference's attention of every query head of a cache step: queries `q`
/// (`[query_heads, n_q, d]`) at positions `len - n_q ..`, over keys and values `[kv_heads, len,
/// d]` at `0 .. len`, each rotated by the reference (the keys then rounded by `store`, as the
/// cache stores them), under the cache's options as dense ones.
fn want_step(
    q: &Array3<f32>,
    (k, v): (&Array3<f32>, &Array3<f32>),
    store: fn(f64) -> f64,
    rotary: &Rotary,
    options: &AttentionOptions<f64>,
) -> Vec<(qkv::Attention<f64>, Array2<f32>)> {
    let (query_heads, n_q, len) = (q.shape()[0], q.shape()[1], k.shape()[1]);
    let group = query_heads / k.shape()[0];
    (0..query_heads)
        .map(|h| {
            let qh = qkv::reference::rotate(q.slice(s![h, .., ..]), rotary, len - n_q);
            let kh = qkv::reference::rotate(k.slice(s![h / group, .., ..]), rotary, 0).mapv(store);
            let vh = v.slice(s![h / group, .., ..]).mapv(f64::from);
            let want = qkv::reference::attention(qh.view(), kh.view(), vh.view(), options).unwrap();
            (want, v.slice(s![h / group, .., ..]).to_owned())
        })
        .collect()
}

fn check_step(what: &str, got: &Array3<f32>, want: &[(qkv::Attention<f64>, Array2<f32>)]) {
    for (h, (want, v)) in want.iter().enumerate() {
        let got = got.slice(s![h, .., ..]).to_owned();
        assert_close(&format!("{what} head {h}"), &got, &want.output, error_bound(want, v).1);
    }
}

/// A cache of `E` with `rotary`, plain or windowed, appended in steps of awkward sizes past a
/// ring's wrap-around, attending after each step; against the reference.
fn check_kv_cache<E: Storage>(rotary: Rotary, window: Option<usize>) {
    let (kv_heads, query_heads, d, steps) = (2, 4, 10, [5, 1, 7, 1, 1, 6, 3]);
    let total: usize = steps.iter().sum();
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    // Stored values are what the cache holds: rounded to `E` first.
    let round = |a: Array3<f32>| a.mapv(|x| E::from_f32(x).to_f32());
    let (k, v) =
        (round(random(&mut rng, (kv_heads, total, d))), round(random(&mut rng, (kv_heads, total, d))));
    let q = random(&mut rng, (query_heads, total, d));
    for level in levels() {
        let shape = CacheShape::new(1, kv_heads, 20, d, d);
        let cache = match window {
            Some(window) => KvCache::<E>::with_window_for_level(shape, window, level).unwrap(),
            None => KvCache::<E>::for_level(shape.with_capacity(total), level).unwrap(),
        };
        let mut cache = cache.with_rotary(rotary).unwrap();
        let mut layer = cache.layer(0).unwrap();
        let mut len = 0;
        for step in steps {
            let new = s![.., len..len + step, ..];
            layer
                .append(k.slice(new).mapv(E::from_f32).view(), v.slice(new).mapv(E::from_f32).view())
                .unwrap();
            len += step;
            let got = layer.attend(q.slice(new)).unwrap();
            let mut options = AttentionOptions::new().causal(CausalMask::BottomRight);
            if let Some(window) = window {
                options = options.sliding_window(SlidingWindow::new(window - 1, 0));
            }
            let (held_k, held_v) =
                (k.slice(s![.., ..len, ..]).to_owned(), v.slice(s![.., ..len, ..]).to_owned());
            let store = |x: f64| f64::from(E::from_f32(x as f32).to_f32());
            let want = want_step(&q.slice(new).to_owned(), (&held_k, &held_v), store, &rotary, &options);
            check_step(&format!("{level} {} {rotary:?} window {window:?} len {len}", E::NAME), &got, &want);
        }
    }
}

#[test]
fn a_rotary_kv_cache_matches_the_reference_over_rotated_inputs() {
    for rotary in embeddings() {
        check_kv_cache::<f32>(rotary, None);
        // A ring of 20 slots, 24 positions: its steps straddle the wrap-around.
        check_kv_cache::<f32>(rotary, Some(8));
    }
    check_kv_cache::<bf16>(Rotary::new(10_000.0), Some(8));
}

#[test]
fn a_rotary_paged_cache_and_its_fork_match_the_reference() {
    let (kv_heads, query_heads, d) = (2, 4, 8);
    let rotary = Rotary::new(10_000.0).interleaved();
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    let (k, v) = (random(&mut rng, (kv_heads, 90, d)), random(&mut rng, (kv_heads, 90, d)));
    let q = random(&mut rng, (query_heads, 90, d));
    for level in levels() {
        let block_size = PagedKvCache::<f32>::block_granularity(level).unwrap();
        let shape = PagedShape::new(1, kv_heads, d, d, block_size, 16);
        let mut cache = PagedKvCache::<f32>::for_level(shape, level).unwrap().with_rotary(rotary).unwrap();
        let a = cache.add_sequence();
        cache.layer(0).unwrap().append(a, k.slice(s![.., ..70, ..]), v.slice(s![.., ..70, ..])).unwrap();
        // The fork shares the 70 rotated positions, then each goes its own way.
        let b = cache.fork(a).unwrap();
        let mut layer = cache.layer(0).unwrap();
        layer.append(a, k.slice(s![.., 70..72, ..]), v.slice(s![.., 70..72, ..])).unwrap();
        layer.append(b, k.slice(s![.., 80..81, ..]), v.slice(s![.., 80..81, ..])).unwrap();
        let queries =
            ndarray::concatenate(ndarray::Axis(1), &[q.slice(s![.., 0..2, ..]), q.slice(s![.., 2..3, ..])]);
        let got =
            layer.attend_with(&[a, b], &[0, 2, 3], queries.unwrap().view(), &CacheOptions::new()).unwrap();
        let options = AttentionOptions::new().causal(CausalMask::BottomRight);
        let held_a = (k.slice(s![.., ..72, ..]).to_owned(), v.slice(s![.., ..72, ..]).to_owned());
        let f32_keys = |x: f64| f64::from(x as f32);
        let want_a = want_step(
            &q.slice(s![.., 0..2, ..]).to_owned(),
            (&held_a.0, &held_a.1),
            f32_keys,
            &rotary,
            &options,
        );
        check_step(&format!("{level} paged a"), &got.slice(s![.., 0..2, ..]).to_owned(), &want_a);
        let joined = |x: &Array3<f32>| {
            ndarray::concatenate(ndarray::Axis(1), &[x.slice(s![.., ..70, ..]), x.slice(s![.., 80..81, ..])])
                .unwrap()
        };
        let held_b = (joined(&k), joined(&v));
        let want_b = want_step(
            &q.slice(s![.., 2..3, ..]).to_owned(),
            (&held_b.0, &held_b.1),
            f32_keys,
            &rotary,
            &options,
        );
        check_step(&format!("{level} paged fork b"), &got.slice(s![.., 2..3, ..]).to_owned(), &want_b);
    }
}

/// `Σ dO ⊙ attention(rotate(q), rotate(k), v)` (causal), in f64.
fn loss(
    q: ArrayView2<f64>,
    k: ArrayView2<f64>,
    v: ArrayView2<f64>,
    d_out: &Array2<f64>,
    rotary: &Rotary,
) -> f64 {
    let options = AttentionOptions::new().causal(CausalMask::BottomRight);
    let (q, k) = (qkv::reference::rotate(q, rotary, 0), qkv::reference::rotate(k, rotary, 0));
    (qkv::reference::attention(q.view(), k.view(), v, &options).unwrap().output * d_out).sum()
}

#[test]
fn gradients_turned_back_through_rotate_back_match_finite_differences() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut random = |r, c| Array2::from_shape_simple_fn((r, c), || rng.random_range(-1.0..1.0_f64));
    let (n, d) = (6, 4);
    let (q, k, v, d_out) = (random(n, d), random(n, d), random(n, d), random(n, d));
    let rotary = Rotary::new(100.0);
    // What a dense caller does: rotate, attend, take the backward, turn dq and dk back.
    let (mut q_rot, mut k_rot) = (q.clone(), k.clone());
    rotary.rotate(q_rot.view_mut(), 0).unwrap();
    rotary.rotate(k_rot.view_mut(), 0).unwrap();
    let options = AttentionOptions::new().causal(CausalMask::BottomRight);
    for level in levels() {
        let options = options.clone().simd(level);
        let forward = qkv::attention_with_lse(q_rot.view(), k_rot.view(), v.view(), &options).unwrap();
        let mut g =
            qkv::attention_backward(q_rot.view(), k_rot.view(), v.view(), &forward, d_out.view(), &options)
                .unwrap();
        rotary.rotate_back(g.dq.view_mut(), 0).unwrap();
        rotary.rotate_back(g.dk.view_mut(), 0).unwrap();
        let h = 1e-6;
        for (name, x, got) in [("dq", &q, &g.dq), ("dk", &k, &g.dk)] {
            for ((r, c), &grad) in got.indexed_iter() {
                let nudged = |delta: f64| {
                    let mut x = x.clone();
                    x[[r, c]] += delta;
                    if name == "dq" {
                        loss(x.view(), k.view(), v.view(), &d_out, &rotary)
                    } else {
                        loss(q.view(), x.view(), v.view(), &d_out, &rotary)
                    }
                };
                let want = (nudged(h) - nudged(-h)) / (2.0 * h);
                assert!((grad - want).abs() < 1e-6, "{level} {name}[{r}, {c}]: {grad} vs {want}");
            }
        }
    }
}

#[test]
fn embeddings_that_do_not_fit_are_errors() {
    let mut x = Array2::<f32>::zeros((2, 6));
    for (rotary, why) in [
        (Rotary::new(0.0), "the base must be finite and positive"),
        (Rotary::new(f64::NAN), "the base must be finite and positive"),
        (Rotary::new(10.0).position_scale(f64::INFINITY), "the position scale must be finite"),
        (Rotary::new(10.0).dims(5), "a positive even number, at most the width"),
        (Rotary::new(10.0).dims(8), "a positive even number, at most the width"),
    ] {
        let message = rotary.rotate(x.view_mut(), 0).unwrap_err().to_string();
        assert!(message.contains(why) && message.contains("over rows of 6"), "{message}");
    }
    let shape = CacheShape::new(1, 1, 4, 3, 1);
    let message =
        KvCache::<f32>::new(shape).unwrap().with_rotary(Rotary::new(10.0)).err().unwrap().to_string();
    assert!(message.contains("3 rotated components"), "{message}");
    let shape = CacheShape::new(1, 1, 4, 2, 1);
    let mut cache = KvCache::<f32>::new(shape).unwrap();
    cache.layer(0).unwrap().append(Array3::zeros((1, 1, 2)).view(), Array3::zeros((1, 1, 1)).view()).unwrap();
    let message = cache.with_rotary(Rotary::new(10.0)).err().unwrap().to_string();
    assert!(message.contains("before its first append"), "{message}");
    // A finite f16 key that the rotation takes past f16's range (65504): position 1 turns
    // (60000, 60000) by 1 radian, to about (-18070, 82907). Both caches say so, and keep nothing.
    let key = Array3::from_elem((1, 2, 2), half::f16::from_f32(60000.0));
    let value = Array3::from_elem((1, 2, 1), half::f16::ONE);
    let want = "keys[0, 1, 1] is finite, but rotated by RoPE it overflows f16";
    let mut cache = KvCache::<half::f16>::new(shape).unwrap().with_rotary(Rotary::new(10.0)).unwrap();
    let message = cache.layer(0).unwrap().append(key.view(), value.view()).unwrap_err().to_string();
    assert!(message.starts_with(want), "{message}");
    assert_eq!(cache.layer(0).unwrap().len(), 0);
    let paged = PagedShape::new(1, 1, 2, 1, 4, 2);
    let mut cache = PagedKvCache::<half::f16>::new(paged).unwrap().with_rotary(Rotary::new(10.0)).unwrap();
    let sequence = cache.add_sequence();
    let message = cache.layer(0).unwrap().append(sequence, key.view(), value.view()).unwrap_err().to_string();
    assert!(message.starts_with(want), "{message}");
}

#[test]
fn extremes_of_the_new_parameters_are_errors_or_results_never_panics() {
    // A position scale so large that the angles overflow: the rotated keys are not finite, and
    // the append says so instead of storing them.
    let shape = CacheShape::new(1, 1, 4, 2, 1);
    let rotary = Rotary::new(10.0).position_scale(f64::MAX);
    let mut cache = KvCache::<f32>::new(shape).unwrap().with_rotary(rotary).unwrap();
    // Position 2 turns by 2 · f64::MAX radians: infinite.
    let kv = Array3::from_elem((1, 3, 2), 1.0_f32);
    let message =
        cache.layer(0).unwrap().append(kv.view(), kv.slice(s![.., .., ..1])).unwrap_err().to_string();
    assert!(message.contains("keys") && message.contains("finite"), "{message}");
    // Positions near usize::MAX turn by finite angles.
    let mut x = Array2::<f64>::ones((2, 4));
    Rotary::new(10_000.0).rotate(x.view_mut(), usize::MAX - 1).unwrap();
    assert!(x.iter().all(|v| v.is_finite()));
    let huge = Rotary::new(10.0).dims(usize::MAX).rotate(x.view_mut(), 0).unwrap_err().to_string();
    assert!(huge.contains("at most the width"), "{huge}");
    // Truncating past anything held, or to nothing.
    assert!(cache.truncate(usize::MAX).is_err());
    cache.truncate(0).unwrap();
    // Slopes per sequence and head of no heads.
    let q = ndarray::Array4::<f32>::zeros((1, 1, 1, 2));
    let none = Array2::<f32>::zeros((1, 0));
    let options = AttentionOptions::new().alibi(qkv::Alibi::batched(none.view()));
    assert!(qkv::multi_head_attention(q.view(), q.view(), q.view(), &options).is_err());
}
