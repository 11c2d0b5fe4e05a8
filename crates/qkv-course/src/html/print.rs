//! The print view, `print.html`: every section's article on one page, in course order, without
//! the script, so quizzes keep their answers collapsed behind `<details>`, widgets show their
//! tables and no control appears; `style.css`'s `@media print` rules do the rest.

use super::Section;
use super::site::{COURSE_TITLE, Kind, page};
use crate::markup::escape;

/// The whole print page. `bodies[i]` is section `i`'s article as its own page has it; its ids
/// and in-page links get the section's id as a prefix, since two sections may share a heading
/// or a quiz id.
pub(super) fn print_page(sections: &[Section], bodies: &[String]) -> String {
    let mut body = format!(
        "<h1>{}</h1>\n<p class=\"lede\">The whole course on one page, to print or read offline. Answers are collapsed under each check; the widgets show their numbers as tables.</p>\n",
        escape(COURSE_TITLE)
    );
    for (s, html) in sections.iter().zip(bodies) {
        body.push_str(&format!("<section class=\"print-section\" id=\"{}\">\n", escape(&s.id)));
        let mut html = prefixed_ids(html, &s.id);
        // Links between sections stay on this page.
        for t in sections {
            html = html
                .replace(&format!(" href=\"{}.html#", t.id), &format!(" href=\"#{}--", t.id))
                .replace(&format!(" href=\"{}.html\"", t.id), &format!(" href=\"#{}\"", t.id));
        }
        body.push_str(&html);
        body.push_str("</section>\n");
    }
    page(sections, &Kind::Print, &format!("{COURSE_TITLE}, the whole course"), &body)
}

/// `html` with every `id="X"` and same-page reference to one (`href="#X"`, `aria-controls`,
/// `aria-labelledby`, `for`) made `PREFIX--X`. The page's HTML is the build's own, always with
/// double-quoted attributes, which is what this relies on.
pub(super) fn prefixed_ids(html: &str, prefix: &str) -> String {
    let mut out = html.to_string();
    // The space in front keeps `data-qkv-grid="` from reading as `id="`.
    for attr in [" id=\"", " href=\"#", " aria-controls=\"", " aria-labelledby=\"", " for=\""] {
        out = out.replace(attr, &format!("{attr}{}--", escape(prefix)));
    }
    out
}
