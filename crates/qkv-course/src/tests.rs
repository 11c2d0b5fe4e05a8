//! The crate's own rules, checked on its sources (rust-analyzer's tidy tests are the model): its
//! modules form layers, and every `crate::` path in non-test code points down a layer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers, bottom first; a module may name only modules of lower layers (and its own
/// submodules). `ARCHITECTURE.md` describes the same list.
const LAYERS: &[&[&str]] = &[
    // Shared types and leaf helpers: what several layers use.
    &["error", "location", "limits", "files", "figure_kind", "format", "values", "markup"],
    // Text: bytes to text, the markdown document (blocks, citations, regions by byte range), and
    // the data files of measured numbers.
    &["encoding", "document", "measured"],
    // Citations: one grammar for every place a number is cited.
    &["citation"],
    // Declarations: typed `qkv` blocks.
    &["examples"],
    // Evaluation through the engine.
    &["eval"],
    // What the site is built from: figure data, notebooks.
    &["figures", "notebook"],
    // Region kinds, each producing its markdown and HTML views.
    &["region"],
    // The site's pages and the stale report.
    &["html", "stale", "leftovers"],
    // Plans, checks and splices.
    &["pipeline"],
];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| layer.contains(&module))
}

/// The top-level module a source file belongs to (`region/quiz.rs` → `region`), or `None` for
/// `lib.rs`, which only declares and re-exports.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let relative = file.strip_prefix(src).ok()?;
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_string())
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> =
        std::fs::read_dir(dir).expect("readable src").flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every `crate::MODULE` named in the code of `text` (not in comments, not in test code), with
/// its line number. Test code (`tests.rs` files, and what follows `#[cfg(test)]`) may reach up:
/// a test of a region builds a whole lesson.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if line.trim_start().starts_with("#[cfg(test)]") {
            break;
        }
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + "crate::".len()..];
            // `$crate::` or a longer identifier ending in `crate` is something else.
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if name.is_empty() {
                // `use crate::{a, b}`: every name in the braces.
                if let Some(inner) = rest.strip_prefix('{') {
                    let inner = inner.split('}').next().unwrap_or("");
                    for item in inner.split(',') {
                        let item = item.trim();
                        let name: String =
                            item.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        if !name.is_empty() {
                            found.push((n + 1, name));
                        }
                    }
                }
                continue;
            }
            found.push((n + 1, name));
        }
    }
    found
}

/// The imports that break the layering, as messages naming both files.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut problems = Vec::new();
    let mut unplaced = BTreeMap::new();
    for file in &files {
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let Some(module) = module_of(src, file) else { continue };
        let Some(own) = layer_of(&module) else {
            unplaced.insert(module, file.display().to_string());
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        for (line, target) in crate_paths(&text) {
            // Items re-exported at the root (`crate::SourceFile`) are not modules.
            let Some(theirs) = layer_of(&target) else { continue };
            if target != module && theirs >= own {
                let direction = if theirs == own { "sideways, within its layer," } else { "up" };
                problems.push(format!(
                    "{}:{line}: `{module}` (layer {own}) imports `{target}` (layer {theirs}, src/{target}.rs): an import pointing {direction} the layers in src/tests.rs; move the shared item down or the code up",
                    file.display()
                ));
            }
        }
    }
    for (module, file) in unplaced {
        problems.push(format!("{file}: module `{module}` is in no layer: add it to LAYERS in src/tests.rs"));
    }
    problems
}

#[test]
fn every_import_points_down_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let problems = violations(&src);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_layer_check_sees_imports_that_point_up() {
    // The check itself must be able to fail: an import of the pipeline from a region, in a copy.
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("region")).expect("dirs");
    std::fs::write(src.join("region.rs"), "use crate::error::Problem;\n").expect("write");
    std::fs::write(
        src.join("region/quiz.rs"),
        "use crate::{format, pipeline::Plan};\n// crate::html in a comment is no import\n#[cfg(test)]\nmod t { use crate::pipeline; }\n",
    )
    .expect("write");
    std::fs::write(src.join("eval.rs"), "fn f() { crate::figures::draw(); }\n").expect("write");
    std::fs::write(src.join("widgets.rs"), "").expect("write");
    let problems = violations(&src);
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("eval.rs:1: `eval` (layer 4) imports `figures`"), "{}", problems[0]);
    assert!(
        problems[1].contains("region/quiz.rs:1: `region` (layer 6) imports `pipeline`"),
        "{}",
        problems[1]
    );
    assert!(problems[2].contains("module `widgets` is in no layer"), "{}", problems[2]);
}
