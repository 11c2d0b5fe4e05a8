//! A near miss: an answer off only because the learner rounded along the way (the key less one
//! unit in its last shown place, as 0.730 for 0.731) is told to keep more decimals and uses no
//! try, so a right answer next still earns full credit. The band comes from the lesson's rule.
//! A whole-number key (a count, a dot product of whole numbers) has no band: an off-by-one
//! there is a wrong try that says which way it is off.

use super::cdp::DESKTOP;
use super::lesson::lesson;
use super::quiz::{Expect, NUMERIC, enter, expect, key, near};

/// A numeric check whose key is a whole number: the dot product of two whole-number vectors.
const WHOLE: &str = "raw_dot";
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

#[test]
fn an_off_by_one_count_costs_a_try() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(WHOLE);
    let (key, _, _) = key(section, quiz);
    assert_eq!(key, key.trunc(), "{WHOLE}'s key {key} is a whole number");
    assert!(quiz.block.get("near_miss").is_none(), "{WHOLE} declares no band of its own");
    b.open(&format!("{}.html", section.id));
    let band = b.eval(&format!(
        "JSON.parse(document.querySelector('[data-qkv-quiz=\"{WHOLE}\"] script[data-qkv-key]').textContent).near"
    ));
    assert_eq!(band.as_f64(), Some(0.0), "the page's key has no near-miss band");
    enter(&mut b, WHOLE, &format!("{}", key - 1.0), true);
    let low = expect(&mut b, WHOLE, Expect { state: "wrong", credit: 0.0, tries: 1, outcome: "wrong" });
    assert!(low.message.starts_with("Too low."), "one below says {:?}", low.message);
    enter(&mut b, WHOLE, &format!("{}", key + 1.0), true);
    let high = expect(&mut b, WHOLE, Expect { state: "wrong", credit: 0.0, tries: 2, outcome: "wrong" });
    assert!(high.message.starts_with("Too high."), "one above says {:?}", high.message);
    b.screenshot_of(&format!("[data-qkv-quiz=\"{WHOLE}\"]"), &screenshot_path("attention-1280-off-by-one"));
    enter(&mut b, WHOLE, &format!("{key}"), true);
    expect(
        &mut b,
        WHOLE,
        Expect { state: "right", credit: section.credit[2], tries: 2, outcome: "right-later" },
    );
    b.assert_clean("an off-by-one count");
}

/// A percentage for a count grades how the number is written, not the number, and uses no try
/// (`K%` read as `K / 100` would be "too low"); one comma before three digits is read both ways
/// (`1,000`: 1 or 1000), and where the readings fall on either side of the key it is a wrong try
/// whose feedback says which way each is off, giving no direction away for free.
#[test]
fn a_count_as_a_percentage_uses_no_try_and_a_comma_is_read_both_ways() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(WHOLE);
    let (key, _, _) = key(section, quiz);
    assert!(key > 1.0 && key < 1000.0, "{WHOLE}'s key {key} lies between the readings of 1,000");
    b.open(&format!("{}.html", section.id));
    enter(&mut b, WHOLE, &format!("{key}%"), true);
    let unanswered = Expect { state: "unanswered", credit: 0.0, tries: 0, outcome: "not-a-percentage" };
    let percent = expect(&mut b, WHOLE, unanswered);
    assert!(
        percent.message.contains("without the % sign"),
        "a count as a percentage says {:?}",
        percent.message
    );
    enter(&mut b, WHOLE, "1,000", true);
    let comma = expect(&mut b, WHOLE, Expect { state: "wrong", credit: 0.0, tries: 1, outcome: "wrong" });
    assert!(
        comma.message.starts_with("Not right either way: 1.000 is too low and 1000 too high."),
        "1,000 says {:?}",
        comma.message
    );
    b.screenshot_of(
        &format!("[data-qkv-quiz=\"{WHOLE}\"]"),
        &screenshot_path("attention-1280-comma-either-way"),
    );
    enter(&mut b, WHOLE, &format!("{key}"), true);
    expect(
        &mut b,
        WHOLE,
        Expect { state: "right", credit: section.credit[1], tries: 1, outcome: "right-later" },
    );
    b.assert_clean("a count as a percentage, a comma read both ways");
}

/// A numeric check whose key has decimals but is no share of a whole: a scaled score.
const SCORE: &str = "scaled_score";

/// A percentage is a way to write a share of a whole (a weight), not any number: on a scaled
/// score it uses no try even where its value would match (`424.3%` for 4.243), and the number
/// without the sign is right.
#[test]
fn a_score_as_a_percentage_uses_no_try() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(SCORE);
    let (key, digits, _) = key(section, quiz);
    assert!(key > 0.0 && digits >= 2, "{SCORE}'s key {key} reads as a percentage");
    assert!(quiz.block.get("share").is_none(), "{SCORE} is no share of a whole");
    b.open(&format!("{}.html", section.id));
    enter(&mut b, SCORE, &format!("{:.*}%", digits - 2, key * 100.0), true);
    let unanswered = Expect { state: "unanswered", credit: 0.0, tries: 0, outcome: "not-a-percentage" };
    let said = expect(&mut b, SCORE, unanswered);
    assert!(said.message.contains("without the % sign"), "a score as a percentage says {:?}", said.message);
    enter(&mut b, SCORE, &format!("{key:.digits$}"), true);
    expect(
        &mut b,
        SCORE,
        Expect { state: "right", credit: section.credit[0], tries: 0, outcome: "right-first" },
    );
    b.assert_clean("a score as a percentage");
}
