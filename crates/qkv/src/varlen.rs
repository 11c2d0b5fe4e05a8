//! Attention over a packed batch of sequences of different lengths, with no padding: flash-attn's
//! `flash_attn_varlen_func` (its `cu_seqlens_q`/`cu_seqlens_k` are the offsets here). Every
//! sequence's queries attend to its own keys only. Sequences of a few queries (decoding steps)
//! share one call of the step the caches take ([`step::attend`]), whose work items span every
//! such sequence and head; a longer one (a prefill) runs alone through the dense path.

use std::ops::Range;

use ndarray::{Array2, Array3, ArrayView3, ArrayViewMut2, ArrayViewMut3, Axis, Ix3, s};

use crate::element::Real;
use crate::error::AttentionError;
use crate::finite::finite_magnitude;
use crate::flash::{self, StoredKeys};
use crate::inputs::{check_heads, check_offsets, check_output_shape};
use crate::kernels::{Element, Job, Kernels};
use crate::masking::MaskSet;
use crate::multi_head;
use crate::options::AttentionOptions;
use crate::partial::PartialAttention;
use crate::shape::{Magnitudes, Shape};
use crate::simd;
use crate::softmax;
use crate::step::{self, Step, StepBuffers};

/// Attention for a packed batch of sequences: sequence `i`'s queries are rows
/// `query_offsets[i]..query_offsets[i + 1]` of `q` (`[query_heads, total_queries, d_k]`), its keys
/// and values rows `key_offsets[i]..key_offsets[i + 1]` of `k` (`[kv_heads, total_keys, d_k]`)
/// and `v` (`[kv_heads, total_keys, d_v]`). Returns `[query_heads, total_queries, d_v]`. Query
/// head `h` reads key/value head `h / (query_heads / kv_heads)`, as in
/// [`multi_head_attention`](crate::multi_head_attention).
///
/// The offsets are flash-attn's `cu_seqlens`: one per sequence and one for the end, from 0 to
/// the packed length, never decreasing. The options apply to every sequence over its own
/// queries and keys (a causal mask aligned within each sequence, a sliding window, a scale, a
/// cap, [`Alibi`](crate::Alibi) slopes per query head or per sequence and head); masks given as
/// matrices over dense keys (a keep mask, a bias, key padding, key lengths) are refused, since
/// the sequences' lengths differ. Every element must be finite: a packed batch has no padding
/// for a non-finite value to hide in. A query of a sequence with no keys sees nothing: its row
/// is 0.
///
/// ```
/// use ndarray::Array3;
/// use qkv::{AttentionOptions, CausalMask};
/// // Two sequences of 3 and 5 tokens, 4 query heads sharing 2 key/value heads, width 8.
/// let q = Array3::<f32>::from_elem((4, 8, 8), 0.1);
/// let kv = Array3::<f32>::from_elem((2, 8, 8), 0.2);
/// let offsets = [0, 3, 8];
/// let options = AttentionOptions::new().causal(CausalMask::BottomRight);
/// let out = qkv::varlen_attention(q.view(), kv.view(), kv.view(), &offsets, &offsets, &options)?;
/// assert_eq!(out.shape(), [4, 8, 8]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn varlen_attention<T: Real>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    query_offsets: &[usize],
    key_offsets: &[usize],
    options: &AttentionOptions<T>,
) -> Result<Array3<T>, AttentionError> {
    let (output, _) = packed(Batch { q, k, v, query_offsets, key_offsets }, options, false)?;
    Ok(output)
}

/// Like [`varlen_attention`], into `out` (`[query_heads, total_queries, d_v]`, any strides, such
/// as a `[total_queries, query_heads, d_v]` buffer with its first two axes swapped: flash-attn's
/// layout), which may hold anything: every row is written.
///
/// ```
/// use ndarray::{Array3, Axis};
/// let q = Array3::<f32>::zeros((2, 4, 8));
/// let kv = Array3::<f32>::ones((1, 6, 8));
/// // flash-attn's layout, [total, heads, d], written through a view of it as [heads, total, d].
/// let mut out = Array3::<f32>::from_elem((4, 2, 8), f32::NAN);
/// let options = qkv::AttentionOptions::new();
/// let view = out.view_mut().permuted_axes([1, 0, 2]);
/// qkv::varlen_attention_into(q.view(), kv.view(), kv.view(), &[0, 1, 4], &[0, 2, 6], &options, view)?;
/// assert!(out.iter().all(|&x| x == 1.0));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn varlen_attention_into<T: Real>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    query_offsets: &[usize],
    key_offsets: &[usize],
    options: &AttentionOptions<T>,
    out: ArrayViewMut3<T>,
) -> Result<(), AttentionError> {
    let batch = Batch { q, k, v, query_offsets, key_offsets };
    let shape = check(&batch, options)?;
    check_output_shape(&[q.shape()[0], shape.n_queries, shape.value_dim], out.shape())?;
    attend(&shape, &batch, options, out, None)
}

/// Like [`varlen_attention`], also returning each row's logsumexp (`[query_heads,
/// total_queries]`, `-inf` for a row that sees no key), so that attention over other keys of
/// the same sequences can be [merged](PartialAttention::merge) in.
///
/// ```
/// let q = ndarray::Array3::<f64>::zeros((1, 3, 2));
/// let kv = ndarray::Array3::<f64>::zeros((1, 5, 2));
/// // One query over 1 key, two queries over 4.
/// let options = qkv::AttentionOptions::new();
/// let r = qkv::varlen_attention_with_lse(q.view(), kv.view(), kv.view(), &[0, 1, 3], &[0, 1, 5], &options)?;
/// assert_eq!(r.logsumexp.row(0).to_vec(), [0.0, 4f64.ln(), 4f64.ln()]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn varlen_attention_with_lse<T: Real>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    query_offsets: &[usize],
    key_offsets: &[usize],
    options: &AttentionOptions<T>,
) -> Result<PartialAttention<T, Ix3>, AttentionError> {
    let (output, logsumexp) = packed(Batch { q, k, v, query_offsets, key_offsets }, options, true)?;
    Ok(PartialAttention { output, logsumexp: logsumexp.expect("asked for") })
}

/// The tensors and offsets of a packed call.
struct Batch<'a, T> {
    q: ArrayView3<'a, T>,
    k: ArrayView3<'a, T>,
    v: ArrayView3<'a, T>,
    query_offsets: &'a [usize],
    key_offsets: &'a [usize],
}

/// The output of a packed call, and with `with_lse` its logsumexp.
fn packed<T: Real>(
    batch: Batch<'_, T>,
    options: &AttentionOptions<T>,
    with_lse: bool,
) -> Result<(Array3<T>, Option<Array2<T>>), AttentionError> {
    let shape = check(&batch, options)?;
    let heads = batch.q.shape()[0];
    let mut output = Array3::zeros((heads, shape.n_queries, shape.value_dim));
    let mut logsumexp = with_lse.then(|| Array2::zeros((heads, shape.n_queries)));
    let lse = logsumexp.as_mut().map(|lse| lse.view_mut());
    attend(&shape, &batch, options, output.view_mut(), lse)?;
    Ok((output, logsumexp))
}

/// Checks the tensors, the offsets and which options a packed call takes; returns the packed
/// shape (`n_queries` and `n_keys` the packed lengths).
fn check<T: Real>(batch: &Batch<'_, T>, options: &AttentionOptions<T>) -> Result<Shape, AttentionError> {
    let Batch { q, k, v, query_offsets, key_offsets } = batch;
    let shape = check_heads(
        &q.view().insert_axis(Axis(0)),
        &k.view().insert_axis(Axis(0)),
        &v.view().insert_axis(Axis(0)),
    )?;
    if query_offsets.len() != key_offsets.len() {
        let (query_offsets, key_offsets) = ((*query_offsets).into(), (*key_offsets).into());
        return Err(AttentionError::PackedOffsetCounts { query_offsets, key_offsets });
    }
    let sequences = query_offsets.len().saturating_sub(1);
    check_offsets("query_offsets", query_offsets, sequences, shape.n_queries)?;
    check_offsets("key_offsets", key_offsets, sequences, shape.n_keys)?;
    let refused = [
        ("keep_mask", options.keep.is_some()),
        ("bias", options.bias.is_some()),
        ("key_padding", options.padding.is_some()),
        ("key_lengths", options.key_lengths.is_some()),
    ];
    if let Some((option, _)) = refused.into_iter().find(|(_, given)| *given) {
        return Err(AttentionError::PackedOption {
            option,
            why: "it is a matrix over dense keys, and a packed batch's sequences differ in length",
        });
    }
    // Each sequence checks its masks as it runs; the options' own values (the scale, the cap,
    // sinks, ALiBi slopes) are checked here against the whole batch, so that a batch of no
    // sequences refuses a NaN scale too.
    options.resolve_heads(&shape, Some((sequences, q.shape()[0])))?;
    Ok(shape)
}

/// Sequence `m`'s rows in the packed queries and keys.
struct Member {
    queries: Range<usize>,
    keys: Range<usize>,
}

/// Runs a checked packed call into `out` and `lse`, which may hold anything: every row is
/// written.
fn attend<T: Real>(
    shape: &Shape,
    batch: &Batch<'_, T>,
    options: &AttentionOptions<T>,
    mut out: ArrayViewMut3<T>,
    mut lse: Option<ArrayViewMut2<T>>,
) -> Result<(), AttentionError> {
    let &Batch { q, k, v, query_offsets, key_offsets } = batch;
    let [query_heads, _, key_dim] = *q.shape() else { unreachable!("3-D view") };
    let kv_heads = k.shape()[0];
    let kernels = simd::kernels_for(options.simd_level())?;
    let sequences = query_offsets.len() - 1;
    let queries = finite_magnitude("queries", &q)?;
    let shape_of = |m: &Member| Shape {
        n_queries: m.queries.len(),
        n_keys: m.keys.len(),
        key_dim,
        value_dim: shape.value_dim,
    };
    let resolve = |m: &Member| options.resolve_heads(&shape_of(m), Some((sequences, query_heads)));
    // A sequence whose rows in the step (its queries times the query heads stacked on a key/value
    // head) fill more than one query block of the step's kernels runs alone through the dense
    // path, which packs its keys once for all its blocks and writes its output in parallel;
    // shorter ones (decoding steps, a few speculative tokens) share one step, one round of work
    // for the whole batch. On a Zen 5 (qkv-bench's `varlen` example), 32 prefills of 20 to 119
    // tokens took 0.37 of the time alone that they took in the step; 32 sequences of 12 queries
    // (one block each) took 4.2 to 4.8 ms in the step against 6.3 ms alone.
    let step_rows = kernels.vectors().run::<T, _>(QueryBlock) / (query_heads / kv_heads);
    // A sequence with queries and no keys has zero rows, and the logsumexp of nothing: its head's
    // sink, or -inf.
    let mut members = Vec::with_capacity(sequences);
    let mut alone = Vec::new();
    let mut heads_differ = false;
    for i in 0..sequences {
        let member = Member {
            queries: query_offsets[i]..query_offsets[i + 1],
            keys: key_offsets[i]..key_offsets[i + 1],
        };
        let masks = resolve(&member)?;
        if member.keys.is_empty() {
            out.slice_mut(s![.., member.queries.clone(), ..]).fill(T::zero());
            if let Some(lse) = &mut lse {
                for h in 0..query_heads {
                    let sink = options.sinks.map(|sinks| sinks[h]);
                    let nothing = softmax::finish(T::neg_infinity(), T::zero(), sink).logsumexp();
                    lse.slice_mut(s![h, member.queries.clone()]).fill(nothing);
                }
            }
        } else if member.queries.len() > step_rows {
            alone.push((i, member));
        } else if !member.queries.is_empty() {
            heads_differ |= masks.vary_by_head();
            members.push((i, member));
        }
    }
    // When every sequence of the step decodes (see `flash::decodes`) and its queries see all its
    // keys, the step reads each key and value once and measures them as it does, as the dense
    // decoding step does: without a pass of their own beforehand, a batch of 64 decoding steps
    // took 0.59 of the time on a Zen 5 at two threads, 0.63 at one (qkv-bench's `varlen
    // decode64`). Every other key and value (prefills', those of sequences without queries, or
    // all of them) is checked here.
    let stack = if heads_differ { 1 } else { query_heads / kv_heads };
    let measured_in_step = !members.is_empty()
        && members.iter().all(|(i, m)| {
            flash::decodes(m.queries.len() * stack, &k.slice(s![0, m.keys.clone(), ..]))
                && resolve(m).expect("resolved when the batch was checked").head(*i, 0).shows_every_key()
        });
    let mut unmeasured: Vec<Range<usize>> = Vec::new();
    let mut in_step = members.iter().map(|(i, _)| *i).filter(|_| measured_in_step).peekable();
    for i in 0..sequences {
        if in_step.next_if_eq(&i).is_some() {
            continue;
        }
        match unmeasured.last_mut() {
            Some(run) if run.end == key_offsets[i] => run.end = key_offsets[i + 1],
            _ => unmeasured.push(key_offsets[i]..key_offsets[i + 1]),
        }
    }
    let magnitudes = Magnitudes {
        queries,
        keys: rows_magnitude(&k, &unmeasured).ok_or_else(|| non_finite(k, v))?,
        values: rows_magnitude(&v, &unmeasured).ok_or_else(|| non_finite(k, v))?,
    };
    let every_head = |members: &[(usize, Member)], holds: &dyn Fn(&Shape, &MaskSet<T>) -> bool| {
        members.iter().all(|(i, m)| {
            let masks = resolve(m).expect("resolved when the batch was checked");
            (0..query_heads).all(|h| holds(&shape_of(m), &masks.head(*i, h)))
        })
    };
    // The blocked path copes with scores that may overflow and names the query whose does: then
    // the step's sequences run alone too, every sequence in order.
    let mut run_alone_in_order = |mut members: Vec<(usize, Member)>| {
        alone.append(&mut members);
        alone.sort_unstable_by_key(|&(i, _)| i);
    };
    if !measured_in_step
        && !every_head(&members, &|shape, masks| flash::stays_finite(shape, &magnitudes, masks))
    {
        run_alone_in_order(std::mem::take(&mut members));
    }
    if !members.is_empty() {
        let masks = |m: usize, head: usize| {
            let (i, member) = &members[m];
            resolve(member).expect("resolved when the batch was checked").head(*i, head)
        };
        let v_tensor = v.to_slice_memory_order();
        let keys = |m: usize, _: usize, kv: usize| {
            let rows = members[m].1.keys.clone();
            let (k, v) = (k.slice_move(s![kv, rows.clone(), ..]), v.slice_move(s![kv, rows, ..]));
            StoredKeys::Rows { k, v, v_tensor }
        };
        let step = Step {
            isa: kernels,
            q: q.insert_axis(Axis(0)),
            kv_heads,
            value_dim: shape.value_dim,
            members: members.len(),
            member: &|m| (0, members[m].1.queries.clone()),
            n_keys: &|m| members[m].1.keys.len(),
            keys: &keys,
            parts: 1,
            masks: &|m, _, head| masks(m, head),
            heads_differ,
            rotary: None,
        };
        let lse = lse.as_mut().map(|lse| lse.view_mut().insert_axis(Axis(0)));
        let measured =
            step::attend(&step, out.view_mut().insert_axis(Axis(0)), lse, &mut StepBuffers::default());
        if measured_in_step {
            // A key or value the step read was not finite (the whole check names it), or scores may
            // have overflowed: the step's rows are written again, alone.
            if !every_head(&members, &|shape, masks| flash::decode_checked(shape, queries, measured, masks)) {
                finite_magnitude("keys", &k)?;
                finite_magnitude("values", &v)?;
                run_alone_in_order(std::mem::take(&mut members));
            }
        }
    }
    for (i, member) in &alone {
        run_alone(*i, member, batch, options, &mut out, &mut lse)?;
    }
    Ok(())
}

/// The largest magnitude of rows `runs` of `x` (`[heads, rows, d]`), or `None` if one is not
/// finite.
fn rows_magnitude<T: Real>(x: &ArrayView3<T>, runs: &[Range<usize>]) -> Option<f64> {
    runs.iter().try_fold(0.0_f64, |largest, run| {
        let magnitude = finite_magnitude("rows", &x.slice(s![.., run.clone(), ..])).ok()?;
        Some(largest.max(magnitude))
    })
}

/// The error naming the first key or value that is not finite, by its index in the whole tensor,
/// once a check of some of their rows found one.
fn non_finite<T: Real>(k: ArrayView3<T>, v: ArrayView3<T>) -> AttentionError {
    let whole = finite_magnitude("keys", &k).and_then(|_| finite_magnitude("values", &v));
    whole.expect_err("a check of some rows found an element that is not finite")
}

/// Sequence `i` alone, through [`multi_head_attention`](crate::multi_head_attention)'s paths (the
/// blocked one where scores may overflow), its errors naming the sequence as the batch index and
/// the query by its packed row.
fn run_alone<T: Real>(
    i: usize,
    member: &Member,
    batch: &Batch<'_, T>,
    options: &AttentionOptions<T>,
    out: &mut ArrayViewMut3<T>,
    lse: &mut Option<ArrayViewMut2<T>>,
) -> Result<(), AttentionError> {
    let Batch { q, k, v, .. } = batch;
    let (queries, keys) = (member.queries.clone(), member.keys.clone());
    let q = q.slice(s![.., queries, ..]).insert_axis(Axis(0));
    let (k, v) = (
        k.slice(s![.., keys.clone(), ..]).insert_axis(Axis(0)),
        v.slice(s![.., keys, ..]).insert_axis(Axis(0)),
    );
    let out = out.slice_mut(s![.., member.queries.clone(), ..]).insert_axis(Axis(0));
    let lse = lse.as_mut().map(|lse| lse.slice_mut(s![.., member.queries.clone()]).insert_axis(Axis(0)));
    let alibi = options.alibi.map(|alibi| alibi.of_sequence(i));
    let options = AttentionOptions { alibi, ..options.clone() };
    multi_head::output_into(q, k, v, &options, out, lse).map_err(|error| match error {
        AttentionError::ScoreOverflow { query_idx, head, ty } => AttentionError::ScoreOverflow {
            query_idx: member.queries.start + query_idx,
            head: head.map(|(_, h)| (i, h)),
            ty,
        },
        error => error,
    })
}

/// The rows of a query block of a level's kernels (`Kernels::QUERY_BLOCK`).
struct QueryBlock;

impl<E: Element> Job<E> for QueryBlock {
    type Output = usize;

    fn run<K: Kernels<E::Compute, E>>(self, _: K) -> usize {
        K::QUERY_BLOCK
    }
}
