//! `table EXAMPLE inputs|weights|scores`: an attention example's inputs, or its weight or score
//! matrix, as a markdown table (weights with a row-sum and an output column; masked cells say so).
//!
//! Inputs are numbers the author wrote, so they are shown as the worked steps show them (`0.5`,
//! not `0.5000`); weights and scores are computed, and keep a fixed number of decimals so their
//! columns line up.

use std::fmt::Write;

use super::{Context, Generated, Kind};
use crate::error::Problem;
use crate::eval::{AttentionInputs, AttentionResult, Computed};
use crate::format::shown;

pub(super) const KIND: Kind =
    Kind { name: "table", usage: "`table EXAMPLE inputs|weights|scores`", options: &["digits"], generate };

/// What a table of an example shows, for [`Context::at_most_shown`]: a row per query, a column
/// per key, and vectors as wide as the queries or the values.
pub(super) fn shown_counts(inputs: &AttentionInputs) -> [(usize, &'static str); 3] {
    let width = |rows: &[Vec<f64>]| rows.first().map_or(0, Vec::len);
    let widths = width(&inputs.queries).max(width(&inputs.values));
    [(inputs.queries.len(), "queries"), (inputs.keys.len(), "keys"), (widths, "components of a vector")]
}

fn generate(cx: &mut Context<'_, '_>) -> Result<Generated, Problem> {
    let named = cx.named(KIND.usage)?;
    let field = cx.args.get(1).copied().unwrap_or("weights");
    let target = cx.args[0];
    let body = match (named.computed, named.rest.is_empty()) {
        (Computed::Attention { inputs, .. }, true) if field == "inputs" => {
            cx.at_most_shown(&shown_counts(&inputs))?;
            inputs_table(&inputs, cx.digits)
        }
        (Computed::Attention { inputs, result: Ok(result) }, true) => match field {
            "weights" | "scores" => {
                cx.at_most_shown(&shown_counts(&inputs))?;
                let m = if field == "weights" { &result.weights } else { &result.scores };
                matrix_table(&inputs, &result, m, field, cx.digits)
            }
            other => {
                return Err(cx.problem(format!("unknown table `{other}`"), "`inputs`, `weights` or `scores`"));
            }
        },
        _ => {
            return Err(cx.problem(
                format!("`{target}` is not an attention example that computes"),
                "the id of a `qkv attention` block",
            ));
        }
    };
    Ok(cx.markdown(body))
}

/// The inputs of an attention example. Self-attention: one table, a row per token with its query,
/// key and value. When the queries go by other labels than the keys (cross-attention, or counts
/// that differ), a table of the queries and one of the keys and values, so that no query is shown
/// on the row of a key it does not belong to.
pub(super) fn inputs_table(inputs: &AttentionInputs, digits: usize) -> String {
    let vector = |r: &[f64]| {
        let parts: Vec<String> = r.iter().map(|&x| shown(x, digits).text).collect();
        if parts.len() == 1 { parts[0].clone() } else { format!("({})", parts.join(", ")) }
    };
    // An example declared with `expect_error` may have fewer values than keys: cells can be empty.
    let cell = |rows: &[Vec<f64>], j: usize| rows.get(j).map_or(String::new(), |r| vector(r));
    let (ql, kl) = (inputs.query_labels(), inputs.key_labels());
    let mut out = String::new();
    if inputs.self_attention() {
        out.push_str("| token | query | key | value |\n|:--|:--|:--|--:|\n");
        for (j, label) in kl.iter().enumerate() {
            let [q, k, v] = [&inputs.queries, &inputs.keys, &inputs.values].map(|rows| cell(rows, j));
            let _ = writeln!(out, "| {} | {q} | {k} | {v} |", escape_cell(label));
        }
        return out;
    }
    out.push_str("| query token | query |\n|:--|:--|\n");
    for (i, label) in ql.iter().enumerate() {
        let _ = writeln!(out, "| {} | {} |", escape_cell(label), cell(&inputs.queries, i));
    }
    out.push_str("\n| key token | key | value |\n|:--|:--|--:|\n");
    for (j, label) in kl.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            escape_cell(label),
            cell(&inputs.keys, j),
            cell(&inputs.values, j)
        );
    }
    out
}

/// A matrix (weights or scores) as a markdown table; weights get a row-sum column and each
/// query's output, so the table shows where every row's blend lands.
pub(super) fn matrix_table(
    inputs: &AttentionInputs,
    result: &AttentionResult,
    m: &ndarray::Array2<f64>,
    what: &str,
    digits: usize,
) -> String {
    let (rows, cols) = (inputs.query_labels(), inputs.key_labels());
    let with_sum = what == "weights";
    let mut out = String::new();
    let _ = write!(out, "| query ↓ · key → |");
    for c in &cols {
        let _ = write!(out, " {} |", escape_cell(c));
    }
    if with_sum {
        out.push_str(" row sum | output |");
    }
    out.push_str("\n|:--|");
    for _ in &cols {
        out.push_str("--:|");
    }
    if with_sum {
        out.push_str("--:|--:|");
    }
    out.push('\n');
    for (i, r) in rows.iter().enumerate() {
        let _ = write!(out, "| **{}** |", escape_cell(r));
        for j in 0..cols.len() {
            let x = m[[i, j]];
            let cell = crate::format::fixed(x, digits);
            let masked = !result.traces[i].kept[j];
            let _ = write!(
                out,
                " {} |",
                if masked { format!("{} (masked)", crate::format::fixed(x, 0)) } else { cell }
            );
        }
        if with_sum {
            let output: Vec<String> =
                result.output.row(i).iter().map(|&x| crate::format::fixed(x, digits)).collect();
            let output =
                if output.len() == 1 { output[0].clone() } else { format!("({})", output.join(", ")) };
            let _ = write!(out, " {} | {output} |", crate::format::fixed(m.row(i).sum(), digits));
        }
        out.push('\n');
    }
    out
}

/// A label as table-cell markdown: no HTML, no emphasis, no column breaks.
fn escape_cell(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '|' | '*' | '_' | '`' | '\\' | '[' | ']' => {
                out.push('\\');
                out.push(c);
            }
            _ => out.push(c),
        }
    }
    out
}
