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
