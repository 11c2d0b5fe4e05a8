//! `tile-stepper`: one query's online softmax (a `qkv tiled` block) walked block by block. Every
//! state the widget can show (before any block, after each block, the result) is written here
//! from the engine's trace, as the text the page shows; the page script only switches between
//! them. Without script, the page shows every block in one table.

use std::fmt::Write;

use serde_json::json;

use super::{computed, wrong_example};
use crate::error::Problem;
use crate::eval::{Computed, TiledResult};
use crate::examples::WidgetDecl;
use crate::format::fixed;
use crate::markup::{escape, inline_markdown, json_script, scroll_box};
use crate::region::Context;

/// The stepper's rows: the readout each shows (absent from a state: the row is hidden) and its
/// heading.
const ROWS: &[(&str, &str)] = &[
    ("scores", "scores $s$"),
    ("values", "values $v$"),
    ("max", "tile max"),
    ("m", "running max $m$"),
    ("rescale", "rescale $\\alpha$"),
    ("exp", "$e^{s - m}$"),
    ("l", "running sum $l$"),
    ("acc", "accumulator"),
    ("output", "output $\\text{acc} / l$"),
    ("partial", "tile's own $o_B$"),
    ("lse", "tile's own $L_B$"),
    ("attention", "all keys at once"),
    ("merged", "parts merged"),
];

/// The columns of the every-block table (the page without script, and the markdown).
const COLUMNS: &[&str] = &[
    "block",
    "keys",
    "scores $s$",
    "values $v$",
    "block max",
    "$m$",
    "rescale",
    "$l$",
    "accumulator",
    "output so far",
];

/// One state of the stepper: a title, the readouts by name, and what the live region says.
struct State {
    title: String,
    readouts: Vec<(&'static str, String)>,
    announce: String,
}

/// The widget's markdown and page HTML, for the `qkv tiled` block the widget names.
pub(super) fn widget(
    cx: &mut Context<'_, '_>,
    id: &str,
    w: &WidgetDecl,
    prompt: &str,
) -> Result<(String, String), Problem> {
    let expected = "the id of a `qkv tiled` block: a `tile-stepper` walks its key blocks";
    let Computed::Tiled(t) = computed(cx, &w.example, expected)? else {
        return Err(wrong_example(cx, &w.example, "a `qkv tiled` block", expected));
    };
    cx.at_most_shown(&[
        (t.inputs.keys.len(), "keys"),
        (t.inputs.values.first().map_or(0, Vec::len), "components of a value"),
    ])?;
    let stepper = Stepper { t: &t, digits: w.digits };
    Ok((stepper.markdown(prompt), stepper.html(id, prompt)))
}

struct Stepper<'t> {
    t: &'t TiledResult,
    digits: usize,
}

impl Stepper<'_> {
    fn number(&self, x: f64) -> String {
        fixed(x, self.digits)
    }

    /// A vector as shown: one entry alone, more in parentheses.
    fn vector(&self, xs: &[f64]) -> String {
        let parts: Vec<String> = xs.iter().map(|&x| self.number(x)).collect();
        if let [one] = parts.as_slice() { one.clone() } else { format!("({})", parts.join(", ")) }
    }

    /// A running maximum, `-∞` before any visible key.
    fn max(&self, m: Option<f64>) -> String {
        self.number(m.unwrap_or(f64::NEG_INFINITY))
    }

    /// Block `b`'s value rows, one vector each, as the table and the stepper show them: the
    /// numbers the accumulator adds up, so that a learner can check it.
    fn values(&self, b: usize) -> String {
        let rows = &self.t.inputs.values[self.t.trace.blocks[b].keys.clone()];
        rows.iter().map(|v| self.vector(v)).collect::<Vec<_>>().join(", ")
    }

    /// Labels of block `b`'s keys.
    fn keys(&self, b: usize) -> Vec<String> {
        self.t.inputs.key_labels()[self.t.trace.blocks[b].keys.clone()].to_vec()
    }

    /// Every state, in order: before the first block, after each block, the result.
    fn states(&self) -> Vec<State> {
        let trace = &self.t.trace;
        let n = trace.blocks.len();
        let zeros = vec![0.0; self.t.inputs.values.first().map_or(0, Vec::len)];
        let mut states = vec![State {
            title: "Before the first block: no key seen yet.".to_string(),
            readouts: vec![("m", self.max(None)), ("l", self.number(0.0)), ("acc", self.vector(&zeros))],
            announce: "Before the first block: m is minus infinity, l and the accumulator are 0.".to_string(),
        }];
        let mut acc_before = zeros.clone();
        for (k, b) in trace.blocks.iter().enumerate() {
            let keys = self.keys(k).iter().map(|l| format!("“{l}”")).collect::<Vec<_>>().join(", ");
            let scores = b.scores.iter().map(|&s| self.number(s)).collect::<Vec<_>>().join(", ");
            let exps = b.exponentials.iter().map(|&e| self.number(e)).collect::<Vec<_>>().join(", ");
            let values = self.values(k);
            let acc = format!("{} → {}", self.vector(&acc_before), self.vector(&b.accumulator));
            acc_before.clone_from(&b.accumulator);
            let m = format!("{} → {}", self.max(b.max_before), self.max(b.max_after));
            let l = format!("{} → {}", self.number(b.sum_before), self.number(b.sum_after));
            let (rescale, output) = (self.number(b.rescale), self.vector(&b.output));
            let max = b.block_max.map_or_else(|| "every key masked".to_string(), |x| self.number(x));
            let title = format!("Block {} of {n}: keys {keys}.", k + 1);
            let announce = format!(
                "Block {} of {n}, keys {keys}: scores {scores}; values {values}; m {m}; rescale {rescale}; e to the s minus m {exps}; l {l}; accumulator {acc}; output so far {output}.",
                k + 1
            );
            let readouts = vec![
                ("scores", scores),
                ("values", values),
                ("max", max),
                ("m", m),
                ("rescale", rescale),
                ("exp", exps),
                ("l", l),
                ("acc", acc),
                ("output", output),
                ("partial", self.vector(&b.partial.output.row(0).to_vec())),
                ("lse", self.number(b.partial.logsumexp[0])),
            ];
            states.push(State { title, readouts, announce });
        }
        let last = trace.blocks.last().map_or(zeros, |b| b.accumulator.clone());
        let (output, attention) = (self.vector(&trace.output), self.vector(&self.t.attention));
        let merged = self.vector(&self.t.merged.output.row(0).to_vec());
        states.push(State {
            title: format!("All {n} blocks done: one division gives the output."),
            announce: format!(
                "All {n} blocks done: output {output}; attention over all keys at once gives {attention}; the blocks' parts merged give {merged}."
            ),
            readouts: vec![
                ("m", self.max(trace.max)),
                ("l", self.number(trace.sum)),
                ("acc", self.vector(&last)),
                ("output", output),
                ("attention", attention),
                ("merged", merged),
            ],
        });
        states
    }

    /// The every-block table's cells, one row per block.
    fn rows(&self) -> Vec<Vec<String>> {
        self.t
            .trace
            .blocks
            .iter()
            .enumerate()
            .map(|(k, b)| {
                vec![
                    (k + 1).to_string(),
                    self.keys(k).join(", "),
                    b.scores.iter().map(|&s| self.number(s)).collect::<Vec<_>>().join(", "),
                    self.values(k),
                    b.block_max.map_or_else(|| "masked".to_string(), |x| self.number(x)),
                    self.max(b.max_after),
                    self.number(b.rescale),
                    self.number(b.sum_after),
                    self.vector(&b.accumulator),
                    self.vector(&b.output),
                ]
            })
            .collect()
    }

    /// What the table leaves to say: the output, and that it is attention's.
    fn result_text(&self) -> String {
        format!(
            "After the last block, $\\text{{acc}} / l$ is {}; attention over all keys at once gives {}, and the blocks' partial results merged give {}.",
            self.vector(&self.t.trace.output),
            self.vector(&self.t.attention),
            self.vector(&self.t.merged.output.row(0).to_vec())
        )
    }

    /// The forge's and `--check`'s view: the prompt, every block in a table, the result.
    fn markdown(&self, prompt: &str) -> String {
        let mut out = format!("**Try it.** {}\n\n| {} |\n", prompt.trim(), COLUMNS.join(" | "));
        out.push_str("|--:|:--|--:|--:|--:|--:|--:|--:|--:|--:|\n");
        for row in self.rows() {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        let _ = writeln!(out, "\n{}", self.result_text());
        out
    }

    fn html(&self, id: &str, prompt: &str) -> String {
        let states = self.states();
        let data = json!({
            "states": states.iter().map(|s| json!({
                "title": s.title,
                "announce": s.announce,
                "readouts": s.readouts.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            })).collect::<Vec<_>>(),
        });
        let mut out = format!(
            "<div class=\"widget tiles\" data-qkv-widget=\"tile-stepper\" id=\"widget-{}\" data-qkv-step=\"0\">\n",
            escape(id)
        );
        out.push_str(&json_script("data-qkv-data", &data));
        let _ = writeln!(out, "<p class=\"prompt\"><strong>Try it.</strong> {}</p>", inline_markdown(prompt));
        // The stepper, at its first state, for the script to show.
        let first = &states[0];
        let _ = writeln!(
            out,
            "<div class=\"stepper\" data-qkv-stepper hidden>\n<p class=\"tile-title\" data-qkv-title>{}</p>",
            escape(&first.title)
        );
        out.push_str(&scroll_box("Readouts"));
        out.push_str("<table class=\"readouts\">\n<tbody>\n");
        for (name, heading) in ROWS {
            let value = first.readouts.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
            let _ = writeln!(
                out,
                "<tr{}><th scope=\"row\">{}</th><td data-qkv-readout=\"{name}\">{}</td></tr>",
                if value.is_none() { " hidden" } else { "" },
                inline_markdown(heading),
                escape(value.unwrap_or(""))
            );
        }
        out.push_str("</tbody>\n</table></div>\n");
        out.push_str(
            "<p class=\"actions\"><button type=\"button\" data-qkv-prev aria-disabled=\"true\">Previous block</button> <button type=\"button\" data-qkv-next>Next block</button></p>\n",
        );
        out.push_str("<p class=\"offscreen\" data-qkv-announce aria-live=\"polite\"></p>\n</div>\n");
        // Every block at once: the page without script.
        out.push_str("<div data-qkv-all>\n");
        out.push_str(&scroll_box("Every block"));
        out.push_str("<table class=\"readouts\">\n<thead><tr>");
        for head in COLUMNS {
            let _ = write!(out, "<th scope=\"col\">{}</th>", inline_markdown(head));
        }
        out.push_str("</tr></thead>\n<tbody>\n");
        for row in self.rows() {
            let cells: String = row.iter().skip(1).map(|c| format!("<td>{}</td>", escape(c))).collect();
            let _ = writeln!(out, "<tr><th scope=\"row\">{}</th>{cells}</tr>", escape(&row[0]));
        }
        out.push_str("</tbody>\n</table></div>\n");
        let _ = writeln!(out, "<p>{}</p>\n</div>\n</div>", inline_markdown(&self.result_text()));
        out
    }
}
