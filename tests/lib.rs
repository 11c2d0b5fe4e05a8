//! Support crate for the end-to-end tests in `e2e/`; it has no code of its own.
