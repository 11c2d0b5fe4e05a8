//! The query diagram: keys and the query as labelled arrows from the origin
//! in the plane, each key's weight printed beside it.

#[cfg(test)]
mod tests;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use crate::axes::{Axis, Plot, dashes};
use crate::figure::{Draw, DrawResult, render};
use crate::theme::{AXIS, GAP, INK, LABEL_SIZE, MARGIN, anchored, bold, draw_frame, fixed, measure, palette};
use crate::{Figure, PlotError, Scale, Size, ticks, validate};

/// A labelled 2-D vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Vector2 {
    /// The token or name drawn at the arrow's tip.
    pub label: String,
    /// First coordinate.
    pub x: f64,
    /// Second coordinate.
    pub y: f64,
}

impl Vector2 {
    /// The vector `(x, y)` labelled `label`.
    pub fn new(label: impl Into<String>, x: f64, y: f64) -> Self {
        Self { label: label.into(), x, y }
    }
}

/// The input of the query diagram.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryDiagram {
    /// Figure title; empty for none.
    pub title: String,
    /// The keys, drawn as coloured arrows.
    pub keys: Vec<Vector2>,
    /// The query, drawn as a thick dark arrow under the keys.
    pub query: Vector2,
    /// The query's weight on each key, printed beside the key's label.
    pub weights: Vec<f64>,
    /// Decimals of the printed weights (default 2), at most 8.
    pub decimals: usize,
    /// Draw the unit circle as a guide (default on), useful when the query
    /// sweeps an angle.
    pub unit_circle: bool,
}

impl QueryDiagram {
    /// A diagram of `keys` and `query` with the query's `weights` on the keys.
    pub fn new(keys: Vec<Vector2>, query: Vector2, weights: Vec<f64>) -> Self {
        Self { title: String::new(), keys, query, weights, decimals: 2, unit_circle: true }
    }
}

/// Renders `spec` as SVG and PNG at `size` (reads best square, e.g. `Size::square(640)`).
///
/// # Errors
/// [`PlotError`] for no keys, a `weights` count that differs from the keys, a
/// non-finite coordinate or weight, too many `decimals`, or a size too small.
pub fn query_diagram(spec: &QueryDiagram, size: Size) -> Result<Figure, PlotError> {
    validate::non_empty("keys", &spec.keys)?;
    validate::length("weights", spec.weights.len(), "keys", spec.keys.len())?;
    for (i, k) in spec.keys.iter().enumerate() {
        validate::finite("keys", &[k.x, k.y], |c| format!("key {i} ({}), coordinate {c}", k.label))?;
    }
    validate::finite("query", &[spec.query.x, spec.query.y], |c| format!("coordinate {c}"))?;
    validate::finite("weights", &spec.weights, validate::index)?;
    validate::decimals(spec.decimals)?;
    render(&Checked(spec), size)
}

struct Checked<'a>(&'a QueryDiagram);

/// Arrowhead length and half-width in pixels.
const HEAD: f64 = 12.0;
const HEAD_HALF: f64 = 5.0;

impl Checked<'_> {
    /// Ticks shared by both axes, so one unit is as long across as up.
    fn ticks(&self) -> ticks::Ticks {
        let spec = self.0;
        let all = spec.keys.iter().chain(std::iter::once(&spec.query));
        let (mut lo, mut hi) =
            all.fold((0.0f64, 0.0f64), |(lo, hi), v| (lo.min(v.x).min(v.y), hi.max(v.x).max(v.y)));
        if spec.unit_circle {
            lo = lo.min(-1.0);
            hi = hi.max(1.0);
        }
        // Room past the tips for the labels.
        let pad = (hi - lo) * 0.15;
        ticks::linear(lo - pad, hi + pad, 6, true)
    }
}

impl Draw for Checked<'_> {
    const NAME: &'static str = "query diagram";

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let spec = self.0;
        let top = draw_frame(root, &spec.title)?;
        let (width, height) = root.dim_in_pixel();
        let (width, height) = (width as i32, height as i32);
        let axis = |ticks: ticks::Ticks| Axis { ticks, scale: Scale::Linear, title: String::new() };
        // Place once to learn the margins, then square the plot and centre it.
        let probe = Plot::place(
            axis(self.ticks()),
            axis(self.ticks()),
            None,
            (MARGIN, top, width - MARGIN, height - MARGIN),
        );
        let side = (probe.x1 - probe.x0).min(probe.y1 - probe.y0);
        let left_room = probe.x0 - MARGIN;
        let right_room = width - MARGIN - probe.x1;
        let block = left_room + side + right_room;
        let x0 = (width - block) / 2 + left_room;
        let plot = Plot { x0, x1: x0 + side, y0: probe.y0, y1: probe.y0 + side, ..probe };
        plot.draw_grid(root)?;

        // Axes through the origin.
        let (ox, oy) = (plot.px(0.0), plot.py(0.0));
        root.draw(&PathElement::new(vec![(plot.x0, oy), (plot.x1, oy)], AXIS.stroke_width(1)))?;
        root.draw(&PathElement::new(vec![(ox, plot.y0), (ox, plot.y1)], AXIS.stroke_width(1)))?;
        if spec.unit_circle {
            let ring: Vec<(i32, i32)> = (0..=180)
                .map(|k| {
                    let a = f64::from(k) * std::f64::consts::TAU / 180.0;
                    (plot.px(a.cos()), plot.py(a.sin()))
                })
                .collect();
            for dash in dashes(&ring) {
                root.draw(&PathElement::new(dash, RGBColor(170, 170, 170).stroke_width(1)))?;
            }
        }

        let tip = |v: &Vector2| (plot.px(v.x), plot.py(v.y));
        // The query goes first and thicker, so a key lying on it still shows.
        draw_arrow(root, (ox, oy), tip(&spec.query), INK, 5)?;
        for (i, key) in spec.keys.iter().enumerate() {
            draw_arrow(root, (ox, oy), tip(key), palette(i), 2)?;
        }

        // Labels: keys first, then the query, each in the first free spot
        // around its tip.
        let mut placed: Vec<Rect> = Vec::new();
        let bounds = Rect { x0: MARGIN, y0: top, x1: width - MARGIN, y1: height - MARGIN };
        for (i, key) in spec.keys.iter().enumerate() {
            let label = format!("{}  w = {}", key.label, fixed(spec.weights[i], spec.decimals));
            let style = bold(LABEL_SIZE, palette(i));
            draw_label(root, &label, style, (ox, oy), tip(key), bounds, &mut placed)?;
        }
        let style = bold(LABEL_SIZE + 1.0, INK);
        draw_label(root, &spec.query.label, style, (ox, oy), tip(&spec.query), bounds, &mut placed)?;
        plot.draw_axes(root)
    }
}

/// An arrow from `from` to `to`: a shaft and a filled head. A zero-length
/// vector is a dot.
fn draw_arrow<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    from: (i32, i32),
    to: (i32, i32),
    color: RGBColor,
    width: u32,
) -> DrawResult<DB> {
    let (dx, dy) = (f64::from(to.0 - from.0), f64::from(to.1 - from.1));
    let len = dx.hypot(dy);
    if len < 1.0 {
        return root.draw(&Circle::new(to, 4, color.filled()));
    }
    let (ux, uy) = (dx / len, dy / len);
    let head = HEAD.min(len * 0.5) + f64::from(width);
    let half = HEAD_HALF + f64::from(width);
    let base = (f64::from(to.0) - ux * head, f64::from(to.1) - uy * head);
    let pt = |x: f64, y: f64| (x.round() as i32, y.round() as i32);
    root.draw(&PathElement::new(vec![from, pt(base.0 + ux, base.1 + uy)], color.stroke_width(width)))?;
    root.draw(&Polygon::new(
        vec![to, pt(base.0 - uy * half, base.1 + ux * half), pt(base.0 + uy * half, base.1 - ux * half)],
        color.filled(),
    ))
}

/// An axis-aligned box in pixels.
#[derive(Clone, Copy)]
struct Rect {
    x0: i32,
    y0: i32,
    x1: i32,
    y1: i32,
}

impl Rect {
    fn overlaps(&self, o: &Rect) -> bool {
        self.x0 < o.x1 && o.x0 < self.x1 && self.y0 < o.y1 && o.y0 < self.y1
    }

    fn inside(&self, o: &Rect) -> bool {
        self.x0 >= o.x0 && self.x1 <= o.x1 && self.y0 >= o.y0 && self.y1 <= o.y1
    }
}

/// Draws `label` near the tip of the arrow `origin → tip`: first beyond the
/// tip, then around it, at the first spot that stays in `bounds` and clears
/// every label already placed.
fn draw_label<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    label: &str,
    style: TextStyle<'static>,
    origin: (i32, i32),
    tip: (i32, i32),
    bounds: Rect,
    placed: &mut Vec<Rect>,
) -> DrawResult<DB> {
    let (w, h) = measure(&style, label);
    let (dx, dy) = (f64::from(tip.0 - origin.0), f64::from(tip.1 - origin.1));
    let start = if dx == 0.0 && dy == 0.0 { -std::f64::consts::FRAC_PI_4 } else { dy.atan2(dx) };
    let offset = f64::from(GAP + 6);
    let candidates = (0..16).map(|k| {
        // Alternate sides of the outward direction, widening each time.
        let turn = f64::from((k + 1) / 2) * std::f64::consts::FRAC_PI_4 * if k % 2 == 0 { 1.0 } else { -1.0 };
        let a = start + turn;
        let dist = offset + if k >= 8 { f64::from(h + GAP) } else { 0.0 };
        let (cx, cy) = (f64::from(tip.0) + a.cos() * dist, f64::from(tip.1) + a.sin() * dist);
        // The box sits on the side the direction points to.
        let bx = cx - f64::from(w) * (1.0 - a.cos()) / 2.0;
        let by = cy - f64::from(h) * (1.0 - a.sin()) / 2.0;
        let (bx, by) = (bx.round() as i32, by.round() as i32);
        Rect { x0: bx, y0: by, x1: bx + w, y1: by + h }
    });
    let candidates: Vec<Rect> = candidates.collect();
    let chosen = candidates
        .iter()
        .find(|r| r.inside(&bounds) && !placed.iter().any(|p| p.overlaps(r)))
        .or_else(|| candidates.iter().find(|r| r.inside(&bounds)))
        .copied()
        .unwrap_or(candidates[0]);
    placed.push(chosen);
    // A white halo keeps the label legible over grid lines and arrows.
    root.draw(&Rectangle::new(
        [(chosen.x0 - 2, chosen.y0 - 1), (chosen.x1 + 2, chosen.y1 + 1)],
        WHITE.filled(),
    ))?;
    root.draw(&Text::new(label.to_owned(), (chosen.x0, chosen.y0), anchored(style, HPos::Left, VPos::Top)))
}
