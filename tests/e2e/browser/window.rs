//! The window-alibi widget: its window and slope controls, by mouse and by keyboard, move it
//! through states whose every bias, weight and output equals the engine's f64 reference for that
//! window and slope, computed here from the lesson's inputs (to half a unit in the last shown
//! place); each state is announced; without script the page shows the declared state.

use std::collections::BTreeMap;

use ndarray::Array2;
use qkv::{AttentionOptions, QueryTrace};
use serde_json::Value;

use super::cdp::{ARROW_LEFT, ARROW_RIGHT, Browser, DESKTOP, PHONE};
use super::dom::{js, parse_shown};
use super::lesson::{Example, lesson};
use super::{launch, launch_with, screenshot_path};

/// The lesson's window-alibi widget and what the tests need to know about it.
struct Widget {
    root: String,
    page: String,
    example: Example,
    digits: usize,
    /// Whether the example is causal, and its key length, as its blocks declare (through `from`).
    causal: bool,
    key_length: Option<usize>,
    /// The choices of each control, in order: `None` is "no window".
    windows: Vec<Option<[usize; 2]>>,
    slopes: Vec<f64>,
    /// The state the widget starts in: the example's own window and slope.
    start: (Option<[usize; 2]>, f64),
}

fn number(v: &toml::Value) -> f64 {
    v.as_float().or(v.as_integer().map(|i| i as f64)).expect("a number")
}

fn window(v: &toml::Value) -> [usize; 2] {
    let sides: Vec<usize> =
        v.as_array().expect("a window").iter().map(|x| x.as_integer().expect("a side") as usize).collect();
    [sides[0], sides[1]]
}

fn widget() -> Widget {
    let w = lesson().widget("window-alibi");
    let section = w.page.trim_end_matches(".html");
    let blocks = &lesson().sections.iter().find(|s| s.id == section).expect("the widget's section").examples;
    // The example's fields, each from the nearest block of its `from` chain that sets it.
    let field = |name: &str| -> Option<toml::Value> {
        let mut id = w.block.get("example").and_then(toml::Value::as_str).expect("an example").to_string();
        loop {
            let block = blocks
                .iter()
                .find(|b| b.get("id").and_then(toml::Value::as_str) == Some(&id))
                .unwrap_or_else(|| panic!("no example `{id}` in {section}"));
            if let Some(v) = block.get(name) {
                return Some(v.clone());
            }
            id = block.get("from")?.as_str().expect("from names an example").to_string();
        }
    };
    assert!(field("key_padding").is_none() && field("scale").is_none(), "the test knows no such example");
    let list = |name: &str| w.block.get(name).and_then(toml::Value::as_array).cloned().unwrap_or_default();
    Widget {
        causal: field("mask").and_then(|m| m.as_str().map(|m| m == "causal")).unwrap_or(false),
        key_length: field("key_length").map(|v| v.as_integer().expect("a length") as usize),
        windows: std::iter::once(None).chain(list("windows").iter().map(|v| Some(window(v)))).collect(),
        slopes: list("slopes").iter().map(number).collect(),
        start: (field("window").map(|v| window(&v)), field("alibi").map_or(0.0, |v| number(&v))),
        root: w.root,
        page: w.page,
        example: w.example,
        digits: w.digits,
    }
}

impl Widget {
    /// The engine's f64 reference at `window` and `slope` (weights and outputs), and each query's
    /// trace (which keys it sees, and its scores before and after the bias).
    fn reference(&self, window: Option<[usize; 2]>, slope: f64) -> (qkv::Attention<f64>, Vec<QueryTrace>) {
        let array = |rows: &[Vec<f64>]| {
            Array2::from_shape_vec((rows.len(), rows[0].len()), rows.concat()).expect("rectangular")
        };
        let (q, k, v) =
            (array(&self.example.queries), array(&self.example.keys), array(&self.example.values));
        let slopes = [slope];
        let lengths = self.key_length.map(|l| [l]);
        let mut options = AttentionOptions::new().scale(self.example.scale).alibi(qkv::Alibi::new(&slopes));
        if self.causal {
            options = options.causal(qkv::CausalMask::BottomRight);
        }
        if let Some([before, after]) = window {
            options = options.sliding_window(qkv::SlidingWindow::new(before, after));
        }
        if let Some(lengths) = &lengths {
            options = options.key_lengths(lengths);
        }
        let all =
            qkv::reference::attention(q.view(), k.view(), v.view(), &options).expect("the engine evaluates");
        let traces = (0..q.nrows())
            .map(|i| qkv::trace_query(q.view(), k.view(), v.view(), i, &options).expect("the engine traces"))
            .collect();
        (all, traces)
    }
}

/// What the widget shows: its state attributes, every readout (text, and whether it is masked),
/// the state line and the live region.
struct Shown {
    window: String,
    slope: String,
    readouts: BTreeMap<String, (String, bool)>,
    state: String,
    announce: String,
}

fn read(b: &mut Browser, w: &Widget) -> Shown {
    let v = b.eval(&format!(
        "(() => {{ const root = document.querySelector({root});
           const readouts = Object.fromEntries(Array.from(root.querySelectorAll('[data-qkv-readout]'),
             (e) => [e.dataset.qkvReadout, [e.textContent.trim(), e.hasAttribute('data-qkv-masked')]]));
           return {{ window: root.dataset.qkvWindow, slope: root.dataset.qkvSlope, readouts,
                     state: root.querySelector('[data-qkv-state]').textContent,
                     announce: root.querySelector('[data-qkv-announce]').textContent }}; }})()",
        root = js(&w.root)
    ));
    let text = |key: &str| v[key].as_str().unwrap_or_default().to_string();
    let readouts = v["readouts"]
        .as_object()
        .expect("readouts")
        .iter()
        .map(|(k, x)| (k.clone(), (x[0].as_str().unwrap_or_default().to_string(), x[1] == Value::Bool(true))))
        .collect();
    Shown {
        window: text("window"),
        slope: text("slope"),
        readouts,
        state: text("state"),
        announce: text("announce"),
    }
}

/// `data-qkv-window` of a window: `none` or `BEFORE,AFTER`.
fn window_attr(window: Option<[usize; 2]>) -> String {
    window.map_or("none".into(), |[b, a]| format!("{b},{a}"))
}

/// Every difference between what the widget shows and the engine at `window` and `slope`.
fn mismatches(w: &Widget, shown: &Shown, window: Option<[usize; 2]>, slope: f64) -> Vec<String> {
    let (all, traces) = w.reference(window, slope);
    let half_unit = 0.5 * 10f64.powi(-(w.digits as i32));
    let mut out = Vec::new();
    if shown.window != window_attr(window) || shown.slope.parse::<f64>().ok() != Some(slope) {
        out.push(format!("the widget says window {} and slope {}", shown.window, shown.slope));
    }
    let mut check = |name: String, expected: Option<f64>| match shown.readouts.get(&name) {
        None => out.push(format!("no readout {name}")),
        Some((text, masked)) => match (expected, parse_shown(text)) {
            (None, _) if *masked => {}
            (None, _) => out.push(format!("{name} shows {text:?}, but the engine hides that key")),
            (Some(x), _) if *masked => out.push(format!("{name} is masked, the engine says {x:.6}")),
            (Some(x), Some((value, decimals))) => {
                if (value - x).abs() > half_unit + 1e-12 || decimals != w.digits {
                    out.push(format!("{name} shows {text}, the engine says {x:.6} ({} decimals)", w.digits));
                }
            }
            (Some(x), None) => out.push(format!("{name} shows {text:?}, the engine says {x:.6}")),
        },
    };
    let n_keys = w.example.keys.len();
    for (i, (q, t)) in w.example.labels.iter().zip(&traces).enumerate() {
        for (j, k) in w.example.labels.iter().enumerate() {
            let kept = |x: f64| t.kept[j].then_some(x);
            // ALiBi's bias, slope · (j − p) at the query's key position p, is what the engine's
            // score holds beyond the scaled dot product.
            let bias = t.scores[j] - t.dot_products[j] * t.scale;
            if t.kept[j] {
                let p = (i + n_keys - traces.len()) as f64;
                assert!((bias - slope * (j as f64 - p)).abs() < 1e-12, "the engine's bias at {q}, {k}");
            }
            check(format!("bias:{q}:{k}"), kept(bias));
            check(format!("weight:{q}:{k}"), kept(all.weights[[i, j]]));
        }
        match all.output.row(i).to_vec().as_slice() {
            [x] => check(format!("output:{q}"), Some(*x)),
            xs => xs.iter().enumerate().for_each(|(c, &x)| check(format!("output:{q}:{}", c + 1), Some(x))),
        }
    }
    out
}

fn assert_engine(w: &Widget, shown: &Shown, window: Option<[usize; 2]>, slope: f64, when: &str) {
    let wrong = mismatches(w, shown, window, slope);
    assert!(wrong.is_empty(), "{when} (window {window:?}, slope {slope}):\n  {}", wrong.join("\n  "));
}

/// Waits until the widget says it shows `window` and `slope`, after `what`.
fn wait_state(b: &mut Browser, w: &Widget, window: Option<[usize; 2]>, slope: f64, what: &str) {
    b.wait_for(
        &format!(
            "document.querySelector({}).dataset.qkvWindow === {} && Number(document.querySelector({0}).dataset.qkvSlope) === {slope}",
            js(&w.root),
            js(&window_attr(window))
        ),
        &format!("the widget to show window {window:?} and slope {slope} after {what}"),
        &format!("document.querySelector({}).outerHTML.slice(0, 200)", js(&w.root)),
    );
}

/// The selector of choice `i` of control `name` (`window` or `slope`).
fn choice(w: &Widget, name: &str, i: usize) -> String {
    format!("{} [data-qkv-control=\"{name}\"] input[value=\"{i}\"]", w.root)
}

#[test]
fn the_window_alibi_widget_shows_the_engines_numbers_in_every_state_it_is_moved_to() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let w = widget();
    assert!(w.windows.len() >= 3 && w.slopes.len() >= 3, "the widget offers too few states to test");
    b.open(&w.page);
    assert!(b.visible(&format!("{} .controls", w.root)), "the controls are hidden with the script on");
    let start = read(&mut b, &w);
    assert_engine(&w, &start, w.start.0, w.start.1, "at the start");
    b.screenshot_of(&w.root, &screenshot_path("where-to-look-1280-window-alibi-start"));

    let index = |window: Option<[usize; 2]>| w.windows.iter().position(|&x| x == window).expect("offered");
    let slope_index = |s: f64| w.slopes.iter().position(|&x| x == s).expect("offered");
    let (mut wi, mut si) = (index(w.start.0), slope_index(w.start.1));
    let (last_w, last_s) = (w.windows.len() - 1, w.slopes.len() - 1);
    // Each move: how, and the state it leads to. Mouse clicks on radio buttons, then the arrow
    // keys within a group (a native radio group moves its choice with them).
    let moves: Vec<(&str, &str, usize)> = vec![
        ("click", "slope", 0),
        ("click", "window", 1),
        ("arrow right", "window", 2),
        ("arrow right", "slope", 1),
        ("click", "window", last_w),
        ("click", "slope", last_s),
        ("arrow left", "window", last_w - 1),
        ("click", "window", 0),
    ];
    let mut seen = std::collections::BTreeSet::new();
    for (n, &(how, control, to)) in moves.iter().enumerate() {
        let from = if control == "window" { wi } else { si };
        match how {
            "click" => b.click(&choice(&w, control, to)),
            _ => {
                b.focus(&choice(&w, control, from));
                b.press(if how == "arrow right" { ARROW_RIGHT } else { ARROW_LEFT }, 0);
            }
        }
        if control == "window" {
            wi = to
        } else {
            si = to
        }
        let (window, slope) = (w.windows[wi], w.slopes[si]);
        wait_state(&mut b, &w, window, slope, &format!("a {how} on {control}"));
        let shown = read(&mut b, &w);
        assert_engine(&w, &shown, window, slope, &format!("after move {n} ({how} on {control})"));
        // The state is said in words, and the polite live region repeats it with every output.
        assert!(shown.state.contains(&format!("m = {}", shown.slope)), "state line: {}", shown.state);
        assert!(shown.announce.starts_with(&shown.state), "announced: {}", shown.announce);
        for q in &w.example.labels {
            let output = &shown.readouts[&format!("output:{q}")].0;
            assert!(
                shown.announce.contains(&format!("{q} {output}")),
                "{q}'s output is not announced: {}",
                shown.announce
            );
        }
        seen.insert((wi, si));
        if n == 4 {
            b.screenshot_of(&w.root, &screenshot_path("where-to-look-1280-window-alibi-moved"));
        }
    }
    assert!(seen.len() >= 5, "the test moved the widget through only {} states", seen.len());
    assert_eq!(
        b.attr(&format!("{} [data-qkv-announce]", w.root), "aria-live").as_deref(),
        Some("polite"),
        "the readouts are announced politely"
    );
    b.assert_clean("the window-alibi widget");
}

#[test]
fn the_window_alibi_widget_works_on_a_phone_and_shows_its_declared_state_without_script() {
    let Some(mut b) = launch_with(DESKTOP, false) else { return };
    let w = widget();
    b.open(&w.page);
    assert!(!b.visible(&format!("{} .controls", w.root)), "controls that need the script show without it");
    let shown = read(&mut b, &w);
    assert_engine(&w, &shown, w.start.0, w.start.1, "without script");
    b.screenshot_of(&w.root, &screenshot_path("where-to-look-1280-window-alibi-no-script"));

    let Some(mut b) = launch(PHONE) else { return };
    b.open(&w.page);
    let (window, slope) = (w.windows[1], w.slopes[w.slopes.len() - 1]);
    // A phone takes taps: one finger down and up on each radio button.
    for (control, i) in [("window", 1), ("slope", w.slopes.len() - 1)] {
        let at = b.center(&choice(&w, control, i));
        b.touch_drag(&[at]);
    }
    wait_state(&mut b, &w, window, slope, "two taps");
    let shown = read(&mut b, &w);
    assert_engine(&w, &shown, window, slope, "on a phone");
    let wide = b.eval(&format!(
        "(() => {{ const r = document.querySelector({}).getBoundingClientRect(); return r.right <= innerWidth + 0.5; }})()",
        js(&format!("{} .controls", w.root))
    ));
    assert_eq!(wide, Value::Bool(true), "the controls are wider than a phone's screen");
    // The tables may be wider than the screen: every bias, weight and output cell scrolls into
    // view within its table's box, covered by nothing (the row labels stay at the box's left
    // edge, beside it, and nothing is pinned over the cells).
    let hidden = b.eval(&format!(
        "Array.from(document.querySelectorAll({}), (td) => {{
            const box = td.closest('.scroll');
            window.scrollBy(0, td.getBoundingClientRect().top - innerHeight / 2);
            const label = td.parentElement.querySelector('th').getBoundingClientRect();
            box.scrollLeft += td.getBoundingClientRect().right - box.getBoundingClientRect().right;
            box.scrollLeft -= Math.max(0, label.right - td.getBoundingClientRect().left);
            const s = td.getBoundingClientRect(), row = td.parentElement.querySelector('th').getBoundingClientRect();
            const seen = s.left >= row.right - 0.5 && s.right <= innerWidth + 0.5 && row.left >= 0;
            const y = (s.top + s.bottom) / 2;
            const whole = [s.left + 2, (s.left + s.right) / 2, s.right - 2].every((x) => td.contains(document.elementFromPoint(x, y)));
            box.scrollLeft = 0;
            return seen && whole ? '' : td.dataset.qkvReadout + ' at ' + Math.round(s.left) + '..' + Math.round(s.right);
        }}).filter((s) => s)",
        js(&format!("{} [data-qkv-readout]", w.root))
    ));
    assert_eq!(hidden, Value::Array(vec![]), "cells that no scrolling shows whole on a 360 px screen");
    b.screenshot_of(&w.root, &screenshot_path("where-to-look-360-window-alibi"));
    b.assert_clean("the window-alibi widget on a phone");
}
