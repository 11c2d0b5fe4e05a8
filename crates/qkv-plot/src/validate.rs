//! Input checks shared by the figures: each returns the [`PlotError`] that
//! names the argument and the sizes involved.

use crate::PlotError;
use crate::theme::MAX_DECIMALS;

/// Checks that `rows` is a non-empty rectangular matrix and returns its shape.
pub(crate) fn matrix<T>(arg: &'static str, rows: &[Vec<T>]) -> Result<(usize, usize), PlotError> {
    let Some(first) = rows.first() else {
        return Err(PlotError::Empty { arg });
    };
    if first.is_empty() {
        return Err(PlotError::Empty { arg });
    }
    let expected = first.len();
    if let Some((row, r)) = rows.iter().enumerate().find(|(_, r)| r.len() != expected) {
        return Err(PlotError::Ragged { arg, row, len: r.len(), expected });
    }
    Ok((rows.len(), expected))
}

/// Checks that `arg` has `expected` entries, as `other` requires.
pub(crate) fn length(
    arg: &'static str,
    len: usize,
    other: &'static str,
    expected: usize,
) -> Result<(), PlotError> {
    if len == expected { Ok(()) } else { Err(PlotError::LengthMismatch { arg, len, other, expected }) }
}

/// Checks that `values` is not empty.
pub(crate) fn non_empty<T>(arg: &'static str, values: &[T]) -> Result<(), PlotError> {
    if values.is_empty() { Err(PlotError::Empty { arg }) } else { Ok(()) }
}

/// Checks that every value is finite; `at` describes position `i`.
pub(crate) fn finite(
    arg: &'static str,
    values: &[f64],
    at: impl Fn(usize) -> String,
) -> Result<(), PlotError> {
    match values.iter().position(|v| !v.is_finite()) {
        Some(i) => Err(PlotError::NonFinite { arg, at: at(i), value: values[i] }),
        None => Ok(()),
    }
}

/// Describes position `i` of a plain list.
pub(crate) fn index(i: usize) -> String {
    format!("index {i}")
}

/// Checks that a number of decimals can be shown.
pub(crate) fn decimals(decimals: usize) -> Result<(), PlotError> {
    if decimals <= MAX_DECIMALS {
        Ok(())
    } else {
        Err(PlotError::TooManyDecimals { decimals, max: MAX_DECIMALS })
    }
}

/// Checks that an optional range is finite and increasing.
pub(crate) fn range(arg: &'static str, range: Option<(f64, f64)>) -> Result<(), PlotError> {
    match range {
        Some((lo, hi)) if !(lo.is_finite() && hi.is_finite() && lo < hi) => {
            Err(PlotError::BadRange { arg, lo, hi })
        }
        _ => Ok(()),
    }
}
