use super::*;

#[test]
fn urls_map_into_the_site_and_never_out_of_it() {
    let out = Path::new("/site");
    assert_eq!(site_file(out, "/"), Some(PathBuf::from("/site/index.html")));
    assert_eq!(site_file(out, "/figures/a.svg"), Some(PathBuf::from("/site/figures/a.svg")));
    assert_eq!(site_file(out, "/notebooks/"), Some(PathBuf::from("/site/notebooks/index.html")));
    // Leading slashes are all trimmed: an absolute-looking path stays inside the site.
    assert_eq!(site_file(out, "//etc/passwd"), Some(PathBuf::from("/site/etc/passwd")));
    for escape in ["/../secret", "/figures/../../x", "/./index.html", "/a\\..\\..\\x"] {
        assert_eq!(site_file(out, escape), None, "{escape}");
    }
}

/// A URL that names no file is a 404 whatever the file system says about it, never a 500 with the
/// operating system's message: a path segment of 256 bytes (longer than a file name may be), a
/// file used as a folder, a missing file. A file that is there is served.
#[test]
fn urls_that_name_no_file_are_not_found() {
    let out = tempfile::tempdir().expect("a folder");
    std::fs::write(out.path().join("attention.html"), "<p>4.41</p>").expect("a page");
    let long = format!("/{}", "a".repeat(256));
    let in_a_folder = format!("/figures{long}.svg");
    for url in [long.as_str(), "/attention.html/x", "/nothing.html", &in_a_folder] {
        let response = page_or_file(out.path(), url, 0, None);
        let (status, body) = response.parts();
        let body = String::from_utf8_lossy(body);
        assert_eq!(status, 404, "{url}: {body}");
        assert!(!body.contains("os error"), "{url} echoes the OS error: {body}");
    }
    assert_eq!(page_or_file(out.path(), "/attention.html", 0, None).parts().0, 200);
}

#[test]
fn pages_get_the_reload_script_and_after_a_failed_build_the_overlay() {
    let page = "<html><body><p>4.41</p></body></html>";
    let served = with_preview(page, 7, None);
    assert!(served.contains("var generation = 7;") && served.contains(WAIT_PATH), "{served}");
    assert!(served.ends_with("</script>\n</body></html>"), "{served}");
    assert!(!served.contains("qkv-serve-error"));
    let failed = with_preview(page, 8, Some("content/01-attention.md:146:23: unknown reference `a<b`"));
    assert!(failed.contains("<pre style"), "{failed}");
    assert!(failed.contains("content/01-attention.md:146:23: unknown reference `a&lt;b`"), "{failed}");
    assert!(failed.find("qkv-serve-error") < failed.find("<script>"));
}

#[test]
fn every_kind_of_site_file_is_served_as_what_it_is() {
    for (name, kind) in [
        ("qkv.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
        ("figures/a.svg", "image/svg+xml"),
        ("figures/a.png", "image/png"),
        ("notebooks/a.ipynb", "application/x-ipynb+json"),
        ("markdown/01-a.md", "text/markdown; charset=utf-8"),
    ] {
        assert_eq!(content_type(name), kind, "{name}");
    }
}

/// Starts a reload request for generation 0 with `ticket` on its own thread, and waits until it
/// is held.
fn held_wait(shared: &Arc<Shared>, ticket: u64) -> std::thread::JoinHandle<Option<u64>> {
    let waiting = Arc::clone(shared);
    let handle = std::thread::spawn(move || waiting.wait_for_build(Some(0), ticket, || false));
    while !shared.lock().held.contains(&ticket) {
        std::thread::yield_now();
    }
    handle
}

#[test]
fn beyond_the_bound_the_oldest_held_reload_is_answered_and_running_out_lowers_it() {
    let shared = Arc::new(Shared::default());
    let oldest = held_wait(&shared, 1);
    let mut newer: Vec<_> = (2..).take(MAX_HELD_WAITS).map(|t| held_wait(&shared, t)).collect();
    assert_eq!(oldest.join().expect("the oldest"), Some(0), "answered with the generation it had");
    assert_eq!(shared.lock().held.len(), MAX_HELD_WAITS);

    // Descriptors ran out with the server down to 8 connections: hold 4, answer the oldest others.
    let preview = Preview { shared: Arc::clone(&shared), out: PathBuf::new() };
    preview.relieve(8);
    for answered in newer.drain(..MAX_HELD_WAITS - 4) {
        assert_eq!(answered.join().expect("an older one"), Some(0));
    }
    assert_eq!(shared.lock().held, [30, 31, 32, 33]);
    newer.push(held_wait(&shared, 40));
    assert_eq!(newer.remove(0).join().expect("pushed out"), Some(0));
    // A request accepted before every held one that reaches the handler late is the oldest: it
    // is answered at once and pushes none of the newer ones out.
    assert_eq!(shared.wait_for_build(Some(0), 3, || false), Some(0));
    assert_eq!(shared.lock().held, [31, 32, 33, 40]);

    // A build answers the rest with the new generation; a page that is there already, at once.
    shared.update(|s| s.generation += 1);
    for held in newer {
        assert_eq!(held.join().expect("a held one"), Some(1));
    }
    assert_eq!(shared.wait_for_build(Some(0), 41, || false), Some(1));
    assert!(shared.lock().held.is_empty());
}
