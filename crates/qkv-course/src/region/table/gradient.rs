//! Tables of a gradient block: `table GRADIENT gradients` (each token's `dq`, `dk`, `dv`), `table
//! GRADIENT.TOKEN jacobian` (the softmax's Jacobian for one query) and `table GRADIENT steps` (the
//! loss and the outputs after each gradient step).

use std::fmt::Write;

use super::escape_cell;
use crate::eval::GradientResult;
use crate::format::shown;

/// The usage of a gradient block's tables, for messages.
const USAGE: &str = "`table GRADIENT gradients`, `table GRADIENT steps` or `table GRADIENT.TOKEN jacobian`";

/// A vector as a cell: `(a, b)`, or one number bare.
fn cell(xs: &[f64], digits: usize) -> String {
    let parts: Vec<String> = xs.iter().map(|&x| shown(x, digits).text).collect();
    if parts.len() == 1 { parts[0].clone() } else { format!("({})", parts.join(", ")) }
}

/// The table `rest` (past the block) and `field` name, or what was expected.
pub(super) fn table(
    g: &GradientResult,
    rest: &[String],
    field: Option<&str>,
    digits: usize,
) -> Result<String, String> {
    let (ql, kl) = g.labels();
    let start = &g.steps[0];
    match (rest, field) {
        ([], Some("gradients")) => {
            let mut out = String::from("| token | $dq$ | $dk$ | $dv$ |\n|:--|:--|:--|:--|\n");
            for (i, label) in kl.iter().enumerate() {
                // Self-attention: one row per token holds its query's, key's and value's gradients.
                let dq = ql
                    .iter()
                    .position(|q| q == label)
                    .map_or(String::new(), |r| cell(&start.d_queries[r], digits));
                let _ = writeln!(
                    out,
                    "| {} | {dq} | {} | {} |",
                    escape_cell(label),
                    cell(&start.d_keys[i], digits),
                    cell(&start.d_values[i], digits)
                );
            }
            Ok(out)
        }
        ([], Some("steps")) => {
            let mut out = String::from("| step | loss |");
            for q in &ql {
                let _ = write!(out, " output of {} |", escape_cell(q));
            }
            out.push_str("\n|--:|--:|");
            out.push_str(&"--:|".repeat(ql.len()));
            out.push('\n');
            for (s, step) in g.steps.iter().enumerate() {
                let _ = write!(out, "| {s} | {} |", shown(step.loss, digits).text);
                for row in step.result.output.rows() {
                    let _ = write!(out, " {} |", cell(&row.to_vec(), digits));
                }
                out.push('\n');
            }
            Ok(out)
        }
        ([token], Some("jacobian")) => {
            let i = ql
                .iter()
                .position(|q| q == token)
                .ok_or_else(|| format!("`{token}` is not a query: one of {}", ql.join(", ")))?;
            let jacobian = g.jacobian(i);
            let mut out = String::from("| $\\partial p_j / \\partial s_k$ |");
            for k in &kl {
                let _ = write!(out, " $k$ = {} |", escape_cell(k));
            }
            out.push_str("\n|:--|");
            out.push_str(&"--:|".repeat(kl.len()));
            out.push('\n');
            for (j, label) in kl.iter().enumerate() {
                let _ = write!(out, "| $j$ = {} |", escape_cell(label));
                for x in &jacobian[j] {
                    let _ = write!(out, " {} |", shown(*x, digits).text);
                }
                out.push('\n');
            }
            Ok(out)
        }
        _ => Err(USAGE.to_string()),
    }
}
