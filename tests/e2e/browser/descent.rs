//! The gradient-descent widget: its buttons walk every step, by mouse and by keyboard, and each
//! step's loss, queries, keys, values, outputs and gradients equal the gradient block's record
//! (the engine's forward and reference backward, checked against finite differences and NumPy
//! elsewhere); at either end the button that cannot move stays focusable; each step is announced.

use std::collections::BTreeMap;

use super::cdp::{DESKTOP, ENTER, PHONE};
use super::dom::{js, parse_shown};
use super::lesson::lesson;
use super::{launch, screenshot_path};

struct Widget {
    root: String,
    page: String,
    section: String,
    block: String,
    tokens: Vec<String>,
    steps: usize,
    digits: usize,
}

fn widget() -> Widget {
    let w = lesson().widget_names("gradient-descent");
    let tokens = lesson().names(&w.section, &format!("{}.d_queries", w.example), "1");
    let steps = lesson().names(&w.section, &format!("{}.steps", w.example), "loss").len();
    assert!(tokens.len() >= 2 && steps >= 2, "too little to walk: {tokens:?}, {steps} steps");
    Widget {
        root: w.root,
        page: w.page,
        section: w.section,
        block: w.example,
        tokens,
        steps,
        digits: w.digits,
    }
}

impl Widget {
    /// What step `s` should show, from the record: readout name → numbers.
    fn expected(&self, s: usize) -> BTreeMap<String, Vec<f64>> {
        let at = |path: &str| lesson().vector(&self.section, &format!("{}.{path}", self.block));
        let mut out = BTreeMap::new();
        let (prefix, dq) = if s == 0 { (String::new(), "d_queries") } else { (format!("steps.{s}."), "") };
        let loss = if s == 0 { "loss".to_string() } else { format!("steps.{s}.loss") };
        out.insert("loss".into(), vec![lesson().number(&self.section, &format!("{}.{loss}", self.block))]);
        for t in &self.tokens {
            let input = |name: &str| at(&format!("{prefix}{name}.{t}"));
            out.insert(format!("query:{t}"), input("queries"));
            out.insert(format!("key:{t}"), input("keys"));
            out.insert(format!("value:{t}"), input("values"));
            out.insert(format!("output:{t}"), at(&format!("{prefix}output.{t}")));
            if !dq.is_empty() {
                out.insert(format!("dq:{t}"), at(&format!("{dq}.{t}")));
            }
        }
        out
    }
}

fn read(b: &mut super::cdp::Browser, w: &Widget) -> (BTreeMap<String, String>, String, String) {
    let readouts = b.readouts(&w.root);
    let step = b.attr(&w.root, "data-qkv-step").unwrap_or_default();
    (readouts, step, b.text(&format!("{} [data-qkv-announce]", w.root)))
}

fn assert_step(w: &Widget, readouts: &BTreeMap<String, String>, s: usize) {
    let half_unit = 0.5 * 10f64.powi(-(w.digits as i32));
    let mut wrong = Vec::new();
    for (name, numbers) in w.expected(s) {
        let shown = readouts.get(&name).cloned().unwrap_or_default();
        let parts: Vec<&str> = shown.trim_matches(['(', ')']).split(", ").collect();
        let ok = parts.len() == numbers.len()
            && parts.iter().zip(&numbers).all(|(text, &x)| {
                parse_shown(text).is_some_and(|(value, decimals)| {
                    (value - x).abs() <= half_unit + 1e-12 && (decimals == w.digits || value == x)
                })
            });
        if !ok {
            wrong.push(format!("{name} shows {shown:?}, the record says {numbers:?}"));
        }
    }
    assert!(wrong.is_empty(), "step {s}:\n  {}", wrong.join("\n  "));
}

#[test]
fn the_gradient_descent_widget_walks_every_step_of_the_record() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let w = widget();
    b.open(&w.page);
    let (prev, next) = (format!("{} [data-qkv-prev]", w.root), format!("{} [data-qkv-next]", w.root));
    assert!(b.visible(&next), "the buttons are hidden with the script on");
    let (readouts, step, _) = read(&mut b, &w);
    assert_eq!(step, "0");
    assert_step(&w, &readouts, 0);
    assert_eq!(b.attr(&prev, "aria-disabled").as_deref(), Some("true"), "no step before the first");
    b.screenshot_of(&w.root, &screenshot_path("training-attention-1280-descent-start"));
    for s in 1..=w.steps {
        // The mouse, then Enter on the focused button, in turn.
        if s % 2 == 1 {
            b.click(&next);
        } else {
            b.focus(&next);
            b.press(ENTER, 0);
        }
        b.wait_for(
            &format!("document.querySelector({}).dataset.qkvStep === '{s}'", js(&w.root)),
            &format!("step {s}"),
            &format!("document.querySelector({}).dataset.qkvStep", js(&w.root)),
        );
        let (readouts, _, announce) = read(&mut b, &w);
        assert_step(&w, &readouts, s);
        assert!(
            announce.contains(&format!("step {s} of")) && announce.contains(&readouts["loss"]),
            "announced: {announce}"
        );
    }
    assert_eq!(b.attr(&next, "aria-disabled").as_deref(), Some("true"), "no step after the last");
    b.screenshot_of(&w.root, &screenshot_path("training-attention-1280-descent-last"));
    b.click(&prev);
    let (readouts, step, _) = read(&mut b, &w);
    assert_eq!(step, (w.steps - 1).to_string());
    assert_step(&w, &readouts, w.steps - 1);
    b.assert_clean("the gradient-descent widget");

    let Some(mut b) = launch(PHONE) else { return };
    b.open(&w.page);
    let at = b.center(&next);
    b.touch_drag(&[at]);
    b.wait_for(
        &format!("document.querySelector({}).dataset.qkvStep === '1'", js(&w.root)),
        "a tap to take a step",
        "''",
    );
    let (readouts, _, _) = read(&mut b, &w);
    assert_step(&w, &readouts, 1);
    b.screenshot_of(&w.root, &screenshot_path("training-attention-360-descent"));
    b.assert_clean("the gradient-descent widget on a phone");
}
