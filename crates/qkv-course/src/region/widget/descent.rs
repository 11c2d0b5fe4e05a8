//! `gradient-descent` widgets: a gradient block's steps walked one at a time, each showing the
//! loss, every token's query, key, value and output, and the gradient that the next step follows.
//! The build writes every step's text from the block's record (the engine's forward and
//! backward), so the script only swaps text in.

use std::fmt::Write;

use serde_json::json;

use super::{Context, computed, wrong_example};
use crate::error::Problem;
use crate::eval::{Computed, GradientResult};
use crate::examples::WidgetDecl;
use crate::format::shown;
use crate::markup::{escape, inline_markdown, json_script, scroll_box};

/// The readouts of one step, by name (`loss`, `output:TOKEN`, `query:TOKEN`, …), as shown.
fn readouts(g: &GradientResult, s: usize, digits: usize) -> Vec<(String, String)> {
    let (ql, kl) = g.labels();
    let step = &g.steps[s];
    let vector = |xs: &[f64]| {
        let parts: Vec<String> = xs.iter().map(|&x| shown(x, digits).text).collect();
        if parts.len() == 1 { parts[0].clone() } else { format!("({})", parts.join(", ")) }
    };
    let mut out = vec![("loss".to_string(), shown(step.loss, digits).text)];
    for (i, q) in ql.iter().enumerate() {
        out.push((format!("query:{q}"), vector(&step.inputs.queries[i])));
        out.push((format!("dq:{q}"), vector(&step.d_queries[i])));
        out.push((format!("output:{q}"), vector(&step.result.output.row(i).to_vec())));
    }
    for (j, k) in kl.iter().enumerate() {
        out.push((format!("key:{k}"), vector(&step.inputs.keys[j])));
        out.push((format!("value:{k}"), vector(&step.inputs.values[j])));
    }
    out
}

fn title(s: usize, last: usize) -> String {
    match s {
        0 => "Before any step.".to_string(),
        _ => format!("After step {s} of {last}."),
    }
}

/// The markdown (forge and `--check`) and page views of a gradient-descent widget.
pub(super) fn descent(
    cx: &mut Context<'_, '_>,
    id: &str,
    w: &WidgetDecl,
) -> Result<(String, String), Problem> {
    let g = match computed(cx, &w.example, "just the gradient block's id")? {
        Computed::Gradient(g) => g,
        _ => {
            return Err(wrong_example(
                cx,
                &w.example,
                "a gradient block",
                "the id of a `qkv gradient` block",
            ));
        }
    };
    let (ql, kl) = g.labels();
    // One row per token holds its query, key and value: the example must be self-attention.
    if !g.steps[0].inputs.self_attention() {
        return Err(wrong_example(
            cx,
            &w.example,
            &format!(
                "a self-attention gradient block: its queries are {} and its keys {}, and the widget shows one row per token with its query, key and value",
                ql.join(", "),
                kl.join(", ")
            ),
            "a `qkv gradient` block over an example whose queries and keys are the same tokens",
        ));
    }
    cx.at_most_shown(&[(kl.len(), "keys")])?;
    let prompt = w.prompt.fill(cx.eval, cx.doc)?;
    let last = g.steps.len() - 1;
    let states: Vec<Vec<(String, String)>> = (0..=last).map(|s| readouts(&g, s, w.digits)).collect();
    let get = |s: usize, name: &str| {
        states[s].iter().find(|(n, _)| n == name).map(|(_, t)| t.clone()).unwrap_or_default()
    };
    // Self-attention (checked above): one row per token; queries and keys go by the same labels.
    let mut markdown = format!(
        "**Try it.** {}\n\n{} Loss: {}.\n\n| token | output | $dq$ | query | key | value |\n|:--|:--|:--|:--|:--|:--|\n",
        prompt.trim(),
        title(0, last),
        get(0, "loss")
    );
    for (q, k) in ql.iter().zip(&kl) {
        let _ = writeln!(
            markdown,
            "| {q} | {} | {} | {} | {} | {} |",
            get(0, &format!("output:{q}")),
            get(0, &format!("dq:{q}")),
            get(0, &format!("query:{q}")),
            get(0, &format!("key:{k}")),
            get(0, &format!("value:{k}"))
        );
    }
    let data = json!({
        "steps": states.iter().enumerate().map(|(s, r)| json!({
            "title": title(s, last),
            "readouts": r.iter().map(|(n, t)| (n.clone(), json!(t))).collect::<serde_json::Map<String, serde_json::Value>>(),
            "announce": format!("{} Loss {}.", title(s, last), get(s, "loss")),
        })).collect::<Vec<_>>(),
    });
    let mut html = format!(
        "<div class=\"widget descent\" data-qkv-widget=\"gradient-descent\" id=\"widget-{}\" data-qkv-step=\"0\">\n",
        escape(id)
    );
    html.push_str(&json_script("data-qkv-data", &data));
    let _ = writeln!(html, "<p class=\"prompt\"><strong>Try it.</strong> {}</p>", inline_markdown(&prompt));
    html.push_str("<p class=\"actions\" hidden><button type=\"button\" data-qkv-prev>Previous step</button> <button type=\"button\" data-qkv-next>Next step</button></p>\n");
    let _ = writeln!(
        html,
        "<p><span data-qkv-title>{}</span> Loss: <strong data-qkv-readout=\"loss\">{}</strong>.</p>",
        escape(&title(0, last)),
        get(0, "loss")
    );
    html.push_str(&scroll_box("Readouts"));
    html.push_str("<table class=\"readouts\">\n<thead><tr><th scope=\"col\">token</th><th scope=\"col\">output</th><th scope=\"col\">dq</th><th scope=\"col\">query</th><th scope=\"col\">key</th><th scope=\"col\">value</th></tr></thead>\n<tbody>\n");
    for (q, k) in ql.iter().zip(&kl) {
        let (q, k) = (escape(q), escape(k));
        let _ = write!(html, "<tr><th scope=\"row\">{q}</th>");
        for name in [
            format!("output:{q}"),
            format!("dq:{q}"),
            format!("query:{q}"),
            format!("key:{k}"),
            format!("value:{k}"),
        ] {
            let _ = write!(html, "<td data-qkv-readout=\"{name}\">{}</td>", get(0, &name));
        }
        html.push_str("</tr>\n");
    }
    html.push_str("</tbody>\n</table></div>\n");
    html.push_str("<p class=\"offscreen\" data-qkv-announce aria-live=\"polite\"></p>\n</div>\n");
    Ok((markdown, html))
}
