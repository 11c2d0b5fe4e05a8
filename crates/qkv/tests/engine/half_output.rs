//! Half precision on the output side and over many heads: `multi_head_attention_half` (with
//! `_with_lse` and `_into`), `attention_half_with_lse` and `attention_half_into` against the f64
//! reference and, bit for bit, against the f32 path on the widened inputs; bf16 and f16 outputs
//! (of those entry points and of the caches' `attend_into`) equal to the f32 output rounded once;
//! and the errors for an output of the wrong shape.

use half::{bf16, f16};
use ndarray::{Array2, Array3, Array4, ArrayView3, ArrayView4, Dimension, Ix3, s};
use qkv::{
    Alibi, AttentionOptions, CacheLayer, CacheOptions, CacheShape, CausalMask, Half, KvCache, PagedKvCache,
    PagedShape, PartialAttention, SlidingWindow, Storage,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::lse::assert_lse_close;
use crate::problem::{
    MASK_KINDS, MaskKind, Problem, assert_close, assert_f32_path, error_bound, levels, max_abs,
    weight_rounding, with_rounding,
};

/// `a` rounded once from f32 to `O`, element by element: what a half output must hold.
fn rounded<O: Storage, D: Dimension>(a: &ndarray::Array<f32, D>) -> ndarray::Array<O, D> {
    a.mapv(O::from_f32)
}

/// An output buffer of `O` full of NaN, so that an element left unwritten fails the comparison.
fn nans<O: Storage, D: Dimension, Sh: ndarray::ShapeBuilder<Dim = D>>(shape: Sh) -> ndarray::Array<O, D> {
    ndarray::Array::from_elem(shape, O::from_f32(f32::NAN))
}

/// `attention_half_into` into f32, bf16 and f16 outputs equals `want` (the f32 result of the same
/// call) rounded once to each.
fn check_single_outputs<H: Half>(
    (q, k, v): (&Array2<H>, &Array2<H>, &Array2<H>),
    options: &AttentionOptions<f32>,
    want: &Array2<f32>,
    ctx: &str,
) {
    fn one<H: Half, O: Storage>(
        (q, k, v): (&Array2<H>, &Array2<H>, &Array2<H>),
        options: &AttentionOptions<f32>,
        want: &Array2<f32>,
        ctx: &str,
    ) {
        let mut out = nans::<O, _, _>(want.raw_dim());
        qkv::attention_half_into(q.view(), k.view(), v.view(), options, out.view_mut()).unwrap();
        assert_eq!(out, rounded::<O, _>(want), "{ctx}: an {} output is the f32 output rounded once", O::NAME);
    }
    one::<H, f32>((q, k, v), options, want, ctx);
    one::<H, bf16>((q, k, v), options, want, ctx);
    one::<H, f16>((q, k, v), options, want, ctx);
}

fn check_single_head<H: Half>() {
    let shapes = [(1, 1, 1, 1), (3, 17, 16, 24), (5, 129, 64, 8), (70, 141, 24, 40), (19, 257, 8, 33)];
    // Every other shape with the mask that hides whole rows, the others with other kinds.
    for (i, &dims) in shapes.iter().enumerate() {
        let mask =
            if i % 2 == 0 { MaskKind::KeepWithEmptyRows } else { MASK_KINDS[(2 * i + 1) % MASK_KINDS.len()] };
        let p = Problem::<f32>::random(40 + i as u64, dims, 1.0, mask);
        let (q, k, v) = (p.q.mapv(H::from_f32), p.k.mapv(H::from_f32), p.v.mapv(H::from_f32));
        let (wq, wk, wv) = (q.mapv(H::to_f32), k.mapv(H::to_f32), v.mapv(H::to_f32));
        let reference = qkv::reference::attention(wq.view(), wk.view(), wv.view(), &p.options()).unwrap();
        let want = qkv::reference::attention_with_lse(wq.view(), wk.view(), wv.view(), &p.options()).unwrap();
        let (weight_bound, output_bound) = error_bound(&reference, &wv);
        for level in levels() {
            let options = p.options().simd(level);
            let ctx = format!("{} {level} {dims:?} {mask:?}", H::NAME);
            let got = qkv::attention_half_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
            let f32_path = qkv::attention_with_lse(wq.view(), wk.view(), wv.view(), &options).unwrap();
            let rounding = weight_rounding(level, H::NAME, max_abs(&wv));
            if rounding == 0.0 {
                assert_eq!(got, f32_path, "{ctx}: the f32 path on the widened inputs, bit for bit");
            }
            assert_f32_path(&ctx, &got.output, &f32_path.output, rounding);
            let output_bound = with_rounding(output_bound, rounding);
            assert_close(&format!("output {ctx}"), &got.output, &want.output, output_bound);
            assert_lse_close(&format!("logsumexp {ctx}"), &got.logsumexp, &want.logsumexp, weight_bound);
            check_single_outputs((&q, &k, &v), &options, &got.output, &ctx);
        }
    }
}

#[test]
fn single_head_half_logsumexp_and_outputs_match_the_reference_and_the_f32_path() {
    check_single_head::<bf16>();
    check_single_head::<f16>();
}

/// `[batch, heads, n, d]` uniform in `[-1, 1]`, rounded to `H`.
fn random4<H: Half>(rng: &mut ChaCha8Rng, shape: (usize, usize, usize, usize)) -> Array4<H> {
    Array4::from_shape_simple_fn(shape, || H::from_f32(rng.random_range(-1.0..1.0)))
}

/// One multi-head call: every half entry point against the f32 path on the widened inputs (bit
/// for bit), against the reference for the first and last query head of each sequence
/// (`per_head(b, h)`: the options of query head `h` of sequence `b` alone), and its half
/// outputs against the f32 one rounded.
fn check_heads<'a, H: Half>(
    (q, k, v): (ArrayView4<H>, ArrayView4<H>, ArrayView4<H>),
    options: &AttentionOptions<f32>,
    per_head: &dyn Fn(usize, usize) -> AttentionOptions<'a, f32>,
    ctx: &str,
) {
    let widen = |a: ArrayView4<H>| a.mapv(H::to_f32);
    let (wq, wk, wv) = (widen(q), widen(k), widen(v));
    let [batch, query_heads, _, _] = *q.shape() else { unreachable!("4-D") };
    let group = query_heads / k.shape()[1];
    let head = |a: &Array4<f32>, b: usize, h: usize| a.slice(s![b, h, .., ..]).to_owned();
    let mut references = Vec::new();
    for b in 0..batch {
        for h in [0, query_heads - 1] {
            let (qh, kh, vh) = (head(&wq, b, h), head(&wk, b, h / group), head(&wv, b, h / group));
            let alone = per_head(b, h);
            let reference = qkv::reference::attention(qh.view(), kh.view(), vh.view(), &alone).unwrap();
            let want = qkv::reference::attention_with_lse(qh.view(), kh.view(), vh.view(), &alone).unwrap();
            references.push((b, h, want, error_bound(&reference, &vh)));
        }
    }
    for level in levels() {
        let options = options.clone().simd(level);
        let ctx = format!("{} {level} {ctx}", H::NAME);
        let got = qkv::multi_head_attention_half_with_lse(q, k, v, &options).unwrap();
        let f32_path = qkv::multi_head_attention_with_lse(wq.view(), wk.view(), wv.view(), &options).unwrap();
        let rounding = weight_rounding(level, H::NAME, max_abs(&wv));
        if rounding == 0.0 {
            assert_eq!(got, f32_path, "{ctx}: the f32 path on the widened inputs, bit for bit");
        }
        assert_f32_path(&ctx, &got.output, &f32_path.output, rounding);
        assert_eq!(
            qkv::multi_head_attention_half(q, k, v, &options).unwrap(),
            got.output,
            "{ctx}: output only"
        );
        for (b, h, want, (weight_bound, output_bound)) in &references {
            let at = format!("{ctx}, batch {b} head {h}");
            let output_bound = with_rounding(*output_bound, rounding);
            assert_close(&format!("output {at}"), &head(&got.output, *b, *h), &want.output, output_bound);
            let lse = got.logsumexp.slice(s![*b, *h, ..]).to_owned();
            assert_lse_close(&format!("logsumexp {at}"), &lse, &want.logsumexp, *weight_bound);
        }
        check_head_outputs::<H, f32>((q, k, v), &options, &got.output, &ctx);
        check_head_outputs::<H, bf16>((q, k, v), &options, &got.output, &ctx);
        check_head_outputs::<H, f16>((q, k, v), &options, &got.output, &ctx);
    }
}

/// `multi_head_attention_half_into` into an output of `O`, contiguous and token-major (a
/// permuted view), equals `want` rounded once.
fn check_head_outputs<H: Half, O: Storage>(
    (q, k, v): (ArrayView4<H>, ArrayView4<H>, ArrayView4<H>),
    options: &AttentionOptions<f32>,
    want: &Array4<f32>,
    ctx: &str,
) {
    let mut out = nans::<O, _, _>(want.raw_dim());
    qkv::multi_head_attention_half_into(q, k, v, options, out.view_mut()).unwrap();
    assert_eq!(out, rounded::<O, _>(want), "{ctx}: an {} output is the f32 output rounded once", O::NAME);
    let [batch, heads, n, d] = *want.shape() else { unreachable!("4-D") };
    let mut token_major = nans::<O, _, _>((batch, n, heads, d));
    let out = token_major.view_mut().permuted_axes([0, 2, 1, 3]);
    qkv::multi_head_attention_half_into(q, k, v, options, out).unwrap();
    let token_major = token_major.permuted_axes([0, 2, 1, 3]);
    assert_eq!(token_major, rounded::<O, _>(want), "{ctx}: a token-major {} output", O::NAME);
}

fn check_multi_head<H: Half>() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    // (batch, query heads, kv heads, n_q, n_k, d_k, d_v): a single element; decoding steps with
    // the heads of a group stacked; a few queries; tiles that are not whole; few rows over keys
    // split in parts; a causal diagonal across key blocks of every level (AMX's are 512 keys).
    let shapes = [
        (1, 1, 1, 1, 1, 1, 1),
        (2, 8, 2, 1, 300, 16, 24),
        (2, 4, 4, 3, 130, 8, 5),
        (1, 4, 2, 70, 141, 16, 24),
        (1, 2, 1, 5, 2100, 8, 4),
        (1, 2, 1, 130, 1100, 16, 24),
    ];
    // A mask of `[n_q, n_k]` per shape, shared by every head (the per-sequence and per-head kinds
    // below): rows that see nothing, a causal window over a decoding step, a bias, whole key
    // tiles hidden from split keys.
    let shared = [
        MaskKind::KeepWithEmptyRows,
        MaskKind::CausalWindow,
        MaskKind::KeepWithEmptyRows,
        MaskKind::Bias,
        MaskKind::PaddingBlocks,
        MaskKind::CausalBottomRight,
    ];
    for (i, &(batch, query_heads, kv_heads, n_q, n_k, d_k, d_v)) in shapes.iter().enumerate() {
        let q = random4::<H>(&mut rng, (batch, query_heads, n_q, d_k));
        let k = random4::<H>(&mut rng, (batch, kv_heads, n_k, d_k));
        let v = random4::<H>(&mut rng, (batch, kv_heads, n_k, d_v));
        let qkv = (q.view(), k.view(), v.view());
        let dims = format!("[{batch}, {query_heads}/{kv_heads}, {n_q}x{n_k}, {d_k}/{d_v}]");
        let mask = shared[i];
        // Only the masks of this problem are used (its inputs are one component wide); they apply
        // to every head alike, so the reference takes them as they are.
        let masked = Problem::<f32>::random(30 + i as u64, (n_q, n_k, 1, 1), 1.0, mask);
        let options = masked.options();
        check_heads(qkv, &options, &|_, _| options.clone(), &format!("{dims} {mask:?}"));
        // Key lengths, one per sequence: the last sequence sees nothing (zeros, logsumexp -inf).
        let lengths: Vec<usize> =
            (0..batch).map(|b| if b + 1 == batch && batch > 1 { 0 } else { n_k }).collect();
        let causal = AttentionOptions::new().causal(CausalMask::BottomRight);
        let options = causal.clone().key_lengths(&lengths);
        let per_sequence = |b: usize, _| causal.clone().key_lengths(&lengths[b..b + 1]);
        check_heads(qkv, &options, &per_sequence, &format!("{dims} key lengths {lengths:?}"));
        // ALiBi, one slope per query head: the heads of a group are problems of their own.
        let slopes = qkv::alibi_slopes::<f32>(query_heads);
        let options = causal.clone().alibi(Alibi::new(&slopes));
        let per_head = |_, h: usize| causal.clone().alibi(Alibi::new(&slopes[h..h + 1]));
        check_heads(qkv, &options, &per_head, &format!("{dims} alibi"));
    }
}

#[test]
fn multi_head_half_matches_the_reference_and_the_f32_path_with_half_outputs() {
    check_multi_head::<bf16>();
    check_multi_head::<f16>();
}

/// One cache step into an output of `O`: `attend_with_into` writes `want` (the step's f32
/// output) rounded once, and the same logsumexp as into f32.
fn check_cache_step<E: Storage, O: Storage>(
    layer: &mut CacheLayer<E>,
    (q, options): (ArrayView3<f32>, &CacheOptions),
    want: &PartialAttention<f32, Ix3>,
    ctx: &str,
) {
    let mut out = nans::<O, _, _>(want.output.raw_dim());
    let mut lse = nans::<f32, _, _>(want.logsumexp.raw_dim());
    layer.attend_with_into(q, options, out.view_mut(), Some(lse.view_mut())).unwrap();
    let what = format!("{ctx}: an {} output", O::NAME);
    assert_eq!(out, rounded::<O, _>(&want.output), "{what} is the f32 output rounded once");
    assert_eq!(lse, want.logsumexp, "{what}: the logsumexp");
}

/// A `KvCache` of `E` into f32, bf16 and f16 outputs, step after step (a prefill chunk, then
/// steps): a plain cache with and without a window and ALiBi, and a ring buffer of a 12-position
/// window that wraps (its keys read as two runs).
fn check_kv_cache<E: Storage>() {
    let shape = CacheShape::new(1, 2, 300, 24, 40);
    let mut rng = ChaCha8Rng::seed_from_u64(22);
    let mut random3 = |shape| Array3::from_shape_simple_fn(shape, || rng.random_range(-1.0..1.0_f32));
    let slopes = qkv::alibi_slopes::<f32>(4);
    let windowed = CacheOptions::new().sliding_window(SlidingWindow::new(50, 0)).alibi(&slopes);
    for level in levels() {
        let plain = KvCache::<E>::for_level(shape, level).unwrap();
        // 12 + 129 - 1 slots: steps of up to 129 queries.
        let ring = KvCache::<E>::with_window_for_level(shape.with_capacity(140), 12, level).unwrap();
        let both = [("plain", CacheOptions::new()), ("window + alibi", windowed.clone())];
        for (kind, mut cache, options) in [("plain", plain, &both[..]), ("ring", ring, &both[..1])] {
            let mut layer = cache.layer(0).unwrap();
            for n_new in [1, 129, 3, 1, 60, 1] {
                let (k, v) = (random3((2, n_new, 24)), random3((2, n_new, 40)));
                layer.append(k.mapv(E::from_f32).view(), v.mapv(E::from_f32).view()).unwrap();
                let q = random3((4, n_new, 24));
                for (what, options) in options {
                    let ctx =
                        format!("{} {kind} cache {level} {what}, {n_new} new of {}", E::NAME, layer.len());
                    let want = layer.attend_with_lse(q.view(), options).unwrap();
                    let step = (q.view(), options);
                    check_cache_step::<E, f32>(&mut layer, step, &want, &ctx);
                    check_cache_step::<E, bf16>(&mut layer, step, &want, &ctx);
                    check_cache_step::<E, f16>(&mut layer, step, &want, &ctx);
                }
                let want = layer.attend(q.view()).unwrap();
                let mut out = nans::<bf16, _, _>(want.raw_dim());
                layer.attend_into(q.view(), out.view_mut()).unwrap();
                let ctx = format!("{} {kind} cache {level}", E::NAME);
                assert_eq!(out, rounded::<bf16, _>(&want), "{ctx}: attend_into a bf16 output");
            }
        }
    }
}

#[test]
fn caches_write_half_outputs_rounded_once_from_f32() {
    check_kv_cache::<bf16>();
    check_kv_cache::<f32>();
    // A paged bf16 cache: a ragged batch of a prefill chunk and a decoding step.
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    let mut random3 =
        |shape| Array3::from_shape_simple_fn(shape, || bf16::from_f32(rng.random_range(-1.0..1.0)));
    for level in levels() {
        let block_size = PagedKvCache::<bf16>::block_granularity(level).unwrap();
        let shape = PagedShape::new(1, 2, 16, 24, block_size, 32);
        let mut cache = PagedKvCache::<bf16>::for_level(shape, level).unwrap();
        let (a, b) = (cache.add_sequence(), cache.add_sequence());
        let mut layer = cache.layer(0).unwrap();
        for (seq, len) in [(a, 130), (b, 7)] {
            layer.append(seq, random3((2, len, 16)).view(), random3((2, len, 24)).view()).unwrap();
        }
        let q = random3((4, 3, 16));
        let want = layer.attend(&[a, b], &[0, 2, 3], q.view()).unwrap();
        let mut out = nans::<bf16, _, _>(want.raw_dim());
        layer.attend_into(&[a, b], &[0, 2, 3], q.view(), out.view_mut()).unwrap();
        assert_eq!(out, rounded::<bf16, _>(&want), "paged {level}: a bf16 output");
        let mut out = nans::<f16, _, _>(want.raw_dim());
        layer.attend_into(&[a, b], &[0, 2, 3], q.view(), out.view_mut()).unwrap();
        assert_eq!(out, rounded::<f16, _>(&want), "paged {level}: an f16 output");
    }
}

#[test]
fn multi_head_half_inputs_take_the_checked_path_as_f32_does() {
    // A NaN in a key no query sees (past a sequence's length) is read as 0, decoding or not; huge
    // inputs, whose scores could overflow the fast path's bound, take the blocked path.
    let mut rng = ChaCha8Rng::seed_from_u64(24);
    for n_q in [1, 20] {
        let q = random4::<bf16>(&mut rng, (2, 4, n_q, 8));
        let mut k = random4::<bf16>(&mut rng, (2, 2, 40, 8));
        let v = random4::<bf16>(&mut rng, (2, 2, 40, 8));
        k[[1, 0, 35, 3]] = bf16::NAN;
        let lengths = [40, 30];
        let options = AttentionOptions::new().key_lengths(&lengths);
        let widened = |a: &Array4<bf16>| a.mapv(bf16::to_f32);
        let f32_path =
            qkv::multi_head_attention(widened(&q).view(), widened(&k).view(), widened(&v).view(), &options);
        let got = qkv::multi_head_attention_half(q.view(), k.view(), v.view(), &options);
        let rounding = weight_rounding(qkv::SimdLevel::dispatched().unwrap(), "bf16", max_abs(&widened(&v)));
        let ctx = format!("{n_q} queries, a NaN past a sequence's length");
        assert_f32_path(&ctx, &got.unwrap(), &f32_path.unwrap(), rounding);
        let seen = qkv::multi_head_attention_half(q.view(), k.view(), v.view(), &AttentionOptions::new());
        assert_eq!(seen.unwrap_err().to_string(), "keys[1, 0, 35, 3] is NaN: attention needs finite inputs");
    }
    let x =
        Array4::from_shape_fn((1, 2, 2, 1), |(_, h, i, _)| if (h + i) % 2 == 0 { 6e18 } else { -6e18_f32 });
    let options = AttentionOptions::new().scale(1.0);
    let half = x.mapv(bf16::from_f32);
    let got = qkv::multi_head_attention_half(half.view(), half.view(), half.view(), &options).unwrap();
    let wide = half.mapv(bf16::to_f32);
    let want = qkv::multi_head_attention(wide.view(), wide.view(), wide.view(), &options).unwrap();
    assert_eq!(got, want);
    assert!(got.iter().all(|y| y.is_finite()));
}

#[test]
fn an_output_of_the_wrong_shape_is_named() {
    let err = |e: qkv::AttentionError| e.to_string();
    let (q, kv) = (Array2::from_elem((2, 3), bf16::ONE), Array2::from_elem((5, 3), bf16::ONE));
    let mut out = Array2::<bf16>::zeros((2, 4));
    let options = AttentionOptions::new();
    assert_eq!(
        err(qkv::attention_half_into(q.view(), kv.view(), kv.view(), &options, out.view_mut()).unwrap_err()),
        "output has shape [2, 4] but the attention result has shape [2, 3]"
    );
    let (q, kv) = (Array4::from_elem((1, 4, 2, 3), f16::ONE), Array4::from_elem((1, 2, 5, 3), f16::ONE));
    let mut out = Array4::<f16>::zeros((1, 2, 2, 3));
    assert_eq!(
        err(qkv::multi_head_attention_half_into(q.view(), kv.view(), kv.view(), &options, out.view_mut())
            .unwrap_err()),
        "output has shape [1, 2, 2, 3] but the attention result has shape [1, 4, 2, 3]"
    );
    let shape = CacheShape::new(1, 2, 4, 3, 5);
    let mut cache = KvCache::<bf16>::new(shape).unwrap();
    let mut layer = cache.layer(0).unwrap();
    layer
        .append(
            Array3::from_elem((2, 1, 3), bf16::ONE).view(),
            Array3::from_elem((2, 1, 5), bf16::ONE).view(),
        )
        .unwrap();
    let mut out = Array3::<bf16>::zeros((4, 1, 4));
    assert_eq!(
        err(layer.attend_into(Array3::<f32>::zeros((4, 1, 3)).view(), out.view_mut()).unwrap_err()),
        "layer 0 of the KV cache takes output of shape [4, 1, 5], not [4, 1, 4]: one value-wide row per query"
    );
    let paged = PagedShape::new(1, 2, 3, 5, 64, 2);
    let mut cache = PagedKvCache::<bf16>::new(paged).unwrap();
    let seq = cache.add_sequence();
    let mut layer = cache.layer(0).unwrap();
    layer
        .append(
            seq,
            Array3::from_elem((2, 1, 3), bf16::ONE).view(),
            Array3::from_elem((2, 1, 5), bf16::ONE).view(),
        )
        .unwrap();
    let mut out = Array3::<f16>::zeros((4, 1, 6));
    let q = Array3::from_elem((4, 1, 3), bf16::ONE);
    assert_eq!(
        err(layer.attend_into(&[seq], &[0, 1], q.view(), out.view_mut()).unwrap_err()),
        "layer 0 of the paged KV cache takes output of shape [4, 1, 5], not [4, 1, 6]: one value-wide row per query"
    );
}
