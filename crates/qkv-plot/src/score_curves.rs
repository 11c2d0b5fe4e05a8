//! Score curves: each key's weight as the query sweeps a path, the output on
//! a right-hand axis, and a marker at the lesson's current query.

#[cfg(test)]
mod tests;

use crate::{
    Figure, LineChart, PlotError, Scale, SecondaryAxis, Series, Size, VerticalMarker, line_chart, validate,
};

/// The input of the score-curve figure. The sweep is computed by the lesson
/// pipeline with the engine; this type only carries the series.
#[derive(Debug, Clone, PartialEq)]
pub struct ScoreCurves {
    /// Figure title; empty for none.
    pub title: String,
    /// Title of the x axis, e.g. "query angle (degrees)".
    pub x_title: String,
    /// Title of the left axis (default `"weight"`), which spans 0 to 1.
    pub weight_title: String,
    /// Title of the right axis (default `"output"`).
    pub output_title: String,
    /// The sweep positions, increasing.
    pub x: Vec<f64>,
    /// Explicit x tick positions, e.g. `[0, 90, 180, 270, 360]` for an angle;
    /// `None` picks round numbers.
    pub x_ticks: Option<Vec<f64>>,
    /// One weight series per key, labelled with the key's token.
    pub weights: Vec<Series>,
    /// Output series for the right axis (dashed); may be empty.
    pub outputs: Vec<Series>,
    /// The lesson's current query position on the sweep.
    pub marker: Option<VerticalMarker>,
}

impl ScoreCurves {
    /// Curves of `weights` (and `outputs` on the right axis) over `x`, with
    /// default axis titles and no marker.
    pub fn new(x: Vec<f64>, weights: Vec<Series>, outputs: Vec<Series>) -> Self {
        Self {
            title: String::new(),
            x_title: String::new(),
            weight_title: "weight".to_owned(),
            output_title: "output".to_owned(),
            x,
            x_ticks: None,
            weights,
            outputs,
            marker: None,
        }
    }
}

/// Renders `spec` as SVG and PNG at `size` (640 × 480 by default).
///
/// # Errors
/// [`PlotError`] for empty `x` or `weights`, a series whose length differs
/// from `x`, a non-finite value, `x` not increasing, or a size too small.
pub fn score_curves(spec: &ScoreCurves, size: Size) -> Result<Figure, PlotError> {
    validate::non_empty("x", &spec.x)?;
    validate::non_empty("weights", &spec.weights)?;
    for (arg, list) in [("weights", &spec.weights), ("outputs", &spec.outputs)] {
        for (s, one) in list.iter().enumerate() {
            validate::length(arg, one.values.len(), "x", spec.x.len())?;
            validate::finite(arg, &one.values, |i| format!("series {s} ({}), index {i}", one.label))?;
        }
    }
    line_chart(&to_line_chart(spec), size)
}

/// The score curves as a general line chart: weights on a 0–1 left axis,
/// outputs dashed on the right.
fn to_line_chart(spec: &ScoreCurves) -> LineChart {
    LineChart {
        title: spec.title.clone(),
        x_title: spec.x_title.clone(),
        y_title: spec.weight_title.clone(),
        x: spec.x.clone(),
        series: spec.weights.clone(),
        x_scale: Scale::Linear,
        x_ticks: spec.x_ticks.clone(),
        y_scale: Scale::Linear,
        y_range: Some((0.0, 1.0)),
        markers: false,
        secondary: (!spec.outputs.is_empty()).then(|| SecondaryAxis {
            title: spec.output_title.clone(),
            series: spec.outputs.clone(),
            range: None,
        }),
        marker: spec.marker.clone(),
    }
}
