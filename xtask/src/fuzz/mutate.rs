//! Mutations of a lesson: line and byte edits, extreme numbers, blocks, regions and markers
//! duplicated or deleted, line endings and byte-order marks, files and figures added or removed.
//! Each is a small edit an author (or an editor, or a merge) could make.

use super::Lesson;

/// A small seeded generator (xorshift64*): the same seed gives the same mutants on every
/// machine, so a failure found once can be made again.
pub struct Rng(u64);

impl Rng {
    /// A generator for case `index` of a run seeded with `seed`.
    pub fn new(seed: u64, index: u64) -> Self {
        // Any non-zero state works; mixing keeps neighbouring cases apart.
        Rng((seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xD129_0E1D_5A09_3C4B) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() { None } else { Some(&items[self.below(items.len())]) }
    }
}

/// Every kind of mutation, by name (the fuzz summary counts them).
pub const KINDS: &[&str] = &[
    "delete a line",
    "duplicate a line",
    "swap two lines",
    "insert a tricky line",
    "change a byte",
    "insert a byte",
    "delete a byte",
    "cut the file short",
    "extreme number",
    "huge matrix",
    "duplicate a block",
    "delete a block",
    "duplicate a region",
    "delete a region",
    "delete a marker or fence",
    "CRLF line endings",
    "byte-order mark",
    "CRLF and byte-order mark",
    "second file, same section",
    "delete a figure file",
    "leftover figure file",
];

/// Lines an author could paste in the wrong place: markers, fences, citations, math, TOML.
const TRICKY_LINES: &[&str] = &[
    "```",
    "````",
    "~~~",
    "```qkv attention",
    "```qkv figure",
    "```qkv softmax",
    "<!-- qkv steps sentence.love -->",
    "<!-- qkv table sentence weights -->",
    "<!-- qkv figure love-query -->",
    "<!-- qkv lab sentence.love digits=12 -->",
    "<!-- qkv error trap -->",
    "<!-- qkv steps quiz_softmax digits=99 -->",
    "<!-- /qkv -->",
    "$$",
    "$d_k = {2}\\vphantom{\\verb|=sentence.d_k:0|}$",
    "${?}\\vphantom{\\verb|=sentence.love.weights.NLP:1%|}",
    "$x = {1}\\vphantom{\\verb|=sentence.love.output",
    "[?](=sentence.love.output:2)",
    "[?](=attention.sentence.NLP.weights.I:12g)",
    "[x](=sentence.love.scores.NLP:99)",
    "[1](=sentence)",
    "[](=masked.love.scores.NLP:2)",
    "id = \"sentence\"",
    "from = \"sentence\"",
    "query_tokens = [\"le\", \"chat\"]",
    "tokens = [\"\", \"a\\nb\"]",
    "mask = \"causal\"",
    "mask = [[true, false], [false]]",
    "scale = 1e308",
    "queries = [[1e308, -1e308], [0, 1], [1, 1]]",
    "keys = \"sentence.keys\"",
    "x_q = [[1, 0]]",
    "trials = 99999999999999999999",
    "dims = [1, 4096, 2]",
    "> ```python",
    "| a | b |",
    "# Title",
    "\u{feff}",
    "\t\t",
];

/// Numbers past every edge the build has: overflow, underflow, 64-bit integers, limits.
const EXTREME_NUMBERS: &[&str] = &[
    "1e35",
    "-1e35",
    "1e308",
    "-1e308",
    "1.7976931348623157e308",
    "1e400",
    "5e-324",
    "1e-320",
    "0",
    "-0.0",
    "99999999999999999999",
    "0x7fffffffffffffff",
    "0x1ffffffffffffffff",
    "-9223372036854775808",
    "nan",
    "inf",
    "-inf",
    "1_000_000",
    "123456789.123456789",
    "65",
    "17",
    "4097",
];

/// Applies one mutation of a random kind to `lesson`; returns what it did, for the report.
pub fn mutate(lesson: &mut Lesson, rng: &mut Rng) -> String {
    let kind = KINDS[rng.below(KINDS.len())];
    let file = rng.below(lesson.markdown.len());
    let name = lesson.markdown[file].0.clone();
    // Mutations of the file set first; the rest edit one file's bytes.
    let detail = match kind {
        "second file, same section" => {
            let copy = (format!("9{name}"), lesson.markdown[file].1.clone());
            lesson.markdown.push(copy);
            return format!("{kind}: 9{name}");
        }
        "delete a figure file" if !lesson.figures.is_empty() => {
            let i = rng.below(lesson.figures.len());
            return format!("{kind}: {}", lesson.figures.remove(i).0);
        }
        "leftover figure file" => {
            lesson.figures.push(("stray.svg".into(), b"<svg/>".to_vec()));
            return format!("{kind}: figures/stray.svg");
        }
        _ => edit(kind, &mut lesson.markdown[file].1, rng),
    };
    format!("{kind} in {name}: {detail}")
}

/// Applies a mutation of kind `kind` to one file's bytes; says where.
fn edit(kind: &str, text: &mut Vec<u8>, rng: &mut Rng) -> String {
    match kind {
        "delete a line" | "duplicate a line" | "swap two lines" | "insert a tricky line" => {
            let mut lines = split_lines(text);
            let i = rng.below(lines.len().max(1));
            match kind {
                "delete a line" if !lines.is_empty() => {
                    lines.remove(i);
                }
                "duplicate a line" if !lines.is_empty() => {
                    let line = lines[i].clone();
                    lines.insert(i, line);
                }
                "swap two lines" if i + 1 < lines.len() => lines.swap(i, i + 1),
                "insert a tricky line" => {
                    let line = rng.pick(TRICKY_LINES).copied().unwrap_or("");
                    lines.insert(i.min(lines.len()), format!("{line}\n").into_bytes());
                }
                _ => {}
            }
            *text = lines.concat();
            format!("line {}", i + 1)
        }
        "change a byte" | "insert a byte" | "delete a byte" if !text.is_empty() => {
            let at = rng.below(text.len());
            // Bytes that matter to the parsers, and ones that are not UTF-8 on their own.
            let bytes = b"`$[]()<>!-=:.\"'{}|\\\n\r\t 0123456789e\x00\x7f\x80\xbf\xc3\xe2\xff";
            let b = bytes[rng.below(bytes.len())];
            match kind {
                "change a byte" => text[at] = b,
                "insert a byte" => text.insert(at, b),
                _ => {
                    text.remove(at);
                }
            }
            format!("byte {at} ({b:#04x})")
        }
        "cut the file short" => {
            let at = rng.below(text.len().max(1));
            text.truncate(at);
            format!("at byte {at}")
        }
        "extreme number" => {
            let numbers = number_ranges(text);
            match rng.pick(&numbers).cloned() {
                Some(r) => {
                    let new = rng.pick(EXTREME_NUMBERS).copied().unwrap_or("0");
                    text.splice(r.clone(), new.bytes());
                    format!("{new} at byte {}", r.start)
                }
                None => "no number".into(),
            }
        }
        "huge matrix" => {
            let starts: Vec<usize> = find_all(text, b"[[");
            match rng.pick(&starts).copied() {
                Some(start) => {
                    let end = find_from(text, start, b"]]").map_or(text.len(), |e| e + 2);
                    let rows = [17, 65, 300][rng.below(3)];
                    let matrix = format!("[{}]", vec!["[1, 0]"; rows].join(", "));
                    text.splice(start..end, matrix.bytes());
                    format!("{rows} rows at byte {start}")
                }
                None => "no matrix".into(),
            }
        }
        "duplicate a block" | "delete a block" => {
            let blocks = spans(text, b"```", b"```");
            edit_span(text, &blocks, kind.starts_with("duplicate"), rng)
        }
        "duplicate a region" | "delete a region" => {
            let regions = spans(text, b"<!-- qkv ", b"<!-- /qkv -->");
            edit_span(text, &regions, kind.starts_with("duplicate"), rng)
        }
        "delete a marker or fence" => {
            let mut marks = find_all(text, b"```");
            marks.extend(find_all(text, b"<!-- qkv "));
            marks.extend(find_all(text, b"<!-- /qkv -->"));
            match rng.pick(&marks).copied() {
                Some(at) => {
                    let end = find_from(text, at, b"\n").map_or(text.len(), |e| e + 1);
                    text.drain(at..end);
                    format!("at byte {at}")
                }
                None => "no marker".into(),
            }
        }
        "CRLF line endings" | "byte-order mark" | "CRLF and byte-order mark" => {
            if kind.contains("CRLF") {
                *text =
                    String::from_utf8_lossy(text).replace("\r\n", "\n").replace('\n', "\r\n").into_bytes();
            }
            if kind.contains("mark") {
                text.splice(0..0, "\u{feff}".bytes());
            }
            String::new()
        }
        _ => "nothing to change".into(),
    }
}

/// Lines with their endings, as bytes.
fn split_lines(text: &[u8]) -> Vec<Vec<u8>> {
    text.split_inclusive(|&b| b == b'\n').map(<[u8]>::to_vec).collect()
}

fn find_all(text: &[u8], needle: &[u8]) -> Vec<usize> {
    (0..text.len().saturating_sub(needle.len() - 1)).filter(|&i| text[i..].starts_with(needle)).collect()
}

fn find_from(text: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    (from + 1..text.len()).find(|&i| text[i..].starts_with(needle))
}

/// Byte ranges from each `open` to the end of the line of the next `close` after it.
fn spans(text: &[u8], open: &[u8], close: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(start) = (at..text.len()).find(|&i| text[i..].starts_with(open)) {
        let Some(end) = find_from(text, start + open.len() - 1, close) else { break };
        let end = find_from(text, end, b"\n").map_or(text.len(), |e| e + 1);
        out.push(start..end);
        at = end;
    }
    out
}

/// Duplicates one of `spans` right after itself, or deletes it.
fn edit_span(text: &mut Vec<u8>, spans: &[std::ops::Range<usize>], duplicate: bool, rng: &mut Rng) -> String {
    let Some(span) = rng.pick(spans).cloned() else { return "none found".into() };
    if duplicate {
        let copy = text[span.clone()].to_vec();
        text.splice(span.end..span.end, copy);
    } else {
        text.drain(span.clone());
    }
    format!("bytes {}..{}", span.start, span.end)
}

/// Where the numbers are: runs of digits (with a sign, a point or an exponent).
fn number_ranges(text: &[u8]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let starts = text[i].is_ascii_digit() && (i == 0 || !text[i - 1].is_ascii_alphanumeric());
        if !starts {
            i += 1;
            continue;
        }
        let start = if i > 0 && text[i - 1] == b'-' { i - 1 } else { i };
        let mut end = i;
        while end < text.len() && (text[end].is_ascii_digit() || matches!(text[end], b'.' | b'e' | b'_')) {
            end += 1;
        }
        out.push(start..end);
        i = end;
    }
    out
}
