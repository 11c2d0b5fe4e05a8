//! A near miss: an answer off only because the learner rounded along the way (the key less one
//! unit in its last shown place, as 0.730 for 0.731) is told to keep more decimals and uses no
//! try, so a right answer next still earns full credit. The band comes from the lesson's rule.

use super::cdp::DESKTOP;
use super::lesson::lesson;
use super::quiz::{Expect, NUMERIC, enter, expect, key, near};
use super::{launch, screenshot_path};

#[test]
fn a_near_miss_says_so_and_uses_no_try() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(NUMERIC);
    let (key, digits, tolerance) = key(section, quiz);
    let unit = 10f64.powi(-(digits as i32));
    assert!(unit > tolerance && unit < near(quiz, key, digits), "one unit off is not a near miss here");
    b.open(&format!("{}.html", section.id));
    let early = format!("{:.*}", digits, key - unit);
    enter(&mut b, NUMERIC, &early, true);
    let shown =
        expect(&mut b, NUMERIC, Expect { state: "unanswered", credit: 0.0, tries: 0, outcome: "near-miss" });
    assert!(shown.message.contains("keep more decimals"), "the near miss says {:?}", shown.message);
    b.screenshot_of(&format!("[data-qkv-quiz=\"{NUMERIC}\"]"), &screenshot_path("attention-1280-near-miss"));
    enter(&mut b, NUMERIC, &format!("{key:.digits$}"), true);
    expect(
        &mut b,
        NUMERIC,
        Expect { state: "right", credit: section.credit[0], tries: 0, outcome: "right-first" },
    );
    b.assert_clean("a near miss");
}
