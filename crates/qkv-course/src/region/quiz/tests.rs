use super::also_accepted;
use crate::files::{SourceFile, Sources};
use crate::region::testing::one_section;

/// A section with its own credit schedule, a practice problem before two graded checks.
const LESSON: &str = r#"# Quizzes

```qkv settings
credit = [1, 0.6, 0.3]
```

```qkv softmax
id = "pair"
scores = [1.0, 0.0]
```

```qkv quiz
id = "blend"
kind = "short"
practice = true
question = "Which vectors are blended into the output?"
answer_text = "The values, each times its weight."
```

<!-- qkv quiz blend -->
<!-- /qkv -->

```qkv quiz
id = "key_role"
kind = "choice"
question = "What does a key do?"
hint = "Think of a catalog card."
why = "It is only ever compared with a query."

[[options]]
text = "It is handed back."
feedback = "That is the value's job."

[[options]]
text = "It is compared with the query: $q \\cdot k$."
correct = true
```

<!-- qkv quiz key_role -->
<!-- /qkv -->

```qkv quiz
id = "weight"
kind = "numeric"
question = "Scores {=pair.scores.1:0} and {=pair.scores.2:0}: what is $a_1$ (3 decimals)?"
why = "Softmax:"
answer = "pair.weights.1"
digits = 3
share = true
steps = "pair"
```

<!-- qkv quiz weight -->
<!-- /qkv -->
"#;

fn built(text: &str) -> (String, String) {
    one_section("quizzes", text)
}

/// The quiz sections (and progress indicator) of a page, without the rest of it.
fn quiz_html(page: &str) -> String {
    page.split("<div class=\"generated quiz\">\n")
        .skip(1)
        .map(|s| s.split("</section>").next().unwrap_or("").to_string() + "</section>\n")
        .collect()
}

#[test]
fn quizzes_read_as_questions_on_a_forge() {
    let (markdown, _) = built(LESSON);
    insta::assert_snapshot!("quiz_forge_view", markdown);
}

#[test]
fn quizzes_on_the_page_carry_their_keys_and_the_no_script_view() {
    let (_, page) = built(LESSON);
    insta::assert_snapshot!("quiz_page_view", quiz_html(&page));
}

#[test]
fn graded_checks_and_practice_are_numbered_apart_and_only_checks_are_counted() {
    let (markdown, page) = built(LESSON);
    assert!(markdown.contains("**P1.** Which vectors"), "{markdown}");
    assert!(markdown.contains("**1.** What does a key do?"), "{markdown}");
    assert!(markdown.contains("**2.** Scores 1 and 0"), "{markdown}");
    assert_eq!(page.matches("data-qkv-progress ").count(), 1, "one progress indicator per section");
    let progress = page.find("data-qkv-progress ").expect("progress");
    assert!(
        page.find("data-qkv-quiz=\"blend\"").expect("practice") < progress,
        "the practice problem comes first"
    );
    assert!(progress < page.find("data-qkv-quiz=\"key_role\"").expect("first check"));
    assert!(page.contains("data-qkv-total=\"2\""), "two graded checks");
    assert!(page.contains("data-qkv-graded=\"false\" data-qkv-section=\"quizzes\""), "{page}");
}

#[test]
fn keys_come_from_the_computation_and_the_settings() {
    let (_, page) = built(LESSON);
    let key = |id: &str| -> serde_json::Value {
        let at = page.find(&format!("data-qkv-quiz=\"{id}\"")).expect("quiz");
        let json = page[at..].split("data-qkv-key>").nth(1).and_then(|s| s.split("</script>").next());
        serde_json::from_str(json.expect("key")).expect("JSON")
    };
    let weight = key("weight");
    assert_eq!(weight["value"], 0.7310585786300049);
    assert_eq!(weight["shown"], "0.731");
    assert_eq!(weight["tolerance"], 0.0005);
    assert_eq!(weight["credit"], serde_json::json!([1.0, 0.6, 0.3]));
    assert_eq!(key("key_role")["correct"], "b");
    assert_eq!(key("blend"), serde_json::json!({ "kind": "short", "graded": false }));
}

#[test]
fn a_change_to_a_cited_input_makes_the_quiz_stale() {
    let (markdown, _) = built(LESSON);
    let edited = markdown.replacen("scores = [1.0, 0.0]", "scores = [2.0, 0.0]", 1);
    let sources = Sources {
        markdown: vec![SourceFile { path: "content/01-quizzes.md".into(), text: edited }],
        ..Default::default()
    };
    let stale = crate::check(&sources).expect("valid");
    assert!(stale.iter().any(|s| s.what == "quiz weight"), "{}", crate::stale_report(&stale));
}

fn check(shown: &str, value: f64, digits: usize, share: bool, expected: &[&str]) {
    assert_eq!(also_accepted(shown, value, digits, share), expected);
}

#[test]
fn the_forms_also_accepted() {
    check("0.731", 0.7310585786300049, 3, true, &[".731", "73.1%", "0,731"]);
    check("7.85", 7.848469, 2, false, &["7,85"]);
    check("0.25", 0.25, 2, true, &[".25", "25%", "0,25", "1/4"]);
    check("6", 6.0, 0, false, &[]);
    // A fraction that is no share of a whole (a variance, a score): no percentage.
    check("0.1719", 0.171875, 4, false, &[".1719", "0,1719"]);
}

/// The page's key says whether a percentage reads as the answer: for a `share` (and a key shown
/// as a percentage), not for a key without it.
#[test]
fn a_key_says_whether_it_is_a_share_of_a_whole() {
    let (markdown, page) = built(LESSON);
    assert_eq!(key_of(&page, "weight")["share"], true);
    assert!(markdown.contains("(also accepted: .731, 73.1%, 0,731)"), "{markdown}");
    let scored = LESSON.replace("share = true\n", "").replace("pair.weights.1", "pair.weights.2");
    let (markdown, page) = built(&scored);
    assert_eq!(key_of(&page, "weight").get("share"), None, "no share: the page reads no percentage");
    assert!(markdown.contains("(also accepted: .269, 0,269)"), "{markdown}");
}

/// A choice quiz keyed by computation, twice: by the largest weight, and by conditions.
fn computed(values: &str, query: &str) -> String {
    format!(
        r#"# Computed keys

```qkv attention
id = "s"
tokens = ["I", "love", "NLP"]
queries = [[1, 0], [0, 1], {query}]
keys = [[1, 0], [0, 1], [1, 1]]
values = {values}
```

```qkv quiz
id = "top"
kind = "choice"
shuffle = true
question = "Which key does NLP weigh most?"
why = "The key that lines up best with the query wins."
correct = {{ largest = "s.NLP.weights" }}

[[options]]
text = "I"
item = "I"
feedback = "I's weight is {{=s.NLP.weights.I:3}}."
why = "I's weight is {{=s.NLP.weights.I:3}} against {{=s.NLP.weights.NLP:3}} for NLP."

[[options]]
text = "NLP"
item = "NLP"
feedback = "NLP's weight is {{=s.NLP.weights.NLP:3}}."
why = "NLP's own key lines up best with its query: {{=s.NLP.weights.NLP:3}}."
```

<!-- qkv quiz top -->
<!-- /qkv -->

```qkv quiz
id = "above"
kind = "choice"
question = "Is the output for NLP above 4?"
why = "It is {{=s.NLP.output:2}}."

[[options]]
text = "Yes"
when = "s.NLP.output > 4"
feedback = "It is {{=s.NLP.output:2}}."

[[options]]
text = "No"
when = "s.NLP.output <= 4"
feedback = "It is {{=s.NLP.output:2}}."
```

<!-- qkv quiz above -->
<!-- /qkv -->
"#
    )
}

/// The key of quiz `id` on a page.
fn key_of(page: &str, id: &str) -> serde_json::Value {
    let at = page.find(&format!("data-qkv-quiz=\"{id}\"")).expect("quiz");
    let json = page[at..].split("data-qkv-key>").nth(1).and_then(|s| s.split("</script>").next());
    serde_json::from_str(json.expect("key")).expect("JSON")
}

/// NLP's weights and output, by hand: softmax of the scaled dot products with the three keys.
fn nlp_by_hand(query: [f64; 2], values: [f64; 3]) -> ([f64; 3], f64) {
    let keys = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]];
    let e: Vec<f64> =
        keys.iter().map(|k| ((query[0] * k[0] + query[1] * k[1]) / 2f64.sqrt()).exp()).collect();
    let sum: f64 = e.iter().sum();
    let w = [e[0] / sum, e[1] / sum, e[2] / sum];
    (w, w.iter().zip(values).map(|(a, v)| a * v).sum())
}

#[test]
fn a_computed_key_follows_its_inputs_and_check_lists_the_quiz() {
    let (markdown, page) = one_section("keys", &computed("[[2], [6], [8]]", "[1, 1]"));
    let (w, output) = nlp_by_hand([1.0, 1.0], [2.0, 6.0, 8.0]);
    assert!(w[2] > w[0] && output > 4.0, "{w:?} {output}");
    assert_eq!(key_of(&page, "top")["correct"], "b");
    assert_eq!(key_of(&page, "top")["shuffle"], true);
    assert_eq!(key_of(&page, "above")["correct"], "a");
    assert!(markdown.contains("**(b)** NLP"), "{markdown}");
    assert!(markdown.contains("NLP's own key lines up best"), "the right option's own why: {markdown}");

    // Point NLP's query along I's key and shrink its value: now I wins and the output drops.
    let after = markdown.replacen("[0, 1], [1, 1]]\nkeys", "[0, 1], [2, -1]]\nkeys", 1).replacen(
        "[[2], [6], [8]]",
        "[[2], [6], [1]]",
        1,
    );
    assert_ne!(after, markdown, "the edit applied");
    let (w, output) = nlp_by_hand([2.0, -1.0], [2.0, 6.0, 1.0]);
    assert!(w[0] > w[2] && output <= 4.0, "{w:?} {output}");
    let sources = Sources {
        markdown: vec![SourceFile { path: "content/01-keys.md".into(), text: after.clone() }],
        ..Default::default()
    };
    let stale = crate::check(&sources).expect("valid");
    let report = crate::stale_report(&stale);
    assert!(stale.iter().any(|s| s.what == "quiz top"), "{report}");
    assert!(stale.iter().any(|s| s.what == "quiz above"), "{report}");
    let (_, page) = one_section("keys", &after);
    assert_eq!(key_of(&page, "top")["correct"], "a");
    assert_eq!(key_of(&page, "above")["correct"], "b");
}

#[test]
fn a_numeric_key_can_be_shown_as_a_percentage() {
    let text = "# P\n\n```qkv softmax\nid = \"pair\"\nscores = [1.0, 0.0]\n```\n\n```qkv quiz\nid = \"share\"\nkind = \"numeric\"\nquestion = \"What share of the weight goes to the first score?\"\nwhy = \"Softmax.\"\nanswer = \"pair.weights.1\"\ndigits = 1\npercent = true\n```\n\n<!-- qkv quiz share -->\n<!-- /qkv -->\n";
    let (markdown, page) = one_section("percent", text);
    let key = key_of(&page, "share");
    // softmax(1, 0)₁ = e / (e + 1), by hand.
    let share = std::f64::consts::E / (std::f64::consts::E + 1.0);
    assert_eq!(key["value"], share);
    assert_eq!(key["shown"], "73.1%");
    assert_eq!(key["percent"], true);
    assert!((key["tolerance"].as_f64().expect("number") - 0.0005).abs() < 1e-15);
    assert!(markdown.contains("**73.1%** (also accepted: 73.1, 73,1%, 0.731)"), "{markdown}");
}

/// A whole-number key (here a dot product of whole numbers, 1·3 + 2·1 = 5 by hand) has no
/// near-miss band: nothing was rounded, so 4 or 6 is an off-by-one, not a rounding slip. The same
/// quiz on a fractional key (the scaled score 5/√2) keeps the default band.
#[test]
fn a_whole_number_key_has_no_near_miss_band() {
    let quiz = |answer: &str| {
        format!(
            "# W\n\n```qkv dot\nid = \"d\"\nq = [1, 2]\nk = [3, 1]\n```\n\n```qkv quiz\nid = \"n\"\nkind = \"numeric\"\nquestion = \"What is it?\"\nwhy = \"Multiply and add.\"\nanswer = \"{answer}\"\ndigits = 2\n```\n\n<!-- qkv quiz n -->\n<!-- /qkv -->\n"
        )
    };
    let (_, page) = one_section("whole", &quiz("d.dot"));
    let key = key_of(&page, "n");
    assert_eq!(key["value"], 5.0);
    assert_eq!(key["near"], 0.0, "{key}");
    let (_, page) = one_section("whole", &quiz("d.scaled"));
    let key = key_of(&page, "n");
    let scaled = 5.0 / 2f64.sqrt();
    assert_eq!(key["value"], scaled);
    assert_eq!(key["near"], (0.02f64).max(0.005 * scaled), "{key}");
}
