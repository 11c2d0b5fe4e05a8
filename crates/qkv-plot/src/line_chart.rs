//! A line chart of labelled series over one shared x axis, optionally with a
//! second y axis on the right and a vertical marker. The scaling figures and
//! the score curves are all drawn with it.

#[cfg(test)]
mod tests;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use crate::axes::{Axis, Plot, dashes};
use crate::figure::{Draw, DrawResult, render};
use crate::theme::{
    INK, LABEL_SIZE, LegendItem, MARGIN, MARKER, anchored, draw_frame_and_legend, measure, palette, text,
    trimmed,
};
use crate::{Figure, PlotError, Size, ticks, validate};

/// How values are spaced along an axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scale {
    /// Evenly spaced values; ticks at 1, 2 or 5 times a power of ten.
    #[default]
    Linear,
    /// Evenly spaced powers; ticks at powers of two (or ten for very wide
    /// ranges). Every value on the axis must be above zero.
    Log,
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SeriesStyle {
    /// A data series: a solid line in the next palette colour (Okabe–Ito),
    /// with point markers if the chart asks for them.
    #[default]
    Data,
    /// A guide such as `y = d_k` or `y = 1`: thin, grey and dashed, no markers.
    Reference,
}

/// One labelled series: a y value for every x value of its chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// One value per x value of the chart.
    pub values: Vec<f64>,
    /// How the series is drawn.
    pub style: SeriesStyle,
}

impl Series {
    /// A data series.
    pub fn new(label: impl Into<String>, values: Vec<f64>) -> Self {
        Self { label: label.into(), values, style: SeriesStyle::Data }
    }

    /// A reference (guide) series.
    pub fn reference(label: impl Into<String>, values: Vec<f64>) -> Self {
        Self { style: SeriesStyle::Reference, ..Self::new(label, values) }
    }
}

/// A second y axis on the right with its own series, drawn dashed.
#[derive(Debug, Clone, PartialEq)]
pub struct SecondaryAxis {
    /// Title of the right axis.
    pub title: String,
    /// Its series (same length as the chart's x values).
    pub series: Vec<Series>,
    /// Fixed axis range; `None` fits the data.
    pub range: Option<(f64, f64)>,
}

/// A vertical line across the plot at one x value, with a short label.
#[derive(Debug, Clone, PartialEq)]
pub struct VerticalMarker {
    /// Where the line goes, in x units; the axis widens to include it.
    pub x: f64,
    /// Text beside the top of the line; empty for none.
    pub label: String,
}

/// The input of a line chart.
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Figure title; empty for none.
    pub title: String,
    /// Title of the x axis.
    pub x_title: String,
    /// Title of the (left) y axis.
    pub y_title: String,
    /// The shared x values, in increasing order.
    pub x: Vec<f64>,
    /// The series on the left y axis, each with one value per x value.
    pub series: Vec<Series>,
    /// Scale of the x axis.
    pub x_scale: Scale,
    /// Explicit x tick positions (say every 90 degrees of a sweep); `None`
    /// picks round numbers. Ticks outside the data are dropped.
    pub x_ticks: Option<Vec<f64>>,
    /// Scale of the left y axis.
    pub y_scale: Scale,
    /// Fixed left-axis range (widened if data fall outside); `None` fits the data.
    pub y_range: Option<(f64, f64)>,
    /// Draw a dot at every data point (for a few measured points rather than a dense curve).
    pub markers: bool,
    /// An optional right y axis with its own series.
    pub secondary: Option<SecondaryAxis>,
    /// An optional vertical marker.
    pub marker: Option<VerticalMarker>,
}

impl LineChart {
    /// A chart of `series` over `x` with linear axes, no markers, no second axis.
    pub fn new(x: Vec<f64>, series: Vec<Series>) -> Self {
        Self {
            title: String::new(),
            x_title: String::new(),
            y_title: String::new(),
            x,
            series,
            x_scale: Scale::Linear,
            x_ticks: None,
            y_scale: Scale::Linear,
            y_range: None,
            markers: false,
            secondary: None,
            marker: None,
        }
    }
}

/// Renders `spec` as SVG and PNG at `size` (640 × 480 by default).
///
/// # Errors
/// [`PlotError`] for empty `x` or `series`, a series whose length differs from
/// `x`, a non-finite value, a value at or below zero on a log axis, a bad
/// range, or a size too small.
pub fn line_chart(spec: &LineChart, size: Size) -> Result<Figure, PlotError> {
    render(&Checked::new(spec)?, size)
}

/// A line chart whose input passed every check, with its axes' ticks.
struct Checked<'a> {
    spec: &'a LineChart,
    x_ticks: ticks::Ticks,
    y_ticks: ticks::Ticks,
    y2_ticks: Option<ticks::Ticks>,
}

fn check_series(arg: &'static str, series: &[Series], n: usize, scale: Scale) -> Result<(), PlotError> {
    for (s, one) in series.iter().enumerate() {
        validate::length(arg, one.values.len(), "x", n)?;
        validate::finite(arg, &one.values, |i| format!("series {s} ({}), index {i}", one.label))?;
        if scale == Scale::Log
            && let Some(i) = one.values.iter().position(|&v| v <= 0.0)
        {
            return Err(PlotError::NotPositive {
                arg,
                at: format!("series {s} ({}), index {i}", one.label),
                value: one.values[i],
            });
        }
    }
    Ok(())
}

/// Ticks for data spanning `[lo, hi]` (widened to `range` if given).
fn axis_ticks(lo: f64, hi: f64, range: Option<(f64, f64)>, scale: Scale, expand: bool) -> ticks::Ticks {
    let (lo, hi) = match range {
        Some((a, b)) => (a.min(lo), b.max(hi)),
        None => (lo, hi),
    };
    match scale {
        Scale::Linear => ticks::linear(lo, hi, 5, expand || range.is_none()),
        Scale::Log => ticks::log(lo, hi, 8),
    }
}

/// The ticks of `t` that fall in `[lo, hi]`, on an axis spanning exactly
/// that range: a swept x (an angle, a head size) ends where the data end.
fn clamp_ticks(t: ticks::Ticks, lo: f64, hi: f64) -> ticks::Ticks {
    let eps = (hi - lo).abs() * 1e-9;
    let (values, labels) =
        t.values.into_iter().zip(t.labels).filter(|(v, _)| *v >= lo - eps && *v <= hi + eps).unzip();
    let (lo, hi) = if hi > lo { (lo, hi) } else { (t.lo, t.hi) };
    ticks::Ticks { values, labels, lo, hi }
}

fn extent<'s>(series: impl Iterator<Item = &'s Series>) -> (f64, f64) {
    series
        .flat_map(|s| s.values.iter())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

impl<'a> Checked<'a> {
    fn new(spec: &'a LineChart) -> Result<Self, PlotError> {
        validate::non_empty("x", &spec.x)?;
        validate::finite("x", &spec.x, validate::index)?;
        if let Some(i) = spec.x.windows(2).position(|w| w[1] <= w[0]) {
            return Err(PlotError::BadRange { arg: "x", lo: spec.x[i], hi: spec.x[i + 1] });
        }
        if spec.x_scale == Scale::Log && spec.x[0] <= 0.0 {
            return Err(PlotError::NotPositive { arg: "x", at: validate::index(0), value: spec.x[0] });
        }
        validate::non_empty("series", &spec.series)?;
        let n = spec.x.len();
        check_series("series", &spec.series, n, spec.y_scale)?;
        validate::range("y_range", spec.y_range)?;
        if let Some(second) = &spec.secondary {
            validate::non_empty("secondary.series", &second.series)?;
            check_series("secondary.series", &second.series, n, Scale::Linear)?;
            validate::range("secondary.range", second.range)?;
        }
        let mut x_lo = spec.x[0];
        let mut x_hi = spec.x[n - 1];
        if let Some(marker) = &spec.marker {
            validate::finite("marker.x", &[marker.x], |_| "x".to_owned())?;
            if spec.x_scale == Scale::Log && marker.x <= 0.0 {
                return Err(PlotError::NotPositive { arg: "marker.x", at: "x".to_owned(), value: marker.x });
            }
            x_lo = x_lo.min(marker.x);
            x_hi = x_hi.max(marker.x);
        }
        // Only the y axes round outward to whole ticks.
        let x_ticks = match (&spec.x_ticks, spec.x_scale) {
            (Some(given), _) => {
                validate::finite("x_ticks", given, validate::index)?;
                ticks::Ticks {
                    values: given.clone(),
                    labels: given.iter().map(|&v| trimmed(v, 6)).collect(),
                    lo: x_lo,
                    hi: x_hi,
                }
            }
            (None, Scale::Linear) => ticks::linear(x_lo, x_hi, 6, false),
            (None, Scale::Log) => ticks::log(x_lo, x_hi, 8),
        };
        let x_ticks = clamp_ticks(x_ticks, x_lo, x_hi);
        let (lo, hi) = extent(spec.series.iter());
        let y_ticks = axis_ticks(lo, hi, spec.y_range, spec.y_scale, false);
        let y2_ticks = spec.secondary.as_ref().map(|second| {
            let (lo, hi) = extent(second.series.iter());
            axis_ticks(lo, hi, second.range, Scale::Linear, false)
        });
        Ok(Self { spec, x_ticks, y_ticks, y2_ticks })
    }

    fn legend(&self) -> Vec<LegendItem> {
        let mut items = Vec::new();
        let mut data = 0;
        for s in &self.spec.series {
            items.push(self.item(s, &mut data, false));
        }
        if let Some(second) = &self.spec.secondary {
            let lone = second.series.len() == 1;
            for s in &second.series {
                let mut item = self.item(s, &mut data, true);
                if lone && s.style == SeriesStyle::Data {
                    item.color = INK;
                }
                item.label = format!("{} (right axis)", s.label);
                items.push(item);
            }
        }
        items
    }

    fn item(&self, s: &Series, data: &mut usize, secondary: bool) -> LegendItem {
        match s.style {
            SeriesStyle::Data => {
                let color = palette(*data);
                *data += 1;
                LegendItem { label: s.label.clone(), color, dashed: secondary, width: 2 }
            }
            SeriesStyle::Reference => {
                LegendItem { label: s.label.clone(), color: RGBColor(150, 150, 150), dashed: true, width: 1 }
            }
        }
    }
}

impl Draw for Checked<'_> {
    const NAME: &'static str = "line chart";

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let spec = self.spec;
        let items = self.legend();
        let (top, width, height) = draw_frame_and_legend(root, &spec.title, &items)?;

        let plot = Plot::place(
            Axis { ticks: self.x_ticks.clone(), scale: spec.x_scale, title: spec.x_title.clone() },
            Axis { ticks: self.y_ticks.clone(), scale: spec.y_scale, title: spec.y_title.clone() },
            self.y2_ticks.as_ref().zip(spec.secondary.as_ref()).map(|(t, s)| Axis {
                ticks: t.clone(),
                scale: Scale::Linear,
                title: s.title.clone(),
            }),
            (MARGIN, top, width - MARGIN, height - MARGIN),
        );
        plot.draw_grid(root)?;

        if let Some(marker) = &spec.marker {
            let x = plot.px(marker.x);
            for dash in dashes(&[(x, plot.y0), (x, plot.y1)]) {
                root.draw(&PathElement::new(dash, MARKER.stroke_width(2)))?;
            }
            if !marker.label.is_empty() {
                let style = text(LABEL_SIZE, MARKER);
                let w = measure(&style, &marker.label).0;
                // Label on the side of the line with room for it.
                let (h, lx) = if x + 4 + w <= plot.x1 { (HPos::Left, x + 4) } else { (HPos::Right, x - 4) };
                root.draw(&Text::new(
                    marker.label.clone(),
                    (lx, plot.y0 + 2),
                    anchored(style, h, VPos::Top),
                ))?;
            }
        }

        // Reference lines first, so data draw over them.
        let mut ordered: Vec<(usize, &Series, bool)> = Vec::new();
        let mut k = 0;
        for s in &spec.series {
            ordered.push((k, s, false));
            k += 1;
        }
        if let Some(second) = &spec.secondary {
            for s in &second.series {
                ordered.push((k, s, true));
                k += 1;
            }
        }
        ordered.sort_by_key(|(_, s, _)| s.style == SeriesStyle::Data);
        for (index, s, secondary) in ordered {
            let item = &items[index];
            let points: Vec<(i32, i32)> = spec
                .x
                .iter()
                .zip(&s.values)
                .map(|(&x, &y)| (plot.px(x), if secondary { plot.py2(y) } else { plot.py(y) }))
                .collect();
            let style = item.color.stroke_width(item.width);
            if item.dashed {
                for dash in dashes(&points) {
                    root.draw(&PathElement::new(dash, style))?;
                }
            } else {
                root.draw(&PathElement::new(points.clone(), style))?;
            }
            if spec.markers && s.style == SeriesStyle::Data {
                for &p in &points {
                    root.draw(&Circle::new(p, 3, item.color.filled()))?;
                }
            }
        }
        plot.draw_axes(root)
    }
}
