//! The Python package's pytest suite (`crates/qkv-python/tests`), run by the interpreter named in
//! `QKV_PYTHON` (default `python3`) once it has torch, pytest and the installed `qkv` package
//! (`pip install ./crates/qkv-python`); skipped with a message otherwise, failed under `CI`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::support::{interpreter_imports, kill_group, kill_process_group};

/// How long the suite may run (about a minute on 2 cores; CI's whole run has 90) before it is
/// stopped as hung: a call that never returns fails the test instead of the CI run.
const PATIENCE: Duration = Duration::from_secs(20 * 60);

#[test]
fn the_python_package_passes_its_pytest_suite() {
    let test = "the_python_package_passes_its_pytest_suite";
    let python = std::env::var("QKV_PYTHON").unwrap_or_else(|_| "python3".into());
    if !interpreter_imports(test, &python, &["torch", "pytest", "numpy", "qkv.distributed"]) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace root");
    // `-p no:cacheprovider`: pytest writes no `.pytest_cache` into the checkout;
    // `faulthandler_timeout`: a test still running after that many seconds prints every thread's
    // stack, so a hang says where it is before `PATIENCE` ends the run.
    let mut child = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "faulthandler_timeout=300"])
        .arg("crates/qkv-python/tests")
        .current_dir(root)
        // Output as it is written, so that a stopped run shows how far it got.
        .env("PYTHONUNBUFFERED", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: a stopped run takes the tests' own subprocesses with it, which
        // would otherwise hold the pipes open.
        .process_group(0)
        .spawn()
        .expect("the interpreter runs");
    let read_all = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut text = Vec::new();
            let _ = pipe.read_to_end(&mut text);
            String::from_utf8_lossy(&text).into_owned()
        })
    };
    let stdout = read_all(Box::new(child.stdout.take().expect("piped")));
    let stderr = read_all(Box::new(child.stderr.take().expect("piped")));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waits on pytest") {
            // What the suite started and left running (torch.compile's workers, say) would hold
            // the pipes open, and the readers with them.
            kill_group(child.id());
            break Some(status);
        }
        if started.elapsed() > PATIENCE {
            kill_process_group(&mut child);
            break None;
        }
        thread::sleep(Duration::from_millis(200));
    };
    let (stdout, stderr) = (stdout.join().expect("reads"), stderr.join().expect("reads"));
    let Some(status) = status else {
        panic!("pytest still ran after {PATIENCE:?} and was stopped:\n{stdout}\n{stderr}");
    };
    assert!(status.success(), "pytest failed:\n{stdout}\n{stderr}");
    // Which `qkv` it tested: an installed copy goes stale when the Rust code changes.
    let location =
        Command::new(&python).args(["-c", "import qkv; print(qkv.__file__)"]).output().expect("runs");
    eprintln!(
        "{test}: {} ({})",
        stdout.lines().last().unwrap_or(""),
        String::from_utf8_lossy(&location.stdout).trim()
    );
}
