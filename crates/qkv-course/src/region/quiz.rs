//! `quiz ID`: a graded check or a practice problem, declared by a `qkv quiz` block of the same
//! file. The markdown shows it as it reads on a forge (the question, lettered options, the answer
//! behind `<details>`); the page gets the same content marked with `data-qkv-*` attributes and a
//! JSON key, which the page script turns into buttons, inputs, tries and credit.
//!
//! Graded checks are numbered 1, 2, … and practice problems P1, P2, … in the order their
//! regions appear; the first graded check of a file carries the file's progress indicator.

use std::fmt::Write;

use serde_json::json;

use super::{Context, Generated, Kind, steps};
use crate::citation::Text;
use crate::document::Region;
use crate::error::Problem;
use crate::examples::{ChoiceKey, Decl, DeclKind, PageDecl, QuizDecl, QuizKey, QuizOption, Settings, letter};
use crate::format::DEFAULT_DIGITS;
use crate::format::Format;
use crate::markup::{escape, fragment, inline_markdown, json_script};
use crate::values::Resolve;

pub(super) const KIND: Kind = Kind { name: "quiz", usage: "`quiz ID`", options: &[], generate };

fn generate(cx: &mut Context<'_, '_>) -> Result<Generated, Problem> {
    let id = cx.target(KIND.usage)?;
    let quiz = cx.page_block(id, "quiz", |p| match p {
        PageDecl::Quiz(q) => Some(q.as_ref()),
        _ => None,
    })?;
    let place = place(cx);
    let filled = Filled::new(cx, quiz)?;
    let credit = cx.settings().credit.unwrap_or(Settings::CREDIT);
    let key = key_json(cx, quiz, &filled, credit)?;
    let section = &cx.sections[cx.doc];
    let body = forge_view(&place.label, &filled);
    let mut html = String::new();
    if let Some(total) = place.progress {
        html.push_str(&progress(section, total));
    }
    html.push_str(&page_view(id, section, quiz, &place.label, &filled, &key));
    Ok(Generated { html: Some(html), ..cx.markdown(body) })
}

/// Where a quiz sits among its file's quizzes.
struct Place {
    /// `7` for the seventh graded check, `P2` for the second practice problem.
    label: String,
    /// The number of graded checks in the file, when this is the first of them.
    progress: Option<usize>,
}

/// Numbers the region at `cx.at` among the quiz regions of its file.
fn place(cx: &Context<'_, '_>) -> Place {
    let (mut graded, mut practice, mut before, mut total) = (0, 0, None, 0);
    let mut label = String::new();
    for r in cx.regions.iter().filter(|r| r.directive.first().is_some_and(|k| k == "quiz")) {
        let is_practice = match r.directive.get(1).and_then(|id| cx.page_decl(id)) {
            Some(PageDecl::Quiz(q)) => q.practice,
            _ => continue,
        };
        if is_practice {
            practice += 1;
        } else {
            graded += 1;
            total += 1;
            before.get_or_insert(r.start);
        }
        if r.start == cx.at {
            label = if is_practice { format!("P{practice}") } else { graded.to_string() };
        }
    }
    Place { label, progress: (before == Some(cx.at)).then_some(total) }
}

/// The ids of file `doc`'s graded checks, in the order their regions appear (as [`place`]
/// numbers them), for the site's progress across the course.
pub(crate) fn graded_checks(decls: &[Decl], doc: usize, regions: &[Region]) -> Vec<String> {
    regions
        .iter()
        .filter(|r| r.directive.first().is_some_and(|k| k == "quiz"))
        .filter_map(|r| r.directive.get(1))
        .filter(|id| {
            decls.iter().any(|d| {
                d.doc == doc
                    && &d.id == *id
                    && matches!(&d.kind, DeclKind::Page(p) if matches!(p.as_ref(), PageDecl::Quiz(q) if !q.practice))
            })
        })
        .cloned()
        .collect()
}

/// A quiz's text with every `{=PATH:FORMAT}` replaced, and its key worked out.
struct Filled {
    question: String,
    hint: Option<String>,
    why: Option<String>,
    answer: Answer,
}

/// The key, as the learner is shown it.
enum Answer {
    /// Options as markdown with their feedback; `correct` is the right one's index; `shuffle`
    /// asks the page for the learner's own order.
    Choice { options: Vec<(String, Option<String>)>, correct: usize, shuffle: bool },
    /// The key's value, as shown, the forms also accepted, the tolerance, and the worked steps.
    Numeric {
        value: f64,
        shown: String,
        also: Vec<String>,
        tolerance: f64,
        /// The near-miss band, wider than the tolerance, or 0 for none.
        near: f64,
        steps: Option<String>,
        percent: bool,
        /// A percentage reads as the key (it is shown as one, or is a share of a whole).
        share: bool,
    },
    /// The model answer.
    Short(String),
}

impl Filled {
    fn new(cx: &mut Context<'_, '_>, quiz: &QuizDecl) -> Result<Self, Problem> {
        let doc = cx.doc;
        let right = match &quiz.key {
            QuizKey::Choice { options, correct, .. } => {
                if let (ChoiceKey::Extreme { path, .. }, Some(why)) = (correct, &quiz.why) {
                    why_names_no_item(cx, why, &path.value, options)?;
                }
                Some(right_option(cx, options, correct)?)
            }
            _ => None,
        };
        let mut fill = |t: &Text| t.fill(cx.eval, doc);
        let question = fill(&quiz.question)?;
        let hint = quiz.hint.as_ref().map(&mut fill).transpose()?;
        let mut why = quiz.why.as_ref().map(&mut fill).transpose()?;
        let answer = match &quiz.key {
            QuizKey::Choice { options, shuffle, .. } => {
                let correct = right.unwrap_or_default();
                // A computed key's right option may bring its own reason.
                if let Some(own) = &options[correct].why {
                    why = Some(fill(own)?);
                }
                choice_answer(&mut fill, options, correct, *shuffle)?
            }
            QuizKey::Short { answer_text } => Answer::Short(fill(answer_text)?),
            QuizKey::Numeric { answer, digits, tolerance, steps, percent, share, near_miss } => {
                let value = cx.eval.number(cx.doc, &answer.value, answer.at)?;
                if let Some(s) = share.as_ref().filter(|s| s.value && !(0.0..=1.0).contains(&value)) {
                    return Err(Problem::new(
                        doc,
                        s.at,
                        format!(
                            "`share = true` on a key of {value}: a share of a whole lies between 0 and 1"
                        ),
                        "share = true",
                        "`share = true` only on a weight, a probability or another share of a whole; no `share` here",
                    ));
                }
                if let Some(s) = share.as_ref().filter(|s| !s.value && *percent) {
                    return Err(Problem::new(
                        doc,
                        s.at,
                        "`share = false` on a key shown as a percentage: the page reads a percentage as its answer",
                        "share = false",
                        "no `share` beside `percent = true`",
                    ));
                }
                let format = Format { percent: *percent, ..Format::decimals(*digits) };
                let shown = format.apply(value);
                // The shown key's value, and half a unit in its last place, in the key's units.
                let unit = if *percent { 0.01 } else { 1.0 };
                let shown_value = shown.trim_end_matches('%').parse::<f64>().map(|s| s * unit);
                let tolerance = match tolerance {
                    None => 0.5 * 10f64.powi(-(*digits as i32)) * unit,
                    // The page must accept the key it prints.
                    Some(t) => {
                        let off = shown_value.map_or(0.0, |s| (s - value).abs());
                        if t.value < off {
                            return Err(Problem::new(
                                doc,
                                t.at,
                                format!(
                                    "a tolerance of {} is tighter than the shown key: {shown} is {} from the value {value}, so the page would reject the answer it prints",
                                    t.value,
                                    crate::format::shortest(off, 0)
                                ),
                                format!("tolerance = {}", t.value),
                                format!(
                                    "a tolerance of at least {} (or more `digits`)",
                                    crate::format::shortest(off, 0)
                                ),
                            ));
                        }
                        t.value
                    }
                };
                let whole = !*percent && value == value.trunc();
                if let Some(n) = near_miss.as_ref().filter(|n| whole && n.value >= 1.0) {
                    return Err(Problem::new(
                        doc,
                        n.at,
                        format!(
                            "a near-miss band of {} around the whole number {shown} would take an off-by-one answer ({} or {}) for a rounding slip and use no try",
                            n.value,
                            value - 1.0,
                            value + 1.0
                        ),
                        format!("near_miss = {}", n.value),
                        "no `near_miss` (a whole-number key has no band), or one below 1",
                    ));
                }
                let declared = near_miss.as_ref().map(|n| n.value);
                let near = near_band(value, *digits, unit, tolerance, declared, whole);
                let steps = match steps {
                    Some(s) => Some(steps::worked(cx, &s.value, DEFAULT_DIGITS).map_err(|p| Problem {
                        at: s.at,
                        found: s.value.clone(),
                        ..p
                    })?),
                    None => None,
                };
                Answer::Numeric {
                    also: if *percent {
                        percent_forms(&shown, value)
                    } else {
                        also_accepted(&shown, value, *digits, share.as_ref().is_some_and(|s| s.value))
                    },
                    percent: *percent,
                    share: *percent || share.as_ref().is_some_and(|s| s.value),
                    value,
                    shown,
                    tolerance,
                    near,
                    steps,
                }
            }
        };
        Ok(Filled { question, hint, why, answer })
    }
}

/// How far from the key an answer is a near miss, an answer off only because the learner
/// rounded intermediate steps to the shown precision: the declared `near_miss`, or by default
/// two units in the last shown place or 0.5% of the key, whichever is wider (0.002 around 0.731,
/// 0.021 around 4.243, 0.039 around 7.85). A `whole` key (a count, a dot product of whole
/// numbers) has no default band: nothing was rounded, so 3 for 4 is an off-by-one, a wrong try
/// that says "too low". A band no wider than the tolerance is none (0).
fn near_band(
    value: f64,
    digits: usize,
    unit: f64,
    tolerance: f64,
    declared: Option<f64>,
    whole: bool,
) -> f64 {
    let band = declared.unwrap_or_else(|| {
        if whole { 0.0 } else { (2.0 * 10f64.powi(-(digits as i32)) * unit).max(0.005 * value.abs()) }
    });
    if band > tolerance { band } else { 0.0 }
}

/// The options filled in, and which is right.
fn choice_answer(
    fill: &mut impl FnMut(&Text) -> Result<String, Problem>,
    options: &[QuizOption],
    correct: usize,
    shuffle: bool,
) -> Result<Answer, Problem> {
    let options = options
        .iter()
        .map(|o| Ok((fill(&o.text)?, o.feedback.as_ref().map(&mut *fill).transpose()?)))
        .collect::<Result<_, Problem>>()?;
    Ok(Answer::Choice { options, correct, shuffle })
}

/// Which option is right at this build: the marked one, or the one the computation picks. A
/// computed key that picks none, or more than one, is an error at the key: the page would
/// otherwise grade against a stale answer.
fn right_option(cx: &mut Context<'_, '_>, options: &[QuizOption], key: &ChoiceKey) -> Result<usize, Problem> {
    let doc = cx.doc;
    match key {
        ChoiceKey::Fixed(i) => Ok(*i),
        ChoiceKey::Extreme { path, largest } => {
            let at = path.at;
            let list = cx.eval.resolve(doc, &path.value).map_err(|expected| {
                Problem::new(
                    doc,
                    at,
                    format!("unknown reference `{}`", path.value),
                    path.value.clone(),
                    expected,
                )
            })?;
            let items = list.numbers().filter(|items| !items.is_empty()).ok_or_else(|| {
                Problem::new(
                    doc,
                    at,
                    format!("`{}` is not a list of numbers", path.value),
                    path.value.clone(),
                    "a path to a list of numbers, such as `sentence.love.weights`",
                )
            })?;
            if !*largest {
                hidden_pick(cx, &path.value, at, &items)?;
            }
            let mut ranked = items.clone();
            ranked.sort_by(|a, b| if *largest { b.1.total_cmp(&a.1) } else { a.1.total_cmp(&b.1) });
            let (best, value) = &ranked[0];
            let which = if *largest { "largest" } else { "smallest" };
            if let Some((tied, _)) = ranked.get(1).filter(|(_, x)| x == value) {
                return Err(Problem::new(
                    doc,
                    at,
                    format!(
                        "`{best}` and `{tied}` tie for the {which} number of `{}` ({value}): no option is the right one",
                        path.value
                    ),
                    path.value.clone(),
                    format!("inputs under which one item is strictly the {which}, or a fixed key"),
                ));
            }
            let named: Vec<&str> =
                options.iter().filter_map(|o| o.item.as_ref().map(|i| i.value.as_str())).collect();
            for o in options {
                if let Some(item) = &o.item
                    && !items.iter().any(|(label, _)| label == &item.value)
                {
                    let labels: Vec<&str> = items.iter().map(|(l, _)| l.as_str()).collect();
                    return Err(Problem::new(
                        doc,
                        item.at,
                        format!("`{}` is not an item of `{}`", item.value, path.value),
                        item.value.clone(),
                        format!("one of {}", labels.join(", ")),
                    ));
                }
            }
            named.iter().position(|n| n == best).ok_or_else(|| {
                Problem::new(
                    doc,
                    at,
                    format!(
                        "the {which} number of `{}` is `{best}`'s ({value}), which no option names",
                        path.value
                    ),
                    path.value.clone(),
                    format!("an option with `item = \"{best}\"`"),
                )
            })
        }
        ChoiceKey::When => {
            let mut holding = Vec::new();
            for (i, o) in options.iter().enumerate() {
                let Some(when) = &o.when else { continue };
                if cx.eval.compare(doc, when)?.0 {
                    holding.push(i);
                }
            }
            let (at, first_when) = options
                .iter()
                .find_map(|o| o.when.as_ref().map(|w| (w.at, format!("when = \"{}\"", w.value.written))))
                .unwrap_or_default();
            let letters: Vec<String> = holding.iter().map(|&i| format!("({})", letter(i))).collect();
            match holding.as_slice() {
                [one] => Ok(*one),
                [] => Err(Problem::new(
                    doc,
                    at,
                    "no option's `when` holds at these inputs, so no option is the right one",
                    first_when.clone(),
                    "conditions of which exactly one holds (an input may have changed)",
                )),
                _ => Err(Problem::new(
                    doc,
                    at,
                    format!(
                        "the conditions of options {} {} hold at these inputs, so the key is ambiguous",
                        letters.join(" and "),
                        if letters.len() == 2 { "both" } else { "all" }
                    ),
                    first_when,
                    "conditions of which exactly one holds (an input may have changed)",
                )),
            }
        }
    }
}

/// A quiz-level `why` of a computed key may not cite one item of the key's list
/// (`sentence.love.weights.NLP` beside `largest = "sentence.love.weights"`): it is shown with
/// whichever option is right, so when an input moves the key to another item it would explain the
/// old one. What is said about one item belongs in that option's own `why`. When every option has
/// its own, the quiz-level one is never shown and may say anything.
fn why_names_no_item(
    cx: &mut Context<'_, '_>,
    why: &Text,
    list: &str,
    options: &[QuizOption],
) -> Result<(), Problem> {
    if options.iter().all(|o| o.why.is_some()) {
        return Ok(());
    }
    let doc = cx.doc;
    let Ok(items) = cx.eval.resolve(doc, list) else { return Ok(()) };
    let labels = items.children();
    for (cited, at) in why.cited() {
        let Some(item) = cited.strip_prefix(list).and_then(|rest| rest.strip_prefix('.')) else { continue };
        let item = item.split('.').next().unwrap_or(item);
        let named = labels.iter().position(|l| l == item).or_else(|| {
            item.parse::<usize>().ok().and_then(|p| p.checked_sub(1)).filter(|&p| p < labels.len())
        });
        if let Some(i) = named {
            return Err(Problem::new(
                doc,
                at,
                format!(
                    "the quiz's `why` cites `{cited}`, item `{}` of the computed key `{list}`: once an input moves the key to another item, this reason would be shown with that one",
                    labels[i]
                ),
                cited,
                "what is said of one item in the `why` of the option that names it (shown when that option is right), and a quiz-level `why` that cites no single item",
            ));
        }
    }
    Ok(())
}

/// A `smallest` key must not pick a key that the example's masks hide: its weight is 0 and its
/// score `-inf` only because it is hidden, which is no answer to "which key does it weigh
/// least?". A list of scores says so itself (`-inf`); for the other lists of a query's trace
/// (`weights`, `exp`, `shifted`, `bias`), the `scores` beside them tell.
fn hidden_pick(
    cx: &mut Context<'_, '_>,
    path: &str,
    at: usize,
    items: &[(String, f64)],
) -> Result<(), Problem> {
    let doc = cx.doc;
    let segments: Vec<&str> = path.split('.').collect();
    let mut scores: Option<Vec<(String, f64)>> = None;
    if let Some(i) =
        segments.iter().rposition(|s| ["weights", "exp", "shifted", "bias", "scores"].contains(s))
    {
        let mut beside = segments.clone();
        beside[i] = "scores";
        scores = cx.eval.resolve(doc, &beside.join(".")).ok().and_then(|n| n.numbers());
    }
    let hidden: Vec<&str> = items
        .iter()
        .enumerate()
        .filter(|(i, (label, x))| {
            *x == f64::NEG_INFINITY
                || scores.as_ref().is_some_and(|s| {
                    s.len() == items.len() && s[*i].0 == *label && s[*i].1 == f64::NEG_INFINITY
                })
        })
        .map(|(_, (label, _))| label.as_str())
        .collect();
    if hidden.is_empty() {
        return Ok(());
    }
    let least =
        items.iter().min_by(|a, b| a.1.total_cmp(&b.1)).map(|(label, _)| label.as_str()).unwrap_or_default();
    if !hidden.contains(&least) {
        return Ok(());
    }
    Err(Problem::new(
        doc,
        at,
        format!(
            "the smallest number of `{path}` is `{least}`'s, but the mask hides key `{least}`: the key would be a key the query cannot see, not the one it weighs least among those it sees"
        ),
        path,
        "a list whose keys the query all sees (a query without masked keys), or a `largest` key",
    ))
}

/// The other ways of writing `shown` (the key at `digits` decimals) that the page accepts, to
/// list with the answer: a percentage only for a `share` of a whole.
fn also_accepted(shown: &str, value: f64, digits: usize, share: bool) -> Vec<String> {
    let mut forms = Vec::new();
    if let Some(rest) = shown.strip_prefix("0.") {
        forms.push(format!(".{rest}"));
    }
    if share && value > 0.0 && value < 1.0 {
        let percent = Format { percent: true, ..Format::decimals(digits.saturating_sub(2)) };
        forms.push(percent.apply(value));
    }
    if shown.contains('.') {
        forms.push(shown.replace('.', ","));
    }
    if value != value.trunc()
        && let Some((a, b)) = (2..=12).find_map(|b: i64| {
            let a = (value * b as f64).round();
            ((a / b as f64 - value).abs() < 1e-12).then_some((a as i64, b))
        })
    {
        forms.push(format!("{a}/{b}"));
    }
    forms
}

/// The other ways of writing a key shown as a percentage (`73.1%`): without the sign (read as a
/// percentage), with a decimal comma, and as the fraction at as many significant places.
fn percent_forms(shown: &str, value: f64) -> Vec<String> {
    let bare = shown.trim_end_matches('%');
    let mut forms = vec![bare.to_string()];
    if bare.contains('.') {
        forms.push(format!("{}%", bare.replace('.', ",")));
    }
    let decimals = bare.split_once('.').map_or(0, |(_, d)| d.len()) + 2;
    forms.push(Format::decimals(decimals).apply(value));
    forms
}

/// What the page script needs to grade the quiz.
fn key_json(
    cx: &Context<'_, '_>,
    quiz: &QuizDecl,
    filled: &Filled,
    credit: [f64; 3],
) -> Result<serde_json::Value, Problem> {
    let graded = !quiz.practice;
    Ok(match &filled.answer {
        Answer::Choice { correct, shuffle, .. } => {
            let mut key = json!({
                "kind": "choice", "graded": graded, "credit": credit, "correct": letter(*correct).to_string(),
            });
            if *shuffle {
                key["shuffle"] = json!(true);
            }
            key
        }
        Answer::Numeric { value, shown, tolerance, near, percent, share, .. } => {
            let mut key = json!({
                "kind": "numeric", "graded": graded, "credit": credit,
                "value": value, "shown": shown, "tolerance": tolerance, "near": near,
            });
            if *percent {
                key["percent"] = json!(true);
            }
            if *share {
                key["share"] = json!(true);
            }
            key
        }
        Answer::Short(_) if graded => {
            // The block reader rejects a graded short answer; say so again rather than grade one.
            return Err(cx.problem("a short-answer quiz cannot be graded", "`practice = true`"));
        }
        Answer::Short(_) => json!({ "kind": "short", "graded": false }),
    })
}

/// The feedback of each option but the right one, with its index. A computed key's right option
/// has feedback too (it may be wrong after an input changes), which must not be listed as
/// "Not (c)" beside the key "(c)".
fn wrong_feedback(
    options: &[(String, Option<String>)],
    correct: usize,
) -> impl Iterator<Item = (usize, &str)> {
    options
        .iter()
        .enumerate()
        .filter(move |(i, _)| *i != correct)
        .filter_map(|(i, (_, feedback))| Some((i, feedback.as_deref()?)))
}

/// Text for a one-line markdown context (a list item, a bold question): no line breaks.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The quiz as markdown: what a forge shows, and what `--check` compares.
fn forge_view(label: &str, f: &Filled) -> String {
    let mut out = format!("**{label}.** {}\n", one_line(&f.question));
    if let Answer::Choice { options, .. } = &f.answer {
        out.push('\n');
        for (i, (text, _)) in options.iter().enumerate() {
            let _ = writeln!(out, "- **({})** {}", letter(i), one_line(text));
        }
    }
    if let Some(hint) = &f.hint {
        let _ = write!(out, "\n<details><summary>Hint</summary>\n\n{}\n\n</details>\n", hint.trim());
    }
    let summary = if matches!(f.answer, Answer::Short(_)) { "A model answer" } else { "Answer" };
    let _ = write!(out, "\n<details><summary>{summary}</summary>\n\n");
    match &f.answer {
        Answer::Choice { options, correct, .. } => {
            let _ = writeln!(out, "**({})** {}\n", letter(*correct), one_line(&options[*correct].0));
        }
        Answer::Numeric { shown, also, .. } => {
            let _ = write!(out, "**{shown}**");
            if !also.is_empty() {
                let _ = write!(out, " (also accepted: {})", also.join(", "));
            }
            out.push_str("\n\n");
        }
        Answer::Short(text) => {
            let _ = writeln!(out, "{}\n", text.trim());
        }
    }
    if let Some(why) = &f.why {
        let _ = writeln!(out, "{}\n", why.trim());
    }
    if let Answer::Numeric { steps: Some(steps), .. } = &f.answer {
        let _ = writeln!(out, "{}", steps.trim_end());
        out.push('\n');
    }
    if let Answer::Choice { options, correct, .. } = &f.answer {
        for (i, feedback) in wrong_feedback(options, *correct) {
            let _ = writeln!(out, "- Not ({}): {}", letter(i), one_line(feedback));
        }
        out.push('\n');
    }
    out.push_str("</details>\n");
    out
}

/// The progress indicator of a file's graded checks (hidden until the page script fills it).
fn progress(section: &str, total: usize) -> String {
    format!(
        "<div class=\"progress\" data-qkv-progress data-qkv-section=\"{0}\" data-qkv-answered=\"0\" data-qkv-total=\"{total}\" data-qkv-score=\"0\" hidden>\n<p><strong>Your progress</strong> <span data-qkv-progress-text>0 of {total} {1} answered</span></p>\n<progress max=\"{total}\" value=\"0\"></progress>\n<button type=\"button\" data-qkv-reset>Reset progress</button>\n</div>\n",
        escape(section),
        if total == 1 { "check" } else { "checks" }
    )
}

/// The quiz as the page has it: complete without script, marked for the script.
fn page_view(
    id: &str,
    section: &str,
    quiz: &QuizDecl,
    label: &str,
    f: &Filled,
    key: &serde_json::Value,
) -> String {
    let mut out = format!(
        "<section class=\"quiz{}\" id=\"quiz-{1}\" data-qkv-quiz=\"{1}\" data-qkv-kind=\"{2}\" data-qkv-graded=\"{3}\" data-qkv-section=\"{4}\" data-qkv-state=\"unanswered\" data-qkv-credit=\"0\" data-qkv-tries=\"0\">\n",
        if quiz.practice { " practice" } else { "" },
        escape(id),
        quiz.key.name(),
        !quiz.practice,
        escape(section),
    );
    out.push_str(&json_script("data-qkv-key", key));
    let _ = writeln!(
        out,
        "<div class=\"quiz-question\"><span class=\"quiz-number\">{}.</span> {}</div>",
        escape(label),
        inline_markdown(&f.question)
    );
    if let Answer::Choice { options, .. } = &f.answer {
        out.push_str("<ol class=\"quiz-options\">\n");
        for (i, (text, _)) in options.iter().enumerate() {
            let _ = writeln!(
                out,
                "<li data-qkv-choice=\"{0}\"><span class=\"quiz-letter\">({0})</span> <span class=\"quiz-option-text\">{1}</span></li>",
                letter(i),
                inline_markdown(text)
            );
        }
        out.push_str("</ol>\n");
    }
    if let Some(hint) = &f.hint {
        let _ = writeln!(
            out,
            "<details class=\"quiz-hint\"><summary>Hint</summary><div data-qkv-hint-text>{}</div></details>",
            fragment(hint)
        );
    }
    let summary = if matches!(f.answer, Answer::Short(_)) { "A model answer" } else { "Answer" };
    let _ =
        writeln!(out, "<details class=\"quiz-answer\"><summary>{summary}</summary>\n<div data-qkv-answer>");
    match &f.answer {
        Answer::Choice { options, correct, .. } => {
            let _ = writeln!(
                out,
                "<p class=\"quiz-key\"><span class=\"quiz-letter\">({})</span> {}</p>",
                letter(*correct),
                inline_markdown(&options[*correct].0)
            );
        }
        Answer::Numeric { shown, also, .. } => {
            let _ = write!(out, "<p class=\"quiz-key\"><strong>{}</strong>", escape(shown));
            if !also.is_empty() {
                let _ = write!(
                    out,
                    " <span class=\"quiz-also\">(also accepted: {})</span>",
                    escape(&also.join(", "))
                );
            }
            out.push_str("</p>\n");
        }
        Answer::Short(text) => out.push_str(&fragment(text)),
    }
    if let Some(why) = &f.why {
        let _ = writeln!(out, "<div class=\"quiz-why\">{}</div>", fragment(why));
    }
    if let Answer::Numeric { steps: Some(steps), .. } = &f.answer {
        let _ = writeln!(out, "<div class=\"quiz-steps\">{}</div>", fragment(steps));
    }
    if let Answer::Choice { options, correct, .. } = &f.answer {
        out.push_str("<ul class=\"quiz-feedback\">\n");
        for (i, feedback) in wrong_feedback(options, *correct) {
            let _ = writeln!(
                out,
                "<li data-qkv-feedback-for=\"{0}\"><strong>Not ({0}):</strong> <span data-qkv-feedback-text>{1}</span></li>",
                letter(i),
                inline_markdown(feedback)
            );
        }
        out.push_str("</ul>\n");
    }
    out.push_str("</div>\n</details>\n</section>\n");
    out
}

#[cfg(test)]
mod tests;
