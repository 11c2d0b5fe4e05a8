//! Cartesian axes drawn by hand: the plot rectangle, grid, tick labels and
//! axis titles shared by the line charts and the query diagram, so every
//! figure has the same margins, type and number formatting.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use crate::Scale;
use crate::figure::DrawResult;
use crate::theme::{AXIS, AXIS_TITLE_SIZE, GAP, GRID, INK, LABEL_SIZE, MUTED, anchored, measure, text};
use crate::ticks::Ticks;

/// Length of a tick mark outside the plot rectangle.
pub(crate) const TICK: i32 = 4;

/// One axis: its ticks (which fix its range), scale and title.
pub(crate) struct Axis {
    pub ticks: Ticks,
    pub scale: Scale,
    pub title: String,
}

impl Axis {
    /// Where `v` falls along the axis, 0 at the low end and 1 at the high end.
    pub fn frac(&self, v: f64) -> f64 {
        let (lo, hi) = (self.ticks.lo, self.ticks.hi);
        match self.scale {
            Scale::Linear => (v - lo) / (hi - lo),
            Scale::Log => (v.ln() - lo.ln()) / (hi.ln() - lo.ln()),
        }
    }

    fn label_width(&self) -> i32 {
        let style = text(LABEL_SIZE, INK);
        self.ticks.labels.iter().map(|l| measure(&style, l).0).max().unwrap_or(0)
    }
}

/// Height of one line of axis-title text.
fn title_height() -> i32 {
    measure(&text(AXIS_TITLE_SIZE, MUTED), "Ag").1
}

/// Height of one line of tick-label text.
fn label_height() -> i32 {
    measure(&text(LABEL_SIZE, INK), "0").1
}

/// A placed plot: the rectangle in pixels and its axes (an optional second
/// y axis on the right).
pub(crate) struct Plot {
    pub x0: i32,
    pub y0: i32,
    pub x1: i32,
    pub y1: i32,
    pub x: Axis,
    pub y: Axis,
    pub y2: Option<Axis>,
}

impl Plot {
    /// Places the plot rectangle inside `(left, top, right, bottom)`, leaving
    /// room for tick labels and axis titles on every side that has them.
    pub fn place(x: Axis, y: Axis, y2: Option<Axis>, bounds: (i32, i32, i32, i32)) -> Self {
        let (left, top, right, bottom) = bounds;
        let title_band = |t: &str| {
            if t.is_empty() { 0 } else { title_height() + GAP }
        };
        let x0 = left + title_band(&y.title) + y.label_width() + GAP + TICK;
        // The last x tick label is centred on the right edge: leave half of it.
        let x_overhang = x.ticks.labels.last().map_or(0, |l| measure(&text(LABEL_SIZE, INK), l).0 / 2);
        let x1 = match &y2 {
            Some(a) => right - title_band(&a.title) - a.label_width() - GAP - TICK,
            None => right - x_overhang,
        };
        let y1 = bottom - title_band(&x.title) - label_height() - 2 * GAP - TICK;
        // The top y tick label is centred on the top edge: leave half of it.
        let y0 = top + label_height() / 2;
        Self { x0, y0, x1, y1, x, y, y2 }
    }

    /// Pixel column of data value `v` on the x axis.
    pub fn px(&self, v: f64) -> i32 {
        self.x0 + (self.x.frac(v) * f64::from(self.x1 - self.x0)).round() as i32
    }

    /// Pixel row of data value `v` on the left y axis.
    pub fn py(&self, v: f64) -> i32 {
        self.y1 - (self.y.frac(v) * f64::from(self.y1 - self.y0)).round() as i32
    }

    /// Pixel row of data value `v` on the right y axis (the left one if there is none).
    pub fn py2(&self, v: f64) -> i32 {
        match &self.y2 {
            Some(a) => self.y1 - (a.frac(v) * f64::from(self.y1 - self.y0)).round() as i32,
            None => self.py(v),
        }
    }

    /// Grid lines at the ticks of the x and left y axes.
    pub fn draw_grid<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        self.draw_x_grid(root)?;
        let grid = GRID.stroke_width(1);
        for &v in &self.y.ticks.values {
            let y = self.py(v);
            root.draw(&PathElement::new(vec![(self.x0, y), (self.x1, y)], grid))?;
        }
        Ok(())
    }

    /// Grid lines at the ticks of the x axis alone (a bar chart's category axis has none).
    pub fn draw_x_grid<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let grid = GRID.stroke_width(1);
        for &v in &self.x.ticks.values {
            let x = self.px(v);
            root.draw(&PathElement::new(vec![(x, self.y0), (x, self.y1)], grid))?;
        }
        Ok(())
    }

    /// The axis lines, tick marks, tick labels and axis titles.
    pub fn draw_axes<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let line = AXIS.stroke_width(1);
        let label = text(LABEL_SIZE, INK);
        root.draw(&PathElement::new(vec![(self.x0, self.y1), (self.x1, self.y1)], line))?;
        root.draw(&PathElement::new(vec![(self.x0, self.y0), (self.x0, self.y1)], line))?;
        for (&v, s) in self.x.ticks.values.iter().zip(&self.x.ticks.labels) {
            let x = self.px(v);
            root.draw(&PathElement::new(vec![(x, self.y1), (x, self.y1 + TICK)], line))?;
            root.draw(&Text::new(
                s.clone(),
                (x, self.y1 + TICK + GAP),
                anchored(label.clone(), HPos::Center, VPos::Top),
            ))?;
        }
        for (&v, s) in self.y.ticks.values.iter().zip(&self.y.ticks.labels) {
            let y = self.py(v);
            root.draw(&PathElement::new(vec![(self.x0 - TICK, y), (self.x0, y)], line))?;
            root.draw(&Text::new(
                s.clone(),
                (self.x0 - TICK - GAP / 2, y),
                anchored(label.clone(), HPos::Right, VPos::Center),
            ))?;
        }
        let axis = text(AXIS_TITLE_SIZE, MUTED);
        let mid_y = (self.y0 + self.y1) / 2;
        if !self.x.title.is_empty() {
            root.draw(&Text::new(
                self.x.title.clone(),
                ((self.x0 + self.x1) / 2, self.y1 + TICK + 2 * GAP + label_height() + GAP),
                anchored(axis.clone(), HPos::Center, VPos::Top),
            ))?;
        }
        if !self.y.title.is_empty() {
            let x = self.x0 - TICK - GAP - self.y.label_width() - GAP - title_height() / 2;
            root.draw(&Text::new(
                self.y.title.clone(),
                (x, mid_y),
                anchored(axis.clone(), HPos::Center, VPos::Center).transform(FontTransform::Rotate270),
            ))?;
        }
        if let Some(y2) = &self.y2 {
            root.draw(&PathElement::new(vec![(self.x1, self.y0), (self.x1, self.y1)], line))?;
            for (&v, s) in y2.ticks.values.iter().zip(&y2.ticks.labels) {
                let y = self.py2(v);
                root.draw(&PathElement::new(vec![(self.x1, y), (self.x1 + TICK, y)], line))?;
                root.draw(&Text::new(
                    s.clone(),
                    (self.x1 + TICK + GAP / 2, y),
                    anchored(label.clone(), HPos::Left, VPos::Center),
                ))?;
            }
            if !y2.title.is_empty() {
                let x = self.x1 + TICK + GAP + y2.label_width() + GAP + title_height() / 2;
                root.draw(&Text::new(
                    y2.title.clone(),
                    (x, mid_y),
                    anchored(axis, HPos::Center, VPos::Center).transform(FontTransform::Rotate270),
                ))?;
            }
        }
        Ok(())
    }
}

/// Dash length and gap of dashed lines, in pixels.
const DASH: f64 = 7.0;
const DASH_GAP: f64 = 5.0;

/// Splits a polyline into dashes of fixed length, continuing the pattern
/// across vertices so dense curves stay visibly dashed.
pub(crate) fn dashes(points: &[(i32, i32)]) -> Vec<Vec<(i32, i32)>> {
    let mut out = Vec::new();
    let mut current: Vec<(i32, i32)> = Vec::new();
    // Position within the dash-gap period.
    let mut phase = 0.0;
    for w in points.windows(2) {
        let (a, b) = (w[0], w[1]);
        let (dx, dy) = (f64::from(b.0 - a.0), f64::from(b.1 - a.1));
        let len = dx.hypot(dy);
        let mut t = 0.0;
        while t < len {
            let on = phase < DASH;
            let left = if on { DASH - phase } else { DASH + DASH_GAP - phase };
            let step = left.min(len - t);
            let at = |s: f64| {
                (
                    (f64::from(a.0) + dx * s / len).round() as i32,
                    (f64::from(a.1) + dy * s / len).round() as i32,
                )
            };
            if on {
                if current.is_empty() {
                    current.push(at(t));
                }
                current.push(at(t + step));
            }
            t += step;
            phase += step;
            if phase >= DASH && on {
                out.push(std::mem::take(&mut current));
            }
            if phase >= DASH + DASH_GAP {
                phase = 0.0;
            }
        }
    }
    if current.len() > 1 {
        out.push(current);
    }
    out
}
