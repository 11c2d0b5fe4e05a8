//! Figures for the qkv lesson: plain data in, SVG text and PNG bytes out.
//!
//! Every figure is described by a plain data type (labels, matrices, series,
//! vectors) and rendered by one function that returns a [`Figure`]: the same
//! picture as SVG text and as PNG bytes. The crate never touches files and
//! knows nothing of markdown; the lesson pipeline computes the numbers with the
//! engine and decides where the figures go.
//!
//! | figure | input type | function |
//! | --- | --- | --- |
//! | attention heatmap (optionally masked, one row highlighted) | [`Heatmap`] | [`heatmap`](fn@heatmap) |
//! | keys and query as arrows in the plane | [`QueryDiagram`] | [`query_diagram`](fn@query_diagram) |
//! | weights (and output) as the query sweeps a path | [`ScoreCurves`] | [`score_curves`](fn@score_curves) |
//! | any line chart of labelled series, e.g. the scaling figures | [`LineChart`] | [`line_chart`](fn@line_chart) |
//! | grouped horizontal bars per category, e.g. benchmark throughput | [`BarChart`] | [`bar_chart`](fn@bar_chart) |
//!
//! ```
//! use qkv_plot::{Heatmap, Size, heatmap};
//!
//! let tokens: Vec<String> = ["I", "love", "NLP"].map(String::from).to_vec();
//! let mut spec = Heatmap::new(
//!     tokens.clone(),
//!     tokens,
//!     vec![
//!         vec![0.4011, 0.1978, 0.4011],
//!         vec![0.1978, 0.4011, 0.4011],
//!         vec![0.2483, 0.2483, 0.5035],
//!     ],
//! );
//! spec.decimals = 4;
//! spec.highlight_row = Some(1);
//! let figure = heatmap(&spec, Size::default())?;
//! assert!(figure.svg.starts_with("<svg"));
//! assert!(figure.png.starts_with(b"\x89PNG"));
//! # Ok::<(), qkv_plot::PlotError>(())
//! ```
//!
//! Inputs are checked at this boundary: a ragged matrix, a label count that
//! does not match, a non-finite value, empty data, series of different
//! lengths or a highlighted row out of range is a [`PlotError`] naming the
//! argument and the sizes, never a panic.
//!
//! Output is deterministic: the same input gives byte-identical SVG and PNG,
//! because every number is formatted by this crate before it reaches the
//! figure and nothing depends on the clock, the machine's fonts or hashing.
//!
//! # Font
//!
//! Text is set in DejaVu Sans, embedded from the [`dejavu`] crate (version
//! 2.37 of the DejaVu fonts) and registered with plotters' `ab_glyph` renderer
//! on first use, so rendering needs no system font library. The font's
//! licence (Bitstream Vera derivative, changes in the public domain) ships
//! beside this crate as `LICENSE-DejaVu.txt`. The SVG asks for
//! `DejaVu Sans, sans-serif` and leaves glyphs to the viewer; layout is
//! measured with DejaVu Sans, which is wider than most sans-serif faces, so a
//! fallback face never grows past the room it was given.

mod axes;
mod bar_chart;
mod error;
mod figure;
mod font;
mod heatmap;
mod line_chart;
mod query_diagram;
mod scaled;
mod score_curves;
mod theme;
mod ticks;
mod validate;

/// The version of the house look (type sizes, colours, margins). A caller that keeps drawn
/// figures (the course keeps them by a hash of their data) folds it into its fingerprint, so a
/// change of look redraws them; bump it with any change to `theme.rs` that shows.
pub const LOOK_VERSION: u32 = 5;

pub use bar_chart::{BarChart, BarSeries, ReferenceLine, bar_chart};
pub use error::PlotError;
pub use figure::{Figure, Size};
pub use heatmap::{Heatmap, heatmap};
pub use line_chart::{LineChart, Scale, SecondaryAxis, Series, SeriesStyle, VerticalMarker, line_chart};
pub use query_diagram::{QueryDiagram, Vector2, query_diagram};
pub use score_curves::{ScoreCurves, score_curves};
