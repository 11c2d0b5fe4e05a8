//! The tile stepper: walked forward and back with the mouse and the keyboard, every state it shows
//! holds the numbers of an online softmax computed here in plain f64 from the lesson's inputs
//! (independently of `trace_tiled`), and its last state the output of `qkv::reference::attention`,
//! to half a unit in the last shown place. Each step is said in a polite live region, the focus
//! stays on the button pressed, and without script the page shows every block in one table.

use std::collections::BTreeMap;

use ndarray::Array2;
use qkv::AttentionOptions;
use serde_json::Value;

use super::cdp::{Browser, DESKTOP, ENTER, PHONE, SPACE};
use super::dom::js;
use super::lesson::{self, lesson};
use super::{launch, launch_with, screenshot_path};

/// The lesson's tile-stepper and the inputs of the `qkv tiled` block it walks.
struct Stepper {
    root: String,
    page: String,
    digits: usize,
    query: Vec<f64>,
    keys: Vec<Vec<f64>>,
    values: Vec<Vec<f64>>,
    scale: f64,
    /// Keys per tile.
    block: usize,
}

fn stepper() -> Stepper {
    let lesson::Widget { root, page, digits, block, .. } = lesson().widget("tile-stepper");
    let section = lesson().section(page.trim_end_matches(".html"));
    let field = |t: &toml::Table, name: &str| -> String {
        t.get(name)
            .and_then(toml::Value::as_str)
            .unwrap_or_else(|| panic!("no `{name}` in {t:?}"))
            .to_string()
    };
    let tiled = section.block("tiled", &field(block, "example"));
    let (example, token) = (field(tiled, "example"), field(tiled, "query"));
    let keys_per_tile = tiled.get("block").and_then(toml::Value::as_integer).expect("a block size") as usize;
    // An example of another section is cited as `SECTION.ID`.
    let (home, id) = example.split_once('.').unwrap_or((section.id.as_str(), example.as_str()));
    let declared = lesson().section(home).block("attention", id);
    for mask in ["mask", "key_length", "key_padding", "window", "alibi", "from"] {
        assert!(
            !declared.contains_key(mask),
            "this test's online softmax has no masks and reads its inputs directly: example `{example}` declares `{mask}`"
        );
    }
    let inputs = lesson().example(home, id);
    let query = lesson().vector(home, &format!("{id}.queries.{token}"));
    assert!(!query.is_empty(), "example `{example}` has no query `{token}`");
    Stepper {
        root,
        page,
        digits,
        query,
        keys: inputs.keys,
        values: inputs.values,
        scale: inputs.scale,
        block: keys_per_tile,
    }
}

/// What the stepper should show in each state, by readout: the numbers, in the order shown.
type Expected = BTreeMap<&'static str, Vec<f64>>;

/// Every state: before the first tile, after each tile, the result. The online softmax of
/// Milakov and Gimelshein, written out here in plain f64; the result also from the reference.
fn expected(s: &Stepper) -> Vec<Expected> {
    let d_v = s.values[0].len();
    let (mut m, mut l, mut acc) = (f64::NEG_INFINITY, 0.0, vec![0.0; d_v]);
    let mut states = vec![Expected::from([("m", vec![m]), ("l", vec![l]), ("acc", acc.clone())])];
    // Each tile's own output and logsumexp, merged at the end.
    let mut parts: Vec<(Vec<f64>, f64)> = Vec::new();
    for start in (0..s.keys.len()).step_by(s.block) {
        let tile = start..(start + s.block).min(s.keys.len());
        let scores: Vec<f64> = s.keys[tile.clone()]
            .iter()
            .map(|k| s.scale * k.iter().zip(&s.query).map(|(a, b)| a * b).sum::<f64>())
            .collect();
        let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let m_new = m.max(max);
        let rescale = (m - m_new).exp();
        let exps: Vec<f64> = scores.iter().map(|x| (x - m_new).exp()).collect();
        let (l_before, m_before, acc_before) = (l, m, acc.clone());
        l = rescale * l + exps.iter().sum::<f64>();
        for (c, a) in acc.iter_mut().enumerate() {
            *a = rescale * *a + tile.clone().zip(&exps).map(|(j, e)| e * s.values[j][c]).sum::<f64>();
        }
        let own: f64 = scores.iter().map(|x| (x - max).exp()).sum();
        let own_output = (0..d_v).map(|c| {
            tile.clone().zip(&scores).map(|(j, x)| (x - max).exp() * s.values[j][c]).sum::<f64>() / own
        });
        let (own_output, own_lse): (Vec<f64>, f64) = (own_output.collect(), max + own.ln());
        parts.push((own_output.clone(), own_lse));
        m = m_new;
        states.push(Expected::from([
            ("scores", scores),
            // The tile's values and exponentials, from which the accumulator can be checked.
            ("values", s.values[tile.clone()].concat()),
            ("max", vec![max]),
            ("m", vec![m_before, m]),
            ("rescale", vec![rescale]),
            ("exp", exps),
            ("l", vec![l_before, l]),
            ("acc", [acc_before, acc.clone()].concat()),
            ("output", acc.iter().map(|a| a / l).collect()),
            ("partial", own_output),
            ("lse", vec![own_lse]),
        ]));
    }
    let lse = parts.iter().map(|(_, x)| x).fold(f64::NEG_INFINITY, |a, &b| a.max(b));
    let total: f64 = parts.iter().map(|(_, x)| (x - lse).exp()).sum();
    let merged = (0..d_v).map(|c| parts.iter().map(|(o, x)| (x - lse).exp() / total * o[c]).sum()).collect();
    let array = |rows: &[Vec<f64>]| {
        Array2::from_shape_vec((rows.len(), rows[0].len()), rows.concat()).expect("rectangular rows")
    };
    let (q, k, v) = (array(std::slice::from_ref(&s.query)), array(&s.keys), array(&s.values));
    let reference =
        qkv::reference::attention(q.view(), k.view(), v.view(), &AttentionOptions::new().scale(s.scale))
            .expect("the reference evaluates");
    states.push(Expected::from([
        ("m", vec![m]),
        ("l", vec![l]),
        ("acc", acc.clone()),
        ("output", acc.iter().map(|a| a / l).collect()),
        ("attention", reference.output.row(0).to_vec()),
        ("merged", merged),
    ]));
    states
}

/// The numbers in a readout's text, in order: `0.7071 → 2.1213`, `(1.0000, 0.4931)`, `-∞`. Each
/// finite one must be shown with `digits` decimals.
fn numbers(text: &str, digits: usize) -> Result<Vec<f64>, String> {
    text.replace('\u{2212}', "-")
        .split(|c: char| c == '→' || c == ',' || c == '(' || c == ')' || c.is_whitespace())
        .filter(|t| !t.is_empty())
        .map(|t| match t {
            "-∞" => Ok(f64::NEG_INFINITY),
            _ => match t.split_once('.') {
                Some((_, d)) if d.len() == digits => t.parse().map_err(|_| format!("{t:?} in {text:?}")),
                _ => Err(format!("{t:?} in {text:?} is not a number with {digits} decimals")),
            },
        })
        .collect()
}

/// What the stepper shows now: its state index, title, visible readouts, the live region's text.
struct Shown {
    step: usize,
    title: String,
    readouts: BTreeMap<String, String>,
    announce: String,
}

fn read(b: &mut Browser, s: &Stepper) -> Shown {
    let v = b.eval(&format!(
        "(() => {{ const root = document.querySelector({root});
           const shown = Array.from(root.querySelectorAll('[data-qkv-stepper] [data-qkv-readout]')).filter((e) => {visible}(e));
           return {{ step: root.dataset.qkvStep, title: root.querySelector('[data-qkv-title]').textContent,
                     readouts: Object.fromEntries(shown.map((e) => [e.dataset.qkvReadout, e.textContent.trim()])),
                     announce: root.querySelector('[data-qkv-announce]').textContent }}; }})()",
        root = js(&s.root),
        visible = super::dom::VISIBLE,
    ));
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    Shown {
        step: text(&v["step"]).parse().unwrap_or_else(|_| panic!("data-qkv-step is {}", v["step"])),
        title: text(&v["title"]),
        readouts: v["readouts"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), text(v)))
            .collect(),
        announce: text(&v["announce"]),
    }
}

/// Every difference between what the stepper shows and the state it should be in.
fn mismatches(shown: &Shown, step: usize, expected: &Expected, digits: usize) -> Vec<String> {
    let half_unit = 0.5 * 10f64.powi(-(digits as i32));
    let mut out = Vec::new();
    if shown.step != step {
        out.push(format!("data-qkv-step is {}, not {step}", shown.step));
    }
    let names: Vec<&str> = shown.readouts.keys().map(String::as_str).collect();
    let wanted: Vec<&str> = expected.keys().copied().collect();
    if names != wanted {
        out.push(format!("it shows the readouts {names:?}, not {wanted:?}"));
    }
    for (name, reference) in expected {
        let Some(text) = shown.readouts.get(*name) else { continue };
        match numbers(text, digits) {
            Err(e) => out.push(format!("{name}: {e}")),
            Ok(xs) if xs.len() != reference.len() => out
                .push(format!("{name} shows {text:?}, expected {} numbers: {reference:?}", reference.len())),
            Ok(xs) => {
                for (x, r) in xs.iter().zip(reference) {
                    let same = if r.is_finite() { (x - r).abs() <= half_unit + 1e-12 } else { x == r };
                    if !same {
                        out.push(format!("{name} shows {text:?}, the online softmax gives {reference:?}"));
                    }
                }
            }
        }
    }
    out
}

/// Checks the state and that the live region said it (the output so far, or the result).
fn check(b: &mut Browser, s: &Stepper, step: usize, states: &[Expected], how: &str) {
    let shown = read(b, s);
    let problems = mismatches(&shown, step, &states[step], s.digits);
    assert!(problems.is_empty(), "state {step} after {how} ({:?}):\n{}", shown.title, problems.join("\n"));
    if step > 0 && step < states.len() - 1 {
        assert!(
            shown.title.starts_with(&format!("Block {step} of ")),
            "state {step}'s title: {:?}",
            shown.title
        );
    }
    if let Some(output) = shown.readouts.get("output") {
        assert!(
            shown.announce.contains(output.as_str()),
            "after {how}, the live region says {:?}, without the output {output}",
            shown.announce
        );
    }
}

/// The button `which` of the stepper (`next` or `prev`).
fn button(s: &Stepper, which: &str) -> String {
    format!("{} [data-qkv-{which}]", s.root)
}

#[test]
fn the_tile_stepper_walks_every_block_with_the_numbers_of_an_online_softmax() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let s = stepper();
    let states = expected(&s);
    assert!(states.len() >= 5, "the stepper has {} states; the issue asks for at least five", states.len());
    b.open(&s.page);
    let announce = format!("{} [data-qkv-announce]", s.root);
    assert_eq!(b.attr(&announce, "aria-live").as_deref(), Some("polite"), "the live region");
    assert!(
        !b.visible(&format!("{} [data-qkv-all]", s.root)),
        "with script, the every-block table still shows beside the stepper"
    );
    check(&mut b, &s, 0, &states, "loading");
    assert_eq!(
        b.attr(&button(&s, "prev"), "aria-disabled").as_deref(),
        Some("true"),
        "Previous at the start"
    );

    // Forward to the end: the mouse, then Enter and Space on the focused button in turn.
    let next = button(&s, "next");
    for step in 1..states.len() {
        let how = b.activate(&next, step - 1);
        check(&mut b, &s, step, &states, how);
        if step == 2 {
            b.screenshot_of(&s.root, &screenshot_path("flash-attention-1280-tiles-block-2"));
        }
    }
    let last = states.len() - 1;
    assert_eq!(b.attr(&next, "aria-disabled").as_deref(), Some("true"), "Next at the end");
    b.screenshot_of(&s.root, &screenshot_path("flash-attention-1280-tiles-result"));
    // Past the end nothing moves, and the focus stays on the button.
    b.focus(&next);
    b.press(ENTER, 0);
    check(&mut b, &s, last, &states, "Enter on Next at the end");
    let focused = b.eval(&format!("document.activeElement === {}", super::dom::the(&next)));
    assert_eq!(focused, Value::Bool(true), "the focus left Next at the end");

    // And back, by keyboard and mouse, to the start.
    let prev = button(&s, "prev");
    for step in (0..last).rev() {
        if step % 2 == 0 {
            b.click(&prev);
        } else {
            b.focus(&prev);
            b.press(SPACE, 0);
        }
        check(&mut b, &s, step, &states, "Previous");
    }
    b.assert_clean("the tile stepper");
}

#[test]
fn without_script_the_tile_stepper_is_a_table_of_every_block() {
    let Some(mut b) = launch_with(DESKTOP, false) else { return };
    let s = stepper();
    let states = expected(&s);
    b.open(&s.page);
    assert!(!b.visible(&format!("{} [data-qkv-stepper]", s.root)), "the stepper shows without script");
    let table = format!("{} [data-qkv-all] tbody tr", s.root);
    let blocks = &states[1..states.len() - 1];
    assert_eq!(b.count(&table), blocks.len(), "one row per block");
    let rows = b.eval(&format!(
        "Array.from(document.querySelectorAll({})).map((r) => Array.from(r.cells).map((c) => c.textContent.trim()))",
        js(&table)
    ));
    let half_unit = 0.5 * 10f64.powi(-(s.digits as i32));
    for (k, (row, state)) in rows.as_array().expect("rows").iter().zip(blocks).enumerate() {
        let cell = |c: usize| row[c].as_str().unwrap_or_default().to_string();
        // block, keys, scores, values, block max, m, rescale, l, accumulator, output so far.
        let d_v = s.values[0].len();
        let columns = [
            (2, state["scores"].clone()),
            (3, state["values"].clone()),
            (4, state["max"].clone()),
            (5, vec![state["m"][1]]),
            (6, state["rescale"].clone()),
            (7, vec![state["l"][1]]),
            (8, state["acc"][d_v..].to_vec()),
            (9, state["output"].clone()),
        ];
        for (c, reference) in columns {
            let shown = numbers(&cell(c), s.digits).unwrap_or_else(|e| panic!("block {}: {e}", k + 1));
            assert!(
                shown.len() == reference.len()
                    && shown.iter().zip(&reference).all(|(x, r)| (x - r).abs() <= half_unit + 1e-12),
                "block {}, column {c}: the table shows {:?}, the online softmax gives {reference:?}",
                k + 1,
                cell(c)
            );
        }
    }
    b.screenshot_of(&s.root, &screenshot_path("flash-attention-1280-tiles-no-script"));
}

#[test]
fn the_tile_stepper_fits_a_phone() {
    let Some(mut b) = launch(PHONE) else { return };
    let s = stepper();
    let states = expected(&s);
    b.open(&s.page);
    for step in 1..=2 {
        b.click(&button(&s, "next"));
        check(&mut b, &s, step, &states, "a tap on Next");
    }
    let overflow = b.eval(&format!(
        "(() => {{ const r = document.querySelector({}).getBoundingClientRect(); return r.right <= document.documentElement.clientWidth + 0.5; }})()",
        js(&s.root)
    ));
    assert_eq!(overflow, Value::Bool(true), "the stepper is wider than the phone's column");
    b.screenshot_of(&s.root, &screenshot_path("flash-attention-360-tiles-block-2"));
    b.assert_clean("the tile stepper on a phone");
}
