//! A drawing backend that draws every figure at an integer multiple of its
//! size, so the PNG can be sharp on high-density screens while the layout
//! code keeps working in the figure's own (SVG) pixels.

use plotters::prelude::*;
use plotters_backend::{BackendColor, BackendCoord, BackendStyle, BackendTextStyle, DrawingErrorKind};

use crate::font::FAMILY;

/// Wraps a backend of `factor` times the logical size; coordinates, line
/// widths and type sizes are multiplied before they reach it.
pub(crate) struct Scaled<B> {
    inner: B,
    factor: i32,
}

impl<B: DrawingBackend> Scaled<B> {
    /// Wraps `inner`, whose size must be `factor` times the logical size.
    pub(crate) fn new(inner: B, factor: u32) -> Self {
        Self { inner, factor: factor.max(1) as i32 }
    }

    fn at(&self, (x, y): BackendCoord) -> BackendCoord {
        (x * self.factor, y * self.factor)
    }

    fn style<S: BackendStyle>(&self, style: &S) -> Thick {
        Thick { color: style.color(), width: style.stroke_width() * self.factor as u32 }
    }
}

/// A style with its stroke width already multiplied.
struct Thick {
    color: BackendColor,
    width: u32,
}

impl BackendStyle for Thick {
    fn color(&self) -> BackendColor {
        self.color
    }

    fn stroke_width(&self) -> u32 {
        self.width
    }
}

impl<B: DrawingBackend> DrawingBackend for Scaled<B> {
    type ErrorType = B::ErrorType;

    fn get_size(&self) -> (u32, u32) {
        let (w, h) = self.inner.get_size();
        (w / self.factor as u32, h / self.factor as u32)
    }

    fn ensure_prepared(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.ensure_prepared()
    }

    fn present(&mut self) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        self.inner.present()
    }

    fn draw_pixel(
        &mut self,
        point: BackendCoord,
        color: BackendColor,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let (x, y) = self.at(point);
        let f = self.factor - 1;
        self.inner.draw_rect((x, y), (x + f, y + f), &color, true)
    }

    fn draw_line<S: BackendStyle>(
        &mut self,
        from: BackendCoord,
        to: BackendCoord,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        // A wide line is a path, which the inner backend turns into a polygon.
        let thick = self.style(style);
        let (from, to) = (self.at(from), self.at(to));
        self.inner.draw_path([from, to], &thick)
    }

    fn draw_rect<S: BackendStyle>(
        &mut self,
        upper_left: BackendCoord,
        bottom_right: BackendCoord,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let thick = self.style(style);
        let (ul, br) = (self.at(upper_left), self.at(bottom_right));
        if fill {
            self.inner.draw_rect(ul, br, &thick, true)
        } else {
            self.inner.draw_path([ul, (br.0, ul.1), br, (ul.0, br.1), ul], &thick)
        }
    }

    fn draw_path<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        path: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let thick = self.style(style);
        let points: Vec<BackendCoord> = path.into_iter().map(|p| self.at(p)).collect();
        self.inner.draw_path(points, &thick)
    }

    fn draw_circle<S: BackendStyle>(
        &mut self,
        center: BackendCoord,
        radius: u32,
        style: &S,
        fill: bool,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let thick = self.style(style);
        let center = self.at(center);
        self.inner.draw_circle(center, radius * self.factor as u32, &thick, fill)
    }

    fn fill_polygon<S: BackendStyle, I: IntoIterator<Item = BackendCoord>>(
        &mut self,
        vert: I,
        style: &S,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        let thick = self.style(style);
        let points: Vec<BackendCoord> = vert.into_iter().map(|p| self.at(p)).collect();
        self.inner.fill_polygon(points, &thick)
    }

    fn draw_text<S: BackendTextStyle>(
        &mut self,
        text: &str,
        style: &S,
        pos: BackendCoord,
    ) -> Result<(), DrawingErrorKind<Self::ErrorType>> {
        // Every text style in this crate uses FAMILY; rebuild the style at
        // the multiplied size so glyphs are rasterised sharp, not enlarged.
        let c = style.color();
        let big = (FAMILY, style.size() * f64::from(self.factor), style.style())
            .into_font()
            .color(&RGBAColor(c.rgb.0, c.rgb.1, c.rgb.2, c.alpha))
            .pos(style.anchor())
            .transform(style.transform());
        let pos = self.at(pos);
        self.inner.draw_text(text, &big, pos)
    }
}
