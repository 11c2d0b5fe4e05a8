//! qkv's `KvCache` on a decoding step: the cache is filled with the case's keys and values
//! outside the timing (as the steps before it would have), and each timed run attends with one
//! query per query head, as a decoder layer does for every new token.

use anyhow::{Result, ensure};
use ndarray::{Array3, ArrayView3, Axis};
use qkv::{CacheShape, KvCache, Storage};

use super::Runner;
use crate::cases::{Case, Inputs};

/// A filled cache of `E` for `case` (batch 1), its step run in a pool of `threads`.
pub fn runner<E: Storage>(case: Case, inputs: &Inputs, threads: Option<usize>) -> Result<Runner<'static>> {
    ensure!(case.batch == 1, "a KV cache holds one sequence: {} has a batch of {}", case.label(), case.batch);
    let shape = CacheShape::new(1, case.kv_heads, case.n_k, case.d, case.d);
    let mut cache = KvCache::<E>::new(shape)?;
    let stored = |a: ArrayView3<f32>| -> Array3<E> { a.mapv(E::from_f32) };
    let first = |a: &ndarray::Array4<f32>| stored(a.index_axis(Axis(0), 0));
    cache.layer(0)?.append(first(&inputs.k).view(), first(&inputs.v).view())?;
    let q = first(&inputs.q);
    let run = move || Ok(cache.layer(0)?.attend(q.view())?.insert_axis(Axis(0)));
    Ok(Runner { name: format!("qkv KvCache<{}>", E::NAME), threads, run: Box::new(run) })
}
