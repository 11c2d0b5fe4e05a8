//! Bad input is a typed error whose message names the argument and the shapes.

use ndarray::{Array2, Array4, array};
use qkv::{AdditiveBias, Alibi, AttentionError, AttentionOptions, KeepMask, KeyPadding};

fn check(err: AttentionError, expected: &str) {
    assert_eq!(err.to_string(), expected);
}

#[test]
fn scoring_against_values_is_the_common_trap() {
    // The lesson's trap: values (width 1) passed where keys (width 2) belong.
    let q = array![[0.0, 1.0]];
    let v = array![[2.0], [6.0], [4.0]];
    let err = qkv::attention(q.view(), v.view(), v.view(), &AttentionOptions::new()).unwrap_err();
    check(
        err,
        "keys have width 1 but queries have width 2: each key is compared with a query by a dot product, \
         so both need the same width (queries [1, 2], keys [3, 1])",
    );
}

#[test]
fn shape_errors_name_both_shapes() {
    let q = array![[1.0_f32, 0.0]];
    let k = array![[1.0_f32, 0.0], [0.0, 1.0]];
    let v = array![[1.0_f32], [2.0], [3.0]];
    let o = AttentionOptions::new();
    check(
        qkv::attention(q.view(), k.view(), v.view(), &o).unwrap_err(),
        "values have 3 rows but keys have 2: every key needs exactly one value to hand over (keys [2, 2], values [3, 1])",
    );
    let mask = Array2::from_elem((2, 3), true);
    let masked = AttentionOptions::new().keep_mask(KeepMask::new(mask.view()));
    check(
        qkv::attention(q.view(), k.view(), v.slice(ndarray::s![..2, ..]), &masked).unwrap_err(),
        "keep_mask has shape [2, 3] but the scores it applies to have shape [1, 2] (n_q = 1, n_k = 2)",
    );
}

#[test]
fn non_finite_inputs_are_named_by_index() {
    let q = array![[1.0, 0.0], [0.0, f64::NAN]];
    let k = array![[1.0, 0.0]];
    let v = array![[1.0]];
    check(
        qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap_err(),
        "queries[1, 1] is NaN: attention needs finite inputs",
    );
    check(
        qkv::attention(k.view(), k.view(), v.view(), &AttentionOptions::new().scale(f64::INFINITY))
            .unwrap_err(),
        "scale is inf: the score multiplier must be finite",
    );
}

#[test]
fn f32_overflow_in_the_dot_product_is_an_error() {
    let q = array![[1e30_f32, 1e30]];
    let v = array![[1.0_f32]];
    let err = qkv::attention(q.view(), q.view(), v.view(), &AttentionOptions::new()).unwrap_err();
    assert!(matches!(err, AttentionError::ScoreOverflow { query_idx: 0, head: None, ty: "f32" }), "{err}");
}

#[test]
fn multi_head_errors() {
    let q = Array4::<f32>::zeros((2, 3, 4, 8));
    let k = Array4::<f32>::zeros((2, 2, 5, 8));
    let v = Array4::<f32>::zeros((2, 2, 5, 8));
    check(
        qkv::multi_head_attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap_err(),
        "3 query heads cannot share 2 key/value heads: the number of query heads must be a positive multiple of the number of key/value heads",
    );
    let k1 = Array4::<f32>::zeros((1, 1, 5, 8));
    check(
        qkv::multi_head_attention(q.view(), k1.view(), v.view(), &AttentionOptions::new()).unwrap_err(),
        "keys has shape [1, 1, 5, 8] but must agree with queries [2, 3, 4, 8] on the batch axis",
    );
    let k7 = Array4::<f32>::zeros((2, 1, 5, 7));
    let v7 = Array4::<f32>::zeros((2, 1, 5, 8));
    check(
        qkv::multi_head_attention(q.view(), k7.view(), v7.view(), &AttentionOptions::new()).unwrap_err(),
        "keys have width 7 but queries have width 8: each key is compared with a query by a dot product, so both need the same width (queries [2, 3, 4, 8], keys [2, 1, 5, 7])",
    );
}

#[test]
fn trace_and_slices_report_their_argument() {
    let k = array![[1.0, 0.0]];
    let v = array![[1.0]];
    check(
        qkv::trace_query(k.view(), k.view(), v.view(), 3, &AttentionOptions::new()).unwrap_err(),
        "query_idx 3 is out of range for 1 query",
    );
    check(
        qkv::trace_tiled(k.view(), k.view(), v.view(), 0, 0, &AttentionOptions::new()).unwrap_err(),
        "block is 0: the tiled trace takes the keys in blocks of at least one key",
    );
    check(
        qkv::trace_tiled(k.view(), k.view(), v.view(), 1, 4, &AttentionOptions::new()).unwrap_err(),
        "query_idx 1 is out of range for 1 query",
    );
    check(
        qkv::matrix("keys", &[1.0, 2.0, 3.0], 2, 2).unwrap_err(),
        "keys has 3 elements but a 2 × 2 matrix needs 4",
    );
}

#[test]
fn decoding_names_a_non_finite_key_or_value_it_read() {
    // Decoding checks its keys and values as it reads them rather than beforehand; a bad element
    // must still be named by its index, and a huge one must still reach the checked path.
    let n_k = 3000;
    let k = Array2::from_shape_fn((n_k, 8), |(i, j)| ((i + j) % 7) as f32 / 7.0);
    let v = Array2::from_shape_fn((n_k, 4), |(i, j)| ((i * j) % 5) as f32 / 5.0);
    let q = Array2::from_elem((1, 8), 0.5_f32);
    let o = AttentionOptions::new();
    let mut bad_k = k.clone();
    bad_k[[2900, 3]] = f32::NAN;
    check(
        qkv::attention(q.view(), bad_k.view(), v.view(), &o).unwrap_err(),
        "keys[2900, 3] is NaN: attention needs finite inputs",
    );
    let mut bad_v = v.clone();
    bad_v[[17, 2]] = f32::NEG_INFINITY;
    let mut out = Array2::zeros((1, 4));
    check(
        qkv::attention_into(q.view(), k.view(), bad_v.view(), &o, out.view_mut()).unwrap_err(),
        "values[17, 2] is -inf: attention needs finite inputs",
    );
    // The same through the stacked heads of a grouped-query decoding step.
    let q4 = Array4::from_elem((2, 4, 1, 8), 0.5_f32);
    let k4 = Array4::from_shape_fn((2, 2, n_k, 8), |(_, _, i, j)| k[[i, j]]);
    let mut v4 = Array4::from_shape_fn((2, 2, n_k, 4), |(_, _, i, j)| v[[i, j]]);
    v4[[1, 1, 2999, 0]] = f32::INFINITY;
    check(
        qkv::multi_head_attention(q4.view(), k4.view(), v4.view(), &o).unwrap_err(),
        "values[1, 1, 2999, 0] is inf: attention needs finite inputs",
    );
    // Keys large enough that a score could overflow f32: the result comes from the checked path.
    let huge = k.mapv(|x| x * 1e37);
    let err = qkv::attention((q * 100.0).view(), huge.view(), v.view(), &o).unwrap_err();
    assert!(matches!(err, AttentionError::ScoreOverflow { query_idx: 0, head: None, ty: "f32" }), "{err}");
}

#[test]
fn multi_head_errors_name_the_batch_element_and_head() {
    // Only batch 1, head 3 has inputs whose dot product overflows f32.
    let mut q = Array4::<f32>::zeros((2, 4, 3, 2));
    q[[1, 3, 2, 0]] = 1e30;
    let mut k = Array4::<f32>::zeros((2, 4, 5, 2));
    k.slice_mut(ndarray::s![1, 3, .., 0]).fill(1e30);
    let v = Array4::<f32>::zeros((2, 4, 5, 1));
    check(
        qkv::multi_head_attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap_err(),
        "the scaled score of query 2 in batch 1, head 3 overflowed f32: its inputs and the scale are finite but \
         their scaled dot product is too large for it; compute in f64, or scale the inputs (or the scale) down",
    );
}

#[test]
fn batched_mask_shapes_say_which_shapes_fit() {
    let q = Array4::<f32>::zeros((2, 8, 4, 16));
    let kv = Array4::<f32>::zeros((2, 2, 6, 16));
    let run = |options: &AttentionOptions<f32>| {
        qkv::multi_head_attention(q.view(), kv.view(), kv.view(), options).unwrap_err().to_string()
    };
    let padding = Array2::from_elem((3, 6), true);
    assert_eq!(
        run(&AttentionOptions::new().key_padding(KeyPadding::batched(padding.view()))),
        "key_padding has shape [3, 6] but the scores it applies to have shape [2, 8, 4, 6] (shared [6] or per \
         sequence [2, 6])"
    );
    let keep = Array4::from_elem((2, 4, 4, 6), true);
    assert_eq!(
        run(&AttentionOptions::new().keep_mask(KeepMask::batched(keep.view()))),
        "keep_mask has shape [2, 4, 4, 6] but the scores it applies to have shape [2, 8, 4, 6] (shared [4, 6], \
         per sequence [2, 1, 4, 6] or per head [2, 8, 4, 6])"
    );
    let bias = Array4::from_elem((1, 8, 4, 6), 0.0_f32);
    let mut nan = bias.clone();
    nan[[0, 5, 3, 1]] = f32::NAN;
    assert_eq!(
        run(&AttentionOptions::new().bias(AdditiveBias::batched(nan.view()))),
        "bias[0, 5, 3, 1] is NaN: attention needs finite inputs"
    );
    assert_eq!(
        run(&AttentionOptions::new().key_lengths(&[6])),
        "key_lengths has shape [1] but the scores it applies to have shape [2, 8, 4, 6] (one length per sequence: [2])"
    );
    assert_eq!(
        run(&AttentionOptions::new().key_lengths(&[6, 7])),
        "key_lengths[1] is 7 but there are 6 keys"
    );
    let slopes = qkv::alibi_slopes::<f32>(4);
    assert_eq!(
        run(&AttentionOptions::new().alibi(Alibi::new(&slopes))),
        "alibi slopes has shape [4] but the scores it applies to have shape [2, 8, 4, 6] (one slope per query head: [8])"
    );
    // The same padding mistake in a single-head call names the [n_q, n_k] scores.
    let (q2, kv2) = (Array2::<f32>::zeros((4, 16)), Array2::<f32>::zeros((6, 16)));
    let padding = ndarray::Array1::from_elem(5, true);
    let options = AttentionOptions::new().key_padding(KeyPadding::new(padding.view()));
    check(
        qkv::attention(q2.view(), kv2.view(), kv2.view(), &options).unwrap_err(),
        "key_padding has shape [5] but the scores it applies to have shape [4, 6] (n_k = 6)",
    );
}

#[test]
fn slices_must_fit_their_shape_exactly() {
    check(
        qkv::tensor("q", &[0.0_f32; 10], [1, 2, 2, 2]).unwrap_err(),
        "q has 10 elements but a 1 × 2 × 2 × 2 tensor needs 8",
    );
    let mut out = [0.0_f32; 5];
    check(
        qkv::matrix_mut("out", &mut out, 2, 3).unwrap_err(),
        "out has 5 elements but a 2 × 3 matrix needs 6",
    );
}

#[test]
fn score_overflow_names_the_first_query_whatever_the_threads() {
    // Every query from 63 on overflows f32 (blocks of 64 on the blocked path, run in parallel):
    // the error names query 63 on every call, not whichever block failed first.
    let n = 400;
    let q = Array2::from_shape_fn((n, 8), |(i, _)| if i >= 63 { 1e30_f32 } else { 0.5 });
    let v = Array2::from_elem((n, 4), 1.0_f32);
    for threads in [2, 3] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for call in 0..30 {
            let err = pool
                .install(|| qkv::attention(q.view(), q.view(), v.view(), &AttentionOptions::new()))
                .unwrap_err();
            assert!(
                matches!(err, AttentionError::ScoreOverflow { query_idx: 63, head: None, ty: "f32" }),
                "{threads} threads, call {call}: {err}"
            );
        }
    }
}

#[test]
fn a_window_aligned_unlike_the_causal_mask_is_refused() {
    use qkv::{CausalMask, SlidingWindow};
    // Two queries over five keys: a top-left causal mask with a window placed bottom-right would
    // leave the first query no key at all, silently.
    let q = Array2::<f32>::ones((2, 3));
    let k = Array2::<f32>::ones((5, 3));
    let v = Array2::<f32>::ones((5, 1));
    let window = SlidingWindow::new(1, 0);
    let mixed = AttentionOptions::new().causal(CausalMask::TopLeft).sliding_window(window);
    check(
        qkv::attention(q.view(), k.view(), v.view(), &mixed).unwrap_err(),
        "the causal mask is TopLeft but the sliding window is BottomRight-aligned: the two would put each query at \
         two different key positions (with more keys than queries a window can hide every key the causal mask \
         leaves a row); align them alike, as `SlidingWindow::new(before, after).aligned(CausalMask::TopLeft)`",
    );
    let q4 = q.clone().into_shape_with_order((1, 1, 2, 3)).unwrap();
    let (k4, v4) = (
        k.clone().into_shape_with_order((1, 1, 5, 3)).unwrap(),
        v.clone().into_shape_with_order((1, 1, 5, 1)).unwrap(),
    );
    assert!(qkv::multi_head_attention(q4.view(), k4.view(), v4.view(), &mixed).is_err(), "multi-head too");
    for align in [CausalMask::TopLeft, CausalMask::BottomRight] {
        let alike = AttentionOptions::new().causal(align).sliding_window(window.aligned(align));
        let out = qkv::attention(q.view(), k.view(), v.view(), &alike).unwrap();
        assert!(out.iter().all(|x| (x - 1.0).abs() < 1e-6), "{align:?}: every row sees a key");
    }
}
