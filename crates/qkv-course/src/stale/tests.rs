use super::*;

#[test]
fn block_differences_show_where_the_lines_differ() {
    let long = "x".repeat(100);
    let (new, old) =
        differing_window(&format!("{long} output 4.01 tail"), &format!("{long} output 4.41 tail"));
    assert!(new.starts_with('…') && new.contains("output 4.01 tail"), "{new}");
    assert!(old.contains("output 4.41 tail"), "{old}");
    assert_eq!(differing_window("a 1 b", "a 2 b"), ("a 1 b".to_string(), "a 2 b".to_string()));
}

fn stale_of(text: &str, edit: Edit) -> Stale {
    in_file("content/01-x.md", text, &[edit]).pop().expect("a stale place")
}

/// Issue 11, finding 4: the first build of an empty region reported "expected ``, found (nothing)".
#[test]
fn an_empty_region_shows_the_first_generated_line() {
    let text = "# T\n\n<!-- qkv steps s -->\n<!-- /qkv -->\n";
    let body = text.find("<!-- /qkv").unwrap();
    let generated = "\n1. **Subtract the max** ($1$).\n2. **Exponentiate.**\n".to_string();
    let s = stale_of(text, Edit { range: body..body, text: generated.clone(), what: "steps s".into() });
    assert_eq!(
        s.to_string(),
        "content/01-x.md:4: expected `1. **Subtract the max** ($1$).`, found an empty region (steps s)"
    );
    // A region that lost its last lines says what is missing, not that it is empty.
    let text = "<!-- qkv steps s -->\n\n1. **Subtract the max** ($1$).\n<!-- /qkv -->\n";
    let body = text.find('\n').unwrap() + 1..text.find("<!-- /qkv").unwrap();
    let s = stale_of(text, Edit { range: body, text: generated, what: "steps s".into() });
    assert_eq!(
        s.to_string(),
        "content/01-x.md:4: expected `2. **Exponentiate.**`, found nothing more (steps s)"
    );
}
