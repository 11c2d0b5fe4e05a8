//! The inference step, written once: a few new queries per sequence over keys and values that are
//! already stored (a [`KvCache`](crate::KvCache)'s, a [`PagedKvCache`](crate::PagedKvCache)'s) or
//! read as they are (the dense decoding step of
//! [`multi_head_attention`](crate::multi_head_attention)). It stacks the query heads that share a
//! key/value head as the rows of one problem (unless their masks differ by head), widens the
//! queries into the compute type, runs the problems in one call of the fast path
//! ([`flash::attend_cached`]), and copies each row back to where its head and query belong,
//! rounded once to the output's type.
//!
//! The callers keep only what differs: which keys each sequence reads, and the masks each of
//! its parts takes (a ring's two runs of slots, a paged sequence's own positions). A cache's
//! options are checked here too ([`check_cache_options`]), once for both caches.

use std::ops::Range;

use ndarray::{ArrayView1, ArrayView2, ArrayView4, ArrayViewMut3, ArrayViewMut4, s};

use crate::element::Real;
use crate::error::{AttentionError, Dims};
use crate::flash::{self, CachedCall, CachedProblem, Measured, StoredKeys, Workspace};
use crate::kernels::{Element, Isa};
use crate::level::SimdLevel;
use crate::masking::MaskSet;
use crate::options::CacheOptions;
use crate::rotary::{Angles, Rotary};
use crate::shape::Shape;

/// The buffers of a step, kept between steps by the caches (a dense call makes them anew): the
/// queries stacked by key/value head and widened, the stacked output and logsumexp, and the fast
/// path's own buffers. Each grows to the largest step seen and never shrinks.
pub(crate) struct StepBuffers<T: Real> {
    queries: Vec<T>,
    output: Vec<T>,
    logsumexp: Vec<T>,
    /// Where each member's rows start among the stacked rows.
    first_rows: Vec<usize>,
    /// One query turned by a rotary embedding, in f64, and the angles of its position.
    rotated: Vec<f64>,
    angles: Angles,
    workspace: Workspace<T>,
}

impl<T: Real> Default for StepBuffers<T> {
    fn default() -> Self {
        StepBuffers {
            queries: Vec::new(),
            output: Vec::new(),
            logsumexp: Vec::new(),
            first_rows: Vec::new(),
            rotated: Vec::new(),
            angles: Angles::default(),
            workspace: Workspace::default(),
        }
    }
}

/// One step's problems: `members` sequences, member `m` being batch element `member(m).0` of
/// the queries `q` (`[batch, query_heads, n, d_k]`), its queries `member(m).1` there, over
/// `n_keys(m)` stored keys. Member `m`'s key/value head `kv` reads `keys(m, part, kv)` in part
/// `part` (a windowed cache's sink tokens are stored apart from its ring); its query head
/// `h` takes `masks(m, part, h)` over part `part < parts` of those keys (see
/// [`flash::CachedCall`]).
pub(crate) struct Step<'c, 'p, T: Real, E: Element, Q> {
    pub(crate) isa: Isa,
    pub(crate) q: ArrayView4<'p, Q>,
    pub(crate) kv_heads: usize,
    pub(crate) value_dim: usize,
    pub(crate) members: usize,
    pub(crate) member: &'c (dyn Fn(usize) -> (usize, Range<usize>) + Sync),
    pub(crate) n_keys: &'c (dyn Fn(usize) -> usize + Sync),
    pub(crate) keys: &'c (dyn Fn(usize, usize, usize) -> StoredKeys<'p, E> + Sync),
    pub(crate) parts: usize,
    pub(crate) masks: &'c (dyn Fn(usize, usize, usize) -> MaskSet<'p, T> + Sync),
    /// Whether query heads take masks of their own (ALiBi, per-head masks or biases), so that
    /// each reads its key/value head alone rather than stacked with its group.
    pub(crate) heads_differ: bool,
    /// A cache's rotary embedding, with the absolute position of member `m`'s first query: its
    /// queries are rotated as they are stacked (a ring's by position, never by slot).
    pub(crate) rotary: Option<(&'c Rotary, &'c (dyn Fn(usize) -> usize + Sync))>,
}

/// Runs `step` into `out` (`[batch, query_heads, n, d_v]`, each row rounded once to `O`) and
/// `lse` (`[batch, query_heads, n]`), where its members' queries are: nothing else of them is
/// written. When its keys are rows and every problem decodes, returns their magnitudes as it
/// measured them (see [`flash::attend_cached`]); stored keys were measured when they were stored.
pub(crate) fn attend<T: Real, E: Element<Compute = T>, Q: Element<Compute = T>, O: Element<Compute = T>>(
    step: &Step<'_, '_, T, E, Q>,
    mut out: ArrayViewMut4<O>,
    mut lse: Option<ArrayViewMut3<T>>,
    buffers: &mut StepBuffers<T>,
) -> Option<Measured<T>> {
    let &Step {
        isa,
        q,
        kv_heads,
        value_dim,
        members,
        member,
        n_keys,
        keys,
        parts,
        masks,
        heads_differ,
        rotary,
    } = step;
    let [_, query_heads, _, key_dim] = *q.shape() else { unreachable!("4-D view") };
    // The query heads that share a key/value head are the rows of one problem, query-major (row
    // `i · stack + g` is query `i` of the stack's head `g`), so that its keys and values are read
    // once for all of them; heads with masks of their own are a problem each. Problem
    // `m · per_member + j` is member `m`'s `j`-th, and the problems' rows follow one another.
    let group = query_heads / kv_heads;
    let stack = if heads_differ { 1 } else { group };
    let per_member = query_heads / stack;
    let StepBuffers { queries, output, logsumexp, first_rows, rotated, angles, workspace } = buffers;
    first_rows.clear();
    let mut total_rows = 0;
    for m in 0..members {
        first_rows.push(total_rows);
        total_rows += member(m).1.len() * query_heads;
    }
    // Member `m`'s stacked row of query `i` of head `head`, counted from the member's first
    // row: problem `head / stack`'s rows come `rows = n · stack` at a time, query-major. Each
    // head's rows are walked as one view: a view sliced per row, with these copies, took a tenth
    // of a packed prefill's time when prefills took the step (on the calling thread alone).
    let stacked_row = |rows: usize, head: usize, i: usize| head / stack * rows + i * stack + head % stack;
    let stacked = flash::prefix(queries, total_rows * key_dim);
    for m in 0..members {
        let (b, range) = member(m);
        let rows = range.len() * stack;
        let member_rows = &mut stacked[first_rows[m] * key_dim..][..range.len() * query_heads * key_dim];
        for head in 0..query_heads {
            for (i, query) in q.slice(s![b, head, range.clone(), ..]).rows().into_iter().enumerate() {
                let row = &mut member_rows[stacked_row(rows, head, i) * key_dim..][..key_dim];
                // A contiguous row copies as slices, which the compiler vectorises.
                match query.as_slice() {
                    Some(query) => row.iter_mut().zip(query).for_each(|(x, &y)| *x = y.widen()),
                    None => row.iter_mut().zip(query).for_each(|(x, &y)| *x = y.widen()),
                }
                if let Some((rotary, first_position)) = rotary {
                    let dims = rotary.dims.unwrap_or(key_dim);
                    let turned = flash::prefix(rotated, dims);
                    let position = first_position(m) + i;
                    rotary.turn_into(row.iter().map(|x| x.to_f64_exact()), turned, (position, 1.0), angles);
                    row.iter_mut().zip(&*turned).for_each(|(x, &y)| *x = T::from_f64_round(y));
                }
            }
        }
    }
    let stacked = &*stacked;
    let first_rows = &*first_rows;
    let shape = |p: usize| {
        let m = p / per_member;
        Shape { n_queries: member(m).1.len(), n_keys: n_keys(m), key_dim, value_dim }
    };
    let problem = |p: usize, part: usize| {
        let (m, j) = (p / per_member, p % per_member);
        let rows = member(m).1.len() * stack;
        let first = first_rows[m] + j * rows;
        CachedProblem {
            q: ArrayView2::from_shape((rows, key_dim), &stacked[first * key_dim..(first + rows) * key_dim])
                .expect("the rows fit"),
            kv: keys(m, part, j * stack / group),
            masks: masks(m, part, j * stack),
        }
    };
    let stacked_out = flash::prefix(output, total_rows * value_dim);
    let stacked_lse = lse.is_some().then(|| flash::prefix(logsumexp, total_rows));
    let call = CachedCall {
        rows_per_query: stack,
        n_problems: members * per_member,
        parts,
        shape: &shape,
        problem: &problem,
    };
    let measured = flash::attend_cached(isa, call, stacked_out, stacked_lse, workspace);
    for (m, &first) in first_rows.iter().enumerate() {
        let (b, range) = member(m);
        let rows = range.len() * stack;
        let member_out = &stacked_out[first * value_dim..][..range.len() * query_heads * value_dim];
        for head in 0..query_heads {
            let mut head_out = out.slice_mut(s![b, head, range.clone(), ..]);
            for (i, mut output) in head_out.rows_mut().into_iter().enumerate() {
                let r = stacked_row(rows, head, i);
                let row = &member_out[r * value_dim..][..value_dim];
                match output.as_slice_mut() {
                    Some(output) => output.iter_mut().zip(row).for_each(|(o, &x)| *o = O::narrow(x)),
                    None => output.zip_mut_with(&ArrayView1::from(row), |o, &x| *o = O::narrow(x)),
                }
                if let Some(lse) = &mut lse {
                    lse[[b, head, range.start + i]] = logsumexp[first + r];
                }
            }
        }
    }
    measured
}

/// An argument or option whose shape does not fit the call, for the cache to report with its own
/// context (its layer, and which cache).
pub(crate) struct ShapeMismatch {
    pub(crate) argument: &'static str,
    pub(crate) found: Dims,
    pub(crate) expected: String,
    pub(crate) why: &'static str,
}

impl ShapeMismatch {
    /// `Err` naming `argument` unless `found` is `expected`.
    fn check(
        argument: &'static str,
        found: &[usize],
        expected: &[usize],
        why: &'static str,
    ) -> Result<(), Self> {
        if found == expected {
            return Ok(());
        }
        let (found, expected) = (found.into(), Dims(expected.to_vec()).to_string());
        Err(ShapeMismatch { argument, found, expected, why })
    }
}

/// Checks the keys `k` and values `v` appended to a cache layer of `kv_heads` heads: `[kv_heads,
/// n_new, key_dim]` and `[kv_heads, n_new, value_dim]`, `n_new` taken from the keys.
pub(crate) fn check_appended(
    k: &[usize],
    v: &[usize],
    kv_heads: usize,
    key_dim: usize,
    value_dim: usize,
) -> Result<(), ShapeMismatch> {
    let n_new = k[1];
    if k[0] != kv_heads || k[2] != key_dim {
        // The keys set n_new: their own second axis is no guide when the others are wrong (keys
        // passed as `[n_new, kv_heads, key_dim]` would be told to take `[kv_heads, kv_heads, ..]`).
        return Err(ShapeMismatch {
            argument: "keys",
            found: k.into(),
            expected: format!("[{kv_heads}, n_new, {key_dim}]"),
            why: "one [n_new, key_dim] block per key/value head",
        });
    }
    let why = "one value for every key, one [n_new, value_dim] block per key/value head";
    ShapeMismatch::check("values", v, &[kv_heads, n_new, value_dim], why)
}

/// Checks a step's queries `q` (`[query_heads, n_queries, key_dim]`, the query heads a positive
/// multiple of the layer's `kv_heads`), its `out` (`[query_heads, n_queries, value_dim]`) and, if
/// asked for, its logsumexp `lse` (`[query_heads, n_queries]`).
pub(crate) fn check_step(
    q: &[usize],
    out: &[usize],
    lse: Option<&[usize]>,
    kv_heads: usize,
    key_dim: usize,
    value_dim: usize,
) -> Result<(), ShapeMismatch> {
    let [query_heads, n_queries, _] = *q else { unreachable!("3-D queries") };
    let why = "query heads a positive multiple of the key/value heads, each query as wide as the keys";
    if query_heads == 0 || query_heads % kv_heads != 0 {
        // No one number of heads is right: say which are.
        let expected = format!("[a multiple of {kv_heads}, {n_queries}, {key_dim}]");
        return Err(ShapeMismatch { argument: "queries", found: q.into(), expected, why });
    }
    ShapeMismatch::check("queries", q, &[query_heads, n_queries, key_dim], why)?;
    let why = "one value-wide row per query";
    ShapeMismatch::check("output", out, &[query_heads, n_queries, value_dim], why)?;
    match lse {
        Some(lse) => ShapeMismatch::check("logsumexp", lse, &[query_heads, n_queries], "one per query row"),
        None => Ok(()),
    }
}

/// Checks that `options` are a cache step's (see [`CacheOptions`]): no option that the cache
/// decides itself, a keep mask of `[n_queries, n_keys]`, one ALiBi slope and one attention sink
/// per query head. The
/// values (scale, cap, slopes) are checked when the options are resolved. `level` is the level
/// the cache runs at.
pub(crate) fn check_cache_options(
    options: &CacheOptions,
    level: SimdLevel,
    query_heads: usize,
    n_queries: usize,
    n_keys: usize,
) -> Result<Result<(), ShapeMismatch>, AttentionError> {
    let refuse = |option, why| Err(AttentionError::CacheOption { option, why });
    if options.causal.is_some_and(|causal| causal != crate::mask::CausalMask::BottomRight) {
        return refuse("causal", "a step's queries are the last positions held, aligned bottom-right");
    }
    // Named here rather than as `WindowAlignment`, whose message is about a causal mask the caller set.
    if options.window.is_some_and(|window| window.align != crate::mask::CausalMask::BottomRight) {
        return refuse(
            "TopLeft-aligned sliding_window",
            "a step's queries are the last positions held, aligned bottom-right, as \
             `SlidingWindow::new(before, after)` is unless `.aligned` says otherwise",
        );
    }
    if options.padding.is_some() || options.key_lengths.is_some() {
        let option = if options.padding.is_some() { "key_padding" } else { "key_lengths" };
        return refuse(option, "the positions a sequence holds are its keys; hide others with a keep mask");
    }
    if options.bias.is_some() {
        return refuse("bias", "a bias is a matrix over dense keys; use ALiBi or a keep mask");
    }
    if options.simd.is_some_and(|asked| asked != level) {
        return refuse("simd", "a cache runs the level it was made for (its `for_level`)");
    }
    if let Some(keep) = &options.keep
        && keep.0.view.shape() != [1, 1, n_queries, n_keys]
    {
        return Ok(Err(ShapeMismatch {
            argument: "keep_mask",
            found: keep.0.given.dims(),
            expected: Dims(vec![n_queries, n_keys]).to_string(),
            why: "one row per new query, one column per position held",
        }));
    }
    if let Some(alibi) = &options.alibi
        && alibi.slopes.shape() != [1, query_heads]
    {
        return Ok(Err(ShapeMismatch {
            argument: "alibi slopes",
            found: alibi.given.dims(),
            expected: Dims(vec![query_heads]).to_string(),
            why: "one slope per query head",
        }));
    }
    if let Some(sinks) = options.sinks
        && sinks.len() != query_heads
    {
        return Ok(Err(ShapeMismatch {
            argument: "sinks",
            found: Dims(vec![sinks.len()]),
            expected: Dims(vec![query_heads]).to_string(),
            why: "one attention-sink logit per query head",
        }));
    }
    Ok(Ok(()))
}
