use super::*;

fn check_fixed(x: f64, decimals: usize, expected: &str) {
    assert_eq!(fixed(x, decimals), expected, "fixed({x}, {decimals})");
}

#[test]
fn fixed_rounds_and_drops_negative_zero() {
    check_fixed(4.40653, 2, "4.41");
    check_fixed(-0.00001, 3, "0.000");
    check_fixed(-0.5, 4, "-0.5000");
    check_fixed(f64::NEG_INFINITY, 4, "-∞");
    check_fixed(6.0, 0, "6");
}

#[test]
fn format_specs() {
    assert_eq!(
        Format::parse("2"),
        Some(Format { decimals: 2, percent: false, bare_integers: false, shortest: false })
    );
    assert_eq!(
        Format::parse("0%"),
        Some(Format { decimals: 0, percent: true, bare_integers: false, shortest: false })
    );
    assert_eq!(
        Format::parse("4g").map(|f| (f.apply(0.0), f.apply(0.25))),
        Some(("0".into(), "0.2500".into()))
    );
    assert_eq!(Format::parse("two"), None);
    assert_eq!(Format::parse(""), None);
    assert_eq!(Format::parse("2").map(|f| f.apply(0.7310585)), Some("0.73".to_string()));
    assert_eq!(Format::parse("0%").map(|f| f.apply(0.66)), Some("66%".to_string()));
}

#[test]
fn shown_numbers_say_when_they_are_rounded() {
    let one = shown(1.0, 4);
    assert_eq!((one.text.as_str(), one.exact), ("1", true));
    let w = shown(0.19782, 4);
    assert_eq!((w.text.as_str(), w.exact, w.units), ("0.1978", false, Some(1978)));
    let half = shown(0.5, 4);
    assert_eq!((half.text.as_str(), half.exact), ("0.5", true));
}

/// From 1e16 on numbers are written in scientific notation: a 35-digit integer helps no reader,
/// and past 2^53 its digits are not all the number's own.
#[test]
fn huge_numbers_are_scientific() {
    let big = shown(1e20, 4);
    assert_eq!((big.text.as_str(), big.exact), ("1e20", true));
    let bigger = shown(-1.25e35, 2);
    assert_eq!((bigger.text.as_str(), bigger.exact), ("-1.25e35", true));
    assert_eq!(shown(1e15 + 0.5, 1).text, "1000000000000000.5");
    check_fixed(1.23456e35, 2, "1.23e35");
    check_fixed(f64::MAX, 3, "1.798e308");
    assert_eq!(tex_number("1.23e35"), r"1.23 \times 10^{35}");
    assert_eq!(tex_number("12.5%"), r"12.5\%");
}

/// `:w` writes the shortest form that reads back as the same number, and shifts the decimal
/// point for a percentage instead of multiplying (which would print `73.10000000000001%`).
#[test]
fn as_written() {
    let w = Format::parse("w").expect("valid");
    let wp = Format::parse("w%").expect("valid");
    for (x, plain, percent) in [
        (0.75, "0.75", "75%"),
        (0.5, "0.5", "50%"),
        (2.0, "2", "200%"),
        (0.731, "0.731", "73.1%"),
        (-0.001, "-0.001", "-0.1%"),
        (0.0, "0", "0%"),
        (1e20, "1e20", "1e22%"),
        (123456.789, "123456.789", "12345678.9%"),
        (1e-7, "0.0000001", "0.00001%"),
    ] {
        assert_eq!(w.apply(x), plain, "{x}");
        assert_eq!(wp.apply(x), percent, "{x}");
        assert_eq!(plain.parse::<f64>().ok(), Some(x), "reads back");
    }
}

#[test]
fn sums_of_rounded_terms_get_approx() {
    let terms = [shown(0.39564, 4), shown(2.40654, 4), shown(1.60436, 4)];
    assert_eq!(sum_relation(&terms, &shown(4.40654, 4)), r"\approx");
    let exact = [shown(1.0, 4), shown(2.0, 4)];
    assert_eq!(sum_relation(&exact, &shown(3.0, 4)), "=");
}

/// Finding 1 of issue 11: values of 1e35 and more overflowed the exact sum of shown terms.
#[test]
fn sums_of_huge_terms_say_approx_instead_of_overflowing() {
    let huge = shown(1e35, 4);
    assert_eq!(huge.units, None);
    let terms = [shown(5e34, 4), shown(0.5, 4)];
    assert_eq!(sum_relation(&terms, &shown(5e34 + 0.5, 4)), r"\approx");
    let many = vec![shown(1e25, 12); 40];
    assert_eq!(sum_relation(&many, &shown(4e26, 12)), r"\approx");
    let max = [shown(f64::MAX, 12), shown(f64::MAX, 12)];
    assert_eq!(sum_relation(&max, &shown(f64::MAX, 12)), r"\approx");
}
