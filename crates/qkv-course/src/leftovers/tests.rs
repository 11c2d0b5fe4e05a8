use super::*;

fn check(name: &str, text: &str, leftovers: usize) {
    let found = leftover_citations([(name, text)]);
    assert_eq!(found.len(), leftovers, "{name}: {found:#?}");
}

#[test]
fn pages_with_citation_syntax_are_caught() {
    check("a.html", "<p>The output is <span class=\"num\" title=\"s.love.output\">4.41</span>.</p>", 0);
    check("a.html", "<p>The output is [4.41](=s.love.output:2).</p>", 1);
    check("a.html", "<p>d = {=s.d_k:0}</p>", 1);
    check("a.html", "<p>$ {3}\\vphantom{\\verb|=s.d_k:0|} $</p>", 1);
    // A stray marker rendered as math shows its path as text.
    check("a.html", "<math><mtext>=s.d_k:0</mtext></math>", 1);
    // Code shows the syntax itself; scripts hold data.
    check("a.html", "<pre><code>[4.41](=s.love.output:2)</code></pre><script>{=a.b:2}</script>", 0);
    check("nb.ipynb", "{\"source\": [\"{=s.d_k:0}\"]}", 1);
}

#[test]
fn a_lesson_file_holds_only_the_citations_it_reads() {
    check(
        "01-a.md",
        "# A\n\nThe output is [4.41](=s.love.output:2), $d = {3}\\vphantom{\\verb|=s.d_k:0|}$.\n",
        0,
    );
    check("01-a.md", "# A\n\nShown as `[4.41](=s.love.output:2)`:\n\n```\n{=s.d_k:0}\n```\n", 0);
    // The parser rejects the near miss, so it reads no citation at all: counted apart.
    check("01-a.md", "# A\n\nThe width is {=s.d_k:0}.\n", 1);
}

#[test]
fn a_fence_opened_in_a_block_quote_ends_with_the_quote() {
    // The fuzzer's case (seed 1796289054, case 247): a quoted fence line with no closing fence;
    // CommonMark closes the code with the quote, so the citation below it is read and counted.
    let text = "# A\n\nSome text\n> ```python\nmore text, $d = {3}\\vphantom{\\verb|=s.d_k:0|}$.\n";
    check("01-a.md", text, 0);
    // Inside the quote, the fence still hides what it holds.
    check("01-a.md", "# A\n\n> ```\n> {=s.d_k:0}\n> ```\n", 0);
}
