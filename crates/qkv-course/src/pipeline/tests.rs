use super::*;

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
    for expected in [
        "0", "0.7071", "0.1978", "0.4011", "4.41", "3.59", "0.731", "7.85", "4.243", "0.881", "6", "4", "4.0",
    ] {
        assert!(nums.contains(&expected), "{expected} missing from {nums:?}");
    }
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

// Bad content: each is an error with file:line:column, the offending text and what was expected.

#[test]
fn error_unknown_reference() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen(
        "(=sentence.love.output:2)",
        "(=sentence.lvoe.output:2)",
        1
    )));
}

#[test]
fn error_unknown_example() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen(
        "(=sentence.love.output:2)",
        "(=sentense.love.output:2)",
        1
    )));
}

#[test]
fn error_misspelled_field() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen(
        "values = [[2], [6], [4]]",
        "valuse = [[2], [6], [4]]",
        1
    )));
}

#[test]
fn error_malformed_block() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen(
        "values = [[2], [6], [4]]",
        "values = [[2], [6], [4]",
        1
    )));
}

#[test]
fn error_mismatched_shapes() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen(
        "keys = [[1, 0], [0, 1], [1, 1]]",
        "keys = [[1, 0, 0], [0, 1, 0], [1, 1, 0]]",
        1
    )));
}

#[test]
fn error_non_finite_number() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen(
        "values = [[2], [6], [4]]",
        "values = [[2], [inf], [4]]",
        1
    )));
}

#[test]
fn error_unknown_figure_kind() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen("kind = \"heatmap\"", "kind = \"heat-map\"", 1)));
}

#[test]
fn error_ragged_rows() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen(
        "queries = [[1, 0], [0, 1], [1, 1]]",
        "queries = [[1, 0], [0], [1, 1]]",
        1
    )));
}

#[test]
fn section_ids_drop_the_number_prefix() {
    assert_eq!(section_id("content/01-attention.md"), "attention");
    assert_eq!(section_id("causal-masking.md"), "causal-masking");
    assert_eq!(section_id("2024.md"), "2024");
}

#[test]
fn error_reference_cycle() {
    let cyclic = ATTENTION.replacen("values = [10, 2]", "values = \"quiz_output.terms\"", 1);
    assert_ne!(cyclic, ATTENTION);
    insta::assert_snapshot!(errors(&cyclic));
}

#[test]
fn error_figure_dims_must_increase() {
    insta::assert_snapshot!(errors(&ATTENTION.replacen(
        "dims = [1, 2, 4, 8, 16, 32, 64, 128, 256]",
        "dims = [1, 4, 2]",
        1
    )));
}
