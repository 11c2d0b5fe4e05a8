use super::*;

fn sample() -> Node {
    let tokens = ["I".to_string(), "love".to_string()];
    Node::Map(vec![
        ("values", Node::labelled(&tokens, [Node::vector(&[2.0]), Node::vector(&[6.0])])),
        ("sum", Node::Number(8.0)),
    ])
}

#[test]
fn paths_resolve_by_label_and_position() {
    let node = sample();
    assert_eq!(node.lookup(&["values", "love"]).ok().and_then(Node::as_number), Some(6.0));
    assert_eq!(node.lookup(&["values", "1"]).ok().and_then(Node::as_number), Some(2.0));
    assert_eq!(node.lookup(&["values"]).ok().and_then(Node::as_matrix), Some(vec![vec![2.0], vec![6.0]]));
}

#[test]
fn misses_name_the_segment_and_the_alternatives() {
    let miss = sample().lookup(&["values", "NLP"]).unwrap_err();
    assert_eq!(miss, Miss { segment: 1, known: vec!["I".into(), "love".into()] });
}

#[test]
fn a_record_is_named_never_numbered() {
    let record = Node::Record(vec![("output".into(), Node::Number(4.0)), ("love".into(), Node::Number(1.0))]);
    assert_eq!(record.lookup(&["output"]).ok().and_then(Node::as_number), Some(4.0));
    // Position 1 would be `output`: a record does not count.
    assert_eq!(
        record.lookup(&["1"]).unwrap_err(),
        Miss { segment: 0, known: vec!["output".into(), "love".into()] }
    );
}
