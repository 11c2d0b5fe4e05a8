//! The microkernels against plain loops, and the exponential's error bound.

use ndarray::Array2;

use super::*;

/// Largest relative error of `exp_shifted` over `x` in `[-lo, 0]`, against f64's `exp`, in units
/// of `floor + slope · |x|`: the polynomial's error plus the rounding of `x · log2(e)`, which
/// grows with `|x|` (the argument itself is only known to that precision).
fn exp_error<T: Element + crate::Real>(lo: f64, steps: usize, floor: f64, slope: f64) -> f64 {
    let lanes = V::<T>::LANES;
    let mut worst: f64 = 0.0;
    for i in 0..steps {
        let xs: Vec<T> = (0..lanes)
            .map(|l| T::from_f64_round(-lo * ((i * lanes + l) as f64) / (steps * lanes) as f64))
            .collect();
        let mut v = [V::<T>::default()];
        V::<T>::scalars_mut(&mut v).copy_from_slice(&xs);
        let e = v[0].exp_shifted(V::<T>::splat(T::zero()));
        for (x, got) in xs.iter().zip(V::<T>::scalars(&[e])) {
            let want = x.to_f64_exact().exp();
            if want > 1e-30 {
                let x = *x;
                let bound = floor + slope * x.to_f64_exact().abs();
                worst = worst.max((got.to_f64_exact() - want).abs() / want / bound);
            }
        }
    }
    worst
}

#[test]
fn softmax_exp_is_within_its_stated_bound() {
    // The Taylor remainders of vector.rs plus the rounding of the few operations around them.
    // Relative error at most 3e-7 + 1e-7·|x| in f32: the Taylor remainder 1.7e-7 plus a few
    // roundings, and |x|·2^-24 from rounding x·log2(e) and log2(e) itself. In f64, 1e-14 + 2e-16·|x|.
    let f32_error = exp_error::<f32>(87.0, 200_000, 3e-7, 1e-7);
    assert!(f32_error <= 1.0, "f32 exp error is {f32_error} times its bound");
    let f64_error = exp_error::<f64>(700.0, 200_000, 1e-14, 2e-16);
    assert!(f64_error <= 1.0, "f64 exp error is {f64_error} times its bound");
}

#[test]
fn softmax_exp_of_hidden_and_tiny_scores_is_zero() {
    for x in [f32::NEG_INFINITY, -200.0, -1e30] {
        let e = V::<f32>::splat(x).exp_shifted(V::<f32>::splat(3.0));
        assert!(V::<f32>::scalars(&[e]).iter().all(|&y| y == 0.0), "exp({x} - 3)");
    }
    let e = V::<f64>::splat(f64::NEG_INFINITY).exp_shifted(V::<f64>::splat(0.0));
    assert!(V::<f64>::scalars(&[e]).iter().all(|&y| y == 0.0));
}

fn matrix(rows: usize, cols: usize, seed: usize) -> Array2<f32> {
    Array2::from_shape_fn((rows, cols), |(i, j)| (((i * 31 + j * 17 + seed) % 23) as f32 - 11.0) / 8.0)
}

#[test]
fn score_and_value_tiles_match_plain_loops() {
    let width = key_panel_width::<f32>();
    for (rows, n_keys, d, d_v) in
        [(1, 1, 1, 1), (8, 32, 3, 17), (13, 64, 64, 64), (6, 40, 80, 80), (9, 7, 5, 3)]
    {
        let (q, k, v) = (matrix(rows, d, 1), matrix(n_keys, d, 2), matrix(n_keys, d_v, 3));
        let panels = n_keys.div_ceil(width);
        let mut keys = vec![V::<f32>::default(); panels * d * KEY_VECTORS];
        for (p, panel) in keys.chunks_exact_mut(d * KEY_VECTORS).enumerate() {
            pack_key_panel(k.view(), p * width, panel);
        }
        let mut packed_q = vec![0.0; rows * d];
        pack_queries(q.view(), 0, rows, 0.5, &mut packed_q);
        let s_stride = panels * KEY_VECTORS;
        let mut s = vec![V::<f32>::splat(f32::NAN); rows * s_stride];
        // Stale maxima from an earlier tile must not leak into this one.
        let mut row_max = vec![V::<f32>::splat(1e30); rows];
        scores(&packed_q, d, rows, &keys, panels, &mut s, s_stride, &mut row_max, |_| usize::MAX);
        let want = q.dot(&k.t()) * 0.5;
        let s_scalars = V::<f32>::scalars(&s);
        let lanes = s_stride * V::<f32>::LANES;
        for ((i, j), w) in want.indexed_iter() {
            assert!((s_scalars[i * lanes + j] - w).abs() < 1e-4, "S[{i}, {j}] for {rows}x{n_keys}x{d}");
        }
        // The row maxima cover every computed lane (padding included), whatever was in them.
        for (i, m) in row_max.iter().enumerate() {
            let row = &s_scalars[i * lanes..i * lanes + panels * width];
            assert_eq!(
                m.reduce_max(),
                row.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                "max of row {i}"
            );
        }

        let dv = vectors_for::<f32>(d_v);
        let mut values = vec![V::<f32>::default(); n_keys * dv];
        for (j, out) in values.chunks_exact_mut(dv).enumerate() {
            pack_value_row(v.row(j), out);
        }
        let alpha: Vec<f32> = (0..rows).map(|r| 0.25 * r as f32).collect();
        let mut o = vec![V::<f32>::splat(1.0); rows * dv];
        let weights = Weights { p: &s, stride: s_stride, rows, n_keys };
        accumulate_values(weights, &alpha, V::<f32>::scalars(&values), dv, &mut o);
        let p = Array2::from_shape_fn((rows, n_keys), |(i, j)| s_scalars[i * lanes + j]);
        let o_scalars = V::<f32>::scalars(&o);
        for ((i, c), w) in p.dot(&v).indexed_iter() {
            let want = alpha[i] + w;
            let got = o_scalars[i * dv * V::<f32>::LANES + c];
            assert!((got - want).abs() < 1e-3 * (1.0 + want.abs()), "O[{i}, {c}] = {got}, want {want}");
        }
    }
}

#[test]
fn direct_scores_match_plain_loops() {
    for (rows, n_keys, d) in [(1, 1, 1), (1, 70, 64), (3, 17, 19), (4, 128, 80)] {
        let (q, k) = (matrix(rows, d, 4), matrix(n_keys, d, 5));
        let mut packed_q = vec![0.0; rows * d];
        pack_query_rows(q.view(), 0, rows, 2.0, &mut packed_q);
        let s_stride = vectors_for::<f32>(n_keys);
        let mut s = vec![V::<f32>::splat(f32::NAN); rows * s_stride];
        direct_scores(&packed_q, rows, k.view(), &mut s, s_stride);
        let lanes = s_stride * V::<f32>::LANES;
        for ((i, j), w) in (q.dot(&k.t()) * 2.0).indexed_iter() {
            let got = V::<f32>::scalars(&s)[i * lanes + j];
            assert!((got - w).abs() < 1e-4, "S[{i}, {j}] = {got}, want {w} for {rows}x{n_keys}x{d}");
        }
    }
}

#[test]
fn trimmed_score_tiles_compute_every_score_a_group_needs() {
    // A causal diagonal: the group starting at row `g` needs keys `..g + 6 + 3`, so full groups
    // take 1, 2, 3 or 4 vectors of a panel, and the last groups skip the second panel or not.
    let width = key_panel_width::<f32>();
    let (rows, n_keys, d) = (64, 128, 64);
    let (q, k) = (matrix(rows, d, 4), matrix(n_keys, d, 5));
    let panels = n_keys / width;
    let mut keys = vec![V::<f32>::default(); panels * d * KEY_VECTORS];
    for (p, panel) in keys.chunks_exact_mut(d * KEY_VECTORS).enumerate() {
        pack_key_panel(k.view(), p * width, panel);
    }
    let mut packed_q = vec![0.0; rows * d];
    pack_queries(q.view(), 0, rows, 1.0, &mut packed_q);
    let s_stride = panels * KEY_VECTORS;
    let mut s = vec![V::<f32>::splat(f32::NAN); rows * s_stride];
    let mut row_max = vec![V::<f32>::splat(f32::NEG_INFINITY); rows];
    let needed = |g: usize| (g + SCORE_ROWS).min(rows) + 3;
    scores(&packed_q, d, rows, &keys, panels, &mut s, s_stride, &mut row_max, needed);
    let want = q.dot(&k.t());
    let s_scalars = V::<f32>::scalars(&s);
    let lanes = s_stride * V::<f32>::LANES;
    let mut checked = 0;
    for ((i, j), w) in want.indexed_iter() {
        if j < needed(i / SCORE_ROWS * SCORE_ROWS) {
            assert!((s_scalars[i * lanes + j] - w).abs() < 1e-4, "S[{i}, {j}]");
            checked += 1;
        }
    }
    assert_eq!(checked, (0..rows).map(|i| needed(i / SCORE_ROWS * SCORE_ROWS)).sum::<usize>());
    // The row maxima fold only computed scores, and never a NaN left in a skipped one.
    for (i, m) in row_max.iter().enumerate() {
        let got = m.reduce_max();
        let n = needed(i / SCORE_ROWS * SCORE_ROWS);
        let most = (0..n).map(|j| want[(i, j)]).fold(f32::NEG_INFINITY, f32::max);
        assert!(got >= most - 1e-4 && got.is_finite(), "max of row {i}: {got}, want at least {most}");
    }
}
