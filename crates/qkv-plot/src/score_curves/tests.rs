//! Tests of the score curves' input checks and their mapping to a line chart.

use super::*;

fn curves() -> ScoreCurves {
    ScoreCurves::new(
        vec![0.0, 1.0, 2.0],
        vec![Series::new("I", vec![0.2, 0.3, 0.4]), Series::new("love", vec![0.8, 0.7, 0.6])],
        vec![Series::new("output", vec![1.0, 0.5, 0.0])],
    )
}

#[test]
fn errors_name_the_score_curve_fields() {
    let mut spec = curves();
    spec.weights[1].values.pop();
    assert_eq!(
        score_curves(&spec, Size::default()),
        Err(PlotError::LengthMismatch { arg: "weights", len: 2, other: "x", expected: 3 })
    );
    let mut spec = curves();
    spec.outputs[0].values[2] = f64::NAN;
    assert!(matches!(score_curves(&spec, Size::default()), Err(PlotError::NonFinite { arg: "outputs", .. })));
    let mut spec = curves();
    spec.weights.clear();
    assert_eq!(score_curves(&spec, Size::default()), Err(PlotError::Empty { arg: "weights" }));
}

#[test]
fn weights_sit_on_a_unit_axis_and_outputs_on_the_right() {
    let chart = to_line_chart(&curves());
    assert_eq!(chart.y_range, Some((0.0, 1.0)));
    assert_eq!(chart.secondary.as_ref().map(|s| s.series.len()), Some(1));
    let no_output = to_line_chart(&ScoreCurves { outputs: vec![], ..curves() });
    assert!(no_output.secondary.is_none());
}
