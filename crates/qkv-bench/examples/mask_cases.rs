//! Writes attention cases with batched masks, sliding windows, ALiBi and NaN in masked positions,
//! with qkv's outputs and logsumexps, and its gradients from a random output gradient, as JSON for
//! `python/check_masks.py` and `python/check_backward.py` (which compare them with PyTorch):
//! `cargo run --release -p qkv-bench --example mask_cases -- cases.json`.
//!
//! Masks are written as their parameters (lengths, window, slopes, ...), not as matrices, so the
//! script builds its own masks from them and checks qkv's reading of each parameter. Never run in
//! CI: PyTorch is not there.

use ndarray::{Array2, Array4, s};
use qkv::{AdditiveBias, Alibi, AttentionOptions, CausalMask, KeepMask, KeyPadding, SlidingWindow};
use serde_json::{Value, json};

/// A small deterministic generator, so that the cases do not depend on a random crate.
struct Lcg(u64);

impl Lcg {
    fn uniform(&mut self) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }

    fn tensor(&mut self, shape: (usize, usize, usize, usize)) -> Array4<f32> {
        Array4::from_shape_simple_fn(shape, || self.uniform())
    }
}

fn flat<T: Clone + serde::Serialize, D: ndarray::Dimension>(a: &ndarray::Array<T, D>) -> Value {
    json!({ "shape": a.shape(), "data": a.iter().cloned().collect::<Vec<_>>() })
}

fn align(a: CausalMask) -> &'static str {
    match a {
        CausalMask::BottomRight => "bottom_right",
        CausalMask::TopLeft => "top_left",
    }
}

/// The masks of one case, as parameters.
#[derive(Default)]
struct Masks {
    causal: Option<CausalMask>,
    lengths: Option<Vec<usize>>,
    padding: Option<Array2<bool>>,
    keep: Option<Array4<bool>>,
    bias: Option<Array4<f32>>,
    window: Option<SlidingWindow>,
    slopes: Option<Vec<f32>>,
    /// `[b, kv_head, key]` rows of keys and values that no query sees, filled with NaN for qkv.
    nan_rows: Vec<[usize; 3]>,
}

fn case(
    name: &str,
    rng: &mut Lcg,
    (b, hq, hkv, nq, nk, d, dv): (usize, usize, usize, usize, usize, usize, usize),
    masks: Masks,
) -> Value {
    let q = rng.tensor((b, hq, nq, d));
    let k = rng.tensor((b, hkv, nk, d));
    let v = rng.tensor((b, hkv, nk, dv));
    let mut options = AttentionOptions::new();
    if let Some(c) = masks.causal {
        options = options.causal(c);
    }
    if let Some(l) = &masks.lengths {
        options = options.key_lengths(l);
    }
    if let Some(p) = &masks.padding {
        options = options.key_padding(KeyPadding::batched(p.view()));
    }
    if let Some(m) = &masks.keep {
        options = options.keep_mask(KeepMask::batched(m.view()));
    }
    if let Some(m) = &masks.bias {
        options = options.bias(AdditiveBias::batched(m.view()));
    }
    if let Some(w) = masks.window {
        options = options.sliding_window(w);
    }
    if let Some(slopes) = &masks.slopes {
        options = options.alibi(Alibi::new(slopes).aligned(masks.causal.unwrap_or_default()));
    }
    let (mut k_bad, mut v_bad) = (k.clone(), v.clone());
    for &[bi, h, j] in &masks.nan_rows {
        k_bad.slice_mut(s![bi, h, j, ..]).fill(f32::NAN);
        v_bad.slice_mut(s![bi, h, j, ..]).fill(f32::NAN);
    }
    let r = qkv::multi_head_attention_with_lse(q.view(), k_bad.view(), v_bad.view(), &options)
        .expect("a valid case");
    // The backward from a random output gradient, for `python/check_backward.py`.
    let d_output = rng.tensor((b, hq, nq, dv));
    let g = qkv::multi_head_attention_backward(
        q.view(),
        k_bad.view(),
        v_bad.view(),
        &r,
        d_output.view(),
        &options,
    )
    .expect("a valid case");
    json!({
        "name": name,
        "q": flat(&q), "k": flat(&k), "v": flat(&v),
        "scale": 1.0 / (d as f64).sqrt(),
        "causal": masks.causal.map(align),
        "key_lengths": masks.lengths,
        "key_padding": masks.padding.as_ref().map(flat),
        "keep": masks.keep.as_ref().map(flat),
        "bias": masks.bias.as_ref().map(flat),
        "window": masks.window.map(|w| json!({ "before": w.before, "after": w.after, "align": align(w.align) })),
        "alibi": masks.slopes.as_ref().map(|s| json!({ "slopes": s, "align": align(masks.causal.unwrap_or_default()) })),
        "nan_rows": masks.nan_rows,
        "qkv_output": flat(&r.output),
        "qkv_logsumexp": flat(&r.logsumexp.mapv(|l| if l == f32::NEG_INFINITY { None } else { Some(l) })),
        "d_output": flat(&d_output),
        "qkv_dq": flat(&g.dq), "qkv_dk": flat(&g.dk), "qkv_dv": flat(&g.dv),
        "qkv_dbias": g.dbias.as_ref().map(flat),
    })
}

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| "cases.json".into());
    let mut rng = Lcg(7);
    let mut cases = Vec::new();
    // Batched key lengths, GQA, with and without a causal mask; decoding and prefill.
    for (nq, nk) in [(37, 130), (1, 300)] {
        // The last sequence has no keys at all: its rows see nothing.
        let lengths = vec![nk, nk / 2 + 3, 0];
        cases.push(case(
            &format!("key_lengths {nq}x{nk}"),
            &mut rng,
            (3, 4, 2, nq, nk, 32, 24),
            Masks { lengths: Some(lengths.clone()), ..Masks::default() },
        ));
        cases.push(case(
            &format!("key_lengths causal {nq}x{nk}"),
            &mut rng,
            (3, 4, 2, nq, nk, 32, 24),
            Masks { lengths: Some(lengths), causal: Some(CausalMask::BottomRight), ..Masks::default() },
        ));
    }
    // Broadcast masks: shared, per sequence, per head; per-sequence padding; a bias per head.
    let (b, h, nq, nk) = (2, 4, 50, 70);
    let keep =
        |rng: &mut Lcg, hb, hh| Array4::from_shape_simple_fn((hb, hh, nq, nk), || rng.uniform() > -0.6);
    for (label, hb, hh) in [
        ("keep [1, 1, n_q, n_k]", 1, 1),
        ("keep [batch, 1, n_q, n_k]", b, 1),
        ("keep [batch, heads, n_q, n_k]", b, h),
    ] {
        let m = keep(&mut rng, hb, hh);
        cases.push(case(
            label,
            &mut rng,
            (b, h, 2, nq, nk, 16, 16),
            Masks { keep: Some(m), ..Masks::default() },
        ));
    }
    let padding = Array2::from_shape_fn((b, nk), |(bi, j)| (j * 7 + bi) % 5 != 0);
    let bias = Array4::from_shape_simple_fn((1, h, nq, nk), || rng.uniform() * 2.0);
    cases.push(case(
        "padding [batch, n_k] + bias [1, heads, n_q, n_k]",
        &mut rng,
        (b, h, 2, nq, nk, 16, 16),
        Masks { padding: Some(padding), bias: Some(bias), ..Masks::default() },
    ));
    // Sliding windows: causal (Mistral-like) and two-sided, top-left.
    cases.push(case(
        "causal window 20 back",
        &mut rng,
        (2, 4, 4, 200, 200, 32, 32),
        Masks {
            causal: Some(CausalMask::BottomRight),
            window: Some(SlidingWindow::new(20, 0)),
            ..Masks::default()
        },
    ));
    cases.push(case(
        "window (10, 5) top-left",
        &mut rng,
        (1, 2, 1, 64, 100, 16, 8),
        Masks { window: Some(SlidingWindow::new(10, 5).aligned(CausalMask::TopLeft)), ..Masks::default() },
    ));
    // ALiBi with the causal mask: prefill and a decoding step.
    cases.push(case(
        "alibi causal 150x150",
        &mut rng,
        (2, 8, 8, 150, 150, 32, 32),
        Masks {
            causal: Some(CausalMask::BottomRight),
            slopes: Some(qkv::alibi_slopes(8)),
            ..Masks::default()
        },
    ));
    cases.push(case(
        "alibi causal decode 1x500",
        &mut rng,
        (1, 8, 2, 1, 500, 64, 64),
        Masks {
            causal: Some(CausalMask::BottomRight),
            slopes: Some(qkv::alibi_slopes(8)),
            ..Masks::default()
        },
    ));
    // NaN in keys and values no query sees: past each sequence's length, and in padding.
    const LENGTHS: [usize; 2] = [120, 40];
    let nan_rows: Vec<[usize; 3]> = (0..2)
        .flat_map(|bi| (0..2).flat_map(move |hk| (LENGTHS[bi]..120).map(move |j| [bi, hk, j])))
        .collect();
    cases.push(case(
        "NaN past key lengths",
        &mut rng,
        (2, 4, 2, 30, 120, 32, 16),
        Masks { lengths: Some(LENGTHS.to_vec()), nan_rows: nan_rows.clone(), ..Masks::default() },
    ));
    let padding = Array2::from_shape_fn((2, 120), |(bi, j)| j < LENGTHS[bi]);
    cases.push(case(
        "NaN in key padding, decode",
        &mut rng,
        (2, 4, 2, 1, 120, 32, 16),
        Masks { padding: Some(padding), nan_rows, ..Masks::default() },
    ));
    let json =
        serde_json::to_string(&json!({ "simd": qkv::simd_report(), "cases": &cases })).expect("serialisable");
    std::fs::write(&path, json).expect("the output file is writable");
    println!("wrote {} cases to {path}", cases.len());
}
