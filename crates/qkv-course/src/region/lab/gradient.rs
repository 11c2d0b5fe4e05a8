//! `lab GRADIENT`: training attention in NumPy: the forward keeping each row's logsumexp, the
//! backward by hand from it (`dP`, `δ`, `dS`, then `dQ`, `dK`, `dV`), a check against finite
//! differences, and the gradient steps; and what it prints, from the gradient block's record.

use std::fmt::Write;

use super::{Lab, py_fixed, py_rows};
use crate::error::Problem;
use crate::eval::GradientResult;
use crate::region::Context;

/// The notebook's title.
pub(super) const TITLE: &str = "Training attention, in NumPy";

/// The notebook's introduction.
pub(super) const INTRO: &str = "The backward of attention by hand, from the forward's logsumexp as FlashAttention keeps it, checked against finite differences, then a few steps of gradient descent. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.";

/// The program and its printout. The example must have no mask and the default scale.
pub(super) fn lab(cx: &Context<'_, '_>, g: &GradientResult, digits: usize) -> Result<Lab, Problem> {
    let start = &g.steps[0];
    let inputs = &start.inputs;
    let d_k = inputs.queries.first().map_or(0, Vec::len) as f64;
    let plain = start
        .result
        .traces
        .iter()
        .all(|t| t.kept.iter().all(|&k| k) && (t.scale - 1.0 / d_k.sqrt()).abs() < 1e-15)
        && inputs.limits.alibi.is_none();
    if !plain {
        return Err(cx.problem(
            format!("`lab {}` needs an example without masks or ALiBi, at the default scale", cx.args[0]),
            "a gradient block on a plain attention example",
        ));
    }
    let (ql, kl) = g.labels();
    let quoted = |l: &[String]| l.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ");
    let mut code = String::from("import numpy as np\n\n");
    let _ = writeln!(code, "queries, keys = [{}], [{}]", quoted(&ql), quoted(&kl));
    let _ = writeln!(code, "Q = {}", py_rows(&inputs.queries));
    let _ = writeln!(code, "K = {}", py_rows(&inputs.keys));
    let _ = writeln!(code, "V = {}", py_rows(&inputs.values));
    let _ = writeln!(code, "target = {}  # the output we want", py_rows(&g.target));
    let _ = writeln!(code, "rate, steps = {:?}, {}\n", g.learning_rate, g.steps.len() - 1);
    code.push_str(
        "def forward(Q, K, V):\n    S = Q @ K.T / np.sqrt(K.shape[1])\n    m = S.max(axis=1, keepdims=True)\n    lse = m + np.log(np.exp(S - m).sum(axis=1, keepdims=True))  # all the backward keeps of P\n    return np.exp(S - lse) @ V, lse\n\n",
    );
    code.push_str(
        "def loss(Q, K, V):\n    O, _ = forward(Q, K, V)\n    return 0.5 * ((O - target) ** 2).sum()\n\n",
    );
    code.push_str(
        "def backward(Q, K, V):\n    O, lse = forward(Q, K, V)\n    dO = O - target\n    scale = 1 / np.sqrt(K.shape[1])\n    P = np.exp(Q @ K.T * scale - lse)   # the weights again, from the logsumexp\n    dV = P.T @ dO\n    dP = dO @ V.T\n    delta = (dO * O).sum(axis=1, keepdims=True)  # = (P * dP).sum(axis=1)\n    dS = P * (dP - delta)                # the softmax's backward\n    return dS @ K * scale, dS.T @ Q * scale, dV\n\n",
    );
    // A gradient that is 0 in exact arithmetic may come out as -1e-17: round first, so that it
    // prints 0.0000, not -0.0000 (`+ 0.0` turns -0.0 into 0.0).
    let _ = writeln!(
        code,
        "def show(xs, digits={digits}):\n    return \", \".join(f\"{{round(x, digits) + 0.0:.{{digits}}f}}\" for x in np.atleast_1d(xs))\n"
    );
    code.push_str("dQ, dK, dV = backward(Q, K, V)\n");
    code.push_str("for name, labels, G in [(\"dQ\", queries, dQ), (\"dK\", keys, dK), (\"dV\", keys, dV)]:\n    print(name)\n    for label, row in zip(labels, G):\n        print(f\"  {label}: {show(row)}\")\n\n");
    code.push_str(
        "# Finite differences: nudge each input by h both ways and watch the loss.\nh, agree = 1e-6, True\nfor X, G in [(Q, dQ), (K, dK), (V, dV)]:\n    for index in np.ndindex(X.shape):\n        up, down = X.copy(), X.copy()\n        up[index] += h\n        down[index] -= h\n        args = [up if A is X else A for A in (Q, K, V)], [down if A is X else A for A in (Q, K, V)]\n        numeric = (loss(*args[0]) - loss(*args[1])) / (2 * h)\n        agree = agree and abs(numeric - G[index]) < 1e-6\nprint(\"finite differences agree:\", agree)\n\n",
    );
    code.push_str("for step in range(steps + 1):\n    print(f\"step {step}: loss {show(loss(Q, K, V))}\")\n    dQ, dK, dV = backward(Q, K, V)\n    Q, K, V = Q - rate * dQ, K - rate * dK, V - rate * dV\n");
    let show = |xs: &[f64]| xs.iter().map(|&x| py_fixed(x, digits)).collect::<Vec<_>>().join(", ");
    let mut printed = String::new();
    for (name, labels, rows) in
        [("dQ", &ql, &start.d_queries), ("dK", &kl, &start.d_keys), ("dV", &kl, &start.d_values)]
    {
        let _ = writeln!(printed, "{name}");
        for (label, row) in labels.iter().zip(rows) {
            let _ = writeln!(printed, "  {label}: {}", show(row));
        }
    }
    printed.push_str("finite differences agree: True\n");
    for (s, step) in g.steps.iter().enumerate() {
        let _ = writeln!(printed, "step {s}: loss {}", show(&[step.loss]));
    }
    Ok(Lab { code, printed })
}
