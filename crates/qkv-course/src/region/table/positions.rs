//! Tables of a positions block: `table POSITIONS sweep` (each point of the sweep: the positions,
//! the RoPE score and the score with sinusoidal encodings added) and `table POSITIONS encoding`
//! (the sinusoidal encoding of each position).

use std::fmt::Write;

use crate::eval::PositionsResult;
use crate::format::shown;

const USAGE: &str = "`table POSITIONS sweep` or `table POSITIONS encoding`; `table POSITIONS.rope weights` for the rotated example";

/// The table `field` names, or what was expected.
pub(super) fn table(
    p: &PositionsResult,
    rest: &[String],
    field: Option<&str>,
    digits: usize,
) -> Result<String, String> {
    match (rest, field) {
        ([], Some("sweep")) => {
            let mut out = String::from("| query at | key at | RoPE | sinusoids |\n|--:|--:|--:|--:|\n");
            for s in &p.sweep {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {} |",
                    s.query_position,
                    s.key_position,
                    shown(s.rope_score, digits).text,
                    shown(s.sinusoid_score, digits).text
                );
            }
            Ok(out)
        }
        ([], Some("encoding")) => {
            let positions = p.sweep.last().map_or(0, |s| s.query_position + 1);
            let d = p.sweep.first().map_or(0, |s| s.rope_query.len());
            let mut out = String::from("| position |");
            for i in 0..d / 2 {
                let _ = write!(out, " $\\sin(m\\theta_{})$ | $\\cos(m\\theta_{})$ |", i + 1, i + 1);
            }
            out.push_str("\n|--:|");
            out.push_str(&"--:|".repeat(d));
            out.push('\n');
            for m in 0..positions {
                let _ = write!(out, "| {m} |");
                for x in crate::eval::positions_sinusoid(m as f64, d, p.base) {
                    let _ = write!(out, " {} |", shown(x, digits).text);
                }
                out.push('\n');
            }
            Ok(out)
        }
        _ => Err(USAGE.to_string()),
    }
}
