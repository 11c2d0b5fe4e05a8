//! `steps TARGET`: the worked steps of one query of an attention example, from the engine's trace,
//! or of a `softmax`, `dot` or `weighted-sum` block. Numbers are shown at the directive's
//! precision; a step says `≈` wherever the shown terms do not add up exactly to the shown total.

use std::fmt::Write;

mod block;
mod gradient;
mod positions;

use super::{Context, Generated, Kind};
use crate::error::Problem;
use crate::eval::{AttentionInputs, Computed, Order};
use crate::format::{Shown, relation, shown, sum_relation};

pub(super) const KIND: Kind = Kind { name: "steps", usage: "`steps TARGET`", options: &["digits"], generate };

const USAGE: &str = "`steps EXAMPLE.TOKEN` or `steps ID` of a `softmax`, `dot` or `weighted-sum` block";

fn generate(cx: &mut Context<'_, '_>) -> Result<Generated, Problem> {
    let target = cx.target(USAGE)?;
    let body = worked(cx, target, cx.digits)?;
    Ok(cx.markdown(body))
}

/// The worked steps `target` names (`sentence.love`, `quiz_softmax`), at `digits` decimals: what a
/// `steps` region holds, also shown with a quiz's answer.
pub(super) fn worked(cx: &mut Context<'_, '_>, target: &str, digits: usize) -> Result<String, Problem> {
    let named = cx.named_path(target)?;
    Ok(match named.computed {
        Computed::Attention { inputs, result: Ok(result) } => {
            // An example of one query (a decoding step) needs no token.
            let i = if named.rest.is_empty() && inputs.queries.len() == 1 {
                0
            } else {
                cx.query_index(target, &inputs, &named.rest)?
            };
            let widths = [inputs.queries[0].len(), inputs.values[0].len()];
            cx.at_most_shown(&[
                (inputs.keys.len(), "keys"),
                (widths[0].max(widths[1]), "components of a vector"),
            ])?;
            attention_steps(&inputs, &result.traces[i], &inputs.query_labels()[i], digits)
        }
        // `BLOCK.ORDER.TOKEN`: one token through a Transformer block.
        Computed::Block(b) => {
            let [order, token] = named.rest.as_slice() else {
                return Err(cx.problem(
                    format!("`{target}` needs an order and a token after the block"),
                    format!(
                        "`{target}.pre.TOKEN` or `{target}.post.TOKEN`, TOKEN one of {}",
                        b.tokens.join(", ")
                    ),
                ));
            };
            let order = Order::from_name(order).ok_or_else(|| {
                cx.problem(format!("`{order}` is not an order of a block"), "`pre` or `post`")
            })?;
            let i = b.tokens.iter().position(|t| t == token).ok_or_else(|| {
                cx.problem(
                    format!("`{token}` is not a token of the block"),
                    format!("one of {}", b.tokens.join(", ")),
                )
            })?;
            let (_, passes) = b.order(order);
            cx.at_most_shown(&[(b.b_1.len(), "components of a vector")])?;
            block::block_steps(order, &passes[i], token, b.eps, digits)
        }
        // `GRADIENT.TOKEN`: one query's row of the backward.
        Computed::Gradient(g) => {
            let (ql, _) = g.labels();
            let [token] = named.rest.as_slice() else {
                return Err(cx.problem(
                    format!("`{target}` needs a query token after the gradient block"),
                    format!("`{target}.TOKEN`, TOKEN one of {}", ql.join(", ")),
                ));
            };
            let i = ql.iter().position(|t| t == token).ok_or_else(|| {
                cx.problem(
                    format!("`{token}` is not a query of the gradient block"),
                    format!("one of {}", ql.join(", ")),
                )
            })?;
            cx.at_most_shown(&[(g.rows[i].dp.len(), "keys")])?;
            gradient::gradient_steps(&g, i, digits)
        }
        Computed::Positions(p) if named.rest.is_empty() => positions::positions_steps(&p, digits),
        Computed::Attention { result: Err(_), .. } => {
            return Err(cx.problem("an example that fails has no steps", "`error EXAMPLE` to show its error"));
        }
        _ if !named.rest.is_empty() => {
            return Err(cx.problem(
                format!("`{target}` names a value, not a computation"),
                "the id of a `qkv softmax`, `dot` or `weighted-sum` block",
            ));
        }
        Computed::Softmax(trace) => {
            cx.at_most_shown(&[(trace.scores.len(), "scores")])?;
            softmax_steps(&trace, digits)
        }
        Computed::Dot { q, k, trace } => {
            cx.at_most_shown(&[(q.len(), "components of a vector")])?;
            dot_steps(&q, &k, &trace, digits)
        }
        Computed::WeightedSum { weights, values, terms, output } => {
            cx.at_most_shown(&[(values.len(), "values")])?;
            weighted_sum_steps(&weights, &values, &terms, output, digits)
        }
        Computed::Tiled(t) => {
            cx.at_most_shown(&[
                (t.inputs.keys.len(), "keys"),
                (t.inputs.values[0].len(), "components of a vector"),
            ])?;
            tiled_steps(&t, digits)
        }
        Computed::Matrix { .. }
        | Computed::MultiHead(_)
        | Computed::Decode(_)
        | Computed::Measured
        | Computed::Positions(_) => {
            return Err(cx.problem(
                format!("`{target}` has no worked steps of its own"),
                "`EXAMPLE.TOKEN` of an attention example, `MULTIHEAD.heads.HEAD.TOKEN` for one head, `DECODE.TOKEN` for one step, or a `qkv tiled` block",
            ));
        }
    })
}

/// A label as TeX: numbers bare, words in `\text{}`. Inside `\text{}` everything is literal except
/// `\`, `{`, `}`, `%` and `$`, which are written as math-mode symbols between text runs.
pub(super) fn tex_label(label: &str) -> String {
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
    crate::format::tex_number(&s.text)
}

/// A tuple of shown numbers, `(0,\ 0.7071,\ 0.7071)`; a single number stands alone.
fn tuple(xs: &[Shown]) -> String {
    if xs.len() == 1 {
        return tex(&xs[0]);
    }
    format!("({})", xs.iter().map(tex).collect::<Vec<_>>().join(", "))
}

/// Several formulas as separate pieces of inline math, so that a long step wraps between them
/// on a narrow screen (inline math never wraps inside itself).
fn pieces(formulas: &[String], separator: &str) -> String {
    formulas.iter().map(|f| format!("${f}$")).collect::<Vec<_>>().join(separator)
}

/// `lhs = t1 + t2 + …` as inline math, two terms to a piece so that a long sum can wrap.
fn expanded(lhs: &str, terms: &[String]) -> String {
    let mut out = format!("${lhs} =");
    for (i, pair) in terms.chunks(2).enumerate() {
        if i > 0 {
            out.push_str("$ $+");
        }
        out.push(' ');
        out.push_str(&pair.join(" + "));
    }
    out.push('$');
    out
}

fn shown_all(xs: &[f64], digits: usize) -> Vec<Shown> {
    xs.iter().map(|&x| shown(x, digits)).collect()
}

fn all_exact(xs: &[Shown]) -> bool {
    xs.iter().all(|s| s.exact)
}

/// The worked steps of one query of an attention example, from the engine's trace.
pub(super) fn attention_steps(
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
    if let Some(p) = &inputs.projection {
        out.push_str(&projection_step(inputs, p, query, digits));
    }

    // 1. Dot products, expanded term by term while the vectors are short enough to read.
    let q_shown = shown_all(&trace.query, digits);
    let mut dots = Vec::new();
    for (j, &dot) in trace.dot_products.iter().enumerate() {
        let d = shown(dot, digits);
        let lhs = format!("{q_name} \\cdot {}", k(j));
        let expansion = if d_k <= 4 {
            let terms: Vec<String> = q_shown
                .iter()
                .zip(&inputs.keys[j])
                .map(|(a, &b)| format!("({})({})", tex(a), tex(&shown(b, digits))))
                .collect();
            expanded(&lhs, &terms)
        } else {
            format!("${lhs}$")
        };
        dots.push(format!("{expansion} ${} {}$", relation(d.exact), tex(&d)));
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
    // ALiBi's bias is what the scores hold beyond the scaled dot products.
    let alibi = match inputs.limits.alibi {
        Some(slope) => {
            let bias: Vec<Shown> = (0..keys.len())
                .map(|j| {
                    shown(
                        if trace.kept[j] {
                            trace.scores[j] - trace.dot_products[j] * trace.scale
                        } else {
                            0.0
                        },
                        digits,
                    )
                })
                .collect();
            let m = shown(slope, digits);
            format!(
                ", then add ALiBi's bias $m (j - i)$ with slope $m {} {}$, a penalty that grows with the distance back to each key: $b {} {}$",
                relation(m.exact),
                tex(&m),
                relation(all_exact(&bias)),
                tuple(&bias)
            )
        }
        None => String::new(),
    };
    let _ = writeln!(
        out,
        "2. **Scale.** {how}{alibi}: $s {} {}$.{mask_note}",
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
        "3. **Subtract the max.** The largest score is ${}$: $s - {}$ ${} {}$, so no exponential can overflow.",
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
            "5. **Sum.** ${}$ ${} {}$.",
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
    let _ = writeln!(out, "6. **Normalize.** Divide each by ${}$: {}.", tex(&sum), pieces(&normal, ", "));
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
    let _ = writeln!(out, "7. **Weight the values.** {}.", pieces(&term_text, "; "));
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
    // The sum and its total are two pieces of math, so the line can wrap before the total.
    let sums: Vec<(String, String)> = (0..output.len())
        .map(|c| {
            let column: Vec<Shown> = kept.iter().map(|&j| terms[j][c].clone()).collect();
            (
                column.iter().map(tex).collect::<Vec<_>>().join(" + "),
                format!("{} {}", sum_relation(&column, &output[c]), tex(&output[c])),
            )
        })
        .collect();
    if let [(terms, total)] = sums.as_slice() {
        let _ = writeln!(out, "8. **Add them up.** $\\operatorname{{output}} = {terms}$ ${total}$.");
    } else {
        let sums: Vec<String> = sums.iter().map(|(terms, total)| format!("${terms}$ ${total}$")).collect();
        let _ = writeln!(out, "8. **Add them up,** component by component: {}.", sums.join("; "));
    }
    out
}

/// The online softmax of one query, block by block: each block's scores and maximum, the
/// running maximum `m` and the rescale factor, the running sum `l` and accumulator, the output so
/// far; then the one division, and the blocks' partial results merged as a check.
pub(super) fn tiled_steps(t: &crate::eval::TiledResult, digits: usize) -> String {
    let keys = t.inputs.key_labels();
    let values = &t.inputs.values;
    let query = &t.inputs.query_labels()[t.query];
    let mut out = format!(
        "The query of “{query}” against its keys in blocks of {}, keeping a running maximum $m$, a running sum $l$ and an accumulator $\\text{{acc}}$, all starting empty ($m = -\\infty$, $l = 0$, $\\text{{acc}} = 0$).\n\n",
        t.trace.block
    );
    let m_tex = |m: Option<f64>| m.map_or(r"-\infty".to_string(), |m| tex(&shown(m, digits)));
    for (n, b) in t.trace.blocks.iter().enumerate() {
        let names: Vec<String> =
            keys[b.keys.clone()].iter().map(|k| format!("$k_{{{}}}$", tex_label(k))).collect();
        let scores: Vec<Shown> = b.scores.iter().map(|&s| shown(s, digits)).collect();
        let mut line = format!(
            "{}. **Block {}** ({}). Scores $s {} {}$",
            n + 1,
            n + 1,
            names.join(", "),
            relation(all_exact(&scores)),
            tuple(&scores)
        );
        let Some(block_max) = b.block_max else {
            let _ = writeln!(
                out,
                "{line}: every key of the block is masked, so $m$, $l$ and the accumulator stay as they are."
            );
            continue;
        };
        let rescale = shown(b.rescale, digits);
        let exps = shown_all(&b.exponentials, digits);
        let l_before = shown(b.sum_before, digits);
        let l = shown(b.sum_after, digits);
        let rescale_text = match b.max_before {
            None => "nothing is carried in yet, so the rescale factor is $e^{-\\infty} = 0$".to_string(),
            Some(_) if b.rescale == 1.0 => "$m$ does not change, so the rescale factor is $1$".to_string(),
            Some(_) => format!(
                "the rescale factor is $e^{{m_{{\\text{{old}}}} - m}} = e^{{{} - {}}} {} {}$",
                m_tex(b.max_before),
                m_tex(b.max_after),
                relation(rescale.exact),
                tex(&rescale)
            ),
        };
        let _ = write!(
            line,
            ", block max ${}$. Running max $m = {} \\to {}$; {rescale_text}. Exponentials $e^{{s - m}} {} {}$. Running sum $l = {} \\cdot {} + {}$ ${} {}$.",
            tex(&shown(block_max, digits)),
            m_tex(b.max_before),
            m_tex(b.max_after),
            relation(all_exact(&exps)),
            tuple(&exps),
            tex(&rescale),
            tex(&l_before),
            exps.iter().map(tex).collect::<Vec<_>>().join(" + "),
            relation(false),
            tex(&l),
        );
        let acc = shown_all(&b.accumulator, digits);
        let output = shown_all(&b.output, digits);
        let terms: Vec<String> = b
            .keys
            .clone()
            .zip(&exps)
            .map(|(j, e)| format!("{} \\cdot {}", tex(e), tuple(&shown_all(&values[j], digits))))
            .collect();
        let _ = writeln!(
            line,
            " Accumulator ${} \\cdot \\text{{acc}} + {}$ ${} {}$, so the output so far is $\\text{{acc}} / l {} {}$.",
            tex(&rescale),
            terms.join(" + "),
            relation(false),
            tuple(&acc),
            relation(false),
            tuple(&output)
        );
        out.push_str(&line);
    }
    let n = t.trace.blocks.len();
    let output = shown_all(&t.trace.output, digits);
    let merged = shown_all(&t.merged.output.row(0).to_vec(), digits);
    let _ = writeln!(
        out,
        "{}. **Finish.** One division gives the output, $\\text{{acc}} / l {} {}$: what attention over every key at once gives. Merging the blocks' own partial results by their logsumexps gives it too: ${}$.",
        n + 1,
        relation(false),
        tuple(&output),
        tuple(&merged)
    );
    out
}

/// Where the query, keys and values came from, before the steps: `q = x W_q` for the query and
/// `k = x W_k`, `v = x W_v` for each key, as shown numbers.
fn projection_step(
    inputs: &AttentionInputs,
    p: &crate::eval::Projection,
    query: &str,
    digits: usize,
) -> String {
    let (x_q, x_kv) = if p.x_kv.is_none() { ("x", "x") } else { ("x^{q}", "x^{kv}") };
    let i = inputs.query_labels().iter().position(|l| l == query).unwrap_or(0);
    let vector = |xs: &[f64]| tuple(&shown_all(xs, digits));
    // `=` only where the shown product is the product exactly.
    let is = |xs: &[f64]| relation(all_exact(&shown_all(xs, digits)));
    let q_label = tex_label(query);
    let mut out = format!(
        // Two formulas, so that a phone's column may break the line between them.
        "First the projections: $q_{{{q_label}}} = {x_q}_{{{q_label}}} W_q$ $= {} W_q {} {}$",
        vector(&p.x_q[i]),
        is(&inputs.queries[i]),
        vector(&inputs.queries[i])
    );
    for (j, key) in inputs.key_labels().iter().enumerate() {
        let label = tex_label(key);
        out.push_str(&format!(
            "; $k_{{{label}}} = {x_kv}_{{{label}}} W_k {} {}$, $v_{{{label}}} = {x_kv}_{{{label}}} W_v {} {}$",
            is(&inputs.keys[j]),
            vector(&inputs.keys[j]),
            is(&inputs.values[j]),
            vector(&inputs.values[j])
        ));
    }
    out.push_str(".\n\n");
    out
}

/// The steps of a softmax over given scores, as one list.
pub(super) fn softmax_steps(trace: &qkv::QueryTrace, digits: usize) -> String {
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
        "3. **Sum:** ${}$ ${} {}$.",
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
    let _ = writeln!(out, "4. **Normalize:** {}.", pieces(&normal, ", "));
    out
}

/// The steps of a dot product and its scaled score.
pub(super) fn dot_steps(q: &[f64], k: &[f64], trace: &qkv::QueryTrace, digits: usize) -> String {
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
        "1. **Dot product:** {} ${} {}$.",
        expanded("q \\cdot k", &terms),
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
pub(super) fn weighted_sum_steps(
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
        "1. **Weight each value:** ${}$ ${} {}$.\n2. **Add:** $\\operatorname{{output}} {} {}$.\n",
        products.join(" + "),
        relation(exact_terms),
        t.iter().map(tex).collect::<Vec<_>>().join(" + "),
        sum_relation(&t, &out),
        tex(&out)
    )
}

#[cfg(test)]
mod tests;
