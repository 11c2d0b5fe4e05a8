//! Tests of tick choice and formatting.

use super::*;

fn check_linear(lo: f64, hi: f64, expand: bool, expected: &[&str], range: (f64, f64)) {
    let ticks = linear(lo, hi, 5, expand);
    assert_eq!(ticks.labels, expected, "labels for [{lo}, {hi}]");
    assert!((ticks.lo - range.0).abs() < 1e-12, "lo {} != {}", ticks.lo, range.0);
    assert!((ticks.hi - range.1).abs() < 1e-12, "hi {} != {}", ticks.hi, range.1);
}

#[test]
fn unit_interval_in_fifths() {
    check_linear(0.0, 1.0, false, &["0.0", "0.2", "0.4", "0.6", "0.8", "1.0"], (0.0, 1.0));
}

#[test]
fn weight_range_of_the_love_row() {
    check_linear(0.1978, 0.4011, false, &["0.20", "0.25", "0.30", "0.35", "0.40"], (0.1978, 0.4011));
}

#[test]
fn expanded_range_ends_on_ticks() {
    check_linear(0.3, 9.7, true, &["0", "2", "4", "6", "8", "10"], (0.0, 10.0));
}

#[test]
fn negative_range_has_no_negative_zero() {
    check_linear(-1.0, 1.0, true, &["-1.0", "-0.5", "0.0", "0.5", "1.0"], (-1.0, 1.0));
}

#[test]
fn flat_range_is_widened() {
    let ticks = linear(3.0, 3.0, 5, true);
    assert!(ticks.lo < 3.0 && ticks.hi > 3.0);
}

#[test]
fn powers_of_two_for_head_dims() {
    let ticks = log(1.0, 1024.0, 6);
    assert_eq!(ticks.labels, ["1", "4", "16", "64", "256", "1024"]);
    assert_eq!((ticks.lo, ticks.hi), (1.0, 1024.0));
}

#[test]
fn log_range_widens_to_whole_powers() {
    let ticks = log(0.9, 300.0, 12);
    assert_eq!(ticks.lo, 0.5);
    assert_eq!(ticks.hi, 512.0);
    assert_eq!(ticks.labels.first().map(String::as_str), Some("0.5"));
}

#[test]
fn wide_log_range_uses_powers_of_ten() {
    let ticks = log(1e-3, 1e6, 10);
    assert_eq!(
        ticks.labels,
        ["0.001", "0.01", "0.1", "1", "10", "100", "1000", "10000", "100000", "1000000"]
    );
}
