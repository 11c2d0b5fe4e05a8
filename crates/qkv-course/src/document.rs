//! One lesson file: where its example blocks, citations and generated regions sit, by byte range.
//!
//! Everything is found through pulldown-cmark's `into_offset_iter`, so a `qkv` marker inside a
//! code block (say, in documentation) is never mistaken for a live one.

use std::ops::Range;

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

use crate::error::Problem;
use crate::format::Format;

/// The markdown extensions every lesson file is parsed with (here and when rendering HTML).
pub(crate) fn markdown_options() -> Options {
    Options::ENABLE_MATH
        | Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_SMART_PUNCTUATION
}

/// A fenced block whose info string starts with `qkv`: a declaration (example, computation, figure).
#[derive(Debug, Clone)]
pub(crate) struct Block {
    /// The word after `qkv` in the info string (`attention`, `softmax`, ...).
    pub kind: String,
    /// Byte offset of the opening fence.
    pub start: usize,
    /// The block's content, as TOML text.
    pub content: String,
    /// Pieces of `content` and where each begins in the source: `(content offset, source offset)`.
    pieces: Vec<(usize, usize)>,
}

impl Block {
    /// Source byte offset of byte `offset` of the block's content.
    pub(crate) fn source_offset(&self, offset: usize) -> usize {
        let i = self.pieces.partition_point(|&(c, _)| c <= offset).max(1) - 1;
        match self.pieces.get(i) {
            Some(&(c, s)) => s + (offset - c),
            None => self.start,
        }
    }
}

/// A number in the prose written as a link `[4.41](=sentence.love.output:2)`.
#[derive(Debug, Clone)]
pub(crate) struct Citation {
    /// Which value, e.g. `sentence.love.output`.
    pub path: String,
    /// Byte offset of the path in the source (for error positions).
    pub path_at: usize,
    /// How the value is shown.
    pub format: Format,
    /// The byte range of the link text: what the build rewrites.
    pub text: Range<usize>,
}

/// A generated region: `<!-- qkv KIND ARGS -->`, generated markdown, `<!-- /qkv -->`.
#[derive(Debug, Clone)]
pub(crate) struct Region {
    /// The words inside the opening marker after `qkv`.
    pub directive: Vec<String>,
    /// Byte offset of the opening marker.
    pub start: usize,
    /// The generated body between the markers: what the build rewrites.
    pub body: Range<usize>,
}

/// A parsed lesson file.
#[derive(Debug, Clone)]
pub(crate) struct Document {
    pub blocks: Vec<Block>,
    pub citations: Vec<Citation>,
    pub regions: Vec<Region>,
    /// The first level-1 heading's text.
    pub title: Option<String>,
}

/// A citation link being read: destination, path offset, inner events (range, is text).
type OpenLink = (String, usize, Vec<(Range<usize>, bool)>);

/// How a generated region's opening marker starts.
pub(crate) const OPEN: &str = "<!-- qkv ";
/// A generated region's closing marker.
pub(crate) const CLOSE: &str = "<!-- /qkv -->";

/// Finds the blocks, citations and regions of document number `doc`.
pub(crate) fn parse(doc: usize, text: &str) -> Result<Document, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut document =
        Document { blocks: Vec::new(), citations: Vec::new(), regions: Vec::new(), title: None };
    let mut open_region: Option<(Vec<String>, usize, usize)> = None;
    let mut block: Option<Block> = None;
    let mut link: Option<OpenLink> = None;
    let mut heading: Option<String> = None;

    for (event, range) in Parser::new_ext(text, markdown_options()).into_offset_iter() {
        // Events inside a generated region belong to the build, not the author.
        let in_region = open_region.is_some();
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) if !in_region => {
                let mut words = info.split_whitespace();
                if words.next() == Some("qkv") {
                    let kind = words.next().unwrap_or("").to_string();
                    block =
                        Some(Block { kind, start: range.start, content: String::new(), pieces: Vec::new() });
                }
            }
            Event::Text(t) if block.is_some() => {
                if let Some(b) = block.as_mut() {
                    b.pieces.push((b.content.len(), range.start));
                    b.content.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => {
                if let Some(b) = block.take() {
                    document.blocks.push(b);
                }
            }
            Event::Html(html) => {
                let trimmed = html.trim();
                if trimmed == CLOSE {
                    match open_region.take() {
                        Some((directive, start, body_start)) => {
                            document.regions.push(Region { directive, start, body: body_start..range.start })
                        }
                        None => problems.push(Problem::new(
                            doc,
                            range.start,
                            "closing marker without an opening one",
                            trimmed,
                            "`<!-- qkv KIND ARGS -->` before this `<!-- /qkv -->`",
                        )),
                    }
                } else if let Some(rest) = trimmed.strip_prefix(OPEN) {
                    let Some(inner) = rest.strip_suffix("-->") else { continue };
                    if let Some((_, start, _)) = &open_region {
                        problems.push(Problem::new(
                            doc,
                            *start,
                            "generated region is not closed before the next one opens",
                            first_line(&text[*start..]),
                            "`<!-- /qkv -->` on its own line to close it",
                        ));
                    }
                    let directive = inner.split_whitespace().map(str::to_string).collect();
                    // The body starts after the marker's own line.
                    let line_end = text[range.start..].find('\n').map_or(text.len(), |i| range.start + i + 1);
                    open_region = Some((directive, range.start, line_end));
                }
            }
            Event::Start(Tag::Link { dest_url, .. }) if !in_region && dest_url.starts_with('=') => {
                let path_at = text[range.clone()].find("](=").map_or(range.start, |i| range.start + i + 3);
                link = Some((dest_url[1..].to_string(), path_at, Vec::new()));
            }
            Event::End(TagEnd::Link) if link.is_some() => {
                if let Some((dest, path_at, inner)) = link.take() {
                    match citation(doc, text, &dest, path_at, range.start, &inner) {
                        Ok(c) => document.citations.push(c),
                        Err(p) => problems.push(p),
                    }
                }
            }
            Event::Text(_) if link.is_some() => {
                if let Some((_, _, inner)) = link.as_mut() {
                    inner.push((range, true));
                }
            }
            Event::Start(Tag::Heading { level: pulldown_cmark::HeadingLevel::H1, .. }) => {
                heading = Some(String::new());
            }
            Event::Text(t) | Event::Code(t) if heading.is_some() => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::End(TagEnd::Heading(pulldown_cmark::HeadingLevel::H1)) => {
                if let Some(h) = heading.take() {
                    document.title.get_or_insert(h);
                }
            }
            _ if link.is_some() => {
                if let Some((_, _, inner)) = link.as_mut() {
                    inner.push((range, false));
                }
            }
            _ => {}
        }
    }
    if let Some((_, start, _)) = open_region {
        problems.push(Problem::new(
            doc,
            start,
            "generated region is never closed",
            first_line(&text[start..]),
            "`<!-- /qkv -->` on its own line after the generated text",
        ));
    }
    if problems.is_empty() { Ok(document) } else { Err(problems) }
}

/// Reads `[text](=path:format)` once its inner events are known.
fn citation(
    doc: usize,
    text: &str,
    dest: &str,
    path_at: usize,
    link_start: usize,
    inner: &[(Range<usize>, bool)],
) -> Result<Citation, Problem> {
    let Some((path, spec)) = dest.rsplit_once(':') else {
        return Err(Problem::new(
            doc,
            path_at,
            "citation has no format",
            format!("(={dest})"),
            format!("`(={dest}:DECIMALS)`, e.g. `(={dest}:2)` for two decimals"),
        ));
    };
    let format = Format::parse(spec).ok_or_else(|| {
        Problem::new(
            doc,
            path_at + path.len() + 1,
            format!("unknown number format `{spec}`"),
            format!("(={dest})"),
            crate::citation::FORMATS,
        )
    })?;
    let text_range = match inner {
        [] => link_start + 1..link_start + 1,
        [(r, true)] => r.clone(),
        // Smart punctuation or escapes can split the text; a number never needs them.
        _ if inner.iter().all(|(_, t)| *t) => inner[0].0.start..inner[inner.len() - 1].0.end,
        _ => {
            return Err(Problem::new(
                doc,
                link_start,
                "a citation's text must be the plain number",
                first_line(&text[link_start..]),
                "`[4.41](=example.path:2)` with no emphasis or code inside the brackets",
            ));
        }
    };
    Ok(Citation { path: path.to_string(), path_at, format, text: text_range })
}

/// The first line of `s`, for quoting source in an error.
pub(crate) fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim_end().to_string()
}

#[cfg(test)]
mod tests;
