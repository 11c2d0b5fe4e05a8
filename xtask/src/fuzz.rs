//! `cargo xtask fuzz [--minutes N] [--seed S [--case I]] [--replay DIR]`: mutates the committed lesson and
//! holds the build to its promises on every mutant. Each case writes the mutant to a scratch
//! folder and runs the real `build-content` code on it (check, then build):
//!
//! - nothing panics;
//! - every content error is at `file:line:column` of a file of the lesson, within that file;
//! - a run that fails writes nothing (the lesson and the site are byte for byte as before, and no
//!   temporary file is left), and `--check` never writes;
//! - a run that succeeds leaves the lesson up to date: `--check` right after it finds nothing.
//!
//! A plain `cargo test` runs a fixed number of seeded cases (`fuzz/tests.rs`); this command runs
//! for as long as asked and saves every failing mutant under `target/fuzz/` with how to replay it.

mod mutate;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::cli::{Args, say, workspace_root};
use crate::lesson::{self, Failure, Mode, Paths};

use mutate::Rng;

/// A lesson in memory: its markdown files and its figure files, by name.
#[derive(Debug, Clone)]
pub struct Lesson {
    /// `(file name, bytes)` of each `NN-name.md`.
    pub markdown: Vec<(String, Vec<u8>)>,
    /// `(file name, bytes)` of each file under `figures/`.
    pub figures: Vec<(String, Vec<u8>)>,
    /// `(file name, bytes)` of each file under `data/` (what `measurements` figures draw).
    pub data: Vec<(String, Vec<u8>)>,
}

impl Lesson {
    /// Reads a lesson folder (`content/`), as `build-content` would find it.
    pub fn read(dir: &Path) -> Result<Self> {
        let mut markdown = Vec::new();
        for entry in fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if name.ends_with(".md") && name != "README.md" {
                markdown.push((name, fs::read(entry.path())?));
            }
        }
        markdown.sort();
        let mut figures = Vec::new();
        if let Ok(entries) = fs::read_dir(dir.join("figures")) {
            for entry in entries.flatten() {
                figures.push((entry.file_name().to_string_lossy().to_string(), fs::read(entry.path())?));
            }
        }
        figures.sort();
        let mut data = Vec::new();
        if let Ok(entries) = fs::read_dir(dir.join("data")) {
            for entry in entries.flatten() {
                data.push((entry.file_name().to_string_lossy().to_string(), fs::read(entry.path())?));
            }
        }
        data.sort();
        Ok(Lesson { markdown, figures, data })
    }

    /// Writes the lesson into a fresh folder `dir`.
    pub fn write(&self, dir: &Path) -> Result<()> {
        if dir.exists() {
            fs::remove_dir_all(dir).with_context(|| format!("clearing {}", dir.display()))?;
        }
        fs::create_dir_all(dir.join("figures"))?;
        for (name, bytes) in &self.markdown {
            fs::write(dir.join(name), bytes)?;
        }
        for (name, bytes) in &self.figures {
            fs::write(dir.join("figures").join(name), bytes)?;
        }
        if !self.data.is_empty() {
            fs::create_dir_all(dir.join("data"))?;
        }
        for (name, bytes) in &self.data {
            fs::write(dir.join("data").join(name), bytes)?;
        }
        Ok(())
    }
}

/// One mutant: the seed and index that made it, the edits, and the lesson they produced.
#[derive(Debug, Clone)]
pub struct Case {
    /// The run's seed.
    pub seed: u64,
    /// The case's number in the run.
    pub index: u64,
    /// What was done to the committed lesson, in order.
    pub mutations: Vec<String>,
    /// The mutated lesson.
    pub lesson: Lesson,
}

impl Case {
    /// Case `index` of the run seeded `seed`: one to three mutations of `base`.
    pub fn new(base: &Lesson, seed: u64, index: u64) -> Self {
        let mut rng = Rng::new(seed, index);
        let mut lesson = base.clone();
        let mutations = (0..1 + rng.below(3)).map(|_| mutate::mutate(&mut lesson, &mut rng)).collect();
        Case { seed, index, mutations, lesson }
    }
}

/// What a case did, when it kept every promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The build succeeded and left the lesson up to date.
    Built,
    /// The build reported content errors, all located, and wrote nothing.
    Rejected,
}

/// Runs one case in the scratch folder `work`: `Ok` if every promise held, else what broke.
pub fn check_case(lesson: &Lesson, work: &Path) -> Result<Outcome, String> {
    let content = work.join("content");
    lesson.write(&content).map_err(|e| format!("could not write the mutant: {e:#}"))?;
    let paths = Paths { content: content.clone(), out: work.join("site"), shown_from: work.to_path_buf() };
    let files: Vec<String> = lesson.markdown.iter().map(|(name, _)| format!("content/{name}")).collect();
    let texts: Vec<String> =
        lesson.markdown.iter().map(|(_, b)| String::from_utf8_lossy(b).to_string()).collect();

    let before = snapshot(work);
    let check = guarded("check", || lesson::run(&paths, Mode::Check))?;
    if snapshot(work) != before {
        return Err("`--check` wrote files".into());
    }
    let build = guarded("build", || lesson::run(&paths, Mode::Build))?;
    match (check, build) {
        (Err(Failure::Content(e)), Err(Failure::Content(f))) => {
            located(&e.0, &files, &texts)?;
            located(&f.0, &files, &texts)?;
            if snapshot(work) != before {
                return Err(format!("a build that failed wrote files:\n{f}"));
            }
            Ok(Outcome::Rejected)
        }
        (Ok(_), Ok(_)) => {
            if let Some(temp) = snapshot(work).keys().find(|p| p.to_string_lossy().ends_with(".tmp")) {
                return Err(format!("a temporary file was left behind: {}", temp.display()));
            }
            let leftovers = leftovers(work, lesson);
            if !leftovers.is_empty() {
                return Err(format!("the build left citation syntax:\n{}", leftovers.join("\n")));
            }
            let after = guarded("check after the build", || lesson::run(&paths, Mode::Check))?;
            match after {
                Ok(o) if o.stale.is_empty() => Ok(Outcome::Built),
                Ok(o) => {
                    Err(format!("the build left stale places:\n{}", qkv_course::Stale::report(&o.stale)))
                }
                Err(e) => Err(format!("the built lesson does not check: {}", describe(e))),
            }
        }
        (check, build) => Err(format!(
            "check and build disagree: check {}, build {}",
            check.map_or_else(describe, |_| "succeeded".into()),
            build.map_or_else(describe, |_| "succeeded".into())
        )),
    }
}

/// Citation syntax left in the built site or the rewritten lesson files of scratch folder `work`.
fn leftovers(work: &Path, lesson: &Lesson) -> Vec<String> {
    let lesson_file = |p: &Path| lesson.markdown.iter().any(|(name, _)| p == Path::new("content").join(name));
    let files: Vec<(String, String)> = snapshot(work)
        .into_iter()
        .filter_map(|(path, bytes)| {
            let relative = path.strip_prefix(work).ok()?;
            (relative.starts_with("site") || lesson_file(relative))
                .then(|| Some((relative.display().to_string(), String::from_utf8(bytes).ok()?)))?
        })
        .collect();
    qkv_course::leftover_citations(files.iter().map(|(name, text)| (name.as_str(), text.as_str())))
}

fn describe(e: Failure) -> String {
    match e {
        Failure::Content(e) => format!("failed with content errors:\n{e}"),
        Failure::Io(e) => format!("failed to read or write: {e:#}"),
    }
}

thread_local! {
    /// Whether this thread is inside [`guarded`], and the message of the panic it caught.
    static GUARD: RefCell<Option<Option<String>>> = const { RefCell::new(None) };
}

/// Runs `f`, turning a panic into an error that says where it was raised.
fn guarded<T>(what: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    // One hook for the whole process, installed once: inside `guarded` a panic is kept quiet
    // (the report says it) and remembered; anywhere else (another test) it prints as usual.
    static QUIET_HOOK: Once = Once::new();
    QUIET_HOOK.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let guarded =
                GUARD.with(|g| g.borrow_mut().as_mut().map(|m| *m = Some(info.to_string())).is_some());
            if !guarded {
                default(info);
            }
        }));
    });
    GUARD.with(|g| *g.borrow_mut() = Some(None));
    let result = panic::catch_unwind(AssertUnwindSafe(f));
    let message = GUARD.with(|g| g.borrow_mut().take()).flatten().unwrap_or_default();
    result.map_err(|_| format!("{what} panicked: {message}"))
}

/// Checks that every error names a file of the lesson and a line and column inside it.
fn located(errors: &[qkv_course::ContentError], files: &[String], texts: &[String]) -> Result<(), String> {
    if errors.is_empty() {
        return Err("a run failed with no error to show".into());
    }
    for e in errors {
        let shown = e.to_string();
        let Some(i) = files.iter().position(|f| *f == e.file) else {
            return Err(format!("an error names a file that is not in the lesson:\n{shown}"));
        };
        // The decoder counts lines in the raw bytes; a stray `\r` is no line break to it either.
        let text = texts[i].strip_prefix('\u{feff}').unwrap_or(&texts[i]);
        let lines: Vec<&str> = text.split('\n').collect();
        let line_ok = e.line >= 1 && e.line <= lines.len();
        let width = lines.get(e.line.wrapping_sub(1)).map_or(0, |l| l.chars().count());
        if !line_ok || e.column < 1 || e.column > width + 1 {
            return Err(format!("an error is outside its file ({} lines):\n{shown}", lines.len()));
        }
        if !shown.starts_with(&format!("{}:{}:{}: ", e.file, e.line, e.column)) || e.message.is_empty() {
            return Err(format!("an error does not read `file:line:column: message`:\n{shown}"));
        }
    }
    Ok(())
}

/// Every file under `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let Ok(entries) = fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(snapshot(&path));
        } else if let Ok(bytes) = fs::read(&path) {
            out.insert(path, bytes);
        }
    }
    out
}

/// What a run of many cases found.
#[derive(Debug, Default)]
pub struct Summary {
    /// Cases run.
    pub cases: u64,
    /// Cases whose build succeeded.
    pub built: u64,
    /// Cases rejected with located content errors.
    pub rejected: u64,
    /// How often each kind of mutation was applied.
    pub kinds: BTreeMap<String, u64>,
    /// Cases that broke a promise, with what broke.
    pub failures: Vec<(Case, String)>,
}

/// Runs cases `0..` of `seed` on `base` until `until` says stop; `work` is a scratch folder.
pub fn run_cases(base: &Lesson, seed: u64, work: &Path, mut until: impl FnMut(&Summary) -> bool) -> Summary {
    let mut summary = Summary::default();
    while !until(&summary) {
        let case = Case::new(base, seed, summary.cases);
        for m in &case.mutations {
            let kind = mutate::KINDS.iter().find(|k| m.starts_with(*k)).copied().unwrap_or("?");
            *summary.kinds.entry(kind.to_string()).or_default() += 1;
        }
        summary.cases += 1;
        match check_case(&case.lesson, work) {
            Ok(Outcome::Built) => summary.built += 1,
            Ok(Outcome::Rejected) => summary.rejected += 1,
            Err(failure) => summary.failures.push((case, failure)),
        }
    }
    summary
}

/// The first line of a failure, for the log (the whole report is saved beside the case).
fn first_line(failure: &str) -> &str {
    failure.lines().next().unwrap_or_default()
}

/// Where `cargo xtask fuzz` saves failing cases.
fn failures_dir() -> PathBuf {
    workspace_root().join("target/fuzz")
}

/// Saves a failing case: its lesson as a content folder, and what broke with how to replay it.
fn save(case: &Case, failure: &str) -> Result<PathBuf> {
    let dir = failures_dir().join(format!("{}-{}", case.seed, case.index));
    case.lesson.write(&dir.join("content"))?;
    let report = format!(
        "seed {} case {}\nmutations:\n  {}\n\nwhat broke:\n{failure}\n\nreplay: cargo xtask fuzz --replay {}\n   or: cargo xtask build-content --content {} --out {}\n",
        case.seed,
        case.index,
        case.mutations.join("\n  "),
        dir.display(),
        dir.join("content").display(),
        dir.join("site").display(),
    );
    fs::write(dir.join("failure.txt"), report)?;
    Ok(dir)
}

/// Runs the subcommand.
pub fn run(args: Vec<String>) -> Result<()> {
    let mut args = Args::new("fuzz", args);
    let minutes: f64 = match args.value("--minutes")? {
        Some(m) => m.parse().ok().filter(|m: &f64| *m > 0.0).context("--minutes needs a positive number")?,
        None => 1.0,
    };
    let seed = match args.value("--seed")? {
        Some(s) => s.parse().context("--seed needs a whole number")?,
        None => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_secs()),
    };
    let replay = args.value("--replay")?;
    let only_case: Option<u64> = match args.value("--case")? {
        Some(c) => Some(c.parse().context("--case needs a whole number")?),
        None => None,
    };
    args.finish()?;
    let work = tempdir()?;

    if let Some(dir) = replay {
        let lesson = Lesson::read(&Path::new(&dir).join("content"))?;
        let verdict = check_case(&lesson, &work);
        let _ = fs::remove_dir_all(&work);
        return match verdict {
            Ok(outcome) => {
                say!("{dir}: every promise held ({outcome:?})");
                Ok(())
            }
            Err(failure) => bail!("{dir}: {failure}"),
        };
    }

    let base = Arc::new(Lesson::read(&workspace_root().join("content"))?);
    if let Some(index) = only_case {
        // One case of a seed, as a CI log names it: the same mutant without rerunning the others.
        let case = Case::new(&base, seed, index);
        let verdict = check_case(&case.lesson, &work);
        let _ = fs::remove_dir_all(&work);
        return match verdict {
            Ok(outcome) => {
                say!("seed {seed} case {index}: every promise held ({outcome:?})");
                Ok(())
            }
            Err(failure) => {
                let dir = save(&case, &failure)?;
                bail!("seed {seed} case {index} broke a promise: {failure}\nsaved in {}", dir.display())
            }
        };
    }
    let deadline = Instant::now() + Duration::from_secs_f64(minutes * 60.0);
    say!(
        "fuzzing the lesson for {minutes} minutes with seed {seed} (rerun case I alone with --seed {seed} --case I)"
    );
    let started = Instant::now();
    let current = watchdog(Arc::clone(&base), seed, work.clone());
    let mut saved = 0;
    let summary = run_cases(&base, seed, &work, |s| {
        *current.lock().unwrap_or_else(|e| e.into_inner()) = (s.cases, Instant::now());
        // Save failures as they come, so a run stopped early keeps them.
        for (case, failure) in s.failures.iter().skip(saved) {
            if let Ok(dir) = save(case, failure) {
                eprintln!(
                    "case {} broke a promise: {}\nsaved in {}",
                    case.index,
                    first_line(failure),
                    dir.display()
                );
            }
        }
        saved = s.failures.len();
        Instant::now() >= deadline
    });
    for (case, failure) in summary.failures.iter().skip(saved) {
        save(case, failure)?;
    }
    say!(
        "{} cases in {:.0} s: {} built, {} rejected with located errors, {} broke a promise",
        summary.cases,
        started.elapsed().as_secs_f64(),
        summary.built,
        summary.rejected,
        summary.failures.len()
    );
    say!("mutations applied:");
    for (kind, n) in &summary.kinds {
        say!("  {n:>6}  {kind}");
    }
    let _ = fs::remove_dir_all(&work);
    if !summary.failures.is_empty() {
        bail!(
            "{} cases broke a promise; each is saved under {}",
            summary.failures.len(),
            failures_dir().display()
        );
    }
    Ok(())
}

/// The longest one case may take, and the most memory the process may hold, before the run
/// stops and saves it: a mutant that hangs or grows without bound is a failure too, and would
/// otherwise stall the run (a 2^31-line plane once took 15 GB over 8 minutes).
const CASE_TIME_LIMIT: Duration = Duration::from_secs(60);
const MEMORY_LIMIT_BYTES: u64 = 4 << 30;

/// Watches the case being run (its index and start, which the returned cell holds) from another
/// thread. A case past [`CASE_TIME_LIMIT`], or the process past [`MEMORY_LIMIT_BYTES`], is saved
/// like any failure and the process exits: a runaway case cannot be stopped from outside it.
fn watchdog(base: Arc<Lesson>, seed: u64, work: PathBuf) -> Arc<Mutex<(u64, Instant)>> {
    let current = Arc::new(Mutex::new((0, Instant::now())));
    let watched = Arc::clone(&current);
    std::thread::spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            let (index, since) = *watched.lock().unwrap_or_else(|e| e.into_inner());
            let memory = resident_bytes();
            let failure = if since.elapsed() > CASE_TIME_LIMIT {
                format!(
                    "the case did not finish within {} s (a hang or runaway work)",
                    CASE_TIME_LIMIT.as_secs()
                )
            } else if memory > MEMORY_LIMIT_BYTES {
                format!("the process grew to {} MiB (limit {} MiB)", memory >> 20, MEMORY_LIMIT_BYTES >> 20)
            } else {
                continue;
            };
            let case = Case::new(&base, seed, index);
            match save(&case, &failure) {
                Ok(dir) => eprintln!("case {index}: {failure}; saved in {}", dir.display()),
                Err(e) => eprintln!("case {index}: {failure}; could not be saved: {e:#}"),
            }
            let _ = fs::remove_dir_all(&work);
            std::process::exit(1);
        }
    });
    current
}

/// The process's resident memory, from `/proc/self/statm` (0 where there is none).
fn resident_bytes() -> u64 {
    let pages = fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|p| p.parse::<u64>().ok()))
        .unwrap_or(0);
    pages * 4096
}

/// A fresh scratch folder under the system's temporary folder.
fn tempdir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("qkv-fuzz-{}", std::process::id()));
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

#[cfg(test)]
mod tests;
