//! `head-explorer`: a multi-head example one head at a time (its weights as a heatmap, and its
//! output), and the final output with any heads switched off (their outputs replaced by zeros
//! before `W_o`). The build computes every state the page can show, each head and each of the
//! 2^heads on/off combinations, from the example's engine results, and embeds them as shown
//! text: the page script only picks which to show. The markdown (and the page without script)
//! shows the declared head with every head on.

use std::fmt::Write;

use serde_json::json;

use super::{computed, position_of, wrong_example};
use crate::error::Problem;
use crate::eval::{AttentionInputs, AttentionResult, Computed, MultiHeadResult};
use crate::examples::WidgetDecl;
use crate::format::fixed;
use crate::markup::{escape, inline_markdown, json_script, scroll_box};
use crate::region::Context;
use crate::region::table::{escape_cell, matrix_table, shown_counts};

/// The most heads one explorer switches: 2^6 = 64 combinations of on and off, each embedded.
const MAX_HEADS: usize = 6;

/// The explorer's markdown and page HTML.
pub(super) fn widget(
    cx: &mut Context<'_, '_>,
    id: &str,
    w: &WidgetDecl,
) -> Result<(String, String), Problem> {
    let m = match computed(cx, &w.example, "just the example id, such as `many`")? {
        Computed::MultiHead(m) => m,
        _ => {
            return Err(wrong_example(
                cx,
                &w.example,
                "a multi-head example",
                "the id of a `qkv multi-head` block",
            ));
        }
    };
    if m.heads.len() > MAX_HEADS {
        return Err(Problem::new(
            cx.doc,
            w.example.at,
            format!(
                "`{}` has {} heads, more than the {MAX_HEADS} a `head-explorer` switches (it shows every combination of heads on and off)",
                w.example.value,
                m.heads.len()
            ),
            w.example.value.clone(),
            format!("a multi-head example of at most {MAX_HEADS} heads"),
        ));
    }
    for (_, inputs, _) in &m.heads {
        cx.at_most_shown(&shown_counts(inputs))?;
    }
    cx.at_most_shown(&[(m.output.first().map_or(0, Vec::len), "components of the output")])?;
    let names: Vec<&str> = m.heads.iter().map(|(n, _, _)| n.as_str()).collect();
    let start = match &w.head {
        None => 0,
        Some(head) => position_of(cx, w, head, &names, "a head")?,
    };
    let prompt = w.prompt.fill(cx.eval, cx.doc)?;
    let explorer = Explorer { m: &m, start, digits: w.digits };
    Ok((explorer.markdown(&prompt), explorer.html(id, &prompt)))
}

/// A head-explorer at its declared state.
struct Explorer<'m> {
    m: &'m MultiHeadResult,
    /// The head shown at the start.
    start: usize,
    digits: usize,
}

/// How the page names a head: `head 1`, `head near`.
fn head_label(name: &str) -> String {
    format!("head {name}")
}

/// The key of an on/off combination in the embedded data: one `1` or `0` per head, in order.
fn state_key(on: &[bool]) -> String {
    on.iter().map(|&b| if b { '1' } else { '0' }).collect()
}

impl Explorer<'_> {
    fn head(&self, h: usize) -> (&AttentionInputs, &AttentionResult) {
        let (_, inputs, result) = &self.m.heads[h];
        (inputs, result)
    }

    fn shown(&self, rows: &[Vec<f64>]) -> Vec<Vec<String>> {
        rows.iter().map(|r| r.iter().map(|&x| fixed(x, self.digits)).collect()).collect()
    }

    /// Head `h`'s weights as shown: a masked key says so.
    fn weights(&self, h: usize) -> Vec<Vec<String>> {
        let (_, result) = self.head(h);
        result
            .traces
            .iter()
            .map(|t| {
                t.weights
                    .iter()
                    .zip(&t.kept)
                    .map(
                        |(&w, &kept)| {
                            if kept { fixed(w, self.digits) } else { format!("{} (masked)", fixed(w, 0)) }
                        },
                    )
                    .collect()
            })
            .collect()
    }

    /// Head `h`'s output, one row per token.
    fn head_output(&self, h: usize) -> Vec<Vec<String>> {
        let (_, result) = self.head(h);
        self.shown(&result.output.rows().into_iter().map(|r| r.to_vec()).collect::<Vec<_>>())
    }

    /// Every on/off combination, all on first.
    fn combinations(&self) -> Vec<Vec<bool>> {
        let n = self.m.heads.len();
        (0..1usize << n).map(|bits| (0..n).map(|h| bits & (1 << (n - 1 - h)) == 0).collect()).collect()
    }

    /// The final output with the heads `on` marks, as shown.
    fn output(&self, on: &[bool]) -> Vec<Vec<String>> {
        self.shown(&self.m.output_with(on))
    }

    /// What the heatmap of head `h` shows (the page adds a colon, and the script a note when the
    /// head is switched off).
    fn caption(&self, h: usize) -> String {
        format!("The weights of {}, one row per query, and its output", head_label(&self.m.heads[h].0))
    }

    /// The forge's and `--check`'s view: the prompt, the declared head's weights and output, and
    /// the final output with every head on.
    fn markdown(&self, prompt: &str) -> String {
        let (inputs, result) = self.head(self.start);
        let mut out = format!("**Try it.** {}\n\n{}:\n\n", prompt.trim(), self.caption(self.start));
        out.push_str(&matrix_table(inputs, result, &result.weights, "weights", self.digits));
        out.push_str("\nThe output, with every head switched on:\n\n| token |");
        let output = self.output(&vec![true; self.m.heads.len()]);
        let width = output.first().map_or(0, Vec::len);
        for c in 1..=width {
            let _ = write!(out, " {c} |");
        }
        out.push_str("\n|:--|");
        out.push_str(&"--:|".repeat(width));
        out.push('\n');
        for (token, row) in self.m.tokens.iter().zip(&output) {
            let _ = writeln!(out, "| {} | {} |", escape_cell(token), row.join(" | "));
        }
        out
    }

    fn html(&self, id: &str, prompt: &str) -> String {
        let n = self.m.heads.len();
        let names: Vec<&str> = self.m.heads.iter().map(|(name, _, _)| name.as_str()).collect();
        let (inputs, result) = self.head(self.start);
        let (queries, keys) = (inputs.query_labels(), inputs.key_labels());
        let finals: serde_json::Map<String, serde_json::Value> =
            self.combinations().iter().map(|on| (state_key(on), json!(self.output(on)))).collect();
        let data = json!({
            "heads": names,
            "labels": names.iter().map(|n| head_label(n)).collect::<Vec<_>>(),
            "captions": (0..n).map(|h| self.caption(h)).collect::<Vec<_>>(),
            "tokens": queries,
            "keys": keys,
            "weights": (0..n).map(|h| self.weights(h)).collect::<Vec<_>>(),
            "shade": (0..n).map(|h| self.head(h).1.weights.rows().into_iter().map(|r| r.iter().map(|w| (w * 1e4).round() / 1e4).collect::<Vec<_>>()).collect::<Vec<_>>()).collect::<Vec<_>>(),
            "outputs": (0..n).map(|h| self.head_output(h)).collect::<Vec<_>>(),
            "final": finals,
            "start": self.start,
        });
        let mut out = format!(
            "<div class=\"widget heads\" data-qkv-widget=\"head-explorer\" id=\"widget-{}\" data-qkv-head=\"{}\" data-qkv-on=\"{}\">\n",
            escape(id),
            escape(names[self.start]),
            escape(&names.join(","))
        );
        out.push_str(&json_script("data-qkv-data", &data));
        let _ = writeln!(out, "<p class=\"prompt\"><strong>Try it.</strong> {}</p>", inline_markdown(prompt));
        // The controls do nothing without the script, so they stay hidden until it runs.
        out.push_str("<div class=\"head-controls\" data-qkv-controls hidden>\n<fieldset><legend>Show the weights of</legend>");
        for (h, name) in names.iter().enumerate() {
            let _ = write!(
                out,
                " <label><input type=\"radio\" name=\"widget-{}-head\" value=\"{n}\" data-qkv-pick=\"{n}\"{}> {}</label>",
                escape(id),
                if h == self.start { " checked" } else { "" },
                escape(&head_label(name)),
                n = escape(name)
            );
        }
        out.push_str("</fieldset>\n<fieldset><legend>Heads that reach <var>W</var><sub>o</sub></legend>");
        for name in &names {
            let _ = write!(
                out,
                " <label><input type=\"checkbox\" data-qkv-switch=\"{}\" checked> {}</label>",
                escape(name),
                escape(&head_label(name))
            );
        }
        out.push_str("</fieldset>\n</div>\n");
        let _ =
            writeln!(out, "<p class=\"start\" data-qkv-caption>{}:</p>", escape(&self.caption(self.start)));
        out.push_str(&scroll_box("Weights and output of the shown head"));
        out.push_str(
            "<table class=\"heatmap\">\n<thead><tr><th scope=\"col\" class=\"corner\">query ↓ · key →</th>",
        );
        for k in &keys {
            let _ = write!(out, "<th scope=\"col\">{}</th>", escape(k));
        }
        let head_width = result.output.ncols();
        for c in 1..=head_width {
            let label = if head_width == 1 { "output".to_string() } else { format!("output {c}") };
            let _ = write!(out, "<th scope=\"col\">{label}</th>");
        }
        out.push_str("</tr></thead>\n<tbody>\n");
        let (weights, outputs) = (self.weights(self.start), self.head_output(self.start));
        for (i, q) in queries.iter().enumerate() {
            let q = escape(q);
            let _ = write!(out, "<tr><th scope=\"row\">{q}</th>");
            for (j, k) in keys.iter().enumerate() {
                let w = result.weights[[i, j]];
                let _ = write!(
                    out,
                    "<td data-qkv-readout=\"weight:{q}:{}\" style=\"--w: {w:.4}\">{}</td>",
                    escape(k),
                    weights[i][j]
                );
            }
            for (c, y) in outputs[i].iter().enumerate() {
                let _ = write!(out, "<td data-qkv-readout=\"head-output:{q}:{}\">{y}</td>", c + 1);
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody>\n</table></div>\n");
        out.push_str("<p class=\"start\" data-qkv-on-text>The output, with every head switched on:</p>\n");
        out.push_str(&scroll_box("Output"));
        out.push_str("<table class=\"readouts\">\n<thead><tr><th scope=\"col\">token</th>");
        let output = self.output(&vec![true; n]);
        let width = output.first().map_or(0, Vec::len);
        for c in 1..=width {
            let _ = write!(out, "<th scope=\"col\">{c}</th>");
        }
        out.push_str("</tr></thead>\n<tbody>\n");
        for (token, row) in self.m.tokens.iter().zip(&output) {
            let t = escape(token);
            let _ = write!(out, "<tr><th scope=\"row\">{t}</th>");
            for (c, y) in row.iter().enumerate() {
                let _ = write!(out, "<td data-qkv-readout=\"output:{t}:{}\">{y}</td>", c + 1);
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody>\n</table></div>\n");
        // The script says here what the readouts now show, after each change.
        out.push_str("<p class=\"offscreen\" data-qkv-announce aria-live=\"polite\"></p>\n</div>\n");
        out
    }
}

#[cfg(test)]
mod tests;
