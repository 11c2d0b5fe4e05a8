//! The lesson on disk: reads `content/`, runs the pipeline, and writes what it returns, all or
//! nothing. Shared by `build-content`, `serve` (which writes only the site) and `fuzz`.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow};
use qkv_course::{ContentErrors, SourceFile, Sources, Stale};

/// Where the lesson is read from and the site written to.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The lesson folder (`content/`).
    pub content: PathBuf,
    /// The site folder (`target/site/`).
    pub out: PathBuf,
    /// Paths in messages are shown relative to this folder (the workspace root).
    pub shown_from: PathBuf,
}

/// What a run writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Nothing: report the stale places.
    Check,
    /// The updated lesson files and figures in `content/`, and the site.
    Build,
    /// Only the site, as a build would write it (`serve`: the author's files stay as they are
    /// while an editor has them open).
    Preview,
}

/// What a successful run did.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Places that were out of date (rewritten by a build, reported by check and preview).
    pub stale: Vec<Stale>,
    /// Lesson files rewritten.
    pub rewritten: Vec<String>,
    /// Figures re-rendered.
    pub figures: usize,
    /// Figure files removed because no block declares them any more.
    pub removed: Vec<String>,
    /// Files an earlier build wrote to the site that this one does not (a page renamed, a
    /// figure dropped), removed.
    pub pruned: Vec<String>,
    /// Lesson sections read.
    pub sections: usize,
}

/// Why a run failed; in either case it wrote nothing.
#[derive(Debug)]
pub enum Failure {
    /// Errors in the lesson source, each at `file:line:column`.
    Content(ContentErrors),
    /// A file could not be read or written.
    Io(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Io(e)
    }
}

impl Failure {
    /// As an error for the command line.
    pub fn into_anyhow(self) -> anyhow::Error {
        match self {
            Failure::Content(e) => anyhow!("{e}"),
            Failure::Io(e) => e,
        }
    }
}

/// Reads the lesson, runs the pipeline and writes what `mode` asks for.
pub fn run(paths: &Paths, mode: Mode) -> Result<Outcome, Failure> {
    let sources = read_sources(paths)?;
    let sections = sources.markdown.len();
    if mode == Mode::Check {
        let stale = qkv_course::check(&sources).map_err(Failure::Content)?;
        let (rewritten, removed, pruned) = (Vec::new(), Vec::new(), Vec::new());
        return Ok(Outcome { stale, rewritten, figures: 0, removed, sections, pruned });
    }
    let build = qkv_course::build(&sources).map_err(Failure::Content)?;
    let (content, out) = (&paths.content, &paths.out);

    // Stage every output as a temporary file first; rename only once all were written.
    let mut staged = Staged::default();
    let mut rewritten = Vec::new();
    if mode == Mode::Build {
        for (old, new) in sources.markdown.iter().zip(&build.markdown) {
            if old.text != new.text {
                staged.add(&content.join(file_name(&new.path)), new.text.as_bytes())?;
                rewritten.push(new.path.clone());
            }
        }
        for figure in &build.figures {
            staged.add(&content.join(&figure.name), &figure.bytes)?;
        }
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
    // The site's files are listed in it, so that the next build removes those it no longer
    // writes, and only those: the folder may hold files of the author's own.
    let written: BTreeSet<String> = staged.under(out, content);
    let manifest = out.join(SITE_MANIFEST);
    let listed = fs::read_to_string(&manifest).unwrap_or_default();
    let mut list: String = written.iter().map(|name| format!("{name}\n")).collect();
    list.insert_str(0, SITE_MANIFEST_HEADER);
    staged.add(&manifest, list.as_bytes())?;
    staged.commit()?;
    let mut pruned = Vec::new();
    for name in listed.lines().filter(|l| !l.starts_with('#') && !l.is_empty() && !written.contains(*l)) {
        // Never outside the site: the list is ours, but a file is only text.
        if Path::new(name).components().all(|c| matches!(c, std::path::Component::Normal(_))) {
            match fs::remove_file(out.join(name)) {
                Ok(()) => pruned.push(name.to_string()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(anyhow::Error::from(e)
                        .context(format!("removing {name} from the site"))
                        .into());
                }
            }
        }
    }
    let mut removed = Vec::new();
    if mode == Mode::Build {
        // Figures no block declares any more go last, once everything else is in place.
        for orphan in &build.orphans {
            fs::remove_file(content.join(orphan)).with_context(|| format!("removing {orphan}"))?;
            removed.push(orphan.clone());
        }
    }
    Ok(Outcome { stale: build.stale, rewritten, figures: build.figures.len() / 2, removed, sections, pruned })
}

/// The list of the files a build wrote to the site, in the site's folder.
const SITE_MANIFEST: &str = ".qkv-site-files";
const SITE_MANIFEST_HEADER: &str =
    "# The files `cargo xtask build-content` wrote here; the next build removes those it no longer writes.\n";

fn file_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// Reads `content/*.md` (except README.md) in name order and `content/data/*.toml`, and lists
/// `content/figures/`. Lesson files that are not UTF-8 are content errors, all reported together.
pub fn read_sources(paths: &Paths) -> Result<Sources, Failure> {
    let content = &paths.content;
    let mut names: Vec<PathBuf> = fs::read_dir(content)
        .with_context(|| format!("reading the lesson folder {}", content.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|e| e == "md") && p.file_name().is_some_and(|n| n != "README.md")
        })
        .collect();
    names.sort();
    let mut markdown = Vec::new();
    let mut undecodable = Vec::new();
    for path in names {
        let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let shown = path.strip_prefix(&paths.shown_from).unwrap_or(&path).display().to_string();
        match qkv_course::decode(&shown, &bytes) {
            Ok(text) => markdown.push(SourceFile { path: shown, text }),
            Err(e) => undecodable.push(e),
        }
    }
    if !undecodable.is_empty() {
        return Err(Failure::Content(ContentErrors(undecodable)));
    }
    let mut figures = BTreeSet::new();
    let mut figure_hashes = BTreeMap::new();
    if let Ok(entries) = fs::read_dir(content.join("figures")) {
        for entry in entries.flatten() {
            if let Some(name) = entry.file_name().to_str()
                && !name.starts_with('.')
            {
                let name = format!("figures/{name}");
                // An SVG says what it was drawn from (an unreadable one is drawn again).
                if name.ends_with(".svg")
                    && let Ok(svg) = fs::read_to_string(entry.path())
                    && let Some(hash) = qkv_course::drawn_from(&svg)
                {
                    figure_hashes.insert(name.clone(), hash.to_string());
                }
                figures.insert(name);
            }
        }
    }
    // Measured numbers the `measurements` figures draw, `data/NAME.toml`.
    let mut data = BTreeMap::new();
    if let Ok(entries) = fs::read_dir(content.join("data")) {
        for path in entries.flatten().map(|e| e.path()) {
            if let Some(name) = path.file_name().and_then(|n| n.to_str())
                && name.ends_with(".toml")
            {
                let text =
                    fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
                data.insert(format!("data/{name}"), text);
            }
        }
    }
    Ok(Sources { markdown, figures, figure_hashes, data })
}

/// Temporary files written next to their targets, renamed into place together. Whatever is not
/// renamed (an error on the way) is removed when this is dropped, so no `.tmp` file stays behind.
#[derive(Default)]
struct Staged {
    files: Vec<(PathBuf, PathBuf)>,
}

impl Staged {
    fn add(&mut self, target: &Path, bytes: &[u8]) -> anyhow::Result<()> {
        // Two outputs for one path would leave the first renamed and the second failing.
        if self.files.iter().any(|(_, t)| t == target) {
            anyhow::bail!("two outputs would be written to {}", target.display());
        }
        // The one way a rename onto an existing path fails that can be seen before renaming.
        if target.is_dir() {
            anyhow::bail!("cannot write {}: a folder of that name is in the way", target.display());
        }
        let dir = target.parent().context("output path has no folder")?;
        let name = target.file_name().and_then(|n| n.to_str()).unwrap_or("out");
        let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        // Listed before writing, so that a write failing halfway still has its file removed.
        self.files.push((temp.clone(), target.to_path_buf()));
        fs::create_dir_all(dir)
            .and_then(|()| fs::write(&temp, bytes))
            .with_context(|| format!("writing {}", target.display()))
    }

    /// The targets under `dir` but not under `except` (the lesson folder, were the site around
    /// it: its files are never the site's to remove), as paths relative to `dir` with `/` between
    /// folders.
    fn under(&self, dir: &Path, except: &Path) -> BTreeSet<String> {
        let relative = |(_, target): &(PathBuf, PathBuf)| {
            (!target.starts_with(except))
                .then(|| target.strip_prefix(dir).ok().map(Path::to_path_buf))
                .flatten()
        };
        let parts = |path: PathBuf| {
            path.iter().map(|c| c.to_string_lossy().into_owned()).collect::<Vec<_>>().join("/")
        };
        self.files.iter().filter_map(relative).map(parts).collect()
    }

    fn commit(mut self) -> anyhow::Result<()> {
        // What is left in `self.files` when a rename fails is removed by `drop`.
        let files = std::mem::take(&mut self.files);
        for (i, (temp, target)) in files.iter().enumerate() {
            if let Err(e) = fs::rename(temp, target) {
                self.files = files[i..].to_vec();
                return Err(e).with_context(|| format!("moving {} into place", target.display()));
            }
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        for (temp, _) in self.files.drain(..) {
            let _ = fs::remove_file(temp);
        }
    }
}
