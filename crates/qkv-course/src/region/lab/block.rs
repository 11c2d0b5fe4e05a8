//! `lab BLOCK`: a Transformer block in NumPy, both orders: the heads and `W_o` on the layer norm
//! of `X` (pre-norm) or on `X` itself (post-norm), the residual sums, the layer norms and the
//! feed-forward layer; and what it prints, from the block's record.

use std::fmt::Write;

use super::{Lab, py_fixed, py_rows};
use crate::error::Problem;
use crate::eval::{BlockResult, Order};
use crate::region::Context;

/// The notebook's title.
pub(super) const TITLE: &str = "A Transformer block, in NumPy";

/// The notebook's introduction.
pub(super) const INTRO: &str = "Multi-head attention, two residual connections, two layer norms and a feed-forward layer, in both orders: pre-norm and post-norm. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.";

/// The program and its printout. The block's attention must have the default scale and no mask
/// (the program attends with every key).
pub(super) fn lab(cx: &Context<'_, '_>, b: &BlockResult, digits: usize) -> Result<Lab, Problem> {
    let (m, _) = b.order(Order::Post);
    let mut code = String::from("import numpy as np\n\n");
    let tokens: Vec<String> = b.tokens.iter().map(|t| format!("{t:?}")).collect();
    let _ = writeln!(code, "tokens = [{}]", tokens.join(", "));
    let _ = writeln!(code, "X = {}  # one embedding per token", py_rows(&b.x));
    code.push_str("heads = [  # each head's W_q, W_k, W_v\n");
    for (name, inputs, result) in &m.heads {
        let unmasked = result.traces.iter().all(|t| t.kept.iter().all(|&k| k));
        let d_k = inputs.queries.first().map_or(0, Vec::len) as f64;
        let default_scale = result.traces.iter().all(|t| (t.scale - 1.0 / d_k.sqrt()).abs() < 1e-15);
        let (Some(p), true, true) = (&inputs.projection, unmasked, default_scale) else {
            return Err(cx.problem(
                format!(
                    "`lab {}` needs heads without masks, at the default scale (head `{name}`)",
                    cx.args[0]
                ),
                "a block whose multi-head example has no mask and no `scale`",
            ));
        };
        let _ = writeln!(code, "    ({}, {}, {}),", py_rows(&p.w_q), py_rows(&p.w_k), py_rows(&p.w_v));
    }
    code.push_str("]\n");
    let _ = writeln!(code, "W_o = {}", py_rows(&m.w_o));
    let _ = writeln!(code, "W_1 = {}", py_rows(&b.w_1));
    let _ = writeln!(code, "b_1 = np.array({})", py_list(&b.b_1));
    let _ = writeln!(code, "W_2 = {}", py_rows(&b.w_2));
    let _ = writeln!(code, "b_2 = np.array({})", py_list(&b.b_2));
    let _ = writeln!(code, "eps = {:?}\n", b.eps);
    code.push_str(
        "def layer_norm(H):  # each row to mean 0 and variance 1 (scale 1, shift 0)\n    mean = H.mean(axis=1, keepdims=True)\n    variance = ((H - mean) ** 2).mean(axis=1, keepdims=True)\n    return (H - mean) / np.sqrt(variance + eps)\n\n",
    );
    code.push_str(
        "def attention(H):  # every head on H, side by side, then W_o\n    outputs = []\n    for W_q, W_k, W_v in heads:\n        Q, K, V = H @ W_q, H @ W_k, H @ W_v\n        scores = Q @ K.T / np.sqrt(K.shape[1])\n        weights = np.exp(scores - scores.max(axis=1, keepdims=True))\n        weights = weights / weights.sum(axis=1, keepdims=True)\n        outputs.append(weights @ V)\n    return np.hstack(outputs) @ W_o\n\n",
    );
    code.push_str("def feed_forward(H):\n    return np.maximum(H @ W_1 + b_1, 0) @ W_2 + b_2\n\n");
    code.push_str("def pre_norm(X):\n    H = X + attention(layer_norm(X))\n    return H + feed_forward(layer_norm(H))\n\n");
    code.push_str("def post_norm(X):\n    H = layer_norm(X + attention(X))\n    return layer_norm(H + feed_forward(H))\n\n");
    let _ = writeln!(
        code,
        "def show(xs, digits={digits}):\n    return \", \".join(f\"{{x:.{{digits}}f}}\" for x in np.atleast_1d(xs))\n"
    );
    code.push_str("for name, block in [(\"pre-norm\", pre_norm), (\"post-norm\", post_norm)]:\n");
    code.push_str("    print(name)\n    for token, row in zip(tokens, block(X)):\n");
    code.push_str("        print(f\"  {token}: {show(row)}\")\n");
    let show = |xs: &[f64]| xs.iter().map(|&x| py_fixed(x, digits)).collect::<Vec<_>>().join(", ");
    let mut printed = String::new();
    for (order, name) in [(Order::Pre, "pre-norm"), (Order::Post, "post-norm")] {
        let _ = writeln!(printed, "{name}");
        let (_, passes) = b.order(order);
        for (token, pass) in b.tokens.iter().zip(passes) {
            let _ = writeln!(printed, "  {token}: {}", show(&pass.output));
        }
    }
    Ok(Lab { code, printed })
}

/// A vector as a Python list.
fn py_list(xs: &[f64]) -> String {
    format!("[{}]", xs.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", "))
}
