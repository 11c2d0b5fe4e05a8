//! The search index, built with the site: per heading of every section, its page, anchor, title,
//! the opening of its text and the distinct words under it. It ships as `search-index.js`, a
//! classic script that sets one global, because a page read from `file://` may not `fetch` a
//! local file but may load a script; the page script loads it on first use.

use serde_json::json;

use super::Section;
use super::site::numbered;

/// One heading of a section and the prose under it, up to the next heading.
#[derive(Debug, Default)]
pub(super) struct Entry {
    /// The heading's anchor; `None` for the section's title (the top of the page).
    pub id: Option<String>,
    pub title: String,
    /// The text under the heading, as read (code and prose, no math).
    pub text: String,
}

/// Characters of a heading's text shown under its result.
const SNIPPET: usize = 140;

/// Words shorter than this are not indexed: they match nearly everything.
const MIN_WORD: usize = 3;

/// `search-index.js`: `window.QKV_SEARCH = { "sections": [[page, "1. Title"], …], "entries":
/// [[section, anchor, title, snippet, words], …] }`, words lowercase and space-separated.
pub(super) fn index(sections: &[Section], entries: &[Vec<Entry>]) -> String {
    let pages: Vec<_> = sections.iter().map(|s| json!([format!("{}.html", s.id), numbered(s)])).collect();
    let mut rows = Vec::new();
    for (i, list) in entries.iter().enumerate() {
        for e in list {
            let text = one_line(&e.text);
            let snippet = match text.char_indices().nth(SNIPPET) {
                Some((at, _)) => format!("{}…", text[..at].trim_end()),
                None => text.clone(),
            };
            rows.push(json!([i, e.id.clone().unwrap_or_default(), e.title, snippet, words(&e.title, &text)]));
        }
    }
    let data = json!({ "sections": pages, "entries": rows });
    format!(
        "/* The course's search index, written by cargo xtask build-content; read by qkv.js. */\nwindow.QKV_SEARCH = {};\n",
        data.to_string().replace('<', "\\u003c")
    )
}

/// Whitespace collapsed to single spaces.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The distinct words of a heading and its text, lowercase, in order of first appearance.
fn words(title: &str, text: &str) -> String {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for w in format!("{title} {text}").split(|c: char| !c.is_alphanumeric()) {
        let w = w.to_lowercase();
        if w.chars().count() >= MIN_WORD && seen.insert(w.clone()) {
            out.push(w);
        }
    }
    out.join(" ")
}
