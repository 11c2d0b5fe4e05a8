//! Tests of the engine's public API: every path against the f64 reference, the properties
//! attention must have, multi-head layouts, and the errors.

mod errors;
mod lesson;
mod multi_head;
mod oracle;
mod problem;
mod properties;
