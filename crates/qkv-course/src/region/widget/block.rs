//! `block-walk` widgets: one token's pass through a Transformer block, stage by stage, with a
//! control for the order of the layer norms (pre-norm, post-norm) and one for the token. The
//! build embeds every state (each order × each token) as the text the page shows, from the
//! block's record (the engine's attention, the course's layer norm and feed-forward layer), so
//! the script only swaps text in and never computes.

use std::fmt::Write;

use serde_json::json;

use super::window::radios;
use super::{Context, computed, position_of, wrong_example};
use crate::error::Problem;
use crate::eval::{BlockResult, Computed, Order, length};
use crate::examples::WidgetDecl;
use crate::format::shown;
use crate::markup::{escape, inline_markdown, json_script, mathml, scroll_box};

/// The orders as the control names them, in [`Order::ALL`]'s order.
const ORDER_NAMES: [&str; 2] = ["pre-norm", "post-norm"];

/// One state: per stage its formula (TeX and the page's MathML), its vector and its length, as
/// shown.
struct State {
    formulas: Vec<&'static str>,
    vectors: Vec<String>,
    lengths: Vec<String>,
}

fn state(b: &BlockResult, order: Order, token: usize, digits: usize) -> State {
    let (_, passes) = b.order(order);
    let stages = passes[token].stages(order);
    State {
        formulas: stages.iter().map(|s| s.formula).collect(),
        vectors: stages
            .iter()
            .map(|s| {
                format!(
                    "({})",
                    s.vector.iter().map(|&x| shown(x, digits).text).collect::<Vec<_>>().join(", ")
                )
            })
            .collect(),
        lengths: stages.iter().map(|s| shown(length(s.vector), digits).text).collect(),
    }
}

/// The sentence that says which state is shown (the script writes the same).
fn state_text(order: &str, token: &str) -> String {
    format!("Order: {order}. Token: {token}.")
}

/// The markdown (forge and `--check`) and page views of a block-walk widget.
pub(super) fn walk(cx: &mut Context<'_, '_>, id: &str, w: &WidgetDecl) -> Result<(String, String), Problem> {
    let b = match computed(cx, &w.example, "just the block's id")? {
        Computed::Block(b) => b,
        _ => {
            return Err(wrong_example(
                cx,
                &w.example,
                "a Transformer block",
                "the id of a `qkv block` block",
            ));
        }
    };
    cx.at_most_shown(&[(b.b_1.len(), "components of a vector")])?;
    let start = match &w.query {
        Some(q) => position_of(cx, w, q, &b.tokens, "a token")?,
        None => 0,
    };
    let prompt = w.prompt.fill(cx.eval, cx.doc)?;
    // states[order][token]
    let states: Vec<Vec<State>> = Order::ALL
        .iter()
        .map(|&o| (0..b.tokens.len()).map(|t| state(&b, o, t, w.digits)).collect())
        .collect();
    let shown = &states[0][start];
    let text = state_text(ORDER_NAMES[0], &b.tokens[start]);
    let mut markdown =
        format!("**Try it.** {}\n\n{text}\n\n| stage | length | vector |\n|:--|--:|:--|\n", prompt.trim());
    // The columns of the page's readouts (and of the pass tables beside them).
    for ((f, v), l) in shown.formulas.iter().zip(&shown.vectors).zip(&shown.lengths) {
        let _ = writeln!(markdown, "| ${f}$ | {l} | {v} |");
    }
    let data = json!({
        "orders": ORDER_NAMES,
        "tokens": b.tokens,
        "states": states.iter().map(|row| row.iter().map(|s| json!({
            "formulas": s.formulas.iter().map(|f| mathml(f, false)).collect::<Vec<_>>(),
            "vectors": s.vectors,
            "lengths": s.lengths,
        })).collect::<Vec<_>>()).collect::<Vec<_>>(),
    });
    let mut html = format!(
        "<div class=\"widget block-walk\" data-qkv-widget=\"block-walk\" id=\"widget-{}\" data-qkv-order=\"pre\" data-qkv-token=\"{}\">\n",
        escape(id),
        escape(&b.tokens[start])
    );
    html.push_str(&json_script("data-qkv-data", &data));
    let _ = writeln!(html, "<p class=\"prompt\"><strong>Try it.</strong> {}</p>", inline_markdown(&prompt));
    html.push_str("<div class=\"controls\" hidden>\n");
    html.push_str(&radios(id, "order", "Layer norm", &ORDER_NAMES.map(String::from), 0));
    html.push_str(&radios(id, "token", "Token", &b.tokens, start));
    html.push_str("</div>\n");
    let _ = writeln!(html, "<p class=\"state\" data-qkv-state>{}</p>", escape(&text));
    html.push_str(&scroll_box("Readouts"));
    html.push_str("<table class=\"readouts\">\n<thead><tr><th scope=\"col\">stage</th><th scope=\"col\">length</th><th scope=\"col\">vector</th></tr></thead>\n<tbody>\n");
    for (k, ((f, v), l)) in shown.formulas.iter().zip(&shown.vectors).zip(&shown.lengths).enumerate() {
        let _ = writeln!(
            html,
            "<tr><th scope=\"row\" data-qkv-readout=\"formula:{k}\">{}</th><td data-qkv-readout=\"length:{k}\">{l}</td><td data-qkv-readout=\"vector:{k}\">{v}</td></tr>",
            mathml(f, false)
        );
    }
    html.push_str("</tbody>\n</table></div>\n");
    html.push_str("<p class=\"offscreen\" data-qkv-announce aria-live=\"polite\"></p>\n</div>\n");
    Ok((markdown, html))
}
