//! Tables of a Transformer block: `table BLOCK.ORDER.TOKEN` (each stage of one token's pass, its
//! vector and its length), `table BLOCK w_1|b_1|w_2|b_2` (the feed-forward weights) and `table
//! BLOCK costs` (where the parameters and the operations of one token's pass go).

use std::fmt::Write;

use super::{labelled_table, numbers};
use crate::eval::{BlockResult, Order, length};
use crate::format::shown;

/// The usage of a block's tables, for messages.
pub(super) const USAGE: &str = "`table BLOCK.pre.TOKEN` or `table BLOCK.post.TOKEN` (one token's pass), `table BLOCK w_1|b_1|w_2|b_2` or `table BLOCK costs`";

/// The table `rest` (the path past the block) and `field` (the directive's second word) name,
/// or what was expected.
pub(super) fn table(
    b: &BlockResult,
    rest: &[String],
    field: Option<&str>,
    digits: usize,
) -> Result<String, String> {
    match (rest, field) {
        ([order, token], None) => {
            let order =
                Order::from_name(order).ok_or_else(|| format!("`{order}` is not an order: {USAGE}"))?;
            let i = b.tokens.iter().position(|t| t == token).ok_or_else(|| {
                format!("`{token}` is not a token of the block: one of {}", b.tokens.join(", "))
            })?;
            Ok(pass_table(b, order, i, digits))
        }
        ([], Some("costs")) => Ok(costs_table(b)),
        ([], Some(name @ ("w_1" | "w_2"))) => {
            let w = if name == "w_1" { &b.w_1 } else { &b.w_2 };
            Ok(labelled_table("row", &numbers(w.len()), w, digits))
        }
        ([], Some(name @ ("b_1" | "b_2"))) => {
            let (bias, label) = if name == "b_1" { (&b.b_1, "b₁") } else { (&b.b_2, "b₂") };
            // The label as it reads (a cell's `_` is escaped, and would show as typed).
            Ok(labelled_table("bias", &[label.to_string()], std::slice::from_ref(bias), digits))
        }
        _ => Err(USAGE.to_string()),
    }
}

/// One token's pass: a row per stage with its formula, its vector and the vector's length.
fn pass_table(b: &BlockResult, order: Order, i: usize, digits: usize) -> String {
    let (_, passes) = b.order(order);
    let mut out = String::from("| stage | length | vector |\n|:--|--:|:--|\n");
    for stage in passes[i].stages(order) {
        let parts: Vec<String> = stage.vector.iter().map(|&x| shown(x, digits).text).collect();
        let length = length(stage.vector);
        let _ = writeln!(
            out,
            "| ${}$ | {} | ({}) |",
            stage.formula,
            shown(length, digits).text,
            parts.join(", ")
        );
    }
    out
}

/// Where the parameters go and what one token's pass costs.
fn costs_table(b: &BlockResult) -> String {
    let c = &b.costs;
    let params = c.attention_params + c.ffn_params + c.norm_params;
    let flops = c.projection_flops + c.score_flops + c.ffn_flops;
    let share = |x: f64, of: f64| shown(100.0 * x / of, 1).text;
    let mut out = String::from("| part | parameters | % | operations | % |\n|:--|--:|--:|--:|--:|\n");
    let rows = [
        ("$W_q$, $W_k$, $W_v$, $W_o$", c.attention_params, c.projection_flops),
        ("scores, weighted values", 0.0, c.score_flops),
        ("feed-forward", c.ffn_params, c.ffn_flops),
        ("layer norms", c.norm_params, 0.0),
    ];
    for (name, p, f) in rows {
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {} | {} |",
            shown(p, 0).text,
            share(p, params),
            shown(f, 0).text,
            share(f, flops)
        );
    }
    let _ = writeln!(out, "| **block** | {} | 100 | {} | 100 |", shown(params, 0).text, shown(flops, 0).text);
    out
}
