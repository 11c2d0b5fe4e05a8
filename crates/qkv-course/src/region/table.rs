//! `table EXAMPLE inputs|weights|scores|projections|w_qkv`: an attention example's inputs, its weight or
//! score matrix (weights with a row-sum and an output column; masked cells say so), or the
//! embeddings and projections its inputs came from; `table MATRIX` for a `qkv matrix` block; and
//! `table MULTIHEAD x|concat|w_o|output` for a multi-head example (`MULTIHEAD.heads.HEAD` is a
//! head, with every view of an attention example).
//!
//! Inputs are numbers the author wrote, so they are shown as the worked steps show them (`0.5`,
//! not `0.5000`); weights and scores are computed, and keep a fixed number of decimals so their
//! columns line up.

use std::fmt::Write;

mod block;
mod gradient;
mod positions;

use super::{Context, Generated, Kind};
use crate::error::Problem;
use crate::eval::{AttentionInputs, AttentionResult, Computed};
use crate::format::shown;

pub(super) const KIND: Kind = Kind {
    name: "table",
    usage: "`table EXAMPLE inputs|weights|scores|projections|w_qkv`",
    options: &["digits"],
    generate,
};

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
    if let Computed::Block(b) = &named.computed {
        let body = block::table(b, &named.rest, cx.args.get(1).copied(), cx.digits).map_err(|expected| {
            cx.problem(format!("`{}` is not a table of a block", cx.what.trim()), expected)
        })?;
        return Ok(cx.markdown(body));
    }
    if let Computed::Positions(p) = &named.computed {
        let body =
            positions::table(p, &named.rest, cx.args.get(1).copied(), cx.digits).map_err(|expected| {
                cx.problem(format!("`{}` is not a table of a positions block", cx.what.trim()), expected)
            })?;
        return Ok(cx.markdown(body));
    }
    if let Computed::Gradient(g) = &named.computed {
        let body =
            gradient::table(g, &named.rest, cx.args.get(1).copied(), cx.digits).map_err(|expected| {
                cx.problem(format!("`{}` is not a table of a gradient block", cx.what.trim()), expected)
            })?;
        return Ok(cx.markdown(body));
    }
    let body = match (named.computed, named.rest.is_empty()) {
        (Computed::Attention { inputs, .. }, true) if field == "inputs" => {
            cx.at_most_shown(&shown_counts(&inputs))?;
            inputs_table(&inputs, cx.digits)
        }
        (Computed::Attention { inputs, .. }, true) if field == "projections" || field == "w_qkv" => {
            let Some(p) = &inputs.projection else {
                return Err(cx.problem(
                    format!(
                        "`{target}` has no projections: its queries, keys and values are given as numbers"
                    ),
                    "an example with `x` (or `x_q` and `x_kv`) and `w_q`, `w_k`, `w_v`",
                ));
            };
            cx.at_most_shown(&shown_counts(&inputs))?;
            projections_table(&inputs, p, field == "w_qkv", cx.digits)
        }
        (Computed::Attention { inputs, result: Ok(result) }, true) => match field {
            "weights" | "scores" => {
                cx.at_most_shown(&shown_counts(&inputs))?;
                let m = if field == "weights" { &result.weights } else { &result.scores };
                matrix_table(&inputs, &result, m, field, cx.digits)
            }
            other => {
                return Err(cx.problem(
                    format!("unknown table `{other}`"),
                    "`inputs`, `weights`, `scores`, `projections` or `w_qkv`",
                ));
            }
        },
        (Computed::Matrix { labels, rows }, true) => {
            cx.at_most_shown(&[(rows.len(), "rows"), (rows.first().map_or(0, Vec::len), "columns")])?;
            labelled_table("row", &labels, &rows, cx.digits)
        }
        (Computed::Decode(d), true) => {
            cx.at_most_shown(&[(d.steps.len(), "decoding steps")])?;
            decode_table(&d, cx.digits)
        }
        (Computed::MultiHead(m), true) => {
            let (header, labels, rows) = match field {
                "x" => ("token", m.tokens.clone(), &m.x),
                "concat" => ("token", m.tokens.clone(), &m.concat),
                "output" => ("token", m.tokens.clone(), &m.output),
                "w_o" => ("row", numbers(m.w_o.len()), &m.w_o),
                other => {
                    return Err(cx.problem(
                        format!("unknown table `{other}` of a multi-head example"),
                        "`x`, `concat`, `w_o` or `output`; `table MULTIHEAD.heads.HEAD weights` for one head",
                    ));
                }
            };
            cx.at_most_shown(&[(rows.len(), "rows"), (rows.first().map_or(0, Vec::len), "columns")])?;
            labelled_table(header, &labels, rows, cx.digits)
        }
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
            let output = output_cell(result, i, digits);
            let _ = write!(out, " {} | {output} |", crate::format::fixed(m.row(i).sum(), digits));
        }
        out.push('\n');
    }
    out
}

/// Query `i`'s output as a table cell: a number, or a tuple when values are wider than one.
pub(super) fn output_cell(result: &AttentionResult, i: usize, digits: usize) -> String {
    let output: Vec<String> = result.output.row(i).iter().map(|&x| crate::format::fixed(x, digits)).collect();
    if output.len() == 1 { output[0].clone() } else { format!("({})", output.join(", ")) }
}

/// A decoded example, a row per token: whether it came with the prompt or was decoded, how many
/// positions the cache holds when it attends, its weights over them (the keys still to come are
/// not in the cache yet) and its output.
fn decode_table(d: &crate::eval::DecodeResult, digits: usize) -> String {
    let all = d.steps.last().map(|(_, inputs, _)| inputs.key_labels()).unwrap_or_default();
    let mut out = String::from("| token | step | cache length |");
    for key in &all {
        let _ = write!(out, " {} |", escape_cell(key));
    }
    out.push_str(" output |\n|:--|:--|--:|");
    out.push_str(&"--:|".repeat(all.len()));
    out.push_str("--:|\n");
    for (t, (label, inputs, result)) in d.steps.iter().enumerate() {
        let step = if t < d.prompt { "prompt".to_string() } else { format!("decode {}", t + 1 - d.prompt) };
        // A prompt is appended whole, then attended under the causal mask.
        let _ = write!(out, "| {} | {step} | {} |", escape_cell(label), inputs.keys.len().max(d.prompt));
        for j in 0..all.len() {
            let cell = if j < inputs.keys.len() {
                crate::format::fixed(result.weights[[0, j]], digits)
            } else {
                "·".into()
            };
            let _ = write!(out, " {cell} |");
        }
        let output: Vec<String> =
            result.output.row(0).iter().map(|&x| crate::format::fixed(x, digits)).collect();
        let output = if output.len() == 1 { output[0].clone() } else { format!("({})", output.join(", ")) };
        let _ = writeln!(out, " {output} |");
    }
    out
}

/// `1..=n` as labels.
fn numbers(n: usize) -> Vec<String> {
    (1..=n).map(|i| i.to_string()).collect()
}

/// A matrix with a label per row and a column per component, numbers as the steps show them.
fn labelled_table(header: &str, labels: &[String], rows: &[Vec<f64>], digits: usize) -> String {
    let width = rows.first().map_or(0, Vec::len);
    let mut out = format!("| {header} |");
    for c in 1..=width {
        let _ = write!(out, " {c} |");
    }
    out.push_str("\n|:--|");
    out.push_str(&"--:|".repeat(width));
    out.push('\n');
    for (label, row) in labels.iter().zip(rows) {
        let _ = write!(out, "| {} |", escape_cell(label));
        for &x in row {
            let _ = write!(out, " {} |", shown(x, digits).text);
        }
        out.push('\n');
    }
    out
}

/// The embeddings, each projection and each product: `X`, `W_q`, `W_k`, `W_v`, then
/// `Q = X W_q`, `K = X W_k`, `V = X W_v` (with `X_q` and `X_kv` for cross-attention).
/// With `weights_only`, the three matrices `W` alone (for an example whose `X` a page shows
/// elsewhere, or whose heads read another input).
fn projections_table(
    inputs: &AttentionInputs,
    p: &crate::eval::Projection,
    weights_only: bool,
    digits: usize,
) -> String {
    let (ql, kl) = (inputs.query_labels(), inputs.key_labels());
    let weights = [("W_q", &p.w_q), ("W_k", &p.w_k), ("W_v", &p.w_v)]
        .map(|(name, w)| (format!("${name}$"), labelled_table("row", &numbers(w.len()), w, digits)));
    let join = |parts: &[(String, String)]| {
        parts.iter().map(|(title, table)| format!("**{title}**\n\n{table}")).collect::<Vec<_>>().join("\n")
    };
    if weights_only {
        return join(&weights);
    }
    let (x_q, x_kv) = match &p.x_kv {
        None => ("X", "X"),
        Some(_) => ("X_q", "X_{kv}"),
    };
    let mut parts = vec![(format!("${x_q}$, the embeddings"), labelled_table("token", &ql, &p.x_q, digits))];
    if let Some(x) = &p.x_kv {
        parts.push((
            format!("${x_kv}$, the embeddings of the keys' tokens"),
            labelled_table("token", &kl, x, digits),
        ));
    }
    parts.extend(weights);
    for (name, from, w, labels, rows) in [
        ("Q", x_q, "W_q", &ql, &inputs.queries),
        ("K", x_kv, "W_k", &kl, &inputs.keys),
        ("V", x_kv, "W_v", &kl, &inputs.values),
    ] {
        parts.push((format!("${name} = {from} {w}$"), labelled_table("token", labels, rows, digits)));
    }
    join(&parts)
}

/// A label as table-cell markdown: no HTML, no emphasis, no column breaks.
pub(super) fn escape_cell(s: &str) -> String {
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
