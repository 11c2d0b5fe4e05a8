//! The rendered figure (SVG text plus PNG bytes), its size, and the one
//! routine that draws a figure on both backends.

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::scaled::Scaled;
use crate::{PlotError, font};

/// One rendered figure: the same picture as SVG text and as PNG bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figure {
    /// A standalone SVG document (`<svg …>…</svg>`), deterministic for a given input.
    pub svg: String,
    /// An 8-bit RGB PNG of the same picture, `png_scale` times
    /// [`Figure::width`] × [`Figure::height`] pixels.
    pub png: Vec<u8>,
    /// Width in SVG user units (CSS pixels).
    pub width: u32,
    /// Height in SVG user units.
    pub height: u32,
    /// How many PNG pixels there are per SVG unit, along each side.
    pub png_scale: u32,
}

/// The size of a figure in CSS pixels (SVG user units), and the PNG's pixel
/// density.
///
/// The default is 640 × 480 at one PNG pixel per unit; square figures
/// (heatmaps of many tokens, the query diagram) read best at
/// [`Size::square`]`(640)`. [`Size::with_png_scale`]`(2)` makes a PNG of
/// twice the width and height, sharp on high-density screens, with the same
/// layout as the SVG.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Size {
    /// Width in CSS pixels.
    pub width: u32,
    /// Height in CSS pixels.
    pub height: u32,
    /// PNG pixels per CSS pixel along each side, 1 to [`Size::MAX_PNG_SCALE`].
    pub png_scale: u32,
}

impl Size {
    /// The smallest width any figure accepts.
    pub const MIN_WIDTH: u32 = 240;
    /// The smallest height any figure accepts.
    pub const MIN_HEIGHT: u32 = 180;

    /// The largest side any figure accepts: beyond it a figure is no longer
    /// a course-page picture and its RGB buffer would run to hundreds of megabytes.
    pub const MAX_SIDE: u32 = 8192;

    /// The largest PNG scale.
    pub const MAX_PNG_SCALE: u32 = 4;

    /// A `width` × `height` size with a PNG of the same pixel size.
    pub const fn new(width: u32, height: u32) -> Self {
        Self { width, height, png_scale: 1 }
    }

    /// The same size with `png_scale` PNG pixels per CSS pixel.
    pub const fn with_png_scale(self, png_scale: u32) -> Self {
        Self { png_scale, ..self }
    }

    /// A square `side` × `side` size.
    pub const fn square(side: u32) -> Self {
        Self::new(side, side)
    }

    fn check(self) -> Result<(), PlotError> {
        if self.width < Self::MIN_WIDTH || self.height < Self::MIN_HEIGHT {
            return Err(PlotError::TooSmall {
                width: self.width,
                height: self.height,
                min_width: Self::MIN_WIDTH,
                min_height: Self::MIN_HEIGHT,
            });
        }
        if !(1..=Self::MAX_PNG_SCALE).contains(&self.png_scale) {
            return Err(PlotError::PngScale { png_scale: self.png_scale, max: Self::MAX_PNG_SCALE });
        }
        if self.width > Self::MAX_SIDE || self.height > Self::MAX_SIDE {
            return Err(PlotError::TooLarge { width: self.width, height: self.height, max: Self::MAX_SIDE });
        }
        Ok(())
    }
}

impl Default for Size {
    fn default() -> Self {
        Self::new(640, 480)
    }
}

/// The error type of drawing on backend `DB`.
pub(crate) type DrawResult<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// A validated figure that can draw itself on any plotters backend. Drawing
/// is generic so the SVG and the PNG come from the same code.
pub(crate) trait Draw {
    /// The figure's name in error messages.
    const NAME: &'static str;

    /// Draws the whole figure onto `root`, which covers the full size.
    fn draw<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> DrawResult<DB>;
}

/// Draws `figure` as SVG and as PNG at `size`.
pub(crate) fn render<F: Draw>(figure: &F, size: Size) -> Result<Figure, PlotError> {
    size.check()?;
    font::ensure_registered()?;
    let dims = (size.width, size.height);
    let draw_error = |e: &dyn std::fmt::Display| PlotError::Draw { figure: F::NAME, message: e.to_string() };

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, dims).into_drawing_area();
        figure.draw(&root).map_err(|e| draw_error(&e))?;
        root.present().map_err(|e| draw_error(&e))?;
    }

    let scale = size.png_scale;
    let (png_w, png_h) = (size.width * scale, size.height * scale);
    let mut rgb = vec![255u8; png_w as usize * png_h as usize * 3];
    {
        let bitmap = BitMapBackend::with_buffer(&mut rgb, (png_w, png_h));
        if scale == 1 { draw_on(figure, bitmap) } else { draw_on(figure, Scaled::new(bitmap, scale)) }
            .map_err(|e| draw_error(&e))?;
    }
    let png = encode_png(&rgb, png_w, png_h)
        .map_err(|e| PlotError::Encode { figure: F::NAME, message: e.to_string() })?;

    Ok(Figure { svg, png, width: size.width, height: size.height, png_scale: scale })
}

/// Draws `figure` on `backend` and flushes it.
fn draw_on<F: Draw, DB: DrawingBackend>(
    figure: &F,
    backend: DB,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let root = backend.into_drawing_area();
    figure.draw(&root)?;
    root.present()
}

/// Encodes an RGB buffer as PNG in memory. The encoder settings are fixed, so
/// the bytes depend only on the pixels.
fn encode_png(rgb: &[u8], width: u32, height: u32) -> Result<Vec<u8>, png::EncodingError> {
    let mut out = Vec::new();
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    // Figures are flat colour: adaptive filtering with the default
    // compression keeps them small without slowing the lesson build.
    encoder.set_compression(png::Compression::Default);
    encoder.set_filter(png::FilterType::Paeth);
    encoder.set_adaptive_filter(png::AdaptiveFilterType::Adaptive);
    let mut writer = encoder.write_header()?;
    writer.write_image_data(rgb)?;
    writer.finish()?;
    Ok(out)
}

/// The text content of every `<text>` element of an SVG, in order, for tests
/// that look for a label or annotation.
#[cfg(test)]
pub(crate) fn svg_texts(svg: &str) -> Vec<&str> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim()))
        .collect()
}
