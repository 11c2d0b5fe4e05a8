//! The lesson in a real browser (issue 8): Debian's chromium, driven over the DevTools protocol
//! (`browser/cdp.rs`), on the site that the real `xtask build-content` writes. Every scenario
//! asserts on the page's `data-qkv-*` contract (documented in `content/README.md`) and compares
//! the numbers it shows with the engine's f64 reference, computed here in Rust from the lesson's
//! own inputs (`browser/lesson.rs`).
//!
//! Without chromium the tests print one line and pass, unless `CI` is set: then they fail, so CI
//! can never go green by skipping them. Every browser starts with a fresh profile (empty
//! `localStorage`) and is killed when its test ends, passed or panicked. Screenshots go to
//! `target/browser-screenshots/`.

mod a11y;
mod block;
mod cdp;
mod course;
mod decode;
mod descent;
mod dom;
mod drag;
mod heads;
mod layout;
mod lesson;
mod matrix;
mod near_miss;
mod print;
mod progress;
mod quiz;
mod search;
mod shuffle;
mod sweep;
mod tiles;
mod window;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cdp::{Browser, Viewport};

use crate::content::{content_dir, copy_dir};
use crate::support::xtask;

/// The pages `cargo xtask build-content` writes: the index, one per `content/NN-NAME.md`
/// (`NAME.html`) in course order, the glossary and the print view. The page-wide tests (layout,
/// accessibility) open every one.
pub fn pages() -> Vec<String> {
    let mut sections: Vec<String> = std::fs::read_dir(content_dir())
        .expect("content/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|name| name.ends_with(".md") && name.as_bytes().first().is_some_and(u8::is_ascii_digit))
        .collect();
    sections.sort();
    let named = sections.iter().map(|name| format!("{}.html", qkv_course::section_id(name)));
    std::iter::once("index.html".to_string())
        .chain(named)
        .chain(["glossary.html".to_string(), "print.html".to_string()])
        .collect()
}

/// Debian's chromium, or `None` (after saying so once) when it is not installed and `CI` is not
/// set. With `CI` set, a missing browser fails the test.
fn chromium() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let found = std::env::split_paths(&path).map(|dir| dir.join("chromium")).find(|p| p.is_file());
        if found.is_none() && std::env::var_os("CI").is_none_or(|v| v.is_empty()) {
            // Straight to stderr: the test harness captures `eprintln!` of passing tests.
            let _ = writeln!(
                std::io::stderr(),
                "browser tests skipped: chromium is not installed (`apt-get install chromium`; with CI set they fail)"
            );
        }
        found
    });
    if found.is_none() && std::env::var_os("CI").is_some_and(|v| !v.is_empty()) {
        panic!("CI is set but chromium is not on PATH: `.ci/run` installs it with apt-get");
    }
    found.as_deref()
}

/// The site, built once per test run by the real `xtask build-content` from a copy of
/// `content/` (so that a stale lesson is never rewritten under the other tests' feet), into
/// `target/tmp/browser-site/`.
fn site() -> &'static Path {
    static SITE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = SITE.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser-site");
        let _ = std::fs::remove_dir_all(&root);
        let (content, out) = (root.join("content"), root.join("site"));
        copy_dir(&content_dir(), &content);
        let utf8 = |p: &Path| p.to_str().expect("utf-8 path").to_string();
        let run = xtask(&["build-content", "--content", &utf8(&content), "--out", &utf8(&out)]);
        if run.status == 0 { Ok(out) } else { Err(format!("build-content failed:\n{}", run.stderr)) }
    });
    built.as_deref().unwrap_or_else(|e| panic!("{e}"))
}

/// The `file://` address of `page` in the built site.
fn url(page: &str) -> String {
    let path = site().join(page);
    let path = path.to_str().expect("utf-8 path");
    assert!(!path.contains([' ', '#', '?', '%']), "the site path needs no escaping: {path}");
    format!("file://{path}")
}

/// Where screenshots go: `target/browser-screenshots/NAME.png`.
fn screenshot_path(name: &str) -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target/tmp sits in target");
    target.join("browser-screenshots").join(format!("{name}.png"))
}

/// A fresh browser (its own profile: empty `localStorage`) at `viewport` with page scripts on, or
/// `None` when chromium is missing outside CI (the test then passes without running). Tests call
/// it first, so that a machine without chromium skips them before anything else is checked.
fn launch(viewport: Viewport) -> Option<Browser> {
    launch_with(viewport, true)
}

/// Like [`launch`], with page scripts on or off.
fn launch_with(viewport: Viewport, javascript: bool) -> Option<Browser> {
    Some(Browser::launch(chromium()?, viewport, javascript))
}

impl Browser {
    /// Opens `page` of the built site (`attention.html`).
    fn open(&mut self, page: &str) {
        self.navigate(&url(page));
    }
}
