//! The Python peers (NumPy, PyTorch's SDPA) on the same cases: `peers.py` is handed the cases
//! as JSON, so that both sides always measure the same shapes, and its rows join the table.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::cases::Case;
use crate::report::Row;

/// One case as `peers.py` reads it: the case's fields and its label.
#[derive(Serialize)]
struct PythonCase {
    label: String,
    #[serde(flatten)]
    case: Case,
}

/// Runs `peers.py` with `python` on `cases` and returns its rows.
pub fn rows(python: &str, cases: &[Case], quick: bool) -> anyhow::Result<Vec<Row>> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers.py");
    let temp = std::env::temp_dir();
    let (cases_file, rows_file) = (
        temp.join(format!("qkv-bench-{}-cases.json", std::process::id())),
        temp.join(format!("qkv-bench-{}-python.json", std::process::id())),
    );
    let listed: Vec<PythonCase> =
        cases.iter().map(|&case| PythonCase { label: case.label(), case }).collect();
    std::fs::write(&cases_file, serde_json::to_string(&listed)?)
        .with_context(|| format!("writing {}", cases_file.display()))?;
    let mut command = Command::new(python);
    // Its own table would repeat the rows the benchmark prints; its errors go to stderr.
    command.arg(&script).arg("--cases").arg(&cases_file).arg("--json").arg(&rows_file).stdout(Stdio::null());
    if quick {
        command.arg("--quick");
    }
    let status = command.status().with_context(|| format!("running {python} {}", script.display()));
    let _ = std::fs::remove_file(&cases_file);
    if !status?.success() {
        bail!("{} failed", script.display());
    }
    let text =
        std::fs::read_to_string(&rows_file).with_context(|| format!("reading {}", rows_file.display()))?;
    let _ = std::fs::remove_file(&rows_file);
    serde_json::from_str(&text).with_context(|| format!("parsing the rows of {}", script.display()))
}
