//! Declarations: `qkv` blocks parsed from TOML into typed inputs, with every field's position.
//!
//! A numeric field holds either a literal (`keys = [[1, 0], [0, 1]]`) or a reference to another
//! block's value (`keys = "sentence.values"`), resolved when the block is evaluated.
//!
//! A new example kind touches its declaration here (a line in `KINDS`, a `DeclKind` arm), its
//! evaluation (`eval.rs` or a file under `eval/`: a `Computed` arm and its `Node` record) and the
//! regions that show it, and nothing else; `Computed::part` lets a kind expose parts that are
//! attention examples (a multi-head example's heads), so every attention region shows them too.
//! `pipeline/fixtures/every-kind.md` gets a case checked against an independent computation.

use std::collections::HashSet;

use toml::Spanned;
use toml::de::{DeTable, DeValue};

use crate::document::{Block, Document, first_line};
use crate::error::{Problem, closest};
use crate::figure_kind::FigureKind;
use crate::files::Sources;
use crate::format;
use crate::limits::{self, MAX_DIM, MAX_DIMS, MAX_SAMPLES};
use crate::location::LineIndex;

mod block;
mod gradient;
mod interactive;
mod positions;

pub(crate) use block::{BlockDecl, DEFAULT_EPS};
pub(crate) use gradient::GradientDecl;
pub(crate) use positions::PositionsDecl;

pub(crate) use interactive::{
    ChoiceKey, Condition, Goal, Operand, PageDecl, QuizDecl, QuizKey, QuizOption, SETTINGS_ID, Settings,
    TermDecl, WidgetDecl, WidgetKind, colab_base, letter,
};

/// The first row of `rows` whose width differs from the first row's, and what to say of it.
pub(crate) fn unequal_rows(rows: &[Vec<f64>]) -> Option<(usize, String)> {
    let bad = rows.iter().position(|r| r.len() != rows[0].len())?;
    let n = rows[bad].len();
    let plural = if n == 1 { "" } else { "s" };
    Some((bad, format!("row {} has {n} number{plural} but row 1 has {}", bad + 1, rows[0].len())))
}

/// A numeric input: a literal, or a reference to be resolved at evaluation.
#[derive(Debug, Clone)]
pub(crate) enum Input<T> {
    Literal(T),
    Ref(String),
    /// A matrix written row by row, some rows references to another example's rows
    /// (`["attention.sentence.keys.NLP", [0, -1]]`): a copy of the running example that follows
    /// when its inputs change. Only the matrix reader makes it.
    Rows(Vec<Field<Input<Vec<f64>>>>),
}

/// A field's value with the source offset of its text (for errors).
#[derive(Debug, Clone)]
pub(crate) struct Field<T> {
    pub value: T,
    pub at: usize,
}

/// The inputs of a `qkv attention` block as written (before `from` and references are resolved).
#[derive(Debug, Clone, Default)]
pub(crate) struct AttentionDecl {
    pub from: Option<Field<String>>,
    /// Labels of the keys (and of the queries, one per token, unless `query_tokens` is given).
    pub tokens: Option<Field<Vec<String>>>,
    /// Labels of the queries, for cross-attention.
    pub query_tokens: Option<Field<Vec<String>>>,
    pub queries: Option<Field<Input<Vec<Vec<f64>>>>>,
    pub keys: Option<Field<Input<Vec<Vec<f64>>>>>,
    pub values: Option<Field<Input<Vec<Vec<f64>>>>>,
    /// Embeddings of self-attention: queries, keys and values are all projected from them.
    pub x: Option<Field<Input<Vec<Vec<f64>>>>>,
    /// Cross-attention: the embeddings the queries are projected from (a decoder's states)...
    pub x_q: Option<Field<Input<Vec<Vec<f64>>>>>,
    /// ...and those the keys and values are projected from (an encoder's).
    pub x_kv: Option<Field<Input<Vec<Vec<f64>>>>>,
    pub w_q: Option<Field<Input<Vec<Vec<f64>>>>>,
    pub w_k: Option<Field<Input<Vec<Vec<f64>>>>>,
    pub w_v: Option<Field<Input<Vec<Vec<f64>>>>>,
    pub mask: Option<Field<Mask>>,
    /// Where each query may look, beside `mask`: the engine's other masks.
    pub limits: DeclaredLimits,
    pub scale: Option<Field<f64>>,
    /// A temperature `T` in place of `scale`: the scores are multiplied by `1/(T·√d_k)`.
    pub temperature: Option<Field<f64>>,
    pub expect_error: bool,
}

/// Which keys each query may see.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mask {
    /// Query `i` sees keys `0..=i + n_k - n_q`: aligned at the bottom right when the counts
    /// differ, so the last query sees every key (the engine's `CausalMask::BottomRight`).
    Causal,
    /// An explicit `[n_q][n_k]` table, true = may attend.
    Keep(Vec<Vec<bool>>),
}

/// The masks an example may add beside `mask` (each the engine's): how many keys are real
/// (`key_length`, the rest are padding), which keys are padding (`key_padding`), a sliding window
/// (`window = [before, after]`) and an ALiBi slope (`alibi`). Generic over how each is held, so
/// that the declaration keeps positions and the inputs plain values.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct KeyLimits<L, P, W, A> {
    pub key_length: Option<L>,
    pub key_padding: Option<P>,
    pub window: Option<W>,
    pub alibi: Option<A>,
}

/// The limits as a block declares them, each with its position.
pub(crate) type DeclaredLimits = KeyLimits<Field<usize>, Field<Vec<bool>>, Field<[usize; 2]>, Field<f64>>;

/// The limits as the engine takes them.
pub(crate) type Limits = KeyLimits<usize, Vec<bool>, [usize; 2], f64>;

impl<L, P, W, A> Default for KeyLimits<L, P, W, A> {
    fn default() -> Self {
        Self { key_length: None, key_padding: None, window: None, alibi: None }
    }
}

/// A `qkv figure` block.
#[derive(Debug, Clone)]
pub(crate) struct FigureDecl {
    pub kind: FigureKind,
    pub example: Option<Field<String>>,
    pub query: Option<Field<String>>,
    /// Markdown, citing numbers as `{=PATH:FORMAT}` like quiz text.
    pub caption: Option<crate::citation::Text>,
    pub seed: u64,
    pub trials: usize,
    pub dims: Vec<usize>,
    /// measurements: the data file it draws (`data/NAME.toml`).
    pub data: Option<Field<String>>,
}

/// What a block declares.
#[derive(Debug, Clone)]
pub(crate) enum DeclKind {
    Attention(Box<AttentionDecl>),
    Softmax {
        scores: Field<Input<Vec<f64>>>,
    },
    Dot {
        q: Field<Input<Vec<f64>>>,
        k: Field<Input<Vec<f64>>>,
    },
    WeightedSum {
        weights: Field<Input<Vec<f64>>>,
        values: Field<Input<Vec<f64>>>,
    },
    Figure(Box<FigureDecl>),
    Page(Box<PageDecl>),
    /// A named matrix (embeddings, a projection), declared once and used by any example.
    Matrix {
        rows: Field<Input<Vec<Vec<f64>>>>,
        labels: Option<Field<Vec<String>>>,
    },
    MultiHead(Box<MultiHeadDecl>),
    /// Decoding an attention example one token at a time over a KV cache: the first `prompt`
    /// tokens at once, then each of the rest.
    Decode {
        example: Field<String>,
        prompt: Field<usize>,
    },
    /// One query of an attention example through the tiled online softmax, `block` keys a tile.
    Tiled {
        example: Field<String>,
        query: Field<String>,
        block: Field<usize>,
    },
    /// A Transformer block around a multi-head example: layer norms, residuals, feed-forward.
    Block(Box<BlockDecl>),
    /// The backward of an attention example under a squared-error loss, and gradient steps.
    Gradient(Box<GradientDecl>),
    /// Positions for an attention example: rotary embeddings, sinusoidal encodings, a sweep.
    Positions(Box<PositionsDecl>),
    /// What the prose says of the computed numbers in words ("the loss falls"), as comparisons
    /// that must hold at every build: an input that falsifies one is an error at it.
    Claims {
        holds: Vec<Field<Condition>>,
    },
}

/// A `qkv multi-head` block: heads with their own projections of one `x`, concatenated and
/// projected by `w_o`; with `kv_heads`, several query heads share a key/value head (GQA).
#[derive(Debug, Clone)]
pub(crate) struct MultiHeadDecl {
    pub tokens: Option<Field<Vec<String>>>,
    pub x: Field<Input<Vec<Vec<f64>>>>,
    pub heads: Vec<HeadDecl>,
    pub kv_heads: Vec<KvHeadDecl>,
    pub w_o: Field<Input<Vec<Vec<f64>>>>,
    pub mask: Option<Field<Mask>>,
    pub limits: DeclaredLimits,
    pub scale: Option<Field<f64>>,
}

/// One query head of a multi-head block.
#[derive(Debug, Clone)]
pub(crate) struct HeadDecl {
    /// Its label in paths (`mh.heads.NAME`); by default its number.
    pub name: String,
    pub w_q: Field<Input<Vec<Vec<f64>>>>,
    /// Its own keys and values, or (`kv`) those of a shared key/value head.
    pub kv: HeadKv,
    /// Its ALiBi slope, if any.
    pub alibi: Option<Field<f64>>,
    /// Where its table starts, for errors about the head as a whole.
    pub at: usize,
}

/// Where a query head's keys and values come from.
#[derive(Debug, Clone)]
pub(crate) enum HeadKv {
    Own {
        w_k: Field<Input<Vec<Vec<f64>>>>,
        w_v: Field<Input<Vec<Vec<f64>>>>,
    },
    /// The 0-based index of a `kv_heads` entry.
    Shared(Field<usize>),
}

/// A key/value head that query heads share.
#[derive(Debug, Clone)]
pub(crate) struct KvHeadDecl {
    pub w_k: Field<Input<Vec<Vec<f64>>>>,
    pub w_v: Field<Input<Vec<Vec<f64>>>>,
}

impl DeclKind {
    /// Whether the block computes values that paths can name (figures and page blocks do not).
    pub(crate) fn computes(&self) -> bool {
        match self {
            // A `measurements` figure's id cites its data file's numbers.
            DeclKind::Figure(f) => f.kind == FigureKind::Measurements,
            DeclKind::Page(_) | DeclKind::Claims { .. } => false,
            _ => true,
        }
    }
}

/// One declaration, from one `qkv` block.
#[derive(Debug, Clone)]
pub(crate) struct Decl {
    pub doc: usize,
    pub id: String,
    pub id_at: usize,
    pub start: usize,
    pub kind: DeclKind,
}

/// The block kinds and the fields each accepts.
const KINDS: &[(&str, &[&str])] = &[
    (
        "attention",
        &[
            "id",
            "from",
            "tokens",
            "query_tokens",
            "queries",
            "keys",
            "values",
            "x",
            "x_q",
            "x_kv",
            "w_q",
            "w_k",
            "w_v",
            "mask",
            "key_length",
            "key_padding",
            "window",
            "alibi",
            "scale",
            "temperature",
            "expect_error",
        ],
    ),
    ("matrix", &["id", "rows", "labels"]),
    (
        "multi-head",
        &[
            "id",
            "tokens",
            "x",
            "heads",
            "kv_heads",
            "w_o",
            "mask",
            "key_length",
            "key_padding",
            "window",
            "scale",
        ],
    ),
    ("decode", &["id", "example", "prompt"]),
    ("tiled", &["id", "example", "query", "block"]),
    ("block", block::FIELDS),
    ("gradient", gradient::FIELDS),
    ("positions", positions::FIELDS),
    ("claims", &["id", "holds"]),
    ("softmax", &["id", "scores"]),
    ("dot", &["id", "q", "k"]),
    ("weighted-sum", &["id", "weights", "values"]),
    ("figure", &["id", "kind", "example", "query", "caption", "seed", "trials", "dims", "data"]),
    (
        "quiz",
        &[
            "id",
            "kind",
            "practice",
            "question",
            "hint",
            "why",
            "options",
            "correct",
            "shuffle",
            "answer",
            "digits",
            "tolerance",
            "steps",
            "percent",
            "share",
            "answer_text",
            "near_miss",
        ],
    ),
    ("widget", &["id", "kind", "example", "query", "goal", "head", "windows", "slopes", "prompt", "digits"]),
    ("settings", &["credit", "notebook_repository", "summary"]),
    ("term", &["id", "term", "symbol", "forms", "definition"]),
];

/// Every declaration of the lesson, one per `qkv` block that parses, with the problems of the
/// rest; also the qualified ids (`section.id`) of blocks that failed, whose dependants stay quiet.
pub(crate) fn declarations(
    sources: &Sources,
    docs: &[Document],
    sections: &[String],
    problems: &mut Vec<Problem>,
) -> (Vec<Decl>, HashSet<String>) {
    let mut decls: Vec<Decl> = Vec::new();
    let mut broken = HashSet::new();
    for (i, doc) in docs.iter().enumerate() {
        for block in &doc.blocks {
            match parse(i, block) {
                Ok(d) => {
                    if let Some(prev) = decls.iter().find(|p| p.doc == i && p.id == d.id) {
                        let line = LineIndex::new(&sources.markdown[i].text)
                            .position(&sources.markdown[i].text, prev.start)
                            .0;
                        problems.push(if block.kind == "settings" {
                            Problem::new(
                                i,
                                d.id_at,
                                format!("a second `qkv settings` block (the first is on line {line})"),
                                first_line(&block.content),
                                "one `qkv settings` block per section",
                            )
                        } else {
                            Problem::new(
                                i,
                                d.id_at,
                                format!("duplicate id `{}` (first declared on line {line})", d.id),
                                format!("id = \"{}\"", d.id),
                                "an id not used by another block of this section",
                            )
                        });
                    } else {
                        decls.push(d);
                    }
                }
                Err(p) => {
                    problems.extend(p);
                    if let Some(id) = declared_id(&block.content) {
                        broken.insert(format!("{}.{id}", sections[i]));
                    }
                }
            }
        }
    }
    (decls, broken)
}

/// The names of an attention example's own values (`sentence.weights`): a query's label sits
/// beside them in paths (`sentence.love`), so no label may be one of them.
pub(crate) const ATTENTION_FIELDS: &[&str] = &[
    "tokens",
    "query_tokens",
    "queries",
    "keys",
    "values",
    "d_k",
    "sqrt_d_k",
    "scale",
    "temperature",
    "scores",
    "weights",
    "output",
    "error",
    "x",
    "x_q",
    "x_kv",
    "w_q",
    "w_k",
    "w_v",
    "kv_head",
];

/// Why a list of token labels cannot name its rows in paths, if it cannot: two labels alike (the
/// same text, or the same once Unicode-normalised, which a reader cannot tell apart), a label with
/// a `.` (it would split the path), one that is a field name, or a number other than its own
/// position (`2` for the first row would make `ex.values.2` mean two rows).
fn label_problem(labels: &[String]) -> Option<String> {
    use unicode_normalization::UnicodeNormalization;
    let normal: Vec<String> = labels.iter().map(|l| l.nfc().collect()).collect();
    let seen: Vec<String> = labels.iter().map(|l| skeleton(l)).collect();
    for (i, label) in labels.iter().enumerate() {
        if let Some(j) = normal[..i].iter().position(|n| *n == normal[i]) {
            let how = if labels[j] == *label { "" } else { " (the same text in another Unicode form)" };
            return Some(format!(
                "labels {} and {} are both `{label}`{how}: a path could name only the first",
                j + 1,
                i + 1
            ));
        }
        if let Some(j) = seen[..i].iter().position(|n| *n == seen[i]) {
            let odd: Vec<String> = [&labels[j], label]
                .iter()
                .flat_map(|l| l.chars())
                .filter(|c| skeleton(&c.to_string()) != c.to_string())
                .map(|c| format!("U+{:04X}", c as u32))
                .collect();
            return Some(format!(
                "labels {} and {} look alike (`{}` and `{label}`, {:?} and {label:?}) but differ in {}, which a reader cannot see: a path would name one while the page seems to show the other",
                j + 1,
                i + 1,
                labels[j],
                labels[j],
                odd.join(", ")
            ));
        }
        if let Some(c) = label.chars().find(|&c| invisible(c)) {
            return Some(format!(
                "label `{label}` ({label:?}) holds the invisible character U+{:04X}, which a reader cannot see or type in a path",
                c as u32
            ));
        }
        if label.contains('.') {
            return Some(format!("label `{label}` has a `.`, which would split a path"));
        }
        if ATTENTION_FIELDS.contains(&label.as_str()) {
            return Some(format!(
                "label `{label}` is the name of an example's field, which a path would name instead"
            ));
        }
        if let Ok(n) = label.parse::<usize>()
            && n != i + 1
        {
            return Some(format!(
                "label `{label}` is a number but labels row {}: a path could not tell the label from the position",
                i + 1
            ));
        }
    }
    None
}

/// A label as a reader sees it: compatibility-normalised (a no-break space is a space, `ﬁ` is
/// `fi`), without invisible characters, and with the Cyrillic and Greek letters that look like
/// Latin ones written as those (`аре` is `ape`). Two labels with one skeleton cannot be told
/// apart on the page (UTS #39's confusable detection, for the look-alikes a lesson meets).
fn skeleton(label: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    label.nfkc().filter(|&c| !invisible(c)).map(latin_look_alike).collect()
}

/// A character that draws nothing, or only changes how its neighbours are drawn: zero-width
/// spaces and joiners, bidirectional controls (an override can show `abc` as `cba`), the soft
/// hyphen, the byte-order mark, the Mongolian vowel separator and the invisible operators.
fn invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}' | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{3164}' | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}'
        | '\u{FFF0}'..='\u{FFF8}')
}

/// The Latin letter a Cyrillic or Greek one is drawn like, or the character itself.
fn latin_look_alike(c: char) -> char {
    const PAIRS: &[(char, char)] = &[
        // Cyrillic
        ('а', 'a'),
        ('в', 'B'),
        ('е', 'e'),
        ('ё', 'ë'),
        ('к', 'k'),
        ('м', 'M'),
        ('н', 'H'),
        ('о', 'o'),
        ('р', 'p'),
        ('с', 'c'),
        ('т', 'T'),
        ('у', 'y'),
        ('х', 'x'),
        ('ѕ', 's'),
        ('і', 'i'),
        ('ї', 'ï'),
        ('ј', 'j'),
        ('ԁ', 'd'),
        ('ԛ', 'q'),
        ('ԝ', 'w'),
        ('һ', 'h'),
        ('ӏ', 'l'),
        ('А', 'A'),
        ('В', 'B'),
        ('Е', 'E'),
        ('К', 'K'),
        ('М', 'M'),
        ('Н', 'H'),
        ('О', 'O'),
        ('Р', 'P'),
        ('С', 'C'),
        ('Т', 'T'),
        ('Х', 'X'),
        ('У', 'Y'),
        ('Ү', 'Y'),
        ('Ѕ', 'S'),
        ('І', 'I'),
        ('Ј', 'J'),
        ('Ԛ', 'Q'),
        ('Ԝ', 'W'),
        ('Һ', 'h'),
        ('Ӏ', 'I'),
        // Greek
        ('Α', 'A'),
        ('Β', 'B'),
        ('Ε', 'E'),
        ('Ζ', 'Z'),
        ('Η', 'H'),
        ('Ι', 'I'),
        ('Κ', 'K'),
        ('Μ', 'M'),
        ('Ν', 'N'),
        ('Ο', 'O'),
        ('Ρ', 'P'),
        ('Τ', 'T'),
        ('Υ', 'Y'),
        ('Χ', 'X'),
        ('ο', 'o'),
        ('ν', 'v'),
        ('ι', 'i'),
        ('κ', 'k'),
        ('ρ', 'p'),
        ('α', 'a'),
    ];
    PAIRS.iter().find(|(from, _)| *from == c).map_or(c, |&(_, to)| to)
}

/// The `id = "..."` of a block that failed to parse, found line by line.
fn declared_id(content: &str) -> Option<String> {
    content.lines().find_map(|line| {
        let rest = line.trim().strip_prefix("id")?.trim_start().strip_prefix('=')?.trim();
        Some(rest.trim_matches('"').to_string())
    })
}

/// Reads one block into a declaration, or every problem in it.
pub(crate) fn parse(doc: usize, block: &Block) -> Result<Decl, Vec<Problem>> {
    let Some(&(kind, allowed)) = KINDS.iter().find(|(k, _)| *k == block.kind) else {
        let names: Vec<_> = KINDS.iter().map(|(k, _)| format!("`qkv {k}`")).collect();
        return Err(vec![Problem::new(
            doc,
            block.start,
            format!("unknown block kind `qkv {}`", block.kind),
            first_line(&block.content_line()),
            format!("one of {}", names.join(", ")),
        )]);
    };
    let table = match DeTable::parse(&block.content) {
        Ok(t) => t.into_inner(),
        Err(e) => {
            let at = e.span().map_or(0, |s| s.start);
            let mut message = format!("malformed `qkv {kind}` block: {}", e.message().trim());
            // A list left open reads on into the next line, where TOML finds the mistake: the
            // line to fix is the one whose `[` never closes.
            let at = match unclosed_bracket(&block.content, at) {
                Some(open) => {
                    message = format!(
                        "malformed `qkv {kind}` block: this `[` is never closed, so the next line was read as more of the list ({})",
                        e.message().trim()
                    );
                    open
                }
                None => at,
            };
            return Err(vec![Problem::new(
                doc,
                block.source_offset(at),
                message,
                line_at(&block.content, at),
                "TOML: `name = value` lines, numbers in lists like `[[1, 0], [0, 1]]`, text in quotes",
            )]);
        }
    };
    let mut reader = Reader { doc, block, problems: Vec::new() };
    reader.known_fields(&table, allowed, &format!("a `qkv {kind}` block"));
    let get = |name: &str| table.get(name);
    let id = match get("id") {
        Some(v) => reader.identifier(v),
        // A section has one settings block, and it needs no name.
        None if kind == "settings" => Some(Field { value: SETTINGS_ID.to_string(), at: block.start }),
        None => {
            reader.problem(
                0,
                format!("`qkv {kind}` block has no `id`"),
                first_line(&block.content),
                "`id = \"name\"`",
            );
            None
        }
    };
    let kind = match kind {
        "attention" => {
            let a = AttentionDecl {
                from: get("from").and_then(|v| reader.string(v, "a reference to another attention example")),
                tokens: get("tokens").and_then(|v| reader.strings(v)),
                query_tokens: get("query_tokens").and_then(|v| reader.strings(v)),
                queries: get("queries").and_then(|v| reader.matrix(v)),
                keys: get("keys").and_then(|v| reader.matrix(v)),
                values: get("values").and_then(|v| reader.matrix(v)),
                x: get("x").and_then(|v| reader.matrix(v)),
                x_q: get("x_q").and_then(|v| reader.matrix(v)),
                x_kv: get("x_kv").and_then(|v| reader.matrix(v)),
                w_q: get("w_q").and_then(|v| reader.matrix(v)),
                w_k: get("w_k").and_then(|v| reader.matrix(v)),
                w_v: get("w_v").and_then(|v| reader.matrix(v)),
                mask: get("mask").and_then(|v| reader.mask(v)),
                limits: KeyLimits {
                    key_length: get("key_length").and_then(|v| reader.whole(v)),
                    key_padding: get("key_padding").and_then(|v| reader.flags(v)),
                    window: get("window").and_then(|v| reader.window(v)),
                    alibi: get("alibi").and_then(|v| reader.number(v)),
                },
                scale: get("scale").and_then(|v| reader.number(v)),
                temperature: get("temperature").and_then(|v| reader.number(v)),
                expect_error: get("expect_error").and_then(|v| reader.boolean(v)).unwrap_or(false),
            };
            projection_problems(&mut reader, &table);
            if get("scale").is_some()
                && let Some((key, _)) = table.get_key_value("temperature")
            {
                // Both set the scores' multiplier: one of the two would silently win.
                reader.problem(
                    key.span().start,
                    "attention example has both `scale` and `temperature`, which both set what multiplies the scores",
                    first_line(reader.block.content.get(key.span().start..).unwrap_or("")),
                    "one of them: `temperature = T` multiplies the scores by 1/(T·√d_k), `scale` by its own value",
                );
            }
            // Only a missing field: one that is present but invalid has its own error already.
            let projected = ["x", "x_q", "x_kv"].iter().any(|name| get(name).is_some());
            if get("from").is_none() && !projected {
                for name in ["queries", "keys", "values"] {
                    if get(name).is_none() {
                        reader.problem(
                            0,
                            format!("attention example has no `{name}`"),
                            first_line(&block.content),
                            format!("`{name} = [[...], ...]`, or `x` with `w_q`, `w_k`, `w_v`, or `from = \"other\"`"),
                        );
                    }
                }
            }
            DeclKind::Attention(Box::new(a))
        }
        "matrix" => {
            let rows = reader.required(&table, "rows", Reader::matrix);
            let labels = get("labels").and_then(|v| reader.strings(v));
            match rows {
                Some(rows) => DeclKind::Matrix { rows, labels },
                None => return Err(reader.problems),
            }
        }
        "multi-head" => match reader.multi_head(&table) {
            Some(m) => DeclKind::MultiHead(Box::new(m)),
            None => return Err(reader.problems),
        },
        "decode" => {
            let example =
                reader.required(&table, "example", |r, v| r.string(v, "the id of an attention example"));
            let prompt = reader.required(&table, "prompt", Reader::whole);
            match (example, prompt) {
                (Some(example), Some(prompt)) => DeclKind::Decode { example, prompt },
                _ => return Err(reader.problems),
            }
        }
        "tiled" => {
            let example =
                reader.required(&table, "example", |r, v| r.string(v, "the id of an attention example"));
            let query = reader.required(&table, "query", |r, v| r.string(v, "a query token of the example"));
            let block = reader.required(&table, "block", Reader::whole);
            match (example, query, block) {
                (Some(example), Some(query), Some(block)) => DeclKind::Tiled { example, query, block },
                _ => return Err(reader.problems),
            }
        }
        "block" => match reader.block(&table) {
            Some(b) => DeclKind::Block(Box::new(b)),
            None => return Err(reader.problems),
        },
        "positions" => match reader.positions(&table) {
            Some(p) => DeclKind::Positions(Box::new(p)),
            None => return Err(reader.problems),
        },
        "gradient" => match reader.gradient(&table) {
            Some(g) => DeclKind::Gradient(Box::new(g)),
            None => return Err(reader.problems),
        },
        "claims" => match reader.required(&table, "holds", Reader::conditions) {
            Some(holds) => DeclKind::Claims { holds },
            None => return Err(reader.problems),
        },
        "softmax" => match reader.required(&table, "scores", Reader::vector) {
            Some(scores) => DeclKind::Softmax { scores },
            None => return Err(reader.problems),
        },
        "dot" => {
            let q = reader.required(&table, "q", Reader::vector);
            let k = reader.required(&table, "k", Reader::vector);
            match (q, k) {
                (Some(q), Some(k)) => DeclKind::Dot { q, k },
                _ => return Err(reader.problems),
            }
        }
        "weighted-sum" => {
            let weights = reader.required(&table, "weights", Reader::vector);
            let values = reader.required(&table, "values", Reader::vector);
            match (weights, values) {
                (Some(weights), Some(values)) => DeclKind::WeightedSum { weights, values },
                _ => return Err(reader.problems),
            }
        }
        "quiz" | "widget" | "settings" | "term" => match reader.page(kind, &table) {
            Some(page) => DeclKind::Page(Box::new(page)),
            None => return Err(reader.problems),
        },
        _ => {
            let figure_kind = get("kind").and_then(|v| reader.figure_kind(v));
            let figure = figure_kind.map(|kind| FigureDecl {
                kind,
                example: get("example").and_then(|v| reader.string(v, "the id of an attention example")),
                query: get("query").and_then(|v| reader.string(v, "a token of the example")),
                caption: get("caption").and_then(|v| reader.text(v)),
                seed: get("seed").and_then(|v| reader.count(v)).unwrap_or(7) as u64,
                trials: get("trials").and_then(|v| reader.count(v)).unwrap_or(2000),
                dims: get("dims")
                    .and_then(|v| reader.counts(v))
                    .unwrap_or_else(|| vec![1, 2, 4, 8, 16, 32, 64, 128, 256]),
                data: get("data").and_then(|v| reader.string(v, "a data file, `data/NAME.toml`")),
            });
            if let Some(f) = &figure {
                reader.other_kinds_fields(&table, f.kind.name(), &FigureKind::all_fields());
            }
            if let Some(f) = &figure
                && f.kind == FigureKind::Measurements
                && f.data.is_none()
            {
                reader.problem(
                    0,
                    "a `measurements` figure has no `data`",
                    first_line(&block.content),
                    "`data = \"data/NAME.toml\"`: the file of measured numbers it draws",
                );
            }
            // The other kinds without an example are the Monte Carlo ones.
            if let Some(f) = &figure
                && !f.kind.needs_example()
                && f.kind != FigureKind::Measurements
            {
                monte_carlo_limits(&mut reader, &table, f);
            }
            if get("kind").is_none() {
                reader.problem(
                    0,
                    "figure has no `kind`",
                    first_line(&block.content),
                    format!("`kind = \"...\"`, one of: {}", FigureKind::NAMES.join(", ")),
                );
            }
            match figure {
                Some(f) => DeclKind::Figure(Box::new(f)),
                None => return Err(reader.problems),
            }
        }
    };
    match (id, reader.problems.is_empty()) {
        (Some(id), true) => Ok(Decl { doc, id: id.value, id_at: id.at, start: block.start, kind }),
        _ => Err(reader.problems),
    }
}

/// How an attention block may project embeddings: `x` with `w_q`, `w_k`, `w_v` (self-attention),
/// or `x_q` and `x_kv` with them (cross-attention); every other mix is a problem.
fn projection_problems(reader: &mut Reader<'_>, table: &DeTable<'_>) {
    let has = |name: &str| table.get(name).is_some();
    let first = first_line(&reader.block.content);
    let sides: Vec<&str> = ["x", "x_q", "x_kv"].into_iter().filter(|n| has(n)).collect();
    let weights: Vec<&str> = ["w_q", "w_k", "w_v"].into_iter().filter(|n| has(n)).collect();
    if sides.contains(&"x") && sides.len() > 1 {
        reader.problem(
            0,
            "attention example has both `x` and cross-attention embeddings",
            first.clone(),
            "`x` alone (self-attention), or `x_q` and `x_kv` (cross-attention: queries from one sequence, keys and values from another)",
        );
    } else if sides.len() == 1 && sides[0] != "x" {
        let missing = if sides[0] == "x_q" { "x_kv" } else { "x_q" };
        reader.problem(
            0,
            format!("cross-attention example has `{}` but no `{missing}`", sides[0]),
            first.clone(),
            "`x_q` (the embeddings the queries come from) and `x_kv` (those the keys and values come from)",
        );
    }
    if let Some(side) = sides.first() {
        // Queries, keys and values are what the projection computes: given beside it, one of
        // the two would silently win.
        for name in ["queries", "keys", "values"] {
            if let Some((key, _)) = table.get_key_value(name) {
                reader.problem(
                    key.span().start,
                    format!("attention example has both `{name}` and `{side}` with projections, which compute its {name}"),
                    first_line(reader.block.content.get(key.span().start..).unwrap_or("")),
                    format!("either `{name}` as numbers, or `{side}` with `w_q`, `w_k`, `w_v` (a second example with `from` can override the projected {name})"),
                );
            }
        }
        for name in ["w_q", "w_k", "w_v"].into_iter().filter(|n| !weights.contains(n)) {
            reader.problem(
                0,
                format!("attention example has `{side}` but no `{name}`"),
                first.clone(),
                format!("all three projections `w_q`, `w_k`, `w_v` next to `{side}`"),
            );
        }
    } else if let Some(w) = weights.first() {
        reader.problem(
            0,
            format!("attention example has `{w}` but no embeddings to project"),
            first,
            "`x` (self-attention) or `x_q` and `x_kv` (cross-attention) next to `w_q`, `w_k`, `w_v`",
        );
    }
}

/// The limits of a Monte Carlo figure, at the field that passes one.
fn monte_carlo_limits(reader: &mut Reader<'_>, table: &DeTable<'_>, figure: &FigureDecl) {
    let at = |name: &str| table.get(name).map_or(0, |v| v.span().start);
    let largest = figure.dims.iter().copied().max().unwrap_or(0);
    let samples = figure.trials.saturating_mul(figure.dims.iter().sum());
    let checks = [
        ("dims", limits::at_most(figure.dims.len(), MAX_DIMS, "values of d_k", "a chart shows")),
        ("dims", limits::at_most(largest, MAX_DIM, "as the largest d_k", "a figure samples")),
        (
            "trials",
            limits::at_most(
                samples,
                MAX_SAMPLES,
                "random numbers (trials × the sum of dims)",
                "a figure may draw",
            ),
        ),
    ];
    for (field, check) in checks {
        if let Err(message) = check {
            let found = table.get(field).map(|v| reader.snippet(v)).unwrap_or_default();
            reader.problem(
                at(field),
                message,
                format!("{field} = {found}"),
                "fewer trials or smaller dims (the lesson uses 4000 trials over d_k = 1 to 256)",
            );
        }
    }
}

impl Block {
    /// The block's first content line, for messages about the block as a whole.
    fn content_line(&self) -> String {
        first_line(&self.content)
    }
}

/// Whether `x`, read from integer `digits` in `radix`, is that integer exactly.
fn holds_exactly(digits: &str, radix: u32, x: f64) -> bool {
    let (negative, magnitude) =
        digits.strip_prefix('-').map_or((false, digits.trim_start_matches('+')), |d| (true, d));
    // Up to 2^53 every integer is an f64; beyond it, compare the f64's exact integer digits.
    match u128::from_str_radix(magnitude, radix) {
        Ok(n) => n <= 1 << 53 || (x.abs() < 2f64.powi(127) && x.abs() as u128 == n && negative == (x < 0.0)),
        Err(_) => format!("{:.0}", x.abs()) == magnitude.trim_start_matches('0'),
    }
}

/// The line of `text` containing byte `at`.
fn line_at(text: &str, at: usize) -> String {
    let at = at.min(text.len());
    let start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    first_line(&text[start..])
}

/// Where the outermost `[` still open at `at` was opened, when `at` begins a line (only
/// blanks before it) and that `[` is on an earlier line: TOML reports a list left open where
/// the next line starts, one line after the mistake. Strings and comments are skipped.
fn unclosed_bracket(text: &str, at: usize) -> Option<usize> {
    let at = at.min(text.len());
    let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
    if !text[line_start..at].trim().is_empty() {
        return None;
    }
    let mut open: Vec<usize> = Vec::new();
    let mut chars = text[..line_start].char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '[' => open.push(i),
            ']' => {
                open.pop();
            }
            '#' => {
                for (_, c) in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            '"' | '\'' => {
                let mut escaped = false;
                for (_, d) in chars.by_ref() {
                    if d == c && !escaped || d == '\n' {
                        break;
                    }
                    escaped = c == '"' && d == '\\' && !escaped;
                }
            }
            // A new `name = value` line or table header at the outer level ends nothing: a
            // line starting while a list is open is still inside it.
            _ => {}
        }
    }
    open.first().copied()
}

/// Turns TOML values into typed fields, collecting problems with positions.
struct Reader<'b> {
    doc: usize,
    block: &'b Block,
    problems: Vec<Problem>,
}

type Value<'i> = Spanned<DeValue<'i>>;

impl Reader<'_> {
    /// Reports every field of `table` not in `allowed`, suggesting the nearest allowed name;
    /// whether there was one.
    fn known_fields(&mut self, table: &DeTable<'_>, allowed: &[&str], what: &str) -> bool {
        let before = self.problems.len();
        for (key, value) in table.iter() {
            if !allowed.contains(&key.get_ref().as_ref()) {
                let hint = closest(key.get_ref(), allowed)
                    .map(|k| format!(" (did you mean `{k}`?)"))
                    .unwrap_or_default();
                let found = format!("{} = {}", key.get_ref(), self.snippet(value));
                self.problem(
                    key.span().start,
                    format!("unknown field `{}` in {what}{hint}", key.get_ref()),
                    found,
                    format!("one of: {}", allowed.join(", ")),
                );
            }
        }
        self.problems.len() > before
    }

    fn problem(
        &mut self,
        content_at: usize,
        message: impl Into<String>,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) {
        let at = self.block.source_offset(content_at);
        self.problems.push(Problem::new(self.doc, at, message, found, expected));
    }

    fn snippet(&self, v: &Value<'_>) -> String {
        let s = self.block.content.get(v.span()).unwrap_or("");
        first_line(s)
    }

    fn wrong(&mut self, v: &Value<'_>, what: &str, expected: &str) {
        let found = self.snippet(v);
        self.problem(v.span().start, format!("expected {what}"), found, expected.to_string());
    }

    fn required<T>(
        &mut self,
        table: &DeTable<'_>,
        name: &str,
        read: impl Fn(&mut Self, &Value<'_>) -> Option<T>,
    ) -> Option<T> {
        match table.get(name) {
            Some(v) => read(self, v),
            None => {
                let first = first_line(&self.block.content);
                self.problem(
                    0,
                    format!("`qkv {}` block has no `{name}`", self.block.kind),
                    first,
                    format!("`{name} = ...`"),
                );
                None
            }
        }
    }

    fn identifier(&mut self, v: &Value<'_>) -> Option<Field<String>> {
        let f = self.string(v, "an identifier")?;
        let ok =
            !f.value.is_empty() && f.value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !ok {
            self.wrong(
                v,
                "an identifier",
                "letters, digits, `_` and `-`, such as `\"sentence\"` (a dot would break paths)",
            );
            return None;
        }
        Some(f)
    }

    fn string(&mut self, v: &Value<'_>, what: &str) -> Option<Field<String>> {
        match v.get_ref() {
            DeValue::String(s) => {
                Some(Field { value: s.to_string(), at: self.block.source_offset(v.span().start + 1) })
            }
            _ => {
                self.wrong(v, &format!("text: {what}"), "a quoted string");
                None
            }
        }
    }

    /// A list of comparisons (`["train.loss_after < train.loss"]`), each placed at its own text.
    fn conditions(&mut self, v: &Value<'_>) -> Option<Vec<Field<Condition>>> {
        let expected =
            "`[\"A < B\", …]`: comparisons of two paths to numbers, or numbers (`<`, `<=`, `>`, `>=`)";
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(v, "a list of comparisons", expected);
            return None;
        };
        if items.is_empty() {
            self.wrong(v, "at least one comparison", expected);
            return None;
        }
        let mut conditions = Vec::new();
        for item in items.iter() {
            let f = self.string(item, "a comparison such as `train.loss_after < train.loss`")?;
            let computed = |c: &Condition| [&c.left, &c.right].iter().any(|o| matches!(o, Operand::Path(_)));
            match Condition::parse(&f.value) {
                Ok(c) if computed(&c) => conditions.push(Field { value: c, at: f.at }),
                // Placed inside the quotes, as the evaluated claims' problems are.
                Ok(_) => {
                    let found = self.snippet(item);
                    self.problem(
                        item.span().start + 1,
                        "a claim between two numbers checks nothing",
                        found,
                        expected,
                    );
                }
                Err(message) => {
                    let found = self.snippet(item);
                    self.problem(item.span().start + 1, message, found, expected);
                }
            }
        }
        (conditions.len() == items.len()).then_some(conditions)
    }

    fn strings(&mut self, v: &Value<'_>) -> Option<Field<Vec<String>>> {
        let at = self.block.source_offset(v.span().start);
        let items = match v.get_ref() {
            DeValue::Array(a) => {
                a.iter().map(|x| x.get_ref().as_str().map(str::to_string)).collect::<Option<Vec<_>>>()
            }
            _ => None,
        };
        match items {
            // A label heads a table row and a path segment: it must be something to see and
            // stay on one line.
            Some(value) if value.iter().any(|t| t.trim().is_empty() || t.chars().any(char::is_control)) => {
                self.wrong(
                    v,
                    "token names that are visible text on one line",
                    "`[\"I\", \"love\", \"NLP\"]`",
                );
                None
            }
            Some(value) => match label_problem(&value) {
                None => Some(Field { value, at }),
                Some(message) => {
                    let found = self.snippet(v);
                    self.problem(
                            v.span().start,
                            message,
                            found,
                            "distinct labels that can stand in a path: no `.`, no field name of an example, a number only as its own position",
                        );
                    None
                }
            },
            None => {
                self.wrong(v, "a list of token names", "`[\"I\", \"love\", \"NLP\"]`");
                None
            }
        }
    }

    fn boolean(&mut self, v: &Value<'_>) -> Option<bool> {
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            _ => {
                self.wrong(v, "true or false", "`true` or `false`");
                None
            }
        }
    }

    fn count(&mut self, v: &Value<'_>) -> Option<usize> {
        let x = self.scalar(v)?;
        if x >= 1.0 && x == x.trunc() && x < 1e9 {
            Some(x as usize)
        } else {
            self.wrong(v, "a positive whole number", "a whole number such as `2000`");
            None
        }
    }

    /// A list of positive whole numbers, in increasing order (the x axis of a chart).
    fn counts(&mut self, v: &Value<'_>) -> Option<Vec<usize>> {
        let items = match v.get_ref() {
            DeValue::Array(a) => a.iter().map(|x| self.count(x)).collect::<Option<Vec<_>>>()?,
            _ => {
                self.wrong(v, "a list of whole numbers", "`[1, 2, 4, 8]`");
                return None;
            }
        };
        if items.is_empty() || items.windows(2).any(|w| w[0] >= w[1]) {
            self.wrong(v, "increasing whole numbers", "`[1, 2, 4, 8]`");
            return None;
        }
        Some(items)
    }

    fn number(&mut self, v: &Value<'_>) -> Option<Field<f64>> {
        let at = self.block.source_offset(v.span().start);
        self.scalar(v).map(|value| Field { value, at })
    }

    /// One finite number.
    fn scalar(&mut self, v: &Value<'_>) -> Option<f64> {
        let (parsed, written) = match v.get_ref() {
            DeValue::Integer(i) => {
                let digits = i.as_str().replace('_', "");
                let x = i64::from_str_radix(&digits, i.radix()).ok().map(|x| x as f64);
                // TOML integers stop at 64 bits; a longer decimal one is still the number it says.
                let x = x.or_else(|| (i.radix() == 10).then(|| digits.parse::<f64>().ok()).flatten());
                // An integer is exact: one that no f64 holds would show up as another number.
                if let Some(x) = x.filter(|x| x.is_finite())
                    && !holds_exactly(&digits, i.radix(), x)
                {
                    let found = self.snippet(v);
                    self.problem(
                        v.span().start,
                        format!("`{i}` is an integer no 64-bit float holds exactly: it would be {}", format::shortest(x, 0)),
                        found,
                        "an integer of at most 2^53 = 9007199254740992 in size, or a float such as `1e20` where an approximate value is meant",
                    );
                    return None;
                }
                (x, i.to_string())
            }
            DeValue::Float(f) => (f.as_str().replace('_', "").parse::<f64>().ok(), f.as_str().to_string()),
            _ => (None, String::new()),
        };
        let found = self.snippet(v);
        match parsed {
            Some(x) if x.is_finite() => Some(x),
            Some(_) if !written.contains(['i', 'n']) => {
                self.problem(
                    v.span().start,
                    format!("`{written}` is too large for a number here"),
                    found,
                    "a number of magnitude below 1.8e308 (the largest 64-bit float)",
                );
                None
            }
            Some(_) => {
                self.problem(
                    v.span().start,
                    "non-finite number",
                    found,
                    "a finite number (no `inf` or `nan`)",
                );
                None
            }
            None if !written.is_empty() => {
                self.problem(
                    v.span().start,
                    format!("`{written}` is too large for an integer"),
                    found,
                    "a whole number below 2^63 in hexadecimal, octal or binary, or write it in decimal",
                );
                None
            }
            None => {
                self.wrong(v, "a number", "a number such as `0.5` or `2`");
                None
            }
        }
    }

    fn vector(&mut self, v: &Value<'_>) -> Option<Field<Input<Vec<f64>>>> {
        let at = self.block.source_offset(v.span().start);
        match v.get_ref() {
            DeValue::String(s) => Some(Field { value: Input::Ref(s.to_string()), at: at + 1 }),
            DeValue::Array(a) => {
                let n = self.problems.len();
                let xs: Vec<f64> = a.iter().filter_map(|x| self.scalar(x)).collect();
                (self.problems.len() == n).then_some(Field { value: Input::Literal(xs), at })
            }
            _ => {
                self.wrong(v, "a list of numbers or a reference", "`[1, 0]` or `\"example.path\"`");
                None
            }
        }
    }

    fn matrix(&mut self, v: &Value<'_>) -> Option<Field<Input<Vec<Vec<f64>>>>> {
        let at = self.block.source_offset(v.span().start);
        match v.get_ref() {
            DeValue::String(s) => Some(Field { value: Input::Ref(s.to_string()), at: at + 1 }),
            DeValue::Array(rows) if rows.iter().any(|row| matches!(row.get_ref(), DeValue::String(_))) => {
                // Rows by reference: their widths are known once they are resolved.
                let n = self.problems.len();
                let out: Vec<_> = rows
                    .iter()
                    .filter_map(|row| match row.get_ref() {
                        DeValue::Array(xs) if xs.is_empty() => {
                            self.wrong(row, "a row of at least one number", "a row such as `[1, 0]`");
                            None
                        }
                        DeValue::String(_) | DeValue::Array(_) => self.vector(row),
                        // A bare number is a one-wide row, as in a literal matrix.
                        DeValue::Integer(_) | DeValue::Float(_) => {
                            let at = self.block.source_offset(row.span().start);
                            self.scalar(row).map(|x| Field { value: Input::Literal(vec![x]), at })
                        }
                        _ => {
                            let expected = "`[1, 0]` or `\"other.keys.love\"`";
                            self.wrong(row, "a row of numbers or a reference to one", expected);
                            None
                        }
                    })
                    .collect();
                (self.problems.len() == n).then_some(Field { value: Input::Rows(out), at })
            }
            DeValue::Array(rows) => {
                let n = self.problems.len();
                let mut out = Vec::new();
                for row in rows.iter() {
                    match row.get_ref() {
                        DeValue::Array(xs) => {
                            out.push(xs.iter().filter_map(|x| self.scalar(x)).collect::<Vec<_>>())
                        }
                        // A bare number is a one-wide row: `values = [2, 6, 4]`.
                        DeValue::Integer(_) | DeValue::Float(_) => {
                            out.push(self.scalar(row).into_iter().collect());
                        }
                        _ => self.wrong(row, "a row of numbers", "a row such as `[1, 0]`"),
                    }
                }
                if self.problems.len() > n {
                    return None;
                }
                if let Some((bad, message)) = unequal_rows(&out) {
                    let found = self.snippet(&rows[bad]);
                    self.problem(rows[bad].span().start, message, found, "rows of equal length");
                    return None;
                }
                if out.is_empty() || out[0].is_empty() {
                    self.wrong(v, "at least one row of numbers", "`[[1, 0], [0, 1]]`");
                    return None;
                }
                Some(Field { value: Input::Literal(out), at })
            }
            _ => {
                self.wrong(v, "rows of numbers or a reference", "`[[1, 0], [0, 1]]` or `\"example.keys\"`");
                None
            }
        }
    }

    /// Reads a `qkv multi-head` block.
    fn multi_head(&mut self, table: &DeTable<'_>) -> Option<MultiHeadDecl> {
        let n = self.problems.len();
        let tokens = table.get("tokens").and_then(|v| self.strings(v));
        let x = self.required(table, "x", Reader::matrix);
        let w_o = self.required(table, "w_o", Reader::matrix);
        let mask = table.get("mask").and_then(|v| self.mask(v));
        let scale = table.get("scale").and_then(|v| self.number(v));
        let limits = KeyLimits {
            key_length: table.get("key_length").and_then(|v| self.whole(v)),
            key_padding: table.get("key_padding").and_then(|v| self.flags(v)),
            window: table.get("window").and_then(|v| self.window(v)),
            alibi: None,
        };
        let kv_heads = match table.get("kv_heads") {
            None => Vec::new(),
            Some(v) => self
                .tables(v, "kv_heads", &["w_k", "w_v"])
                .into_iter()
                .filter_map(|(_, t)| {
                    let w_k = self.required(t, "w_k", Reader::matrix);
                    let w_v = self.required(t, "w_v", Reader::matrix);
                    Some(KvHeadDecl { w_k: w_k?, w_v: w_v? })
                })
                .collect(),
        };
        let shared = table.get("kv_heads").is_some();
        let mut heads = Vec::new();
        let Some(v) = table.get("heads") else {
            self.problem(
                0,
                "a `multi-head` block has no `heads`",
                first_line(&self.block.content),
                "`[[heads]]` tables, each with `w_q`, and `w_k` and `w_v` (or `kv`, with `[[kv_heads]]`)",
            );
            return None;
        };
        let items = self.tables(v, "heads", &["name", "w_q", "w_k", "w_v", "kv", "alibi"]);
        if items.len() > limits::MAX_SHOWN {
            self.wrong(
                v,
                &format!("at most {} heads", limits::MAX_SHOWN),
                "fewer heads: every head is shown and cited",
            );
        }
        for (i, (at, t)) in items.into_iter().enumerate() {
            let name = match t.get("name") {
                Some(v) => self.identifier(v).map(|f| f.value),
                None => Some((i + 1).to_string()),
            };
            let w_q = self.required(t, "w_q", Reader::matrix);
            let alibi = t.get("alibi").and_then(|v| self.number(v));
            let kv = if shared {
                for name in ["w_k", "w_v"] {
                    if let Some((key, _)) = t.get_key_value(name) {
                        self.problem(
                            key.span().start,
                            format!(
                                "head {} has `{name}`, but its keys and values come from `kv_heads`",
                                i + 1
                            ),
                            first_line(self.block.content.get(key.span().start..).unwrap_or("")),
                            "`kv = N`: the number of the `[[kv_heads]]` entry it shares",
                        );
                    }
                }
                match self.required(t, "kv", Reader::whole) {
                    Some(f) if f.value >= 1 && f.value <= kv_heads.len() => {
                        Some(HeadKv::Shared(Field { value: f.value - 1, at: f.at }))
                    }
                    Some(f) => {
                        self.problems.push(Problem::new(
                            self.doc,
                            f.at,
                            format!(
                                "head {} shares key/value head {}, but there are {}",
                                i + 1,
                                f.value,
                                kv_heads.len()
                            ),
                            format!("kv = {}", f.value),
                            format!("a number from 1 to {}", kv_heads.len()),
                        ));
                        None
                    }
                    None => None,
                }
            } else {
                if let Some((key, _)) = t.get_key_value("kv") {
                    self.problem(
                        key.span().start,
                        "`kv` names a shared key/value head, but the block has no `kv_heads`",
                        first_line(self.block.content.get(key.span().start..).unwrap_or("")),
                        "`[[kv_heads]]` tables with `w_k` and `w_v`, or `w_k` and `w_v` on the head",
                    );
                }
                let w_k = self.required(t, "w_k", Reader::matrix);
                let w_v = self.required(t, "w_v", Reader::matrix);
                w_k.zip(w_v).map(|(w_k, w_v)| HeadKv::Own { w_k, w_v })
            };
            if let (Some(name), Some(w_q), Some(kv)) = (name, w_q, kv) {
                heads.push(HeadDecl { name, w_q, kv, alibi, at });
            }
        }
        let names: Vec<String> = heads.iter().map(|h| h.name.clone()).collect();
        if let Some(message) = label_problem(&names) {
            self.wrong(v, "heads with distinct names", &message);
        }
        for (k, _) in kv_heads.iter().enumerate() {
            if !heads.iter().any(|h| matches!(&h.kv, HeadKv::Shared(f) if f.value == k)) {
                let at = table.get("kv_heads").map_or(0, |v| v.span().start);
                self.problem(
                    at,
                    format!("key/value head {} is shared by no query head", k + 1),
                    first_line(self.block.content.get(at..).unwrap_or("")),
                    "every `[[kv_heads]]` entry named by some head's `kv`",
                );
            }
        }
        if self.problems.len() > n {
            return None;
        }
        Some(MultiHeadDecl { tokens, x: x?, heads, kv_heads, w_o: w_o?, mask, limits, scale })
    }

    /// `[[NAME]]` tables, each checked for unknown fields: with the source offset of each.
    fn tables<'t>(
        &mut self,
        v: &'t Value<'_>,
        name: &str,
        allowed: &[&str],
    ) -> Vec<(usize, &'t DeTable<'t>)> {
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(
                v,
                &format!("`[[{name}]]` tables"),
                &format!("`[[{name}]]` tables with {}", allowed.join(", ")),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            match item.get_ref() {
                DeValue::Table(t) if !self.known_fields(t, allowed, &format!("`{name}` entry {}", i + 1)) => {
                    out.push((self.block.source_offset(item.span().start), t));
                }
                DeValue::Table(_) => {}
                _ => self.wrong(
                    item,
                    &format!("a `[[{name}]]` table"),
                    &format!("fields {}", allowed.join(", ")),
                ),
            }
        }
        out
    }

    /// A whole number, 0 included.
    fn whole(&mut self, v: &Value<'_>) -> Option<Field<usize>> {
        let at = self.block.source_offset(v.span().start);
        match self.scalar(v)? {
            x if x >= 0.0 && x == x.trunc() && x < 1e9 => Some(Field { value: x as usize, at }),
            _ => {
                self.wrong(v, "a whole number", "a count such as `2`");
                None
            }
        }
    }

    /// `[true, false, …]`.
    fn flags(&mut self, v: &Value<'_>) -> Option<Field<Vec<bool>>> {
        let at = self.block.source_offset(v.span().start);
        let flags = match v.get_ref() {
            DeValue::Array(a) => a.iter().map(|x| x.get_ref().as_bool()).collect::<Option<Vec<_>>>(),
            _ => None,
        };
        match flags {
            Some(value) if !value.is_empty() => Some(Field { value, at }),
            _ => {
                self.wrong(
                    v,
                    "one `true` or `false` per key",
                    "`[false, false, true]` (true: the key is padding)",
                );
                None
            }
        }
    }

    /// `window = [before, after]`: how many keys before and after its own position a query sees.
    fn window(&mut self, v: &Value<'_>) -> Option<Field<[usize; 2]>> {
        const EXPECTED: &str = "`window = [BEFORE, AFTER]`: how many keys before and after its own position each query sees, such as `[1, 0]`";
        let at = self.block.source_offset(v.span().start);
        let sides = match v.get_ref() {
            DeValue::Array(a) if a.len() == 2 => {
                a.iter().map(|x| self.whole(x).map(|f| f.value)).collect::<Option<Vec<_>>>()
            }
            _ => None,
        };
        match sides.as_deref() {
            Some(&[before, after]) => Some(Field { value: [before, after], at }),
            _ => {
                self.wrong(v, "a window", EXPECTED);
                None
            }
        }
    }

    fn mask(&mut self, v: &Value<'_>) -> Option<Field<Mask>> {
        let at = self.block.source_offset(v.span().start);
        match v.get_ref() {
            DeValue::String(s) if s == "causal" => Some(Field { value: Mask::Causal, at }),
            DeValue::Array(rows) => {
                let table: Option<Vec<Vec<bool>>> = rows
                    .iter()
                    .map(|r| {
                        r.get_ref()
                            .as_array()
                            .and_then(|xs| xs.iter().map(|x| x.get_ref().as_bool()).collect())
                    })
                    .collect();
                match table {
                    Some(t) => Some(Field { value: Mask::Keep(t), at }),
                    None => {
                        self.wrong(v, "a mask", "`\"causal\"` or rows of `true`/`false`");
                        None
                    }
                }
            }
            _ => {
                self.wrong(v, "a mask", "`\"causal\"` or rows of `true`/`false` (true = may attend)");
                None
            }
        }
    }

    fn figure_kind(&mut self, v: &Value<'_>) -> Option<FigureKind> {
        let name = self.string(v, "a figure kind")?;
        match FigureKind::from_name(&name.value) {
            Some(k) => Some(k),
            None => {
                let hint = closest(&name.value, FigureKind::NAMES)
                    .map(|k| format!(" (did you mean `{k}`?)"))
                    .unwrap_or_default();
                let found = self.snippet(v);
                self.problem(
                    v.span().start,
                    format!("unknown figure kind `{}`{hint}", name.value),
                    found,
                    format!("one of: {}", FigureKind::NAMES.join(", ")),
                );
                None
            }
        }
    }
}
