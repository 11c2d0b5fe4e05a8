//! qkv's `PagedKvCache` on a batched decoding step over sequences of different lengths: each
//! sequence's keys and values are appended outside the timing (as the steps before it would
//! have), and each timed run attends with one query per query head of every sequence in one call.

use anyhow::Result;
use ndarray::{Array4, Axis, s};
use qkv::{AttentionOptions, PagedKvCache, PagedShape, SequenceId, SimdLevel};

use super::Runner;
use crate::cases::{Case, Inputs};

/// Positions per block: a whole number of every level's key panel.
const BLOCK_SIZE: usize = 64;

/// A filled paged cache for `case`'s ragged batch, its step run in a pool of `threads`.
pub fn runner(case: Case, inputs: &Inputs, threads: Option<usize>) -> Result<Runner<'static>> {
    let lengths = case.lengths();
    let block_size =
        BLOCK_SIZE.next_multiple_of(PagedKvCache::<f32>::block_granularity(SimdLevel::dispatched()?)?);
    let blocks = lengths.iter().map(|len| len.div_ceil(block_size)).sum();
    let shape = PagedShape::new(1, case.kv_heads, case.d, case.d, block_size, blocks);
    let mut cache = PagedKvCache::<f32>::new(shape)?;
    let mut sequences: Vec<SequenceId> = Vec::new();
    for (b, &len) in lengths.iter().enumerate() {
        let seq = cache.add_sequence();
        let keys = s![b, .., ..len, ..];
        cache.layer(0)?.append(seq, inputs.k.slice(keys), inputs.v.slice(keys))?;
        sequences.push(seq);
    }
    // One query per query head of each sequence, packed along axis 1: `[heads, batch, d]`.
    let q = inputs.q.index_axis(Axis(2), 0).permuted_axes([1, 0, 2]).to_owned();
    let offsets: Vec<usize> = (0..=case.batch).collect();
    let run = move || {
        let out = cache.layer(0)?.attend(&sequences, &offsets, q.view())?;
        Ok(out.permuted_axes([1, 0, 2]).insert_axis(Axis(2)).as_standard_layout().into_owned())
    };
    Ok(Runner { name: "qkv PagedKvCache<f32>".into(), threads, run: Box::new(run) })
}

/// `multi_head_attention` over the padded batch, each sequence's keys past its length hidden.
pub fn padded(case: Case, inputs: &Inputs) -> Result<Array4<f32>> {
    let lengths = case.lengths();
    let options = AttentionOptions::new().key_lengths(&lengths);
    Ok(qkv::multi_head_attention(inputs.q.view(), inputs.k.view(), inputs.v.view(), &options)?)
}
