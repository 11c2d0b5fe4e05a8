//! `position-sweep` widgets: a positions block's sweep, one point at a time: a control moves the
//! query along the positions, its key a fixed distance behind, and the readouts show both
//! rotated vectors, the RoPE score (which stays put) and the score with sinusoidal encodings
//! added (which does not). The build writes every point's text from the block's record, so the
//! script only swaps it in.

use std::fmt::Write;

use serde_json::json;

use super::window::radios;
use super::{Context, computed, wrong_example};
use crate::error::Problem;
use crate::eval::{Computed, PositionsResult};
use crate::examples::WidgetDecl;
use crate::format::shown;
use crate::markup::{escape, inline_markdown, json_script, scroll_box};

/// The readouts, by name, and their row titles.
const READOUTS: [(&str, &str); 6] = [
    ("query-position", "query at position"),
    ("key-position", "key at position"),
    ("rope-query", "query, rotated"),
    ("rope-key", "key, rotated"),
    ("rope-score", "score with RoPE"),
    ("sinusoid-score", "score with sinusoids added"),
];

fn texts(p: &PositionsResult, s: usize, digits: usize) -> Vec<String> {
    let point = &p.sweep[s];
    let vector = |xs: &[f64]| {
        format!("({})", xs.iter().map(|&x| shown(x, digits).text).collect::<Vec<_>>().join(", "))
    };
    vec![
        point.query_position.to_string(),
        point.key_position.to_string(),
        vector(&point.rope_query),
        vector(&point.rope_key),
        shown(point.rope_score, digits).text,
        shown(point.sinusoid_score, digits).text,
    ]
}

/// The markdown (forge and `--check`) and page views of a position-sweep widget.
pub(super) fn sweep(cx: &mut Context<'_, '_>, id: &str, w: &WidgetDecl) -> Result<(String, String), Problem> {
    let p = match computed(cx, &w.example, "just the positions block's id")? {
        Computed::Positions(p) => p,
        _ => {
            return Err(wrong_example(
                cx,
                &w.example,
                "a positions block",
                "the id of a `qkv positions` block",
            ));
        }
    };
    let prompt = w.prompt.fill(cx.eval, cx.doc)?;
    let states: Vec<Vec<String>> = (0..p.sweep.len()).map(|s| texts(&p, s, w.digits)).collect();
    let choices: Vec<String> = p.sweep.iter().map(|s| s.query_position.to_string()).collect();
    let mut markdown = format!("**Try it.** {}\n\n| readout | value |\n|:--|--:|\n", prompt.trim());
    for ((_, title), text) in READOUTS.iter().zip(&states[0]) {
        let _ = writeln!(markdown, "| {title} | {text} |");
    }
    let data = json!({ "names": READOUTS.map(|(n, _)| n), "states": states });
    let mut html = format!(
        "<div class=\"widget position-sweep\" data-qkv-widget=\"position-sweep\" id=\"widget-{}\" data-qkv-position=\"{}\">\n",
        escape(id),
        choices[0]
    );
    html.push_str(&json_script("data-qkv-data", &data));
    let _ = writeln!(html, "<p class=\"prompt\"><strong>Try it.</strong> {}</p>", inline_markdown(&prompt));
    html.push_str("<div class=\"controls\" hidden>\n");
    html.push_str(&radios(id, "position", "Query position", &choices, 0));
    html.push_str("</div>\n");
    html.push_str(&scroll_box("Readouts"));
    html.push_str("<table class=\"readouts\">\n<tbody>\n");
    for ((name, title), text) in READOUTS.iter().zip(&states[0]) {
        let _ = writeln!(
            html,
            "<tr><th scope=\"row\">{title}</th><td data-qkv-readout=\"{name}\">{text}</td></tr>"
        );
    }
    html.push_str("</tbody>\n</table></div>\n");
    html.push_str("<p class=\"offscreen\" data-qkv-announce aria-live=\"polite\"></p>\n</div>\n");
    Ok((markdown, html))
}
