//! `widget ID`: an interactive figure on an attention example's numbers, declared by a
//! `qkv widget` block of the same file.
//!
//! - `drag-query`: the keys in the plane and a query handle; every dot product, scaled score,
//!   weight and the output follow the handle. The markdown (and the page without script) shows
//!   the prompt and every readout at the declared query; the page adds the plane, hidden until
//!   the script shows it, and the data the script recomputes from.
//! - `attention-matrix`: the weight matrix as a heatmap with row sums; each row opens that query's
//!   worked steps (the text of a `steps EXAMPLE.TOKEN` region, from the engine's trace).
//! - `head-explorer` (`widget/heads.rs`): a multi-head example's heads, one at a time, and its
//!   output with any of them switched off.
//! - `tile-stepper` (`widget/tiles.rs`): a `qkv tiled` trace, one key block at a time.
//! - `decode-stepper` (`widget/decode.rs`): a decoding walked step by step.
//! - `window-alibi` (`widget/window.rs`): a window control and an ALiBi-slope control over the
//!   bias, the weights and the outputs, every state computed by the build.
//! - `block-walk` (`widget/block.rs`): one token through a Transformer block, pre- or post-norm.
//! - `gradient-descent` (`widget/descent.rs`): a gradient block's steps, one at a time.
//! - `position-sweep` (`widget/sweep.rs`): a query moved along the positions, RoPE against sinusoids.

use std::fmt::Write;

use serde_json::json;

use super::{Context, Generated, Kind, steps, table};
use crate::error::Problem;
use crate::eval::{AttentionInputs, AttentionResult, Computed};
use crate::examples::{Field, Goal, PageDecl, WidgetDecl, WidgetKind};
use crate::format::{fixed, relation, shown, sum_relation};
use crate::markup::{escape, fragment, inline_markdown, json_script, scroll_box};

pub(super) const KIND: Kind = Kind { name: "widget", usage: "`widget ID`", options: &[], generate };

fn generate(cx: &mut Context<'_, '_>) -> Result<Generated, Problem> {
    let id = cx.target(KIND.usage)?;
    let widget = cx.page_block(id, "widget", |p| match p {
        PageDecl::Widget(w) => Some(w.as_ref()),
        _ => None,
    })?;
    let (body, html) = match widget.kind {
        WidgetKind::DragQuery | WidgetKind::AttentionMatrix | WidgetKind::WindowAlibi => {
            on_attention(cx, id, widget)?
        }
        WidgetKind::HeadExplorer => heads::widget(cx, id, widget)?,
        WidgetKind::DecodeStepper => decode::stepper(cx, id, widget)?,
        WidgetKind::BlockWalk => block::walk(cx, id, widget)?,
        WidgetKind::GradientDescent => descent::descent(cx, id, widget)?,
        WidgetKind::PositionSweep => sweep::sweep(cx, id, widget)?,
        WidgetKind::TileStepper => {
            let prompt = widget.prompt.fill(cx.eval, cx.doc)?;
            tiles::widget(cx, id, widget, &prompt)?
        }
    };
    Ok(Generated { html: Some(html), ..cx.markdown(body) })
}

/// A widget on an attention example: its markdown and its page's HTML.
fn on_attention(
    cx: &mut Context<'_, '_>,
    id: &str,
    widget: &WidgetDecl,
) -> Result<(String, String), Problem> {
    let (inputs, result) = example(cx, &widget.example)?;
    // A widget holds tables and worked steps, so their limits hold for it too.
    match widget.kind {
        WidgetKind::DragQuery => cx.at_most_shown(&[
            (inputs.keys.len(), "keys"),
            (inputs.values.first().map_or(0, Vec::len), "components of a value"),
        ])?,
        _ => cx.at_most_shown(&table::shown_counts(&inputs))?,
    }
    let prompt = widget.prompt.fill(cx.eval, cx.doc)?;
    Ok(match widget.kind {
        WidgetKind::DragQuery => {
            let drag = Drag::new(cx, widget, &inputs, &result)?;
            (drag.markdown(&prompt), drag.html(id, &prompt))
        }
        WidgetKind::WindowAlibi => window::window_alibi(cx, id, widget, &prompt, &inputs)?,
        _ => matrix(id, &prompt, &inputs, &result, widget.digits),
    })
}

/// What a widget's `example` names, computed; `expected` says what it should be, for the error
/// when it is not a whole record.
fn computed(cx: &mut Context<'_, '_>, example: &Field<String>, expected: &str) -> Result<Computed, Problem> {
    let problem = |message: String, expected: &str| {
        Problem::new(cx.doc, example.at, message, example.value.clone(), expected)
    };
    let t = cx
        .eval
        .target(cx.doc, &example.value)
        .map_err(|e| problem(format!("unknown reference `{}`", example.value), &e))?;
    if !t.rest.is_empty() {
        return Err(problem(format!("`{}` names a value, not an example", example.value), expected));
    }
    // A broken example reports its own error; the widget stays quiet.
    let record = cx.eval.record(&t.key).ok_or_else(|| problem(String::new(), ""))?;
    Ok(record.computed)
}

/// Where `field` (a token, key or head that a widget names) stands among `names`, or the error
/// at the field that lists the choices; `what` is what it should be ("a token").
fn position_of<S: AsRef<str>>(
    cx: &Context<'_, '_>,
    w: &WidgetDecl,
    field: &Field<String>,
    names: &[S],
    what: &str,
) -> Result<usize, Problem> {
    names.iter().position(|n| n.as_ref() == field.value).ok_or_else(|| {
        let names: Vec<&str> = names.iter().map(AsRef::as_ref).collect();
        Problem::new(
            cx.doc,
            field.at,
            format!("`{}` is not {what} of `{}`", field.value, w.example.value),
            field.value.clone(),
            format!("one of {}", names.join(", ")),
        )
    })
}

/// The error for a widget whose `example` is a record of the wrong kind.
fn wrong_example(cx: &Context<'_, '_>, example: &Field<String>, what: &str, expected: &str) -> Problem {
    Problem::new(
        cx.doc,
        example.at,
        format!("`{}` is not {what}", example.value),
        example.value.clone(),
        expected,
    )
}

/// The attention example a widget names, computed.
fn example(
    cx: &mut Context<'_, '_>,
    example: &Field<String>,
) -> Result<(AttentionInputs, AttentionResult), Problem> {
    match computed(cx, example, "just the example id, such as `sentence`")? {
        Computed::Attention { inputs, result: Ok(result) } => Ok((inputs, result)),
        _ => Err(wrong_example(
            cx,
            example,
            "an attention example that computes",
            "the id of a `qkv attention` block",
        )),
    }
}

/// Side of the plane, in SVG user units (about CSS pixels at a phone's column width).
const PLANE: f64 = 360.0;
/// Room between the plane's edge and its extent, for labels.
const PAD: f64 = 30.0;

/// A drag-query widget at its declared query: every number the build writes, and the data the
/// script recomputes from.
struct Drag<'i> {
    inputs: &'i AttentionInputs,
    trace: &'i qkv::QueryTrace,
    /// The declared query's label.
    query: String,
    goal: Option<usize>,
    digits: usize,
    /// Half the side of the square of query space the plane shows, a whole number of `grid`s.
    extent: f64,
    /// Distance between the plane's grid lines (every other one is labelled).
    grid: f64,
}

impl<'i> Drag<'i> {
    fn new(
        cx: &Context<'_, '_>,
        w: &WidgetDecl,
        inputs: &'i AttentionInputs,
        result: &'i AttentionResult,
    ) -> Result<Self, Problem> {
        let d_k = inputs.keys.first().map_or(0, Vec::len);
        if d_k != 2 {
            return Err(Problem::new(
                cx.doc,
                w.example.at,
                format!(
                    "a `drag-query` widget moves a query in the plane, but `{}` has d_k = {d_k}",
                    w.example.value
                ),
                w.example.value.clone(),
                "an example whose queries and keys have 2 entries",
            ));
        }
        let labels = inputs.query_labels();
        let keys = inputs.key_labels();
        // The block reader makes sure a drag-query widget has a query.
        let query = w.query.as_ref().map_or(Ok(0), |q| position_of(cx, w, q, &labels, "a query"))?;
        let goal = match &w.goal {
            Some(Goal::Largest(key)) => Some((position_of(cx, w, key, &keys, "a key")?, key)),
            None => None,
        };
        let trace = &result.traces[query];
        if let Some((g, key)) = goal
            && largest(&trace.weights, g)
        {
            return Err(Problem::new(
                cx.doc,
                key.at,
                format!(
                    "the goal is already met where the handle starts: `{}` has the largest weight",
                    key.value
                ),
                key.value.clone(),
                "a goal the learner reaches by moving the query (another key, or another starting query)",
            ));
        }
        if let Some((g, key)) = goal
            && !reachable(&inputs.keys, &trace.kept, g)
        {
            let why = if trace.kept[g] {
                "its key lies within the others' (on or inside the shape they span), so some other key always scores at least as high"
            } else {
                "the mask hides that key from this query, so its weight stays 0"
            };
            return Err(Problem::new(
                cx.doc,
                key.at,
                format!(
                    "the goal can never be met: wherever the query moves, `{}` never has the largest weight: {why}",
                    key.value
                ),
                key.value.clone(),
                "a goal on a key the learner can make the largest by moving the query",
            ));
        }
        let reach = inputs.keys.iter().chain([&trace.query]).flatten().fold(1.0f64, |m, x| m.max(x.abs()));
        // A quarter more than the farthest point, on whole grid steps; finite for any finite input.
        let wanted = (reach * 1.25).min(f64::MAX / 4.0);
        let grid = grid_step(wanted);
        let extent = (wanted / grid).ceil() * grid;
        Ok(Drag {
            inputs,
            trace,
            query: labels[query].clone(),
            goal: goal.map(|(g, _)| g),
            digits: w.digits,
            extent,
            grid,
        })
    }

    /// A readout as the lesson shows it.
    fn number(&self, x: f64) -> String {
        fixed(x, self.digits)
    }

    /// Per key: label, dot product, score (or `masked`), weight; all as shown.
    fn rows(&self) -> Vec<[String; 4]> {
        let t = self.trace;
        self.inputs
            .key_labels()
            .into_iter()
            .enumerate()
            .map(|(j, label)| {
                let score = if t.kept[j] { self.number(t.scores[j]) } else { "masked".to_string() };
                [label, self.number(t.dot_products[j]), score, self.number(t.weights[j])]
            })
            .collect()
    }

    fn output(&self) -> Vec<String> {
        self.trace.output.iter().map(|&x| self.number(x)).collect()
    }

    fn goal_text(&self) -> Option<String> {
        self.goal.map(|g| format!("Goal: make the weight of “{}” the largest.", self.inputs.key_labels()[g]))
    }

    fn start_text(&self) -> String {
        format!("At the start, $q = {}$, the query of “{}”:", vector(&self.trace.query), self.query)
    }

    /// The forge's and `--check`'s view: the prompt and every readout at the declared query.
    fn markdown(&self, prompt: &str) -> String {
        let mut out = format!("**Try it.** {}\n\n{}\n\n", prompt.trim(), self.start_text());
        out.push_str("| key | $q \\cdot k$ | score $s$ | weight $a$ |\n|:--|--:|--:|--:|\n");
        for row in self.rows() {
            let _ = writeln!(out, "| {} |", row.join(" | "));
        }
        let _ = write!(out, "\nThe output is {}.", vector_text(&self.output()));
        if let Some(goal) = self.goal_text() {
            let _ = write!(out, " {goal}");
        }
        out.push('\n');
        out
    }

    /// Screen position of query-space point `(x, y)` on the plane.
    fn at(&self, x: f64, y: f64) -> (f64, f64) {
        let unit = (PLANE - 2.0 * PAD) / (2.0 * self.extent);
        (PAD + (x + self.extent) * unit, PLANE - PAD - (y + self.extent) * unit)
    }

    fn html(&self, id: &str, prompt: &str) -> String {
        /// What the widget is without script: its numbers at the starting query.
        const STATIC_PROMPT: &str = "<strong>The numbers at one query.</strong> The table below gives every dot product, score and weight, and the output, at the query the widget starts from. With JavaScript on, the page lets you move the query over the plane of the keys and watch them change.";
        let labels = self.inputs.key_labels();
        let q = &self.trace.query;
        let data = json!({
            "labels": labels,
            "keys": self.inputs.keys,
            "values": self.inputs.values,
            "scale": self.trace.scale,
            "kept": self.trace.kept,
            "query": q,
            "digits": self.digits,
            "goal": self.goal.map(|g| json!({ "largest": labels[g] })),
            "plane": { "size": PLANE, "pad": PAD, "extent": self.extent },
        });
        let mut out = format!(
            "<div class=\"widget drag\" data-qkv-widget=\"drag-query\" id=\"widget-{}\" data-qkv-query=\"{}\">\n",
            escape(id),
            q.iter().map(|&x| js_number(x)).collect::<Vec<_>>().join(",")
        );
        out.push_str(&json_script("data-qkv-data", &data));
        // The author's prompt asks for dragging, which only the script makes possible: without it
        // the page says what it does show.
        let _ = writeln!(
            out,
            "<p class=\"prompt\" data-qkv-prompt hidden><strong>Try it.</strong> {}</p>\n<p class=\"prompt\" data-qkv-static-prompt>{STATIC_PROMPT}</p>",
            inline_markdown(prompt)
        );
        out.push_str("<div class=\"plane\" hidden>\n");
        out.push_str(&self.svg(id));
        out.push_str("</div>\n");
        let _ =
            writeln!(out, "<p class=\"start\" data-qkv-start>{}</p>", inline_markdown(&self.start_text()));
        out.push_str(&scroll_box("Readouts"));
        out.push_str("<table class=\"readouts\">\n<thead><tr><th>key</th>");
        for head in ["$q \\cdot k$", "score $s$", "weight $a$"] {
            let _ = write!(out, "<th>{}</th>", inline_markdown(head));
        }
        out.push_str("</tr></thead>\n<tbody>\n");
        for (j, row) in self.rows().iter().enumerate() {
            let l = escape(&row[0]);
            let width = 100.0 * self.trace.weights[j];
            let _ = writeln!(
                out,
                "<tr><th scope=\"row\">{l}</th><td data-qkv-readout=\"dot:{l}\">{}</td><td data-qkv-readout=\"score:{l}\">{}</td><td class=\"weight\"><span data-qkv-readout=\"weight:{l}\">{}</span> <span class=\"bar\"><span data-qkv-bar=\"{l}\" style=\"width: {width:.2}%\"></span></span></td></tr>",
                row[1], row[2], row[3]
            );
        }
        out.push_str("</tbody>\n</table></div>\n");
        let output = self.output();
        let readouts = if let [x] = output.as_slice() {
            format!("<strong data-qkv-readout=\"output\">{x}</strong>")
        } else {
            let parts: Vec<String> = output
                .iter()
                .enumerate()
                .map(|(c, x)| format!("<strong data-qkv-readout=\"output:{}\">{x}</strong>", c + 1))
                .collect();
            format!("({})", parts.join(", "))
        };
        let _ = writeln!(
            out,
            "<p class=\"output\">The output {} is {readouts}.</p>",
            inline_markdown("$\\sum_i a_i v_i$")
        );
        if let Some(goal) = self.goal_text() {
            let _ = writeln!(
                out,
                "<p class=\"goal\" data-qkv-goal data-qkv-met=\"false\"><span class=\"mark\" aria-hidden=\"true\"></span> <span data-qkv-goal-text>{}</span></p>",
                escape(&goal)
            );
        }
        // The script says here, once the learner pauses, what the readouts and the goal now show.
        out.push_str("<p class=\"offscreen\" data-qkv-announce aria-live=\"polite\"></p>\n");
        out.push_str(
            "<p class=\"actions\"><button type=\"button\" data-qkv-reset hidden>Reset</button></p>\n</div>\n",
        );
        out
    }

    /// The plane at the declared query: grid, keys as labelled arrows, a line from the query to
    /// each key as thick as its weight, and the query's handle.
    fn svg(&self, id: &str) -> String {
        let e = self.extent;
        let mut out = format!(
            "<svg data-qkv-plane viewBox=\"0 0 {PLANE} {PLANE}\" role=\"group\" aria-label=\"The keys and the query q in the plane\">\n<defs><marker id=\"head-{0}\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\"/></marker></defs>\n",
            escape(id)
        );
        // At most about two dozen lines each way, whatever the plane's extent.
        let (g, lines) = (self.grid, (2.0 * e / self.grid).round() as i64);
        let origin = lines / 2;
        for i in 0..=lines {
            let v = g * (i - origin) as f64;
            let class = if i == origin { "axis" } else { "grid" };
            let (x0, y0) = self.at(v, -e);
            let (x1, y1) = self.at(v, e);
            let (a0, b0) = self.at(-e, v);
            let (a1, b1) = self.at(e, v);
            let _ = writeln!(
                out,
                "<line class=\"{class}\" x1=\"{x0:.1}\" y1=\"{y0:.1}\" x2=\"{x1:.1}\" y2=\"{y1:.1}\"/><line class=\"{class}\" x1=\"{a0:.1}\" y1=\"{b0:.1}\" x2=\"{a1:.1}\" y2=\"{b1:.1}\"/>"
            );
            // Every other line (the whole numbers, on the usual plane) is labelled along the
            // bottom and left edges, clear of the arrows.
            if (i - origin) % 2 == 0 {
                let (tx, ty) = self.at(v, -e);
                let (sx, sy) = self.at(-e, v);
                let _ = writeln!(
                    out,
                    "<text class=\"tick\" aria-hidden=\"true\" x=\"{tx:.1}\" y=\"{:.1}\">{v}</text><text class=\"tick\" aria-hidden=\"true\" x=\"{:.1}\" y=\"{:.1}\">{v}</text>",
                    ty + 18.0,
                    sx - 12.0,
                    sy + 4.0
                );
            }
        }
        let (ox, oy) = self.at(0.0, 0.0);
        let (qx, qy) = self.at(self.trace.query[0], self.trace.query[1]);
        for (j, label) in self.inputs.key_labels().iter().enumerate() {
            let k = &self.inputs.keys[j];
            let (kx, ky) = self.at(k[0], k[1]);
            let width = if self.trace.kept[j] { link_width(self.trace.weights[j]) } else { 0.0 };
            let _ = writeln!(
                out,
                "<line class=\"link\" data-qkv-line=\"{}\" x1=\"{qx:.1}\" y1=\"{qy:.1}\" x2=\"{kx:.1}\" y2=\"{ky:.1}\" stroke-width=\"{width:.2}\"/>",
                escape(label)
            );
        }
        // Arrows first, then the query and its handle, then the keys' labels: drawn last, they
        // stay readable when the handle sits on a key's tip (where a self-attention query starts).
        let mut labels = String::new();
        for (j, label) in self.inputs.key_labels().iter().enumerate() {
            let k = &self.inputs.keys[j];
            let (kx, ky) = self.at(k[0], k[1]);
            let class = if self.trace.kept[j] { "key" } else { "key masked" };
            let _ = writeln!(
                out,
                "<line class=\"{class}\" x1=\"{ox:.1}\" y1=\"{oy:.1}\" x2=\"{kx:.1}\" y2=\"{ky:.1}\" marker-end=\"url(#head-{})\"/>",
                escape(id)
            );
            // The label sits past the arrow's tip, away from the origin, and clear of a handle on
            // the tip: further out above and below it, where the text's height is in the way.
            let norm = k[0].hypot(k[1]).max(1e-9);
            let (ux, uy) = (k[0] / norm, k[1] / norm);
            let reach = 16.0 + 8.0 * uy.abs();
            let (lx, ly) = (kx + reach * ux, ky - reach * uy + 5.0);
            let anchor = if k[0] < -1e-9 {
                "end"
            } else if k[0] > 1e-9 {
                "start"
            } else {
                "middle"
            };
            let _ = writeln!(
                labels,
                "<text class=\"label key-label\" aria-hidden=\"true\" x=\"{lx:.1}\" y=\"{ly:.1}\" text-anchor=\"{anchor}\">k<tspan class=\"sub\" dy=\"4\">{}</tspan></text>",
                escape(label)
            );
        }
        let _ = writeln!(
            out,
            "<line class=\"query\" data-qkv-query-arrow x1=\"{ox:.1}\" y1=\"{oy:.1}\" x2=\"{qx:.1}\" y2=\"{qy:.1}\"/>"
        );
        let _ = writeln!(
            out,
            "<g class=\"handle\" data-qkv-handle tabindex=\"0\" role=\"slider\" aria-label=\"The query q: drag it, or use the arrow keys (Shift for larger steps)\" aria-valuemin=\"{}\" aria-valuemax=\"{}\" aria-valuenow=\"{}\" aria-valuetext=\"q = {}\" transform=\"translate({qx:.1} {qy:.1})\"><circle class=\"hit\" r=\"22\"/><circle class=\"knob\" r=\"9\"/><text class=\"label\" data-qkv-query-label x=\"13\" y=\"20\">q</text></g>",
            js_number(-e),
            js_number(e),
            js_number(self.trace.query[0]),
            vector(&self.trace.query)
        );
        out.push_str(&labels);
        out.push_str("</svg>\n");
        out
    }
}

/// The plane's grid step for an extent of `wanted`: half a unit while that makes at most 24
/// lines each way (extents up to 6, which the lesson's examples use), else a round step (1, 2 or
/// 5 times a power of ten) that keeps the lines to about two dozen. A key at 1e19 once asked for
/// 2^31 grid lines and ate the machine's memory.
fn grid_step(wanted: f64) -> f64 {
    if wanted <= 6.0 {
        return 0.5;
    }
    let rough = wanted / 12.0;
    let power = 10f64.powi(rough.log10().floor() as i32);
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|&step| step >= rough).unwrap_or(10.0 * power)
}

/// `x` as JavaScript's `String(x)` writes it, the shortest text that reads back as `x` (`0`, `1`,
/// `0.35`), so the build and the page script write `data-qkv-query` alike. (They differ only below
/// 1e-6 or from 1e21, where JavaScript switches to an exponent; no query of a lesson is that far out.)
fn js_number(x: f64) -> String {
    if x == 0.0 { "0".to_string() } else { format!("{x}") }
}

/// Stroke width of the line from the query to a visible key of weight `w` (the script uses the
/// same; a masked key has no line).
fn link_width(w: f64) -> f64 {
    1.0 + 9.0 * w
}

/// Whether entry `g` is larger than every other.
/// Whether some direction of the query gives key `g` a score above every other visible key's
/// (the largest weight is the largest score, and a score's order depends on the query's direction
/// only). That fails exactly when `g` is hidden or lies in the convex hull of the other visible
/// keys. The directions tried are a fine circle and, for each other key, the direction from it
/// to `g` and the two edges of the half-plane where `g` beats it, a hair inside: the cone where
/// `g` beats them all is bounded by such edges, so where it exists one of them lies in it.
fn reachable(keys: &[Vec<f64>], kept: &[bool], g: usize) -> bool {
    if !kept[g] {
        return false;
    }
    let others: Vec<&Vec<f64>> =
        keys.iter().enumerate().filter(|&(j, _)| j != g && kept[j]).map(|(_, k)| k).collect();
    let k = &keys[g];
    let wins = |angle: f64| {
        let (x, y) = (angle.cos(), angle.sin());
        let score = |p: &[f64]| x * p[0] + y * p[1];
        others.iter().all(|o| score(k) > score(o))
    };
    let circle = (0..7200).map(|i| f64::from(i) * std::f64::consts::TAU / 7200.0);
    let normals = others.iter().flat_map(|o| {
        let along = (k[1] - o[1]).atan2(k[0] - o[0]);
        let edge = std::f64::consts::FRAC_PI_2 - 1e-6;
        [along, along + edge, along - edge]
    });
    circle.chain(normals).any(wins)
}

fn largest(xs: &[f64], g: usize) -> bool {
    xs.iter().enumerate().all(|(j, &x)| j == g || x < xs[g])
}

/// A vector as the lesson writes inputs: `(1, 0)`; one entry stands alone.
fn vector(xs: &[f64]) -> String {
    let parts: Vec<String> = xs.iter().map(|&x| shown(x, crate::format::DEFAULT_DIGITS).text).collect();
    vector_text(&parts)
}

/// Numbers already shown, as a vector: `(1.299, 1.847)`; one stands alone.
fn vector_text(parts: &[String]) -> String {
    if let [one] = parts { one.clone() } else { format!("({})", parts.join(", ")) }
}

/// The attention-matrix widget: markdown (the weight table, then each query's steps behind
/// `<details>`) and the page's heatmap with the same numbers.
fn matrix(
    id: &str,
    prompt: &str,
    inputs: &AttentionInputs,
    result: &AttentionResult,
    digits: usize,
) -> (String, String) {
    let (rows, cols) = (inputs.query_labels(), inputs.key_labels());
    let panels: Vec<String> = rows
        .iter()
        .enumerate()
        .map(|(i, label)| {
            format!(
                "{}\n{}",
                row_sum(&result.weights.row(i).to_vec(), digits),
                steps::attention_steps(inputs, &result.traces[i], label, digits)
            )
        })
        .collect();
    let summary = |label: &str| format!("Worked steps for the query “{label}”");

    let mut md = format!("**Try it.** {}\n\n", prompt.trim());
    md.push_str(&table::matrix_table(inputs, result, &result.weights, "weights", digits));
    for (label, panel) in rows.iter().zip(&panels) {
        let _ = write!(
            md,
            "\n<details><summary>{}</summary>\n\n{}\n\n</details>\n",
            summary(label),
            panel.trim_end()
        );
    }

    let mut html = format!(
        "<div class=\"widget matrix\" data-qkv-widget=\"attention-matrix\" id=\"widget-{}\">\n<p class=\"prompt\"><strong>Try it.</strong> {}</p>\n{}<table class=\"heatmap\">\n<thead><tr><th scope=\"col\" class=\"corner\">query ↓ · key →</th>",
        escape(id),
        inline_markdown(prompt),
        scroll_box("Attention weights")
    );
    for c in &cols {
        let _ = write!(html, "<th scope=\"col\">{}</th>", escape(c));
    }
    html.push_str("<th scope=\"col\">row sum</th><th scope=\"col\">output</th></tr></thead>\n<tbody>\n");
    for (i, r) in rows.iter().enumerate() {
        let r = escape(r);
        let _ = write!(html, "<tr data-qkv-row=\"{r}\"><th scope=\"row\">{r}</th>");
        for (j, c) in cols.iter().enumerate() {
            let w = result.weights[[i, j]];
            let text =
                if result.traces[i].kept[j] { fixed(w, digits) } else { format!("{} (masked)", fixed(w, 0)) };
            let _ = write!(
                html,
                "<td data-qkv-readout=\"weight:{r}:{}\" style=\"--w: {w:.4}\"{}>{text}</td>",
                escape(c),
                if w > 0.55 { " class=\"strong\"" } else { "" }
            );
        }
        let _ = writeln!(
            html,
            "<td data-qkv-readout=\"row-sum:{r}\">{}</td><td data-qkv-readout=\"output:{r}\">{}</td></tr>",
            fixed(result.weights.row(i).sum(), digits),
            table::output_cell(result, i, digits)
        );
    }
    html.push_str("</tbody>\n</table></div>\n");
    for (label, panel) in rows.iter().zip(&panels) {
        let _ = writeln!(
            html,
            "<details class=\"row-steps\" data-qkv-steps=\"{}\"><summary>{}</summary>\n{}</details>",
            escape(label),
            escape(&summary(label)),
            fragment(panel)
        );
    }
    html.push_str("</div>\n");
    (md, html)
}

/// "Row sum: $0.1978 + 0.4011 + 0.4011 \approx 1.0000$", from the weights as shown.
fn row_sum(weights: &[f64], digits: usize) -> String {
    let terms: Vec<_> = weights.iter().map(|&w| shown(w, digits)).collect();
    let total = shown(weights.iter().sum(), digits);
    format!(
        "**Row sum.** ${} {} {}$.\n",
        terms.iter().map(|t| t.text.as_str()).collect::<Vec<_>>().join(" + "),
        if terms.len() == 1 { relation(terms[0].exact && total.exact) } else { sum_relation(&terms, &total) },
        total.text
    )
}

mod block;
mod decode;
mod descent;
mod heads;
mod sweep;
mod tiles;
mod window;

#[cfg(test)]
mod tests;
