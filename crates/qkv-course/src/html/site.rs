//! The course around the sections: the page shell every page shares (skip link, numbered section
//! navigation, search box, the sticky progress bar, previous and next, the footer), the contents
//! page, and each section's summary of its graded checks. The script fills in what depends on the
//! learner (progress, search results); without it every link and list is still there.

use serde_json::json;

use super::Section;
use crate::files::file_name;
use crate::markup::{escape, json_script};

/// The course's own title, on the contents page and the print view.
pub(super) const COURSE_TITLE: &str = "Attention, number by number";
/// The course's lede, under its title.
const COURSE_LEDE: &str = "A course on the attention inside every Transformer: one query, then masks, many heads, decoding with a KV cache and FlashAttention's tiles. Every number on these pages is computed by the qkv engine.";

/// What a page is, for its shell.
pub(super) enum Kind<'a> {
    /// Section `i`, rendered from the markdown file `source`.
    Section { i: usize, source: &'a str },
    /// The contents page.
    Index,
    /// The whole course on one page, for print (no script).
    Print,
    /// The glossary of the course's terms.
    Glossary,
}

/// "1. Title": a section's number and title, as navigation and links show it.
pub(super) fn numbered(s: &Section) -> String {
    format!("{}. {}", s.number, s.title)
}

/// Whether any section declares a glossary entry (and so the site has `glossary.html`).
fn has_glossary(sections: &[Section]) -> bool {
    sections.iter().any(|s| s.terms > 0)
}

/// Whether the course has any graded check (and so any progress to show).
fn has_checks(sections: &[Section]) -> bool {
    sections.iter().any(|s| !s.checks.is_empty())
}

/// A whole page: `body` is the article's HTML.
pub(super) fn page(sections: &[Section], kind: &Kind<'_>, title: &str, body: &str) -> String {
    let current = match kind {
        Kind::Section { i, .. } => Some(*i),
        _ => None,
    };
    let mut nav = String::from("<nav class=\"sections\" aria-label=\"Sections\"><a href=\"index.html\"");
    if matches!(kind, Kind::Index) {
        nav.push_str(" aria-current=\"page\"");
    }
    nav.push_str(">Contents</a>");
    for (i, s) in sections.iter().enumerate() {
        let class = if Some(i) == current { " aria-current=\"page\"" } else { "" };
        nav.push_str(&format!(" · <a href=\"{}.html\"{class}>{}</a>", escape(&s.id), escape(&numbered(s))));
    }
    if has_glossary(sections) {
        let current = if matches!(kind, Kind::Glossary) { " aria-current=\"page\"" } else { "" };
        nav.push_str(&format!(" · <a href=\"glossary.html\"{current}>Glossary</a>"));
    }
    nav.push_str("</nav>");
    // The print view has no script, so nothing that only the script can use.
    let scripted = !matches!(kind, Kind::Print);
    let search = if scripted { search_box() } else { String::new() };
    let mut bar = String::new();
    if scripted && has_checks(sections) {
        bar.push_str(&course_checks(sections));
        if let Some(i) = current {
            bar.push_str(&progress_bar(sections, i));
        }
    }
    let script = if scripted { "<script src=\"qkv.js\" defer></script>\n" } else { "" };
    let pager = current.map(|i| pager(sections, i)).unwrap_or_default();
    let footer = match kind {
        Kind::Section { source, .. } => {
            let name = file_name(source);
            format!(
                "<footer><p>This section is written in <a href=\"markdown/{0}\">{0}</a>, where its examples are declared as data. Every number, table and figure on this page is computed from those inputs by the qkv attention engine's f64 reference, so a changed input changes every number that depends on it.</p></footer>",
                escape(name)
            )
        }
        _ => "<footer><p>Each section is written in markdown, where its examples are declared as data; every number, table and figure is computed from those inputs by the qkv attention engine.</p></footer>".to_string(),
    };
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>{} · qkv</title>\n<link rel=\"stylesheet\" href=\"style.css\">\n{script}</head>\n<body>\n<a class=\"skip\" href=\"#content\">Skip to the content</a>\n<header>{nav}{search}</header>\n{bar}<main id=\"content\" tabindex=\"-1\">\n<article>\n{body}</article>\n{pager}\n</main>\n{footer}\n</body>\n</html>\n",
        escape(title)
    )
}

/// The search box, hidden until the script runs (searching needs it); the index it reads is
/// `search-index.js`, loaded on first use.
fn search_box() -> String {
    "<div class=\"search\" role=\"search\" aria-label=\"Course\" data-qkv-search hidden><label for=\"qkv-search\">Search the course</label> <input id=\"qkv-search\" type=\"search\" autocomplete=\"off\" spellcheck=\"false\" aria-describedby=\"qkv-search-status\" aria-controls=\"qkv-search-results\"><p id=\"qkv-search-status\" class=\"search-status\" role=\"status\" aria-live=\"polite\" data-qkv-search-status></p><ul id=\"qkv-search-results\" class=\"search-results\" data-qkv-search-results></ul></div>".to_string()
}

/// The course's graded checks (ids by section), for the script, which counts them from storage.
fn course_checks(sections: &[Section]) -> String {
    let course = json!({
        "sections": sections.iter().map(|s| json!({
            "id": s.id, "number": s.number, "title": s.title, "checks": s.checks,
        })).collect::<Vec<_>>(),
    });
    json_script("data-qkv-course", &course)
}

/// The sticky bar with the learner's progress in section `i` and across the course: a named
/// landmark of its own, so that no text of the page lies outside one.
fn progress_bar(sections: &[Section], i: usize) -> String {
    let total: usize = sections.iter().map(|s| s.checks.len()).sum();
    let s = &sections[i];
    let (section, link) = if s.checks.is_empty() {
        (String::new(), String::new())
    } else {
        (
            format!(" data-qkv-section=\"{}\"", escape(&s.id)),
            " <a href=\"#section-summary\">Summary</a>".to_string(),
        )
    };
    format!(
        "<aside class=\"course-bar\" aria-label=\"Your progress\" data-qkv-course-progress{section} data-qkv-answered=\"0\" data-qkv-total=\"{total}\" data-qkv-score=\"0\" hidden>\n<p><span data-qkv-course-text>0 of {total} checks answered</span>{link}</p>\n</aside>\n"
    )
}

/// Previous and next section, numbered.
fn pager(sections: &[Section], i: usize) -> String {
    let mut out = String::from("<nav class=\"pager\" aria-label=\"Previous and next section\">");
    if i > 0 {
        let s = &sections[i - 1];
        out.push_str(&format!(
            "<a rel=\"prev\" href=\"{}.html\"><span class=\"pager-label\">Previous</span> ← {}</a>",
            escape(&s.id),
            escape(&numbered(s))
        ));
    }
    if let Some(s) = sections.get(i + 1) {
        out.push_str(&format!(
            "<a rel=\"next\" href=\"{}.html\"><span class=\"pager-label\">Next</span> {} →</a>",
            escape(&s.id),
            escape(&numbered(s))
        ));
    }
    out.push_str("</nav>");
    out
}

/// The contents page's article: the course's title and lede, the course's progress (filled by
/// the script), every section with its number, summary and progress, and the print view.
pub(super) fn index(sections: &[Section]) -> String {
    let mut out =
        format!("<h1>{}</h1>\n<p class=\"lede\">{}</p>\n", escape(COURSE_TITLE), escape(COURSE_LEDE));
    if has_checks(sections) {
        out.push_str("<div class=\"progress course\" data-qkv-course-total hidden>\n<p><strong>Your progress in the course</strong> <span data-qkv-course-text></span></p>\n<progress max=\"1\" value=\"0\"></progress>\n<button type=\"button\" data-qkv-reset-course>Reset all progress</button>\n</div>\n");
    }
    out.push_str("<ol class=\"toc\">\n");
    for s in sections {
        let total = s.checks.len();
        let _ = std::fmt::Write::write_fmt(
            &mut out,
            format_args!(
                "<li data-qkv-toc=\"{0}\" data-qkv-total=\"{total}\"><a href=\"{0}.html\"><span class=\"section-number\">{1}.</span> {2}</a>",
                escape(&s.id),
                s.number,
                escape(&s.title)
            ),
        );
        if let Some(summary) = &s.summary {
            out.push_str(&format!("<p class=\"toc-summary\">{}</p>", escape(summary)));
        }
        if total > 0 {
            out.push_str(&format!(
                "<p class=\"toc-progress\" data-qkv-toc-progress>{total} {}</p>",
                checks_word(total)
            ));
        }
        out.push_str("</li>\n");
    }
    out.push_str("</ol>\n<p class=\"print-link\"><a href=\"print.html\">The whole course on one page</a>, to print or to read offline (answers collapsed, no widgets).</p>\n");
    if has_glossary(sections) {
        out.push_str("<p class=\"print-link\"><a href=\"glossary.html\">The glossary</a>: every term and symbol of the course, with the section that introduces it.</p>\n");
    }
    out
}

/// "graded check" or "graded checks".
fn checks_word(n: usize) -> &'static str {
    if n == 1 { "graded check" } else { "graded checks" }
}

/// The end of a section with graded checks: each check with a link to it, the score and what is
/// left (filled by the script), and a reset that asks first.
pub(super) fn summary(section: &Section) -> String {
    if section.checks.is_empty() {
        return String::new();
    }
    let n = section.checks.len();
    let mut out = format!(
        "<section class=\"section-summary\" id=\"section-summary\" aria-labelledby=\"section-summary-title\" data-qkv-summary data-qkv-section=\"{}\">\n<h2 id=\"section-summary-title\">Your checks in this section</h2>\n<p data-qkv-summary-text>This section has {n} {}:</p>\n<ol class=\"summary-checks\">\n",
        escape(&section.id),
        checks_word(n)
    );
    for (k, id) in section.checks.iter().enumerate() {
        out.push_str(&format!(
            "<li data-qkv-summary-check=\"{0}\"><a href=\"#quiz-{0}\">Check {1}</a> <span data-qkv-summary-state></span></li>\n",
            escape(id),
            k + 1
        ));
    }
    out.push_str("</ol>\n<button type=\"button\" data-qkv-reset hidden>Reset progress in this section</button>\n</section>\n");
    out
}
