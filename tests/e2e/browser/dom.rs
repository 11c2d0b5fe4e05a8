//! Reading and operating the page as a learner would: elements by CSS selector, clicked at their
//! centre with the real mouse (after checking that nothing covers them), focused, read back.

use serde_json::Value;

use super::cdp::{Browser, ENTER, Point, SPACE};

/// A selector as a JavaScript string literal.
pub fn js(selector: &str) -> String {
    serde_json::to_string(selector).expect("json string")
}

impl Browser {
    /// How many elements match `selector`.
    pub fn count(&mut self, selector: &str) -> usize {
        let n = self.eval(&format!("document.querySelectorAll({}).length", js(selector)));
        n.as_u64().expect("a count") as usize
    }

    /// The attribute `name` of the first element matching `selector` (`None` if absent).
    pub fn attr(&mut self, selector: &str, name: &str) -> Option<String> {
        let value = self.eval(&format!("{}.getAttribute({})", the(selector), js(name)));
        value.as_str().map(str::to_string)
    }

    /// The trimmed text content of the first element matching `selector`.
    pub fn text(&mut self, selector: &str) -> String {
        let value = self.eval(&format!("{}.textContent.trim()", the(selector)));
        value.as_str().unwrap_or_default().to_string()
    }

    /// The trimmed text of every `[data-qkv-readout]` inside the first element matching `root`,
    /// by readout name.
    pub fn readouts(&mut self, root: &str) -> std::collections::BTreeMap<String, String> {
        let v = self.eval(&format!(
            "Object.fromEntries(Array.from({}.querySelectorAll('[data-qkv-readout]'), (e) => [e.dataset.qkvReadout, e.textContent.trim()]))",
            the(root)
        ));
        let entries = v.as_object().expect("readouts");
        entries.iter().map(|(k, x)| (k.clone(), x.as_str().unwrap_or_default().to_string())).collect()
    }

    /// Whether the first element matching `selector` is rendered and visible (not `hidden`, not
    /// inside a closed `<details>`, not `display: none` or `visibility: hidden`, not zero-sized).
    pub fn visible(&mut self, selector: &str) -> bool {
        self.eval(&format!("{}(document.querySelector({}))", VISIBLE, js(selector))) == Value::Bool(true)
    }

    /// Scrolls the first element matching `selector` to the middle of the viewport and returns its
    /// centre, failing if another element covers that point (a learner could not click it).
    pub fn center(&mut self, selector: &str) -> Point {
        let found = self.eval(&format!(
            "(() => {{ const el = {}; el.scrollIntoView({{ block: 'center', inline: 'center', behavior: 'instant' }});
               const r = el.getBoundingClientRect(); const x = r.left + r.width / 2, y = r.top + r.height / 2;
               const hit = document.elementFromPoint(x, y);
               return {{ x, y, ok: !!hit && (el === hit || el.contains(hit)),
                         hit: hit ? hit.outerHTML.slice(0, 120) : 'nothing' }}; }})()",
            the(selector)
        ));
        assert!(
            found["ok"] == Value::Bool(true),
            "{selector} cannot be clicked: at its centre the page shows {}",
            found["hit"]
        );
        Point { x: found["x"].as_f64().expect("x"), y: found["y"].as_f64().expect("y") }
    }

    /// Clicks the first element matching `selector` with the mouse.
    pub fn click(&mut self, selector: &str) {
        let at = self.center(selector);
        self.click_at(at);
    }

    /// Operates the first element matching `selector` as a learner would, the `n`th way of three
    /// in turn (a mouse click, Enter once focused, Space once focused), and says which it was.
    pub fn activate(&mut self, selector: &str, n: usize) -> &'static str {
        match n % 3 {
            0 => {
                self.click(selector);
                "a click"
            }
            1 => {
                self.focus(selector);
                self.press(ENTER, 0);
                "Enter"
            }
            _ => {
                self.focus(selector);
                self.press(SPACE, 0);
                "Space"
            }
        }
    }

    /// Gives the keyboard focus to the first element matching `selector`, and checks that it took it.
    pub fn focus(&mut self, selector: &str) {
        let focused = self.eval(&format!(
            "(() => {{ const el = {}; el.scrollIntoView({{ block: 'center', behavior: 'instant' }}); el.focus();
               return el === document.activeElement || el.contains(document.activeElement); }})()",
            the(selector)
        ));
        assert_eq!(focused, Value::Bool(true), "{selector} cannot take the keyboard focus (tabindex?)");
    }

    /// Clicks the text field matching `selector`, replaces its content with `text` as typed input.
    pub fn fill(&mut self, selector: &str, text: &str) {
        self.click(selector);
        self.eval(&format!("{}.select()", the(selector)));
        self.type_text(text);
    }
}

impl Browser {
    /// Saves a PNG of the first element matching `selector` (with a small margin) to `path`.
    pub fn screenshot_of(&mut self, selector: &str, path: &std::path::Path) {
        let r = self.eval(&format!(
            "(() => {{ const r = {}.getBoundingClientRect();
               return [Math.max(r.left + scrollX - 8, 0), Math.max(r.top + scrollY - 8, 0), r.width + 16, r.height + 16]; }})()",
            the(selector)
        ));
        let n = |i: usize| r[i].as_f64().expect("a number");
        self.capture(path, [n(0), n(1), n(2), n(3)]);
    }
}

/// A number as the page shows it: its value and how many decimals it was shown with.
pub fn parse_shown(text: &str) -> Option<(f64, usize)> {
    let text = text.trim().replace('\u{2212}', "-");
    let value = text.parse().ok()?;
    Some((value, text.split_once('.').map_or(0, |(_, d)| d.len())))
}

/// The first element matching `selector`, or an exception that names it.
pub fn the(selector: &str) -> String {
    format!(
        "(document.querySelector({s}) ?? (() => {{ throw new Error('no element matches ' + {s}); }})())",
        s = js(selector)
    )
}

/// A JavaScript function: is this element visible to the learner?
pub const VISIBLE: &str =
    "((el) => !!el && el.checkVisibility({ checkOpacity: true, checkVisibilityCSS: true })
    && el.getClientRects().length > 0 && !el.closest('[hidden]'))";
