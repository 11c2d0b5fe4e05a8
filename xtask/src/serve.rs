//! `cargo xtask serve [--port N] [--content DIR] [--out DIR]`: the live preview. Builds the site,
//! serves it on 127.0.0.1, rebuilds when `content/` changes (debounced), and reloads the open
//! page. A content error shows as an overlay on the last good page, with `file:line:column`.
//!
//! The preview writes only the site: the author's files stay as they are while an editor has
//! them open (`cargo xtask build-content` rewrites them). The reload script and the overlay are
//! added to pages as they are served, never written to the site. The HTTP side, and what keeps
//! a client from knocking it over, is `serve/http.rs`.

mod http;

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use notify::Watcher;

use self::http::{Handler, Request, Response, Server};

use crate::build_content;
use crate::cli::{Args, say};
use crate::lesson::{self, Failure, Mode, Paths};

/// Quiet time after the last change before rebuilding: an editor's save is often several writes.
const DEBOUNCE: Duration = Duration::from_millis(200);
/// How often the loops look at the Ctrl-C flag.
const TICK: Duration = Duration::from_millis(100);
/// How long a page's wait for the next build is held open before it asks again.
const LONG_POLL: Duration = Duration::from_secs(25);
/// The path the reload script waits on.
const WAIT_PATH: &str = "/__qkv/wait";
/// Reload requests held at once. Beyond it, the oldest is answered (with the generation it
/// has, so its page asks again after a pause): a flood of them holds at most this many
/// connections, and leaves the rest of the server's connections to pages.
const MAX_HELD_WAITS: usize = 32;
/// How often a held reload request looks whether its page has gone away (closed, reloaded).
const CLIENT_CHECK: Duration = Duration::from_secs(1);
/// How long Ctrl-C waits for open connections (the held reload requests it answers, a page
/// being sent) before the process ends.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// What the open pages need to know: which build they show, and whether it failed.
#[derive(Debug)]
struct Status {
    /// Bumped by every build, good or bad: a page showing an older one reloads.
    generation: u64,
    /// The last build's errors, shown over the last good page.
    error: Option<String>,
    /// Set on Ctrl-C, so waiting pages are answered at once.
    stopping: bool,
    /// The held reload requests' tickets (their connections' [`Request::accepted`]), oldest
    /// first; one taken off is answered.
    held: VecDeque<u64>,
    /// How many may be held: [`MAX_HELD_WAITS`], or fewer once descriptors ran out.
    held_limit: usize,
}

impl Default for Status {
    fn default() -> Status {
        Status {
            generation: 0,
            error: None,
            stopping: false,
            held: VecDeque::new(),
            held_limit: MAX_HELD_WAITS,
        }
    }
}

/// The status and a way to wake every page waiting for it to change.
#[derive(Default)]
struct Shared {
    status: Mutex<Status>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Status> {
        // Every update leaves the status whole, so one from a thread that panicked is still good.
        self.status.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn update(&self, f: impl FnOnce(&mut Status)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    fn snapshot(&self) -> (u64, Option<String>) {
        let status = self.lock();
        (status.generation, status.error.clone())
    }

    /// `/__qkv/wait?since=N`: the build generation, once it is not `N` any more, the request has
    /// been held for [`LONG_POLL`], or newer requests pushed it out; `None` when the page went
    /// away first. `ticket` orders the requests (older is smaller): one older than every held
    /// request while as many as may be are held is answered at once.
    fn wait_for_build(&self, since: Option<u64>, ticket: u64, client_left: impl Fn() -> bool) -> Option<u64> {
        let deadline = Instant::now() + LONG_POLL;
        let mut status = self.lock();
        if since != Some(status.generation) || status.stopping {
            return Some(status.generation);
        }
        // In order, not at the back: threads reach here in any order, and a late older request
        // must not push a newer one out.
        let place = status.held.partition_point(|&t| t < ticket);
        status.held.insert(place, ticket);
        if status.held.len() > status.held_limit {
            let excess = status.held.len() - status.held_limit;
            status.held.drain(..excess);
            self.changed.notify_all();
        }
        let mut left = false;
        while since == Some(status.generation) && !status.stopping && status.held.contains(&ticket) && !left {
            let wait = deadline.saturating_duration_since(Instant::now()).min(CLIENT_CHECK);
            if wait.is_zero() {
                break;
            }
            let (guard, waited) =
                self.changed.wait_timeout(status, wait).unwrap_or_else(PoisonError::into_inner);
            status = guard;
            // Only when nothing else woke it: a flood wakes every held request many times over.
            left = waited.timed_out() && client_left();
        }
        status.held.retain(|&t| t != ticket);
        (!left).then_some(status.generation)
    }
}

/// What the server serves: the site and the reload requests.
struct Preview {
    shared: Arc<Shared>,
    out: PathBuf,
}

impl Handler for Preview {
    fn respond(&self, request: &Request) -> Response {
        let (path, query) = request.target.split_once('?').unwrap_or((request.target, ""));
        if path != WAIT_PATH {
            let (generation, error) = self.shared.snapshot();
            return page_or_file(&self.out, request.target, generation, error.as_deref());
        }
        let since =
            query.split('&').find_map(|pair| pair.strip_prefix("since=")).and_then(|n| n.parse().ok());
        // An answer to a page that went away is never read: any will do.
        let generation =
            self.shared.wait_for_build(since, request.accepted, || request.client_left()).unwrap_or_default();
        Response::new(200, "application/json", format!("{{\"generation\": {generation}}}").into_bytes())
    }

    /// Holds at most half the connections the server keeps, so that pages always have the other
    /// half, and answers the oldest beyond that at once (their pages ask again after a pause).
    fn relieve(&self, connections: usize) {
        self.shared.update(|s| {
            s.held_limit = s.held_limit.min(connections / 2).max(1);
            let excess = s.held.len().saturating_sub(s.held_limit);
            s.held.drain(..excess);
        });
    }
}

/// Runs the subcommand.
pub fn run(args: Vec<String>) -> Result<()> {
    let mut args = Args::new("serve", args);
    let port: u16 = match args.value("--port")? {
        Some(p) => {
            p.parse().map_err(|_| anyhow!("--port `{p}`: expected a port number, 0 for any free one"))?
        }
        None => 3000,
    };
    let paths = build_content::paths(&mut args)?;
    args.finish()?;

    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        // The first Ctrl-C stops between builds; a second one, while a build runs, ends at once.
        signal_hook::flag::register_conditional_shutdown(signal, 130, Arc::clone(&stop))
            .and_then(|_| signal_hook::flag::register(signal, Arc::clone(&stop)))
            .context("listening for Ctrl-C")?;
    }
    let shared = Arc::new(Shared::default());
    rebuild(&paths, &shared)?;

    let preview = Preview { shared: Arc::clone(&shared), out: paths.out.clone() };
    let server =
        Server::start(port, Arc::new(preview)).with_context(|| format!("serving on 127.0.0.1:{port}"))?;
    let address = server.address();

    let (events, changes) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(events).context("watching the lesson folder")?;
    watcher
        .watch(&paths.content, notify::RecursiveMode::Recursive)
        .with_context(|| format!("watching {}", paths.content.display()))?;
    say!(
        "serving http://{address}/ from {}; watching {} (Ctrl-C stops)",
        paths.out.display(),
        paths.content.display()
    );

    while !stop.load(Ordering::Relaxed) {
        match changes.recv_timeout(TICK) {
            Ok(event) if touches_lesson(&event, &paths) => {
                // Debounce: wait for a quiet moment, then build once for the whole burst.
                let mut last = Instant::now();
                while last.elapsed() < DEBOUNCE && !stop.load(Ordering::Relaxed) {
                    if changes.recv_timeout(TICK.min(DEBOUNCE)).is_ok() {
                        last = Instant::now();
                    }
                }
                if !stop.load(Ordering::Relaxed) {
                    rebuild(&paths, &shared)?;
                }
            }
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // A build in progress has finished by now (this loop runs them), so nothing is half written.
    drop(watcher);
    shared.update(|s| s.stopping = true);
    server.wait_idle(STOP_GRACE);
    say!("stopped");
    Ok(())
}

/// Whether a watcher event is about a file of the lesson (not the site, if it sits inside).
fn touches_lesson(event: &notify::Result<notify::Event>, paths: &Paths) -> bool {
    match event {
        Ok(e) => !e.kind.is_access() && e.paths.iter().any(|p| !p.starts_with(&paths.out)),
        // A watcher error (say, a folder removed) may hide a change: rebuild to be sure.
        Err(_) => true,
    }
}

/// Builds the site from the lesson and tells the open pages.
fn rebuild(paths: &Paths, shared: &Shared) -> Result<()> {
    let started = Instant::now();
    let error = match lesson::run(paths, Mode::Preview) {
        Ok(outcome) => {
            let stale = outcome.stale.len();
            let note = if stale == 0 {
                String::new()
            } else {
                format!(
                    "; the lesson files have {stale} out-of-date place{} (`cargo xtask build-content` rewrites them)",
                    if stale == 1 { "" } else { "s" }
                )
            };
            say!("built in {} ms{note}", started.elapsed().as_millis());
            None
        }
        Err(Failure::Content(e)) => Some(e.to_string()),
        Err(Failure::Io(e)) => Some(format!("{e:#}")),
    };
    if let Some(e) = &error {
        say!("{e}\n(the pages show this over the last good build)");
    }
    shared.update(|s| {
        s.generation += 1;
        s.error = error;
    });
    Ok(())
}

/// The file a URL names in the site, with the reload script (and the overlay, after a failed
/// build) added to pages; a page saying so when there is no such file.
fn page_or_file(out: &Path, url: &str, generation: u64, error: Option<&str>) -> Response {
    let path = url.split(['?', '#']).next().unwrap_or("/");
    let file = site_file(out, path);
    let bytes = file.as_ref().map(std::fs::read);
    let name = file
        .as_ref()
        .and_then(|f| f.file_name())
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let (status, body, kind) = match bytes {
        Some(Ok(bytes)) if name.ends_with(".html") => (
            200,
            with_preview(&String::from_utf8_lossy(&bytes), generation, error).into_bytes(),
            "text/html; charset=utf-8",
        ),
        Some(Ok(bytes)) => (200, bytes, content_type(&name)),
        // Out of file descriptors, say: the file is there, and a 404 would say it is not.
        Some(Err(e)) if !names_nothing(&e) => {
            (500, format!("reading {path}: {e}\n").into_bytes(), "text/plain; charset=utf-8")
        }
        Some(Err(_)) | None => {
            let page = format!(
                "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Not found · qkv</title></head>\n<body>\n<p>No page {} in the site (yet). <a href=\"/\">Contents</a></p>\n</body>\n</html>\n",
                qkv_course::escape_html(path)
            );
            (404, with_preview(&page, generation, error).into_bytes(), "text/html; charset=utf-8")
        }
    };
    Response::new(status, kind, body)
}

/// Whether reading a site file failed because the URL names no file: a missing file or a folder,
/// and also a name longer than the file system allows (a 256-byte path segment) or a file where
/// a folder should be (`/attention.html/x`). Those are the client's mistakes, a 404, not the
/// server's trouble (a 500 that would echo the operating system's error).
fn names_nothing(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::NotFound | ErrorKind::IsADirectory | ErrorKind::NotADirectory | ErrorKind::InvalidFilename
    )
}

/// The site file a URL path names, or `None` for paths that leave the site folder.
fn site_file(out: &Path, path: &str) -> Option<PathBuf> {
    let relative = path.trim_start_matches('/');
    let relative = if relative.is_empty() || relative.ends_with('/') {
        format!("{relative}index.html")
    } else {
        relative.to_string()
    };
    // A backslash separates folders on Windows, where `a\..\..\x` would climb out.
    let relative = Path::new(&relative);
    let inside = !path.contains('\\') && relative.components().all(|c| matches!(c, Component::Normal(_)));
    inside.then(|| out.join(relative))
}

fn content_type(name: &str) -> &'static str {
    match name.rsplit('.').next() {
        Some("css") => "text/css; charset=utf-8",
        // The page script: a browser that sniffs strictly runs no script served as bytes.
        Some("js") => "text/javascript; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("ipynb") => "application/x-ipynb+json",
        Some("md") => "text/markdown; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// A page with the reload script, and the overlay when the last build failed.
fn with_preview(page: &str, generation: u64, error: Option<&str>) -> String {
    let overlay = error.map_or(String::new(), |e| {
        format!(
            "<div id=\"qkv-serve-error\" role=\"alert\" style=\"position:fixed;inset:0;z-index:2147483647;overflow:auto;background:rgba(20,20,20,.92);color:#fff;font:15px/1.5 system-ui,sans-serif;padding:2rem\">\n<p style=\"margin:0 0 1rem;font-weight:bold\">The lesson has errors; underneath is the last good build. Fix them and save: this page reloads.</p>\n<pre style=\"white-space:pre-wrap;font:14px/1.5 ui-monospace,monospace;color:#ffd5cc;background:#3a1d18;border:0;border-radius:6px;padding:1rem;margin:0\">{}</pre>\n</div>\n",
            qkv_course::escape_html(e)
        )
    });
    // An answer with the same generation (held too long, or pushed out by newer waits) is asked
    // again after a pause, so that pages beyond the preview's bound do not push each other out
    // at full speed.
    let script = format!(
        "<script>\n// qkv serve: reload when the lesson is rebuilt.\n(function () {{\n  var generation = {generation};\n  function wait() {{\n    fetch(\"{WAIT_PATH}?since=\" + generation, {{ cache: \"no-store\" }})\n      .then(function (r) {{ return r.json(); }})\n      .then(function (s) {{ if (s.generation !== generation) {{ location.reload(); }} else {{ setTimeout(wait, 500); }} }})\n      .catch(function () {{ setTimeout(wait, 1000); }});\n  }}\n  wait();\n}})();\n</script>\n"
    );
    let insert = format!("{overlay}{script}");
    match page.rfind("</body>") {
        Some(at) => format!("{}{insert}{}", &page[..at], &page[at..]),
        None => format!("{page}{insert}"),
    }
}

#[cfg(test)]
mod tests;
