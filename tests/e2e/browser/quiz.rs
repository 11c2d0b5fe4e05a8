//! Every quiz path of issue 8, answered with the real mouse and keyboard: right first (full
//! credit), right later (the schedule's credit), three wrong tries (answer shown, no credit),
//! "Show answer" (no credit, also for a right answer after it), numeric answers inside and outside
//! the tolerance and in every also-accepted form, and an entry that is not a number.

use serde_json::Value;

use super::cdp::{Browser, DESKTOP, ENTER};
use super::dom::{VISIBLE, js};
use super::lesson::{Quiz, Section, lesson};
use super::{launch, screenshot_path};

/// The quizzes issue 8's contract names (section 4).
pub const CHOICE: &str = "key_role";
pub const NUMERIC: &str = "softmax_weight";

/// The root of quiz `id`.
pub fn root(id: &str) -> String {
    format!("[data-qkv-quiz=\"{id}\"]")
}

/// A quiz as the page reports it.
#[derive(Debug, Clone)]
pub struct Shown {
    pub state: String,
    pub credit: String,
    pub tries: String,
    pub outcome: String,
    pub message: String,
    pub answer_visible: bool,
}

/// What a quiz should report after an action.
pub struct Expect<'a> {
    pub state: &'a str,
    pub credit: f64,
    pub tries: u32,
    pub outcome: &'a str,
}

const READ: &str = "((root) => { const f = root.querySelector('[data-qkv-feedback]'), a = root.querySelector('[data-qkv-answer]');
    return { state: root.dataset.qkvState ?? '', credit: root.dataset.qkvCredit ?? '', tries: root.dataset.qkvTries ?? '',
             outcome: f ? f.dataset.qkvOutcome ?? '' : '', message: f ? f.textContent.trim() : '', answer: VISIBLE(a) }; })";

/// Reads quiz `id`.
pub fn read(b: &mut Browser, id: &str) -> Shown {
    let v =
        b.eval(&format!("{}(document.querySelector({}))", READ.replace("VISIBLE", VISIBLE), js(&root(id))));
    let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    Shown {
        state: s("state"),
        credit: s("credit"),
        tries: s("tries"),
        outcome: s("outcome"),
        message: s("message"),
        answer_visible: v["answer"] == Value::Bool(true),
    }
}

/// Waits until quiz `id` reports `expect`, and returns what it shows then. The credit is the
/// contract's decimal string (`1`, `0.5`, `0.25`, `0`); the answer is visible exactly when the
/// quiz is `right` or `revealed`; every outcome comes with a sentence.
pub fn expect(b: &mut Browser, id: &str, expect: Expect<'_>) -> Shown {
    let Expect { state, credit, tries, outcome } = expect;
    let credit = format!("{credit}");
    let read_js = format!("{}(document.querySelector({}))", READ.replace("VISIBLE", VISIBLE), js(&root(id)));
    b.wait_for(
        &format!(
            "(() => {{ const q = {read_js}; return q.state === {} && q.credit === {} && q.tries === '{tries}' && q.outcome === {}; }})()",
            js(state),
            js(&credit),
            js(outcome)
        ),
        &format!("quiz {id} to be {state} with credit {credit}, {tries} wrong tries, outcome {outcome}"),
        &read_js,
    );
    let shown = read(b, id);
    assert!(!shown.message.is_empty(), "quiz {id}: outcome {outcome} has no message");
    let answer_due = matches!(state, "right" | "revealed");
    assert_eq!(shown.answer_visible, answer_due, "quiz {id} ({state}): the answer's visibility");
    shown
}

/// Clicks option `letter` of quiz `id`.
pub fn choose(b: &mut Browser, id: &str, letter: char) {
    b.click(&format!("{} [data-qkv-option=\"{letter}\"]", root(id)));
}

/// Types `text` into quiz `id`'s field and submits it, with Enter or with the submit button.
pub fn enter(b: &mut Browser, id: &str, text: &str, with_enter: bool) {
    b.fill(&format!("{} [data-qkv-input]", root(id)), text);
    if with_enter {
        b.press(ENTER, 0);
    } else {
        b.click(&format!("{} [data-qkv-submit]", root(id)));
    }
}

/// Clicks quiz `id`'s "Show answer".
pub fn show(b: &mut Browser, id: &str) {
    b.click(&format!("{} [data-qkv-show]", root(id)));
}

/// Forgets every answer (as a new learner) and reloads.
pub fn fresh(b: &mut Browser) {
    b.eval("localStorage.clear()");
    b.reload();
}

/// The numeric quiz's key and its tolerance, from the lesson.
pub fn key(section: &Section, quiz: &Quiz) -> (f64, usize, f64) {
    let path = quiz.field("answer").unwrap_or_else(|| panic!("numeric quiz {} has no answer path", quiz.id));
    let key = lesson().number(&section.id, path);
    let digits = quiz.block.get("digits").and_then(toml::Value::as_integer).unwrap_or(3) as usize;
    let tolerance = quiz
        .block
        .get("tolerance")
        .and_then(toml::Value::as_float)
        .unwrap_or(0.5 * 10f64.powi(-(digits as i32)));
    (key, digits, tolerance)
}

/// The near-miss band of a numeric quiz, by the rule of `content/README.md`: its `near_miss`,
/// or two units in the last shown place or 0.5% of the key, whichever is wider, and none around
/// a whole number.
pub fn near(quiz: &Quiz, key: f64, digits: usize) -> f64 {
    let default =
        if key == key.trunc() { 0.0 } else { (2.0 * 10f64.powi(-(digits as i32))).max(0.005 * key.abs()) };
    quiz.block.get("near_miss").and_then(toml::Value::as_float).unwrap_or(default)
}

fn page(section: &Section) -> String {
    format!("{}.html", section.id)
}

#[test]
fn every_quiz_is_upgraded_as_the_contract_says() {
    let Some(mut b) = launch(DESKTOP) else { return };
    // The contract's two quizzes must be there, so that this cannot pass on a lesson without any.
    lesson().quiz(CHOICE);
    lesson().quiz(NUMERIC);
    for section in &lesson().sections {
        b.open(&page(section));
        assert_eq!(
            b.count("[data-qkv-quiz]"),
            section.quizzes.len(),
            "{}: quizzes on the page vs in the lesson",
            section.id
        );
        for quiz in &section.quizzes {
            let (id, r) = (&quiz.id, root(&quiz.id));
            let attr = |b: &mut Browser, name: &str| b.attr(&r, name).unwrap_or_default();
            assert_eq!(attr(&mut b, "id"), format!("quiz-{id}"), "quiz {id}'s element id");
            assert_eq!(attr(&mut b, "data-qkv-kind"), quiz.kind, "quiz {id}'s kind");
            assert_eq!(
                attr(&mut b, "data-qkv-graded"),
                (!quiz.practice).to_string(),
                "quiz {id}: graded or practice"
            );
            let shown = read(&mut b, id);
            assert_eq!(
                (shown.state.as_str(), shown.credit.as_str(), shown.tries.as_str()),
                ("unanswered", "0", "0"),
                "quiz {id} at the start"
            );
            assert!(!shown.answer_visible, "quiz {id}'s answer shows before any try");
            assert_eq!(
                b.count(&format!("{r} script[type=\"application/json\"][data-qkv-key]")),
                1,
                "quiz {id}'s key"
            );
            let feedback = format!("{r} [data-qkv-feedback]");
            assert_eq!(b.attr(&feedback, "role").as_deref(), Some("status"), "quiz {id}'s feedback role");
            assert_eq!(
                b.attr(&feedback, "aria-live").as_deref(),
                Some("polite"),
                "quiz {id}'s feedback aria-live"
            );
            assert_eq!(b.count(&format!("{r} button[data-qkv-show]")), 1, "quiz {id}'s Show answer button");
            match quiz.kind.as_str() {
                "choice" => {
                    let options = quiz.options();
                    assert_eq!(
                        b.count(&format!("{r} button[data-qkv-option]")),
                        options.len(),
                        "quiz {id}'s options"
                    );
                    for (letter, _) in options {
                        let option = format!("{r} button[data-qkv-option=\"{letter}\"]");
                        assert_eq!(
                            b.attr(&option, "aria-pressed").as_deref(),
                            Some("false"),
                            "quiz {id}, option {letter}"
                        );
                    }
                }
                "numeric" => {
                    let input = format!("{r} input[data-qkv-input]");
                    assert_eq!(b.attr(&input, "inputmode").as_deref(), Some("decimal"), "quiz {id}'s field");
                    assert_eq!(
                        b.count(&format!("{r} button[data-qkv-submit]")),
                        1,
                        "quiz {id}'s submit button"
                    );
                }
                "short" => {
                    assert_eq!(b.count(&format!("{r} textarea[data-qkv-input]")), 1, "quiz {id}'s text area")
                }
                other => panic!("quiz {id} has an unknown kind {other}"),
            }
            let hint = format!("{r} button[data-qkv-hint]");
            assert_eq!(
                b.count(&hint),
                usize::from(quiz.has_hint()),
                "quiz {id}: a hint button where the lesson has a hint"
            );
            if quiz.has_hint() {
                let text = format!("{r} [data-qkv-hint-text]");
                assert!(!b.visible(&text), "quiz {id}'s hint shows before it is asked for");
                b.click(&hint);
                b.wait_for(
                    &format!("{VISIBLE}(document.querySelector({}))", js(&text)),
                    &format!("quiz {id}'s hint"),
                    "",
                );
                assert!(!b.text(&text).is_empty(), "quiz {id}'s hint is empty");
                assert_eq!(
                    b.eval(&format!("document.activeElement === document.querySelector({})", js(&text))),
                    Value::Bool(true),
                    "quiz {id}: the disabled hint button hands the focus to its hint, not to <body>"
                );
            }
        }
        b.assert_clean(&format!("{}: every quiz", section.id));
    }
}

#[test]
fn right_on_the_first_try_earns_full_credit() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(CHOICE);
    let (right, _) = quiz.letters();
    b.open(&page(section));
    choose(&mut b, CHOICE, right);
    expect(
        &mut b,
        CHOICE,
        Expect { state: "right", credit: section.credit[0], tries: 0, outcome: "right-first" },
    );
    let option = format!("{} [data-qkv-option=\"{right}\"]", root(CHOICE));
    assert_eq!(
        b.attr(&option, "aria-pressed").as_deref(),
        Some("true"),
        "the chosen option is not marked pressed"
    );
    b.screenshot_of(&root(CHOICE), &screenshot_path("attention-1280-quiz-right"));
    b.assert_clean("right on the first try");
}

#[test]
fn a_later_right_try_earns_the_schedules_credit() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(CHOICE);
    let (right, wrong) = quiz.letters();
    b.open(&page(section));
    // Wrong, then right: the second try's credit; the wrong option's own feedback meanwhile.
    choose(&mut b, CHOICE, wrong[0]);
    let first = expect(&mut b, CHOICE, Expect { state: "wrong", credit: 0.0, tries: 1, outcome: "wrong" });
    choose(&mut b, CHOICE, right);
    expect(
        &mut b,
        CHOICE,
        Expect { state: "right", credit: section.credit[1], tries: 1, outcome: "right-later" },
    );
    // Wrong twice (two different options where there are two), then right: the third try's.
    fresh(&mut b);
    choose(&mut b, CHOICE, wrong[0]);
    expect(&mut b, CHOICE, Expect { state: "wrong", credit: 0.0, tries: 1, outcome: "wrong" });
    let other = wrong.get(1).copied().unwrap_or(wrong[0]);
    choose(&mut b, CHOICE, other);
    let second = expect(&mut b, CHOICE, Expect { state: "wrong", credit: 0.0, tries: 2, outcome: "wrong" });
    if other != wrong[0] {
        assert_ne!(first.message, second.message, "two wrong options of {CHOICE} give the same feedback");
    }
    choose(&mut b, CHOICE, right);
    expect(
        &mut b,
        CHOICE,
        Expect { state: "right", credit: section.credit[2], tries: 2, outcome: "right-later" },
    );
    b.assert_clean("right on a later try");
}

#[test]
fn three_wrong_tries_show_the_answer_and_earn_nothing() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(NUMERIC);
    let (key, digits, tolerance) = key(section, quiz);
    let near = near(quiz, key, digits);
    b.open(&page(section));
    // Beyond the near-miss band, which uses no try.
    let high = format!("{:.*}", digits + 2, key + near + 5.0 * tolerance);
    let low = format!("{:.*}", digits + 2, key - near - 5.0 * tolerance);
    enter(&mut b, NUMERIC, &high, true);
    let too_high =
        expect(&mut b, NUMERIC, Expect { state: "wrong", credit: 0.0, tries: 1, outcome: "wrong" });
    enter(&mut b, NUMERIC, &low, false);
    let too_low = expect(&mut b, NUMERIC, Expect { state: "wrong", credit: 0.0, tries: 2, outcome: "wrong" });
    assert_ne!(too_high.message, too_low.message, "\"too high\" and \"too low\" get the same help");
    enter(&mut b, NUMERIC, &high, true);
    expect(&mut b, NUMERIC, Expect { state: "revealed", credit: 0.0, tries: 3, outcome: "exhausted" });
    let answer = b.text(&format!("{} [data-qkv-answer]", root(NUMERIC)));
    let shown_key = format!("{key:.digits$}");
    assert!(answer.contains(&shown_key), "the revealed answer does not show the key {shown_key}: {answer}");
    // The same quiz, right now: it stays revealed and earns nothing.
    enter(&mut b, NUMERIC, &shown_key, true);
    expect(
        &mut b,
        NUMERIC,
        Expect { state: "revealed", credit: 0.0, tries: 3, outcome: "right-after-shown" },
    );
    b.screenshot_of(&root(NUMERIC), &screenshot_path("attention-1280-quiz-exhausted"));
    b.assert_clean("three wrong tries");
}

#[test]
fn show_answer_forfeits_the_credit_also_for_a_right_answer_after_it() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(CHOICE);
    let (right, _) = quiz.letters();
    b.open(&page(section));
    show(&mut b, CHOICE);
    expect(&mut b, CHOICE, Expect { state: "revealed", credit: 0.0, tries: 0, outcome: "shown" });
    choose(&mut b, CHOICE, right);
    expect(&mut b, CHOICE, Expect { state: "revealed", credit: 0.0, tries: 0, outcome: "right-after-shown" });
    b.assert_clean("show answer");
}

/// The forms a learner may type for `key` shown at `digits` decimals: the key itself, a leading
/// point, a percentage, a decimal comma, spaces around it, and the fraction it reads as.
fn accepted_forms(key: f64, digits: usize) -> Vec<String> {
    let shown = format!("{key:.digits$}");
    let mut forms = vec![shown.clone(), format!("  {shown}  "), shown.replace('.', ",")];
    if let Some(rest) = shown.strip_prefix("0.") {
        forms.push(format!(".{rest}"));
    }
    if digits >= 2 {
        forms.push(format!("{:.*}%", digits - 2, key * 100.0));
    }
    let scale = 10u64.pow(digits as u32);
    forms.push(format!("{}/{scale}", (key * scale as f64).round() as u64));
    forms
}

#[test]
fn numeric_answers_within_the_tolerance_and_in_every_accepted_form_earn_full_credit() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(NUMERIC);
    let (key, digits, tolerance) = key(section, quiz);
    b.open(&page(section));
    let mut inside = accepted_forms(key, digits);
    inside.push(format!("{:.*}", digits + 3, key + 0.9 * tolerance));
    inside.push(format!("{:.*}", digits + 3, key - 0.9 * tolerance));
    for (n, form) in inside.iter().enumerate() {
        fresh(&mut b);
        enter(&mut b, NUMERIC, form, n % 2 == 0);
        b.wait_for(
            &format!("document.querySelector({}).dataset.qkvState !== 'unanswered'", js(&root(NUMERIC))),
            &format!("{form:?} to be graded"),
            "",
        );
        let got = read(&mut b, NUMERIC);
        assert_eq!(
            (got.state.as_str(), got.outcome.as_str()),
            ("right", "right-first"),
            "{form:?} (key {key}, tolerance {tolerance}): {got:?}"
        );
        assert_eq!(got.credit, format!("{}", section.credit[0]), "{form:?} earns full credit");
    }
    // Just outside the tolerance, above and below: a near miss, which uses no try.
    fresh(&mut b);
    for outside in [key + 1.1 * tolerance, key - 1.1 * tolerance] {
        let form = format!("{:.*}", digits + 3, outside);
        enter(&mut b, NUMERIC, &form, true);
        expect(&mut b, NUMERIC, Expect { state: "unanswered", credit: 0.0, tries: 0, outcome: "near-miss" });
    }
    // Just outside the near-miss band: wrong.
    let near = near(quiz, key, digits);
    for (n, outside) in [key + near + 1.1 * tolerance, key - near - 1.1 * tolerance].iter().enumerate() {
        let form = format!("{:.*}", digits + 3, outside);
        enter(&mut b, NUMERIC, &form, true);
        let tries = n as u32 + 1;
        expect(&mut b, NUMERIC, Expect { state: "wrong", credit: 0.0, tries, outcome: "wrong" });
    }
    b.assert_clean("numeric forms and tolerance");
}

#[test]
fn an_entry_that_is_not_a_number_uses_no_try() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, _) = lesson().quiz(NUMERIC);
    b.open(&page(section));
    enter(&mut b, NUMERIC, "about a half", true);
    expect(&mut b, NUMERIC, Expect { state: "unanswered", credit: 0.0, tries: 0, outcome: "invalid" });
    b.assert_clean("an invalid entry");
}

#[test]
fn every_outcome_has_a_sentence_of_its_own() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(CHOICE);
    let (right, wrong) = quiz.letters();
    let (_, numeric) = lesson().quiz(NUMERIC);
    let (key, digits, tolerance) = key(section, numeric);
    let far = format!("{:.*}", digits + 2, key + near(numeric, key, digits) + 5.0 * tolerance);
    b.open(&page(section));
    let mut sentences: Vec<(&str, String)> = Vec::new();
    choose(&mut b, CHOICE, right);
    let e = Expect { state: "right", credit: section.credit[0], tries: 0, outcome: "right-first" };
    sentences.push(("right-first", expect(&mut b, CHOICE, e).message));
    fresh(&mut b);
    choose(&mut b, CHOICE, wrong[0]);
    choose(&mut b, CHOICE, right);
    let e = Expect { state: "right", credit: section.credit[1], tries: 1, outcome: "right-later" };
    sentences.push(("right-later", expect(&mut b, CHOICE, e).message));
    fresh(&mut b);
    show(&mut b, CHOICE);
    sentences.push((
        "shown",
        expect(&mut b, CHOICE, Expect { state: "revealed", credit: 0.0, tries: 0, outcome: "shown" }).message,
    ));
    choose(&mut b, CHOICE, right);
    let e = Expect { state: "revealed", credit: 0.0, tries: 0, outcome: "right-after-shown" };
    sentences.push(("right-after-shown", expect(&mut b, CHOICE, e).message));
    enter(&mut b, NUMERIC, "?", true);
    let e = Expect { state: "unanswered", credit: 0.0, tries: 0, outcome: "invalid" };
    sentences.push(("invalid", expect(&mut b, NUMERIC, e).message));
    for _ in 0..3 {
        enter(&mut b, NUMERIC, &far, true);
    }
    let e = Expect { state: "revealed", credit: 0.0, tries: 3, outcome: "exhausted" };
    sentences.push(("exhausted", expect(&mut b, NUMERIC, e).message));
    for (i, (a, x)) in sentences.iter().enumerate() {
        for (b_, y) in &sentences[..i] {
            assert_ne!(x, y, "outcomes {a} and {b_} show the same message");
        }
    }
    b.assert_clean("every outcome's message");
}
