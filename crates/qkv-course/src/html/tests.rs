use super::*;
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
    assert!(page.contains("<title>Tags &amp; things · qkv</title>"), "{page}");
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
}
