//! The int8 KV cache (`KvCache<Q8>`) at every SIMD level: against the f64 reference over the
//! keys and values as this test quantizes them on its own (tight: f32 arithmetic's error), and
//! against the f64 reference over the original keys and values within the stated bound of the
//! quantization (see [`quantization_bound`]); with every cache option, a ring, rotary keys,
//! truncation, awkward shapes, rows of zeros and of huge values; and its errors.

use ndarray::{Array2, Array3, ArrayView1, ArrayView2, Axis, s};
use qkv::{
    AttentionOptions, CacheShape, CausalMask, KvCache, PagedKvCache, PagedShape, Q8, Rotary, SimdLevel,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cache_options::{CHUNKS, KINDS, Kind, options, test_sinks};
use crate::problem::{F32_TOLERANCE, assert_close, error_bound, levels, max_abs};

/// `x` (`[heads, n, d]`) as an int8 cache stores it, widened back: each row `x` (one head's
/// position) as `q · s` with `s = max |x| / 127` and `q = round(x / s)` (f32 arithmetic, as the
/// cache quantizes; zeros for a row of zeros), written here independently of the engine.
fn dequantized(x: &Array3<f32>) -> Array3<f32> {
    let mut out = x.clone();
    for mut row in out.lanes_mut(Axis(2)) {
        let scale = row.iter().fold(0.0_f32, |m, &x| m.max(x.abs())) / 127.0;
        row.mapv_inplace(
            |x| if scale == 0.0 { 0.0 } else { (x / scale).round().clamp(-127.0, 127.0) * scale },
        );
    }
    out
}

/// The stated bound on how far quantization moves an output row of query `q` (after any
/// rotation, times `scale` in the scores) over keys `k` and values `v` (the original ones,
/// before quantization; a row's keys all count, seen or not): each stored element is within
/// `max |x| / 254` of its row's original `x` (half a step, up to a relative 2^-16 of f32
/// rounding), so each score moves by at most `δ = |scale| · ‖q‖₁ · max |k| / 254` (logit
/// soft-capping, 1-Lipschitz, only shrinks that), each weight by a factor within `e^{±2δ}`, and
/// the output by at most `(e^{2δ} - 1) · max |v| + max |v| / 254`.
fn quantization_bound(q: ArrayView1<f32>, scale: f64, k: ArrayView2<f32>, v: ArrayView2<f32>) -> f64 {
    let step = |m: f64| m / 254.0 * (1.0 + 2f64.powi(-16));
    let q_norm: f64 = q.iter().map(|&x| f64::from(x).abs()).sum();
    let delta = scale.abs() * q_norm * step(max_abs(k));
    let v_max = max_abs(v);
    (2.0 * delta).exp_m1() * v_max + step(v_max)
}

/// Positions `positions` of head `head` of `x` (`[heads, n, d]`).
fn head_of(x: &Array3<f32>, head: usize, positions: std::ops::Range<usize>) -> ArrayView2<'_, f32> {
    x.slice(s![head, positions, ..])
}

/// The worst error against the original keys and values, absolute and as a share of the
/// bound, over the steps checked.
#[derive(Debug, Default, Clone, Copy)]
struct Worst {
    error: f64,
    share: f64,
}

/// A run of steps over an int8 cache at `level` of `shape` (a ring of `window` if given, with
/// `rotary` if given), of `query_heads` query heads, appending `chunks` positions at a time and
/// attending after each with their queries (at most `most_queries`) under `kind`'s options, the
/// keys and values random in `±1.5 · magnitude`.
#[derive(Clone, Copy)]
struct Steps<'a> {
    level: SimdLevel,
    shape: CacheShape,
    query_heads: usize,
    chunks: &'a [usize],
    most_queries: usize,
    kind: Kind,
    window: Option<usize>,
    rotary: Option<Rotary>,
    seed: u64,
    magnitude: f32,
}

impl Steps<'_> {
    /// Plain steps: every chunk's queries, no ring, no rotary, magnitude 1.
    fn new(
        level: SimdLevel,
        shape: CacheShape,
        query_heads: usize,
        chunks: &[usize],
        kind: Kind,
        seed: u64,
    ) -> Steps<'_> {
        Steps {
            level,
            shape,
            query_heads,
            chunks,
            most_queries: usize::MAX,
            kind,
            window: None,
            rotary: None,
            seed,
            magnitude: 1.0,
        }
    }
}

/// Runs `steps`: each output row must match the reference over the test's own dequantization
/// within f32's tolerance, and the reference over the original inputs within
/// [`quantization_bound`] plus that tolerance. Returns the worst error against the original.
fn check_steps(steps: Steps) -> Worst {
    let Steps { level, shape, query_heads, chunks, most_queries, kind, window, rotary, seed, magnitude } =
        steps;
    let len: usize = chunks.iter().sum();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensor = |heads, d| {
        Array3::from_shape_simple_fn((heads, len, d), || magnitude * rng.random_range(-1.5_f32..1.5))
    };
    let q = tensor(query_heads, shape.key_dim).mapv(|x| x / magnitude);
    let (k, v) = (tensor(shape.kv_heads, shape.key_dim), tensor(shape.kv_heads, shape.value_dim));
    // What the scores read: the keys and queries rotated by position (the cache rotates keys
    // before it quantizes them).
    let (mut q_turned, mut k_turned) = (q.clone(), k.clone());
    if let Some(rotary) = rotary {
        for mut x in q_turned.outer_iter_mut().chain(k_turned.outer_iter_mut()) {
            rotary.rotate(x.view_mut(), 0).unwrap();
        }
    }
    let (kq, vq) = (dequantized(&k_turned), dequantized(&v));
    let slopes: Vec<f32> = (0..query_heads).map(|h| 0.05 + 0.3 * h as f32 / query_heads as f32).collect();
    let sinks = test_sinks(query_heads);
    let cache = match window {
        None => KvCache::<Q8>::for_level(shape, level).unwrap(),
        Some(window) => KvCache::<Q8>::with_window_for_level(shape, window, level).unwrap(),
    };
    let mut cache = match rotary {
        Some(rotary) => cache.with_rotary(rotary).unwrap(),
        None => cache,
    };
    let mut layer = cache.layer(shape.layers - 1).unwrap();
    let group = query_heads / shape.kv_heads;
    let (mut held, mut worst) = (0, Worst::default());
    for &n_new in chunks {
        let new = s![.., held..held + n_new, ..];
        layer.append(k.slice(new), v.slice(new)).unwrap();
        held += n_new;
        let n_q = n_new.min(most_queries);
        let keep = Array2::from_shape_fn((n_q, layer.held()), |(i, j)| {
            (i % 5 != 3) && (j == layer.held() - n_q + i || rng.random_bool(0.6))
        });
        // The positions the keep mask's columns are, oldest first.
        let first_held = held - layer.held();
        let options = options(kind, &slopes, &sinks, &keep);
        let mut got = Array3::from_elem((query_heads, n_q, shape.value_dim), f32::NAN);
        layer
            .attend_with_into(q.slice(s![.., held - n_q..held, ..]), &options, got.view_mut(), None)
            .unwrap();
        for h in 0..query_heads {
            let ctx =
                format!("{level} {kind:?} {shape:?} {query_heads} heads, {n_q} new of {held}, head {h}");
            let kv = h / group;
            // One head's options, over the positions held: its own ALiBi slope, and a ring's
            // window as a sliding window over them.
            let head_options = match kind {
                Kind::Alibi => options.clone().alibi(&slopes[h..=h]),
                Kind::Sinks => options.clone().sinks(&sinks[h..=h]),
                Kind::All => options.clone().alibi(&slopes[h..=h]).sinks(&sinks[h..=h]),
                _ => options.clone(),
            };
            let head_options = match window {
                Some(window) => head_options.sliding_window(qkv::SlidingWindow::new(window - 1, 0)),
                None => head_options,
            }
            .dense();
            let qh = head_of(&q_turned, h, held - n_q..held);
            let reference = |k: &Array3<f32>, v: &Array3<f32>| {
                qkv::reference::attention(
                    qh,
                    head_of(k, kv, first_held..held),
                    head_of(v, kv, first_held..held),
                    &head_options,
                )
                .unwrap()
            };
            let got_head = got.slice(s![h, .., ..]).to_owned();
            let over_dequantized = reference(&kq, &vq);
            let (_, bound) = error_bound(&over_dequantized, &head_of(&vq, kv, first_held..held).to_owned());
            assert_close(
                &format!("int8 cache vs its dequantized inputs {ctx}"),
                &got_head,
                &over_dequantized.output,
                bound,
            );
            let over_original = reference(&k_turned, &v);
            let scale = match kind {
                Kind::Scale => 0.7,
                Kind::Softcap => 1.5,
                Kind::All => 1.2,
                _ => 1.0 / (shape.key_dim as f64).sqrt(),
            };
            for (i, (got_row, want_row)) in
                got_head.outer_iter().zip(over_original.output.outer_iter()).enumerate()
            {
                let quantization = quantization_bound(
                    qh.row(i),
                    scale,
                    head_of(&k_turned, kv, first_held..held),
                    head_of(&v, kv, first_held..held),
                );
                let allowed = quantization + F32_TOLERANCE * bound;
                for (c, (&g, &w)) in got_row.iter().zip(want_row).enumerate() {
                    let error = (f64::from(g) - w).abs();
                    assert!(
                        error <= allowed,
                        "int8 cache vs original {ctx} [{i}, {c}]: {g} against {w}, beyond {allowed:e}"
                    );
                    worst.error = worst.error.max(error);
                    worst.share = worst.share.max(error / allowed);
                }
            }
        }
    }
    worst
}

/// Every option on three awkward shapes (widths 1, 17 and 5, 16 and 24, 128; d_k ≠ d_v, nothing
/// a multiple of a panel, a first step of one key), at every level.
#[test]
fn int8_cache_steps_match_the_reference_over_its_dequantized_inputs_and_the_stated_bound() {
    let shapes = [(1, 1, 1, 1), (2, 3, 16, 24), (3, 2, 17, 5), (1, 4, 128, 128)];
    // The worst error of each shape's widths, over levels and options.
    let mut worst = [Worst::default(); 4];
    let mut seed = 2600;
    for level in levels() {
        for (k, &kind) in KINDS.iter().enumerate() {
            for s in [k % 4, (k + 1) % 4] {
                let (kv_heads, group, key_dim, value_dim) = shapes[s];
                seed += 1;
                let shape = CacheShape::new(2, kv_heads, CHUNKS.iter().sum(), key_dim, value_dim);
                let step = check_steps(Steps::new(level, shape, kv_heads * group, &CHUNKS, kind, seed));
                worst[s] =
                    Worst { error: worst[s].error.max(step.error), share: worst[s].share.max(step.share) };
            }
        }
    }
    for ((_, _, key_dim, value_dim), worst) in shapes.iter().zip(worst) {
        println!(
            "int8 cache, d_k = {key_dim}, d_v = {value_dim}, values in ±1.5: worst error against the original \
             inputs {:.3e}, {:.1}% of its bound",
            worst.error,
            100.0 * worst.share
        );
    }
}

/// A ring buffer with rotary keys, and a plain cache with them, of decoding steps and chunks: the
/// ring's slots and the rotation by absolute position hold under quantization.
#[test]
fn an_int8_ring_with_rotary_keys_matches_the_reference() {
    let mut seed = 2700;
    for level in levels() {
        for kind in [Kind::Scale, Kind::Keep, Kind::Alibi] {
            seed += 1;
            let shape = CacheShape::new(1, 2, 40, 32, 20);
            let rotary = Some(Rotary::new(10_000.0));
            let ring = Steps::new(level, shape, 8, &[1, 30, 1, 1, 9, 1, 17, 1], kind, seed);
            check_steps(Steps { most_queries: 8, window: Some(33), rotary, ..ring });
            let plain = Steps::new(level, shape, 4, &[3, 1, 20, 1], kind, seed);
            check_steps(Steps { most_queries: 8, rotary, ..plain });
        }
    }
}

/// Past 1024 positions a decoding step splits its keys between tasks: the parts' scales are
/// their own keys'. Huge and tiny magnitudes scale alike.
#[test]
fn long_int8_steps_split_their_keys_and_huge_or_tiny_values_scale_alike() {
    for level in levels() {
        let shape = CacheShape::new(1, 2, 2200, 64, 40);
        check_steps(Steps { most_queries: 1, ..Steps::new(level, shape, 8, &[2100, 1, 1], Kind::All, 2800) });
        for magnitude in [1e30, 1e-30] {
            let shape = CacheShape::new(1, 1, 200, 24, 24);
            let steps = Steps::new(level, shape, 2, &[150, 1, 1], Kind::Scale, 2801);
            check_steps(Steps { most_queries: 1, magnitude, ..steps });
        }
    }
}

/// Rows of zeros (a scale of 0) store zeros; a row hiding every key gives exactly 0; huge and
/// zero rows side by side; truncation and appends past it.
#[test]
fn zero_rows_hidden_rows_and_truncation_over_an_int8_cache() {
    for level in levels() {
        let shape = CacheShape::new(1, 1, 16, 3, 2);
        let mut cache = KvCache::<Q8>::for_level(shape, level).unwrap();
        let mut layer = cache.layer(0).unwrap();
        let k =
            Array3::from_shape_vec((1, 3, 3), vec![0.0, 0.0, 0.0, 1e30, -2e30, 0.5, 0.0, 0.0, 0.0]).unwrap();
        let v = Array3::from_shape_vec((1, 3, 2), vec![0.0, 0.0, 3e30, 1.0, 0.0, 0.0]).unwrap();
        layer.append(k.view(), v.view()).unwrap();
        // A zero query: equal scores, the mean of the values as stored.
        let out = layer.attend(Array3::<f32>::zeros((1, 1, 3)).view()).unwrap();
        let want = dequantized(&v).mean_axis(Axis(1)).unwrap();
        assert_eq!(out.slice(s![0, 0, ..]), want.slice(s![0, ..]), "{level}: the mean of the stored values");
        assert_eq!(out[[0, 0, 1]], 1.0 / 3.0 * (1.0 / (3e30 / 127.0) as f32).round() * (3e30 / 127.0) as f32);
        // A keep mask that hides everything: exactly zero, never NaN.
        let keep = Array2::from_elem((1, 3), false);
        let options = qkv::CacheOptions::new().keep_mask(keep.view());
        let hidden = layer.attend_with(Array3::<f32>::ones((1, 1, 3)).view(), &options).unwrap();
        assert!(hidden.iter().all(|&x| x == 0.0), "{level}: a hidden row is zeros, got {hidden:?}");
        cache.truncate(1).unwrap();
        let mut layer = cache.layer(0).unwrap();
        let (k, v) = (Array3::from_elem((1, 1, 3), 0.25_f32), Array3::from_elem((1, 1, 2), -4.0_f32));
        layer.append(k.view(), v.view()).unwrap();
        // Positions 0 (zeros) and the new one; the query sees both with scores 0 and 0.
        let out = layer.attend(Array3::<f32>::zeros((1, 1, 3)).view()).unwrap();
        assert_eq!(out.iter().copied().collect::<Vec<_>>(), [-2.0, -2.0], "{level}: after truncation");
    }
}

/// Bad input is an error naming the argument and shape: appends of the wrong shape or with a
/// non-finite element, queries of the wrong width; nothing is written by a failed append.
#[test]
fn bad_input_to_an_int8_cache_is_an_error_naming_the_argument() {
    let shape = CacheShape::new(1, 2, 8, 4, 3);
    let mut cache = KvCache::<Q8>::new(shape).unwrap();
    let mut layer = cache.layer(0).unwrap();
    let error = layer.append(Array3::zeros((2, 1, 5)).view(), Array3::zeros((2, 1, 3)).view()).unwrap_err();
    assert!(error.to_string().contains("keys"), "{error}");
    let mut k = Array3::zeros((2, 2, 4));
    k[[1, 1, 2]] = f32::NAN;
    let error = layer.append(k.view(), Array3::zeros((2, 2, 3)).view()).unwrap_err();
    assert!(error.to_string().contains("keys"), "{error}");
    assert_eq!(layer.len(), 0, "a failed append writes nothing");
    let v = Array3::from_elem((2, 2, 3), f32::INFINITY);
    let error = layer.append(Array3::zeros((2, 2, 4)).view(), v.view()).unwrap_err();
    assert!(error.to_string().contains("values"), "{error}");
    layer.append(Array3::ones((2, 2, 4)).view(), Array3::ones((2, 2, 3)).view()).unwrap();
    let error = layer.attend(Array3::<f32>::zeros((4, 1, 5)).view()).unwrap_err();
    assert!(error.to_string().contains("queries") && error.to_string().contains("[4, 1, 5]"), "{error}");
    let error = KvCache::<Q8>::new(CacheShape::new(1, 1, usize::MAX / 2, 4, 4)).err().unwrap();
    assert!(error.to_string().contains("int8"), "{error}");
}

/// bf16 queries over an int8 cache give what their f32 widening gives, bit for bit.
/// Tiny keys under huge queries: the scores are small, but the kernels multiply the queries by
/// the stored integers (up to 127) before the keys' scales, which would overflow f32; an int8
/// cache refuses the step where an f32 cache of the same keys computes it. Both caches, every
/// level.
#[test]
fn an_int8_cache_refuses_queries_whose_products_with_its_integers_overflow() {
    let (k, q) = (Array3::from_elem((1, 3, 8), 1e-30_f32), Array3::from_elem((1, 1, 8), 1e37_f32));
    let v = Array3::from_shape_fn((1, 3, 8), |(_, j, _)| j as f32);
    for level in levels() {
        let mut f32_cache = KvCache::<f32>::for_level(CacheShape::new(1, 1, 4, 8, 8), level).unwrap();
        f32_cache.layer(0).unwrap().append(k.view(), v.view()).unwrap();
        let out = f32_cache.layer(0).unwrap().attend(q.view()).unwrap();
        assert!(out.iter().all(|&x| (x - 1.0).abs() < 1e-6), "{level}: f32 cache gives {out}");
        let mut int8 = KvCache::<Q8>::for_level(CacheShape::new(1, 1, 4, 8, 8), level).unwrap();
        int8.layer(0).unwrap().append(k.view(), v.view()).unwrap();
        let error = int8.layer(0).unwrap().attend(q.view()).unwrap_err();
        assert!(matches!(error, qkv::AttentionError::CacheOverflow { layer: 0 }), "{level}: {error}");
        let mut paged = PagedKvCache::<Q8>::for_level(PagedShape::new(1, 1, 8, 8, 16, 1), level).unwrap();
        let seq = paged.add_sequence();
        paged.layer(0).unwrap().append(seq, k.view(), v.view()).unwrap();
        let error = paged.layer(0).unwrap().attend(&[seq], &[0, 1], q.view()).unwrap_err();
        assert!(matches!(error, qkv::AttentionError::CacheOverflow { layer: 0 }), "{level} paged: {error}");
        // Queries of 1e34 leave room: the step runs, and equals the f32 cache's.
        let q = q.mapv(|x| x / 1e3);
        let (got, want) = (
            int8.layer(0).unwrap().attend(q.view()).unwrap(),
            f32_cache.layer(0).unwrap().attend(q.view()).unwrap(),
        );
        assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-2), "{level}: {got} vs {want}");
    }
}

#[test]
fn bf16_queries_over_an_int8_cache_equal_their_widening() {
    for level in levels() {
        let shape = CacheShape::new(1, 2, 64, 40, 24);
        let mut rng = ChaCha8Rng::seed_from_u64(2900);
        let mut tensor =
            |heads, n, d| Array3::from_shape_simple_fn((heads, n, d), || rng.random_range(-1.0_f32..1.0));
        let (k, v) = (tensor(2, 50, 40), tensor(2, 50, 24));
        let q = tensor(6, 3, 40).mapv(half::bf16::from_f32);
        let mut cache = KvCache::<Q8>::for_level(shape, level).unwrap();
        let mut layer = cache.layer(0).unwrap();
        layer.append(k.view(), v.view()).unwrap();
        let widened = layer.attend(q.mapv(half::bf16::to_f32).view()).unwrap();
        assert_eq!(layer.attend(q.view()).unwrap(), widened, "{level}");
    }
}

/// An int8 paged cache: two sequences sharing a prefix (a fork, whose first append copies the
/// shared partial block and its scales), positions across blocks, a batch of a prefill chunk and
/// a decoding step, against the reference over the test's own dequantization of each sequence.
#[test]
fn an_int8_paged_cache_and_its_fork_match_the_reference_over_their_dequantized_inputs() {
    // Whole panels, and blocks of 7 whose keys are padded to a panel (their scales are not).
    let sizes = |level| [PagedKvCache::<Q8>::block_granularity(level).unwrap(), 7];
    for (level, block_size) in levels().into_iter().flat_map(|level| sizes(level).map(|size| (level, size))) {
        let shape = PagedShape::new(2, 2, 20, 12, block_size, 64);
        let mut cache = PagedKvCache::<Q8>::for_level(shape, level).unwrap();
        let mut rng = ChaCha8Rng::seed_from_u64(3000);
        let mut tensor =
            |heads, n, d| Array3::from_shape_simple_fn((heads, n, d), || rng.random_range(-2.0_f32..2.0));
        let (shared, len_a, len_b) = (block_size + 5, 2 * block_size + 9, block_size + 11);
        let (k_a, v_a) = (tensor(2, len_a, 20), tensor(2, len_a, 12));
        let (mut k_b, mut v_b) = (tensor(2, len_b, 20), tensor(2, len_b, 12));
        k_b.slice_mut(s![.., ..shared, ..]).assign(&k_a.slice(s![.., ..shared, ..]));
        v_b.slice_mut(s![.., ..shared, ..]).assign(&v_a.slice(s![.., ..shared, ..]));
        let a = cache.add_sequence();
        let rows = |x: &Array3<f32>, range: std::ops::Range<usize>| x.slice(s![.., range, ..]).to_owned();
        cache
            .layer(1)
            .unwrap()
            .append(a, k_a.slice(s![.., ..shared, ..]), v_a.slice(s![.., ..shared, ..]))
            .unwrap();
        let b = cache.fork(a).unwrap();
        let mut layer = cache.layer(1).unwrap();
        layer.append(a, rows(&k_a, shared..len_a).view(), rows(&v_a, shared..len_a).view()).unwrap();
        layer.append(b, rows(&k_b, shared..len_b).view(), rows(&v_b, shared..len_b).view()).unwrap();
        // Sequence a: its last 3 positions' queries; sequence b: its last one's. 4 query heads.
        let q = tensor(4, 4, 20);
        let out = layer.attend(&[a, b], &[0, 3, 4], q.view()).unwrap();
        let causal = AttentionOptions::new().causal(CausalMask::BottomRight);
        for (name, k, v, queries, len) in [("a", &k_a, &v_a, 0..3, len_a), ("b", &k_b, &v_b, 3..4, len_b)] {
            let (kq, vq) = (dequantized(k), dequantized(v));
            for h in 0..4 {
                let qh = q.slice(s![h, queries.clone(), ..]);
                let (kh, vh) = (head_of(&kq, h / 2, 0..len), head_of(&vq, h / 2, 0..len));
                let want = qkv::reference::attention(qh, kh, vh, &causal).unwrap();
                let (_, bound) = error_bound(&want, &vh.to_owned());
                let got = out.slice(s![h, queries.clone(), ..]).to_owned();
                assert_close(
                    &format!("{level} paged int8 sequence {name} head {h}"),
                    &got,
                    &want.output,
                    bound,
                );
            }
        }
    }
}
