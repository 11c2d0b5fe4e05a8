//! The attention heatmap: an `n_q × n_k` matrix of weights with token labels,
//! annotated cells, a colour bar, masked cells and an optional highlighted row.

#[cfg(test)]
mod tests;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, VPos};

use crate::figure::{Draw, DrawResult, render};
use crate::theme::{
    ACCENT, AXIS, AXIS_TITLE_SIZE, GAP, INK, LABEL_SIZE, MARGIN, MASK_FILL, MASK_HATCH, MUTED, anchored,
    bold, draw_frame, fit, fixed, luminance, measure, text,
};
use crate::{Figure, PlotError, Size, ticks, validate};

/// The input of an attention heatmap: rows are queries, columns are keys.
///
/// Build one with [`Heatmap::new`] and set the optional fields directly.
#[derive(Debug, Clone, PartialEq)]
pub struct Heatmap {
    /// Figure title; empty for none.
    pub title: String,
    /// The `n_q × n_k` matrix, one row per query; every row the same length.
    pub weights: Vec<Vec<f64>>,
    /// One label per row (query tokens), drawn left of the matrix.
    pub row_labels: Vec<String>,
    /// One label per column (key tokens), drawn under the matrix.
    pub col_labels: Vec<String>,
    /// Title of the row axis (default `"query"`); empty for none.
    pub row_title: String,
    /// Title of the column axis (default `"key"`); empty for none.
    pub col_title: String,
    /// Title of the colour bar (default `"weight"`); empty for none.
    pub colorbar_title: String,
    /// Decimals of the cell annotations (default 2), at most 8.
    pub decimals: usize,
    /// Optional `n_q × n_k` mask: `true` marks a hidden (masked) cell, drawn
    /// grey and hatched with "masked" or "–" instead of a number. Its weight
    /// is not drawn and may be anything, even NaN.
    pub masked: Option<Vec<Vec<bool>>>,
    /// A row to outline and whose label is set in bold (the static form of
    /// clicking a row).
    pub highlight_row: Option<usize>,
    /// The values at the two ends of the colour bar. `None` spans the
    /// smallest and largest unmasked weight.
    pub value_range: Option<(f64, f64)>,
}

impl Heatmap {
    /// A heatmap of `weights` with query labels `row_labels` and key labels
    /// `col_labels`, 2 decimals, no title, mask or highlight.
    pub fn new(row_labels: Vec<String>, col_labels: Vec<String>, weights: Vec<Vec<f64>>) -> Self {
        Self {
            title: String::new(),
            weights,
            row_labels,
            col_labels,
            row_title: "query".to_owned(),
            col_title: "key".to_owned(),
            colorbar_title: "weight".to_owned(),
            decimals: 2,
            masked: None,
            highlight_row: None,
            value_range: None,
        }
    }
}

/// Renders `spec` as SVG and PNG at `size` (640 × 480 by default; many
/// tokens read best in a square such as `Size::square(640)`).
///
/// # Errors
/// [`PlotError`] for an empty or ragged `weights`, label or mask counts that do
/// not match it, a non-finite unmasked weight, a `highlight_row` out of range,
/// a bad `value_range`, too many `decimals` or a size too small.
pub fn heatmap(spec: &Heatmap, size: Size) -> Result<Figure, PlotError> {
    render(&Checked::new(spec)?, size)
}

/// A heatmap whose input passed every check, with its colour range.
struct Checked<'a> {
    spec: &'a Heatmap,
    n_q: usize,
    n_k: usize,
    lo: f64,
    hi: f64,
}

impl<'a> Checked<'a> {
    fn new(spec: &'a Heatmap) -> Result<Self, PlotError> {
        let (n_q, n_k) = validate::matrix("weights", &spec.weights)?;
        validate::length("row_labels", spec.row_labels.len(), "weights", n_q)?;
        validate::length("col_labels", spec.col_labels.len(), "weights", n_k)?;
        if let Some(mask) = &spec.masked {
            validate::length("masked", mask.len(), "weights", n_q)?;
            if let Some((row, r)) = mask.iter().enumerate().find(|(_, r)| r.len() != n_k) {
                return Err(PlotError::Ragged { arg: "masked", row, len: r.len(), expected: n_k });
            }
        }
        let is_masked = |i: usize, j: usize| spec.masked.as_ref().is_some_and(|m| m[i][j]);
        for (i, row) in spec.weights.iter().enumerate() {
            for (j, &v) in row.iter().enumerate() {
                if !is_masked(i, j) && !v.is_finite() {
                    return Err(PlotError::NonFinite {
                        arg: "weights",
                        at: format!("row {i}, column {j}"),
                        value: v,
                    });
                }
            }
        }
        if let Some(index) = spec.highlight_row
            && index >= n_q
        {
            return Err(PlotError::OutOfRange { arg: "highlight_row", index, len: n_q });
        }
        validate::decimals(spec.decimals)?;
        validate::range("value_range", spec.value_range)?;
        let (lo, hi) = spec.value_range.unwrap_or_else(|| {
            let visible = spec.weights.iter().enumerate().flat_map(|(i, row)| {
                row.iter().enumerate().filter(move |&(j, _)| !is_masked(i, j)).map(|(_, &v)| v)
            });
            let (lo, hi) =
                visible.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
            if !lo.is_finite() {
                (0.0, 1.0)
            } else if hi > lo {
                (lo, hi)
            } else if (0.0..=1.0).contains(&lo) {
                // One distinct weight (a single token): show it on the full weight scale.
                (0.0, 1.0)
            } else {
                (lo - 0.5, hi + 0.5)
            }
        });
        Ok(Self { spec, n_q, n_k, lo, hi })
    }

    fn is_masked(&self, i: usize, j: usize) -> bool {
        self.spec.masked.as_ref().is_some_and(|m| m[i][j])
    }

    fn color(&self, v: f64) -> RGBColor {
        let t = ((v - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0);
        ViridisRGB::get_color(t)
    }
}

/// The largest cell side: a few tokens should not fill the page.
const MAX_CELL: i32 = 120;
/// Gap between a row label and the grid: clear of the highlight outline.
const ROW_LABEL_GAP: i32 = GAP + 4;
/// Width of the colour bar.
const BAR_WIDTH: i32 = 14;
/// Length of a colour-bar tick.
const TICK: i32 = 4;
/// Smallest annotation size worth printing; below it numbers are dropped (the figure's alt text
/// and the section's tables still give them). A figure 360 units wide shows at about 333 px in a
/// phone's column and plotters writes text at 0.806 of its nominal size, so 14.75 is the least
/// that still reads at 11 px there.
const MIN_ANNOTATION: f64 = 14.75;
/// Largest annotation size.
const MAX_ANNOTATION: f64 = 15.0;
/// Colour-bar slices: enough for a smooth ramp, few enough for a small SVG.
const BAR_SLICES: i32 = 64;

/// Where everything goes, worked out from measured text before drawing.
struct Layout {
    cell: i32,
    grid_x0: i32,
    grid_y0: i32,
    /// Column labels run vertically (reading upward) when they are wider than a cell.
    vertical_cols: bool,
    col_labels: Vec<String>,
    row_labels: Vec<String>,
    /// Only every `row_every`-th row label is drawn, so labels never overlap.
    row_every: usize,
    col_every: usize,
    /// Height of the column-label band under the grid.
    col_band: i32,
    label_size: f64,
    /// Size of the column labels (horizontal ones may be a little smaller).
    col_size: f64,
    left_edge: i32,
    /// Top of the content below the title.
    top: i32,
}

impl Checked<'_> {
    fn layout(&self, width: i32, height: i32, top: i32) -> Layout {
        let spec = self.spec;
        let axis = text(AXIS_TITLE_SIZE, MUTED);
        let axis_h = measure(&axis, "Ag").1;
        let axis_band = |title: &str| if title.is_empty() { 0 } else { axis_h + GAP };
        // Many tokens get slightly smaller labels before any are dropped.
        let label_size = if self.n_q.max(self.n_k) > 16 { LABEL_SIZE - 2.0 } else { LABEL_SIZE };
        let label = text(label_size, INK);
        let label_h = measure(&label, "Ag").1;

        let right_w =
            3 * GAP + BAR_WIDTH + TICK + GAP + self.bar_label_width() + GAP + axis_band(&spec.colorbar_title);
        let row_labels: Vec<String> =
            spec.row_labels.iter().map(|l| fit(&bold(label_size, INK), l, width / 5)).collect();
        let row_label_w = row_labels.iter().map(|l| measure(&bold(label_size, INK), l).0).max().unwrap_or(0);
        let left_w = axis_band(&spec.row_title) + row_label_w + ROW_LABEL_GAP;
        let avail_w = width - 2 * MARGIN - left_w - right_w;
        let title_band = axis_band(&spec.col_title);

        let fit_cell = |band: i32| {
            let avail_h = height - top - MARGIN - band;
            (avail_w / self.n_k as i32).min(avail_h / self.n_q as i32).clamp(1, MAX_CELL)
        };
        let horizontal_band = GAP + 2 + label_h + GAP + title_band;
        let mut cell = fit_cell(horizontal_band);
        // Column labels stay horizontal if they fit a cell, at full size or
        // a little smaller; otherwise they turn to read upward.
        let widest_at = |size: f64| {
            let style = text(size, INK);
            spec.col_labels.iter().map(|l| measure(&style, l).0).max().unwrap_or(0)
        };
        let smaller = (label_size - 2.0).max(10.0);
        let horizontal_size = [label_size, smaller].into_iter().find(|&size| widest_at(size) + GAP <= cell);
        let vertical_cols = horizontal_size.is_none();
        let col_size = horizontal_size.unwrap_or(label_size);
        let (col_labels, col_band) = if vertical_cols {
            let labels: Vec<String> = spec.col_labels.iter().map(|l| fit(&label, l, height / 5)).collect();
            let longest = labels.iter().map(|l| measure(&label, l).0).max().unwrap_or(0);
            let band = GAP + 2 + longest + GAP + title_band;
            cell = fit_cell(band);
            (labels, band)
        } else {
            (spec.col_labels.clone(), horizontal_band)
        };
        let every = |pitch: i32| (((pitch + 2) as f64) / cell as f64).ceil().max(1.0) as usize;

        let grid_w = cell * self.n_k as i32;
        let grid_h = cell * self.n_q as i32;
        let block_w = left_w + grid_w + right_w;
        let left_edge = ((width - block_w) / 2).max(MARGIN);
        let block_h = grid_h + col_band;
        let grid_y0 = top + ((height - MARGIN - top - block_h) / 2).max(0);
        Layout {
            cell,
            grid_x0: left_edge + left_w,
            grid_y0,
            vertical_cols,
            col_labels,
            row_labels,
            row_every: every(label_h),
            col_every: if vertical_cols { every(label_h) } else { 1 },
            col_band,
            label_size,
            col_size,
            left_edge,
            top,
        }
    }

    fn bar_ticks(&self) -> ticks::Ticks {
        ticks::linear(self.lo, self.hi, 5, false)
    }

    fn bar_label_width(&self) -> i32 {
        let style = text(LABEL_SIZE, INK);
        self.bar_ticks().labels.iter().map(|l| measure(&style, l).0).max().unwrap_or(0)
    }

    /// The annotation size that fits the widest number in a cell, if any does.
    fn annotation_size(&self, cell: i32) -> Option<f64> {
        let widest = (0..self.n_q)
            .flat_map(|i| (0..self.n_k).map(move |j| (i, j)))
            .filter(|&(i, j)| !self.is_masked(i, j))
            .map(|(i, j)| fixed(self.spec.weights[i][j], self.spec.decimals))
            .max_by_key(|s| s.len())?;
        // As large as the cell holds, up to the largest size: a number needs its width plus a
        // margin of 3 on each side, and a line of text within half the cell's height, so that the
        // rows of numbers stay apart. (A cap of 0.28 of the cell once dropped the numbers of
        // five-token matrices at 360 units, whose cells hold them.)
        let base = MAX_ANNOTATION;
        let room = f64::from(cell - 6);
        let (w, h) = measure(&text(base, INK), &widest);
        let size = base * (room / f64::from(w)).min(f64::from(cell) / f64::from(2 * h)).min(1.0);
        (size >= MIN_ANNOTATION).then_some(size)
    }
}

impl Draw for Checked<'_> {
    const NAME: &'static str = "attention heatmap";

    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB> {
        let spec = self.spec;
        let top = draw_frame(root, &spec.title)?;
        let (width, height) = root.dim_in_pixel();
        let l = self.layout(width as i32, height as i32, top);
        let x = |j: usize| l.grid_x0 + j as i32 * l.cell;
        let y = |i: usize| l.grid_y0 + i as i32 * l.cell;
        let (grid_x1, grid_y1) = (x(self.n_k), y(self.n_q));
        let annotation = self.annotation_size(l.cell);

        for i in 0..self.n_q {
            // Each run of masked cells gets one fill and one continuous
            // hatch: fewer SVG elements than per-cell hatching, and the
            // lines run on unbroken across cells and rows.
            let mut j = 0;
            while j < self.n_k {
                if !self.is_masked(i, j) {
                    j += 1;
                    continue;
                }
                let start = j;
                while j < self.n_k && self.is_masked(i, j) {
                    j += 1;
                }
                let corners = [(x(start), y(i)), (x(j), y(i + 1))];
                root.draw(&Rectangle::new(corners, MASK_FILL.filled()))?;
                draw_hatch(root, corners[0], corners[1])?;
            }
            for j in 0..self.n_k {
                let (x0, y0, x1, y1) = (x(j), y(i), x(j + 1), y(i + 1));
                let (cx, cy) = ((x0 + x1) / 2, (y0 + y1) / 2);
                if self.is_masked(i, j) {
                    if let Some(size) = annotation {
                        let style = text(size, MUTED);
                        let word = if measure(&style, "masked").0 <= l.cell - 8 { "masked" } else { "–" };
                        root.draw(&Text::new(word, (cx, cy), anchored(style, HPos::Center, VPos::Center)))?;
                    }
                    continue;
                }
                let v = spec.weights[i][j];
                let fill = self.color(v);
                root.draw(&Rectangle::new([(x0, y0), (x1, y1)], fill.filled()))?;
                if let Some(size) = annotation {
                    let ink = if luminance(fill) > 0.3 { INK } else { WHITE };
                    root.draw(&Text::new(
                        fixed(v, spec.decimals),
                        (cx, cy),
                        anchored(text(size, ink), HPos::Center, VPos::Center),
                    ))?;
                }
            }
        }
        // Thin white rules separate cells while they are large enough to read.
        if l.cell >= 8 {
            let rule = WHITE.stroke_width(1);
            for j in 1..self.n_k {
                root.draw(&PathElement::new(vec![(x(j), l.grid_y0), (x(j), grid_y1)], rule))?;
            }
            for i in 1..self.n_q {
                root.draw(&PathElement::new(vec![(l.grid_x0, y(i)), (grid_x1, y(i))], rule))?;
            }
        }
        if let Some(i) = spec.highlight_row {
            // Four filled bands rather than a stroked rectangle: the SVG
            // backend ignores the stroke width of rectangle outlines.
            let (x0, y0, x1, y1) = (l.grid_x0 - 2, y(i) - 2, grid_x1 + 2, y(i + 1) + 2);
            let t = 3;
            for band in [
                [(x0, y0), (x1, y0 + t)],
                [(x0, y1 - t), (x1, y1)],
                [(x0, y0), (x0 + t, y1)],
                [(x1 - t, y0), (x1, y1)],
            ] {
                root.draw(&Rectangle::new(band, ACCENT.filled()))?;
            }
        }

        self.draw_row_labels(root, &l)?;
        self.draw_col_labels(root, &l, grid_y1)?;
        self.draw_colorbar(root, &l, grid_x1, grid_y1)
    }
}

impl Checked<'_> {
    fn draw_row_labels<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        l: &Layout,
    ) -> DrawResult<DB> {
        for (i, label) in l.row_labels.iter().enumerate() {
            let highlighted = self.spec.highlight_row == Some(i);
            if i % l.row_every != 0 && !highlighted {
                continue;
            }
            let style = if highlighted { bold(l.label_size, ACCENT) } else { text(l.label_size, INK) };
            let cy = l.grid_y0 + i as i32 * l.cell + l.cell / 2;
            root.draw(&Text::new(
                label.clone(),
                (l.grid_x0 - ROW_LABEL_GAP, cy),
                anchored(style, HPos::Right, VPos::Center),
            ))?;
        }
        if !self.spec.row_title.is_empty() {
            let axis = text(AXIS_TITLE_SIZE, MUTED);
            let axis_h = measure(&axis, "Ag").1;
            let cy = l.grid_y0 + self.n_q as i32 * l.cell / 2;
            root.draw(&Text::new(
                self.spec.row_title.clone(),
                (l.left_edge + axis_h / 2, cy),
                anchored(axis, HPos::Center, VPos::Center).transform(FontTransform::Rotate270),
            ))?;
        }
        Ok(())
    }

    fn draw_col_labels<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        l: &Layout,
        grid_y1: i32,
    ) -> DrawResult<DB> {
        let style = text(l.col_size, INK);
        for (j, label) in l.col_labels.iter().enumerate() {
            if j % l.col_every != 0 {
                continue;
            }
            let cx = l.grid_x0 + j as i32 * l.cell + l.cell / 2;
            let placed = if l.vertical_cols {
                anchored(style.clone(), HPos::Right, VPos::Center).transform(FontTransform::Rotate270)
            } else {
                anchored(style.clone(), HPos::Center, VPos::Top)
            };
            root.draw(&Text::new(label.clone(), (cx, grid_y1 + GAP + 2), placed))?;
        }
        if !self.spec.col_title.is_empty() {
            let axis = text(AXIS_TITLE_SIZE, MUTED);
            let axis_h = measure(&axis, "Ag").1;
            let cx = l.grid_x0 + self.n_k as i32 * l.cell / 2;
            root.draw(&Text::new(
                self.spec.col_title.clone(),
                (cx, grid_y1 + l.col_band - axis_h),
                anchored(axis, HPos::Center, VPos::Top),
            ))?;
        }
        Ok(())
    }

    fn draw_colorbar<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        l: &Layout,
        grid_x1: i32,
        grid_y1: i32,
    ) -> DrawResult<DB> {
        let (_, height) = root.dim_in_pixel();
        let grid_h = grid_y1 - l.grid_y0;
        // A one-row matrix still gets a readable bar, centred on the grid.
        let room = height as i32 - MARGIN - l.top;
        let bar_h = grid_h.max(160.min(room));
        let mid = (l.grid_y0 + grid_y1) / 2;
        let bar_y0 = (mid - bar_h / 2).clamp(l.top, (height as i32 - MARGIN - bar_h).max(l.top));
        let bar_y1 = bar_y0 + bar_h;
        let bar_x0 = grid_x1 + 3 * GAP;
        let bar_x1 = bar_x0 + BAR_WIDTH;
        let slice_y =
            |k: i32| bar_y1 - (f64::from(k) * f64::from(bar_h) / f64::from(BAR_SLICES)).round() as i32;
        for k in 0..BAR_SLICES {
            let t = (f64::from(k) + 0.5) / f64::from(BAR_SLICES);
            root.draw(&Rectangle::new(
                [(bar_x0, slice_y(k + 1)), (bar_x1, slice_y(k))],
                ViridisRGB::get_color(t).filled(),
            ))?;
        }
        root.draw(&Rectangle::new([(bar_x0, bar_y0), (bar_x1, bar_y1)], AXIS.stroke_width(1)))?;

        let ticks = self.bar_ticks();
        let label = text(LABEL_SIZE, INK);
        for (v, s) in ticks.values.iter().zip(&ticks.labels) {
            let ty = bar_y1 - ((v - self.lo) / (self.hi - self.lo) * f64::from(bar_h)).round() as i32;
            root.draw(&PathElement::new(vec![(bar_x1, ty), (bar_x1 + TICK, ty)], AXIS.stroke_width(1)))?;
            root.draw(&Text::new(
                s.clone(),
                (bar_x1 + TICK + GAP, ty),
                anchored(label.clone(), HPos::Left, VPos::Center),
            ))?;
        }
        if !self.spec.colorbar_title.is_empty() {
            let axis = text(AXIS_TITLE_SIZE, MUTED);
            let axis_h = measure(&axis, "Ag").1;
            let x = bar_x1 + TICK + GAP + self.bar_label_width() + GAP + axis_h / 2;
            root.draw(&Text::new(
                self.spec.colorbar_title.clone(),
                (x, (bar_y0 + bar_y1) / 2),
                anchored(axis, HPos::Center, VPos::Center).transform(FontTransform::Rotate270),
            ))?;
        }
        Ok(())
    }
}

/// Spacing of the hatch lines in a masked cell.
const HATCH: i32 = 7;

/// Diagonal hatching ("/") clipped to the cell, so masked cells read as
/// "nothing here" even in greyscale print.
fn draw_hatch<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    p0: (i32, i32),
    p1: (i32, i32),
) -> DrawResult<DB> {
    let ((x0, y0), (x1, y1)) = (p0, p1);
    let style = MASK_HATCH.stroke_width(1);
    // Lines sit on x + y = a multiple of HATCH, so neighbouring runs line up.
    let mut c = (x0 + y0).div_euclid(HATCH) * HATCH + HATCH;
    while c < x1 + y1 {
        // The line x + y = c, clipped to the rectangle.
        let xa = x0.max(c - y1);
        let xb = x1.min(c - y0);
        root.draw(&PathElement::new(vec![(xa, c - xa), (xb, c - xb)], style))?;
        c += HATCH;
    }
    Ok(())
}
