//! The position-sweep widget: choosing each query position, by mouse and by keyboard, shows the
//! positions, the rotated query and key, and both scores of that point of the positions block's
//! sweep (the course's RoPE and sinusoids, checked against complex multiplication and NumPy in
//! the other tests); the RoPE score is the same at every position; each move is announced.

use super::cdp::{ARROW_RIGHT, DESKTOP, PHONE};
use super::dom::{js, parse_shown};
use super::lesson::lesson;
use super::{launch, screenshot_path};

struct Widget {
    root: String,
    page: String,
    section: String,
    block: String,
    points: usize,
    digits: usize,
}

fn widget() -> Widget {
    let w = lesson().widget_names("position-sweep");
    let points = lesson().names(&w.section, &format!("{}.sweep", w.example), "rope_score").len();
    assert!(points >= 3, "a sweep of {points} points is too short to test");
    Widget { root: w.root, page: w.page, section: w.section, block: w.example, points, digits: w.digits }
}

/// Every readout of point `s` (from 1) against the record.
fn assert_point(b: &mut super::cdp::Browser, w: &Widget, s: usize) {
    let path = |leaf: &str| format!("{}.sweep.{s}.{leaf}", w.block);
    let number = |leaf: &str| vec![lesson().number(&w.section, &path(leaf))];
    let expected = [
        ("query-position", number("query_position")),
        ("key-position", number("key_position")),
        ("rope-query", lesson().vector(&w.section, &path("rope_query"))),
        ("rope-key", lesson().vector(&w.section, &path("rope_key"))),
        ("rope-score", number("rope_score")),
        ("sinusoid-score", number("sinusoid_score")),
    ];
    let half_unit = 0.5 * 10f64.powi(-(w.digits as i32));
    for (name, numbers) in expected {
        let shown = b.text(&format!("{} [data-qkv-readout=\"{name}\"]", w.root));
        let parts: Vec<&str> = shown.trim().trim_matches(['(', ')']).split(", ").collect();
        let ok = parts.len() == numbers.len()
            && parts.iter().zip(&numbers).all(|(t, &x)| {
                parse_shown(t).is_some_and(|(value, d)| {
                    (value - x).abs() <= half_unit + 1e-12 && (d == w.digits || value == x)
                })
            });
        assert!(ok, "point {s}: {name} shows {shown:?}, the record says {numbers:?}");
    }
}

fn choice(w: &Widget, i: usize) -> String {
    format!("{} [data-qkv-control=\"position\"] input[value=\"{i}\"]", w.root)
}

#[test]
fn the_position_sweep_widget_shows_every_point_and_the_rope_score_stays_put() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let w = widget();
    b.open(&w.page);
    assert!(b.visible(&format!("{} .controls", w.root)), "the controls are hidden with the script on");
    assert_point(&mut b, &w, 1);
    let first = b.text(&format!("{} [data-qkv-readout=\"rope-score\"]", w.root));
    b.screenshot_of(&w.root, &screenshot_path("positions-1280-position-sweep-start"));
    for i in 1..w.points {
        if i % 2 == 1 {
            b.click(&choice(&w, i));
        } else {
            b.focus(&choice(&w, i - 1));
            b.press(ARROW_RIGHT, 0);
        }
        let position = lesson().number(&w.section, &format!("{}.sweep.{}.query_position", w.block, i + 1));
        b.wait_for(
            &format!("document.querySelector({}).dataset.qkvPosition === '{position}'", js(&w.root)),
            &format!("the query at position {position}"),
            &format!("document.querySelector({}).dataset.qkvPosition", js(&w.root)),
        );
        assert_point(&mut b, &w, i + 1);
        let score = b.text(&format!("{} [data-qkv-readout=\"rope-score\"]", w.root));
        assert_eq!(score, first, "the RoPE score moved with the query");
        let announce = b.text(&format!("{} [data-qkv-announce]", w.root));
        assert!(
            announce.contains(&format!("Query at {position}")) && announce.contains(&score),
            "announced: {announce}"
        );
    }
    b.screenshot_of(&w.root, &screenshot_path("positions-1280-position-sweep-last"));
    b.assert_clean("the position-sweep widget");

    let Some(mut b) = launch(PHONE) else { return };
    b.open(&w.page);
    let at = b.center(&choice(&w, 2));
    b.touch_drag(&[at]);
    b.wait_for(
        &format!(
            "document.querySelector({}).dataset.qkvPosition !== '{}'",
            js(&w.root),
            lesson().number(&w.section, &format!("{}.sweep.1.query_position", w.block))
        ),
        "a tap to move the query",
        "''",
    );
    assert_point(&mut b, &w, 3);
    b.screenshot_of(&w.root, &screenshot_path("positions-360-position-sweep"));
    b.assert_clean("the position-sweep widget on a phone");
}
