//! qkv's `varlen_attention` on a packed prefill of sequences of different lengths, beside a call
//! of `multi_head_attention` per sequence: the ragged case's sequence `b` holds the first
//! `lengths[b]` positions of batch element `b` of the padded inputs, as its queries and its keys.
//! Both return the padded output, zero past each sequence's length, for the table's check.

use anyhow::Result;
use ndarray::{Array3, Array4, Axis, concatenate, s};

use super::{Runner, options};
use crate::cases::{Case, Inputs};

/// The packed `[heads, total, d]` tensor of each sequence's first positions of `padded`.
fn packed(padded: &Array4<f32>, lengths: &[usize]) -> Array3<f32> {
    let parts: Vec<_> =
        lengths.iter().enumerate().map(|(b, &len)| padded.slice(s![b, .., ..len, ..])).collect();
    concatenate(Axis(1), &parts).expect("the sequences share heads and width")
}

/// `varlen_attention` over the packed sequences (packed outside the timing), in a pool of
/// `threads`.
pub fn runner(case: Case, inputs: &Inputs, threads: Option<usize>) -> Runner<'static> {
    let lengths = case.lengths();
    let (q, k, v) = (packed(&inputs.q, &lengths), packed(&inputs.k, &lengths), packed(&inputs.v, &lengths));
    let mut offsets = vec![0];
    for len in &lengths {
        offsets.push(offsets.last().expect("starts at 0") + len);
    }
    let run = move || {
        let out = qkv::varlen_attention(q.view(), k.view(), v.view(), &offsets, &offsets, &options(case))?;
        let mut padded = Array4::zeros((case.batch, case.heads, case.n_q, case.d));
        for (b, w) in offsets.windows(2).enumerate() {
            padded.slice_mut(s![b, .., ..w[1] - w[0], ..]).assign(&out.slice(s![.., w[0]..w[1], ..]));
        }
        Ok(padded)
    };
    Runner { name: "qkv varlen_attention".into(), threads, run: Box::new(run) }
}

/// `multi_head_attention` on each sequence's slice of the padded inputs.
pub fn per_sequence(case: Case, inputs: &Inputs) -> Result<Array4<f32>> {
    let mut padded = Array4::zeros((case.batch, case.heads, case.n_q, case.d));
    for (b, len) in case.lengths().into_iter().enumerate() {
        let one = s![b..b + 1, .., ..len, ..];
        let (q, k, v) = (inputs.q.slice(one), inputs.k.slice(one), inputs.v.slice(one));
        padded.slice_mut(one).assign(&qkv::multi_head_attention(q, k, v, &options(case))?);
    }
    Ok(padded)
}
