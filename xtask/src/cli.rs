//! What every subcommand shares: the small argument parser, the usage error (exit status 2),
//! printing that ends quietly on a closed pipe, and where the workspace is.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A malformed command line: the offending text and what was expected. Exits with status 2.
#[derive(Debug)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// Fails with a [`UsageError`].
pub fn usage<T>(message: impl Into<String>) -> anyhow::Result<T> {
    Err(UsageError(message.into()).into())
}

/// `--flag` and `--name value` arguments, taken out one by one; [`Args::finish`] rejects leftovers.
pub struct Args {
    rest: Vec<String>,
    command: &'static str,
}

impl Args {
    /// Wraps the arguments that follow the subcommand's name.
    pub fn new(command: &'static str, args: Vec<String>) -> Self {
        Args { rest: args, command }
    }

    /// Whether `--name` is present (and removes it).
    pub fn flag(&mut self, name: &str) -> bool {
        let before = self.rest.len();
        self.rest.retain(|a| a != name);
        self.rest.len() != before
    }

    /// The value after `--name` (or in `--name=value`), if present.
    pub fn value(&mut self, name: &str) -> anyhow::Result<Option<String>> {
        let prefix = format!("{name}=");
        if let Some(i) = self.rest.iter().position(|a| a.starts_with(&prefix)) {
            return Ok(Some(self.rest.remove(i)[prefix.len()..].to_string()));
        }
        let Some(i) = self.rest.iter().position(|a| a == name) else {
            return Ok(None);
        };
        if i + 1 >= self.rest.len() {
            return usage(format!("{name} needs a value after it"));
        }
        self.rest.remove(i);
        Ok(Some(self.rest.remove(i)))
    }

    /// Errors on anything not taken out yet.
    pub fn finish(self) -> anyhow::Result<()> {
        match self.rest.first() {
            None => Ok(()),
            Some(a) => usage(format!(
                "cargo xtask {}: unexpected argument `{a}` (see `cargo xtask help`)",
                self.command
            )),
        }
    }
}

/// The workspace root. `cargo run` (and so `cargo xtask`) sets `CARGO_MANIFEST_DIR` for the
/// program it runs: that names the clone being worked in, even when several clones share one
/// target folder and this binary was compiled in another. The compile-time folder is the fallback.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest_dir.parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Writes one line to standard output. Unlike `println!`, a closed pipe (`| head -1`) is an
/// error to return, which `main` turns into a quiet exit.
pub fn write_line(line: fmt::Arguments<'_>) -> io::Result<()> {
    let mut out = io::stdout().lock();
    out.write_fmt(line)?;
    out.write_all(b"\n")
}

/// `say!("...", args)`: [`write_line`] with `format!` arguments, returning early on an error.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::cli::write_line(format_args!($($arg)*))?
    };
}
pub(crate) use say;

/// Whether `e` is standard output closing under us (the reader of a pipe went away).
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|cause| {
        cause.downcast_ref::<io::Error>().is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}
