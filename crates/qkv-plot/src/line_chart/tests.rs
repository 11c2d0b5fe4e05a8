//! Tests of the line chart's input checks and axes.

use super::*;

fn chart() -> LineChart {
    LineChart::new(vec![1.0, 2.0, 4.0], vec![Series::new("a", vec![1.0, 2.0, 3.0])])
}

fn check_err(spec: &LineChart, expected: PlotError) {
    assert_eq!(line_chart(spec, Size::default()), Err(expected));
}

#[test]
fn empty_data_are_rejected() {
    check_err(&LineChart::new(vec![], vec![]), PlotError::Empty { arg: "x" });
    check_err(&LineChart::new(vec![1.0], vec![]), PlotError::Empty { arg: "series" });
}

#[test]
fn series_of_another_length_name_both_sizes() {
    let mut spec = chart();
    spec.series.push(Series::new("b", vec![1.0, 2.0]));
    check_err(&spec, PlotError::LengthMismatch { arg: "series", len: 2, other: "x", expected: 3 });
    let err = line_chart(&spec, Size::default()).unwrap_err();
    assert_eq!(err.to_string(), "`series` has 2 entries but `x` needs 3");
}

#[test]
fn non_finite_values_are_rejected() {
    let mut spec = chart();
    spec.series[0].values[1] = f64::INFINITY;
    check_err(
        &spec,
        PlotError::NonFinite { arg: "series", at: "series 0 (a), index 1".to_owned(), value: f64::INFINITY },
    );
    let mut spec = chart();
    spec.x[2] = f64::NAN;
    assert!(matches!(line_chart(&spec, Size::default()), Err(PlotError::NonFinite { arg: "x", .. })));
}

#[test]
fn x_must_increase() {
    let mut spec = chart();
    spec.x = vec![1.0, 3.0, 2.0];
    check_err(&spec, PlotError::BadRange { arg: "x", lo: 3.0, hi: 2.0 });
}

#[test]
fn log_axes_need_positive_values() {
    let mut spec = chart();
    spec.y_scale = Scale::Log;
    spec.series[0].values[0] = 0.0;
    check_err(
        &spec,
        PlotError::NotPositive { arg: "series", at: "series 0 (a), index 0".to_owned(), value: 0.0 },
    );
    let mut spec = chart();
    spec.x_scale = Scale::Log;
    spec.x[0] = -1.0;
    check_err(&spec, PlotError::NotPositive { arg: "x", at: "index 0".to_owned(), value: -1.0 });
}

#[test]
fn secondary_series_are_checked_too() {
    let mut spec = chart();
    spec.secondary = Some(SecondaryAxis { title: "out".to_owned(), series: vec![], range: None });
    check_err(&spec, PlotError::Empty { arg: "secondary.series" });
    spec.secondary = Some(SecondaryAxis {
        title: "out".to_owned(),
        series: vec![Series::new("o", vec![0.0; 4])],
        range: None,
    });
    check_err(&spec, PlotError::LengthMismatch { arg: "secondary.series", len: 4, other: "x", expected: 3 });
}

#[test]
fn fixed_y_range_widens_to_fit_the_data() {
    let mut spec = chart();
    spec.y_range = Some((0.0, 1.0));
    let checked = Checked::new(&spec).unwrap();
    assert_eq!((checked.y_ticks.lo, checked.y_ticks.hi), (0.0, 3.0));
}

#[test]
fn x_axis_spans_the_data_and_the_marker() {
    let mut spec = chart();
    spec.marker = Some(VerticalMarker { x: 5.0, label: String::new() });
    let checked = Checked::new(&spec).unwrap();
    assert_eq!((checked.x_ticks.lo, checked.x_ticks.hi), (1.0, 5.0));
}

#[test]
fn dashes_follow_the_path() {
    // 7 on, 5 off along a straight line.
    let pieces = dashes(&[(0, 0), (24, 0)]);
    assert_eq!(pieces, vec![vec![(0, 0), (7, 0)], vec![(12, 0), (19, 0)]]);
    // A dash bends round a corner, and a last partial dash is kept.
    let pieces = dashes(&[(0, 0), (4, 0), (4, 10)]);
    assert_eq!(pieces, vec![vec![(0, 0), (4, 0), (4, 3)], vec![(4, 8), (4, 10)]]);
}

#[test]
fn explicit_x_ticks_are_kept_inside_the_data() {
    let mut spec = chart();
    spec.x_ticks = Some(vec![0.0, 1.0, 2.5, 4.0, 9.0]);
    let checked = Checked::new(&spec).unwrap();
    assert_eq!(checked.x_ticks.labels, ["1", "2.5", "4"]);
    spec.x_ticks = Some(vec![1.0, f64::INFINITY]);
    check_err(&spec, PlotError::NonFinite { arg: "x_ticks", at: "index 1".to_owned(), value: f64::INFINITY });
}

#[test]
fn a_single_point_still_gets_axes() {
    let spec = LineChart::new(vec![8.0], vec![Series::new("a", vec![0.5])]);
    let checked = Checked::new(&spec).unwrap();
    assert!(checked.x_ticks.lo < 8.0 && checked.x_ticks.hi > 8.0);
    assert!(line_chart(&spec, Size::default()).is_ok());
}
