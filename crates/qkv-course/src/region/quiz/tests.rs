use super::also_accepted;
use crate::pipeline::{SourceFile, Sources};
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
        figures: Default::default(),
    };
    let stale = crate::check(&sources).expect("valid");
    assert!(stale.iter().any(|s| s.what == "quiz weight"), "{}", crate::stale_report(&stale));
}

fn check(shown: &str, value: f64, digits: usize, expected: &[&str]) {
    assert_eq!(also_accepted(shown, value, digits), expected);
}

#[test]
fn the_forms_also_accepted() {
    check("0.731", 0.7310585786300049, 3, &[".731", "73.1%", "0,731"]);
    check("7.85", 7.848469, 2, &["7,85"]);
    check("0.25", 0.25, 2, &[".25", "25%", "0,25", "1/4"]);
    check("6", 6.0, 0, &[]);
}
