//! Logit soft-capping (`cap · tanh(s / cap)` on the scaled scores, before bias, ALiBi and masks):
//! the reference against the formula written out, every dense path against the reference with
//! every mask kind at every SIMD level, and the errors (the backward's gradients through the cap
//! are `backward.rs`'s).

use ndarray::{Array2, Array4, array, s};
use qkv::{AdditiveBias, AttentionOptions, CausalMask, Real};

use crate::problem::{MASK_KINDS, Problem, assert_close, error_bound, levels};

/// The reference's soft-capped attention equals the formula computed here by hand, the bias added
/// after the cap: `softmax(cap · tanh(q·kᵀ · scale / cap) + bias) · v`.
#[test]
fn the_reference_caps_the_scaled_scores_before_adding_the_bias() {
    let q = array![[2.0_f64, -1.0], [0.5, 3.0]];
    let k = array![[1.0, 2.0], [-3.0, 0.5], [2.0, 2.0]];
    let v = array![[1.0, 0.0], [0.0, 1.0], [2.0, -1.0]];
    let bias = array![[0.0, 1.0, f64::NEG_INFINITY], [0.5, -0.5, 0.0]];
    let (scale, cap) = (0.8, 1.5);
    let options =
        AttentionOptions::new().scale(scale).logit_softcap(cap).bias(AdditiveBias::new(bias.view()));
    let got = qkv::reference::attention(q.view(), k.view(), v.view(), &options).unwrap();
    for i in 0..2 {
        let scores: Vec<f64> =
            (0..3).map(|j| cap * (q.row(i).dot(&k.row(j)) * scale / cap).tanh() + bias[[i, j]]).collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
        let sum: f64 = exps.iter().sum();
        for c in 0..2 {
            let want: f64 = (0..3).map(|j| exps[j] / sum * v[[j, c]]).sum();
            assert!(
                (got.output[[i, c]] - want).abs() < 1e-14,
                "row {i} column {c}: {} vs {want}",
                got.output[[i, c]]
            );
        }
        assert_eq!(got.scores[[i, 2]].is_finite(), bias[[i, 2]].is_finite(), "a hidden pair stays hidden");
    }
}

fn check<T: Real>(seed: u64, dims: (usize, usize, usize, usize)) {
    for mask in MASK_KINDS {
        // Inputs of magnitude 3: scaled scores well past the cap of 1.5, so capping changes them.
        let p = Problem::<T>::random(seed, dims, 3.0, mask);
        let options = p.options().logit_softcap(T::from_f64_round(1.5));
        let want = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        let want_lse =
            qkv::reference::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        let (weight_bound, output_bound) = error_bound(&want, &p.v);
        let ctx = format!("{} {dims:?} {mask:?} seed {seed}", T::NAME);
        let with = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        assert_close(&format!("weights {ctx}"), &with.weights, &want.weights, weight_bound);
        for level in levels() {
            let options = options.clone().simd(level);
            let out = qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
            assert_close(&format!("output {level} {ctx}"), &out, &want.output, output_bound);
            let mut into = Array2::from_elem(out.raw_dim(), T::nan());
            qkv::attention_into(p.q.view(), p.k.view(), p.v.view(), &options, into.view_mut()).unwrap();
            assert_close(&format!("into {level} {ctx}"), &into, &want.output, output_bound);
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
}

#[test]
fn every_dense_path_matches_the_reference_with_every_mask() {
    for (seed, dims) in
        [(1, (1, 1, 1, 1)), (2, (37, 200, 16, 24)), (3, (130, 129, 8, 5)), (4, (1, 1500, 64, 32))]
    {
        check::<f32>(seed, dims);
        check::<f64>(seed, dims);
    }
}

#[test]
fn multi_head_attention_caps_every_head() {
    let (batch, heads, kv_heads, n_q, n_k, d) = (2, 8, 2, 5, 70, 16);
    let tensor = |h: usize, n: usize, salt: usize| {
        Array4::from_shape_fn((batch, h, n, d), |(b, h, i, c)| {
            (((b * 7 + h * 5 + i * 3 + c + salt) % 13) as f32 - 6.0) / 2.0
        })
    };
    let (q, k, v) = (tensor(heads, n_q, 0), tensor(kv_heads, n_k, 1), tensor(kv_heads, n_k, 2));
    let slopes = qkv::alibi_slopes::<f32>(heads);
    for level in levels() {
        let options = AttentionOptions::new()
            .causal(CausalMask::BottomRight)
            .alibi(qkv::Alibi::new(&slopes))
            .logit_softcap(2.5)
            .simd(level);
        let got = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
        for b in 0..batch {
            for h in 0..heads {
                let head_options = AttentionOptions::new()
                    .causal(CausalMask::BottomRight)
                    .alibi(qkv::Alibi::new(&slopes[h..=h]))
                    .logit_softcap(2.5);
                let (qh, kh, vh) =
                    (q.slice(s![b, h, .., ..]), k.slice(s![b, h / 4, .., ..]), v.slice(s![b, h / 4, .., ..]));
                let want = qkv::reference::attention(qh, kh, vh, &head_options).unwrap();
                let (_, bound) = error_bound(&want, &vh.to_owned());
                let got_head = got.output.slice(s![b, h, .., ..]).to_owned();
                assert_close(&format!("{level} batch {b} head {h}"), &got_head, &want.output, bound);
            }
        }
    }
}

#[test]
fn a_cap_that_is_not_finite_and_positive_is_an_error() {
    let x = array![[1.0_f32, 0.0], [0.0, 1.0]];
    for cap in [0.0, -2.0, f32::NAN, f32::INFINITY] {
        let options = AttentionOptions::new().logit_softcap(cap);
        let err = qkv::attention(x.view(), x.view(), x.view(), &options).unwrap_err();
        assert!(matches!(err, qkv::AttentionError::InvalidSoftcap { .. }), "{err}");
        let message =
            format!("logit_softcap is {cap}: the cap must be finite and positive (Gemma 2 uses 50)");
        assert_eq!(err.to_string(), message);
        let forward =
            qkv::attention_with_lse(x.view(), x.view(), x.view(), &AttentionOptions::new()).unwrap();
        let err = qkv::attention_backward(x.view(), x.view(), x.view(), &forward, x.view(), &options);
        assert_eq!(err.unwrap_err().to_string(), message, "the backward checks the cap too");
    }
}

/// The traces the lesson prints cap as `attention` does: a query's trace and its tiled online
/// softmax end at the reference's row.
#[test]
fn the_traces_cap_as_attention_does() {
    let p = Problem::<f64>::random(7, (9, 40, 8, 3), 3.0, crate::problem::MaskKind::Alibi);
    let options = p.options().logit_softcap(1.5);
    let want = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    for i in [0, 4, 8] {
        let trace = qkv::trace_query(p.q.view(), p.k.view(), p.v.view(), i, &options).unwrap();
        let tiled = qkv::trace_tiled(p.q.view(), p.k.view(), p.v.view(), i, 16, &options).unwrap();
        for c in 0..3 {
            assert!((trace.output[c] - want.output[[i, c]]).abs() < 1e-12, "trace_query row {i}");
            assert!((tiled.output[c] - want.output[[i, c]]).abs() < 1e-12, "trace_tiled row {i}");
        }
        assert!(trace.scores.iter().all(|s| *s == f64::NEG_INFINITY || s.abs() <= 1.5 + 0.3 * 49.0));
    }
}
