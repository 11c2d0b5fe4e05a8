//! The backward: the reference against central finite differences of the reference forward, and
//! the tiled path against the reference at every SIMD level, for every mask kind, on the awkward
//! grid; thread-count independence, keys no query sees, grouped-query heads and the errors.

use ndarray::{Array2, Array4, ArrayView2, Axis, s};
use qkv::half::bf16;
use qkv::{AdditiveBias, AttentionOptions, GradientsMut, Real, SimdLevel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{MASK_KINDS, MaskKind, Problem, backward_on_pair_products, levels, pair_level};

/// A random output gradient, `[n_q, d_v]`, entries in `[-1, 1]`.
fn d_output<T: Real>(seed: u64, n_q: usize, d_v: usize) -> Array2<T> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    Array2::from_shape_simple_fn((n_q, d_v), || T::from_f64_round(rng.random_range(-1.0..=1.0)))
}

/// `L = Σ dO ∘ O` by the reference forward: the loss whose gradients the backward computes.
fn loss(
    q: ArrayView2<f64>,
    k: ArrayView2<f64>,
    v: ArrayView2<f64>,
    d_out: &Array2<f64>,
    o: &AttentionOptions<f64>,
) -> f64 {
    let out = qkv::reference::attention(q, k, v, o).unwrap().output;
    (&out * d_out).sum()
}

/// Central differences of [`loss`] with respect to every element of `x` (one of the inputs,
/// perturbed through `with`), step `h`.
fn finite_differences(x: &Array2<f64>, with: &dyn Fn(&Array2<f64>) -> f64) -> Array2<f64> {
    let h = 1e-6;
    Array2::from_shape_fn(x.raw_dim(), |idx| {
        if !x[idx].is_finite() {
            return 0.0; // a hidden pair of a bias: its gradient is 0
        }
        let (mut up, mut down) = (x.clone(), x.clone());
        up[idx] += h;
        down[idx] -= h;
        (with(&up) - with(&down)) / (2.0 * h)
    })
}

fn assert_matches_differences(what: &str, got: &Array2<f64>, want: &Array2<f64>) {
    for ((idx, g), w) in got.indexed_iter().zip(want) {
        assert!(
            (g - w).abs() <= 1e-7 * (1.0 + w.abs()),
            "{what}{idx:?}: backward {g}, finite differences {w}"
        );
    }
}

#[test]
fn reference_backward_matches_finite_differences_for_every_mask() {
    for mask in MASK_KINDS {
        check_reference_backward(mask, None, 1.0);
    }
}

/// Soft-capped scores (inputs of magnitude 3, scaled scores past the cap of 1.5): `dQ` and `dK`
/// through the cap's derivative, `dBias` not (the bias is added after the cap).
#[test]
fn soft_capped_gradients_match_finite_differences_and_the_reference() {
    for mask in MASK_KINDS {
        check_reference_backward(mask, Some(1.5), 3.0);
        for (seed, dims) in [(11, (37, 130, 8, 5)), (12, (1, 200, 16, 16)), (13, (49, 17, 3, 8))] {
            check_fast_capped::<f32>(seed, dims, 3.0, mask, Some(1.5));
            check_fast_capped::<f64>(seed, dims, 3.0, mask, Some(1.5));
        }
    }
}

/// The reference backward of problems with `mask` (soft-capped at `softcap`, entries of
/// `magnitude`) against central differences of the reference forward.
fn check_reference_backward(mask: MaskKind, softcap: Option<f64>, magnitude: f64) {
    {
        // n_q > n_k leaves the first rows of a bottom-right causal mask with nothing to see.
        for (seed, dims) in [(1, (5, 7, 3, 2)), (2, (6, 4, 2, 3)), (3, (1, 1, 1, 1))] {
            let p = Problem::<f64>::random(seed, dims, magnitude, mask).capped(softcap);
            let d_out = d_output::<f64>(seed, dims.0, dims.3);
            let options = p.options();
            let g = qkv::reference::attention_backward(
                p.q.view(),
                p.k.view(),
                p.v.view(),
                d_out.view(),
                &options,
            )
            .unwrap();
            let ctx = format!("{mask:?} {dims:?} cap {softcap:?}");
            let (q, k, v) = (p.q.view(), p.k.view(), p.v.view());
            let dq = finite_differences(&p.q, &|x| loss(x.view(), k, v, &d_out, &options));
            let dk = finite_differences(&p.k, &|x| loss(q, x.view(), v, &d_out, &options));
            let dv = finite_differences(&p.v, &|x| loss(q, k, x.view(), &d_out, &options));
            assert_matches_differences(&format!("dq {ctx}"), &g.dq, &dq);
            assert_matches_differences(&format!("dk {ctx}"), &g.dk, &dk);
            assert_matches_differences(&format!("dv {ctx}"), &g.dv, &dv);
            assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|x| x.is_finite()), "{ctx}: finite");
            match mask {
                MaskKind::Bias => {
                    let dbias = finite_differences(p.bias(), &|b| {
                        let options = AttentionOptions::new().bias(AdditiveBias::new(b.view()));
                        let options = match softcap {
                            Some(cap) => options.logit_softcap(cap),
                            None => options,
                        };
                        loss(q, k, v, &d_out, &options)
                    });
                    assert_matches_differences(&format!("dbias {ctx}"), g.dbias.as_ref().unwrap(), &dbias);
                }
                _ => assert!(g.dbias.is_none(), "{ctx}: no bias, no bias gradient"),
            }
        }
    }
}

/// Bounds of the gradients' rounding, element by element: each gradient computed with the
/// magnitudes of every term (`|dO|`, `|V|`, ... and `P`), so that cancellation cannot hide a
/// large error, times `1 + max |s|` (a score's rounding moves its weight by that, relatively).
fn gradient_bounds<T: Real>(
    p: &Problem<T>,
    d_out: &Array2<T>,
    options: &AttentionOptions<T>,
) -> (f64, GradientBounds) {
    // The problems use the default scale.
    let scale = 1.0 / (p.q.ncols() as f64).sqrt();
    bounds_of([p.q.view(), p.k.view(), p.v.view()], d_out.view(), options, scale)
}

/// [`gradient_bounds`] of any inputs `[q, k, v]` and output gradient, whose scores are scaled
/// by `scale`.
pub(crate) fn bounds_of<T: Real>(
    [q, k, v]: [ArrayView2<T>; 3],
    d_out: ArrayView2<T>,
    options: &AttentionOptions<T>,
    scale: f64,
) -> (f64, GradientBounds) {
    let r = qkv::reference::attention(q, k, v, options).unwrap();
    let abs = |x: ArrayView2<T>| x.mapv(|x| x.to_f64_exact().abs());
    let (q, k, v, d_o) = (abs(q), abs(k), abs(v), abs(d_out));
    // Keys no query sees are zeros to the backward: their bound is what it is for zeros.
    let seen: Vec<bool> = r.weights.columns().into_iter().map(|c| c.iter().any(|&w| w > 0.0)).collect();
    let (k, v) = (mask_rows(k, &seen), mask_rows(v, &seen));
    let weights = r.weights.clone().into_inner();
    let dv = weights.t().dot(&d_o);
    let o = r.output.mapv(f64::abs);
    let delta = (&d_o * &o).sum_axis(Axis(1)).insert_axis(Axis(1));
    let ds = &weights * &(d_o.dot(&v.t()) + &delta);
    let dq = ds.dot(&k) * scale;
    let dk = ds.t().dot(&q) * scale;
    let max_score = r.scores.iter().filter(|s| s.is_finite()).fold(0.0_f64, |m, s| m.max(s.abs()));
    (1.0 + max_score, GradientBounds { dq, dk, dv, dbias: Some(ds) })
}

/// [`gradient_bounds`]' bound of each gradient, named as `qkv::Gradients`' fields.
pub(crate) struct GradientBounds {
    pub(crate) dq: Array2<f64>,
    pub(crate) dk: Array2<f64>,
    pub(crate) dv: Array2<f64>,
    pub(crate) dbias: Option<Array2<f64>>,
}

fn mask_rows(mut x: Array2<f64>, seen: &[bool]) -> Array2<f64> {
    for (mut row, &seen) in x.rows_mut().into_iter().zip(seen) {
        if !seen {
            row.fill(0.0);
        }
    }
    x
}

/// `|got - want| <= tol · condition · (bound + max(bound) / 100)`: the element's own bound, and a
/// floor for elements whose terms are all tiny, with `tol` 1e-12 for f64 and 2e-5 for f32.
pub(crate) fn assert_gradient_close<T: Real>(
    what: &str,
    got: &Array2<T>,
    want: &Array2<f64>,
    bound: &Array2<f64>,
    condition: f64,
) {
    let tol = if T::NAME == "f32" { 2e-5 } else { 1e-12 };
    assert_eq!(got.shape(), want.shape(), "{what}: shapes differ");
    let floor = bound.iter().fold(0.0_f64, |m, &b| m.max(b)) / 100.0;
    for (((idx, g), w), b) in got.indexed_iter().zip(want).zip(bound) {
        let g = g.to_f64_exact();
        let allowed = tol * condition * (b + floor);
        assert!((g - w).abs() <= allowed, "{what}{idx:?}: got {g}, want {w} (allowed {allowed:e})");
    }
}

/// The tiled backward (from the tiled forward's output and logsumexp, at the same level) against
/// the reference at every SIMD level, allocating and into NaN-filled buffers.
fn check_fast<T: Real>(seed: u64, dims: (usize, usize, usize, usize), magnitude: f64, mask: MaskKind) {
    check_fast_capped::<T>(seed, dims, magnitude, mask, None);
}

/// [`check_fast`] with the scores soft-capped at `softcap`.
fn check_fast_capped<T: Real>(
    seed: u64,
    dims: (usize, usize, usize, usize),
    magnitude: f64,
    mask: MaskKind,
    softcap: Option<f64>,
) {
    let p = Problem::<T>::random(seed, dims, magnitude, mask).capped(softcap);
    let d_out = d_output::<T>(seed, dims.0, dims.3);
    let want =
        qkv::reference::attention_backward(p.q.view(), p.k.view(), p.v.view(), d_out.view(), &p.options())
            .unwrap();
    let (condition, bounds) = gradient_bounds(&p, &d_out, &p.options());
    for level in levels() {
        let options = p.options().simd(level);
        let ctx = format!("{} {level} {dims:?} x{magnitude} {mask:?} cap {softcap:?} seed {seed}", T::NAME);
        let forward = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        let got =
            qkv::attention_backward(p.q.view(), p.k.view(), p.v.view(), &forward, d_out.view(), &options)
                .unwrap();
        let mut into = [&p.q, &p.k, &p.v].map(|x| Array2::from_elem(x.raw_dim(), T::nan()));
        let mut dbias = Array2::from_elem((dims.0, dims.1), T::nan());
        let [dq, dk, dv] = &mut into;
        let buffers = GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
        let buffers = if want.dbias.is_some() { buffers.with_dbias(dbias.view_mut()) } else { buffers };
        qkv::attention_backward_into(
            p.q.view(),
            p.k.view(),
            p.v.view(),
            &forward,
            d_out.view(),
            &options,
            buffers,
        )
        .unwrap();
        for (name, got) in [("", &got.dq), (" (into)", &into[0])] {
            assert_gradient_close(&format!("dq{name} {ctx}"), got, &want.dq, &bounds.dq, condition);
        }
        for (name, got) in [("", &got.dk), (" (into)", &into[1])] {
            assert_gradient_close(&format!("dk{name} {ctx}"), got, &want.dk, &bounds.dk, condition);
        }
        for (name, got) in [("", &got.dv), (" (into)", &into[2])] {
            assert_gradient_close(&format!("dv{name} {ctx}"), got, &want.dv, &bounds.dv, condition);
        }
        if let Some(want_bias) = &want.dbias {
            let bound = bounds.dbias.as_ref().unwrap();
            assert_gradient_close(
                &format!("dbias {ctx}"),
                got.dbias.as_ref().unwrap(),
                want_bias,
                bound,
                condition,
            );
            assert_gradient_close(&format!("dbias (into) {ctx}"), &dbias, want_bias, bound, condition);
        } else {
            assert!(got.dbias.is_none(), "{ctx}: no bias, no bias gradient");
        }
    }
}

/// Sizes around the SIMD widths, the query block (48) and the key block (128), plus 1.
const GRID_SIZES: [usize; 10] = [1, 2, 15, 17, 47, 48, 49, 127, 128, 129];
/// Head widths below, at and above the SIMD width, and the common 64.
const GRID_DIMS: [usize; 5] = [1, 3, 8, 17, 64];

#[test]
fn fast_backward_matches_reference_on_the_awkward_grid() {
    // Every mask kind at every size, the widths rotating (d_k != d_v for most). A debug build
    // (unoptimised kernels) takes every fourth pair, each mask kind at two or three sizes.
    let step = if cfg!(debug_assertions) { 4 } else { 1 };
    for (i, &n_q) in GRID_SIZES.iter().enumerate() {
        for (j, mask) in MASK_KINDS.into_iter().enumerate().filter(|(j, _)| (i + j) % step == 0) {
            let n_k = GRID_SIZES[(i + 3 * j + 1) % GRID_SIZES.len()];
            let d_k = GRID_DIMS[(i + j) % GRID_DIMS.len()];
            let d_v = GRID_DIMS[(i + 2 * j + 1) % GRID_DIMS.len()];
            let seed = (i * 100 + j) as u64;
            check_fast::<f32>(seed, (n_q, n_k, d_k, d_v), 1.0, mask);
            check_fast::<f64>(seed, (n_q, n_k, d_k, d_v), 1.0, mask);
        }
    }
    // No queries, and no keys.
    check_fast::<f32>(3, (0, 70, 8, 16), 1.0, MaskKind::CausalBottomRight);
    check_fast::<f32>(3, (20, 0, 8, 16), 1.0, MaskKind::None);
}

#[test]
fn fast_backward_matches_reference_with_huge_scores_and_many_tiles() {
    // Scores up to about 40 · 40 · 64 / 8: weights of exactly 0 and 1 beside ordinary ones.
    for mask in [MaskKind::None, MaskKind::CausalTopLeft, MaskKind::Bias] {
        check_fast::<f32>(7, (49, 130, 64, 17), 40.0, mask);
    }
    if cfg!(debug_assertions) {
        return; // f64 and the larger shapes run in release builds
    }
    for mask in [MaskKind::None, MaskKind::CausalTopLeft, MaskKind::Bias] {
        check_fast::<f64>(7, (49, 130, 64, 17), 40.0, mask);
    }
    for mask in MASK_KINDS {
        check_fast::<f32>(1, (300, 257, 64, 80), 1.0, mask);
    }
    for mask in [MaskKind::CausalBottomRight, MaskKind::PaddingBlocks, MaskKind::CausalWindow] {
        check_fast::<f32>(2, (600, 600, 64, 64), 1.0, mask);
    }
}

/// The half-precision backward (from the half-precision forward) against the reference on the
/// same inputs, widened exactly, at every SIMD level: the f32 backward's tolerance, since the
/// backward computes in f32 from the widened inputs. It widens them as it packs them, which must
/// give the f32 backward's gradients on widened copies bit for bit, except for bf16 at the AMX
/// level, whose score products read the stored bf16 on the tiles (exact products, summed in
/// another order).
fn check_half<H: qkv::Half>(seed: u64, dims: (usize, usize, usize, usize), magnitude: f64, mask: MaskKind) {
    check_half_with::<H>(seed, dims, magnitude, mask, None, None);
}

/// [`check_half`] with the scores soft-capped at `softcap` and an attention sink of logit `sink`.
fn check_half_with<H: qkv::Half>(
    seed: u64,
    dims: (usize, usize, usize, usize),
    magnitude: f64,
    mask: MaskKind,
    softcap: Option<f64>,
    sink: Option<f32>,
) {
    let mut p = Problem::<f32>::random(seed, dims, magnitude, mask).capped(softcap);
    let round = |x: &Array2<f32>| x.mapv(H::from_f32);
    let (q, k, v) = (round(&p.q), round(&p.k), round(&p.v));
    let d_out = round(&d_output::<f32>(seed, dims.0, dims.3));
    (p.q, p.k, p.v) = (q.mapv(H::to_f32), k.mapv(H::to_f32), v.mapv(H::to_f32));
    let d_out_f32 = d_out.mapv(H::to_f32);
    let sinks = sink.map(|s| [s]);
    let base = match &sinks {
        Some(sinks) => p.options().sinks(sinks),
        None => p.options(),
    };
    let want =
        qkv::reference::attention_backward(p.q.view(), p.k.view(), p.v.view(), d_out_f32.view(), &base)
            .unwrap();
    let (condition, bounds) = gradient_bounds(&p, &d_out_f32, &base);
    for level in levels() {
        let ctx = format!(
            "{} {level} {dims:?} x{magnitude} {mask:?} cap {softcap:?} sink {sink:?} seed {seed}",
            H::NAME
        );
        // The pair levels' forward rounds the weights to bf16 before `P·V`, an error in the
        // output that these bounds do not count: their backward takes the f32 weights' output.
        let forward_level = if pair_level(level) { SimdLevel::Avx512 } else { level };
        let forward_options = base.clone().simd(forward_level);
        let forward = qkv::attention_half_with_lse(q.view(), k.view(), v.view(), &forward_options).unwrap();
        let options = base.clone().simd(level);
        let got =
            qkv::attention_backward_half(q.view(), k.view(), v.view(), &forward, d_out.view(), &options)
                .unwrap();
        let widened =
            qkv::attention_backward(p.q.view(), p.k.view(), p.v.view(), &forward, d_out_f32.view(), &options)
                .unwrap();
        if !(H::NAME == "bf16" && backward_on_pair_products(level)) {
            assert_eq!(got, widened, "{ctx}: the f32 backward on the widened inputs");
        }
        assert_gradient_close(&format!("dq {ctx}"), &got.dq, &want.dq, &bounds.dq, condition);
        assert_gradient_close(&format!("dk {ctx}"), &got.dk, &want.dk, &bounds.dk, condition);
        assert_gradient_close(&format!("dv {ctx}"), &got.dv, &want.dv, &bounds.dv, condition);
        if let Some(want_bias) = &want.dbias {
            let (got_bias, bound) = (got.dbias.as_ref().unwrap(), bounds.dbias.as_ref().unwrap());
            assert_gradient_close(&format!("dbias {ctx}"), got_bias, want_bias, bound, condition);
        }
        if let Some(want_sinks) = &want.dsinks {
            // The sinks test's bound: a sum over the rows of terms of size about 1.
            let (got_sink, want_sink) = (got.dsinks.as_ref().unwrap()[0], want_sinks[0]);
            let bound = 1e-4 * (1.0 + dims.0 as f64);
            assert!(
                (f64::from(got_sink) - want_sink).abs() <= bound,
                "dsink {ctx}: {got_sink} vs {want_sink}"
            );
        }
    }
}

#[test]
fn half_precision_backward_matches_reference_for_every_mask() {
    // Every mask kind at an awkward size (d_k != d_v, off the query and key blocks), n = 1, huge
    // scores, and a fully masked row where the masks make one; bf16 and f16 alike.
    for (j, mask) in MASK_KINDS.into_iter().enumerate() {
        let n_q = GRID_SIZES[(j + 2) % GRID_SIZES.len()];
        let n_k = GRID_SIZES[(3 * j + 5) % GRID_SIZES.len()];
        check_half::<bf16>(j as u64, (n_q, n_k, 17, 8), 1.0, mask);
        check_half::<half::f16>(j as u64, (n_k, n_q, 8, 64), 1.0, mask);
    }
    check_half::<bf16>(5, (1, 1, 3, 5), 1.0, MaskKind::None);
    check_half::<bf16>(6, (49, 130, 64, 17), 40.0, MaskKind::CausalTopLeft);
    check_half::<half::f16>(6, (49, 130, 64, 17), 8.0, MaskKind::Bias);
    if cfg!(debug_assertions) {
        return; // the larger shapes run in release builds
    }
    // Several query blocks and key chunks of the pair levels' tiles, at the common widths.
    check_half::<bf16>(7, (300, 257, 64, 80), 1.0, MaskKind::CausalBottomRight);
    check_half::<bf16>(8, (200, 333, 128, 128), 1.0, MaskKind::PaddingBlocks);
    // A soft-cap (its derivative taken at the tiles' scores) and a sink (in the logsumexp).
    check_half_with::<bf16>(9, (130, 200, 64, 64), 4.0, MaskKind::Bias, Some(5.0), None);
    check_half_with::<bf16>(10, (97, 150, 32, 48), 1.0, MaskKind::KeepWithEmptyRows, None, Some(0.8));
}

#[test]
fn half_precision_backward_errors_name_the_argument() {
    let x = Array2::from_elem((3, 4), bf16::ONE);
    let options = AttentionOptions::new();
    let forward = qkv::attention_half_with_lse(x.view(), x.view(), x.view(), &options).unwrap();
    let wrong = Array2::from_elem((2, 4), bf16::ONE);
    let err = qkv::attention_backward_half(x.view(), x.view(), x.view(), &forward, wrong.view(), &options)
        .unwrap_err()
        .to_string();
    assert!(err.contains("d_output") && err.contains("[2, 4]") && err.contains("[3, 4]"), "{err}");
    let mut bad = x.clone();
    bad[[1, 2]] = bf16::NAN;
    let err = qkv::attention_backward_half(x.view(), x.view(), x.view(), &forward, bad.view(), &options)
        .unwrap_err()
        .to_string();
    assert!(err.contains("d_output") && err.contains("[1, 2]"), "{err}");
}

/// Gradients of every tensor, bit for bit comparable.
type Bits<T> = (Array2<T>, Array2<T>, Array2<T>, Option<Array2<T>>);

#[test]
fn fast_backward_results_do_not_depend_on_thread_count() {
    // Large enough that the work is shared out (see `work::worth_sharing`).
    let masks: &[MaskKind] =
        if cfg!(debug_assertions) { &[MaskKind::CausalBottomRight, MaskKind::Bias] } else { &MASK_KINDS };
    let dims = if cfg!(debug_assertions) { (260, 260, 32, 32) } else { (600, 500, 64, 48) };
    for level in levels() {
        for &mask in masks {
            let p = Problem::<f32>::random(3, dims, 2.0, mask);
            let d_out = d_output::<f32>(3, dims.0, dims.3);
            let options = p.options().simd(level);
            let forward = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
            let run = |threads| -> Bits<f32> {
                let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
                let g = pool.install(|| {
                    qkv::attention_backward(
                        p.q.view(),
                        p.k.view(),
                        p.v.view(),
                        &forward,
                        d_out.view(),
                        &options,
                    )
                    .unwrap()
                });
                (g.dq, g.dk, g.dv, g.dbias)
            };
            let (one, two, three) = (run(1), run(2), run(3));
            assert!(
                one == two && two == three,
                "{level} {mask:?}: gradients differ between 1, 2 and 3 threads"
            );
        }
    }
}

#[test]
fn keys_no_query_sees_get_zero_gradients_and_are_never_read() {
    for level in levels() {
        for mask in [MaskKind::Padding, MaskKind::KeyLength, MaskKind::CausalTopLeft] {
            // Top-left causal over more keys than queries: the last keys are seen by no query.
            let p = Problem::<f32>::random(5, (20, 60, 8, 8), 1.0, mask);
            let d_out = d_output::<f32>(5, 20, 8);
            let options = p.options().simd(level);
            let seen =
                qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap().weights;
            let unseen: Vec<usize> = (0..60).filter(|&j| seen.column(j).iter().all(|&w| w == 0.0)).collect();
            assert!(!unseen.is_empty(), "{mask:?}: some key is unseen");
            let (mut k, mut v) = (p.k.clone(), p.v.clone());
            for &j in &unseen {
                k.row_mut(j).fill(f32::NAN);
                v.row_mut(j).fill(f32::INFINITY);
            }
            let forward = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
            let clean =
                qkv::attention_backward(p.q.view(), p.k.view(), p.v.view(), &forward, d_out.view(), &options)
                    .unwrap();
            let dirty =
                qkv::attention_backward(p.q.view(), k.view(), v.view(), &forward, d_out.view(), &options)
                    .unwrap();
            assert_eq!(clean, dirty, "{level} {mask:?}: unseen keys change nothing");
            for &j in &unseen {
                assert!(
                    dirty.dk.row(j).iter().chain(dirty.dv.row(j)).all(|&g| g == 0.0),
                    "{mask:?}: key {j}"
                );
            }
        }
    }
}

#[test]
fn rows_that_see_nothing_have_zero_gradients() {
    // Bottom-right causal with more queries than keys: the first queries see no key.
    for level in levels() {
        let p = Problem::<f32>::random(9, (30, 10, 8, 8), 1.0, MaskKind::CausalBottomRight);
        let d_out = d_output::<f32>(9, 30, 8);
        let options = p.options().simd(level);
        let forward = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
        let g = qkv::attention_backward(p.q.view(), p.k.view(), p.v.view(), &forward, d_out.view(), &options)
            .unwrap();
        assert!(g.dq.slice(s![..20, ..]).iter().all(|&x| x == 0.0), "{level}: masked rows");
        assert!(g.dq.iter().chain(&g.dk).chain(&g.dv).all(|x| x.is_finite()), "{level}: never NaN");
    }
}

#[test]
fn grouped_query_gradients_sum_over_the_heads_of_a_group() {
    // 2 sequences, 6 query heads over 2 key/value heads, per-sequence key lengths, ALiBi. The
    // inputs are bf16 numbers, so that the bf16 backward can be compared too.
    let (batch, heads, kv_heads, n, d) = (2, 6, 2, 50, 16);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let mut random = |shape: (usize, usize, usize, usize)| {
        Array4::from_shape_simple_fn(shape, || bf16::from_f32(rng.random_range(-1.0_f32..=1.0)).to_f32())
    };
    let (q, k, v) =
        (random((batch, heads, n, d)), random((batch, kv_heads, n, d)), random((batch, kv_heads, n, d)));
    let d_out = random((batch, heads, n, d));
    let half = |x: &Array4<f32>| x.mapv(bf16::from_f32);
    let (q_half, k_half, v_half, d_out_half) = (half(&q), half(&k), half(&v), half(&d_out));
    let lengths = [50, 31];
    let slopes = qkv::alibi_slopes::<f32>(heads);
    for level in levels() {
        let options = AttentionOptions::new()
            .causal(qkv::CausalMask::BottomRight)
            .key_lengths(&lengths)
            .alibi(qkv::Alibi::new(&slopes))
            .simd(level);
        let forward = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
        let g = qkv::multi_head_attention_backward(
            q.view(),
            k.view(),
            v.view(),
            &forward,
            d_out.view(),
            &options,
        )
        .unwrap();
        let g_half = qkv::multi_head_attention_backward_half(
            q_half.view(),
            k_half.view(),
            v_half.view(),
            &forward,
            d_out_half.view(),
            &options,
        )
        .unwrap();
        // Where the bf16 scores are the level's own, the bf16 gradients are checked against the
        // reference as the f32 ones are.
        if !backward_on_pair_products(level) {
            assert_eq!(g_half, g, "{level}: the bf16 backward is the f32 backward on its widened inputs");
        }
        for (ty, g) in [("f32", &g), ("bf16", &g_half)] {
            for b in 0..batch {
                let mut dk = Array2::<f64>::zeros((n, d));
                let mut dv = Array2::<f64>::zeros((n, d));
                for h in 0..heads {
                    let kv = h / (heads / kv_heads);
                    let head_options = AttentionOptions::new()
                        .causal(qkv::CausalMask::BottomRight)
                        .key_lengths(&lengths[b..b + 1])
                        .alibi(qkv::Alibi::new(&slopes[h..h + 1]));
                    let want = qkv::reference::attention_backward(
                        q.slice(s![b, h, .., ..]),
                        k.slice(s![b, kv, .., ..]),
                        v.slice(s![b, kv, .., ..]),
                        d_out.slice(s![b, h, .., ..]),
                        &head_options,
                    )
                    .unwrap();
                    let got = g.dq.slice(s![b, h, .., ..]);
                    for (g, w) in got.iter().zip(&want.dq) {
                        assert!(
                            (f64::from(*g) - w).abs() < 1e-4,
                            "{level} {ty} dq of head ({b}, {h}): {g} vs {w}"
                        );
                    }
                    if kv == 1 {
                        dk += &want.dk;
                        dv += &want.dv;
                    }
                }
                for (got, want) in [(g.dk.slice(s![b, 1, .., ..]), &dk), (g.dv.slice(s![b, 1, .., ..]), &dv)]
                {
                    for (g, w) in got.iter().zip(want) {
                        assert!(
                            (f64::from(*g) - w).abs() < 1e-4,
                            "{level} {ty} dk/dv of kv head ({b}, 1): {g} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn backward_errors_name_the_argument_and_both_shapes() {
    let p = Problem::<f32>::random(1, (4, 5, 3, 2), 1.0, MaskKind::None);
    let options = AttentionOptions::new();
    let forward = qkv::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    let wrong = Array2::<f32>::zeros((4, 3));
    let error = qkv::attention_backward(p.q.view(), p.k.view(), p.v.view(), &forward, wrong.view(), &options)
        .unwrap_err();
    assert_eq!(error.to_string(), "d_output has shape [4, 3] but the problem's output has shape [4, 2]");
    let mut nan = d_output::<f32>(1, 4, 2);
    nan[[2, 1]] = f32::NAN;
    let error = qkv::attention_backward(p.q.view(), p.k.view(), p.v.view(), &forward, nan.view(), &options)
        .unwrap_err();
    assert_eq!(error.to_string(), "d_output[2, 1] is NaN: attention needs finite inputs");
    let (mut dq, mut dk, mut dv) = (Array2::zeros((4, 3)), Array2::zeros((5, 3)), Array2::zeros((4, 2)));
    let into = GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
    let d_out = d_output::<f32>(1, 4, 2);
    let error = qkv::attention_backward_into(
        p.q.view(),
        p.k.view(),
        p.v.view(),
        &forward,
        d_out.view(),
        &options,
        into,
    )
    .unwrap_err();
    assert_eq!(error.to_string(), "dv has shape [4, 2] but the problem's values has shape [5, 2]");
    let huge = p.q.mapv(|x| x * 1e38);
    let error =
        qkv::attention_backward(huge.view(), p.k.view(), p.v.view(), &forward, d_out.view(), &options)
            .unwrap_err();
    assert!(matches!(error, qkv::AttentionError::GradientOverflow { ty: "f32" }), "{error}");
}

#[test]
fn symmetric_alibi_gradients_are_those_of_its_bias_matrix() {
    // The backward of flash-attn's symmetric ALiBi, against the backward of the same terms as an
    // explicit bias (whose own gradient is the only difference): reference and every level.
    let mut rng = ChaCha8Rng::seed_from_u64(21);
    let (n_q, n_k, d) = (70, 150, 16);
    let mut random = |r, c| Array2::from_shape_simple_fn((r, c), || rng.random_range(-1.0..1.0_f64));
    let (q, k, v) = (random(n_q, d), random(n_k, d), random(n_k, d));
    let slope = [0.05];
    let bias = Array2::from_shape_fn((n_q, n_k), |(i, j)| {
        -0.05 * (i as f64 + n_k as f64 - n_q as f64 - j as f64).abs()
    });
    let explicit = AttentionOptions::new().bias(AdditiveBias::new(bias.view()));
    let alibi = AttentionOptions::new().alibi(qkv::Alibi::new(&slope).symmetric());
    let d_out = d_output::<f64>(3, n_q, d);
    let want =
        qkv::reference::attention_backward(q.view(), k.view(), v.view(), d_out.view(), &explicit).unwrap();
    for level in levels() {
        let options = alibi.clone().simd(level);
        let forward = qkv::attention_with_lse(q.view(), k.view(), v.view(), &options).unwrap();
        let got =
            qkv::attention_backward(q.view(), k.view(), v.view(), &forward, d_out.view(), &options).unwrap();
        for (what, got, want) in
            [("dq", &got.dq, &want.dq), ("dk", &got.dk, &want.dk), ("dv", &got.dv, &want.dv)]
        {
            let worst = (got - want).iter().fold(0.0_f64, |m, x| m.max(x.abs()));
            assert!(worst < 1e-10, "{level} {what}: {worst}");
        }
        assert!(got.dbias.is_none(), "ALiBi is no bias with a gradient");
    }
}
