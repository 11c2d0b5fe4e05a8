//! The Python peers (NumPy, PyTorch's SDPA) on the same cases: `peers.py --serve KIND` runs as a
//! child process per library for the whole benchmark and times calls of one case when asked, so
//! that qkv's runs and PyTorch's can take turns within a row (`measure::paired`).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use crate::cases::Case;
use crate::measure;

/// One case as `peers.py` reads it: the case's fields and its label.
#[derive(Serialize)]
struct PythonCase {
    label: String,
    #[serde(flatten)]
    case: Case,
}

/// A request to a server: `runs` timed calls of `case` on `threads` threads, after untimed ones
/// for `warm` seconds (at least one if `warm > 0`; the server adds one anyway the first time it
/// meets a case).
#[derive(Serialize)]
struct Request {
    case: PythonCase,
    threads: usize,
    runs: usize,
    warm: f64,
}

/// A server's answer: its implementation's name and the seconds of each call, or no name where
/// the library has nothing for the case.
#[derive(Deserialize)]
struct Reply {
    implementation: Option<String>,
    #[serde(default)]
    seconds: Vec<f64>,
}

/// One library's `peers.py --serve` process.
pub struct Server {
    kind: &'static str,
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Server {
    /// Starts `peers.py --serve kind` (`numpy` or `torch`) with `python`. NumPy's runs without
    /// `OPENBLAS_CORETYPE` and `OPENBLAS_L2_SIZE`, which may be set on this machine and would pin
    /// OpenBLAS to a slower kernel.
    pub fn start(python: &str, kind: &'static str, quick: bool) -> anyhow::Result<Server> {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("peers.py");
        let mut command = Command::new(python);
        command.arg(&script).arg("--serve").arg(kind).stdin(Stdio::piped()).stdout(Stdio::piped());
        if quick {
            command.arg("--quick");
        }
        if kind == "numpy" {
            command.env_remove("OPENBLAS_CORETYPE").env_remove("OPENBLAS_L2_SIZE");
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("running {python} {} --serve {kind}", script.display()))?;
        let (input, output) = (child.stdin.take(), child.stdout.take());
        let (Some(input), Some(output)) = (input, output) else { bail!("peers.py --serve {kind}: no pipes") };
        Ok(Server { kind, child, input, output: BufReader::new(output) })
    }

    /// The implementation's name and the seconds of `runs` calls of `case` on `threads` threads
    /// after untimed calls for `warm` seconds, or `None` where the library has nothing for the
    /// case.
    pub fn times(
        &mut self,
        case: &Case,
        threads: usize,
        runs: usize,
        warm: f64,
    ) -> anyhow::Result<Option<(String, Vec<f64>)>> {
        let request = Request { case: PythonCase { label: case.label(), case: *case }, threads, runs, warm };
        let kind = self.kind;
        writeln!(self.input, "{}", serde_json::to_string(&request)?)
            .and_then(|()| self.input.flush())
            .with_context(|| format!("peers.py --serve {kind} stopped (its error is above)"))?;
        let mut line = String::new();
        self.output.read_line(&mut line)?;
        if line.is_empty() {
            bail!("peers.py --serve {kind} stopped on {} (its error is above)", case.label());
        }
        let reply: Reply = serde_json::from_str(&line)
            .with_context(|| format!("peers.py --serve {kind} answered {line:?}"))?;
        Ok(reply.implementation.map(|name| (name, reply.seconds)))
    }

    /// The implementation's name and its median seconds on `case` at `threads` threads, over as
    /// many runs as [`measure::run_count`] gives its first call; `None` as for [`Self::times`].
    pub fn median(
        &mut self,
        case: &Case,
        threads: usize,
        quick: bool,
    ) -> anyhow::Result<Option<(String, f64)>> {
        let Some((_, once)) = self.times(case, threads, 1, 0.0)? else { return Ok(None) };
        let runs = measure::run_count(once.first().copied().unwrap_or(0.0), quick);
        let Some((name, seconds)) = self.times(case, threads, runs, 0.0)? else { return Ok(None) };
        Ok(Some((name, measure::median_of(seconds))))
    }
}

impl Drop for Server {
    /// Stops the server and reaps it.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
