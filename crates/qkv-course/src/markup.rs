//! Markup helpers every layer that writes HTML shares: escaping, slugs, TeX to MathML, short
//! markdown fragments, JSON data for the page script, and the markdown options every lesson file
//! is parsed with.

use pulldown_cmark::{Event, Options, Parser};

mod spoken;

/// The markdown extensions every lesson file is parsed with (here and when rendering HTML).
pub(crate) fn markdown_options() -> Options {
    Options::ENABLE_MATH
        | Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_SMART_PUNCTUATION
}

/// Escapes text for HTML content and attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}

/// TeX as MathML (inline or display), spoken as words in its `aria-label` ([`spoken`]); TeX the
/// renderer cannot read is shown as code.
pub(crate) fn mathml(tex: &str, display: bool) -> String {
    let storage = pulldown_latex::Storage::new();
    let parser = pulldown_latex::Parser::new(tex, &storage);
    let config = pulldown_latex::RenderConfig {
        display_mode: if display {
            pulldown_latex::config::DisplayMode::Block
        } else {
            pulldown_latex::config::DisplayMode::Inline
        },
        ..Default::default()
    };
    let mut out = String::new();
    match pulldown_latex::push_mathml(&mut out, parser, config) {
        Ok(()) => {
            let label = format!("<math aria-label=\"{}\"", escape(&spoken::spoken(&out)));
            out.replacen("<math", &label, 1)
        }
        Err(_) => format!("<code>{}</code>", escape(tex)),
    }
}

/// What the renderer cannot read in `tex`, if anything: the first parse error's reason (an
/// unknown command, a group not closed), which the page would show as an error box.
pub(crate) fn tex_error(tex: &str) -> Option<String> {
    let storage = pulldown_latex::Storage::new();
    let error = pulldown_latex::Parser::new(tex, &storage).find_map(Result::err)?;
    let reason = error.to_string();
    let reason = reason.strip_prefix("parsing error: ").unwrap_or(&reason);
    Some(reason.lines().next().unwrap_or_default().to_string())
}

/// Where in `text`'s text event at `range` a `$` stands that markdown did not read as math but TeX
/// follows (its braces do not balance): the dollars and the TeX would be shown as typed. The `$`
/// may be an event of its own, the TeX the next one.
pub(crate) fn dollar_opening_no_math(text: &str, range: std::ops::Range<usize>) -> Option<usize> {
    let mut dollars = text[range.clone()].match_indices('$').map(|(i, _)| range.start + i);
    dollars.find(|&at| text[at + 1..].starts_with('\\'))
}

/// What is wrong with the math of a short markdown text (a quiz's question, a figure's caption),
/// if anything: TeX the renderer cannot read, or a `$` that opens no math (braces that do not
/// balance), which the page would show as typed. The same rules as the prose's.
pub(crate) fn fragment_math_error(markdown: &str) -> Option<String> {
    // A citation (`{=PATH:FORMAT}`) stands for a number: its path is no TeX.
    let mut cited = String::with_capacity(markdown.len());
    let mut rest = markdown;
    while let Some(open) = rest.find("{=") {
        let Some(close) = rest[open..].find('}') else { break };
        cited.push_str(&rest[..open]);
        cited.push_str("{0}");
        rest = &rest[open + close + 1..];
    }
    cited.push_str(rest);
    let markdown = cited.as_str();
    for (event, range) in Parser::new_ext(markdown, markdown_options()).into_offset_iter() {
        match event {
            Event::InlineMath(tex) | Event::DisplayMath(tex) => {
                if let Some(reason) = tex_error(&tex) {
                    return Some(format!(
                        "TeX the renderer cannot read ({reason}) in `{}`",
                        &markdown[range]
                    ));
                }
            }
            Event::Text(_) if dollar_opening_no_math(markdown, range).is_some() => {
                return Some("a `$` that opens no math (do its braces balance?)".to_string());
            }
            _ => {}
        }
    }
    None
}

/// A display formula that fits a phone's column: `<span class="display-math">` holding one
/// `<span class="equation">` per formula of a list (`a, \qquad b`), each holding one `<math>` per
/// piece that starts at a relation (`=`, `\approx`, …). MathML cannot break a line, but the page
/// can between these elements: a formula that fits its line stays whole, a longer one wraps
/// before a relation. Pieces are split only outside braces and `\left … \right`, and TeX with
/// environments (`\begin`, where `&` and `\\` align rows) stays one formula.
pub(crate) fn display_math(tex: &str) -> String {
    let mut out = String::from("<span class=\"display-math\">");
    for equation in display_pieces(tex) {
        out.push_str("<span class=\"equation\">");
        for piece in equation {
            out.push_str(&mathml(piece, true));
        }
        out.push_str("</span>");
    }
    out.push_str("</span>");
    out
}

/// The relations a display formula may break before, longest first (`\le` is a prefix of `\leq`).
const RELATIONS: &[&str] = &[
    "\\notin", "\\not", "\\approx", "\\equiv", "\\neq", "\\leq", "\\geq", "\\ne", "\\le", "\\ge", "=", "<",
    ">",
];
/// The spaces that separate the formulas of a list.
const SEPARATORS: &[&str] = &["\\qquad", "\\quad"];

/// `tex` cut into formulas at each top-level separator (dropped: the page spaces them) and each
/// formula into pieces before each top-level relation; no piece is empty.
fn display_pieces(tex: &str) -> Vec<Vec<&str>> {
    if tex.contains("\\begin") {
        return vec![vec![tex]];
    }
    let (mut equations, mut pieces) = (Vec::new(), Vec::new());
    let (mut depth, mut start, mut i) = (0i32, 0, 0);
    let bytes = tex.as_bytes();
    // A command name ends at the first byte that is not a letter (`\left(` is `\left`).
    let command_at = |i: usize, name: &str| {
        tex[i..].starts_with(name)
            && (!name.starts_with('\\') || !bytes.get(i + name.len()).is_some_and(u8::is_ascii_alphabetic))
    };
    fn cut<'a>(pieces: &mut Vec<&'a str>, piece: &'a str) {
        if !piece.trim().is_empty() {
            pieces.push(piece.trim());
        }
    }
    while i < tex.len() {
        let c = bytes[i];
        if c == b'\\' && command_at(i, "\\left") {
            depth += 1;
        } else if c == b'\\' && command_at(i, "\\right") {
            depth -= 1;
        } else if c == b'{' {
            depth += 1;
        } else if c == b'}' {
            depth -= 1;
        } else if depth == 0 {
            if let Some(sep) = SEPARATORS.iter().find(|s| command_at(i, s)) {
                cut(&mut pieces, &tex[start..i]);
                if !pieces.is_empty() {
                    equations.push(std::mem::take(&mut pieces));
                }
                i += sep.len();
                start = i;
                continue;
            }
            // `\not=` is one relation, which breaks before its `\not` only.
            let negated = tex[..i].trim_end().ends_with("\\not");
            if let Some(rel) = RELATIONS.iter().find(|r| !negated && command_at(i, r)) {
                cut(&mut pieces, &tex[start..i]);
                start = i;
                i += rel.len();
                continue;
            }
        }
        // A backslash escapes the next byte (`\{` opens no group); TeX is ASCII where it matters.
        i += if c == b'\\' { 2 } else { 1 };
        while !tex.is_char_boundary(i.min(tex.len())) {
            i += 1;
        }
    }
    cut(&mut pieces, &tex[start..]);
    if !pieces.is_empty() {
        equations.push(pieces);
    }
    equations
}

/// The opening tag of a box that scrolls sideways when its content is wider than the column (a
/// table): a named region that takes the keyboard focus, so that a learner without a mouse can
/// scroll it with the arrow keys; the stylesheet gives it shadows at the edges that hide more.
pub(crate) fn scroll_box(name: &str) -> String {
    format!("<div class=\"scroll\" tabindex=\"0\" role=\"region\" aria-label=\"{}\">", escape(name))
}

/// A file-name and anchor-safe form of a label (`Worked example 1` → `worked-example-1`).
pub(crate) fn slug(s: &str) -> String {
    let mut out: String =
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    while out.contains("--") {
        out = out.replace("--", "-");
    }
    out.trim_matches('-').to_string()
}

/// A short markdown string (a caption, a quiz option) as inline HTML.
pub(crate) fn inline_markdown(s: &str) -> String {
    let html = fragment(s);
    html.trim().trim_start_matches("<p>").trim_end_matches("</p>").to_string()
}

/// A markdown fragment (paragraphs, lists, math) as HTML, for text a page block holds.
pub(crate) fn fragment(s: &str) -> String {
    let mut html = String::new();
    let events = Parser::new_ext(s, markdown_options()).map(|e| match e {
        Event::InlineMath(tex) => Event::InlineHtml(mathml(&tex, false).into()),
        Event::DisplayMath(tex) => Event::InlineHtml(display_math(&tex).into()),
        other => other,
    });
    pulldown_cmark::html::push_html(&mut html, events);
    html
}

/// Data for the page script: `<script type="application/json" ATTR>JSON</script>`. Every `<` is
/// written `\u003c`, so no text inside can close the element.
pub(crate) fn json_script(attr: &str, value: &serde_json::Value) -> String {
    let json = value.to_string().replace('<', "\\u003c");
    format!("<script type=\"application/json\" {attr}>{json}</script>\n")
}

#[cfg(test)]
mod tests;
