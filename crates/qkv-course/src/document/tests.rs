use super::*;

fn check(text: &str, citations: &[&str], regions: &[&str]) {
    let doc = parse(0, text).unwrap_or_else(|p| panic!("parse failed: {p:?}"));
    let found: Vec<&str> = doc.citations.iter().map(|c| &text[c.text.clone()]).collect();
    assert_eq!(found, citations);
    let bodies: Vec<&str> = doc.regions.iter().map(|r| &text[r.body.clone()]).collect();
    assert_eq!(bodies, regions);
}

#[test]
fn citations_and_regions_are_found_by_byte_range() {
    check(
        "# T\n\nThe output is [4.41](=sentence.love.output:2).\n\n<!-- qkv steps sentence.love -->\n\nold\n\n<!-- /qkv -->\n",
        &["4.41"],
        &["\nold\n\n"],
    );
}

#[test]
fn markers_inside_code_blocks_are_not_live() {
    check("```markdown\n<!-- qkv steps x -->\n[1](=x.y:2)\n```\n", &[], &[]);
}

#[test]
fn an_unclosed_region_is_an_error() {
    let problems = parse(0, "<!-- qkv steps x -->\n\ntext\n").unwrap_err();
    assert_eq!(problems[0].message, "generated region is never closed");
}

#[test]
fn a_citation_needs_a_format() {
    let problems = parse(0, "see [4.41](=sentence.love.output)\n").unwrap_err();
    assert_eq!(problems[0].message, "citation has no format");
}

#[test]
fn citations_inside_math_are_found_by_byte_range() {
    check(
        "$d_k = {3}\\vphantom{\\verb|=ex.d_k:0|}$ and\n\n$$\ns \\approx {0.7071}\\vphantom{\\verb!=ex.love.scores.love:4!}\n$$\n",
        &["3", "0.7071"],
        &[],
    );
    let doc = parse(0, "$x = {?}\\vphantom{\\verb|=a.b_c.d:1%|}$\n").expect("parses");
    assert_eq!((doc.citations[0].path.as_str(), doc.citations[0].math), ("a.b_c.d", true));
    assert!(doc.citations[0].format.percent);
}

#[test]
fn malformed_math_citations_say_what_is_wrong() {
    for (tex, message) in [
        (
            "$3\\vphantom{\\verb|=a.b:0|}$",
            "a math citation needs its number in braces right before the marker",
        ),
        ("${3}\\vphantom{\\verb|=a.b:0}$", "the `\\verb` is not closed"),
        ("${3}\\vphantom{\\verb|a.b:0|}$", "the cited path must start with `=`"),
        ("${3}\\vphantom{\\verb|=a.b|}$", "citation has no format"),
        (
            "${3}\\vphantom{\\verb|=a.b:0| }$",
            "`\\vphantom{\\verb|…|}` needs its `}` right after the closing delimiter",
        ),
    ] {
        let problems = parse(0, tex).expect_err(tex);
        assert_eq!(problems[0].message, message, "{tex}");
    }
}

/// A marker cut short (a file that ends inside it) or a stray `\vphantom` is an error at its
/// place, once, not text that the page would show: the fuzzer's cases 212 and 331 of seed
/// 1796196341 left `$({6.0111}\vphantom{` on a page.
#[test]
fn a_marker_cut_short_is_an_error_where_it_stands() {
    let outside = "a math citation outside math, which would be shown as typed";
    let unread = "a math citation marker that is not read: it must be written exactly as `\\vphantom{\\verb|=…|}`, right after the number in braces";
    for (text, message, at) in [
        ("For love the row is $({6.0111}\\vphantom{", outside, 30),
        ("For love the row is $({6.0111}\\vphantom{\\verb", outside, 30),
        ("$x \\vphantom{y}$ and more", unread, 3),
        ("${3}\\vphantom{\\verb x}$", "`\\verb` needs a delimiter such as `|` right after it", 4),
    ] {
        let problems = parse(0, text).expect_err(text);
        assert_eq!(problems.len(), 1, "one problem for {text}: {problems:?}");
        assert_eq!((problems[0].message.as_str(), problems[0].at), (message, at), "{text}");
    }
}

/// A math citation's mistakes are quoted as the marker has them, not as a link would.
#[test]
fn a_math_citation_without_a_format_is_quoted_as_written() {
    let problems = parse(0, "${3}\\vphantom{\\verb|=a.b|}$").expect_err("no format");
    assert_eq!(problems[0].found, "=a.b");
    assert_eq!(problems[0].expected, "`\\verb|=a.b:DECIMALS|`, e.g. `\\verb|=a.b:2|` for two decimals");
    let link = parse(0, "[3](=a.b)").expect_err("no format");
    assert_eq!(
        (link[0].found.as_str(), link[0].expected.as_str()),
        ("(=a.b)", "`(=a.b:DECIMALS)`, e.g. `(=a.b:2)` for two decimals")
    );
}

#[test]
fn the_site_renders_math_without_the_markers() {
    assert_eq!(
        without_math_citations(
            r"s \approx ({0.7071}\vphantom{\verb|=e.love.scores.love:4|}, {1}\vphantom{\verb!=e.x:0!})"
        ),
        r"s \approx ({0.7071}, {1})"
    );
}

#[test]
fn a_qkv_block_shown_inside_a_longer_fence_is_documentation() {
    check("````markdown\n```qkv attention\nid = \"x\"\n```\n````\n\nText.\n", &[], &[]);
    let doc = parse(0, "> ```python\n> print(1)\n> ```\n").expect("a closed fence in a quote");
    assert!(doc.blocks.is_empty());
}
