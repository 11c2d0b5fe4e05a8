use super::*;
use crate::eval::array;
use crate::format::DEFAULT_DIGITS;

fn sentence() -> AttentionInputs {
    AttentionInputs {
        tokens: Some(vec!["I".into(), "love".into(), "NLP".into()]),
        query_tokens: None,
        queries: vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![1.0, 1.0]],
        keys: vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![1.0, 1.0]],
        values: vec![vec![2.0], vec![6.0], vec![4.0]],
        mask: None,
        limits: Default::default(),
        scale: None,
        projection: None,
    }
}

fn trace(inputs: &AttentionInputs, i: usize) -> qkv::QueryTrace {
    let (q, k, v) = (array(&inputs.queries), array(&inputs.keys), array(&inputs.values));
    let masks = inputs.masks();
    qkv::trace_query(q.view(), k.view(), v.view(), i, &inputs.options(&masks)).expect("valid example")
}

#[test]
fn love_query_worked_steps() {
    let inputs = sentence();
    insta::assert_snapshot!(attention_steps(&inputs, &trace(&inputs, 1), "love", DEFAULT_DIGITS));
}

#[test]
fn masked_love_query_worked_steps() {
    let inputs = AttentionInputs { mask: Some(crate::examples::Mask::Causal), ..sentence() };
    insta::assert_snapshot!(attention_steps(&inputs, &trace(&inputs, 1), "love", DEFAULT_DIGITS));
}

#[test]
fn rounded_terms_say_approx_and_exact_ones_say_equals() {
    let inputs = sentence();
    let steps = attention_steps(&inputs, &trace(&inputs, 1), "love", DEFAULT_DIGITS);
    assert!(steps.contains(r"0.3956 + 2.4067 + 1.6044$ $\approx 4.4067"), "{steps}");
    let masked = AttentionInputs { mask: Some(crate::examples::Mask::Causal), ..sentence() };
    let first = attention_steps(&masked, &trace(&masked, 0), "I", DEFAULT_DIGITS);
    assert!(first.contains(r"the output is its value: $\operatorname{output} = 2$"), "{first}");
}

#[test]
fn labels_are_escaped_for_tex() {
    assert_eq!(tex_label("a_b"), r"\text{a_b}");
    assert_eq!(tex_label("50%{x}"), r"\text{50}\%\{\text{x}\}");
    assert_eq!(tex_label("3"), "3");
}

#[test]
fn long_sums_are_several_pieces_of_math_so_that_lines_wrap() {
    let terms: Vec<String> = ["(1)(2)", "(1)(2)", "(1)(2)", "(1)(2)"].map(String::from).to_vec();
    assert_eq!(expanded("q \\cdot k", &terms), r"$q \cdot k = (1)(2) + (1)(2)$ $+ (1)(2) + (1)(2)$");
    let inputs = sentence();
    let steps = attention_steps(&inputs, &trace(&inputs, 1), "love", DEFAULT_DIGITS);
    let normalize = steps.lines().find(|l| l.contains("Normalize")).expect("a normalize step");
    assert_eq!(normalize.matches('$').count(), 8, "one piece per weight, and the divisor: {normalize}");
}
