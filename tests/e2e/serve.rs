//! `cargo xtask serve`, the live preview: started on a free port, it serves the lesson, rebuilds
//! when a file changes, shows content errors over the page, and stops cleanly on Ctrl-C; no
//! client can knock it over (a flood of reload requests under a low descriptor limit, or under
//! one too low for what it holds; a client that never reads), and it answers only GET and HEAD
//! for its own address.

use std::fs;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use crate::content::{copy_of_content, snapshot};

/// How long the preview may take to notice a change and rebuild (debug build, busy machine).
const PATIENCE: Duration = Duration::from_secs(60);
/// How soon a page must be answered beside a flood or a slow reader (it takes milliseconds).
const PROMPTLY: Duration = Duration::from_secs(5);
/// Reload requests in a flood: far more than the preview holds at once (32).
const FLOOD: usize = 500;
/// A descriptor limit below what the preview uses with all the reload requests it would hold.
const DESCRIPTORS_TIGHT: u32 = 40;

/// A running `xtask serve` and the lines it prints; killed if a test fails midway.
struct Preview {
    child: Child,
    lines: mpsc::Receiver<String>,
    address: String,
}

impl Preview {
    /// Starts the preview, with at most `descriptors` open file descriptors if given.
    fn start(content: &std::path::Path, out: &std::path::Path, descriptors: Option<u32>) -> Preview {
        let xtask = env!("CARGO_BIN_EXE_xtask");
        let mut command = match descriptors {
            Some(n) => {
                // The shell lowers its limit and then becomes the preview (`exec`), so that the
                // child, and the process `kill` reaches, is the preview itself.
                let mut shell = Command::new("sh");
                shell.args(["-c", &format!("ulimit -n {n} && exec \"$0\" \"$@\""), xtask]);
                shell
            }
            None => Command::new(xtask),
        };
        let mut child = command
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
    get_within(address, path, PATIENCE)
}

/// GET `path` from `address`, answered within `patience`: the status code and the body.
fn get_within(address: &str, path: &str, patience: Duration) -> (u16, String) {
    request(
        address,
        &format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"),
        patience,
    )
}

/// Sends `head` to `address` and reads the whole answer, which must come within `patience`: the
/// status code and the body.
fn request(address: &str, head: &str, patience: Duration) -> (u16, String) {
    let mut stream = TcpStream::connect(address).expect("connect");
    stream.write_all(head.as_bytes()).expect("send");
    let response = read_answer(&mut stream, patience);
    let (head, body) = response.split_once("\r\n\r\n").expect("headers");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
    (status, body.to_string())
}

/// Everything the preview sends on `stream` until it closes it, which must be within `patience`.
fn read_answer(stream: &mut TcpStream, patience: Duration) -> String {
    stream.set_read_timeout(Some(patience)).expect("timeout");
    let started = Instant::now();
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("an answer in time");
    assert!(started.elapsed() < patience, "answered only after {:?}", started.elapsed());
    response
}

/// Sends `count` reload requests that wait for the build after `generation` and keeps their
/// connections open, unread.
fn hold_waits(address: &str, generation: u64, count: usize) -> Vec<TcpStream> {
    (0..count)
        .map(|_| {
            let mut stream = TcpStream::connect(address).expect("the preview takes a connection");
            write!(
                stream,
                "GET /__qkv/wait?since={generation} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
            )
            .expect("the preview takes a reload request");
            stream
        })
        .collect()
}

/// Whether the preview is still holding `stream`'s request (has sent nothing and not closed).
fn still_held(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(Duration::from_millis(300))).expect("timeout");
    matches!(stream.read(&mut [0]), Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
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
    let preview = Preview::start(&content, &out, None);

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

/// Floods the preview with reload requests and checks that it still answers: a page at once,
/// the oldest requests (answered to make room), while the newest are held. Returns the preview
/// still flooded, and the folder it serves.
fn check_flood_of_held_reloads(descriptors: u32) -> (Preview, tempfile::TempDir, Vec<TcpStream>) {
    let dir = copy_of_content();
    let preview = Preview::start(&dir.path().join("content"), &dir.path().join("site"), Some(descriptors));
    let (_, page) = preview.get("/attention.html");
    let generation = generation(&page);
    let mut waits = hold_waits(&preview.address, generation, FLOOD);

    let address = &preview.address;
    let (status, page) = get_within(address, "/attention.html", PROMPTLY);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(">4.41</span>"), "{page}");
    let oldest = read_answer(&mut waits[0], PROMPTLY);
    assert!(oldest.ends_with(&format!("{{\"generation\": {generation}}}")), "{oldest}");
    assert!(still_held(waits.last_mut().expect("the newest")), "the newest reload request was not held");
    (preview, dir, waits)
}

#[test]
fn a_flood_of_held_reloads_under_256_descriptors_leaves_the_preview_answering() {
    // The reproduction: what the preview holds stays below the limit.
    check_flood_of_held_reloads(256);
}

#[test]
fn a_flood_of_held_reloads_beyond_the_descriptors_leaves_the_preview_answering() {
    // Fewer descriptors than the reload requests the preview would hold: accepting fails, the
    // preview backs off, holds fewer, and goes on.
    let (preview, _dir, _waits) = check_flood_of_held_reloads(DESCRIPTORS_TIGHT);
    let line = preview.wait_for_line("accepting a connection: ");
    assert!(line.contains("Too many open files"), "{line}");
}

#[test]
fn a_client_that_never_reads_holds_only_its_own_connection() {
    let dir = copy_of_content();
    let (content, out) = (dir.path().join("content"), dir.path().join("site"));
    let preview = Preview::start(&content, &out, None);
    let address = &preview.address;
    // Far larger than a loopback connection's buffers, so writing it to a client that never
    // reads blocks the writer.
    fs::write(out.join("big.bin"), vec![0_u8; 32 << 20]).expect("a big file");
    let mut slow = TcpStream::connect(address).expect("connect");
    write!(slow, "GET /big.bin HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").expect("send");
    let mut start = [0; 12];
    slow.read_exact(&mut start).expect("the big file starts");
    assert_eq!(&start, b"HTTP/1.1 200");
    // The case: a 5 MB URL, which a 404 page would echo, from a client that never reads.
    let mut long = TcpStream::connect(address).expect("connect");
    let head = format!("GET /{} HTTP/1.1\r\nHost: {address}\r\n\r\n", "a".repeat(5 << 20));
    // The preview stops reading after its head limit, so this write blocks until it closes.
    let sending = thread::spawn(move || long.write_all(head.as_bytes()).is_err());
    // Let the writer fill the buffers and block.
    thread::sleep(Duration::from_millis(300));

    let (status, page) = get_within(address, "/attention.html", PROMPTLY);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(">4.41</span>"), "{page}");
    // A client that sends nothing does not stall the others either.
    let _silent = TcpStream::connect(address).expect("connect");
    assert_eq!(get_within(address, "/qkv.js", PROMPTLY).0, 200);
    assert!(sending.join().expect("the long URL's writer"), "the preview read all of a 5 MB head");
}

#[test]
fn only_gets_and_heads_for_the_previews_own_address_are_answered() {
    let dir = copy_of_content();
    let preview = Preview::start(&dir.path().join("content"), &dir.path().join("site"), None);
    let address = &preview.address;
    let port = address.rsplit(':').next().expect("port");
    let ask = |head: String| request(address, &head, PROMPTLY);

    let (status, page) =
        ask(format!("GET /attention.html HTTP/1.1\r\nHost: localhost:{port}\r\nConnection: close\r\n\r\n"));
    assert_eq!(status, 200, "{page}");
    assert!(page.contains(">4.41</span>"), "{page}");
    let (status, body) =
        ask(format!("HEAD /attention.html HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"));
    assert_eq!((status, body.as_str()), (200, ""));
    // DNS rebinding: a page on another site reaches 127.0.0.1 under its own name.
    let (status, body) = ask(format!(
        "GET /attention.html HTTP/1.1\r\nHost: rebound.example:{port}\r\nConnection: close\r\n\r\n"
    ));
    assert_eq!(status, 403, "{body}");
    assert!(!body.contains("4.41"), "{body}");
    let (status, body) = ask("GET /attention.html HTTP/1.0\r\n\r\n".to_string());
    assert_eq!(status, 403, "{body}");
    for method in ["POST", "PUT", "DELETE", "OPTIONS"] {
        let (status, body) = ask(format!(
            "{method} /attention.html HTTP/1.1\r\nHost: {address}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        ));
        assert_eq!(status, 405, "{method}: {body}");
    }
}
