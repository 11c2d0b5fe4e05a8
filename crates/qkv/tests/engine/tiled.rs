//! The reference's tiled online-softmax trace (`reference::trace_tiled`): its final numbers equal
//! attention's, its blocks' parts merge into the whole row, and every block obeys the recurrence.

use ndarray::{Array2, ArrayView2};
use qkv::{AttentionOptions, KeepMask, Real, TiledTrace};

use crate::problem::{MASK_KINDS, MaskKind, Problem, assert_close, error_bound, levels};

/// Two f64 numbers agree to `1e-12` relative to `scale`, or are the same infinity.
fn near(a: f64, b: f64, scale: f64) -> bool {
    a == b || (a - b).abs() <= 1e-12 * scale.max(1.0)
}

/// Every block obeys the online softmax's recurrence, starting from `m = -inf`, `l = 0`,
/// `acc = 0`, and its own part is the softmax over its keys alone; the blocks tile the keys in
/// order; the final numbers are the last block's. Computed here from the block's scores and the
/// values, not by the engine's code.
fn check_recurrence(t: &TiledTrace, v: &ArrayView2<f64>, ctx: &str) {
    let (n_k, d_v) = v.dim();
    let largest = v.iter().fold(0.0_f64, |m, x| m.max(x.abs()));
    let (mut m, mut l, mut acc) = (None::<f64>, 0.0, vec![0.0; d_v]);
    let mut next_key = 0;
    for (b, block) in t.blocks.iter().enumerate() {
        let ctx = format!("{ctx} block {b}");
        assert_eq!(block.keys, next_key..(next_key + t.block).min(n_k), "{ctx}: keys");
        next_key = block.keys.end;
        let values = v.slice(ndarray::s![block.keys.clone(), ..]);
        let visible = block.scores.iter().copied().filter(|s| *s != f64::NEG_INFINITY);
        assert_eq!(block.block_max, visible.clone().reduce(f64::max), "{ctx}: block max");
        assert_eq!(block.max_before, m, "{ctx}: m before");
        assert_eq!(block.sum_before, l, "{ctx}: l before");
        let m_after = match (m, block.block_max) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
        assert_eq!(block.max_after, m_after, "{ctx}: m after");
        match m_after {
            None => assert_eq!(block.rescale, 1.0, "{ctx}: nothing visible yet, nothing to rescale"),
            Some(new) => assert_eq!(block.rescale, (m.unwrap_or(f64::NEG_INFINITY) - new).exp(), "{ctx}"),
        }
        if block.block_max.is_none() {
            assert_eq!((block.max_after, block.rescale), (block.max_before, 1.0), "{ctx}: hidden block");
        }
        for (e, s) in block.exponentials.iter().zip(&block.scores) {
            assert_eq!(*e, m_after.map_or(0.0, |m| (s - m).exp()), "{ctx}: exponential of {s}");
        }
        let l_after = block.rescale * l + block.exponentials.iter().sum::<f64>();
        assert!(near(block.sum_after, l_after, l_after), "{ctx}: l {} vs {l_after}", block.sum_after);
        for (c, carried) in acc.iter().enumerate() {
            let terms: f64 = block.exponentials.iter().zip(values.column(c)).map(|(e, x)| e * x).sum();
            let want = block.rescale * carried + terms;
            assert!(near(block.accumulator[c], want, l_after * largest), "{ctx}: acc[{c}]");
            let output = if l_after > 0.0 { want / l_after } else { 0.0 };
            assert!(near(block.output[c], output, largest), "{ctx}: output[{c}]");
        }
        // The block's own part: a plain logsumexp and softmax over its visible scores.
        let part = &block.partial;
        match block.block_max {
            None => {
                assert_eq!(part.logsumexp[0], f64::NEG_INFINITY, "{ctx}: empty part");
                assert!(part.output.iter().all(|x| *x == 0.0), "{ctx}: empty part's output");
            }
            Some(mb) => {
                let sum: f64 = visible.map(|s| (s - mb).exp()).sum();
                let lse = mb + sum.ln();
                let ctx = format!("{ctx}: part lse {} vs {lse}", part.logsumexp[0]);
                assert!(near(part.logsumexp[0], lse, lse.abs()), "{ctx}");
                for c in 0..d_v {
                    let terms = block.scores.iter().zip(values.column(c)).map(|(s, x)| (s - mb).exp() * x);
                    assert!(
                        near(part.output[[0, c]], terms.sum::<f64>() / sum, largest),
                        "{ctx}: output[{c}]"
                    );
                }
            }
        }
        (m, l, acc) = (block.max_after, block.sum_after, block.accumulator.clone());
    }
    assert_eq!(next_key, n_k, "{ctx}: the blocks cover every key");
    assert_eq!(t.blocks.len(), n_k.div_ceil(t.block), "{ctx}: block count");
    assert_eq!((t.max, t.sum), (m, l), "{ctx}: final m and l");
    let last_output = t.blocks.last().map_or(vec![0.0; d_v], |b| b.output.clone());
    assert_eq!(t.output, last_output, "{ctx}: final output");
    assert_eq!(t.logsumexp, m.map_or(f64::NEG_INFINITY, |m| m + l.ln()), "{ctx}: final lse");
}

/// Every query of a random problem, in blocks of each size: the trace against the reference
/// (output and logsumexp), the fast path at every level, the merge of its parts and the
/// recurrence.
fn check_tiled<T: Real>(seed: u64, dims: (usize, usize, usize, usize), magnitude: f64, mask: MaskKind) {
    let p = Problem::<T>::random(seed, dims, magnitude, mask);
    let options = p.options();
    let want = qkv::reference::attention(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    let want_lse = qkv::reference::attention_with_lse(p.q.view(), p.k.view(), p.v.view(), &options).unwrap();
    let (weight_bound, output_bound) = error_bound(&want, &p.v);
    let fast: Vec<_> = levels()
        .into_iter()
        .map(|level| {
            (level, qkv::attention(p.q.view(), p.k.view(), p.v.view(), &options.clone().simd(level)).unwrap())
        })
        .collect();
    let v = p.v.mapv(|x| x.to_f64_exact());
    let (n_q, n_k, _, d_v) = dims;
    for i in 0..n_q {
        let whole = qkv::trace_query(p.q.view(), p.k.view(), p.v.view(), i, &options).unwrap();
        for block in [1, 2, 5, 7, n_k + 3] {
            let ctx =
                format!("{} {dims:?} x{magnitude} {mask:?} seed {seed} query {i} block {block}", T::NAME);
            let t =
                qkv::reference::trace_tiled(p.q.view(), p.k.view(), p.v.view(), i, block, &options).unwrap();
            let scores: Vec<f64> = t.blocks.iter().flat_map(|b| b.scores.iter().copied()).collect();
            assert_eq!(scores, whole.scores, "{ctx}: the blocks hold the row's masked scores");
            check_recurrence(&t, &v.view(), &ctx);
            let output = Array2::from_shape_vec((1, d_v), t.output.clone()).unwrap();
            assert_close(
                &format!("output {ctx}"),
                &output,
                &want.output.slice(ndarray::s![i..=i, ..]).to_owned(),
                output_bound,
            );
            let lse = want_lse.logsumexp[i];
            assert!(
                t.logsumexp == lse || (t.logsumexp - lse).abs() <= 1e-12 * weight_bound,
                "lse {ctx}: {} vs {lse}",
                t.logsumexp
            );
            for (level, out) in &fast {
                let got = out.slice(ndarray::s![i..=i, ..]).to_owned();
                assert_close(&format!("fast {level} vs trace {ctx}"), &got, &output, output_bound);
            }
            let mut parts = t.blocks.iter().map(|b| b.partial.clone());
            let empty = qkv::PartialAttention {
                output: Array2::zeros((1, d_v)),
                logsumexp: ndarray::arr1(&[f64::NEG_INFINITY]),
            };
            let first = parts.next().unwrap_or(empty);
            let merged = parts.fold(first, |merged, part| merged.merge(&part).unwrap());
            assert_close(&format!("merged parts {ctx}"), &merged.output, &output, output_bound);
            let m = merged.logsumexp[0];
            assert!(
                m == t.logsumexp || (m - t.logsumexp).abs() <= 1e-12 * weight_bound,
                "merged lse {ctx}: {m} vs {}",
                t.logsumexp
            );
        }
    }
}

#[test]
fn tiled_trace_equals_attention_with_every_mask() {
    // One key; keys not a multiple of the block; d_k != d_v; more queries than keys (bottom-right
    // rows that see nothing); blocks of 1, larger than n_k, and in between.
    for (seed, dims) in [(1, 1, 3, 2), (5, 23, 6, 3), (9, 13, 1, 4), (4, 30, 16, 16)]
        .into_iter()
        .enumerate()
        .map(|(seed, dims)| (seed as u64, dims))
    {
        for mask in MASK_KINDS {
            check_tiled::<f64>(seed, dims, 1.0, mask);
            check_tiled::<f32>(seed, dims, 1.0, mask);
        }
    }
}

#[test]
fn tiled_trace_keeps_huge_scores_finite() {
    // Scores near ±5e3: exp of an unshifted score would overflow, and every new block maximum
    // rescales the running sum by a factor that underflows to 0.
    for mask in MASK_KINDS {
        check_tiled::<f64>(7, (4, 17, 4, 3), 50.0, mask);
        check_tiled::<f32>(8, (4, 17, 4, 3), 50.0, mask);
    }
}

#[test]
fn a_fully_masked_row_traces_to_zero_and_minus_infinity() {
    let k = ndarray::array![[1.0_f64, 0.0], [0.0, 1.0], [1.0, 1.0], [2.0, 0.5], [0.5, 0.5]];
    let v = ndarray::array![[2.0, 1.0], [6.0, 0.0], [4.0, -1.0], [1.0, 1.0], [0.0, 3.0]];
    // Row 0 sees nothing; row 1 sees only key 3, so its first block is hidden.
    let keep = ndarray::array![[false; 5], [false, false, false, true, false]];
    let options = AttentionOptions::new().keep_mask(KeepMask::new(keep.view()));
    let q = k.slice(ndarray::s![..2, ..]);
    let nothing = qkv::reference::trace_tiled(q, k.view(), v.view(), 0, 2, &options).unwrap();
    check_recurrence(&nothing, &v.view(), "fully masked");
    assert_eq!((nothing.max, nothing.sum, nothing.logsumexp), (None, 0.0, f64::NEG_INFINITY));
    assert_eq!(nothing.output, vec![0.0, 0.0]);
    for block in &nothing.blocks {
        assert_eq!((block.block_max, block.max_after, block.rescale), (None, None, 1.0));
        assert!(block.exponentials.iter().chain(&block.accumulator).chain(&block.output).all(|x| *x == 0.0));
        assert_eq!(block.partial.logsumexp[0], f64::NEG_INFINITY);
    }
    let late = qkv::reference::trace_tiled(q, k.view(), v.view(), 1, 2, &options).unwrap();
    check_recurrence(&late, &v.view(), "first block hidden");
    assert_eq!(late.blocks[0].max_after, None);
    assert_eq!(late.blocks[1].rescale, 0.0, "the first visible key: exp(-inf - m)");
    assert_eq!(late.blocks[2].rescale, 1.0, "a hidden block after a visible one leaves m");
    assert_eq!(late.output, vec![1.0, 1.0]);
    // No keys at all: no blocks, the same empty row.
    let none = Array2::<f64>::zeros((0, 2));
    let empty =
        qkv::reference::trace_tiled(q, none.view(), none.view(), 0, 4, &AttentionOptions::new()).unwrap();
    assert!(empty.blocks.is_empty());
    assert_eq!((empty.output, empty.logsumexp), (vec![0.0, 0.0], f64::NEG_INFINITY));
}
