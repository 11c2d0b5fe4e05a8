//! `lab MULTIHEAD`: a multi-head example in NumPy: every head's projections and attention over
//! all the tokens, the heads side by side, then `W_o`; and what it prints, from the engine's
//! results (each head's weights and output, and the final output).

use std::fmt::Write;

use super::{Lab, py_fixed, py_rows};
use crate::error::Problem;
use crate::eval::MultiHeadResult;
use crate::region::Context;

/// The notebook's title.
pub(super) const TITLE: &str = "Multi-head attention, in NumPy";

/// The notebook's introduction.
pub(super) const INTRO: &str = "Every head projects the same embeddings with its own matrices and attends on its own; the heads' outputs are set side by side and multiplied by W_o. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.";

/// The program and its printout; an example with ALiBi slopes is refused (its heads' labs,
/// `lab MULTIHEAD.heads.NAME.TOKEN`, show the bias).
pub(super) fn lab(cx: &Context<'_, '_>, m: &MultiHeadResult, digits: usize) -> Result<Lab, Problem> {
    if m.heads.iter().any(|(_, inputs, _)| inputs.limits.alibi.is_some()) {
        return Err(cx.problem(
            format!("`lab {}` cannot show ALiBi: a head has a slope", cx.args[0]),
            "`lab MULTIHEAD.heads.NAME.TOKEN`, one head's lab, which adds the bias",
        ));
    }
    let tokens: Vec<String> = m.tokens.iter().map(|t| format!("{t:?}")).collect();
    let mut code = String::from("import numpy as np\n\n");
    let _ = writeln!(code, "tokens = [{}]", tokens.join(", "));
    let _ = writeln!(code, "X = {}  # one embedding per token", py_rows(&m.x));
    code.push_str("heads = {  # each head's own projections\n");
    let mut scales = Vec::new();
    let mut masks = Vec::new();
    for (name, inputs, result) in &m.heads {
        let Some(p) = &inputs.projection else {
            return Err(cx.problem(format!("head `{name}` has no projections"), "a `qkv multi-head` block"));
        };
        let _ = writeln!(
            code,
            "    {name:?}: (\n        {},  # W_q\n        {},  # W_k\n        {},  # W_v\n    ),",
            py_rows(&p.w_q),
            py_rows(&p.w_k),
            py_rows(&p.w_v)
        );
        let d_k = inputs.queries.first().map_or(0, Vec::len);
        let scale = result.traces.first().map_or(1.0, |t| t.scale);
        scales.push((scale, (scale - 1.0 / (d_k as f64).sqrt()).abs() < 1e-15));
        let kept: Vec<Vec<bool>> = result.traces.iter().map(|t| t.kept.clone()).collect();
        masks.push(kept.iter().flatten().any(|k| !k).then_some(kept));
    }
    code.push_str("}\n");
    let _ = writeln!(code, "W_o = {}  # a row per column of the heads side by side\n", py_rows(&m.w_o));
    // Every head has the example's scale: the default 1/sqrt(d_k) of its own width, or one given.
    let scale = match scales.first() {
        _ if scales.iter().all(|&(_, default)| default) => " / np.sqrt(K.shape[1])".to_string(),
        Some(&(s, _)) if scales.iter().all(|&(x, _)| x == s) => format!(" * {s:?}"),
        _ => {
            return Err(cx.problem(
                format!("`lab {}` needs one scale for every head", cx.args[0]),
                "heads that share the example's `scale`",
            ));
        }
    };
    let mask = masks.iter().flatten().next();
    if masks.iter().any(|k| k.as_ref() != mask) {
        return Err(cx.problem(
            format!("`lab {}` needs one mask for every head", cx.args[0]),
            "heads that share the example's mask",
        ));
    }
    code.push_str("def attention(Q, K, V):\n");
    let _ = writeln!(code, "    scores = Q @ K.T{scale}  # every query against every key");
    if let Some(kept) = mask {
        let rows: Vec<String> = kept
            .iter()
            .map(|r| {
                format!(
                    "[{}]",
                    r.iter().map(|&k| if k { "True" } else { "False" }).collect::<Vec<_>>().join(", ")
                )
            })
            .collect();
        let _ = writeln!(code, "    scores = np.where([{}], scores, -np.inf)  # the mask", rows.join(", "));
    }
    code.push_str("    weights = np.exp(scores - scores.max(axis=1, keepdims=True))  # softmax by rows...\n");
    code.push_str("    weights = weights / weights.sum(axis=1, keepdims=True)        # ...normalized\n");
    code.push_str("    return weights, weights @ V\n\n");
    let _ = writeln!(
        code,
        "def show(xs, digits={digits}):\n    return \", \".join(f\"{{x:.{{digits}}f}}\" for x in np.atleast_1d(xs))\n"
    );
    code.push_str("outputs = []\nfor name, (W_q, W_k, W_v) in heads.items():\n");
    code.push_str("    weights, output = attention(X @ W_q, X @ W_k, X @ W_v)  # one head, on its own\n");
    code.push_str("    outputs.append(output)\n    print(f\"head {name}\")\n");
    code.push_str("    for token, row, out in zip(tokens, weights, output):\n");
    code.push_str("        print(f\"  {token}: weights {show(row)}; output {show(out)}\")\n\n");
    code.push_str("final = np.hstack(outputs) @ W_o  # the heads side by side, then W_o\n");
    code.push_str(
        "print(\"output\")\nfor token, row in zip(tokens, final):\n    print(f\"  {token}: {show(row)}\")\n",
    );

    let show = |xs: &[f64]| xs.iter().map(|&x| py_fixed(x, digits)).collect::<Vec<_>>().join(", ");
    let mut printed = String::new();
    for (name, _, result) in &m.heads {
        let _ = writeln!(printed, "head {name}");
        for (i, token) in m.tokens.iter().enumerate() {
            let _ = writeln!(
                printed,
                "  {token}: weights {}; output {}",
                show(&result.traces[i].weights),
                show(&result.output.row(i).to_vec())
            );
        }
    }
    printed.push_str("output\n");
    for (token, row) in m.tokens.iter().zip(&m.output) {
        let _ = writeln!(printed, "  {token}: {}", show(row));
    }
    Ok(Lab { code, printed })
}
