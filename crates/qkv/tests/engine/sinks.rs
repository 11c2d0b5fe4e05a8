//! Attention sinks (one logit per query head joining every row's softmax, with no value): the
//! reference against the formula written out, every dense path against the reference with every
//! mask kind at every SIMD level (key splits, decoding, grouped-query stacking, the blocked path),
//! `-inf` as no sink bit for bit, huge scores and sinks, fully masked rows, merging parts, the
//! backward's sink gradient against finite differences and the reference, and the errors. The
//! caches' steps with sinks are `cache_options.rs`', `ring.rs`' and `paged.rs`' (their `All`).

use ndarray::{Array1, Array2, Array4, ArrayView2, array, s};
use qkv::{AttentionOptions, CacheOptions, CacheShape, CausalMask, GradientsMut, KeepMask, KvCache, Real};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{MASK_KINDS, MaskKind, Problem, assert_close, error_bound, levels};

/// The reference's sink is one more term of the softmax's denominator, with no value:
/// `O_i = Σ_j exp(S_ij) v_j / (exp(s) + Σ_j exp(S_ij))`, `lse_i = ln(exp(s) + Σ_j exp(S_ij))`; a
/// row that sees nothing has output 0 and logsumexp `s`.
#[test]
fn the_reference_adds_the_sink_to_the_denominator_only() {
    let q = array![[2.0_f64, -1.0], [0.5, 3.0], [1.0, 1.0]];
    let k = array![[1.0, 2.0], [-3.0, 0.5], [2.0, 2.0]];
    let v = array![[1.0, 0.0, 3.0], [0.0, 1.0, -1.0], [2.0, -1.0, 0.5]];
    let keep = array![[true, true, false], [true, true, true], [false, false, false]];
    let sink = [0.75];
    let options = AttentionOptions::new().scale(0.8).keep_mask(KeepMask::new(keep.view())).sinks(&sink);
    let got = qkv::reference::attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
    for i in 0..3 {
        let exps: Vec<f64> =
            (0..3).map(|j| if keep[[i, j]] { (q.row(i).dot(&k.row(j)) * 0.8).exp() } else { 0.0 }).collect();
        let sum = sink[0].exp() + exps.iter().sum::<f64>();
        for c in 0..3 {
            let want: f64 = (0..3).map(|j| exps[j] / sum * v[[j, c]]).sum();
            assert!((got.output[[i, c]] - want).abs() < 1e-14, "row {i} column {c}");
        }
        assert!((got.logsumexp[i] - sum.ln()).abs() < 1e-14, "logsumexp row {i}");
    }
    assert_eq!(got.output.row(2).to_vec(), vec![0.0; 3], "a row that sees nothing is exactly 0");
    assert_eq!(got.logsumexp[2], 0.75, "and its logsumexp is the sink's logit");
}

/// The largest `|got - want|` of a comparison, for the report of worst errors.
fn worst<T: Real>(got: &Array2<T>, want: &Array2<f64>) -> f64 {
    got.iter().zip(want).fold(0.0_f64, |m, (g, w)| m.max((g.to_f64_exact() - w).abs()))
}

/// Every dense single-head path (`attention`, `_into`, `_with_lse`, `_with_weights`) with a sink
/// against the reference, for every mask kind at every level; returns the worst output error.
fn check_dense<T: Real>(seed: u64, dims: (usize, usize, usize, usize), sink: f64) -> f64 {
    let mut worst_error = 0.0_f64;
    let sinks = [T::from_f64_round(sink)];
    for mask in MASK_KINDS {
        let p = Problem::<T>::random(seed, dims, 1.0, mask);
        let options = p.options().sinks(&sinks);
        let want = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        let want_lse =
            qkv::reference::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        assert_eq!(want.output, want_lse.output, "the reference's two entry points agree");
        let (weight_bound, output_bound) = error_bound(&want, &p.v);
        let ctx = format!("{} {dims:?} {mask:?} sink {sink} seed {seed}", T::NAME);
        let with = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        assert_close(&format!("weights {ctx}"), &with.weights, &want.weights, weight_bound);
        assert_close(&format!("blocked output {ctx}"), &with.output, &want.output, output_bound);
        for level in levels() {
            let options = options.clone().simd(level);
            let out = qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
            assert_close(&format!("output {level} {ctx}"), &out, &want.output, output_bound);
            worst_error = worst_error.max(worst(&out, &want.output));
            let mut into = Array2::from_elem(out.raw_dim(), T::nan());
            qkv::attention_into(p.q.view(), p.k.view(), p.v.view(), &options, into.view_mut()).unwrap();
            assert_eq!(into, out, "into {level} {ctx}");
            let lse = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
            assert_close(&format!("lse output {level} {ctx}"), &lse.output, &want.output, output_bound);
            for (i, (&g, &w)) in lse.logsumexp.iter().zip(&want_lse.logsumexp).enumerate() {
                let close = if w == f64::NEG_INFINITY {
                    g == T::neg_infinity()
                } else {
                    (g.to_f64_exact() - w).abs() <= 2e-5 * (weight_bound + dims.1 as f64)
                };
                assert!(close, "logsumexp {level} {ctx} row {i}: {g} vs {w}");
            }
        }
    }
    worst_error
}

/// Shapes with one query and one key, rows that are not a whole tile, `d_k != d_v`, decoding over
/// keys that are split between tasks (2500 keys), and a few query blocks over split keys.
#[test]
fn every_dense_path_matches_the_reference_with_every_mask() {
    let mut worst_f32 = 0.0_f64;
    let mut worst_f64 = 0.0_f64;
    let grid = [
        (1, (1, 1, 1, 1)),
        (2, (37, 200, 16, 24)),
        (3, (130, 129, 8, 5)),
        (4, (1, 2500, 64, 32)),
        (5, (7, 2100, 8, 3)),
    ];
    for (seed, dims) in grid {
        for sink in [-1.5, 0.0, 2.0] {
            worst_f32 = worst_f32.max(check_dense::<f32>(seed, dims, sink));
            worst_f64 = worst_f64.max(check_dense::<f64>(seed, dims, sink));
        }
    }
    println!("sinks: worst output error against the f64 reference: f32 {worst_f32:e}, f64 {worst_f64:e}");
}

/// A sink of `-inf` is no sink: the same bits on every path, outputs and logsumexps.
#[test]
fn a_sink_of_minus_infinity_is_no_sink_bit_for_bit() {
    let none = [f32::NEG_INFINITY];
    for (seed, dims) in [(21, (1, 300, 16, 8)), (22, (70, 90, 8, 12))] {
        for mask in [MaskKind::None, MaskKind::KeepWithEmptyRows, MaskKind::CausalWindow] {
            let p = Problem::<f32>::random(seed, dims, 1.0, mask);
            for level in levels() {
                let plain = p.options().simd(level);
                let with = plain.clone().sinks(&none);
                let a = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &plain).unwrap();
                let b = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &with).unwrap();
                assert_eq!(a, b, "{level} {dims:?} {mask:?}");
            }
            let a = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &p.options()).unwrap();
            let b =
                qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &p.options().sinks(&none))
                    .unwrap();
            assert_eq!(a.output, b.output, "blocked {dims:?} {mask:?}");
        }
    }
    let (q, kv) = (Array4::<f32>::from_elem((1, 4, 3, 8), 0.3), Array4::<f32>::from_elem((1, 2, 5, 8), 0.2));
    let heads = [f32::NEG_INFINITY; 4];
    let plain = qkv::multi_head_attention_with_lse(q.view(), kv.view(), kv.view(), &AttentionOptions::new());
    let with = qkv::multi_head_attention_with_lse(
        q.view(),
        kv.view(),
        kv.view(),
        &AttentionOptions::new().sinks(&heads),
    );
    assert_eq!(plain.unwrap(), with.unwrap(), "multi-head");
}

/// Huge sinks and huge scores: a sink far above every score takes every weight (output 0,
/// logsumexp the sink), one far below changes nothing, and large scores beside a sink of their
/// size stay exact; never NaN.
#[test]
fn huge_scores_and_huge_sinks_stay_finite_and_exact() {
    for level in levels() {
        let p = Problem::<f32>::random(31, (9, 150, 8, 4), 1.0, MaskKind::None);
        let huge = [1e30_f32];
        let r = qkv::attention_with_lse(
            p.q.view(),
            p.k.view(),
            p.v.view(),
            &p.options().sinks(&huge).simd(level),
        )
        .unwrap();
        assert!(r.output.iter().all(|&x| x == 0.0), "{level}: a huge sink takes every weight");
        assert!(r.logsumexp.iter().all(|&l| l == 1e30), "{level}: the logsumexp is the sink's");
        let tiny = [-1e30_f32];
        let r = qkv::attention(p.q.view(), p.k.view(), p.v.view(), &p.options().sinks(&tiny).simd(level))
            .unwrap();
        let plain = qkv::attention(p.q.view(), p.k.view(), p.v.view(), &p.options().simd(level)).unwrap();
        assert_eq!(r, plain, "{level}: a sink far below every score weighs nothing");
        // Scores near 200 (inputs of magnitude 10, d = 8) and a sink among them.
        let p = Problem::<f32>::random(32, (9, 150, 8, 4), 10.0, MaskKind::CausalBottomRight);
        for sink in [150.0_f32, 100.0, 400.0] {
            let sinks = [sink];
            let options = p.options().sinks(&sinks);
            let want = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
            let (_, bound) = error_bound(&want, &p.v);
            let got =
                qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options.clone().simd(level)).unwrap();
            assert_close(&format!("{level} large scores, sink {sink}"), &got, &want.output, bound);
        }
    }
}

/// A row that sees no key gets output exactly 0 and the sink's logit as its logsumexp, on every
/// path (the tiled path, decoding, the blocked path).
#[test]
fn a_fully_masked_row_is_zero_with_the_sinks_logit_as_logsumexp() {
    let sink = [1.25_f64];
    for n_q in [1, 9] {
        let p = Problem::<f64>::random(41, (n_q, 70, 8, 6), 1.0, MaskKind::None);
        let keep = Array2::from_shape_fn((n_q, 70), |(i, _)| i % 2 == 1);
        let options = AttentionOptions::new().keep_mask(KeepMask::new(keep.view())).sinks(&sink);
        for level in levels() {
            let r = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options.clone().simd(level))
                .unwrap();
            for i in (0..n_q).step_by(2) {
                assert!(r.output.row(i).iter().all(|&x| x == 0.0), "{level} {n_q} row {i}");
                assert_eq!(r.logsumexp[i], 1.25, "{level} {n_q} row {i}");
            }
        }
        let w = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        assert!(w.output.row(0).iter().all(|&x| x == 0.0), "blocked {n_q}");
    }
}

/// Multi-head attention with one sink per query head (some `-inf`), grouped-query heads decoding
/// (the heads of a group stacked as the rows of one problem, each row with its own head's sink),
/// prefill and key splits, each head against the reference with its own sink.
#[test]
fn multi_head_attention_gives_each_head_its_own_sink() {
    let (batch, heads, kv_heads, d) = (2, 8, 2, 16);
    let sinks: Vec<f32> =
        (0..heads).map(|h| if h == 5 { f32::NEG_INFINITY } else { h as f32 * 0.6 - 1.5 }).collect();
    let mut rng = ChaCha8Rng::seed_from_u64(51);
    for (n_q, n_k) in [(1, 70), (3, 2500), (37, 129)] {
        let mut tensor = |h: usize, n: usize| {
            Array4::from_shape_simple_fn((batch, h, n, d), || rng.random_range(-1.0_f32..1.0))
        };
        let (q, k, v) = (tensor(heads, n_q), tensor(kv_heads, n_k), tensor(kv_heads, n_k));
        for level in levels() {
            let options = AttentionOptions::new().causal(CausalMask::BottomRight).sinks(&sinks).simd(level);
            let got = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
            for b in 0..batch {
                for h in 0..heads {
                    let head_options =
                        AttentionOptions::new().causal(CausalMask::BottomRight).sinks(&sinks[h..=h]);
                    let group = heads / kv_heads;
                    let (qh, kh, vh) = (
                        q.slice(s![b, h, .., ..]),
                        k.slice(s![b, h / group, .., ..]),
                        v.slice(s![b, h / group, .., ..]),
                    );
                    let want = qkv::reference::attention_with_lse(qh, kh, vh, &head_options).unwrap();
                    let ctx = format!("{level} {n_q}x{n_k} batch {b} head {h}");
                    let got_head = got.output.slice(s![b, h, .., ..]).to_owned();
                    assert_close(&ctx, &got_head, &want.output, 4.0);
                    for (i, (&g, &w)) in
                        got.logsumexp.slice(s![b, h, ..]).iter().zip(&want.logsumexp).enumerate()
                    {
                        assert!(
                            (f64::from(g) - w).abs() <= 2e-5 * (5.0 + n_k as f64),
                            "lse {ctx} row {i}: {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

/// Parts over disjoint keys merge into the whole with the sink counted once: the sink goes to one
/// part's call only, even a part that sees no key (which then carries the sink alone).
#[test]
fn merged_parts_count_the_sink_once() {
    let p = Problem::<f64>::random(61, (5, 300, 8, 4), 1.0, MaskKind::CausalBottomRight);
    let sink = [0.5];
    let with = p.options().sinks(&sink);
    let whole = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &with).unwrap();
    for split in [1, 128, 299] {
        let (k1, v1) = (p.k.slice(s![..split, ..]), p.v.slice(s![..split, ..]));
        let (k2, v2) = (p.k.slice(s![split.., ..]), p.v.slice(s![split.., ..]));
        // Each part masked as inside the whole: keep masks cut from the causal mask's.
        let causal = |j: usize, i: usize| j <= i + 295;
        let keep1 = Array2::from_shape_fn((5, split), |(i, j)| causal(j, i));
        let keep2 = Array2::from_shape_fn((5, 300 - split), |(i, j)| causal(j + split, i));
        let first_options = AttentionOptions::new().keep_mask(KeepMask::new(keep1.view()));
        let rest_options = AttentionOptions::new().keep_mask(KeepMask::new(keep2.view()));
        for (a, b) in [
            (first_options.clone().sinks(&sink), rest_options.clone()),
            (first_options, rest_options.sinks(&sink)),
        ] {
            let first = qkv::attention_with_lse(p.q.view(), k1, v1, &a).unwrap();
            let rest = qkv::attention_with_lse(p.q.view(), k2, v2, &b).unwrap();
            let merged = first.merge(&rest).unwrap();
            let close =
                |x: &Array2<f64>, y: &Array2<f64>| x.iter().zip(y).all(|(a, b)| (a - b).abs() < 1e-12);
            assert!(close(&merged.output, &whole.output), "split {split}: outputs");
            assert!(
                merged.logsumexp.iter().zip(&whole.logsumexp).all(|(a, b)| (a - b).abs() < 1e-12),
                "split {split}: logsumexps"
            );
        }
    }
}

/// `L = Σ dO ∘ O` by the reference forward with sink `s`.
fn loss(
    q: ArrayView2<f64>,
    k: ArrayView2<f64>,
    v: ArrayView2<f64>,
    d_out: &Array2<f64>,
    options: &AttentionOptions<f64>,
) -> f64 {
    (&qkv::reference::attention(q, k, v, options).unwrap().output * d_out).sum()
}

/// The reference's sink gradient is the central difference of the reference forward, and its
/// other gradients are too; the tiled backward matches the reference at every level, single-head
/// and multi-head (each head's gradient summed over the batch).
#[test]
fn the_sink_gradient_matches_finite_differences_and_the_reference() {
    let mut worst_error = 0.0_f64;
    for mask in [MaskKind::None, MaskKind::CausalBottomRight, MaskKind::KeepWithEmptyRows, MaskKind::Alibi] {
        for (seed, dims) in [(71, (5, 7, 3, 2)), (72, (1, 1, 1, 1)), (73, (6, 4, 2, 3))] {
            let p = Problem::<f64>::random(seed, dims, 1.0, mask);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let d_out = Array2::from_shape_simple_fn((dims.0, dims.3), || rng.random_range(-1.0..1.0));
            let sink = [0.3];
            let options = p.options().sinks(&sink);
            let g = qkv::reference::attention_backward(
                p.q.view(),
                p.k.view(),
                p.v.view(),
                d_out.view(),
                &options,
            )
            .unwrap();
            let h = 1e-6;
            let at = |s: f64| loss(p.q.view(), p.k.view(), p.v.view(), &d_out, &p.options().sinks(&[s]));
            let want = (at(0.3 + h) - at(0.3 - h)) / (2.0 * h);
            let got = g.dsinks.as_ref().unwrap()[0];
            assert!(
                (got - want).abs() <= 1e-7 * (1.0 + want.abs()),
                "{mask:?} {dims:?}: dsink {got} vs {want}"
            );
            let dv_fd = Array2::from_shape_fn(p.v.raw_dim(), |idx| {
                let (mut up, mut down) = (p.v.clone(), p.v.clone());
                up[idx] += h;
                down[idx] -= h;
                (loss(p.q.view(), p.k.view(), up.view(), &d_out, &options)
                    - loss(p.q.view(), p.k.view(), down.view(), &d_out, &options))
                    / (2.0 * h)
            });
            assert!(
                g.dv.iter().zip(&dv_fd).all(|(a, b)| (a - b).abs() <= 1e-7 * (1.0 + b.abs())),
                "{mask:?} {dims:?}: dv"
            );
            let dq_fd = Array2::from_shape_fn(p.q.raw_dim(), |idx| {
                let (mut up, mut down) = (p.q.clone(), p.q.clone());
                up[idx] += h;
                down[idx] -= h;
                (loss(up.view(), p.k.view(), p.v.view(), &d_out, &options)
                    - loss(down.view(), p.k.view(), p.v.view(), &d_out, &options))
                    / (2.0 * h)
            });
            assert!(
                g.dq.iter().zip(&dq_fd).all(|(a, b)| (a - b).abs() <= 1e-7 * (1.0 + b.abs())),
                "{mask:?} {dims:?}: dq"
            );
        }
        for (seed, dims) in [(74, (37, 130, 8, 5)), (75, (1, 200, 16, 16))] {
            let p = Problem::<f32>::random(seed, dims, 1.0, mask);
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let d_out = Array2::from_shape_simple_fn((dims.0, dims.3), || rng.random_range(-1.0_f32..1.0));
            let sink = [0.8_f32];
            let options = p.options().sinks(&sink);
            let want = qkv::reference::attention_backward(
                p.q.view(),
                p.k.view(),
                p.v.view(),
                d_out.view(),
                &options,
            )
            .unwrap();
            for level in levels() {
                let options = options.clone().simd(level);
                let forward = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
                let g = qkv::attention_backward(
                    p.q.view(),
                    p.k.view(),
                    p.v.view(),
                    &forward,
                    d_out.view(),
                    &options,
                )
                .unwrap();
                let ctx = format!("{level} {mask:?} {dims:?}");
                let scale = 1.0 + dims.0 as f64;
                for (name, got, want) in
                    [("dq", &g.dq, &want.dq), ("dk", &g.dk, &want.dk), ("dv", &g.dv, &want.dv)]
                {
                    let e = worst(got, want);
                    worst_error = worst_error.max(e);
                    assert!(e <= 1e-4 * scale, "{name} {ctx}: worst error {e}");
                }
                let (got, want) = (g.dsinks.as_ref().unwrap()[0], want.dsinks.as_ref().unwrap()[0]);
                assert!((f64::from(got) - want).abs() <= 1e-4 * scale, "dsink {ctx}: {got} vs {want}");
                let mut dsinks = Array1::from_elem(1, f32::NAN);
                let (mut dq, mut dk, mut dv) = (g.dq.clone(), g.dk.clone(), g.dv.clone());
                let into = GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut())
                    .with_dsinks(dsinks.view_mut());
                qkv::attention_backward_into(
                    p.q.view(),
                    p.k.view(),
                    p.v.view(),
                    &forward,
                    d_out.view(),
                    &options,
                    into,
                )
                .unwrap();
                assert_eq!(dsinks[0], g.dsinks.as_ref().unwrap()[0], "into {ctx}");
            }
        }
    }
    // Multi-head, grouped: head h's gradient is the sum over the batch of the single-head one.
    let (batch, heads, kv_heads, n, d) = (2, 4, 2, 9, 8);
    let mut rng = ChaCha8Rng::seed_from_u64(76);
    let mut tensor =
        |h: usize| Array4::from_shape_simple_fn((batch, h, n, d), || rng.random_range(-1.0_f64..1.0));
    let (q, k, v, d_out) = (tensor(heads), tensor(kv_heads), tensor(kv_heads), tensor(heads));
    let sinks = [0.5, f64::NEG_INFINITY, -1.0, 2.0];
    for level in levels() {
        let options = AttentionOptions::new().causal(CausalMask::BottomRight).sinks(&sinks).simd(level);
        let forward = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
        let g = qkv::multi_head_attention_backward(
            q.view(),
            k.view(),
            v.view(),
            &forward,
            d_out.view(),
            &options,
        )
        .unwrap();
        for h in 0..heads {
            let head_options = AttentionOptions::new().causal(CausalMask::BottomRight).sinks(&sinks[h..=h]);
            let want: f64 = (0..batch)
                .map(|b| {
                    let (qh, kh, vh) = (
                        q.slice(s![b, h, .., ..]),
                        k.slice(s![b, h / 2, .., ..]),
                        v.slice(s![b, h / 2, .., ..]),
                    );
                    let r = qkv::reference::attention_backward(
                        qh,
                        kh,
                        vh,
                        d_out.slice(s![b, h, .., ..]),
                        &head_options,
                    )
                    .unwrap();
                    r.dsinks.unwrap()[0]
                })
                .sum();
            let got = g.dsinks.as_ref().unwrap()[h];
            assert!((got - want).abs() <= 1e-12, "{level} head {h}: {got} vs {want}");
        }
    }
    println!("sinks: worst f32 gradient error against the f64 reference: {worst_error:e}");
}

/// Sinks of the wrong length or not finite (NaN, `+inf`) are errors naming the argument and the
/// shapes, on dense calls and caches.
#[test]
fn bad_sinks_are_errors_naming_the_argument() {
    let x = array![[1.0_f32, 0.0], [0.0, 1.0]];
    let err = |options: &AttentionOptions<f32>| {
        qkv::attention(x.view(), x.view(), x.view(), options).unwrap_err().to_string()
    };
    assert_eq!(
        err(&AttentionOptions::new().sinks(&[0.0, 1.0])),
        "sinks has shape [2] but the scores it applies to have shape [2, 2] (one logit per query head: [1])"
    );
    assert_eq!(
        err(&AttentionOptions::new().sinks(&[f32::NAN])),
        "sinks[0] is NaN: attention needs finite inputs"
    );
    let q4 = Array4::<f32>::zeros((1, 3, 2, 2));
    let e = qkv::multi_head_attention(
        q4.view(),
        q4.view(),
        q4.view(),
        &AttentionOptions::new().sinks(&[0.0, f32::INFINITY, 0.0]),
    );
    assert_eq!(e.unwrap_err().to_string(), "sinks[1] is inf: attention needs finite inputs");
    let shape = CacheShape::new(1, 1, 8, 2, 2);
    let mut cache = KvCache::<f32>::new(shape).unwrap();
    let mut layer = cache.layer(0).unwrap();
    let kv = ndarray::Array3::<f32>::zeros((1, 3, 2));
    layer.append(kv.view(), kv.view()).unwrap();
    let q = ndarray::Array3::<f32>::zeros((2, 1, 2));
    let message = layer.attend_with(q.view(), &CacheOptions::new().sinks(&[0.0])).unwrap_err().to_string();
    assert!(message.contains("sinks") && message.contains("[1]") && message.contains("[2]"), "{message}");
}

/// The traces the lesson prints take the sink as `attention` does: a query's trace (its `sink`,
/// `max` and `sum` included) and its tiled online softmax, whose blocks are over the keys alone
/// and whose end takes the sink once, give the reference's row.
#[test]
fn the_traces_take_the_sink_once_at_the_end() {
    let p = Problem::<f64>::random(81, (9, 40, 8, 3), 1.0, MaskKind::CausalBottomRight);
    let sink = [1.5];
    let options = p.options().sinks(&sink);
    let want = qkv::reference::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    for i in [0, 4, 8] {
        let trace = qkv::trace_query(p.q.view(), p.k.view(), p.v.view(), i, &options).unwrap();
        let tiled = qkv::trace_tiled(p.q.view(), p.k.view(), p.v.view(), i, 16, &options).unwrap();
        assert_eq!(trace.sink, Some(1.5));
        let weights: f64 = trace.weights.iter().sum();
        let sink_weight = (1.5 - trace.max.unwrap()).exp() / trace.sum;
        assert!((weights + sink_weight - 1.0).abs() < 1e-12, "row {i}: the sink takes the rest");
        for c in 0..3 {
            assert!((trace.output[c] - want.output[[i, c]]).abs() < 1e-12, "trace_query row {i}");
            assert!((tiled.output[c] - want.output[[i, c]]).abs() < 1e-12, "trace_tiled row {i}");
        }
        assert!((trace.logsumexp() - want.logsumexp[i]).abs() < 1e-12, "trace_query lse row {i}");
        assert!((tiled.logsumexp - want.logsumexp[i]).abs() < 1e-12, "trace_tiled lse row {i}");
        // The blocks' parts are over the keys alone: merged, they are the row without the sink.
        let merged = tiled
            .blocks
            .iter()
            .skip(1)
            .fold(tiled.blocks[0].partial.clone(), |m, b| m.merge(&b.partial).unwrap());
        let without =
            qkv::reference::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &p.options()).unwrap();
        assert!((merged.logsumexp[0] - without.logsumexp[i]).abs() < 1e-12, "blocks row {i}");
    }
}
