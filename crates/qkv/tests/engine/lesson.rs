//! The lesson's own numbers: "I love NLP" with keys I=(1,0), love=(0,1), NLP=(1,1), values 2, 6, 4.

use ndarray::{Array2, array};
use qkv::{AttentionOptions, CausalMask};

fn keys() -> Array2<f64> {
    array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]
}

fn values() -> Array2<f64> {
    array![[2.0], [6.0], [4.0]]
}

/// The lesson prints four decimals.
fn round4(xs: &[f64]) -> Vec<String> {
    xs.iter().map(|x| format!("{x:.4}")).collect()
}

#[test]
fn love_query_worked_steps() {
    let q = array![[0.0, 1.0]];
    let t = qkv::trace_query(q.view(), keys().view(), values().view(), 0, &AttentionOptions::new()).unwrap();
    assert_eq!(t.dot_products, vec![0.0, 1.0, 1.0]);
    assert_eq!(round4(&t.scores), vec!["0.0000", "0.7071", "0.7071"]);
    assert_eq!(round4(&[t.max.unwrap()]), vec!["0.7071"]);
    assert_eq!(round4(&t.shifted), vec!["-0.7071", "0.0000", "0.0000"]);
    assert_eq!(round4(&t.exponentials), vec!["0.4931", "1.0000", "1.0000"]);
    assert_eq!(round4(&[t.sum]), vec!["2.4931"]);
    assert_eq!(round4(&t.weights), vec!["0.1978", "0.4011", "0.4011"]);
    assert_eq!(round4(&t.output), vec!["4.4067"]);
}

#[test]
fn i_query_output() {
    let q = array![[1.0_f32, 0.0]];
    let (k, v) = (keys().mapv(|x| x as f32), values().mapv(|x| x as f32));
    let out = qkv::attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap();
    assert!((out[[0, 0]] - 3.5933).abs() < 1e-4, "{}", out[[0, 0]]);
}

#[test]
fn self_attention_matrix_rows() {
    let k = keys();
    let r =
        qkv::attention_with_weights(k.view(), k.view(), values().view(), &AttentionOptions::new()).unwrap();
    let rows: Vec<Vec<String>> = r.weights.rows().into_iter().map(|w| round4(&w.to_vec())).collect();
    assert_eq!(rows[0], vec!["0.4011", "0.1978", "0.4011"]);
    assert_eq!(rows[1], vec!["0.1978", "0.4011", "0.4011"]);
    // Causal: "I" sees only itself; "love" sees I and love equally (scores 0 and 0.7071).
    let causal = AttentionOptions::new().causal(CausalMask::BottomRight);
    let c = qkv::attention_with_weights(k.view(), k.view(), values().view(), &causal).unwrap();
    assert_eq!(c.weights.row(0).to_vec(), vec![1.0, 0.0, 0.0]);
    assert_eq!(c.scores[[0, 1]], f64::NEG_INFINITY);
}
