use super::*;

/// Each formula of `tex`, its pieces joined by `|`.
fn check(tex: &str, expected: &[&str]) {
    let got: Vec<String> = display_pieces(tex).iter().map(|pieces| pieces.join(" | ")).collect();
    assert_eq!(got, expected, "{tex}");
}

#[test]
fn display_math_breaks_between_formulas_and_before_relations() {
    check(
        "s_i = \\frac{q \\cdot k_i}{\\sqrt{d_k}}, \\qquad a_i \\approx 0.7 \\quad o \\leq 1",
        &["s_i | = \\frac{q \\cdot k_i}{\\sqrt{d_k}},", "a_i | \\approx 0.7", "o | \\leq 1"],
    );
    // Nothing inside braces or \left … \right, no command that merely begins like a relation.
    check("f(x) = \\left( a = b \\right) + {c = d}", &["f(x) | = \\left( a = b \\right) + {c = d}"]);
    check("a \\not= b", &["a | \\not= b"]);
    check("\\left\\{ x \\right\\} \\ne y \\leftarrow z", &["\\left\\{ x \\right\\} | \\ne y \\leftarrow z"]);
    // An environment aligns its own rows; a formula with no relation is one piece.
    check(
        "\\begin{aligned} a &= b \\\\ c &= d \\end{aligned}",
        &["\\begin{aligned} a &= b \\\\ c &= d \\end{aligned}"],
    );
    check("\\sum_i a_i v_i", &["\\sum_i a_i v_i"]);
}

#[test]
fn a_display_formula_is_one_math_element_per_piece() {
    let html = display_math("a = b, \\qquad c");
    assert!(html.starts_with("<span class=\"display-math\"><span class=\"equation\"><math"), "{html}");
    assert_eq!(html.matches("<span class=\"equation\">").count(), 2, "{html}");
    assert_eq!(html.matches("<math").count(), 3, "{html}");
    assert!(!html.contains("qquad"), "{html}");
}

#[test]
fn a_fragments_math_is_checked_as_the_prose_is() {
    assert_eq!(fragment_math_error("Is $\\eta = {=train.learning_rate:w}$ small?"), None);
    let unknown = fragment_math_error("What is $q \\cdott k$?").expect("an unknown command");
    assert!(
        unknown.starts_with("TeX the renderer cannot read (unknown primitive command found)"),
        "{unknown}"
    );
    let open = fragment_math_error("Each weight is $\\frac{e^{s_j}}{\\sum_k e^{s_k}$.").expect("braces");
    assert_eq!(open, "a `$` that opens no math (do its braces balance?)");
    assert_eq!(fragment_math_error("It costs $5 and $6."), None);
}
