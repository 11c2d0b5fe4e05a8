//! Every public path against the f64 reference, on random shapes including the awkward ones.

use proptest::prelude::*;
use qkv::Real;

use crate::problem::{MASK_KINDS, MaskKind, Problem, assert_close, error_bound};

/// Sizes around the block and SIMD widths, plus 1.
const AWKWARD: [usize; 12] = [1, 2, 3, 15, 16, 17, 63, 64, 65, 127, 128, 129];

fn check_against_reference<T: Real>(
    seed: u64,
    dims: (usize, usize, usize, usize),
    magnitude: f64,
    mask: MaskKind,
) {
    let p = Problem::<T>::random(seed, dims, magnitude, mask);
    let options = p.options();
    let want = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    let (weight_bound, output_bound) = error_bound(&want, &p.v);
    let ctx = format!("{} {dims:?} x{magnitude} {mask:?} seed {seed}", T::NAME);
    let out = qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    assert_close(&format!("output {ctx}"), &out, &want.output, output_bound);
    let with = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    assert_close(&format!("output (with weights) {ctx}"), &with.output, &want.output, output_bound);
    assert_close(&format!("weights {ctx}"), &with.weights, &want.weights, weight_bound);
    // Pre-fill with NaN: an element the path forgets to write fails the comparison.
    let mut into = ndarray::Array2::from_elem(out.raw_dim(), T::nan());
    qkv::attention_into(p.q.view(), p.k.view(), p.v.view(), &options, into.view_mut()).unwrap();
    assert_close(&format!("output (into) {ctx}"), &into, &want.output, output_bound);
}

#[test]
fn awkward_sizes_match_reference() {
    for (seed, &n) in AWKWARD.iter().enumerate() {
        for mask in MASK_KINDS {
            let dims = (n, AWKWARD[(seed + 5) % AWKWARD.len()], 1 + seed % 9, 1 + (seed * 7) % 5);
            check_against_reference::<f32>(seed as u64, dims, 1.0, mask);
            check_against_reference::<f64>(seed as u64, dims, 1.0, mask);
        }
    }
}

#[test]
fn huge_scores_stay_finite_and_match() {
    // Scores near ±1e4: without subtracting the row max, exp would overflow.
    for mask in MASK_KINDS {
        check_against_reference::<f64>(7, (9, 33, 4, 3), 50.0, mask);
        check_against_reference::<f32>(8, (9, 33, 4, 3), 50.0, mask);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_shapes_match_reference(
        seed in any::<u64>(),
        n_q in 1usize..80,
        n_k in 1usize..80,
        d_k in 1usize..20,
        d_v in 1usize..10,
        mask in 0usize..MASK_KINDS.len(),
        magnitude in prop_oneof![Just(0.01), Just(1.0), Just(10.0)],
    ) {
        check_against_reference::<f32>(seed, (n_q, n_k, d_k, d_v), magnitude, MASK_KINDS[mask]);
        check_against_reference::<f64>(seed, (n_q, n_k, d_k, d_v), magnitude, MASK_KINDS[mask]);
    }
}
