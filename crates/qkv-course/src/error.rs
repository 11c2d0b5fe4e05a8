//! Content errors: a problem in the lesson source, located by `file:line:column`.

use std::fmt;

/// One problem in the lesson source: where it is, the offending text, and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentError {
    /// The file as the caller named it in [`crate::SourceFile::path`].
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, counted in characters.
    pub column: usize,
    /// What is wrong, as a sentence.
    pub message: String,
    /// The offending source text (trimmed to one line).
    pub found: String,
    /// What the pipeline expected instead.
    pub expected: String,
}

impl fmt::Display for ContentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.column, self.message)?;
        write!(f, "\n    found:    {}", self.found)?;
        write!(f, "\n    expected: {}", self.expected)
    }
}

impl std::error::Error for ContentError {}

/// Every problem found in one run; the pipeline reports them all rather than stopping at the first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ContentErrors(pub Vec<ContentError>);

impl fmt::Display for ContentErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for error in &self.0 {
            writeln!(f, "{error}")?;
        }
        let n = self.0.len();
        write!(f, "{n} error{} in the lesson source; nothing was written", if n == 1 { "" } else { "s" })
    }
}

/// A problem found while evaluating, before it is given a file position.
///
/// `at` is a byte offset into the document the problem belongs to.
#[derive(Debug, Clone)]
pub(crate) struct Problem {
    pub doc: usize,
    pub at: usize,
    pub message: String,
    pub found: String,
    pub expected: String,
}

impl Problem {
    pub(crate) fn new(
        doc: usize,
        at: usize,
        message: impl Into<String>,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) -> Self {
        Self { doc, at, message: message.into(), found: found.into(), expected: expected.into() }
    }
}

/// The allowed name nearest to a misspelt one, if it is close.
pub(crate) fn closest<'a>(name: &str, allowed: &[&'a str]) -> Option<&'a str> {
    let distance = |a: &str, b: &str| {
        let b: Vec<char> = b.chars().collect();
        let mut row: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut prev = row[0];
            row[0] = i + 1;
            for (j, &cb) in b.iter().enumerate() {
                let cur = row[j + 1];
                row[j + 1] = (prev + usize::from(ca != cb)).min(row[j] + 1).min(cur + 1);
                prev = cur;
            }
        }
        row[b.len()]
    };
    allowed.iter().map(|&a| (distance(name, a), a)).filter(|&(d, _)| d <= 2).min().map(|(_, a)| a)
}
