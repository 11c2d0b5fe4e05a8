//! The result rows, the printed table and the JSON written by `--json`.

use std::collections::HashMap;
use std::fmt::Write;

use serde::{Deserialize, Serialize};

use crate::cases::Case;
use crate::measure::Measurement;
use crate::peers::Ceiling;

/// One measured (shape, implementation) pair, as written to JSON: the case's fields sit flat
/// beside the measurement. `peers.py` writes the same fields (without the optional ones).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    pub shape: String,
    pub implementation: String,
    #[serde(flatten)]
    pub case: Case,
    pub threads: usize,
    pub median_ms: f64,
    pub gflops: f64,
    #[serde(default)]
    pub peak_mb: Option<f64>,
    /// For a decoding step: the bytes of its keys and values over its time, in GB/s.
    #[serde(default)]
    pub kv_gbps: Option<f64>,
}

/// The implementation name of the streaming-read rows.
const STREAM: &str = "streaming read";
/// The shape name of the GEMM ceiling's row.
const CEILING: &str = "f32 GEMM";

impl Row {
    pub fn new(case: &Case, implementation: &str, threads: usize, m: &Measurement) -> Row {
        Row { peak_mb: m.peak_mb, ..Row::timed(case, implementation, threads, m.median) }
    }

    /// A row from a median time alone (a Python peer's), without peak memory.
    pub fn timed(case: &Case, implementation: &str, threads: usize, seconds: f64) -> Row {
        let median_ms = seconds * 1e3;
        Row {
            shape: case.label(),
            implementation: implementation.to_string(),
            case: *case,
            threads,
            median_ms,
            gflops: case.flops() / seconds / 1e9,
            peak_mb: None,
            kv_gbps: case.decodes().then(|| case.kv_bytes() as f64 / median_ms / 1e6),
        }
    }

    /// The GEMM ceiling as a row of its own (shape `f32 GEMM`, no attention sizes).
    pub fn ceiling(c: &Ceiling, threads: usize) -> Row {
        Row {
            shape: CEILING.into(),
            implementation: c.label.clone(),
            case: Case {
                batch: 1,
                heads: 1,
                kv_heads: 1,
                n_q: 0,
                n_k: 0,
                d: 0,
                causal: false,
                precision: Default::default(),
                cache: false,
                backward: false,
                ragged: false,
            },
            threads,
            median_ms: c.median_ms,
            gflops: c.gflops,
            peak_mb: None,
            kv_gbps: None,
        }
    }

    /// A streaming read of as many bytes as `case`'s keys and values, on the same row as it.
    pub fn stream(case: &Case, threads: usize, gbps: f64) -> Row {
        Row {
            shape: case.label(),
            implementation: STREAM.into(),
            case: *case,
            threads,
            median_ms: case.kv_bytes() as f64 / gbps / 1e6,
            gflops: 0.0,
            peak_mb: None,
            kv_gbps: Some(gbps),
        }
    }

    pub fn is_qkv(&self) -> bool {
        self.implementation.starts_with("qkv")
    }

    /// A peer that computes attention (not qkv, the streaming read or the GEMM ceiling).
    pub fn is_peer(&self) -> bool {
        !self.is_qkv() && self.implementation != STREAM && self.shape != CEILING
    }

    pub fn is_torch(&self) -> bool {
        self.implementation.starts_with("torch")
    }
}

/// The table: one line per row, with the ratio to the best peer on the same shape and thread
/// count (peers are the implementations that are not qkv, PyTorch among them), to PyTorch alone,
/// the fraction of the GEMM ceiling for qkv, for decoding steps the fraction of a streaming read
/// of as many bytes, for steps over a KV cache the tokens per second (one step of one layer), and
/// peak memory above the inputs where `n_k >= 16384`.
pub fn table(rows: &[Row], ceiling: Option<f64>) -> String {
    let mut best_peer: HashMap<(&str, usize), f64> = HashMap::new();
    let mut torch: HashMap<(&str, usize), f64> = HashMap::new();
    let mut stream: HashMap<&str, f64> = HashMap::new();
    for r in rows {
        if r.is_peer() {
            let best = best_peer.entry((&r.shape, r.threads)).or_insert(0.0);
            *best = best.max(r.gflops);
        }
        if r.is_torch() {
            torch.insert((&r.shape, r.threads), r.gflops);
        }
        if let (STREAM, Some(gbps)) = (r.implementation.as_str(), r.kv_gbps) {
            stream.insert(&r.shape, gbps);
        }
    }
    let ratio = |r: &Row, peer: Option<&f64>| match peer {
        Some(&p) if r.is_qkv() && p > 0.0 => format!("{:.2}x", r.gflops / p),
        _ => String::new(),
    };
    let mut out = String::new();
    let columns = [
        "shape (d = 64 unless named)",
        "implementation",
        "threads",
        "median ms",
        "GFLOP/s",
        "vs best peer",
        "vs torch",
        "of GEMM",
        "GB/s K+V",
        "of read BW",
        "tokens/s",
        "peak MB",
    ];
    let widths = [38, 38, 7, 10, 8, 12, 8, 7, 8, 10, 8, 7];
    let line = |cells: &[String]| {
        let cells: Vec<String> = cells
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| if i < 2 { format!(" {c:<w$} ") } else { format!(" {c:>w$} ") })
            .collect();
        format!("|{}|", cells.join("|"))
    };
    let _ = writeln!(out, "{}", line(&columns.map(String::from)));
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, &w)| {
            let dashes = "-".repeat(w + 1);
            if i < 2 { format!(":{dashes}") } else { format!("{dashes}:") }
        })
        .collect();
    let _ = writeln!(out, "|{}|", rule.join("|"));
    for r in rows {
        let of_gemm = match ceiling {
            Some(c) if r.is_qkv() && !r.case.decodes() => format!("{:.0}%", 100.0 * r.gflops / c),
            _ => String::new(),
        };
        let of_read = match (r.kv_gbps, stream.get(r.shape.as_str())) {
            (Some(gbps), Some(&read)) if r.is_qkv() => format!("{:.0}%", 100.0 * gbps / read),
            _ => String::new(),
        };
        let peak = match r.peak_mb {
            Some(mb) if r.case.n_k >= 16384 => format!("{mb:.0}"),
            _ => String::new(),
        };
        let gflops = if r.implementation == STREAM { String::new() } else { format!("{:.1}", r.gflops) };
        let tokens = if r.case.cache && r.implementation != STREAM {
            format!("{:.0}", 1e3 / r.median_ms)
        } else {
            String::new()
        };
        let cells = [
            r.shape.clone(),
            r.implementation.clone(),
            r.threads.to_string(),
            format!("{:.3}", r.median_ms),
            gflops,
            ratio(r, best_peer.get(&(r.shape.as_str(), r.threads))),
            ratio(r, torch.get(&(r.shape.as_str(), r.threads))),
            of_gemm,
            r.kv_gbps.map(|g| format!("{g:.1}")).unwrap_or_default(),
            of_read,
            tokens,
            peak,
        ];
        let _ = writeln!(out, "{}", line(&cells));
    }
    out
}
