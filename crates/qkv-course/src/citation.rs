//! Citations: a number the lesson names instead of typing. In prose it is a link whose text the
//! build rewrites (`[4.41](=sentence.love.output:2)`); in math, the number in braces before a
//! marker that draws nothing (`{4.41}\vphantom{\verb|=sentence.love.output:2|}`), rewritten the
//! same way; inside a block's text field (a quiz question, a widget prompt) it is written
//! `{=sentence.love.output:2}` and substituted when the region and the page are generated.

use std::ops::Range;

use crate::document::{Citation, Shape, citation_shapes};
use crate::error::Problem;
use crate::format::{FORMATS, Format, tex_number};
use crate::values::Resolve;

/// What citation `c` of document `doc` should say; `found` is what it says now.
pub(crate) fn text(
    eval: &mut impl Resolve,
    doc: usize,
    c: &Citation,
    found: &str,
) -> Result<String, Problem> {
    let text = number(eval, doc, &c.path, c.path_at, c.format, found)?;
    // In math the number is TeX: `12.5\%`, `1.2 \times 10^{35}`.
    Ok(if c.math { tex_number(&text) } else { text })
}

/// The number `path` names, in `format`; `path_at` is where the path is written.
fn number(
    eval: &mut impl Resolve,
    doc: usize,
    path: &str,
    path_at: usize,
    format: Format,
    found: &str,
) -> Result<String, Problem> {
    let node = eval.resolve(doc, path).map_err(|expected| {
        Problem::new(doc, path_at, format!("unknown reference `{path}`"), path, expected)
    })?;
    match node.as_number() {
        Some(x) if x.is_finite() => Ok(format.apply(x)),
        Some(x) => Err(Problem::new(
            doc,
            path_at,
            format!("`{path}` is {x}, which cannot be shown as a number"),
            found,
            "a finite value (a masked score is -inf; cite its weight instead)",
        )),
        None => Err(Problem::new(
            doc,
            path_at,
            format!("`{path}` is not a single number"),
            path,
            format!(
                "a path down to one number, such as `{path}.{}`",
                node.children().first().map_or("1", String::as_str)
            ),
        )),
    }
}

/// Markdown from a block's text field, citing computed numbers as `{=PATH:FORMAT}`.
#[derive(Debug, Clone)]
pub(crate) struct Text {
    /// The text as written.
    pub value: String,
    refs: Vec<TextRef>,
}

/// One `{=PATH:FORMAT}` inside a [`Text`].
#[derive(Debug, Clone)]
struct TextRef {
    /// The byte range of `{=…}` in the text.
    range: Range<usize>,
    path: String,
    /// Source offset of the path, for errors.
    path_at: usize,
    format: Format,
}

impl Text {
    /// Reads the `{=PATH:FORMAT}` citations of `value` (a field of document `doc` written at
    /// `at`); `source_at[n]` is the source offset of the `n`-th citation shape of the field as
    /// written (see [`citation_shapes`]), where it is known. Any other citation shape (a link
    /// citation, a math marker, `{ =` with a space) is an error: here it would be shown as typed.
    pub(crate) fn parse(doc: usize, value: String, at: usize, source_at: &[usize]) -> Result<Text, Problem> {
        let mut refs = Vec::new();
        for (n, (start, shape)) in citation_shapes(&value).into_iter().enumerate() {
            let open_at = source_at.get(n).copied().unwrap_or(at);
            let written = snippet(&value[start..]);
            let near_miss =
                |message: &str| Problem::new(doc, open_at, message, written.clone(), Shape::Braced.form());
            match shape {
                Shape::Link => {
                    return Err(near_miss(
                        "a link citation does not work in quiz and widget text; it would be shown as typed",
                    ));
                }
                Shape::Marker => {
                    return Err(near_miss(
                        "a math citation marker does not work in quiz and widget text, even inside `$…$`; it would be shown as typed",
                    ));
                }
                Shape::Path => {
                    return Err(near_miss("a cited path outside `{=…}`; it would be shown as typed"));
                }
                Shape::Braced if !value[start..].starts_with("{=") => {
                    return Err(near_miss("a space between `{` and `=` hides this citation"));
                }
                Shape::Braced => {}
            }
            let rest = &value[start + 2..];
            let Some(len) = rest.find('}') else {
                return Err(Problem::new(
                    doc,
                    open_at,
                    "a citation `{=` is never closed",
                    written,
                    "`{=PATH:FORMAT}`, such as `{=sentence.love.output:2}`",
                ));
            };
            let inner = &rest[..len];
            let found = format!("{{={inner}}}");
            let Some((path, spec)) = inner.rsplit_once(':') else {
                return Err(Problem::new(
                    doc,
                    open_at,
                    "citation has no format",
                    found,
                    format!("`{{={inner}:DECIMALS}}`, e.g. `{{={inner}:2}}` for two decimals"),
                ));
            };
            let format = Format::parse(spec).ok_or_else(|| {
                Problem::new(
                    doc,
                    open_at + 2 + path.len() + 1,
                    format!("unknown number format `{spec}`"),
                    found.clone(),
                    FORMATS,
                )
            })?;
            if path.is_empty() || path.contains(char::is_whitespace) {
                return Err(Problem::new(
                    doc,
                    open_at,
                    if path.is_empty() {
                        "citation without a path"
                    } else {
                        "a citation's path has no spaces"
                    },
                    found,
                    "`{=PATH:FORMAT}`, such as `{=sentence.love.output:2}`",
                ));
            }
            refs.push(TextRef {
                range: start..start + 2 + len + 1,
                path: path.to_string(),
                path_at: open_at + 2,
                format,
            });
        }
        Ok(Text { value, refs })
    }

    /// Each citation's path with the source offset where it is written.
    pub(crate) fn cited(&self) -> impl Iterator<Item = (&str, usize)> {
        self.refs.iter().map(|r| (r.path.as_str(), r.path_at))
    }

    /// The text with every citation replaced by its number, as document `doc` computes it.
    pub(crate) fn fill(&self, eval: &mut impl Resolve, doc: usize) -> Result<String, Problem> {
        let mut out = String::with_capacity(self.value.len());
        let mut last = 0;
        for r in &self.refs {
            out.push_str(&self.value[last..r.range.start]);
            out.push_str(&number(eval, doc, &r.path, r.path_at, r.format, &self.value[r.range.clone()])?);
            last = r.range.end;
        }
        out.push_str(&self.value[last..]);
        Ok(out)
    }
}

/// The start of `s`, for quoting an unclosed citation.
fn snippet(s: &str) -> String {
    s.chars().take(40).collect()
}
