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
//!
//! A ring that keeps its first `k` positions as sink tokens (StreamingLLM,
//! [`KvCache::with_sink_tokens`](super::KvCache::with_sink_tokens)) holds them in slots `0 .. k`
//! for good, and its ring proper from slot `first_slot` (`k` rounded up to whole key panels, so
//! that the ring's keys are panels of their own) on: position `p >= k` lives in slot
//! `first_slot + (p - k) % capacity`. The sink tokens are a third part of the step's problem,
//! keys `0 .. k` at their own positions under the causal mask alone; the ring's runs are those
//! of the positions from `k` on, so no position is in two parts.

use ndarray::ArrayView2;

use crate::mask::SlidingWindow;

/// A windowed layer's ring of `capacity` slots, each query seeing the last `window` positions
/// up to its own (`capacity >= window`, both positive), and the first `sink_tokens` positions,
/// kept in slots of their own before the ring's, which starts at slot `first_slot`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ring {
    pub(crate) window: usize,
    pub(crate) capacity: usize,
    pub(crate) sink_tokens: usize,
    pub(crate) first_slot: usize,
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
    /// A ring of `capacity` slots and no sink tokens.
    pub(crate) fn new(window: usize, capacity: usize) -> Ring {
        Ring { window, capacity, sink_tokens: 0, first_slot: 0 }
    }

    /// The slot that holds position `position`.
    pub(crate) fn slot(self, position: usize) -> usize {
        match position.checked_sub(self.sink_tokens) {
            Some(in_ring) => self.first_slot + in_ring % self.capacity,
            None => position,
        }
    }

    /// Of `len` positions appended, those that went to the ring (the sink tokens' excepted).
    pub(crate) fn ring_len(self, len: usize) -> usize {
        len.saturating_sub(self.sink_tokens)
    }

    /// The oldest position a layer holds once `n_new` positions are appended after `len`, if it
    /// held every position from `oldest` on before: each new position writes over the slot of
    /// the one `capacity` before it. The positions held are always one run, from this oldest to
    /// the last (and the sink tokens): appends move its start on, and a truncation cuts its end
    /// without giving back what the positions it cut wrote over.
    pub(crate) fn oldest_after_append(self, oldest: usize, len: usize, n_new: usize) -> usize {
        oldest.max((len + n_new).saturating_sub(self.capacity))
    }

    /// Positions held of the first `len`, the ring's from `oldest` on: the sink tokens and the
    /// ring's.
    pub(crate) fn held(self, len: usize, oldest: usize) -> usize {
        len.min(self.sink_tokens) + len.saturating_sub(oldest.max(self.sink_tokens))
    }

    /// Whether position `position` of an append that ends at position `end` (exclusive) is
    /// written over by a later position of the same append.
    pub(crate) fn overwritten(self, position: usize, end: usize) -> bool {
        position >= self.sink_tokens && end - position > self.capacity
    }

    /// Whether a layer whose ring holds the positions from `oldest` on holds every position
    /// before `next` that the window of position `next` needs (the sink tokens are never written
    /// over; a window of 1 needs none).
    pub(crate) fn holds_window_of(self, oldest: usize, next: usize) -> bool {
        let needed = (next + 1).saturating_sub(self.window).max(self.sink_tokens);
        needed >= next || oldest <= needed
    }

    /// The most queries one step over `len` positions may have, the ring holding those from
    /// `oldest` on: the window of the first of them and the step's own positions must all be
    /// held. Before anything is written over, every window is (no limit: `usize::MAX`); from
    /// then on `window + n_q - 1 <= capacity` (fewer right after a truncation, whose cut
    /// positions wrote over older ones).
    pub(crate) fn largest_step(self, len: usize, oldest: usize) -> usize {
        if oldest <= self.sink_tokens {
            return usize::MAX;
        }
        // The first query, at `len - n_q`, sees back to `len - n_q + 1 - window`; the ring holds
        // at most `capacity` positions back from `len`, so this is at most
        // `capacity - window + 1`.
        (len + 1).saturating_sub(self.window + oldest)
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
    /// `head` of that run. Before the ring wraps the older run reads nothing, and the newer one
    /// holds every position: a step may then take them all.
    pub(crate) fn runs(self, len: usize) -> [Run; 2] {
        let len = self.ring_len(len);
        let head = len % self.capacity;
        let older = if len >= self.capacity { self.capacity } else { 0 };
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
        debug_assert_eq!(self.sink_tokens, 0, "a ring with sink tokens takes no keep mask");
        // Column `c` of `keep` is the `c`-th position held, oldest first.
        let (head, oldest) = (len % self.capacity, len - keep.ncols());
        let (n_queries, width) = (keep.nrows(), head + self.capacity);
        if buffer.len() < n_queries * width {
            buffer.resize(n_queries * (2 * self.capacity - 1), false);
        }
        let by_slot = &mut buffer[..n_queries * width];
        for (i, row) in by_slot.chunks_exact_mut(width).enumerate() {
            for (j, kept) in row.iter_mut().enumerate() {
                // The newer run's slots hold the positions just before `len`, the older run's
                // those `capacity` before (none before the ring wraps).
                let position = if j < head {
                    Some(len - head + j)
                } else if j < self.capacity {
                    (len + j).checked_sub(head + self.capacity)
                } else {
                    None
                };
                let column = position.and_then(|p| p.checked_sub(oldest));
                *kept = column.is_some_and(|c| keep[[i, c]]);
            }
        }
        ArrayView2::from_shape((n_queries, width), &*by_slot).expect("the rows fit")
    }
}
