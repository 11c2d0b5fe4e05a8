//! qkv's `KvCache` on a decoding step: the cache is filled with the case's keys and values
//! outside the timing (as the steps before it would have), and each timed run attends with one
//! query per query head, as a decoder layer does for every new token. With a rotary embedding
//! the keys were rotated as they were appended and each step rotates its queries; the case's
//! keys and queries are turned back by their positions first, so that the cache's rotation
//! restores them and its output can be checked against the other rows like any peer's.

use anyhow::{Result, ensure};
use ndarray::{Array3, ArrayView3, Axis};
use qkv::{CacheShape, CacheStorage, KvCache, Rotary, Storage};

use super::Runner;
use crate::cases::{Case, Inputs};

/// A filled cache of `E` for `case` (batch 1; appended as `E::Appended`, f32 for int8), with `rotary` if given, its step run in a pool of
/// `threads`.
pub fn runner<E: CacheStorage>(
    case: Case,
    inputs: &Inputs,
    threads: Option<usize>,
    rotary: Option<Rotary>,
) -> Result<Runner<'static>> {
    ensure!(case.batch == 1, "a KV cache holds one sequence: {} has a batch of {}", case.label(), case.batch);
    let shape = CacheShape::new(1, case.kv_heads, case.n_k, case.d, case.d);
    let mut cache = KvCache::<E>::new(shape)?;
    if let Some(rotary) = rotary {
        cache = cache.with_rotary(rotary)?;
    }
    // Keys at positions 0 .. n_k, the query at the last of them.
    let stored = |a: ArrayView3<f32>, position: usize| -> Result<Array3<E::Appended>> {
        let mut a = a.to_owned();
        if let Some(rotary) = rotary {
            for head in a.outer_iter_mut() {
                rotary.rotate_back(head, position)?;
            }
        }
        Ok(a.mapv(E::Appended::from_f32))
    };
    let first = |a: &ndarray::Array4<f32>, position| stored(a.index_axis(Axis(0), 0), position);
    // Values are never rotated.
    let values = inputs.v.index_axis(Axis(0), 0).mapv(E::Appended::from_f32);
    cache.layer(0)?.append(first(&inputs.k, 0)?.view(), values.view())?;
    let q = first(&inputs.q, case.n_k - case.n_q)?;
    let run = move || Ok(cache.layer(0)?.attend(q.view())?.insert_axis(Axis(0)));
    let rope = if rotary.is_some() { " + RoPE" } else { "" };
    Ok(Runner { name: format!("qkv KvCache<{}>{rope}", E::NAME), threads, run: Box::new(run) })
}
