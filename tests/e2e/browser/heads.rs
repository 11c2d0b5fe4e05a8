//! The head explorer: picking a head (by mouse or keyboard) shows its weights and output, and
//! switching heads off changes the final output; in every state each number shown equals the
//! engine's f64 reference to half a unit in the last shown place. The reference is computed
//! here from the lesson's inputs: each head projected by hand, `qkv::reference::attention` per
//! head, the heads' outputs side by side (zeros for a head switched off) times `W_o` by hand.

use ndarray::Array2;
use qkv::AttentionOptions;
use serde_json::Value;

use super::cdp::{ARROW_LEFT, Browser, DESKTOP, PHONE, SPACE};
use super::dom::{js, parse_shown};
use super::lesson::lesson;
use super::{launch, launch_with, screenshot_path};

/// The lesson's head explorer, with the engine's numbers for every state.
struct Explorer {
    root: String,
    page: String,
    digits: usize,
    tokens: Vec<String>,
    /// Head names, in order (the columns of the concatenation).
    heads: Vec<String>,
    /// The head shown at the start.
    start: usize,
    /// Per head: its weights `[token, key]` and output `[token, component]`.
    reference: Vec<(Array2<f64>, Array2<f64>)>,
    w_o: Array2<f64>,
}

fn array(rows: &[Vec<f64>]) -> Array2<f64> {
    let width = rows.first().map_or(0, Vec::len);
    Array2::from_shape_vec((rows.len(), width), rows.concat()).expect("rectangular rows")
}

/// `a · b`, written out rather than borrowed from ndarray, so that the test's `W_o` is its own.
fn times(a: &Array2<f64>, b: &Array2<f64>) -> Array2<f64> {
    assert_eq!(a.ncols(), b.nrows(), "shapes of a product");
    Array2::from_shape_fn((a.nrows(), b.ncols()), |(i, j)| {
        (0..a.ncols()).map(|k| a[[i, k]] * b[[k, j]]).sum()
    })
}

fn explorer() -> Explorer {
    let lesson = lesson();
    let (section, block) = lesson.widget_block("head-explorer");
    let field = |name: &str| block.get(name).and_then(toml::Value::as_str);
    let id = field("id").expect("a widget has an id");
    let example = field("example").expect("a head explorer names its example");
    let s = &section.id;
    // The embeddings' rows are the tokens, in order.
    let tokens = lesson.names(s, &format!("{example}.x"), "1");
    let heads = lesson.names(s, &format!("{example}.heads"), "kv_head");
    assert!(heads.len() >= 2, "the explorer's example has {} heads", heads.len());
    let x = array(&lesson.rows(s, &format!("{example}.x"), &tokens));
    let numbered = |n: usize| (1..=n).map(|i| i.to_string()).collect::<Vec<_>>();
    let reference = heads
        .iter()
        .map(|h| {
            let w = |name: &str| {
                array(&lesson.rows(s, &format!("{example}.heads.{h}.{name}"), &numbered(x.ncols())))
            };
            let (q, k, v) = (times(&x, &w("w_q")), times(&x, &w("w_k")), times(&x, &w("w_v")));
            let scale = lesson.number(s, &format!("{example}.heads.{h}.scale"));
            let r = qkv::reference::attention(
                q.view(),
                k.view(),
                v.view(),
                &AttentionOptions::new().scale(scale),
            )
            .expect("the engine evaluates the head");
            (r.weights.into_inner(), r.output)
        })
        .collect::<Vec<(Array2<f64>, Array2<f64>)>>();
    let width: usize = reference.iter().map(|(_, o)| o.ncols()).sum();
    let w_o = array(&lesson.rows(s, &format!("{example}.w_o"), &numbered(width)));
    let start =
        field("head").map_or(0, |h| heads.iter().position(|n| n == h).expect("a head of the example"));
    Explorer {
        root: format!("[data-qkv-widget=\"head-explorer\"]#widget-{id}"),
        page: format!("{s}.html"),
        digits: block.get("digits").and_then(toml::Value::as_integer).unwrap_or(4) as usize,
        tokens,
        heads,
        start,
        reference,
        w_o,
    }
}

impl Explorer {
    /// The final output with the heads `on` marks: their outputs side by side, zeros for a head
    /// switched off, times `W_o`.
    fn output(&self, on: &[bool]) -> Array2<f64> {
        let columns: Vec<Array2<f64>> = self
            .reference
            .iter()
            .zip(on)
            .map(|((_, o), &on)| if on { o.clone() } else { Array2::zeros(o.dim()) })
            .collect();
        let views: Vec<_> = columns.iter().map(|c| c.view()).collect();
        times(&ndarray::concatenate(ndarray::Axis(1), &views).expect("same rows"), &self.w_o)
    }

    /// Checks every readout against the reference for head `shown` and the heads `on`, the
    /// root's state attributes, and (after a change) the announcement; `state` names the step.
    fn check(&self, b: &mut Browser, shown: usize, on: &[bool], announced: bool, state: &str) {
        let v = b.eval(&format!(
            "(() => {{ const root = document.querySelector({root});
               const readouts = Object.fromEntries(Array.from(root.querySelectorAll('[data-qkv-readout]'))
                 .map((e) => [e.dataset.qkvReadout, e.textContent.trim()]));
               return {{ readouts, head: root.dataset.qkvHead, on: root.dataset.qkvOn,
                         announce: root.querySelector('[data-qkv-announce]').textContent,
                         live: root.querySelector('[data-qkv-announce]').getAttribute('aria-live') }}; }})()",
            root = js(&self.root)
        ));
        let half_unit = 0.5 * 10f64.powi(-(self.digits as i32));
        let readout = |name: &str| -> String {
            v["readouts"][name].as_str().unwrap_or_else(|| panic!("{state}: no readout {name}")).to_string()
        };
        let close = |name: &str, engine: f64| {
            let text = readout(name);
            match parse_shown(&text) {
                Some((shown, d)) if d == self.digits => assert!(
                    (shown - engine).abs() <= half_unit + 1e-12,
                    "{state}: {name} shows {text}, the engine says {engine:.6}"
                ),
                _ => panic!("{state}: {name} shows {text:?}, not a number with {} decimals", self.digits),
            }
            text
        };
        let (weights, head_output) = &self.reference[shown];
        let output = self.output(on);
        let mut finals = Vec::new();
        for (i, t) in self.tokens.iter().enumerate() {
            for (j, k) in self.tokens.iter().enumerate() {
                close(&format!("weight:{t}:{k}"), weights[[i, j]]);
            }
            for c in 0..head_output.ncols() {
                close(&format!("head-output:{t}:{}", c + 1), head_output[[i, c]]);
            }
            for c in 0..output.ncols() {
                finals.push(close(&format!("output:{t}:{}", c + 1), output[[i, c]]));
            }
        }
        let expected = self.tokens.len() * (self.tokens.len() + head_output.ncols() + output.ncols());
        assert_eq!(
            v["readouts"].as_object().map_or(0, |m| m.len()),
            expected,
            "{state}: readouts {}",
            v["readouts"]
        );
        assert_eq!(v["head"], Value::String(self.heads[shown].clone()), "{state}: data-qkv-head");
        let on_names: Vec<&str> =
            self.heads.iter().zip(on).filter(|(_, on)| **on).map(|(h, _)| h.as_str()).collect();
        assert_eq!(v["on"], Value::String(on_names.join(",")), "{state}: data-qkv-on");
        assert_eq!(v["live"], "polite", "{state}: the announcement is a polite live region");
        if announced {
            let said = v["announce"].as_str().unwrap_or_default();
            for text in &finals {
                assert!(
                    said.contains(text.as_str()),
                    "{state}: the announcement {said:?} lacks the output {text}"
                );
            }
        }
    }

    fn pick(&self, head: usize) -> String {
        format!("{} [data-qkv-pick=\"{}\"]", self.root, self.heads[head])
    }

    fn switch(&self, head: usize) -> String {
        format!("{} [data-qkv-switch=\"{}\"]", self.root, self.heads[head])
    }
}

#[test]
fn the_head_explorer_shows_the_engines_numbers_in_every_state_it_reaches() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let e = explorer();
    b.open(&e.page);
    let mut on = vec![true; e.heads.len()];
    e.check(&mut b, e.start, &on, false, "the declared state");
    assert!(b.visible(&e.pick(0)), "the head picker is hidden once the script runs");

    // 1. Another head, picked with the mouse.
    let other = (e.start + 1) % e.heads.len();
    b.click(&e.pick(other));
    e.check(&mut b, other, &on, true, "after clicking another head");
    b.screenshot_of(&e.root, &screenshot_path("heads-1280-other-head"));

    // 2. That head switched off from the keyboard (Space on its checkbox).
    b.focus(&e.switch(other));
    b.press(SPACE, 0);
    on[other] = false;
    e.check(&mut b, other, &on, true, "after switching the shown head off with Space");

    // 3. The previous head, picked with an arrow key inside the radio group.
    b.focus(&e.pick(other));
    b.press(ARROW_LEFT, 0);
    let previous = (other + e.heads.len() - 1) % e.heads.len();
    e.check(&mut b, previous, &on, true, "after ArrowLeft in the head picker");

    // 4. Every head off: the output is zero.
    for (h, on) in on.iter_mut().enumerate() {
        if *on {
            b.click(&e.switch(h));
            *on = false;
        }
    }
    e.check(&mut b, previous, &on, true, "with every head switched off");

    // 5. Only the other head back on.
    b.click(&e.switch(other));
    on[other] = true;
    e.check(&mut b, previous, &on, true, "with only one head switched on");
    b.screenshot_of(&e.root, &screenshot_path("heads-1280-one-head-on"));
    b.assert_clean("the head explorer");
}

#[test]
fn without_script_the_head_explorer_shows_its_declared_state() {
    let Some(mut b) = launch_with(PHONE, false) else { return };
    let e = explorer();
    b.open(&e.page);
    assert!(!b.visible(&e.pick(0)), "the head picker shows without script, where it does nothing");
    e.check(&mut b, e.start, &vec![true; e.heads.len()], false, "the page without script");
    b.screenshot_of(&e.root, &screenshot_path("heads-360-no-script"));
}
