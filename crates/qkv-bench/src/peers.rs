//! The implementations the table compares: qkv (all threads, one thread), the f64 reference, an
//! unfused `ndarray` matmul → softmax → matmul, and with the `peers` feature candle's unfused
//! attention and the `gemm` crate's f32 GEMM (the ceiling); on bf16 cases qkv's
//! `attention_half` (`multi_head_attention_half` over several heads), on KV-cache cases qkv's `KvCache` (and, in f32, `multi_head_attention`
//! over the same tensors), on ragged batches qkv's `PagedKvCache` (and `multi_head_attention`
//! over the padded tensors with key lengths) or `varlen_attention` (and a call per sequence), and
//! on backward cases qkv's `attention_backward`.

use anyhow::Result;
use ndarray::{Array2, Array4, Axis, s};
use qkv::{AttentionOptions, CausalMask};
use rayon::prelude::*;

use crate::cases::{Case, Inputs, Precision};

/// One implementation ready to run on one case (inputs already converted, outside the timing).
pub struct Runner<'a> {
    pub name: String,
    /// `Some(n)` to run in a pool of `n` threads; `None` for the default pool.
    pub threads: Option<usize>,
    pub run: Box<dyn FnMut() -> Result<Array4<f32>> + Send + 'a>,
}

/// Problems whose `n_q × n_k` score matrix would not fit comfortably are left to qkv alone.
const UNFUSED_LIMIT: usize = 16384 * 16384;
/// The scalar reference runs on the small shapes only.
const REFERENCE_LIMIT: usize = 256 * 256;

/// Every implementation that applies to `case`, qkv first (the others are checked against it).
pub fn runners<'a>(case: &Case, inputs: &'a Inputs, quick: bool) -> Result<Vec<Runner<'a>>> {
    let case = *case;
    if case.packed_prefill() {
        return Ok(vec![
            varlen::runner(case, inputs, None),
            varlen::runner(case, inputs, Some(1)),
            Runner {
                name: "qkv multi_head_attention per sequence".into(),
                threads: None,
                run: Box::new(move || varlen::per_sequence(case, inputs)),
            },
        ]);
    }
    if case.ragged {
        return Ok(vec![
            paged::runner(case, inputs, None)?,
            paged::runner(case, inputs, Some(1))?,
            Runner {
                name: "qkv multi_head_attention (key lengths)".into(),
                threads: None,
                run: Box::new(move || paged::padded(case, inputs)),
            },
        ]);
    }
    if case.cache {
        return Ok(match case.precision {
            Precision::F32 => vec![
                kv_cache::runner::<f32>(case, inputs, None, None)?,
                kv_cache::runner::<f32>(case, inputs, Some(1), None)?,
                // LLaMA's embedding: the step's own cost of rotating its queries.
                kv_cache::runner::<f32>(case, inputs, None, Some(qkv::Rotary::new(10_000.0)))?,
                Runner {
                    name: "qkv multi_head_attention".into(),
                    threads: None,
                    run: Box::new(move || qkv_fast(case, inputs)),
                },
            ],
            Precision::Bf16 => vec![
                kv_cache::runner::<half::bf16>(case, inputs, None, None)?,
                kv_cache::runner::<half::bf16>(case, inputs, Some(1), None)?,
                kv_cache::runner::<half::bf16>(case, inputs, None, Some(qkv::Rotary::new(10_000.0)))?,
            ],
            Precision::Int8 => vec![
                kv_cache::runner::<qkv::Q8>(case, inputs, None, None)?,
                kv_cache::runner::<qkv::Q8>(case, inputs, Some(1), None)?,
                kv_cache::runner::<qkv::Q8>(case, inputs, None, Some(qkv::Rotary::new(10_000.0)))?,
            ],
        });
    }
    if case.backward {
        return backward::runners(case, inputs);
    }
    if case.precision == Precision::Bf16 {
        return Ok([None, Some(1)].into_iter().map(|threads| qkv_half(case, inputs, threads)).collect());
    }
    let pairs = case.n_q * case.n_k;
    let mut runners =
        vec![Runner { name: "qkv".into(), threads: None, run: Box::new(move || qkv_fast(case, inputs)) }];
    if pairs <= if quick { 4096 * 4096 } else { UNFUSED_LIMIT } {
        runners.push(Runner {
            name: "qkv".into(),
            threads: Some(1),
            run: Box::new(move || qkv_fast(case, inputs)),
        });
    }
    if pairs <= REFERENCE_LIMIT && case.heads == 1 {
        runners.push(Runner {
            name: "qkv reference (f64)".into(),
            threads: Some(1),
            run: Box::new(move || reference(case, inputs)),
        });
    }
    if pairs <= if quick { 4096 * 4096 } else { UNFUSED_LIMIT } {
        runners.push(Runner {
            name: "ndarray unfused".into(),
            threads: None,
            run: Box::new(move || Ok(ndarray_unfused(case, inputs))),
        });
        #[cfg(feature = "peers")]
        runners.push(candle::runner(case, inputs)?);
    }
    Ok(runners)
}

pub(crate) fn options(case: Case) -> AttentionOptions<'static, f32> {
    let options = AttentionOptions::new();
    if case.causal { options.causal(CausalMask::BottomRight) } else { options }
}

/// The public API as an embedder calls it.
fn qkv_fast(case: Case, inputs: &Inputs) -> Result<Array4<f32>> {
    let Inputs { q, k, v } = inputs;
    if case.batch * case.heads == 1 {
        let out = qkv::attention(
            q.slice(s![0, 0, .., ..]),
            k.slice(s![0, 0, .., ..]),
            v.slice(s![0, 0, .., ..]),
            &options(case),
        )?;
        return Ok(out.insert_axis(Axis(0)).insert_axis(Axis(0)));
    }
    Ok(qkv::multi_head_attention(q.view(), k.view(), v.view(), &options(case))?)
}

/// `attention_half` on one head of bf16 inputs, `multi_head_attention_half` on several (rounded
/// from the f32 ones outside the timing).
fn qkv_half(case: Case, inputs: &Inputs, threads: Option<usize>) -> Runner<'static> {
    let bf16 = |a: &Array4<f32>| a.mapv(half::bf16::from_f32);
    let (q, k, v) = (bf16(&inputs.q), bf16(&inputs.k), bf16(&inputs.v));
    if case.batch * case.heads == 1 {
        let run = move || {
            let one = s![0, 0, .., ..];
            let out = qkv::attention_half(q.slice(one), k.slice(one), v.slice(one), &options(case))?;
            Ok(out.insert_axis(Axis(0)).insert_axis(Axis(0)))
        };
        return Runner { name: "qkv attention_half<bf16>".into(), threads, run: Box::new(run) };
    }
    let run = move || Ok(qkv::multi_head_attention_half(q.view(), k.view(), v.view(), &options(case))?);
    Runner { name: "qkv multi_head_attention_half<bf16>".into(), threads, run: Box::new(run) }
}

fn reference(case: Case, inputs: &Inputs) -> Result<Array4<f32>> {
    let Inputs { q, k, v } = inputs;
    let r = qkv::reference::attention(
        q.slice(s![0, 0, .., ..]),
        k.slice(s![0, 0, .., ..]),
        v.slice(s![0, 0, .., ..]),
        &options(case),
    )?;
    Ok(r.output.mapv(|x| x as f32).insert_axis(Axis(0)).insert_axis(Axis(0)))
}

/// The textbook three steps with `ndarray` (its `matrixmultiply` GEMM), the queries cut into
/// blocks of 256 rows that run in parallel.
fn ndarray_unfused(case: Case, inputs: &Inputs) -> Array4<f32> {
    const ROWS: usize = 256;
    let Inputs { q, k, v } = inputs;
    let group = case.heads / case.kv_heads;
    let scale = 1.0 / (case.d as f32).sqrt();
    let tasks: Vec<(usize, usize, usize)> = (0..case.batch)
        .flat_map(|b| (0..case.heads).flat_map(move |h| (0..case.n_q).step_by(ROWS).map(move |r| (b, h, r))))
        .collect();
    let blocks: Vec<Array2<f32>> = tasks
        .par_iter()
        .map(|&(b, h, r0)| {
            let r1 = (r0 + ROWS).min(case.n_q);
            let kv = h / group;
            let (qb, kb, vb) =
                (q.slice(s![b, h, r0..r1, ..]), k.slice(s![b, kv, .., ..]), v.slice(s![b, kv, .., ..]));
            let mut scores = qb.dot(&kb.t()) * scale;
            for (i, mut row) in scores.axis_iter_mut(Axis(0)).enumerate() {
                let visible = if case.causal { r0 + i + 1 + case.n_k - case.n_q } else { case.n_k };
                row.slice_mut(s![visible.min(case.n_k)..]).fill(f32::NEG_INFINITY);
                let max = row.fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                row.mapv_inplace(|x| (x - max).exp());
                let sum = row.sum();
                row /= sum;
            }
            scores.dot(&vb)
        })
        .collect();
    let mut out = Array4::zeros((case.batch, case.heads, case.n_q, case.d));
    for (&(b, h, r0), block) in tasks.iter().zip(&blocks) {
        out.slice_mut(s![b, h, r0..r0 + block.nrows(), ..]).assign(block);
    }
    out
}

/// The machine's f32 GEMM rate, measured with the `gemm` crate.
pub struct Ceiling {
    pub label: String,
    pub gflops: f64,
    pub median_ms: f64,
}

/// Times a square f32 GEMM on all threads (`None` without the `peers` feature).
pub fn gemm_ceiling(quick: bool) -> Option<Ceiling> {
    #[cfg(feature = "peers")]
    {
        Some(ceiling::measure(quick))
    }
    #[cfg(not(feature = "peers"))]
    {
        let _ = quick;
        None
    }
}

#[cfg(feature = "peers")]
mod ceiling;

mod backward;
mod kv_cache;
mod paged;
mod varlen;

#[cfg(feature = "peers")]
mod candle;
