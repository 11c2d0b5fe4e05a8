//! The small argument parser every subcommand shares, and the usage error (exit status 2).

use std::fmt;

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
