//! The glossary: `glossary.html`, every `qkv term` of the course in alphabetical order, each with
//! its symbol, its definition and a link to its first use in the section that declares it; and,
//! on every section page, the first use of each term in the prose linked to its entry. Terms are
//! declared in the sections that introduce them, so a new section adds its own entries without
//! touching a shared list.

use std::fmt::Write;
use std::ops::Range;

use pulldown_cmark::{Event, Parser, Tag, TagEnd};

use super::Section;
use crate::document;
use crate::examples::TermDecl;
use crate::markup::{escape, inline_markdown, markdown_options, mathml};

/// A glossary entry: its `qkv term` block, and the block's id (the entry's anchor is `term-ID`).
#[derive(Debug, Clone)]
pub(crate) struct Term {
    pub id: String,
    pub entry: TermDecl,
}

/// Where a term is first used on a page: the index of a text event among the events of the
/// page's markdown (as `Parser::new_ext(text, markdown_options())` gives them), and the byte range
/// of the use inside that event's text.
pub(crate) type Use = (usize, Range<usize>);

/// The first use of each of `terms` in the prose of markdown `text`, if any. Prose is text outside
/// headings, links, images, tables, code and generated regions: a link never lands inside another
/// one, a heading or text the build writes. Longer forms are placed first, so `KV cache` wins
/// over `cache`, and two uses never overlap.
pub(crate) fn first_uses(text: &str, terms: &[Term]) -> Vec<Option<Use>> {
    let prose = prose_texts(text);
    let mut order: Vec<usize> = (0..terms.len()).collect();
    let longest = |t: &Term| t.entry.forms.iter().map(String::len).max().unwrap_or(0);
    order.sort_by_key(|&i| std::cmp::Reverse(longest(&terms[i])));
    let mut taken: Vec<Use> = Vec::new();
    let mut found = vec![None; terms.len()];
    for i in order {
        found[i] = prose.iter().find_map(|(event, t)| {
            let uses = terms[i].entry.forms.iter().filter_map(|form| {
                whole_words(t, form).find(|r| {
                    !taken.iter().any(|(e, other)| e == event && r.start < other.end && other.start < r.end)
                })
            });
            uses.min_by_key(|r| r.start).map(|r| (*event, r))
        });
        if let Some(u) = &found[i] {
            taken.push(u.clone());
        }
    }
    found
}

/// The prose text events of `text`, by index.
fn prose_texts(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let (mut depth, mut region) = (0usize, false);
    for (k, event) in Parser::new_ext(text, markdown_options()).enumerate() {
        match event {
            Event::Html(h) if h.trim() == document::CLOSE => region = false,
            Event::Html(h) if h.trim().starts_with(document::OPEN) => region = true,
            Event::Start(
                Tag::Heading { .. }
                | Tag::Link { .. }
                | Tag::Image { .. }
                | Tag::Table(_)
                | Tag::CodeBlock(_),
            ) => depth += 1,
            Event::End(
                TagEnd::Heading(_) | TagEnd::Link | TagEnd::Image | TagEnd::Table | TagEnd::CodeBlock,
            ) => depth = depth.saturating_sub(1),
            Event::Text(t) if depth == 0 && !region => out.push((k, t.to_string())),
            _ => {}
        }
    }
    out
}

/// Where `word` occurs in `text` as a whole word, ASCII letter case aside.
fn whole_words<'a>(text: &'a str, word: &str) -> impl Iterator<Item = Range<usize>> + 'a {
    let hay = text.to_ascii_lowercase();
    let needle = word.to_ascii_lowercase();
    let edge = |c: Option<char>| !c.is_some_and(char::is_alphanumeric);
    let found: Vec<Range<usize>> = hay
        .match_indices(&needle)
        .map(|(at, m)| at..at + m.len())
        .filter(|r| edge(text[..r.start].chars().next_back()) && edge(text[r.end..].chars().next()))
        .collect();
    found.into_iter()
}

/// The page's events with each first use in `uses` made a link to its entry (`term-ID`); on the
/// page that declares a term, the link also carries the anchor the entry links back to.
pub(crate) fn link_uses<'a>(
    k: usize,
    text: &pulldown_cmark::CowStr<'a>,
    uses: &[(&Term, &Use, bool)],
    out: &mut Vec<Event<'a>>,
) -> bool {
    let mut here: Vec<&(&Term, &Use, bool)> = uses.iter().filter(|(_, (e, _), _)| *e == k).collect();
    if here.is_empty() {
        return false;
    }
    here.sort_by_key(|(_, (_, r), _)| r.start);
    let mut last = 0;
    for (term, (_, r), own) in here {
        out.push(Event::Text(text[last..r.start].to_string().into()));
        let anchor = if *own { format!(" id=\"term-use-{}\"", escape(&term.id)) } else { String::new() };
        out.push(Event::InlineHtml(
            format!("<a class=\"term\" href=\"glossary.html#term-{}\"{anchor}>", escape(&term.id)).into(),
        ));
        out.push(Event::Text(text[r.clone()].to_string().into()));
        out.push(Event::InlineHtml("</a>".into()));
        last = r.end;
    }
    out.push(Event::Text(text[last..].to_string().into()));
    true
}

/// The glossary page's article: every term, in alphabetical order, with the section that
/// introduces it. `terms` holds each term with the index of the section that declares it.
pub(super) fn page(sections: &[Section], terms: &[(usize, Term)]) -> String {
    let mut sorted: Vec<&(usize, Term)> = terms.iter().collect();
    sorted.sort_by_key(|(_, t)| t.entry.term.to_lowercase());
    let mut out = String::from(
        "<h1>Glossary</h1>\n<p class=\"lede\">The course's terms and symbols. Each links to the section that introduces it, and each section links the first use of a term on its page here.</p>\n<dl class=\"glossary\">\n",
    );
    for (i, t) in sorted {
        let s = &sections[*i];
        let symbol = t
            .entry
            .symbol
            .as_ref()
            .map(|tex| format!(" <span class=\"symbol\">{}</span>", mathml(tex, false)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "<dt id=\"term-{0}\">{1}{symbol}</dt>\n<dd>{2} <span class=\"glossary-where\">Introduced in <a href=\"{3}.html#term-use-{0}\">{4}</a>.</span></dd>",
            escape(&t.id),
            escape(&t.entry.term),
            inline_markdown(&t.entry.definition),
            escape(&s.id),
            escape(&super::site::numbered(s)),
        );
    }
    out.push_str("</dl>\n");
    out
}

#[cfg(test)]
mod tests;
