//! The house look shared by every figure: colours, type sizes, margins, text
//! measurement and number formatting.

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::figure::DrawResult;
use crate::font::FAMILY;

/// Body text, titles and tick labels.
pub(crate) const INK: RGBColor = RGBColor(34, 34, 34);
/// Secondary text such as axis titles.
pub(crate) const MUTED: RGBColor = RGBColor(85, 85, 85);
/// Axis lines and tick marks.
pub(crate) const AXIS: RGBColor = RGBColor(120, 120, 120);
/// Grid lines: visible, but quieter than any data.
pub(crate) const GRID: RGBColor = RGBColor(228, 228, 228);
/// Fill of a masked heatmap cell.
pub(crate) const MASK_FILL: RGBColor = RGBColor(240, 240, 240);
/// Hatching of a masked heatmap cell.
pub(crate) const MASK_HATCH: RGBColor = RGBColor(185, 185, 185);
/// The current-query marker line: dark, so it never reads as a data series.
pub(crate) const MARKER: RGBColor = RGBColor(70, 70, 70);
/// Accent for the highlighted row.
pub(crate) const ACCENT: RGBColor = RGBColor(213, 94, 0);

/// Categorical colours from the Okabe–Ito palette, which stays distinct under
/// the common colour-vision deficiencies. Yellow is left out: it vanishes on
/// white. Series cycle through these in order.
pub(crate) const PALETTE: [RGBColor; 6] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
];

/// The `i`-th categorical colour, cycling.
pub(crate) fn palette(i: usize) -> RGBColor {
    PALETTE[i % PALETTE.len()]
}

/// Figure title size in pixels.
pub(crate) const TITLE_SIZE: f64 = 19.0;
/// Axis title size.
pub(crate) const AXIS_TITLE_SIZE: f64 = 16.0;
/// Tick label and legend size.
pub(crate) const LABEL_SIZE: f64 = 16.0;
/// Outer margin on every side.
pub(crate) const MARGIN: i32 = 14;
/// Gap between a label and what it labels.
pub(crate) const GAP: i32 = 6;
/// Most decimals any figure prints.
pub(crate) const MAX_DECIMALS: usize = 8;

/// A regular text style of `size` pixels in `color`.
pub(crate) fn text(size: f64, color: RGBColor) -> TextStyle<'static> {
    (FAMILY, size).into_font().color(&color)
}

/// A bold text style of `size` pixels in `color`.
pub(crate) fn bold(size: f64, color: RGBColor) -> TextStyle<'static> {
    (FAMILY, size, FontStyle::Bold).into_font().color(&color)
}

/// The same style anchored at `h`, `v`.
pub(crate) fn anchored(style: TextStyle<'static>, h: HPos, v: VPos) -> TextStyle<'static> {
    style.pos(Pos::new(h, v))
}

/// Width and height of `s` in `style`, in pixels, measured with DejaVu Sans.
pub(crate) fn measure(style: &TextStyle<'_>, s: &str) -> (i32, i32) {
    // Layout may be asked for before anything is drawn (tests do): make
    // sure the measuring font is there, or the guess below would be used.
    let registered = crate::font::ensure_registered().is_ok();
    match style.font.box_size(s).ok().filter(|_| registered) {
        Some((w, h)) => (w as i32, h as i32),
        // Only a broken build lacks the font: a generous estimate keeps the
        // layout from overlapping.
        None => {
            ((style.font.get_size() * 0.65 * s.chars().count() as f64) as i32, style.font.get_size() as i32)
        }
    }
}

/// `s` shortened with an ellipsis so it is at most `max_width` pixels wide.
pub(crate) fn fit(style: &TextStyle<'_>, s: &str, max_width: i32) -> String {
    if measure(style, s).0 <= max_width {
        return s.to_owned();
    }
    let chars: Vec<char> = s.chars().collect();
    for keep in (0..chars.len()).rev() {
        let candidate: String = chars[..keep].iter().chain(std::iter::once(&'…')).collect();
        if measure(style, &candidate).0 <= max_width {
            return candidate;
        }
    }
    "…".to_owned()
}

/// `value` with exactly `decimals` decimals; negative zero prints as zero.
pub(crate) fn fixed(value: f64, decimals: usize) -> String {
    let s = format!("{value:.decimals$}");
    if s.starts_with('-') && s[1..].chars().all(|c| c == '0' || c == '.') { s[1..].to_owned() } else { s }
}

/// `value` with at most `decimals` decimals, trailing zeros dropped.
pub(crate) fn trimmed(value: f64, decimals: usize) -> String {
    let s = fixed(value, decimals);
    if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_owned() } else { s }
}

/// Relative luminance of `c` (sRGB, 0 = black, 1 = white), to pick
/// annotation ink that contrasts with a cell.
pub(crate) fn luminance(c: RGBColor) -> f64 {
    fn channel(v: u8) -> f64 {
        let v = f64::from(v) / 255.0;
        if v <= 0.040_45 { v / 12.92 } else { ((v + 0.055) / 1.055).powf(2.4) }
    }
    0.2126 * channel(c.0) + 0.7152 * channel(c.1) + 0.0722 * channel(c.2)
}

/// Paints the background white and draws `title` centred at the top; returns
/// the y coordinate where the content below the title may start.
pub(crate) fn draw_frame<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
) -> Result<i32, DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let (width, _) = root.dim_in_pixel();
    if !title.is_empty() {
        let style = bold(TITLE_SIZE, INK);
        let shown = fit(&style, title, width as i32 - 2 * MARGIN);
        root.draw(&Text::new(shown, (width as i32 / 2, MARGIN), anchored(style, HPos::Center, VPos::Top)))?;
    }
    Ok(frame_top(title, width as i32))
}

/// Where the content under `title` starts in a figure `width` pixels wide, as [`draw_frame`]
/// returns it; lets a layout be worked out without drawing.
pub(crate) fn frame_top(title: &str, width: i32) -> i32 {
    if title.is_empty() {
        return MARGIN;
    }
    let style = bold(TITLE_SIZE, INK);
    let (_, h) = measure(&style, &fit(&style, title, width - 2 * MARGIN));
    MARGIN + h + 2 * GAP
}

/// Draws the frame and title (see [`draw_frame`]) and the legend under them; returns where the
/// content may start and the figure's width and height in pixels.
pub(crate) fn draw_frame_and_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    items: &[LegendItem],
) -> Result<(i32, i32, i32), DrawingAreaErrorKind<DB::ErrorType>> {
    let top = draw_frame(root, title)?;
    let (width, height) = root.dim_in_pixel();
    let (width, height) = (width as i32, height as i32);
    draw_legend(root, items, width / 2, top, width - 2 * MARGIN)?;
    Ok((top + legend_height(items, width - 2 * MARGIN), width, height))
}

/// One legend entry: a label and how to draw its swatch.
pub(crate) struct LegendItem {
    /// The text beside the swatch.
    pub label: String,
    /// Swatch colour.
    pub color: RGBColor,
    /// Dashed rather than solid line.
    pub dashed: bool,
    /// Line width in pixels.
    pub width: u32,
}

/// Length of a legend swatch line.
const SWATCH: i32 = 26;

/// Lays the legend out in centred rows that fit `width`; returns the rows of
/// item indices and the row height.
fn legend_rows(items: &[LegendItem], width: i32) -> (Vec<Vec<usize>>, i32) {
    let style = text(LABEL_SIZE, INK);
    let mut rows: Vec<Vec<usize>> = vec![Vec::new()];
    let mut used = 0;
    for (i, item) in items.iter().enumerate() {
        let w = item_width(&style, item);
        if used > 0 && used + w > width {
            rows.push(Vec::new());
            used = 0;
        }
        used += w;
        if let Some(r) = rows.last_mut() {
            r.push(i);
        }
    }
    let row_height = measure(&style, "Ag").1 + GAP;
    (rows, row_height)
}

fn item_width(style: &TextStyle<'_>, item: &LegendItem) -> i32 {
    SWATCH + GAP + measure(style, &item.label).0 + 3 * GAP
}

/// The height the legend needs in `width` pixels.
pub(crate) fn legend_height(items: &[LegendItem], width: i32) -> i32 {
    if items.is_empty() {
        return 0;
    }
    let (rows, row_height) = legend_rows(items, width);
    rows.len() as i32 * row_height + GAP
}

/// Draws the legend in rows centred on `x_mid`, starting at `top`.
pub(crate) fn draw_legend<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    items: &[LegendItem],
    x_mid: i32,
    top: i32,
    width: i32,
) -> DrawResult<DB> {
    let style = text(LABEL_SIZE, INK);
    let (rows, row_height) = legend_rows(items, width);
    for (r, row) in rows.iter().enumerate() {
        let total: i32 = row.iter().map(|&i| item_width(&style, &items[i])).sum::<i32>() - 3 * GAP;
        let mut x = x_mid - total / 2;
        let y = top + r as i32 * row_height + row_height / 2;
        for &i in row {
            let item = &items[i];
            let line_style = item.color.stroke_width(item.width);
            if item.dashed {
                for k in 0..3 {
                    let x0 = x + k * 10;
                    root.draw(&PathElement::new(vec![(x0, y), (x0 + 6, y)], line_style))?;
                }
            } else {
                root.draw(&PathElement::new(vec![(x, y), (x + SWATCH, y)], line_style))?;
            }
            root.draw(&Text::new(
                item.label.clone(),
                (x + SWATCH + GAP, y),
                anchored(style.clone(), HPos::Left, VPos::Center),
            ))?;
            x += item_width(&style, item);
        }
    }
    Ok(())
}
