//! The clickable attention matrix: its weights and row sums are the engine's, and each row, picked
//! by a click, by Enter or by Space, opens that query's worked steps and shows its row sum.

use super::cdp::DESKTOP;
use super::dom::parse_shown;
use super::lesson::{Widget, lesson};
use super::{launch, screenshot_path};

#[test]
fn the_matrix_shows_the_engines_weights_and_opens_each_rows_steps() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let Widget { root, page, example, digits, .. } = lesson().widget("attention-matrix");
    let (weights, outputs) = example.self_attention();

    b.open(&page);
    let half_unit = 0.5 * 10f64.powi(-(digits as i32));
    // Each readout: its value, and shown at the widget's digits.
    let number = |text: &str| -> f64 {
        match parse_shown(text) {
            Some((value, decimals)) if decimals == digits => value,
            _ => panic!("{text:?} is not a number shown with {digits} decimals"),
        }
    };
    for (r, row) in example.labels.iter().enumerate() {
        for (k, key) in example.labels.iter().enumerate() {
            let text = b.text(&format!("{root} [data-qkv-readout=\"weight:{row}:{key}\"]"));
            let (shown, engine) = (number(&text), weights[[r, k]]);
            assert!(
                (shown - engine).abs() <= half_unit + 1e-12,
                "weight {row}→{key} shows {text}, the engine says {engine:.6}"
            );
        }
        let steps = format!("{root} [data-qkv-steps=\"{row}\"]");
        assert!(!b.visible(&steps), "the steps of {row} are open before the row is picked");
    }

    // Pick one row each way a learner can: the mouse, Enter, Space.
    for (n, row) in example.labels.iter().enumerate().take(3) {
        let selector = format!("{root} [data-qkv-row=\"{row}\"]");
        assert_eq!(b.attr(&selector, "role").as_deref(), Some("button"), "row {row}'s role");
        assert_eq!(b.attr(&selector, "tabindex").as_deref(), Some("0"), "row {row} is not in the tab order");
        let how = b.activate(&selector, n);
        let steps = format!("{root} [data-qkv-steps=\"{row}\"]");
        b.wait_for(
            &format!("{}(document.querySelector({}))", super::dom::VISIBLE, super::dom::js(&steps)),
            &format!("row {row}'s steps to open after {how}"),
            &format!("document.querySelector({}).outerHTML.slice(0, 300)", super::dom::js(&selector)),
        );
        assert_eq!(b.attr(&selector, "aria-expanded").as_deref(), Some("true"), "row {row} after {how}");
        // The steps end on the output (an exact one may be shown without trailing zeros).
        let output = outputs[[example.index(row), 0]];
        let text = b.text(&steps).replace('\u{2212}', "-");
        let last = text
            .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
            .filter_map(|t| t.trim_end_matches('.').parse::<f64>().ok())
            .next_back();
        assert!(
            last.is_some_and(|x| (x - output).abs() <= half_unit + 1e-12),
            "row {row}'s steps end on {last:?}, not the engine's output {output:.6}: {text}"
        );
        let sum = format!("{root} [data-qkv-readout=\"row-sum:{row}\"]");
        assert!(b.visible(&sum), "picking row {row} by {how} does not show its row sum");
        let engine: f64 = (0..example.labels.len()).map(|k| weights[[example.index(row), k]]).sum();
        let shown = b.text(&sum);
        assert!(
            (number(&shown) - engine).abs() <= half_unit + 1e-12,
            "row-sum {row} shows {shown}, the engine says {engine:.6}"
        );
        // Each row's output beside its weights, as the lesson's weights table shows it.
        let cell = format!("{root} [data-qkv-readout=\"output:{row}\"]");
        let shown = b.text(&cell);
        assert!(
            (number(&shown) - output).abs() <= half_unit + 1e-12,
            "output {row} shows {shown}, the engine says {output:.6}"
        );
    }
    b.screenshot_of(&root, &screenshot_path("attention-1280-matrix-rows-open"));
    b.assert_clean("the attention matrix");
}
