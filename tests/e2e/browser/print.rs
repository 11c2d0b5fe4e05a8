//! The print view: the whole course on one page, in course order, with no script, so no control;
//! in print media (`Emulation.setEmulatedMedia`) no navigation, search or progress shows, every
//! answer stays collapsed, and figures come at print size.

use serde_json::{Value, json};

use super::cdp::DESKTOP;
use super::lesson::lesson;
use super::{launch, screenshot_path};

#[test]
fn the_print_view_holds_the_whole_course_and_prints_without_controls() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let lesson = lesson();
    b.open("print.html");
    let order = b.eval("Array.from(document.querySelectorAll('.print-section'), (s) => s.id)");
    let ids: Vec<&str> = lesson.sections.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(order, json!(ids), "the sections of the print view");
    let quizzes: usize = lesson.sections.iter().map(|s| s.quizzes.len()).sum();
    assert_eq!(b.count("[data-qkv-quiz]"), quizzes, "every check and practice problem is printed");
    assert_eq!(b.count("script[src]"), 0, "the print view loads a script");
    let duplicates = b.eval(
        "(() => { const ids = Array.from(document.querySelectorAll('[id]'), (e) => e.id); return ids.filter((x, i) => ids.indexOf(x) !== i); })()",
    );
    assert_eq!(duplicates, json!([]), "ids repeated across sections");

    b.call("Emulation.setEmulatedMedia", json!({ "media": "print" }));
    let shown = |b: &mut super::cdp::Browser, selector: &str| {
        b.eval(&format!(
            "Array.from(document.querySelectorAll('{selector}')).filter((e) => e.getClientRects().length > 0).length"
        ))
    };
    for hidden in ["header", "button", "input", ".plane", ".course-bar", "nav.pager", ".search"] {
        assert_eq!(shown(&mut b, hidden), Value::from(0), "{hidden} shows in print");
    }
    assert_eq!(b.count("details[open]"), 0, "an answer is open in print");
    assert!(b.count("details.quiz-answer") > 0, "no collapsed answers in print");
    let widths =
        b.eval("Array.from(document.querySelectorAll('figure img'), (i) => i.getBoundingClientRect().width)");
    let widths: Vec<f64> = widths.as_array().expect("widths").iter().filter_map(Value::as_f64).collect();
    assert!(!widths.is_empty(), "no figure in the print view");
    // 11 cm at 96 px per inch.
    let print_size = 11.0 / 2.54 * 96.0;
    for w in &widths {
        assert!(
            (w - print_size).abs() < 2.0,
            "a figure is {w} px wide in print, not 11 cm ({print_size} px)"
        );
    }
    b.screenshot(&screenshot_path("print-1280-print-media"));
    b.call("Emulation.setEmulatedMedia", json!({ "media": "" }));
    b.assert_clean("the print view");
}
