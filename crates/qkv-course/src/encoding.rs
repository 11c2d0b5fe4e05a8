//! A lesson file's bytes as text and back: UTF-8 checked with the position of the first bad byte,
//! a byte-order mark set aside while parsing and put back on output, and each file's own line
//! ending used for everything the build writes into it.

use crate::error::ContentError;

/// The UTF-8 byte-order mark some editors put at the start of a file.
const BOM: char = '\u{feff}';

/// The text of a lesson file, or a content error naming the line and column of its first byte
/// that is not UTF-8.
pub fn decode(path: &str, bytes: &[u8]) -> Result<String, ContentError> {
    let error = match std::str::from_utf8(bytes) {
        Ok(text) => return Ok(text.to_string()),
        Err(e) => e,
    };
    let valid = &bytes[..error.valid_up_to()];
    // The prefix is valid UTF-8 by construction, so this never falls back.
    let before = std::str::from_utf8(valid).unwrap_or_default();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before[line_start..].chars().count() + 1;
    let bad_len = error.error_len().unwrap_or(bytes.len() - valid.len());
    let bad = &bytes[valid.len()..valid.len() + bad_len];
    let line_end =
        bytes[line_start..].iter().position(|&b| b == b'\n').map_or(bytes.len(), |i| line_start + i);
    Err(ContentError {
        file: path.to_string(),
        line,
        column,
        message: format!(
            "the file is not UTF-8: byte{} {} here",
            if bad.len() == 1 { "" } else { "s" },
            escaped(bad)
        ),
        found: escaped(&bytes[line_start..line_end]).trim().to_string(),
        expected: "UTF-8 text (save the file as UTF-8 in your editor)".into(),
    })
}

/// Bytes as text, with every byte that is not part of a UTF-8 character written `\xNN`.
fn escaped(bytes: &[u8]) -> String {
    let mut out = String::new();
    for chunk in bytes.utf8_chunks() {
        out.push_str(chunk.valid().trim_end_matches('\r'));
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02X}"));
        }
    }
    out
}

/// `text` without a leading byte-order mark, and whether it had one.
pub(crate) fn strip_bom(text: &str) -> (&str, bool) {
    match text.strip_prefix(BOM) {
        Some(rest) => (rest, true),
        None => (text, false),
    }
}

/// `text` with the byte-order mark put back if it had one.
pub(crate) fn restore_bom(text: String, had_bom: bool) -> String {
    if had_bom { format!("{BOM}{text}") } else { text }
}

/// How a file ends its lines; the build writes generated text with the same ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LineEnding {
    /// `\n`.
    Lf,
    /// `\r\n`.
    Crlf,
}

impl LineEnding {
    /// The ending of the file's first line (a file of one line ends its lines with `\n`).
    pub(crate) fn of(text: &str) -> Self {
        match text.find('\n') {
            Some(i) if text[..i].ends_with('\r') => Self::Crlf,
            _ => Self::Lf,
        }
    }

    /// Generated text (which always breaks lines with `\n`) with this ending.
    pub(crate) fn apply(self, generated: String) -> String {
        match self {
            Self::Lf => generated,
            Self::Crlf => {
                let mut out = String::with_capacity(generated.len() + generated.len() / 16);
                let mut previous = '\0';
                for c in generated.chars() {
                    if c == '\n' && previous != '\r' {
                        out.push('\r');
                    }
                    out.push(c);
                    previous = c;
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests;
