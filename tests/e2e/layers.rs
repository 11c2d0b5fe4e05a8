//! The crates' own rules, checked on their sources (rust-analyzer's tidy tests are the model):
//! inside the engine and inside the course pipeline, modules form layers, and every `crate::`
//! path in non-test code points down a layer, so neither crate has an import circle.
//! `ARCHITECTURE.md` describes the same lists.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The engine's layers, bottom first; a module may name only modules of lower layers (and its
/// own submodules).
const ENGINE: &[&[&str]] = &[
    // The level names, then the SIMD kernels, which know nothing of attention.
    &["level"],
    &["kernels"],
    // The public element types, sealed by the kernels' own.
    &["element"],
    // The masks a caller can name, then the error every layer above reports with.
    &["mask"],
    &["error"],
    // Shared helpers: validated shapes, the work split, buffers kept between calls, the
    // dispatched level, the softmax's finishing rule, outputs allocated without zeroing.
    &["shape", "work", "spare", "simd", "softmax", "fresh"],
    // Input checks at the dispatched level.
    &["finite"],
    // Rotary position embeddings, and the keys a cache stores under them.
    &["rotary"],
    // Partial results and their exact merge.
    &["partial"],
    // Options, declared once, then masking, applied once.
    &["options"],
    &["masking"],
    // Input checks and the overflow-proof blocked path.
    &["inputs", "blocked"],
    // The tiled online softmax.
    &["flash"],
    // The inference step, written once.
    &["step"],
    // Entry points, from one head up.
    &["attention"],
    &["multi_head", "kv_cache", "paged"],
    &["backward", "half_precision", "projection"],
    // Packed batches, forward and backward (its backward is `backward`'s, sequence by sequence).
    &["varlen"],
    // The f64 oracle and the debug build's instantiation list, which may name anything.
    &["reference"],
    &["instances"],
];

/// The course pipeline's layers, bottom first.
const COURSE: &[&[&str]] = &[
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

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask sits in the workspace root").to_path_buf()
}

fn layer_of(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|layer| layer.contains(&module))
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

/// The identifiers of `text`, in order.
fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|word| !word.is_empty())
}

/// What `lib.rs` re-exports at the root, by the module it comes from (`pub use kv_cache::{KvCache,
/// …}` makes `crate::KvCache` an import of `kv_cache`), so that a root path cannot hide an import.
fn root_items(src: &Path) -> HashMap<String, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let mut items = HashMap::new();
    for statement in lib.split(';') {
        let code: String = statement.lines().map(|line| line.split("//").next().unwrap_or("")).collect();
        let Some(at) = code.find("pub use ") else { continue };
        let path = &code[at + "pub use ".len()..];
        let mut names = identifiers(path);
        let Some(module) = names.next() else { continue };
        for name in names {
            items.insert(name.to_string(), module.to_string());
        }
    }
    items
}

/// Every `crate::NAME` named in the code of `text` (not in comments, not in test code), with its
/// line number. Test code (`tests.rs` files, and what follows `#[cfg(test)]`) may reach up: a
/// test of a region builds a whole lesson.
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
            match rest.strip_prefix('{') {
                // `use crate::{a, b::c}`: the first name of every path in the braces.
                Some(inner) => {
                    let inner = inner.split('}').next().unwrap_or("");
                    for item in inner.split(',') {
                        if let Some(name) = identifiers(item).next() {
                            found.push((n + 1, name.to_string()));
                        }
                    }
                }
                None => found.extend(identifiers(rest).next().map(|name| (n + 1, name.to_string()))),
            }
        }
    }
    found
}

/// The imports of the crate in `src` that break `layers`, as messages naming both files.
fn violations(src: &Path, layers: &[&[&str]]) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let roots = root_items(src);
    let mut problems = Vec::new();
    let mut unplaced = BTreeMap::new();
    for file in &files {
        if file.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let Some(module) = module_of(src, file) else { continue };
        let Some(own) = layer_of(layers, &module) else {
            unplaced.insert(module, file.display().to_string());
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        for (line, name) in crate_paths(&text) {
            let target = roots.get(&name).cloned().unwrap_or(name);
            let Some(theirs) = layer_of(layers, &target) else { continue };
            if target != module && theirs >= own {
                let direction = if theirs == own { "sideways, within its layer," } else { "up" };
                problems.push(format!(
                    "{}:{line}: `{module}` (layer {own}) imports `{target}` (layer {theirs}, src/{target}.rs): an \
                     import pointing {direction} the layers in tests/e2e/layers.rs; move the shared item down or \
                     the code up",
                    file.display()
                ));
            }
        }
    }
    for (module, file) in unplaced {
        problems.push(format!("{file}: module `{module}` is in no layer: add it to tests/e2e/layers.rs"));
    }
    problems
}

#[test]
fn every_engine_import_points_down_a_layer() {
    let problems = violations(&workspace().join("crates/qkv/src"), ENGINE);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_course_import_points_down_a_layer() {
    let problems = violations(&workspace().join("crates/qkv-course/src"), COURSE);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_layer_check_sees_imports_that_point_up() {
    // The check itself must be able to fail: an import of the pipeline from a region, in a copy.
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("region")).expect("dirs");
    std::fs::write(src.join("lib.rs"), "mod region;\npub use pipeline::{Plan, build};\n").expect("write");
    std::fs::write(src.join("region.rs"), "use crate::error::Problem;\n").expect("write");
    std::fs::write(
        src.join("region/quiz.rs"),
        "use crate::{format, pipeline::Plan};\n// crate::html in a comment is no import\n#[cfg(test)]\nmod t { use crate::pipeline; }\n",
    )
    .expect("write");
    std::fs::write(src.join("eval.rs"), "fn f() { crate::figures::draw(); crate::build(); }\n")
        .expect("write");
    std::fs::write(src.join("widgets.rs"), "").expect("write");
    let problems = violations(&src, COURSE);
    assert_eq!(problems.len(), 4, "{problems:#?}");
    assert!(problems[0].contains("eval.rs:1: `eval` (layer 4) imports `figures`"), "{}", problems[0]);
    // A root re-export is an import of the module it comes from.
    assert!(problems[1].contains("eval.rs:1: `eval` (layer 4) imports `pipeline`"), "{}", problems[1]);
    assert!(
        problems[2].contains("region/quiz.rs:1: `region` (layer 6) imports `pipeline`"),
        "{}",
        problems[2]
    );
    assert!(problems[3].contains("module `widgets` is in no layer"), "{}", problems[3]);
}
