//! The course around the sections: numbered sections in the navigation, titles and previous and
//! next links; the contents page with each section's progress, counted from what the learner
//! answered on the section's own page; the sticky progress bar; the summary at the end of a
//! section; and a reset that asks first, operated by keyboard.

use serde_json::Value;

use super::cdp::{Browser, DESKTOP, ENTER, Key, PHONE, SHIFT, TAB};
use super::dom::js;
use super::lesson::{Section, lesson};
use super::quiz::{CHOICE, read};
use super::{launch, screenshot_path};

const ESCAPE: Key = Key { key: "Escape", code: "Escape", key_code: 27, text: "" };

fn graded(section: &Section) -> usize {
    section.quizzes.iter().filter(|q| !q.practice).count()
}

/// Waits until `selector`'s `data-qkv-answered` reads `answered`.
fn wait_answered(b: &mut Browser, selector: &str, answered: usize) {
    b.wait_for(
        &format!("document.querySelector({})?.dataset.qkvAnswered === '{answered}'", js(selector)),
        &format!("{selector} to count {answered} answered"),
        &format!("document.querySelector({})?.outerHTML", js(selector)),
    );
}

#[test]
fn sections_are_numbered_in_the_navigation_the_titles_and_the_pager() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let sections = &lesson().sections;
    let glossary = std::fs::read_dir(crate::content::content_dir())
        .expect("content/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(|c: char| c.is_ascii_digit()))
        })
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .any(|text| text.contains("```qkv term"));
    for (i, s) in sections.iter().enumerate() {
        b.open(&format!("{}.html", s.id));
        let numbered = format!("{}. {}", i + 1, s.title);
        assert_eq!(b.text("h1"), numbered, "{}: the title", s.id);
        assert!(b.eval("document.title").as_str().unwrap_or_default().starts_with(&numbered), "{}", s.id);
        let nav = b.eval("Array.from(document.querySelectorAll('nav.sections a'), (a) => a.textContent)");
        // The glossary comes after the sections, once any section declares a term.
        let expected: Vec<String> = std::iter::once("Contents".to_string())
            .chain(sections.iter().enumerate().map(|(k, t)| format!("{}. {}", k + 1, t.title)))
            .chain(glossary.then(|| "Glossary".to_string()))
            .collect();
        assert_eq!(nav, serde_json::json!(expected), "{}: the navigation", s.id);
        let link = |b: &mut Browser, rel: &str| {
            b.eval(&format!("document.querySelector('nav.pager a[rel={rel}]')?.getAttribute('href') ?? null"))
        };
        let prev = i.checked_sub(1).map(|k| format!("{}.html", sections[k].id));
        let next = sections.get(i + 1).map(|t| format!("{}.html", t.id));
        assert_eq!(link(&mut b, "prev"), serde_json::json!(prev), "{}: the previous link", s.id);
        assert_eq!(link(&mut b, "next"), serde_json::json!(next), "{}: the next link", s.id);
        if let Some(t) = sections.get(i + 1) {
            let text = b.text("nav.pager a[rel=next]");
            assert!(
                text.contains(&format!("{}. {}", i + 2, t.title)),
                "{}: the next link reads {text:?}",
                s.id
            );
        }
    }
    // Following "next" from the first section lands on the second.
    if sections.len() > 1 {
        b.open(&format!("{}.html", sections[0].id));
        b.click("nav.pager a[rel=next]");
        b.wait_for(
            &format!(
                "location.pathname.endsWith('/{}.html') && document.readyState === 'complete'",
                sections[1].id
            ),
            "the next link to open the second section",
            "location.href",
        );
    }
    b.assert_clean("section numbers and the pager");
}

#[test]
fn the_contents_page_shows_the_progress_made_on_a_section_page() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let lesson = lesson();
    let (section, quiz) = lesson.quiz(CHOICE);
    let total: usize = lesson.sections.iter().map(graded).sum();
    b.open("index.html");
    let first = &lesson.sections[0];
    assert_ne!(b.text("h1"), first.title, "the contents page repeats the first section's title");
    for (i, s) in lesson.sections.iter().enumerate() {
        let item = format!("[data-qkv-toc=\"{}\"]", s.id);
        assert_eq!(b.attr(&item, "data-qkv-total"), Some(graded(s).to_string()), "{}: its check count", s.id);
        assert!(b.text(&format!("{item} a")).starts_with(&format!("{}.", i + 1)), "{}: its number", s.id);
        assert!(b.count(&format!("{item} .toc-summary")) == 1, "{}: no summary on the contents page", s.id);
    }
    wait_answered(&mut b, "[data-qkv-course-total]", 0);
    assert!(b.count("a[href='print.html']") == 1, "the contents page does not link the print view");

    b.open(&format!("{}.html", section.id));
    b.click(&format!("[data-qkv-quiz=\"{CHOICE}\"] [data-qkv-option=\"{}\"]", quiz.letters().0));
    wait_answered(&mut b, "[data-qkv-course-progress]", 1);
    // The bar stays at the top of the viewport while the page scrolls.
    b.eval("window.scrollTo(0, document.documentElement.scrollHeight / 2); true");
    let top = b.eval("document.querySelector('[data-qkv-course-progress]').getBoundingClientRect().top");
    assert_eq!(top.as_f64().map(f64::round), Some(0.0), "the progress bar scrolled away: top {top}");

    b.open("index.html");
    let item = format!("[data-qkv-toc=\"{}\"] [data-qkv-toc-progress]", section.id);
    wait_answered(&mut b, &item, 1);
    let text = b.text(&item);
    assert!(text.starts_with(&format!("1 of {}", graded(section))), "the contents page says {text:?}");
    wait_answered(&mut b, "[data-qkv-course-total]", 1);
    assert_eq!(b.attr("[data-qkv-course-total]", "data-qkv-total"), Some(total.to_string()));
    b.screenshot(&screenshot_path("index-1280-progress"));
    b.assert_clean("the contents page's progress");
}

#[test]
fn the_progress_bar_fits_a_phone_and_the_summary_lists_what_is_left() {
    let Some(mut b) = launch(PHONE) else { return };
    let (section, quiz) = lesson().quiz(CHOICE);
    b.open(&format!("{}.html", section.id));
    let height =
        b.eval("document.querySelector('[data-qkv-course-progress]').getBoundingClientRect().height");
    assert!(
        height.as_f64().unwrap_or(999.0) < 48.0,
        "the progress bar takes {height} px of a phone's screen"
    );
    b.click(&format!("[data-qkv-quiz=\"{CHOICE}\"] [data-qkv-option=\"{}\"]", quiz.letters().0));
    wait_answered(&mut b, "[data-qkv-course-progress]", 1);
    let summary = format!("[data-qkv-summary][data-qkv-section=\"{}\"]", section.id);
    assert_eq!(
        b.count(&format!("{summary} [data-qkv-summary-check]")),
        graded(section),
        "one line per check"
    );
    let line = format!("{summary} [data-qkv-summary-check=\"{CHOICE}\"]");
    assert_eq!(b.attr(&line, "data-qkv-state").as_deref(), Some("right"), "the answered check's line");
    let left =
        b.count(&format!("{summary} [data-qkv-summary-check][data-qkv-state=unanswered] a[href^='#quiz-']"));
    assert_eq!(left, graded(section) - 1, "the summary's links to the checks left");
    let text = b.text(&format!("{summary} [data-qkv-summary-text]"));
    assert!(text.contains(&format!("1 of {}", graded(section))), "the summary says {text:?}");
    b.screenshot_of(&summary, &screenshot_path("attention-360-summary"));
    b.assert_clean("the progress bar and the summary on a phone");
}

#[test]
fn reset_asks_first_and_is_operated_by_keyboard() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let (section, quiz) = lesson().quiz(CHOICE);
    b.open(&format!("{}.html", section.id));
    b.click(&format!("[data-qkv-quiz=\"{CHOICE}\"] [data-qkv-option=\"{}\"]", quiz.letters().0));
    wait_answered(&mut b, "[data-qkv-progress]", 1);
    let reset = "[data-qkv-summary] [data-qkv-reset]";
    let open = "document.querySelector('dialog[data-qkv-confirm]')?.open === true";
    let focus_in_dialog = "!!document.activeElement.closest('dialog[data-qkv-confirm]')";

    // Escape cancels: nothing is forgotten, and the focus is back on the button.
    b.focus(reset);
    b.press(ENTER, 0);
    b.wait_for(open, "the confirmation dialog to open", "");
    assert_eq!(b.eval(focus_in_dialog), Value::Bool(true), "the focus is not in the dialog");
    let y = b.eval("scrollY").as_f64().unwrap_or(0.0);
    b.capture(&screenshot_path("attention-1280-reset-dialog"), [0.0, y, 1280.0, 900.0]);
    b.press(ESCAPE, 0);
    b.wait_for(&format!("!({open})"), "Escape to close the dialog", "");
    assert_eq!(read(&mut b, CHOICE).state, "right", "cancelling forgot the answer");
    let on_reset = format!("document.activeElement === document.querySelector({})", js(reset));
    assert_eq!(b.eval(&on_reset), Value::Bool(true), "the focus did not return to the reset button");

    // Cancel has the focus first; Shift+Tab reaches "Reset", and Enter forgets the section.
    b.press(ENTER, 0);
    b.wait_for(open, "the confirmation dialog to open again", "");
    assert_eq!(b.eval("document.activeElement.hasAttribute('data-qkv-confirm-no')"), Value::Bool(true));
    b.press(TAB, SHIFT);
    assert_eq!(b.eval("document.activeElement.hasAttribute('data-qkv-confirm-yes')"), Value::Bool(true));
    b.press(ENTER, 0);
    b.wait_for(&format!("!({open})"), "the dialog to close after Reset", "");
    wait_answered(&mut b, "[data-qkv-progress]", 0);
    assert_eq!(read(&mut b, CHOICE).state, "unanswered", "Reset left the answer");
    assert_eq!(b.eval(&on_reset), Value::Bool(true), "the focus did not return to the reset button");
    b.assert_clean("reset with confirmation");
}

/// The smallest `font-size` an SVG figure writes, in its own units.
fn smallest_font(svg: &str) -> f64 {
    svg.match_indices("font-size=\"")
        .filter_map(|(i, m)| svg[i + m.len()..].split('"').next()?.parse::<f64>().ok())
        .fold(f64::INFINITY, f64::min)
}

#[test]
fn figure_labels_read_at_least_11_px_on_a_phone() {
    let Some(mut b) = launch(PHONE) else { return };
    let site = super::site();
    for s in &lesson().sections {
        b.open(&format!("{}.html", s.id));
        let figures = b.eval(
            "Array.from(document.querySelectorAll('figure img'), (i) => [i.getAttribute('src'), i.getBoundingClientRect().width, Number(i.getAttribute('width'))])",
        );
        for f in figures.as_array().expect("a list") {
            let (src, shown, drawn) =
                (f[0].as_str().expect("src"), f[1].as_f64().expect("width"), f[2].as_f64().expect("width"));
            let svg = std::fs::read_to_string(site.join(src)).unwrap_or_else(|e| panic!("{src}: {e}"));
            let px = smallest_font(&svg) * shown / drawn;
            assert!(px >= 11.0, "{}: {src}'s smallest text shows at {px:.1} px on a phone", s.id);
        }
    }
    b.assert_clean("figure labels on a phone");
}

#[test]
fn without_script_the_drag_widget_does_not_ask_for_dragging() {
    let Some(mut b) = super::launch_with(PHONE, false) else { return };
    let widget = lesson().widget("drag-query");
    b.open(&widget.page);
    let prompts = format!("{} .prompt", widget.root);
    let shown = b.eval(&format!(
        "Array.from(document.querySelectorAll({}), (p) => p.getClientRects().length ? p.textContent : '').join(' ')",
        js(&prompts)
    ));
    let shown = shown.as_str().unwrap_or_default().to_lowercase();
    assert!(!shown.contains("drag") && !shown.contains("arrow keys"), "the no-script prompt says {shown:?}");
    assert!(
        b.visible(&format!("{} [data-qkv-static-prompt]", widget.root)),
        "no prompt for what the page shows"
    );
    b.screenshot_of(&widget.root, &screenshot_path("attention-360-drag-no-script"));
    b.assert_clean("the drag widget without script");
}
