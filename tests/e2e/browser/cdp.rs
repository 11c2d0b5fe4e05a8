//! A small Chrome DevTools Protocol client for Debian's chromium, over `--remote-debugging-pipe`.
//!
//! Why a pipe and not a websocket or WebDriver: chromium reads protocol messages from its file
//! descriptor 3 and writes replies to descriptor 4, NUL-separated JSON. A shell `exec` with two
//! redirections puts our stdin/stdout there, so the client needs nothing but `serde_json` (no
//! websocket crate, no async runtime, no chromedriver), and the browser quits by itself when the
//! pipe closes: a test process that dies, however it dies, takes its browser with it.
//!
//! One [`Browser`] is one headless chromium with a fresh profile and one tab. It records, for
//! the whole of its life, every request URL and every console error, uncaught exception, log
//! error and failed load, so a test can assert on them at the end ([`Browser::assert_clean`]).

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::kill_process_group;

/// How long one protocol call or one awaited condition may take before the test fails. axe-core
/// over a long page takes 5 to 7 s on a loaded 2-core machine, and the print view holds the whole
/// course on one page, several times one section's work.
const TIMEOUT: Duration = Duration::from_secs(30);

/// The flags headless chromium needs here: run as root it refuses to start without
/// `--no-sandbox`; without the background-networking, component-update and sync switches it
/// floods the closed network with refused connections; the rest keep runs alike.
const FLAGS: &[&str] = &[
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
];

/// A viewport: CSS width and height, and whether it is a phone (honours `<meta name=viewport>`,
/// touch, mobile scrollbars).
#[derive(Debug, Clone, Copy)]
pub struct Viewport {
    pub width: u32,
    pub height: u32,
    pub mobile: bool,
}

/// A desktop window, 1280 px wide.
pub const DESKTOP: Viewport = Viewport { width: 1280, height: 900, mobile: false };
/// A phone, 360 px wide.
pub const PHONE: Viewport = Viewport { width: 360, height: 780, mobile: true };

/// A point in CSS pixels of the viewport.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    pub x: f64,
    pub y: f64,
}

/// A key as the protocol describes it.
#[derive(Debug, Clone, Copy)]
pub struct Key {
    /// `KeyboardEvent.key`.
    pub key: &'static str,
    /// `KeyboardEvent.code`.
    pub code: &'static str,
    /// The Windows virtual key code chromium maps the key from.
    pub key_code: u32,
    /// The text the key types, if any (Enter types `\r`, Space a space).
    pub text: &'static str,
}

pub const ARROW_LEFT: Key = Key { key: "ArrowLeft", code: "ArrowLeft", key_code: 37, text: "" };
pub const ARROW_UP: Key = Key { key: "ArrowUp", code: "ArrowUp", key_code: 38, text: "" };
pub const ARROW_RIGHT: Key = Key { key: "ArrowRight", code: "ArrowRight", key_code: 39, text: "" };
pub const ARROW_DOWN: Key = Key { key: "ArrowDown", code: "ArrowDown", key_code: 40, text: "" };
pub const ENTER: Key = Key { key: "Enter", code: "Enter", key_code: 13, text: "\r" };
pub const SPACE: Key = Key { key: " ", code: "Space", key_code: 32, text: " " };
pub const TAB: Key = Key { key: "Tab", code: "Tab", key_code: 9, text: "" };

/// The protocol's modifier bit for Shift.
pub const SHIFT: u32 = 8;

/// One headless chromium with a fresh profile and one attached tab. Killed on drop, also when
/// the test panics.
pub struct Browser {
    child: Child,
    pipe: Option<ChildStdin>,
    inbox: Receiver<Value>,
    session: String,
    next_id: u64,
    /// The loader of the main frame's current document, and every loader whose `load` fired.
    main_loader: String,
    loaded: Vec<String>,
    /// Every request URL the tab made, in order.
    pub requests: Vec<String>,
    /// Console errors, uncaught exceptions, log errors and failed loads, as one line each.
    pub problems: Vec<String>,
    profile: tempfile::TempDir,
}

impl Browser {
    /// Starts `chromium` (a path or a name on `PATH`) with a fresh profile, opens one blank tab at
    /// `viewport`, with page scripts enabled or not.
    pub fn launch(chromium: &Path, viewport: Viewport, javascript: bool) -> Browser {
        let profile = tempfile::tempdir().expect("temp profile dir");
        let log = std::fs::File::create(profile.path().join("chromium.log")).expect("chromium log");
        let mut command = Command::new("/bin/sh");
        // fd 3 = what we write (our stdin pipe), fd 4 = what we read (our stdout pipe); chromium's
        // own stdout and stderr go to the log.
        command
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg(chromium)
            .args(FLAGS)
            .arg(format!("--user-data-dir={}", profile.path().join("data").display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log);
        // Its own process group, so that drop can end the renderers and helpers too.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child =
            command.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e}", chromium.display()));
        let pipe = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (send, inbox) = channel();
        thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                if message.last() == Some(&0) {
                    message.pop();
                }
                let Ok(value) = serde_json::from_slice::<Value>(&message) else { break };
                if send.send(value).is_err() {
                    break;
                }
                message.clear();
            }
        });
        let mut browser = Browser {
            child,
            pipe,
            inbox,
            session: String::new(),
            next_id: 0,
            main_loader: String::new(),
            loaded: Vec::new(),
            requests: Vec::new(),
            problems: Vec::new(),
            profile,
        };
        let target = browser.call("Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().expect("targetId").to_string();
        let attached =
            browser.call("Target.attachToTarget", json!({ "targetId": target_id, "flatten": true }));
        browser.session = attached["sessionId"].as_str().expect("sessionId").to_string();
        for domain in ["Page", "Runtime", "Network", "Log"] {
            browser.call(&format!("{domain}.enable"), json!({}));
        }
        browser.call("Page.setLifecycleEventsEnabled", json!({ "enabled": true }));
        browser.set_javascript(javascript);
        browser.set_viewport(viewport);
        browser
    }

    /// Turns page scripts on or off, from the next navigation on.
    pub fn set_javascript(&mut self, on: bool) {
        self.call("Emulation.setScriptExecutionDisabled", json!({ "value": !on }));
    }

    /// Sets the viewport (and touch input for a phone).
    pub fn set_viewport(&mut self, viewport: Viewport) {
        let Viewport { width, height, mobile } = viewport;
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile }),
        );
        self.call("Emulation.setTouchEmulationEnabled", json!({ "enabled": mobile, "maxTouchPoints": 1 }));
    }

    /// Opens `url` and returns once its own `load` event fired (deferred scripts have run by
    /// then). Waiting on this navigation's loader, not on any `load`, matters: the blank tab's
    /// own load can arrive after the navigation started.
    pub fn navigate(&mut self, url: &str) {
        let result = self.call("Page.navigate", json!({ "url": url }));
        if let Some(error) = result["errorText"].as_str() {
            panic!("cannot open {url}: {error}");
        }
        let loader = result["loaderId"].as_str().expect("a navigation's loaderId").to_string();
        self.await_load(|b| b.loaded.contains(&loader), url);
        self.settle();
    }

    /// Reloads the page, as the learner's F5 would, and waits for the new document's `load`.
    pub fn reload(&mut self) {
        let old = self.main_loader.clone();
        self.call("Page.reload", json!({ "ignoreCache": true }));
        self.await_load(|b| b.main_loader != old && b.loaded.contains(&b.main_loader), "the reload");
        self.settle();
    }

    /// Loads every image now and waits until they are decoded. Lazy figures otherwise arrive
    /// while a test points at something further down, and shift the page under the pointer
    /// (their `<img>` reserve no space before they load).
    fn settle(&mut self) {
        self.eval(
            "Promise.all(Array.from(document.images, (img) => { img.loading = 'eager'; return img.decode().catch(() => {}); }))",
        );
    }

    fn await_load(&mut self, done: impl Fn(&Browser) -> bool, what: &str) {
        let deadline = Instant::now() + TIMEOUT;
        while !done(self) {
            if !self.pump(deadline) {
                panic!("{what} did not finish loading within {TIMEOUT:?}");
            }
        }
    }

    /// Evaluates `expression` in the page and returns its value as JSON (promises awaited).
    /// An exception fails the test with its text.
    pub fn eval(&mut self, expression: &str) -> Value {
        let reply = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        );
        if let Some(details) = reply.get("exceptionDetails") {
            let text =
                details["exception"]["description"].as_str().or(details["text"].as_str()).unwrap_or("?");
            panic!("page evaluation failed: {text}\nexpression: {expression}");
        }
        reply["result"]["value"].clone()
    }

    /// Waits until `expression` is truthy in the page; fails with `what` and, to say what the
    /// page did instead, the value of `explain` at the deadline.
    pub fn wait_for(&mut self, expression: &str, what: &str, explain: &str) {
        let deadline = Instant::now() + TIMEOUT;
        let probe =
            format!("(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()");
        let params = json!({ "expression": probe, "returnByValue": true, "awaitPromise": true });
        loop {
            match self.try_call("Runtime.evaluate", params.clone()) {
                Ok(reply) if reply["result"]["value"] == Value::Bool(true) => return,
                Ok(_) => {}
                // A probe sent as the page navigates (the condition is often that it has) is
                // dropped with the old page: it is not an answer, so ask the new page.
                Err(error)
                    if error["message"].as_str().is_some_and(|m| m.contains("navigated or closed")) => {}
                Err(error) => panic!("Runtime.evaluate failed: {error}"),
            }
            // Between polls, take in whatever the browser reports (a condition wait, not a nap).
            let poll = (Instant::now() + Duration::from_millis(15)).min(deadline);
            while self.pump(poll) {}
            if Instant::now() >= deadline {
                let state = if explain.is_empty() { Value::Null } else { self.eval(explain) };
                panic!(
                    "timed out after {TIMEOUT:?} waiting for {what}\n  condition: {expression}\n  page: {state}"
                );
            }
        }
    }

    /// Presses and releases the left mouse button at `at`.
    pub fn click_at(&mut self, at: Point) {
        self.mouse("mouseMoved", at, 0);
        self.mouse("mousePressed", at, 1);
        self.mouse("mouseReleased", at, 0);
    }

    /// Moves the mouse to `at` with the left button `held`.
    pub fn mouse_move(&mut self, at: Point, held: bool) {
        self.mouse("mouseMoved", at, u32::from(held));
    }

    /// Presses the left mouse button at `at`.
    pub fn mouse_down(&mut self, at: Point) {
        self.mouse("mouseMoved", at, 0);
        self.mouse("mousePressed", at, 1);
    }

    /// Releases the left mouse button at `at`.
    pub fn mouse_up(&mut self, at: Point) {
        self.mouse("mouseReleased", at, 0);
    }

    fn mouse(&mut self, kind: &str, at: Point, buttons: u32) {
        let button = if kind == "mouseMoved" && buttons == 0 { "none" } else { "left" };
        self.call(
            "Input.dispatchMouseEvent",
            json!({ "type": kind, "x": at.x, "y": at.y, "button": button, "buttons": buttons, "clickCount": 1 }),
        );
    }

    /// One finger: touches down at `path[0]`, moves through the rest, lifts at the last point.
    pub fn touch_drag(&mut self, path: &[Point]) {
        let (first, rest) = path.split_first().expect("a touch path has a start");
        let touch =
            |p: &Point| json!([{ "x": p.x, "y": p.y, "id": 1, "radiusX": 2, "radiusY": 2, "force": 1 }]);
        self.call("Input.dispatchTouchEvent", json!({ "type": "touchStart", "touchPoints": touch(first) }));
        for p in rest {
            self.call("Input.dispatchTouchEvent", json!({ "type": "touchMove", "touchPoints": touch(p) }));
        }
        self.call("Input.dispatchTouchEvent", json!({ "type": "touchEnd", "touchPoints": [] }));
    }

    /// Presses and releases `key` with `modifiers` (e.g. [`SHIFT`]) in the focused element.
    pub fn press(&mut self, key: Key, modifiers: u32) {
        let kind = if key.text.is_empty() { "rawKeyDown" } else { "keyDown" };
        let mut down = json!({
            "type": kind, "key": key.key, "code": key.code, "modifiers": modifiers,
            "windowsVirtualKeyCode": key.key_code, "nativeVirtualKeyCode": key.key_code,
        });
        if !key.text.is_empty() {
            down["text"] = json!(key.text);
            down["unmodifiedText"] = json!(key.text);
        }
        self.call("Input.dispatchKeyEvent", down);
        self.call(
            "Input.dispatchKeyEvent",
            json!({ "type": "keyUp", "key": key.key, "code": key.code, "modifiers": modifiers,
                    "windowsVirtualKeyCode": key.key_code, "nativeVirtualKeyCode": key.key_code }),
        );
    }

    /// Types `text` into the focused element, as a keyboard or an input method would.
    pub fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({ "text": text }));
    }

    /// Saves a PNG of the whole page (beyond the viewport) to `path`.
    pub fn screenshot(&mut self, path: &Path) {
        let metrics = self.call("Page.getLayoutMetrics", json!({}));
        let size = &metrics["cssContentSize"];
        let (width, height) =
            (size["width"].as_f64().expect("width"), size["height"].as_f64().expect("height"));
        self.capture(path, [0.0, 0.0, width, height]);
    }

    /// Saves a PNG of the rectangle `[left, top, width, height]` of the page (CSS pixels from the
    /// document's top left) to `path`.
    pub fn capture(&mut self, path: &Path, [x, y, width, height]: [f64; 4]) {
        let clip = json!({ "x": x, "y": y, "width": width, "height": height, "scale": 1 });
        // A capture beyond the viewport lays the page out at its full height for a moment and can
        // leave the scroll position off afterwards (on a phone, by whole screens, which a later
        // touch then snaps back): put it back where it was.
        let scrolled = self.eval("[scrollX, scrollY]");
        let shot = self.call(
            "Page.captureScreenshot",
            json!({ "format": "png", "captureBeyondViewport": true, "clip": clip }),
        );
        self.eval(&format!("scrollTo({}, {}); true", scrolled[0], scrolled[1]));
        let png = base64_decode(shot["data"].as_str().expect("screenshot data"));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot dir");
        }
        std::fs::write(path, png).expect("write screenshot");
    }

    /// Fails if any request left `file://` or the page logged an error, an uncaught exception or a
    /// failed load, over the browser's whole life so far.
    pub fn assert_clean(&mut self, scenario: &str) {
        // Take in what is still in flight.
        while self.pump(Instant::now() + Duration::from_millis(50)) {}
        let outside: Vec<&String> = self
            .requests
            .iter()
            .filter(|u| !["file:", "data:", "blob:"].iter().any(|s| u.starts_with(s)))
            .collect();
        assert!(outside.is_empty(), "{scenario}: requests left file://: {outside:#?}");
        assert!(self.problems.is_empty(), "{scenario}: the page reported errors: {:#?}", self.problems);
    }

    /// Sends one command to the tab (or, before a tab is attached, to the browser) and waits for
    /// its reply, taking in the events that arrive meanwhile.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        match self.try_call(method, params) {
            Ok(result) => result,
            Err(error) => panic!("{method} failed: {error}"),
        }
    }

    /// [`Browser::call`], with the browser's error reply returned rather than failed on.
    fn try_call(&mut self, method: &str, params: Value) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() && !method.starts_with("Target.") && !method.starts_with("Browser.") {
            message["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&message).expect("json");
        bytes.push(0);
        let pipe = self.pipe.as_mut().expect("the pipe is open");
        if let Err(e) = pipe.write_all(&bytes).and_then(|()| pipe.flush()) {
            panic!("chromium closed its pipe ({e}) before {method}{}", self.log_tail());
        }
        let deadline = Instant::now() + TIMEOUT;
        loop {
            match self.inbox.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(reply) if reply["id"].as_u64() == Some(id) => {
                    if let Some(error) = reply.get("error") {
                        return Err(error.clone());
                    }
                    return Ok(reply["result"].clone());
                }
                Ok(event) => self.observe(&event),
                Err(RecvTimeoutError::Timeout) => panic!("{method}: no reply within {TIMEOUT:?}"),
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("chromium exited during {method}{}", self.log_tail())
                }
            }
        }
    }

    /// Takes in one message before `deadline`; false if none came.
    fn pump(&mut self, deadline: Instant) -> bool {
        match self.inbox.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(event) => {
                self.observe(&event);
                true
            }
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => panic!("chromium exited{}", self.log_tail()),
        }
    }

    /// Records what an event says about the page: loads, requests and every kind of error.
    fn observe(&mut self, event: &Value) {
        let p = &event["params"];
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        match event["method"].as_str().unwrap_or_default() {
            "Page.frameNavigated" if p["frame"]["parentId"].is_null() => {
                self.main_loader = text(&p["frame"]["loaderId"]);
            }
            "Page.lifecycleEvent" if p["name"] == "load" => self.loaded.push(text(&p["loaderId"])),
            "Network.requestWillBeSent" => self.requests.push(text(&p["request"]["url"])),
            "Network.loadingFailed" if p["canceled"] != json!(true) => {
                self.problems.push(format!(
                    "failed load: {} ({})",
                    text(&p["errorText"]),
                    text(&p["requestId"])
                ));
            }
            "Runtime.consoleAPICalled" if matches!(p["type"].as_str(), Some("error" | "assert")) => {
                let args: Vec<String> = p["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| {
                        a["value"]
                            .as_str()
                            .map(str::to_string)
                            .unwrap_or_else(|| a["description"].to_string())
                    })
                    .collect();
                self.problems.push(format!("console.{}: {}", text(&p["type"]), args.join(" ")));
            }
            "Runtime.exceptionThrown" => {
                let d = &p["exceptionDetails"];
                let description =
                    d["exception"]["description"].as_str().unwrap_or(d["text"].as_str().unwrap_or("?"));
                self.problems.push(format!("uncaught exception: {description}"));
            }
            "Log.entryAdded" if p["entry"]["level"] == "error" => {
                self.problems.push(format!(
                    "log: {} {}",
                    text(&p["entry"]["text"]),
                    text(&p["entry"]["url"])
                ));
            }
            _ => {}
        }
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.profile.path().join("chromium.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!("; its log ends:\n{}", tail.join("\n"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Nothing of the profile is worth a graceful shutdown (it is deleted next): the browser,
        // its renderers and helpers go at once, so nothing outlives the test, passed or panicked.
        kill_process_group(&mut self.child);
        self.pipe = None;
    }
}

/// Standard base64 (the protocol's encoding of screenshots) to bytes.
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c:?}"),
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    for chunk in digits.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, &d)| n | (u32::from(d) << (18 - 6 * i)));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
fn base64_decodes_every_padding() {
    assert_eq!(base64_decode("TWFu"), b"Man");
    assert_eq!(base64_decode("TWE="), b"Ma");
    assert_eq!(base64_decode("TQ=="), b"M");
}
