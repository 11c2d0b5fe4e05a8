//! The decode stepper: "Next token" and "Previous", by mouse and by keyboard, walk the decoding
//! steps, and every number each step shows (the cache's keys and values, the new query's scores,
//! the weights and the output) is the engine's f64 reference for full causal attention over the
//! lesson's inputs: decoding with a cache changes the work, never the result.

use ndarray::Array2;
use qkv::{AttentionOptions, CausalMask};

use super::cdp::{DESKTOP, ENTER};
use super::dom::parse_shown;
use super::lesson::{Example, lesson};
use super::{launch, screenshot_path};

/// The stepper's page, root selector, digits, prompt length, first step, and the inputs of the
/// example its decoding runs over.
struct Stepper {
    page: String,
    root: String,
    digits: usize,
    prompt: usize,
    start: usize,
    example: Example,
}

fn stepper() -> Stepper {
    let lesson = lesson();
    let (section, block) = lesson
        .sections
        .iter()
        .find_map(|s| {
            let w = s
                .widgets
                .iter()
                .find(|w| w.get("kind").and_then(toml::Value::as_str) == Some("decode-stepper"))?;
            Some((s, w))
        })
        .expect("the lesson declares a decode-stepper widget");
    let field = |t: &toml::Table, name: &str| t.get(name).and_then(toml::Value::as_str).map(str::to_string);
    let id = field(block, "id").expect("a widget id");
    let decode_id = field(block, "example").expect("the widget names a decoding");
    let decode = section
        .decodes
        .iter()
        .find(|d| field(d, "id").as_deref() == Some(decode_id.as_str()))
        .expect("the widget's decoding is declared in its section");
    let example =
        lesson.example(&section.id, &field(decode, "example").expect("the decoding names an example"));
    let prompt = decode.get("prompt").and_then(toml::Value::as_integer).expect("a prompt") as usize;
    let start = field(block, "query").map_or(prompt, |q| example.index(&q));
    Stepper {
        page: format!("{}.html", section.id),
        root: format!("[data-qkv-widget=\"decode-stepper\"]#widget-{id}"),
        digits: block.get("digits").and_then(toml::Value::as_integer).unwrap_or(4) as usize,
        prompt,
        start,
        example,
    }
}

fn array(rows: &[Vec<f64>]) -> Array2<f64> {
    let width = rows.first().map_or(0, Vec::len);
    Array2::from_shape_vec((rows.len(), width), rows.concat()).expect("rectangular rows")
}

/// A vector as the lesson writes its inputs: `(1, 0)`, `(0.5, -1)`; one entry alone.
fn written(xs: &[f64]) -> String {
    let parts: Vec<String> = xs.iter().map(|x| format!("{x}")).collect();
    if let [one] = parts.as_slice() { one.clone() } else { format!("({})", parts.join(", ")) }
}

#[test]
fn the_decode_stepper_walks_every_step_with_the_engines_numbers() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let Stepper { page, root, digits, prompt, start, example } = stepper();
    let n = example.labels.len();
    // Full causal attention, the engine's f64 reference: row t is token t's decoding step.
    let (q, k, v) = (array(&example.queries), array(&example.keys), array(&example.values));
    let options = AttentionOptions::new().scale(example.scale).causal(CausalMask::TopLeft);
    let full =
        qkv::reference::attention(q.view(), k.view(), v.view(), &options).expect("the engine evaluates");
    let weights = full.weights.into_inner();
    let half_unit = 0.5 * 10f64.powi(-(digits as i32));
    let number = |text: &str, what: &str| -> f64 {
        match parse_shown(text) {
            Some((value, decimals)) if decimals == digits => value,
            _ => panic!("{what} shows {text:?}, not a number with {digits} decimals"),
        }
    };

    b.open(&page);
    let (prev, next) = (format!("{root} [data-qkv-prev]"), format!("{root} [data-qkv-next]"));
    assert!(b.visible(&next) && b.visible(&prev), "the script shows the stepper's buttons");
    let check = |b: &mut super::cdp::Browser, t: usize, how: &str| {
        let token = &example.labels[t];
        assert_eq!(b.attr(&root, "data-qkv-step").as_deref(), Some(token.as_str()), "the step after {how}");
        // The prompt is appended whole; after it, one position per step.
        let held = (t + 1).max(prompt);
        assert_eq!(
            b.count(&format!("{root} [data-qkv-cache] tr")),
            held,
            "cache rows at the step of {token}"
        );
        let trace = example.trace(&example.queries[t]);
        for j in 0..held {
            let key = &example.labels[j];
            let cell = |b: &mut super::cdp::Browser, what: &str| {
                b.text(&format!("{root} [data-qkv-readout=\"{what}:{key}\"]"))
            };
            assert_eq!(cell(b, "key"), written(&example.keys[j]), "the cached key of {key} at {token}");
            assert_eq!(cell(b, "value"), written(&example.values[j]), "the cached value of {key} at {token}");
            let (score, weight) = (cell(b, "score"), cell(b, "weight"));
            if j <= t {
                let s = trace.scores[j];
                assert!(
                    (number(&score, "a score") - s).abs() <= half_unit + 1e-12,
                    "{token}'s score for {key} shows {score}, the engine says {s:.6}"
                );
            } else {
                assert_eq!(score, "masked", "{token} may not see {key}, a later prompt position");
            }
            let w = weights[[t, j]];
            assert!(
                (number(&weight, "a weight") - w).abs() <= half_unit + 1e-12,
                "{token}'s weight for {key} shows {weight}, the engine says {w:.6}"
            );
        }
        for c in 0..example.values[0].len() {
            let selector = if example.values[0].len() == 1 {
                format!("{root} [data-qkv-readout=\"output\"]")
            } else {
                format!("{root} [data-qkv-readout=\"output:{}\"]", c + 1)
            };
            let (text, o) = (b.text(&selector), full.output[[t, c]]);
            assert!(
                (number(&text, "the output") - o).abs() <= half_unit + 1e-12,
                "{token}'s output shows {text}, the engine says {o:.6}"
            );
        }
        assert_eq!(b.attr(&prev, "aria-disabled").as_deref(), Some(if t == 0 { "true" } else { "false" }));
        assert_eq!(
            b.attr(&next, "aria-disabled").as_deref(),
            Some(if t == n - 1 { "true" } else { "false" })
        );
    };

    // The declared step, as the build wrote it; nothing announced yet.
    check(&mut b, start, "loading the page");
    assert_eq!(b.text(&format!("{root} [data-qkv-announce]")), "", "announced before any move");
    assert_eq!(b.attr(&format!("{root} [data-qkv-announce]"), "aria-live").as_deref(), Some("polite"));

    // Forward to the last step with the mouse, one past it (nothing moves), then back to the first
    // by keyboard: every state of the decoding, at least five.
    let mut states = vec![start];
    for t in start + 1..n {
        b.click(&next);
        check(&mut b, t, "a click on Next token");
        states.push(t);
    }
    b.click(&next);
    check(&mut b, n - 1, "a click on Next token at the last step");
    b.focus(&prev);
    for t in (0..n - 1).rev() {
        b.press(ENTER, 0);
        check(&mut b, t, "Enter on Previous");
        states.push(t);
        let focused =
            b.eval(&format!("document.activeElement === document.querySelector({})", super::dom::js(&prev)));
        assert_eq!(focused, serde_json::Value::Bool(true), "the focus stays on Previous");
        let said = b.text(&format!("{root} [data-qkv-announce]"));
        let output = b.text(&format!("{root} [data-qkv-output]"));
        assert!(
            said.contains(&example.labels[t]) && said.contains(&output),
            "the live region says {said:?} at the step of {}, whose output is {output}",
            example.labels[t]
        );
    }
    states.sort_unstable();
    states.dedup();
    assert!(states.len() >= 5, "the walk saw only {} states", states.len());
    b.screenshot_of(&root, &screenshot_path("decoding-1280-stepper-first-step"));
    b.assert_clean("the decode stepper");
}
