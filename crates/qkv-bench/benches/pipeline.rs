//! Course pipeline timings over the committed course: a full build (every figure redrawn), a
//! no-op rebuild (everything fresh, nothing redrawn) and the check alone.
//! Run with `cargo bench -p qkv-bench --bench pipeline`.

use qkv_course::{SourceFile, Sources};

fn main() {
    divan::main();
}

/// The committed course (every `content/NN-NAME.md`), with every committed figure file taken as
/// present or none of them.
fn lesson(with_figures: bool) -> Sources {
    let content = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../content");
    let names = |dir: &std::path::Path| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("content/")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    };
    let markdown = names(&content)
        .into_iter()
        .filter(|n| n.ends_with(".md") && n.as_bytes().first().is_some_and(u8::is_ascii_digit))
        .map(|n| SourceFile {
            text: std::fs::read_to_string(content.join(&n)).expect("lesson file"),
            path: format!("content/{n}"),
        })
        .collect();
    let figures: std::collections::BTreeSet<String> = if with_figures {
        names(&content.join("figures")).into_iter().map(|n| format!("figures/{n}")).collect()
    } else {
        Default::default()
    };
    // What each committed SVG says it was drawn from: without it every figure is drawn again.
    let figure_hashes = figures
        .iter()
        .filter_map(|name| {
            let svg = std::fs::read_to_string(content.join(name)).ok()?;
            Some((name.clone(), qkv_course::drawn_from(&svg)?.to_string()))
        })
        .collect();
    // Measured numbers some figures draw (`content/data/*.toml`).
    let data = names(&content.join("data"))
        .into_iter()
        .map(|n| {
            let text = std::fs::read_to_string(content.join("data").join(&n)).expect("data file");
            (format!("data/{n}"), text)
        })
        .collect();
    Sources { markdown, figures, figure_hashes, data }
}

/// Everything recomputed and every figure redrawn (no figure files present).
#[divan::bench(sample_count = 10)]
fn full_build(bencher: divan::Bencher) {
    let sources = lesson(false);
    bencher.bench(|| {
        let build = qkv_course::build(divan::black_box(&sources)).expect("lesson builds");
        assert!(!build.figures.is_empty());
        build
    });
}

/// The lesson is fresh and every figure file exists: numbers and pages only.
#[divan::bench(sample_count = 20)]
fn noop_rebuild(bencher: divan::Bencher) {
    let sources = lesson(true);
    bencher.bench(|| {
        let build = qkv_course::build(divan::black_box(&sources)).expect("lesson builds");
        assert!(build.figures.is_empty() && build.stale.is_empty());
        build
    });
}

/// `--check` without writing or rendering.
#[divan::bench(sample_count = 20)]
fn check(bencher: divan::Bencher) {
    let sources = lesson(true);
    bencher.bench(|| qkv_course::check(divan::black_box(&sources)).expect("lesson checks"));
}
