//! Running the `xtask` binary and reading what it printed.

use std::path::Path;
use std::process::{Child, Command, Output};

/// The result of one `cargo xtask ...` run.
pub struct Run {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `xtask` with `args`, from the workspace root.
pub fn xtask(args: &[&str]) -> Run {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace root");
    let Output { status, stdout, stderr } =
        Command::new(env!("CARGO_BIN_EXE_xtask")).args(args).current_dir(root).output().expect("xtask runs");
    Run {
        status: status.code().unwrap_or(-1),
        stdout: String::from_utf8(stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(stderr).expect("utf-8 stderr"),
    }
}

/// Whether `python3 -c "import numpy"` works; prints why a test skips when it does not.
pub fn numpy_available(test: &str) -> bool {
    python_modules_available(test, &["numpy"])
}

/// Whether python3 can import every one of `modules`; prints why a test skips when it cannot.
/// With `CI` set a missing module fails the test instead, as a missing browser does: `.ci/run`
/// installs them, so CI never goes green by skipping the NumPy and notebook checks.
pub fn python_modules_available(test: &str, modules: &[&str]) -> bool {
    interpreter_imports(test, "python3", modules)
}

/// Whether `python` (a path or a command on `PATH`) can import every one of `modules`, with the
/// same skip message and the same failure under `CI` as [`python_modules_available`].
pub fn interpreter_imports(test: &str, python: &str, modules: &[&str]) -> bool {
    let import = format!("import {}", modules.join(", "));
    let ok = Command::new(python).args(["-c", &import]).output().is_ok_and(|o| o.status.success());
    if !ok && std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("{test}: CI is set but {python} cannot `{import}`: `.ci/run` installs them with pip");
    }
    if !ok {
        eprintln!(
            "{test}: skipped: {python} with {} is not installed (`.ci/run` installs it)",
            modules.join(" and ")
        );
    }
    ok
}

/// Kills `child`'s whole process group (started with `process_group(0)`, so the group's id is the
/// child's), then reaps the child: nothing it started outlives the test. Killing the group while
/// the child is still unreaped keeps its id from being reused meanwhile.
pub fn kill_process_group(child: &mut Child) {
    kill_group(child.id());
    let _ = child.kill();
    let _ = child.wait();
}

/// Kills every process left in process group `group` (none left: nothing happens).
pub fn kill_group(group: u32) {
    let group = format!("-{group}");
    let _ = Command::new("/bin/sh").args(["-c", r#"kill -KILL -- "$0" 2>/dev/null"#, &group]).status();
}
