use super::*;
use crate::files::SourceFile;
use crate::region::testing::one_section;

fn page_for(markdown: &str) -> String {
    one_section("odd", markdown).1
}

#[test]
fn tokens_and_titles_are_escaped() {
    let page = page_for(concat!(
        "# Tags & things\n\n",
        "```qkv attention\nid = \"odd\"\ntokens = [\"<b>\", \"a&b\"]\n",
        "queries = [[1, 0], [0, 1]]\nkeys = [[1, 0], [0, 1]]\nvalues = [[1], [2]]\n```\n\n",
        "Output [?](=odd.<b>.output:2).\n\n<!-- qkv table odd weights -->\n<!-- /qkv -->\n\n",
        "<!-- qkv steps odd.a&b -->\n<!-- /qkv -->\n",
    ));
    assert!(!page.contains("<b>"), "raw tag leaked: {page}");
    assert!(page.contains("<title>1. Tags &amp; things · qkv</title>"), "{page}");
    assert!(page.contains("&lt;b&gt;"), "{page}");
}

#[test]
fn math_becomes_mathml_and_citations_become_spans() {
    let page = page_for(concat!(
        "# M\n\n```qkv dot\nid = \"d\"\nq = [1, 2]\nk = [2, 1]\n```\n\n",
        "The score $s = q \\cdot k$ is [?](=d.dot:0).\n",
    ));
    assert!(page.contains("<math"), "{page}");
    assert!(page.contains("<span class=\"num\" title=\"d.dot\">4</span>"), "{page}");
    assert!(!page.contains("qkv dot"), "declarations are data, not prose: {page}");
}

/// Each table's scrolling region is named apart, for a screen reader's list of regions: by its
/// bold title where the table has one, else by its heading and its place under it.
#[test]
fn every_table_region_has_a_name_of_its_own() {
    let page = page_for(concat!(
        "# Tables\n\n| a |\n|--|\n| 1 |\n\n## Two here\n\n| b |\n|--|\n| 2 |\n\n| c |\n|--|\n| 3 |\n\n",
        "**$W_q$, the weights**\n\n| d |\n|--|\n| 4 |\n\nSome **bold** text.\n\n| e |\n|--|\n| 5 |\n\n",
        "**$W_q$, the weights**\n\n| f |\n|--|\n| 6 |\n",
    ));
    let names: Vec<&str> = page
        .split("role=\"region\" aria-label=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "Tables, table 1",
            "Two here, table 1",
            "Two here, table 2",
            "W_q, the weights",
            "Two here, table 4",
            "W_q, the weights (Two here, table 5)",
        ]
    );
}

/// A line never starts with the punctuation after a formula, nor ends with the bracket before it.
#[test]
fn punctuation_stays_with_its_formula() {
    // `M` stands for a formula in both texts.
    let math = "<math display=\"inline\"><mi>x</mi></math>";
    let html = "<p>Divide by M: M and (M), then “M”. M M</p>".replace('M', math);
    let expected = "<p>Divide by <span class=\"nobr\">M:</span> M and <span class=\"nobr\">(M),</span> then <span class=\"nobr\">“M”.</span> M M</p>"
        .replace('M', math);
    assert_eq!(punctuation_with_math(&html), expected);
    assert_eq!(punctuation_with_math("no math: (here)."), "no math: (here).");
    let page = page_for("# P\n\nThe weight is $a \\approx 0.269$) and $b$, which.\n");
    assert!(page.contains("<span class=\"nobr\"><math"), "{page}");
    assert!(page.contains("</math>)</span> and"), "{page}");
    assert!(page.contains("</math>,</span> which"), "{page}");
}

#[test]
fn the_page_script_is_small_classic_and_offline() {
    let script = script();
    // 60 KB, not the lesson's 40: six sections bring four widgets, search and course progress.
    assert!(script.len() < 60 * 1024, "qkv.js is {} bytes; the budget is 60 KB", script.len());
    // A classic script: module syntax would not load from file://.
    for module_syntax in ["\nimport ", "\nexport ", "import(", "type=\"module\""] {
        assert!(!script.contains(module_syntax), "qkv.js uses `{module_syntax}`");
    }
    for network in
        ["fetch(", "XMLHttpRequest", "WebSocket", "sendBeacon", "EventSource", "http://", "https://"]
    {
        assert!(!script.contains(network), "qkv.js may not reach the network (`{network}`)");
    }
    let page = page_for("# Plain\n\nText.\n");
    assert!(page.contains("<script src=\"qkv.js\" defer></script>"), "{page}");
    // The script goes out without indentation (`script`): no line of code may hold text that
    // would change with it, a template literal or a string continued on the next line.
    for line in SCRIPT_PARTS.iter().flat_map(|part| part.lines()).map(str::trim_start) {
        let comment = ["*", "/*", "//"].iter().any(|start| line.starts_with(start));
        assert!(comment || !line.contains('`'), "a template literal in qkv.js: {line}");
        assert!(!line.ends_with('\\'), "a string continued on the next line in qkv.js: {line}");
    }
}

/// A two-section course: each file's text, in order; the built site's files by name.
fn course(files: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    built_course(files).unwrap_or_else(|e| panic!("{e}"))
}

/// A course of `files` (name, text), built as `content/0N-NAME.md`: its site's files by name, or
/// the error report.
pub(super) fn built_course(
    files: &[(&str, &str)],
) -> Result<std::collections::HashMap<String, String>, String> {
    let sources = crate::files::Sources {
        markdown: files
            .iter()
            .enumerate()
            .map(|(i, (name, text))| SourceFile {
                path: format!("content/0{}-{name}.md", i + 1),
                text: text.to_string(),
            })
            .collect(),
        ..Default::default()
    };
    let built = crate::pipeline::build(&sources).map_err(|e| e.to_string())?;
    Ok(built.site.into_iter().map(|f| (f.name, f.text)).collect())
}

/// A graded numeric check on a dot product, and a practice one.
const CHECKS: &str = concat!(
    "```qkv dot\nid = \"d\"\nq = [1, 2]\nk = [2, 1]\n```\n\n",
    "```qkv quiz\nid = \"dot\"\nkind = \"numeric\"\nquestion = \"The dot product?\"\nwhy = \"Add.\"\nanswer = \"d.dot\"\ndigits = 0\n```\n\n",
    "<!-- qkv quiz dot -->\n<!-- /qkv -->\n\n",
    "```qkv quiz\nid = \"again\"\nkind = \"numeric\"\npractice = true\nquestion = \"Again?\"\nwhy = \"Add.\"\nanswer = \"d.dot\"\ndigits = 0\n```\n\n",
    "<!-- qkv quiz again -->\n<!-- /qkv -->\n",
);

fn two_sections() -> std::collections::HashMap<String, String> {
    course(&[
        (
            "first",
            &format!(
                "# First things\n\n```qkv settings\nsummary = \"Where it starts & why.\"\n```\n\nIntro.\n\n## Dots and more\n\nThe dot product multiplies.\n\n{CHECKS}"
            ),
        ),
        ("second", "# Second things\n\n## Summary\n\nNo checks here, and no summary field.\n"),
    ])
}

#[test]
fn the_contents_page_has_the_course_title_numbers_summaries_and_check_counts() {
    let site = two_sections();
    let index = &site["index.html"];
    assert!(index.contains(&format!("<h1>{}</h1>", site::COURSE_TITLE)), "{index}");
    assert!(!index.contains("<h1>First things</h1>"), "the index repeats the first title: {index}");
    assert!(index.contains("<span class=\"section-number\">1.</span> First things</a>"), "{index}");
    assert!(index.contains("<span class=\"section-number\">2.</span> Second things</a>"), "{index}");
    assert!(index.contains("<p class=\"toc-summary\">Where it starts &amp; why.</p>"), "{index}");
    // Only graded checks count: the practice problem does not.
    assert!(index.contains("data-qkv-toc=\"first\" data-qkv-total=\"1\""), "{index}");
    assert!(index.contains("data-qkv-toc=\"second\" data-qkv-total=\"0\""), "{index}");
    assert!(index.contains("data-qkv-course-total"), "{index}");
    assert!(index.contains("\"checks\":[\"dot\"]"), "the course's checks for the script: {index}");
    assert!(index.contains("<a href=\"print.html\">"), "{index}");
    assert!(
        index.contains("<script src=\"qkv.js\" defer></script>"),
        "it shows progress, so it loads the script"
    );
}

#[test]
fn sections_are_numbered_in_titles_navigation_and_pager() {
    let site = two_sections();
    let first = &site["first.html"];
    let second = &site["second.html"];
    assert!(first.contains("<title>1. First things · qkv</title>"), "{first}");
    assert!(first.contains("<h1><span class=\"section-number\">1.</span> First things</h1>"), "{first}");
    assert!(first.contains("<a href=\"first.html\" aria-current=\"page\">1. First things</a>"), "{first}");
    assert!(first.contains("<a href=\"second.html\">2. Second things</a>"), "{first}");
    assert!(first.contains("rel=\"next\" href=\"second.html\""), "{first}");
    assert!(!first.contains("rel=\"prev\""), "{first}");
    assert!(second.contains("rel=\"prev\" href=\"first.html\""), "{second}");
    assert!(second.contains("← 1. First things</a>"), "{second}");
}

#[test]
fn a_section_with_checks_ends_with_their_summary_and_has_the_sticky_bar() {
    let site = two_sections();
    let first = &site["first.html"];
    assert!(first.contains("data-qkv-course-progress data-qkv-section=\"first\""), "{first}");
    assert!(
        first.contains("<li data-qkv-summary-check=\"dot\"><a href=\"#quiz-dot\">Check 1</a>"),
        "{first}"
    );
    assert!(
        !first.contains("data-qkv-summary-check=\"again\""),
        "a practice problem in the summary: {first}"
    );
    assert!(first.find("data-qkv-summary").unwrap() > first.find("id=\"quiz-again\"").unwrap(), "{first}");
    let second = &site["second.html"];
    assert!(!second.contains("data-qkv-summary "), "a section without checks has no summary: {second}");
    // Its bar counts the course, not a section of its own.
    assert!(second.contains("data-qkv-course-progress data-qkv-answered"), "{second}");
}

#[test]
fn the_footer_is_about_the_course_not_the_build_tool() {
    let site = two_sections();
    let first = &site["first.html"];
    let footer = &first[first.find("<footer>").expect("a footer")..];
    assert!(footer.contains("<a href=\"markdown/01-first.md\">01-first.md</a>"), "{footer}");
    assert!(footer.contains("qkv attention engine"), "{footer}");
    assert!(!footer.contains("xtask"), "{footer}");
}

#[test]
fn the_search_index_is_a_classic_script_with_every_heading() {
    let site = two_sections();
    let index = &site["search-index.js"];
    let json = index
        .split_once("window.QKV_SEARCH = ")
        .and_then(|(_, rest)| rest.trim_end().strip_suffix(';'))
        .unwrap_or_else(|| panic!("not one global: {index}"));
    let data: serde_json::Value = serde_json::from_str(json).expect("JSON");
    assert_eq!(
        data["sections"],
        serde_json::json!([["first.html", "1. First things"], ["second.html", "2. Second things"]])
    );
    let entries = data["entries"].as_array().expect("entries");
    let dots = entries.iter().find(|e| e[2] == "Dots and more").expect("the heading");
    assert_eq!(dots[0], 0);
    assert_eq!(dots[1], "dots-and-more");
    assert!(dots[4].as_str().unwrap().split(' ').any(|w| w == "multiplies"), "{dots}");
    assert!(entries.iter().any(|e| e[0] == 1 && e[1] == "summary"), "{entries:?}");
    // The section's title is an entry too, for the top of the page.
    assert!(entries.iter().any(|e| e[0] == 1 && e[1] == "" && e[2] == "Second things"), "{entries:?}");
    for network in ["fetch(", "import ", "http"] {
        assert!(!index.contains(network), "{network}");
    }
}

#[test]
fn the_print_view_has_every_section_no_script_and_no_repeated_id() {
    let site = two_sections();
    let print = &site["print.html"];
    assert!(!print.contains("<script src"), "the print view loads a script");
    assert!(!print.contains("data-qkv-search"), "a search box that needs the script");
    let first = print.find("<section class=\"print-section\" id=\"first\">").expect("the first section");
    let second = print.find("<section class=\"print-section\" id=\"second\">").expect("the second section");
    assert!(first < second);
    assert!(print.contains("id=\"first--quiz-dot\""), "{print}");
    assert!(print.contains("<h2 id=\"second--summary\">"), "{print}");
    let ids: Vec<&str> = print
        .match_indices(" id=\"")
        .map(|(i, _)| &print[i + 5..][..print[i + 5..].find('"').unwrap()])
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(ids.len(), unique.len(), "repeated ids: {ids:?}");
    assert_eq!(
        print::prefixed_ids("<a data-qkv-grid=\"x\" href=\"#y\">", "s"),
        "<a data-qkv-grid=\"x\" href=\"#s--y\">"
    );
}

#[test]
fn numeric_keys_carry_a_near_miss_band_wider_than_the_tolerance() {
    let key = |extra: &str| {
        let page = page_for(&format!(
            "# N\n\n```qkv dot\nid = \"d\"\nq = [1, 2]\nk = [2, 1.23456]\n```\n\n```qkv quiz\nid = \"n\"\nkind = \"numeric\"\nquestion = \"?\"\nwhy = \"!\"\nanswer = \"d.scaled\"\ndigits = 3\n{extra}```\n\n<!-- qkv quiz n -->\n<!-- /qkv -->\n"
        ));
        let at = page.find("data-qkv-key>").expect("a key") + "data-qkv-key>".len();
        let json = &page[at..at + page[at..].find("</script>").unwrap()];
        serde_json::from_str::<serde_json::Value>(json).expect("JSON")
    };
    // d.scaled = (2 + 2·1.23456) / √2 ≈ 3.1600: 0.5% of it beats two units of 0.001.
    let value = (2.0 + 2.0 * 1.23456) / 2f64.sqrt();
    let default = key("");
    assert!((default["near"].as_f64().unwrap() - 0.005 * value).abs() < 1e-12, "{default}");
    assert_eq!(key("near_miss = 0.01\n")["near"], 0.01);
    // A band no wider than the tolerance is none.
    assert_eq!(key("near_miss = 0.0004\n")["near"], 0.0);
    assert_eq!(key("tolerance = 0.1\n")["near"], 0.0);
}
