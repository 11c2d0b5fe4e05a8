//! The blocked path: for each block of queries, `S = Q_b·Kᵀ` with a GEMM, softmax by rows, then
//! `O_b = P_b·V`. Blocks run in parallel (`work::map_items`); each writes only its own output
//! rows, so the result is the same bit for bit whatever the thread count.

use ndarray::linalg::general_mat_mul;
use ndarray::{Array2, ArrayView2, ArrayViewMut1, ArrayViewMut2, Axis, s};

use crate::element::Real;
use crate::error::AttentionError;
use crate::kernels::Element;
use crate::masking::MaskSet;
use crate::shape::Shape;
use crate::softmax;
use crate::work;

/// Queries per block: large enough for the GEMMs to run near full speed, small enough that a
/// block's `[QUERY_BLOCK, n_keys]` score matrix stays modest.
const QUERY_BLOCK: usize = 64;

/// One finished block of queries: its output rows, their logsumexp, weights, and scores (when
/// asked for).
struct Block<T> {
    output: Array2<T>,
    logsumexp: Vec<T>,
    weights: Array2<T>,
    scores: Option<Array2<T>>,
}

/// Computes attention for a checked problem into `out` (each row rounded once to `O`, when that
/// is a half-precision format), and into `lse` (each row's logsumexp) and `matrices` (scores,
/// weights) when asked.
#[allow(clippy::too_many_arguments)] // one checked problem and its outputs
pub(crate) fn attend<T: Real, O: Element<Compute = T>>(
    shape: &Shape,
    q: ArrayView2<T>,
    k: ArrayView2<T>,
    v: ArrayView2<T>,
    masks: &MaskSet<'_, T>,
    mut out: ArrayViewMut2<O>,
    mut lse: Option<ArrayViewMut1<T>>,
    matrices: Option<(ArrayViewMut2<T>, ArrayViewMut2<T>)>,
) -> Result<(), AttentionError> {
    let kt = k.t();
    let n_blocks = shape.n_queries.div_ceil(QUERY_BLOCK);
    let keep_scores = matrices.is_some();
    let blocks = work::map_items(
        (0..n_blocks).collect(),
        true,
        || (),
        |(), b: usize| {
            let first = b * QUERY_BLOCK;
            let rows = first..(first + QUERY_BLOCK).min(shape.n_queries);
            attend_block(q.slice(s![rows, ..]), first, kt, v, masks, keep_scores)
        },
    );
    // The first error in query order, so that a call names the same query whichever block's
    // thread failed first.
    let blocks: Vec<Block<T>> = blocks.into_iter().collect::<Result<_, _>>()?;
    let (mut scores, mut weights) = matrices.unzip();
    for (b, block) in blocks.into_iter().enumerate() {
        let rows = s![b * QUERY_BLOCK..b * QUERY_BLOCK + block.output.nrows(), ..];
        out.slice_mut(rows).zip_mut_with(&block.output, |o, &x| *o = O::narrow(x));
        if let Some(lse) = lse.as_mut() {
            let first = b * QUERY_BLOCK;
            lse.slice_mut(s![first..first + block.logsumexp.len()])
                .assign(&ndarray::aview1(&block.logsumexp));
        }
        if let (Some(w), Some(sc), Some(raw)) = (weights.as_mut(), scores.as_mut(), block.scores) {
            w.slice_mut(rows).assign(&block.weights);
            sc.slice_mut(rows).assign(&raw);
        }
    }
    Ok(())
}

/// One block of queries starting at query `first`.
fn attend_block<T: Real>(
    q: ArrayView2<T>,
    first: usize,
    kt: ArrayView2<T>,
    v: ArrayView2<T>,
    masks: &MaskSet<'_, T>,
    keep_scores: bool,
) -> Result<Block<T>, AttentionError> {
    let scale = T::from_f64_round(masks.scale);
    let n_keys = kt.ncols();
    // Row-major by construction, so every row below is a contiguous slice.
    let mut p = Array2::zeros((q.nrows(), n_keys));
    general_mat_mul(scale, &q, &kt, T::zero(), &mut p);
    for (r, mut row) in p.axis_iter_mut(Axis(0)).enumerate() {
        let row = row.as_slice_mut().expect("row-major");
        if !masks.is_unmasked() {
            masks.apply_row(first + r, 0..n_keys, row);
        }
    }
    let scores = keep_scores.then(|| p.clone());
    let logsumexp = p
        .axis_iter_mut(Axis(0))
        .enumerate()
        .map(|(r, mut row)| {
            softmax_in_place(row.as_slice_mut().expect("row-major"), first + r, masks.sink(0))
        })
        .collect::<Result<_, _>>()?;
    let mut o = Array2::zeros((q.nrows(), v.ncols()));
    general_mat_mul(T::one(), &p, &v, T::zero(), &mut o);
    Ok(Block { output: o, logsumexp, weights: p, scores })
}

/// Softmax of one score row in place, with the attention sink `sink` joining it
/// ([`softmax::finish`]), returning the row's logsumexp. Hidden entries (`-inf`) become 0; a row
/// with nothing visible becomes all 0, with a logsumexp of `-inf` (the sink's logit with a sink).
fn softmax_in_place<T: Real>(row: &mut [T], query_idx: usize, sink: Option<T>) -> Result<T, AttentionError> {
    // Finite inputs can still overflow to `inf` (or `inf - inf = NaN`) in the dot product.
    if row.iter().any(|x| x.is_nan() || *x == T::infinity()) {
        return Err(AttentionError::ScoreOverflow { query_idx, head: None, ty: T::NAME });
    }
    let max = row.iter().copied().fold(T::neg_infinity(), T::max);
    if max == T::neg_infinity() {
        row.fill(T::zero());
        return Ok(softmax::finish(max, T::zero(), sink).logsumexp());
    }
    let mut sum = T::zero();
    for x in row.iter_mut() {
        *x = (*x - max).exp();
        sum = sum + *x;
    }
    let finished = softmax::finish(max, sum, sink);
    for x in row.iter_mut() {
        *x = finished.output(*x);
    }
    Ok(finished.logsumexp())
}
