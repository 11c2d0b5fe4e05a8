//! Progress: the indicator counts graded checks only, is kept in `localStorage` under
//! `qkv-progress` across a reload, and "Reset progress" clears the section once confirmed.

use serde_json::Value;

use super::cdp::{Browser, DESKTOP};
use super::dom::js;
use super::lesson::{Section, lesson};
use super::quiz::{CHOICE, Expect, NUMERIC, choose, enter, expect, read, root, show};
use super::{launch, screenshot_path};

const PROGRESS: &str = "[data-qkv-progress]";

/// (answered, total, score) as the indicator reports them.
fn progress(b: &mut Browser) -> (String, String, String) {
    let a = |b: &mut Browser, n: &str| b.attr(PROGRESS, n).unwrap_or_default();
    (a(b, "data-qkv-answered"), a(b, "data-qkv-total"), a(b, "data-qkv-score"))
}

fn wait_for_progress(b: &mut Browser, answered: usize, score: f64) {
    b.wait_for(
        &format!(
            "(() => {{ const p = document.querySelector({}); return p.dataset.qkvAnswered === '{answered}' && p.dataset.qkvScore === '{score}'; }})()",
            js(PROGRESS)
        ),
        &format!("progress to read {answered} answered, score {score}"),
        &format!("JSON.stringify(document.querySelector({}).dataset)", js(PROGRESS)),
    );
}

fn stored(b: &mut Browser) -> Value {
    let text = b.eval("localStorage.getItem('qkv-progress')");
    text.as_str().map(|t| serde_json::from_str(t).expect("qkv-progress holds JSON")).unwrap_or(Value::Null)
}

fn graded(section: &Section) -> usize {
    section.quizzes.iter().filter(|q| !q.practice).count()
}

/// The first practice problem of `section` that can be answered right with one click or entry.
fn practice(section: &Section) -> Option<(&str, char)> {
    section.quizzes.iter().find(|q| q.practice && q.kind == "choice").map(|q| (q.id.as_str(), q.letters().0))
}

#[test]
fn the_indicator_counts_graded_checks_only() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(CHOICE);
    let (right, _) = quiz.letters();
    b.open(&format!("{}.html", section.id));
    assert_eq!(
        b.attr(PROGRESS, "data-qkv-section").as_deref(),
        Some(section.id.as_str()),
        "the indicator's section"
    );
    assert_eq!(
        progress(&mut b),
        ("0".into(), graded(section).to_string(), "0".into()),
        "progress at the start"
    );
    choose(&mut b, CHOICE, right);
    wait_for_progress(&mut b, 1, section.credit[0]);
    // A wrong try is not an answer yet; showing the answer is, with no credit.
    enter(&mut b, NUMERIC, "12345", true);
    expect(&mut b, NUMERIC, Expect { state: "wrong", credit: 0.0, tries: 1, outcome: "wrong" });
    wait_for_progress(&mut b, 1, section.credit[0]);
    show(&mut b, NUMERIC);
    wait_for_progress(&mut b, 2, section.credit[0]);
    if let Some((id, letter)) = practice(section) {
        choose(&mut b, id, letter);
        b.wait_for(
            &format!("document.querySelector({}).dataset.qkvState === 'right'", js(&root(id))),
            "the practice problem",
            "",
        );
        assert_eq!(progress(&mut b).0, "2", "a practice problem counted");
        let entry = &stored(&mut b)[&section.id][id];
        assert!(
            entry["credit"].as_f64().unwrap_or(0.0) == 0.0,
            "practice problem {id} stored as credit: {entry}"
        );
    }
    b.screenshot_of(PROGRESS, &screenshot_path("attention-1280-progress"));
    b.assert_clean("the progress indicator");
}

#[test]
fn a_reload_keeps_progress_and_reset_clears_it() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(CHOICE);
    let (right, _) = quiz.letters();
    b.open(&format!("{}.html", section.id));
    choose(&mut b, CHOICE, right);
    show(&mut b, NUMERIC);
    wait_for_progress(&mut b, 2, section.credit[0]);
    let before = (read(&mut b, CHOICE), read(&mut b, NUMERIC));
    let saved = stored(&mut b);
    let entry = &saved[&section.id][CHOICE];
    assert_eq!(entry["state"], "right", "stored: {saved}");
    assert_eq!(entry["credit"].as_f64(), Some(section.credit[0]), "stored: {saved}");
    assert_eq!(saved[&section.id][NUMERIC]["state"], "revealed", "stored: {saved}");

    b.reload();
    wait_for_progress(&mut b, 2, section.credit[0]);
    let after = (read(&mut b, CHOICE), read(&mut b, NUMERIC));
    for (was, is, id) in [(&before.0, &after.0, CHOICE), (&before.1, &after.1, NUMERIC)] {
        assert_eq!(
            (&was.state, &was.credit, &was.tries),
            (&is.state, &is.credit, &is.tries),
            "quiz {id} after the reload"
        );
        assert!(is.answer_visible, "quiz {id}'s answer is hidden again after the reload");
    }

    // Reset asks first (`browser::course` walks the dialog by keyboard).
    b.click(&format!("{PROGRESS} [data-qkv-reset]"));
    b.click("dialog[data-qkv-confirm] [data-qkv-confirm-yes]");
    wait_for_progress(&mut b, 0, 0.0);
    for q in &section.quizzes {
        let shown = read(&mut b, &q.id);
        assert_eq!(
            (shown.state.as_str(), shown.credit.as_str(), shown.tries.as_str()),
            ("unanswered", "0", "0"),
            "quiz {} after reset",
            q.id
        );
        assert!(!shown.answer_visible, "quiz {}'s answer still shows after reset", q.id);
    }
    let cleared = stored(&mut b);
    let left = cleared.get(&section.id).and_then(Value::as_object).map_or(0, |m| m.len());
    assert_eq!(left, 0, "reset left answers in localStorage: {cleared}");
    b.reload();
    wait_for_progress(&mut b, 0, 0.0);
    assert_eq!(read(&mut b, CHOICE).state, "unanswered", "a reload after reset brought an answer back");
    b.assert_clean("reload and reset");
}

#[test]
fn a_reload_keeps_wrong_tries_and_the_options_they_used() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, _) = lesson().quiz(CHOICE);
    // A graded choice check other than the one the other tests answer right.
    let quiz = section
        .quizzes
        .iter()
        .find(|q| !q.practice && q.kind == "choice" && q.id != CHOICE)
        .expect("a second graded choice check");
    let (right, wrong) = quiz.letters();
    b.open(&format!("{}.html", section.id));
    choose(&mut b, &quiz.id, wrong[0]);
    expect(&mut b, &quiz.id, Expect { state: "wrong", credit: 0.0, tries: 1, outcome: "wrong" });

    b.reload();
    let is = read(&mut b, &quiz.id);
    assert_eq!((is.state.as_str(), is.tries.as_str()), ("wrong", "1"), "quiz {} after the reload", quiz.id);
    assert!(!is.message.is_empty(), "quiz {}: no word about the earlier try after the reload", quiz.id);
    let disabled = |b: &mut Browser, letter: char| {
        b.eval(&format!(
            "document.querySelector({}).disabled",
            js(&format!("{} [data-qkv-option=\"{letter}\"]", root(&quiz.id)))
        ))
    };
    assert_eq!(
        disabled(&mut b, wrong[0]),
        Value::Bool(true),
        "the wrong option tried before the reload is live again"
    );
    assert_eq!(disabled(&mut b, right), Value::Bool(false), "the right option is disabled after the reload");
    // The earlier try still counts: a right answer now is a second try.
    choose(&mut b, &quiz.id, right);
    expect(
        &mut b,
        &quiz.id,
        Expect { state: "right", credit: section.credit[1], tries: 1, outcome: "right-later" },
    );
    b.assert_clean("a reload after a wrong try");
}
