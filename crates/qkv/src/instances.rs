//! The engine's entry points, compiled once in this crate for the element types callers use.
//!
//! Generic code is compiled where it is used. At opt-level 0 and 1 rustc shares generics: a crate
//! links to a copy that a dependency already compiled instead of compiling its own. Naming the
//! entry points here compiles them, and everything they call, when qkv itself is compiled, so the
//! engine's test binaries, its examples and the lesson build (all dev builds) do not each compile
//! the engine again. Measured on Zen 3, 2 cores: the `train_copy` example from 15 s to 3 s.
//! Optimised builds (opt-level 2 and 3) share nothing, and the unit tests build the crate itself,
//! so both leave this out.

use ::half::{bf16, f16};
use ndarray::Ix4;

use crate::*;

/// One instance of every public generic entry point per element type (f32 and f64 for the
/// computing types, f32, bf16 and f16 for storage). Never called: naming an instance is what
/// compiles it.
#[doc(hidden)]
pub fn entry_points() -> Vec<*const ()> {
    macro_rules! computing {
        ($($t:ty),*) => {
            vec![$(vec![
                attention::<$t> as *const (),
                attention_into::<$t> as *const (),
                attention_with_lse::<$t> as *const (),
                attention_with_weights::<$t> as *const (),
                multi_head_attention::<$t> as *const (),
                multi_head_attention_into::<$t> as *const (),
                multi_head_attention_with_lse::<$t> as *const (),
                attention_backward::<$t> as *const (),
                attention_backward_into::<$t> as *const (),
                multi_head_attention_backward::<$t> as *const (),
                multi_head_attention_backward_into::<$t> as *const (),
                reference::attention::<$t> as *const (),
                reference::attention_with_lse::<$t> as *const (),
                reference::attention_backward::<$t> as *const (),
                trace_query::<$t> as *const (),
                trace_tiled::<$t> as *const (),
                alibi_slopes::<$t> as *const (),
                Projections::<$t>::project as *const (),
                Projections::<$t>::project_cross as *const (),
                Projections::<$t>::self_attention as *const (),
                PartialAttention::<$t>::merge as *const (),
                PartialAttention::<$t, Ix4>::merge as *const (),
            ]),*].concat()
        };
    }
    macro_rules! storage {
        ($($e:ty),*) => {
            vec![$(vec![
                KvCache::<$e>::new as *const (),
                KvCache::<$e>::layer as *const (),
                CacheLayer::<$e>::append as *const (),
                CacheLayer::<$e>::attend as *const (),
                CacheLayer::<$e>::attend_into as *const (),
            ]),*].concat()
        };
    }
    [
        computing!(f32, f64),
        storage!(f32, bf16, f16),
        vec![attention_half::<bf16> as *const (), attention_half::<f16> as *const ()],
    ]
    .concat()
}
