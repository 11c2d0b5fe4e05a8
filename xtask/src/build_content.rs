//! `cargo xtask build-content [--check] [--out DIR] [--content DIR]`: reads the lesson, runs the
//! pipeline, and writes the updated markdown, re-rendered figures and the site, all or nothing.

use std::path::PathBuf;

use anyhow::{Result, bail};
use qkv_course::Stale;

use crate::cli::{Args, say, workspace_root};
use crate::lesson::{self, Mode, Paths};

/// Reads `--out DIR` and `--content DIR` (defaults: `target/site`, `content`).
pub fn paths(args: &mut Args) -> Result<Paths> {
    let root = workspace_root();
    let out = args.value("--out")?.map(PathBuf::from).unwrap_or_else(|| root.join("target/site"));
    let content = args.value("--content")?.map(PathBuf::from).unwrap_or_else(|| root.join("content"));
    Ok(Paths { content, out, shown_from: root })
}

/// Runs the subcommand.
pub fn run(args: Vec<String>) -> Result<()> {
    let mut args = Args::new("build-content", args);
    let check = args.flag("--check");
    let paths = paths(&mut args)?;
    args.finish()?;

    let mode = if check { Mode::Check } else { Mode::Build };
    let outcome = lesson::run(&paths, mode).map_err(lesson::Failure::into_anyhow)?;
    if check {
        if outcome.stale.is_empty() {
            say!("content is up to date ({} sections)", outcome.sections);
            return Ok(());
        }
        bail!("{}", Stale::report(&outcome.stale));
    }
    for name in &outcome.pruned {
        say!("removed {name} from the site: this build no longer writes it");
    }
    for orphan in &outcome.removed {
        say!("removed {orphan}: no figure block declares it");
    }
    for s in &outcome.stale {
        say!("updated {s}");
    }
    let n = outcome.rewritten.len();
    say!(
        "{n} file{} rewritten, {} figure{} re-rendered; site written to {}",
        if n == 1 { "" } else { "s" },
        outcome.figures,
        if outcome.figures == 1 { "" } else { "s" },
        paths.out.join("index.html").display()
    );
    Ok(())
}
