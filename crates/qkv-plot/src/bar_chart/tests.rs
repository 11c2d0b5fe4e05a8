//! Tests of the bar chart's input checks and of what it draws.

use super::*;
use crate::figure::svg_texts;

fn chart() -> BarChart {
    BarChart {
        title: "Throughput".to_owned(),
        value_title: "GFLOP/s".to_owned(),
        categories: vec!["n=256".to_owned(), "n=4096".to_owned()],
        series: vec![
            BarSeries { label: "qkv".to_owned(), values: vec![Some(80.0), Some(120.0)] },
            BarSeries { label: "torch".to_owned(), values: vec![Some(60.0), None] },
        ],
        references: vec![ReferenceLine { label: "GEMM ceiling".to_owned(), value: 130.0 }],
    }
}

fn check_err(spec: &BarChart, expected: PlotError) {
    assert_eq!(bar_chart(spec, Size::default()), Err(expected));
}

#[test]
fn empty_data_are_rejected() {
    let mut spec = chart();
    spec.categories.clear();
    check_err(&spec, PlotError::Empty { arg: "categories" });
    let mut spec = chart();
    spec.series.clear();
    check_err(&spec, PlotError::Empty { arg: "series" });
    // A series that measured nothing would be a legend entry without a bar.
    let mut spec = chart();
    spec.series[1].values = vec![None, None];
    check_err(&spec, PlotError::Empty { arg: "series" });
}

#[test]
fn bad_values_name_their_series_and_category() {
    let mut spec = chart();
    spec.series[1].values.push(Some(1.0));
    check_err(&spec, PlotError::LengthMismatch { arg: "series", len: 3, other: "categories", expected: 2 });
    let mut spec = chart();
    spec.series[0].values[1] = Some(f64::NAN);
    assert!(matches!(
        bar_chart(&spec, Size::default()),
        Err(PlotError::NonFinite { arg: "series", at, .. }) if at == "series 0 (qkv), category 1"
    ));
    let mut spec = chart();
    spec.series[1].values[0] = Some(-2.0);
    let err = bar_chart(&spec, Size::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`series` has -2 at series 1 (torch), category 0, but a bar needs a value of 0 or more"
    );
    let mut spec = chart();
    spec.references[0].value = -1.0;
    check_err(
        &spec,
        PlotError::Negative { arg: "references", at: "reference 0 (GEMM ceiling)".to_owned(), value: -1.0 },
    );
}

#[test]
fn the_value_axis_starts_at_zero_and_covers_bars_and_references() {
    let spec = chart();
    let checked = Checked::new(&spec).unwrap();
    assert_eq!(checked.ticks.lo, 0.0);
    assert!(checked.ticks.hi >= 130.0, "{:?}", checked.ticks);
}

#[test]
fn every_label_and_one_bar_per_value_are_drawn() {
    let figure = bar_chart(&chart(), Size::new(640, 360)).unwrap();
    let texts = svg_texts(&figure.svg);
    for label in ["Throughput", "GFLOP/s", "n=256", "n=4096", "qkv", "torch", "GEMM ceiling", "130"] {
        assert!(texts.contains(&label), "{label:?} missing from {texts:?}");
    }
    // Three measured values, three bars in the palette's first two colours.
    let bars = |rgb: &str| figure.svg.matches(&format!("fill=\"{rgb}\"")).count();
    assert_eq!((bars("#0072B2"), bars("#D55E00")), (2, 1), "{}", figure.svg);
    assert!(figure.png.starts_with(b"\x89PNG"));
}
