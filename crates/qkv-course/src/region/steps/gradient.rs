//! `steps GRADIENT.TOKEN`: the backward of one query's row by hand, from the loss's gradient at
//! its output through the values (`dP`), the softmax (`δ`, `dS`) into its query, and its share
//! of the keys' and values' gradients.

use std::fmt::Write;

use super::{shown_all, tex_label, tuple};
use crate::eval::GradientResult;
use crate::format::{relation, shown};

/// A factor as TeX: a negative number in parentheses, so that `a · (-b)` and `a - (-b)` read right.
fn signed_at(x: f64, digits: usize) -> String {
    let text = shown(x, digits).text;
    if x < 0.0 { format!("({text})") } else { text }
}

/// The worked backward of query `i` at `digits` decimals.
pub(super) fn gradient_steps(g: &GradientResult, i: usize, digits: usize) -> String {
    let (ql, kl) = g.labels();
    let start = &g.steps[0];
    let trace = &start.result.traces[i];
    let row = &g.rows[i];
    let v = |xs: &[f64]| shown_all(xs, digits);
    let rel = |xs: &[f64]| relation(v(xs).iter().all(|s| s.exact));
    let n = |x: f64| shown(x, digits);
    let signed = |x: f64| signed_at(x, digits);
    let q = tex_label(&ql[i]);
    let key = |j: usize| tex_label(&kl[j]);
    let output = start.result.output.row(i).to_vec();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "The forward gave $o_{{{q}}} {} {}$ with the weights $p_{{{q}}} {} {}$; the target is $t_{{{q}}} = {}$.\n",
        rel(&output),
        tuple(&v(&output)),
        rel(&trace.weights),
        tuple(&v(&trace.weights)),
        tuple(&v(&g.target[i]))
    );
    let _ = writeln!(
        out,
        "1. **The loss's gradient at the output.** $L = \\tfrac12 \\sum (o - t)^2$, so $do_{{{q}}} = o_{{{q}}} - t_{{{q}}} {} {}$.",
        rel(&row.d_output),
        tuple(&v(&row.d_output))
    );
    let dp: Vec<String> = (0..kl.len())
        .map(|j| {
            format!(
                "$dp_{{{}}} = do \\cdot v_{{{}}} {} {}$",
                key(j),
                key(j),
                relation(n(row.dp[j]).exact),
                n(row.dp[j]).text
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "2. **Back through the values.** Each weight multiplied a value, so its gradient is $do$ against that value: {}.",
        dp.join(", ")
    );
    // One piece of math per term, so that the sum wraps on a phone.
    let terms: Vec<String> = (0..kl.len())
        .map(|j| {
            let plus = if j == 0 { "" } else { "+ " };
            format!("${plus}{} \\cdot {}$", n(trace.weights[j]).text, signed(row.dp[j]))
        })
        .collect();
    let _ = writeln!(
        out,
        "3. **The softmax's weighted mean.** $\\delta = \\sum_j p_j\\, dp_j =$ {} ${} {}$, the same as $do \\cdot o$.",
        terms.join(" "),
        relation(n(row.delta).exact),
        n(row.delta).text
    );
    let ds: Vec<String> = (0..kl.len())
        .map(|j| {
            format!(
                "$ds_{{{}}} = {} \\cdot ({} - {})$ ${} {}$",
                key(j),
                n(trace.weights[j]).text,
                n(row.dp[j]).text,
                signed(row.delta),
                relation(n(row.ds[j]).exact),
                n(row.ds[j]).text
            )
        })
        .collect();
    let _ = writeln!(
        out,
        "4. **Back through the softmax.** $ds_j = p_j (dp_j - \\delta)$: {}. They add up to 0, as the weights always do.",
        ds.join("; ")
    );
    let _ = writeln!(
        out,
        "5. **Into the query.** $dq_{{{q}}} = {} \\sum_j ds_j\\, k_j$ ${} {}$ (the scale $1/\\sqrt{{d_k}}$ of the forward again).",
        n(trace.scale).text,
        rel(&row.d_query),
        tuple(&v(&row.d_query))
    );
    let _ = writeln!(
        out,
        "6. **Into the keys and values.** This query adds ${} \\, ds_j\\, q_{{{q}}}$ to each $dk_j$ and $p_j\\, do_{{{q}}}$ to each $dv_j$; every query adds its share, which gives the tables of $dK$ and $dV$.",
        n(trace.scale).text
    );
    out
}
