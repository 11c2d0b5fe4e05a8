//! Stale places: where the committed text of a citation or region differs from what the build
//! computes, and the `--check` report that lists them.

use std::fmt;
use std::ops::Range;

use crate::location::LineIndex;

/// A replacement of one byte range of one file.
pub(crate) struct Edit {
    pub range: Range<usize>,
    pub text: String,
    /// How a stale report names the place.
    pub what: String,
}

/// A generated place whose committed text differs from what the build computes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stale {
    /// File, as in [`crate::SourceFile::path`].
    pub file: String,
    /// 1-based line of the place.
    pub line: usize,
    /// What the place is (`citation sentence.love.output`, `steps sentence.love`, ...).
    pub what: String,
    /// What the build would write (for blocks: the first line that differs).
    pub expected: String,
    /// What is there now.
    pub found: String,
}

impl fmt::Display for Stale {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: expected {}, found {} ({})",
            self.file, self.line, self.expected, self.found, self.what
        )
    }
}

/// The report for `--check`: every stale place and how to fix it; empty when fresh.
pub fn stale_report(stale: &[Stale]) -> String {
    if stale.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    for s in stale {
        out.push_str(&s.to_string());
        out.push('\n');
    }
    out.push_str(&format!(
        "{} generated place{} out of date: run `cargo xtask build-content` to rewrite them, then review and commit the diff",
        stale.len(),
        if stale.len() == 1 { " is" } else { "s are" }
    ));
    out
}

impl Stale {
    /// The `--check` report for a list of stale places (see [`stale_report`]).
    pub fn report(stale: &[Stale]) -> String {
        stale_report(stale)
    }
}

/// The places of one file (`path`, `text`) where an edit would change the text, top to bottom.
pub(crate) fn in_file(path: &str, text: &str, edits: &[Edit]) -> Vec<Stale> {
    let index = LineIndex::new(text);
    let mut stale = Vec::new();
    for e in edits {
        let found = &text[e.range.clone()];
        if found == e.text {
            continue;
        }
        let (mut line, _) = index.position(text, e.range.start);
        let (expected, found) = if e.text.contains('\n') || found.contains('\n') {
            // Blocks: point at the first line that differs.
            let (new, old): (Vec<&str>, Vec<&str>) = (e.text.lines().collect(), found.lines().collect());
            let i = (0..new.len().max(old.len())).find(|&i| new.get(i) != old.get(i)).unwrap_or(0);
            line += i;
            match (new.get(i), old.get(i)) {
                (Some(n), Some(o)) => {
                    let (n, o) = differing_window(n, o);
                    (quoted(&n), quoted(&o))
                }
                _ => {
                    // One side ran out of lines: show the first line with text from here on, so
                    // a region's first build does not read "expected ``".
                    let from_here = |lines: &[&str]| {
                        lines.iter().skip(i).find(|l| !l.trim().is_empty()).map(|l| quoted(&shorten(l)))
                    };
                    let found = if old.iter().all(|l| l.trim().is_empty()) {
                        "an empty region".to_string()
                    } else {
                        from_here(&old).unwrap_or_else(|| "nothing more".to_string())
                    };
                    (from_here(&new).unwrap_or_else(|| "nothing more".to_string()), found)
                }
            }
        } else {
            (e.text.clone(), if found.is_empty() { "(nothing)".to_string() } else { found.to_string() })
        };
        stale.push(Stale { file: path.to_string(), line, what: e.what.clone(), expected, found });
    }
    // Citations and regions were gathered separately; list them top to bottom.
    stale.sort_by_key(|s| s.line);
    stale
}

/// The part of two lines around where they first differ, so a long line's change stays visible:
/// `…the output is 4.01.](figures/love-sweep.svg)` against `…the output is 4.41.](…`.
fn differing_window(new: &str, old: &str) -> (String, String) {
    let (new, old) = (new.trim(), old.trim());
    let (n, o): (Vec<char>, Vec<char>) = (new.chars().collect(), old.chars().collect());
    let first = n.iter().zip(&o).take_while(|(a, b)| a == b).count();
    let start = first.saturating_sub(30);
    let cut = |chars: &[char]| {
        let end = (start + 70).min(chars.len());
        let mut out = String::new();
        if start > 0 {
            out.push('…');
        }
        out.extend(&chars[start..end]);
        if end < chars.len() {
            out.push('…');
        }
        out
    };
    (cut(&n), cut(&o))
}

/// A line in backticks, as markdown quotes code: with doubled ones and spaces when the line has
/// backticks of its own (`` ```python ``).
fn quoted(line: &str) -> String {
    if line.contains('`') { format!("`` {line} ``") } else { format!("`{line}`") }
}

fn shorten(s: &str) -> String {
    let s = s.trim();
    if s.chars().count() > 90 {
        format!("{}…", s.chars().take(90).collect::<String>())
    } else {
        s.to_string()
    }
}

#[cfg(test)]
mod tests;
