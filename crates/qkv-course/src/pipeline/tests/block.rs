//! The fixture's Transformer block against an independent computation: the attention by the
//! engine's fast multi-head path (not the reference the lesson prints), the layer norms with
//! ndarray's own mean and variance, the feed-forward layer as ndarray matrix products; and the
//! costs from the shapes.

use ndarray::{Array1, Array2, Array4, Axis, s};

use super::{EVERY_KIND, one_file, values_of};

/// Each row to mean 0 and variance 1, with ndarray's `mean_axis` and `var_axis` (ddof 0).
fn layer_norm(h: &Array2<f64>, eps: f64) -> Array2<f64> {
    let mean = h.mean_axis(Axis(1)).expect("rows").insert_axis(Axis(1));
    let std = h.var_axis(Axis(1), 0.0).mapv(|v| (v + eps).sqrt()).insert_axis(Axis(1));
    (h - &mean) / &std
}

fn m(rows: &[&[f64]]) -> Array2<f64> {
    Array2::from_shape_vec((rows.len(), rows[0].len()), rows.concat()).expect("rows of one width")
}

#[test]
fn a_block_equals_the_engine_s_attention_and_an_independent_norm_and_feed_forward() {
    let values = values_of(&one_file(EVERY_KIND));
    let get = |path: &str| *values.get(&format!("test.blk.{path}")).unwrap_or_else(|| panic!("no {path}"));
    let x = m(&[&[1., 0., 2., -1.], &[0., 1., -1., 0.], &[1., 1., 0.5, 0.]]);
    let w_q =
        [m(&[&[1., 0.], &[0., 1.], &[1., 0.], &[0., 1.]]), m(&[&[0., 1.], &[1., 0.], &[0., 0.], &[1., 1.]])];
    // One key/value head that both query heads share (GQA).
    let w_k = m(&[&[1., 0.], &[0., 1.], &[0., 0.], &[1., 1.]]);
    let w_v = m(&[&[1., 0.], &[0., 1.], &[1., 1.], &[0., 0.]]);
    let w_o = m(&[&[1., 0., 0., 0.5], &[0., 1., 0.5, 0.], &[0., 0., 1., 0.], &[-0.5, 0., 0., 1.]]);
    let w_1 = m(&[&[1., 0., -1.], &[0., 1., 0.], &[-1., 0., 1.], &[0.5, -1., 0.]]);
    let b_1 = Array1::from(vec![0., 0.5, -0.5]);
    let w_2 = m(&[&[0.5, 0., 0., -1.], &[0., 0.5, 1., 0.], &[-0.5, 0., 0.5, 0.]]);
    let b_2 = Array1::from(vec![0.25, 0., 0., -0.25]);
    let eps = 0.001;
    let attention = |h: &Array2<f64>| {
        let mut q = Array4::zeros((1, 2, 3, 2));
        for (i, w) in w_q.iter().enumerate() {
            q.slice_mut(s![0, i, .., ..]).assign(&h.dot(w));
        }
        let k = h.dot(&w_k).insert_axis(Axis(0)).insert_axis(Axis(0));
        let v = h.dot(&w_v).insert_axis(Axis(0)).insert_axis(Axis(0));
        let out = qkv::multi_head_attention(q.view(), k.view(), v.view(), &qkv::AttentionOptions::new())
            .expect("engine");
        let concat: Array2<f64> =
            ndarray::concatenate(Axis(1), &[out.slice(s![0, 0, .., ..]), out.slice(s![0, 1, .., ..])])
                .expect("heads side by side");
        concat.dot(&w_o)
    };
    let feed_forward = |h: &Array2<f64>| {
        let hidden = h.dot(&w_1) + &b_1;
        (hidden.clone(), hidden.mapv(|u| u.max(0.0)).dot(&w_2) + &b_2)
    };
    // Pre-norm: the stream is never normalised.
    let a = attention(&layer_norm(&x, eps));
    let h = &x + &a;
    let (hidden_pre, f) = feed_forward(&layer_norm(&h, eps));
    let pre = &h + &f;
    // Post-norm: a norm after each sum.
    let h_post = layer_norm(&(&x + &attention(&x)), eps);
    let (hidden_post, f_post) = feed_forward(&h_post);
    let post = layer_norm(&(&h_post + &f_post), eps);
    let close = |path: &str, expected: f64| {
        let ours = get(path);
        // The engine's fast path sums in another order than the reference.
        assert!((ours - expected).abs() < 1e-9, "{path}: {ours} vs {expected}");
    };
    for (i, token) in ["I", "love", "NLP"].iter().enumerate() {
        let var = x.row(i).var(0.0);
        close(&format!("pre.{token}.norm1.variance"), var);
        close(&format!("pre.{token}.norm1.std"), (var + eps).sqrt());
        for c in 0..4 {
            let col = c + 1;
            close(&format!("pre.{token}.attention.{col}"), a[[i, c]]);
            close(&format!("pre.{token}.residual1.{col}"), h[[i, c]]);
            close(&format!("pre.{token}.ffn.{col}"), f[[i, c]]);
            close(&format!("pre.{token}.output.{col}"), pre[[i, c]]);
            close(&format!("post.{token}.norm1.output.{col}"), h_post[[i, c]]);
            close(&format!("post.{token}.output.{col}"), post[[i, c]]);
        }
        for u in 0..3 {
            close(&format!("pre.{token}.hidden.{}", u + 1), hidden_pre[[i, u]]);
            close(&format!("pre.{token}.relu.{}", u + 1), hidden_pre[[i, u]].max(0.0));
            close(&format!("post.{token}.hidden.{}", u + 1), hidden_post[[i, u]]);
        }
        let length = pre.row(i).dot(&pre.row(i)).sqrt();
        close(&format!("pre.{token}.lengths.output"), length);
    }
    // Costs from the shapes: W_q twice, the shared W_k and W_v once, W_o; W_1, b_1, W_2, b_2;
    // a scale and a shift of 4 for each of the two norms.
    let (attention_params, ffn_params, norms) = (2. * 8. + 8. + 8. + 16., 12. + 3. + 12. + 4., 16.);
    assert_eq!(get("params.attention"), attention_params);
    assert_eq!(get("params.ffn"), ffn_params);
    assert_eq!(get("params.total"), attention_params + ffn_params + norms);
    // Two heads, each 2 n (d_k + d_v) over n = 3 keys, beside twice each matrix's weights.
    let scores = 2. * 2. * 3. * (2. + 2.);
    assert_eq!(get("flops.total"), 2. * attention_params + scores + 2. * 24.);
}
