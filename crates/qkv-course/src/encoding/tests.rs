use super::*;

fn check_invalid(bytes: &[u8], line: usize, column: usize, message: &str, found: &str) {
    let e = decode("content/01-x.md", bytes).expect_err("invalid UTF-8");
    assert_eq!((e.line, e.column), (line, column), "{e}");
    assert_eq!(e.message, message);
    assert_eq!(e.found, found);
}

#[test]
fn invalid_bytes_are_located_by_line_and_column() {
    check_invalid(b"# T\n\nv = \xff1\n", 3, 5, r"the file is not UTF-8: byte \xFF here", r"v = \xFF1");
    // Columns count characters, not bytes: `é` is one column.
    check_invalid(
        b"\xc3\xa9t\xc3\xa9 \xe9t\xe9\r\nnext",
        1,
        5,
        r"the file is not UTF-8: byte \xE9 here",
        r"été \xE9t\xE9",
    );
    // A character cut short at the end of the file.
    check_invalid(b"ok\n\xe2\x82", 2, 1, r"the file is not UTF-8: bytes \xE2\x82 here", r"\xE2\x82");
}

#[test]
fn valid_text_decodes_unchanged() {
    assert_eq!(decode("a.md", "\u{feff}# T\r\n".as_bytes()).as_deref(), Ok("\u{feff}# T\r\n"));
}

#[test]
fn a_byte_order_mark_is_set_aside_and_put_back() {
    let (text, bom) = strip_bom("\u{feff}# Title\n");
    assert_eq!((text, bom), ("# Title\n", true));
    assert_eq!(restore_bom(text.to_string(), bom), "\u{feff}# Title\n");
    assert_eq!(strip_bom("# Title\n"), ("# Title\n", false));
}

#[test]
fn generated_text_takes_the_file_s_line_ending() {
    assert_eq!(LineEnding::of("a\r\nb\n"), LineEnding::Crlf);
    assert_eq!(LineEnding::of("a\nb\r\n"), LineEnding::Lf);
    assert_eq!(LineEnding::of("one line"), LineEnding::Lf);
    assert_eq!(LineEnding::Crlf.apply("\n1. a\n2. b\r\n".into()), "\r\n1. a\r\n2. b\r\n");
    assert_eq!(LineEnding::Lf.apply("\n1. a\n".into()), "\n1. a\n");
}
