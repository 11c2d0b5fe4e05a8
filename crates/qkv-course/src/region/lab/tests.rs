use crate::region::testing::{SENTENCE, one_section};

const LAB: &str = "<!-- qkv lab sentence.love rounded=2 -->\n<!-- /qkv -->\n";

/// The updated markdown and the page of a lesson with `settings` before its lab.
fn built(settings: &str) -> (String, String) {
    one_section("lab", &format!("# Lab\n\n{SENTENCE}\n{settings}{LAB}"))
}

#[test]
fn the_printout_has_the_output_as_the_prose_rounds_it() {
    let (markdown, _) = built("");
    assert!(markdown.contains("output:  4.4067 (the lesson rounds it to 4.41)\n"), "{markdown}");
    assert!(markdown.contains("f\"(the lesson rounds it to {show(output, 2)})\""), "{markdown}");
}

#[test]
fn the_notebook_link_downloads_and_carries_the_notebook_for_file_pages() {
    let (markdown, page) = built("");
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
    let (markdown, page) = built(
        "```qkv settings\nnotebook_repository = \"https://github.com/owner/course/tree/main/site\"\n```\n\n",
    );
    let colab = "https://colab.research.google.com/github/owner/course/blob/main/site/notebooks/lab-sentence-love.ipynb";
    assert!(markdown.contains(&format!("[Open in Colab]({colab})")), "{markdown}");
    assert!(page.contains(&format!("<a href=\"{colab}\" rel=\"noopener\">Open in Colab</a>")), "{page}");
}

/// A tiled lab prints what its loop prints, tile by tile, a masked tile included.
#[test]
fn a_tiled_lab_prints_each_tile_and_skips_a_masked_one() {
    let tiled = "```qkv attention\nid = \"short\"\nfrom = \"sentence\"\nkey_padding = [true, false, false]\n```\n\n```qkv tiled\nid = \"flash\"\nexample = \"short\"\nquery = \"love\"\nblock = 1\n```\n\n<!-- qkv lab flash -->\n<!-- /qkv -->\n";
    let (markdown, _) = one_section("lab", &format!("# Lab\n\n{SENTENCE}\n{tiled}"));
    for line in [
        "block 1: every key masked\n",
        "block 2: max 0.7071  m 0.7071  rescale 0.0000  l 1.0000  output so far 6.0000\n",
        "block 3: max 0.7071  m 0.7071  rescale 1.0000  l 2.0000  output so far 5.0000\n",
        "output:    5.0000\nattention: 5.0000 (every key at once)\n",
        "keep = np.array([False, True, True])  # the mask\n",
        "notebooks/lab-flash-love.ipynb",
    ] {
        assert!(markdown.contains(line), "{line:?} missing from {markdown}");
    }
}
