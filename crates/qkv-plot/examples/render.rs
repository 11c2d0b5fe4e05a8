//! Writes every lesson figure (and the 32-token stress cases) as SVG and PNG
//! into the folder named on the command line, to look at them by eye:
//! `cargo run -p qkv-plot --example render -- /tmp/qkv-figures`.

#[path = "../fixtures/lesson.rs"]
mod lesson;

use std::path::PathBuf;

use qkv_plot::{Figure, PlotError, Size, heatmap, line_chart, query_diagram, score_curves};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).ok_or("usage: render <output folder>")?);
    std::fs::create_dir_all(&dir)?;
    let square = Size::square(640);
    let figures: Vec<(&str, Result<Figure, PlotError>)> = vec![
        ("heatmap_love", heatmap(&lesson::love_heatmap(), Size::default())),
        ("heatmap_causal", heatmap(&lesson::causal_heatmap(), Size::default())),
        ("heatmap_random32", heatmap(&lesson::random_heatmap(32), square)),
        ("heatmap_random32_wide", heatmap(&lesson::random_heatmap(32), Size::default())),
        ("heatmap_causal32", heatmap(&lesson::random_causal_heatmap(32), square)),
        ("heatmap_love_2x", heatmap(&lesson::love_heatmap(), Size::default().with_png_scale(2))),
        ("score_curves_2x", score_curves(&lesson::score_curves(200), Size::default().with_png_scale(2))),
        ("heatmap_row32", heatmap(&lesson::random_row(32), Size::default())),
        ("heatmap_row8", heatmap(&lesson::random_row(8), Size::default())),
        ("heatmap_one", heatmap(&lesson::random_heatmap(1), Size::default())),
        ("query_diagram", query_diagram(&lesson::query_diagram(), square)),
        ("score_curves", score_curves(&lesson::score_curves(200), Size::default())),
        ("scaling_variance", line_chart(&lesson::variance_chart(), Size::default())),
        ("scaling_saturation", line_chart(&lesson::saturation_chart(), Size::default())),
    ];
    for (name, figure) in figures {
        let figure = figure?;
        std::fs::write(dir.join(format!("{name}.svg")), &figure.svg)?;
        std::fs::write(dir.join(format!("{name}.png")), &figure.png)?;
        println!("{name}: {} bytes SVG, {} bytes PNG", figure.svg.len(), figure.png.len());
    }
    Ok(())
}
