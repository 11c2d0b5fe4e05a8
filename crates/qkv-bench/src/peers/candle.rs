//! candle's unfused attention: `softmax(Q·Kᵀ · scale + mask) · V` as four tensor operations, on
//! candle's CPU backend (its matmul is the `gemm` crate, with `x86-v4` enabled in this build).

use anyhow::Result;
use candle_core::{D, Device, Tensor};
use ndarray::Array4;

use super::Runner;
use crate::cases::{Case, Inputs};

pub fn runner<'a>(case: Case, inputs: &'a Inputs) -> Result<Runner<'a>> {
    let dev = Device::Cpu;
    let tensor = |a: &Array4<f32>| -> Result<Tensor> {
        let shape = a.shape().to_vec();
        let t = Tensor::from_slice(a.as_slice().expect("standard layout"), shape.as_slice(), &dev)?;
        Ok(t)
    };
    let group = case.heads / case.kv_heads;
    // GQA: candle has no shared-head matmul, so each key/value head is repeated for its group
    // of query heads here, outside the timing.
    let expand = |t: Tensor| -> Result<Tensor> {
        if group == 1 {
            return Ok(t);
        }
        let (b, kv, n, d) = t.dims4()?;
        Ok(t.unsqueeze(2)?.expand((b, kv, group, n, d))?.reshape((b, kv * group, n, d))?)
    };
    let q = tensor(&inputs.q)?;
    let k = expand(tensor(&inputs.k)?)?;
    let v = expand(tensor(&inputs.v)?)?;
    let mask = if case.causal {
        let offset = case.n_k - case.n_q;
        let m: Vec<f32> = (0..case.n_q * case.n_k)
            .map(|x| if x % case.n_k > x / case.n_k + offset { f32::NEG_INFINITY } else { 0.0 })
            .collect();
        Some(Tensor::from_vec(m, (case.n_q, case.n_k), &dev)?)
    } else {
        None
    };
    let scale = 1.0 / (case.d as f64).sqrt();
    let run = move || -> Result<Array4<f32>> {
        let mut scores = (q.matmul(&k.t()?)? * scale)?;
        if let Some(mask) = &mask {
            scores = scores.broadcast_add(mask)?;
        }
        let max = scores.max_keepdim(D::Minus1)?;
        let e = scores.broadcast_sub(&max)?.exp()?;
        let sum = e.sum_keepdim(D::Minus1)?;
        let out = e.broadcast_div(&sum)?.matmul(&v)?;
        let shape = out.dims4()?;
        Ok(Array4::from_shape_vec(shape, out.flatten_all()?.to_vec1::<f32>()?)?)
    };
    Ok(Runner { name: "candle unfused".into(), threads: None, run: Box::new(run) })
}
