//! The engine's entry points, compiled once in this crate for the element types callers use.
//!
//! Generic code is compiled where it is used. At opt-level 0 and 1 rustc shares generics: a crate
//! links to a copy that a dependency already compiled instead of compiling its own. Naming the
//! entry points here compiles them, and everything they call, when qkv itself is compiled, so the
//! engine's test binaries, its examples and the lesson build (all dev builds) do not each compile
//! the engine again. Measured on Zen 3, 2 cores: the `train_copy` example from 15 s to 3 s.
//! Optimised builds (opt-level 2 and 3) share nothing, and the unit tests build the crate itself,
//! so both leave this out.

use crate::*;

/// The instances that more than one dev build would otherwise compile: the f64 entry points of
/// the lesson build (the reference, the traces, the calculator's fast path, projections) and of
/// the training example, and the f32 cache and multi-head attention of the decoder example. Each
/// is also in the engine's test binary. The rest (f32 single-head and backward, the half-precision
/// paths, `_into` forms) only the engine's tests use, so they stay there: compiled here they would
/// only move time from the first `cargo test` into the first `cargo xtask build-content`.
/// Never called: naming an instance is what compiles it.
#[doc(hidden)]
pub fn entry_points() -> [*const (); 20] {
    [
        reference::attention::<f64> as *const (),
        reference::attention_with_lse::<f64> as *const (),
        reference::attention_backward::<f64> as *const (),
        trace_query::<f64> as *const (),
        trace_tiled::<f64> as *const (),
        alibi_slopes::<f64> as *const (),
        attention::<f64> as *const (),
        attention_with_weights::<f64> as *const (),
        multi_head_attention::<f64> as *const (),
        multi_head_attention_with_lse::<f64> as *const (),
        multi_head_attention_backward::<f64> as *const (),
        Projections::<f64>::project as *const (),
        Projections::<f64>::project_cross as *const (),
        Projections::<f64>::self_attention as *const (),
        multi_head_attention::<f32> as *const (),
        KvCache::<f32>::new as *const (),
        KvCache::<f32>::layer as *const (),
        CacheLayer::<f32>::append as *const (),
        CacheLayer::<f32>::attend::<f32> as *const (),
        CacheLayer::<f32>::attend_into::<f32, f32> as *const (),
    ]
}
