//! The block-walk widget: its order and token controls, by mouse and by keyboard, move it through
//! states whose every stage (vector and length) equals the block's record, the numbers the Rust
//! side computed (the engine's attention, the course's layer norm and feed-forward layer, both
//! checked against independent computations in the unit and NumPy tests); each state is
//! announced; on a phone every readout is on screen; without script the page shows the start.

use std::collections::BTreeMap;

use serde_json::Value;

use super::cdp::{ARROW_RIGHT, Browser, DESKTOP, PHONE};
use super::dom::{js, parse_shown};
use super::lesson::lesson;
use super::{launch, launch_with, screenshot_path};

/// The stages of each order, as the record names them (a norm's vector is its `output`).
const PRE: [&str; 9] = ["x", "norm1", "attention", "residual1", "norm2", "hidden", "relu", "ffn", "output"];
const POST: [&str; 9] =
    ["x", "attention", "residual1", "norm1", "hidden", "relu", "ffn", "residual2", "output"];

struct Widget {
    root: String,
    page: String,
    section: String,
    block: String,
    tokens: Vec<String>,
    start: String,
    digits: usize,
}

fn widget() -> Widget {
    let w = lesson().widget_names("block-walk");
    let tokens = lesson().names(&w.section, &format!("{}.pre", w.example), "x.1");
    assert!(tokens.len() >= 2, "the block has too few tokens to walk: {tokens:?}");
    let (_, block) = lesson().widget_block("block-walk");
    let start =
        block.get("query").and_then(toml::Value::as_str).map_or_else(|| tokens[0].clone(), str::to_string);
    Widget {
        root: w.root,
        page: w.page,
        section: w.section,
        block: w.example,
        tokens,
        start,
        digits: w.digits,
    }
}

impl Widget {
    /// Each stage's vector, from the record.
    fn stages(&self, order: &str, token: &str) -> Vec<Vec<f64>> {
        let names = if order == "pre" { PRE } else { POST };
        names
            .iter()
            .map(|&stage| {
                let path = format!("{}.{order}.{token}.{stage}", self.block);
                let v = lesson().vector(&self.section, &path);
                if v.is_empty() { lesson().vector(&self.section, &format!("{path}.output")) } else { v }
            })
            .collect()
    }
}

/// Every readout's text, the state attributes, the state line and the live region.
fn read(b: &mut Browser, w: &Widget) -> (BTreeMap<String, String>, [String; 4]) {
    let readouts = b.readouts(&w.root);
    let attr = |b: &mut Browser, name: &str| b.attr(&w.root, name).unwrap_or_default();
    let (order, token) = (attr(b, "data-qkv-order"), attr(b, "data-qkv-token"));
    let state = b.text(&format!("{} [data-qkv-state]", w.root));
    let announce = b.text(&format!("{} [data-qkv-announce]", w.root));
    (readouts, [order, token, state, announce])
}

/// Every difference between the shown readouts and the record at `order` and `token`.
fn mismatches(w: &Widget, readouts: &BTreeMap<String, String>, order: &str, token: &str) -> Vec<String> {
    let half_unit = 0.5 * 10f64.powi(-(w.digits as i32));
    let mut out = Vec::new();
    let mut check = |name: String, text: &str, x: f64| match parse_shown(text) {
        // A number shown exactly may drop its trailing zeros (`0`, `0.5`).
        Some((value, decimals))
            if (value - x).abs() <= half_unit + 1e-12 && (decimals == w.digits || value == x) => {}
        _ => out.push(format!("{name} shows {text:?}, the record says {x:.6}")),
    };
    for (k, vector) in w.stages(order, token).iter().enumerate() {
        let shown = readouts.get(&format!("vector:{k}")).cloned().unwrap_or_default();
        let parts: Vec<&str> = shown.trim_matches(['(', ')']).split(", ").collect();
        if parts.len() != vector.len() {
            check(format!("stage {k} ({shown}) has {} numbers", parts.len()), "", vector.len() as f64);
            continue;
        }
        for (c, (text, &x)) in parts.iter().zip(vector).enumerate() {
            check(format!("stage {k} entry {}", c + 1), text, x);
        }
        let length = vector.iter().map(|x| x * x).sum::<f64>().sqrt();
        check(format!("length:{k}"), readouts.get(&format!("length:{k}")).map_or("", String::as_str), length);
    }
    out
}

fn assert_record(w: &Widget, readouts: &BTreeMap<String, String>, order: &str, token: &str, when: &str) {
    let wrong = mismatches(w, readouts, order, token);
    assert!(wrong.is_empty(), "{when} ({order}-norm, {token}):\n  {}", wrong.join("\n  "));
}

fn choice(w: &Widget, control: &str, i: usize) -> String {
    format!("{} [data-qkv-control=\"{control}\"] input[value=\"{i}\"]", w.root)
}

fn wait_state(b: &mut Browser, w: &Widget, order: &str, token: &str) {
    b.wait_for(
        &format!(
            "document.querySelector({0}).dataset.qkvOrder === {1} && document.querySelector({0}).dataset.qkvToken === {2}",
            js(&w.root),
            js(order),
            js(token)
        ),
        &format!("the widget to show {order}-norm and {token}"),
        &format!("document.querySelector({}).outerHTML.slice(0, 200)", js(&w.root)),
    );
}

#[test]
fn the_block_walk_widget_shows_the_block_s_numbers_in_every_state() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let w = widget();
    b.open(&w.page);
    assert!(b.visible(&format!("{} .controls", w.root)), "the controls are hidden with the script on");
    let (readouts, _) = read(&mut b, &w);
    assert_record(&w, &readouts, "pre", &w.start, "at the start");
    b.screenshot_of(&w.root, &screenshot_path("transformer-block-1280-block-walk-start"));
    let mut seen = 0;
    for (o, order) in ["pre", "post"].iter().enumerate() {
        b.click(&choice(&w, "order", o));
        for (t, token) in w.tokens.iter().enumerate() {
            if t == 0 {
                b.click(&choice(&w, "token", 0));
            } else {
                // The arrow keys move a native radio group's choice.
                b.focus(&choice(&w, "token", t - 1));
                b.press(ARROW_RIGHT, 0);
            }
            wait_state(&mut b, &w, order, token);
            let (readouts, [_, _, state, announce]) = read(&mut b, &w);
            assert_record(&w, &readouts, order, token, "after a move");
            assert!(state.contains(&format!("Token: {token}.")), "state line: {state}");
            let last = readouts.get("vector:8").cloned().unwrap_or_default();
            assert!(announce.starts_with(&state) && announce.contains(&last), "announced: {announce}");
            seen += 1;
        }
    }
    assert_eq!(seen, 2 * w.tokens.len(), "every state was visited");
    b.screenshot_of(&w.root, &screenshot_path("transformer-block-1280-block-walk-post"));
    b.assert_clean("the block-walk widget");
}

#[test]
fn the_block_walk_widget_fits_a_phone_and_shows_its_start_without_script() {
    let Some(mut b) = launch_with(DESKTOP, false) else { return };
    let w = widget();
    b.open(&w.page);
    assert!(!b.visible(&format!("{} .controls", w.root)), "controls that need the script show without it");
    let (readouts, _) = read(&mut b, &w);
    assert_record(&w, &readouts, "pre", &w.start, "without script");

    let Some(mut b) = launch(PHONE) else { return };
    b.open(&w.page);
    let at = b.center(&choice(&w, "order", 1));
    b.touch_drag(&[at]);
    wait_state(&mut b, &w, "post", &w.start);
    let (readouts, _) = read(&mut b, &w);
    assert_record(&w, &readouts, "post", &w.start, "on a phone");
    // Every readout, vectors and lengths alike, lies within the phone's screen.
    let inside = b.eval(&format!(
        "Array.from(document.querySelectorAll({}), (e) => e.getBoundingClientRect().right <= innerWidth + 0.5).every(Boolean)",
        js(&format!("{} [data-qkv-readout]", w.root))
    ));
    assert_eq!(inside, Value::Bool(true), "a readout is off a phone's screen");
    b.screenshot_of(&w.root, &screenshot_path("transformer-block-360-block-walk"));
    b.assert_clean("the block-walk widget on a phone");
}
