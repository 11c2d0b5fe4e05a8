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

/// Softmax of the scaled dot products of `query` with `keys`, as the course computes them.
fn weights(query: (f64, f64), keys: &[(f64, f64)]) -> Vec<f64> {
    let scores: Vec<f64> = keys.iter().map(|k| (query.0 * k.0 + query.1 * k.1) / 2f64.sqrt()).collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exp: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = exp.iter().sum();
    exp.iter().map(|e| e / sum).collect()
}

/// A diagram labelled the way the course labels its own.
fn course_like(names: &[&str], keys: &[(f64, f64)], query: &str, q: (f64, f64)) -> QueryDiagram {
    let vectors = names.iter().zip(keys).map(|(n, k)| Vector2::new(format!("k {n}"), k.0, k.1)).collect();
    let mut spec = QueryDiagram::new(vectors, Vector2::new(format!("q {query}"), q.0, q.1), weights(q, keys));
    spec.title = format!("Query “{query}” and the keys");
    spec
}

/// The course's three diagrams (sections 1, 5 and 6), then harder ones: a query on every key in
/// turn, three arrows on one tip, the third quadrant, a zero query, keys almost on one line.
fn cases() -> Vec<QueryDiagram> {
    let sentence = [(1.0, 0.0), (0.0, 1.0), (1.0, 1.0)];
    let words = ["I", "love", "NLP"];
    let row =
        [(1.0, 0.0), (0.0, -1.0), (2.0, 1.0), (0.5, 1.5), (0.0, 1.0), (-1.0, 0.0), (2.0, 2.0), (1.0, -1.0)];
    let row_words = ["flash", "attention", "reads", "long", "rows", "in", "small", "tiles"];
    vec![
        course_like(&words, &sentence, "love", (0.0, 1.0)),
        course_like(
            &["I", "love", "NLP", "so", "much"],
            &[(1.0, 0.0), (0.0, 1.0), (1.0, 1.0), (-1.0, 0.5), (1.0, -1.0)],
            "much",
            (1.0, 2.0),
        ),
        course_like(&row_words, &row, "next", (1.0, 1.0)),
        course_like(&words, &sentence, "I", (1.0, 0.0)),
        course_like(&words, &sentence, "NLP", (1.0, 1.0)),
        course_like(&["a", "b", "c"], &[(1.0, 1.0), (1.0, 1.0), (-1.0, 0.0)], "a", (1.0, 1.0)),
        course_like(&["west", "south", "sw"], &[(-1.0, 0.0), (0.0, -1.0), (-1.0, -1.0)], "sw", (-1.0, -1.0)),
        course_like(&words[..2], &sentence[..2], "zero", (0.0, 0.0)),
        course_like(&["one", "two", "three"], &[(1.0, 0.0), (0.95, 0.1), (0.9, 0.2)], "q", (1.0, 0.0)),
    ]
}

#[test]
fn labels_clear_each_other_and_every_arrowhead_and_sit_by_their_own_tip() {
    for side in [360, 640] {
        for spec in cases() {
            let name = &spec.query.label;
            let layout = Checked(&spec).layout(side, side, crate::theme::frame_top(&spec.title, side));
            let figure = Rect { x0: MARGIN, y0: 0, x1: side - MARGIN, y1: side };
            let mut labelled: Vec<usize> = layout.blocks.iter().flat_map(|b| b.arrows.clone()).collect();
            labelled.sort_unstable();
            assert_eq!(labelled, (0..=spec.keys.len()).collect::<Vec<_>>(), "{name}: one label per arrow");
            for (i, block) in layout.blocks.iter().enumerate() {
                let halo = block.rect.halo();
                assert!(halo.x0 >= figure.x0 && halo.x1 <= figure.x1, "{name}: block {i} leaves the figure");
                assert!(block.rect.y1 < layout.plot.y1, "{name}: block {i} covers the x axis's labels");
                for other in &layout.blocks[i + 1..] {
                    assert!(!halo.overlaps(&other.rect.halo()), "{name}: two labels overlap at {side} px");
                }
                for (a, arrow) in layout.arrows.iter().enumerate() {
                    let head: Vec<(f64, f64)> =
                        arrow.head.iter().map(|&(x, y)| (f64::from(x), f64::from(y))).collect();
                    assert!(
                        !halo.meets_polygon(&head),
                        "{name}: block {i} covers arrowhead {a} at {side} px"
                    );
                }
                let tip = layout.arrows[block.arrows[0]].tip;
                let tip = (f64::from(tip.0), f64::from(tip.1));
                let own = block.rect.distance_to(tip);
                assert!(own <= 20.0, "{name}: block {i} sits {own} px from its tip at {side} px");
                // Tips a few pixels apart (keys nearly equal) cannot each have a side to themselves.
                for arrow in &layout.arrows {
                    let other = (f64::from(arrow.tip.0), f64::from(arrow.tip.1));
                    if (other.0 - tip.0).hypot(other.1 - tip.1) >= 20.0 {
                        assert!(
                            block.rect.distance_to(other) > own,
                            "{name}: block {i} is nearer another tip"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_key_equal_to_the_query_shares_its_label_block() {
    let spec = &cases()[0];
    let layout = Checked(spec).layout(360, 360, crate::theme::frame_top(&spec.title, 360));
    let shared: Vec<&Vec<usize>> = layout.blocks.iter().map(|b| &b.arrows).filter(|a| a.len() > 1).collect();
    // Arrow 0 is the query "love", arrow 2 the key "love": both end at (0, 1).
    assert_eq!(shared, [&vec![0, 2]], "the query and the key love, stacked");
    assert_eq!(layout.blocks.len(), 3);
}

#[test]
fn segments_and_polygons_meet_boxes_where_they_cross() {
    let r = Rect { x0: 0, y0: 0, x1: 10, y1: 10 };
    assert!((r.clipped_length((-5.0, 5.0), (15.0, 5.0)) - 10.0).abs() < 1e-9);
    assert_eq!(r.clipped_length((-5.0, -5.0), (-1.0, 20.0)), 0.0);
    assert!(r.meets_polygon(&[(5.0, 5.0), (20.0, 20.0), (20.0, 5.0)]));
    // The box lies beside the triangle's long edge, inside the triangle's bounding box.
    assert!(!r.meets_polygon(&[(12.0, -10.0), (30.0, 30.0), (30.0, -10.0)]));
}
