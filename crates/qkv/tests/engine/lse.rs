//! Each row's logsumexp against the reference, and merging results over disjoint keys into the
//! result over all of them.

use ndarray::{Array1, Array2, Array3, Array4, Axis, Dimension, Ix4, IxDyn, s};
use qkv::{AdditiveBias, AttentionOptions, KeepMask, Part, PartialAttention, Real};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{MASK_KINDS, MaskKind, Problem, assert_close, error_bound, levels};

/// Logsumexps agree: `-inf` (a row that sees nothing) exactly, the rest within `tol · bound` as
/// [`assert_close`] measures (a score's rounding moves its logsumexp by as much).
pub fn assert_lse_close<T: Real>(what: &str, got: &Array1<T>, want: &Array1<f64>, bound: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if *w == f64::NEG_INFINITY {
            assert_eq!(g.to_f64_exact(), f64::NEG_INFINITY, "{what}[{i}]: a row that sees nothing");
        }
    }
    let finite = |x: f64| if x == f64::NEG_INFINITY { 0.0 } else { x };
    let got = got.mapv(|g| T::from_f64_round(finite(g.to_f64_exact()))).insert_axis(Axis(1));
    assert_close(what, &got, &want.mapv(finite).insert_axis(Axis(1)), bound);
}

fn check_lse<T: Real>(seed: u64, dims: (usize, usize, usize, usize), magnitude: f64, mask: MaskKind) {
    let p = Problem::<T>::random(seed, dims, magnitude, mask);
    let options = p.options();
    let want = qkv::reference::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    let full = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    assert_eq!(want.output, full.output);
    let (weight_bound, output_bound) = error_bound(&full, &p.v);
    for level in levels() {
        let got = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options.clone().simd(level))
            .unwrap();
        let ctx = format!("{} {level} {dims:?} x{magnitude} {mask:?}", T::NAME);
        assert_close(&format!("output {ctx}"), &got.output, &want.output, output_bound);
        assert_lse_close(&format!("logsumexp {ctx}"), &got.logsumexp, &want.logsumexp, weight_bound);
    }
}

#[test]
fn logsumexp_matches_reference() {
    for (i, dims) in [(1, 1, 1, 1), (17, 65, 8, 3), (130, 129, 64, 64), (3, 2100, 16, 16), (200, 300, 24, 40)]
        .into_iter()
        .enumerate()
    {
        for mask in MASK_KINDS {
            check_lse::<f32>(i as u64, dims, 1.0, mask);
            check_lse::<f64>(i as u64, dims, 1.0, mask);
        }
    }
    // Scores near ±1e4 overflow nothing, and large inputs go through the blocked path.
    check_lse::<f32>(7, (70, 90, 64, 16), 40.0, MaskKind::Bias);
    check_lse::<f32>(8, (9, 33, 4, 3), 4e18, MaskKind::CausalBottomRight);
}

/// Attention with `keep` and `bias` masks over the keys in `keys` only (the masks sliced with
/// them), at `level`.
fn part<T: Real>(
    (q, k, v): (&Array2<T>, &Array2<T>, &Array2<T>),
    keep: &Array2<bool>,
    bias: &Array2<T>,
    keys: std::ops::Range<usize>,
    level: qkv::SimdLevel,
) -> PartialAttention<T> {
    let (keep, bias) = (keep.slice(s![.., keys.clone()]), bias.slice(s![.., keys.clone()]));
    let options =
        AttentionOptions::new().keep_mask(KeepMask::new(keep)).bias(AdditiveBias::new(bias)).simd(level);
    qkv::attention_with_lse(q.view(), k.slice(s![keys.clone(), ..]), v.slice(s![keys, ..]), &options).unwrap()
}

fn check_merge<T: Real>(seed: u64, (n_q, n_k, d_k, d_v): (usize, usize, usize, usize), tol: f64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut random =
        |r, c| Array2::from_shape_simple_fn((r, c), || T::from_f64_round(rng.random_range(-1.0..1.0)));
    let (q, k, v) = (random(n_q, d_k), random(n_k, d_k), random(n_k, d_v));
    // Rows 1 and 4 see no key at all; other rows see none in some parts.
    let keep = Array2::from_shape_fn((n_q, n_k), |(i, j)| i != 1 && i != 4 && (i + 2 * j) % 5 != 0);
    let bias = random(n_q, n_k);
    for level in levels() {
        let full = part((&q, &k, &v), &keep, &bias, 0..n_k, level);
        for cuts in
            [vec![0], vec![1], vec![n_k / 2], vec![n_k - 1], vec![n_k], vec![n_k / 3, n_k / 3, 2 * n_k / 3]]
        {
            let mut bounds = vec![0];
            bounds.extend(cuts.iter().copied());
            bounds.push(n_k);
            let mut parts = bounds.windows(2).map(|w| part((&q, &k, &v), &keep, &bias, w[0]..w[1], level));
            let first = parts.next().expect("at least one part");
            let merged = parts.fold(first, |merged, part| merged.merge(&part).unwrap());
            let ctx = format!("{} {level} {n_q}x{n_k} cut at {cuts:?}", T::NAME);
            let diff = |a: &Array2<T>, b: &Array2<T>| {
                a.iter().zip(b).fold(0.0_f64, |m, (x, y)| m.max((x.to_f64_exact() - y.to_f64_exact()).abs()))
            };
            assert!(diff(&merged.output, &full.output) <= tol, "output {ctx}");
            for (i, (m, f)) in merged.logsumexp.iter().zip(&full.logsumexp).enumerate() {
                let (m, f) = (m.to_f64_exact(), f.to_f64_exact());
                assert!(m == f || (m - f).abs() <= tol, "logsumexp {ctx} row {i}: {m} vs {f}");
            }
            assert!([1, 4].iter().filter(|&&i| i < n_q).all(|&i| merged.logsumexp[i] == T::neg_infinity()));
        }
    }
}

#[test]
fn merging_parts_over_disjoint_keys_gives_the_whole() {
    for (seed, dims) in [(1, 1, 1, 1), (5, 7, 3, 2), (17, 300, 16, 8), (2, 2500, 32, 16), (130, 129, 64, 24)]
        .into_iter()
        .map(|(n_q, n_k, d_k, d_v)| (n_q as u64, (n_q, n_k, d_k, d_v)))
    {
        check_merge::<f64>(seed, dims, 1e-12);
        check_merge::<f32>(seed, dims, 2e-5);
    }
}

#[test]
fn multi_head_parts_merge_into_the_whole() {
    let mut rng = ChaCha8Rng::seed_from_u64(3);
    let mut random4 = |shape| Array4::from_shape_simple_fn(shape, || rng.random_range(-1.0..1.0_f64));
    let (q, k, v) = (random4((2, 4, 5, 8)), random4((2, 2, 70, 8)), random4((2, 2, 70, 6)));
    let o = AttentionOptions::new();
    let full = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &o).unwrap();
    let keys = |r: std::ops::Range<usize>| (k.slice(s![.., .., r.clone(), ..]), v.slice(s![.., .., r, ..]));
    let ((k1, v1), (k2, v2)) = (keys(0..20), keys(20..70));
    let first = qkv::multi_head_attention_with_lse(q.view(), k1, v1, &o).unwrap();
    let rest = qkv::multi_head_attention_with_lse(q.view(), k2, v2, &o).unwrap();
    let merged = rest.merge(&first).unwrap();
    assert!(merged.output.iter().zip(&full.output).all(|(a, b)| (a - b).abs() < 1e-12));
    assert!(merged.logsumexp.iter().zip(&full.logsumexp).all(|(a, b)| (a - b).abs() < 1e-12));
    // Parts of different queries do not merge.
    let other = qkv::multi_head_attention_with_lse(q.slice(s![.., .., ..4, ..]), k1, v1, &o).unwrap();
    assert_eq!(
        first.merge(&other).unwrap_err().to_string(),
        "cannot merge shapes [2, 4, 5, 6] and [2, 4, 4, 6]: a merge takes two outputs of the same queries, of the same shape"
    );
}

/// A part as `merge_into` reads it, in place.
fn parts<T, D: Dimension>(p: &PartialAttention<T, D>) -> Part<'_, T, D> {
    (p.output.view(), p.logsumexp.view())
}

/// `merge_into` reads the parts where they are and gives `merge`'s bits: parts laid out row after
/// row (merged as `[rows, d]`) and parts whose rows are not (a head-major tensor viewed
/// query-major, merged a row at a time in their own shape), over a dynamic number of axes too.
#[test]
fn merging_views_into_an_output_gives_merges_bits_in_any_layout() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    let mut random4 = |shape| Array4::from_shape_simple_fn(shape, || rng.random_range(-1.0..1.0_f64));
    let (q, k, v) = (random4((2, 3, 5, 8)), random4((2, 3, 40, 8)), random4((2, 3, 40, 6)));
    let o = AttentionOptions::new();
    let split = |r: std::ops::Range<usize>| {
        let (k, v) = (k.slice(s![.., .., r.clone(), ..]), v.slice(s![.., .., r, ..]));
        qkv::multi_head_attention_with_lse(q.view(), k, v, &o).unwrap()
    };
    let (first, second) = (split(0..15), split(15..40));
    let merged = first.clone().merge(&second).unwrap();
    let (mut out, mut lse) =
        (Array4::from_elem((2, 3, 5, 6), f64::NAN), Array3::from_elem((2, 3, 5), f64::NAN));
    PartialAttention::merge_into(parts(&first), parts(&second), out.view_mut(), lse.view_mut()).unwrap();
    assert_eq!((&out, &lse), (&merged.output, &merged.logsumexp), "row after row");
    // Query-major views of head-major arrays: not one run of rows.
    fn swapped(p: &PartialAttention<f64, Ix4>) -> Part<'_, f64, IxDyn> {
        let (mut o, mut l) = parts(p);
        o.swap_axes(1, 2);
        l.swap_axes(1, 2);
        (o.into_dyn(), l.into_dyn())
    }
    let (mut out, mut lse) =
        (Array4::from_elem((2, 5, 3, 6), f64::NAN), Array3::from_elem((2, 5, 3), f64::NAN));
    PartialAttention::merge_into(
        swapped(&first),
        swapped(&second),
        out.view_mut().into_dyn(),
        lse.view_mut().into_dyn(),
    )
    .unwrap();
    let (mut want, mut want_lse) = (merged.output.view(), merged.logsumexp.view());
    want.swap_axes(1, 2);
    want_lse.swap_axes(1, 2);
    assert_eq!((out.view(), lse.view()), (want, want_lse), "a row at a time");
    // A 0-D "output" has no rows: an error, not a panic.
    let (scalar, no_lse) = (ndarray::arr0(1.0_f64), ndarray::arr0(0.0_f64));
    let part0 = || (scalar.view(), no_lse.view());
    let (mut o0, mut l0) = (ndarray::arr0(0.0_f64), ndarray::arr0(0.0_f64));
    assert!(PartialAttention::merge_into(part0(), part0(), o0.view_mut(), l0.view_mut()).is_err());
    let wrong = Array3::<f64>::zeros((2, 3, 4));
    assert_eq!(
        PartialAttention::merge_into(
            parts(&first),
            parts(&second),
            Array4::zeros((2, 3, 5, 6)).view_mut(),
            wrong.clone().view_mut()
        )
        .unwrap_err()
        .to_string(),
        "cannot merge shapes [2, 3, 5] and [2, 3, 4]: a merge takes the parts and what their merge is written into"
    );
}

#[test]
fn merging_refuses_a_nan_or_infinite_part() {
    let part = |output: [f64; 2], lse: f64| PartialAttention {
        output: Array2::from_shape_vec((1, 2), output.to_vec()).unwrap(),
        logsumexp: Array1::from_elem(1, lse),
    };
    let good = part([1.0, 2.0], 0.5);
    for (first, second, message) in [
        (
            part([1.0, 2.0], f64::NAN),
            good.clone(),
            "cannot merge: the first part's logsumexp[0] is NaN; a logsumexp is finite, or -inf for a row that sees no key",
        ),
        (
            good.clone(),
            part([1.0, 2.0], f64::INFINITY),
            "cannot merge: the second part's logsumexp[0] is inf; a logsumexp is finite, or -inf for a row that sees no key",
        ),
        (
            good.clone(),
            part([1.0, f64::NAN], 0.25),
            "cannot merge: the second part's output[0, 1] is NaN; an output is finite",
        ),
    ] {
        assert_eq!(first.merge(&second).unwrap_err().to_string(), message);
    }
    // A row that sees no key (-inf) still merges, whatever the other part holds there.
    let empty = part([0.0, 0.0], f64::NEG_INFINITY);
    assert_eq!(empty.merge(&good).unwrap(), good);
}

/// Merges large enough to go in pieces shared with the pool: every row as the formula gives it,
/// computed here a row at a time; a bad value in one piece stops the merge with the error that
/// names the first bad value (the first part's before the second's), wherever the pieces are.
#[test]
fn merges_in_pieces_give_every_row_and_name_the_first_bad_value() {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let shape = (3, 4, 300, 40);
    let mut part = || PartialAttention::<f64, Ix4> {
        output: Array4::from_shape_simple_fn(shape, || rng.random_range(-1.0..1.0)),
        logsumexp: Array3::from_shape_simple_fn((3, 4, 300), || {
            if rng.random_range(0.0..1.0) < 0.1 { f64::NEG_INFINITY } else { rng.random_range(-30.0..30.0) }
        }),
    };
    let (first, second) = (part(), part());
    let merged = first.clone().merge(&second).unwrap();
    for ((b, h, i), &lse) in merged.logsumexp.indexed_iter() {
        let (la, lb) = (first.logsumexp[(b, h, i)], second.logsumexp[(b, h, i)]);
        let m = la.max(lb);
        let (wa, wb) = if m == f64::NEG_INFINITY { (1.0, 0.0) } else { ((la - m).exp(), (lb - m).exp()) };
        let want_lse = if m == f64::NEG_INFINITY { m } else { m + (wa + wb).ln() };
        assert!(
            (lse - want_lse).abs() <= 1e-12 * want_lse.abs().max(1.0) || lse == want_lse,
            "lse {b} {h} {i}"
        );
        for c in 0..shape.3 {
            let want = (first.output[(b, h, i, c)] * wa + second.output[(b, h, i, c)] * wb) / (wa + wb);
            assert!((merged.output[(b, h, i, c)] - want).abs() <= 1e-14, "output {b} {h} {i} {c}");
        }
    }
    let (mut out, mut lse) = (Array4::zeros(shape), Array3::zeros((3, 4, 300)));
    PartialAttention::merge_into(parts(&first), parts(&second), out.view_mut(), lse.view_mut()).unwrap();
    assert_eq!((&out, &lse), (&merged.output, &merged.logsumexp));

    // An early bad output in the second part and a late bad logsumexp in the first: the first's.
    let (mut bad_first, mut bad_second) = (first.clone(), second.clone());
    bad_second.output[(0, 0, 2, 5)] = f64::INFINITY;
    bad_first.logsumexp[(2, 3, 290)] = f64::NAN;
    let first_message = "cannot merge: the first part's logsumexp[2, 3, 290] is NaN; a logsumexp is finite, or -inf for a row that sees no key";
    let second_message = "cannot merge: the second part's output[0, 0, 2, 5] is inf; an output is finite";
    assert_eq!(bad_first.clone().merge(&bad_second).unwrap_err().to_string(), first_message);
    let into = |a: &PartialAttention<f64, Ix4>, b: &PartialAttention<f64, Ix4>| {
        let (mut out, mut lse) = (Array4::zeros(shape), Array3::zeros((3, 4, 300)));
        PartialAttention::merge_into(parts(a), parts(b), out.view_mut(), lse.view_mut())
            .unwrap_err()
            .to_string()
    };
    assert_eq!(into(&bad_first, &bad_second), first_message);
    assert_eq!(first.clone().merge(&bad_second).unwrap_err().to_string(), second_message);
    assert_eq!(into(&first, &bad_second), second_message);
}

/// A merge of two finite rows can overflow (outputs at f32's largest, weights that round to a
/// sum above 1): a refused merge still names the value the caller gave, in `merge` too, whose
/// first part is merged in place.
#[test]
fn a_refused_merge_names_a_value_given_not_one_merged() {
    let rows = 2 * (1 << 14) + 1;
    let part = |output: f32, lse: f32| PartialAttention::<f32> {
        output: Array2::from_elem((rows, 1), output),
        logsumexp: Array1::from_elem(rows, lse),
    };
    let (first, mut second) = (part(f32::MAX, 0.0), part(f32::MAX, -17.3286));
    let merged = first.clone().merge(&second).unwrap();
    assert_eq!(merged.output[[0, 0]], f32::INFINITY, "this pair overflows when merged");
    second.logsumexp[rows - 1] = f32::NAN;
    let message = format!(
        "cannot merge: the second part's logsumexp[{}] is NaN; a logsumexp is finite, or -inf for a row that sees no key",
        rows - 1
    );
    assert_eq!(first.clone().merge(&second).unwrap_err().to_string(), message);
    let (mut out, mut lse) = (Array2::zeros((rows, 1)), Array1::zeros(rows));
    let err = PartialAttention::merge_into(parts(&first), parts(&second), out.view_mut(), lse.view_mut());
    assert_eq!(err.unwrap_err().to_string(), message);
}
