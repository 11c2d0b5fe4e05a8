//! Attention over a packed batch of sequences of different lengths, with no padding: flash-attn's
//! `flash_attn_varlen_func` (its `cu_seqlens_q`/`cu_seqlens_k` are the offsets here). Every
//! sequence's queries attend to its own keys only. Sequences of a few queries (decoding steps)
//! share one call of the step the caches take ([`step::attend`]), whose work items span every
//! such sequence and head; a longer one (a prefill) runs alone through the dense path.

use std::ops::Range;

use ndarray::{
    Array1, Array2, Array3, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut2, ArrayViewMut3, Axis, Ix3, s,
};

use crate::backward::{self, Gradients, GradientsMut, check_logsumexp, expect_shape};
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
/// use qkv::ndarray::Array3;
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
/// use qkv::ndarray::{Array3, Axis};
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
/// let q = qkv::ndarray::Array3::<f64>::zeros((1, 3, 2));
/// let kv = qkv::ndarray::Array3::<f64>::zeros((1, 5, 2));
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

/// The gradients of a packed batch's inputs (see [`Gradients`]: `dq`, `dk`, `dv` shaped as `q`,
/// `k`, `v`, and `dsinks` with sinks) from `d_output = ∂L/∂O` (`[query_heads, total_queries,
/// d_v]`) and what [`varlen_attention_with_lse`] returned for the same inputs and options:
/// flash-attn's `flash_attn_varlen_func` backward.
///
/// Each sequence is differentiated over its own rows as
/// [`multi_head_attention_backward`](crate::multi_head_attention_backward) differentiates one
/// sequence (its work shared out over its heads and key blocks); sequences run one after
/// another. A shared key/value head's gradient is summed over its query heads in their order, a
/// sink's over every sequence in theirs. A query of a sequence with no keys, and a key of one
/// with no queries, gets zeros (such a query's output is 0 and its logsumexp its head's sink:
/// the sink's gradient takes it in). Every element of the inputs, the output's gradient and the saved
/// output must be finite (errors name the element by its index in the packed tensor).
///
/// ```
/// use qkv::ndarray::Array3;
/// use qkv::{AttentionOptions, CausalMask};
/// // Two sequences of 3 and 5 tokens, 4 query heads sharing 2 key/value heads, width 8.
/// let q = Array3::<f64>::from_shape_fn((4, 8, 8), |(h, i, j)| 0.1 * (h + i) as f64 - 0.05 * j as f64);
/// let kv = Array3::<f64>::from_shape_fn((2, 8, 8), |(h, i, j)| 0.2 * (h * i) as f64 - 0.1 * j as f64);
/// let offsets = [0, 3, 8];
/// let options = AttentionOptions::new().causal(CausalMask::BottomRight);
/// let forward = qkv::varlen_attention_with_lse(q.view(), kv.view(), kv.view(), &offsets, &offsets, &options)?;
/// let d_out = Array3::<f64>::ones((4, 8, 8));
/// let g = qkv::varlen_attention_backward(
///     q.view(), kv.view(), kv.view(), &offsets, &offsets, &forward, d_out.view(), &options,
/// )?;
/// assert_eq!(g.dk.shape(), [2, 8, 8]);
/// // Each sequence's first query sees one key: its weight is 1 whatever the score, so dq is 0.
/// assert!(g.dq.slice(qkv::ndarray::s![.., 0, ..]).iter().all(|&x| x == 0.0));
/// assert!(g.dq.slice(qkv::ndarray::s![.., 3, ..]).iter().all(|&x| x == 0.0));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn varlen_attention_backward<T: Real>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    query_offsets: &[usize],
    key_offsets: &[usize],
    forward: &PartialAttention<T, Ix3>,
    d_output: ArrayView3<T>,
    options: &AttentionOptions<T>,
) -> Result<Gradients<T, Ix3>, AttentionError> {
    let batch = Batch { q, k, v, query_offsets, key_offsets };
    let shape = check(&batch, options)?;
    let mut gradients = Gradients {
        dq: Array3::zeros(q.raw_dim()),
        dk: Array3::zeros(k.raw_dim()),
        dv: Array3::zeros(v.raw_dim()),
        dbias: None,
        dsinks: options.sinks.map(|_| Array1::zeros(q.shape()[0])),
    };
    let into = GradientsMut {
        dq: gradients.dq.view_mut(),
        dk: gradients.dk.view_mut(),
        dv: gradients.dv.view_mut(),
        dbias: None,
        dsinks: gradients.dsinks.as_mut().map(|d| d.view_mut()),
    };
    let saved = (forward.output.view(), forward.logsumexp.view());
    differentiate(&shape, &batch, saved, d_output, options, into)?;
    Ok(gradients)
}

/// Like [`varlen_attention_backward`], writing the gradients into `gradients` (any strides, such
/// as `[total, heads, d]` buffers with their first two axes swapped: flash-attn's layout), which
/// may hold anything: every element is written. A packed call has no bias, so `dbias` must not
/// be given. If the call fails, the buffers may hold anything.
///
/// ```
/// use qkv::ndarray::Array3;
/// let q = Array3::<f32>::from_elem((2, 4, 8), 0.5);
/// let kv = Array3::<f32>::from_elem((1, 6, 8), 0.25);
/// let (qo, ko) = ([0, 1, 4], [0, 2, 6]);
/// let options = qkv::AttentionOptions::new();
/// let forward = qkv::varlen_attention_with_lse(q.view(), kv.view(), kv.view(), &qo, &ko, &options)?;
/// let d_out = Array3::<f32>::ones((2, 4, 8));
/// let mut buffers = [q.clone(), kv.clone(), kv.clone()].map(|x| x.mapv(|_| f32::NAN));
/// let [dq, dk, dv] = &mut buffers;
/// let into = qkv::GradientsMut::new(dq.view_mut(), dk.view_mut(), dv.view_mut());
/// qkv::varlen_attention_backward_into(q.view(), kv.view(), kv.view(), &qo, &ko, &forward, d_out.view(), &options, into)?;
/// // Equal keys: every weight of a sequence is equal, and dS is 0, so only the values get a gradient.
/// assert!(dq.iter().all(|&x| x == 0.0));
/// // A value's gradient is the sum of its weights over both heads' rows (dO is 1): the first
/// // sequence's 2 keys take 1/2 of one row a head, the second's 4 keys 1/4 of three rows.
/// assert!(dv.slice(qkv::ndarray::s![.., ..2, ..]).iter().all(|&x| (x - 1.0).abs() < 1e-6));
/// assert!(dv.slice(qkv::ndarray::s![.., 2.., ..]).iter().all(|&x| (x - 1.5).abs() < 1e-6));
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[allow(clippy::too_many_arguments)]
pub fn varlen_attention_backward_into<T: Real>(
    q: ArrayView3<T>,
    k: ArrayView3<T>,
    v: ArrayView3<T>,
    query_offsets: &[usize],
    key_offsets: &[usize],
    forward: &PartialAttention<T, Ix3>,
    d_output: ArrayView3<T>,
    options: &AttentionOptions<T>,
    gradients: GradientsMut<T, Ix3>,
) -> Result<(), AttentionError> {
    let batch = Batch { q, k, v, query_offsets, key_offsets };
    let shape = check(&batch, options)?;
    let saved = (forward.output.view(), forward.logsumexp.view());
    differentiate(&shape, &batch, saved, d_output, options, gradients)
}

/// The backward of a checked packed call, sequence by sequence, from the forward's `(output,
/// logsumexp)`.
fn differentiate<T: Real>(
    shape: &Shape,
    batch: &Batch<'_, T>,
    (output, logsumexp): (ArrayView3<T>, ArrayView2<T>),
    d_output: ArrayView3<T>,
    options: &AttentionOptions<T>,
    gradients: GradientsMut<T, Ix3>,
) -> Result<(), AttentionError> {
    let &Batch { q, k, v, query_offsets, key_offsets } = batch;
    let query_heads = q.shape()[0];
    let rows = [query_heads, shape.n_queries, shape.value_dim];
    expect_shape("output", output.shape(), &rows, "output")?;
    expect_shape("logsumexp", logsumexp.shape(), &q.shape()[..2], "queries")?;
    expect_shape("d_output", d_output.shape(), &rows, "output")?;
    let GradientsMut { mut dq, mut dk, mut dv, dbias, dsinks } = gradients;
    expect_shape("dq", dq.shape(), q.shape(), "queries")?;
    expect_shape("dk", dk.shape(), k.shape(), "keys")?;
    expect_shape("dv", dv.shape(), v.shape(), "values")?;
    if let Some(dsinks) = &dsinks {
        expect_shape("dsinks", dsinks.shape(), &[query_heads], "query heads")?;
    }
    if dbias.is_some() {
        return Err(AttentionError::PackedOption {
            option: "dbias",
            why: "a packed call has no bias to differentiate",
        });
    }
    // Checked whole, so that an element is named by its packed index (each sequence's own check
    // would name it within the sequence).
    for (argument, x) in
        [("queries", &q), ("keys", &k), ("values", &v), ("d_output", &d_output), ("output", &output)]
    {
        finite_magnitude(argument, x)?;
    }
    check_logsumexp(&logsumexp)?;
    let mut sink_sums = vec![0.0; query_heads];
    for i in 0..query_offsets.len() - 1 {
        let (rows, keys) = (query_offsets[i]..query_offsets[i + 1], key_offsets[i]..key_offsets[i + 1]);
        let mut dq = dq.slice_mut(s![.., rows.clone(), ..]);
        let (mut dk, mut dv) =
            (dk.slice_mut(s![.., keys.clone(), ..]), dv.slice_mut(s![.., keys.clone(), ..]));
        if rows.is_empty() || keys.is_empty() {
            // Nothing attends, or nothing to attend to: the rows there are have zero gradients.
            for x in [&mut dq, &mut dk, &mut dv] {
                x.fill(T::zero());
            }
            // A row with no keys puts all its weight on its head's sink (its logsumexp is the
            // sink's logit): `-P_sink · δ` with `P_sink = 1`. Its output is 0, so `δ` is too,
            // unless the caller's gradient carries the logsumexp's through `O` and `dO`.
            let sinks = options.sinks.unwrap_or_default();
            for ((h, total), sink) in sink_sums.iter_mut().enumerate().zip(sinks) {
                let sink = Some(sink.to_f64_exact());
                for r in rows.clone() {
                    let (o, d) = (output.slice(s![h, r, ..]), d_output.slice(s![h, r, ..]));
                    let delta: f64 = o.iter().zip(d).map(|(o, d)| o.to_f64_exact() * d.to_f64_exact()).sum();
                    *total -= softmax::sink_weight(sink, logsumexp[[h, r]].to_f64_exact()) * delta;
                }
            }
            continue;
        }
        let member = Shape { n_queries: rows.len(), n_keys: keys.len(), ..*shape };
        let alibi = options.alibi.map(|alibi| alibi.of_sequence(i));
        let options = AttentionOptions { alibi, ..options.clone() };
        let into =
            GradientsMut::new(dq.insert_axis(Axis(0)), dk.insert_axis(Axis(0)), dv.insert_axis(Axis(0)));
        let sums = backward::backward(
            &member,
            Some((1, query_heads)),
            one_sequence(q, &rows),
            one_sequence(k, &keys),
            one_sequence(v, &keys),
            one_sequence(output, &rows),
            logsumexp.slice_move(s![.., rows.clone()]).insert_axis(Axis(0)),
            one_sequence(d_output, &rows),
            &options,
            into,
        )?;
        sink_sums.iter_mut().zip(sums).for_each(|(total, sum)| *total += sum);
    }
    if let Some(mut dsinks) = dsinks {
        dsinks.iter_mut().zip(&sink_sums).for_each(|(d, &sum)| *d = T::from_f64_round(sum));
    }
    Ok(())
}

/// Rows `rows` of `x` (`[heads, total, d]`) as a batch of one sequence, `[1, heads, rows, d]`.
fn one_sequence<'a, T>(x: ArrayView3<'a, T>, rows: &Range<usize>) -> ArrayView4<'a, T> {
    x.slice_move(s![.., rows.clone(), ..]).insert_axis(Axis(0))
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
