//! `cargo xtask serve [--port N] [--content DIR] [--out DIR]`: the live preview. Builds the site,
//! serves it on 127.0.0.1, rebuilds when `content/` changes (debounced), and reloads the open
//! page. A content error shows as an overlay on the last good page, with `file:line:column`.
//!
//! The preview writes only the site: the author's files stay as they are while an editor has
//! them open (`cargo xtask build-content` rewrites them). The reload script and the overlay are
//! added to pages as they are served, never written to the site.

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use notify::Watcher;
use tiny_http::{Header, Request, Response, Server};

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

/// What the open pages need to know: which build they show, and whether it failed.
#[derive(Debug, Default)]
struct Status {
    /// Bumped by every build, good or bad: a page showing an older one reloads.
    generation: u64,
    /// The last build's errors, shown over the last good page.
    error: Option<String>,
    /// Set on Ctrl-C, so waiting pages are answered at once.
    stopping: bool,
}

/// The status and a way to wake every page waiting for it to change.
#[derive(Default)]
struct Shared {
    status: Mutex<Status>,
    changed: Condvar,
}

impl Shared {
    fn update(&self, f: impl FnOnce(&mut Status)) {
        if let Ok(mut status) = self.status.lock() {
            f(&mut status);
        }
        self.changed.notify_all();
    }

    fn snapshot(&self) -> (u64, Option<String>) {
        self.status.lock().map_or((0, None), |s| (s.generation, s.error.clone()))
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

    // Loopback only: the preview is for the author at this machine.
    let server =
        Server::http(("127.0.0.1", port)).map_err(|e| anyhow!("serving on 127.0.0.1:{port}: {e}"))?;
    let address = server.server_addr().to_ip().context("the server's address")?;
    let server = Arc::new(server);
    let http = {
        let (server, shared, stop, out) =
            (Arc::clone(&server), Arc::clone(&shared), Arc::clone(&stop), paths.out.clone());
        thread::spawn(move || serve_requests(&server, &shared, &stop, &out))
    };

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
    server.unblock();
    let _ = http.join();
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
                    "; {stale} place{} in the lesson files out of date (`cargo xtask build-content` rewrites them)",
                    if stale == 1 { " is" } else { "s are" }
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

/// Answers requests until Ctrl-C.
fn serve_requests(server: &Server, shared: &Arc<Shared>, stop: &AtomicBool, out: &Path) {
    while !stop.load(Ordering::Relaxed) {
        match server.recv_timeout(TICK) {
            Ok(Some(request)) if request.url().starts_with(WAIT_PATH) => {
                // Held open until the next build: one thread each, so pages do not queue.
                let shared = Arc::clone(shared);
                thread::spawn(move || wait_for_build(request, &shared));
            }
            Ok(Some(request)) => {
                let (generation, error) = shared.snapshot();
                let response = page_or_file(out, request.url(), generation, error.as_deref());
                let _ = request.respond(response);
            }
            Ok(None) => {}
            Err(_) => break,
        }
    }
}

/// `/__qkv/wait?since=N`: answers with the build generation once it is not `N` any more.
fn wait_for_build(request: Request, shared: &Shared) {
    let since: Option<u64> = request.url().split_once("since=").and_then(|(_, n)| n.parse().ok());
    let deadline = Instant::now() + LONG_POLL;
    let mut generation = 0;
    if let Ok(mut status) = shared.status.lock() {
        while since == Some(status.generation) && !status.stopping && Instant::now() < deadline {
            match shared.changed.wait_timeout(status, deadline.saturating_duration_since(Instant::now())) {
                Ok((s, _)) => status = s,
                Err(_) => return,
            }
        }
        generation = status.generation;
    }
    let body = format!("{{\"generation\": {generation}}}");
    let _ =
        request.respond(Response::from_string(body).with_header(header("Content-Type", "application/json")));
}

fn header(name: &str, value: &str) -> Header {
    // Both are ASCII literals of ours, which `from_bytes` always accepts.
    Header::from_bytes(name.as_bytes(), value.as_bytes()).unwrap_or_else(|()| unreachable!("ASCII header"))
}

/// The file a URL names in the site, with the reload script (and the overlay, after a failed
/// build) added to pages; a page saying so when there is no such file.
fn page_or_file(
    out: &Path,
    url: &str,
    generation: u64,
    error: Option<&str>,
) -> Response<std::io::Cursor<Vec<u8>>> {
    let path = url.split(['?', '#']).next().unwrap_or("/");
    let file = site_file(out, path);
    let bytes = file.as_ref().and_then(|f| std::fs::read(f).ok());
    let name = file
        .as_ref()
        .and_then(|f| f.file_name())
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let (status, body, kind) = match bytes {
        Some(bytes) if name.ends_with(".html") => (
            200,
            with_preview(&String::from_utf8_lossy(&bytes), generation, error).into_bytes(),
            "text/html; charset=utf-8",
        ),
        Some(bytes) => (200, bytes, content_type(&name)),
        None => {
            let page = format!(
                "<!DOCTYPE html>\n<html lang=\"en\">\n<head><meta charset=\"utf-8\"><title>Not found · qkv</title></head>\n<body>\n<p>No page {} in the site (yet). <a href=\"/\">Contents</a></p>\n</body>\n</html>\n",
                qkv_course::escape_html(path)
            );
            (404, with_preview(&page, generation, error).into_bytes(), "text/html; charset=utf-8")
        }
    };
    Response::from_data(body)
        .with_status_code(status)
        .with_header(header("Content-Type", kind))
        .with_header(header("Cache-Control", "no-store"))
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
    let script = format!(
        "<script>\n// qkv serve: reload when the lesson is rebuilt.\n(function () {{\n  var generation = {generation};\n  function wait() {{\n    fetch(\"{WAIT_PATH}?since=\" + generation, {{ cache: \"no-store\" }})\n      .then(function (r) {{ return r.json(); }})\n      .then(function (s) {{ if (s.generation !== generation) {{ location.reload(); }} else {{ wait(); }} }})\n      .catch(function () {{ setTimeout(wait, 1000); }});\n  }}\n  wait();\n}})();\n</script>\n"
    );
    let insert = format!("{overlay}{script}");
    match page.rfind("</body>") {
        Some(at) => format!("{}{insert}{}", &page[..at], &page[at..]),
        None => format!("{page}{insert}"),
    }
}

#[cfg(test)]
mod tests;
