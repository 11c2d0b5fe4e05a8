//! The Python package's pytest suite (`crates/qkv-python/tests`), run by the interpreter named in
//! `QKV_PYTHON` (default `python3`) once it has torch, pytest and the installed `qkv` package
//! (`pip install ./crates/qkv-python`); skipped with a message otherwise, failed under `CI`.

use std::path::Path;
use std::process::Command;

use crate::support::interpreter_imports;

#[test]
fn the_python_package_passes_its_pytest_suite() {
    let test = "the_python_package_passes_its_pytest_suite";
    let python = std::env::var("QKV_PYTHON").unwrap_or_else(|_| "python3".into());
    if !interpreter_imports(test, &python, &["torch", "pytest", "numpy", "qkv.distributed"]) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace root");
    // `-p no:cacheprovider`: pytest writes no `.pytest_cache` into the checkout.
    let run = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "crates/qkv-python/tests"])
        .current_dir(root)
        .output()
        .expect("the interpreter runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "pytest failed:\n{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    // Which `qkv` it tested: an installed copy goes stale when the Rust code changes.
    let location =
        Command::new(&python).args(["-c", "import qkv; print(qkv.__file__)"]).output().expect("runs");
    eprintln!(
        "{test}: {} ({})",
        stdout.lines().last().unwrap_or(""),
        String::from_utf8_lossy(&location.stdout).trim()
    );
}
