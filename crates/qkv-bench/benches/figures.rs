//! Renders qkv-plot's lesson fixtures (SVG and PNG), one figure of each drawing the lesson uses
//! but the tile trace and the measurements: `cargo bench -p qkv-bench --bench figures`. The
//! target is under 0.5 s for `all_lesson_figures`; the whole course build, every figure included,
//! is `benches/pipeline.rs`.

// qkv-plot's own fixtures: the figures its snapshot tests draw.
#[path = "../../qkv-plot/fixtures/lesson.rs"]
mod lesson;

use divan::{Bencher, black_box};
use qkv_plot::{Size, heatmap, line_chart, query_diagram, score_curves};

fn main() {
    divan::main();
}

/// The fixtures' figures: heatmap 3×3, masked 3×3, query diagram,
/// score curves (200 points × 3 keys), the two scaling figures; PNGs at
/// 1 and 2 pixels per CSS pixel.
#[divan::bench(args = [1, 2], sample_count = 20)]
fn all_lesson_figures(bencher: Bencher, png_scale: u32) {
    let love = lesson::love_heatmap();
    let causal = lesson::causal_heatmap();
    let diagram = lesson::query_diagram();
    let curves = lesson::score_curves(200);
    let variance = lesson::variance_chart();
    let saturation = lesson::saturation_chart();
    bencher.bench(|| {
        let figures = [
            heatmap(black_box(&love), Size::default().with_png_scale(png_scale)),
            heatmap(black_box(&causal), Size::default().with_png_scale(png_scale)),
            query_diagram(black_box(&diagram), Size::square(640)),
            score_curves(black_box(&curves), Size::default().with_png_scale(png_scale)),
            line_chart(black_box(&variance), Size::default().with_png_scale(png_scale)),
            line_chart(black_box(&saturation), Size::default().with_png_scale(png_scale)),
        ];
        figures.into_iter().map(|f| f.map(|f| f.png.len() + f.svg.len())).sum::<Result<usize, _>>()
    });
}

/// One heatmap alone, 3 tokens and 32.
#[divan::bench(args = [3, 32], sample_count = 20)]
fn heatmap_tokens(bencher: Bencher, n: usize) {
    let spec = lesson::random_heatmap(n);
    bencher.bench(|| heatmap(black_box(&spec), Size::square(640)));
}
