//! The query diagram: keys and the query as labelled arrows from the origin
//! in the plane, each key's weight printed beside it. Where the labels go is
//! `labels.rs`.

mod labels;
#[cfg(test)]
mod tests;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use crate::axes::{Axis, Plot, dashes};
use crate::figure::{Draw, DrawResult, render};
use crate::theme::{AXIS, INK, LABEL_SIZE, MARGIN, anchored, bold, draw_frame, fixed, palette};
use crate::{Figure, PlotError, Scale, Size, ticks, validate};
use labels::{Arrow, Block, Label, Line, Rect};

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

impl Checked<'_> {
    /// Every arrow's label, most important first: the query's, then the keys' by weight, so
    /// the ones a reader looks for first get first pick of the spots. A key's label may break
    /// between its name and its weight.
    fn labels(&self) -> Vec<Label> {
        let spec = self.0;
        let query = Label {
            arrow: 0,
            line: Line::new(spec.query.label.clone(), bold(LABEL_SIZE + 1.0, INK)),
            broken: None,
        };
        let mut keys: Vec<usize> = (0..spec.keys.len()).collect();
        keys.sort_by(|&a, &b| spec.weights[b].total_cmp(&spec.weights[a]));
        let keys = keys.into_iter().map(|i| {
            let style = bold(LABEL_SIZE, palette(i));
            let (name, weight) =
                (&spec.keys[i].label, format!("w = {}", fixed(spec.weights[i], spec.decimals)));
            Label {
                arrow: i + 1,
                line: Line::new(format!("{name}  {weight}"), style.clone()),
                broken: Some([Line::new(name.clone(), style.clone()), Line::new(weight, style)]),
            }
        });
        std::iter::once(query).chain(keys).collect()
    }

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

/// Where everything goes, in pixels.
struct Layout {
    plot: Plot,
    origin: (i32, i32),
    /// The query's arrow, then the keys'.
    arrows: Vec<Arrow>,
    /// The label blocks, each beside its arrows' tip.
    blocks: Vec<Block>,
}

impl Checked<'_> {
    /// The layout in a `width` × `height` figure whose content starts at `top`.
    fn layout(&self, width: i32, height: i32, top: i32) -> Layout {
        let spec = self.0;
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

        let origin = (plot.px(0.0), plot.py(0.0));
        let tip = |v: &Vector2| (plot.px(v.x), plot.py(v.y));
        // The query goes first and thicker, so a key lying on it still shows.
        let arrows: Vec<Arrow> = std::iter::once(Arrow::new(origin, tip(&spec.query), 5))
            .chain(spec.keys.iter().map(|k| Arrow::new(origin, tip(k), 2)))
            .collect();
        // Labels stay off the tick labels: right of the y axis's, above the x axis's.
        let bounds = Rect { x0: plot.x0 + 1, y0: top, x1: width - MARGIN, y1: plot.y1 - 1 };
        let blocks = labels::place(&self.labels(), &arrows, origin, bounds);
        Layout { plot, origin, arrows, blocks }
    }
}

impl Draw for Checked<'_> {
    const NAME: &'static str = "query diagram";

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let spec = self.0;
        let top = draw_frame(root, &spec.title)?;
        let (width, height) = root.dim_in_pixel();
        let Layout { plot, origin: (ox, oy), arrows, blocks } = self.layout(width as i32, height as i32, top);
        plot.draw_grid(root)?;

        // Axes through the origin.
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

        let colors = std::iter::once(INK).chain((0..spec.keys.len()).map(palette));
        for (arrow, color) in arrows.iter().zip(colors) {
            draw_arrow(root, arrow, color)?;
        }
        for block in blocks {
            // A white halo keeps the label legible over grid lines and the unit circle.
            let halo = block.rect.halo();
            root.draw(&Rectangle::new([(halo.x0, halo.y0), (halo.x1, halo.y1)], WHITE.filled()))?;
            for (line, at) in block.lines {
                root.draw(&Text::new(line.text, at, anchored(line.style, HPos::Left, VPos::Top)))?;
            }
        }
        plot.draw_axes(root)
    }
}

/// Draws `arrow` in `color`: its shaft and filled head, or a dot for a zero-length vector.
fn draw_arrow<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    arrow: &Arrow,
    color: RGBColor,
) -> DrawResult<DB> {
    if arrow.is_dot() {
        return root.draw(&Circle::new(arrow.tip, labels::DOT as u32, color.filled()));
    }
    root.draw(&PathElement::new(arrow.shaft.to_vec(), color.stroke_width(arrow.width)))?;
    root.draw(&Polygon::new(arrow.head.clone(), color.filled()))
}
