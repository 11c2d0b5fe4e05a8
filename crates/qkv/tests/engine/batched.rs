//! Masks per sequence and per head in multi-head attention, sliding windows and ALiBi: the fast
//! path against the reference run head by head with that head's slices of the masks.

use ndarray::{Array2, Array4, s};
use qkv::{AdditiveBias, Alibi, AttentionOptions, CausalMask, KeepMask, KeyPadding, SlidingWindow};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{assert_close, error_bound, levels};

/// The masks of a batch, and what each test case takes from them.
struct Masks {
    keep_per_head: Array4<bool>,
    bias_per_head: Array4<f32>,
    padding: Array2<bool>,
    lengths: Vec<usize>,
    slopes: Vec<f32>,
}

#[derive(Debug, Clone, Copy)]
enum Case {
    SharedKeep,
    KeepPerSequence,
    KeepPerHead,
    BiasPerHeadSharedOverBatch,
    PaddingAndLengths,
    CausalAlibi,
    WindowLengthsAndBiasPerSequence,
}

const CASES: [Case; 7] = [
    Case::SharedKeep,
    Case::KeepPerSequence,
    Case::KeepPerHead,
    Case::BiasPerHeadSharedOverBatch,
    Case::PaddingAndLengths,
    Case::CausalAlibi,
    Case::WindowLengthsAndBiasPerSequence,
];

impl Masks {
    fn random(rng: &mut ChaCha8Rng, (batch, heads, n_q, n_k): (usize, usize, usize, usize)) -> Masks {
        // Some rows of some heads see nothing at all.
        let keep_per_head = Array4::from_shape_fn((batch, heads, n_q, n_k), |(b, h, i, _)| {
            (b + h + i) % 7 != 3 && rng.random_bool(0.7)
        });
        let bias_per_head = Array4::from_shape_simple_fn((batch, heads, n_q, n_k), || {
            if rng.random_bool(0.1) { f32::NEG_INFINITY } else { rng.random_range(-2.0..2.0) }
        });
        let lengths: Vec<usize> =
            (0..batch).map(|b| if b == 0 { n_k } else { (n_k / (b + 1)).max(1) - 1 }).collect();
        let padding = Array2::from_shape_fn((batch, n_k), |(b, j)| (j + b) % 4 != 1);
        Masks { keep_per_head, bias_per_head, padding, lengths, slopes: qkv::alibi_slopes(heads) }
    }

    /// The options of a case for the whole batch, and for batch element `b`, query head `h` alone
    /// (`None`: the whole batch).
    fn options(&self, case: Case, head: Option<(usize, usize)>) -> AttentionOptions<'_, f32> {
        let o = AttentionOptions::new();
        match (case, head) {
            (Case::SharedKeep, None) => {
                o.keep_mask(KeepMask::new(self.keep_per_head.slice(s![0, 0, .., ..])))
            }
            (Case::SharedKeep, Some(_)) => {
                o.keep_mask(KeepMask::new(self.keep_per_head.slice(s![0, 0, .., ..])))
            }
            (Case::KeepPerSequence, None) => {
                o.keep_mask(KeepMask::batched(self.keep_per_head.slice(s![.., 0..1, .., ..])))
            }
            (Case::KeepPerSequence, Some((b, _))) => {
                o.keep_mask(KeepMask::new(self.keep_per_head.slice(s![b, 0, .., ..])))
            }
            (Case::KeepPerHead, None) => o.keep_mask(KeepMask::batched(self.keep_per_head.view())),
            (Case::KeepPerHead, Some((b, h))) => {
                o.keep_mask(KeepMask::new(self.keep_per_head.slice(s![b, h, .., ..])))
            }
            (Case::BiasPerHeadSharedOverBatch, None) => {
                o.bias(AdditiveBias::batched(self.bias_per_head.slice(s![0..1, .., .., ..])))
            }
            (Case::BiasPerHeadSharedOverBatch, Some((_, h))) => {
                o.bias(AdditiveBias::new(self.bias_per_head.slice(s![0, h, .., ..])))
            }
            (Case::PaddingAndLengths, None) => {
                o.key_padding(KeyPadding::batched(self.padding.view())).key_lengths(&self.lengths)
            }
            (Case::PaddingAndLengths, Some((b, _))) => o
                .key_padding(KeyPadding::new(self.padding.slice(s![b, ..])))
                .key_lengths(&self.lengths[b..b + 1]),
            (Case::CausalAlibi, None) => o.causal(CausalMask::BottomRight).alibi(Alibi::new(&self.slopes)),
            (Case::CausalAlibi, Some((_, h))) => {
                o.causal(CausalMask::BottomRight).alibi(Alibi::new(&self.slopes[h..h + 1]))
            }
            (Case::WindowLengthsAndBiasPerSequence, None) => o
                .sliding_window(SlidingWindow::new(150, 10))
                .key_lengths(&self.lengths)
                .bias(AdditiveBias::batched(self.bias_per_head.slice(s![.., 0..1, .., ..]))),
            (Case::WindowLengthsAndBiasPerSequence, Some((b, _))) => o
                .sliding_window(SlidingWindow::new(150, 10))
                .key_lengths(&self.lengths[b..b + 1])
                .bias(AdditiveBias::new(self.bias_per_head.slice(s![b, 0, .., ..]))),
        }
    }
}

#[test]
fn batched_masks_match_the_reference_head_by_head() {
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let (batch, q_heads, kv_heads, d_k, d_v) = (2, 8, 2, 16, 8);
    // Decoding (stacked GQA rows unless the heads' masks differ), decoding with split keys, tiles.
    for (n_q, n_k) in [(1, 300), (3, 2100), (70, 150), (100, 200)] {
        let mut random4 = |shape| Array4::from_shape_simple_fn(shape, || rng.random_range(-1.0..1.0_f32));
        let q = random4((batch, q_heads, n_q, d_k));
        let k = random4((batch, kv_heads, n_k, d_k));
        let v = random4((batch, kv_heads, n_k, d_v));
        let masks = Masks::random(&mut rng, (batch, q_heads, n_q, n_k));
        for case in CASES {
            // The reference once per head (it dominates a debug build's time), then every level.
            let mut wants = Vec::new();
            for b in 0..batch {
                for h in 0..q_heads {
                    let kv = h / (q_heads / kv_heads);
                    let (qh, kh, vh) =
                        (q.slice(s![b, h, .., ..]), k.slice(s![b, kv, .., ..]), v.slice(s![b, kv, .., ..]));
                    let head_options = masks.options(case, Some((b, h)));
                    let want = qkv::reference::attention(qh, kh, vh, &head_options).unwrap();
                    let lse =
                        qkv::reference::attention_with_lse(qh, kh, vh, &head_options).unwrap().logsumexp;
                    let bounds = error_bound(&want, &vh.to_owned());
                    wants.push((b, h, want.output, lse, bounds));
                }
            }
            for level in levels() {
                let options = masks.options(case, None).simd(level);
                let got = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
                let mut into = Array4::from_elem((batch, q_heads, n_q, d_v), f32::NAN);
                qkv::multi_head_attention_into(q.view(), k.view(), v.view(), &options, into.view_mut())
                    .unwrap();
                assert_eq!(into, got.output, "{case:?} {level}: _into and _with_lse differ");
                for (b, h, output, lse, (weight_bound, bound)) in &wants {
                    let ctx = format!("{case:?} {level} {n_q}x{n_k} batch {b} head {h}");
                    assert_close(&ctx, &got.output.slice(s![*b, *h, .., ..]).to_owned(), output, *bound);
                    for (i, (g, w)) in got.logsumexp.slice(s![*b, *h, ..]).iter().zip(lse).enumerate() {
                        let g = f64::from(*g);
                        assert!(
                            g == *w || (g - w).abs() <= 2e-5 * weight_bound,
                            "{ctx} lse row {i}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn alibi_is_the_bias_slope_times_key_minus_query_position() {
    // ALiBi from indices equals the bias matrix m · (j - p), p the query's key position under
    // the alignment: on the reference and the fast path alike.
    let mut rng = ChaCha8Rng::seed_from_u64(4);
    for (n_q, n_k, align) in
        [(5, 9, CausalMask::BottomRight), (9, 5, CausalMask::TopLeft), (200, 300, CausalMask::BottomRight)]
    {
        let mut random = |r, c| Array2::from_shape_simple_fn((r, c), || rng.random_range(-1.0..1.0_f64));
        let (q, k, v) = (random(n_q, 8), random(n_k, 8), random(n_k, 4));
        let slope = [0.25];
        let offset = if align == CausalMask::BottomRight { n_k as f64 - n_q as f64 } else { 0.0 };
        let bias = Array2::from_shape_fn((n_q, n_k), |(i, j)| 0.25 * (j as f64 - (i as f64 + offset)));
        let explicit = AttentionOptions::new().causal(align).bias(AdditiveBias::new(bias.view()));
        let want = qkv::reference::attention(q.view(), k.view(), v.view(), &explicit).unwrap();
        let alibi = AttentionOptions::new().causal(align).alibi(Alibi::new(&slope).aligned(align));
        let got = qkv::reference::attention(q.view(), k.view(), v.view(), &alibi).unwrap();
        assert_close("reference", &got.output, &want.output, 1.0);
        for level in levels() {
            let fast = qkv::attention(q.view(), k.view(), v.view(), &alibi.clone().simd(level)).unwrap();
            assert_close(&format!("{level} {n_q}x{n_k}"), &fast, &want.output, error_bound(&want, &v).1);
        }
    }
}

#[test]
fn a_sliding_window_is_the_keep_mask_of_its_band() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    for (n_q, n_k, before, after, align) in [
        (7, 12, 2, 0, CausalMask::BottomRight),
        (12, 7, 0, 3, CausalMask::TopLeft),
        (300, 1000, 130, 5, CausalMask::BottomRight),
        (1000, 1000, 0, 0, CausalMask::TopLeft),
        // Sides of 2^63 and more (usize::MAX for "no limit") saturate rather than wrap.
        (9, 14, usize::MAX, 0, CausalMask::BottomRight),
        (14, 9, 0, usize::MAX, CausalMask::TopLeft),
        (9, 14, 1 << 63, 1 << 63, CausalMask::BottomRight),
        (14, 9, usize::MAX, usize::MAX, CausalMask::BottomRight),
        (9, 14, 2, SlidingWindow::UNBOUNDED, CausalMask::TopLeft),
        (130, 300, usize::MAX - 1, 5, CausalMask::BottomRight),
    ] {
        let mut random = |r, c| Array2::from_shape_simple_fn((r, c), || rng.random_range(-1.0..1.0_f32));
        let (q, k, v) = (random(n_q, 16), random(n_k, 16), random(n_k, 8));
        // The band in i128, where no side overflows: independent of the engine's window code.
        let offset = if align == CausalMask::BottomRight { n_k as i128 - n_q as i128 } else { 0 };
        let band = Array2::from_shape_fn((n_q, n_k), |(i, j)| {
            let (p, j) = (i as i128 + offset, j as i128);
            p - before as i128 <= j && j <= p + after as i128
        });
        let want = qkv::reference::attention(
            q.view(),
            k.view(),
            v.view(),
            &AttentionOptions::new().keep_mask(KeepMask::new(band.view())),
        )
        .unwrap();
        let window = AttentionOptions::new().sliding_window(SlidingWindow::new(before, after).aligned(align));
        // The reference shares the window code with the fast path; checked where it is quick in
        // a debug build, which covers every window with a huge side.
        if n_q * n_k <= 50_000 {
            let reference = qkv::reference::attention(q.view(), k.view(), v.view(), &window).unwrap();
            let ctx = format!("reference {n_q}x{n_k} window ({before}, {after}) {align:?}");
            assert_close(&ctx, &reference.output, &want.output, 1.0);
        }
        for level in levels() {
            let got = qkv::attention(q.view(), k.view(), v.view(), &window.clone().simd(level)).unwrap();
            let ctx = format!("{level} {n_q}x{n_k} window ({before}, {after}) {align:?}");
            assert_close(&ctx, &got, &want.output, error_bound(&want, &v).1);
        }
    }
}

#[test]
fn alibi_slopes_follow_the_paper() {
    let powers = |exponents: &[i32]| exponents.iter().map(|&e| 2f64.powi(-e)).collect::<Vec<_>>();
    assert_eq!(qkv::alibi_slopes::<f64>(8), powers(&[1, 2, 3, 4, 5, 6, 7, 8]));
    // Six heads: the four of the power of two below, then every other one of eight.
    assert_eq!(qkv::alibi_slopes::<f64>(6), powers(&[2, 4, 6, 8, 1, 3]));
    assert_eq!(qkv::alibi_slopes::<f64>(1), powers(&[8]));
    assert!(qkv::alibi_slopes::<f32>(0).is_empty());
}

#[test]
fn symmetric_alibi_per_sequence_and_head_is_flash_attn_s_bias() {
    // flash-attn's non-causal ALiBi, -slope[b, h] · |i + n_k - n_q - j|, built here as a bias
    // matrix per (sequence, head) from its own formula, against the engine's indices: the
    // reference and every level, over key-split decoding shapes and tiled ones.
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let (batch, heads, kv_heads) = (2, 4, 2);
    let slopes = Array2::from_shape_fn((batch, heads), |(b, h)| 0.03 * (1 + b * heads + h) as f64);
    for (n_q, n_k) in [(1, 1), (3, 2000), (7, 9), (130, 70)] {
        let mut random = |shape: (usize, usize, usize, usize)| {
            Array4::from_shape_simple_fn(shape, || rng.random_range(-1.0..1.0_f64))
        };
        let (q, k, v) = (
            random((batch, heads, n_q, 8)),
            random((batch, kv_heads, n_k, 8)),
            random((batch, kv_heads, n_k, 5)),
        );
        let bias = Array4::from_shape_fn((batch, heads, n_q, n_k), |(b, h, i, j)| {
            -slopes[[b, h]] * (i as f64 + n_k as f64 - n_q as f64 - j as f64).abs()
        });
        let alibi = AttentionOptions::new().alibi(Alibi::batched(slopes.view()).symmetric());
        for b in 0..batch {
            for h in 0..heads {
                let (qh, kh, vh) =
                    (q.slice(s![b, h, .., ..]), k.slice(s![b, h / 2, .., ..]), v.slice(s![b, h / 2, .., ..]));
                let explicit = AttentionOptions::new().bias(AdditiveBias::new(bias.slice(s![b, h, .., ..])));
                let want = qkv::reference::attention(qh, kh, vh, &explicit).unwrap();
                let slope = [slopes[[b, h]]];
                let one = AttentionOptions::new().alibi(Alibi::new(&slope).symmetric());
                let got = qkv::reference::attention(qh, kh, vh, &one).unwrap();
                assert_close(&format!("reference {n_q}x{n_k} [{b}, {h}]"), &got.output, &want.output, 1.0);
                for level in levels() {
                    let fast =
                        qkv::multi_head_attention(q.view(), k.view(), v.view(), &alibi.clone().simd(level))
                            .unwrap();
                    let ctx = format!("{level} {n_q}x{n_k} [{b}, {h}]");
                    let got = fast.slice(s![b, h, .., ..]).to_owned();
                    assert_close(&ctx, &got, &want.output, error_bound(&want, &vh.to_owned()).1);
                }
            }
        }
    }
}

#[test]
fn symmetric_alibi_under_a_causal_mask_is_plain_alibi() {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut random = |r, c| Array2::from_shape_simple_fn((r, c), || rng.random_range(-1.0..1.0_f32));
    let (q, k, v) = (random(40, 16), random(90, 16), random(90, 8));
    let slope = [0.3_f32];
    let causal = AttentionOptions::new().causal(CausalMask::BottomRight);
    let plain = qkv::attention(q.view(), k.view(), v.view(), &causal.clone().alibi(&slope)).unwrap();
    let symmetric =
        qkv::attention(q.view(), k.view(), v.view(), &causal.alibi(Alibi::new(&slope).symmetric()));
    assert_eq!(plain, symmetric.unwrap());
}

#[test]
fn alibi_slopes_per_sequence_are_checked_against_the_batch() {
    let q = Array4::<f32>::zeros((2, 2, 1, 4));
    let kv = Array4::<f32>::zeros((2, 1, 3, 4));
    let err = |slopes: Array2<f32>| {
        let options = AttentionOptions::new().alibi(Alibi::batched(slopes.view()));
        qkv::multi_head_attention(q.view(), kv.view(), kv.view(), &options).unwrap_err().to_string()
    };
    let message = err(Array2::zeros((3, 2)));
    assert!(message.contains("alibi slopes"), "{message}");
    assert!(message.contains("[3, 2]") && message.contains("per sequence and head [2, 2]"), "{message}");
    let mut slopes = Array2::zeros((2, 2));
    slopes[[1, 0]] = f32::NAN;
    assert_eq!(err(slopes), "alibi slopes[1, 0] is NaN: attention needs finite inputs");
    // One row of slopes is shared by the batch.
    let shared = Array2::from_elem((1, 2), 0.5_f32);
    let options = AttentionOptions::new().alibi(Alibi::batched(shared.view()));
    qkv::multi_head_attention(q.view(), kv.view(), kv.view(), &options).unwrap();
}
