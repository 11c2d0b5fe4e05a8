//! The microkernels of every level this CPU runs against plain loops, and the exponential's
//! error bound. A level the CPU lacks is named on stdout and skipped (`cargo test -- --nocapture`).

use ndarray::{Array2, s};

use super::*;
use crate::element::Real;

/// Runs `$body` once per level this CPU runs, with `$kernels: $K` that level's kernels for `$t`
/// and `$level` its [`SimdLevel`]; prints the levels it skips.
macro_rules! each_level {
    ($t:ty, |$kernels:ident: $K:ident, $level:ident| $body:block) => {{
        struct Test(SimdLevel);
        impl Job<$t> for Test {
            type Output = ();
            #[allow(unused_variables)]
            fn run<$K: Kernels<<$t as Element>::Compute, $t>>(self, $kernels: $K) {
                let $level = self.0;
                $body
            }
        }
        for level in SimdLevel::ALL {
            match Isa::new(level) {
                Some(isa) => isa.run::<$t, _>(Test(level)),
                None => println!("{level}: skipped, this CPU does not run it"),
            }
        }
    }};
}

/// Largest relative error of the softmax's `exp` over `x` in `[-lo, 0]`, against f64's `exp`, in
/// units of `floor + slope · |x|`: the polynomial's error plus the rounding of `x · log2(e)`, which
/// grows with `|x|` (the argument itself is only known to that precision).
fn exp_error<T: Real, K: Kernels<T>>(kernels: K, lo: f64, steps: usize, floor: f64, slope: f64) -> f64 {
    let xs: Vec<T> = (0..steps).map(|i| T::from_f64_round(-lo * i as f64 / steps as f64)).collect();
    let mut got = vec![T::zero(); steps];
    kernels.exp_differences(&xs, &vec![T::zero(); steps], &mut got);
    let mut worst: f64 = 0.0;
    for (x, got) in xs.iter().zip(&got) {
        let want = x.to_f64_exact().exp();
        if want > 1e-30 {
            let bound = floor + slope * x.to_f64_exact().abs();
            worst = worst.max((got.to_f64_exact() - want).abs() / want / bound);
        }
    }
    worst
}

#[test]
fn softmax_exp_is_within_its_stated_bound() {
    // The Taylor remainders of simd.rs plus the rounding of the few operations around them.
    // Relative error at most 3e-7 + 1e-7·|x| in f32: the Taylor remainder 1.7e-7 plus a few
    // roundings, and |x|·2^-24 from rounding x·log2(e) and log2(e) itself. In f64, 1e-14 + 2e-16·|x|.
    each_level!(f32, |kernels: K, level| {
        let error = exp_error::<f32, K>(kernels, 87.0, 1_000_003, 3e-7, 1e-7);
        assert!(error <= 1.0, "{level}: f32 exp error is {error} times its bound");
    });
    each_level!(f64, |kernels: K, level| {
        let error = exp_error::<f64, K>(kernels, 700.0, 1_000_003, 1e-14, 2e-16);
        assert!(error <= 1.0, "{level}: f64 exp error is {error} times its bound");
    });
}

/// `exp(x)` of every level is exactly 0 from `x = (FLOOR + 1/2) · ln 2` down (`t = x · log2(e)`
/// below `FLOOR + 1/2`, and `-inf`), and not 0 just above it: the levels agree on where the
/// weights stop, whichever instructions split `t`.
fn check_exp_floor<T: Real + Exp2, K: Kernels<T>>(kernels: K, level: SimdLevel) {
    let edge = (T::FLOOR.to_f64_exact() + 0.5) * std::f64::consts::LN_2;
    let below: Vec<T> = (0..1000)
        .map(|i| T::from_f64_round(edge - 0.1 - 0.01 * f64::from(i) * edge.abs()))
        .chain([T::neg_infinity()])
        .collect();
    let mut got = vec![T::one(); below.len()];
    kernels.exp_differences(&below, &vec![T::zero(); below.len()], &mut got);
    for (x, e) in below.iter().zip(&got) {
        assert!(e.to_f64_exact() == 0.0, "{level}: exp({}) is {}, not 0", x.to_f64_exact(), e.to_f64_exact());
    }
    let above = [T::from_f64_round(edge + 0.1)];
    let mut got = [T::zero()];
    kernels.exp_differences(&above, &[T::zero()], &mut got);
    assert!(got[0] > T::zero(), "{level}: exp({}) is 0", above[0].to_f64_exact());
}

#[test]
fn softmax_exp_is_zero_below_its_floor() {
    each_level!(f32, |kernels: K, level| { check_exp_floor::<f32, K>(kernels, level) });
    each_level!(f64, |kernels: K, level| { check_exp_floor::<f64, K>(kernels, level) });
}

/// `exp_rows` of one level for inputs stored as `E`: each weight `exp(s - m)` (in f32, or rounded
/// to bf16 at the start of the row for [`Layout::Pairs`]) and each row's sum of the unrounded
/// weights, over rows of one to eight vectors (odd counts included), a row that sees nothing, and
/// a row whose scores fall from its maximum to 1.7 · 127 below it, with hidden (`-inf`) keys: the
/// weights below f32's normal range may be 0 or subnormal, and hidden keys weigh exactly 0.
fn check_exp_rows<E: Element<Compute = f32>, K: Kernels<f32, E>>(kernels: K, level: SimdLevel) {
    for vectors in [1, 3, 8] {
        let (rows, len, stride) = (4, vectors * K::LANES, KEY_BLOCK);
        let scores: Vec<f32> = (0..rows * stride)
            .map(|i| match (i / stride, i % stride) {
                (3, j) if j % 5 == 4 => f32::NEG_INFINITY,
                (3, j) => -1.7 * j as f32,
                _ => ((i * 37) % 101) as f32 / 10.0 - 12.0,
            })
            .collect();
        let maxima: Vec<f32> = (0..rows)
            .map(|r| match r {
                2 => f32::NEG_INFINITY,
                _ => scores[r * stride..r * stride + len].iter().copied().fold(f32::NEG_INFINITY, f32::max),
            })
            .collect();
        let mut data = scores.clone();
        let mut sums = vec![f32::NAN; rows];
        kernels.exp_rows(RowsMut { data: &mut data, stride, rows }, len, &maxima, &mut sums);
        for r in 0..rows {
            let ctx = format!("{level} {} row {r} of {len}", std::any::type_name::<E>());
            let row = r * stride..r * stride + len;
            assert_weights::<E, K>(&ctx, (&data[row.clone()], &scores[row]), maxima[r], sums[r]);
        }
    }
}

/// Asserts that `weights` (a row as `exp_rows` leaves it: f32, or bf16 at the start of the row for
/// [`Layout::Pairs`]) holds `exp(s - reference)` of each of `scores` (0 for a hidden key, and
/// for every key when `reference` is `-inf`), and `sum` their sum, in f64.
fn assert_weights<E: Element<Compute = f32>, K: Kernels<f32, E>>(
    ctx: &str,
    (weights, scores): (&[f32], &[f32]),
    reference: f32,
    sum: f32,
) {
    let len = scores.len();
    let want: Vec<f64> = scores
        .iter()
        .map(|&s| match (s, reference) {
            (f32::NEG_INFINITY, _) | (_, f32::NEG_INFINITY) => 0.0,
            _ => (f64::from(s) - f64::from(reference)).exp(),
        })
        .collect();
    let (got, rounding): (Vec<f64>, f64) = match K::LAYOUT {
        Layout::Lanes => (weights.iter().map(|&x| f64::from(x)).collect(), 0.0),
        Layout::Pairs => {
            let row: &[bf16] = wide::bytemuck::cast_slice(weights);
            (row[..len].iter().map(|x| f64::from(x.to_f32())).collect(), 2f64.powi(-8))
        }
    };
    for (j, (g, w)) in got.iter().zip(&want).enumerate() {
        // `softmax_exp_is_within_its_stated_bound`'s growth with |s - m|.
        let distance = (f64::from(reference) - f64::from(scores[j])).abs().min(1e3);
        let relative = 1e-6 + 1e-7 * distance + rounding;
        let bound = relative * w + if *w > 0.0 { f64::from(f32::MIN_POSITIVE) } else { 0.0 };
        assert!((g - w).abs() <= bound, "{ctx}: weight {j} is {g}, want {w}");
    }
    // The pair levels' exp has its own polynomial (3.0e-6, `EXP2_FOR_BF16`).
    let polynomial = if K::LAYOUT == Layout::Pairs { 3e-6 } else { 0.0 };
    let total: f64 = want.iter().sum();
    let error = (f64::from(sum) - total).abs();
    assert!(error <= (1e-6 + polynomial) * total, "{ctx}: sum {sum}, want {total}");
}

/// `exp_rows_raising` of one level for inputs stored as `E`, over rows of one to eight vectors:
/// scores within the headroom above the reference (weights up to 256, the reference kept),
/// scores past it in the first, a middle and the last chunk (raised by whole doublings; the
/// weights written before are rescaled), one so far past it that every earlier weight vanishes,
/// a reference of `-inf` (the row's maximum, or kept for a row that sees nothing), and a row
/// hiding every key.
fn check_exp_rows_raising<E: Element<Compute = f32>, K: Kernels<f32, E>>(kernels: K, level: SimdLevel) {
    let headroom = REFERENCE_HEADROOM.ln();
    for vectors in [1, 3, 8] {
        let len = vectors * K::LANES;
        let base = |j: usize| ((j * 37) % 101) as f32 / 20.0 - 2.0;
        let past = |j: usize, at: usize, by: f32| match j {
            _ if j == at => 1.5 + by,
            _ if j % 7 == 3 => f32::NEG_INFINITY,
            _ => base(j),
        };
        let score = |r: usize, j: usize| match r {
            0 | 5 => base(j),
            1 => past(j, 0, 30.0),
            2 => past(j, len / 2 + 1, 9.0),
            3 => past(j, len - 1, 200.0),
            4 => past(j, len - 2, 1e30),
            _ => f32::NEG_INFINITY,
        };
        let before = [-2.5, 1.0, 1.0, 1.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY, 3.0];
        let (rows, stride) = (before.len(), K::KEY_BLOCK);
        let scores: Vec<f32> = (0..rows * stride)
            .map(|i| if i % stride < len { score(i / stride, i % stride) } else { f32::NAN })
            .collect();
        let mut references = before.to_vec();
        let (mut data, mut sums) = (scores.clone(), vec![f32::NAN; rows]);
        let tile = RowsMut { data: &mut data, stride, rows };
        kernels.exp_rows_raising(tile, len, &mut references, &mut sums);
        for (r, &before) in before.iter().enumerate() {
            let ctx = format!("{level} {} row {r} of {len}", std::any::type_name::<E>());
            let row = r * stride..r * stride + len;
            let max = scores[row.clone()].iter().fold(f64::NEG_INFINITY, |m, &s| m.max(f64::from(s)));
            let (before, got) = (f64::from(before), f64::from(references[r]));
            if before == f64::NEG_INFINITY || max <= before + headroom {
                // From -inf the reference is the maximum; within the headroom it stays.
                let want = if before == f64::NEG_INFINITY { max } else { before };
                assert_eq!(got, want, "{ctx}: reference");
            } else {
                // Raised by the least whole number of doublings that reaches the maximum.
                let doublings = (max - before) / std::f64::consts::LN_2;
                let raised = (got - before) / std::f64::consts::LN_2;
                assert!(
                    (raised - doublings.ceil()).abs() <= 1e-6 * doublings.max(1.0),
                    "{ctx}: raised by {raised} doublings for {doublings}"
                );
            }
            assert_weights::<E, K>(&ctx, (&data[row.clone()], &scores[row]), references[r], sums[r]);
        }
    }
}

#[test]
fn exp_rows_give_each_weight_and_the_sums() {
    each_level!(f32, |kernels: K, level| { check_exp_rows(kernels, level) });
    each_level!(bf16, |kernels: K, level| { check_exp_rows(kernels, level) });
}

#[test]
fn raising_references_keeps_every_weight_within_the_headroom() {
    each_level!(f32, |kernels: K, level| { check_exp_rows_raising(kernels, level) });
    each_level!(bf16, |kernels: K, level| { check_exp_rows_raising(kernels, level) });
}

#[test]
fn softmax_exp_of_hidden_and_tiny_scores_is_zero() {
    each_level!(f32, |kernels: K, level| {
        let xs = [f32::NEG_INFINITY, -200.0, -1e30, -90.0 * std::f32::consts::LN_2 * 2.0];
        let mut got = [1.0; 4];
        kernels.exp_differences(&xs, &[3.0; 4], &mut got);
        assert_eq!(got, [0.0; 4], "{level}: exp of {xs:?} - 3");
        // A row of scores with its hidden entries: exactly 0 there, and the sum of the rest.
        let mut row = vec![f32::NEG_INFINITY; 2 * K::LANES];
        row[1] = 0.0;
        let mut sums = [f32::NAN];
        kernels.exp_rows(
            RowsMut { data: &mut row, stride: 2 * K::LANES, rows: 1 },
            2 * K::LANES,
            &[0.0],
            &mut sums,
        );
        assert_eq!((row[1], sums[0]), (1.0, 1.0), "{level}");
        assert!(
            row.iter().enumerate().all(|(i, &x)| x == if i == 1 { 1.0 } else { 0.0 }),
            "{level}: {row:?}"
        );
        // A row with nothing visible becomes zeros, its sum 0.
        let mut hidden = vec![f32::NEG_INFINITY; K::LANES];
        kernels.exp_rows(
            RowsMut { data: &mut hidden, stride: K::LANES, rows: 1 },
            K::LANES,
            &[f32::NEG_INFINITY],
            &mut sums,
        );
        assert!(hidden.iter().all(|&x| x == 0.0) && sums[0] == 0.0, "{level}");
    });
    each_level!(f64, |kernels: K, level| {
        let mut got = [1.0; 3];
        kernels.exp_differences(&[f64::NEG_INFINITY, -800.0, -1e300], &[0.0; 3], &mut got);
        assert_eq!(got, [0.0; 3], "{level}");
    });
}

#[test]
fn magnitudes_are_exact_and_never_lose_a_non_finite_element() {
    each_level!(f32, |kernels: K, level| {
        for len in [0, 1, K::LANES - 1, K::LANES, 3 * K::LANES + 2, 1000] {
            let x: Vec<f32> = (0..len).map(|i| ((i * 37) % 101) as f32 - 70.0).collect();
            let want = x.iter().fold(0.0_f32, |m, x| m.max(x.abs()));
            assert_eq!(kernels.magnitude(&x), want, "{level}: {len} elements");
            // A bad element anywhere (vector lanes and tail alike), with larger finite ones after it.
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                for at in [0, len / 2, len.saturating_sub(1)].into_iter().filter(|_| len > 0) {
                    let mut y = x.clone();
                    y[at] = bad;
                    y.push(1e30);
                    let got = kernels.magnitude(&y);
                    assert!(!got.is_finite(), "{level}: {bad} at {at} of {len} gave {got}");
                }
            }
        }
    });
    each_level!(f64, |kernels: K, level| {
        let mut x: Vec<f64> = (0..77).map(|i| i as f64 - 50.0).collect();
        assert_eq!(kernels.magnitude(&x), 50.0, "{level}");
        x[9] = f64::NAN;
        x.push(1e300);
        assert!(kernels.magnitude(&x).is_nan(), "{level}");
    });
}

#[test]
fn row_maxima_cover_every_lane() {
    each_level!(f32, |kernels: K, level| {
        let (rows, len, stride) = (5, 3 * K::LANES, 4 * K::LANES);
        let data: Vec<f32> = (0..rows * stride).map(|i| ((i * 37) % 101) as f32 - 50.0).collect();
        let mut got = vec![f32::NAN; rows];
        kernels.row_maxima(Rows { data: &data, stride, rows }, len, &mut got);
        for (r, got) in got.iter().enumerate() {
            let want = data[r * stride..r * stride + len].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(*got, want, "{level}: row {r}");
        }
    });
}

fn matrix(rows: usize, cols: usize, seed: usize) -> Array2<f32> {
    Array2::from_shape_fn((rows, cols), |(i, j)| (((i * 31 + j * 17 + seed) % 23) as f32 - 11.0) / 8.0)
}

/// Every key component lands where the layout says, for keys in rows (whole, or cut from wider
/// rows at an odd column, so that 16-bit rows lose their 4-byte alignment) and in columns (no
/// row contiguous), full and partial panels, `d` odd and even, f32, bf16 and int8.
#[test]
fn packed_key_panels_put_each_component_where_the_layout_says() {
    fn check<E: Element + PartialEq + std::fmt::Debug>(narrow: impl Fn(f32) -> E) {
        for (n_keys, d, width, first) in [
            (1, 1, 16, 0),
            (9, 3, 8, 0),
            (40, 64, 16, 16),
            (23, 65, 16, 16),
            (40, 67, 16, 0),
            (70, 6, 64, 0),
            (64, 18, 32, 32),
            (5, 2, 32, 0),
        ] {
            let wide = Array2::from_shape_fn((n_keys, d + 1), |(i, c)| narrow((i * 131 + c * 7 + 1) as f32));
            let rows = wide.slice(ndarray::s![.., 1..]);
            let columns = rows.t().as_standard_layout().into_owned().reversed_axes();
            assert!(columns.row(0).as_slice().is_none() || n_keys == 1, "rows not contiguous");
            for keys in [rows.view(), columns.view(), wide.slice(ndarray::s![.., ..d])] {
                for layout in [Layout::Lanes, Layout::Pairs] {
                    let mut panel = vec![narrow(-1.0); layout.padded_dim(d) * width];
                    pack_key_panel(keys, first, width, layout, &mut panel);
                    let mut want = vec![E::default(); panel.len()];
                    for lane in 0..width.min(n_keys - first) {
                        for c in 0..d {
                            let at = match layout {
                                Layout::Lanes => c * width + lane,
                                Layout::Pairs => c / 2 * 2 * width + 2 * lane + c % 2,
                            };
                            want[at] = keys[[first + lane, c]];
                        }
                    }
                    assert_eq!(panel, want, "{n_keys} keys, d = {d}, width {width}, {layout:?}");
                }
            }
        }
    }
    check(|x| x);
    check(bf16::from_f32);
    check(|x| Q8::nearest(x % 254.0 - 127.0));
}

/// Queries packed for the lane layout: groups of `group_rows` rows, each component-major and
/// scaled, zero rows padding the last group; from rows and from columns alike.
#[test]
fn packed_queries_put_each_component_where_the_layout_says() {
    for (n_q, d, group_rows, first, rows) in
        [(1, 1, 6, 0, 1usize), (20, 65, 6, 3, 17), (40, 8, 8, 0, 40), (9, 3, 14, 1, 8)]
    {
        let q = Array2::from_shape_fn((n_q, d), |(i, c)| (i * 131 + c * 7) as f32);
        let columns = q.t().as_standard_layout().into_owned().reversed_axes();
        for queries in [q.view(), columns.view()] {
            let padded = rows.next_multiple_of(group_rows);
            let mut out = vec![-1.0; padded * d];
            assert_eq!(pack_queries(queries, first, rows, 0.5, (group_rows, Layout::Lanes), &mut out), 1.0);
            let mut want = vec![0.0; out.len()];
            for r in 0..rows {
                for c in 0..d {
                    want[r / group_rows * group_rows * d + c * group_rows + r % group_rows] =
                        q[[first + r, c]] * 0.5;
                }
            }
            assert_eq!(out, want, "{rows} of {n_q} queries, d = {d}, groups of {group_rows}");
        }
    }
}

#[test]
fn pair_queries_are_scaled_only_where_that_is_exact() {
    let rows = [[1.0_f32, -3.5, 0.0, 1e30], [-0.0, 0.15625, 2.0e-30, -7.0]];
    let q = Array2::from_shape_fn((2, 4), |(r, c)| bf16::from_f32(rows[r][c]));
    let pack = |q: &Array2<bf16>, scale: f32| {
        let mut out = vec![f32::NAN; 4];
        let left = pack_queries(q.view(), 0, 2, scale, (1, Layout::Pairs), &mut out);
        let packed: &[bf16] = wide::bytemuck::cast_slice(&out);
        (left, packed.iter().map(|x| x.to_f32()).collect::<Vec<f32>>())
    };
    let times = |factor: f32| q.iter().map(|x| x.to_f32() * factor).collect::<Vec<f32>>();
    // Powers of two move exponents: the scores then take no scale.
    for scale in [0.125, 0.5, 1.0, 4.0] {
        assert_eq!(pack(&q, scale), (1.0, times(scale)), "scale {scale}");
    }
    // Any other scale, or a product that would leave the normal numbers, is left to the scores.
    let unscaled = times(1.0);
    assert_eq!(pack(&q, 1.0 / 128f32.sqrt()), (1.0 / 128f32.sqrt(), unscaled.clone()));
    assert_eq!(pack(&q, 2f32.powi(-100)), (2f32.powi(-100), unscaled.clone()), "2e-30 would go subnormal");
    assert_eq!(pack(&q, 2f32.powi(100)), (2f32.powi(100), unscaled), "1e30 would overflow");
    let mut tiny = q.clone();
    tiny[[0, 0]] = bf16::from_bits(1);
    assert_eq!(pack(&tiny, 0.5).0, 0.5, "a subnormal query is left unscaled");
}

/// Packs `k`'s keys into panels of `width` keys in `layout`.
fn pack_keys<E: Element>(k: &Array2<E>, width: usize, layout: Layout) -> Vec<E> {
    let (n_keys, d) = k.dim();
    let depth = layout.padded_dim(d);
    let mut keys = vec![E::default(); n_keys.div_ceil(width) * depth * width];
    for (p, panel) in keys.chunks_exact_mut(depth * width).enumerate() {
        pack_key_panel(k.view(), p * width, width, layout, panel);
    }
    keys
}

/// The score and `P·V` tiles of one level for inputs stored as `E`, against plain f64 loops over
/// the same (exactly representable) inputs, and the weights as that level's `exp_rows` leaves
/// them (rounded to bf16 for [`Layout::Pairs`]).
fn check_score_and_value_tiles<E: Element<Compute = f32>, K: Kernels<f32, E>>(kernels: K, level: SimdLevel) {
    let stored = |a: Array2<f32>| a.mapv(|x| E::narrow(x));
    for (rows, n_keys, d, d_v) in [
        (1, 1, 1, 1),
        (8, 32, 3, 17),
        (13, 64, 64, 64),
        (6, 40, 80, 80),
        (9, 7, 5, 3),
        (4, 100, 64, 64),
        (6, 128, 16, 130),
        (17, 127, 33, 48),
        (32, 128, 128, 128),
        (20, 3, 62, 16),
        // Single rows (decoding) whose value vectors leave tiles of four, two and one.
        (1, 50, 64, 112),
        (2, 33, 64, 96),
        (1, 20, 64, 64),
        // Key blocks longer than the vector levels' (AMX's are 512): the tile kernels' chunks of
        // keys and of values, several a block, the last with a tail and an odd key; value
        // columns in passes of four tiles and one.
        (19, 301, 40, 72),
        (33, 512, 128, 144),
        (16, 449, 64, 64),
    ] {
        if n_keys > K::KEY_BLOCK {
            continue;
        }
        let ctx = format!("{level} {rows}x{n_keys}x{d}x{d_v}");
        let (q, k, v) =
            (stored(matrix(rows, d, 1)), stored(matrix(n_keys, d, 2)), stored(matrix(n_keys, d_v, 3)));
        let wide = |a: &Array2<E>| a.mapv(|x| f64::from(x.widen()));
        let width = K::KEY_PANEL;
        let panels = n_keys.div_ceil(width);
        let keys = pack_keys(&k, width, K::LAYOUT);
        let padded = rows.next_multiple_of(K::TILE_ROWS);
        let s_stride = K::SCORE_STRIDE;
        // The scores of queries packed with `factor` in rows `stride` apart, and with their row
        // maxima if `row_max`.
        let scores = |factor: f32, row_max: Option<&mut [f32]>, stride: usize| {
            let mut packed_q = vec![f32::NAN; padded * d];
            let scale = pack_queries(q.view(), 0, rows, factor, (K::TILE_ROWS, K::LAYOUT), &mut packed_q);
            let mut s = vec![f32::NAN; padded * stride];
            let maxima = row_max.is_some();
            let mut unread = vec![0.0; padded * K::LANES];
            let tile = ScoreTile {
                q: &packed_q,
                scale,
                d,
                rows: padded,
                real_rows: rows,
                keys: &keys,
                panels,
                s: &mut s,
                stride,
                row_max: row_max.unwrap_or(&mut unread),
                maxima,
            };
            kernels.scores(tile, None);
            s
        };
        // Stale maxima from an earlier tile must not leak into this one.
        let mut row_max = vec![1e30; padded * K::LANES];
        let s = scores(0.5, Some(&mut row_max), s_stride);
        let want = wide(&q).dot(&wide(&k).t()) * 0.5;
        for ((i, j), w) in want.indexed_iter() {
            assert!((f64::from(s[i * s_stride + j]) - w).abs() < 1e-4, "{ctx}: S[{i}, {j}]");
        }
        // The backward's tiles are `KEY_BLOCK` apart at every level (and hold as many keys): the
        // same scores there.
        if n_keys <= KEY_BLOCK {
            let backward = scores(0.5, Some(&mut vec![1e30; padded * K::LANES]), KEY_BLOCK);
            for (i, j) in want.indexed_iter().map(|(at, _)| at) {
                assert_eq!(
                    backward[i * KEY_BLOCK + j],
                    s[i * s_stride + j],
                    "{ctx}: S[{i}, {j}], backward's rows"
                );
            }
        }
        // Without maxima asked for, the same scores (AMX skips their pass), with a scale the
        // pair layout's queries cannot carry exactly too (AMX scales in that pass, then).
        for factor in [0.5, 0.3] {
            let unasked = scores(factor, None, s_stride);
            for ((i, j), w) in want.indexed_iter() {
                let got = f64::from(unasked[i * s_stride + j]);
                assert!(
                    (got - w / 0.5 * f64::from(factor)).abs() < 1e-4,
                    "{ctx}: S[{i}, {j}] at {factor}, no maxima"
                );
            }
        }
        // The rows that pad the last group score zero, computed or not.
        for i in rows..padded {
            assert!(s[i * s_stride..][..panels * width].iter().all(|&x| x == 0.0), "{ctx}: padding row {i}");
        }
        // The row maxima cover every computed lane (padding included), whatever was in them.
        let mut maxima = vec![f32::NAN; rows];
        kernels.row_maxima(Rows { data: &row_max, stride: K::LANES, rows }, K::LANES, &mut maxima);
        for (i, m) in maxima.iter().enumerate() {
            let row = &s[i * s_stride..i * s_stride + panels * width];
            assert_eq!(*m, row.iter().copied().fold(f32::NEG_INFINITY, f32::max), "{ctx}: max of row {i}");
        }

        let vectors = d_v.div_ceil(K::LANES);
        let v_stride = vectors * K::LANES;
        // NaN past the last value row: an odd last key's partner in a pair is never read.
        let mut values = vec![E::narrow(f32::NAN); n_keys.next_multiple_of(2) * v_stride];
        match K::LAYOUT {
            Layout::Lanes => {
                for (j, out) in values.chunks_exact_mut(v_stride).enumerate().take(n_keys) {
                    out.fill(E::default());
                    pack_value_row(v.row(j), out);
                }
            }
            Layout::Pairs => {
                values[..n_keys.div_ceil(2) * 2 * v_stride].fill(E::default());
                pack_value_pairs(v.view(), v_stride, &mut values);
                values[n_keys * v_stride..]
                    .iter_mut()
                    .skip(1)
                    .step_by(2)
                    .for_each(|x| *x = E::narrow(f32::NAN));
            }
        }
        // The weights as `accumulate_values` reads them: the scores themselves (f32), or the
        // scores rounded to bf16 at the start of each row, as `exp_rows` leaves them.
        let weights: Vec<f32> = match K::LAYOUT {
            Layout::Lanes => s.clone(),
            Layout::Pairs => {
                let mut weights = vec![f32::NAN; s.len()];
                for (row, out) in s.chunks_exact(s_stride).zip(weights.chunks_exact_mut(s_stride)) {
                    let out: &mut [bf16] = wide::bytemuck::cast_slice_mut(out);
                    for (o, &x) in out.iter_mut().zip(&row[..n_keys]) {
                        *o = bf16::from_f32(x);
                    }
                }
                weights
            }
        };
        let weight = |i: usize, j: usize| match K::LAYOUT {
            Layout::Lanes => f64::from(weights[i * s_stride + j]),
            Layout::Pairs => {
                f64::from(wide::bytemuck::cast_slice::<f32, bf16>(&weights)[2 * i * s_stride + j])
            }
        };
        // Whole groups, and for the lane levels rows left over (decoding); the pair levels take
        // whole tiles of rows only.
        let fewer = if K::LAYOUT == Layout::Lanes { rows.min(K::TILE_ROWS - 1).max(1) } else { padded };
        for rows in [padded, fewer] {
            let alpha: Vec<f32> = (0..rows).map(|r| 0.25 * r as f32).collect();
            let mut o = vec![1.0; rows * v_stride];
            let tile = Weights { p: &weights, rows, n_keys };
            let value_rows = ValueRows { v: &values, stride: v_stride, vectors };
            kernels.accumulate_values(tile, &alpha, value_rows, &mut o);
            let p = Array2::from_shape_fn((rows, n_keys), |(i, j)| weight(i, j));
            for ((i, c), w) in p.dot(&wide(&v)).indexed_iter() {
                let want = f64::from(alpha[i]) + w;
                let got = f64::from(o[i * v_stride + c]);
                assert!(
                    (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                    "{ctx}: O[{i}, {c}] = {got}, want {want}"
                );
            }
            check_measured_values(kernels, tile, &alpha, &values, (v_stride, vectors), &o, &ctx);
        }
    }
}

/// `accumulate_values_measuring` adds exactly what `accumulate_values` added (`added`, from an
/// output of ones) and returns the largest magnitude of the values, which a non-finite element
/// anywhere in them (a vector's first or last lane, the first or last key) makes non-finite.
/// `values` holds the rows as the tile reads them, past the last key too (NaN in a pair's unread
/// partner, which packed values hold as zero: set so here). At the lane levels, the same rows
/// read at a wider stride with NaN between them, from a buffer that ends where the last row does
/// (a head's rows of a `[total, heads, d]` tensor read in place), add the same bits by either
/// entry and measure the rows alone.
fn check_measured_values<E: Element<Compute = f32>, K: Kernels<f32, E>>(
    kernels: K,
    tile: Weights<'_, f32>,
    alpha: &[f32],
    values: &[E],
    (stride, vectors): (usize, usize),
    added: &[f32],
    ctx: &str,
) {
    let rows = match K::LAYOUT {
        Layout::Lanes => tile.n_keys,
        Layout::Pairs => tile.n_keys.next_multiple_of(2),
    };
    let mut values = values[..rows * stride].to_vec();
    values.iter_mut().filter(|x| x.widen().is_nan()).for_each(|x| *x = E::default());
    let measure = |values: &[E]| {
        let mut o = vec![1.0; added.len()];
        let magnitude = kernels.accumulate_values_measuring(
            tile,
            alpha,
            ValueRows { v: values, stride, vectors },
            &mut o,
        );
        (magnitude, o)
    };
    let (magnitude, o) = measure(&values);
    let same = |o: &[f32]| o.iter().zip(added).all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same(&o), "{ctx}: measuring changed O");
    let largest = values.iter().fold(0.0_f32, |m, x| m.max(x.widen().abs()));
    assert_eq!(magnitude, largest, "{ctx}: magnitude of the values");
    if K::LAYOUT == Layout::Lanes {
        let apart = 2 * stride + K::LANES;
        let mut rows_apart = vec![E::narrow(f32::NAN); (tile.n_keys - 1) * apart + stride];
        for (j, row) in values.chunks_exact(stride).enumerate() {
            rows_apart[j * apart..][..stride].copy_from_slice(row);
        }
        let rows = ValueRows { v: &rows_apart, stride: apart, vectors };
        let mut o = vec![1.0; added.len()];
        kernels.accumulate_values(tile, alpha, rows, &mut o);
        assert!(same(&o), "{ctx}: rows {apart} apart");
        o.fill(1.0);
        let magnitude = kernels.accumulate_values_measuring(tile, alpha, rows, &mut o);
        assert!(same(&o), "{ctx}: rows {apart} apart, measured");
        assert_eq!(magnitude, largest, "{ctx}: magnitude of rows {apart} apart");
    }
    if E::narrow(f32::INFINITY).widen().is_finite() {
        return; // int8 values hold no infinity
    }
    for at in [0, K::LANES - 1, stride - 1, values.len() - stride, values.len() - 1] {
        let mut bad = values.clone();
        bad[at] = E::narrow(f32::INFINITY);
        let (magnitude, _) = measure(&bad);
        assert!(!magnitude.is_finite(), "{ctx}: infinity at {at} gave {magnitude}");
    }
}

#[test]
fn score_and_value_tiles_match_plain_loops() {
    each_level!(f32, |kernels: K, level| { check_score_and_value_tiles(kernels, level) });
    each_level!(bf16, |kernels: K, level| { check_score_and_value_tiles(kernels, level) });
    each_level!(f16, |kernels: K, level| { check_score_and_value_tiles(kernels, level) });
    each_level!(Q8, |kernels: K, level| { check_score_and_value_tiles(kernels, level) });
}

#[test]
fn scale_columns_scales_each_column_of_each_row() {
    each_level!(f32, |kernels: K, level| {
        for (rows, len) in [(1, 1), (3, 7), (4, 16), (2, 37), (6, 128)] {
            let data = matrix(rows, KEY_BLOCK, 5).into_raw_vec_and_offset().0;
            let scales: Vec<f32> = (0..len).map(|j| 0.25 * j as f32 - 3.0).collect();
            let mut scaled = data.clone();
            kernels.scale_columns(RowsMut { data: &mut scaled, stride: KEY_BLOCK, rows }, &scales);
            for (i, (got, x)) in scaled.iter().zip(&data).enumerate() {
                let want = scales.get(i % KEY_BLOCK).map_or(*x, |s| x * s);
                assert_eq!(*got, want, "{level} {rows}x{len}: element {i}");
            }
        }
    });
}

/// Key rows side by side, and a head's rows of a `[n_keys, heads, d]` tensor (rows `heads · d`
/// apart, the others' elements in between); key counts that are no multiple of a group, lengths
/// with and without a scalar tail; keys stored as f32, bf16, f16 and int8.
#[test]
fn direct_scores_match_plain_loops() {
    each_level!(f32, |kernels: K, level| { check_direct_scores(kernels, level) });
    each_level!(bf16, |kernels: K, level| { check_direct_scores(kernels, level) });
    each_level!(f16, |kernels: K, level| { check_direct_scores(kernels, level) });
    each_level!(Q8, |kernels: K, level| { check_direct_scores(kernels, level) });
}

fn check_direct_scores<E: Element<Compute = f32>, K: Kernels<f32, E>>(kernels: K, level: SimdLevel) {
    let cases = [(1, 1, 1), (1, 70, 64), (3, 17, 19), (4, 128, 80), (2, 9, 3), (1, 33, 40), (2, 5, 112)];
    for (rows, n_keys, d) in cases {
        let q = matrix(rows, d, 4);
        let mut packed_q = vec![0.0; rows * d];
        pack_query_rows(q.view(), 0, rows, 2.0, &mut packed_q);
        let s_stride = KEY_BLOCK;
        let mut s = vec![f32::NAN; rows * s_stride];
        let nan = E::narrow(f32::NAN);
        for heads in [1, 3] {
            // Head 1 of 3 (or the only one); the other heads' elements are NaN (where the format
            // has one), never read.
            let mut stored = ndarray::Array3::from_elem((n_keys, heads, d), nan);
            let head = heads / 2;
            stored.slice_mut(s![.., head, ..]).assign(&matrix(n_keys, d, 5).mapv(E::narrow));
            let ctx =
                format!("{level} {} {rows}x{n_keys}x{d}, head {head} of {heads}", std::any::type_name::<E>());
            let k = stored.slice(s![.., head, ..]);
            let magnitude = kernels.direct_scores(&packed_q, rows, k, &mut s);
            let widened = k.mapv(|x| x.widen());
            for ((i, j), w) in (q.dot(&widened.t()) * 2.0).indexed_iter() {
                let got = s[i * s_stride + j];
                assert!((got - w).abs() < 1e-4, "{ctx}: S[{i}, {j}] = {got}, want {w}");
            }
            let largest = widened.iter().fold(0.0_f32, |m, x| m.max(x.abs()));
            assert_eq!(magnitude, largest, "{ctx}: magnitude of the keys");
            if !nan.widen().is_nan() {
                continue;
            }
            // A non-finite key element is never lost, wherever it sits (vector lanes or tail),
            // whatever its sign.
            for (at, x) in [([0, 0], f32::NAN), ([n_keys / 2, d / 2], f32::NEG_INFINITY)]
                .into_iter()
                .chain([([n_keys / 3, d * 7 / 8], f32::NAN), ([n_keys - 1, d - 1], -f32::NAN)])
            {
                let mut bad = stored.clone();
                bad[[at[0], head, at[1]]] = E::narrow(x);
                let magnitude = kernels.direct_scores(&packed_q, rows, bad.slice(s![.., head, ..]), &mut s);
                assert!(!magnitude.is_finite(), "{ctx}: {x} at {at:?} gave {magnitude}");
            }
        }
    }
}

/// A causal diagonal: the group starting at row `g` needs keys `..g + TILE_ROWS + 3`, so full
/// groups take one to all vectors of a panel, and the last groups skip panels or not.
fn check_trimmed_score_tiles<E: Element<Compute = f32>, K: Kernels<f32, E>>(kernels: K, level: SimdLevel) {
    // The last two run past one chunk of AMX's key panels (16 KiB: 8 panels at d = 64, 4 at
    // d = 128), some groups ending in the first chunk and some in a later one.
    for (rows, n_keys, d) in [(48_usize, 128, 64), (160, 320, 64), (96, 208, 128)] {
        if n_keys > K::KEY_BLOCK {
            continue;
        }
        let rows = rows.next_multiple_of(K::TILE_ROWS);
        let (q, k) = (matrix(rows, d, 4).mapv(E::narrow), matrix(n_keys, d, 5).mapv(E::narrow));
        let width = K::KEY_PANEL;
        let panels = n_keys / width;
        let keys = pack_keys(&k, width, K::LAYOUT);
        let mut packed_q = vec![0.0; rows * d];
        let scale = pack_queries(q.view(), 0, rows, 1.0, (K::TILE_ROWS, K::LAYOUT), &mut packed_q);
        let s_stride = K::SCORE_STRIDE;
        let mut s = vec![f32::NAN; rows * s_stride];
        let mut row_max = vec![f32::NEG_INFINITY; rows * K::LANES];
        let needed = |g: usize| (g + K::TILE_ROWS).min(rows) + 3;
        let tile = ScoreTile {
            q: &packed_q,
            scale,
            d,
            rows,
            real_rows: rows,
            keys: &keys,
            panels,
            s: &mut s,
            stride: s_stride,
            row_max: &mut row_max,
            maxima: true,
        };
        kernels.scores(tile, Some(&needed));
        let want = q.mapv(E::widen).dot(&k.mapv(E::widen).t());
        let group = |i: usize| i / K::TILE_ROWS * K::TILE_ROWS;
        let mut checked = 0;
        for ((i, j), w) in want.indexed_iter() {
            if j < needed(group(i)) {
                assert!((s[i * s_stride + j] - w).abs() < 1e-4, "{level} {rows}x{n_keys}x{d}: S[{i}, {j}]");
                checked += 1;
            }
        }
        assert_eq!(checked, (0..rows).map(|i| needed(group(i))).sum::<usize>());
        // The row maxima fold only computed scores, and never a NaN left in a skipped one.
        let mut maxima = vec![f32::NAN; rows];
        kernels.row_maxima(Rows { data: &row_max, stride: K::LANES, rows }, K::LANES, &mut maxima);
        for (i, got) in maxima.iter().enumerate() {
            let most = (0..needed(group(i))).map(|j| want[(i, j)]).fold(f32::NEG_INFINITY, f32::max);
            assert!(
                *got >= most - 1e-4 && got.is_finite(),
                "{level} {rows}x{n_keys}x{d}: max of row {i}: {got}, want at least {most}"
            );
        }
    }
}

#[test]
fn trimmed_score_tiles_compute_every_score_a_group_needs() {
    each_level!(f32, |kernels: K, level| { check_trimmed_score_tiles(kernels, level) });
    each_level!(bf16, |kernels: K, level| { check_trimmed_score_tiles(kernels, level) });
    each_level!(Q8, |kernels: K, level| { check_trimmed_score_tiles(kernels, level) });
}

#[test]
fn the_engine_runs_the_fastest_level_that_pays() {
    // AVX512-BF16 does not pay on Intel's CPUs: with AMX above it that changes nothing, without
    // AMX the engine runs AVX-512 (which `QKV_SIMD` can still raise).
    let fastest = SimdLevel::fastest();
    assert!(fastest <= SimdLevel::detected() && Isa::new(fastest).is_some_and(Isa::pays), "{fastest}");
    for level in SimdLevel::ALL.into_iter().filter(|&level| level > fastest) {
        assert!(!Isa::new(level).is_some_and(Isa::pays), "{level} runs and pays, above {fastest}");
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(Isa::Avx512Bf16(level)) = Isa::new(SimdLevel::Avx512Bf16) {
        // CPUID leaf 0 spells the vendor in EBX, EDX, ECX.
        let vendor = std::arch::x86_64::__cpuid(0);
        let intel = [vendor.ebx, vendor.edx, vendor.ecx] == [0x756e_6547, 0x4965_6e69, 0x6c65_746e];
        assert_eq!(level.pays(), !intel, "AVX512-BF16 pays on AMD's CPUs only");
    }
}

#[test]
fn every_level_the_cpu_reports_is_one_the_engine_runs() {
    // The dispatch is only as good as detection: the detected level must run, and the levels
    // above it must not claim to.
    let detected = SimdLevel::detected();
    for level in SimdLevel::ALL {
        assert_eq!(Isa::new(level).is_some(), level <= detected, "{level} against detected {detected}");
    }
    #[cfg(target_arch = "x86_64")]
    {
        let avx2 = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        assert_eq!(SimdLevel::Avx2.is_supported(), avx2);
        assert_eq!(SimdLevel::Avx512.is_supported(), is_x86_feature_detected!("avx512f"));
    }
}

/// Every finite bit pattern of a half-precision format `E`, as the kernels of one level read it
/// through `direct_scores` (queries that are unit vectors pick one component of each key, and
/// `1 · x` plus zeros is exact), and the magnitude of keys holding each non-finite pattern.
struct WidenEveryPattern<E> {
    finite: Vec<E>,
    non_finite: Vec<E>,
}

impl<E: Element<Compute = f32>> Job<E> for WidenEveryPattern<E> {
    type Output = (Vec<f32>, Vec<f32>);

    fn run<K: Kernels<f32, E>>(self, kernels: K) -> (Vec<f32>, Vec<f32>) {
        // Keys 16 components wide (whole vectors at every level), a block of them per call.
        let (d, rows) = (16, 4);
        let mut widened = vec![f32::NAN; self.finite.len()];
        let mut s = vec![f32::NAN; rows * KEY_BLOCK];
        for (keys, out) in self.finite.chunks(KEY_BLOCK * d).zip(widened.chunks_mut(KEY_BLOCK * d)) {
            let mut padded = keys.to_vec();
            padded.resize(keys.len().next_multiple_of(d), E::default());
            let n_keys = padded.len() / d;
            for first in (0..d).step_by(rows) {
                let q: Vec<f32> = (0..rows * d).map(|i| f32::from(i % d == first + i / d)).collect();
                let keys = ArrayView2::from_shape((n_keys, d), padded.as_slice()).unwrap();
                kernels.direct_scores(&q, rows, keys, &mut s);
                for j in 0..n_keys {
                    for r in 0..rows {
                        if let Some(slot) = out.get_mut(j * d + first + r) {
                            *slot = s[r * KEY_BLOCK + j];
                        }
                    }
                }
            }
        }
        let magnitudes = self
            .non_finite
            .iter()
            .map(|&bad| {
                let mut keys = vec![E::default(); 3 * K::LANES + 1];
                keys[K::LANES + 2] = bad;
                kernels.magnitude(&keys)
            })
            .collect();
        (widened, magnitudes)
    }
}

/// [`WidenEveryPattern`] for `E` at every level the CPU runs, and `Element::widen`, against
/// `half`'s own conversion `to_f32` (a NaN only has to stay a NaN).
fn check_every_pattern<E: Element<Compute = f32>>(name: &str, from_bits: fn(u16) -> E, to_f32: fn(E) -> f32) {
    let (finite, non_finite): (Vec<E>, Vec<E>) =
        (0..=u16::MAX).map(from_bits).partition(|&x| to_f32(x).is_finite());
    for &x in &finite {
        assert_eq!(x.widen().to_bits(), to_f32(x).to_bits(), "{name}: widen({})", to_f32(x));
    }
    for &x in &non_finite {
        let (got, want) = (x.widen(), to_f32(x));
        assert!(got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()), "{name}: widen({want})");
    }
    for level in SimdLevel::ALL {
        let Some(isa) = Isa::new(level) else {
            println!("{level}: skipped, this CPU does not run it");
            continue;
        };
        let job = WidenEveryPattern { finite: finite.clone(), non_finite: non_finite.clone() };
        let (widened, magnitudes) = isa.run::<E, _>(job);
        for (x, got) in finite.iter().zip(&widened) {
            let want = x.widen();
            // Bit for bit: -0 stays -0 (1 · -0 + 0 is +0, so compare magnitudes' bits there).
            assert!(
                got.to_bits() == want.to_bits() || (want == 0.0 && *got == 0.0),
                "{level} {name}: {want} read as {got}"
            );
        }
        assert!(magnitudes.iter().all(|m| !m.is_finite()), "{level} {name}: a NaN or infinity was lost");
    }
}

#[test]
fn half_precision_loads_widen_every_bit_pattern_exactly() {
    check_every_pattern::<bf16>("bf16", bf16::from_bits, bf16::to_f32);
    check_every_pattern::<f16>("f16", f16::from_bits, f16::to_f32);
}

#[test]
fn backward_tiles_match_plain_loops() {
    each_level!(f32, |kernels: K, level| {
        // (weight rows, keys, width of the rows summed): groups of TILE_ROWS keys and keys left
        // over, widths of whole vectors and a partial one.
        for (rows, n_keys, d) in [(1, 1, 1), (48, 128, 64), (7, 13, 17), (12, 100, 80), (3, 6, 8)] {
            let ctx = format!("{level} {rows}x{n_keys}x{d}");
            let p = matrix(rows, n_keys, 4);
            let mut tile = vec![f32::NAN; rows * KEY_BLOCK];
            for (i, row) in p.rows().into_iter().enumerate() {
                tile[i * KEY_BLOCK..i * KEY_BLOCK + n_keys].iter_mut().zip(row).for_each(|(t, &x)| *t = x);
            }
            let x = matrix(rows, d, 5);
            let vectors = d.div_ceil(K::LANES);
            let stride = vectors * K::LANES;
            let mut x_rows = vec![0.0; rows * stride];
            for (r, out) in x_rows.chunks_exact_mut(stride).enumerate() {
                pack_value_row(x.row(r), out);
            }
            let mut o = vec![1.0; n_keys * stride];
            let weights = Weights { p: &tile, rows, n_keys };
            kernels.accumulate_transposed(weights, ValueRows { v: &x_rows, stride, vectors }, &mut o);
            for ((j, c), w) in p.t().dot(&x).indexed_iter() {
                let (got, want) = (o[j * stride + c], 1.0 + w);
                assert!(
                    (got - want).abs() < 1e-3 * (1.0 + want.abs()),
                    "{ctx}: O[{j}, {c}] = {got}, want {want}"
                );
            }

            let used = n_keys.next_multiple_of(K::LANES).min(KEY_BLOCK);
            let dp = matrix(rows, KEY_BLOCK, 6);
            let mut ds: Vec<f32> = dp.iter().copied().collect();
            let delta: Vec<f32> = (0..rows).map(|r| 0.3 * r as f32 - 1.0).collect();
            let mut weights = tile.clone();
            weights.iter_mut().filter(|w| w.is_nan()).for_each(|w| *w = 0.5);
            let p_rows = Rows { data: &weights, stride: KEY_BLOCK, rows };
            kernels.softmax_gradient(
                p_rows,
                RowsMut { data: &mut ds, stride: KEY_BLOCK, rows },
                used,
                &delta,
            );
            for r in 0..rows {
                for j in 0..KEY_BLOCK {
                    let at = r * KEY_BLOCK + j;
                    let want = if j < used { weights[at] * (dp[[r, j]] - delta[r]) } else { dp[[r, j]] };
                    assert!((ds[at] - want).abs() < 1e-6, "{ctx}: dS[{r}, {j}] = {}, want {want}", ds[at]);
                }
            }
        }
    });
}
