//! `lab EXAMPLE.TOKEN [rounded=N]`: the NumPy laboratory for one query (or `lab MULTIHEAD`, every
//! head of a multi-head example and its output, `lab/multi_head.rs`; `lab TILED`, the online
//! softmax tile by tile; `lab DECODE`, a whole decoding step by step): a short program, what it
//! prints (from the engine's trace; with `rounded=N` the output also at the N decimals the prose
//! cites), and the same program as a Jupyter notebook for the site. The page's link downloads the
//! notebook (the page script can also hand it over from the copy embedded in the page, for pages
//! read from `file://`); "Open in Colab" appears when the section's settings name a repository.

use std::fmt::Write;

use super::{Context, Generated, Kind};
use crate::error::Problem;
use crate::eval::{AttentionInputs, AttentionResult, Computed, DecodeResult, TiledResult};
use crate::examples::colab_base;
use crate::files::OutputFile;
use crate::markup::{escape, fragment, json_script};
use crate::notebook;

pub(super) const KIND: Kind = Kind {
    name: "lab",
    usage: "`lab EXAMPLE.TOKEN`, `lab TILED`, `lab MULTIHEAD`, `lab DECODE`, `lab BLOCK`, `lab GRADIENT` or `lab POSITIONS`",
    options: &["digits", "rounded"],
    generate,
};

fn generate(cx: &mut Context<'_, '_>) -> Result<Generated, Problem> {
    let named = cx.named(KIND.usage)?;
    let rounded = cx.options.iter().find(|(o, _)| *o == "rounded").map(|&(_, n)| n);
    if rounded.is_some() && !matches!(named.computed, Computed::Attention { result: Ok(_), .. }) {
        // Only one query's lab prints its output a second time, rounded as the prose cites it.
        return Err(cx.option_problem(
            "rounded",
            "`rounded=N` on a lab that is not one query of an attention example",
            "`rounded=N` only on `lab EXAMPLE.TOKEN`; `digits=N` sets any lab's decimals",
        ));
    }
    // A part of a record (a head of a multi-head example) is named in the file too, so that two
    // heads' labs of one token do not share a notebook.
    let notebook_name = |label: &str| {
        let segments: Vec<&str> = cx.args[0].split('.').collect();
        let part = &segments[segments.len().saturating_sub(named.rest.len() + named.consumed)
            ..segments.len() - named.rest.len()];
        let stem =
            [named.key.replace('.', "-")].into_iter().chain(part.iter().map(|s| crate::markup::slug(s)));
        format!("notebooks/{}-{}.ipynb", stem.collect::<Vec<_>>().join("-"), crate::markup::slug(label))
    };
    let (lab, name, title, intro) = match named.computed {
        Computed::MultiHead(m) if named.rest.is_empty() => {
            let name = format!("notebooks/{}.ipynb", named.key.replace('.', "-"));
            (multi_head::lab(cx, &m, cx.digits)?, name, multi_head::TITLE.to_string(), multi_head::INTRO)
        }
        Computed::Positions(p) if named.rest.is_empty() => {
            let name = format!("notebooks/{}.ipynb", named.key.replace('.', "-"));
            (positions::lab(&p, cx.digits), name, positions::TITLE.to_string(), positions::INTRO)
        }
        Computed::Gradient(g) if named.rest.is_empty() => {
            let name = format!("notebooks/{}.ipynb", named.key.replace('.', "-"));
            (gradient::lab(cx, &g, cx.digits)?, name, gradient::TITLE.to_string(), gradient::INTRO)
        }
        Computed::Block(b) if named.rest.is_empty() => {
            let name = format!("notebooks/{}.ipynb", named.key.replace('.', "-"));
            (block::lab(cx, &b, cx.digits)?, name, block::TITLE.to_string(), block::INTRO)
        }
        Computed::Decode(d) if named.rest.is_empty() => (
            decode_lab(&d, cx.digits),
            format!("notebooks/{}.ipynb", named.key.replace('.', "-")),
            "Decoding with a KV cache, in NumPy".to_string(),
            "A prompt, then one token at a time: each step appends its key and value to the cache and attends with its own query over what the cache holds. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.",
        ),
        Computed::Attention { inputs, result: Ok(result) } => {
            let i = cx.query_index(cx.args[0], &inputs, &named.rest)?;
            let rounded = match rounded {
                Some(n) => Some(n.parse().ok().filter(|&d| d <= 12).ok_or_else(|| {
                    cx.option_problem(
                        "rounded",
                        format!("bad `rounded={n}`"),
                        "`rounded=N` with N from 0 to 12, the decimals the prose cites",
                    )
                })?),
                None => None,
            };
            let label = inputs.query_labels()[i].clone();
            (
                lab(&inputs, &result, i, cx.digits, rounded),
                notebook_name(&label),
                format!("Attention for the query “{label}”, in NumPy"),
                "Scaled dot-product attention in a few lines of NumPy: score every key, softmax, blend the values. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.",
            )
        }
        Computed::Tiled(t) if named.rest.is_empty() => {
            let label = t.inputs.query_labels()[t.query].clone();
            (
                tiled_lab(&t, cx.digits),
                notebook_name(&label),
                format!("The online softmax for the query “{label}”, in NumPy"),
                "Attention one tile of keys at a time, keeping only a running maximum, a running sum and an accumulator, as FlashAttention does. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.",
            )
        }
        Computed::Tiled(_) => {
            return Err(cx.problem(
                format!("`{}`: a `qkv tiled` block follows the query it names", cx.args[0]),
                format!("`lab {}`, the block's id alone", named.key.rsplit('.').next().unwrap_or(&named.key)),
            ));
        }
        _ => {
            return Err(cx.problem(
                format!("`{}` is not an attention example that computes", cx.args[0]),
                "`EXAMPLE.TOKEN` of a `qkv attention` block, or the id of a `qkv tiled`, `qkv multi-head` or `qkv decode` block",
            ));
        }
    };
    Ok(finish(cx, lab, name, &title, intro))
}

/// A lab's region: its markdown, its page view and its notebook `name`.
fn finish(cx: &mut Context<'_, '_>, lab: Lab, name: String, title: &str, intro: &str) -> Generated {
    let nb = notebook::notebook(title, intro, &lab.code, &lab.printed);
    let colab = cx
        .settings()
        .notebook_repository
        .and_then(|r| colab_base(&r.value))
        .map(|base| format!("{base}/{name}"));
    let html = lab_html(&lab, &name, colab.as_deref(), &nb);
    Generated {
        html: Some(html),
        notebook: Some(OutputFile { name: name.clone(), text: nb }),
        ..cx.markdown(lab_markdown(&lab, &name, colab.as_deref()))
    }
}

/// The NumPy program of a whole decoding: the cache as two arrays that grow by a row per decoded
/// token, and each token's step over it; what it prints, a line per step, from the decoding's
/// own steps (the engine's trace).
fn decode_lab(d: &DecodeResult, digits: usize) -> Lab {
    let Some((_, all, _)) = d.steps.last() else {
        return Lab { code: String::new(), printed: String::new() };
    };
    let tokens: Vec<String> = all.key_labels().iter().map(|t| format!("{t:?}")).collect();
    let queries: Vec<Vec<f64>> = d.steps.iter().map(|(_, _, r)| r.traces[0].query.clone()).collect();
    let mut code = String::from("import numpy as np\n\n");
    let _ = writeln!(code, "tokens = [{}]", tokens.join(", "));
    let _ = writeln!(code, "Q = {}  # one query per token", py_rows(&queries));
    let _ = writeln!(code, "K = {}  # one key per token", py_rows(&all.keys));
    let _ = writeln!(code, "V = {}  # one value per token", py_rows(&all.values));
    let _ = writeln!(code, "prompt = {}  # tokens that come at once (the prefill)\n", d.prompt);
    let _ = writeln!(
        code,
        "def show(xs, digits={digits}):\n    return \", \".join(f\"{{x:.{{digits}}f}}\" for x in np.atleast_1d(xs))\n"
    );
    code.push_str(
        "def attend(q, K_seen, V_seen):\n    scores = K_seen @ q / np.sqrt(K_seen.shape[1])  # score every key it sees\n    weights = np.exp(scores - scores.max())        # softmax...\n    weights = weights / weights.sum()              # ...normalized\n    return weights, weights @ V_seen               # blend the values\n\n",
    );
    code.push_str("K_cache, V_cache = K[:prompt], V[:prompt]  # the prefill appends the whole prompt\n");
    code.push_str("for t, token in enumerate(tokens):\n");
    code.push_str("    if t >= prompt:  # a decoding step appends one key and one value\n");
    code.push_str(
        "        K_cache = np.vstack([K_cache, K[t]])\n        V_cache = np.vstack([V_cache, V[t]])\n",
    );
    code.push_str("    # The causal mask: token t sees the cached positions up to its own.\n");
    code.push_str("    weights, output = attend(Q[t], K_cache[: t + 1], V_cache[: t + 1])\n");
    code.push_str("    step = \"prompt\" if t < prompt else f\"decode {t + 1 - prompt}\"\n");
    code.push_str(
        "    print(f\"{token} ({step}, cache {len(K_cache)}): weights {show(weights)}; output {show(output)}\")\n",
    );
    let show = |xs: &[f64]| xs.iter().map(|x| py_fixed(*x, digits)).collect::<Vec<_>>().join(", ");
    let mut printed = String::new();
    for (t, (label, inputs, result)) in d.steps.iter().enumerate() {
        let step = if t < d.prompt { "prompt".to_string() } else { format!("decode {}", t + 1 - d.prompt) };
        let _ = writeln!(
            printed,
            "{label} ({step}, cache {}): weights {}; output {}",
            inputs.keys.len().max(d.prompt),
            show(&result.traces[0].weights),
            show(&result.output.row(0).to_vec())
        );
    }
    Lab { code, printed }
}

/// The NumPy laboratory for one query: the program, and what it prints (from the engine's trace).
struct Lab {
    code: String,
    printed: String,
}

fn py_rows(rows: &[Vec<f64>]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|r| format!("[{}]", r.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", ")))
        .collect();
    format!("np.array([{}])", rows.join(", "))
}

/// Writes the NumPy program for query `query_idx` and the text it prints; `rounded` adds the
/// output at the decimals the prose cites.
fn lab(
    inputs: &AttentionInputs,
    result: &AttentionResult,
    query_idx: usize,
    digits: usize,
    rounded: Option<usize>,
) -> Lab {
    let trace = &result.traces[query_idx];
    let labels = inputs.query_labels();
    let mut code = inputs_code(inputs);
    let _ = writeln!(code, "q = Q[{query_idx}]  # the query of {:?}", labels[query_idx]);
    if default_scale(trace.scale, trace.query.len()) {
        let _ = writeln!(code, "scores = K @ q / np.sqrt(K.shape[1])  # step 1: score every key");
    } else {
        let _ = writeln!(code, "scores = (K @ q) * {:?}  # step 1: score every key", trace.scale);
    }
    if let Some(slope) = inputs.limits.alibi {
        let position = alibi_position(inputs, query_idx);
        let _ = writeln!(
            code,
            "scores = scores + {slope:?} * (np.arange(len(K)) - {position})  # ALiBi: slope times distance"
        );
    }
    if trace.kept.iter().any(|k| !k) {
        let keep: Vec<&str> = trace.kept.iter().map(|&k| if k { "True" } else { "False" }).collect();
        let _ = writeln!(code, "scores = np.where([{}], scores, -np.inf)  # the mask", keep.join(", "));
    }
    let _ = writeln!(code, "weights = np.exp(scores - scores.max())  # step 2: softmax...");
    let _ = writeln!(code, "weights = weights / weights.sum()        # ...normalized");
    let _ = writeln!(code, "output = weights @ V                     # step 3: blend the values\n");
    code.push_str(&show_code(digits));
    let _ = writeln!(code, "print(\"scores: \", show(scores))");
    let _ = writeln!(code, "print(\"weights:\", show(weights))");
    let show =
        |xs: &[f64], digits: usize| xs.iter().map(|x| py_fixed(*x, digits)).collect::<Vec<_>>().join(", ");
    let output = result.output.row(query_idx).to_vec();
    let mut printed = format!(
        "scores:  {}\nweights: {}\noutput:  {}",
        show(&trace.scores, digits),
        show(&trace.weights, digits),
        show(&output, digits)
    );
    match rounded {
        Some(r) => {
            let _ = writeln!(
                code,
                "print(\"output: \", show(output), f\"(the lesson rounds it to {{show(output, {r})}})\")"
            );
            let _ = writeln!(printed, " (the lesson rounds it to {})", show(&output, r));
        }
        None => {
            let _ = writeln!(code, "print(\"output: \", show(output))");
            printed.push('\n');
        }
    }
    Lab { code, printed }
}

/// The program's first lines: NumPy, the tokens, and `Q`, `K`, `V` (from the projections when
/// the example has them).
fn inputs_code(inputs: &AttentionInputs) -> String {
    let tokens: Vec<String> = inputs.key_labels().iter().map(|t| format!("{t:?}")).collect();
    let mut code = String::new();
    let _ = writeln!(code, "import numpy as np\n");
    let _ = writeln!(code, "tokens = [{}]", tokens.join(", "));
    match &inputs.projection {
        Some(p) => {
            match &p.x_kv {
                None => {
                    let _ = writeln!(code, "X = {}  # one embedding per token", py_rows(&p.x_q));
                }
                Some(x_kv) => {
                    let _ = writeln!(code, "X_q = {}  # the queries' tokens", py_rows(&p.x_q));
                    let _ = writeln!(code, "X_kv = {}  # the keys' tokens", py_rows(x_kv));
                }
            }
            let _ = writeln!(code, "W_q = {}", py_rows(&p.w_q));
            let _ = writeln!(code, "W_k = {}", py_rows(&p.w_k));
            let _ = writeln!(code, "W_v = {}", py_rows(&p.w_v));
            let (x_q, x_kv) = if p.x_kv.is_none() { ("X", "X") } else { ("X_q", "X_kv") };
            let _ = writeln!(
                code,
                "Q, K, V = {x_q} @ W_q, {x_kv} @ W_k, {x_kv} @ W_v  # queries, keys and values, one per row\n"
            );
        }
        None => {
            let _ = writeln!(code, "Q = {}  # one query per row", py_rows(&inputs.queries));
            let _ = writeln!(code, "K = {}  # one key per row", py_rows(&inputs.keys));
            let _ = writeln!(code, "V = {}  # one value per row\n", py_rows(&inputs.values));
        }
    }
    code
}

/// Whether `scale` is the default `1 / sqrt(d_k)`, which the program then writes as such.
fn default_scale(scale: f64, d_k: usize) -> bool {
    (scale - 1.0 / (d_k as f64).sqrt()).abs() < 1e-15
}

/// The key position query `i` stands at, for ALiBi: `i + n_k - n_q` (bottom-right, as the engine
/// aligns it).
fn alibi_position(inputs: &AttentionInputs, i: usize) -> i64 {
    i as i64 + inputs.keys.len() as i64 - inputs.queries.len() as i64
}

/// The program's `show`, which prints numbers as the lesson does, at `digits` decimals.
fn show_code(digits: usize) -> String {
    format!(
        "def show(xs, digits={digits}):\n    return \", \".join(f\"{{x:.{{digits}}f}}\" for x in np.atleast_1d(xs))\n\n"
    )
}

/// The NumPy laboratory for a tiled trace: the online softmax over blocks of keys, each block's
/// state printed, then the one division and attention over every key at once to compare.
fn tiled_lab(t: &TiledResult, digits: usize) -> Lab {
    let (inputs, i) = (&t.inputs, t.query);
    let trace = &t.trace;
    let mut code = inputs_code(inputs);
    let _ = writeln!(code, "q = Q[{i}]  # the query of {:?}", inputs.query_labels()[i]);
    let scale = if default_scale(trace.scale, inputs.queries[i].len()) {
        "1 / np.sqrt(K.shape[1])".to_string()
    } else {
        format!("{:?}", trace.scale)
    };
    let _ = writeln!(code, "scale = {scale}");
    let _ = writeln!(code, "block = {}  # keys per tile\n", trace.block);
    code.push_str(&show_code(digits));
    // Masks and biases, per key, so that each tile takes its own slice.
    let mut extra = String::new();
    if let Some(slope) = inputs.limits.alibi {
        let position = alibi_position(inputs, i);
        let _ = writeln!(
            code,
            "bias = {slope:?} * (np.arange(len(K)) - {position})  # ALiBi: slope times distance"
        );
        extra.push_str(" + bias[start:stop]");
    }
    // A hidden key's score is -inf in the trace (inputs are finite), and so it is here.
    let kept: Vec<bool> =
        trace.blocks.iter().flat_map(|b| b.scores.iter().map(|&s| s != f64::NEG_INFINITY)).collect();
    let masked = kept.iter().any(|k| !k);
    let score = |keys: &str| {
        let s = format!("(K{keys} @ q) * scale{}", extra.replace("[start:stop]", keys));
        if masked { format!("np.where(keep{keys}, {s}, -np.inf)") } else { s }
    };
    if masked {
        let keep: Vec<&str> = kept.iter().map(|&k| if k { "True" } else { "False" }).collect();
        let _ = writeln!(code, "keep = np.array([{}])  # the mask", keep.join(", "));
    }
    code.push_str(
        "m, l, acc = -np.inf, 0.0, np.zeros(V.shape[1])  # running max, running sum, accumulator\n",
    );
    code.push_str("for start in range(0, len(K), block):\n");
    code.push_str("    stop = min(start + block, len(K))\n");
    let _ = writeln!(code, "    s = {}  # this tile's scores, and no others", score("[start:stop]"));
    code.push_str("    m_new = max(m, s.max())                   # the running maximum, updated\n");
    if masked {
        code.push_str(
            "    if m_new == -np.inf:                      # no visible key yet: nothing changes\n",
        );
        code.push_str("        print(f\"block {start // block + 1}: every key masked\")\n");
        code.push_str("        continue\n");
    }
    code.push_str(
        "    rescale = np.exp(m - m_new)               # shrinks what was summed against the old maximum\n",
    );
    code.push_str("    p = np.exp(s - m_new)\n");
    code.push_str("    l = rescale * l + p.sum()\n");
    code.push_str("    acc = rescale * acc + p @ V[start:stop]\n");
    code.push_str("    m = m_new\n");
    code.push_str("    print(f\"block {start // block + 1}: max {show(s.max())}  m {show(m)}  rescale {show(rescale)}  l {show(l)}  output so far {show(acc / l)}\")\n\n");
    code.push_str("output = acc / l  # the one division, at the end\n");
    let _ = writeln!(code, "scores = {}  # every key at once, to compare", score(""));
    code.push_str("weights = np.exp(scores - scores.max())\n");
    code.push_str("print(\"output:   \", show(output))\n");
    code.push_str("print(\"attention:\", show((weights / weights.sum()) @ V), \"(every key at once)\")\n");
    let show = |xs: &[f64]| xs.iter().map(|x| py_fixed(*x, digits)).collect::<Vec<_>>().join(", ");
    let mut printed = String::new();
    for (k, b) in trace.blocks.iter().enumerate() {
        if b.max_after.is_none() {
            let _ = writeln!(printed, "block {}: every key masked", k + 1);
            continue;
        }
        let _ = writeln!(
            printed,
            "block {}: max {}  m {}  rescale {}  l {}  output so far {}",
            k + 1,
            py_fixed(b.block_max.unwrap_or(f64::NEG_INFINITY), digits),
            py_fixed(b.max_after.unwrap_or(f64::NEG_INFINITY), digits),
            py_fixed(b.rescale, digits),
            py_fixed(b.sum_after, digits),
            show(&b.output)
        );
    }
    let _ = writeln!(printed, "output:    {}", show(&trace.output));
    let _ = writeln!(printed, "attention: {} (every key at once)", show(&t.attention));
    Lab { code, printed }
}

/// What Python's `f"{x:.Nf}"` prints (it keeps negative zero and spells infinity `inf`).
fn py_fixed(x: f64, digits: usize) -> String {
    if x == f64::NEG_INFINITY { "-inf".to_string() } else { format!("{x:.digits$}") }
}

/// The program and what it prints, as markdown.
fn program_markdown(lab: &Lab) -> String {
    format!("```python\n{}```\n\nIt prints:\n\n```text\n{}```\n", lab.code, lab.printed)
}

/// The lab as markdown: the program, what it prints, and the notebook's links.
fn lab_markdown(lab: &Lab, notebook: &str, colab: Option<&str>) -> String {
    let colab = colab.map(|url| format!(" · [Open in Colab]({url})")).unwrap_or_default();
    format!(
        "{}\nThe same program as a Jupyter notebook: [{notebook}]({notebook}){colab}.\n",
        program_markdown(lab)
    )
}

/// The lab as the page has it: the notebook link downloads (`download`), and the notebook's text
/// rides along for the page script, which hands it over itself where a browser would rather
/// show a local file than save it.
fn lab_html(lab: &Lab, notebook: &str, colab: Option<&str>, text: &str) -> String {
    let file = notebook.rsplit('/').next().unwrap_or(notebook);
    let colab = colab
        .map(|url| format!(" · <a href=\"{}\" rel=\"noopener\">Open in Colab</a>", escape(url)))
        .unwrap_or_default();
    format!(
        "{}<p class=\"notebook\">The same program as a Jupyter notebook: <a href=\"{}\" download=\"{}\" data-qkv-notebook>download {}</a>{colab}.</p>\n{}",
        fragment(&program_markdown(lab)),
        escape(notebook),
        escape(file),
        escape(file),
        json_script("data-qkv-notebook-text", &serde_json::json!({ "name": file, "text": text }))
    )
}

mod block;
mod gradient;
mod multi_head;
mod positions;
#[cfg(test)]
mod tests;
