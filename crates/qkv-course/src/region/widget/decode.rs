//! The `decode-stepper` widget: a `qkv decode` example walked one step at a time. Each state is
//! one token's step: what the cache holds (its keys and values), the new query's scores over
//! them, the weights and the output. The build writes every state (from the engine's f64
//! reference, as the decoding computed it) as the page shows it; the script only swaps them.

use std::fmt::Write;

use serde_json::json;

use super::super::Context;
use super::{computed, position_of, vector, vector_text, wrong_example};
use crate::error::Problem;
use crate::eval::{Computed, DecodeResult};
use crate::examples::WidgetDecl;
use crate::format::fixed;
use crate::markup::{escape, inline_markdown, json_script, scroll_box};

/// The decoding a widget names, computed.
fn decoding(cx: &mut Context<'_, '_>, w: &WidgetDecl) -> Result<DecodeResult, Problem> {
    let expected = "the id of a `qkv decode` block, such as `gen`";
    match computed(cx, &w.example, expected)? {
        Computed::Decode(d) => Ok(*d),
        _ => Err(wrong_example(cx, &w.example, "a decoding", expected)),
    }
}

/// One state of the stepper: one token's step, as both views show it.
struct Step {
    /// The token whose step this is.
    token: String,
    /// The heading line, markdown.
    title: String,
    /// Per cached position: position, token, key, value, score (or `masked`), weight.
    rows: Vec<[String; 6]>,
    /// The output, a number per value column, as shown.
    output: Vec<String>,
}

impl Step {
    /// Token `t`'s step of decoding `d`, its numbers at `digits` decimals.
    fn new(d: &DecodeResult, t: usize, digits: usize) -> Step {
        let (label, inputs, result) = &d.steps[t];
        let trace = &result.traces[0];
        // A prompt is appended whole, so its tokens see a cache of the whole prompt, of which
        // the causal mask leaves them the positions up to their own.
        let (_, all, _) = &d.steps[d.steps.len() - 1];
        let held = inputs.keys.len().max(d.prompt);
        let labels = all.key_labels();
        let rows = (0..held)
            .map(|j| {
                let (score, weight) = match trace.scores.get(j) {
                    Some(&s) => (fixed(s, digits), fixed(trace.weights[j], digits)),
                    None => ("masked".to_string(), fixed(0.0, digits)),
                };
                [
                    (j + 1).to_string(),
                    labels[j].clone(),
                    vector(&all.keys[j]),
                    vector(&all.values[j]),
                    score,
                    weight,
                ]
            })
            .collect();
        let n = d.steps.len();
        let query = vector(&trace.query);
        let title = if t < d.prompt {
            let seen =
                if t == 0 { "only position 1".to_string() } else { format!("positions 1 to {}", t + 1) };
            format!(
                "Step {} of {n}, the prompt: “{label}” with $q = {query}$; the cache holds the {held} prompt positions, and the causal mask lets it see {seen}.",
                t + 1
            )
        } else {
            format!(
                "Step {} of {n}, decode step {}: “{label}” with $q = {query}$ appends its key and value; the cache now holds {held} positions.",
                t + 1,
                t + 1 - d.prompt
            )
        };
        let output = result.output.row(0).iter().map(|&x| fixed(x, digits)).collect();
        Step { token: label.clone(), title, rows, output }
    }

    /// The forge's view: the heading line, the cache as a table, the output.
    fn markdown(&self) -> String {
        let mut out = format!("{}\n\n", self.title);
        out.push_str(HEADER_MD);
        for row in &self.rows {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        let _ = writeln!(out, "\nThe output is {}.", vector_text(&self.output));
        out
    }

    /// The table's body rows, each readout marked by its token.
    fn rows_html(&self) -> String {
        let mut out = String::new();
        for [position, token, key, value, score, weight] in &self.rows {
            let l = escape(token);
            let _ = writeln!(
                out,
                "<tr><td>{position}</td><th scope=\"row\">{l}</th><td data-qkv-readout=\"key:{l}\">{key}</td><td data-qkv-readout=\"value:{l}\">{value}</td><td data-qkv-readout=\"score:{l}\">{score}</td><td data-qkv-readout=\"weight:{l}\">{weight}</td></tr>",
            );
        }
        out
    }

    /// The output's readouts: one number, or a vector of them.
    fn output_html(&self) -> String {
        if let [x] = self.output.as_slice() {
            return format!("<strong data-qkv-readout=\"output\">{x}</strong>");
        }
        let parts: Vec<String> = self
            .output
            .iter()
            .enumerate()
            .map(|(c, x)| format!("<strong data-qkv-readout=\"output:{}\">{x}</strong>", c + 1))
            .collect();
        format!("({})", parts.join(", "))
    }

    /// What the live region says once the learner moves to this step.
    fn announcement(&self) -> String {
        let weights: Vec<String> =
            self.rows.iter().filter(|r| r[4] != "masked").map(|r| format!("{} {}", r[1], r[5])).collect();
        format!(
            "Step of “{}”: the cache holds {} positions; weights {}; output {}.",
            self.token,
            self.rows.len(),
            weights.join(", "),
            vector_text(&self.output)
        )
    }
}

/// The cache table's head, in markdown.
const HEADER_MD: &str =
    "| position | token | key $k$ | value $v$ | score $s$ | weight $a$ |\n|--:|:--|--:|--:|--:|--:|\n";

/// The stepper's two views: markdown (the prompt and the declared step) and the page's HTML (the
/// same, plus every step as data and the buttons, hidden until the script shows them).
pub(super) fn stepper(
    cx: &mut Context<'_, '_>,
    id: &str,
    w: &WidgetDecl,
) -> Result<(String, String), Problem> {
    let d = decoding(cx, w)?;
    let (_, all, _) = &d.steps[d.steps.len() - 1];
    cx.at_most_shown(&[(all.keys.len(), "keys"), (all.values[0].len(), "components of a value")])?;
    let start = match &w.query {
        None => d.prompt.min(d.steps.len() - 1),
        Some(q) => {
            let tokens: Vec<&str> = d.steps.iter().map(|(t, _, _)| t.as_str()).collect();
            position_of(cx, w, q, &tokens, "a token")?
        }
    };
    let prompt = w.prompt.fill(cx.eval, cx.doc)?;
    let steps: Vec<Step> = (0..d.steps.len()).map(|t| Step::new(&d, t, w.digits)).collect();
    let shown = &steps[start];
    let markdown = format!("**Try it.** {}\n\n{}", prompt.trim(), shown.markdown());

    let data = json!({
        "start": start,
        "steps": steps.iter().map(|s| json!({
            "token": s.token,
            "title": inline_markdown(&s.title),
            "rows": s.rows_html(),
            "output": s.output_html(),
            "announce": s.announcement(),
        })).collect::<Vec<_>>(),
    });
    let mut html = format!(
        "<div class=\"widget decode\" data-qkv-widget=\"decode-stepper\" id=\"widget-{}\" data-qkv-step=\"{}\">\n",
        escape(id),
        escape(&shown.token)
    );
    html.push_str(&json_script("data-qkv-data", &data));
    let _ = writeln!(html, "<p class=\"prompt\"><strong>Try it.</strong> {}</p>", inline_markdown(&prompt));
    html.push_str(
        "<p class=\"actions\" hidden><button type=\"button\" data-qkv-prev>Previous</button> <button type=\"button\" data-qkv-next>Next token</button></p>\n",
    );
    let _ = writeln!(html, "<p class=\"step\" data-qkv-step-title>{}</p>", inline_markdown(&shown.title));
    html.push_str(&scroll_box("The cache at this step"));
    html.push_str("<table class=\"readouts\">\n<thead><tr>");
    for head in ["position", "token", "key $k$", "value $v$", "score $s$", "weight $a$"] {
        let _ = write!(html, "<th scope=\"col\">{}</th>", inline_markdown(head));
    }
    let _ = write!(
        html,
        "</tr></thead>\n<tbody data-qkv-cache>\n{}</tbody>\n</table></div>\n",
        shown.rows_html()
    );
    let _ = writeln!(
        html,
        "<p class=\"output\">The output {} is <span data-qkv-output>{}</span>.</p>",
        inline_markdown("$\\sum_i a_i v_i$"),
        shown.output_html()
    );
    html.push_str("<p class=\"offscreen\" data-qkv-announce aria-live=\"polite\"></p>\n</div>\n");
    Ok((markdown, html))
}
