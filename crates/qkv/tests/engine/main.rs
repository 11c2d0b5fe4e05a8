//! Tests of the engine's public API: every path against the f64 reference, the properties
//! attention must have, multi-head layouts, the errors, and the choice of SIMD level.

mod allocations;
mod backward;
mod batched;
mod cache_options;
mod errors;
mod half_output;
mod half_precision;
mod kv_cache;
mod lesson;
mod lse;
mod multi_head;
mod oracle;
mod package;
mod paged;
mod problem;
mod properties;
mod quantized;
mod ring;
mod rotary;
mod simd;
mod sink_tokens;
mod sinks;
mod softcap;
mod tiled;
mod unseen;
mod varlen;
