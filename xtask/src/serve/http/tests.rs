use super::*;

/// The status `admit` gives a request head for a preview on port 3000, 0 for one it lets through.
fn status(head: &str) -> u16 {
    admit(head, 3000).map_or_else(|refusal| refusal.status, |_| 0)
}

#[test]
fn only_gets_and_heads_for_the_previews_own_address_are_let_through() {
    for (head, expected) in [
        ("GET /attention.html HTTP/1.1\r\nHost: 127.0.0.1:3000\r\n", 0),
        ("HEAD / HTTP/1.1\r\nhost: LOCALHOST:3000\r\n", 0),
        ("GET / HTTP/1.0\nHost:localhost:3000\n", 0),
        // DNS rebinding: the browser sends the other site's name.
        ("GET / HTTP/1.1\r\nHost: evil.example:3000\r\n", 403),
        ("GET / HTTP/1.1\r\nHost: 127.0.0.1:3001\r\n", 403),
        ("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n", 403),
        ("GET / HTTP/1.1\r\nHost: [::1]:3000\r\n", 403),
        ("GET / HTTP/1.1\r\n", 403),
        ("GET / HTTP/1.1\r\nHost: 127.0.0.1:3000\r\nHost: evil.example\r\n", 403),
        // The address is checked before the method: a foreign page learns nothing.
        ("POST / HTTP/1.1\r\nHost: evil.example\r\n", 403),
        ("POST / HTTP/1.1\r\nHost: 127.0.0.1:3000\r\n", 405),
        ("get / HTTP/1.1\r\nHost: 127.0.0.1:3000\r\n", 405),
        ("GET / HTTP/2.0\r\nHost: 127.0.0.1:3000\r\n", 400),
        ("GET /\r\nHost: 127.0.0.1:3000\r\n", 400),
        ("GET  / HTTP/1.1\r\nHost: 127.0.0.1:3000\r\n", 400),
        ("GET http://127.0.0.1:3000/ HTTP/1.1\r\nHost: 127.0.0.1:3000\r\n", 400),
        ("", 400),
    ] {
        assert_eq!(status(head), expected, "{head:?}");
    }
    assert_eq!(admit("HEAD /a?b HTTP/1.1\r\nHost: localhost:3000\r\n", 3000).ok(), Some(("/a?b", false)));
    assert_eq!(admit("GET /a HTTP/1.1\r\nHost: localhost:3000\r\n", 3000).ok(), Some(("/a", true)));
}

#[test]
fn a_head_ends_at_its_first_empty_line() {
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest"), Some(25));
    assert_eq!(head_end(b"GET / HTTP/1.1\nHost: a\n\n"), Some(23));
    assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: a\r\n"), None);
    assert_eq!(head_end(b""), None);
}

#[test]
fn responses_say_their_length_close_their_connection_and_allow_on_405() {
    let head = Response::new(200, "text/html; charset=utf-8", b"<p>4.41</p>".to_vec()).head();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    assert!(
        head.contains("\r\nContent-Length: 11\r\n") && head.contains("\r\nConnection: close\r\n"),
        "{head}"
    );
    assert!(head.ends_with("\r\n\r\n") && !head.contains("Allow"), "{head}");
    let refused = Response::plain(405, "no").head();
    assert!(
        refused.starts_with("HTTP/1.1 405 Method Not Allowed\r\n")
            && refused.contains("\r\nAllow: GET, HEAD\r\n")
    );
}
