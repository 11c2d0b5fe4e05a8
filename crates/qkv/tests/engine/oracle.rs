//! Every public path against the f64 reference, on random shapes including the awkward ones.

use proptest::prelude::*;
use qkv::Real;

use crate::problem::{MASK_KINDS, MaskKind, Problem, assert_close, error_bound, levels};

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
    let with = qkv::attention_with_weights(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    assert_close(&format!("output (with weights) {ctx}"), &with.output, &want.output, output_bound);
    assert_close(&format!("weights {ctx}"), &with.weights, &want.weights, weight_bound);
    for level in levels() {
        let options = options.clone().simd(level);
        let out = qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        assert_close(&format!("output {level} {ctx}"), &out, &want.output, output_bound);
        // Pre-fill with NaN: an element the path forgets to write fails the comparison.
        let mut into = ndarray::Array2::from_elem(out.raw_dim(), T::nan());
        qkv::attention_into(p.q.view(), p.k.view(), p.v.view(), &options, into.view_mut()).unwrap();
        assert_close(&format!("output (into) {level} {ctx}"), &into, &want.output, output_bound);
    }
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

/// The fast path's grid: sizes one below, at and above the SIMD width (16), the key panel (32),
/// the tiles (64) and twice the tile, plus 1 and a size that is not a power of two.
const GRID_SIZES: [usize; 12] = [1, 2, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000];
/// Head widths: below, at and above the SIMD width, and the common 64, 80 and 128.
const GRID_DIMS: [usize; 7] = [1, 2, 3, 8, 64, 80, 128];

/// The output-only path (the tiled kernel) against the reference at every SIMD level this CPU
/// runs, writing into a NaN-filled output so that an element it forgets fails.
fn check_fast_path<T: Real>(seed: u64, dims: (usize, usize, usize, usize), magnitude: f64, mask: MaskKind) {
    let p = Problem::<T>::random(seed, dims, magnitude, mask);
    let want = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &p.options()).unwrap();
    let (_, output_bound) = error_bound(&want, &p.v);
    for level in levels() {
        let options = p.options().simd(level);
        let mut out = ndarray::Array2::from_elem((dims.0, dims.3), T::nan());
        qkv::attention_into(p.q.view(), p.k.view(), p.v.view(), &options, out.view_mut()).unwrap();
        let ctx = format!("{} {level} {dims:?} x{magnitude} {mask:?} seed {seed}", T::NAME);
        assert_close(&format!("fast output {ctx}"), &out, &want.output, output_bound);
    }
}

#[test]
fn fast_path_matches_reference_on_the_awkward_grid() {
    // Every size meets every width once (n_q != n_k for most pairs), the masks rotating through.
    for (i, &n_q) in GRID_SIZES.iter().enumerate() {
        for (j, &d) in GRID_DIMS.iter().enumerate() {
            let n_k = GRID_SIZES[(i + 3 * j + 1) % GRID_SIZES.len()];
            let d_v = GRID_DIMS[(j + i) % GRID_DIMS.len()];
            let mask = MASK_KINDS[(i + j) % MASK_KINDS.len()];
            let seed = (i * 100 + j) as u64;
            check_fast_path::<f32>(seed, (n_q, n_k, d, d_v), 1.0, mask);
            if n_q * n_k * d <= 200_000 {
                check_fast_path::<f64>(seed, (n_q, n_k, d, d_v), 1.0, mask);
            }
        }
    }
    // No queries at all, and views whose rows are not contiguous (a column slice, reversed keys).
    check_fast_path::<f32>(3, (0, 70, 8, 16), 1.0, MaskKind::CausalBottomRight);
    let p = Problem::<f32>::random(8, (70, 130, 64, 48), 1.0, MaskKind::None);
    let (q, k, v) = (
        p.q.slice(ndarray::s![.., ..40]),
        p.k.slice(ndarray::s![..;-1, ..40]),
        p.v.slice(ndarray::s![..;-1, ..32]),
    );
    let options = qkv::AttentionOptions::new().causal(qkv::CausalMask::TopLeft);
    let want = qkv::reference::attention(q, k, v, &options).unwrap();
    for level in levels() {
        let got = qkv::attention(q, k, v, &options.clone().simd(level)).unwrap();
        assert_close(
            &format!("strided views {level}"),
            &got,
            &want.output,
            error_bound(&want, &v.to_owned()).1,
        );
    }
    // Square problems over several tiles with every mask; n = 1000 over itself with the masks
    // that decide tile skipping (the reference takes seconds there in a debug build).
    for mask in MASK_KINDS {
        check_fast_path::<f32>(1, (129, 129, 64, 64), 1.0, mask);
    }
    for mask in [MaskKind::CausalBottomRight, MaskKind::PaddingBlocks, MaskKind::CausalWindow] {
        check_fast_path::<f32>(2, (1000, 1000, 64, 64), 1.0, mask);
    }
}

#[test]
fn causal_diagonal_tiles_match_reference() {
    // Tiles on a causal diagonal compute only the scores and weights each group of rows can see:
    // diagonals on and off the panel boundaries, rows that see nothing (n_q > n_k, bottom right),
    // and row counts that leave partial groups of 6.
    for (n_q, n_k) in [(256, 256), (200, 300), (300, 200), (97, 1000), (130, 70)] {
        for mask in [MaskKind::CausalBottomRight, MaskKind::CausalTopLeft] {
            check_fast_path::<f32>(11, (n_q, n_k, 64, 64), 1.0, mask);
            check_fast_path::<f64>(12, (n_q, n_k, 24, 40), 1.0, mask);
        }
    }
}

#[test]
fn fast_path_keeps_huge_scores_finite() {
    // Entries up to 40 with d = 64: scores reach about ±1e4.
    for mask in MASK_KINDS {
        check_fast_path::<f32>(9, (130, 200, 64, 16), 40.0, mask);
        check_fast_path::<f64>(10, (70, 65, 64, 16), 40.0, mask);
    }
}

#[test]
fn long_keys_take_larger_query_blocks_and_match_reference() {
    // Keys and values of more than 4 MiB (8200 × (64 + 72) f32) take the level's long query
    // blocks (96 rows on AVX2 and AVX-512). 291 queries make four blocks of 72–78 rows, the last
    // with a partial tile; 100 queries make two (54 and 46 rows), few enough that their keys are
    // split as well. (The reference's cost grows with queries × 4 MiB, so the cases are few.)
    check_fast_path::<f32>(13, (291, 8200, 64, 72), 1.0, MaskKind::None);
    for mask in [MaskKind::CausalBottomRight, MaskKind::PaddingBlocks] {
        check_fast_path::<f32>(14, (100, 8200, 64, 72), 1.0, mask);
    }
    // The extremes of the rule: no queries, one (decoding), five (the fewest that tile).
    for n_q in [0, 1, 5] {
        check_fast_path::<f32>(15, (n_q, 8200, 64, 72), 1.0, MaskKind::CausalBottomRight);
    }
}

#[test]
fn decoding_splits_match_reference() {
    // One to a few queries over many keys: the keys are split and the partial states merged.
    for mask in MASK_KINDS {
        check_fast_path::<f32>(4, (1, 5000, 64, 64), 1.0, mask);
        check_fast_path::<f32>(5, (70, 3000, 16, 24), 1.0, mask);
        check_fast_path::<f64>(6, (2, 2100, 8, 8), 1.0, mask);
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
