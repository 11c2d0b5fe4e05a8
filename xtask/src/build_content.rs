//! `cargo xtask build-content [--check] [--out DIR] [--content DIR]`: reads the lesson, runs the
//! pipeline, and writes the updated markdown, re-rendered figures and the site, all or nothing.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use qkv_course::{SourceFile, Sources, Stale};

use crate::cli::Args;

/// The workspace root (xtask sits directly inside it).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// Runs the subcommand.
pub fn run(args: Vec<String>) -> Result<()> {
    let mut args = Args::new("build-content", args);
    let check = args.flag("--check");
    let out = args.value("--out")?.map(PathBuf::from).unwrap_or_else(|| root().join("target/site"));
    let content = args.value("--content")?.map(PathBuf::from).unwrap_or_else(|| root().join("content"));
    args.finish()?;

    let sources = read_sources(&content)?;
    if check {
        let stale = qkv_course::check(&sources).map_err(|e| anyhow::anyhow!("{e}"))?;
        if stale.is_empty() {
            println!("content is up to date ({} sections)", sources.markdown.len());
            return Ok(());
        }
        bail!("{}", Stale::report(&stale));
    }
    let build = qkv_course::build(&sources).map_err(|e| anyhow::anyhow!("{e}"))?;

    // Stage every output as a temporary file first; rename only once all were written.
    let mut staged = Staged::default();
    let mut updated = Vec::new();
    for (old, new) in sources.markdown.iter().zip(&build.markdown) {
        if old.text != new.text {
            staged.add(&content.join(file_name(&new.path)), new.text.as_bytes())?;
            updated.push(new.path.clone());
        }
    }
    for figure in &build.figures {
        staged.add(&content.join(&figure.name), &figure.bytes)?;
    }
    for file in &build.site {
        staged.add(&out.join(&file.name), file.text.as_bytes())?;
    }
    // Figures in the site: the freshly rendered ones, else the committed files.
    let fresh: BTreeSet<&str> = build.figures.iter().map(|f| f.name.as_str()).collect();
    for figure in &build.figures {
        staged.add(&out.join(&figure.name), &figure.bytes)?;
    }
    let orphans: BTreeSet<&str> = build.orphans.iter().map(String::as_str).collect();
    for name in
        sources.figures.iter().filter(|n| !fresh.contains(n.as_str()) && !orphans.contains(n.as_str()))
    {
        let bytes = fs::read(content.join(name))
            .with_context(|| format!("reading {}", content.join(name).display()))?;
        staged.add(&out.join(name), &bytes)?;
    }
    staged.commit()?;
    // Figures no block declares any more go last, once everything else is in place.
    for orphan in &build.orphans {
        fs::remove_file(content.join(orphan)).with_context(|| format!("removing {orphan}"))?;
        println!("removed {orphan}: no figure block declares it");
    }

    for s in &build.stale {
        println!("updated {s}");
    }
    println!(
        "{} file{} rewritten, {} figure{} re-rendered; site written to {}",
        updated.len(),
        if updated.len() == 1 { "" } else { "s" },
        build.figures.len() / 2,
        if build.figures.len() == 2 { "" } else { "s" },
        out.join("index.html").display()
    );
    Ok(())
}

fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// Reads `content/*.md` (except README.md) in name order, and lists `content/figures/`.
fn read_sources(content: &Path) -> Result<Sources> {
    let mut names: Vec<PathBuf> = fs::read_dir(content)
        .with_context(|| format!("reading the lesson folder {}", content.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "md") && p.file_name().is_some_and(|n| n != "README.md")
        })
        .collect();
    names.sort();
    let shown_root = root();
    let mut markdown = Vec::new();
    for path in names {
        let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let shown = path.strip_prefix(&shown_root).unwrap_or(&path).display().to_string();
        markdown.push(SourceFile { path: shown, text });
    }
    let mut figures = BTreeSet::new();
    if let Ok(entries) = fs::read_dir(content.join("figures")) {
        for entry in entries.flatten() {
            if let Some(name) = entry.file_name().to_str()
                && !name.starts_with('.')
            {
                figures.insert(format!("figures/{name}"));
            }
        }
    }
    Ok(Sources { markdown, figures })
}

/// Temporary files written next to their targets, renamed into place together.
#[derive(Default)]
struct Staged {
    files: Vec<(PathBuf, PathBuf)>,
}

impl Staged {
    fn add(&mut self, target: &Path, bytes: &[u8]) -> Result<()> {
        let dir = target.parent().context("output path has no folder")?;
        let result = fs::create_dir_all(dir).and_then(|()| {
            let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("out");
            let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
            fs::write(&temp, bytes).map(|()| temp)
        });
        match result {
            Ok(temp) => {
                self.files.push((temp, target.to_path_buf()));
                Ok(())
            }
            Err(e) => {
                self.discard();
                Err(e).with_context(|| format!("writing {}", target.display()))
            }
        }
    }

    fn discard(&mut self) {
        for (temp, _) in self.files.drain(..) {
            let _ = fs::remove_file(temp);
        }
    }

    fn commit(mut self) -> Result<()> {
        for (temp, target) in std::mem::take(&mut self.files) {
            fs::rename(&temp, &target).with_context(|| format!("moving {} into place", target.display()))?;
        }
        Ok(())
    }
}
