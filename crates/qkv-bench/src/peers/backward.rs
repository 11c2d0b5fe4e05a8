//! qkv's backward on a backward case: `attention_backward` from the forward's output and
//! logsumexp, both computed before the timing, as PyTorch's row times `out.backward(d_out)` alone.

use anyhow::Result;
use ndarray::{Array2, Axis, s};

use super::{Runner, options};
use crate::cases::{Case, Inputs};

/// qkv's backward on all threads and on one (the gradient of the queries is what the table
/// checks; both rows compute the same).
pub fn runners(case: Case, inputs: &Inputs) -> Result<Vec<Runner<'_>>> {
    let (q, k, v) = (
        inputs.q.slice(s![0, 0, .., ..]),
        inputs.k.slice(s![0, 0, .., ..]),
        inputs.v.slice(s![0, 0, .., ..]),
    );
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
