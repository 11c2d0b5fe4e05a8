//! bf16 and f16 inputs: the same f32 arithmetic as on their widened values, bit for bit (within
//! the rounding of the weights to bf16 at the AMX level); within
//! f32's tolerance of the f64 reference on the rounded inputs; and within a bound derived from
//! the format's precision of the reference on the original f32 inputs.

use ndarray::{Array2, Array3, ArrayView2, s};
use qkv::{CacheShape, KvCache, Storage};

use crate::problem::{
    MASK_KINDS, MaskKind, Problem, assert_close, assert_f32_path, error_bound, levels, max_abs,
    weight_rounding, with_rounding,
};

/// Round-to-nearest unit roundoff `u = 2^-p` of a format with `p` bits of significand (the
/// implicit bit included): every finite f32 `x` in range rounds to `x · (1 + e)`, `|e| <= u`.
/// bf16 keeps f32's 8 exponent bits and `p = 8`; f16 has `p = 11` (and a narrower range, which
/// these inputs, of magnitude at most 1, stay inside).
fn unit_roundoff<H: Storage>() -> f64 {
    match H::NAME {
        "bf16" => 2f64.powi(-8),
        "f16" => 2f64.powi(-11),
        other => panic!("no half-precision format {other}"),
    }
}

fn round<H: Storage>(a: &Array2<f32>) -> Array2<H> {
    a.mapv(H::from_f32)
}

fn widen<H: Storage>(a: ArrayView2<H>) -> Array2<f32> {
    a.mapv(H::to_f32)
}

/// How far the output may move when every input is rounded to a format of unit roundoff `u`.
///
/// A score `s = scale · Σ_c q_c k_c` with `q_c (1 + e)`, `k_c (1 + e')` moves by at most
/// `δ = (2u + u²) · scale · Σ_c |q_c k_c|` (the largest such sum over all pairs is measured from
/// the inputs). A softmax's weights move by `ΔP_j = P_j (Δs_j - Σ_i P_i Δs_i)` to first order, so
/// `Σ_j |ΔP_j| <= 2δ`; the output `Σ_j P_j v_j` then moves by at most `2δ · max |v|` from the
/// weights plus `u · max |v|` from rounding the values. Twice that covers the second-order terms
/// and the f32 arithmetic on top.
fn rounding_bound(p: &Problem<f32>, u: f64) -> f64 {
    let scale = 1.0 / (p.q.ncols() as f64).sqrt();
    let mut largest_sum: f64 = 0.0;
    for q in p.q.rows() {
        for k in p.k.rows() {
            let sum: f64 = q.iter().zip(k).map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs()).sum();
            largest_sum = largest_sum.max(sum);
        }
    }
    let delta = (2.0 * u + u * u) * scale * largest_sum;
    let max_value = p.v.iter().fold(0.0_f64, |m, &x| m.max(f64::from(x).abs()));
    2.0 * (2.0 * delta + u) * max_value
}

const SHAPES: [(usize, usize, usize, usize); 7] = [
    (1, 1, 1, 1),
    (3, 17, 16, 24),
    (5, 129, 64, 8),
    (1, 1000, 128, 128),
    (4, 300, 17, 5),
    (130, 141, 80, 64),
    (49, 257, 8, 128),
];

/// `shapes` (the masks in turn) in format `H` at every level: the f32 path on the widened inputs,
/// the reference on them, and the reference on the original f32 inputs within [`rounding_bound`].
fn check_format<H: Storage + qkv::Half>(shapes: &[(usize, usize, usize, usize)]) {
    let u = unit_roundoff::<H>();
    for (i, &dims) in shapes.iter().enumerate() {
        let mask = MASK_KINDS[i % MASK_KINDS.len()];
        let p = Problem::<f32>::random(i as u64, dims, 1.0, mask);
        let (q, k, v) = (round::<H>(&p.q), round::<H>(&p.k), round::<H>(&p.v));
        let (wq, wk, wv) = (widen(q.view()), widen(k.view()), widen(v.view()));
        let rounded = qkv::reference::attention(wq.view(), wk.view(), wv.view(), &p.options()).unwrap();
        let original = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &p.options()).unwrap();
        let (_, tight) = error_bound(&rounded, &wv);
        let loose = rounding_bound(&p, u);
        for level in levels() {
            let options = p.options().simd(level);
            let got = qkv::attention_half(q.view(), k.view(), v.view(), &options).unwrap();
            let ctx = format!("{} {level} {dims:?} {mask:?}", H::NAME);
            // The kernels widen each element exactly and then do what the f32 path does (but for
            // the AMX tiles' rounding of the weights).
            let f32_path = qkv::attention(wq.view(), wk.view(), wv.view(), &options).unwrap();
            let rounding = weight_rounding(level, H::NAME, max_abs(&wv));
            assert_f32_path(&ctx, &got, &f32_path, rounding);
            let tight = with_rounding(tight, rounding);
            assert_close(&format!("{ctx}, reference on the rounded inputs"), &got, &rounded.output, tight);
            for ((idx, g), w) in got.indexed_iter().zip(&original.output) {
                let (error, loose) = ((f64::from(*g) - w).abs(), loose + rounding);
                assert!(error <= loose, "{ctx}{idx:?}: {g} against the f32 inputs' {w}, beyond {loose:e}");
            }
        }
    }
}

#[test]
fn bf16_inputs_match_the_reference_within_their_rounding() {
    check_format::<half::bf16>(&SHAPES);
}

#[test]
fn bf16_over_long_keys_takes_larger_query_blocks_and_matches_the_reference() {
    // Keys and values of more than 4 MiB (16400 × (64 + 72) bf16) take the levels' long query
    // blocks (96 rows on AVX2, AVX-512 and AVX512-BF16): on two threads 200 queries make four
    // blocks of 54, 54, 48 and 44 rows at AVX512-BF16, blocks that short keys' 48 rows forbid;
    // 100 make two (54 and 46), few enough that their keys are split as well, under a causal mask.
    check_format::<half::bf16>(&[(200, 16400, 64, 72), (100, 16400, 64, 72)]);
    // The extremes of the rule: no queries, one (decoding), five (the fewest that tile).
    check_format::<half::bf16>(&[(0, 16400, 64, 72), (1, 16400, 64, 72), (5, 16400, 64, 72)]);
}

#[test]
fn f16_inputs_match_the_reference_within_their_rounding() {
    check_format::<half::f16>(&SHAPES);
}

/// A cache of `H` against a cache of f32 holding the widened values: the same bits, step by step.
fn check_cache<H: Storage>() {
    let shape = CacheShape::new(1, 2, 1400, 24, 40);
    let p = Problem::<f32>::random(3, (1300, 1300, 24, 40), 1.0, MASK_KINDS[0]);
    // Two key/value heads from one problem's keys and values, four query heads from its queries.
    let heads = |a: &Array2<f32>, n: usize| {
        Array3::from_shape_fn((n, a.nrows(), a.ncols()), |(h, i, c)| a[[(i + 7 * h) % a.nrows(), c]])
    };
    let (q, k, v) = (heads(&p.q, 4), heads(&p.k, 2), heads(&p.v, 2));
    let rounded = |a: &Array3<f32>| a.mapv(H::from_f32);
    let (hq, hk, hv) = (rounded(&q), rounded(&k), rounded(&v));
    let widened = |a: &Array3<H>| a.mapv(H::to_f32);
    let (wq, wk, wv) = (widened(&hq), widened(&hk), widened(&hv));
    for level in levels() {
        let mut half_cache = KvCache::<H>::for_level(shape, level).unwrap();
        let mut f32_cache = KvCache::<f32>::for_level(shape, level).unwrap();
        let (mut half_layer, mut f32_layer) = (half_cache.layer(0).unwrap(), f32_cache.layer(0).unwrap());
        let mut held = 0;
        for n_new in [1, 129, 1, 1000, 3, 1] {
            let new = s![.., held..held + n_new, ..];
            half_layer.append(hk.slice(new), hv.slice(new)).unwrap();
            f32_layer.append(wk.slice(new), wv.slice(new)).unwrap();
            held += n_new;
            // The last positions attend: a prefill chunk of up to 130 queries, or a step.
            let queries = s![.., held - n_new.min(130)..held, ..];
            let got = half_layer.attend(hq.slice(queries)).unwrap();
            let want = f32_layer.attend(wq.slice(queries)).unwrap();
            assert_eq!(got, want, "{} {level}: {n_new} new of {held}", H::NAME);
        }
    }
}

#[test]
fn half_precision_caches_compute_what_f32_caches_of_the_widened_values_do() {
    check_cache::<half::bf16>();
    check_cache::<half::f16>();
}

#[test]
fn scores_that_climb_along_the_keys_match_the_reference_at_every_level() {
    // Scores that climb by about 13 per 512 keys, and one key far above the rest in the second
    // block: the levels that keep each row's reference until a score passes it by ln 256 raise it
    // in the middle of most key blocks, rescaling the weights already written.
    for (mask, spike) in
        [(MaskKind::None, 20.0), (MaskKind::CausalBottomRight, 60.0), (MaskKind::KeyLength, 0.0)]
    {
        let (n_q, n_k) = (70, 1500);
        let mut p = Problem::<f32>::random(7, (n_q, n_k, 16, 24), 1.0, mask);
        p.q.column_mut(0).fill(4.0);
        p.q.column_mut(1).fill(1.0);
        for (j, mut key) in p.k.rows_mut().into_iter().enumerate() {
            key[0] = 40.0 * j as f32 / n_k as f32;
            key[1] = if j == 700 { spike } else { 0.0 };
        }
        let (q, k, v) = (round::<half::bf16>(&p.q), round::<half::bf16>(&p.k), round::<half::bf16>(&p.v));
        let (wq, wk, wv) = (widen(q.view()), widen(k.view()), widen(v.view()));
        let want = qkv::reference::attention(wq.view(), wk.view(), wv.view(), &p.options()).unwrap();
        let (_, bound) = error_bound(&want, &wv);
        for level in levels() {
            let options = p.options().simd(level);
            let ctx = format!("{level} {mask:?}, a key {spike} above");
            let got = qkv::attention_half(q.view(), k.view(), v.view(), &options).unwrap();
            let rounding = weight_rounding(level, "bf16", max_abs(&wv));
            assert_close(&ctx, &got, &want.output, with_rounding(bound, rounding));
            let got = qkv::attention(wq.view(), wk.view(), wv.view(), &options).unwrap();
            assert_close(&format!("{ctx}, f32"), &got, &want.output, bound);
        }
    }
}

#[test]
fn inputs_that_could_overflow_f32_take_the_checked_f32_path() {
    // Scores of 3.6e37: finite, but too close to f32's largest value for the fast path's bound.
    let x = ndarray::array![[6e18_f32], [-6e18]].mapv(half::bf16::from_f32);
    let got =
        qkv::attention_half(x.view(), x.view(), x.view(), &qkv::AttentionOptions::new().scale(1.0)).unwrap();
    let wide = widen(x.view());
    let want =
        qkv::attention(wide.view(), wide.view(), wide.view(), &qkv::AttentionOptions::new().scale(1.0))
            .unwrap();
    assert_eq!(got, want);
    assert!(got.iter().all(|y| y.is_finite()));
}

#[test]
fn half_inputs_may_hold_anything_where_no_query_looks() {
    // A padded key that holds NaN (an inference cache's garbage) is never read, as in f32; a NaN
    // in a key that is seen stays an error naming it.
    use half::bf16;
    use ndarray::array;
    use qkv::{AttentionOptions, KeyPadding, attention, attention_half};
    let q = array![[0.5_f32, 1.0], [1.0, -0.25]];
    let k = array![[1.0_f32, 0.0], [0.0, 1.0], [f32::NAN, 2.0]];
    let v = array![[2.0_f32, 1.0], [6.0, 0.5], [4.0, f32::NAN]];
    let real_keys = array![true, true, false];
    let opts = AttentionOptions::new().key_padding(KeyPadding::new(real_keys.view()));
    let half =
        attention_half(round::<bf16>(&q).view(), round::<bf16>(&k).view(), round::<bf16>(&v).view(), &opts)
            .unwrap();
    let widened = |a: &Array2<f32>| widen(round::<bf16>(a).view());
    let want = attention(widened(&q).view(), widened(&k).view(), widened(&v).view(), &opts).unwrap();
    assert_eq!(half, want);
    let seen = attention_half(
        round::<bf16>(&q).view(),
        round::<bf16>(&k).view(),
        round::<bf16>(&v).view(),
        &AttentionOptions::new(),
    )
    .unwrap_err();
    assert_eq!(
        seen.to_string(),
        attention(q.view(), k.view(), v.view(), &AttentionOptions::new()).unwrap_err().to_string()
    );
}
