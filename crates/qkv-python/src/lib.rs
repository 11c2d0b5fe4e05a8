//! `qkv._qkv`, the extension module under the Python package `qkv` (`python/qkv`): the engine's
//! entry points over tensors the package describes as `raw::Raw` (an address, a dtype, a shape
//! and strides), so that torch tensors and NumPy arrays go in and come out without a copy.
//!
//! The package does the Python side: PyTorch's argument conventions, broadcasting, allocating
//! outputs, autograd and `torch.distributed`. Everything here runs with the GIL released, and
//! the engine's errors become `ValueError` with its message; a panic becomes `RuntimeError`
//! instead of unwinding into the interpreter.

mod cache;
mod dense;
mod raw;
mod team;

use std::panic::{AssertUnwindSafe, catch_unwind};

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

/// The engine's error as Python's `ValueError`, with the engine's message.
fn value_error(error: qkv::AttentionError) -> PyErr {
    PyValueError::new_err(error.to_string())
}

/// Runs `work` with the GIL released (other Python threads run meanwhile), on PyTorch's OpenMP
/// threads where the package found them (`team::run`), turning a panic into `RuntimeError`.
fn detached<R: Send>(py: Python<'_>, work: impl FnOnce() -> PyResult<R> + Send) -> PyResult<R> {
    let call = || team::run(work);
    py.detach(|| catch_unwind(AssertUnwindSafe(call))).unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Err(PyRuntimeError::new_err(format!("qkv: internal error (please report it): {message}")))
    })
}

/// One line naming the SIMD level the kernels run at and why (`qkv::simd_report`).
#[pyfunction]
fn simd_report() -> String {
    qkv::simd_report()
}

/// The ALiBi paper's slopes for `heads` heads (`qkv::alibi_slopes`).
#[pyfunction]
fn alibi_slopes(heads: usize) -> Vec<f64> {
    qkv::alibi_slopes(heads)
}

/// The module `qkv._qkv`.
#[pymodule]
fn _qkv(module: &Bound<'_, PyModule>) -> PyResult<()> {
    // The package's version is the crate's (maturin reads it from Cargo.toml).
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    module.add_function(wrap_pyfunction!(simd_report, module)?)?;
    module.add_function(wrap_pyfunction!(alibi_slopes, module)?)?;
    dense::register(module)?;
    cache::register(module)?;
    team::register(module)?;
    Ok(())
}
