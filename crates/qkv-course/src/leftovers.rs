//! The promise that no citation syntax survives a build, checked on the files themselves: a
//! page, notebook or markdown file that still holds `](=`, `{=`, `\verb|=` or a `\vphantom`
//! marker would show the learner whatever number was typed. The scan reads the output as text,
//! apart from the parser that found the citations, so that it can catch what the parser missed.

use crate::document;

/// Every leftover citation in the built files, as `file: text around it`. `files` are the site's
/// text files and the updated lesson files, by name; a page's scripts, code and stylesheet, and
/// the page script, are left out (code may show the syntax itself). In a lesson file, the
/// citations the build keeps there by design are accounted for: a leftover is a citation shape
/// beyond them.
pub fn leftover_citations<'a>(files: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let mut found = Vec::new();
    for (name, text) in files {
        if name.ends_with(".css") || name.ends_with(".js") {
            continue;
        }
        if name.ends_with(".md") {
            let shapes = SHAPES.iter().map(|s| without_code_markdown(text).matches(s).count()).sum::<usize>();
            let cited = document::parse(0, text).map_or(0, |d| d.citations.len());
            if shapes != cited {
                found.push(format!(
                    "{name}: {shapes} citation shapes outside code, but {cited} citations were read"
                ));
            }
            continue;
        }
        let shown = if name.ends_with(".html") { without_code_html(text) } else { text.to_string() };
        let marks = SHAPES
            .iter()
            .chain(&["\\vphantom"])
            .flat_map(|shape| shown.match_indices(shape).map(|(at, _)| at));
        // Rendered math shows a stray marker's path as text: `=sentence.love.output:2`.
        let mut at: Vec<usize> = marks.chain(cited_paths(&shown)).collect();
        at.sort_unstable();
        // One finding per place: the pieces of one citation sit within a few characters.
        at.dedup_by(|later, earlier| *later < *earlier + 40);
        for at in at {
            let start = (0..=at.saturating_sub(30)).rev().find(|&i| shown.is_char_boundary(i)).unwrap_or(0);
            let around: String = shown[start..].chars().take(70).collect();
            found.push(format!("{name}: citation syntax left in `{}`", around.replace('\n', " ")));
        }
    }
    found
}

/// What each citation form starts with: a link's target, a quiz text's braces, a math marker.
const SHAPES: &[&str] = &["](=", "{=", "\\verb|="];

/// Where `text` holds a cited path as written after its `=`: `=ID.SEGMENT…:FORMAT`.
fn cited_paths(text: &str) -> Vec<usize> {
    let word = |c: char| c.is_alphanumeric() || c == '_' || c == '-';
    text.match_indices('=')
        .filter(|&(at, _)| {
            let rest = &text[at + 1..];
            let path: String = rest.chars().take_while(|&c| word(c) || c == '.').collect();
            let format = rest[path.len()..].strip_prefix(':').and_then(|f| f.chars().next());
            path.contains('.')
                && path.starts_with(word)
                && format.is_some_and(|c| c.is_ascii_digit() || c == 'w')
        })
        .map(|(at, _)| at)
        .collect()
}

/// An HTML page without its `<script>`, `<pre>` and `<code>` elements' content, and
/// with its tags dropped (attributes hold no text a learner reads).
fn without_code_html(html: &str) -> String {
    let mut out = String::with_capacity(html.len());
    let mut rest = html;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        rest = &rest[open..];
        let name: String =
            rest[1..].chars().take_while(|c| c.is_ascii_alphanumeric()).collect::<String>().to_lowercase();
        let end_of_tag = rest.find('>').map_or(rest.len(), |i| i + 1);
        if ["script", "pre", "code"].contains(&name.as_str()) {
            let close = format!("</{name}>");
            rest = rest.find(&close).map_or("", |i| &rest[i + close.len()..]);
        } else {
            rest = &rest[end_of_tag..];
        }
    }
    out.push_str(rest);
    out
}

/// Markdown without fenced code blocks and inline code spans, found by their backticks and
/// tildes alone.
fn without_code_markdown(text: &str) -> String {
    let mut out = String::new();
    // The open fence's marker, and how deep in block quotes it was opened: a fence inside a
    // quote ends with the quote, closed or not (CommonMark), so a line quoted less deeply is text.
    let mut fence: Option<(String, usize)> = None;
    for line in text.lines() {
        let prefix = line.len() - line.trim_start_matches([' ', '>']).len();
        let depth = line[..prefix].matches('>').count();
        let trimmed = &line[prefix..];
        let marker: String = trimmed.chars().take_while(|&c| c == '`' || c == '~').collect();
        if fence.as_ref().is_some_and(|(_, opened)| depth < *opened) {
            fence = None;
        }
        match &fence {
            Some((f, _))
                if trimmed.starts_with(f.as_str())
                    && trimmed.trim_start_matches(['`', '~']).trim().is_empty() =>
            {
                fence = None
            }
            Some(_) => {}
            None if marker.len() >= 3 => fence = Some((marker, depth)),
            None => {
                // Inline code: drop what lies between matching runs of backticks.
                // A run of backticks that no run of the same length closes is literal text.
                let mut rest = line;
                while let Some(open) = rest.find('`') {
                    let ticks = rest[open..].chars().take_while(|&c| c == '`').count();
                    let after = &rest[open + ticks..];
                    match after.find(&"`".repeat(ticks)) {
                        Some(close) => {
                            out.push_str(&rest[..open]);
                            rest = &after[close + ticks..];
                        }
                        None => {
                            out.push_str(&rest[..open + ticks]);
                            rest = after;
                        }
                    }
                }
                out.push_str(rest);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
