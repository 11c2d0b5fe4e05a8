use super::grid_step;
use crate::region::testing::{SENTENCE, one_section};

/// Both widgets on the running example, and a `steps` region to compare the matrix with.
const WIDGETS: &str = r#"```qkv widget
id = "drag"
kind = "drag-query"
example = "sentence"
query = "love"
goal = { largest = "NLP" }
prompt = "Drag $q$ toward $k_{\\text{NLP}}$, whose value is {=sentence.values.NLP:0}."
```

<!-- qkv widget drag -->
<!-- /qkv -->

```qkv widget
id = "matrix"
kind = "attention-matrix"
example = "sentence"
prompt = "Pick each row."
```

<!-- qkv widget matrix -->
<!-- /qkv -->

<!-- qkv steps sentence.love -->
<!-- /qkv -->
"#;

/// The updated markdown and the page.
fn built() -> (String, String) {
    one_section("widgets", &format!("# Widgets\n\n{SENTENCE}\n{WIDGETS}"))
}

/// The HTML of one widget.
fn widget<'p>(page: &'p str, kind: &str) -> &'p str {
    let start = page.find(&format!("data-qkv-widget=\"{kind}\"")).expect("widget");
    let end = page[start..].find("\n</div>\n</div>").map_or(page.len(), |e| start + e);
    &page[start..end]
}

#[test]
fn the_no_script_views_show_every_readout() {
    let (markdown, _) = built();
    insta::assert_snapshot!("widget_forge_view", markdown);
}

#[test]
fn the_drag_widget_starts_at_the_declared_query_with_the_build_s_numbers() {
    let (_, page) = built();
    let drag = widget(&page, "drag-query");
    insta::assert_snapshot!("drag_query_page_view", drag);
    assert!(drag.contains("data-qkv-query=\"0,1\""), "{drag}");
    for (readout, text) in [
        ("dot:I", "0.0000"),
        ("score:love", "0.7071"),
        ("weight:I", "0.1978"),
        ("weight:NLP", "0.4011"),
        ("output", "4.4067"),
    ] {
        assert!(drag.contains(&format!("data-qkv-readout=\"{readout}\">{text}<")), "{readout}: {drag}");
    }
    assert!(drag.contains("data-qkv-met=\"false\""), "the goal is not met at the start");
}

#[test]
fn each_matrix_row_opens_the_same_steps_as_a_steps_region() {
    let (markdown, page) = built();
    let steps_region = markdown.split("<!-- qkv steps sentence.love -->\n").nth(1).expect("region");
    let steps = steps_region.split("<!-- /qkv -->").next().expect("closed").trim();
    let matrix_md = markdown.split("<!-- qkv widget matrix -->").nth(1).expect("matrix");
    assert!(matrix_md.contains(steps), "the matrix's steps for “love” are the steps region's");
    let matrix = widget(&page, "attention-matrix");
    for row in ["I", "love", "NLP"] {
        assert!(matrix.contains(&format!("<tr data-qkv-row=\"{row}\">")), "{matrix}");
        assert!(matrix.contains(&format!("data-qkv-steps=\"{row}\"")), "{matrix}");
        assert!(matrix.contains(&format!("data-qkv-readout=\"row-sum:{row}\">1.0000<")), "{matrix}");
    }
    assert!(
        matrix.contains("data-qkv-readout=\"weight:love:NLP\" style=\"--w: 0.4011\">0.4011<"),
        "{matrix}"
    );
}

/// The plane keeps to a couple of dozen grid lines however far out a key lies: a key near 2^63
/// once asked for 2^31 lines and ran the build out of memory.
#[test]
fn a_far_key_gets_a_coarser_grid_not_billions_of_lines() {
    let lesson = r#"# Far

```qkv attention
id = "far"
tokens = ["a", "b", "c"]
queries = [[0, 1], [1, 0], [0, 1]]
keys = [[1, 0], [0, 1], [9.223372036854775807e18, 1]]
values = [[2], [6], [4]]
```

```qkv widget
id = "drag-far"
kind = "drag-query"
example = "far"
query = "a"
prompt = "Drag."
```

<!-- qkv widget drag-far -->
<!-- /qkv -->
"#;
    let (_, page) = one_section("far", lesson);
    let drag = widget(&page, "drag-query");
    let grid_lines =
        drag.matches("<line class=\"grid\"").count() + drag.matches("<line class=\"axis\"").count();
    assert!((8..=60).contains(&grid_lines), "{grid_lines} grid lines");
    assert!(drag.contains("<line class=\"axis\""), "the axes through the origin are drawn");
    assert!(!drag.contains("NaN") && !drag.contains("inf"), "{drag}");
}

#[test]
fn grid_steps_are_half_units_on_small_planes_and_round_beyond() {
    assert_eq!(grid_step(1.25), 0.5);
    assert_eq!(grid_step(6.0), 0.5);
    assert_eq!(grid_step(7.0), 1.0);
    assert_eq!(grid_step(100.0), 10.0);
    assert_eq!(grid_step(1.2e19), 1e18);
    assert!(grid_step(f64::MAX / 4.0).is_finite());
}

/// The running example's "love" in tiles of one key, walked by a tile stepper.
const TILES: &str = r#"```qkv tiled
id = "flash"
example = "sentence"
query = "love"
block = 1
```

```qkv widget
id = "walk"
kind = "tile-stepper"
example = "flash"
prompt = "Walk the tiles."
```

<!-- qkv widget walk -->
<!-- /qkv -->
"#;

#[test]
fn the_tile_stepper_holds_every_state_and_a_table_of_every_tile() {
    let (markdown, page) = one_section("tiles", &format!("# Tiles\n\n{SENTENCE}\n{TILES}"));
    // Without script: one row per tile (its values, m, rescale, l, the accumulator, output so
    // far), then the result. By hand, tile 2: m = 0.7071, rescale e^-0.7071 = 0.4931, l = 0.4931
    // + 1, accumulator 0.49307 · 2 + 1 · 6 = 6.9861, output 6.9861 / 1.4931 = 4.6790.
    assert!(
        markdown
            .contains("| 2 | love | 0.7071 | 6.0000 | 0.7071 | 0.7071 | 0.4931 | 1.4931 | 6.9861 | 4.6790 |"),
        "{markdown}"
    );
    assert!(markdown.contains("attention over all keys at once gives 4.4067"), "{markdown}");
    let stepper = widget(&page, "tile-stepper");
    let data = stepper.split("data-qkv-data>").nth(1).and_then(|s| s.split("</script>").next());
    let data: serde_json::Value = serde_json::from_str(data.expect("the states")).expect("JSON");
    let states = data["states"].as_array().expect("states");
    // Before the first tile, after each of the three, and the result.
    assert_eq!(states.len(), 5, "{data}");
    assert_eq!(states[0]["readouts"]["m"], "-∞");
    assert_eq!(states[2]["readouts"]["m"], "0.0000 → 0.7071");
    assert_eq!(states[2]["readouts"]["rescale"], "0.4931");
    // What the accumulator is made of, so that the learner can check it.
    assert_eq!(states[2]["readouts"]["values"], "6.0000");
    assert_eq!(states[2]["readouts"]["exp"], "1.0000");
    assert_eq!(states[2]["readouts"]["acc"], "2.0000 → 6.9861");
    assert_eq!(states[3]["readouts"]["l"], "1.4931 → 2.4931");
    assert_eq!(states[4]["readouts"]["attention"], "4.4067");
    assert_eq!(states[4]["readouts"]["merged"], "4.4067");
    // The page starts at the first state, the stepper hidden until the script shows it.
    assert!(stepper.contains("data-qkv-step=\"0\""), "{stepper}");
    assert!(stepper.contains("<div class=\"stepper\" data-qkv-stepper hidden>"), "{stepper}");
    assert!(
        stepper.contains("<tr hidden><th scope=\"row\">scores"),
        "no scores before the first tile: {stepper}"
    );
}

/// The decode stepper shows its declared step without script (a prompt token's later prompt
/// positions masked) and carries every step, as the build wrote it, for the script.
#[test]
fn the_decode_stepper_writes_every_step_and_shows_the_declared_one() {
    let lesson = format!(
        "# Stepper\n\n{SENTENCE}\n```qkv decode\nid = \"gen\"\nexample = \"sentence\"\nprompt = 2\n```\n\n```qkv widget\nid = \"steps\"\nkind = \"decode-stepper\"\nexample = \"gen\"\nquery = \"I\"\nprompt = \"Step.\"\n```\n\n<!-- qkv widget steps -->\n<!-- /qkv -->\n"
    );
    let (markdown, page) = one_section("stepper", &lesson);
    assert!(markdown.contains("| 2 | love | (0, 1) | 6 | masked | 0.0000 |"), "{markdown}");
    let stepper = widget(&page, "decode-stepper");
    assert!(stepper.contains("data-qkv-step=\"I\""), "{stepper}");
    assert!(stepper.contains("data-qkv-readout=\"weight:I\">1.0000<"), "{stepper}");
    assert!(stepper.contains("<p class=\"actions\" hidden>"), "the buttons wait for the script");
    // Every step rides along: the last, "NLP" over the whole cache, as a steps region shows it.
    let data =
        stepper.split("data-qkv-data>").nth(1).and_then(|d| d.split("</script>").next()).expect("data");
    let data: serde_json::Value = serde_json::from_str(data).expect("json");
    let steps = data["steps"].as_array().expect("steps");
    assert_eq!(steps.len(), 3);
    assert_eq!(data["start"], 0);
    assert!(steps[2]["rows"].as_str().is_some_and(|r| r.contains("data-qkv-readout=\"weight:NLP\">0.5035<")));
    assert!(steps[2]["output"].as_str().is_some_and(|o| o.contains(">4.0000<")));
}
