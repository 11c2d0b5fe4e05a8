//! The KV cache against full attention over the same prefix: `multi_head_attention` with a
//! bottom-right causal mask, and the f64 reference head by head, at every SIMD level, for
//! decoding steps and prefill chunks of awkward lengths; and its errors.

use ndarray::{Array2, Array3, Axis, s};
use qkv::{AttentionOptions, CacheOptions, CacheShape, CausalMask, KeepMask, KvCache, SimdLevel, Storage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{assert_close, error_bound, levels};

/// A sequence of `len` positions: keys and values per key/value head, queries per query head.
struct Sequence {
    q: Array3<f32>,
    k: Array3<f32>,
    v: Array3<f32>,
}

impl Sequence {
    fn random(seed: u64, shape: CacheShape, query_heads: usize, len: usize) -> Sequence {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut tensor =
            |heads, d| Array3::from_shape_simple_fn((heads, len, d), || rng.random_range(-1.0..1.0));
        let q = tensor(query_heads, shape.key_dim);
        let k = tensor(shape.kv_heads, shape.key_dim);
        let v = tensor(shape.kv_heads, shape.value_dim);
        Sequence { q, k, v }
    }
}

/// Appends `chunks` positions at a time to a cache at `level` and after each append attends with
/// the queries of the positions just appended (the last `most_queries` of them at most); each
/// output must match full attention over the prefix held so far.
fn check_chunks(
    level: SimdLevel,
    shape: CacheShape,
    query_heads: usize,
    chunks: &[usize],
    most_queries: usize,
    seed: u64,
) {
    let len: usize = chunks.iter().sum();
    let seq = Sequence::random(seed, shape, query_heads, len);
    let mut cache = KvCache::<f32>::for_level(shape, level).unwrap();
    let mut layer = cache.layer(shape.layers - 1).unwrap();
    let options = AttentionOptions::new().causal(CausalMask::BottomRight).simd(level);
    let mut held = 0;
    for &n_new in chunks {
        let new = s![.., held..held + n_new, ..];
        layer.append(seq.k.slice(new), seq.v.slice(new)).unwrap();
        held += n_new;
        let n_new = n_new.min(most_queries);
        let q = seq.q.slice(s![.., held - n_new..held, ..]);
        // Pre-filled with NaN: an element the step forgets to write fails the comparison.
        let mut got = Array3::from_elem((query_heads, n_new, shape.value_dim), f32::NAN);
        layer.attend_into(q, got.view_mut()).unwrap();
        assert_eq!(layer.attend(q).unwrap(), got, "attend and attend_into agree");
        let (k, v) = (seq.k.slice(s![.., ..held, ..]), seq.v.slice(s![.., ..held, ..]));
        let full = qkv::multi_head_attention(
            q.insert_axis(Axis(0)),
            k.insert_axis(Axis(0)),
            v.insert_axis(Axis(0)),
            &options,
        )
        .unwrap();
        let group = query_heads / shape.kv_heads;
        for h in 0..query_heads {
            let ctx = format!("{level} {shape:?} {query_heads} query heads, {n_new} new of {held}, head {h}");
            let (qh, kh, vh) =
                (q.slice(s![h, .., ..]), k.slice(s![h / group, .., ..]), v.slice(s![h / group, .., ..]));
            let want = qkv::reference::attention(qh, kh, vh, &options).unwrap();
            let (_, bound) = error_bound(&want, &vh.to_owned());
            let got_head = got.slice(s![h, .., ..]).to_owned();
            assert_close(&format!("cache vs reference {ctx}"), &got_head, &want.output, bound);
            let full_head = full.slice(s![0, h, .., ..]).mapv(f64::from);
            assert_close(&format!("cache vs multi_head_attention {ctx}"), &got_head, &full_head, bound);
        }
    }
}

/// Lengths that cross the key panels (8 to 64 keys) and the key block (128) off their
/// boundaries: single positions, odd chunks, and chunks longer than a block.
const CHUNKS: [usize; 10] = [1, 1, 15, 1, 113, 1, 130, 7, 1, 63];

#[test]
fn decoding_and_prefill_chunks_match_full_attention_over_the_prefix() {
    let mut seed = 0;
    for level in levels() {
        for (kv_heads, group, key_dim, value_dim) in
            [(1, 1, 1, 1), (2, 4, 16, 24), (3, 2, 17, 5), (1, 6, 64, 128)]
        {
            seed += 1;
            let capacity = CHUNKS.iter().sum::<usize>() + 3;
            let shape = CacheShape::new(2, kv_heads, capacity, key_dim, value_dim);
            check_chunks(level, shape, kv_heads * group, &CHUNKS, usize::MAX, seed);
        }
    }
}

#[test]
fn long_decoding_steps_split_their_keys_and_still_match() {
    // Past 1024 positions a step with few rows splits its keys between tasks and merges them;
    // after the long appends only the last few positions attend, as in a decoder's steps.
    for level in levels() {
        let shape = CacheShape::new(1, 2, 3000, 32, 24);
        check_chunks(level, shape, 8, &[1, 2049, 1, 1, 700, 1], 2, 40);
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let shape = CacheShape::new(1, 2, 5000, 64, 64);
    let seq = Sequence::random(41, shape, 8, 4097);
    let mut outputs = Vec::new();
    for threads in [1, 2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        let mut cache = KvCache::<f32>::new(shape).unwrap();
        let mut layer = cache.layer(0).unwrap();
        layer.append(seq.k.view(), seq.v.view()).unwrap();
        let step = pool.install(|| layer.attend(seq.q.slice(s![.., 4096.., ..])).unwrap());
        let chunk = pool.install(|| layer.attend(seq.q.slice(s![.., 3800.., ..])).unwrap());
        outputs.push((step, chunk));
    }
    assert!(outputs.windows(2).all(|w| w[0] == w[1]), "1, 2 and 3 threads give the same bits");
}

#[test]
fn errors_name_the_layer_the_argument_and_the_shapes() {
    let shape = CacheShape::new(2, 2, 4, 3, 5);
    let mut cache = KvCache::<f32>::new(shape).unwrap();
    let err = |e: qkv::AttentionError| e.to_string();
    assert_eq!(err(cache.layer(2).err().unwrap()), "layer 2 is out of range: the KV cache has 2 layers");
    let mut layer = cache.layer(1).unwrap();
    let (k, v) = (Array3::<f32>::zeros((2, 3, 3)), Array3::<f32>::zeros((2, 3, 5)));
    assert_eq!(
        err(layer.append(k.view(), Array3::zeros((2, 2, 5)).view()).unwrap_err()),
        "layer 1 of the KV cache takes values of shape [2, 3, 5], not [2, 2, 5]: one value for \
         every key, one [n_new, value_dim] block per key/value head"
    );
    assert_eq!(
        err(layer.append(Array3::zeros((1, 3, 3)).view(), v.view()).unwrap_err()),
        "layer 1 of the KV cache takes keys of shape [2, n_new, 3], not [1, 3, 3]: one [n_new, key_dim] \
         block per key/value head"
    );
    // Keys laid out as [n_new, kv_heads, key_dim] are not told to take [2, 2, 3].
    assert_eq!(
        err(layer.append(Array3::zeros((5, 2, 3)).view(), v.view()).unwrap_err()),
        "layer 1 of the KV cache takes keys of shape [2, n_new, 3], not [5, 2, 3]: one [n_new, key_dim] \
         block per key/value head"
    );
    let mut bad = k.clone();
    bad[[1, 2, 0]] = f32::NAN;
    assert_eq!(
        err(layer.append(bad.view(), v.view()).unwrap_err()),
        "keys[1, 2, 0] is NaN: attention needs finite inputs"
    );
    assert_eq!(layer.len(), 0, "a failed append writes nothing");
    assert_eq!(
        err(layer.attend(Array3::<f32>::zeros((2, 1, 3)).view()).unwrap_err()),
        "layer 1 of the KV cache takes queries of shape [2, at most 0, 3], not [2, 1, 3]: the queries \
         are the last positions held, so append their keys and values first"
    );
    layer.append(k.view(), v.view()).unwrap();
    assert_eq!(
        err(layer.append(k.view(), v.view()).unwrap_err()),
        "layer 1 of the KV cache holds 3 of its 4 positions: appending 3 more would pass its capacity; make \
         the cache larger, or clear it for a new sequence"
    );
    assert_eq!(
        err(layer.attend(Array3::<f32>::zeros((3, 1, 3)).view()).unwrap_err()),
        "layer 1 of the KV cache takes queries of shape [a multiple of 2, 1, 3], not [3, 1, 3]: \
         query heads a positive multiple of the key/value heads, each query as wide as the keys"
    );
    assert_eq!(
        err(layer.attend(Array3::<f32>::zeros((4, 1, 2)).view()).unwrap_err()),
        "layer 1 of the KV cache takes queries of shape [4, 1, 3], not [4, 1, 2]: query heads a \
         positive multiple of the key/value heads, each query as wide as the keys"
    );
    let mut out = Array3::<f32>::zeros((4, 1, 4));
    assert_eq!(
        err(layer.attend_into(Array3::<f32>::zeros((4, 1, 3)).view(), out.view_mut()).unwrap_err()),
        "layer 1 of the KV cache takes output of shape [4, 1, 5], not [4, 1, 4]: one value-wide row per query"
    );
    // Keys and queries of 1e19: a score could reach 1e38, past what f32 holds with room to spare.
    let mut huge = cache_with_huge_keys(shape);
    assert_eq!(
        err(huge.layer(0).unwrap().attend(Array3::<f32>::from_elem((2, 1, 3), 1e19).view()).unwrap_err()),
        "layer 0 of the KV cache: its keys and values with these queries could overflow an f32 score or sum; \
         scale the inputs down (positions already appended with huge keys or values stay until truncate cuts them)"
    );
    for (empty, dims) in
        [(shape.with_kv_heads(0), "[2, 0, 4, 3, 5]"), (shape.with_capacity(0), "[2, 2, 0, 3, 5]")]
    {
        assert_eq!(
            err(KvCache::<f32>::new(empty).err().unwrap()),
            format!(
                "the KV cache's shape [layers, kv_heads, capacity, key_dim, value_dim] {dims} is empty: a cache \
                 needs at least one layer, key/value head and position, and keys and values at least one component \
                 wide"
            )
        );
    }
}

fn cache_with_huge_keys(shape: CacheShape) -> KvCache<f32> {
    let mut cache = KvCache::<f32>::new(shape).unwrap();
    let k = Array3::from_elem((shape.kv_heads, 1, shape.key_dim), 1e19);
    let v = Array3::from_elem((shape.kv_heads, 1, shape.value_dim), 1.0);
    cache.layer(0).unwrap().append(k.view(), v.view()).unwrap();
    cache
}

#[test]
fn a_cache_too_large_to_allocate_is_an_error_not_a_panic() {
    // usize::MAX positions overflow the size arithmetic. 2^40 positions of a real model's widths
    // need 2^49 bytes per head's keys alone, more than a 48-bit address space maps, so the
    // allocator refuses them whatever the machine's memory or overcommit setting: nothing of
    // that size is ever written.
    let tiny = CacheShape::new(1, 1, usize::MAX, 4, 4);
    let model = CacheShape::new(32, 8, 1 << 40, 128, 128);
    for (shape, why) in [
        (tiny, "which is more than an address space holds (isize::MAX bytes)"),
        (model, "which the allocator refused"),
    ] {
        for level in levels() {
            let message = KvCache::<f32>::for_level(shape, level).err().expect("too large").to_string();
            assert!(message.starts_with("KvCache shape ["), "{message}");
            assert!(message.contains(why), "{message}");
        }
        assert!(KvCache::<half::bf16>::new(shape).is_err());
    }
    assert_eq!(
        KvCache::<f32>::new(tiny).err().expect("too large").to_string(),
        format!(
            "KvCache shape [1, 1, {}, 4, 4] (layers, kv_heads, capacity, key_dim, value_dim) needs more \
             than usize::MAX bytes of f32 storage, which is more than an address space holds \
             (isize::MAX bytes): ask for a smaller capacity",
            usize::MAX
        )
    );
}

/// A value row too wide to pad to whole vectors (`value_dim` near `usize::MAX`) is the same
/// error as any cache too large, for the single-sequence cache and the paged pool alike; the
/// padding once overflowed and panicked.
#[test]
fn a_value_row_too_wide_to_pad_is_an_error_not_a_panic() {
    for value_dim in [usize::MAX, usize::MAX - 3] {
        for level in levels() {
            // With no capacity such a cache holds nothing and may be made; it must not panic.
            let empty = CacheShape::new(1, 1, 0, 4, value_dim);
            let _ = KvCache::<f32>::for_level(empty, level);
            let shape = empty.with_capacity(1);
            let message = KvCache::<f32>::for_level(shape, level).err().expect("too wide").to_string();
            assert!(message.contains("more than an address space holds"), "{message}");
            let paged = qkv::PagedShape::new(1, 1, 4, value_dim, 64, 4);
            let message =
                qkv::PagedKvCache::<f32>::for_level(paged, level).err().expect("too wide").to_string();
            assert!(message.contains("more than an address space holds"), "{message}");
        }
    }
}

/// A cache truncated to `keep` positions and then appended to equals, bit for bit, a cache that
/// never held the cut positions: plain and windowed (its ring rolled back across a wrap), every
/// level, f32 and bf16 storage, with its step's options.
fn check_truncate<E: Storage>(level: SimdLevel, window: Option<usize>) {
    // A ring of 24 slots wraps at position 24; a plain cache holds all 34.
    let (kv_heads, d) = (2, 8);
    let capacity = if window.is_some() { 24 } else { 40 };
    let shape = CacheShape::new(2, kv_heads, capacity, d, d);
    let make = || match window {
        Some(window) => KvCache::<E>::with_window_for_level(shape, window, level).unwrap(),
        None => KvCache::<E>::for_level(shape, level).unwrap(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut random = |n: usize| {
        Array3::from_shape_simple_fn((kv_heads, n, d), || E::from_f32(rng.random_range(-1.0..1.0)))
    };
    // Positions 0 .. 30 (a ring of 24 wraps), then cut back to 27 and 4 new ones appended.
    let (k, v) = (random(31), random(31));
    let (new_k, new_v) = (random(4), random(4));
    let (cut, keep) = (30, 27);
    let mut truncated = make();
    let mut fresh = make();
    // Appended five positions at a time, as steps of a windowed cache may hold no more.
    let append = |cache: &mut KvCache<E>, end: usize| {
        for layer in 0..2 {
            for start in (0..end).step_by(5) {
                let at = s![.., start..(start + 5).min(end), ..];
                cache.layer(layer).unwrap().append(k.slice(at), v.slice(at)).unwrap();
            }
        }
    };
    append(&mut truncated, cut);
    append(&mut fresh, keep);
    truncated.truncate(keep).unwrap();
    let q = Array3::from_shape_fn((4, 2, d), |(h, i, c)| ((h * 7 + i * 3 + c) % 5) as f32 * 0.25 - 0.5);
    for cache in [&mut truncated, &mut fresh] {
        for layer in 0..2 {
            let mut layer = cache.layer(layer).unwrap();
            assert_eq!(layer.len(), keep);
            layer.append(new_k.view(), new_v.view()).unwrap();
        }
    }
    for layer in 0..2 {
        let options = CacheOptions::new().logit_softcap(20.0);
        let got = truncated.layer(layer).unwrap().attend_with_lse(q.view(), &options).unwrap();
        let want = fresh.layer(layer).unwrap().attend_with_lse(q.view(), &options).unwrap();
        let what = format!("{level} {} window {window:?} layer {layer}", E::NAME);
        assert_eq!(got.output, want.output, "{what}: output");
        assert_eq!(got.logsumexp, want.logsumexp, "{what}: logsumexp");
    }
}

#[test]
fn truncate_then_append_matches_a_cache_that_never_held_the_cut_positions() {
    for level in levels() {
        for window in [None, Some(6)] {
            check_truncate::<f32>(level, window);
            check_truncate::<half::bf16>(level, window);
        }
    }
}

/// A cache that once held a key too large for the queries refuses steps while that key is held,
/// and takes them again once it is not (cut by `truncate`, or written over by the ring): then a
/// step equals, bit for bit, one of a cache that never held it. Plain and windowed, every level,
/// f32, bf16 and int8 storage.
fn check_huge_key_let_go<E: qkv::CacheStorage>(level: SimdLevel, window: Option<usize>) {
    let (kv_heads, d) = (2, 8);
    let shape = CacheShape::new(1, kv_heads, 12, d, d);
    let make = || match window {
        Some(window) => KvCache::<E>::with_window_for_level(shape, window, level).unwrap(),
        None => KvCache::<E>::for_level(shape, level).unwrap(),
    };
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut random = |n: usize| {
        Array3::from_shape_simple_fn((kv_heads, n, d), || E::Appended::from_f32(rng.random_range(-1.0..1.0)))
    };
    let (k, v) = (random(20), random(20));
    // Key 3 of 1e21 against queries of 1e18: a score could pass f32's 3.4e38.
    let mut huge_k = k.clone();
    huge_k.slice_mut(s![.., 3, ..]).fill(E::Appended::from_f32(1e21));
    let q = Array3::from_shape_fn((4, 1, d), |(h, _, c)| ((h * 7 + c) % 5) as f32 * 0.5e18 - 1e18);
    let (mut held, mut never) = (make(), make());
    let what = format!("{level} {} window {window:?}", E::NAME);
    let overflow = |cache: &mut KvCache<E>| {
        let error = cache.layer(0).unwrap().attend(q.view()).unwrap_err();
        assert!(matches!(error, qkv::AttentionError::CacheOverflow { layer: 0 }), "{what}: {error}");
    };
    let step = |cache: &mut KvCache<E>| {
        cache.layer(0).unwrap().attend_with_lse(q.view(), &CacheOptions::new()).unwrap()
    };
    for end in 1..=5 {
        let at = s![.., end - 1..end, ..];
        held.layer(0).unwrap().append(huge_k.slice(at), v.slice(at)).unwrap();
        never.layer(0).unwrap().append(k.slice(at), v.slice(at)).unwrap();
    }
    overflow(&mut held);
    overflow(&mut held); // the bound measured in what is held still refuses
    let let_go = match window {
        // Cut back before the huge key, and appended again without it.
        None => {
            held.truncate(3).unwrap();
            never.truncate(3).unwrap();
            // At once, the huge key still in its lane: it is not a key any more.
            assert_eq!(step(&mut held), step(&mut never), "{what}: right after the truncation");
            3..5
        }
        // Positions 3 + 12 on write over its slot.
        Some(_) => 5..16,
    };
    for end in let_go.clone() {
        let at = s![.., end..end + 1, ..];
        for cache in [&mut held, &mut never] {
            cache.layer(0).unwrap().append(k.slice(at), v.slice(at)).unwrap();
        }
        if end + 1 < let_go.end && window.is_some() {
            overflow(&mut held);
        }
    }
    let (got, want) = (step(&mut held), step(&mut never));
    assert_eq!(got.output, want.output, "{what}: output");
    assert_eq!(got.logsumexp, want.logsumexp, "{what}: logsumexp");
    assert!(got.output.iter().all(|x| x.is_finite()), "{what}");
    // The huge key again: refused again.
    let at = s![.., 3..4, ..];
    held.layer(0).unwrap().append(huge_k.slice(at), v.slice(at)).unwrap();
    overflow(&mut held);
}

/// With sink tokens beside the ring: a huge key among the sink tokens blocks steps for good (they
/// are kept), one in the ring until the ring writes over it.
#[test]
fn a_huge_sink_token_blocks_steps_for_good_and_a_huge_ring_key_until_overwritten() {
    let shape = CacheShape::new(1, 1, 12, 8, 8);
    let q = Array3::from_elem((1, 1, 8), 1e18_f32);
    for level in levels() {
        for huge_at in [1, 5] {
            let mut cache =
                KvCache::<f32>::with_window_for_level(shape, 4, level).unwrap().with_sink_tokens(2).unwrap();
            for position in 0..30 {
                let value = if position == huge_at { 1e21 } else { 0.5 };
                let k = Array3::from_elem((1, 1, 8), value);
                cache.layer(0).unwrap().append(k.view(), k.view().mapv(|_| 1.0).view()).unwrap();
                // The ring holds 10 positions after the 2 sink tokens: position 5 goes at 15.
                let held = huge_at < 2 || position < huge_at + 10;
                let result = cache.layer(0).unwrap().attend(q.view());
                match (position >= huge_at && held, result) {
                    (true, Err(qkv::AttentionError::CacheOverflow { layer: 0 })) => {}
                    (false, Ok(out)) => {
                        assert!(out.iter().all(|x| x.is_finite()), "{level} {huge_at} {position}")
                    }
                    (blocked, result) => panic!(
                        "{level} huge at {huge_at}, position {position}: blocked {blocked}, {result:?}"
                    ),
                }
            }
        }
    }
}

#[test]
fn a_huge_key_blocks_steps_only_while_it_is_held() {
    for level in levels() {
        for window in [None, Some(4)] {
            check_huge_key_let_go::<f32>(level, window);
            check_huge_key_let_go::<half::bf16>(level, window);
            check_huge_key_let_go::<qkv::Q8>(level, window);
        }
    }
}

#[test]
fn truncate_refuses_what_it_cannot_do_and_changes_nothing() {
    let shape = CacheShape::new(1, 1, 10, 1, 1);
    let kv = Array3::<f32>::zeros((1, 5, 1));
    let mut cache = KvCache::<f32>::with_window(shape, 4).unwrap();
    for n in [5, 5, 5, 2] {
        cache.layer(0).unwrap().append(kv.slice(s![.., ..n, ..]), kv.slice(s![.., ..n, ..])).unwrap();
    }
    // 17 appended: slots hold positions 7 .. 17; the window of position 10 needs 7 .. 10.
    let err = cache.truncate(18).unwrap_err().to_string();
    assert_eq!(
        err,
        "the KV cache holds 17 positions: it cannot be truncated to 18: truncation only removes positions"
    );
    let err = cache.truncate(9).unwrap_err().to_string();
    assert!(err.ends_with("the ring has written over positions the window of the next one needs"), "{err}");
    assert_eq!(cache.layer(0).unwrap().len(), 17, "a refused truncation changes nothing");
    cache.truncate(10).unwrap();
    assert_eq!(cache.layer(0).unwrap().len(), 10);
}

/// Truncations in a row count from the furthest position the ring wrote, not from the last
/// truncation: its slots still hold the positions cut, written over the older ones. With equal
/// scores a query's output is the mean of the values it sees (each value its position), so each
/// step is checked by hand: truncations that would leave the next window partly written over are
/// refused, a step's queries are at most those whose windows are whole, and a keep mask's columns
/// are the positions held.
#[test]
fn truncations_in_a_row_count_from_the_furthest_position_written() {
    for level in levels() {
        // A ring of 6 slots, each query seeing itself and the 3 before.
        let mut cache =
            KvCache::<f32>::with_window_for_level(CacheShape::new(1, 1, 6, 2, 1), 4, level).unwrap();
        let append = |cache: &mut KvCache<f32>, positions: std::ops::Range<usize>| {
            let n = positions.len();
            let v = Array3::from_shape_vec((1, n, 1), positions.map(|p| p as f32).collect()).unwrap();
            cache.layer(0).unwrap().append(Array3::zeros((1, n, 2)).view(), v.view()).unwrap();
        };
        for start in (0..106).step_by(3) {
            append(&mut cache, start..(start + 3).min(106));
        }
        // Slots hold 100 .. 105; the window of position 102 needs 99.
        assert!(cache.truncate(102).is_err(), "{level}: at once");
        for len in [105, 104, 103] {
            cache.truncate(len).unwrap();
        }
        let refused = cache.truncate(102).unwrap_err().to_string();
        assert!(refused.ends_with("the window of the next one needs"), "{level}: in steps: {refused}");
        assert_eq!(cache.layer(0).unwrap().held(), 3, "{level}: 100 .. 102 held, 103 .. 105 cut");
        // Position 102's window needs 99, written over by 105: no query until an append.
        let q = |n: usize| Array3::<f32>::zeros((1, n, 2));
        let err = cache.layer(0).unwrap().attend(q(1).view()).unwrap_err().to_string();
        assert!(err.contains("at most 0") && err.contains("truncation"), "{level}: {err}");
        append(&mut cache, 103..104);
        {
            let mut layer = cache.layer(0).unwrap();
            assert_eq!(layer.held(), 4);
            assert_eq!(layer.attend(q(1).view()).unwrap()[[0, 0, 0]], 101.5, "{level}: 100 .. 103");
            assert!(layer.attend(q(2).view()).is_err(), "{level}: position 102's window needs 99");
            // The keep mask's columns are the positions held, 100 .. 103: hiding 100 and 101 leaves
            // 102 and 103.
            let keep = Array2::from_shape_vec((1, 4), vec![false, false, true, true]).unwrap();
            let options = CacheOptions::new().keep_mask(KeepMask::new(keep.view()));
            assert_eq!(layer.attend_with(q(1).view(), &options).unwrap()[[0, 0, 0]], 102.5, "{level}: keep");
        }
        append(&mut cache, 104..106);
        let out = cache.layer(0).unwrap().attend(q(3).view()).unwrap();
        let means: Vec<f32> = out.iter().copied().collect();
        assert_eq!(means, [101.5, 102.5, 103.5], "{level}: 103 .. 105 see 100 .. 105 again");
        // A window of 1 needs no position before its own: any truncation will do, however far
        // the ring wrote.
        let mut single =
            KvCache::<f32>::with_window_for_level(CacheShape::new(1, 1, 4, 2, 1), 1, level).unwrap();
        append(&mut single, 0..4);
        append(&mut single, 4..8);
        append(&mut single, 8..14);
        for len in [9, 2, 0] {
            single.truncate(len).unwrap();
            append(&mut single, len..len + 1);
            let out = single.layer(0).unwrap().attend(q(1).view()).unwrap();
            assert_eq!(out[[0, 0, 0]], len as f32, "{level}: position {len} sees itself");
            single.truncate(len).unwrap();
        }
    }
}

/// The crate says the caches, their ids and the errors may move to and be shared with other
/// threads (a server keeps its caches behind a lock, or one per worker); this stops compiling
/// if one of them stops being so.
#[test]
fn caches_ids_and_errors_are_send_and_sync() {
    fn send_and_sync<T: Send + Sync>() {}
    send_and_sync::<KvCache<f32>>();
    send_and_sync::<KvCache<half::bf16>>();
    send_and_sync::<KvCache<qkv::Q8>>();
    send_and_sync::<qkv::PagedKvCache<f32>>();
    send_and_sync::<qkv::PagedKvCache<qkv::Q8>>();
    send_and_sync::<qkv::SequenceId>();
    send_and_sync::<qkv::AttentionError>();
}
