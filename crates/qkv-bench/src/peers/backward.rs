//! qkv's backward on a backward case: `attention_backward` (`attention_backward_half` on a bf16
//! case) from the forward's output and logsumexp, both computed before the timing, as PyTorch's
//! row times `out.backward(d_out)` alone.

use anyhow::Result;
use ndarray::{Array2, ArrayView2, Axis, s};
use qkv::half::bf16;

use super::{Runner, options};
use crate::cases::{Case, Inputs, Precision};

/// qkv's backward on all threads and on one (the gradient of the queries is what the table
/// checks; both rows compute the same): of f32 inputs, or of bf16 ones (rounded from the f32
/// inputs outside the timing) on a bf16 case.
pub fn runners(case: Case, inputs: &Inputs) -> Result<Vec<Runner<'_>>> {
    let (q, k, v) = (
        inputs.q.slice(s![0, 0, .., ..]),
        inputs.k.slice(s![0, 0, .., ..]),
        inputs.v.slice(s![0, 0, .., ..]),
    );
    if case.precision == Precision::Bf16 {
        return half_runners(case, q, k, v);
    }
    let forward = qkv::attention_with_lse(q, k, v, &options(case))?;
    // The output's gradient: the values again, a fixed and varied matrix of the right shape.
    let d_output: Array2<f32> = v.slice(s![..case.n_q, ..]).to_owned();
    let forward = std::sync::Arc::new((forward, d_output));
    let runner = |threads| {
        let forward = forward.clone();
        let run = move || {
            let (forward, d_output) = &*forward;
            let g = qkv::attention_backward(q, k, v, forward, d_output.view(), &options(case))?;
            Ok(g.dq.insert_axis(Axis(0)).insert_axis(Axis(0)))
        };
        Runner { name: "qkv attention_backward".into(), threads, run: Box::new(run) }
    };
    Ok(vec![runner(None), runner(Some(1))])
}

/// [`runners`] on bf16 inputs: `attention_backward_half` from `attention_half_with_lse`.
fn half_runners<'a>(
    case: Case,
    q: ArrayView2<'a, f32>,
    k: ArrayView2<'a, f32>,
    v: ArrayView2<'a, f32>,
) -> Result<Vec<Runner<'a>>> {
    let bf16 = |a: ArrayView2<f32>| a.mapv(bf16::from_f32);
    let (q, k, v) = (bf16(q), bf16(k), bf16(v));
    let forward = qkv::attention_half_with_lse(q.view(), k.view(), v.view(), &options(case))?;
    let d_output = v.slice(s![..case.n_q, ..]).to_owned();
    let operands = std::sync::Arc::new((q, k, v, forward, d_output));
    let runner = |threads| {
        let operands = operands.clone();
        let run = move || {
            let (q, k, v, forward, d_output) = &*operands;
            let (q, k, v, d_output) = (q.view(), k.view(), v.view(), d_output.view());
            let g = qkv::attention_backward_half(q, k, v, forward, d_output, &options(case))?;
            Ok(g.dq.insert_axis(Axis(0)).insert_axis(Axis(0)))
        };
        Runner { name: "qkv attention_backward_half<bf16>".into(), threads, run: Box::new(run) }
    };
    Ok(vec![runner(None), runner(Some(1))])
}
