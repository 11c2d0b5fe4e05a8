//! Running the `xtask` binary and reading what it printed; copies of the lesson to run it on.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

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
    let ok = Command::new("python3").args(["-c", "import numpy"]).output().is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("{test}: skipped: python3 with numpy is not installed (`.ci/run` installs it)");
    }
    ok
}

/// The committed lesson folder.
pub fn content_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").join("content")
}

/// A copy of `content/` in a fresh temporary folder.
pub fn copy_of_content() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    copy_dir(&content_dir(), &dir.path().join("content"));
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).expect("create dir");
    for entry in fs::read_dir(from).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else {
            fs::copy(&path, to.join(entry.file_name())).expect("copy file");
        }
    }
}

/// Every file under `dir` with its bytes, for "nothing was written" comparisons.
pub fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(snapshot(&path));
        } else {
            out.push((path.clone(), fs::read(&path).expect("read file")));
        }
    }
    out.sort();
    out
}

/// A path as a command-line argument.
pub fn arg(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}
