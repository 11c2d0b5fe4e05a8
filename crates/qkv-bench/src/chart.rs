//! The bar chart of a run: GFLOP/s per shape, qkv beside each peer (all threads), the GEMM
//! ceiling as a line.

use qkv_plot::{BarChart, BarSeries, Figure, ReferenceLine, Size, bar_chart};

use crate::cases::Case;
use crate::peers::Ceiling;
use crate::report::Row;

/// Draws `rows` (of `cases`) at each implementation's largest thread count.
pub fn draw(rows: &[Row], cases: &[Case], ceiling: Option<&Ceiling>) -> anyhow::Result<Figure> {
    let threads = rows.iter().map(|r| r.threads).max().unwrap_or(1);
    let shown = |r: &Row| {
        r.threads == threads && (r.is_qkv() || r.is_peer()) && !r.implementation.contains("reference")
    };
    // qkv first, then the peers in the order they were measured.
    let mut implementations: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| shown(r)) {
        if !implementations.contains(&r.implementation.as_str()) {
            implementations.push(&r.implementation);
        }
    }
    implementations.sort_by_key(|name| !name.starts_with("qkv"));
    let categories: Vec<String> = cases.iter().map(Case::label).collect();
    let series = implementations
        .iter()
        .map(|&name| BarSeries {
            label: name.to_string(),
            values: categories
                .iter()
                .map(|shape| {
                    rows.iter()
                        .find(|r| shown(r) && r.implementation == name && &r.shape == shape)
                        .map(|r| r.gflops)
                })
                .collect(),
        })
        .collect();
    let spec = BarChart {
        title: format!("Attention throughput, f32, d = 64, {threads} threads"),
        value_title: "GFLOP/s (4 · n_q · n_k · d per head, half when causal)".to_string(),
        categories,
        series,
        references: ceiling
            .map(|c| ReferenceLine { label: format!("f32 GEMM ceiling ({})", c.label), value: c.gflops })
            .into_iter()
            .collect(),
    };
    // About 14 pixels per bar, so that every label keeps its own line.
    let bars = spec.categories.len() * spec.series.len().max(1);
    let height = (160 + 14 * bars).clamp(480, 4000) as u32;
    Ok(bar_chart(&spec, Size::new(900, height))?)
}
