//! Semantics at the edges: keys and values that no query sees may hold anything and are never
//! read, a non-finite one that is seen is an error naming it, and no keys at all is a fully
//! masked row.

use ndarray::{Array2, Array4, s};
use qkv::{AttentionOptions, CausalMask, KeyPadding, Real};

use crate::problem::{MASK_KINDS, MaskKind, Problem, assert_close, error_bound, levels};

/// Sizes around the block and SIMD widths, plus 1.
const SIZES: [usize; 9] = [1, 2, 15, 17, 64, 65, 129, 200, 300];

/// Fills every key and value row that no query sees (by the reference's scores) with NaN or
/// infinities, then checks every path against the reference on the clean inputs; then makes one
/// seen element NaN and checks that the error names it.
fn check_poisoned<T: Real>(seed: u64, dims: (usize, usize, usize, usize), mask: MaskKind) {
    let p = Problem::<T>::random(seed, dims, 1.0, mask);
    let options = p.options();
    let want = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    let (weight_bound, output_bound) = error_bound(&want, &p.v);
    let seen: Vec<bool> =
        want.scores.columns().into_iter().map(|c| c.iter().any(|s| *s != f64::NEG_INFINITY)).collect();
    let (mut k, mut v) = (p.k.clone(), p.v.clone());
    for (j, _) in seen.iter().enumerate().filter(|(_, seen)| !**seen) {
        k.row_mut(j).fill(T::nan());
        v.row_mut(j).fill(if j % 2 == 0 { T::infinity() } else { T::nan() });
    }
    let ctx = format!("{} {dims:?} {mask:?} seed {seed}", T::NAME);
    let reference = qkv::reference::attention(p.q.view(), k.view(), v.view(), &options).unwrap();
    assert_eq!(reference.output, want.output, "reference {ctx}");
    let with = qkv::attention_with_weights(p.q.view(), k.view(), v.view(), &options).unwrap();
    assert_close(&format!("with weights {ctx}"), &with.output, &want.output, output_bound);
    assert_close(&format!("weights {ctx}"), &with.weights, &want.weights, weight_bound);
    for level in levels() {
        let options = options.clone().simd(level);
        let mut out = Array2::from_elem((dims.0, dims.3), T::nan());
        qkv::attention_into(p.q.view(), k.view(), v.view(), &options, out.view_mut()).unwrap();
        assert_close(&format!("fast {level} {ctx}"), &out, &want.output, output_bound);
    }
    if let Some(j) = seen.iter().position(|s| *s) {
        let mut bad = p.v.clone();
        bad[[j, 0]] = T::nan();
        let err = qkv::attention(p.q.view(), p.k.view(), bad.view(), &options).unwrap_err();
        assert_eq!(err.to_string(), format!("values[{j}, 0] is NaN: attention needs finite inputs"), "{ctx}");
    }
}

#[test]
fn keys_and_values_no_query_sees_are_never_read() {
    for (i, &n_q) in SIZES.iter().enumerate() {
        for mask in MASK_KINDS {
            let n_k = SIZES[(i + 4) % SIZES.len()];
            let dims = (n_q, n_k, 1 + i % 9, 1 + (i * 7) % 5);
            check_poisoned::<f32>(i as u64, dims, mask);
            check_poisoned::<f64>(i as u64, dims, mask);
        }
    }
    // Decoding (which checks keys as it reads them) and many tiles skipped by a window.
    for mask in [MaskKind::KeyLength, MaskKind::PaddingBlocks, MaskKind::CausalWindow] {
        check_poisoned::<f32>(3, (1, 3000, 32, 16), mask);
        check_poisoned::<f32>(4, (600, 700, 64, 64), mask);
    }
}

#[test]
fn garbage_in_padded_sequences_of_a_batch_is_never_read() {
    // Per-sequence key lengths in multi-head attention, decoding and tiled: the padding of each
    // sequence holds NaN, and GQA stacks the heads that share a key/value head.
    let (batch, q_heads, kv_heads, d) = (2, 4, 2, 8); // two query heads per key/value head
    for (n_q, n_k) in [(1, 300), (70, 90)] {
        let q = Array4::from_shape_fn((batch, q_heads, n_q, d), |(b, h, i, c)| {
            ((b + h + i + c) % 5) as f32 / 5.0
        });
        let mut k = Array4::from_shape_fn((batch, kv_heads, n_k, d), |(b, h, j, c)| {
            ((b * h + j + c) % 7) as f32 / 7.0
        });
        let mut v = k.clone();
        let lengths = [n_k, n_k / 3];
        k.slice_mut(s![1, .., n_k / 3.., ..]).fill(f32::NAN);
        v.slice_mut(s![1, .., n_k / 3.., ..]).fill(f32::INFINITY);
        for level in levels() {
            let options = AttentionOptions::new().key_lengths(&lengths).simd(level);
            let out = qkv::multi_head_attention(q.view(), k.view(), v.view(), &options).unwrap();
            for (b, &length) in lengths.iter().enumerate() {
                for h in 0..q_heads {
                    let (kh, vh) = (k.slice(s![b, h / 2, ..length, ..]), v.slice(s![b, h / 2, ..length, ..]));
                    let want = qkv::reference::attention(
                        q.slice(s![b, h, .., ..]),
                        kh,
                        vh,
                        &AttentionOptions::new(),
                    )
                    .unwrap();
                    let ctx = format!("{level} {n_q}x{n_k} batch {b} head {h}");
                    assert_close(&ctx, &out.slice(s![b, h, .., ..]).to_owned(), &want.output, 10.0);
                }
            }
        }
        let mut seen = v.clone();
        seen[[1, 1, 0, 3]] = f32::NAN;
        let options = AttentionOptions::new().key_lengths(&lengths);
        let err = qkv::multi_head_attention(q.view(), k.view(), seen.view(), &options).unwrap_err();
        assert_eq!(err.to_string(), "values[1, 1, 0, 3] is NaN: attention needs finite inputs");
    }
}

#[test]
fn no_keys_is_a_fully_masked_row() {
    let q = Array2::from_elem((3, 4), 0.5_f32);
    let (k, v) = (Array2::<f32>::zeros((0, 4)), Array2::<f32>::zeros((0, 2)));
    let zeros = Array2::<f64>::zeros((3, 2));
    for options in [AttentionOptions::new(), AttentionOptions::new().causal(CausalMask::BottomRight)] {
        let want = qkv::reference::attention(q.view(), k.view(), v.view(), &options).unwrap();
        assert_eq!((want.output.clone(), want.weights.shape()), (zeros.clone(), &[3, 0][..]));
        let with = qkv::attention_with_weights(q.view(), k.view(), v.view(), &options).unwrap();
        assert_eq!((with.output, with.weights.shape()), (Array2::zeros((3, 2)), &[3, 0][..]));
        for level in levels() {
            let options = options.clone().simd(level);
            let mut out = Array2::from_elem((3, 2), f32::NAN);
            qkv::attention_into(q.view(), k.view(), v.view(), &options, out.view_mut()).unwrap();
            assert_eq!(out, Array2::zeros((3, 2)), "{level}");
            let r = qkv::attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
            assert!(r.logsumexp.iter().all(|l| *l == f32::NEG_INFINITY), "{level}: {}", r.logsumexp);
            for (q_heads, n_q) in [(4, 1), (2, 70)] {
                let q4 = Array4::from_elem((2, q_heads, n_q, 4), 0.5_f32);
                let kv = Array4::<f32>::zeros((2, 2, 0, 4));
                let r =
                    qkv::multi_head_attention_with_lse(q4.view(), kv.view(), kv.view(), &options).unwrap();
                assert!(r.output.iter().all(|o| *o == 0.0), "{level}");
                assert!(r.logsumexp.iter().all(|l| *l == f32::NEG_INFINITY), "{level}");
            }
        }
        let t = qkv::trace_query(q.view(), k.view(), v.view(), 1, &options).unwrap();
        assert_eq!((t.logsumexp(), t.max, t.sum, t.output), (f64::NEG_INFINITY, None, 0.0, vec![0.0, 0.0]));
    }
    // A padding over no keys is empty too.
    let padding = ndarray::Array1::<bool>::from_elem(0, true);
    let options = AttentionOptions::new().key_padding(KeyPadding::new(padding.view()));
    assert_eq!(qkv::attention(q.view(), k.view(), v.view(), &options).unwrap(), Array2::zeros((3, 2)));
}
