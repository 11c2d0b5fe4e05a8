//! Large buffers a call is done with, kept on its thread for the next call.
//!
//! A call that allocates its working memory afresh and frees it at the end gets that memory
//! faulted in page by page on every call: glibc's allocator returns the free top of its heap to
//! the OS once it passes its trim threshold, and mapped chunks on every free. For the backward at
//! n = 1024, d = 128 on two threads that was about 430 page faults a call and about 9% of its
//! time (Zen 3, `crates/qkv-bench/results/2026-12-04-zen3-spare-buffers.md`). Kept here, the
//! buffers are taken again by the next call on the same thread, whatever the allocator.
//!
//! At most [`KEEP_BYTES`] are kept per thread, the oldest dropped first; a buffer is zeroed
//! before anything can read it (when it is taken, or by the thread that fills it), so nothing one
//! call leaves in it reaches the next. A thread's buffers are freed when the thread ends.

use std::any::{Any, TypeId};
use std::cell::RefCell;

use crate::kernels::{Buffer, Element};

/// The most a thread keeps: a call whose buffers are larger does enough arithmetic per byte that
/// faulting them in is a small part of its time (16 MiB holds a single head's backward up to
/// n = 2048 at d = 128 in f32).
const KEEP_BYTES: usize = 16 << 20;

/// A kept buffer, of any element type, with its type and size in bytes beside it: a small call
/// takes and keeps some fifty buffers against a list as long, and asking each boxed buffer for
/// its type and capacity was a fifth of an 8 × 8-query backward (Zen 4).
struct Kept {
    ty: TypeId,
    bytes: usize,
    buffer: Box<dyn Any>,
}

/// A thread's kept buffers, oldest first, and their bytes in all.
struct Shelf {
    kept: Vec<Kept>,
    bytes: usize,
}

thread_local! {
    /// This thread's kept buffers.
    static KEPT: RefCell<Shelf> = const { RefCell::new(Shelf { kept: Vec::new(), bytes: 0 }) };
}

/// The smallest kept buffer of `T` that holds `len` elements, or none yet, to be zeroed by
/// whichever thread will fill it ([`Unzeroed::zeroed`]): the memset is then shared out with the
/// rest of that work, and the buffer still comes back to this thread's list.
pub(crate) fn take<T: Element>(len: usize) -> Unzeroed<T> {
    let (ty, needed) = (TypeId::of::<Buffer<T>>(), Buffer::<T>::bytes_holding(len));
    let kept = KEPT.with_borrow_mut(|shelf| {
        let fits = |k: &Kept| k.ty == ty && k.bytes >= needed;
        let best = shelf.kept.iter().enumerate().filter(|(_, k)| fits(k)).min_by_key(|(_, k)| k.bytes)?.0;
        let kept = shelf.kept.remove(best);
        shelf.bytes -= kept.bytes;
        Some(kept)
    });
    Unzeroed { kept: kept.and_then(|k| k.buffer.downcast::<Buffer<T>>().ok()).map(|b| *b), len }
}

/// A buffer of `len` elements taken by [`take`], whose contents (whatever the last call left)
/// can only be reached zeroed.
pub(crate) struct Unzeroed<T: Element> {
    kept: Option<Buffer<T>>,
    len: usize,
}

impl<T: Element> Unzeroed<T> {
    /// The elements it will hold.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// `len` zeros, in the kept memory or in new memory.
    pub(crate) fn zeroed(self) -> Buffer<T> {
        match self.kept {
            Some(mut buffer) => {
                buffer.reset_zeros(self.len);
                buffer
            }
            None => Buffer::zeros(self.len),
        }
    }
}

/// Keeps `buffer` for a later [`take`] on this thread, dropping the oldest kept buffers to stay
/// within [`KEEP_BYTES`] (or `buffer` itself if it is larger than that).
pub(crate) fn keep<T: Element>(buffer: Buffer<T>) {
    let bytes = buffer.capacity_bytes();
    if bytes > KEEP_BYTES {
        return;
    }
    KEPT.with_borrow_mut(|shelf| {
        let mut oldest = 0;
        while shelf.bytes + bytes > KEEP_BYTES {
            shelf.bytes -= shelf.kept[oldest].bytes;
            oldest += 1;
        }
        shelf.kept.drain(..oldest);
        shelf.bytes += bytes;
        shelf.kept.push(Kept { ty: TypeId::of::<Buffer<T>>(), bytes, buffer: Box::new(buffer) });
    });
}

#[cfg(test)]
mod tests;
