//! Tests of the heatmap's input checks and layout choices.

use super::*;

fn labels(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("t{i}")).collect()
}

fn uniform(n_q: usize, n_k: usize) -> Heatmap {
    Heatmap::new(labels(n_q), labels(n_k), vec![vec![1.0 / n_k as f64; n_k]; n_q])
}

/// Renders `spec` and expects exactly `expected`.
fn check_err(spec: &Heatmap, expected: PlotError) {
    assert_eq!(heatmap(spec, Size::default()), Err(expected));
}

#[test]
fn ragged_weights_name_the_row() {
    let mut spec = uniform(3, 3);
    spec.weights[2].pop();
    check_err(&spec, PlotError::Ragged { arg: "weights", row: 2, len: 2, expected: 3 });
}

#[test]
fn empty_weights_are_rejected() {
    check_err(&Heatmap::new(vec![], vec![], vec![]), PlotError::Empty { arg: "weights" });
    check_err(&Heatmap::new(labels(1), vec![], vec![vec![]]), PlotError::Empty { arg: "weights" });
}

#[test]
fn label_counts_must_match_the_matrix() {
    let mut spec = uniform(3, 2);
    spec.row_labels.pop();
    check_err(&spec, PlotError::LengthMismatch { arg: "row_labels", len: 2, other: "weights", expected: 3 });
    let mut spec = uniform(3, 2);
    spec.col_labels.push("extra".to_owned());
    check_err(&spec, PlotError::LengthMismatch { arg: "col_labels", len: 3, other: "weights", expected: 2 });
}

#[test]
fn non_finite_weight_names_its_cell() {
    let mut spec = uniform(2, 2);
    spec.weights[1][0] = f64::NAN;
    let err = heatmap(&spec, Size::default()).unwrap_err();
    assert!(
        matches!(&err, PlotError::NonFinite { arg: "weights", at, value } if at == "row 1, column 0" && value.is_nan())
    );
    assert_eq!(err.to_string(), "`weights` has the non-finite value NaN at row 1, column 0");
}

#[test]
fn masked_cells_may_hold_any_value() {
    let mut spec = uniform(2, 2);
    spec.weights[0][1] = f64::NEG_INFINITY;
    spec.masked = Some(vec![vec![false, true], vec![false, false]]);
    assert!(heatmap(&spec, Size::default()).is_ok());
}

#[test]
fn mask_shape_must_match() {
    let mut spec = uniform(2, 3);
    spec.masked = Some(vec![vec![false; 3]]);
    check_err(&spec, PlotError::LengthMismatch { arg: "masked", len: 1, other: "weights", expected: 2 });
    spec.masked = Some(vec![vec![false; 3], vec![false; 2]]);
    check_err(&spec, PlotError::Ragged { arg: "masked", row: 1, len: 2, expected: 3 });
}

#[test]
fn highlighted_row_out_of_range() {
    let mut spec = uniform(3, 3);
    spec.highlight_row = Some(3);
    check_err(&spec, PlotError::OutOfRange { arg: "highlight_row", index: 3, len: 3 });
}

#[test]
fn bad_value_range_and_decimals() {
    let mut spec = uniform(2, 2);
    spec.value_range = Some((1.0, 0.0));
    check_err(&spec, PlotError::BadRange { arg: "value_range", lo: 1.0, hi: 0.0 });
    let mut spec = uniform(2, 2);
    spec.decimals = 40;
    check_err(&spec, PlotError::TooManyDecimals { decimals: 40, max: 8 });
}

#[test]
fn too_small_a_size_is_an_error() {
    let err = heatmap(&uniform(2, 2), Size::new(100, 80)).unwrap_err();
    assert!(matches!(err, PlotError::TooSmall { width: 100, height: 80, .. }));
}

#[test]
fn too_large_a_size_is_an_error() {
    let err = heatmap(&uniform(2, 2), Size::new(640, 100_000)).unwrap_err();
    assert_eq!(err, PlotError::TooLarge { width: 640, height: 100_000, max: Size::MAX_SIDE });
}

#[test]
fn small_matrices_are_annotated_and_large_ones_are_not() {
    let small = Checked::new(&uniform(3, 3)).map(|c| c.annotation_size(100));
    assert!(matches!(small, Ok(Some(size)) if size >= MIN_ANNOTATION));
    let large = Checked::new(&uniform(32, 32)).map(|c| c.annotation_size(13));
    assert_eq!(large, Ok(None));
}

#[test]
fn long_column_labels_turn_vertical_and_thin_out_when_cells_are_tiny() {
    let mut spec = uniform(32, 32);
    spec.col_labels = (0..32).map(|i| format!("token{i}")).collect();
    let checked = Checked::new(&spec).unwrap();
    let layout = checked.layout(640, 640, 40);
    assert!(layout.vertical_cols);
    assert_eq!(layout.col_every, 1, "32 labels fit at 640 px");
    let layout = checked.layout(320, 240, 40);
    assert!(layout.col_every > 1 && layout.row_every > 1, "labels thin out in a small figure");
}

#[test]
fn a_single_token_renders_on_the_unit_scale() {
    let spec = Heatmap::new(labels(1), labels(1), vec![vec![1.0]]);
    let checked = Checked::new(&spec).unwrap();
    assert_eq!((checked.lo, checked.hi), (0.0, 1.0));
    let figure = heatmap(&spec, Size::default()).unwrap();
    assert!(crate::figure::svg_texts(&figure.svg).contains(&"1.00"));
}

#[test]
fn long_labels_are_shortened_with_an_ellipsis() {
    let mut spec = uniform(2, 2);
    spec.row_labels[0] = "a".repeat(200);
    let figure = heatmap(&spec, Size::default()).unwrap();
    let texts = crate::figure::svg_texts(&figure.svg);
    let shown = texts.iter().find(|t| t.starts_with("aaa")).expect("the long label");
    assert!(shown.ends_with('…') && shown.len() < 200, "{shown}");
}

#[test]
fn labels_that_almost_fit_stay_horizontal_in_a_smaller_size() {
    let mut spec = uniform(1, 8);
    spec.col_labels =
        ["The", "attention", "layer", "compares", "every", "query", "with", "all"].map(String::from).to_vec();
    // 720 px: the widest label fits a column at the smaller size only (at 16 px labels, 660 px
    // turns them upright and 760 px fits them at full size).
    let layout = Checked::new(&spec).unwrap().layout(720, 480, 40);
    assert!(!layout.vertical_cols);
    assert!(layout.col_size < layout.label_size);
}

/// The course draws heatmaps 360 units wide, about as wide as they show on a 360 px phone: every
/// matrix whose cells hold a number at the least readable size prints its numbers, the course's
/// five-token examples included (they once lost them to a size cap proportional to the cell),
/// and a matrix whose cells cannot hold them prints none.
#[test]
fn numbers_are_printed_wherever_the_cells_hold_them() {
    let words = ["I", "love", "NLP", "so", "much", "more", "and", "then"];
    for n in 1..=8 {
        let mut spec = Heatmap::new(
            words[..n].iter().map(|w| w.to_string()).collect(),
            words[..n].iter().map(|w| w.to_string()).collect(),
            vec![vec![0.38; n]; n],
        );
        spec.title = "Attention weights".into();
        let checked = Checked::new(&spec).unwrap();
        let layout = checked.layout(360, 320, 40);
        let number = measure(&text(MIN_ANNOTATION, INK), "0.38");
        let holds = number.0 <= layout.cell - 6 && number.1 * 2 <= layout.cell;
        let size = checked.annotation_size(layout.cell);
        assert_eq!(size.is_some(), holds, "{n} tokens, cells of {}: {size:?}", layout.cell);
        if n <= 5 {
            assert!(holds, "{n} tokens at 360 units: cells of {} should hold 0.38 ({number:?})", layout.cell);
        }
    }
}
