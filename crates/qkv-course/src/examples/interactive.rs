//! The blocks the page shows rather than computes: `qkv quiz` (a graded check or a practice
//! problem), `qkv widget` (an interactive figure on an example's numbers) and `qkv settings`
//! (per-section options). Their text fields are markdown citing numbers as `{=PATH:FORMAT}`.

use toml::de::{DeTable, DeValue};

use super::{Field, Reader, Value};
use crate::citation::Text;
use crate::document::{citation_shapes, first_line};
use crate::error::closest;
use crate::figure_kind::named_kinds;

/// The id a `qkv settings` block is known by (it is written without one).
pub(crate) const SETTINGS_ID: &str = "settings";

/// Letters name choice options on the page, so there can be no more options than letters.
const MAX_OPTIONS: usize = 26;

/// A block the page shows.
#[derive(Debug, Clone)]
pub(crate) enum PageDecl {
    Quiz(Box<QuizDecl>),
    Widget(Box<WidgetDecl>),
    Settings(Settings),
    Term(Box<TermDecl>),
}

/// A `qkv term` block: one entry of the course's glossary, declared in the section that
/// introduces it. The glossary page lists every section's terms; each page links the first use
/// of each term in its prose to the entry.
#[derive(Debug, Clone)]
pub(crate) struct TermDecl {
    /// The term as the glossary lists it (`query`, `KV cache`).
    pub term: String,
    /// Its symbol, TeX without dollars (`q`, `d_k`), if it has one.
    pub symbol: Option<String>,
    /// The words in the prose that are uses of it (`query`, `queries`), matched as whole words,
    /// letter case aside; by default the term itself.
    pub forms: Vec<String>,
    /// What it is: markdown, one or two sentences.
    pub definition: String,
}

/// A `qkv quiz` block.
#[derive(Debug, Clone)]
pub(crate) struct QuizDecl {
    /// A practice problem: never graded, never counted.
    pub practice: bool,
    pub question: Text,
    pub hint: Option<Text>,
    /// Why the answer is right, shown with it (required for choice and numeric quizzes).
    pub why: Option<Text>,
    pub key: QuizKey,
}

/// How a quiz is answered, and its key.
#[derive(Debug, Clone)]
pub(crate) enum QuizKey {
    /// Multiple choice: which option is right, fixed or computed; `shuffle` asks the page to
    /// show the options in an order of the learner's own (seeded, stable across reloads).
    Choice { options: Vec<QuizOption>, correct: ChoiceKey, shuffle: bool },
    /// A number: the value `answer` names, shown at `digits` decimals, accepted within
    /// `tolerance` (default half a unit in the last shown place); `steps` names a computation
    /// whose worked steps go with the answer.
    Numeric {
        answer: Field<String>,
        digits: usize,
        tolerance: Option<Field<f64>>,
        steps: Option<Field<String>>,
        /// The key is shown as a percentage, `digits` decimals of it (`73.1%`).
        percent: bool,
        /// The key is a share of a whole (a weight, a probability; `share`): a percentage reads
        /// as one. Elsewhere a percentage is no way to write the answer.
        share: Option<Field<bool>>,
        /// The near-miss band (`near_miss`): an answer this close to the key but outside the
        /// tolerance is told to keep more decimals, and uses no try; `0` turns it off. Default:
        /// two units in the last shown place or 0.5% of the key, whichever is wider.
        near_miss: Option<Field<f64>>,
    },
    /// Written freely and checked by the learner against a model answer (practice only).
    Short { answer_text: Text },
}

impl QuizKey {
    /// The `kind = "..."` that declares it.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            QuizKey::Choice { .. } => "choice",
            QuizKey::Numeric { .. } => "numeric",
            QuizKey::Short { .. } => "short",
        }
    }
}

/// Which option of a choice quiz is right.
#[derive(Debug, Clone)]
pub(crate) enum ChoiceKey {
    /// The option marked `correct = true` (a conceptual question): its index.
    Fixed(usize),
    /// `correct = { largest = "PATH" }` (or `smallest`): the option whose `item` names the
    /// largest (smallest) number of the list `PATH` names, worked out at every build.
    Extreme { path: Field<String>, largest: bool },
    /// Every option has `when = "A < B"`: the one whose condition holds at this build.
    When,
}

/// One option of a choice quiz.
#[derive(Debug, Clone)]
pub(crate) struct QuizOption {
    pub text: Text,
    /// What a learner who picks it is told (every option that can be wrong has one).
    pub feedback: Option<Text>,
    /// With an `Extreme` key: the item of the list this option names.
    pub item: Option<Field<String>>,
    /// With a `When` key: the condition under which this option is the right one.
    pub when: Option<Field<Condition>>,
    /// With a computed key: why this option is right, shown instead of the quiz's `why`.
    pub why: Option<Text>,
}

/// `A OP B` between two numbers, each a path or a literal: when a computed option is right.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Condition {
    /// The condition as written, for messages.
    pub written: String,
    pub left: Operand,
    pub op: Comparison,
    pub right: Operand,
}

/// One side of a [`Condition`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Operand {
    /// The number a path names (`sentence.love.weights.NLP`).
    Path(String),
    /// A number written in the condition.
    Number(f64),
}

/// The comparisons a [`Condition`] may make. No equality: two computed numbers are rarely equal
/// to the last bit, and a key that hangs on it would flip unseen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Comparison {
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

impl Comparison {
    /// The operators, longest first so that `<=` is not read as `<`.
    const OPERATORS: &[(&str, Comparison)] = &[
        ("<=", Comparison::LessOrEqual),
        (">=", Comparison::GreaterOrEqual),
        ("<", Comparison::Less),
        (">", Comparison::Greater),
    ];

    /// Whether `a OP b` holds.
    pub(crate) fn holds(self, a: f64, b: f64) -> bool {
        match self {
            Comparison::Less => a < b,
            Comparison::LessOrEqual => a <= b,
            Comparison::Greater => a > b,
            Comparison::GreaterOrEqual => a >= b,
        }
    }
}

impl Condition {
    /// Reads `A OP B`; `Err` says what is wrong.
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let Some((at, op, len)) = Comparison::OPERATORS
            .iter()
            .filter_map(|&(text, op)| s.find(text).map(|at| (at, op, text.len())))
            .min_by_key(|&(at, _, len)| (at, std::cmp::Reverse(len)))
        else {
            return Err("no comparison: `<`, `<=`, `>` or `>=` between two numbers".into());
        };
        let operand = |side: &str| -> Result<Operand, String> {
            let side = side.trim();
            if side.is_empty() {
                return Err("a comparison needs a number or a path on each side".into());
            }
            if let Ok(x) = side.parse::<f64>() {
                return if x.is_finite() {
                    Ok(Operand::Number(x))
                } else {
                    Err(format!("`{side}` is not finite"))
                };
            }
            if side.chars().any(|c| c.is_whitespace() || "<>=!(){}".contains(c)) {
                return Err(format!("`{side}` is neither a number nor a path"));
            }
            Ok(Operand::Path(side.to_string()))
        };
        Ok(Condition {
            written: s.to_string(),
            left: operand(&s[..at])?,
            op,
            right: operand(&s[at + len..])?,
        })
    }
}

/// The quiz kinds, and the fields only that kind takes.
const QUIZ_KINDS: &[(&str, &[&str])] = &[
    ("choice", &["options", "correct", "shuffle"]),
    ("numeric", &["answer", "digits", "tolerance", "steps", "percent", "share", "near_miss"]),
    ("short", &["answer_text"]),
];

/// A `qkv widget` block.
#[derive(Debug, Clone)]
pub(crate) struct WidgetDecl {
    pub kind: WidgetKind,
    /// The example it shows: an attention example, a multi-head example (head-explorer), a
    /// `qkv tiled` block (tile-stepper) or a decoding (decode-stepper).
    pub example: Field<String>,
    /// drag-query: the token whose query the handle starts at (and resets to); decode-stepper:
    /// the token whose step is shown first.
    pub query: Option<Field<String>>,
    /// drag-query: what the learner is asked to reach.
    pub goal: Option<Goal>,
    /// head-explorer: the head shown at the start (default the first).
    pub head: Option<Field<String>>,
    /// window-alibi: the windows `[before, after]` its control offers beside "no window".
    pub windows: Option<Field<Vec<[usize; 2]>>>,
    /// window-alibi: the ALiBi slopes its other control offers (0 is no bias).
    pub slopes: Option<Field<Vec<f64>>>,
    /// The task, as markdown.
    pub prompt: Text,
    /// Decimals of every readout.
    pub digits: usize,
}

/// The widget kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WidgetKind {
    /// A plane with the keys and a query handle; every score, weight and the output live.
    DragQuery,
    /// The weight matrix as a heatmap whose rows open that query's worked steps.
    AttentionMatrix,
    /// A multi-head example: pick a head to see its weights and output, switch heads off to see
    /// the final output without them.
    HeadExplorer,
    /// A `qkv tiled` trace walked block by block: scores, `m`, `l`, rescale, output so far.
    TileStepper,
    /// A decoding walked step by step: the cache, the new query's scores, weights and output.
    DecodeStepper,
    /// A window control and an ALiBi-slope control over the bias, the weights and the outputs.
    WindowAlibi,
    /// One token through a Transformer block, stage by stage, pre-norm or post-norm.
    BlockWalk,
    /// A gradient block's descent walked step by step: the loss, the inputs, outputs, gradients.
    GradientDescent,
    /// A positions block's sweep: a query moved along the positions, its key a distance behind.
    PositionSweep,
}

named_kinds!(WidgetKind {
    DragQuery => "drag-query",
    AttentionMatrix => "attention-matrix",
    HeadExplorer => "head-explorer",
    TileStepper => "tile-stepper",
    DecodeStepper => "decode-stepper",
    WindowAlibi => "window-alibi",
    BlockWalk => "block-walk",
    GradientDescent => "gradient-descent",
    PositionSweep => "position-sweep",
});

/// The fields only some widget kinds take, and those kinds.
const WIDGET_FIELDS: &[(&str, &[WidgetKind])] = &[
    ("query", &[WidgetKind::DragQuery, WidgetKind::DecodeStepper, WidgetKind::BlockWalk]),
    ("goal", &[WidgetKind::DragQuery]),
    ("head", &[WidgetKind::HeadExplorer]),
    ("windows", &[WidgetKind::WindowAlibi]),
    ("slopes", &[WidgetKind::WindowAlibi]),
];

/// The most choices one control of a window-alibi widget offers: the page embeds every
/// combination, and a row of radio buttons past this no longer fits a phone's column.
const MAX_CHOICES: usize = 8;

/// What a drag-query widget asks the learner to reach.
#[derive(Debug, Clone)]
pub(crate) enum Goal {
    /// This key's weight is larger than every other key's.
    Largest(Field<String>),
}

/// The goals a widget understands, for messages.
const GOALS: &[&str] = &["largest"];

/// A section's `qkv settings` block.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Credit for a right answer on the first, second and third try.
    pub credit: Option<[f64; 3]>,
    /// The GitHub folder that holds the published site, for "Open in Colab" links.
    pub notebook_repository: Option<Field<String>>,
    /// The section's one-line summary, for the contents page (plain text).
    pub summary: Option<String>,
}

impl Settings {
    /// The default credit schedule: full, half, a quarter.
    pub(crate) const CREDIT: [f64; 3] = [1.0, 0.5, 0.25];
}

/// The "Open in Colab" address of the folder a `notebook_repository` names, or `None` if it is
/// not a GitHub folder: `https://github.com/OWNER/REPO/blob/BRANCH/FOLDER` (or `tree`) becomes
/// `https://colab.research.google.com/github/OWNER/REPO/blob/BRANCH/FOLDER`.
pub(crate) fn colab_base(url: &str) -> Option<String> {
    let rest = url.trim_end_matches('/').strip_prefix("https://github.com/")?;
    let parts: Vec<&str> = rest.split('/').collect();
    let [owner, repo, "blob" | "tree", branch, folder @ ..] = parts.as_slice() else { return None };
    if [owner, repo, branch].iter().any(|p| p.is_empty()) || folder.iter().any(|p| p.is_empty()) {
        return None;
    }
    let mut base = format!("https://colab.research.google.com/github/{owner}/{repo}/blob/{branch}");
    for part in folder {
        base.push('/');
        base.push_str(part);
    }
    Some(base)
}

/// One `[[options]]` table as read, with what the checks across options need to know of it.
struct OptionRead {
    letter: char,
    /// Where its `text` (or the table) starts.
    at: usize,
    has_feedback: bool,
    has_when: bool,
    /// The option, when it read without problems.
    option: Option<QuizOption>,
}

/// Whether every option of a choice quiz carries its own `why` (so the quiz needs none).
fn every_option_has_why(table: &DeTable<'_>) -> bool {
    match table.get("options").map(|v| v.get_ref()) {
        Some(DeValue::Array(items)) => {
            !items.is_empty()
                && items.iter().all(|i| matches!(i.get_ref(), DeValue::Table(t) if t.get("why").is_some()))
        }
        _ => false,
    }
}

/// The letter of option `i` (`a`, `b`, …).
pub(crate) fn letter(i: usize) -> char {
    (b'a' + (i % MAX_OPTIONS) as u8) as char
}

impl Reader<'_> {
    /// Reads a `quiz`, `widget` or `settings` block.
    pub(super) fn page(&mut self, kind: &str, table: &DeTable<'_>) -> Option<PageDecl> {
        match kind {
            "quiz" => self.quiz(table).map(|q| PageDecl::Quiz(Box::new(q))),
            "widget" => self.widget(table).map(|w| PageDecl::Widget(Box::new(w))),
            "term" => self.term(table).map(|t| PageDecl::Term(Box::new(t))),
            _ => self.settings(table).map(PageDecl::Settings),
        }
    }

    /// A glossary entry: `term`, `definition` (plain markdown, no citations: the glossary page
    /// computes nothing), optional `symbol` and `forms`.
    fn term(&mut self, table: &DeTable<'_>) -> Option<TermDecl> {
        const FORMS: &str = "the words that count as a use, such as `forms = [\"query\", \"queries\"]`";
        let line = |r: &mut Self, name: &str, what: &str| -> Option<String> {
            let v = table.get(name)?;
            let f = r.string(v, what)?;
            let text = f.value.trim();
            if text.is_empty() || text.contains('\n') || !citation_shapes(text).is_empty() {
                r.wrong(v, what, "one line of text without citations (the glossary computes nothing)");
                return None;
            }
            Some(text.to_string())
        };
        let term = line(self, "term", "the term as the glossary lists it");
        let symbol = line(self, "symbol", "its symbol in TeX, such as `d_k`");
        if let (Some(tex), Some(v)) = (&symbol, table.get("symbol"))
            && let Some(reason) = crate::markup::tex_error(tex)
        {
            self.wrong(v, &format!("TeX the renderer reads ({reason})"), "its symbol in TeX, such as `d_k`");
        }
        let definition = line(self, "definition", "what the term means, in markdown");
        if let (Some(text), Some(v)) = (&definition, table.get("definition"))
            && let Some(message) = crate::markup::fragment_math_error(text)
        {
            self.wrong(v, &message, "TeX the renderer reads, between `$` and `$`");
        }
        for (name, value) in [("term", &term), ("definition", &definition)] {
            if value.is_none() && table.get(name).is_none() {
                self.problem(
                    0,
                    format!("`qkv term` block has no `{name}`"),
                    first_line(&self.block.content),
                    format!("`{name} = \"…\"`"),
                );
            }
        }
        let forms = match table.get("forms") {
            None => term.clone().into_iter().collect(),
            Some(v) => {
                let words = match v.get_ref() {
                    DeValue::Array(a) => a
                        .iter()
                        .map(|x| x.get_ref().as_str().map(str::trim).map(str::to_string))
                        .collect::<Option<Vec<String>>>(),
                    _ => None,
                };
                match words {
                    Some(w)
                        if !w.is_empty()
                            && w.iter()
                                .all(|f| f.chars().any(char::is_alphanumeric) && !f.contains('\n')) =>
                    {
                        w
                    }
                    _ => {
                        self.wrong(v, "a list of words", FORMS);
                        return None;
                    }
                }
            }
        };
        Some(TermDecl { term: term?, symbol, forms, definition: definition? })
    }

    /// Markdown text that may cite numbers as `{=PATH:FORMAT}`.
    pub(super) fn text(&mut self, v: &Value<'_>) -> Option<Text> {
        let field = self.string(v, "markdown text")?;
        let span = v.span();
        let raw = self.block.content.get(span.clone()).unwrap_or("");
        let opens: Vec<usize> =
            citation_shapes(raw).into_iter().map(|(i, _)| self.block.source_offset(span.start + i)).collect();
        if let Some(message) = crate::markup::fragment_math_error(&field.value) {
            self.problem(span.start, message, first_line(raw), "TeX the renderer reads, between `$` and `$`");
            return None;
        }
        match Text::parse(self.doc, field.value, field.at, &opens) {
            Ok(t) => Some(t),
            Err(p) => {
                self.problems.push(p);
                None
            }
        }
    }

    /// A whole number of decimals, 0 to 12.
    fn digits(&mut self, v: &Value<'_>) -> Option<usize> {
        const WHOLE: &str = "a whole number from 0 to 12, such as `3`";
        if !matches!(v.get_ref(), DeValue::Integer(_) | DeValue::Float(_)) {
            self.wrong(v, "a number of decimals", WHOLE);
            return None;
        }
        match self.scalar(v)? {
            x if (0.0..=12.0).contains(&x) && x == x.trunc() => Some(x as usize),
            _ => {
                self.wrong(v, "a number of decimals", WHOLE);
                None
            }
        }
    }

    /// Reports each field of `table` that belongs to another kind than `kind` (in `kinds`), and
    /// not to `kind` too.
    pub(super) fn other_kinds_fields(&mut self, table: &DeTable<'_>, kind: &str, kinds: &[(&str, &[&str])]) {
        let own: &[&str] = kinds.iter().find(|(k, _)| *k == kind).map_or(&[], |(_, fields)| fields);
        for (key, _) in table.iter() {
            let name = key.get_ref().as_ref();
            if own.contains(&name) {
                continue;
            }
            if let Some((owner, _)) = kinds.iter().find(|(k, fields)| *k != kind && fields.contains(&name)) {
                self.problem(
                    key.span().start,
                    format!("`{name}` is for `kind = \"{owner}\"`, not `\"{kind}\"`"),
                    first_line(self.block.content.get(key.span().start..).unwrap_or("")),
                    format!("a `{kind}` block without `{name}`"),
                );
            }
        }
    }

    /// A `kind = "..."` among `names`.
    fn kind_name<'n>(&mut self, table: &DeTable<'_>, what: &str, names: &[&'n str]) -> Option<&'n str> {
        let field = self.required(table, "kind", |r, v| r.string(v, what))?;
        if let Some(&name) = names.iter().find(|&&n| n == field.value) {
            return Some(name);
        }
        let hint =
            closest(&field.value, names).map(|k| format!(" (did you mean `{k}`?)")).unwrap_or_default();
        let v = table.get("kind")?;
        let found = self.snippet(v);
        let expected: Vec<String> = names.iter().map(|n| format!("`{n}`")).collect();
        self.problem(
            v.span().start,
            format!("unknown {what} `{}`{hint}", field.value),
            found,
            format!("one of: {}", expected.join(", ")),
        );
        None
    }

    fn quiz(&mut self, table: &DeTable<'_>) -> Option<QuizDecl> {
        let names: Vec<&str> = QUIZ_KINDS.iter().map(|(k, _)| *k).collect();
        let kind = self.kind_name(table, "quiz kind", &names);
        let practice = table.get("practice").and_then(|v| self.boolean(v)).unwrap_or(false);
        let question = self.required(table, "question", Self::text);
        let hint = table.get("hint").and_then(|v| self.text(v));
        let why = table.get("why").and_then(|v| self.text(v));
        let kind = kind?;
        self.other_kinds_fields(table, kind, QUIZ_KINDS);
        let key = match kind {
            "choice" => self.choice(table),
            "numeric" => self.numeric(table),
            _ => self.short(table, practice),
        };
        if why.is_none() && table.get("why").is_none() && kind != "short" && !every_option_has_why(table) {
            self.problem(
                0,
                format!("a `{kind}` quiz has no `why`"),
                first_line(&self.block.content),
                "`why = \"...\"`: why the answer is right, shown with it",
            );
        }
        Some(QuizDecl { practice, question: question?, hint, why, key: key? })
    }

    fn choice(&mut self, table: &DeTable<'_>) -> Option<QuizKey> {
        const EXPECTED: &str = "`[[options]]` tables, each with `text`; `correct = true` on the right one and `feedback` on each of the others, or a computed key (`correct = { largest = \"PATH\" }` with `item` on every option, or `when` on every option)";
        let Some(v) = table.get("options") else {
            self.problem(0, "a `choice` quiz has no `options`", first_line(&self.block.content), EXPECTED);
            return None;
        };
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(v, "a list of options", EXPECTED);
            return None;
        };
        let n = self.problems.len();
        let computed = table.get("correct").and_then(|c| self.extreme_key(c));
        let shuffle = table.get("shuffle").and_then(|v| self.boolean(v)).unwrap_or(false);
        let mut options = Vec::new();
        let mut marked: Vec<(usize, usize)> = Vec::new();
        let mut misspelt = false;
        for (i, item) in items.iter().enumerate() {
            let letter = letter(i);
            let DeValue::Table(t) = item.get_ref() else {
                self.wrong(item, "an option", EXPECTED);
                continue;
            };
            // An option with a misspelt field is reported as such, not as missing what it misspelt.
            if self.known_fields(
                t,
                &["text", "feedback", "correct", "item", "when", "why"],
                &format!("option ({letter})"),
            ) {
                misspelt = true;
                continue;
            }
            let text = match t.get("text") {
                Some(v) => self.text(v),
                None => {
                    self.problem(
                        item.span().start,
                        format!("option ({letter}) has no `text`"),
                        first_line(self.block.content.get(item.span()).unwrap_or("")),
                        "`text = \"...\"`: the option as the learner reads it",
                    );
                    None
                }
            };
            let feedback = t.get("feedback").and_then(|v| self.text(v));
            let why = t.get("why").and_then(|v| self.text(v));
            let item_label =
                t.get("item").and_then(|v| self.string(v, "the label of an item of the key's list"));
            let when = t.get("when").and_then(|v| {
                let f = self.string(v, "a comparison such as `sentence.love.weights.NLP > 0.5`")?;
                match Condition::parse(&f.value) {
                    Ok(c) => Some(Field { value: c, at: f.at }),
                    Err(message) => {
                        let found = self.snippet(v);
                        self.problem(
                            v.span().start,
                            format!("option ({letter}): {message}"),
                            found,
                            "`when = \"A > B\"` with A and B paths to numbers or numbers (`<`, `<=`, `>`, `>=`)",
                        );
                        None
                    }
                }
            });
            if let Some((key, v)) = t.get_key_value("correct")
                && self.boolean(v) == Some(true)
            {
                marked.push((i, key.span().start));
            }
            options.push(OptionRead {
                letter,
                at: t.get("text").map_or(item.span().start, |v| v.span().start),
                has_feedback: t.get("feedback").is_some(),
                has_when: t.get("when").is_some(),
                option: text.map(|text| QuizOption { text, feedback, item: item_label, when, why }),
            });
        }
        if items.len() > MAX_OPTIONS || items.len() < 2 {
            self.wrong(v, "between 2 and 26 options", EXPECTED);
        }
        let with_when = options.iter().filter(|o| o.has_when).count();
        let key = match (&computed, with_when) {
            (Some(_), 0) => computed.clone(),
            (None, w) if w > 0 => Some(ChoiceKey::When),
            (None, _) => None,
            (Some(_), _) => {
                let at = table.get("correct").map_or(0, |c| c.span().start);
                self.problem(
                    at,
                    "this quiz has both `correct = { … }` and options with `when`",
                    first_line(self.block.content.get(at..).unwrap_or("")),
                    "one way of computing the right option: `correct = { largest = \"PATH\" }` with `item`s, or `when` on every option",
                );
                return None;
            }
        };
        match (&key, marked.as_slice()) {
            (Some(_), [(_, at), ..]) => self.problem(
                *at,
                "`correct = true` on an option of a quiz whose right option is computed",
                first_line(self.block.content.get(*at..).unwrap_or("")),
                "no `correct = true`: the computation says which option is right at every build",
            ),
            (Some(_), []) | (None, [_]) => {}
            (None, []) if misspelt => {}
            (None, []) => self.problem(
                v.span().start,
                "no option is marked right",
                first_line(self.block.content.get(v.span()).unwrap_or("")),
                "`correct = true` on exactly one option, or a computed key",
            ),
            (None, [(first, _), rest @ ..]) => {
                for &(i, at) in rest {
                    self.problem(
                        at,
                        format!("options ({}) and ({}) are both marked right", letter(*first), letter(i)),
                        first_line(self.block.content.get(at..).unwrap_or("")),
                        "`correct = true` on exactly one option",
                    );
                }
            }
        }
        for (i, OptionRead { letter, at, has_feedback, has_when, option }) in options.iter().enumerate() {
            let right = key.is_none() && marked.first().is_some_and(|&(r, _)| r == i);
            match &key {
                // The right option's feedback would never be shown.
                None if right && *has_feedback => self.problem(
                    *at,
                    format!("option ({letter}) is the right one, and its `feedback` would never be shown"),
                    first_line(self.block.content.get(*at..).unwrap_or("")),
                    "the explanation in the quiz's `why`, and no `feedback` on the right option",
                ),
                // With a computed key any option may be the wrong one after an input changes.
                _ if !right && !has_feedback => self.problem(
                    *at,
                    format!(
                        "option ({letter}) {} but has no `feedback`",
                        if key.is_none() { "is wrong" } else { "can be wrong after an input changes" }
                    ),
                    first_line(self.block.content.get(*at..).unwrap_or("")),
                    "`feedback = \"...\"`: what a learner who picks it should hear (why it is not the answer)",
                ),
                _ => {}
            }
            let Some(option) = option else { continue };
            let field_for =
                |name: &str| format!("option ({letter}) has `{name}`, which only a computed key reads");
            match &key {
                None => {
                    for (name, present) in [("item", option.item.is_some()), ("why", option.why.is_some())] {
                        if present {
                            self.problem(
                                *at,
                                field_for(name),
                                first_line(self.block.content.get(*at..).unwrap_or("")),
                                "`correct = true` on the right option, or a computed key",
                            );
                        }
                    }
                }
                Some(ChoiceKey::Extreme { .. }) if option.item.is_none() => self.problem(
                    *at,
                    format!("option ({letter}) names no `item` of the key's list"),
                    first_line(self.block.content.get(*at..).unwrap_or("")),
                    "`item = \"LABEL\"` on every option: the item of the list it stands for",
                ),
                Some(ChoiceKey::When) if !has_when => self.problem(
                    *at,
                    format!("option ({letter}) has no `when`, but other options do"),
                    first_line(self.block.content.get(*at..).unwrap_or("")),
                    "`when = \"A > B\"` on every option: exactly one holds at each build",
                ),
                _ => {}
            }
        }
        if self.problems.len() > n {
            return None;
        }
        let options: Vec<QuizOption> = options.into_iter().filter_map(|o| o.option).collect();
        let correct = key.unwrap_or_else(|| ChoiceKey::Fixed(marked[0].0));
        Some(QuizKey::Choice { options, correct, shuffle })
    }

    /// `correct = { largest = "PATH" }` or `{ smallest = "PATH" }` (`correct = true` belongs on
    /// an option).
    fn extreme_key(&mut self, v: &Value<'_>) -> Option<ChoiceKey> {
        const EXPECTED: &str = "`correct = { largest = \"PATH\" }` or `{ smallest = \"PATH\" }`, PATH a list of numbers such as `sentence.love.weights`; or `correct = true` on the right option";
        let DeValue::Table(t) = v.get_ref() else {
            self.wrong(v, "a computed key", EXPECTED);
            return None;
        };
        match t.iter().collect::<Vec<_>>().as_slice() {
            [(name, path)] if matches!(name.get_ref().as_ref(), "largest" | "smallest") => {
                let path = self.string(path, "the path of a list of numbers")?;
                Some(ChoiceKey::Extreme { path, largest: name.get_ref().as_ref() == "largest" })
            }
            _ => {
                self.wrong(v, "a computed key", EXPECTED);
                None
            }
        }
    }

    fn numeric(&mut self, table: &DeTable<'_>) -> Option<QuizKey> {
        let answer =
            self.required(table, "answer", |r, v| r.string(v, "the path of the number that is the key"));
        let digits = self.required(table, "digits", Self::digits);
        let tolerance = table.get("tolerance").and_then(|v| {
            let t = self.number(v)?;
            if t.value > 0.0 {
                Some(t)
            } else {
                self.wrong(v, "a positive tolerance", "a number above 0, such as `0.001`");
                None
            }
        });
        let steps =
            table.get("steps").and_then(|v| self.string(v, "the computation whose steps go with the answer"));
        let percent = table.get("percent").and_then(|v| self.boolean(v)).unwrap_or(false);
        let share = table.get("share").and_then(|v| {
            let at = self.block.source_offset(v.span().start);
            Some(Field { value: self.boolean(v)?, at })
        });
        let near_miss = table.get("near_miss").and_then(|v| {
            let t = self.number(v)?;
            if t.value >= 0.0 {
                Some(t)
            } else {
                self.wrong(v, "a near-miss band", "a number of 0 or more, such as `0.01` (0 turns it off)");
                None
            }
        });
        Some(QuizKey::Numeric {
            answer: answer?,
            digits: digits?,
            tolerance,
            steps,
            percent,
            share,
            near_miss,
        })
    }

    fn short(&mut self, table: &DeTable<'_>, practice: bool) -> Option<QuizKey> {
        if !practice {
            let at = table.get("kind").map_or(0, |v| v.span().start);
            self.problem(
                at,
                "a short-answer quiz cannot be graded: the learner checks it against the model answer",
                "kind = \"short\"",
                "`practice = true`, or `kind = \"choice\"` or `\"numeric\"` for a graded check",
            );
        }
        let answer_text = self.required(table, "answer_text", Self::text)?;
        Some(QuizKey::Short { answer_text })
    }

    fn widget(&mut self, table: &DeTable<'_>) -> Option<WidgetDecl> {
        let kind = self.kind_name(table, "widget kind", WidgetKind::NAMES).and_then(WidgetKind::from_name);
        let example = self.required(table, "example", |r, v| r.string(v, "the id of an attention example"));
        let prompt = self.required(table, "prompt", Self::text);
        let digits =
            table.get("digits").and_then(|v| self.digits(v)).unwrap_or(crate::format::DEFAULT_DIGITS);
        let query = table.get("query").and_then(|v| self.string(v, "a token of the example"));
        let goal = table.get("goal").and_then(|v| self.goal(v));
        let head = table.get("head").and_then(|v| self.string(v, "the name of a head of the example"));
        let windows = table.get("windows").and_then(|v| self.windows(v));
        let slopes = table.get("slopes").and_then(|v| self.slopes(v));
        let kind = kind?;
        for &(name, kinds) in WIDGET_FIELDS {
            if let Some((key, _)) = table.get_key_value(name)
                && !kinds.contains(&kind)
            {
                let owners: Vec<String> = kinds.iter().map(|k| format!("`{}`", k.name())).collect();
                self.problem(
                    key.span().start,
                    format!("`{name}` is for {} widgets, not `{}`", owners.join(", "), kind.name()),
                    first_line(self.block.content.get(key.span().start..).unwrap_or("")),
                    format!("`kind = \"{}\"` without `{name}`", kind.name()),
                );
            }
        }
        let needs: &[(&str, &str)] = match kind {
            WidgetKind::DragQuery => &[("query", "`query = \"TOKEN\"`: the query the handle starts at")],
            WidgetKind::WindowAlibi => &[
                (
                    "windows",
                    "`windows = [[1, 0], [2, 0]]`: the windows `[before, after]` the control offers beside none",
                ),
                ("slopes", "`slopes = [0, 0.25, 0.5]`: the ALiBi slopes the control offers"),
            ],
            WidgetKind::AttentionMatrix
            | WidgetKind::HeadExplorer
            | WidgetKind::TileStepper
            | WidgetKind::DecodeStepper
            | WidgetKind::BlockWalk
            | WidgetKind::GradientDescent
            | WidgetKind::PositionSweep => &[],
        };
        for &(name, expected) in needs {
            if table.get(name).is_none() {
                self.problem(
                    0,
                    format!("a `{}` widget has no `{name}`", kind.name()),
                    first_line(&self.block.content),
                    expected,
                );
            }
        }
        Some(WidgetDecl {
            kind,
            example: example?,
            query,
            goal,
            head,
            windows,
            slopes,
            prompt: prompt?,
            digits,
        })
    }

    /// `windows = [[1, 0], [2, 0]]`: distinct windows, at most [`MAX_CHOICES`] less one (the
    /// control also offers none).
    fn windows(&mut self, v: &Value<'_>) -> Option<Field<Vec<[usize; 2]>>> {
        const EXPECTED: &str = "`windows = [[1, 0], [2, 0], [4, 0]]`: distinct windows `[BEFORE, AFTER]` (the control adds \"none\")";
        let at = self.block.source_offset(v.span().start);
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(v, "a list of windows", EXPECTED);
            return None;
        };
        let windows: Vec<[usize; 2]> =
            items.iter().map(|w| self.window(w).map(|f| f.value)).collect::<Option<_>>()?;
        let repeated = windows.iter().enumerate().any(|(i, w)| windows[..i].contains(w));
        if windows.is_empty() || windows.len() >= MAX_CHOICES || repeated {
            self.wrong(v, &format!("1 to {} distinct windows", MAX_CHOICES - 1), EXPECTED);
            return None;
        }
        Some(Field { value: windows, at })
    }

    /// `slopes = [0, 0.25, 0.5]`: distinct slopes, none negative, at most [`MAX_CHOICES`].
    fn slopes(&mut self, v: &Value<'_>) -> Option<Field<Vec<f64>>> {
        const EXPECTED: &str =
            "`slopes = [0, 0.25, 0.5, 1]`: distinct ALiBi slopes, none negative (0 adds no bias)";
        let at = self.block.source_offset(v.span().start);
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(v, "a list of slopes", EXPECTED);
            return None;
        };
        let slopes: Vec<f64> = items.iter().map(|x| self.scalar(x)).collect::<Option<_>>()?;
        let repeated = slopes.iter().enumerate().any(|(i, s)| slopes[..i].contains(s));
        if slopes.is_empty() || slopes.len() > MAX_CHOICES || repeated || slopes.iter().any(|&s| s < 0.0) {
            self.wrong(v, &format!("1 to {MAX_CHOICES} distinct slopes, none negative"), EXPECTED);
            return None;
        }
        Some(Field { value: slopes, at })
    }

    /// `goal = { largest = "KEY" }`.
    fn goal(&mut self, v: &Value<'_>) -> Option<Goal> {
        const EXPECTED: &str = "`goal = { largest = \"KEY\" }`: met when that key's weight is the largest";
        let DeValue::Table(t) = v.get_ref() else {
            self.wrong(v, "a goal", EXPECTED);
            return None;
        };
        let mut goal = None;
        for (key, value) in t.iter() {
            match key.get_ref().as_ref() {
                "largest" if goal.is_none() => {
                    goal = self.string(value, "the label of a key").map(Goal::Largest);
                }
                name => {
                    let hint =
                        closest(name, GOALS).map(|k| format!(" (did you mean `{k}`?)")).unwrap_or_default();
                    let found = format!("{name} = {}", self.snippet(value));
                    self.problem(key.span().start, format!("unknown goal `{name}`{hint}"), found, EXPECTED);
                }
            }
        }
        if goal.is_none() && t.is_empty() {
            self.wrong(v, "a goal", EXPECTED);
        }
        goal
    }

    fn settings(&mut self, table: &DeTable<'_>) -> Option<Settings> {
        let credit = table.get("credit").and_then(|v| self.credit(v));
        let notebook_repository = table.get("notebook_repository").and_then(|v| {
            let f = self.string(v, "a GitHub folder URL")?;
            if colab_base(&f.value).is_none() {
                self.wrong(
                    v,
                    "the GitHub folder that holds the published site",
                    "`https://github.com/OWNER/REPO/blob/BRANCH/FOLDER` (the folder with the site's `notebooks/`)",
                );
                return None;
            }
            Some(f)
        });
        let summary = table.get("summary").and_then(|v| self.summary(v));
        Some(Settings { credit, notebook_repository, summary })
    }

    /// `summary = "…"`: one line of plain text, which the contents page shows as written.
    fn summary(&mut self, v: &Value<'_>) -> Option<String> {
        const EXPECTED: &str = "one line of plain text of at most 200 characters, such as `summary = \"What a query, a key and a value are.\"`";
        let f = self.string(v, "a one-line summary")?;
        let text = f.value.trim();
        if text.is_empty() || text.contains('\n') || text.chars().count() > 200 {
            self.wrong(v, "a one-line summary", EXPECTED);
            return None;
        }
        if !citation_shapes(text).is_empty() {
            self.wrong(v, "a summary without citations", "plain text: a summary cannot cite numbers");
            return None;
        }
        // The contents page shows it as written: markdown's marks and math would show as typed.
        if let Some(mark) = ['*', '`', '$', '['].into_iter().find(|&c| text.contains(c)) {
            self.wrong(
                v,
                &format!("a summary without markdown (`{mark}` would show as typed on the contents page)"),
                EXPECTED,
            );
            return None;
        }
        Some(text.to_string())
    }

    /// `credit = [1, 0.5, 0.25]`: three numbers from 1 down to 0, never rising.
    fn credit(&mut self, v: &Value<'_>) -> Option<[f64; 3]> {
        const EXPECTED: &str = "three credits from 0 to 1 for a right first, second and third try, never rising, such as `[1, 0.5, 0.25]`";
        let xs = match v.get_ref() {
            DeValue::Array(a) => a.iter().map(|x| self.scalar(x)).collect::<Option<Vec<f64>>>()?,
            _ => {
                self.wrong(v, "a credit schedule", EXPECTED);
                return None;
            }
        };
        match xs.as_slice() {
            &[a, b, c] if (0.0..=1.0).contains(&a) && a > 0.0 && b <= a && c <= b && c >= 0.0 => {
                Some([a, b, c])
            }
            _ => {
                self.wrong(v, "a credit schedule", EXPECTED);
                None
            }
        }
    }
}
