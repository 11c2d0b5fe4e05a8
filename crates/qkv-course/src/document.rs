//! One lesson file: where its example blocks, citations and generated regions sit, by byte range.
//!
//! Everything is found through pulldown-cmark's `into_offset_iter`, so a `qkv` marker inside a
//! code block (say, in documentation) is never mistaken for a live one.
//!
//! A citation is a link in prose, `[4.41](=sentence.love.output:2)`, or a marked number in math,
//! `{4.41}\vphantom{\verb|=sentence.love.output:2|}`: links do not work inside `$…$`, and
//! `\vphantom` of a `\verb` is standard TeX that draws nothing, so a forge's math renderer shows
//! just the number (the site drops the marker before rendering MathML).

use std::ops::Range;

use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

use crate::error::Problem;
use crate::format::{FORMATS, Format};
use crate::markup::{self, markdown_options, slug};

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

/// A number in the prose written as a link `[4.41](=sentence.love.output:2)`, or in math as
/// `{4.41}\vphantom{\verb|=sentence.love.output:2|}`.
#[derive(Debug, Clone)]
pub(crate) struct Citation {
    /// Which value, e.g. `sentence.love.output`.
    pub path: String,
    /// Byte offset of the path in the source (for error positions).
    pub path_at: usize,
    /// How the value is shown.
    pub format: Format,
    /// The byte range of the number's text (link text, or inside the braces): what the build
    /// rewrites.
    pub text: Range<usize>,
    /// Whether the citation is inside math, where the number is written as TeX (`12.5\%`).
    pub math: bool,
}

/// What marks a number in math as a citation, after its `{NUMBER}`.
const MATH_MARKER: &str = r"\vphantom{\verb";

/// The three ways a number is cited, as a near-miss scanner sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shape {
    /// `](=`: a link citation, `[4.41](=PATH:FORMAT)` (spaces allowed before the `=`).
    Link,
    /// `\verb|=`: a math citation's marker, `{4.41}\vphantom{\verb|=PATH:FORMAT|}`.
    Marker,
    /// `{=`: a citation in a quiz or widget's text, `{=PATH:FORMAT}`.
    Braced,
    /// `=PATH:FORMAT` on its own (`=sentence.love.output:2`), where no other shape holds it: the
    /// remains of a citation whose brackets or braces went missing.
    Path,
}

impl Shape {
    /// How this shape is written where it works, for messages.
    pub(crate) fn form(self) -> &'static str {
        match self {
            Shape::Link => "`[NUMBER](=PATH:FORMAT)` in prose",
            Shape::Marker => "`{NUMBER}\\vphantom{\\verb|=PATH:FORMAT|}` inside `$…$`",
            Shape::Braced => "`{=PATH:FORMAT}` in the text fields of `qkv quiz` and `qkv widget` blocks",
            Shape::Path => {
                "`[NUMBER](=PATH:FORMAT)` in prose, `{NUMBER}\\vphantom{\\verb|=PATH:FORMAT|}` in math, `{=PATH:FORMAT}` in quiz and widget text"
            }
        }
    }
}

/// Every place in `s` that has the shape of a citation, with its byte offset: the one grammar
/// that prose, math, HTML, and quiz and widget text are all checked against, so that nothing
/// that looks like a citation is left showing whatever was typed. Spaces inside the shape
/// (`]( =`, `\verb| =`, `{ =`) do not hide it.
pub(crate) fn citation_shapes(s: &str) -> Vec<(usize, Shape)> {
    let bytes = s.as_bytes();
    let after_spaces = |mut i: usize| {
        while i < bytes.len() && (bytes[i] == b' ' || bytes[i] == b'\t') {
            i += 1;
        }
        i
    };
    // `\verb`, its delimiter (any character), then `=` after optional spaces.
    let verb_marker = |i: usize| {
        s[i..].starts_with("\\verb") && {
            let delimiter = s[i + 5..].chars().next().map_or(0, char::len_utf8);
            delimiter > 0 && bytes.get(after_spaces(i + 5 + delimiter)) == Some(&b'=')
        }
    };
    let mut found = Vec::new();
    for (i, &b) in bytes.iter().enumerate() {
        let shape = match b {
            b']' if bytes.get(after_spaces(i + 1)) == Some(&b'(') => {
                (bytes.get(after_spaces(after_spaces(i + 1) + 1)) == Some(&b'=')).then_some(Shape::Link)
            }
            b'{' => (bytes.get(after_spaces(i + 1)) == Some(&b'=')).then_some(Shape::Braced),
            b'\\' if verb_marker(i) => Some(Shape::Marker),
            // A marker's `\vphantom` with no `\verb|=` right inside it: one cut short (`{4.41}\vphantom{`
            // at the end of a file) or mistyped. The scan of the built pages counts every
            // `\vphantom` as citation syntax, so none may stand anywhere but in a marker.
            b'\\' if s[i..].starts_with("\\vphantom") => {
                // Spaced out or not, a `\vphantom` around a `\verb|=` is that marker's, found there.
                let mut inner = after_spaces(i + "\\vphantom".len());
                if bytes.get(inner) == Some(&b'{') {
                    inner = after_spaces(inner + 1);
                }
                (!verb_marker(inner)).then_some(Shape::Marker)
            }
            _ => None,
        };
        if let Some(shape) = shape {
            found.push((i, shape));
        }
    }
    // A cited path that no shape above holds: the `=` of each of them is claimed.
    let claimed: Vec<usize> = found
        .iter()
        .filter_map(|&(i, shape)| {
            let from = match shape {
                Shape::Link => i + 1,
                Shape::Braced => i,
                Shape::Marker => i + 5,
                Shape::Path => return None,
            };
            s[from..].find('=').map(|e| from + e)
        })
        .collect();
    for (i, _) in s.match_indices('=') {
        if !claimed.contains(&i) && is_cited_path(&s[i + 1..]) {
            found.push((i, Shape::Path));
        }
    }
    found.sort_unstable_by_key(|&(i, _)| i);
    found
}

/// Whether `s` starts with a cited path and its format: `ID.SEGMENT…:FORMAT`.
fn is_cited_path(s: &str) -> bool {
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    let path: String = s.chars().take_while(|&c| word(c) || c == '.').collect();
    let format = s[path.len()..].strip_prefix(':').and_then(|f| f.chars().next());
    path.starts_with(word) && path.contains('.') && format.is_some_and(|c| c.is_ascii_digit() || c == 'w')
}

/// A math citation found in TeX, by byte range within it.
struct MathCitation {
    /// Inside the braces before the marker.
    number: Range<usize>,
    /// `\vphantom{\verb|…|}`, removed before the site renders the math.
    marker: Range<usize>,
    /// `=PATH:FORMAT` between the `\verb` delimiters, without the `=`.
    dest: Range<usize>,
}

/// Every math citation in `tex`, or for a malformed one the offset of its marker and what is
/// wrong. One scanner for parsing and for rendering, so the two agree on what a marker is.
fn math_citations(tex: &str) -> Vec<Result<MathCitation, (usize, &'static str)>> {
    let mut found = Vec::new();
    for (at, _) in tex.match_indices(MATH_MARKER) {
        found.push(math_citation(tex, at));
    }
    found
}

fn math_citation(tex: &str, at: usize) -> Result<MathCitation, (usize, &'static str)> {
    let after = at + MATH_MARKER.len();
    // TeX's `\verb` rule: the delimiter is the next character, anything but a letter, a space or `*`.
    let delimiter = tex[after..]
        .chars()
        .next()
        .filter(|c| !c.is_alphabetic() && !c.is_whitespace() && *c != '*')
        .ok_or((at, "`\\verb` needs a delimiter such as `|` right after it"))?;
    let body = after + delimiter.len_utf8();
    let end = tex[body..].find(delimiter).map(|i| body + i).ok_or((at, "the `\\verb` is not closed"))?;
    if !tex[end + delimiter.len_utf8()..].starts_with('}') {
        return Err((at, "`\\vphantom{\\verb|…|}` needs its `}` right after the closing delimiter"));
    }
    if !tex[body..end].starts_with('=') {
        return Err((at, "the cited path must start with `=`"));
    }
    let open = tex[..at]
        .strip_suffix('}')
        .and_then(matching_open_brace)
        .ok_or((at, "a math citation needs its number in braces right before the marker"))?;
    Ok(MathCitation {
        number: open + 1..at - 1,
        marker: at..end + delimiter.len_utf8() + 1,
        dest: body + 1..end,
    })
}

/// The offset of the `{` that a `}` right after `before` closes (a number in scientific notation,
/// `1.2 \times 10^{35}`, has braces of its own).
fn matching_open_brace(before: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, b) in before.bytes().enumerate().rev() {
        match b {
            b'}' => depth += 1,
            b'{' if depth == 0 => return Some(i),
            b'{' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// TeX with every citation marker removed, leaving the braced numbers: what the site renders.
pub(crate) fn without_math_citations(tex: &str) -> String {
    let mut out = tex.to_string();
    for m in math_citations(tex).into_iter().rev().flatten() {
        out.replace_range(m.marker, "");
    }
    out
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
#[derive(Debug, Clone, Default)]
pub(crate) struct Document {
    pub blocks: Vec<Block>,
    pub citations: Vec<Citation>,
    pub regions: Vec<Region>,
    /// The first level-1 heading's text.
    pub title: Option<String>,
    /// The author's links to places in the course: another section's file, a heading's anchor.
    pub links: Vec<SectionLink>,
    /// The author's links and images to other files of the course (`figures/…`,
    /// `notebooks/…`, a page's `.html`), which the build checks it writes.
    pub file_links: Vec<SectionLink>,
    /// The anchors of the headings below the title, as the page gives them ids.
    pub anchors: Vec<String>,
}

/// A link in the author's prose to a section file of the course or an anchor (`02-causal-masking.md`,
/// `02-causal-masking.md#why-mask`, `#why-mask`), which the page turns into a link between pages.
#[derive(Debug, Clone)]
pub(crate) struct SectionLink {
    /// The destination as written.
    pub dest: String,
    /// Byte offset of the destination in the source.
    pub at: usize,
}

/// Whether `dest` is a link within the course (a `.md` file, with or without an anchor, or an
/// anchor alone): not an address with a scheme (`https:`, `mailto:`), an absolute path, or another
/// kind of file (a figure, a notebook).
fn is_section_link(dest: &str) -> bool {
    let scheme = dest.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    });
    let file = dest.split('#').next().unwrap_or("");
    !scheme && !dest.starts_with('/') && (file.is_empty() || file.ends_with(".md")) && !dest.is_empty()
}

/// Whether `dest` is a link to a file relative to the lesson that is not a section's `.md` file (a
/// figure, a notebook, a page as the site names it), nor a citation (`=PATH`).
fn is_file_link(dest: &str) -> bool {
    let scheme = dest.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    });
    let file = dest.split('#').next().unwrap_or("");
    !scheme && !dest.starts_with(['/', '=']) && !file.is_empty() && !file.ends_with(".md")
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
    let mut document = Document::default();
    let mut open_region: Option<(Vec<String>, usize, usize)> = None;
    let mut block: Option<Block> = None;
    let mut link: Option<OpenLink> = None;
    let mut link_start = 0;
    let mut heading: Option<String> = None;
    // The text of a heading below the title, read as the page reads it for the heading's id.
    let mut subheading: Option<String> = None;
    // Byte ranges whose citation shapes are read elsewhere or are literal, and those of HTML.
    let mut literal: Vec<Range<usize>> = Vec::new();
    let mut html: Vec<Range<usize>> = Vec::new();

    for (event, range) in Parser::new_ext(text, markdown_options()).into_offset_iter() {
        // Events inside a generated region belong to the build, not the author.
        let in_region = open_region.is_some();
        if let (Some(h), Event::Text(t) | Event::Code(t)) = (subheading.as_mut(), &event) {
            h.push_str(t);
        }
        if let Event::Text(_) = &event
            && !in_region
            && !literal.iter().any(|r| r.contains(&range.start))
        {
            // Prose only: code may show dollars and TeX as they are.
            if let Some(at) = markup::dollar_opening_no_math(text, range.clone()) {
                problems.push(Problem::new(
                    doc,
                    at,
                    "a `$` that opens no math, so the TeX after it would be shown as typed",
                    first_line(&text[at..]),
                    "`$…$` around TeX whose braces balance, with no space after the opening `$` or before the closing one",
                ));
            }
        }
        match &event {
            // Code is literal text (a lesson may show the syntax itself); math is checked where
            // it is read; a region belongs to the build.
            Event::Start(Tag::CodeBlock(_))
            | Event::Code(_)
            | Event::InlineMath(_)
            | Event::DisplayMath(_) => literal.push(range.clone()),
            Event::Html(_) | Event::InlineHtml(_) => html.push(range.clone()),
            Event::Start(Tag::Heading { level, .. })
                if !in_region && *level != pulldown_cmark::HeadingLevel::H1 =>
            {
                subheading = Some(String::new());
            }
            Event::End(TagEnd::Heading(_)) => {
                document.anchors.extend(subheading.take().map(|h| slug(&h)));
            }
            Event::Start(Tag::Link { dest_url, .. }) if !in_region && is_section_link(dest_url) => {
                let written = &text[range.clone()];
                let at = written.find(&format!("]({dest_url}")).map_or(range.start, |i| range.start + i + 2);
                document.links.push(SectionLink { dest: dest_url.to_string(), at });
            }
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. })
                if !in_region && is_file_link(dest_url) =>
            {
                let written = &text[range.clone()];
                let at = written.find(&format!("]({dest_url}")).map_or(range.start, |i| range.start + i + 2);
                document.file_links.push(SectionLink { dest: dest_url.to_string(), at });
            }
            Event::Start(Tag::Image { dest_url, .. })
                if !in_region && dest_url.trim_start().starts_with('=') =>
            {
                literal.push(range.clone());
                problems.push(Problem::new(
                    doc,
                    range.start,
                    "an image's address cannot cite a number",
                    first_line(&text[range.clone()]),
                    "`[NUMBER](=PATH:FORMAT)`, a link, not an image `![…](…)`",
                ))
            }
            _ => {}
        }
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info))) if !in_region => {
                let problem = fence_problem(doc, text, range.clone());
                // An unclosed block holds the rest of the file; its TOML errors would only add noise.
                let unclosed = problem.as_ref().is_some_and(|p| p.message == NEVER_CLOSED);
                problems.extend(problem);
                let mut words = info.split_whitespace();
                if words.next() == Some("qkv") && !unclosed {
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
                            literal.push(start..range.end);
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
            Event::InlineMath(tex) | Event::DisplayMath(tex) if !in_region => {
                // Offsets come from the source itself, not the event's text (which drops the
                // prefixes of a block quote or list around display math).
                let source = &text[range.clone()];
                // A formula with a malformed citation marker (a `\vphantom` or `\verb` left once
                // the markers read are removed) has its error already; the rest of its TeX is
                // checked here.
                let plain = without_math_citations(&tex);
                let markers_read = math_citations(source).iter().all(Result::is_ok)
                    && !plain.contains("\\verb")
                    && !plain.contains("\\vphantom");
                if markers_read && let Some(reason) = markup::tex_error(&plain) {
                    problems.push(Problem::new(
                        doc,
                        range.start,
                        format!("TeX the renderer cannot read ({reason}); the page would show an error box"),
                        first_line(source),
                        "TeX with balanced braces and commands the renderer knows (`\\frac`, `\\sqrt`, `\\text`, `\\mathrm`, …)",
                    ));
                }
                // The `\verb` of every marker read below, well formed or not: any other
                // citation shape in the formula is a near miss.
                let mut explained = Vec::new();
                for found in math_citations(source) {
                    let m = match found {
                        Ok(m) => {
                            explained.push(m.marker.start + VERB_IN_MARKER);
                            m
                        }
                        Err((at, message)) => {
                            // Its `\vphantom` and its `\verb`, whichever shape the scan sees.
                            explained.extend([at, at + VERB_IN_MARKER]);
                            let expected = "`{4.41}\\vphantom{\\verb|=example.path:2|}`: the number in braces, then the path in the marker";
                            problems.push(Problem::new(
                                doc,
                                range.start + at,
                                message,
                                first_line(&source[at..]),
                                expected,
                            ));
                            continue;
                        }
                    };
                    let (dest, path_at) = (&source[m.dest.clone()], range.start + m.dest.start);
                    match destination(doc, dest, path_at, true) {
                        Ok((path, format)) => document.citations.push(Citation {
                            path,
                            path_at,
                            format,
                            text: range.start + m.number.start..range.start + m.number.end,
                            math: true,
                        }),
                        Err(p) => problems.push(p),
                    }
                }
                for (at, shape) in citation_shapes(source) {
                    if shape == Shape::Marker && explained.contains(&at) {
                        continue;
                    }
                    let message = match shape {
                        Shape::Marker | Shape::Path => {
                            "a math citation marker that is not read: it must be written exactly as `\\vphantom{\\verb|=…|}`, right after the number in braces"
                        }
                        Shape::Braced => {
                            "`{=…}` cites a number only in quiz and widget text; in math it would be shown as typed"
                        }
                        Shape::Link => "a link cannot work inside math; it would be shown as typed",
                    };
                    problems.push(Problem::new(
                        doc,
                        range.start + at,
                        message,
                        first_line(&source[at..]),
                        Shape::Marker.form(),
                    ));
                }
            }
            Event::Start(Tag::Link { dest_url, .. }) if !in_region && dest_url.starts_with('=') => {
                let path_at = text[range.clone()].find("](=").map_or(range.start, |i| range.start + i + 3);
                link = Some((dest_url[1..].to_string(), path_at, Vec::new()));
                link_start = range.start;
            }
            Event::End(TagEnd::Link) if link.is_some() => {
                if let Some((dest, path_at, inner)) = link.take() {
                    literal.push(link_start..range.end);
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
    problems.extend(near_misses(doc, text, &literal, &html));
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

/// Where `\\verb` starts inside a math citation's marker, `\\vphantom{\\verb|…|}`.
const VERB_IN_MARKER: usize = r"\vphantom{".len();

/// The citation shapes of the author's text that no reader took up: outside code, math,
/// generated regions and the citations read, a citation would be shown as typed, so each is an
/// error that says how it is written where it works. `literal` holds the ranges read elsewhere or
/// literal (code may show the syntax itself), `html` those of HTML.
fn near_misses(doc: usize, text: &str, literal: &[Range<usize>], html: &[Range<usize>]) -> Vec<Problem> {
    let inside = |ranges: &[Range<usize>], at: usize| ranges.iter().any(|r| r.contains(&at));
    citation_shapes(text)
        .into_iter()
        .filter(|&(at, _)| !inside(literal, at))
        .map(|(at, shape)| {
            let (message, expected) = match shape {
                _ if inside(html, at) => (
                    "a citation inside HTML is not read; it would be shown as typed".to_string(),
                    "the citation in markdown, outside the HTML tags".to_string(),
                ),
                Shape::Marker => (
                    "a math citation outside math, which would be shown as typed".to_string(),
                    "`${4.41}\\vphantom{\\verb|=PATH:FORMAT|}$`: the marker inside the dollars, with no space after the opening `$` or before the closing one (`$ x $` is not math)".to_string(),
                ),
                Shape::Braced => (
                    "`{=…}` cites a number only in quiz and widget text; in prose it would be shown as typed"
                        .to_string(),
                    format!("{}, or {}", Shape::Link.form(), Shape::Marker.form()),
                ),
                Shape::Path => (
                    "a cited path outside any citation, which would be shown as typed".to_string(),
                    "`[NUMBER](=PATH:FORMAT)`: the number in brackets right before `(=`".to_string(),
                ),
                Shape::Link => (
                    "this has the shape of a citation link, but markdown did not read it as one, so it would be shown as typed".to_string(),
                    "`[NUMBER](=PATH:FORMAT)` with no space between `]` and `(`, the brackets balanced and nothing else inside them".to_string(),
                ),
            };
            Problem::new(doc, at, message, first_line(&text[at..]), expected)
        })
        .collect()
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
    let (path, format) = destination(doc, dest, path_at, false)?;
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
    Ok(Citation { path, path_at, format, text: text_range, math: false })
}

/// Reads a citation's `PATH:FORMAT` (after the `=`), which starts at `path_at` in the source.
/// The same for prose and math (`math`: the marker of a math citation, whose messages quote it as
/// written there), and for any other place that cites a value this way.
fn destination(doc: usize, dest: &str, path_at: usize, math: bool) -> Result<(String, Format), Problem> {
    // How the citation is written where it stands.
    let written = if math { format!("={dest}") } else { format!("(={dest})") };
    let Some((path, spec)) = dest.rsplit_once(':') else {
        let example = |format: &str| {
            if math { format!("\\verb|={dest}:{format}|") } else { format!("(={dest}:{format})") }
        };
        return Err(Problem::new(
            doc,
            path_at,
            "citation has no format",
            written,
            format!("`{}`, e.g. `{}` for two decimals", example("DECIMALS"), example("2")),
        ));
    };
    let format = Format::parse(spec).ok_or_else(|| {
        Problem::new(
            doc,
            path_at + path.len() + 1,
            format!("unknown number format `{spec}`"),
            written,
            FORMATS,
        )
    })?;
    Ok((path.to_string(), format))
}

/// The message for a fenced block that runs to the end of the file.
const NEVER_CLOSED: &str = "code block is never closed, so the rest of the file is inside it";

/// A fenced code block that swallows what follows it, without a word from markdown: one never
/// closed (it runs to the end of the file), or one that only a `qkv` block's closing fence closes
/// (the `qkv` opening line inside it cannot, having an info string). Either hides the blocks,
/// citations and regions after it. `range` is the whole block, fences included.
fn fence_problem(doc: usize, text: &str, range: Range<usize>) -> Option<Problem> {
    let block = &text[range.clone()];
    // Fences may sit in a block quote or a list: look past the container's prefix.
    let strip = |line: &str| line.trim_start_matches([' ', '\t', '>']).to_string();
    let mut lines = block.lines().map(strip);
    let opening = lines.next()?;
    let fence_char = opening.chars().next().filter(|c| matches!(c, '`' | '~'))?;
    let fence_len = opening.chars().take_while(|&c| c == fence_char).count();
    let fence = fence_char.to_string().repeat(fence_len);
    // A line of at least as many fence characters, and what follows them.
    let after_fence = |line: &str| {
        let n = line.chars().take_while(|&c| c == fence_char).count();
        (n >= fence_len).then(|| line[n..].trim().to_string())
    };
    let body: Vec<String> = lines.collect();
    if body
        .iter()
        .rev()
        .skip(1)
        .filter_map(|l| after_fence(l))
        .any(|rest| rest.split_whitespace().next() == Some("qkv"))
    {
        return Some(Problem::new(
            doc,
            range.start,
            "a ```qkv block sits inside this code block, whose fence only that block's closing fence closes",
            first_line(block),
            format!("a closing {fence} line at the end of this code block, before the ```qkv block"),
        ));
    }
    let closed = body.last().and_then(|l| after_fence(l)).is_some_and(|rest| rest.is_empty());
    if !closed && text[range.end..].trim().is_empty() {
        return Some(Problem::new(
            doc,
            range.start,
            NEVER_CLOSED,
            first_line(block),
            format!("a closing {fence} line after the code"),
        ));
    }
    None
}

/// The first line of `s`, for quoting source in an error.
pub(crate) fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim_end().to_string()
}

#[cfg(test)]
mod tests;
