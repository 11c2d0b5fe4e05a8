//! Registers the embedded DejaVu Sans faces with plotters exactly once.

use std::sync::OnceLock;

use plotters::style::{FontStyle, register_font};

use crate::PlotError;

/// The family name every text style in this crate uses. It is also the
/// `font-family` written into the SVG: viewers that have DejaVu Sans show
/// exactly the PNG's glyphs, others fall back to their own sans-serif face.
pub(crate) const FAMILY: &str = "DejaVu Sans, sans-serif";

/// Makes DejaVu Sans (regular and bold) available to plotters' `ab_glyph`
/// renderer. Bitmap text cannot be drawn without it, and SVG layout uses it to
/// measure text. Registration happens once per process.
pub(crate) fn ensure_registered() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        register_font(FAMILY, FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && register_font(FAMILY, FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    if ok { Ok(()) } else { Err(PlotError::Font) }
}
