//! End-to-end tests of the whole workspace, driving the real `xtask` binary as a user would.
//!
//! One integration binary with a module per concern, not one binary per file: each binary links
//! the workspace again. The `xtask` package declares it (`xtask/Cargo.toml`, `[[test]] e2e`), so
//! Cargo builds the real `xtask` binary for it. The modules: `attend` (the calculator, against
//! NumPy), `content` (the lesson build: check, build, errors, notebooks), `serve` (the preview,
//! under floods), `browser` (the built site in chromium), `layers` (every import of the engine
//! and of the course points down a layer), `workspace` (what a first `cargo test` compiles).
//! Expected numbers come from the lesson's records and the engine's f64 reference, computed
//! here, never from the page's script.

mod attend;
mod browser;
mod content;
mod layers;
mod python;
mod serve;
mod support;
mod workspace;
