//! Attention over part of the keys, with each row's logsumexp, and the exact merge of two parts:
//! split-KV across machines, ring attention, a cache split into pages.

use ndarray::{Array, ArrayView, ArrayViewMut, Axis, Dimension, IntoDimension, Ix2, Zip};

use crate::{finite, work};

use crate::element::Real;
use crate::error::{AttentionError, Dims};
use crate::softmax;

/// The output of attention and each row's logsumexp, from
/// [`attention_with_lse`](crate::attention_with_lse) (`D = Ix2`: `output` is `[n_q, d_v]`,
/// `logsumexp` `[n_q]`) or [`multi_head_attention_with_lse`](crate::multi_head_attention_with_lse)
/// (`D = Ix4`: `[batch, heads, n_q, d_v]` and `[batch, heads, n_q]`).
///
/// The logsumexp is in the scaled-score domain, natural log: `lse_i = ln Σ_j exp(S_ij)` with `S`
/// the scaled scores including any bias (what `torch.logsumexp(scores, dim=-1)` gives), over the
/// keys the row sees. A row that sees no key has output 0 and logsumexp `-inf`. With attention
/// sinks ([`AttentionOptions::sinks`](crate::AttentionOptions::sinks)) the sum also holds
/// `exp(s_h)`, as a key with no value would: a row that sees no key then has logsumexp `s_h`.
#[derive(Debug, Clone, PartialEq)]
pub struct PartialAttention<T, D: Dimension = Ix2> {
    /// The output `O = softmax(S) · V` over the keys this part covers.
    pub output: Array<T, D>,
    /// `ln Σ_j exp(S_ij)` per row, over the same keys.
    pub logsumexp: Array<T, D::Smaller>,
}

impl<T: Real, D: Dimension> PartialAttention<T, D> {
    /// Combines attention over two disjoint sets of keys into attention over their union: each
    /// output row is the two rows weighted by their share of the total, `exp(lse_a - lse)` and
    /// `exp(lse_b - lse)` with `lse = ln(exp(lse_a) + exp(lse_b))`. Exact up to rounding, in any
    /// order and grouping; a row that sees no key in one part takes the other's row unchanged.
    /// Both parts need the same shapes, and values attention can produce: a logsumexp that is
    /// NaN or `+inf`, or an output element that is not finite, is an error naming it (the
    /// weighted sum would spread it over the merged row).
    ///
    /// A part computed with attention sinks holds them in its logsumexp, and the merge adds the
    /// parts up, so a sink given to two parts' calls counts twice: give the sinks to one part's
    /// call only (a part is the sink alone where it sees no key; the engine's own key splits and
    /// cache parts add the sink once, after merging).
    ///
    /// ```
    /// use qkv::ndarray::{array, s};
    /// use qkv::AttentionOptions;
    /// let q = array![[1.0_f64, 0.0], [0.5, 2.0]];
    /// let k = array![[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
    /// let v = array![[2.0], [6.0], [4.0]];
    /// let o = AttentionOptions::new();
    /// let full = qkv::attention_with_lse(q.view(), k.view(), v.view(), &o)?;
    /// let first = qkv::attention_with_lse(q.view(), k.slice(s![..1, ..]), v.slice(s![..1, ..]), &o)?;
    /// let rest = qkv::attention_with_lse(q.view(), k.slice(s![1.., ..]), v.slice(s![1.., ..]), &o)?;
    /// let merged = first.merge(&rest)?;
    /// assert!((&merged.output - &full.output).iter().all(|d| d.abs() < 1e-12));
    /// assert!((&merged.logsumexp - &full.logsumexp).iter().all(|d| d.abs() < 1e-12));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn merge(mut self, other: &PartialAttention<T, D>) -> Result<PartialAttention<T, D>, AttentionError> {
        check_shapes(&self.parts(), &other.parts())?;
        merge_checked((self.output.view_mut(), self.logsumexp.view_mut()), None, other.parts())?;
        Ok(self)
    }

    /// [`merge`](Self::merge) of two parts read where they are (views in any layout, such as
    /// another library's tensors), written into `output` and `logsumexp`, of the parts' shapes:
    /// no part is copied. The same checks and the same bits as `merge`; on a value error the
    /// output may hold the merge of some rows (rows are checked and merged a piece at a time, in
    /// one pass over memory, shared with the pool when the parts are large: only the pieces with
    /// a bad value are left unwritten).
    ///
    /// ```
    /// use qkv::ndarray::{Array1, Array2, array};
    /// let (first, first_lse) = (array![[1.0_f64], [3.0]], array![0.0, 0.0]);
    /// let (second, second_lse) = (array![[3.0], [5.0]], array![0.0, f64::NEG_INFINITY]);
    /// let (mut out, mut lse) = (Array2::zeros((2, 1)), Array1::zeros(2));
    /// let (a, b) = ((first.view(), first_lse.view()), (second.view(), second_lse.view()));
    /// qkv::PartialAttention::merge_into(a, b, out.view_mut(), lse.view_mut())?;
    /// // Equal logsumexps share the row; a part that sees no key leaves the other's row.
    /// assert_eq!(out, array![[2.0], [3.0]]);
    /// assert_eq!(lse[0], 2f64.ln());
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn merge_into(
        first: Part<'_, T, D>,
        second: Part<'_, T, D>,
        output: ArrayViewMut<T, D>,
        logsumexp: ArrayViewMut<T, D::Smaller>,
    ) -> Result<(), AttentionError> {
        check_shapes(&first, &second)?;
        for (into, part) in [(output.shape(), first.0.shape()), (logsumexp.shape(), first.1.shape())] {
            if into != part {
                return Err(AttentionError::MergeShape {
                    first: part.into(),
                    second: into.into(),
                    what: "the parts and what their merge is written into",
                });
            }
        }
        merge_checked((output, logsumexp), Some(first), second)
    }

    /// The output and the logsumexp, as [`merge_into`](Self::merge_into) takes a part.
    fn parts(&self) -> Part<'_, T, D> {
        (self.output.view(), self.logsumexp.view())
    }
}

/// One part of a merge, read in place: an output and its logsumexp.
pub type Part<'a, T, D> = (ArrayView<'a, T, D>, ArrayView<'a, T, <D as Dimension>::Smaller>);

/// Checks two parts' shapes for a merge: each logsumexp shaped as its output without the last
/// axis, and the two outputs of one shape.
fn check_shapes<T: Real, D: Dimension>(
    first: &Part<'_, T, D>,
    second: &Part<'_, T, D>,
) -> Result<(), AttentionError> {
    for (output, lse) in [first, second] {
        // An output has at least one axis, the row's (a 0-D one has no rows to merge).
        if output.ndim() == 0 || lse.shape() != &output.shape()[..output.ndim() - 1] {
            return Err(AttentionError::MergeShape {
                first: output.shape().into(),
                second: lse.shape().into(),
                what: "an output and its logsumexp, whose shape is the output's without its last axis",
            });
        }
    }
    if first.0.shape() != second.0.shape() {
        return Err(AttentionError::MergeShape {
            first: first.0.shape().into(),
            second: second.0.shape().into(),
            what: "two outputs of the same queries, of the same shape",
        });
    }
    Ok(())
}

/// Merges `second` into `mine`, or into `first` written to `mine` if given (see
/// [`PartialAttention::merge`]), a piece of rows at a time (each piece's values checked and then
/// merged while they are in cache, rather than a pass over everything for the checks, one to copy
/// and one to merge), the pieces shared with the pool as a pass over memory is
/// ([`work::PASS_PIECE`]). A piece with a value attention cannot produce writes nothing, and the
/// error names the first such value among those pieces ([`check_values`]); the other pieces are
/// merged. As `[rows, d]` pieces where every array lies row after row (most do: a row at a time
/// over a dynamic number of axes costs several times the arithmetic), as one piece in the arrays'
/// own shapes otherwise.
fn merge_checked<T: Real, D: Dimension>(
    (mut mine, mut mine_lse): (ArrayViewMut<T, D>, ArrayViewMut<T, D::Smaller>),
    first: Option<Part<'_, T, D>>,
    second: Part<'_, T, D>,
) -> Result<(), AttentionError> {
    let rows = (mine_lse.len(), mine.shape().last().copied().unwrap_or(1));
    let flat = (
        mine.view_mut().into_shape_with_order(rows),
        mine_lse.view_mut().into_shape_with_order(rows.0),
        first.as_ref().map(|first| as_rows(first, rows)),
        as_rows(&second, rows),
    );
    // Each piece's rows, and whether it merged.
    let (per, merged) = match flat {
        (Ok(mut mine), Ok(mut mine_lse), first @ (None | Some(Some(_))), Some(theirs)) => {
            let per = (work::PASS_PIECE / rows.1.max(1)).max(1);
            let pieces = rows.0.div_ceil(per);
            let first = first.flatten();
            let firsts: Vec<_> = match &first {
                Some(first) => pieces_of(first, per).map(Some).collect(),
                None => vec![None; pieces],
            };
            let pieces: Vec<_> = (mine.axis_chunks_iter_mut(Axis(0), per))
                .zip(mine_lse.axis_chunks_iter_mut(Axis(0), per))
                .zip(firsts)
                .zip(pieces_of(&theirs, per))
                .collect();
            let share = rows.0 * rows.1 >= work::PASS_SHARE_FROM && work::worth_sharing_a_pass();
            let merged = work::map_items(
                pieces,
                share,
                || (),
                |_, ((mine, first), theirs)| merge_piece(mine, first, theirs),
            );
            (per, merged)
        }
        _ => (
            rows.0.max(1),
            vec![merge_piece((mine.view_mut(), mine_lse.view_mut()), first.clone(), second.clone())],
        ),
    };
    if merged.iter().all(|&merged| merged) {
        return Ok(());
    }
    // Only the pieces that refused a value are read again: they wrote nothing, so they hold what
    // was given (a merged piece may hold a value no part did, an overflow of two finite rows).
    let refused = |row: usize| !merged[row / per];
    check_values("first", &first.unwrap_or((mine.view(), mine_lse.view())), refused)?;
    check_values("second", &second, refused)?;
    unreachable!("a piece of a merge refused values its checks pass")
}

/// `part` as `rows` rows, if it lies row after row.
fn as_rows<'a, T, D: Dimension>(
    (output, lse): &Part<'a, T, D>,
    rows: (usize, usize),
) -> Option<Part<'a, T, Ix2>> {
    Some((output.clone().into_shape_with_order(rows).ok()?, lse.clone().into_shape_with_order(rows.0).ok()?))
}

/// `part` in pieces of `per` rows.
fn pieces_of<'a, T>(
    (output, lse): &'a Part<'_, T, Ix2>,
    per: usize,
) -> impl Iterator<Item = Part<'a, T, Ix2>> {
    output.axis_chunks_iter(Axis(0), per).zip(lse.axis_chunks_iter(Axis(0), per))
}

/// Checks the values of `first` (or of `mine`, if not given) and of `theirs` ([`check_values`]);
/// if they are what attention produces, merges `theirs` into `mine` (`first` copied there first).
/// Whether it merged.
fn merge_piece<T: Real, D: Dimension>(
    (mut mine, mut mine_lse): (ArrayViewMut<T, D>, ArrayViewMut<T, D::Smaller>),
    first: Option<Part<'_, T, D>>,
    theirs: Part<'_, T, D>,
) -> bool {
    let produced = |(output, lse): &Part<'_, T, D>| !any(lse, bad_logsumexp) && finite::all_finite(output);
    if !produced(first.as_ref().unwrap_or(&(mine.view(), mine_lse.view()))) || !produced(&theirs) {
        return false;
    }
    if let Some((output, lse)) = first {
        copy(&mut mine, &output);
        copy(&mut mine_lse, &lse);
    }
    merge_lanes((mine, mine_lse), theirs);
    true
}

/// Merges `theirs` into `mine`, row by row.
fn merge_lanes<T: Real, D: Dimension>(
    (mut mine, mut mine_lse): (ArrayViewMut<T, D>, ArrayViewMut<T, D::Smaller>),
    (theirs, their_lse): Part<'_, T, D>,
) {
    let last = Axis(mine.ndim() - 1);
    Zip::from(mine.lanes_mut(last)).and(&mut mine_lse).and(theirs.lanes(last)).and(&their_lse).for_each(
        |mut mine, lse, theirs, &their_lse| {
            let m = lse.max(their_lse);
            if m == T::neg_infinity() {
                // Neither part sees a key: the row stays empty (zero output, -inf).
                return;
            }
            let (a, b) = ((*lse - m).exp(), (their_lse - m).exp());
            // At least 1 (one of the two is exp(0)): no row needs `normalised`'s empty case, and
            // each part's share is one multiplication an element.
            let total = a + b;
            let (share, their_share) = (a / total, b / total);
            let merge = |x: &mut T, &y: &T| *x = *x * share + y * their_share;
            match (mine.as_slice_mut(), theirs.as_slice()) {
                // A row side by side in both (most are): a loop the compiler vectorises.
                (Some(mine), Some(theirs)) => mine.iter_mut().zip(theirs).for_each(|(x, y)| merge(x, y)),
                _ => Zip::from(&mut mine).and(&theirs).for_each(merge),
            }
            *lse = softmax::logsumexp(m, total);
        },
    );
}

/// `into = from`, as one copy where both lie row after row (`assign` goes an element at a time
/// over a dynamic number of axes).
fn copy<T: Copy, D: Dimension>(into: &mut ArrayViewMut<'_, T, D>, from: &ArrayView<'_, T, D>) {
    match (into.as_slice_mut(), from.as_slice()) {
        (Some(into), Some(from)) => into.copy_from_slice(from),
        _ => into.assign(from),
    }
}

/// Whether any element of `a` is `bad`.
fn any<T, D: Dimension>(a: &ArrayView<'_, T, D>, bad: impl Fn(&T) -> bool) -> bool {
    // A chunk at a time without an early exit inside it, which the compiler vectorises.
    let chunks = |s: &[T]| s.chunks(256).any(|chunk| chunk.iter().fold(false, |seen, x| seen | bad(x)));
    a.as_slice_memory_order().map_or_else(|| a.iter().any(&bad), chunks)
}

/// Refuses a NaN or `+inf` logsumexp (`-inf` is a row that sees no key) and a non-finite output
/// element of `part`, naming the first among the rows `checked` takes (by their index in row-major
/// order).
fn check_values<T: Real, D: Dimension>(
    which: &'static str,
    (output, lse): &Part<'_, T, D>,
    checked: impl Fn(usize) -> bool,
) -> Result<(), AttentionError> {
    let bad = |argument, index: Vec<usize>, value: T, why| AttentionError::MergeValue {
        part: which,
        argument,
        index: Dims(index),
        value: value.to_f64_exact(),
        why,
    };
    // A row's index in row-major order, from its index over the logsumexp's axes.
    let row = |index: &[usize]| index.iter().zip(lse.shape()).fold(0, |row, (&i, &len)| row * len + i);
    // `indexed_iter` builds an index per element: slow, but only a refused merge comes here.
    let bad_lse = lse
        .indexed_iter()
        .find(|(i, l)| bad_logsumexp(*l) && checked(row(i.clone().into_dimension().slice())));
    if let Some((i, &l)) = bad_lse {
        let why = "a logsumexp is finite, or -inf for a row that sees no key";
        return Err(bad("logsumexp", i.into_dimension().slice().to_vec(), l, why));
    }
    let last = output.ndim() - 1;
    let bad_output = output.indexed_iter().find(|(i, x)| {
        let i = i.clone().into_dimension();
        !x.is_finite() && checked(row(&i.slice()[..last]))
    });
    if let Some((i, &x)) = bad_output {
        return Err(bad("output", i.into_dimension().slice().to_vec(), x, "an output is finite"));
    }
    Ok(())
}

/// A logsumexp attention cannot produce: NaN or `+inf` (`-inf` is a row that sees no key).
fn bad_logsumexp<T: Real>(lse: &T) -> bool {
    lse.is_nan() || *lse == T::infinity()
}
