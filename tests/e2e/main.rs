//! End-to-end tests of the whole workspace, driving the real `xtask` binary as a user would.

mod attend;
mod browser;
mod content;
mod python;
mod serve;
mod support;
mod workspace;
