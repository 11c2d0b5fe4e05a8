//! Tick positions and labels for linear and logarithmic axes, chosen and
//! formatted here so every figure prints numbers the same way.

#[cfg(test)]
mod tests;

use crate::theme::{fixed, trimmed};

/// Ticks along one axis: positions in data units with their labels, and the
/// axis range they were chosen for (possibly widened to whole ticks).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Ticks {
    /// Tick positions in data units, increasing.
    pub values: Vec<f64>,
    /// One label per position.
    pub labels: Vec<String>,
    /// Lower end of the axis.
    pub lo: f64,
    /// Upper end of the axis.
    pub hi: f64,
}

/// A range with a little width, so a constant series still gets an axis.
fn widen_if_flat(lo: f64, hi: f64) -> (f64, f64) {
    if hi > lo {
        (lo, hi)
    } else if lo == 0.0 {
        (-1.0, 1.0)
    } else {
        let pad = lo.abs() * 0.1;
        (lo - pad, hi + pad)
    }
}

/// About `target` evenly spaced ticks at 1, 2 or 5 times a power of ten over
/// `[lo, hi]`. With `expand`, the range grows outward to the nearest ticks.
pub(crate) fn linear(lo: f64, hi: f64, target: usize, expand: bool) -> Ticks {
    let (lo, hi) = widen_if_flat(lo, hi);
    let raw = (hi - lo) / target.max(1) as f64;
    let mut exponent = raw.log10().floor() as i32;
    let normalised = raw / 10f64.powi(exponent);
    let multiple = if normalised <= 1.0 {
        1.0
    } else if normalised <= 2.0 {
        2.0
    } else if normalised <= 5.0 {
        5.0
    } else {
        exponent += 1;
        1.0
    };
    let step = multiple * 10f64.powi(exponent);
    let decimals = if exponent < 0 { (-exponent) as usize } else { 0 };
    // A small tolerance keeps a tick that floating point puts a hair outside.
    let eps = step * 1e-9;
    let (lo, hi) =
        if expand { ((lo / step + 1e-9).floor() * step, (hi / step - 1e-9).ceil() * step) } else { (lo, hi) };
    let first = ((lo - eps) / step).ceil() as i64;
    let last = ((hi + eps) / step).floor() as i64;
    let values: Vec<f64> = (first..=last).map(|k| k as f64 * step).collect();
    let labels = values.iter().map(|&v| fixed(v, decimals)).collect();
    Ticks { values, labels, lo, hi }
}

/// Ticks at powers of two (or of ten for ranges wider than 2^16), at most
/// about `target` of them, over `[lo, hi]` widened to whole ticks. Both ends
/// must be above zero.
pub(crate) fn log(lo: f64, hi: f64, target: usize) -> Ticks {
    let (lo, hi) = if hi > lo { (lo, hi) } else { (lo / 2.0, hi * 2.0) };
    let span2 = (hi / lo).log2();
    let base: f64 = if span2 <= 16.0 { 2.0 } else { 10.0 };
    let e_lo = (lo.log(base) + 1e-9).floor() as i32;
    let e_hi = (hi.log(base) - 1e-9).ceil() as i32;
    let stride = ((e_hi - e_lo) as usize).div_ceil(target.max(1)).max(1) as i32;
    let mut exponents = Vec::new();
    let mut e = e_lo;
    loop {
        exponents.push(e);
        if e >= e_hi {
            break;
        }
        e += stride;
    }
    let values: Vec<f64> = exponents.iter().map(|&e| base.powi(e)).collect();
    let labels = values.iter().map(|&v| log_label(v)).collect();
    Ticks { lo: values[0], hi: *values.last().unwrap_or(&hi), values, labels }
}

/// A power of two or ten as a plain number where that stays short.
fn log_label(v: f64) -> String {
    if (1e-4..1e7).contains(&v) { trimmed(v, 6) } else { format!("{v:e}") }
}
