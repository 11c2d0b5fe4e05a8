//! A horizontal grouped bar chart: one group of bars per category (a
//! benchmark shape, say), one bar per series (an implementation) in the
//! palette's order, and optional reference lines across every group (a
//! machine ceiling). Categories read top to bottom in the order given, with
//! their labels left of the bars, where long names have room.

#[cfg(test)]
mod tests;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use crate::axes::{Axis, Plot, dashes};
use crate::figure::{Draw, DrawResult, render};
use crate::theme::{
    LABEL_SIZE, LegendItem, MARGIN, MARKER, anchored, draw_frame_and_legend, measure, palette, text,
};
use crate::{Figure, PlotError, Scale, Size, ticks, validate};

/// One series of bars: a value (or a gap) per category.
#[derive(Debug, Clone, PartialEq)]
pub struct BarSeries {
    /// Legend text.
    pub label: String,
    /// One value per category; `None` leaves that bar out (not measured).
    pub values: Vec<Option<f64>>,
}

/// A vertical line across the plot at one value, labelled in the legend.
#[derive(Debug, Clone, PartialEq)]
pub struct ReferenceLine {
    /// Legend text.
    pub label: String,
    /// Where the line goes, in value units.
    pub value: f64,
}

/// The input of a bar chart.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    /// Figure title; empty for none.
    pub title: String,
    /// Title of the value axis (along the bottom).
    pub value_title: String,
    /// One label per group of bars, drawn top to bottom.
    pub categories: Vec<String>,
    /// The series, each with one entry per category. Values must be finite and at least 0.
    pub series: Vec<BarSeries>,
    /// Lines across every group, drawn dashed.
    pub references: Vec<ReferenceLine>,
}

/// Renders `spec` as SVG and PNG at `size`. A chart of many categories
/// needs height: about 14 pixels per bar reads well.
///
/// # Errors
/// [`PlotError`] for empty `categories` or `series`, a series whose length
/// differs from `categories`, a series with no value at all, a non-finite or
/// negative value, or a size too small.
pub fn bar_chart(spec: &BarChart, size: Size) -> Result<Figure, PlotError> {
    render(&Checked::new(spec)?, size)
}

/// A bar chart whose input passed every check, with its value axis ticks.
struct Checked<'a> {
    spec: &'a BarChart,
    ticks: ticks::Ticks,
}

impl<'a> Checked<'a> {
    fn new(spec: &'a BarChart) -> Result<Self, PlotError> {
        validate::non_empty("categories", &spec.categories)?;
        validate::non_empty("series", &spec.series)?;
        let mut largest: f64 = 0.0;
        for (s, series) in spec.series.iter().enumerate() {
            validate::length("series", series.values.len(), "categories", spec.categories.len())?;
            let at = |i: usize| format!("series {s} ({}), category {i}", series.label);
            let values: Vec<(usize, f64)> =
                series.values.iter().enumerate().filter_map(|(i, v)| v.map(|v| (i, v))).collect();
            if values.is_empty() {
                return Err(PlotError::Empty { arg: "series" });
            }
            for &(i, v) in &values {
                validate::finite("series", &[v], |_| at(i))?;
                if v < 0.0 {
                    return Err(PlotError::Negative { arg: "series", at: at(i), value: v });
                }
                largest = largest.max(v);
            }
        }
        for (r, line) in spec.references.iter().enumerate() {
            let at = |_| format!("reference {r} ({})", line.label);
            validate::finite("references", &[line.value], at)?;
            if line.value < 0.0 {
                return Err(PlotError::Negative { arg: "references", at: at(0), value: line.value });
            }
            largest = largest.max(line.value);
        }
        // Bars grow from zero, so the axis always starts there.
        let ticks = ticks::linear(0.0, largest, 6, true);
        Ok(Self { spec, ticks })
    }

    fn legend(&self) -> Vec<LegendItem> {
        let bars = self.spec.series.iter().enumerate().map(|(i, s)| LegendItem {
            label: s.label.clone(),
            color: palette(i),
            dashed: false,
            width: 8,
        });
        let lines = self.spec.references.iter().map(|r| LegendItem {
            label: r.label.clone(),
            color: MARKER,
            dashed: true,
            width: 2,
        });
        bars.chain(lines).collect()
    }
}

/// Fraction of a category's band the bars fill; the rest separates groups.
const GROUP_FILL: f64 = 0.8;

impl Draw for Checked<'_> {
    const NAME: &'static str = "bar chart";

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let spec = self.spec;
        let items = self.legend();
        let (top, width, height) = draw_frame_and_legend(root, &spec.title, &items)?;

        // The category axis runs from 0 (bottom) to n (top); category i fills [n - i - 1, n - i].
        let n = spec.categories.len();
        let centre = |i: usize| (n - i) as f64 - 0.5;
        let categories = ticks::Ticks {
            values: (0..n).rev().map(centre).collect(),
            labels: spec.categories.iter().rev().cloned().collect(),
            lo: 0.0,
            hi: n as f64,
        };
        let plot = Plot::place(
            Axis { ticks: self.ticks.clone(), scale: Scale::Linear, title: spec.value_title.clone() },
            Axis { ticks: categories, scale: Scale::Linear, title: String::new() },
            None,
            (MARGIN, top, width - MARGIN, height - MARGIN),
        );
        plot.draw_x_grid(root)?;

        let bars = spec.series.len() as f64;
        for (s, series) in spec.series.iter().enumerate() {
            let color = palette(s).filled();
            for (i, value) in series.values.iter().enumerate() {
                let Some(value) = *value else { continue };
                // Series top to bottom within the group, in legend order.
                let band_top = centre(i) + GROUP_FILL / 2.0;
                let (y_top, y_bottom) =
                    (band_top - GROUP_FILL * s as f64 / bars, band_top - GROUP_FILL * (s + 1) as f64 / bars);
                let (x0, x1) = (plot.px(0.0), plot.px(value));
                root.draw(&Rectangle::new(
                    [(x0, plot.py(y_top)), (x1.max(x0 + 1), plot.py(y_bottom))],
                    color,
                ))?;
            }
        }
        for line in &spec.references {
            let x = plot.px(line.value);
            for dash in dashes(&[(x, plot.y0), (x, plot.y1)]) {
                root.draw(&PathElement::new(dash, MARKER.stroke_width(2)))?;
            }
            let style = text(LABEL_SIZE, MARKER);
            let label = crate::theme::trimmed(line.value, 0);
            let w = measure(&style, &label).0;
            let (h, lx) = if x + 4 + w <= plot.x1 { (HPos::Left, x + 4) } else { (HPos::Right, x - 4) };
            root.draw(&Text::new(label, (lx, plot.y0 + 2), anchored(style, h, VPos::Top)))?;
        }
        plot.draw_axes(root)
    }
}
