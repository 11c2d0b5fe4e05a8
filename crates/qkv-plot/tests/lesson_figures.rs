//! The lesson's figures end to end: SVG snapshots, determinism, PNG headers,
//! and the 32-token stress cases.

#[path = "../fixtures/lesson.rs"]
mod lesson;

use qkv_plot::{Figure, Size, heatmap, line_chart, query_diagram, score_curves};

/// Width and height from a PNG's IHDR, after checking the signature.
fn png_size(png: &[u8]) -> (u32, u32) {
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&png[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&png[16..20]), be(&png[20..24]))
}

/// The text content of every `<text>` element, in order.
fn texts(svg: &str) -> Vec<&str> {
    svg.split("<text")
        .skip(1)
        .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim()))
        .collect()
}

/// Renders twice, checks the two results are byte-identical and the PNG
/// has the requested size, and returns the figure.
fn check(render: impl Fn() -> Figure, size: Size) -> Figure {
    let first = render();
    let second = render();
    assert!(first.svg == second.svg, "SVG differs between two renders");
    assert!(first.png == second.png, "PNG differs between two renders");
    let scale = size.png_scale;
    assert_eq!(png_size(&first.png), (size.width * scale, size.height * scale));
    assert_eq!((first.width, first.height, first.png_scale), (size.width, size.height, scale));
    assert!(first.svg.starts_with("<svg") && first.svg.trim_end().ends_with("</svg>"));
    first
}

#[test]
fn love_heatmap() {
    let size = Size::default();
    let figure = check(|| heatmap(&lesson::love_heatmap(), size).unwrap(), size);
    for weight in ["0.1978", "0.4011", "0.2483", "0.5035"] {
        assert!(texts(&figure.svg).contains(&weight), "annotation {weight}");
    }
    insta::assert_snapshot!("love_heatmap_svg", figure.svg);
}

/// The RGB pixel at `(x, y)` of a PNG.
fn pixel(png_bytes: &[u8], x: u32, y: u32) -> [u8; 3] {
    let mut reader = png::Decoder::new(png_bytes).read_info().expect("PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("PNG data");
    assert_eq!(info.color_type, png::ColorType::Rgb);
    let at = (y * info.width + x) as usize * 3;
    [buf[at], buf[at + 1], buf[at + 2]]
}

/// The value of attribute `name` in one SVG tag.
fn attr<'a>(tag: &'a str, name: &str) -> &'a str {
    let start = tag.find(&format!(" {name}=\"")).expect(name) + name.len() + 3;
    &tag[start..start + tag[start..].find('"').expect("closing quote")]
}

#[test]
fn png_cells_have_the_svg_colours() {
    for scale in [1, 2] {
        check_cell_colours(scale);
    }
}

fn check_cell_colours(scale: u32) {
    let figure = heatmap(&lesson::love_heatmap(), Size::default().with_png_scale(scale)).unwrap();
    let cells: Vec<&str> =
        figure.svg.lines().filter(|l| l.starts_with("<rect") && l.contains("width=\"120\"")).collect();
    assert_eq!(cells.len(), 9, "one square per weight");
    for cell in cells {
        let x: u32 = attr(cell, "x").parse().unwrap();
        let y: u32 = attr(cell, "y").parse().unwrap();
        let fill = attr(cell, "fill");
        let rgb = pixel(&figure.png, (x + 8) * scale, (y + 8) * scale);
        assert_eq!(format!("#{:02X}{:02X}{:02X}", rgb[0], rgb[1], rgb[2]), fill, "cell at ({x}, {y})");
    }
    // The smallest weight (0.1978) is the dark end of viridis, the largest the bright end.
    assert!(figure.svg.contains("fill=\"#440154\""));
    assert!(figure.svg.contains("fill=\"#FEE825\""));
}

#[test]
fn causal_heatmap() {
    let size = Size::default();
    let figure = check(|| heatmap(&lesson::causal_heatmap(), size).unwrap(), size);
    assert_eq!(texts(&figure.svg).iter().filter(|t| **t == "masked").count(), 3, "three masked cells");
    insta::assert_snapshot!("causal_heatmap_svg", figure.svg);
}

#[test]
fn love_query_diagram() {
    let size = Size::square(640);
    let figure = check(|| query_diagram(&lesson::query_diagram(), size).unwrap(), size);
    insta::assert_snapshot!("love_query_diagram_svg", figure.svg);
}

#[test]
fn angle_sweep_score_curves() {
    let size = Size::default();
    let figure = check(|| score_curves(&lesson::score_curves(200), size).unwrap(), size);
    insta::assert_snapshot!("angle_sweep_score_curves_svg", figure.svg);
}

#[test]
fn dot_product_variance_chart() {
    let size = Size::default();
    let figure = check(|| line_chart(&lesson::variance_chart(), size).unwrap(), size);
    insta::assert_snapshot!("dot_product_variance_svg", figure.svg);
}

#[test]
fn softmax_saturation_chart() {
    let size = Size::default();
    let figure = check(|| line_chart(&lesson::saturation_chart(), size).unwrap(), size);
    insta::assert_snapshot!("softmax_saturation_svg", figure.svg);
}

#[test]
fn thirty_two_tokens_drop_annotations_and_thin_labels_only_when_needed() {
    let count = |texts: &[&str], word: &str| texts.iter().filter(|t| **t == word).count();
    // Square: every token appears as a row label and as a column label.
    let size = Size::square(640);
    let figure = check(|| heatmap(&lesson::random_heatmap(32), size).unwrap(), size);
    let square = texts(&figure.svg);
    assert_eq!(count(&square, "compares"), 2);
    assert_eq!(count(&square, "sentence."), 2);
    assert!(figure.svg.contains("rotate(270"), "column labels turn vertical");
    // Only the colour bar's few tick labels are numbers: cells are too small to annotate.
    let numbers = square.iter().filter(|t| t.parse::<f64>().is_ok()).count();
    assert!(numbers <= 8, "{numbers} numbers drawn at 32 tokens");

    // 640 × 480: rows are too short for 32 labels, so every other one is drawn,
    // but the highlighted row keeps its label.
    let size = Size::default();
    let figure = check(|| heatmap(&lesson::random_heatmap(32), size).unwrap(), size);
    let wide = texts(&figure.svg);
    assert_eq!(count(&wide, "The"), 2, "token 0 is labelled");
    assert_eq!(count(&wide, "attention"), 0, "token 1 is skipped");
    assert_eq!(count(&wide, "sum"), 2, "the highlighted row (16) is labelled");

    let size = Size::square(640);
    let figure = check(|| heatmap(&lesson::random_causal_heatmap(32), size).unwrap(), size);
    assert!(figure.svg.contains("#F0F0F0"), "masked cells are drawn grey");
}

#[test]
fn high_density_png_has_the_same_svg() {
    let size = Size::default().with_png_scale(2);
    let sharp = check(|| score_curves(&lesson::score_curves(200), size).unwrap(), size);
    let plain = score_curves(&lesson::score_curves(200), Size::default()).unwrap();
    assert_eq!(sharp.svg, plain.svg);
    assert_ne!(sharp.png, plain.png);
    let bad = Size::default().with_png_scale(0);
    assert_eq!(
        heatmap(&lesson::love_heatmap(), bad),
        Err(qkv_plot::PlotError::PngScale { png_scale: 0, max: Size::MAX_PNG_SCALE })
    );
}

#[test]
fn one_token_renders() {
    let size = Size::default();
    let figure = check(|| heatmap(&lesson::random_heatmap(1), size).unwrap(), size);
    assert!(texts(&figure.svg).contains(&"1.00"));
}
