//! `cargo xtask bench [--quick] [--json FILE] [--only TEXT] [--python PYTHON]`: builds and runs the
//! benchmark crate with its peers (candle, the `gemm` ceiling) in release mode, and with
//! `--python` also the NumPy/PyTorch script on the same shapes.

use std::process::Command;

use anyhow::{Context, bail};

use crate::cli::{Args, workspace_root};

/// Runs the benchmark; `args` are the command's arguments after `bench`.
pub fn run(args: Vec<String>) -> anyhow::Result<()> {
    let mut args = Args::new("bench", args);
    let quick = args.flag("--quick");
    let python = args.value("--python")?;
    let mut forwarded = Vec::new();
    if quick {
        forwarded.push("--quick".to_string());
    }
    for name in ["--json", "--only"] {
        if let Some(value) = args.value(name)? {
            forwarded.extend([name.to_string(), value]);
        }
    }
    args.finish()?;
    let root = workspace_root();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args(["run", "--release", "--quiet", "-p", "qkv-bench", "--features", "peers", "--"])
        .args(&forwarded)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("the benchmark failed ({status})");
    }
    if let Some(python) = python {
        let script = root.join("crates/qkv-bench/peers.py");
        let mut command = Command::new(&python);
        command.arg(&script);
        if quick {
            command.arg("--quick");
        }
        let status = command.status().with_context(|| format!("running {python} {}", script.display()))?;
        if !status.success() {
            bail!("{} failed ({status})", script.display());
        }
    }
    Ok(())
}
