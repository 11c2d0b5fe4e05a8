use super::*;
use crate::stale_report;

mod block;
mod gradient;
mod positions;

/// The two files the tests edit: the lesson and causal masking.
const ATTENTION: &str = include_str!("../../../../content/01-attention.md");
const MASKING: &str = include_str!("../../../../content/02-causal-masking.md");

/// The committed course's folder.
fn content_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../content")
}

/// The committed course: every `content/NN-NAME.md`, in order, read when the test runs (so a
/// new chapter needs nothing here).
fn committed() -> Vec<SourceFile> {
    let mut names: Vec<String> = std::fs::read_dir(content_dir())
        .expect("content/")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".md") && n.as_bytes().first().is_some_and(u8::is_ascii_digit))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|n| SourceFile {
            text: std::fs::read_to_string(content_dir().join(&n)).expect("lesson file"),
            path: format!("content/{n}"),
        })
        .collect()
}

fn lesson() -> Sources {
    lesson_with(ATTENTION, MASKING)
}

/// The committed course with its first two files (the lesson and causal masking) replaced.
fn lesson_with(attention: &str, masking: &str) -> Sources {
    let mut markdown = committed();
    markdown[0].text = attention.into();
    markdown[1].text = masking.into();
    // Every committed figure file is taken as present, as drawn from what its SVG says: these
    // tests are about the markdown.
    let figures: BTreeSet<String> = std::fs::read_dir(content_dir().join("figures"))
        .expect("content/figures/")
        .filter_map(|e| Some(format!("figures/{}", e.ok()?.file_name().into_string().ok()?)))
        .collect();
    let figure_hashes = figures
        .iter()
        .filter_map(|name| {
            let svg = std::fs::read_to_string(content_dir().join(name)).ok()?;
            Some((name.clone(), files::drawn_from(&svg)?.to_string()))
        })
        .collect();
    Sources { markdown, figures, figure_hashes, data: committed_data() }
}

/// The committed course's data files, `data/NAME.toml` → text.
fn committed_data() -> std::collections::BTreeMap<String, String> {
    let Ok(entries) = std::fs::read_dir(content_dir().join("data")) else { return Default::default() };
    entries
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let text = std::fs::read_to_string(content_dir().join("data").join(&name)).ok()?;
            Some((format!("data/{name}"), text))
        })
        .collect()
}

/// The course as a build rewrote it: every file, since later chapters cite the first two.
fn rebuilt_lesson(rebuilt: &Build) -> Sources {
    let mut sources = Sources { markdown: rebuilt.markdown.clone(), ..lesson() };
    // The figures it drew, as if written back.
    for figure in &rebuilt.figures {
        if let Some(hash) = std::str::from_utf8(&figure.bytes).ok().and_then(files::drawn_from) {
            sources.figure_hashes.insert(figure.name.clone(), hash.to_string());
        }
    }
    sources
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
    // The print view is the sections' articles again (its own tests are in `html/tests.rs`).
    for page in build.site.iter().filter(|f| f.name.ends_with(".html") && f.name != "print.html") {
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
    let again = rebuilt_lesson(&rebuilt);
    let after = check(&again).expect("still valid");
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

/// Bad content: each fixture in `bad-content/` is a one-file lesson with one mistake, or a folder
/// of lesson files whose mistake lies between them; its error report (file:line:column,
/// offending text, what was expected) is the snapshot.
#[test]
fn bad_content() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/pipeline/bad-content");
    let mut fixtures: Vec<_> =
        std::fs::read_dir(&dir).expect("fixtures").flatten().map(|e| e.path()).collect();
    fixtures.sort();
    assert!(fixtures.len() >= 10, "fixtures missing from {}", dir.display());
    for path in fixtures {
        let name = path.file_stem().and_then(|n| n.to_str()).expect("utf-8 name").to_string();
        let files = if path.is_dir() {
            let mut files: Vec<_> =
                std::fs::read_dir(&path).expect("fixture folder").flatten().map(|e| e.path()).collect();
            files.sort();
            files
        } else {
            vec![path.clone()]
        };
        let mut markdown = Vec::new();
        let mut undecodable = Vec::new();
        for file in files {
            let shown = if path.is_dir() {
                format!("content/{}", file.file_name().and_then(|n| n.to_str()).expect("utf-8 name"))
            } else {
                format!("content/{name}.md")
            };
            // Read as xtask reads: bytes, decoded by the pipeline (which locates bad UTF-8).
            match crate::decode(&shown, &std::fs::read(&file).expect("fixture")) {
                Ok(text) => markdown.push(SourceFile { path: shown, text }),
                Err(e) => undecodable.push(e),
            }
        }
        let result = if undecodable.is_empty() {
            check(&Sources { markdown, ..Default::default() })
        } else {
            Err(ContentErrors(undecodable))
        };
        match result {
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

/// The examples that copy the running example's rows (five tokens, decoding, reordered keys)
/// take them by reference, so an edit of its inputs reaches what they show too.
#[test]
fn copies_of_the_running_example_follow_its_inputs() {
    let edited = ATTENTION.replacen("values = [[2], [6], [4]]", "values = [[2], [6], [5]]", 1);
    assert_ne!(edited, ATTENTION);
    let report = stale_report(&check(&lesson_with(&edited, MASKING)).expect("still valid"));
    for place in ["citation band.love.output", "citation gen.NLP.output", "citation reordered.love.output.1"]
    {
        assert!(report.contains(place), "{place} missing from {report}");
    }
}

/// The anchors a link may name are the ids the pages give the headings: the two are worked out
/// apart (`document.rs` for the check, `html.rs` for the page).
#[test]
fn every_anchor_a_link_may_name_is_an_id_on_its_page() {
    let sources = lesson();
    let built = build(&sources).expect("lesson builds");
    for file in &sources.markdown {
        let page = format!("{}.html", section_id(&file.path));
        let html = &built.site.iter().find(|f| f.name == page).expect("a page per section").text;
        let anchors = document::parse(0, &file.text).expect("parses").anchors;
        assert!(!anchors.is_empty(), "{page} has headings");
        for anchor in anchors {
            assert!(html.contains(&format!(" id=\"{anchor}\"")), "{page} has no id {anchor}");
        }
    }
}

/// A region left open in one section: its one mistake is reported, not every use the other
/// sections make of what that file declares (which, unparsed, it declares nothing of).
#[test]
fn a_region_left_open_is_reported_alone() {
    let close = ATTENTION.find("<!-- /qkv -->").expect("a generated region");
    let report = errors(&format!("{}{}", &ATTENTION[..close], &ATTENTION[close + "<!-- /qkv -->".len()..]));
    assert!(report.starts_with("content/01-attention.md:"), "{report}");
    assert!(!report.contains("unknown reference"), "{report}");
    assert!(!report.contains("content/02-causal-masking.md"), "{report}");
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
        ..Default::default()
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

/// A one-file lesson at `content/01-NAME.md`, every figure file taken as missing.
fn one_file(text: &str) -> Sources {
    Sources {
        markdown: vec![SourceFile { path: "content/01-test.md".into(), text: text.into() }],
        ..Default::default()
    }
}

/// Issue 11, finding 1: the minimal input that panicked ("attempt to add with overflow").
#[test]
fn huge_values_build_with_approximate_steps() {
    let text = "# Huge\n\n```qkv weighted-sum\nid = \"big\"\nweights = [0.5, 0.5]\nvalues = [1e35, 1]\n```\n\n<!-- qkv steps big -->\n<!-- /qkv -->\n";
    let built = build(&one_file(text)).unwrap_or_else(|e| panic!("{e}"));
    let steps = &built.markdown[0].text;
    assert!(steps.contains(r"\operatorname{output} \approx"), "{steps}");
}

fn crlf(text: &str) -> String {
    text.replace('\n', "\r\n")
}

/// Issue 11, finding 3: a CRLF file came back with 67 CRLF and 31 LF line endings.
#[test]
fn a_crlf_lesson_stays_crlf_and_fresh() {
    let committed = lesson_with(&crlf(ATTENTION), &crlf(MASKING));
    let stale = check(&committed).expect("lesson evaluates");
    assert!(stale.is_empty(), "{}", stale_report(&stale));
    let edited = crlf(&ATTENTION.replacen("values = [[2], [6], [4]]", "values = [[2], [5], [4]]", 1));
    let emptied = crlf(&MASKING.replacen(
        &MASKING[MASKING.find("<!-- qkv table masked weights -->").unwrap()
            ..MASKING.find("```qkv figure").unwrap()],
        "<!-- qkv table masked weights -->\n<!-- /qkv -->\n\n",
        1,
    ));
    let rebuilt = build(&lesson_with(&edited, &emptied)).expect("builds");
    // The two CRLF files; the later chapters keep their own LF endings.
    for file in rebuilt.markdown.iter().take(2) {
        let bare = file.text.match_indices('\n').filter(|(i, _)| !file.text[..*i].ends_with('\r')).count();
        assert_eq!(bare, 0, "{}: {bare} lines end in a bare LF", file.path);
    }
    assert!(
        rebuilt.markdown[1]
            .text
            .contains("| **love** | 0.3302 | 0.6698 | 0 (masked) | 1.0000 | 4.0093 |\r\n")
    );
    let again = rebuilt_lesson(&rebuilt);
    let after = check(&again).expect("still valid");
    assert!(after.is_empty(), "{}", stale_report(&after));
}

/// Issue 11, finding 3: with a byte-order mark, the title was rendered as a paragraph.
#[test]
fn a_byte_order_mark_is_kept_and_the_title_stays_a_heading() {
    let edited =
        ATTENTION.replacen("[4.41](=sentence.love.output:2)**. It", "[?](=sentence.love.output:2)**. It", 1);
    let sources = lesson_with(&format!("\u{feff}{edited}"), MASKING);
    let report = check(&sources).map(|s| stale_report(&s)).expect("lesson evaluates");
    // Positions on the first line do not count the invisible mark.
    assert!(report.contains("content/01-attention.md:151: expected 4.41, found ?"), "{report}");
    let built = build(&sources).expect("builds");
    assert_eq!(built.markdown[0].text, format!("\u{feff}{ATTENTION}"));
    let page = &built.site.iter().find(|f| f.name == "attention.html").expect("page").text;
    assert!(
        page.contains("<h1><span class=\"section-number\">1.</span> Scaled dot-product attention</h1>"),
        "{page}"
    );
    assert!(page.contains("<title>1. Scaled dot-product attention · qkv</title>"));
    assert!(!page.contains('\u{feff}'));
}

/// Issue 11, finding 4: `99999999999999999999` got "expected a number"; issue 15: it then
/// became 100000000000000000000 without a word. An integer no f64 holds is an error; written as
/// a float it is the approximate number it says, shown in scientific notation.
#[test]
fn an_integer_no_float_holds_is_an_error_and_a_float_is_shown_in_scientific_notation() {
    let text = |q: &str| {
        format!("# Big\n\n```qkv dot\nid = \"d\"\nq = [{q}, 0]\nk = [1, 0]\n```\n\nq·k = [?](=d.dot:0).\n")
    };
    let errors = check(&one_file(&text("99999999999999999999"))).map(|_| ()).unwrap_err().to_string();
    assert!(errors.contains("no 64-bit float holds exactly: it would be 1e20"), "{errors}");
    for exact in ["9007199254740992", "-9007199254740992", "18014398509481984", "0x10"] {
        assert!(check(&one_file(&text(exact))).is_ok(), "{exact} is exact");
    }
    assert!(check(&one_file(&text("9007199254740993"))).is_err(), "2^53 + 1 is not");
    let built = build(&one_file(&text("1e20"))).unwrap_or_else(|e| panic!("{e}"));
    assert!(built.markdown[0].text.contains("q·k = [1e20](=d.dot:0)."), "{}", built.markdown[0].text);
}

/// Cross-attention as issue 11 found it hard to write: two decoder queries over four encoder
/// tokens (d_k = 3, d_v = 2) with their own labels; the same with projections; causal alignment
/// on a non-square example.
const CROSS: &str = r#"# Cross-attention

```qkv attention
id = "cross"
query_tokens = ["le", "chat"]
tokens = ["the", "cat", "sat", "down"]
queries = [[2, 1, 0], [0, 1, 1]]
keys = [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 1]]
values = [[0.5, 1], [1, 0], [0, 2], [1, 1]]
```

"chat" weighs "cat" [?](=cross.chat.weights.cat:4) and its output is ([?](=cross.chat.output.1:4), [?](=cross.chat.output.2:4)).

<!-- qkv table cross inputs -->
<!-- /qkv -->

<!-- qkv table cross weights -->
<!-- /qkv -->

<!-- qkv steps cross.chat -->
<!-- /qkv -->

```qkv attention
id = "projected"
query_tokens = ["le", "chat"]
tokens = ["the", "cat", "sat", "down"]
x_q = [[1, 0], [0, 1]]
x_kv = [[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0]]
w_q = [[1, 0], [0, 1]]
w_k = [[1, 0], [0, 1], [1, 1]]
w_v = [[1], [2], [3]]
```

The decoder query of "chat" is ([?](=projected.queries.chat.1:0), [?](=projected.queries.chat.2:0)); the encoder key of "down" is ([?](=projected.keys.down.1:0), [?](=projected.keys.down.2:0)) and its value [?](=projected.values.down:0).

```qkv attention
id = "causal"
from = "cross"
mask = "causal"
```

Under the causal mask "le" gives "down" [?](=causal.le.weights.down:0) and "chat" gives it [?](=causal.chat.weights.down:4).

<!-- qkv lab cross.le -->
<!-- /qkv -->
"#;

/// Softmax attention of one query by hand, independent of the engine: weights and output.
fn by_hand(q: &[f64], keys: &[&[f64]], values: &[&[f64]]) -> (Vec<f64>, Vec<f64>) {
    by_hand_scaled(q, keys, values, 1.0 / (q.len() as f64).sqrt())
}

/// [`by_hand`] with the scores multiplied by `scale`.
fn by_hand_scaled(q: &[f64], keys: &[&[f64]], values: &[&[f64]], scale: f64) -> (Vec<f64>, Vec<f64>) {
    let scores: Vec<f64> =
        keys.iter().map(|k| q.iter().zip(*k).map(|(a, b)| a * b).sum::<f64>() * scale).collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    let weights: Vec<f64> = exps.iter().map(|e| e / sum).collect();
    let output =
        (0..values[0].len()).map(|c| weights.iter().zip(values).map(|(w, v)| w * v[c]).sum()).collect();
    (weights, output)
}

#[test]
fn cross_attention_has_its_own_query_labels_and_projections() {
    let built = build(&one_file(CROSS)).unwrap_or_else(|e| panic!("{e}"));
    let text = &built.markdown[0].text;
    let keys: [&[f64]; 4] = [&[1.0, 0.0, 0.0], &[0.0, 1.0, 0.0], &[0.0, 0.0, 1.0], &[1.0, 1.0, 1.0]];
    let values: [&[f64]; 4] = [&[0.5, 1.0], &[1.0, 0.0], &[0.0, 2.0], &[1.0, 1.0]];
    let (weights, output) = by_hand(&[0.0, 1.0, 1.0], &keys, &values);
    let cited = format!(
        "\"chat\" weighs \"cat\" [{:.4}](=cross.chat.weights.cat:4) and its output is ([{:.4}](=cross.chat.output.1:4), [{:.4}](=cross.chat.output.2:4)).",
        weights[1], output[0], output[1]
    );
    assert!(text.contains(&cited), "{cited}\n{text}");
    // Queries are listed apart from the keys: no query on the row of "the".
    assert!(
        text.contains("| query token | query |\n|:--|:--|\n| le | (2, 1, 0) |\n| chat | (0, 1, 1) |\n"),
        "{text}"
    );
    // Inputs are shown as the steps show them: 0.5, not 0.5000.
    assert!(text.contains("| the | (1, 0, 0) | (0.5, 1) |"), "{text}");
    assert!(text.contains("| **chat** |"), "{text}");
    assert!(text.contains(r"$q_{\text{chat}} = (0, 1, 1)$"), "{text}");
    // Projections: Q = X_q·W_q, K = X_kv·W_k, V = X_kv·W_v.
    assert!(text.contains("([0](=projected.queries.chat.1:0), [1](=projected.queries.chat.2:0))"), "{text}");
    assert!(text.contains("([1](=projected.keys.down.1:0), [1](=projected.keys.down.2:0)) and its value [3](=projected.values.down:0)"), "{text}");
    // Bottom-right alignment: with 2 queries over 4 keys, "le" sees the first three keys and
    // "chat" (the last query) sees them all.
    let (visible, _) = by_hand(&[0.0, 1.0, 1.0], &keys, &values);
    assert!(text.contains("\"le\" gives \"down\" [0](=causal.le.weights.down:0)"), "{text}");
    assert!(
        text.contains(&format!("\"chat\" gives it [{:.4}](=causal.chat.weights.down:4)", visible[3])),
        "{text}"
    );
    assert!(text.contains("q = Q[0]  # the query of \"le\""), "{text}");
    insta::assert_snapshot!("cross_attention_lesson", text);
}

#[test]
fn cross_attention_heatmaps_label_rows_by_query() {
    let figure = "\n```qkv figure\nid = \"cross-heatmap\"\nkind = \"heatmap\"\nexample = \"cross\"\nquery = \"chat\"\ncaption = \"Decoder queries over encoder keys.\"\n```\n\n<!-- qkv figure cross-heatmap -->\n<!-- /qkv -->\n";
    let built = build(&one_file(&format!("{CROSS}{figure}"))).unwrap_or_else(|e| panic!("{e}"));
    let text = &built.markdown[0].text;
    assert!(text.contains("one column per key (the, cat, sat, down); row le: "), "{text}");
    assert!(text.contains("; row chat: "), "{text}");
    let svg = built.figures.iter().find(|f| f.name == "figures/cross-heatmap.svg").expect("figure drawn");
    let svg = String::from_utf8_lossy(&svg.bytes);
    for axis_label in ["\nle\n</text>", "\nchat\n</text>", "\nthe\n</text>", "\ndown\n</text>"] {
        assert!(svg.contains(axis_label), "{axis_label:?} missing from the heatmap");
    }
}

/// Issue 11, finding 6: numbers inside `$…$` were not tracked. Math citations are.
#[test]
fn numbers_in_math_are_tracked_and_rendered() {
    let text = concat!(
        "# Math\n\n```qkv softmax\nid = \"s\"\nscores = [1, 0]\n```\n\n",
        "With $d = {2}\\vphantom{\\verb|=s.scores.1:0|}$ the first weight is ",
        "$a_1 \\approx {0.5}\\vphantom{\\verb|=s.weights.1:4|} = {50\\%}\\vphantom{\\verb|=s.weights.1:1%|}$.\n\n",
        "| weight | value |\n|:--|--:|\n| $a_2$ | ${?}\\vphantom{\\verb!=s.weights.2:3!}$ |\n",
    );
    let sources = one_file(text);
    let report = stale_report(&check(&sources).expect("valid"));
    for expected in [
        "content/01-test.md:8: expected 1, found 2 (citation s.scores.1)",
        "content/01-test.md:8: expected 0.7311, found 0.5 (citation s.weights.1)",
        r"content/01-test.md:8: expected 73.1\%, found 50\% (citation s.weights.1)",
        "content/01-test.md:12: expected 0.269, found ? (citation s.weights.2)",
    ] {
        assert!(report.contains(expected), "{expected} not in\n{report}");
    }
    let built = build(&sources).expect("builds");
    let again = check(&one_file(&built.markdown[0].text)).expect("valid");
    assert!(again.is_empty(), "{}", stale_report(&again));
    assert!(
        built.markdown[0].text.contains(r"$a_1 \approx {0.7311}\vphantom{\verb|=s.weights.1:4|} = {73.1\%}")
    );
    let page = &built.site.iter().find(|f| f.name == "test.html").expect("page").text;
    assert!(!page.contains("vphantom") && !page.contains("verb"), "{page}");
    for number in ["<mn>1</mn>", "<mn>0.7311</mn>", "<mn>73.1</mn>", "<mn>0.269</mn>"] {
        assert!(page.contains(number), "{number} missing from {page}");
    }
}

/// Issue 15: `expect_error` covered the engine's attention errors but not its projection errors,
/// which stopped the build instead of becoming the example's error text.
#[test]
fn an_expected_projection_error_is_the_example_s_result() {
    let text = "# Wrong shapes\n\n```qkv attention\nid = \"bad\"\nx = [[1, 0], [0, 1]]\nw_q = [[1, 0, 0]]\nw_k = [[1], [0]]\nw_v = [[1], [2]]\nexpect_error = true\n```\n\n<!-- qkv error bad -->\n<!-- /qkv -->\n";
    let built = build(&one_file(text)).unwrap_or_else(|e| panic!("{e}"));
    let shown = &built.markdown[0].text;
    assert!(shown.contains("w_q"), "the engine's message names the projection: {shown}");
}

/// Every name an attention record gives its own values is one no token label may take.
#[test]
fn token_labels_cannot_shadow_any_field_of_a_record() {
    let sources = one_file(&format!("# F\n\n{CROSS}"));
    for (key, listing) in records(&sources).expect("valid") {
        for line in listing.lines() {
            let field = line.strip_prefix(&format!("{key}.")).and_then(|r| r.split(['.', ' ']).next());
            let field = field.expect("a path under the record");
            let is_label = ["le", "chat", "the", "cat", "sat", "down"].contains(&field);
            assert!(
                is_label || examples::ATTENTION_FIELDS.contains(&field),
                "{key}: `{field}` is missing from ATTENTION_FIELDS"
            );
        }
    }
}

/// After a build no citation syntax is left in any page, notebook or lesson file beyond the
/// citations the lesson files keep by design.
#[test]
fn the_built_lesson_has_no_leftover_citation_syntax() {
    let built = build(&lesson()).expect("lesson builds");
    let files = built
        .site
        .iter()
        .map(|f| (f.name.as_str(), f.text.as_str()))
        .chain(built.markdown.iter().map(|f| (f.path.as_str(), f.text.as_str())));
    let leftovers = crate::leftover_citations(files);
    assert!(leftovers.is_empty(), "{leftovers:#?}");
}

/// Weights and output of one query by hand: scaled scores plus `bias`, only `visible` keys.
fn masked_by_hand(
    q: &[f64],
    keys: &[[f64; 2]],
    values: &[f64],
    visible: &[bool],
    bias: &[f64],
) -> (Vec<f64>, f64) {
    let e: Vec<f64> = keys
        .iter()
        .zip(visible)
        .zip(bias)
        .map(|((k, &v), b)| if v { ((q[0] * k[0] + q[1] * k[1]) / 2f64.sqrt() + b).exp() } else { 0.0 })
        .collect();
    let sum: f64 = e.iter().sum();
    let w: Vec<f64> = e.iter().map(|x| x / sum).collect();
    let out = w.iter().zip(values).map(|(a, v)| a * v).sum();
    (w, out)
}

/// Key lengths, padding, windows and ALiBi on examples: each weight as a hand computation has it.
#[test]
fn masks_on_examples_hide_and_bias_the_keys_the_engine_does() {
    let base = "```qkv attention\nid = \"s\"\ntokens = [\"a\", \"b\", \"c\", \"d\"]\nqueries = [[1, 0], [0, 1], [1, 1], [2, 1]]\nkeys = [[1, 0], [0, 1], [1, 1], [1, -1]]\nvalues = [[2], [6], [4], [8]]\n```\n";
    let keys = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]];
    let values = [2.0, 6.0, 4.0, 8.0];
    let q_c = [1.0, 1.0];
    let cases: [(&str, [bool; 4], [f64; 4]); 4] = [
        ("key_length = 3", [true, true, true, false], [0.0; 4]),
        ("key_padding = [false, true, false, false]", [true, false, true, true], [0.0; 4]),
        // Query c stands at position 3 (from 1): one key back and none ahead.
        ("window = [1, 0]", [false, true, true, false], [0.0; 4]),
        // ALiBi adds m (j - i) for query c at i = 3: -1, -0.5, 0, +0.5 with m = 0.5.
        ("alibi = 0.5", [true; 4], [-1.0, -0.5, 0.0, 0.5]),
    ];
    for (field, visible, bias) in cases {
        let example = format!("{base}\n```qkv attention\nid = \"m\"\nfrom = \"s\"\n{field}\n```\n");
        let records =
            records(&one_file(&format!("# M\n\n{example}"))).unwrap_or_else(|e| panic!("{field}: {e}"));
        let (_, listing) = records.iter().find(|(k, _)| k.ends_with(".m")).expect("the masked example");
        let value = |path: &str| -> f64 {
            let line = listing.lines().find(|l| l.split(" = ").next().is_some_and(|p| p.ends_with(path)));
            line.and_then(|l| l.split(" = ").nth(1))
                .and_then(|x| x.parse().ok())
                .unwrap_or_else(|| panic!("{field}: no {path}"))
        };
        let (w, out) = masked_by_hand(&q_c, &keys, &values, &visible, &bias);
        for (j, label) in ["a", "b", "c", "d"].iter().enumerate() {
            let got = value(&format!(".c.weights.{label}"));
            assert!((got - w[j]).abs() < 1e-12, "{field}: weight of {label} {got} against {}", w[j]);
        }
        assert!((value(".c.output.1") - out).abs() < 1e-12, "{field}: output");
    }
}

const EVERY_KIND: &str = include_str!("fixtures/every-kind.md");

/// Every value of every record of a lesson, by qualified path.
fn values_of(sources: &Sources) -> HashMap<String, f64> {
    let mut out = HashMap::new();
    for (_, listing) in records(sources).unwrap_or_else(|e| panic!("{e}")) {
        for line in listing.lines() {
            if let Some((path, value)) = line.split_once(" = ")
                && let Ok(x) = value.parse::<f64>()
            {
                out.insert(path.to_string(), x);
            }
        }
    }
    out
}

/// The fixture builds, and a second build changes nothing.
#[test]
fn the_every_kind_fixture_builds_and_is_stable() {
    let built = build(&one_file(EVERY_KIND)).unwrap_or_else(|e| panic!("{e}"));
    let mut again = one_file(&built.markdown[0].text);
    again.figures = built.figures.iter().map(|f| f.name.clone()).collect();
    assert_eq!(again.figures.len(), 2, "the head's heatmap, as SVG and PNG");
    // The SVG says what it was drawn from; without that it would be drawn again.
    let svg = built.figures.iter().find(|f| f.name.ends_with(".svg")).expect("the SVG");
    let drawn = files::drawn_from(std::str::from_utf8(&svg.bytes).expect("text")).expect("marked");
    again.figure_hashes.insert(svg.name.clone(), drawn.to_string());
    let again = check(&again).expect("valid");
    assert!(again.is_empty(), "{}", stale_report(&again));
}

/// Multi-head examples against the engine's own multi-head path (flash tiles, not the
/// reference the lesson prints) and `W_o` by hand: the heads of `two` each have their keys and
/// values, the four of `gqa` share two, with a causal mask and ALiBi on two heads.
#[test]
fn multi_head_examples_equal_the_engine_s_multi_head_attention() {
    use ndarray::{Array2, Array4, s};
    let values = values_of(&one_file(EVERY_KIND));
    let get = |path: &str| *values.get(&format!("test.{path}")).unwrap_or_else(|| panic!("no {path}"));
    let x = Array2::from_shape_vec((3, 4), vec![1., 0., 1., 0., 0., 1., 0., 1., 1., 1., 0., 0.]).expect("x");
    let m = |rows: &[&[f64]]| Array2::from_shape_vec((rows.len(), rows[0].len()), rows.concat()).expect("m");
    let tokens = ["I", "love", "NLP"];
    // (id, head names, w_q per head, (w_k, w_v) per key/value head, kv head of each head, w_o, causal, alibi slopes)
    type Case<'a> = (
        &'a str,
        Vec<&'a str>,
        Vec<Array2<f64>>,
        Vec<(Array2<f64>, Array2<f64>)>,
        Vec<usize>,
        Array2<f64>,
        bool,
        Vec<f64>,
    );
    let cases: Vec<Case> = vec![
        (
            "two",
            vec!["near", "far"],
            vec![
                m(&[&[1., 0.], &[0., 1.], &[1., 0.], &[0., 1.]]),
                m(&[&[0., 1.], &[1., 0.], &[0., 0.], &[1., 1.]]),
            ],
            vec![
                (
                    m(&[&[1., 0.], &[0., 1.], &[0., 0.], &[1., 1.]]),
                    m(&[&[1., 0.], &[0., 1.], &[1., 1.], &[0., 0.]]),
                ),
                (
                    m(&[&[1., 1.], &[0., 1.], &[1., 0.], &[0., 0.]]),
                    m(&[&[0., 1.], &[1., 0.], &[0., 0.], &[1., 1.]]),
                ),
            ],
            vec![0, 1],
            m(&[&[1., 0.], &[0., 1.], &[1., 1.], &[0.5, -0.5]]),
            false,
            vec![0.0, 0.0],
        ),
        (
            "gqa",
            vec!["1", "2", "3", "4"],
            vec![
                m(&[&[1., 0.], &[0., 1.], &[0., 0.], &[1., 0.]]),
                m(&[&[0., 1.], &[1., 0.], &[1., 0.], &[0., 0.]]),
                m(&[&[1., 1.], &[0., 0.], &[0., 1.], &[1., 0.]]),
                m(&[&[0., 0.], &[1., 1.], &[1., 0.], &[0., 1.]]),
            ],
            vec![
                (m(&[&[1., 0.], &[0., 1.], &[1., 1.], &[0., 0.]]), m(&[&[1.], &[2.], &[0.], &[1.]])),
                (m(&[&[0., 1.], &[1., 0.], &[0., 0.], &[1., 1.]]), m(&[&[0.], &[1.], &[3.], &[1.]])),
            ],
            vec![0, 0, 1, 1],
            m(&[&[1., 0.], &[0., 1.], &[1., 1.], &[1., -1.]]),
            true,
            vec![0.5, 0.25, 0.0, 0.0],
        ),
    ];
    for (id, names, w_q, kv, kv_of, w_o, causal, slopes) in cases {
        let (heads, kv_heads) = (w_q.len(), kv.len());
        let (d_k, d_v) = (w_q[0].ncols(), kv[0].1.ncols());
        let mut q = Array4::zeros((1, heads, 3, d_k));
        for (h, w) in w_q.iter().enumerate() {
            q.slice_mut(s![0, h, .., ..]).assign(&x.dot(w));
        }
        let (mut k, mut v) = (Array4::zeros((1, kv_heads, 3, d_k)), Array4::zeros((1, kv_heads, 3, d_v)));
        for (g, (w_k, w_v)) in kv.iter().enumerate() {
            k.slice_mut(s![0, g, .., ..]).assign(&x.dot(w_k));
            v.slice_mut(s![0, g, .., ..]).assign(&x.dot(w_v));
        }
        let mut options = qkv::AttentionOptions::new();
        if causal {
            options = options.causal(qkv::CausalMask::BottomRight);
        }
        if slopes.iter().any(|&s| s != 0.0) {
            options = options.alibi(qkv::Alibi::new(&slopes));
        }
        let out = qkv::multi_head_attention(q.view(), k.view(), v.view(), &options).expect("engine");
        for (i, token) in tokens.iter().enumerate() {
            let mut concat = Vec::new();
            for (h, name) in names.iter().enumerate() {
                assert_eq!(get(&format!("{id}.heads.{name}.kv_head")), (kv_of[h] + 1) as f64);
                for c in 0..d_v {
                    let ours = get(&format!("{id}.heads.{name}.{token}.output.{}", c + 1));
                    assert!(
                        (ours - out[[0, h, i, c]]).abs() < 1e-12,
                        "{id} head {name} {token}: {ours} vs {}",
                        out[[0, h, i, c]]
                    );
                    concat.push(out[[0, h, i, c]]);
                }
            }
            for c in 0..w_o.ncols() {
                let by_hand: f64 = concat.iter().enumerate().map(|(r, a)| a * w_o[[r, c]]).sum();
                let ours = get(&format!("{id}.output.{token}.{}", c + 1));
                assert!((ours - by_hand).abs() < 1e-12, "{id} {token} output {c}: {ours} vs {by_hand}");
            }
        }
    }
}

/// Every decoding step equals the row of full causal attention over the sequence so far (the
/// engine's reference) and the engine's own `KvCache`, fed the prompt at once and then one token
/// at a time (f32 storage and arithmetic, so within f32 rounding).
#[test]
fn decoding_steps_equal_causal_attention_and_the_engine_s_kv_cache() {
    use ndarray::{Array2, Array3};
    let values = values_of(&one_file(EVERY_KIND));
    let get = |path: &str| *values.get(&format!("test.{path}")).unwrap_or_else(|| panic!("no {path}"));
    let (q, k, v) =
        ([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], [2.0, 6.0, 4.0]);
    let tokens = ["I", "love", "NLP"];
    let m = |rows: &[[f64; 2]]| Array2::from_shape_vec((3, 2), rows.concat()).expect("3 x 2");
    let causal = qkv::AttentionOptions::new().causal(qkv::CausalMask::BottomRight);
    let full = qkv::reference::attention(
        m(&q).view(),
        m(&k).view(),
        Array2::from_shape_vec((3, 1), v.to_vec()).expect("v").view(),
        &causal,
    )
    .expect("reference");
    let shape = qkv::CacheShape::new(1, 1, 3, 2, 1);
    let mut cache = qkv::KvCache::<f32>::new(shape).expect("cache");
    let mut layer = cache.layer(0).expect("layer");
    let as_f32 = |rows: &[[f64; 2]]| rows.iter().flatten().map(|&x| x as f32).collect::<Vec<_>>();
    let prompt = get("gen.prompt") as usize;
    assert_eq!(prompt, 1);
    // The prompt at once (a prefill), then each further token.
    let mut cached = Vec::new();
    for (start, end) in [(0, prompt)].into_iter().chain((prompt..3).map(|t| (t, t + 1))) {
        let n = end - start;
        let kk = Array3::from_shape_vec((1, n, 2), as_f32(&k[start..end])).expect("keys");
        let vv = Array3::from_shape_vec((1, n, 1), v[start..end].iter().map(|&x| x as f32).collect())
            .expect("values");
        layer.append(kk.view(), vv.view()).expect("append");
        let qq = Array3::from_shape_vec((1, n, 2), as_f32(&q[start..end])).expect("queries");
        let out = layer.attend(qq.view()).expect("attend");
        cached.extend((0..n).map(|i| out[[0, i, 0]]));
    }
    for (t, token) in tokens.iter().enumerate() {
        let ours = get(&format!("gen.{token}.output.1"));
        assert!(
            (ours - full.output[[t, 0]]).abs() < 1e-12,
            "{token}: {ours} vs causal {}",
            full.output[[t, 0]]
        );
        assert!((ours - f64::from(cached[t])).abs() < 1e-5, "{token}: {ours} vs the KV cache {}", cached[t]);
        assert_eq!(get(&format!("gen.{token}.cache_length")), (t + 1).max(prompt) as f64);
        for (j, key) in tokens.iter().enumerate().take(t + 1) {
            let w = get(&format!("gen.{token}.weights.{key}"));
            assert!((w - full.weights[[t, j]]).abs() < 1e-12, "{token} on {key}");
        }
    }
}

/// The tiled trace ends where attention over every key at once ends, and so does the merge of
/// its blocks' partial results; each block keeps the online softmax's recurrence.
#[test]
fn the_tiled_trace_equals_attention_and_the_merge_of_its_blocks() {
    let values = values_of(&one_file(EVERY_KIND));
    let get = |path: &str| *values.get(&format!("test.{path}")).unwrap_or_else(|| panic!("no {path}"));
    // Query d = (2, 1) of `four`, by hand over all four keys at once.
    let (w, out) = masked_by_hand(
        &[2.0, 1.0],
        &[[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]],
        &[2.0, 6.0, 4.0, 8.0],
        &[true; 4],
        &[0.0; 4],
    );
    assert!((get("flash.output.1") - out).abs() < 1e-12, "{} vs {out}", get("flash.output.1"));
    assert!((get("flash.merged.output.1") - out).abs() < 1e-12);
    let lse = (get("flash.m") + get("flash.l").ln()) - get("flash.lse");
    assert!(lse.abs() < 1e-12);
    // Block 2 (key d) rescales by exp(m before - m after) and adds its exponential to l.
    let (m1, m2) = (get("flash.blocks.1.m"), get("flash.blocks.2.m"));
    assert!((get("flash.blocks.2.rescale") - (m1 - m2).exp()).abs() < 1e-15);
    let l = get("flash.blocks.2.rescale") * get("flash.blocks.1.l") + get("flash.blocks.2.exp.d");
    assert!((get("flash.blocks.2.l") - l).abs() < 1e-12);
    // The weight of d is its exponential over the final sum.
    assert!((get("flash.blocks.2.exp.d") / get("flash.l") - w[3]).abs() < 1e-12);
    // Each block's first and last key, as positions counted from 1 that prose can cite.
    assert_eq!((get("flash.blocks.1.first"), get("flash.blocks.1.last")), (1.0, 3.0));
    assert_eq!((get("flash.blocks.2.first"), get("flash.blocks.2.last")), (4.0, 4.0));
}

/// The right option of a quiz, as its page key or its forge answer names it, is never listed
/// among the wrong ones ("Not (c): …" beside the key "(c)"): on a page, in print, in markdown.
/// A computed key's right option has feedback of its own (it could be wrong after an input
/// changes), so this is easy to get wrong.
#[test]
fn no_built_page_lists_a_quiz_s_right_option_as_wrong() {
    let built = build(&lesson()).expect("lesson builds");
    let mut checked = 0;
    for page in built.site.iter().filter(|f| f.name.ends_with(".html")) {
        for quiz in page.text.split("<section class=\"quiz").skip(1) {
            let quiz = quiz.split("</section>").next().unwrap_or_default();
            let Some(at) = quiz.find("\"correct\":\"") else { continue };
            let right = &quiz[at + 11..at + 12];
            checked += 1;
            for listed in [format!("data-qkv-feedback-for=\"{right}\""), format!("Not ({right}):")] {
                assert!(
                    !quiz.contains(&listed),
                    "{}: a quiz keyed ({right}) lists {listed}:\n{quiz}",
                    page.name
                );
            }
        }
    }
    for file in &built.markdown {
        for answer in file.text.split("<summary>Answer</summary>").skip(1) {
            let answer = answer.split("</details>").next().unwrap_or_default();
            let Some(right) = answer.trim_start().strip_prefix("**(").and_then(|r| r.get(..1)) else {
                continue;
            };
            checked += 1;
            assert!(
                !answer.contains(&format!("Not ({right}):")),
                "{}: ({right}) listed as wrong:\n{answer}",
                file.path
            );
        }
    }
    assert!(checked > 20, "only {checked} choice quizzes found: the scan reads the wrong shapes");
}

/// The prose about a benchmark cites its data file through the figure's id, so it says what the
/// plot shows: decoding's text gives the f32 growth of its own data (by hand, 56.754 / 0.993 =
/// 57.15, over 32768 / 1024 = 32 times the cache), and a new measurement makes it stale.
#[test]
fn prose_about_measured_numbers_follows_the_data_file() {
    let sources = lesson();
    let decoding = sources.markdown.iter().find(|f| f.path.ends_with("-decoding.md")).expect("decoding");
    for cited in ["[57](=decode-cost.f32.growth:0)", "[32](=decode-cost.x_growth:0)"] {
        assert!(decoding.text.contains(cited), "the decoding text cites {cited}");
    }
    assert!(!decoding.text.contains("roughly doubles"), "a claim its own plot contradicts");
    let mut remeasured = sources.clone();
    let data = remeasured.data.get_mut("data/decode-bench.toml").expect("the data file");
    *data = data.replacen(
        "y = [0.993, 1.443, 3.441, 7.305, 18.598, 56.754]",
        "y = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]",
        1,
    );
    let stale = check(&remeasured).expect("valid");
    let report = stale_report(&stale);
    for path in ["decode-cost.f32.growth", "decode-cost.f32.step_max", "decode-cost.f32.y.6"] {
        assert!(stale.iter().any(|s| s.what == format!("citation {path}")), "{path}:\n{report}");
    }
}

/// The authoring guide's own words, `content/README.md`, as the build has them.
const GUIDE: &str = include_str!("../../../../content/README.md");

/// The fenced block of the guide that starts with `start`, as written there.
fn guide_block(start: &str) -> String {
    let at = GUIDE.find(start).unwrap_or_else(|| panic!("the guide has no block starting {start:?}"));
    let end = GUIDE[at + 3..].find("```").expect("a closed block") + at + 6;
    GUIDE[at..end].to_string()
}

/// What the guide promises of multi-head cross-attention, the tiled paths and formats holds: its
/// cross-attention head builds on two named matrices, with the output worked by hand; a
/// multi-head block does not take `x_q`; its tiled example's first tile is keys 1 to 2, cited as
/// the guide cites them; `:0` rounds 0.25 to "0", decimals stop at 12.
#[test]
fn the_guide_s_recipes_build_and_say_what_the_build_does() {
    let matrices = "```qkv matrix\nid = \"dec\"\nlabels = [\"le\", \"chat\"]\nrows = [[1, 0], [0, 1]]\n```\n\n```qkv matrix\nid = \"enc\"\nlabels = [\"the\", \"cat\", \"sat\"]\nrows = [[1, 0, 0], [0, 1, 0], [0, 0, 1]]\n```\n";
    let head = guide_block("```qkv attention\nid = \"cross_1\"");
    let lesson = format!("# Cross\n\n{matrices}\n{head}\n\nIt gives [?](=cross_1.chat.output:4).\n");
    let values = values_of(&one_file(&lesson));
    // By hand: q_chat = (0, 1); keys (1, 0), (0, 1), (1, 1); values 1, 2, 3; scale 1/√2.
    let e = [0.0f64, 1.0, 1.0].map(|s| (s / 2f64.sqrt()).exp());
    let by_hand = (e[0] + 2.0 * e[1] + 3.0 * e[2]) / e.iter().sum::<f64>();
    assert!((values["test.cross_1.chat.output.1"] - by_hand).abs() < 1e-12);
    let mixed = "# Mixed\n\n```qkv multi-head\nid = \"m\"\ntokens = [\"a\", \"b\"]\nx_q = [[1, 0], [0, 1]]\nx = [[1, 0], [0, 1]]\nw_o = [[1]]\n\n[[heads]]\nw_q = [[1, 0], [0, 1]]\nw_k = [[1, 0], [0, 1]]\nw_v = [[1], [2]]\n```\n";
    let report = check(&one_file(mixed)).map(|_| ()).expect_err("x_q in a multi-head block");
    assert!(report.to_string().contains("x_q"), "{report}");

    let sentence = guide_block("```qkv attention\nid = \"sentence\"");
    let tiled = guide_block("```qkv tiled\nid = \"flash\"");
    let prose = "The first tile holds keys [?](=flash.blocks.1.first:0) to [?](=flash.blocks.1.last:0).";
    assert!(GUIDE.replace('\n', " ").contains("[1](=flash.blocks.1.first:0) to [2](=flash.blocks.1.last:0)"));
    let built = build(&one_file(&format!("# Tiles\n\n{sentence}\n\n{tiled}\n\n{prose}\n"))).expect("builds");
    assert!(
        built.markdown[0].text.contains("keys [1](=flash.blocks.1.first:0) to [2](=flash.blocks.1.last:0)")
    );

    assert!(GUIDE.contains("`:0` writes 0.25 as `0`"));
    let whole = crate::format::Format::parse("0").expect(":0");
    assert_eq!([0.25, 0.75, 0.5, 1.5].map(|x| whole.apply(x)), ["0", "1", "0", "2"]);
    assert!(GUIDE.contains("`:0` to `:12`"));
    assert!(crate::format::Format::parse("12").is_some() && crate::format::Format::parse("13").is_none());
}

/// A temperature `T` multiplies the scores by `1/(T·√d_k)`, for the width of the example's own
/// keys (an example made `from` it with wider keys keeps `T`, not the number); a `scale` given
/// later replaces it; every example's record cites the temperature its scale amounts to.
#[test]
fn a_temperature_scales_the_scores_by_one_over_t_root_d_k() {
    let lesson = r#"# T

```qkv attention
id = "warm"
tokens = ["I", "love", "NLP"]
queries = [[1, 0], [0, 1], [1, 1]]
keys = [[1, 0], [0, 1], [1, 1]]
values = [[2], [6], [4]]
temperature = 2
```

```qkv attention
id = "wide"
from = "warm"
queries = [[1, 0, 1], [0, 1, 0], [1, 1, 1]]
keys = [[1, 0, 1], [0, 1, 0], [1, 1, 1]]
```

```qkv attention
id = "plain"
from = "warm"
scale = 1
```

At [?](=warm.temperature:1) "love" weighs itself [?](=warm.love.weights.love:4) with output [?](=warm.love.output:4); [?](=wide.love.weights.love:4) three wide at [?](=wide.temperature:1); scale [?](=plain.scale:1) is a temperature of [?](=plain.temperature:4).
"#;
    let built = build(&one_file(lesson)).unwrap_or_else(|e| panic!("{e}"));
    let text = &built.markdown[0].text;
    let (k2, v): ([&[f64]; 3], [&[f64]; 3]) =
        ([&[1.0, 0.0], &[0.0, 1.0], &[1.0, 1.0]], [&[2.0], &[6.0], &[4.0]]);
    let (warm, warm_out) = by_hand_scaled(&[0.0, 1.0], &k2, &v, 1.0 / (2.0 * 2f64.sqrt()));
    let k3: [&[f64]; 3] = [&[1.0, 0.0, 1.0], &[0.0, 1.0, 0.0], &[1.0, 1.0, 1.0]];
    let (wide, _) = by_hand_scaled(&[0.0, 1.0, 0.0], &k3, &v, 1.0 / (2.0 * 3f64.sqrt()));
    // At the default scale the weight would differ: the test tells the two apart.
    let (default, _) = by_hand(&[0.0, 1.0], &k2, &v);
    assert!((default[1] - warm[1]).abs() > 1e-3);
    let cited = format!(
        "At [2.0](=warm.temperature:1) \"love\" weighs itself [{:.4}](=warm.love.weights.love:4) with output [{:.4}](=warm.love.output:4); [{:.4}](=wide.love.weights.love:4) three wide at [2.0](=wide.temperature:1); scale [1.0](=plain.scale:1) is a temperature of [{:.4}](=plain.temperature:4).",
        warm[1],
        warm_out[0],
        wide[1],
        1.0 / 2f64.sqrt(),
    );
    assert!(text.contains(&cited), "{cited}\n{text}");
}
