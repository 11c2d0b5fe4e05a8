//! Generated markdown: worked steps, weight tables, engine errors and the NumPy laboratory,
//! each written from a computed record at the lesson's precision.

use std::fmt::Write;

use crate::eval::{AttentionInputs, AttentionResult};
use crate::format::{Shown, relation, shown, sum_relation};

/// The default number of decimals in generated steps and tables.
pub(crate) const DEFAULT_DIGITS: usize = 4;

/// A label as TeX: numbers bare, words in `\text{}`. Inside `\text{}` everything is literal except
/// `\`, `{`, `}`, `%` and `$`, which are written as math-mode symbols between text runs.
pub(crate) fn tex_label(label: &str) -> String {
    if label.bytes().all(|b| b.is_ascii_digit()) {
        return label.to_string();
    }
    let mut out = String::new();
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if !run.is_empty() {
            out.push_str(&format!(r"\text{{{run}}}"));
            run.clear();
        }
    };
    for c in label.chars() {
        let symbol = match c {
            '\\' => r"\backslash ",
            '{' => r"\{",
            '}' => r"\}",
            '%' => r"\%",
            '$' => r"\$",
            _ => {
                run.push(c);
                continue;
            }
        };
        flush(&mut run, &mut out);
        out.push_str(symbol);
    }
    flush(&mut run, &mut out);
    out
}

/// A shown number as TeX (`-∞` becomes `-\infty`).
fn tex(s: &Shown) -> String {
    s.text.replace('∞', r"\infty")
}

/// A tuple of shown numbers, `(0,\ 0.7071,\ 0.7071)`; a single number stands alone.
fn tuple(xs: &[Shown]) -> String {
    if xs.len() == 1 {
        return tex(&xs[0]);
    }
    format!("({})", xs.iter().map(tex).collect::<Vec<_>>().join(", "))
}

fn shown_all(xs: &[f64], digits: usize) -> Vec<Shown> {
    xs.iter().map(|&x| shown(x, digits)).collect()
}

fn all_exact(xs: &[Shown]) -> bool {
    xs.iter().all(|s| s.exact)
}

/// The worked steps of one query of an attention example, from the engine's trace.
pub(crate) fn attention_steps(
    inputs: &AttentionInputs,
    trace: &qkv::QueryTrace,
    query: &str,
    digits: usize,
) -> String {
    let keys = inputs.key_labels();
    let q_name = format!("q_{{{}}}", tex_label(query));
    let k = |j: usize| format!("k_{{{}}}", tex_label(&keys[j]));
    let d_k = trace.query.len();
    let kept: Vec<usize> = (0..keys.len()).filter(|&j| trace.kept[j]).collect();
    let mut out = String::new();

    // 1. Dot products, expanded term by term while the vectors are short enough to read.
    let q_shown = shown_all(&trace.query, digits);
    let mut dots = Vec::new();
    for (j, &dot) in trace.dot_products.iter().enumerate() {
        let d = shown(dot, digits);
        let expansion = if d_k <= 4 {
            let terms: Vec<String> = q_shown
                .iter()
                .zip(&inputs.keys[j])
                .map(|(a, &b)| format!("({})({})", tex(a), tex(&shown(b, digits))))
                .collect();
            format!(" = {}", terms.join(" + "))
        } else {
            String::new()
        };
        dots.push(format!("${q_name} \\cdot {}{expansion} {} {}$", k(j), relation(d.exact), tex(&d)));
    }
    let _ = writeln!(out, "1. **Dot products.** With ${q_name} = {}$: {}.", tuple(&q_shown), dots.join("; "));

    // 2. Scale (and mask).
    let scores: Vec<Shown> = trace.scores.iter().map(|&s| shown(s, digits)).collect();
    let default_scale = (trace.scale - 1.0 / (d_k as f64).sqrt()).abs() < 1e-15;
    let how = if default_scale {
        let root = shown((d_k as f64).sqrt(), digits);
        format!("Divide by $\\sqrt{{d_k}} = \\sqrt{{{d_k}}} {} {}$", relation(root.exact), tex(&root))
    } else {
        let s = shown(trace.scale, digits);
        format!("Multiply by the scale ${}$", tex(&s))
    };
    let masked: Vec<String> =
        (0..keys.len()).filter(|&j| !trace.kept[j]).map(|j| format!("${}$", k(j))).collect();
    let mask_note = if masked.is_empty() {
        String::new()
    } else {
        format!(
            " The mask hides {}, so {} score becomes $-\\infty$.",
            masked.join(", "),
            if masked.len() == 1 { "its" } else { "their" }
        )
    };
    let _ = writeln!(
        out,
        "2. **Scale.** {how}: $s {} {}$.{mask_note}",
        relation(all_exact(&scores)),
        tuple(&scores)
    );

    let Some(max) = trace.max else {
        let _ = writeln!(
            out,
            "3. **Every key is masked.** Nothing to attend to: the weights are all $0$ and so is the output."
        );
        return out;
    };
    // 3. Subtract the max.
    let m = shown(max, digits);
    let shifted = shown_all(&trace.shifted, digits);
    let _ = writeln!(
        out,
        "3. **Subtract the max.** The largest score is ${}$: $s - {} {} {}$, so no exponential can overflow.",
        tex(&m),
        tex(&m),
        relation(all_exact(&shifted)),
        tuple(&shifted)
    );
    // 4. Exponentiate.
    let exps = shown_all(&trace.exponentials, digits);
    let _ = writeln!(
        out,
        "4. **Exponentiate.** $e^{{s_i - {}}} {} {}$.",
        tex(&m),
        relation(all_exact(&exps)),
        tuple(&exps)
    );
    // 5. Sum over the kept keys.
    let kept_exps: Vec<Shown> = kept.iter().map(|&j| exps[j].clone()).collect();
    let sum = shown(trace.sum, digits);
    if kept_exps.len() == 1 {
        let _ = writeln!(out, "5. **Sum.** Only one key is left: the sum is ${}$.", tex(&sum));
    } else {
        let _ = writeln!(
            out,
            "5. **Sum.** ${} {} {}$.",
            kept_exps.iter().map(tex).collect::<Vec<_>>().join(" + "),
            sum_relation(&kept_exps, &sum),
            tex(&sum)
        );
    }
    // 6. Normalize.
    let weights = shown_all(&trace.weights, digits);
    let normal: Vec<String> = (0..keys.len())
        .map(|j| format!("a_{{{}}} {} {}", tex_label(&keys[j]), relation(weights[j].exact), tex(&weights[j])))
        .collect();
    let _ = writeln!(out, "6. **Normalize.** Divide each by ${}$: ${}$.", tex(&sum), normal.join(r",\quad "));
    // 7. Weighted values.
    let terms: Vec<Vec<Shown>> = trace.weighted_values.iter().map(|r| shown_all(r, digits)).collect();
    let term_text: Vec<String> = kept
        .iter()
        .map(|&j| {
            let v = shown_all(&inputs.values[j], digits);
            let exact = weights[j].exact && all_exact(&terms[j]);
            format!("{} \\cdot {} {} {}", tex(&weights[j]), tuple(&v), relation(exact), tuple(&terms[j]))
        })
        .collect();
    let _ = writeln!(out, "7. **Weight the values.** ${}$.", term_text.join(r";\quad "));
    // 8. Output: the displayed terms, added, against the displayed output.
    let output = shown_all(&trace.output, digits);
    if kept.len() == 1 {
        let _ = writeln!(
            out,
            "8. **Output.** With one key left, the output is its value: $\\operatorname{{output}} = {}$.",
            tuple(&output)
        );
        return out;
    }
    let sums: Vec<String> = (0..output.len())
        .map(|c| {
            let column: Vec<Shown> = kept.iter().map(|&j| terms[j][c].clone()).collect();
            format!(
                "{} {} {}",
                column.iter().map(tex).collect::<Vec<_>>().join(" + "),
                sum_relation(&column, &output[c]),
                tex(&output[c])
            )
        })
        .collect();
    if output.len() == 1 {
        let _ = writeln!(out, "8. **Add them up.** $\\operatorname{{output}} = {}$.", sums[0]);
    } else {
        let _ = writeln!(out, "8. **Add them up,** component by component: ${}$.", sums.join(r";\quad "));
    }
    out
}

/// The steps of a softmax over given scores, as one list.
pub(crate) fn softmax_steps(trace: &qkv::QueryTrace, digits: usize) -> String {
    let scores = shown_all(&trace.scores, digits);
    let m = shown(trace.max.unwrap_or(0.0), digits);
    let shifted = shown_all(&trace.shifted, digits);
    let exps = shown_all(&trace.exponentials, digits);
    let sum = shown(trace.sum, digits);
    let weights = shown_all(&trace.weights, digits);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "1. **Subtract the max** (${}$) from ${}$: ${}$.",
        tex(&m),
        tuple(&scores),
        tuple(&shifted)
    );
    let _ = writeln!(
        out,
        "2. **Exponentiate:** $e^{{{}}} {} {}$.",
        tuple(&shifted),
        relation(all_exact(&exps)),
        tuple(&exps)
    );
    let _ = writeln!(
        out,
        "3. **Sum:** ${} {} {}$.",
        exps.iter().map(tex).collect::<Vec<_>>().join(" + "),
        sum_relation(&exps, &sum),
        tex(&sum)
    );
    let normal: Vec<String> = (0..weights.len())
        .map(|i| {
            format!(
                "a_{} = {} / {} {} {}",
                i + 1,
                tex(&exps[i]),
                tex(&sum),
                relation(weights[i].exact),
                tex(&weights[i])
            )
        })
        .collect();
    let _ = writeln!(out, "4. **Normalize:** ${}$.", normal.join(r",\quad "));
    out
}

/// The steps of a dot product and its scaled score.
pub(crate) fn dot_steps(q: &[f64], k: &[f64], trace: &qkv::QueryTrace, digits: usize) -> String {
    let terms: Vec<String> = q
        .iter()
        .zip(k)
        .map(|(&a, &b)| format!("({})({})", tex(&shown(a, digits)), tex(&shown(b, digits))))
        .collect();
    let dot = shown(trace.dot_products[0], digits);
    let d_k = q.len();
    let root = shown((d_k as f64).sqrt(), digits);
    let scaled = shown(trace.scores[0], digits);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "1. **Dot product:** $q \\cdot k = {} {} {}$.",
        terms.join(" + "),
        relation(dot.exact),
        tex(&dot)
    );
    let _ = writeln!(
        out,
        "2. **Scale:** $\\sqrt{{d_k}} = \\sqrt{{{d_k}}} {} {}$, so $\\dfrac{{{}}}{{\\sqrt{{{d_k}}}}} {} {}$.",
        relation(root.exact),
        tex(&root),
        tex(&dot),
        relation(scaled.exact),
        tex(&scaled)
    );
    out
}

/// The steps of a weighted sum of given weights and values.
pub(crate) fn weighted_sum_steps(
    weights: &[f64],
    values: &[f64],
    terms: &[f64],
    output: f64,
    digits: usize,
) -> String {
    let w = shown_all(weights, digits);
    let t = shown_all(terms, digits);
    let products: Vec<String> =
        w.iter().zip(values).map(|(a, &v)| format!("{} \\cdot {}", tex(a), tex(&shown(v, digits)))).collect();
    let out = shown(output, digits);
    let exact_terms = w.iter().zip(&t).all(|(a, b)| a.exact && b.exact);
    format!(
        "1. **Weight each value:** ${} {} {}$.\n2. **Add:** $\\operatorname{{output}} {} {}$.\n",
        products.join(" + "),
        relation(exact_terms),
        t.iter().map(tex).collect::<Vec<_>>().join(" + "),
        sum_relation(&t, &out),
        tex(&out)
    )
}

/// The inputs of an attention example as a table: one row per token.
pub(crate) fn inputs_table(inputs: &AttentionInputs) -> String {
    let vector = |r: &[f64]| {
        let parts: Vec<String> = r
            .iter()
            .map(|&x| crate::format::fixed(x, if x == x.trunc() { 0 } else { DEFAULT_DIGITS }))
            .collect();
        if parts.len() == 1 { parts[0].clone() } else { format!("({})", parts.join(", ")) }
    };
    let mut out = String::from("| token | query | key | value |\n|:--|:--|:--|--:|\n");
    let (ql, kl) = (inputs.query_labels(), inputs.key_labels());
    for j in 0..inputs.keys.len().max(inputs.queries.len()) {
        let label = kl.get(j).or(ql.get(j)).map_or("", String::as_str);
        let cell = |rows: &[Vec<f64>]| rows.get(j).map_or(String::new(), |r| vector(r));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} |",
            escape_cell(label),
            cell(&inputs.queries),
            cell(&inputs.keys),
            cell(&inputs.values)
        );
    }
    out
}

/// A matrix (weights or scores) as a markdown table; weights get a row-sum column and each
/// query's output, so the table shows where every row's blend lands.
pub(crate) fn matrix_table(
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

/// The engine's error for an example declared with `expect_error = true`.
pub(crate) fn error_block(message: &str) -> String {
    format!("```text\nerror: {message}\n```\n")
}

/// The NumPy laboratory for one query: the program, and what it prints (from the engine's trace).
pub(crate) struct Lab {
    pub code: String,
    pub printed: String,
}

fn py_rows(rows: &[Vec<f64>]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|r| format!("[{}]", r.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", ")))
        .collect();
    format!("np.array([{}])", rows.join(", "))
}

/// Writes the NumPy program for query `query_idx` and the text it prints.
pub(crate) fn lab(
    inputs: &AttentionInputs,
    result: &AttentionResult,
    query_idx: usize,
    digits: usize,
) -> Lab {
    let trace = &result.traces[query_idx];
    let labels = inputs.query_labels();
    let tokens: Vec<String> = inputs.key_labels().iter().map(|t| format!("{t:?}")).collect();
    let mut code = String::new();
    let _ = writeln!(code, "import numpy as np\n");
    let _ = writeln!(code, "tokens = [{}]", tokens.join(", "));
    let _ = writeln!(code, "Q = {}  # one query per row", py_rows(&inputs.queries));
    let _ = writeln!(code, "K = {}  # one key per row", py_rows(&inputs.keys));
    let _ = writeln!(code, "V = {}  # one value per row\n", py_rows(&inputs.values));
    let _ = writeln!(code, "q = Q[{query_idx}]  # the query of {:?}", labels[query_idx]);
    let default_scale = (trace.scale - 1.0 / (trace.query.len() as f64).sqrt()).abs() < 1e-15;
    if default_scale {
        let _ = writeln!(code, "scores = K @ q / np.sqrt(K.shape[1])  # step 1: score every key");
    } else {
        let _ = writeln!(code, "scores = (K @ q) * {:?}  # step 1: score every key", trace.scale);
    }
    if trace.kept.iter().any(|k| !k) {
        let keep: Vec<&str> = trace.kept.iter().map(|&k| if k { "True" } else { "False" }).collect();
        let _ = writeln!(code, "scores = np.where([{}], scores, -np.inf)  # the mask", keep.join(", "));
    }
    let _ = writeln!(code, "weights = np.exp(scores - scores.max())  # step 2: softmax...");
    let _ = writeln!(code, "weights = weights / weights.sum()        # ...normalized");
    let _ = writeln!(code, "output = weights @ V                     # step 3: blend the values\n");
    let _ = writeln!(
        code,
        "def show(xs):\n    return \", \".join(f\"{{x:.{digits}f}}\" for x in np.atleast_1d(xs))\n"
    );
    let _ = writeln!(code, "print(\"scores: \", show(scores))");
    let _ = writeln!(code, "print(\"weights:\", show(weights))");
    let _ = writeln!(code, "print(\"output: \", show(output))");
    let show = |xs: &[f64]| xs.iter().map(|x| py_fixed(*x, digits)).collect::<Vec<_>>().join(", ");
    let printed = format!(
        "scores:  {}\nweights: {}\noutput:  {}\n",
        show(&trace.scores),
        show(&trace.weights),
        show(&result.output.row(query_idx).to_vec())
    );
    Lab { code, printed }
}

/// What Python's `f"{x:.Nf}"` prints (it keeps negative zero and spells infinity `inf`).
fn py_fixed(x: f64, digits: usize) -> String {
    if x == f64::NEG_INFINITY { "-inf".to_string() } else { format!("{x:.digits$}") }
}

/// The lab as markdown: the program, what it prints, and the notebook link.
pub(crate) fn lab_markdown(lab: &Lab, notebook: &str) -> String {
    format!(
        "```python\n{}```\n\nIt prints:\n\n```text\n{}```\n\nThe same program as a Jupyter notebook: [{notebook}]({notebook}).\n",
        lab.code, lab.printed
    )
}

#[cfg(test)]
mod tests;
