use super::*;
use crate::stale_report;

const ATTENTION: &str = include_str!("../../../../content/01-attention.md");
const MASKING: &str = include_str!("../../../../content/02-causal-masking.md");

fn lesson() -> Sources {
    lesson_with(ATTENTION, MASKING)
}

fn lesson_with(attention: &str, masking: &str) -> Sources {
    let markdown = vec![
        SourceFile { path: "content/01-attention.md".into(), text: attention.into() },
        SourceFile { path: "content/02-causal-masking.md".into(), text: masking.into() },
    ];
    // Every figure file is taken as present: these tests are about the markdown.
    let figures = [
        "scaling-variance",
        "scaling-saturation",
        "love-query",
        "love-sweep",
        "sentence-heatmap",
        "masked-heatmap",
    ]
    .iter()
    .flat_map(|id| [format!("figures/{id}.svg"), format!("figures/{id}.png")])
    .collect();
    Sources { markdown, figures }
}

/// The error report for a lesson whose first file is `attention`.
fn errors(attention: &str) -> String {
    match check(&lesson_with(attention, MASKING)) {
        Ok(stale) => panic!("expected content errors, got {} stale places", stale.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn committed_lesson_is_fresh() {
    let stale = check(&lesson()).expect("lesson evaluates");
    assert!(stale.is_empty(), "{}", stale_report(&stale));
}

#[test]
fn example_records() {
    for (key, listing) in records(&lesson()).expect("lesson evaluates") {
        insta::assert_snapshot!(format!("record_{}", key.replace('.', "_")), listing);
    }
}

#[test]
fn the_page_shows_the_computed_values() {
    let build = build(&lesson()).expect("lesson builds");
    let page = &build.site.iter().find(|f| f.name == "attention.html").expect("attention page").text;
    let nums: Vec<&str> = page
        .split("<span class=\"num\"")
        .skip(1)
        .filter_map(|s| s.split('>').nth(1)?.split('<').next())
        .collect();
    for expected in ["0", "0.7071", "0.1978", "0.4011", "4.41", "3.59", "4.4067", "4"] {
        assert!(nums.contains(&expected), "{expected} missing from {nums:?}");
    }
    // The keys of the numeric checks, as their answers show them.
    let keys: Vec<&str> =
        page.split("<p class=\"quiz-key\"><strong>").skip(1).filter_map(|s| s.split('<').next()).collect();
    assert_eq!(keys, ["0.731", "7.85", "6", "4.243", "0", "4", "4", "0.881"]);
}

#[test]
fn the_lesson_is_complete_without_script() {
    let build = build(&lesson()).expect("lesson builds");
    let page = &build.site.iter().find(|f| f.name == "attention.html").expect("attention page").text;
    let quizzes: Vec<&str> = page.split("<section class=\"quiz").skip(1).collect();
    assert_eq!(quizzes.len(), 19, "14 graded checks and 5 practice problems");
    assert_eq!(page.matches("data-qkv-graded=\"true\"").count(), 14);
    for quiz in quizzes {
        let quiz = quiz.split("</section>").next().unwrap_or("");
        assert!(quiz.contains("<details class=\"quiz-answer\">"), "an answer behind <details>: {quiz}");
        assert!(quiz.contains("<div data-qkv-answer>"), "{quiz}");
    }
    // What only the script can use is hidden until it runs.
    assert!(
        page.contains("<div class=\"progress\" data-qkv-progress data-qkv-section=\"attention\""),
        "{page}"
    );
    assert!(page.contains("data-qkv-score=\"0\" hidden>"), "the progress indicator waits for the script");
    assert!(page.contains("<div class=\"plane\" hidden>"), "the plane waits for the script");
    // Without it, the widgets are their tables and steps.
    assert!(page.contains("data-qkv-readout=\"weight:NLP\">0.4011<"), "the drag widget's readouts");
    assert!(page.contains("data-qkv-readout=\"row-sum:love\">1.0000<"), "the matrix's row sums");
    assert_eq!(page.matches("<details class=\"row-steps\" data-qkv-steps=").count(), 3, "a row's steps");
}

#[test]
fn rendered_sections() {
    let build = build(&lesson()).expect("lesson builds");
    for page in build.site.iter().filter(|f| f.name.ends_with(".html")) {
        insta::assert_snapshot!(format!("page_{}", page.name.trim_end_matches(".html")), page.text);
    }
}

#[test]
fn changing_v_love_makes_every_dependent_place_stale_and_one_build_fixes_them() {
    let edited = ATTENTION.replacen("values = [[2], [6], [4]]", "values = [[2], [5], [4]]", 1);
    assert_ne!(edited, ATTENTION);
    let sources = lesson_with(&edited, MASKING);
    let stale = check(&sources).expect("still valid");
    let report = stale_report(&stale);
    assert!(report.contains("expected 4.01, found 4.41 (citation sentence.love.output)"), "{report}");
    assert!(report.contains("content/02-causal-masking.md"), "{report}");
    assert!(stale.iter().any(|s| s.what == "steps sentence.love"), "{report}");
    assert!(stale.iter().any(|s| s.what == "figure love-sweep"), "{report}");
    let rebuilt = build(&sources).expect("builds");
    let again = lesson_with(&rebuilt.markdown[0].text, &rebuilt.markdown[1].text);
    let after = check(&again).expect("still valid");
    // Only figure files remain: this test does not write the re-rendered figures back.
    assert!(after.is_empty(), "{}", stale_report(&after));
    assert!(rebuilt.markdown[0].text.contains("[4.01](=sentence.love.output:2)"));
    assert!(
        rebuilt.markdown[0].text.contains("at its current direction the output is 4.01"),
        "the sweep figure's alt text"
    );
}

#[test]
fn text_outside_generated_places_is_untouched() {
    let messy = ATTENTION.replacen(
        "[4.41](=sentence.love.output:2)**. It",
        "[9.99](=sentence.love.output:2)**. It",
        1,
    );
    let rebuilt = build(&lesson_with(&messy, MASKING)).expect("builds");
    assert_eq!(rebuilt.markdown[0].text, ATTENTION);
}

/// Bad content: each fixture in `bad-content/` is a one-file lesson with one mistake; its error
/// report (file:line:column, offending text, what was expected) is the snapshot.
#[test]
fn bad_content() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/pipeline/bad-content");
    let mut fixtures: Vec<_> =
        std::fs::read_dir(&dir).expect("fixtures").flatten().map(|e| e.path()).collect();
    fixtures.sort();
    assert!(fixtures.len() >= 10, "fixtures missing from {}", dir.display());
    for path in fixtures {
        let name = path.file_stem().and_then(|n| n.to_str()).expect("utf-8 name").to_string();
        let text = std::fs::read_to_string(&path).expect("fixture");
        let sources = Sources {
            markdown: vec![SourceFile { path: format!("content/{name}.md"), text }],
            figures: Default::default(),
        };
        match check(&sources) {
            Ok(stale) => panic!("{name}: expected content errors, got {} stale places", stale.len()),
            Err(e) => insta::assert_snapshot!(format!("bad_content_{name}"), e.to_string()),
        }
    }
}

#[test]
fn errors_in_the_lesson_point_into_the_lesson() {
    let report = errors(&ATTENTION.replacen("(=sentence.love.output:2)", "(=sentence.lvoe.output:2)", 1));
    assert!(report.starts_with("content/01-attention.md:"), "{report}");
    assert!(report.contains("unknown reference `sentence.lvoe.output`"), "{report}");
    assert!(report.ends_with("1 error in the lesson source; nothing was written"), "{report}");
}

#[test]
fn section_ids_drop_the_number_prefix() {
    assert_eq!(section_id("content/01-attention.md"), "attention");
    assert_eq!(section_id("causal-masking.md"), "causal-masking");
    assert_eq!(section_id("2024.md"), "2024");
}

/// Projections, an explicit keep mask, a custom scale and two-wide values, in one small lesson.
const FEATURES: &str = r#"# Features

```qkv attention
id = "projected"
tokens = ["a", "b"]
x = [[1, 2], [3, 4]]
w_q = [[1, 0], [0, 1]]
w_k = [[0, 1], [1, 0]]
w_v = [[1, 0, 1], [0, 1, 1]]
```

```qkv attention
id = "kept"
from = "projected"
mask = [[true, false], [true, true]]
scale = 0.5
```

Projected key of b: ([?](=projected.keys.b.1:0), [?](=projected.keys.b.2:0)).
Output of a under the keep mask: [?](=kept.a.output.3:2).

<!-- qkv steps projected.b -->
<!-- /qkv -->

<!-- qkv steps kept.a -->
<!-- /qkv -->

<!-- qkv table kept weights -->
<!-- /qkv -->
"#;

#[test]
fn projections_masks_scales_and_wide_values() {
    let sources = Sources {
        markdown: vec![SourceFile { path: "content/01-features.md".into(), text: FEATURES.into() }],
        figures: Default::default(),
    };
    let built = build(&sources).unwrap_or_else(|e| panic!("{e}"));
    let text = &built.markdown[0].text;
    // K = X · W_k: b's key is (4, 3).
    assert!(text.contains("([4](=projected.keys.b.1:0), [3](=projected.keys.b.2:0))"), "{text}");
    // Under the keep mask, a sees only itself: its output is its value row (1, 2, 3).
    assert!(text.contains("[3.00](=kept.a.output.3:2)"), "{text}");
    assert!(text.contains("Multiply by the scale $0.5$"), "{text}");
    insta::assert_snapshot!("features_lesson", text);
}
