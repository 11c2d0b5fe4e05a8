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
