//! The qkv lesson pipeline: markdown in, recomputed numbers, generated blocks, figures and HTML
//! pages out. String in, string out: it never touches files (`cargo xtask build-content` does).
//!
//! Data flow: each lesson file is parsed (module `document`) into `qkv` blocks (declarations),
//! citations and generated regions; declarations are evaluated with the engine's f64 reference
//! path (`eval`); citations and regions get their new text (`region`, one module per kind; `figures`); where that
//! differs from the file, the place is stale; the updated markdown is rendered to HTML (`html`).
//! The modules form layers, listed in `tests/e2e/layers.rs`, and every `use crate::` points down.
//!
//! ```no_run
//! use qkv_course::{SourceFile, Sources};
//! let sources = Sources {
//!     markdown: vec![SourceFile { path: "content/01-attention.md".into(), text: String::new() }],
//!     ..Default::default()
//! };
//! let stale = qkv_course::check(&sources)?;          // what `--check` reports
//! let build = qkv_course::build(&sources)?;          // updated markdown, figures, site
//! # Ok::<(), qkv_course::ContentErrors>(())
//! ```
//!
//! The authoring format is described in `content/README.md`.

mod citation;
mod document;
mod encoding;
mod error;
mod eval;
mod examples;
mod figure_kind;
mod figures;
mod files;
mod format;
mod html;
mod leftovers;
mod limits;
mod location;
mod markup;
mod measured;
mod notebook;
mod pipeline;
mod region;
mod stale;
mod values;

pub use encoding::decode;
pub use error::{ContentError, ContentErrors};
pub use files::{FigureFile, OutputFile, SourceFile, Sources, drawn_from, section_id};
pub use leftovers::leftover_citations;
/// HTML-escapes text (for pages and attributes): what every page of the site uses.
pub use markup::escape as escape_html;
pub use pipeline::{Build, build, check, records};
pub use stale::{Stale, stale_report};

/// The workspace README's example of embedding the engine, compiled and run as a doctest so it
/// cannot rot. It lives here rather than in `qkv`, whose packaged crate has no workspace around it.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct WorkspaceReadmeExample;
