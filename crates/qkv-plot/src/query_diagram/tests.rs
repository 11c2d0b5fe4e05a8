//! Tests of the query diagram's input checks and label placement.

use super::*;

fn diagram() -> QueryDiagram {
    QueryDiagram::new(
        vec![Vector2::new("I", 1.0, 0.0), Vector2::new("love", 0.0, 1.0)],
        Vector2::new("query", 0.0, 1.0),
        vec![0.3, 0.7],
    )
}

fn check_err(spec: &QueryDiagram, expected: PlotError) {
    assert_eq!(query_diagram(spec, Size::square(480)), Err(expected));
}

#[test]
fn keys_and_weights_must_pair_up() {
    let mut spec = diagram();
    spec.weights.push(0.1);
    check_err(&spec, PlotError::LengthMismatch { arg: "weights", len: 3, other: "keys", expected: 2 });
    check_err(&QueryDiagram { keys: vec![], weights: vec![], ..diagram() }, PlotError::Empty { arg: "keys" });
}

#[test]
fn non_finite_coordinates_name_the_key() {
    let mut spec = diagram();
    spec.keys[1].y = f64::INFINITY;
    check_err(
        &spec,
        PlotError::NonFinite {
            arg: "keys",
            at: "key 1 (love), coordinate 1".to_owned(),
            value: f64::INFINITY,
        },
    );
    let mut spec = diagram();
    spec.query.x = f64::NEG_INFINITY;
    assert!(matches!(query_diagram(&spec, Size::default()), Err(PlotError::NonFinite { arg: "query", .. })));
}

#[test]
fn every_label_is_drawn_once_with_its_weight() {
    let figure = query_diagram(&diagram(), Size::square(480)).unwrap();
    let texts = crate::figure::svg_texts(&figure.svg);
    for label in ["I  w = 0.30", "love  w = 0.70", "query"] {
        assert_eq!(texts.iter().filter(|t| **t == label).count(), 1, "{label} in {texts:?}");
    }
}

#[test]
fn a_zero_vector_still_renders() {
    let mut spec = diagram();
    spec.query = Vector2::new("q", 0.0, 0.0);
    spec.unit_circle = false;
    assert!(query_diagram(&spec, Size::default()).is_ok());
}

#[test]
fn boxes_that_only_touch_do_not_overlap() {
    let a = Rect { x0: 0, y0: 0, x1: 10, y1: 10 };
    let b = Rect { x0: 9, y0: 9, x1: 20, y1: 20 };
    let c = Rect { x0: 10, y0: 0, x1: 20, y1: 10 };
    assert!(a.overlaps(&b));
    assert!(!a.overlaps(&c), "touching edges do not overlap");
}
