//! Multi-head and grouped-query attention against the reference, head by head; self-attention
//! from embeddings against projecting by hand.

use ndarray::{Array2, Array4, s};
use qkv::half::bf16;
use qkv::{AttentionOptions, CausalMask, Projections};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{MASK_KINDS, MaskKind, Problem, assert_close, error_bound, levels};

fn random4(rng: &mut ChaCha8Rng, shape: (usize, usize, usize, usize)) -> Array4<f32> {
    Array4::from_shape_simple_fn(shape, || rng.random_range(-1.0..1.0))
}

#[test]
fn grouped_query_heads_read_their_shared_kv_head() {
    // The tiled path shares out the work items of every head together: one block per head, many
    // blocks per head (zig-zag pairs under the causal mask), and few rows whose keys are split.
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    for (n_q, n_k) in [(17, 23), (130, 141), (5, 2100)] {
        for (q_heads, kv_heads) in [(1, 1), (4, 4), (8, 2), (6, 1)] {
            let (batch, d_k, d_v) = (2, 8, 5);
            let q = random4(&mut rng, (batch, q_heads, n_q, d_k));
            let k = random4(&mut rng, (batch, kv_heads, n_k, d_k));
            let v = random4(&mut rng, (batch, kv_heads, n_k, d_v));
            for level in levels() {
                let opts = AttentionOptions::new().causal(CausalMask::BottomRight).simd(level);
                let out = qkv::multi_head_attention(q.view(), k.view(), v.view(), &opts).unwrap();
                assert_eq!(out.shape(), [batch, q_heads, n_q, d_v]);
                for b in 0..batch {
                    for h in 0..q_heads {
                        let kv = h / (q_heads / kv_heads);
                        let want = qkv::reference::attention(
                            q.slice(s![b, h, .., ..]),
                            k.slice(s![b, kv, .., ..]),
                            v.slice(s![b, kv, .., ..]),
                            &opts,
                        )
                        .unwrap();
                        let got = out.slice(s![b, h, .., ..]).to_owned();
                        let ctx =
                            format!("{level} {n_q}x{n_k} {q_heads}/{kv_heads} heads, batch {b} head {h}");
                        assert_close(&ctx, &got, &want.output, 4.0);
                    }
                }
            }
        }
    }
}

#[test]
fn self_attention_projects_then_attends() {
    let mut rng = ChaCha8Rng::seed_from_u64(5);
    let mut m = |r, c| Array2::from_shape_simple_fn((r, c), || rng.random_range(-1.0..1.0));
    let x: Array2<f64> = m(7, 6);
    let proj = Projections { w_q: m(6, 4), w_k: m(6, 4), w_v: m(6, 3), w_o: Some(m(3, 2)) };
    let got = proj.self_attention(x.view(), &AttentionOptions::new()).unwrap();
    let (q, k, v) = (x.dot(&proj.w_q), x.dot(&proj.w_k), x.dot(&proj.w_v));
    let want = qkv::reference::attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap();
    assert_close("self-attention", &got, &want.output.dot(proj.w_o.as_ref().unwrap()), 10.0);

    let bad = Projections { w_k: m(6, 3), ..proj };
    let err = bad.project(x.view()).unwrap_err().to_string();
    assert_eq!(
        err,
        "w_k has shape [6, 3] but must be [6, 4]: queries and keys meet in a dot product, so w_k needs as many columns as w_q"
    );
}

#[test]
fn cross_attention_projects_queries_and_keys_from_two_sequences() {
    let mut rng = ChaCha8Rng::seed_from_u64(6);
    let mut m = |r, c| Array2::from_shape_simple_fn((r, c), || rng.random_range(-1.0..1.0));
    // A decoder of width 4 reads an encoder of width 6: the projections' rows follow their side.
    let (decoder, encoder): (Array2<f64>, Array2<f64>) = (m(2, 4), m(5, 6));
    let proj = Projections { w_q: m(4, 3), w_k: m(6, 3), w_v: m(6, 2), w_o: None };
    let p = proj.project_cross(decoder.view(), encoder.view()).unwrap();
    assert_eq!(p.queries, decoder.dot(&proj.w_q));
    assert_eq!((p.keys.clone(), p.values.clone()), (encoder.dot(&proj.w_k), encoder.dot(&proj.w_v)));
    assert_eq!(p.queries.shape(), [2, 3]);
    assert_eq!(p.keys.shape(), [5, 3]);

    let err = proj.project_cross(encoder.view(), decoder.view()).unwrap_err().to_string();
    assert_eq!(
        err,
        "w_q has shape [4, 3] but must be [6, _]: it multiplies embeddings from the right, so its rows must match their width"
    );
    let mut bad = encoder.clone();
    bad[[1, 2]] = f64::NAN;
    let err = proj.project_cross(decoder.view(), bad.view()).unwrap_err().to_string();
    assert_eq!(err, "x_kv[1, 2] is NaN: attention needs finite inputs");
}

#[test]
fn decoding_stacks_the_heads_that_share_a_kv_head() {
    // A few queries per head and several query heads per key/value head: the heads of a group run
    // as the rows of one problem, and each row must still take its own query's masks.
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    for (q_heads, kv_heads, n_q, n_k) in
        [(8, 2, 1, 2500), (6, 3, 2, 130), (4, 1, 1, 1), (32, 8, 1, 300), (2, 2, 3, 70)]
    {
        let (batch, d_k, d_v) = (2, 16, 24);
        let q = random4(&mut rng, (batch, q_heads, n_q, d_k));
        let k = random4(&mut rng, (batch, kv_heads, n_k, d_k));
        let v = random4(&mut rng, (batch, kv_heads, n_k, d_v));
        // Key lengths and ALiBi slopes come one per sequence or head: `batched.rs` tests them.
        for mask in MASK_KINDS.into_iter().filter(|m| !matches!(m, MaskKind::KeyLength | MaskKind::Alibi)) {
            // Only the masks of this problem are used; its own inputs are one component wide.
            let masked = Problem::<f32>::random(13, (n_q, n_k, 1, 1), 1.0, mask);
            let options = masked.options();
            for level in levels() {
                let out =
                    qkv::multi_head_attention(q.view(), k.view(), v.view(), &options.clone().simd(level))
                        .unwrap();
                for b in 0..batch {
                    for h in 0..q_heads {
                        let kv = h / (q_heads / kv_heads);
                        let (qh, kh, vh) = (
                            q.slice(s![b, h, .., ..]),
                            k.slice(s![b, kv, .., ..]),
                            v.slice(s![b, kv, .., ..]),
                        );
                        let want = qkv::reference::attention(qh, kh, vh, &options).unwrap();
                        let (_, bound) = error_bound(&want, &vh.to_owned());
                        let ctx = format!(
                            "{level} {q_heads}/{kv_heads} heads, {n_q}x{n_k}, {mask:?}, batch {b} head {h}"
                        );
                        assert_close(&ctx, &out.slice(s![b, h, .., ..]).to_owned(), &want.output, bound);
                    }
                }
            }
        }
    }
}

/// Outputs the engine allocates are not zeroed first: every element must be written. This test
/// binary's allocator fills all memory it is not asked to zero with NaN (`allocations.rs`), so
/// an element left unwritten reads as NaN: each result is compared with the f64 reference and,
/// bit for bit, with the same call into a zeroed array. Shapes: one query (decoding), blocks of
/// one head shared out, whole heads, keys split, a row that sees no key, values large enough for
/// the blocked path, and bf16 inputs (the pair levels' tiles).
#[test]
fn outputs_the_engine_allocates_are_written_in_full() {
    let mut rng = ChaCha8Rng::seed_from_u64(23);
    for (n_q, n_k) in [(1, 9), (3, 40), (70, 33), (130, 141), (5, 2100)] {
        for (q_heads, kv_heads) in [(1, 1), (12, 4)] {
            let (batch, d_k, d_v) = (1, 8, 5);
            let q = random4(&mut rng, (batch, q_heads, n_q, d_k));
            let k = random4(&mut rng, (batch, kv_heads, n_k, d_k));
            let v = random4(&mut rng, (batch, kv_heads, n_k, d_v));
            // The last query sees no key: its row is written as zeros.
            let keep = Array2::from_shape_fn((n_q, n_k), |(i, j)| i + 1 < n_q && (i + j) % 3 != 0);
            for level in levels() {
                for options in [
                    AttentionOptions::new().simd(level),
                    AttentionOptions::new().causal(CausalMask::BottomRight).simd(level),
                    AttentionOptions::new().keep_mask(keep.view()).simd(level),
                ] {
                    let ctx = format!("{level} {n_q}x{n_k} {q_heads}/{kv_heads} heads");
                    let out = qkv::multi_head_attention(q.view(), k.view(), v.view(), &options).unwrap();
                    let mut held = Array4::zeros(out.raw_dim());
                    qkv::multi_head_attention_into(q.view(), k.view(), v.view(), &options, held.view_mut())
                        .unwrap();
                    assert_eq!(out, held, "{ctx}: into a zeroed array");
                    let with_lse =
                        qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
                    assert_eq!(with_lse.output, out, "{ctx}: with the logsumexp");
                    for h in 0..q_heads {
                        let kv = h / (q_heads / kv_heads);
                        let (q, k, v) = (
                            q.slice(s![0, h, .., ..]),
                            k.slice(s![0, kv, .., ..]),
                            v.slice(s![0, kv, .., ..]),
                        );
                        let want = qkv::reference::attention(q, k, v, &options).unwrap();
                        let got = out.slice(s![0, h, .., ..]).to_owned();
                        assert_close(&format!("{ctx}, head {h}"), &got, &want.output, 4.0);
                        let single = qkv::attention(q, k, v, &options).unwrap();
                        assert_close(&format!("{ctx}, head {h} alone"), &single, &want.output, 4.0);
                        let single = qkv::attention_with_lse(q, k, v, &options).unwrap();
                        assert_eq!(single.output, qkv::attention(q, k, v, &options).unwrap(), "{ctx}: lse");
                    }
                    // Values whose unnormalised sums could overflow: the blocked path.
                    let huge = v.mapv(|x| x * 1e36);
                    let out = qkv::multi_head_attention(q.view(), k.view(), huge.view(), &options).unwrap();
                    let mut held = Array4::zeros(out.raw_dim());
                    qkv::multi_head_attention_into(
                        q.view(),
                        k.view(),
                        huge.view(),
                        &options,
                        held.view_mut(),
                    )
                    .unwrap();
                    assert_eq!(out, held, "{ctx}: huge values, into a zeroed array");
                    assert!(out.iter().all(|x| x.is_finite()), "{ctx}: huge values");
                    // bf16 inputs, f32 output.
                    let narrow = |x: &Array4<f32>| x.slice(s![0, 0, .., ..]).mapv(bf16::from_f32);
                    let (q, k, v) = (narrow(&q), narrow(&k), narrow(&v));
                    let out = qkv::attention_half(q.view(), k.view(), v.view(), &options).unwrap();
                    let mut held = Array2::<f32>::zeros(out.raw_dim());
                    qkv::attention_half_into(q.view(), k.view(), v.view(), &options, held.view_mut())
                        .unwrap();
                    assert_eq!(out, held, "{ctx}: bf16 inputs, into a zeroed array");
                }
            }
        }
    }
}

#[test]
fn decoding_reads_values_in_any_layout_as_it_reads_them_side_by_side() {
    // A decoding step reads a head's value rows in place from the caller's tensor when it is one
    // slice: token-major (flash-attn's), rows in reverse (a negative stride), values broadcast
    // over the keys (a zero stride) and values one wide must all give the bits of the same
    // values side by side, and never panic. Keys token-major too put a batch element's key/value
    // heads side by side, and its heads take their key tiles in turn (over 8200 keys in 8 splits
    // each, 16 work items, enough for up to 4 threads): the bits of each head alone.
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let token_major =
        |x: &Array4<f32>| x.view().permuted_axes([0, 2, 1, 3]).as_standard_layout().into_owned();
    for level in levels() {
        let options = AttentionOptions::new().simd(level);
        for (n_k, d_v) in [(1, 64), (37, 64), (300, 16), (513, 80), (9, 1), (8200, 24)] {
            let q = random4(&mut rng, (2, 8, 1, 64));
            let k = random4(&mut rng, (2, 2, n_k, 64));
            let v = random4(&mut rng, (2, 2, n_k, d_v));
            let want = qkv::multi_head_attention(q.view(), k.view(), v.view(), &options).unwrap();
            let ctx = format!("{level} n_k {n_k} d_v {d_v}");
            // Token-major: each head's rows `2 · d_v` apart in one slice.
            let (k_tokens, v_tokens) = (token_major(&k), token_major(&v));
            let (k_tokens, v_tokens) =
                (k_tokens.view().permuted_axes([0, 2, 1, 3]), v_tokens.view().permuted_axes([0, 2, 1, 3]));
            let got = qkv::multi_head_attention(q.view(), k.view(), v_tokens, &options).unwrap();
            assert_eq!(got, want, "{ctx}: token-major values");
            let got = qkv::multi_head_attention(q.view(), k_tokens, v_tokens, &options).unwrap();
            assert_eq!(got, want, "{ctx}: token-major keys and values");
            // Rows in reverse, and keys in reverse to match: the same set of (key, value) pairs.
            let (k_rev, v_rev) = (k.slice(s![.., .., ..;-1, ..]), v.slice(s![.., .., ..;-1, ..]));
            let got = qkv::multi_head_attention(q.view(), k_rev, v_rev, &options).unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{ctx}: reversed rows, {g} against {w}");
            }
            // One value row broadcast over every key (a stride of 0): the output is that row.
            let first_row = v.slice(s![.., .., 0..1, ..]);
            let broadcast = first_row.broadcast((2, 2, n_k, d_v)).unwrap();
            let got = qkv::multi_head_attention(q.view(), k.view(), broadcast, &options).unwrap();
            for ((b, h, _, c), &g) in got.indexed_iter() {
                let w = v[[b, h / 4, 0, c]];
                assert!((g - w).abs() <= 1e-5 * (1.0 + w.abs()), "{ctx}: broadcast values");
            }
        }
    }
}
