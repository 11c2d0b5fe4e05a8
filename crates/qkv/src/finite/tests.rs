//! The one-pass check against plain loops: the largest magnitude exactly, and every NaN or
//! infinity found wherever it sits (the vector body or the tail), for each storage type.

use half::{bf16, f16};
use ndarray::{Array1, Array2, Array3, s};

use super::*;
use crate::element::Real;

fn check<T: Real, E: Element<Compute = T>>(narrow: impl Fn(f64) -> E) {
    for len in [0, 1, 7, 8, 9, 31, 64, 100] {
        let values = Array1::from_shape_fn(len, |i| narrow(((i * 37 % 23) as f64 - 11.0) * 0.37 + 1e-30));
        let want = values.iter().fold(0.0, |m: f64, x| m.max(x.widen().to_f64_exact().abs()));
        assert_eq!(finite_magnitude("x", &values).ok(), Some(want), "{len} elements");
        for at in 0..len {
            for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
                let mut broken = values.clone();
                broken[at] = narrow(bad);
                match finite_magnitude("x", &broken) {
                    Err(AttentionError::NonFinite { argument: "x", index, .. }) => {
                        assert_eq!(index.0, [at], "{bad} at {at} of {len}")
                    }
                    other => panic!("{bad} at {at} of {len}: {other:?}"),
                }
            }
        }
    }
}

#[test]
fn the_largest_magnitude_and_every_non_finite_element_are_found() {
    check(|x| x);
    check(|x| x as f32);
    check(bf16::from_f64);
    check(f16::from_f64);
}

#[test]
fn strided_inputs_name_the_element_by_its_logical_index() {
    let mut a = Array2::<f32>::ones((3, 5));
    a[[2, 1]] = -4.0;
    let columns = a.t();
    assert_eq!(finite_magnitude("x", &columns).ok(), Some(4.0));
    a[[1, 3]] = f32::NAN;
    match finite_magnitude("x", &a.t()) {
        Err(AttentionError::NonFinite { index, .. }) => assert_eq!(index.0, [3, 1]),
        other => panic!("{other:?}"),
    }
}

#[test]
fn inputs_checked_in_shared_pieces_give_the_same_answers() {
    // Past the sharing threshold, and not a whole number of pieces; the largest element and the
    // non-finite ones in the first, a middle and the last (short) piece, each on a pool of one
    // and of two threads.
    let len = PASS_SHARE_FROM + 3 * PASS_PIECE / 2;
    let values = Array1::from_shape_fn(len, |i| ((i * 37 % 23) as f32 - 11.0) * 0.37);
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        for at in [0, PASS_PIECE + 5, len / 2, len - 1] {
            let mut peak = values.clone();
            peak[at] = -1e6;
            assert_eq!(
                pool.install(|| finite_magnitude("x", &peak)).ok(),
                Some(1e6),
                "{threads}: peak at {at}"
            );
            for bad in [f32::NAN, f32::INFINITY] {
                let mut broken = values.clone();
                broken[at] = bad;
                match pool.install(|| finite_magnitude("x", &broken)) {
                    Err(AttentionError::NonFinite { index, .. }) => {
                        assert_eq!(index.0, [at], "{threads}: {bad}")
                    }
                    other => panic!("{threads}: {bad} at {at}: {other:?}"),
                }
            }
        }
    }
}

#[test]
fn views_of_some_rows_are_measured_row_by_row() {
    // Some heads' rows of a larger array (each row contiguous, the view not), small and past the
    // sharing threshold: what lies outside the view, a larger value or a NaN, never counts.
    for rows in [5, PASS_SHARE_FROM / 64 + 7] {
        let mut a =
            Array3::from_shape_fn((3, rows + 4, 64), |(h, i, j)| ((h * 31 + i * 7 + j) % 23) as f32 - 11.0);
        a[[1, rows, 9]] = -300.0;
        a[[0, 1, 3]] = 1e6;
        a[[2, rows + 3, 0]] = f32::NAN;
        let inside = s![.., 2..rows + 2, ..];
        let view = a.slice(inside);
        let isa = simd::kernels_for(None).unwrap();
        assert!(view.as_slice_memory_order().is_none() && kernel_magnitude(isa, &view).is_some());
        assert_eq!(finite_magnitude("x", &view).ok(), Some(300.0), "{rows} rows");
        a[[2, rows, 5]] = f32::INFINITY;
        match finite_magnitude("x", &a.slice(inside)) {
            Err(AttentionError::NonFinite { index, .. }) => assert_eq!(index.0, [2, rows - 2, 5]),
            other => panic!("{rows} rows: {other:?}"),
        }
    }
}
