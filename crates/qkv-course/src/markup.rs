//! Markup helpers every layer that writes HTML shares: escaping, slugs, TeX to MathML, short
//! markdown fragments, JSON data for the page script, and the markdown options every lesson file
//! is parsed with.

use pulldown_cmark::{Event, Options, Parser};

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

/// TeX as MathML (inline or display); TeX the renderer cannot read is shown as code.
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
        Ok(()) => out,
        Err(_) => format!("<code>{}</code>", escape(tex)),
    }
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
        Event::DisplayMath(tex) => {
            Event::InlineHtml(format!("<span class=\"display-math\">{}</span>", mathml(&tex, true)).into())
        }
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
