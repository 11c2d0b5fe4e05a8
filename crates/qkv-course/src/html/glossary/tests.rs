use crate::html::tests::built_course as course;

fn term(id: &str, term: &str, forms: &str, definition: &str) -> String {
    format!(
        "```qkv term\nid = \"{id}\"\nterm = \"{term}\"\nforms = {forms}\ndefinition = \"{definition}\"\n```\n"
    )
}

const FIRST: &str = "# Queries\n\n## Why a query\n\nEach token brings a `query`, and [a query link](https://example.org) too. The queries meet the keys: every query scores every key.\n\n| query | key |\n|---|---|\n| 1 | 2 |\n";

fn first() -> String {
    format!(
        "{FIRST}\n{}\n{}```qkv term\nid = \"d_k\"\nterm = \"key width\"\nsymbol = \"d_k\"\ndefinition = \"How many numbers a key holds, $d_k$.\"\n```\n\nA key width fixes the scale.\n",
        term("query", "query", "[\"query\", \"queries\"]", "The vector a token asks with."),
        term("key", "key", "[\"key\", \"keys\"]", "The vector a query is compared with."),
    )
}

const SECOND: &str = "# Masks\n\nA mask hides some keys from each query.\n";

#[test]
fn the_glossary_lists_every_term_in_order_with_where_it_is_introduced() {
    let site = course(&[("queries", &first()), ("masks", SECOND)]).expect("builds");
    let glossary = &site["glossary.html"];
    let at = |needle: &str| glossary.find(needle).unwrap_or_else(|| panic!("no {needle}: {glossary}"));
    // Alphabetical, letter case aside: key, key width, query.
    assert!(at("id=\"term-key\"") < at("id=\"term-d_k\"") && at("id=\"term-d_k\"") < at("id=\"term-query\""));
    assert!(glossary.contains("<dd>The vector a token asks with. <span class=\"glossary-where\">Introduced in <a href=\"queries.html#term-use-query\">1. Queries</a>.</span></dd>"), "{glossary}");
    assert!(glossary.contains("key width <span class=\"symbol\"><math"), "the symbol as math: {glossary}");
    for page in ["queries.html", "masks.html", "index.html", "glossary.html"] {
        assert!(site[page].contains("<a href=\"glossary.html\""), "{page} links the glossary");
    }
}

#[test]
fn each_page_links_the_first_prose_use_of_each_term_once() {
    let site = course(&[("queries", &first()), ("masks", SECOND)]).expect("builds");
    let page = &site["queries.html"];
    // Not in the heading, the code span, the link or the table: the first prose use of `query`
    // is "queries", in "The queries meet the keys".
    let links: Vec<&str> = page.match_indices("class=\"term\"").map(|(at, _)| &page[at..at + 120]).collect();
    assert_eq!(links.len(), 3, "query, key, key width once each: {links:#?}");
    assert!(page.contains("The <a class=\"term\" href=\"glossary.html#term-query\" id=\"term-use-query\">queries</a> meet the <a class=\"term\" href=\"glossary.html#term-key\" id=\"term-use-key\">keys</a>"), "{page}");
    assert!(
        page.contains("<a class=\"term\" href=\"glossary.html#term-d_k\" id=\"term-use-d_k\">key width</a>"),
        "the longer term wins over `key`: {page}"
    );
    assert!(page.contains("<h2 id=\"why-a-query\">Why a query</h2>"), "headings stay plain: {page}");
    // Another page links its own first uses, without the anchor that belongs to the declaring page.
    let masks = &site["masks.html"];
    assert!(masks.contains("hides some <a class=\"term\" href=\"glossary.html#term-key\">keys</a> from each <a class=\"term\" href=\"glossary.html#term-query\">query</a>"), "{masks}");
}

#[test]
fn a_term_without_a_use_or_declared_twice_is_an_error() {
    let unused = format!("# Q\n\nNothing here.\n\n{}", term("query", "query", "[\"query\"]", "Asks."));
    let report = course(&[("q", &unused)]).expect_err("an unused term");
    assert!(
        report.contains("content/01-q.md:6:7:") && report.contains("term `query` is not used in the prose"),
        "{report}"
    );
    let twice = format!("# R\n\nA query again.\n\n{}", term("query2", "Query", "[\"query\"]", "Asks."));
    let report = course(&[("queries", &first()), ("again", &twice)]).expect_err("a term declared twice");
    assert!(
        report.contains("content/02-again.md:") && report.contains("the glossary already has term `Query`"),
        "{report}"
    );
}

#[test]
fn no_site_without_terms_has_a_glossary() {
    let site = course(&[("masks", SECOND)]).expect("builds");
    assert!(!site.contains_key("glossary.html"));
    assert!(!site["masks.html"].contains("glossary.html"));
}
