use super::*;

const DATA: &str = r#"
title = "One decoding step"
x_name = "n"
x_title = "cache length n"
y_title = "ms"
x = [1024, 2048, 4096]

[[series]]
name = "f32"
y = [1.0, 3.0, 4.5]
"#;

/// By hand: x grows 4096 / 1024 = 4×; f32 4.5 / 1 = 4.5×, its steps 3 / 1 = 3 and 4.5 / 3 = 1.5.
#[test]
fn the_record_cites_growth_by_hand() {
    let m = parse("data/d.toml", DATA).expect("reads");
    let node = m.node();
    let number =
        |path: &str| node.lookup(&path.split('.').collect::<Vec<_>>()).ok().and_then(Node::as_number);
    assert_eq!(number("x_growth"), Some(4.0));
    assert_eq!(number("x.3"), Some(4096.0));
    assert_eq!(number("f32.y.2"), Some(3.0));
    assert_eq!(number("f32.growth"), Some(4.5));
    assert_eq!(number("f32.step_min"), Some(1.5));
    assert_eq!(number("f32.step_max"), Some(3.0));
}

#[test]
fn a_series_name_must_stand_in_a_path() {
    for bad in ["f.32", "f 32", "x", "x_growth"] {
        let text = DATA.replace("name = \"f32\"", &format!("name = {bad:?}"));
        let e = parse("data/d.toml", &text).expect_err(bad);
        assert!(e.contains("`name`"), "{bad}: {e}");
    }
}

#[test]
fn a_data_file_that_does_not_read_says_where() {
    let e = parse("data/d.toml", &DATA.replace("[1024, 2048, 4096]", "[1024, 2048 4096]"))
        .expect_err("a comma short");
    assert!(e.starts_with("a TOML data file (`data/d.toml` does not read at line 6, column 12: "), "{e}");
}

#[test]
fn a_misspelt_series_field_is_named() {
    let e = parse("data/d.toml", &DATA.replace("name = \"f32\"", "nam = \"f32\"")).expect_err("misspelt");
    assert_eq!(e, "only `name` and `y` in series 1 of `data/d.toml`, not `nam` (did you mean `name`?)");
}
