//! `cargo xtask serve`, the live preview: started on a free port, it serves the lesson, rebuilds
//! when a file changes, shows content errors over the page, and stops cleanly on Ctrl-C.

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::content::{copy_of_content, snapshot};

/// How long the preview may take to notice a change and rebuild (debug build, busy machine).
const PATIENCE: Duration = Duration::from_secs(60);

/// A running `xtask serve` and the lines it prints; killed if a test fails midway.
struct Preview {
    child: Child,
    lines: mpsc::Receiver<String>,
    address: String,
}

impl Preview {
    fn start(content: &std::path::Path, out: &std::path::Path) -> Preview {
        let mut child = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .args(["serve", "--port", "0", "--content"])
            .arg(content)
            .arg("--out")
            .arg(out)
            .stdout(Stdio::piped())
            .spawn()
            .expect("xtask serve starts");
        let (send, lines) = mpsc::channel();
        let stdout = child.stdout.take().expect("stdout");
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut preview = Preview { child, lines, address: String::new() };
        let line = preview.wait_for_line("serving http://");
        let rest = line.split("serving http://").nth(1).expect("address");
        preview.address = rest.split('/').next().expect("host:port").to_string();
        assert!(preview.address.starts_with("127.0.0.1:"), "{line}");
        preview
    }

    fn wait_for_line(&self, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(_) => break,
            }
        }
        panic!("xtask serve never printed {needle:?}");
    }

    fn get(&self, path: &str) -> (u16, String) {
        get(&self.address, path)
    }

    /// Waits until the page at `path` contains `needle`; returns it.
    fn page_with(&self, path: &str, needle: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let (_, page) = self.get(path);
            if page.contains(needle) {
                return page;
            }
            assert!(Instant::now() < deadline, "{path} never showed {needle:?}:\n{page}");
            thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Preview {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// GET `path` from `address`: the status code and the body.
fn get(address: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(PATIENCE)).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("headers");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
    (status, body.to_string())
}

/// The generation a served page shows (from its reload script).
fn generation(page: &str) -> u64 {
    page.split("var generation = ")
        .nth(1)
        .and_then(|s| s.split(';').next())
        .and_then(|n| n.parse().ok())
        .expect("generation")
}

#[test]
fn the_preview_serves_rebuilds_reloads_and_stops() {
    let dir = copy_of_content();
    let (content, out) = (dir.path().join("content"), dir.path().join("site"));
    let preview = Preview::start(&content, &out);

    let (status, page) = preview.get("/attention.html");
    assert_eq!(status, 200);
    assert!(page.contains(">4.41</span>"), "{page}");
    let first = generation(&page);
    // The reload script is added as the page is served, never written to the site.
    let on_disk = fs::read_to_string(out.join("attention.html")).expect("the built page");
    assert!(
        on_disk.contains(">4.41</span>") && !on_disk.contains("__qkv"),
        "the snippet leaked into the site"
    );
    assert_eq!(preview.get("/../Cargo.toml").0, 404);

    // The open page waits for the next build.
    let address = preview.address.clone();
    let waiting = thread::spawn(move || get(&address, &format!("/__qkv/wait?since={first}")).1);

    let lesson = content.join("01-attention.md");
    let text = fs::read_to_string(&lesson).expect("lesson");
    fs::write(&lesson, text.replacen("values = [[2], [6], [4]]", "values = [[2], [5], [4]]", 1))
        .expect("edit");
    let answer = waiting.join().expect("the wait returns");
    assert_ne!(answer, format!("{{\"generation\": {first}}}"), "{answer}");
    let page = preview.page_with("/attention.html", ">4.01</span>");
    assert!(!page.contains("qkv-serve-error"), "{page}");
    assert!(
        fs::read_to_string(&lesson).expect("lesson").contains("[4.41](=sentence.love.output:2)"),
        "the preview rewrote the author's file"
    );

    // A content error shows over the last good page, with its position.
    let broken = fs::read_to_string(&lesson).expect("lesson").replacen(
        "(=sentence.I.output:2)",
        "(=sentence.I.outptu:2)",
        1,
    );
    fs::write(&lesson, broken).expect("edit");
    let page = preview.page_with("/attention.html", "qkv-serve-error");
    assert!(
        page.contains("01-attention.md:") && page.contains("unknown reference `sentence.I.outptu`"),
        "{page}"
    );
    assert!(page.contains(">4.01</span>"), "the last good page stays underneath");

    // Ctrl-C: a clean stop.
    let mut preview = preview;
    let pid = preview.child.id().to_string();
    assert!(Command::new("kill").args(["-INT", &pid]).status().expect("kill").success());
    preview.wait_for_line("stopped");
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = preview.child.try_wait().expect("wait") {
            break status;
        }
        assert!(Instant::now() < deadline, "xtask serve did not exit after Ctrl-C");
        thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}");
    let files = snapshot(dir.path());
    let leftovers: Vec<_> = files.iter().filter(|(p, _)| p.to_string_lossy().ends_with(".tmp")).collect();
    assert!(leftovers.is_empty(), "{:?}", leftovers.iter().map(|(p, _)| p).collect::<Vec<_>>());
}
