//! Every page as a whole: no sideways scroll on a phone, nothing fetched from outside `file://`,
//! no console error, a complete page without JavaScript, one small classic script, and the
//! screenshots at 1280 and 360 px.

use serde_json::Value;

use super::cdp::{Browser, DESKTOP, PHONE, Viewport};
use super::{launch, launch_with, pages, screenshot_path, site};

/// Why the page scrolls sideways: the document's widths and the outermost elements that stick out
/// of the viewport without a scrolling (or clipping) box around them.
const OVERFLOW: &str = "(() => {
    const doc = document.documentElement, width = doc.clientWidth;
    const boxed = (el) => { for (let p = el.parentElement; p && p !== document.body; p = p.parentElement) {
        if (/auto|scroll|hidden|clip/.test(getComputedStyle(p).overflowX)) return true; } return false; };
    const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '')
        + (el.className && typeof el.className === 'string' ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
    const out = [];
    for (const el of document.body.querySelectorAll('*')) {
        const r = el.getBoundingClientRect();
        if ((r.right > width + 0.5 || r.left < -0.5) && !boxed(el) && !out.some((o) => o.contains(el))) out.push(el);
    }
    return { scrollWidth: doc.scrollWidth, clientWidth: width,
             culprits: out.slice(0, 10).map((el) => name(el) + ' ' + Math.round(el.getBoundingClientRect().width) + ' px wide: '
                 + JSON.stringify(el.textContent.trim().slice(0, 50))) };
})()";

/// Fails when the page at its current state scrolls sideways, naming what sticks out.
fn assert_no_sideways_scroll(b: &mut Browser, what: &str) {
    let o = b.eval(OVERFLOW);
    let (scroll, client) =
        (o["scrollWidth"].as_f64().expect("width"), o["clientWidth"].as_f64().expect("width"));
    assert!(
        scroll <= client,
        "{what}: the page scrolls sideways ({scroll} > {client} px); sticking out: {:#}",
        o["culprits"]
    );
}

/// Opens every `<details>`, shows every quiz's answer and picks every matrix row (through the
/// page's own controls, by script, so the widest state of the page is measured).
pub const OPEN_EVERYTHING: &str = "(() => {
    document.querySelectorAll('details').forEach((d) => { d.open = true; });
    document.querySelectorAll('[data-qkv-show], [data-qkv-hint], [data-qkv-row]').forEach((b) => b.click());
    return true;
})()";

#[test]
fn no_page_scrolls_sideways_on_a_phone() {
    let Some(mut b) = launch(PHONE) else { return };
    for javascript in [true, false] {
        b.set_javascript(javascript);
        for page in &pages() {
            b.open(page);
            let what = format!("{page} at 360 px, JavaScript {}", if javascript { "on" } else { "off" });
            let width = b.eval("document.documentElement.clientWidth");
            assert_eq!(
                width,
                Value::from(360),
                "{what}: the page must lay out at the phone's width (viewport meta)"
            );
            assert_no_sideways_scroll(&mut b, &what);
            b.eval(OPEN_EVERYTHING);
            assert_no_sideways_scroll(
                &mut b,
                &format!("{what}, every answer, hint, step and <details> open"),
            );
            b.assert_clean(&what);
        }
    }
}

/// Saves a full-page screenshot of every page at `viewport` as `target/browser-screenshots/
/// PAGE-WIDTH.png`, and at phone width one more of each lesson page with everything open.
fn screenshot_every_page(viewport: Viewport) {
    let Some(mut b) = launch(viewport) else { return };
    let width = viewport.width;
    for page in &pages() {
        b.open(page);
        let name = page.trim_end_matches(".html");
        b.screenshot(&screenshot_path(&format!("{name}-{width}")));
        if page != "index.html" && viewport.mobile {
            b.eval(OPEN_EVERYTHING);
            b.screenshot(&screenshot_path(&format!("{name}-{width}-everything-open")));
        }
        b.assert_clean(&format!("{page} at {width} px"));
    }
}

#[test]
fn every_page_is_screenshotted_at_1280_px() {
    screenshot_every_page(DESKTOP);
}

#[test]
fn every_page_is_screenshotted_at_360_px() {
    screenshot_every_page(PHONE);
}

#[test]
fn no_request_leaves_file_and_nothing_logs_an_error() {
    let Some(mut b) = launch(DESKTOP) else { return };
    for page in &pages() {
        b.open(page);
        // Scroll through the page, so that anything loaded lazily is requested too.
        b.eval("window.scrollTo(0, document.documentElement.scrollHeight)");
        b.eval("new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))");
        assert!(
            b.requests.iter().any(|u| u.ends_with(page)),
            "{page}: the request log missed the page itself: {:?}",
            b.requests
        );
        b.assert_clean(page);
    }
}

#[test]
fn without_javascript_every_quiz_and_widget_is_complete() {
    let Some(mut b) = launch_with(DESKTOP, false) else { return };
    let lesson = super::lesson::lesson();
    // The contract's quizzes and both widgets must be there, so that this cannot pass on none.
    lesson.quiz(super::quiz::CHOICE);
    lesson.quiz(super::quiz::NUMERIC);
    lesson.widget("drag-query");
    lesson.widget("attention-matrix");
    for section in &lesson.sections {
        let page = format!("{}.html", section.id);
        b.open(&page);
        assert!(b.count("table") > 0, "{page}: no table without JavaScript");
        assert_eq!(
            b.count("[data-qkv-option], [data-qkv-input]"),
            0,
            "{page}: controls that need the script are in the static page"
        );
        for quiz in &section.quizzes {
            let root = format!("[data-qkv-quiz=\"{}\"]", quiz.id);
            assert_eq!(b.count(&root), 1, "{page}: quiz {} is not on the page once", quiz.id);
            assert!(b.visible(&root), "{page}: quiz {} is hidden without JavaScript", quiz.id);
            let details = format!("{root} details");
            assert!(b.count(&details) > 0, "{page}: quiz {} has no <details> answer", quiz.id);
            assert_eq!(
                b.attr(&details, "open"),
                None,
                "{page}: quiz {}'s answer is open from the start",
                quiz.id
            );
            assert!(!b.text(&details).is_empty(), "{page}: quiz {}'s <details> is empty", quiz.id);
        }
        for widget in &section.widgets {
            let id = widget.get("id").and_then(toml::Value::as_str).expect("a widget has an id");
            let root = format!("#widget-{id}");
            assert_eq!(b.count(&root), 1, "{page}: widget {id} is not on the page once");
            assert!(
                b.count(&format!("{root} table")) > 0,
                "{page}: widget {id} shows no table without JavaScript"
            );
        }
        b.assert_clean(&format!("{page} without JavaScript"));
    }
}

#[test]
fn the_page_script_is_one_small_classic_deferred_file() {
    let site = site();
    for page in &pages() {
        let html = std::fs::read_to_string(site.join(page)).expect("page");
        let scripts: Vec<&str> = html
            .match_indices("<script")
            .map(|(i, _)| &html[i..i + html[i..].find('>').unwrap_or(0)])
            .collect();
        let external: Vec<&&str> = scripts.iter().filter(|s| s.contains("src=")).collect();
        if matches!(page.as_str(), "index.html" | "print.html") && external.is_empty() {
            continue;
        }
        assert_eq!(
            external.len(),
            1,
            "{page}: expected one <script src=\"qkv.js\" defer>, found {external:?}"
        );
        let tag = external[0];
        assert!(tag.contains("src=\"qkv.js\"") && tag.contains("defer"), "{page}: {tag}");
        assert!(!tag.contains("module"), "{page}: module scripts do not load from file://: {tag}");
    }
    let bytes =
        std::fs::metadata(site.join("qkv.js")).map(|m| m.len()).unwrap_or_else(|e| panic!("qkv.js: {e}"));
    assert!(bytes < 60 * 1024, "qkv.js is {bytes} bytes, over the 60 KB budget");
}
