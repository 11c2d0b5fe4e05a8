//! Shuffled options (issue 15): a choice quiz with `shuffle = true` and a computed key, built by
//! the real command into a site of its own. Each learner gets an order of their own, the same
//! after a reload; the options are lettered by place, and the key still grades by the option,
//! wherever it stands.

use std::path::Path;

use super::cdp::DESKTOP;
use super::launch;
use crate::support::xtask;

const LESSON: &str = r#"# Shuffled

```qkv attention
id = "s"
tokens = ["I", "love", "NLP", "you"]
queries = [[1, 0], [0, 1], [1, 1], [2, 2]]
keys = [[1, 0], [0, 1], [1, 1], [-1, 0]]
values = [[2], [6], [4], [1]]
```

```qkv quiz
id = "top"
kind = "choice"
shuffle = true
question = "Which key does NLP weigh most?"
why = "The key that lines up best with the query gets the most weight."
correct = { largest = "s.NLP.weights" }

[[options]]
text = "I"
item = "I"
feedback = "Its weight is {=s.NLP.weights.I:3}."

[[options]]
text = "love"
item = "love"
feedback = "Its weight is {=s.NLP.weights.love:3}."

[[options]]
text = "NLP"
item = "NLP"
feedback = "Its weight is {=s.NLP.weights.NLP:3}."
why = "Its own key lines up with its query: {=s.NLP.weights.NLP:3}."

[[options]]
text = "you"
item = "you"
feedback = "Its weight is {=s.NLP.weights.you:3}."
```

<!-- qkv quiz top -->
<!-- /qkv -->
"#;

/// The options as the page shows them: (declared letter, shown letter, text), top to bottom.
const OPTIONS: &str = "Array.from(document.querySelectorAll('[data-qkv-quiz=top] [data-qkv-option]')).map(b => [b.dataset.qkvOption, b.querySelector('.quiz-letter').textContent, b.querySelector('.quiz-option-text').textContent])";

#[test]
fn shuffled_options_keep_the_learner_s_order_and_grade_by_the_option() {
    let Some(mut b) = launch(DESKTOP) else { return };
    let dir = tempfile::tempdir().expect("scratch");
    let (content, site) = (dir.path().join("content"), dir.path().join("site"));
    std::fs::create_dir_all(&content).expect("content folder");
    std::fs::write(content.join("01-shuffled.md"), LESSON).expect("lesson");
    let utf8 = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    let run = xtask(&["build-content", "--content", &utf8(&content), "--out", &utf8(&site)]);
    assert_eq!(run.status, 0, "{}", run.stderr);
    b.navigate(&format!("file://{}", utf8(&site.join("shuffled.html"))));
    let ready = "document.documentElement.dataset.qkvReady === 'true'";
    b.wait_for(ready, "the page script", "document.documentElement.outerHTML.length");
    let order = |b: &mut super::cdp::Browser| -> Vec<(String, String, String)> {
        serde_json::from_value(b.eval(OPTIONS)).expect("options")
    };
    // Several learners (seeds): every order holds every option once, lettered by place, and not
    // every learner gets the declared order.
    let mut orders = Vec::new();
    for seed in [1u32, 2, 3, 4, 5, 6] {
        b.eval(&format!("localStorage.setItem('qkv-progress', JSON.stringify({{'~seed': {seed}}}))"));
        b.reload();
        b.wait_for(ready, "the page script", "0");
        let shown = order(&mut b);
        let mut declared: Vec<&str> = shown.iter().map(|(d, _, _)| d.as_str()).collect();
        declared.sort_unstable();
        assert_eq!(declared, ["a", "b", "c", "d"], "seed {seed}: {shown:?}");
        let letters: Vec<&str> = shown.iter().map(|(_, l, _)| l.as_str()).collect();
        assert_eq!(letters, ["(a)", "(b)", "(c)", "(d)"], "seed {seed}: lettered by place");
        // The same learner sees the same order after a reload.
        b.reload();
        b.wait_for(ready, "the page script", "0");
        assert_eq!(order(&mut b), shown, "seed {seed}: stable across reloads");
        orders.push(shown);
    }
    assert!(
        orders.iter().any(|o| o[0].0 != "a" || o[1].0 != "b"),
        "no learner got a shuffled order: {orders:?}"
    );
    assert!(orders.windows(2).any(|w| w[0] != w[1]), "every learner got the same order");
    // The key grades the option, not the place: NLP (declared (c)) is right wherever it shows.
    let last = orders.last().expect("an order");
    let place = last.iter().position(|(d, _, _)| d == "c").expect("NLP is an option");
    b.click("[data-qkv-quiz=top] [data-qkv-option=\"c\"]");
    b.wait_for(
        "document.querySelector('[data-qkv-quiz=top]').dataset.qkvState === 'right'",
        "the right option to be graded right",
        "document.querySelector('[data-qkv-quiz=top]').dataset.qkvState",
    );
    let key_letter =
        b.eval("document.querySelector('[data-qkv-quiz=top] .quiz-key .quiz-letter').textContent");
    assert_eq!(
        key_letter,
        serde_json::json!(last[place].1),
        "the answer names the option by its shown letter"
    );
}
