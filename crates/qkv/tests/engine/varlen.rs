//! Packed batches of sequences of different lengths (`varlen_attention`): every sequence and head
//! against the f64 reference run on that sequence's slices alone, at every level; the offsets
//! and options a packed call refuses; and the sequences a call may hold that have no queries or
//! no keys.

use ndarray::{Array1, Array2, Array3, ArrayView3, ArrayViewMut3, s};
use qkv::{Alibi, AttentionError, AttentionOptions, CausalMask, GradientsMut, SlidingWindow};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::backward::{assert_gradient_close, bounds_of};
use crate::problem::{assert_close, error_bound, levels};

/// `x` (`[heads, total, d]`) stored as flash-attn stores it, `[total, heads, d]`.
fn flash_layout(x: &Array3<f32>) -> Array3<f32> {
    x.view().permuted_axes([1, 0, 2]).as_standard_layout().into_owned()
}

/// A tensor stored as flash-attn stores it, viewed as `[heads, total, d]`.
fn heads_first(x: &Array3<f32>) -> ArrayView3<'_, f32> {
    x.view().permuted_axes([1, 0, 2])
}

/// A buffer in flash-attn's layout, viewed as `[heads, total, d]`.
fn heads_first_mut(x: &mut Array3<f32>) -> ArrayViewMut3<'_, f32> {
    x.view_mut().permuted_axes([1, 0, 2])
}

/// A packed batch: `[heads, total, d]` tensors and the offsets of each sequence's rows.
struct Packed {
    q: Array3<f32>,
    k: Array3<f32>,
    v: Array3<f32>,
    query_offsets: Vec<usize>,
    key_offsets: Vec<usize>,
}

impl Packed {
    fn random(
        rng: &mut ChaCha8Rng,
        lengths: &[(usize, usize)],
        heads: (usize, usize),
        dims: (usize, usize),
    ) -> Packed {
        let offsets = |pick: fn(&(usize, usize)) -> usize| {
            let mut offsets = vec![0];
            for l in lengths {
                offsets.push(offsets.last().unwrap() + pick(l));
            }
            offsets
        };
        let (query_offsets, key_offsets) = (offsets(|l| l.0), offsets(|l| l.1));
        let (total_q, total_k) = (*query_offsets.last().unwrap(), *key_offsets.last().unwrap());
        let mut random = |shape| Array3::from_shape_simple_fn(shape, || rng.random_range(-2.0_f32..2.0));
        Packed {
            q: random((heads.0, total_q, dims.0)),
            k: random((heads.1, total_k, dims.0)),
            v: random((heads.1, total_k, dims.1)),
            query_offsets,
            key_offsets,
        }
    }

    fn run(
        &self,
        options: &AttentionOptions<f32>,
    ) -> Result<qkv::PartialAttention<f32, ndarray::Ix3>, AttentionError> {
        let (q, k, v) = (self.q.view(), self.k.view(), self.v.view());
        qkv::varlen_attention_with_lse(q, k, v, &self.query_offsets, &self.key_offsets, options)
    }

    /// Checks `options` (made per sequence by `sequence_options(i, h)` for the reference) at
    /// every level, output and logsumexp of every sequence and head.
    fn check<'a>(
        &'a self,
        what: &str,
        options: impl Fn(Option<(usize, usize)>) -> AttentionOptions<'a, f32>,
    ) {
        let heads = self.q.shape()[0];
        let group = heads / self.k.shape()[0];
        for level in levels() {
            let at_level = options(None).simd(level);
            let got = self.run(&at_level).unwrap();
            let (q, k, v) = (self.q.view(), self.k.view(), self.v.view());
            let offsets = (self.query_offsets.as_slice(), self.key_offsets.as_slice());
            let plain = qkv::varlen_attention(q, k, v, offsets.0, offsets.1, &at_level).unwrap();
            assert_eq!(plain, got.output, "{what} {level}: with and without the logsumexp");
            // Into a buffer in flash-attn's layout (`[total, heads, d_v]`) that holds NaN: every
            // row written, the same bits.
            let [heads, total, d_v] = *plain.shape() else { unreachable!() };
            let mut into = Array3::from_elem((total, heads, d_v), f32::NAN);
            let flash_out = into.view_mut().permuted_axes([1, 0, 2]);
            qkv::varlen_attention_into(q, k, v, offsets.0, offsets.1, &at_level, flash_out).unwrap();
            assert_eq!(plain, into.permuted_axes([1, 0, 2]), "{what} {level}: into a buffer");
            // Inputs stored in flash-attn's layout too (each head's rows `heads · d` apart, which
            // decoding reads as they are): the same bits.
            let (q, k, v) = (flash_layout(&self.q), flash_layout(&self.k), flash_layout(&self.v));
            let (q, k, v) = (heads_first(&q), heads_first(&k), heads_first(&v));
            let strided = qkv::varlen_attention(q, k, v, offsets.0, offsets.1, &at_level).unwrap();
            assert_eq!(plain, strided, "{what} {level}: inputs in flash-attn's layout");
            for i in 0..self.query_offsets.len() - 1 {
                let (rows, keys) = (
                    self.query_offsets[i]..self.query_offsets[i + 1],
                    self.key_offsets[i]..self.key_offsets[i + 1],
                );
                for h in 0..heads {
                    let ctx = format!("{what} {level} sequence {i} head {h}");
                    let got_out = got.output.slice(s![h, rows.clone(), ..]).to_owned();
                    let got_lse = got.logsumexp.slice(s![h, rows.clone()]).to_owned();
                    let qh = self.q.slice(s![h, rows.clone(), ..]);
                    let kh = self.k.slice(s![h / group, keys.clone(), ..]);
                    let vh = self.v.slice(s![h / group, keys.clone(), ..]);
                    let head_options = options(Some((i, h)));
                    let want_lse =
                        qkv::reference::attention_with_lse(qh, kh, vh, &head_options).unwrap().logsumexp;
                    if keys.is_empty() {
                        // Nothing to weigh: zero rows, and the reference's logsumexp of nothing
                        // (the head's sink, or -inf) exactly.
                        assert!(got_out.iter().all(|&x| x == 0.0), "{ctx}: no keys, zero rows");
                        let exact = got_lse.iter().zip(&want_lse).all(|(&g, &w)| f64::from(g) == w);
                        assert!(exact, "{ctx}: no keys, logsumexp {got_lse} where {want_lse} is wanted");
                        continue;
                    }
                    let want = qkv::reference::attention(qh, kh, vh, &head_options).unwrap();
                    let (_, bound) = error_bound(&want, &vh.to_owned());
                    assert_close(&ctx, &got_out, &want.output, bound);
                    let lse = Array2::from_shape_vec((rows.len(), 1), got_lse.to_vec()).unwrap();
                    let want_lse = want_lse.insert_axis(ndarray::Axis(1)).to_owned();
                    let finite = lse
                        .iter()
                        .zip(&want_lse)
                        .all(|(g, w)| (*g == f32::NEG_INFINITY) == (*w == f64::NEG_INFINITY));
                    assert!(finite, "{ctx}: the same rows see no key");
                    let clean = |a: &Array2<f64>| a.mapv(|x| if x.is_finite() { x } else { 0.0 });
                    assert_close(
                        &ctx,
                        &lse.mapv(|x| if x.is_finite() { x } else { 0.0 }),
                        &clean(&want_lse),
                        bound,
                    );
                }
            }
        }
    }
}

/// What the reference backward, run on each sequence and head alone, wants of a packed batch's
/// gradients, with their rounding bounds (see `backward::bounds_of`).
struct WantedGradients {
    dq: Array3<f64>,
    dk: Array3<f64>,
    dv: Array3<f64>,
    bounds: [Array3<f64>; 3],
    /// The largest `1 + max |s|` of any sequence and head.
    condition: f64,
    /// Each head's sink gradient over every sequence, and its bound (`Σ |dO| · |O|` over the rows).
    dsinks: Option<(Vec<f64>, Vec<f64>)>,
}

impl Packed {
    /// The reference's gradients of every sequence and head on their own rows (options per
    /// sequence and head from `options(Some((i, h)))`, scores scaled by `scale`), a shared
    /// key/value head's summed over its query heads.
    fn wanted_gradients<'a>(
        &'a self,
        d_out: &Array3<f32>,
        scale: f64,
        options: &impl Fn(Option<(usize, usize)>) -> AttentionOptions<'a, f32>,
    ) -> WantedGradients {
        let heads = self.q.shape()[0];
        let group = heads / self.k.shape()[0];
        let zeros = |x: &Array3<f32>| Array3::<f64>::zeros(x.raw_dim());
        let mut want = WantedGradients {
            dq: zeros(&self.q),
            dk: zeros(&self.k),
            dv: zeros(&self.v),
            bounds: [zeros(&self.q), zeros(&self.k), zeros(&self.v)],
            condition: 1.0,
            dsinks: None,
        };
        for i in 0..self.query_offsets.len() - 1 {
            let rows = self.query_offsets[i]..self.query_offsets[i + 1];
            let keys = self.key_offsets[i]..self.key_offsets[i + 1];
            if rows.is_empty() || keys.is_empty() {
                continue;
            }
            for h in 0..heads {
                let o = options(Some((i, h)));
                let qh = self.q.slice(s![h, rows.clone(), ..]);
                let (kh, vh) = (
                    self.k.slice(s![h / group, keys.clone(), ..]),
                    self.v.slice(s![h / group, keys.clone(), ..]),
                );
                let d_o = d_out.slice(s![h, rows.clone(), ..]);
                let g = qkv::reference::attention_backward(qh, kh, vh, d_o, &o).unwrap();
                let (condition, b) = bounds_of([qh, kh, vh], d_o, &o, scale);
                want.condition = want.condition.max(condition);
                want.dq.slice_mut(s![h, rows.clone(), ..]).assign(&g.dq);
                want.bounds[0].slice_mut(s![h, rows.clone(), ..]).assign(&b.dq);
                for (x, part) in [(&mut want.dk, &g.dk), (&mut want.bounds[1], &b.dk)] {
                    x.slice_mut(s![h / group, keys.clone(), ..]).zip_mut_with(part, |x, &p| *x += p);
                }
                for (x, part) in [(&mut want.dv, &g.dv), (&mut want.bounds[2], &b.dv)] {
                    x.slice_mut(s![h / group, keys.clone(), ..]).zip_mut_with(part, |x, &p| *x += p);
                }
                if let Some(d) = &g.dsinks {
                    let (dsinks, bound) =
                        want.dsinks.get_or_insert_with(|| (vec![0.0; heads], vec![0.0; heads]));
                    dsinks[h] += d[0];
                    let out = qkv::reference::attention(qh, kh, vh, &o).unwrap().output;
                    bound[h] += d_o.iter().zip(&out).map(|(&g, &o)| (f64::from(g) * o).abs()).sum::<f64>();
                }
            }
        }
        want
    }

    /// Checks the backward of `options` (as [`Packed::check`] takes them; scores scaled by
    /// `scale`) at every level against the reference on each sequence and head alone, allocating
    /// and into NaN-filled buffers in flash-attn's layout.
    fn check_backward<'a>(
        &'a self,
        what: &str,
        scale: f64,
        options: impl Fn(Option<(usize, usize)>) -> AttentionOptions<'a, f32>,
    ) {
        let mut rng = ChaCha8Rng::seed_from_u64(41);
        let [heads, total_q, _] = *self.q.shape() else { unreachable!() };
        let d_v = self.v.shape()[2];
        let d_out = Array3::from_shape_simple_fn((heads, total_q, d_v), || rng.random_range(-1.0_f32..1.0));
        let want = self.wanted_gradients(&d_out, scale, &options);
        let (q, k, v) = (self.q.view(), self.k.view(), self.v.view());
        let (qo, ko) = (self.query_offsets.as_slice(), self.key_offsets.as_slice());
        for level in levels() {
            let ctx = format!("{what} {level}");
            let o = options(None).simd(level);
            let forward = self.run(&o).unwrap();
            let got = qkv::varlen_attention_backward(q, k, v, qo, ko, &forward, d_out.view(), &o).unwrap();
            let flat = |x: &Array3<f32>| {
                let rows = x.shape()[0] * x.shape()[1];
                x.to_shape((rows, x.shape()[2])).unwrap().to_owned()
            };
            let flat64 = |x: &Array3<f64>| {
                let rows = x.shape()[0] * x.shape()[1];
                x.to_shape((rows, x.shape()[2])).unwrap().to_owned()
            };
            let wanted = [(&want.dq, &got.dq, "dq"), (&want.dk, &got.dk, "dk"), (&want.dv, &got.dv, "dv")];
            for ((w, g, name), bound) in wanted.into_iter().zip(&want.bounds) {
                let ctx = format!("{name} {ctx}");
                assert_gradient_close(&ctx, &flat(g), &flat64(w), &flat64(bound), want.condition);
            }
            match (&want.dsinks, &got.dsinks) {
                (Some((dsinks, bound)), Some(got)) => {
                    for h in 0..heads {
                        let allowed = 2e-5 * want.condition * (bound[h] + 1e-6);
                        let (g, w) = (f64::from(got[h]), dsinks[h]);
                        assert!((g - w).abs() <= allowed, "dsinks[{h}] {ctx}: got {g}, want {w}");
                    }
                }
                (None, None) => {}
                _ => panic!("{ctx}: dsinks with sinks only"),
            }
            // Into buffers in flash-attn's layout that hold NaN: every element written, the same bits.
            let nan =
                |x: &Array3<f32>| Array3::from_elem((x.shape()[1], x.shape()[0], x.shape()[2]), f32::NAN);
            let (mut dq, mut dk, mut dv) = (nan(&self.q), nan(&self.k), nan(&self.v));
            let mut dsinks = Array1::from_elem(heads, f32::NAN);
            let into = GradientsMut::new(
                heads_first_mut(&mut dq),
                heads_first_mut(&mut dk),
                heads_first_mut(&mut dv),
            );
            let into = if got.dsinks.is_some() { into.with_dsinks(dsinks.view_mut()) } else { into };
            qkv::varlen_attention_backward_into(q, k, v, qo, ko, &forward, d_out.view(), &o, into).unwrap();
            assert_eq!(got.dq, dq.permuted_axes([1, 0, 2]), "{ctx}: dq into a buffer");
            assert_eq!(got.dk, dk.permuted_axes([1, 0, 2]), "{ctx}: dk into a buffer");
            assert_eq!(got.dv, dv.permuted_axes([1, 0, 2]), "{ctx}: dv into a buffer");
            if let Some(got) = &got.dsinks {
                assert_eq!(got, dsinks, "{ctx}: dsinks into a buffer");
            }
        }
    }
}

#[test]
fn every_sequence_matches_the_reference_on_its_own_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    // Lengths with n = 1, lengths that are no multiple of a tile, a long prefill beside decoding
    // steps, more queries than keys, and sequences without queries or without keys.
    // The last batch is decoding steps alone (and a sequence with keys and no queries), which
    // the step measures as it reads them rather than in a pass beforehand.
    let batches: [&[(usize, usize)]; 5] = [
        &[(1, 1)],
        &[(3, 5), (1, 17), (0, 4), (70, 70), (2, 0), (1, 129)],
        &[(33, 33), (1, 300), (5, 2)],
        &[(0, 0), (1, 64), (9, 9)],
        &[(1, 3), (1, 40), (0, 6), (1, 1), (1, 77), (1, 0)],
    ];
    for (n, lengths) in batches.iter().enumerate() {
        for (heads, dims) in [((1, 1), (8, 8)), ((4, 2), (16, 5)), ((6, 1), (3, 12))] {
            let packed = Packed::random(&mut rng, lengths, heads, dims);
            let what = format!("batch {n}, heads {heads:?}, dims {dims:?}");
            packed.check(&format!("{what} plain"), |_| AttentionOptions::new());
            packed.check(&format!("{what} causal"), |_| {
                AttentionOptions::new().causal(CausalMask::BottomRight)
            });
            packed.check(&format!("{what} top-left causal, window"), |_| {
                AttentionOptions::new()
                    .causal(CausalMask::TopLeft)
                    .sliding_window(SlidingWindow::new(3, 0).aligned(CausalMask::TopLeft))
            });
            packed.check(&format!("{what} scale and cap"), |_| {
                AttentionOptions::new().scale(0.9).logit_softcap(2.0)
            });
        }
    }
}

#[test]
fn alibi_slopes_and_sinks_apply_per_head_or_per_sequence_and_head() {
    let mut rng = ChaCha8Rng::seed_from_u64(32);
    // The sequence of two queries and no keys: its rows' logsumexp is the sink's logit. The one
    // of 30 queries fills more than a query block of stacked rows: it runs alone, through the
    // dense path, with its own sequence's slopes.
    let lengths = [(2, 7), (1, 40), (6, 6), (2, 0), (30, 50)];
    let packed = Packed::random(&mut rng, &lengths, (4, 2), (8, 8));
    let shared = qkv::alibi_slopes::<f32>(4);
    packed.check("per head", |head| {
        let o = AttentionOptions::new().causal(CausalMask::BottomRight);
        match head {
            None => o.alibi(Alibi::new(&shared)),
            Some((_, h)) => o.alibi(Alibi::new(&shared[h..h + 1])),
        }
    });
    let sinks = [0.5_f32, -1.0, 2.0, f32::NEG_INFINITY];
    packed.check("sinks, causal", |head| {
        let o = AttentionOptions::new().causal(CausalMask::BottomRight);
        match head {
            None => o.sinks(&sinks),
            Some((_, h)) => o.sinks(&sinks[h..h + 1]),
        }
    });
    let per_sequence = Array2::from_shape_fn((5, 4), |(i, h)| 0.1 * (i + 1) as f32 + 0.05 * h as f32);
    packed.check("per sequence and head, symmetric", |head| match head {
        None => AttentionOptions::new().alibi(Alibi::batched(per_sequence.view()).symmetric()),
        Some((i, h)) => AttentionOptions::new()
            .alibi(Alibi::batched(per_sequence.slice(s![i..i + 1, h..h + 1])).symmetric()),
    });
}

#[test]
fn decoding_steps_take_a_sequences_heads_in_turn_with_the_bits_each_gets_alone() {
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    // Enough decoding steps for every thread of any pool that tests run on, so that a step in
    // flash-attn's layout runs each sequence's heads as one work item, a key tile of each in turn
    // (whose rows lie side by side there): each head must get the bits it gets from inputs stored
    // head by head (see `Packed::check`), and the reference's values. One key, tiles cut short,
    // a sequence without queries and one without keys among them.
    let key_lengths = [1, 2, 127, 128, 129, 300, 7, 0];
    let lengths: Vec<(usize, usize)> =
        (0..72).map(|i| (usize::from(i % 13 != 5), key_lengths[i % key_lengths.len()])).collect();
    for (heads, dims) in [((8, 4), (16, 5)), ((6, 3), (8, 8))] {
        let packed = Packed::random(&mut rng, &lengths, heads, dims);
        let what = format!("heads {heads:?}, dims {dims:?}");
        packed.check(&format!("{what} plain"), |_| AttentionOptions::new());
        packed.check(&format!("{what} top-left causal, window"), |_| {
            AttentionOptions::new()
                .causal(CausalMask::TopLeft)
                .sliding_window(SlidingWindow::new(3, 0).aligned(CausalMask::TopLeft))
        });
        // Slopes of its own for each query head: a sequence's query heads are its problems, two
        // of them on each key/value head.
        let slopes = qkv::alibi_slopes::<f32>(heads.0);
        packed.check(&format!("{what} ALiBi per head"), |head| {
            let o = AttentionOptions::new().causal(CausalMask::BottomRight);
            match head {
                None => o.alibi(Alibi::new(&slopes)),
                Some((_, h)) => o.alibi(Alibi::new(&slopes[h..h + 1])),
            }
        });
    }
}

#[test]
fn the_backward_of_every_sequence_matches_the_reference_on_its_own_rows() {
    let mut rng = ChaCha8Rng::seed_from_u64(42);
    // n = 1, lengths no multiple of a tile or a key block (128), more queries than keys, and
    // sequences without queries or without keys.
    let batches: [&[(usize, usize)]; 3] =
        [&[(1, 1)], &[(3, 5), (1, 17), (0, 4), (70, 70), (2, 0), (1, 129)], &[(0, 0), (49, 33), (5, 2)]];
    for (n, lengths) in batches.iter().enumerate() {
        for (heads, dims) in [((1, 1), (8, 8)), ((4, 2), (16, 5)), ((6, 1), (3, 12))] {
            let packed = Packed::random(&mut rng, lengths, heads, dims);
            let what = format!("batch {n}, heads {heads:?}, dims {dims:?}");
            let default_scale = 1.0 / (dims.0 as f64).sqrt();
            packed.check_backward(&format!("{what} plain"), default_scale, |_| AttentionOptions::new());
            packed.check_backward(&format!("{what} causal"), default_scale, |_| {
                AttentionOptions::new().causal(CausalMask::BottomRight)
            });
            packed.check_backward(&format!("{what} top-left causal, window"), default_scale, |_| {
                AttentionOptions::new()
                    .causal(CausalMask::TopLeft)
                    .sliding_window(SlidingWindow::new(3, 0).aligned(CausalMask::TopLeft))
            });
            packed.check_backward(&format!("{what} scale and cap"), 0.9, |_| {
                AttentionOptions::new().scale(0.9).logit_softcap(2.0)
            });
        }
    }
    // ALiBi per head and per sequence (flash-attn's symmetric form), and sinks, whose gradient
    // sums over every sequence; the sequence of two queries and no keys adds nothing to it.
    let lengths = [(2, 7), (1, 40), (6, 6), (2, 0), (30, 50)];
    let packed = Packed::random(&mut rng, &lengths, (4, 2), (8, 8));
    let scale = 1.0 / 8f64.sqrt();
    let shared = qkv::alibi_slopes::<f32>(4);
    packed.check_backward("ALiBi per head", scale, |head| {
        let o = AttentionOptions::new().causal(CausalMask::BottomRight);
        match head {
            None => o.alibi(Alibi::new(&shared)),
            Some((_, h)) => o.alibi(Alibi::new(&shared[h..h + 1])),
        }
    });
    let sinks = [0.5_f32, -1.0, 2.0, f32::NEG_INFINITY];
    packed.check_backward("sinks, causal", scale, |head| {
        let o = AttentionOptions::new().causal(CausalMask::BottomRight);
        match head {
            None => o.sinks(&sinks),
            Some((_, h)) => o.sinks(&sinks[h..h + 1]),
        }
    });
    let per_sequence = Array2::from_shape_fn((5, 4), |(i, h)| 0.1 * (i + 1) as f32 + 0.05 * h as f32);
    packed.check_backward("per sequence and head, symmetric", scale, |head| match head {
        None => AttentionOptions::new().alibi(Alibi::batched(per_sequence.view()).symmetric()),
        Some((i, h)) => AttentionOptions::new()
            .alibi(Alibi::batched(per_sequence.slice(s![i..i + 1, h..h + 1])).symmetric()),
    });
    // Scores near 1e6 in one sequence: weights of exactly 0 and 1 beside ordinary ones.
    let mut huge = Packed::random(&mut rng, &[(3, 4), (20, 130)], (2, 1), (4, 4));
    huge.q.slice_mut(s![.., 3.., ..]).mapv_inplace(|x| x * 1e3);
    huge.k.slice_mut(s![.., 4.., ..]).mapv_inplace(|x| x * 1e3);
    huge.check_backward("huge scores", 0.5, |_| AttentionOptions::new());
}

#[test]
fn the_backward_names_what_does_not_fit_by_its_packed_index() {
    let mut rng = ChaCha8Rng::seed_from_u64(43);
    let packed = Packed::random(&mut rng, &[(2, 3), (3, 2)], (2, 1), (4, 4));
    let (q, k, v) = (packed.q.view(), packed.k.view(), packed.v.view());
    let (qo, ko) = (packed.query_offsets.as_slice(), packed.key_offsets.as_slice());
    let options = AttentionOptions::new();
    let forward = packed.run(&options).unwrap();
    let backward = |d_out: ArrayView3<f32>, forward: &qkv::PartialAttention<f32, ndarray::Ix3>| {
        qkv::varlen_attention_backward(q, k, v, qo, ko, forward, d_out, &options).unwrap_err().to_string()
    };
    let mut d_out = Array3::<f32>::ones((2, 5, 4));
    d_out[[1, 3, 2]] = f32::NAN;
    assert!(backward(d_out.view(), &forward).starts_with("d_output[1, 3, 2] is NaN"));
    let error = backward(Array3::ones((2, 5, 3)).view(), &forward);
    assert!(error.starts_with("d_output has shape [2, 5, 3]"), "{error}");
    let mut saved = forward.clone();
    saved.logsumexp[[0, 4]] = f32::INFINITY;
    let error = backward(Array3::ones((2, 5, 4)).view(), &saved);
    assert!(error.starts_with("logsumexp[0, 4] is inf"), "{error}");
    let error =
        qkv::varlen_attention_backward(q, k, v, &[0, 2, 5], &[0, 5], &forward, d_out.view(), &options)
            .unwrap_err();
    assert!(matches!(error, AttentionError::PackedOffsetCounts { .. }), "{error}");
    // A packed call has no bias, so no bias gradient.
    let (mut dq, mut dk, mut dv) = (packed.q.clone(), packed.k.clone(), packed.v.clone());
    let mut dbias = Array3::<f32>::zeros((2, 5, 5));
    let into = GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut()).with_dbias(dbias.view_mut());
    let d_out = Array3::<f32>::ones((2, 5, 4));
    let error = qkv::varlen_attention_backward_into(q, k, v, qo, ko, &forward, d_out.view(), &options, into)
        .unwrap_err()
        .to_string();
    assert!(error.starts_with("a packed (varlen) call takes no dbias option"), "{error}");
}

/// Offsets and shapes at their extremes (none, `usize::MAX`, zero heads or widths, a forward of
/// another call): each an error or a result, never a panic.
#[test]
fn the_backward_of_extreme_calls_is_an_error_or_a_result() {
    let options = AttentionOptions::new();
    let backward = |q: &Array3<f32>, kv: &Array3<f32>, qo: &[usize], ko: &[usize]| {
        let forward = qkv::PartialAttention {
            output: q.clone(),
            logsumexp: Array2::zeros((q.shape()[0], q.shape()[1])),
        };
        let (q, kv, d_out) = (q.view(), kv.view(), q.view());
        qkv::varlen_attention_backward(q, kv, kv, qo, ko, &forward, d_out, &options).map(|g| g.dq.len())
    };
    let (q, kv) = (Array3::<f32>::zeros((2, 3, 4)), Array3::<f32>::zeros((1, 3, 4)));
    for (qo, ko) in [
        (&[][..], &[][..]),
        (&[0][..], &[0][..]),
        (&[0, usize::MAX][..], &[0, 3][..]),
        (&[0, 3][..], &[0, usize::MAX][..]),
        (&[usize::MAX, 3][..], &[0, 3][..]),
        (&[0, 2, 1, 3][..], &[0, 1, 2, 3][..]),
    ] {
        assert!(backward(&q, &kv, qo, ko).is_err(), "{qo:?} {ko:?}");
    }
    // No heads, no width, no rows: refused by shape, or empty gradients.
    for (q, kv) in [
        (Array3::zeros((0, 3, 4)), Array3::zeros((0, 3, 4))),
        (Array3::zeros((2, 3, 0)), Array3::zeros((1, 3, 0))),
        (Array3::zeros((2, 3, 4)), Array3::zeros((3, 3, 4))),
    ] {
        assert!(backward(&q, &kv, &[0, 3], &[0, 3]).is_err(), "{:?} {:?}", q.shape(), kv.shape());
    }
    let (none_q, none_kv) = (Array3::<f32>::zeros((2, 0, 4)), Array3::<f32>::zeros((1, 0, 4)));
    assert_eq!(backward(&none_q, &none_kv, &[0], &[0]), Ok(0));
    assert_eq!(backward(&none_q, &none_kv, &[0, 0, 0], &[0, 0, 0]), Ok(0));
    // A forward of another shape, and huge but finite values (the bound on what the gradients
    // may reach refuses them rather than overflow).
    let wrong = qkv::PartialAttention { output: Array3::zeros((2, 3, 5)), logsumexp: Array2::zeros((2, 3)) };
    let d_out = Array3::<f32>::zeros((2, 3, 4));
    let error = qkv::varlen_attention_backward(
        q.view(),
        kv.view(),
        kv.view(),
        &[0, 3],
        &[0, 3],
        &wrong,
        d_out.view(),
        &options,
    );
    assert!(matches!(error, Err(AttentionError::GradientShape { .. })), "{error:?}");
    let huge = Array3::<f32>::from_elem((2, 3, 4), 1e30);
    let huge_kv = Array3::<f32>::from_elem((1, 3, 4), 1e30);
    let forward = qkv::varlen_attention_with_lse(
        huge.view(),
        huge_kv.view(),
        huge_kv.view(),
        &[0, 3],
        &[0, 3],
        &options,
    );
    if let Ok(forward) = forward {
        let g = qkv::varlen_attention_backward(
            huge.view(),
            huge_kv.view(),
            huge_kv.view(),
            &[0, 3],
            &[0, 3],
            &forward,
            huge.view(),
            &options,
        );
        assert!(g.map_or(true, |g| g.dq.iter().all(|x| x.is_finite())), "finite gradients or an error");
    }
}

#[test]
fn scores_too_large_for_the_fast_path_still_match_the_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(33);
    // The last sequence runs alone through the dense path, which must find its scores too large
    // for the fast path too.
    let mut packed = Packed::random(&mut rng, &[(3, 4), (1, 9), (60, 70)], (2, 1), (4, 4));
    // Scores near 1e36: beyond what the fast path's bounds allow, finite all the same.
    packed.q.mapv_inplace(|x| x * 1e18);
    packed.k.mapv_inplace(|x| x * 1e18);
    packed.check("huge scores", |_| AttentionOptions::new());
}

#[test]
fn decoding_steps_that_overflow_run_alone_and_match_the_reference() {
    let mut rng = ChaCha8Rng::seed_from_u64(35);
    let mut packed = Packed::random(&mut rng, &[(1, 4), (1, 9), (1, 130)], (4, 2), (4, 4));
    // Scores that may reach 8e37, past what the fast path's bounds allow (a sixteenth of f32's
    // largest), known only once the step has read the keys: its rows are written again by the
    // blocked path.
    packed.k.mapv_inplace(|x| x * 1e37);
    packed.check("decoding, huge scores", |_| AttentionOptions::new());
    // Scores past f32's largest, in sequence 1 alone: the blocked path names its query (packed
    // row 1) and the sequence.
    packed.k.mapv_inplace(|x| x * 1e-37);
    packed.q.slice_mut(s![.., 1, ..]).mapv_inplace(|x| x * 1e20);
    packed.k.slice_mut(s![.., 4..13, ..]).mapv_inplace(|x| x * 1e20);
    let error = packed.run(&AttentionOptions::new()).unwrap_err();
    let named = matches!(error, AttentionError::ScoreOverflow { query_idx: 1, head: Some((1, 0)), .. });
    assert!(named, "{error}");
}

/// Every key and value of a batch of decoding steps must be finite, whether the step reads it or
/// not (a key a window hides, a sequence without queries), and the error names the first one that
/// is not by its index in the whole tensor, keys before values.
#[test]
fn decoding_steps_name_the_first_key_or_value_that_is_not_finite() {
    let mut rng = ChaCha8Rng::seed_from_u64(36);
    let lengths = [(1, 5), (0, 3), (1, 600)];
    let packed = Packed::random(&mut rng, &lengths, (4, 2), (4, 4));
    let options = AttentionOptions::new();
    // The last query sees keys 598 and 599 of its sequence alone, and the step skips the whole
    // key blocks before them.
    let window =
        AttentionOptions::new().causal(CausalMask::BottomRight).sliding_window(SlidingWindow::new(1, 0));
    let run = |k: ArrayView3<f32>, v: ArrayView3<f32>, options: &AttentionOptions<f32>| {
        let q = packed.q.view();
        qkv::varlen_attention(q, k, v, &packed.query_offsets, &packed.key_offsets, options).unwrap_err()
    };
    let bad = |x: &Array3<f32>, at: [usize; 3], value: f32| {
        let mut x = x.clone();
        x[at] = value;
        x
    };
    let cases = [
        ("a key the step reads", "keys", [1, 2, 3], &options),
        ("a key of a sequence without queries", "keys", [0, 6, 0], &options),
        ("a key the window hides", "keys", [1, 13, 2], &window),
        ("a value the step reads", "values", [0, 19, 1], &options),
        ("a value the window hides", "values", [1, 14, 0], &window),
    ];
    for (what, argument, at, options) in cases {
        for value in [f32::NAN, f32::INFINITY] {
            let (k, v) = match argument {
                "keys" => (bad(&packed.k, at, value), packed.v.clone()),
                _ => (packed.k.clone(), bad(&packed.v, at, value)),
            };
            // As they are, and stored in flash-attn's layout (the index names the element alike).
            let (flash_k, flash_v) = (flash_layout(&k), flash_layout(&v));
            let flash = (heads_first(&flash_k), heads_first(&flash_v));
            for (k, v) in [(k.view(), v.view()), flash] {
                let error = run(k, v, options);
                let named = matches!(&error, AttentionError::NonFinite { argument: a, index, .. }
                    if *a == argument && index.0 == at);
                assert!(named, "{what} ({value}): {error}");
            }
        }
    }
    // Both a value the step reads and a key it does not: the key is named.
    let (k, v) = (bad(&packed.k, [0, 6, 0], f32::NAN), bad(&packed.v, [0, 0, 0], f32::NAN));
    let error = run(k.view(), v.view(), &options);
    assert!(matches!(&error, AttentionError::NonFinite { argument: "keys", .. }), "{error}");
}

#[test]
fn offsets_and_options_that_do_not_fit_are_refused_by_name() {
    let mut rng = ChaCha8Rng::seed_from_u64(34);
    let packed = Packed::random(&mut rng, &[(2, 3), (1, 2)], (2, 1), (4, 4));
    let (q, k, v) = (packed.q.view(), packed.k.view(), packed.v.view());
    let options = AttentionOptions::new();
    let run = |qo: &[usize], ko: &[usize], options: &AttentionOptions<f32>| {
        qkv::varlen_attention(q, k, v, qo, ko, options).unwrap_err().to_string()
    };
    let error = run(&[0, 2, 3], &[0, 3], &options);
    assert_eq!(
        error,
        "query_offsets [0, 2, 3] and key_offsets [0, 3] differ in length (3 and 2): each has one offset \
         per sequence of the batch and one for the end"
    );
    // One sequence of one row: the counts in the singular.
    let single = Packed::random(&mut rng, &[(1, 1)], (2, 1), (4, 4));
    let (sq, sk, sv) = (single.q.view(), single.k.view(), single.v.view());
    let error = qkv::varlen_attention(sq, sk, sv, &[0, 2], &[0, 1], &options).unwrap_err().to_string();
    assert!(error.starts_with("query_offsets [0, 2] do not fit 1 sequence and 1 packed row:"), "{error}");
    let error = run(&[0, 2, 4], &[0, 3, 5], &options);
    assert!(
        error.contains("query_offsets [0, 2, 4]") && error.contains("end at the number of packed rows"),
        "{error}"
    );
    let error = run(&[0, 3, 2, 3], &[0, 3, 5, 5], &options);
    assert!(error.contains("never decrease"), "{error}");
    let keep = Array2::from_elem((3, 5), true);
    let error =
        run(&[0, 2, 3], &[0, 3, 5], &AttentionOptions::new().keep_mask(qkv::KeepMask::new(keep.view())));
    assert!(error.starts_with("a packed (varlen) call takes no keep_mask option"), "{error}");
    let mut nan = packed.k.clone();
    nan[[0, 4, 1]] = f32::NAN;
    let error = qkv::varlen_attention(q, nan.view(), v, &[0, 2, 3], &[0, 3, 5], &options).unwrap_err();
    assert!(error.to_string().contains("keys"), "{error}");
    let error =
        qkv::varlen_attention(q, k.slice(s![.., .., ..3]), v, &[0, 2, 3], &[0, 3, 5], &options).unwrap_err();
    assert!(matches!(error, AttentionError::KeyWidth { .. }), "{error}");
    let mut out = Array3::zeros((2, 3, 5));
    let error =
        qkv::varlen_attention_into(q, k, v, &[0, 2, 3], &[0, 3, 5], &options, out.view_mut()).unwrap_err();
    assert_eq!(error.to_string(), "output has shape [2, 3, 5] but the attention result has shape [2, 3, 4]");
    // A batch of no sequences refuses bad option values as a full one does.
    let (none_q, none_kv) = (Array3::<f32>::zeros((2, 0, 4)), Array3::<f32>::zeros((1, 0, 4)));
    let empty = |options: &AttentionOptions<f32>| {
        let (k, v) = (none_kv.view(), none_kv.view());
        qkv::varlen_attention(none_q.view(), k, v, &[0], &[0], options)
    };
    assert_eq!(empty(&options).unwrap().shape(), [2, 0, 4]);
    let sinks = [0.5_f32];
    for (options, named) in [
        (AttentionOptions::new().scale(f32::NAN), "scale is NaN"),
        (AttentionOptions::new().logit_softcap(-1.0), "logit_softcap is -1"),
        (AttentionOptions::new().sinks(&sinks), "sinks"),
    ] {
        let (error, full) = (empty(&options).unwrap_err().to_string(), run(&[0, 2, 3], &[0, 3, 5], &options));
        assert!(error.starts_with(named) && full.starts_with(named), "{named}: {error} / {full}");
    }
}
