use crate::region::testing::{SENTENCE, one_section};

/// The running example under the causal mask with ALiBi, and a widget over it.
const WIDGET: &str = r#"```qkv attention
id = "causal"
from = "sentence"
mask = "causal"
alibi = 0.5
```

```qkv widget
id = "controls"
kind = "window-alibi"
example = "causal"
windows = [[1, 0]]
slopes = [0, 0.5]
prompt = "Narrow the window to one key back."
```

<!-- qkv widget controls -->
<!-- /qkv -->
"#;

/// The updated markdown and the widget's page view.
fn built() -> (String, String) {
    let (markdown, page) = one_section("window", &format!("# Window\n\n{SENTENCE}\n{WIDGET}"));
    let start = page.find("data-qkv-widget=\"window-alibi\"").expect("widget");
    let end = page[start..].find("data-qkv-announce").map_or(page.len(), |e| start + e);
    (markdown, page[start..end].to_string())
}

/// The embedded states, `states[window][slope]`.
fn states(html: &str) -> serde_json::Value {
    let open = html.find("data-qkv-data>").expect("data") + "data-qkv-data>".len();
    let close = open + html[open..].find("</script>").expect("closed");
    let data: serde_json::Value = serde_json::from_str(&html[open..close]).expect("json");
    data["states"].clone()
}

#[test]
fn the_no_script_view_shows_the_declared_window_and_slope() {
    let (markdown, _) = built();
    insta::assert_snapshot!("window_alibi_forge_view", markdown);
}

#[test]
fn the_page_starts_at_the_declared_state_with_the_build_s_numbers() {
    let (_, html) = built();
    insta::assert_snapshot!("window_alibi_page_view", html);
    assert!(html.contains("data-qkv-window=\"none\" data-qkv-slope=\"0.5\""), "{html}");
    // "love" with the bias -0.5 on "I": scores (-0.5, 0.7071), weights (0.2302, 0.7698).
    for (readout, text) in
        [("bias:love:I", "-0.5000"), ("weight:love:love", "0.7698"), ("output:I", "2.0000")]
    {
        assert!(html.contains(&format!("data-qkv-readout=\"{readout}\"")), "{readout}");
        assert!(html.contains(&format!(">{text}</td>")), "{readout} shows {text}: {html}");
    }
    assert!(html.contains("<div class=\"controls\" hidden>"), "the controls wait for the script");
}

#[test]
fn every_combination_of_the_controls_is_embedded() {
    let (_, html) = built();
    let states = states(&html);
    // No window or one key back, by slope 0 or 0.5.
    assert_eq!(states.as_array().map(Vec::len), Some(2));
    assert!(states.as_array().expect("windows").iter().all(|row| row.as_array().map(Vec::len) == Some(2)));
    // One key back, slope 0: "NLP" sees "love" and itself, as "love" saw "I" and itself unmasked.
    let nlp = &states[1][0]["weights"][2];
    assert_eq!(nlp, &serde_json::json!([null, "0.3302", "0.6698"]));
    assert_eq!(states[1][0]["bias"][2], serde_json::json!([null, "0.0000", "0.0000"]));
    // Slope 0.5, no window: "NLP" adds -1 to the score of "I".
    assert_eq!(states[0][1]["bias"][2][0], "-1.0000");
}
