//! The files the pipeline reads and writes, as plain data: lesson sources, figure files, site
//! files, and the section id a file name gives. The bottom layer: every other module may use it.

use std::collections::{BTreeMap, BTreeSet};

/// One lesson file, as text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// The path shown in messages (e.g. `content/01-attention.md`); its file stem, less any
    /// leading `NN-`, is the section id.
    pub path: String,
    /// The markdown.
    pub text: String,
}

/// Everything the pipeline reads: the lesson files in order, which figure files exist, and the
/// data files that `measurements` figures draw.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Lesson sections, in reading order.
    pub markdown: Vec<SourceFile>,
    /// Figure files present next to the lesson, as `figures/NAME.svg` / `figures/NAME.png`.
    pub figures: BTreeSet<String>,
    /// What each SVG figure file says it was drawn from (`figures/NAME.svg` → the hash that
    /// [`drawn_from`] reads in it). A figure is current only if its file says so, not only its
    /// region: a lesson reverted to an earlier input keeps the earlier hash, whatever was drawn
    /// since. A figure missing here is drawn again.
    pub figure_hashes: BTreeMap<String, String>,
    /// Data files next to the lesson, `data/NAME.toml` → its text (measured numbers, such as a
    /// benchmark's, that no example computes).
    pub data: BTreeMap<String, String>,
}

/// A rendered figure file (`figures/NAME.svg` or `.png`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FigureFile {
    /// Path relative to the content folder and to the site.
    pub name: String,
    /// The file's bytes.
    pub bytes: Vec<u8>,
}

/// What an SVG figure file says it was drawn from: the hash of its inputs, in the comment the
/// build writes after its root element; `None` for a file without one.
pub fn drawn_from(svg: &str) -> Option<&str> {
    let (_, after) = svg.rsplit_once(DRAWN_FROM)?;
    after.split_whitespace().next()
}

/// `svg` with the hash of the inputs it was drawn from (see [`drawn_from`]).
pub(crate) fn marked_drawn_from(mut svg: String, hash: &str) -> String {
    svg.push_str(&format!("\n<!-- {DRAWN_FROM}{hash} -->\n"));
    svg
}

/// The comment's words before the hash, in a lesson's figure region and in the SVG file.
pub(crate) const DRAWN_FROM: &str = "qkv-figure-hash ";

/// A text file of the site (page, stylesheet, notebook, markdown copy).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputFile {
    /// Path relative to the site folder.
    pub name: String,
    /// Its text.
    pub text: String,
}

/// The file name of `path`: what follows its last `/` or `\\`.
pub(crate) fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// Which of `markdown`'s files a link's file part (`02-causal-masking.md`) names: the site turns
/// such a link into one to that section's page.
pub(crate) fn linked_file(markdown: &[SourceFile], file: &str) -> Option<usize> {
    markdown.iter().position(|f| file_name(&f.path) == file)
}

/// The section id of a lesson file: its stem without a leading `NN-` (`01-attention.md` → `attention`).
pub fn section_id(path: &str) -> String {
    let name = file_name(path);
    let stem = name.strip_suffix(".md").unwrap_or(name);
    let trimmed = stem.trim_start_matches(|c: char| c.is_ascii_digit());
    match trimmed.strip_prefix('-') {
        Some(rest) if trimmed.len() < stem.len() => rest.to_string(),
        _ => stem.to_string(),
    }
}
