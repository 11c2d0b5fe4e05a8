//! The ring buffer of a windowed [`KvCache`](super::KvCache): which slot holds which position,
//! and how a step reads the slots in their own order while its masks see absolute positions.
//!
//! Position `p` lives in slot `p % capacity`. Once the ring has wrapped, its slots hold two runs
//! of consecutive positions: slots `head ..` the older ones and slots `.. head` the newer ones
//! (`head = len % capacity`, the slot the next position takes). Each run is one part of the
//! step's problem (`flash::CachedCall::parts`): a problem whose key `j` is slot `j`, placed among
//! keys of its own so that the bottom-right causal mask, the window and ALiBi, all of which see
//! only distances, measure the distance between absolute positions. The softmax does not care
//! in which order the keys come; the masks do, and this is how they learn the positions.

use ndarray::ArrayView2;

use crate::mask::SlidingWindow;

/// A windowed layer's ring of `capacity` slots, each query seeing the last `window` positions
/// up to its own (`capacity >= window`, both positive).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    pub(crate) window: usize,
    pub(crate) capacity: usize,
}

/// One run of slots as a part of a step's problem: `n_keys` keys whose key `j` is slot `j`, the
/// run's positions at the end of them (where the bottom-right masks place them against the
/// queries), and only the keys before `key_length` stored. Slots of the other run that fall
/// inside `0 .. key_length` lie outside every query's window (see [`Ring::runs`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Run {
    pub(crate) n_keys: usize,
    pub(crate) key_length: usize,
}

impl Ring {
    /// The slot that holds position `position`.
    pub(crate) fn slot(self, position: usize) -> usize {
        position % self.capacity
    }

    /// Positions held after `len` were appended.
    pub(crate) fn held(self, len: usize) -> usize {
        len.min(self.capacity)
    }

    /// The most queries one step may have: the window of the first of them and the step's own
    /// positions must all be held, `window + n_q - 1 <= capacity`.
    pub(crate) fn largest_step(self) -> usize {
        self.capacity - self.window + 1
    }

    /// The window as the dense masks spell it: the query and `window - 1` positions back.
    pub(crate) fn sliding_window(self) -> SlidingWindow {
        SlidingWindow::new(self.window - 1, 0)
    }

    /// The runs of a layer holding `len` positions, older first: the slots from `head` on (their
    /// positions `capacity` keys before the newer run's, so `n_keys = head + capacity`, stored up
    /// to the last slot; nothing yet before the ring wraps), then the slots before `head`.
    ///
    /// In the older run the slots before `head` stand for positions older than anything held,
    /// and no query sees them: a step's first query, at position `len - n_q`, sees back to
    /// `len - n_q - window + 1 >= len - capacity` when `n_q <= largest_step`, which is slot
    /// `head` of that run.
    pub(crate) fn runs(self, len: usize) -> [Run; 2] {
        let head = len % self.capacity;
        let older = if len >= self.capacity { self.capacity } else { head };
        [Run { n_keys: head + self.capacity, key_length: older }, Run { n_keys: head, key_length: head }]
    }

    /// `keep` (`[n_q, held]`, a column per position held, oldest first) laid out by slot in
    /// `buffer` for [`Self::runs`]: `[n_q, head + capacity]`, column `j` for slot `j`, `false`
    /// where no position is held. The older run reads every column, the newer one the first
    /// `head`. The buffer only grows, and at once to the widest layout (`head` is at most
    /// `capacity - 1`), so that the steps after a first one allocate nothing as `head` moves on.
    pub(crate) fn keep_by_slot<'b>(
        self,
        len: usize,
        keep: ArrayView2<bool>,
        buffer: &'b mut Vec<bool>,
    ) -> ArrayView2<'b, bool> {
        let (head, held) = (len % self.capacity, self.held(len));
        let wrapped = len >= self.capacity;
        let (n_queries, width) = (keep.nrows(), head + self.capacity);
        if buffer.len() < n_queries * width {
            buffer.resize(n_queries * (2 * self.capacity - 1), false);
        }
        let by_slot = &mut buffer[..n_queries * width];
        for (i, row) in by_slot.chunks_exact_mut(width).enumerate() {
            for (j, kept) in row.iter_mut().enumerate() {
                let column = if j < head {
                    Some(j + held - head)
                } else if wrapped && j < self.capacity {
                    Some(j - head)
                } else {
                    None
                };
                *kept = column.is_some_and(|c| keep[[i, c]]);
            }
        }
        ArrayView2::from_shape((n_queries, width), &*by_slot).expect("the rows fit")
    }
}
