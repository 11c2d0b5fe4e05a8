use crate::pipeline::{SourceFile, Sources, build};

const EXAMPLE: &str = r#"# Lab

```qkv attention
id = "sentence"
tokens = ["I", "love", "NLP"]
queries = [[1, 0], [0, 1], [1, 1]]
keys = [[1, 0], [0, 1], [1, 1]]
values = [[2], [6], [4]]
```

<!-- qkv lab sentence.love rounded=2 -->
<!-- /qkv -->
"#;

/// The updated markdown and the page of a one-section lesson.
fn built(text: &str) -> (String, String) {
    let sources = Sources {
        markdown: vec![SourceFile { path: "content/01-lab.md".into(), text: text.into() }],
        figures: Default::default(),
    };
    let build = build(&sources).unwrap_or_else(|e| panic!("{e}"));
    let page = build.site.iter().find(|f| f.name == "lab.html").expect("page").text.clone();
    (build.markdown[0].text.clone(), page)
}

#[test]
fn the_printout_has_the_output_as_the_prose_rounds_it() {
    let (markdown, _) = built(EXAMPLE);
    assert!(markdown.contains("output:  4.4067 (the lesson rounds it to 4.41)\n"), "{markdown}");
    assert!(markdown.contains("f\"(the lesson rounds it to {show(output, 2)})\""), "{markdown}");
}

#[test]
fn the_notebook_link_downloads_and_carries_the_notebook_for_file_pages() {
    let (markdown, page) = built(EXAMPLE);
    assert!(
        page.contains("<a href=\"notebooks/lab-sentence-love.ipynb\" download=\"lab-sentence-love.ipynb\" data-qkv-notebook>"),
        "{page}"
    );
    let embedded = page.split("data-qkv-notebook-text>").nth(1).and_then(|s| s.split("</script>").next());
    let embedded: serde_json::Value =
        serde_json::from_str(embedded.expect("embedded notebook")).expect("JSON");
    let notebook: serde_json::Value =
        serde_json::from_str(embedded["text"].as_str().expect("text")).expect("ipynb");
    assert_eq!(notebook["nbformat"], 4);
    assert!(!markdown.contains("Colab") && !page.contains("Colab"), "no Colab link unless configured");
}

#[test]
fn a_configured_repository_adds_an_open_in_colab_link() {
    let text = EXAMPLE.replacen(
        "<!-- qkv lab",
        "```qkv settings\nnotebook_repository = \"https://github.com/owner/course/tree/main/site\"\n```\n\n<!-- qkv lab",
        1,
    );
    let (markdown, page) = built(&text);
    let colab = "https://colab.research.google.com/github/owner/course/blob/main/site/notebooks/lab-sentence-love.ipynb";
    assert!(markdown.contains(&format!("[Open in Colab]({colab})")), "{markdown}");
    assert!(page.contains(&format!("<a href=\"{colab}\" rel=\"noopener\">Open in Colab</a>")), "{page}");
}
