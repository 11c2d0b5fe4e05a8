//! Lesson pipeline timings over the committed lesson strings: a full build (every figure redrawn),
//! a no-op rebuild (everything fresh, nothing redrawn) and the check alone.
//! Run with `cargo bench -p qkv-course --bench pipeline`.

use qkv_course::{SourceFile, Sources};

fn main() {
    divan::main();
}

const FIGURES: [&str; 6] = [
    "scaling-variance",
    "scaling-saturation",
    "love-query",
    "love-sweep",
    "sentence-heatmap",
    "masked-heatmap",
];

fn lesson(with_figures: bool) -> Sources {
    let markdown = vec![
        SourceFile {
            path: "content/01-attention.md".into(),
            text: include_str!("../../../content/01-attention.md").into(),
        },
        SourceFile {
            path: "content/02-causal-masking.md".into(),
            text: include_str!("../../../content/02-causal-masking.md").into(),
        },
    ];
    let figures = if with_figures {
        FIGURES.iter().flat_map(|id| [format!("figures/{id}.svg"), format!("figures/{id}.png")]).collect()
    } else {
        Default::default()
    };
    Sources { markdown, figures, ..Default::default() }
}

/// Everything recomputed and every figure redrawn (no figure files present).
#[divan::bench(sample_count = 10)]
fn full_build(bencher: divan::Bencher) {
    let sources = lesson(false);
    bencher.bench(|| {
        let build = qkv_course::build(divan::black_box(&sources)).expect("lesson builds");
        assert_eq!(build.figures.len(), 2 * FIGURES.len());
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
