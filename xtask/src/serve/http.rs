//! The preview's HTTP server: HTTP/1.1 GET and HEAD on `std::net`, written so that no client can
//! knock it over. Each connection has its own thread and deadlines (a slow client holds only its
//! own connection, and not for long); the connections open at once are bounded; the accept loop
//! backs off and retries when accepting fails, never ends while the process lives, and lowers
//! the bound to what the process can hold when file descriptors run out. Only requests whose
//! `Host` is the preview's own address are answered, so that a page on another site cannot read
//! the preview through DNS rebinding.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use crate::cli;

/// Connections open at once, held reload requests included. Beyond it, new connections wait in
/// the kernel's backlog, which costs the preview no file descriptor, until one closes. Well below
/// the smallest usual descriptor limit (256 on macOS), so connections alone never exhaust it.
const MAX_CONNECTIONS: usize = 64;
/// The fewest connections the bound is lowered to when descriptors run out below it.
const MIN_CONNECTIONS: usize = 8;
/// How long a client has to send the head of its request: one that sends nothing, or a byte at a
/// time, is closed after it.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing a response may take: a client that does not read it is closed after it.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head read. A browser sends a few hundred bytes; a longer head is refused
/// with 431 rather than echoed back by a 404 page.
const MAX_HEAD: usize = 16 * 1024;
/// The longest pause between attempts to accept after accepting failed.
const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// A request the handler answers: a GET or HEAD whose `Host` is the preview's own address.
pub(super) struct Request<'a> {
    /// The request target as sent (`/attention.html?x`), not percent-decoded.
    pub target: &'a str,
    /// The connection's place in the order the server accepted connections (the first is 1):
    /// its threads run in any order, so this, not arrival at the handler, says which is older.
    pub accepted: u64,
    connection: &'a TcpStream,
}

impl Request<'_> {
    /// Whether the client has closed its connection, so that a held answer can be given up.
    pub fn client_left(&self) -> bool {
        let mut byte = [0];
        if self.connection.set_nonblocking(true).is_err() {
            return true;
        }
        let left = match self.connection.peek(&mut byte) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != ErrorKind::WouldBlock,
        };
        left || self.connection.set_nonblocking(false).is_err()
    }
}

/// A complete response; every response closes its connection.
pub(super) struct Response {
    status: u16,
    content_type: &'static str,
    body: Vec<u8>,
}

impl Response {
    /// A response with this status, `Content-Type` and body.
    pub fn new(status: u16, content_type: &'static str, body: Vec<u8>) -> Response {
        Response { status, content_type, body }
    }

    /// The status code and the body, for tests.
    #[cfg(test)]
    pub fn parts(&self) -> (u16, &[u8]) {
        (self.status, &self.body)
    }

    fn plain(status: u16, text: &str) -> Response {
        Response::new(status, "text/plain; charset=utf-8", format!("{text}\n").into_bytes())
    }

    /// The response's head, which says how long its body is.
    fn head(&self) -> String {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            403 => "Forbidden",
            404 => "Not Found",
            405 => "Method Not Allowed",
            431 => "Request Header Fields Too Large",
            500 => "Internal Server Error",
            _ => "",
        };
        let allow = if self.status == 405 { "Allow: GET, HEAD\r\n" } else { "" };
        format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{allow}Connection: close\r\n\r\n",
            self.status,
            self.content_type,
            self.body.len()
        )
    }

    /// Sends the head, and the body unless the request was a HEAD, within [`WRITE_TIMEOUT`].
    fn send(&self, stream: &TcpStream, with_body: bool) {
        let deadline = Instant::now() + WRITE_TIMEOUT;
        // Two writes: without this, a small body could wait for the client to acknowledge the
        // head (Nagle's algorithm meeting a delayed ACK).
        let _ = stream.set_nodelay(true);
        if write_before(stream, self.head().as_bytes(), deadline) && with_body {
            write_before(stream, &self.body, deadline);
        }
    }
}

/// What the server asks of the preview.
pub(super) trait Handler: Send + Sync + 'static {
    /// The answer to a request. It may take its time (a held reload request does): each
    /// connection has its own thread.
    fn respond(&self, request: &Request) -> Response;

    /// Accepting a connection failed for want of resources (file descriptors, most often), and
    /// from now on the server keeps at most `connections` open: free what can be freed, and hold
    /// fewer. Called once for each run of failures.
    fn relieve(&self, connections: usize);
}

/// A running server. It serves for the life of the process: nothing stops its accept loop.
pub(super) struct Server {
    address: SocketAddr,
    connections: Arc<Connections>,
}

impl Server {
    /// Listens on 127.0.0.1:`port` (loopback only: the preview is for the author at this
    /// machine) and answers with `handler`.
    pub fn start(port: u16, handler: Arc<dyn Handler>) -> io::Result<Server> {
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        let address = listener.local_addr()?;
        let connections = Arc::new(Connections::default());
        let accepting = Arc::clone(&connections);
        thread::Builder::new()
            .name("accept".into())
            .spawn(move || accept_forever(&listener, address.port(), &accepting, &handler))?;
        Ok(Server { address, connections })
    }

    /// The address it listens on (the port is the one chosen for `--port 0`).
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Waits until no connection is open, or `grace` has passed.
    pub fn wait_idle(&self, grace: Duration) {
        let count = self.connections.lock();
        drop(self.connections.closed.wait_timeout_while(count, grace, |count| count.open > 0));
    }
}

/// How many connections are open and may be, and a way to wait for one to close.
struct Connections {
    count: Mutex<Count>,
    closed: Condvar,
}

struct Count {
    open: usize,
    limit: usize,
}

impl Default for Connections {
    fn default() -> Connections {
        Connections { count: Mutex::new(Count { open: 0, limit: MAX_CONNECTIONS }), closed: Condvar::new() }
    }
}

impl Connections {
    fn lock(&self) -> MutexGuard<'_, Count> {
        // Two plain numbers, consistent whatever thread panicked while holding them.
        self.count.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until there is room for one more connection. Only the accept loop opens them, so
    /// the room is still there when it has accepted one.
    fn wait_for_room(&self) {
        let count = self.lock();
        drop(self.closed.wait_while(count, |count| count.open >= count.limit));
    }

    /// Counts an accepted connection as open until the slot is dropped.
    fn open(self: &Arc<Self>) -> Slot {
        self.lock().open += 1;
        Slot(Arc::clone(self))
    }

    /// Descriptors ran out with the connections open now: keep a quarter of them free from now
    /// on (for the files pages read, and the builds), and say how many may be open.
    fn shrink(&self) -> usize {
        let mut count = self.lock();
        count.limit = (count.open - count.open / 4).clamp(MIN_CONNECTIONS, count.limit);
        count.limit
    }
}

/// One open connection's place in the count, given up when it is dropped.
struct Slot(Arc<Connections>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.lock().open -= 1;
        self.0.closed.notify_all();
    }
}

/// Accepts connections, each onto a thread of its own, for as long as the process lives.
fn accept_forever(
    listener: &TcpListener,
    port: u16,
    connections: &Arc<Connections>,
    handler: &Arc<dyn Handler>,
) {
    // Zero while accepting succeeds; after a failure, the pause before the next attempt.
    let mut backoff = Duration::ZERO;
    let mut accepted = 0;
    loop {
        connections.wait_for_room();
        match listener.accept() {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                accepted += 1;
                let slot = connections.open();
                let handler = Arc::clone(handler);
                // Should the thread not start, the closure is dropped with the connection and
                // its slot: the client sees it close, and the loop goes on.
                let _ = thread::Builder::new().name("connection".into()).spawn(move || {
                    serve_connection(&stream, accepted, port, handler.as_ref());
                    drop(slot);
                });
            }
            // A client that gave up before it was accepted: nothing is short here.
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::Interrupted
                ) => {}
            // Out of descriptors (EMFILE, ENFILE), or of memory: std names no kind for the first two.
            Err(e) => {
                // Once per run of failures: a flood must not become a flood of lines, and what is
                // freed takes a moment to be closed.
                if backoff.is_zero() {
                    let limit = connections.shrink();
                    let _ = cli::write_line(format_args!(
                        "accepting a connection: {e}; retrying, with at most {limit} connections open from now on"
                    ));
                    handler.relieve(limit);
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(1), MAX_BACKOFF);
                thread::sleep(backoff);
            }
        }
    }
}

fn serve_connection(stream: &TcpStream, accepted: u64, port: u16, handler: &dyn Handler) {
    let (response, with_body) = match read_head(stream) {
        Ok(head) => match admit(&head, port) {
            Ok((target, with_body)) => {
                (handler.respond(&Request { target, accepted, connection: stream }), with_body)
            }
            Err(refusal) => (refusal, true),
        },
        Err(Unread::TooLarge) => (Response::plain(431, "request head too large"), true),
        Err(Unread::Gone) => return,
    };
    response.send(stream, with_body);
}

/// Why no request head was read.
enum Unread {
    /// Longer than [`MAX_HEAD`].
    TooLarge,
    /// The client closed, failed or ran out of time first: there is no one to answer.
    Gone,
}

/// Reads up to the blank line that ends a request head, within [`HEAD_TIMEOUT`] in all (not per
/// read, so a byte at a time does not extend it) and [`MAX_HEAD`] bytes.
fn read_head(mut stream: &TcpStream) -> Result<String, Unread> {
    let deadline = Instant::now() + HEAD_TIMEOUT;
    let mut head = Vec::new();
    let mut chunk = [0; 2048];
    loop {
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Ok(String::from_utf8_lossy(&head).into_owned());
        }
        if head.len() > MAX_HEAD {
            return Err(Unread::TooLarge);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(Unread::Gone);
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err(Unread::Gone),
            Ok(n) => head.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(Unread::Gone),
        }
    }
}

/// Where the head ends: after the line ending before the first empty line (lines end in CRLF, or
/// LF alone, which RFC 9112 lets a server accept).
fn head_end(bytes: &[u8]) -> Option<usize> {
    (0..bytes.len())
        .find(|&i| bytes[i..].starts_with(b"\n\n") || bytes[i..].starts_with(b"\n\r\n"))
        .map(|i| i + 1)
}

/// The request's target and whether its answer has a body (not for HEAD), or the refusal: 400 for
/// a head that is not HTTP/1.x, 403 for a `Host` that is not the preview's own address (checked
/// first: a foreign page learns nothing, not even which methods exist), 405 for other methods.
fn admit(head: &str, port: u16) -> Result<(&str, bool), Response> {
    let mut lines = head.lines();
    let request_line = lines.next().unwrap_or_default();
    let (method, target, version) = match request_line.split(' ').collect::<Vec<_>>()[..] {
        [method, target, version] => (method, target, version),
        _ => return Err(Response::plain(400, "malformed request line")),
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return Err(Response::plain(400, "malformed request line"));
    }
    let mut hosts = lines.filter_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("host").then_some(value.trim())
    });
    let own = match (hosts.next(), hosts.next()) {
        (Some(host), None) => own_host(host, port),
        // No `Host`, or several: not a request for the preview.
        _ => false,
    };
    if !own {
        return Err(Response::plain(403, "this preview answers only for 127.0.0.1 and localhost"));
    }
    match method {
        "GET" => Ok((target, true)),
        "HEAD" => Ok((target, false)),
        _ => Err(Response::plain(405, "the preview answers GET and HEAD only")),
    }
}

/// Whether a `Host` header names the preview: `127.0.0.1:PORT` or `localhost:PORT` (it does not
/// listen on `[::1]`).
fn own_host(host: &str, port: u16) -> bool {
    ["127.0.0.1", "localhost"].iter().any(|name| host.eq_ignore_ascii_case(&format!("{name}:{port}")))
}

/// Writes all of `bytes` unless `deadline` passes first (each write waits at most until then, so
/// a client reading a byte at a time does not extend it) or the client goes away; says whether
/// it did.
fn write_before(mut stream: &TcpStream, mut bytes: &[u8], deadline: Instant) -> bool {
    while !bytes.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_write_timeout(Some(left)).is_err() {
            return false;
        }
        match stream.write(bytes) {
            Ok(0) => return false,
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests;
