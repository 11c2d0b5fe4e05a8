//! Writes attention cases with batched masks, sliding windows, ALiBi (the paper's and flash-attn's
//! symmetric form, slopes per head or per sequence and head), rotary embeddings, packed
//! sequences (`varlen_attention`), a rotary KV cache's steps and NaN in masked positions, with
//! qkv's outputs and logsumexps, and its gradients from a random output gradient, as JSON for
//! `python/check_masks.py` and `python/check_backward.py` (which compare them with PyTorch):
//! `cargo run --release -p qkv-bench --example mask_cases -- cases.json`.
//!
//! Masks and embeddings are written as their parameters (lengths, window, slopes, rotary base,
//! pairing, ...), not as matrices or rotated tensors, so the script builds its own from them and
//! checks qkv's reading of each parameter. Never run in CI: PyTorch is not there.

use ndarray::{Array2, Array3, Array4, Axis, s};
use qkv::{
    AdditiveBias, Alibi, AttentionOptions, CacheOptions, CacheShape, CausalMask, KeepMask, KeyPadding,
    KvCache, Rotary, RotaryPairing, SlidingWindow,
};
use serde_json::{Map, Value, json};

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

/// ALiBi as a case gives it: the slopes, `[1, heads]` (one per head, [`Alibi::new`]) or
/// `[batch, heads]` ([`Alibi::batched`]), where the queries stand, and which form.
struct AlibiCase {
    slopes: Array2<f32>,
    batched: bool,
    align: CausalMask,
    symmetric: bool,
}

impl AlibiCase {
    /// One slope per head, the paper's form.
    fn new(slopes: Vec<f32>, align: CausalMask) -> Self {
        let slopes = Array2::from_shape_vec((1, slopes.len()), slopes).expect("one row");
        AlibiCase { slopes, batched: false, align, symmetric: false }
    }

    /// One slope per (sequence, head), the paper's form.
    fn batched(slopes: Array2<f32>, align: CausalMask) -> Self {
        AlibiCase { slopes, batched: true, align, symmetric: false }
    }

    /// The same slopes in flash-attn's symmetric form.
    fn symmetric(self) -> Self {
        AlibiCase { symmetric: true, ..self }
    }

    fn options(&self) -> Alibi<'_, f32> {
        let alibi = if self.batched {
            Alibi::batched(self.slopes.view())
        } else {
            Alibi::new(self.slopes.as_slice().expect("a standard layout"))
        };
        let alibi = alibi.aligned(self.align);
        if self.symmetric { alibi.symmetric() } else { alibi }
    }

    fn json(&self) -> Value {
        json!({ "slopes": flat(&self.slopes), "align": align(self.align), "symmetric": self.symmetric })
    }
}

/// A rotary embedding as a case gives it, and the positions of the first query and key: queries
/// and keys are written unrotated, and qkv rotates them (`Rotary::rotate`, or a cache as it
/// appends and attends) before attending.
struct RotaryCase {
    rotary: Rotary,
    query_first: usize,
    key_first: usize,
}

impl RotaryCase {
    fn json(&self) -> Value {
        let r = &self.rotary;
        let pairing = match r.pairing {
            RotaryPairing::HalfSplit => "half_split",
            RotaryPairing::Interleaved => "interleaved",
        };
        json!({
            "base": r.base, "pairing": pairing, "position_scale": r.position_scale, "dims": r.dims,
            "query_first": self.query_first, "key_first": self.key_first,
        })
    }
}

/// Rotates (or, `back`, rotates back) every `[n, d]` head of `x`, its rows from position `first`.
fn rotate(rotary: &Rotary, x: &mut Array4<f32>, first: usize, back: bool) {
    for mut batch in x.outer_iter_mut() {
        for head in batch.outer_iter_mut() {
            let turned = if back { rotary.rotate_back(head, first) } else { rotary.rotate(head, first) };
            turned.expect("a valid embedding");
        }
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
    alibi: Option<AlibiCase>,
    /// Not a mask: the rotary embedding qkv applies to the queries and keys before attending.
    rotary: Option<RotaryCase>,
    /// `[b, kv_head, key]` rows of keys and values that no query sees, filled with NaN for qkv.
    nan_rows: Vec<[usize; 3]>,
}

impl Masks {
    /// The options of a multi-head or packed call (the rotary embedding is applied apart).
    fn options(&self) -> AttentionOptions<'_, f32> {
        let mut options = AttentionOptions::new();
        if let Some(c) = self.causal {
            options = options.causal(c);
        }
        if let Some(l) = &self.lengths {
            options = options.key_lengths(l);
        }
        if let Some(p) = &self.padding {
            options = options.key_padding(KeyPadding::batched(p.view()));
        }
        if let Some(m) = &self.keep {
            options = options.keep_mask(KeepMask::batched(m.view()));
        }
        if let Some(m) = &self.bias {
            options = options.bias(AdditiveBias::batched(m.view()));
        }
        if let Some(w) = self.window {
            options = options.sliding_window(w);
        }
        if let Some(a) = &self.alibi {
            options = options.alibi(a.options());
        }
        options
    }

    /// The case's inputs and parameters, every key present (`null` where unused); `varlen`, the
    /// packed offsets, `null` but for a packed case.
    fn record(&self, name: &str, inputs: [Value; 3], d: usize, varlen: Value) -> Map<String, Value> {
        let [q, k, v] = inputs;
        let record = json!({
            "name": name,
            "q": q, "k": k, "v": v,
            "scale": 1.0 / (d as f64).sqrt(),
            "varlen": varlen,
            "causal": self.causal.map(align),
            "key_lengths": self.lengths,
            "key_padding": self.padding.as_ref().map(flat),
            "keep": self.keep.as_ref().map(flat),
            "bias": self.bias.as_ref().map(flat),
            "window": self.window.map(|w| json!({ "before": w.before, "after": w.after, "align": align(w.align) })),
            "alibi": self.alibi.as_ref().map(AlibiCase::json),
            "rotary": self.rotary.as_ref().map(RotaryCase::json),
            "nan_rows": self.nan_rows,
            // No backward unless the case computes one.
            "d_output": null, "qkv_dq": null, "qkv_dk": null, "qkv_dv": null, "qkv_dbias": null,
        });
        let Value::Object(record) = record else { unreachable!("an object") };
        record
    }
}

/// qkv's logsumexps for JSON, `-inf` (a row that sees no key) as `null`.
fn lse_json<D: ndarray::Dimension>(lse: &ndarray::Array<f32, D>) -> Value {
    flat(&lse.mapv(|l| if l == f32::NEG_INFINITY { None } else { Some(l) }))
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
    let options = masks.options();
    // A rotary case attends over its rotated queries and keys; the gradients of the unrotated
    // ones are the rotated ones' turned back.
    let (mut q_in, mut k_in) = (q.clone(), k.clone());
    if let Some(r) = &masks.rotary {
        rotate(&r.rotary, &mut q_in, r.query_first, false);
        rotate(&r.rotary, &mut k_in, r.key_first, false);
    }
    let (mut k_bad, mut v_bad) = (k_in, v.clone());
    for &[bi, h, j] in &masks.nan_rows {
        k_bad.slice_mut(s![bi, h, j, ..]).fill(f32::NAN);
        v_bad.slice_mut(s![bi, h, j, ..]).fill(f32::NAN);
    }
    let r = qkv::multi_head_attention_with_lse(q_in.view(), k_bad.view(), v_bad.view(), &options)
        .expect("a valid case");
    // The backward from a random output gradient, for `python/check_backward.py`.
    let d_output = rng.tensor((b, hq, nq, dv));
    let mut g = qkv::multi_head_attention_backward(
        q_in.view(),
        k_bad.view(),
        v_bad.view(),
        &r,
        d_output.view(),
        &options,
    )
    .expect("a valid case");
    if let Some(r) = &masks.rotary {
        rotate(&r.rotary, &mut g.dq, r.query_first, true);
        rotate(&r.rotary, &mut g.dk, r.key_first, true);
    }
    let mut record = masks.record(name, [flat(&q), flat(&k), flat(&v)], d, Value::Null);
    record.extend([
        ("qkv_output".into(), flat(&r.output)),
        ("qkv_logsumexp".into(), lse_json(&r.logsumexp)),
        ("d_output".into(), flat(&d_output)),
        ("qkv_dq".into(), flat(&g.dq)),
        ("qkv_dk".into(), flat(&g.dk)),
        ("qkv_dv".into(), flat(&g.dv)),
        ("qkv_dbias".into(), g.dbias.as_ref().map_or(Value::Null, flat)),
    ]);
    Value::Object(record)
}

/// Decoding through a rotary [`KvCache`]: the keys and values of `n` positions appended in
/// `chunks` (then one at a time), each chunk's or step's queries attending as they arrive,
/// unrotated, the cache rotating them. With a `window`, a windowed cache
/// ([`KvCache::with_window`]), whose ring wraps. Written as one bottom-right causal case over the
/// whole sequence (queries and keys both from position 0, the window `window - 1` back), which
/// is what the steps add up to.
fn cache_case(
    name: &str,
    rng: &mut Lcg,
    (hq, hkv, n, d, dv): (usize, usize, usize, usize, usize),
    chunks: &[usize],
    rotary: Rotary,
    window: Option<usize>,
) -> Value {
    let q = rng.tensor((1, hq, n, d));
    let k = rng.tensor((1, hkv, n, d));
    let v = rng.tensor((1, hkv, n, dv));
    let cache = match window {
        None => KvCache::<f32>::new(CacheShape::new(1, hkv, n, d, dv)),
        // A ring of the window and the largest chunk but one: it wraps, and rotates by position.
        Some(w) => {
            let largest = chunks.iter().copied().max().unwrap_or(1);
            KvCache::<f32>::with_window(CacheShape::new(1, hkv, w + largest - 1, d, dv), w)
        }
    };
    let mut cache = cache.expect("a cache").with_rotary(rotary).expect("a valid embedding");
    let mut layer = cache.layer(0).expect("one layer");
    let options = CacheOptions::new();
    let (mut output, mut lse) = (Array4::zeros((1, hq, n, dv)), Array3::zeros((1, hq, n)));
    let mut start = 0;
    for step in 0.. {
        if start == n {
            break;
        }
        let rows = start..(start + chunks.get(step).copied().unwrap_or(1)).min(n);
        let at = |x: &Array4<f32>| x.slice(s![0, .., rows.clone(), ..]).to_owned();
        layer.append(at(&k).view(), at(&v).view()).expect("room in the cache");
        let r = layer.attend_with_lse(at(&q).view(), &options).expect("a valid step");
        output.slice_mut(s![0, .., rows.clone(), ..]).assign(&r.output);
        lse.slice_mut(s![0, .., rows.clone()]).assign(&r.logsumexp);
        start = rows.end;
    }
    assert!(window.is_none() || layer.held() < n, "the ring wrapped");
    let masks = Masks {
        causal: Some(CausalMask::BottomRight),
        window: window.map(|w| SlidingWindow::new(w - 1, 0)),
        rotary: Some(RotaryCase { rotary, query_first: 0, key_first: 0 }),
        ..Masks::default()
    };
    let mut record = masks.record(name, [flat(&q), flat(&k), flat(&v)], d, Value::Null);
    record.extend([("qkv_output".into(), flat(&output)), ("qkv_logsumexp".into(), lse_json(&lse))]);
    Value::Object(record)
}

/// A packed batch through [`qkv::varlen_attention_with_lse`], and its backward: sequence `i` has
/// `lengths[i]` (queries, keys). `magnify`: sequence 0's queries are multiplied by it and its keys divided
/// by it, which leaves its scores of the usual size but the bound on every score (the largest
/// query times the largest key) too large for the fast path, so that every sequence runs alone
/// on the blocked path.
fn varlen_case(
    name: &str,
    rng: &mut Lcg,
    (hq, hkv, d, dv): (usize, usize, usize, usize),
    lengths: &[(usize, usize)],
    magnify: Option<f32>,
    masks: Masks,
) -> Value {
    let offsets = |pick: fn(&(usize, usize)) -> usize| {
        let mut offsets = vec![0];
        offsets.extend(lengths.iter().scan(0, |end, l| {
            *end += pick(l);
            Some(*end)
        }));
        offsets
    };
    let (query_offsets, key_offsets) = (offsets(|l| l.0), offsets(|l| l.1));
    let (total_q, total_k) = (query_offsets[lengths.len()], key_offsets[lengths.len()]);
    let mut q = rng.tensor((1, hq, total_q, d)).index_axis_move(Axis(0), 0);
    let mut k = rng.tensor((1, hkv, total_k, d)).index_axis_move(Axis(0), 0);
    let v = rng.tensor((1, hkv, total_k, dv)).index_axis_move(Axis(0), 0);
    if let Some(m) = magnify {
        q.slice_mut(s![.., ..query_offsets[1], ..]).mapv_inplace(|x| x * m);
        k.slice_mut(s![.., ..key_offsets[1], ..]).mapv_inplace(|x| x / m);
    }
    let (offsets, options) = ((&query_offsets, &key_offsets), masks.options());
    let r = qkv::varlen_attention_with_lse(q.view(), k.view(), v.view(), offsets.0, offsets.1, &options)
        .expect("a valid case");
    let varlen = json!({ "query_offsets": query_offsets, "key_offsets": key_offsets });
    let mut record = masks.record(name, [flat(&q), flat(&k), flat(&v)], d, varlen);
    record.extend([("qkv_output".into(), flat(&r.output)), ("qkv_logsumexp".into(), lse_json(&r.logsumexp))]);
    // The backward from a random output gradient, for `python/check_backward.py`; not of a
    // magnified case, whose key gradients (queries of 1e37 summed) f32 may not hold, which the
    // backward refuses (`GradientOverflow`).
    if magnify.is_none() {
        let d_output = rng.tensor((1, hq, total_q, dv)).index_axis_move(Axis(0), 0);
        let (q_in, k_in, v_in, d_in) = (q.view(), k.view(), v.view(), d_output.view());
        let g = qkv::varlen_attention_backward(q_in, k_in, v_in, offsets.0, offsets.1, &r, d_in, &options)
            .expect("a valid case");
        record.extend([
            ("d_output".into(), flat(&d_output)),
            ("qkv_dq".into(), flat(&g.dq)),
            ("qkv_dk".into(), flat(&g.dk)),
            ("qkv_dv".into(), flat(&g.dv)),
        ]);
    }
    Value::Object(record)
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
            alibi: Some(AlibiCase::new(qkv::alibi_slopes(8), CausalMask::BottomRight)),
            ..Masks::default()
        },
    ));
    cases.push(case(
        "alibi causal decode 1x500",
        &mut rng,
        (1, 8, 2, 1, 500, 64, 64),
        Masks {
            causal: Some(CausalMask::BottomRight),
            alibi: Some(AlibiCase::new(qkv::alibi_slopes(8), CausalMask::BottomRight)),
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
    // Flash-attn's symmetric ALiBi without a causal mask: bottom-right, top-left with more
    // queries than keys and a two-sided window, and under a causal mask (where it equals the
    // paper's form). Slopes per (sequence, head), random, in both forms.
    let symmetric = || AlibiCase::new(qkv::alibi_slopes(8), CausalMask::BottomRight).symmetric();
    cases.push(case(
        "alibi symmetric 40x96",
        &mut rng,
        (2, 8, 2, 40, 96, 32, 32),
        Masks { alibi: Some(symmetric()), ..Masks::default() },
    ));
    cases.push(case(
        "alibi symmetric top-left 64x48, window (16, 8)",
        &mut rng,
        (1, 8, 4, 64, 48, 16, 16),
        Masks {
            window: Some(SlidingWindow::new(16, 8).aligned(CausalMask::TopLeft)),
            alibi: Some(AlibiCase { align: CausalMask::TopLeft, ..symmetric() }),
            ..Masks::default()
        },
    ));
    cases.push(case(
        "alibi symmetric causal 70x70",
        &mut rng,
        (1, 8, 8, 70, 70, 32, 32),
        Masks { causal: Some(CausalMask::BottomRight), alibi: Some(symmetric()), ..Masks::default() },
    ));
    let slopes = |rng: &mut Lcg, b, h| Array2::from_shape_simple_fn((b, h), || (rng.uniform() + 1.0) * 0.4);
    let per_sequence = slopes(&mut rng, 3, 4);
    cases.push(case(
        "alibi [batch, heads] causal 50x80",
        &mut rng,
        (3, 4, 2, 50, 80, 32, 24),
        Masks {
            causal: Some(CausalMask::BottomRight),
            alibi: Some(AlibiCase::batched(per_sequence, CausalMask::BottomRight)),
            ..Masks::default()
        },
    ));
    let per_sequence = slopes(&mut rng, 3, 4);
    cases.push(case(
        "alibi [batch, heads] symmetric decode 1x300",
        &mut rng,
        (3, 4, 1, 1, 300, 64, 64),
        Masks {
            alibi: Some(AlibiCase::batched(per_sequence, CausalMask::BottomRight).symmetric()),
            ..Masks::default()
        },
    ));
    // Rotary embeddings applied by `Rotary::rotate` before a causal call, both pairings, partial,
    // with positions scaled and bases other than 10000; then LLaMA's, far from position 0.
    let rotary = |rotary: Rotary, query_first, key_first| Some(RotaryCase { rotary, query_first, key_first });
    cases.push(case(
        "rotary half-split 24 of 32, x0.5, base 1e6, 48x80",
        &mut rng,
        (2, 4, 2, 48, 80, 32, 32),
        Masks {
            causal: Some(CausalMask::BottomRight),
            rotary: rotary(Rotary::new(1e6).dims(24).position_scale(0.5), 32, 0),
            ..Masks::default()
        },
    ));
    cases.push(case(
        "rotary interleaved 16 of 32, x2, base 500, 48x80",
        &mut rng,
        (2, 4, 2, 48, 80, 32, 32),
        Masks {
            causal: Some(CausalMask::BottomRight),
            rotary: rotary(Rotary::new(500.0).interleaved().dims(16).position_scale(2.0), 32, 0),
            ..Masks::default()
        },
    ));
    cases.push(case(
        "rotary LLaMA (64, base 1e4) at 4000, 20x60",
        &mut rng,
        (1, 4, 4, 20, 60, 64, 64),
        Masks {
            causal: Some(CausalMask::BottomRight),
            rotary: rotary(Rotary::new(10_000.0), 4040, 4000),
            ..Masks::default()
        },
    ));
    // Decoding through a rotary KV cache: two chunks of prefill, then one position a step.
    cases.push(cache_case(
        "cache rotary half-split 48 of 64, x0.25, base 1e6",
        &mut rng,
        (8, 2, 64, 64, 32),
        &[13, 27],
        Rotary::new(1e6).dims(48).position_scale(0.25),
        None,
    ));
    cases.push(cache_case(
        "cache ring (window 24) rotary interleaved 32 of 64",
        &mut rng,
        (4, 4, 60, 64, 64),
        &[10, 5],
        Rotary::new(5e4).interleaved().dims(32).position_scale(1.5),
        Some(24),
    ));
    // Packed sequences: GQA, a causal mask and a window within each sequence, a sequence with
    // no queries, one with no keys, one with more queries than keys (its first rows see nothing).
    let lengths = [(1, 33), (17, 17), (0, 9), (40, 64), (5, 0), (20, 8), (23, 30)];
    cases.push(varlen_case(
        "varlen 7 sequences, causal, window 12 back",
        &mut rng,
        (6, 2, 32, 16),
        &lengths,
        None,
        Masks {
            causal: Some(CausalMask::BottomRight),
            window: Some(SlidingWindow::new(12, 0)),
            ..Masks::default()
        },
    ));
    let per_sequence = slopes(&mut rng, lengths.len(), 6);
    cases.push(varlen_case(
        "varlen alibi [seqs, heads] symmetric, window (8, 8)",
        &mut rng,
        (6, 3, 32, 32),
        &lengths,
        None,
        Masks {
            window: Some(SlidingWindow::new(8, 8)),
            alibi: Some(AlibiCase::batched(per_sequence.clone(), CausalMask::BottomRight).symmetric()),
            ..Masks::default()
        },
    ));
    cases.push(varlen_case(
        "varlen blocked path, alibi [seqs, heads] causal",
        &mut rng,
        (6, 2, 32, 16),
        &lengths,
        Some(1e37),
        Masks {
            causal: Some(CausalMask::BottomRight),
            window: Some(SlidingWindow::new(12, 0)),
            alibi: Some(AlibiCase::batched(per_sequence, CausalMask::BottomRight)),
            ..Masks::default()
        },
    ));
    let json =
        serde_json::to_string(&json!({ "simd": qkv::simd_report(), "cases": &cases })).expect("serialisable");
    std::fs::write(&path, json).expect("the output file is writable");
    println!("wrote {} cases to {path}", cases.len());
}
