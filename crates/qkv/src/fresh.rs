//! Outputs the engine allocates itself (`attention`, `multi_head_attention`), written without
//! being zeroed first. Zeroing a 1 MiB output on the calling thread, while the other threads
//! waited for their work, was 6% of a call of 32 heads × 128 queries at two threads (Intel Xeon
//! family 6 model 207, `repeat --pool 128 128 0 1500 32 32`); PyTorch's outputs are not zeroed
//! either.
//!
//! Fresh memory reaches one writer only: the tiled path (`flash::attend`), which writes every
//! element of every row (again, after a decoding attempt whose check failed) and checks that each
//! block of rows was written before it returns. Every other path takes the output zeroed
//! ([`Output::held`], `kernels::zeroed`). Taking fresh memory as written by another module
//! happens here alone ([`FreshArray::written`]), and rests on that convention: a new path that
//! returns `Ok` must write the output through one of the two. The engine tests' allocator fills
//! unzeroed memory with NaN, so that one that does not shows in every test.

use std::mem::MaybeUninit;

use ndarray::{Array, ArrayViewMut, Dimension, ShapeBuilder};

use crate::error::AttentionError;
use crate::kernels::{self, Element, OutRows};

/// Where a result is written: elements the caller holds, or fresh memory that the engine
/// allocated.
pub(crate) enum Output<'a, O, D: Dimension> {
    /// Initialised elements (the caller's, or fresh ones zeroed).
    Held(ArrayViewMut<'a, O, D>),
    /// Memory not yet written: only the tiled path writes it as it stands.
    Fresh(ArrayViewMut<'a, MaybeUninit<O>, D>),
}

impl<'a, O: Element, D: Dimension> Output<'a, O, D> {
    /// The elements, fresh memory zeroed first: for every path but the tiled one.
    pub(crate) fn held(self) -> ArrayViewMut<'a, O, D> {
        match self {
            Output::Held(out) => out,
            Output::Fresh(out) => kernels::zeroed(out),
        }
    }

    /// The same output, borrowed for a shorter time.
    pub(crate) fn reborrow(&mut self) -> Output<'_, O, D> {
        match self {
            Output::Held(out) => Output::Held(out.view_mut()),
            Output::Fresh(out) => Output::Fresh(out.view_mut()),
        }
    }

    /// Whether it has no elements.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Output::Held(out) => out.is_empty(),
            Output::Fresh(out) => out.is_empty(),
        }
    }

    /// Its subviews along the outermost axis, in order.
    pub(crate) fn into_outer(self) -> impl Iterator<Item = Output<'a, O, D::Smaller>>
    where
        D: ndarray::RemoveAxis,
    {
        let (held, fresh) = match self {
            Output::Held(out) => (Some(out.into_outer_iter_mut()), None),
            Output::Fresh(out) => (None, Some(out.into_outer_iter_mut())),
        };
        let held = held.into_iter().flatten().map(Output::Held);
        held.chain(fresh.into_iter().flatten().map(Output::Fresh))
    }
}

impl<'a, O: Element> Output<'a, O, ndarray::Ix2> {
    /// The rows as the tiled path writes them.
    pub(crate) fn rows(self) -> OutRows<'a, O::Compute> {
        match self {
            Output::Held(out) => O::out_rows(out),
            Output::Fresh(out) => O::fresh_rows(out),
        }
    }
}

/// A new array that the engine writes before it is returned, allocated without zeroing.
pub(crate) struct FreshArray<O, D: Dimension>(Array<MaybeUninit<O>, D>);

impl<O: Element, D: Dimension> FreshArray<O, D> {
    /// An array of `shape`, not yet written.
    pub(crate) fn new(shape: impl ShapeBuilder<Dim = D>) -> Self {
        FreshArray(Array::uninit(shape))
    }

    /// The array to write, as fresh memory.
    pub(crate) fn output(&mut self) -> Output<'_, O, D> {
        Output::Fresh(self.0.view_mut())
    }

    /// The array, once `written` (the result of the call [`output`](Self::output) was given to)
    /// succeeded; its error otherwise.
    pub(crate) fn written(self, written: Result<(), AttentionError>) -> Result<Array<O, D>, AttentionError> {
        written?;
        // SAFETY: the call succeeded, and fresh memory is written only by the tiled path, which
        // writes every element of every row it was given and checks that every block of rows was
        // written (`flash::Attend::run`), or is zeroed first (`Output::held`). On a panic or an
        // error the array is dropped unread, as `MaybeUninit`.
        Ok(unsafe { self.0.assume_init() })
    }
}
