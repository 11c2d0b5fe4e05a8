//! Search from `file://`: the index ships as a script beside the pages, so a search typed on one
//! section finds a heading of another, announces how many results it found, and Enter opens
//! that section at the heading, below the sticky progress bar. Also at 360 px.

use serde_json::Value;

use super::cdp::{ARROW_DOWN, Browser, DESKTOP, ENTER, PHONE, Viewport};
use super::dom::js;
use super::lesson::lesson;
use super::{launch, screenshot_path};

/// The `h2` headings of the open page, as (id, text).
fn headings(b: &mut Browser) -> Vec<(String, String)> {
    let found = b.eval(
        "Array.from(document.querySelectorAll('article h2[id]'), (h) => h.closest('[data-qkv-summary]') ? null : [h.id, h.textContent.trim()]).filter(Boolean)",
    );
    found
        .as_array()
        .expect("a list")
        .iter()
        .map(|h| {
            (h[0].as_str().unwrap_or_default().to_string(), h[1].as_str().unwrap_or_default().to_string())
        })
        .collect()
}

fn search_and_land(viewport: Viewport, shot: &str) {
    let Some(mut b) = launch(viewport) else { return };
    let sections = &lesson().sections;
    let (from, to) = (&sections[sections.len() - 1], &sections[0]);
    assert_ne!(from.id, to.id, "search across sections needs two sections");
    b.open(&format!("{}.html", to.id));
    // The heading to find: the target section's last one, looked up by its whole text.
    let (id, title) = headings(&mut b).pop().expect("the first section has headings");
    let href = format!("{}.html#{id}", to.id);

    b.open(&format!("{}.html", from.id));
    b.focus("#qkv-search");
    b.type_text(&title);
    let result = format!("[data-qkv-search-results] a[href={}]", js(&href));
    b.wait_for(
        &format!("!!document.querySelector({})", js(&result)),
        &format!("a result for {title:?} pointing at {href}"),
        "document.querySelector('[data-qkv-search]').outerHTML",
    );
    let status = b.text("[data-qkv-search-status]");
    assert!(status.contains("result"), "the result count is not announced: {status:?}");
    assert_eq!(b.attr("[data-qkv-search-status]", "role").as_deref(), Some("status"));
    let overflow = b.eval("document.documentElement.scrollWidth <= document.documentElement.clientWidth");
    assert_eq!(overflow, Value::Bool(true), "the results make the page scroll sideways");
    b.screenshot_of("[data-qkv-search]", &screenshot_path(shot));

    // Down arrows walk the results; Enter on the one for the heading opens it.
    let place = b.eval(&format!(
        "Array.from(document.querySelectorAll('[data-qkv-search-results] a')).findIndex((a) => a.getAttribute('href') === {})",
        js(&href)
    ));
    for _ in 0..=place.as_u64().expect("the result's place") {
        b.press(ARROW_DOWN, 0);
    }
    assert_eq!(
        b.eval(&format!("document.activeElement.getAttribute('href') === {}", js(&href))),
        Value::Bool(true),
        "the arrow keys did not reach the result"
    );
    b.press(ENTER, 0);
    b.wait_for(
        &format!(
            "location.pathname.endsWith('/{}.html') && location.hash === {} && document.readyState === 'complete'",
            to.id,
            js(&format!("#{id}"))
        ),
        "the result to open the section at its heading",
        "location.href",
    );
    b.wait_for("document.documentElement.dataset.qkvReady === 'true'", "the page script", "");
    let landed = b.eval(&format!(
        "(() => {{ const h = document.getElementById({}).getBoundingClientRect();
           const bar = document.querySelector('[data-qkv-course-progress]');
           const below = bar ? bar.getBoundingClientRect().bottom : 0;
           return h.top >= below - 1 && h.top < innerHeight / 2; }})()",
        js(&id)
    ));
    assert_eq!(landed, Value::Bool(true), "the heading {id} is not in view, below the progress bar");
    b.assert_clean("search from file://");
}

#[test]
fn search_finds_a_heading_of_another_section_and_opens_it_there() {
    search_and_land(DESKTOP, "search-1280-results");
}

#[test]
fn search_works_at_360_px() {
    search_and_land(PHONE, "search-360-results");
}

/// The hrefs of the results the search shows for `query`, typed into a fresh page, in order, and
/// the status line that counts them all.
fn results_for(b: &mut Browser, query: &str) -> (Vec<String>, String) {
    b.open(&format!("{}.html", lesson().sections[0].id));
    b.focus("#qkv-search");
    b.type_text(query);
    let status = "document.querySelector('[data-qkv-search-status]').textContent";
    b.wait_for(&format!("/result/i.test({status})"), &format!("results for {query:?}"), status);
    let found = b.eval(
        "Array.from(document.querySelectorAll('[data-qkv-search-results] a'), (a) => a.getAttribute('href'))",
    );
    let hrefs = found.as_array().expect("a list").iter().map(|h| h.as_str().unwrap_or_default().to_string());
    (hrefs.collect(), b.text("[data-qkv-search-status]"))
}

/// The index leaves out words under 3 letters, so a query's short word cannot be required: "KV
/// cache" finds what "cache" finds, those whose title holds "KV" first; a query of short words
/// alone still needs them.
#[test]
fn short_query_words_rank_results_without_removing_any() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (cache, cache_status) = results_for(&mut b, "cache");
    let (kv_cache, kv_status) = results_for(&mut b, "KV cache");
    assert!(cache.len() > 2, "too few results to tell: {cache:?}");
    // Still the page of the last query: its first result's title.
    let first = b.text("[data-qkv-search-results] a strong");
    assert!(first.contains("KV"), "the first result's title does not say KV: {first:?} of {kv_cache:?}");
    // Every result counted, not only the 8 shown.
    let count = |status: &str| status.split(" result").next().unwrap_or_default().to_string();
    assert_eq!(count(&kv_status), count(&cache_status), "{kv_status:?} against {cache_status:?}");
    assert!(results_for(&mut b, "zq").0.is_empty(), "a short word alone that no entry holds found something");
    b.assert_clean("short query words");
}
