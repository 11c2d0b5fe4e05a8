//! The blocks the page shows rather than computes: `qkv quiz` (a graded check or a practice
//! problem), `qkv widget` (an interactive figure on an example's numbers) and `qkv settings`
//! (per-section options). Their text fields are markdown citing numbers as `{=PATH:FORMAT}`.

use toml::de::{DeTable, DeValue};

use super::{Field, Reader, Value, closest};
use crate::citation::Text;
use crate::document::first_line;

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
    /// Multiple choice; `correct` is the index of the one right option.
    Choice { options: Vec<QuizOption>, correct: usize },
    /// A number: the value `answer` names, shown at `digits` decimals, accepted within
    /// `tolerance` (default half a unit in the last shown place); `steps` names a computation
    /// whose worked steps go with the answer.
    Numeric { answer: Field<String>, digits: usize, tolerance: Option<f64>, steps: Option<Field<String>> },
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

/// One option of a choice quiz.
#[derive(Debug, Clone)]
pub(crate) struct QuizOption {
    pub text: Text,
    /// What a learner who picks it is told (every wrong option has one).
    pub feedback: Option<Text>,
}

/// The quiz kinds, and the fields only that kind takes.
const QUIZ_KINDS: &[(&str, &[&str])] = &[
    ("choice", &["options"]),
    ("numeric", &["answer", "digits", "tolerance", "steps"]),
    ("short", &["answer_text"]),
];

/// A `qkv widget` block.
#[derive(Debug, Clone)]
pub(crate) struct WidgetDecl {
    pub kind: WidgetKind,
    /// The attention example it shows.
    pub example: Field<String>,
    /// drag-query: the token whose query the handle starts at (and resets to).
    pub query: Option<Field<String>>,
    /// drag-query: what the learner is asked to reach.
    pub goal: Option<Goal>,
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
}

impl WidgetKind {
    /// The names authors write in `kind = "..."`.
    pub(crate) const NAMES: &'static [&'static str] = &["drag-query", "attention-matrix"];
}

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
            _ => self.settings(table).map(PageDecl::Settings),
        }
    }

    /// Markdown text that may cite numbers as `{=PATH:FORMAT}`.
    fn text(&mut self, v: &Value<'_>) -> Option<Text> {
        let field = self.string(v, "markdown text")?;
        let span = v.span();
        let raw = self.block.content.get(span.clone()).unwrap_or("");
        let opens: Vec<usize> =
            raw.match_indices("{=").map(|(i, _)| self.block.source_offset(span.start + i)).collect();
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
        match self.scalar(v)? {
            x if (0.0..=12.0).contains(&x) && x == x.trunc() => Some(x as usize),
            _ => {
                self.wrong(v, "a number of decimals", "a whole number from 0 to 12, such as `3`");
                None
            }
        }
    }

    /// Reports each field of `table` that belongs to another kind than `kind` (in `kinds`).
    fn other_kinds_fields(&mut self, table: &DeTable<'_>, kind: &str, kinds: &[(&str, &[&str])]) {
        for (key, _) in table.iter() {
            let name = key.get_ref().as_ref();
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
        if why.is_none() && table.get("why").is_none() && kind != "short" {
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
        const EXPECTED: &str = "`[[options]]` tables, each with `text`; `correct = true` on the right one and `feedback` on each of the others";
        let Some(v) = table.get("options") else {
            self.problem(0, "a `choice` quiz has no `options`", first_line(&self.block.content), EXPECTED);
            return None;
        };
        let DeValue::Array(items) = v.get_ref() else {
            self.wrong(v, "a list of options", EXPECTED);
            return None;
        };
        let n = self.problems.len();
        let mut options = Vec::new();
        let mut correct: Vec<(usize, usize)> = Vec::new();
        let mut missing_feedback = Vec::new();
        let mut misspelt = false;
        for (i, item) in items.iter().enumerate() {
            let letter = letter(i);
            let DeValue::Table(t) = item.get_ref() else {
                self.wrong(item, "an option", EXPECTED);
                continue;
            };
            // An option with a misspelt field is reported as such, not as missing what it misspelt.
            if self.known_fields(t, &["text", "feedback", "correct"], &format!("option ({letter})")) {
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
            if let Some((key, v)) = t.get_key_value("correct")
                && self.boolean(v) == Some(true)
            {
                correct.push((i, key.span().start));
                if let Some(f) = t.get("feedback") {
                    let found = self.snippet(f);
                    self.problem(
                        f.span().start,
                        format!(
                            "option ({letter}) is the right one, and its `feedback` would never be shown"
                        ),
                        found,
                        "the explanation in the quiz's `why`, and no `feedback` on the right option",
                    );
                }
            } else if t.get("feedback").is_none() {
                missing_feedback.push((letter, t.get("text").map_or(item.span().start, |v| v.span().start)));
            }
            options.extend(text.map(|text| QuizOption { text, feedback }));
        }
        if items.len() > MAX_OPTIONS || items.len() < 2 {
            self.wrong(v, "between 2 and 26 options", EXPECTED);
        }
        match correct.as_slice() {
            [] if misspelt => {}
            [] => self.problem(
                v.span().start,
                "no option is marked right",
                first_line(self.block.content.get(v.span()).unwrap_or("")),
                "`correct = true` on exactly one option",
            ),
            [_] => {}
            [(first, _), rest @ ..] => {
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
        for (letter, at) in missing_feedback {
            self.problem(
                at,
                format!("option ({letter}) is wrong but has no `feedback`"),
                first_line(self.block.content.get(at..).unwrap_or("")),
                "`feedback = \"...\"`: what a learner who picks it should hear (why it is not the answer)",
            );
        }
        if self.problems.len() > n {
            return None;
        }
        Some(QuizKey::Choice { options, correct: correct[0].0 })
    }

    fn numeric(&mut self, table: &DeTable<'_>) -> Option<QuizKey> {
        let answer =
            self.required(table, "answer", |r, v| r.string(v, "the path of the number that is the key"));
        let digits = self.required(table, "digits", Self::digits);
        let tolerance = table.get("tolerance").and_then(|v| {
            let t = self.number(v)?;
            if t.value > 0.0 {
                Some(t.value)
            } else {
                self.wrong(v, "a positive tolerance", "a number above 0, such as `0.001`");
                None
            }
        });
        let steps =
            table.get("steps").and_then(|v| self.string(v, "the computation whose steps go with the answer"));
        Some(QuizKey::Numeric { answer: answer?, digits: digits?, tolerance, steps })
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
        let kind = self.kind_name(table, "widget kind", WidgetKind::NAMES).map(|name| match name {
            "drag-query" => WidgetKind::DragQuery,
            _ => WidgetKind::AttentionMatrix,
        });
        let example = self.required(table, "example", |r, v| r.string(v, "the id of an attention example"));
        let prompt = self.required(table, "prompt", Self::text);
        let digits =
            table.get("digits").and_then(|v| self.digits(v)).unwrap_or(crate::region::DEFAULT_DIGITS);
        let query = table.get("query").and_then(|v| self.string(v, "a token of the example"));
        let goal = table.get("goal").and_then(|v| self.goal(v));
        let kind = kind?;
        match kind {
            WidgetKind::DragQuery if table.get("query").is_none() => self.problem(
                0,
                "a `drag-query` widget has no `query`",
                first_line(&self.block.content),
                "`query = \"TOKEN\"`: the query the handle starts at",
            ),
            WidgetKind::AttentionMatrix => {
                for name in ["query", "goal"] {
                    if let Some((key, _)) = table.get_key_value(name) {
                        self.problem(
                            key.span().start,
                            format!("`{name}` is for `drag-query` widgets; an `attention-matrix` shows every query"),
                            first_line(self.block.content.get(key.span().start..).unwrap_or("")),
                            format!("an `attention-matrix` widget without `{name}`"),
                        );
                    }
                }
            }
            WidgetKind::DragQuery => {}
        }
        Some(WidgetDecl { kind, example: example?, query, goal, prompt: prompt?, digits })
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
        Some(Settings { credit, notebook_repository })
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
