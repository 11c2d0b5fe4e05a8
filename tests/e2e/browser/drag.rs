//! The drag-the-query widget: pointer (mouse and touch) and keyboard input move the query, and
//! every readout then equals the engine's f64 reference for the query the page reports, to half a
//! unit in the last shown place. The reference is computed here, from the lesson's inputs.

use std::collections::BTreeMap;

use serde_json::Value;

use super::cdp::{ARROW_DOWN, ARROW_LEFT, ARROW_RIGHT, ARROW_UP, Browser, DESKTOP, Key, PHONE, Point, SHIFT};
use super::dom::{js, parse_shown};
use super::lesson::{self, Example, lesson};
use super::{launch, launch_with, screenshot_path};

/// The lesson's drag-query widget and what the tests need to know about it.
struct Widget {
    /// The CSS selector of its root.
    root: String,
    page: String,
    example: Example,
    /// The query it starts at (and resets to).
    start: Vec<f64>,
    digits: usize,
    /// The key whose weight must become the largest.
    goal: Option<String>,
}

fn widget() -> Widget {
    let lesson::Widget { root, page, example, digits, block } = lesson().widget("drag-query");
    let start = match block.get("query") {
        Some(toml::Value::String(token)) => example.queries[example.index(token)].clone(),
        Some(toml::Value::Array(xs)) => {
            xs.iter().map(|x| x.as_float().or(x.as_integer().map(|i| i as f64)).expect("a number")).collect()
        }
        _ => panic!("{root} declares no starting query"),
    };
    let goal =
        block.get("goal").and_then(|g| g.get("largest")).and_then(toml::Value::as_str).map(str::to_string);
    Widget { root, page, example, start, digits, goal }
}

/// What the widget shows at one moment.
#[derive(Debug, Clone, PartialEq)]
struct Shown {
    /// `data-qkv-query`, parsed.
    query: Vec<f64>,
    /// Every `data-qkv-readout` by name, as its text.
    readouts: BTreeMap<String, String>,
    /// `data-qkv-met` of the goal.
    met: Option<String>,
    goal_visible: bool,
    /// Each line's stroke width and each bar's area, by key label.
    lines: BTreeMap<String, f64>,
    bars: BTreeMap<String, f64>,
    /// The centre of the handle on screen.
    handle: Point,
}

fn read(b: &mut Browser, w: &Widget) -> Shown {
    let v = b.eval(&format!(
        "(() => {{ const root = document.querySelector({root});
           const all = (sel) => Array.from(root.querySelectorAll(sel));
           const readouts = Object.fromEntries(all('[data-qkv-readout]').map((e) => [e.dataset.qkvReadout, e.textContent.trim()]));
           const lines = Object.fromEntries(all('[data-qkv-line]').map((e) => [e.dataset.qkvLine, parseFloat(getComputedStyle(e).strokeWidth)]));
           const bars = Object.fromEntries(all('[data-qkv-bar]').map((e) => {{ const r = e.getBoundingClientRect(); return [e.dataset.qkvBar, r.width * r.height]; }}));
           const goal = root.querySelector('[data-qkv-goal]');
           const h = root.querySelector('[data-qkv-handle]').getBoundingClientRect();
           return {{ query: root.dataset.qkvQuery ?? null, readouts, lines, bars,
                     met: goal ? goal.dataset.qkvMet ?? null : null, goalVisible: goal ? {visible}(goal) : false,
                     handle: {{ x: h.left + h.width / 2, y: h.top + h.height / 2 }} }}; }})()",
        root = js(&w.root),
        visible = super::dom::VISIBLE,
    ));
    let query = v["query"].as_str().unwrap_or_else(|| panic!("{} has no data-qkv-query", w.root));
    let query = query
        .split(',')
        .map(|x| x.trim().parse().unwrap_or_else(|_| panic!("data-qkv-query {query:?}")))
        .collect();
    let numbers = |m: &Value| {
        m.as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_f64().unwrap_or(f64::NAN)))
            .collect()
    };
    Shown {
        query,
        readouts: v["readouts"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect(),
        met: v["met"].as_str().map(str::to_string),
        goal_visible: v["goalVisible"] == Value::Bool(true),
        lines: numbers(&v["lines"]),
        bars: numbers(&v["bars"]),
        handle: Point { x: v["handle"]["x"].as_f64().expect("x"), y: v["handle"]["y"].as_f64().expect("y") },
    }
}

/// Every difference between what the widget shows and the engine's reference at the query the
/// widget reports: readouts (to half a unit in the last of `digits` places), the order of line
/// widths and bar sizes, and the goal check.
fn mismatches(w: &Widget, shown: &Shown) -> Vec<String> {
    let trace = w.example.trace(&shown.query);
    let mut expected: Vec<(String, f64)> = Vec::new();
    for (i, label) in w.example.labels.iter().enumerate() {
        expected.push((format!("dot:{label}"), trace.dot_products[i]));
        expected.push((format!("score:{label}"), trace.scores[i]));
        expected.push((format!("weight:{label}"), trace.weights[i]));
    }
    match trace.output.as_slice() {
        [only] => expected.push(("output".into(), *only)),
        components => {
            expected.extend(components.iter().enumerate().map(|(c, &x)| (format!("output:{}", c + 1), x)));
        }
    }
    let half_unit = 0.5 * 10f64.powi(-(w.digits as i32));
    let mut out = Vec::new();
    for (name, reference) in &expected {
        match shown.readouts.get(name).map(|t| (t, parse_shown(t))) {
            None => out.push(format!("no readout {name} (the engine says {reference:.6})")),
            Some((text, None)) => out.push(format!("{name} shows {text:?}, not a number")),
            Some((text, Some((value, decimals)))) => {
                if (value - reference).abs() > half_unit + 1e-12 {
                    out.push(format!("{name} shows {text}, the engine says {reference:.6}"));
                }
                if decimals != w.digits {
                    out.push(format!("{name} shows {text} with {decimals} decimals, not {}", w.digits));
                }
            }
        }
    }
    // Thicker line and bigger bar for a clearly larger weight.
    for (sizes, what) in [(&shown.lines, "line width"), (&shown.bars, "bar size")] {
        for (i, a) in w.example.labels.iter().enumerate() {
            for (j, b) in w.example.labels.iter().enumerate() {
                if trace.weights[i] > trace.weights[j] + 0.01 {
                    match (sizes.get(a), sizes.get(b)) {
                        (Some(x), Some(y)) if x > y => {}
                        (Some(x), Some(y)) => {
                            out.push(format!("{what} of {a} ({x:.2}) is not above {b}'s ({y:.2})"))
                        }
                        _ => out.push(format!("no {what} for {a} or {b}")),
                    }
                }
            }
        }
    }
    if let Some(goal) = &w.goal {
        let g = w.example.index(goal);
        let others = trace
            .weights
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != g)
            .map(|(_, &x)| x)
            .fold(f64::MIN, f64::max);
        let margin = trace.weights[g] - others;
        // The check follows the query: met exactly while the goal key strictly leads (a tie, as
        // at the start where love and NLP are equal, is not met). Margins within rounding of a
        // tie are left alone.
        let expected = if margin > 1e-9 {
            Some("true")
        } else if margin < -1e-9 {
            Some("false")
        } else {
            None
        };
        match (shown.met.as_deref(), expected) {
            (None, _) => out.push("no data-qkv-goal with data-qkv-met".into()),
            (Some(got), Some(want)) if got != want => out.push(format!(
                "goal check says data-qkv-met={got}, but {goal}'s weight leads the others by {margin:.6}"
            )),
            _ => {}
        }
        if shown.met.as_deref() == Some("true") && !shown.goal_visible {
            out.push("the goal is met but its check is not visible".into());
        }
    }
    out
}

fn assert_engine(w: &Widget, shown: &Shown, when: &str) {
    let wrong = mismatches(w, shown);
    assert!(
        wrong.is_empty(),
        "{when}, at query {:?}:\n  {}\nshown: {shown:#?}",
        shown.query,
        wrong.join("\n  ")
    );
}

/// The widget's plane on screen, scrolled into view: (left, top, width, height).
fn plane(b: &mut Browser, w: &Widget) -> (f64, f64, f64, f64) {
    let r = b.eval(&format!(
        "(() => {{ const p = document.querySelector({}); p.scrollIntoView({{ block: 'center', behavior: 'instant' }});
           const r = p.getBoundingClientRect(); return [r.left, Math.max(r.top, 0), r.width, Math.min(r.bottom, innerHeight) - Math.max(r.top, 0)]; }})()",
        js(&format!("{} [data-qkv-plane]", w.root))
    ));
    let n = |i: usize| r[i].as_f64().expect("plane geometry");
    (n(0), n(1), n(2), n(3))
}

/// Points inside the plane (fractions of its box, away from the edges).
fn targets(plane: (f64, f64, f64, f64), fractions: &[(f64, f64)]) -> Vec<Point> {
    let (left, top, width, height) = plane;
    fractions.iter().map(|&(fx, fy)| Point { x: left + fx * width, y: top + fy * height }).collect()
}

/// `n` points from `from` to `to`, excluding `from`.
fn path(from: Point, to: Point, n: usize) -> Vec<Point> {
    (1..=n)
        .map(|i| {
            let t = i as f64 / n as f64;
            Point { x: from.x + t * (to.x - from.x), y: from.y + t * (to.y - from.y) }
        })
        .collect()
}

/// JavaScript: has the widget's `data-qkv-query` moved away from `before`?
fn query_moved(w: &Widget, before: &[f64]) -> String {
    let before = before.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>();
    format!(
        "document.querySelector({}).dataset.qkvQuery.split(',').map(Number).some((x, i) => Math.abs(x - [{}][i]) > 1e-12)",
        js(&w.root),
        before.join(",")
    )
}

fn wait_for_query_change(b: &mut Browser, w: &Widget, before: &[f64]) {
    b.wait_for(
        &query_moved(w, before),
        "data-qkv-query to change",
        &format!("document.querySelector({}).dataset.qkvQuery", js(&w.root)),
    );
}

fn close(a: &[f64], b: &[f64], tolerance: f64) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tolerance)
}

#[test]
fn at_the_starting_query_every_readout_is_the_number_the_build_wrote() {
    let Some(mut b) = launch_with(DESKTOP, false) else { return };
    let w = widget();
    // The build's own numbers: the widget's no-script view.
    b.open(&w.page);
    let static_text = b.text(&w.root);
    let static_readouts: BTreeMap<String, String> = serde_json::from_value(b.eval(&format!(
        "Object.fromEntries(Array.from(document.querySelectorAll({})).map((e) => [e.dataset.qkvReadout, e.textContent.trim()]))",
        js(&format!("{} [data-qkv-readout]", w.root))
    )))
    .expect("readouts");

    b.set_javascript(true);
    b.open(&w.page);
    let shown = read(&mut b, &w);
    assert!(
        close(&shown.query, &w.start, 0.0),
        "the widget starts at {:?}, the lesson says {:?}",
        shown.query,
        w.start
    );
    assert_engine(&w, &shown, "at the start");
    assert!(!shown.readouts.is_empty(), "the widget shows no readouts");
    if w.goal.is_some() {
        assert_eq!(shown.met.as_deref(), Some("false"), "the goal is met before the learner moved the query");
    }
    for (name, text) in &shown.readouts {
        match static_readouts.get(name) {
            Some(built) => {
                assert_eq!(text, built, "readout {name}: the script shows {text}, the build wrote {built}")
            }
            None => assert!(
                static_text
                    .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '\u{2212}'))
                    .any(|t| t == text),
                "readout {name} shows {text}, which the build's no-script view of the widget does not contain"
            ),
        }
    }
    b.assert_clean("the drag widget at its start");
}

#[test]
fn dragging_the_query_with_the_mouse_shows_the_engines_numbers() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let w = widget();
    b.open(&w.page);
    let area = plane(&mut b, &w);
    let spots =
        targets(area, &[(0.75, 0.3), (0.25, 0.22), (0.6, 0.72), (0.85, 0.82), (0.3, 0.6), (0.5, 0.15)]);
    let mut queries: Vec<Vec<f64>> = Vec::new();
    let mut previous = read(&mut b, &w);
    for (n, &to) in spots.iter().enumerate() {
        let from = previous.handle;
        b.mouse_down(from);
        let steps = path(from, to, 8);
        for (i, &p) in steps.iter().enumerate() {
            b.mouse_move(p, true);
            if i == 3 {
                // Mid-drag, button still down: the numbers follow the pointer already.
                wait_for_query_change(&mut b, &w, &previous.query);
                let live = read(&mut b, &w);
                assert_engine(&w, &live, &format!("drag {}, mid-way", n + 1));
            }
        }
        b.mouse_up(to);
        let shown = read(&mut b, &w);
        assert_engine(&w, &shown, &format!("after mouse drag {} to ({:.0}, {:.0})", n + 1, to.x, to.y));
        let (dx, dy) = (shown.handle.x - to.x, shown.handle.y - to.y);
        assert!(
            dx.hypot(dy) <= 6.0,
            "drag {}: the handle sits at {:?}, the pointer was released at {to:?}",
            n + 1,
            shown.handle
        );
        // The plane's x axis points right and its y axis up.
        let (sx, sy) = (to.x - from.x, to.y - from.y);
        let (qx, qy) = (shown.query[0] - previous.query[0], shown.query[1] - previous.query[1]);
        assert!(
            sx * qx > 0.0 && sy * qy < 0.0,
            "drag {}: pointer moved ({sx:.0}, {sy:.0}) px, query moved ({qx:.3}, {qy:.3})",
            n + 1
        );
        queries.push(shown.query.clone());
        previous = shown;
    }
    for (i, a) in queries.iter().enumerate() {
        assert!(queries[..i].iter().all(|b| !close(a, b, 1e-6)), "two drags gave the same query {a:?}");
    }
    b.screenshot_of(&w.root, &screenshot_path("attention-1280-widget-dragged"));
    b.assert_clean("mouse drags");
}

#[test]
fn a_touch_drag_moves_the_query_without_scrolling_the_page() {
    let Some(mut b) = launch(PHONE) else { return };
    let w = widget();
    b.open(&w.page);
    let area = plane(&mut b, &w);
    let mut previous = read(&mut b, &w);
    // The last drag is straight up: a page that lets the browser pan vertically over the plane
    // (`touch-action: pan-y`) scrolls there instead of moving the handle.
    for (n, &to) in targets(area, &[(0.8, 0.25), (0.2, 0.7), (0.2, 0.15)]).iter().enumerate() {
        let scrolled = b.eval("scrollY");
        let mut finger = vec![previous.handle];
        finger.extend(path(previous.handle, to, 8));
        b.touch_drag(&finger);
        // Either the handle followed the finger or the page scrolled: wait for whichever.
        b.wait_for(
            &format!("scrollY !== {scrolled} || {}", query_moved(&w, &previous.query)),
            &format!("touch drag {} to move the query", n + 1),
            &format!("document.querySelector({}).dataset.qkvQuery", js(&w.root)),
        );
        let (now, shown) = (b.eval("scrollY"), read(&mut b, &w));
        // Saved before the checks, so that a failing drag leaves its picture behind (and after
        // reading the page: a capture beyond the viewport may nudge the scroll by a pixel).
        b.screenshot_of(&w.root, &screenshot_path("attention-360-widget-touched"));
        assert_engine(&w, &shown, &format!("after touch drag {}", n + 1));
        assert_eq!(
            now,
            scrolled,
            "touch drag {} scrolled the page instead of moving the handle (touch-action?)",
            n + 1
        );
        let (dx, dy) = (shown.handle.x - to.x, shown.handle.y - to.y);
        assert!(
            dx.hypot(dy) <= 6.0,
            "touch drag {}: the handle sits at {:?}, the finger lifted at {to:?}",
            n + 1,
            shown.handle
        );
        previous = read(&mut b, &w);
    }
    b.assert_clean("touch drags");
}

#[test]
fn the_keyboard_moves_the_query_by_small_and_shift_steps_and_reset_restores_it() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let w = widget();
    b.open(&w.page);
    let handle = format!("{} [data-qkv-handle]", w.root);
    assert_eq!(b.attr(&handle, "role").as_deref(), Some("slider"), "the handle's role");
    assert!(
        b.attr(&handle, "aria-label").is_some_and(|l| !l.trim().is_empty()),
        "the handle has no aria-label"
    );
    let initial = read(&mut b, &w);
    b.focus(&handle);
    // (key, modifiers, the move it makes in query units): a small step, a larger one with Shift.
    let moves: [(Key, u32, [f64; 2]); 6] = [
        (ARROW_RIGHT, 0, [0.05, 0.0]),
        (ARROW_UP, 0, [0.0, 0.05]),
        (ARROW_LEFT, 0, [-0.05, 0.0]),
        (ARROW_DOWN, 0, [0.0, -0.05]),
        (ARROW_RIGHT, SHIFT, [0.25, 0.0]),
        (ARROW_DOWN, SHIFT, [0.0, -0.25]),
    ];
    let mut expected = w.start.clone();
    let mut before = initial.query.clone();
    for (key, modifiers, step) in moves {
        b.press(key, modifiers);
        expected = vec![expected[0] + step[0], expected[1] + step[1]];
        wait_for_query_change(&mut b, &w, &before);
        let shown = read(&mut b, &w);
        let name = format!("{}{}", if modifiers == SHIFT { "Shift+" } else { "" }, key.key);
        assert!(
            close(&shown.query, &expected, 1e-9),
            "{name}: the query is {:?}, expected {expected:?}",
            shown.query
        );
        assert_engine(&w, &shown, &format!("after {name}"));
        before = shown.query;
    }
    b.click(&format!("{} [data-qkv-reset]", w.root));
    wait_for_query_change(&mut b, &w, &before);
    let reset = read(&mut b, &w);
    assert!(
        close(&reset.query, &w.start, 1e-12),
        "reset gave {:?}, not the start {:?}",
        reset.query,
        w.start
    );
    assert_eq!(reset.readouts, initial.readouts, "after reset the readouts differ from the start");
    b.assert_clean("the keyboard");
}

#[test]
fn the_goal_check_appears_once_the_goal_keys_weight_is_the_largest() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let w = widget();
    let Some(goal) = w.goal.clone() else {
        panic!("the drag widget declares no goal (issue 8: a visible check once met)")
    };
    b.open(&w.page);
    plane(&mut b, &w);
    let start = read(&mut b, &w);
    assert_engine(&w, &start, "at the start");
    assert_eq!(start.met.as_deref(), Some("false"), "the goal is met before the learner moved the query");
    // Where the goal key sits on screen: the end of its line away from the handle.
    let ends = b.eval(&format!(
        "(() => {{ const l = document.querySelector({}); const m = l.getScreenCTM();
           const at = (s) => {{ const p = l.getPointAtLength(s); return [m.a * p.x + m.c * p.y + m.e, m.b * p.x + m.d * p.y + m.f]; }};
           return [at(0), at(l.getTotalLength())]; }})()",
        js(&format!("{} [data-qkv-line=\"{goal}\"]", w.root))
    ));
    let point = |v: &Value| Point { x: v[0].as_f64().expect("x"), y: v[1].as_f64().expect("y") };
    let (a, c) = (point(&ends[0]), point(&ends[1]));
    let far = |p: Point| (p.x - start.handle.x).hypot(p.y - start.handle.y);
    let key = if far(a) > far(c) { a } else { c };
    b.mouse_down(start.handle);
    for p in path(start.handle, key, 10) {
        b.mouse_move(p, true);
    }
    b.mouse_up(key);
    let there = read(&mut b, &w);
    assert_engine(&w, &there, &format!("on the key of {goal}"));
    assert_eq!(
        there.met.as_deref(),
        Some("true"),
        "the goal is not met with the query on {goal}'s key: {there:#?}"
    );
    b.assert_clean("the goal");
}
