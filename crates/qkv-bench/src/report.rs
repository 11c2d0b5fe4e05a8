//! The result rows, the printed table and the JSON written by `--json`.

use std::collections::HashMap;
use std::fmt::Write;

use serde::Serialize;

use crate::cases::Case;
use crate::measure::Measurement;
use crate::peers::Ceiling;

/// One measured (shape, implementation) pair, as written to JSON: the case's fields sit flat
/// beside the measurement.
#[derive(Debug, Serialize)]
pub struct Row {
    pub shape: String,
    pub implementation: String,
    #[serde(flatten)]
    pub case: Case,
    pub threads: usize,
    pub median_ms: f64,
    pub gflops: f64,
    pub peak_mb: Option<f64>,
}

impl Row {
    pub fn new(case: &Case, implementation: &str, threads: usize, m: &Measurement) -> Row {
        Row {
            shape: case.label(),
            implementation: implementation.to_string(),
            case: *case,
            threads,
            median_ms: m.median_ms,
            gflops: m.gflops,
            peak_mb: m.peak_mb,
        }
    }

    /// The GEMM ceiling as a row of its own (shape `f32 GEMM`, no attention sizes).
    pub fn ceiling(c: &Ceiling, threads: usize) -> Row {
        Row {
            shape: "f32 GEMM".into(),
            implementation: c.label.clone(),
            case: Case { batch: 1, heads: 1, kv_heads: 1, n_q: 0, n_k: 0, d: 0, causal: false },
            threads,
            median_ms: c.median_ms,
            gflops: c.gflops,
            peak_mb: None,
        }
    }

    fn is_qkv(&self) -> bool {
        self.implementation.starts_with("qkv")
    }
}

/// The table: one line per row, with the ratio to the best peer on the same shape (peers are the
/// implementations that are not qkv), the fraction of the GEMM ceiling for qkv, and peak memory
/// above the inputs where `n_k >= 16384`.
pub fn table(rows: &[Row], ceiling: Option<f64>) -> String {
    let mut best_peer: HashMap<&str, f64> = HashMap::new();
    for r in rows.iter().filter(|r| !r.is_qkv()) {
        let best = best_peer.entry(&r.shape).or_insert(0.0);
        *best = best.max(r.gflops);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| {:<22} | {:<36} | {:>7} | {:>10} | {:>8} | {:>12} | {:>7} | {:>8} |",
        "shape (d = 64)",
        "implementation",
        "threads",
        "median ms",
        "GFLOP/s",
        "vs best peer",
        "of GEMM",
        "peak MB"
    );
    let _ = writeln!(
        out,
        "|{:-<24}|{:-<38}|{:->9}|{:->12}|{:->10}|{:->14}|{:->9}|{:->10}|",
        ":", ":", ":", ":", ":", ":", ":", ":"
    );
    for r in rows {
        let vs_peer = match best_peer.get(r.shape.as_str()) {
            Some(&best) if r.is_qkv() && best > 0.0 => format!("{:.1}x", r.gflops / best),
            _ => String::new(),
        };
        let of_gemm = match ceiling {
            Some(c) if r.is_qkv() => format!("{:.0}%", 100.0 * r.gflops / c),
            _ => String::new(),
        };
        let peak = match r.peak_mb {
            Some(mb) if r.case.n_k >= 16384 => format!("{mb:.0}"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "| {:<22} | {:<36} | {:>7} | {:>10.3} | {:>8.1} | {:>12} | {:>7} | {:>8} |",
            r.shape, r.implementation, r.threads, r.median_ms, r.gflops, vs_peer, of_gemm, peak
        );
    }
    out
}
