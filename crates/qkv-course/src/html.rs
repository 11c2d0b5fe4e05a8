//! The static site: one HTML page per section (math as MathML, figures as `<figure>`, citations as
//! plain numbers, a contents list), an index, a small hand-written stylesheet and the page script.
//! Every page is complete without script and works from `file://`; `qkv.js` (a classic script,
//! since module scripts do not load from `file://`) only upgrades the elements marked `data-qkv-*`.
//!
//! The script computes almost nothing: the build writes every state a widget can show as text
//! (tile stepper, decode stepper, head explorer, window and ALiBi), and the script swaps them in.
//! Only the drag widget recomputes attention, in the order of `qkv::reference::trace_query`,
//! formatting as `format::fixed` does, and at the declared query it shows the build's own text.

use pulldown_cmark::{CodeBlockKind, CowStr, Event, HeadingLevel, Parser, Tag, TagEnd};

use crate::document;
use crate::files::{OutputFile, SourceFile, file_name, linked_file, section_id};
use crate::markup::{display_math, escape, markdown_options, mathml, scroll_box, slug};

pub(crate) mod glossary;
mod print;
mod search;
mod site;

const STYLE: &str = include_str!("html/style.css");
/// The page script's source files, in the order they are joined: `core.js` opens the one
/// function scope and holds the shared helpers, `init.js` closes it; each file between is one
/// feature or one widget kind (see `js/core.js`).
const SCRIPT_PARTS: &[&str] = &[
    include_str!("html/js/core.js"),
    include_str!("html/js/quiz.js"),
    include_str!("html/js/progress.js"),
    include_str!("html/js/scroll.js"),
    include_str!("html/js/search.js"),
    include_str!("html/js/drag.js"),
    include_str!("html/js/matrix.js"),
    include_str!("html/js/tiles.js"),
    include_str!("html/js/heads.js"),
    include_str!("html/js/window.js"),
    include_str!("html/js/block.js"),
    include_str!("html/js/descent.js"),
    include_str!("html/js/sweep.js"),
    include_str!("html/js/lab.js"),
    include_str!("html/js/decode.js"),
    include_str!("html/js/init.js"),
];

/// The page script, `qkv.js`: hand-written, no framework, no network, one classic script. Each
/// line goes out without its indentation and blank lines are dropped, a fifth of its bytes (the
/// sources hold no template literal or string that spans lines, whose text that would change).
fn script() -> String {
    let lines = SCRIPT_PARTS.iter().flat_map(|part| part.lines()).map(str::trim_start);
    lines.filter(|line| !line.is_empty()).flat_map(|line| [line, "\n"]).collect()
}

/// What the site needs to know of a section beyond its text: its summary for the contents page
/// and its graded checks, in page order, for progress across the course.
#[derive(Debug, Clone, Default)]
pub(crate) struct SectionInfo {
    /// The `summary` of its `qkv settings` block.
    pub summary: Option<String>,
    /// The quiz ids of its graded checks, in the order their regions appear (so check `k + 1`
    /// is `checks[k]`, as the page numbers them).
    pub checks: Vec<String>,
    /// The glossary entries it declares (`qkv term` blocks).
    pub terms: Vec<glossary::Term>,
}

/// A section as the site shows it.
struct Section {
    id: String,
    /// Counted from 1, in course order.
    number: usize,
    title: String,
    summary: Option<String>,
    checks: Vec<String>,
    /// How many glossary entries it declares.
    terms: usize,
}

/// Every file of the site except the figures: pages, contents, print view, search index,
/// stylesheet, script, notebooks, markdown. `region_html[i][r]` is the page's HTML for region `r`
/// of file `i`, where it has its own; `info[i]` what the site needs of file `i` beyond its text.
pub(crate) fn site(
    markdown: &[SourceFile],
    region_html: &[Vec<Option<String>>],
    info: &[SectionInfo],
    notebooks: Vec<OutputFile>,
) -> Vec<OutputFile> {
    let sections: Vec<Section> = markdown
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let title =
                document::parse(0, &f.text).ok().and_then(|d| d.title).unwrap_or_else(|| section_id(&f.path));
            let info = info.get(i).cloned().unwrap_or_default();
            Section {
                id: section_id(&f.path),
                number: i + 1,
                title,
                summary: info.summary,
                checks: info.checks,
                terms: info.terms.len(),
            }
        })
        .collect();
    // Every entry with the section that declares it; each page links its first use of each.
    let terms: Vec<(usize, glossary::Term)> =
        info.iter().enumerate().flat_map(|(i, s)| s.terms.iter().map(move |t| (i, t.clone()))).collect();
    let bare: Vec<glossary::Term> = terms.iter().map(|(_, t)| t.clone()).collect();
    let mut out = Vec::new();
    let mut bodies = Vec::new();
    let mut entries = Vec::new();
    for (i, file) in markdown.iter().enumerate() {
        let s = &sections[i];
        let uses = glossary::first_uses(&file.text, &bare);
        let uses: Vec<(&glossary::Term, &glossary::Use, bool)> = terms
            .iter()
            .zip(&uses)
            .filter_map(|((declared, term), u)| Some((term, u.as_ref()?, *declared == i)))
            .collect();
        let regions = region_html.get(i).map_or(&[][..], Vec::as_slice);
        let (body, found) = render_body(&file.text, regions, markdown, &uses);
        // A code box scrolls sideways; it takes the focus itself so that the keyboard can scroll
        // it (the copy button the script puts inside it would otherwise keep Chromium from
        // making it focusable, and scrolls nothing).
        let body = body.replace("<pre>", "<pre tabindex=\"0\" aria-label=\"Code\">");
        let body = numbered_title(&body, s.number);
        let page_body = format!("{body}{}", site::summary(s));
        out.push(OutputFile {
            name: format!("{}.html", s.id),
            text: site::page(
                &sections,
                &site::Kind::Section { i, source: &file.path },
                &site::numbered(s),
                &page_body,
            ),
        });
        let md_name = file_name(&file.path);
        out.push(OutputFile { name: format!("markdown/{md_name}"), text: file.text.clone() });
        bodies.push(body);
        entries.push(found);
    }
    out.push(OutputFile {
        name: "index.html".into(),
        text: site::page(&sections, &site::Kind::Index, "Contents", &site::index(&sections)),
    });
    if !terms.is_empty() {
        out.push(OutputFile {
            name: "glossary.html".into(),
            text: site::page(
                &sections,
                &site::Kind::Glossary,
                "Glossary",
                &glossary::page(&sections, &terms),
            ),
        });
    }
    out.push(OutputFile { name: "print.html".into(), text: print::print_page(&sections, &bodies) });
    out.push(OutputFile { name: "search-index.js".into(), text: search::index(&sections, &entries) });
    out.push(OutputFile { name: "style.css".into(), text: STYLE.to_string() });
    out.push(OutputFile { name: "qkv.js".into(), text: script() });
    out.extend(notebooks);
    out
}

/// The section's number before its title, in the page's first `<h1>`.
fn numbered_title(body: &str, number: usize) -> String {
    match body.find("<h1>") {
        Some(at) => {
            let at = at + "<h1>".len();
            format!("{}<span class=\"section-number\">{number}.</span> {}", &body[..at], &body[at..])
        }
        None => body.to_string(),
    }
}

/// Renders one section's markdown to the page body; `regions` holds the HTML of each region
/// (in order) that replaces its rendered markdown, `uses` the first use of each glossary term on
/// the page (and whether this page declares it). Also returns the section's headings with the
/// text under each, for the search index.
fn render_body(
    text: &str,
    regions: &[Option<String>],
    markdown: &[SourceFile],
    uses: &[(&glossary::Term, &glossary::Use, bool)],
) -> (String, Vec<search::Entry>) {
    let events: Vec<(Event<'_>, std::ops::Range<usize>)> =
        Parser::new_ext(text, markdown_options()).into_offset_iter().collect();
    let mut out: Vec<Event<'_>> = Vec::with_capacity(events.len());
    let mut skip_block = false;
    let mut skip_region = false;
    let mut region = 0;
    // The page's sections, for its contents list.
    let mut contents: Vec<(String, String)> = Vec::new();
    // The search entries: the text before the first heading belongs to the title's.
    let mut entries: Vec<search::Entry> = vec![search::Entry::default()];
    let mut in_heading = false;
    // The heading tables fall under, and how many have so far: a table's name for a screen
    // reader's list of regions (a page's dozen tables were each "Table").
    let (mut section, mut tables) = (String::new(), 0);
    let mut table_names = std::collections::HashSet::new();
    let mut i = 0;
    while i < events.len() {
        let (event, _) = &events[i];
        i += 1;
        if skip_block {
            if matches!(event, Event::End(TagEnd::CodeBlock)) {
                skip_block = false;
            }
            continue;
        }
        if skip_region {
            if let Event::Html(h) = event
                && h.trim() == document::CLOSE
            {
                skip_region = false;
                out.push(Event::Html("</div>\n".into()));
            }
            continue;
        }
        match event {
            Event::Text(t) | Event::Code(t) if !in_heading => {
                if let Some(e) = entries.last_mut() {
                    e.text.push_str(t);
                    e.text.push(' ');
                }
                let linked = matches!(event, Event::Text(_)) && glossary::link_uses(i - 1, t, uses, &mut out);
                if !linked {
                    out.push(event.clone());
                }
            }
            Event::End(TagEnd::Heading(_)) => {
                in_heading = false;
                out.push(event.clone());
            }
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(info)))
                if info.split_whitespace().next() == Some("qkv") =>
            {
                // Declarations are data; the prose and generated blocks show them.
                skip_block = true;
            }
            Event::Html(h) if h.trim() == document::CLOSE => out.push(Event::Html("</div>\n".into())),
            Event::Html(h) if h.trim().starts_with(document::OPEN) => {
                let kind = h.trim()[document::OPEN.len()..].split_whitespace().next().unwrap_or("");
                out.push(Event::Html(format!("<div class=\"generated {}\">\n", escape(kind)).into()));
                if let Some(Some(html)) = regions.get(region) {
                    out.push(Event::Html(html.clone().into()));
                    skip_region = true;
                }
                region += 1;
            }
            Event::Start(Tag::Link { dest_url, .. }) if dest_url.starts_with('=') => {
                let path = dest_url[1..].rsplit_once(':').map_or(&dest_url[1..], |(p, _)| p);
                out.push(Event::InlineHtml(
                    format!("<span class=\"num\" title=\"{}\">", escape(path)).into(),
                ));
            }
            Event::End(TagEnd::Link) if last_open_is_citation(&out) => {
                out.push(Event::InlineHtml("</span>".into()))
            }
            Event::Start(Tag::Link { link_type, dest_url, title, id }) => {
                out.push(Event::Start(Tag::Link {
                    link_type: *link_type,
                    dest_url: rewrite_link(dest_url, markdown),
                    title: title.clone(),
                    id: id.clone(),
                }));
            }
            // A wide table scrolls inside its own box, never the page.
            Event::Start(Tag::Table(_)) => {
                tables += 1;
                let placed = || match section.as_str() {
                    "" => format!("Table {tables}"),
                    section => format!("{section}, table {tables}"),
                };
                let mut name = bold_lead(&events, i - 1).unwrap_or_else(placed);
                // Two tables of one title (two `**$W_q$**` under one heading) are told apart too.
                if !table_names.insert(name.clone()) {
                    name = format!("{name} ({})", placed());
                    table_names.insert(name.clone());
                }
                out.push(Event::Html(scroll_box(&name).into()));
                out.push(event.clone());
            }
            Event::End(TagEnd::Table) => {
                out.push(event.clone());
                out.push(Event::Html("</div>\n".into()));
            }
            Event::InlineMath(tex) => {
                out.push(Event::InlineHtml(mathml(&document::without_math_citations(tex), false).into()))
            }
            Event::DisplayMath(tex) => {
                out.push(Event::InlineHtml(display_math(&document::without_math_citations(tex)).into()))
            }
            Event::Start(Tag::Heading { level, id: None, classes, attrs }) => {
                let mut title = String::new();
                for (e, _) in events[i..].iter() {
                    match e {
                        Event::End(TagEnd::Heading(_)) => break,
                        Event::Text(t) | Event::Code(t) => title.push_str(t),
                        _ => {}
                    }
                }
                let id = if *level == HeadingLevel::H1 { None } else { Some(CowStr::from(slug(&title))) };
                in_heading = true;
                (section, tables) = (title.clone(), 0);
                if *level == HeadingLevel::H1 {
                    entries[0].title = title.clone();
                } else {
                    entries.push(search::Entry {
                        id: Some(slug(&title)),
                        title: title.clone(),
                        text: String::new(),
                    });
                }
                if *level == HeadingLevel::H2 {
                    contents.push((slug(&title), title));
                }
                out.push(Event::Start(Tag::Heading {
                    level: *level,
                    id,
                    classes: classes.clone(),
                    attrs: attrs.clone(),
                }));
            }
            other => out.push(other.clone()),
        }
    }
    let mut html = String::new();
    pulldown_cmark::html::push_html(&mut html, out.into_iter());
    let mut html = punctuation_with_math(&html);
    if contents.len() > 1
        && let Some(at) = html.find("</h1>\n").map(|i| i + "</h1>\n".len())
    {
        html.insert_str(at, &contents_list(&contents));
    }
    (html, entries)
}

/// The text of the paragraph ending just before event `at` if it is all bold, as the generated
/// tables title themselves (`**$W_q$**`, `**Step 2**`): a table's name. Math keeps its TeX.
fn bold_lead(events: &[(Event<'_>, std::ops::Range<usize>)], at: usize) -> Option<String> {
    let before = |j: usize| j.checked_sub(1).map(|j| (j, &events[j].0));
    let (j, Event::End(TagEnd::Paragraph)) = before(at)? else { return None };
    let (mut j, Event::End(TagEnd::Strong)) = before(j)? else { return None };
    let mut parts = Vec::new();
    loop {
        let (k, event) = before(j)?;
        j = k;
        match event {
            Event::Text(t) | Event::Code(t) | Event::InlineMath(t) => parts.push(t.to_string()),
            Event::SoftBreak => parts.push(" ".into()),
            Event::Start(Tag::Strong) => break,
            _ => return None,
        }
    }
    let (_, Event::Start(Tag::Paragraph)) = before(j)? else { return None };
    parts.reverse();
    Some(parts.concat())
}

/// Punctuation that must not start a line (closing) or end one (opening) beside math.
const CLOSING: &[char] = &[',', '.', ';', ':', '!', '?', ')', ']', '”', '’'];
const OPENING: &[char] = &['(', '[', '“', '‘'];

/// Keeps the punctuation touching an inline formula on the formula's line. A browser may break a
/// line between a `<math>` element and the text right after it, which left steps and questions
/// with a line starting `:`, `,` or a lone `)` on a phone; each formula with punctuation against
/// it goes into a `<span class="nobr">` with that punctuation.
fn punctuation_with_math(html: &str) -> String {
    const CLOSE: &str = "</math>";
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(at) = rest.find(CLOSE) {
        let end = at + CLOSE.len();
        let after: usize = rest[end..].chars().take_while(|c| CLOSING.contains(c)).map(char::len_utf8).sum();
        // Formulas do not nest, so the nearest opening tag before the close is this one's.
        let start = rest[..at].rfind("<math").unwrap_or(at);
        let before: usize =
            rest[..start].chars().rev().take_while(|c| OPENING.contains(c)).map(char::len_utf8).sum();
        if start < at && after + before > 0 {
            out.push_str(&rest[..start - before]);
            out.push_str("<span class=\"nobr\">");
            out.push_str(&rest[start - before..end + after]);
            out.push_str("</span>");
            rest = &rest[end + after..];
        } else {
            out.push_str(&rest[..end]);
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    out
}

/// The list of a page's sections, placed under its title.
fn contents_list(sections: &[(String, String)]) -> String {
    let mut out =
        String::from("<nav class=\"contents\" aria-label=\"On this page\">\n<p>On this page</p>\n<ol>\n");
    for (id, title) in sections {
        out.push_str(&format!("<li><a href=\"#{}\">{}</a></li>\n", escape(id), escape(title)));
    }
    out.push_str("</ol>\n</nav>\n");
    out
}

/// Whether the innermost open link in `out` is a citation (rendered as a span).
fn last_open_is_citation(out: &[Event<'_>]) -> bool {
    let mut depth = 0usize;
    for e in out.iter().rev() {
        match e {
            Event::InlineHtml(h) if h.as_ref() == "</span>" => depth += 1,
            Event::InlineHtml(h) if h.starts_with("<span class=\"num\"") => {
                if depth == 0 {
                    return true;
                }
                depth -= 1;
            }
            Event::Start(Tag::Link { .. }) => return false,
            _ => {}
        }
    }
    false
}

/// Links between lesson files point at the pages instead.
fn rewrite_link<'a>(dest: &CowStr<'a>, markdown: &[SourceFile]) -> CowStr<'a> {
    let (file, anchor) = dest.split_once('#').map_or((dest.as_ref(), ""), |(f, a)| (f, a));
    if let Some(f) = linked_file(markdown, file) {
        let anchor = if anchor.is_empty() { String::new() } else { format!("#{anchor}") };
        return CowStr::from(format!("{}.html{anchor}", section_id(&markdown[f].path)));
    }
    dest.clone()
}

#[cfg(test)]
mod tests;
