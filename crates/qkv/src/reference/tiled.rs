//! The tiled online softmax of one query, traced block by block in f64: what FlashAttention does
//! to a row of scores, with every intermediate a lesson cites.
//!
//! The keys are taken in blocks of `block` keys. A running maximum `m`, a running sum
//! `l = Σ exp(s_j - m)` and an unnormalised output `acc = Σ exp(s_j - m) · v_j` carry over from
//! block to block; when a block raises `m`, the old `l` and `acc` are multiplied by
//! `exp(m_old - m_new)` so that every term is relative to the new maximum. One division,
//! `acc / l`, gives the output at the end. This is the reference's own arithmetic, not the fast
//! path's: tests check that its output equals [`attention`](super::attention).

use std::ops::Range;

use ndarray::{Array1, Array2, ArrayView2};

use super::{check_query, largest_visible, row_scores};
use crate::element::Real;
use crate::error::AttentionError;
use crate::options::AttentionOptions;
use crate::partial::PartialAttention;
use crate::softmax;

/// The online softmax of one query over its keys in blocks (see [`trace_tiled`]).
#[derive(Debug, Clone, PartialEq)]
pub struct TiledTrace {
    /// Keys per block (the last block may hold fewer).
    pub block: usize,
    /// The multiplier applied to every dot product (`1 / sqrt(d_k)` unless overridden).
    pub scale: f64,
    /// One entry per block of keys, in key order.
    pub blocks: Vec<TiledBlock>,
    /// The final running maximum `m`: the largest visible score, `None` if every key is hidden.
    pub max: Option<f64>,
    /// The final running sum `l = Σ_j exp(s_j - m)` (`0` if every key is hidden).
    pub sum: f64,
    /// The output `acc / l`, the one division at the end; zero if every key is hidden. Equal to
    /// the last block's `output`, unless the options carry an attention sink
    /// ([`AttentionOptions::sinks`]): the blocks, their outputs and parts, `max` and `sum` are
    /// over the keys alone, and the sink joins the row here, once, after the last block.
    pub output: Vec<f64>,
    /// The row's logsumexp `m + ln l`, in the scaled-score domain; `-inf` if every key is hidden.
    /// With a sink, the sink's term is included.
    pub logsumexp: f64,
}

/// One block of keys in a [`TiledTrace`]: the state of the online softmax before and after it.
///
/// A block whose keys are all hidden changes nothing: `block_max` is `None`, `max_after` equals
/// `max_before`, `rescale` is 1, the sum and accumulator stay as they were, and `partial` is the
/// empty part (zero output, logsumexp `-inf`).
#[derive(Debug, Clone, PartialEq)]
pub struct TiledBlock {
    /// The keys of this block, `start..end` in the whole key sequence.
    pub keys: Range<usize>,
    /// The block's scaled scores, bias included; `-inf` where a key is hidden from the query.
    pub scores: Vec<f64>,
    /// The largest visible score in the block; `None` if the block hides every key.
    pub block_max: Option<f64>,
    /// The running maximum `m` before the block; `None` (that is, `-inf`) before any visible key.
    pub max_before: Option<f64>,
    /// The running maximum after it: `max(m_before, block_max)`.
    pub max_after: Option<f64>,
    /// `exp(m_before - m_after)`, by which the sum and accumulator carried in are multiplied:
    /// 1 when the block leaves `m` unchanged (a block with no visible key included, even before
    /// any key was seen), 0 at the first block with a visible key (`exp(-inf)`, multiplying a sum
    /// and accumulator that are still zero).
    pub rescale: f64,
    /// `exp(s_j - m_after)` for each key of the block; `0` where hidden.
    pub exponentials: Vec<f64>,
    /// The running sum `l` before the block.
    pub sum_before: f64,
    /// `l_after = rescale · l_before + Σ_j exponentials[j]`.
    pub sum_after: f64,
    /// The unnormalised output after the block, `rescale · acc_before + Σ_j exponentials[j] · v_j`.
    pub accumulator: Vec<f64>,
    /// The output over the keys so far, `accumulator / sum_after` (zero while no key is visible):
    /// what stopping after this block would give.
    pub output: Vec<f64>,
    /// Attention over this block's keys alone (`[1, d_v]` output, `[1]` logsumexp): merging the
    /// blocks' parts with [`PartialAttention::merge`] gives the whole row.
    pub partial: PartialAttention<f64>,
}

/// The online softmax's state after some keys: running maximum `m` (`None` for `-inf`), running
/// sum `l` and the unnormalised output.
#[derive(Debug, Clone)]
struct Online {
    max: Option<f64>,
    sum: f64,
    accumulator: Vec<f64>,
}

impl Online {
    /// The state before any key.
    fn empty(value_dim: usize) -> Online {
        Online { max: None, sum: 0.0, accumulator: vec![0.0; value_dim] }
    }

    /// The state after also taking the keys whose scores are `scores` and values `values`, with
    /// the rescale factor and the block's exponentials: one step of the recurrence.
    fn absorb<T: Real>(&self, scores: &[f64], values: ArrayView2<T>) -> (Online, f64, Vec<f64>) {
        let max = match (self.max, largest_visible(scores)) {
            (Some(old), Some(new)) => Some(old.max(new)),
            (old, new) => old.or(new),
        };
        // While nothing is visible m stays -inf, and exp(-inf - -inf) would be NaN: the state is
        // left as it is instead. exp(-inf - m) = 0 at the first visible key is the formula's own.
        let rescale = max.map_or(1.0, |new| (self.max.unwrap_or(f64::NEG_INFINITY) - new).exp());
        let exponentials: Vec<f64> = scores.iter().map(|s| max.map_or(0.0, |m| (s - m).exp())).collect();
        let sum = rescale * self.sum + exponentials.iter().sum::<f64>();
        let accumulator = (0..self.accumulator.len())
            .map(|c| {
                let block: f64 =
                    exponentials.iter().zip(values.rows()).map(|(e, v)| e * v[c].to_f64_exact()).sum();
                rescale * self.accumulator[c] + block
            })
            .collect();
        (Online { max, sum, accumulator }, rescale, exponentials)
    }

    /// The state finished with the attention sink `sink` (see `softmax::finish`).
    fn finished(&self, sink: Option<f64>) -> softmax::Finished<f64> {
        softmax::finish(self.max.unwrap_or(f64::NEG_INFINITY), self.sum, sink)
    }

    /// `acc / l`, or zeros while no key is visible (`l = 0` exactly then: a visible key adds
    /// `exp(0) = 1` for the maximum); with the sink `sink` joining the row.
    fn output(&self, sink: Option<f64>) -> Vec<f64> {
        let finished = self.finished(sink);
        self.accumulator.iter().map(|&a| finished.output(a)).collect()
    }
}

/// The tiled online softmax of query `query_idx`, traced block by block: its scores taken in
/// blocks of `block` keys (the last block holds the rest), with each block's maximum, the running
/// maximum `m` and sum `l` before and after it, the rescale factor, the accumulator and output so
/// far, and the block's own [`PartialAttention`].
///
/// Takes the whole `q`, as [`trace_query`](crate::trace_query) does, so that every mask (causal,
/// window, keep-mask, padding, key lengths, bias, ALiBi) applies to the query exactly as it does
/// inside [`attention`](fn@crate::attention) over all of `q`: where a query stands among the keys,
/// and which row of a mask or bias is its own, depend on its index among the queries. Accepts
/// `f32` or `f64` inputs and computes in f64. The final `output` and `logsumexp` equal
/// [`attention_with_lse`](super::attention_with_lse)'s row `query_idx` up to rounding. Fails if
/// `block` is 0, as well as wherever `trace_query` fails.
///
/// ```
/// use qkv::ndarray::array;
/// // "I love NLP": the query of "love" over three keys, in blocks of two.
/// let k = array![[1.0_f64, 0.0], [0.0, 1.0], [1.0, 1.0]];
/// let v = array![[2.0], [6.0], [4.0]];
/// let love = array![[0.0, 1.0]];
/// let t = qkv::reference::trace_tiled(love.view(), k.view(), v.view(), 0, 2, &qkv::AttentionOptions::new())?;
/// let [first, second] = &t.blocks[..] else { panic!("two blocks") };
/// assert_eq!((first.keys.clone(), second.keys.clone()), (0..2, 2..3));
/// assert_eq!(first.rescale, 0.0); // exp(-inf - m): nothing was carried in
/// assert!((first.sum_after - 1.4931).abs() < 1e-4); // exp(0 - 0.7071) + exp(0)
/// assert!((first.output[0] - 4.6790).abs() < 1e-4); // the output over I and love
/// assert_eq!(second.rescale, 1.0); // NLP's score 0.7071 does not raise m
/// assert!((t.output[0] - 4.4067).abs() < 1e-4); // what one pass gives
/// let merged = first.partial.clone().merge(&second.partial)?;
/// assert!((merged.output[[0, 0]] - t.output[0]).abs() < 1e-12);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn trace_tiled<T: Real>(
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    query_idx: usize,
    block: usize,
    options: &AttentionOptions<T>,
) -> Result<TiledTrace, AttentionError> {
    if block == 0 {
        return Err(AttentionError::Zero {
            argument: "block",
            why: "the tiled trace takes the keys in blocks of at least one key",
        });
    }
    let (masks, checked) = check_query(&q, k, v, query_idx, options)?;
    let (k, v) = (checked.k.view(), checked.v.view());
    let (_, _, scores) = row_scores(&q, &k, query_idx, &masks);
    let mut state = Online::empty(v.ncols());
    let mut blocks = Vec::with_capacity(scores.len().div_ceil(block));
    for start in (0..scores.len()).step_by(block) {
        let keys = start..(start + block).min(scores.len());
        let (block_scores, block_values) = (&scores[keys.clone()], v.slice(ndarray::s![keys.clone(), ..]));
        let (after, rescale, exponentials) = state.absorb(block_scores, block_values);
        let own = Online::empty(v.ncols()).absorb(block_scores, block_values).0;
        blocks.push(TiledBlock {
            keys,
            scores: block_scores.to_vec(),
            block_max: largest_visible(block_scores),
            max_before: state.max,
            max_after: after.max,
            rescale,
            exponentials,
            sum_before: state.sum,
            sum_after: after.sum,
            accumulator: after.accumulator.clone(),
            output: after.output(None),
            partial: PartialAttention {
                output: Array2::from_shape_vec((1, v.ncols()), own.output(None)).expect("one row of d_v"),
                logsumexp: Array1::from_elem(1, own.finished(None).logsumexp()),
            },
        });
        state = after;
    }
    // The attention sink joins the row once, after the last block.
    let sink = masks.sink(0).map(|s| s.to_f64_exact());
    Ok(TiledTrace {
        block,
        scale: masks.scale,
        blocks,
        max: state.max,
        sum: state.sum,
        output: state.output(sink),
        logsumexp: state.finished(sink).logsumexp(),
    })
}
