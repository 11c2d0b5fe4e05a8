//! Figures: what each declared figure shows, computed from the examples (or seeded Monte Carlo),
//! fingerprinted by a content hash, and rendered with `qkv-plot` only when that hash changes.

mod measured;
mod montecarlo;

pub(crate) use measured::prepare as prepare_measurements;

use std::f64::consts::PI;
use std::fmt::Write;

use qkv_plot::{
    Heatmap, LineChart, QueryDiagram, Scale, ScoreCurves, SecondaryAxis, Series, Size, Vector2,
    VerticalMarker,
};
use sha2::{Digest, Sha256};

use crate::eval::{AttentionInputs, AttentionResult, TiledResult, array};
use crate::examples::FigureDecl;
use crate::figure_kind::FigureKind;

/// Bumped when the Monte Carlo code changes, so its figures re-render.
const MONTE_CARLO_VERSION: u32 = 1;

/// Everything a figure needs to be drawn, as `qkv-plot` input.
#[derive(Debug, Clone)]
pub(crate) enum Plot {
    Heatmap(Heatmap),
    QueryDiagram(QueryDiagram),
    ScoreCurves(ScoreCurves),
    Line(LineChart),
}

// Figures are drawn for a phone's column, about 330 CSS pixels wide: there the page shows them at
// nearly their own size, so their 11-pixel labels stay readable (at 720 pixels wide they shrank
// to 5). Wider screens scale them up. PNGs have two pixels per CSS pixel, for sharp downloads.
const HEATMAP_SIZE: Size = Size::new(360, 320).with_png_scale(2);
const QUERY_DIAGRAM_SIZE: Size = Size::square(360).with_png_scale(2);
const SCORE_CURVES_SIZE: Size = Size::new(360, 340).with_png_scale(2);
const LINE_SIZE: Size = Size::new(360, 300).with_png_scale(2);

impl Plot {
    /// The size this kind of figure is drawn at.
    fn size(&self) -> Size {
        match self {
            Plot::Heatmap(_) => HEATMAP_SIZE,
            Plot::QueryDiagram(_) => QUERY_DIAGRAM_SIZE,
            Plot::ScoreCurves(_) => SCORE_CURVES_SIZE,
            Plot::Line(_) => LINE_SIZE,
        }
    }
}

/// A figure ready to hash and, if stale, to render.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    /// Fingerprint of the figure's inputs (16 hex digits).
    pub hash: String,
    /// Alt text describing what the figure shows, with its numbers.
    pub alt: String,
    /// The size it is drawn at (the page reserves it, so nothing moves when the image loads).
    pub size: Size,
    /// Builds the plot input; deferred because Monte Carlo data is only needed when re-rendering.
    pub plot: Deferred,
}

/// A figure a region shows, to be drawn when its files are missing or its hash changed.
#[derive(Debug, Clone)]
pub(crate) struct FigureJob {
    /// The figure block's id: its files are `figures/ID.svg` and `.png`.
    pub id: String,
    /// Where the figure's region is, for errors while drawing.
    pub doc: usize,
    pub at: usize,
    pub prepared: Prepared,
}

/// The plot input, or how to compute it.
#[derive(Debug, Clone)]
pub(crate) enum Deferred {
    Ready(Box<Plot>),
    Variance { seed: u64, trials: usize, dims: Vec<usize> },
    Saturation { seed: u64, trials: usize, dims: Vec<usize> },
}

/// Fingerprint of a figure's inputs. Numbers are rounded to 9 significant digits first, so a last-bit
/// difference in `exp` between C libraries does not mark a committed figure stale on another machine.
/// The figure library's look is part of it: a new look redraws every figure.
fn hash_of(text: &str) -> String {
    let text = format!("look v{}|{text}", qkv_plot::LOOK_VERSION);
    let digest = Sha256::digest(canonical_numbers(&text).as_bytes());
    digest.iter().take(8).fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// `text` with every decimal number (`0.40111209267978593`, `1e-5`) rewritten as `{:.8e}`.
pub(crate) fn canonical_numbers(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let starts_number = bytes[i].is_ascii_digit()
            && (i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_'));
        if !starts_number {
            let c = text[i..].chars().next().unwrap_or(' ');
            out.push(c);
            i += c.len_utf8();
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (bytes[j].is_ascii_digit() || bytes[j] == b'.') {
            j += 1;
        }
        if j < bytes.len() && bytes[j] == b'e' {
            let mut k = j + 1;
            if k < bytes.len() && bytes[k] == b'-' {
                k += 1;
            }
            if k < bytes.len() && bytes[k].is_ascii_digit() {
                while k < bytes.len() && bytes[k].is_ascii_digit() {
                    k += 1;
                }
                j = k;
            }
        }
        let token = &text[i..j];
        match token.parse::<f64>() {
            Ok(x) if token.contains(['.', 'e']) => out.push_str(&format!("{x:.8e}")),
            _ => out.push_str(token),
        }
        i = j;
    }
    out
}

/// Two decimals, for alt text.
fn two(x: f64) -> String {
    crate::format::fixed(x, 2)
}

/// Prepares an example-based figure. `query` is the index of the followed query, if any.
pub(crate) fn prepare_example(
    decl: &FigureDecl,
    inputs: &AttentionInputs,
    result: &AttentionResult,
    query: Option<usize>,
) -> Result<Prepared, String> {
    let (rows, cols) = (inputs.query_labels(), inputs.key_labels());
    let weights: Vec<Vec<f64>> = result.weights.rows().into_iter().map(|r| r.to_vec()).collect();
    let plot = match decl.kind {
        FigureKind::Heatmap => {
            let mut h = Heatmap::new(rows.clone(), cols.clone(), weights.clone());
            h.title = "Attention weights".to_string();
            if result.traces.iter().any(|t| t.kept.iter().any(|k| !k)) {
                h.masked = Some(result.traces.iter().map(|t| t.kept.iter().map(|k| !k).collect()).collect());
            }
            h.highlight_row = query;
            h.value_range = Some((0.0, 1.0));
            Plot::Heatmap(h)
        }
        FigureKind::QueryDiagram | FigureKind::ScoreCurve => {
            let i = query.ok_or("a `query` naming one of the example's tokens")?;
            if inputs.keys[0].len() != 2 {
                return Err(format!(
                    "an example with 2-wide queries and keys to draw in the plane (this one has d_k = {})",
                    inputs.keys[0].len()
                ));
            }
            let q = &inputs.queries[i];
            if decl.kind == FigureKind::QueryDiagram {
                let keys = cols
                    .iter()
                    .zip(&inputs.keys)
                    .map(|(l, k)| Vector2::new(format!("k {l}"), k[0], k[1]))
                    .collect();
                let mut d = QueryDiagram::new(
                    keys,
                    Vector2::new(format!("q {}", rows[i]), q[0], q[1]),
                    weights[i].clone(),
                );
                d.title = format!("Query “{}” and the keys", rows[i]);
                Plot::QueryDiagram(d)
            } else {
                Plot::ScoreCurves(score_curves(inputs, i, &rows[i])?)
            }
        }
        FigureKind::ScalingVariance | FigureKind::ScalingSaturation | FigureKind::Measurements => {
            return Err("an example-free figure".into());
        }
        FigureKind::TileTrace => return Err("a `qkv tiled` block".into()),
    };
    let alt = match decl.kind {
        FigureKind::Heatmap => {
            let rows_text: Vec<String> = rows
                .iter()
                .zip(&weights)
                .map(|(r, w)| {
                    format!("row {r}: {}", w.iter().map(|&x| two(x)).collect::<Vec<_>>().join(", "))
                })
                .collect();
            format!(
                "Heatmap of the attention weights, one row per query and one column per key ({}); {}.",
                cols.join(", "),
                rows_text.join("; ")
            )
        }
        FigureKind::QueryDiagram => {
            let i = query.unwrap_or(0);
            let parts: Vec<String> =
                cols.iter().zip(&weights[i]).map(|(c, w)| format!("{c} {}", two(*w))).collect();
            format!(
                "Arrows for the keys and the query of “{}” in the plane; its weights: {}.",
                rows[i],
                parts.join(", ")
            )
        }
        _ => {
            let i = query.unwrap_or(0);
            let out: Vec<String> = result.output.row(i).iter().map(|&x| two(x)).collect();
            format!(
                "Curves of each key's weight and of the output as the query of “{}” turns around the circle; at its current direction the output is {}.",
                rows[i],
                out.join(", ")
            )
        }
    };
    let size = plot.size();
    let hash = hash_of(&format!("{plot:?}|{size:?}|{alt}"));
    Ok(Prepared { hash, alt, size, plot: Deferred::Ready(Box::new(plot)) })
}

/// Sweeps the query's direction around the circle (same length), computing weights and output
/// with the engine at each angle; the marker sits at the query's own angle.
fn score_curves(inputs: &AttentionInputs, i: usize, label: &str) -> Result<ScoreCurves, String> {
    let q = &inputs.queries[i];
    let radius = q[0].hypot(q[1]);
    if radius == 0.0 {
        return Err("a query that is not the zero vector (it has no direction to sweep)".into());
    }
    let angle = q[1].atan2(q[0]).rem_euclid(2.0 * PI).to_degrees();
    let degrees: Vec<f64> = (0..=180).map(|s| f64::from(s) * 2.0).collect();
    let (k, v) = (array(&inputs.keys), array(&inputs.values));
    let masks = inputs.masks();
    let options = inputs.options(&masks);
    // The swept query keeps its row among the others, so every mask (causal, window, key length,
    // padding, ALiBi) treats it as it treats query i.
    let mut queries = array(&inputs.queries);
    let n_k = inputs.keys.len();
    let d_v = inputs.values[0].len();
    let mut weights = vec![Vec::with_capacity(degrees.len()); n_k];
    let mut outputs = vec![Vec::with_capacity(degrees.len()); d_v];
    for &deg in &degrees {
        let t = deg.to_radians();
        queries[[i, 0]] = radius * t.cos();
        queries[[i, 1]] = radius * t.sin();
        let a =
            qkv::trace_query(queries.view(), k.view(), v.view(), i, &options).map_err(|e| e.to_string())?;
        for (j, series) in weights.iter_mut().enumerate() {
            series.push(a.weights[j]);
        }
        for (c, series) in outputs.iter_mut().enumerate() {
            series.push(a.output[c]);
        }
    }
    let labels = inputs.key_labels();
    let here: Vec<String> = inputs.queries[i].iter().map(|&x| crate::format::shown(x, 2).text).collect();
    let out_here =
        qkv::trace_query(array(&inputs.queries).view(), k.view(), v.view(), i, &inputs.options(&masks))
            .map_err(|e| e.to_string())?;
    let out_text: Vec<String> = out_here.output.iter().map(|&x| two(x)).collect();
    let mut curves = ScoreCurves::new(
        degrees,
        labels.iter().zip(weights).map(|(l, w)| Series::new(format!("weight on {l}"), w)).collect(),
        outputs
            .into_iter()
            .enumerate()
            .map(|(c, o)| {
                Series::new(if d_v == 1 { "output".to_string() } else { format!("output {}", c + 1) }, o)
            })
            .collect(),
    );
    curves.title = format!("Sweeping the query of “{label}”");
    curves.x_title = "direction of q (degrees)".to_string();
    // Every 90 degrees: at 45 the labels of a phone-sized figure touch.
    curves.x_ticks = Some((0..=4).map(|i| f64::from(i) * 90.0).collect());
    curves.marker = Some(VerticalMarker {
        x: angle,
        label: format!("q = ({}): output {}", here.join(", "), out_text.join(", ")),
    });
    Ok(curves)
}

/// Prepares a tile trace: per block of keys, the block's largest score and the running maximum
/// `m` (scores, left axis), and the running sum `l` (right axis), from the engine's trace.
pub(crate) fn prepare_tiled(t: &TiledResult) -> Result<Prepared, String> {
    let blocks = &t.trace.blocks;
    let (block_max, m): (Vec<f64>, Vec<f64>) = blocks
        .iter()
        .map(|b| b.block_max.zip(b.max_after))
        .collect::<Option<Vec<_>>>()
        .ok_or("a trace whose every block has a visible key (a masked block has no maximum to draw)")?
        .into_iter()
        .unzip();
    let l: Vec<f64> = blocks.iter().map(|b| b.sum_after).collect();
    let x: Vec<f64> = (1..=blocks.len()).map(|k| k as f64).collect();
    let mut chart = LineChart::new(
        x.clone(),
        vec![Series::new("block max", block_max.clone()), Series::new("running max m", m.clone())],
    );
    chart.title = format!("The online softmax of “{}”", t.inputs.query_labels()[t.query]);
    chart.x_title = "block of keys".into();
    chart.y_title = "score".into();
    chart.x_ticks = Some(x);
    chart.markers = true;
    chart.secondary = Some(SecondaryAxis {
        title: "running sum l".into(),
        series: vec![Series::new("running sum l", l.clone())],
        range: None,
    });
    let list = |xs: &[f64]| xs.iter().map(|&x| two(x)).collect::<Vec<_>>().join(", ");
    let alt = format!(
        "Line chart over the {} blocks of keys: each block's largest score ({}), the running maximum m, which only rises ({}), and the running sum l ({}).",
        blocks.len(),
        list(&block_max),
        list(&m),
        list(&l)
    );
    let plot = Plot::Line(chart);
    let size = plot.size();
    let hash = hash_of(&format!("{plot:?}|{size:?}|{alt}"));
    Ok(Prepared { hash, alt, size, plot: Deferred::Ready(Box::new(plot)) })
}

/// Prepares a Monte Carlo figure: hashed by its parameters, computed only when rendered.
pub(crate) fn prepare_scaling(decl: &FigureDecl) -> Prepared {
    let (seed, trials, dims) = (decl.seed, decl.trials, decl.dims.clone());
    let dims_text = dims.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    let (alt, plot) = match decl.kind {
        FigureKind::ScalingVariance => (
            format!(
                "Line chart over d_k = {dims_text} ({trials} random pairs each, seed {seed}): the variance of q·k grows like d_k, while q·k/√d_k stays near 1."
            ),
            Deferred::Variance { seed, trials, dims },
        ),
        _ => (
            format!(
                "Line chart over d_k = {dims_text} ({trials} random trials each, seed {seed}): without scaling the largest softmax weight climbs toward 1 (saturation); with scaling it stays put."
            ),
            Deferred::Saturation { seed, trials, dims },
        ),
    };
    let hash =
        hash_of(&format!("montecarlo v{MONTE_CARLO_VERSION}|{:?}|{plot:?}|{LINE_SIZE:?}|{alt}", decl.kind));
    Prepared { hash, alt, size: LINE_SIZE, plot }
}

/// Draws a prepared figure: SVG text and PNG bytes.
pub(crate) fn render(prepared: &Prepared) -> Result<qkv_plot::Figure, String> {
    let plot = match &prepared.plot {
        Deferred::Ready(p) => (**p).clone(),
        Deferred::Variance { seed, trials, dims } => {
            let data = montecarlo::variance(*seed, *trials, dims);
            let x: Vec<f64> = dims.iter().map(|&d| d as f64).collect();
            let mut chart = LineChart::new(
                x.clone(),
                vec![
                    Series::new("Var(q·k)", data.raw),
                    Series::new("Var(q·k / √d_k)", data.scaled),
                    Series::reference("d_k", x.clone()),
                    Series::reference("1", vec![1.0; x.len()]),
                ],
            );
            chart.title = "The spread of the scores".into();
            chart.x_title = "d_k (width of q and k)".into();
            chart.y_title = "variance over random pairs".into();
            chart.x_scale = Scale::Log;
            chart.y_scale = Scale::Log;
            chart.markers = true;
            Plot::Line(chart)
        }
        Deferred::Saturation { seed, trials, dims } => {
            let data = montecarlo::saturation(*seed, *trials, dims).map_err(|e| e.to_string())?;
            let x: Vec<f64> = dims.iter().map(|&d| d as f64).collect();
            let mut chart = LineChart::new(
                x,
                vec![
                    Series::new("raw scores q·k", data.raw),
                    Series::new("scaled scores q·k / √d_k", data.scaled),
                ],
            );
            chart.title = "Largest of 8 softmax weights".into();
            chart.x_title = "d_k (width of q and k)".into();
            chart.y_title = "mean of the largest weight".into();
            chart.x_scale = Scale::Log;
            chart.y_range = Some((0.0, 1.0));
            chart.markers = true;
            Plot::Line(chart)
        }
    };
    let size = plot.size();
    let result = match &plot {
        Plot::Heatmap(h) => qkv_plot::heatmap(h, size),
        Plot::QueryDiagram(d) => qkv_plot::query_diagram(d, size),
        Plot::ScoreCurves(c) => qkv_plot::score_curves(c, size),
        Plot::Line(c) => qkv_plot::line_chart(c, size),
    };
    result.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
