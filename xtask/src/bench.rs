//! `cargo xtask bench [--quick] [--json FILE] [--only TEXT] [--python PYTHON] | --tile-probe`:
//! builds and runs the benchmark crate with its peers (candle, the `gemm` ceiling) in release
//! mode, with no target-cpu flag (the engine picks its SIMD level at run time, as in an embedding
//! crate); `--tile-probe` times only the AMX tile unit's instruction patterns. With
//! `--python` the benchmark also runs NumPy and PyTorch (`crates/qkv-bench/peers.py`) on the same
//! shapes, in the same sitting, PyTorch's runs taking turns with qkv's; with `--json` it writes
//! the rows and a bar chart beside them.

use std::process::Command;

use anyhow::{Context, bail};

use crate::cli::{Args, workspace_root};

/// Runs the benchmark; `args` are the command's arguments after `bench`.
pub fn run(args: Vec<String>) -> anyhow::Result<()> {
    let mut args = Args::new("bench", args);
    let mut forwarded = Vec::new();
    for flag in ["--quick", "--tile-probe"] {
        if args.flag(flag) {
            forwarded.push(flag.to_string());
        }
    }
    for name in ["--json", "--only", "--python"] {
        if let Some(value) = args.value(name)? {
            forwarded.extend([name.to_string(), value]);
        }
    }
    args.finish()?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(workspace_root())
        .args(["run", "--release", "--quiet", "-p", "qkv-bench", "--features", "peers", "--"])
        .args(&forwarded)
        .status()
        .context("running cargo")?;
    if !status.success() {
        bail!("the benchmark failed ({status})");
    }
    Ok(())
}
