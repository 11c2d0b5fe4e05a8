//! Input checks: every element finite, and the largest magnitude measured in the same pass, by
//! the dispatched level's [`Kernels::magnitude`]. Every call reads its whole inputs here before
//! its work is shared out, so the pass is vectorised at the level the kernels run at rather than
//! at the baseline the rest of the crate compiles for, and large inputs are read in pieces the
//! pool shares.

use ndarray::{ArrayBase, ArrayView, Data, Dimension};

use crate::element::Real;
use crate::error::{AttentionError, Dims};
use crate::kernels::{self, Element, Isa, Job, Kernels};
use crate::shape::Magnitudes;
use crate::simd;
use crate::work::{self, PASS_PIECE, PASS_SHARE_FROM};

/// Fails with the index of the first NaN or infinite element of `a`.
pub(crate) fn check_finite<S, T, D>(argument: &'static str, a: &ArrayBase<S, D>) -> Result<(), AttentionError>
where
    S: Data<Elem = T>,
    T: Real,
    D: Dimension,
{
    finite_magnitude(argument, a).map(|_| ())
}

impl Magnitudes {
    /// Checks that `q`, `k`, `v` are finite and measures them, one pass each.
    pub(crate) fn measure<S: Data<Elem = E>, T: Real, E: Element<Compute = T>, D: Dimension>(
        q: &ArrayBase<S, D>,
        k: &ArrayBase<S, D>,
        v: &ArrayBase<S, D>,
    ) -> Result<Magnitudes, AttentionError> {
        Ok(Magnitudes {
            queries: finite_magnitude("queries", q)?,
            keys: finite_magnitude("keys", k)?,
            values: finite_magnitude("values", v)?,
        })
    }
}

/// The largest `|x|` in `a` (widened, for a half-precision format), or the error naming the
/// first NaN or infinite element.
pub(crate) fn finite_magnitude<S, T, E, D>(
    argument: &'static str,
    a: &ArrayBase<S, D>,
) -> Result<f64, AttentionError>
where
    S: Data<Elem = E>,
    T: Real,
    E: Element<Compute = T>,
    D: Dimension,
{
    // Contiguous runs in one kernel pass, whose result is non-finite exactly when an element is.
    // Without a level (`QKV_SIMD` names none this CPU runs, an error the call reports once it
    // asks for its kernels), or with rows that are not contiguous, the elements are read one by
    // one. Only a failing input pays for finding the index.
    match simd::kernels_for(None).ok().and_then(|isa| kernel_magnitude(isa, a)) {
        Some(largest) if largest.is_finite() => return Ok(largest.to_f64_exact()),
        Some(_) => {}
        None if a.iter().all(|x| x.widen().is_finite()) => {
            return Ok(a.iter().fold(0.0, |m: f64, x| m.max(x.widen().to_f64_exact().abs())));
        }
        None => {}
    }
    let flat = a.iter().position(|x| !x.widen().is_finite()).unwrap_or(0);
    // `iter` walks in logical row-major order, so the flat position unravels against the shape.
    let mut index = vec![0; a.ndim()];
    let mut rest = flat;
    for (slot, &len) in index.iter_mut().zip(a.shape()).rev() {
        *slot = rest % len;
        rest /= len;
    }
    let value = a.iter().nth(flat).map_or(f64::NAN, |x| x.widen().to_f64_exact());
    Err(AttentionError::NonFinite { argument, index: Dims(index), value })
}

/// Whether every element of `a` is finite, read as [`finite_magnitude`] reads it (one vectorised
/// pass at the dispatched level), for checks whose errors say more than "not finite".
pub(crate) fn all_finite<T: Real, D: Dimension>(a: &ArrayView<'_, T, D>) -> bool {
    match simd::kernels_for(None).ok().and_then(|isa| kernel_magnitude(isa, a)) {
        Some(largest) => largest.is_finite(),
        None => a.iter().all(|x| x.is_finite()),
    }
}

/// The largest magnitude of `a` by the kernels of `isa` (non-finite if an element is), reading
/// contiguous runs: the whole array where it is contiguous (in any axis order), row by row where
/// only its rows are (some heads' rows of a larger array, say; read element by element, calls on
/// 8 prefills' slices of one batch took 1.6 times as long on a Zen 5: `varlen --per-sequence
/// prefill8` in qkv-bench); `None` where a row is strided. Allocates only when it shares the pass.
fn kernel_magnitude<S, E, D>(isa: Isa, a: &ArrayBase<S, D>) -> Option<E::Compute>
where
    S: Data<Elem = E>,
    E: Element,
    D: Dimension,
{
    if let Some(data) = a.as_slice_memory_order() {
        if data.len() < PASS_SHARE_FROM {
            return Some(isa.run::<E, _>(Largest(std::iter::once(data))));
        }
        return Some(largest_of_pieces(isa, data.chunks(PASS_PIECE).map(std::iter::once).collect()));
    }
    let rows = || a.rows().into_iter().map(|row| row.to_slice());
    if rows().any(|row| row.is_none()) {
        return None;
    }
    let rows = rows().map(|row| row.expect("every row is contiguous"));
    if a.len() < PASS_SHARE_FROM {
        return Some(isa.run::<E, _>(Largest(rows)));
    }
    let rows: Vec<&[E]> = rows.collect();
    let per_piece = (PASS_PIECE / a.shape().last().map_or(1, |&len| len.max(1))).max(1);
    Some(largest_of_pieces(isa, rows.chunks(per_piece).map(|piece| piece.iter().copied()).collect()))
}

/// The largest magnitude of the pieces' elements, the pieces shared with the pool; the caller
/// starts at once (`work::map_items`).
fn largest_of_pieces<'a, E: Element, I: Iterator<Item = &'a [E]> + Send>(
    isa: Isa,
    pieces: Vec<I>,
) -> E::Compute {
    let share = work::worth_sharing_a_pass();
    let largest = work::map_items(pieces, share, || (), |_, piece| isa.run::<E, _>(Largest(piece)));
    largest.into_iter().fold(num_traits::Zero::zero(), kernels::larger_magnitude)
}

/// The largest magnitude of some contiguous runs of elements, at the level that runs it.
struct Largest<I>(I);

impl<'a, E: Element, I: Iterator<Item = &'a [E]>> Job<E> for Largest<I> {
    type Output = E::Compute;

    fn run<K: Kernels<E::Compute, E>>(self, kernels: K) -> E::Compute {
        let magnitudes = self.0.map(|run| kernels.magnitude(run));
        magnitudes.fold(num_traits::Zero::zero(), kernels::larger_magnitude)
    }
}

#[cfg(test)]
mod tests;
