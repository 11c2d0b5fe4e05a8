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
