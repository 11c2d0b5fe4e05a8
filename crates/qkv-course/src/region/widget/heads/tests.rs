use crate::region::testing::one_section;

/// Two heads whose `W_o` is the identity: a head's column of the output is its own output.
const LESSON: &str = r#"# Heads

```qkv multi-head
id = "two"
tokens = ["I", "love", "NLP"]
x = [[1, 0], [0, 1], [1, 1]]
w_o = [[1, 0], [0, 1]]

[[heads]]
name = "near"
w_q = [[1, 0], [0, 1]]
w_k = [[1, 0], [0, 1]]
w_v = [[2], [6]]

[[heads]]
name = "far"
w_q = [[-2, 1], [1, -1]]
w_k = [[1, 0], [0, 1]]
w_v = [[1], [-1]]
```

```qkv widget
id = "explore"
kind = "head-explorer"
example = "two"
head = "far"
prompt = "Switch a head off."
```

<!-- qkv widget explore -->
<!-- /qkv -->
"#;

/// The widget's embedded data.
fn data(page: &str) -> serde_json::Value {
    let json = page.split("data-qkv-data>").nth(1).and_then(|s| s.split("</script>").next()).expect("data");
    serde_json::from_str(json).expect("JSON")
}

#[test]
fn every_combination_of_heads_is_embedded_and_a_head_switched_off_adds_nothing() {
    let (markdown, page) = one_section("heads", LESSON);
    let data = data(&page);
    let finals = data["final"].as_object().expect("final");
    assert_eq!(finals.len(), 4, "one output per combination of 2 heads: {finals:?}");
    let head = |h: usize, i: usize| data["outputs"][h][i][0].clone();
    for i in 0..3 {
        // With W_o the identity, each column of the output is one head's output, or zero.
        assert_eq!(finals["11"][i], serde_json::json!([head(0, i), head(1, i)]));
        assert_eq!(finals["10"][i], serde_json::json!([head(0, i), "0.0000"]));
        assert_eq!(finals["01"][i], serde_json::json!(["0.0000", head(1, i)]));
        assert_eq!(finals["00"][i], serde_json::json!(["0.0000", "0.0000"]));
    }
    assert_eq!(data["start"], 1, "the declared head");
    assert!(page.contains("data-qkv-head=\"far\" data-qkv-on=\"near,far\""), "{page}");
    assert!(
        page.contains("<div class=\"head-controls\" data-qkv-controls hidden>"),
        "controls wait for the script"
    );
    // Without script, the declared head: "far" gives "love" a weight of 0.5760 on "I".
    assert!(page.contains("data-qkv-readout=\"weight:love:I\" style=\"--w: 0.5760\">0.5760<"), "{page}");
    assert!(markdown.contains("The weights of head far, one row per query, and its output:"), "{markdown}");
    assert!(markdown.contains("The output, with every head switched on:"), "{markdown}");
}
