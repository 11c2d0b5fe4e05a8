//! The qkv lesson pipeline: markdown in, recomputed numbers, generated blocks, figures and HTML
//! pages out. String in, string out: it never touches files (xtask does).
//!
//! Data flow: each file is parsed ([`document`]) into `qkv` blocks (declarations), citations and
//! generated regions; declarations are evaluated with the engine ([`eval`]); citations and regions
//! get their new text ([`generate`], [`figures`]); the differences are the stale places; the
//! updated markdown is rendered to HTML ([`html`]).

mod document;
mod error;
mod eval;
mod examples;
mod figures;
mod format;
mod generate;
mod html;
mod location;
mod notebook;
mod pipeline;
mod values;

pub use error::{ContentError, ContentErrors};
pub use pipeline::{
    Build, FigureFile, OutputFile, SourceFile, Sources, Stale, build, check, records, section_id,
};
