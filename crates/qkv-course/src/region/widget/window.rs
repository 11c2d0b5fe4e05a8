//! `window-alibi` widgets: a window control and an ALiBi-slope control over one attention
//! example, redrawing the bias each score gets, the weights and the outputs. The build computes
//! every combination the controls offer with the engine's f64 reference and embeds them as text,
//! so the script only shows the engine's numbers and never recomputes attention. The markdown
//! and the page without script show the declared state: the example's own window and slope.

use std::fmt::Write;

use serde_json::json;

use super::{Context, js_number};
use crate::error::Problem;
use crate::eval::{AttentionInputs, AttentionResult, compute};
use crate::examples::WidgetDecl;
use crate::format::fixed;
use crate::markup::{escape, inline_markdown, json_script, scroll_box};

/// What one state of the controls shows, as text at the widget's digits: per query and key the
/// bias added to the score and the weight (`None` where the key is hidden), per query its output.
struct Shown {
    bias: Vec<Vec<Option<String>>>,
    weights: Vec<Vec<Option<String>>>,
    output: Vec<Vec<String>>,
    /// The weights as numbers, for the cells' colour.
    shade: Vec<Vec<f64>>,
}

impl Shown {
    fn new(result: &AttentionResult, digits: usize) -> Self {
        let number = |x: f64| fixed(x, digits);
        let per_key = |value: &dyn Fn(&qkv::QueryTrace, usize) -> f64| -> Vec<Vec<Option<String>>> {
            let visible = |t: &qkv::QueryTrace, j: usize| t.kept[j].then(|| number(value(t, j)));
            result.traces.iter().map(|t| (0..t.kept.len()).map(|j| visible(t, j)).collect()).collect()
        };
        Shown {
            // ALiBi's term, as the example's record has it: what a visible score holds beyond
            // the scaled dot product.
            bias: per_key(&|t, j| t.scores[j] - t.dot_products[j] * t.scale),
            weights: per_key(&|t, j| t.weights[j]),
            output: result
                .output
                .rows()
                .into_iter()
                .map(|r| r.iter().map(|&x| number(x)).collect())
                .collect(),
            shade: result.traces.iter().map(|t| t.weights.clone()).collect(),
        }
    }
}

/// A window as the control names it.
fn window_name(window: Option<[usize; 2]>) -> String {
    match window {
        None => "none".to_string(),
        Some([before, 0]) => format!("{before} back"),
        Some([0, after]) => format!("{after} ahead"),
        Some([before, after]) => format!("{before} back and {after} ahead"),
    }
}

/// A window as `data-qkv-window` holds it: `none` or `BEFORE,AFTER`.
fn window_attr(window: Option<[usize; 2]>) -> String {
    window.map_or("none".to_string(), |[b, a]| format!("{b},{a}"))
}

/// The sentence that says which state the widget shows (the script writes the same).
fn state_text(window: &str, slope: &str) -> String {
    format!("Window: {window}. ALiBi slope m = {slope}.")
}

/// The markdown (forge and `--check`) and page views of a window-alibi widget.
pub(super) fn window_alibi(
    cx: &Context<'_, '_>,
    id: &str,
    w: &WidgetDecl,
    prompt: &str,
    inputs: &AttentionInputs,
) -> Result<(String, String), Problem> {
    // The block reader makes sure a window-alibi widget has both lists.
    let (Some(declared_windows), Some(slopes)) = (&w.windows, &w.slopes) else {
        return Err(cx.problem(String::new(), ""));
    };
    let windows: Vec<Option<[usize; 2]>> =
        std::iter::once(None).chain(declared_windows.value.iter().copied().map(Some)).collect();
    let not_offered = |at: usize, found: String, what: String, expected: &str| {
        Problem::new(cx.doc, at, what, found, expected)
    };
    let start_window = windows.iter().position(|&x| x == inputs.limits.window).ok_or_else(|| {
        not_offered(
            declared_windows.at,
            format!("windows = {:?}", declared_windows.value),
            format!(
                "example `{}` has the window {}, which `windows` does not offer",
                w.example.value,
                window_name(inputs.limits.window)
            ),
            "`windows` that hold the example's own window, where the widget starts",
        )
    })?;
    let slope = inputs.limits.alibi.unwrap_or(0.0);
    let start_slope = slopes.value.iter().position(|&s| s == slope).ok_or_else(|| {
        not_offered(
            slopes.at,
            format!(
                "slopes = [{}]",
                slopes.value.iter().map(|&s| js_number(s)).collect::<Vec<_>>().join(", ")
            ),
            format!(
                "example `{}` has the ALiBi slope {}, which `slopes` does not offer",
                w.example.value,
                js_number(slope)
            ),
            "`slopes` that hold the example's own slope (0 without ALiBi), where the widget starts",
        )
    })?;
    // Every state, computed by the engine: states[window][slope].
    let mut states = Vec::with_capacity(windows.len());
    for &window in &windows {
        let mut row = Vec::with_capacity(slopes.value.len());
        for &slope in &slopes.value {
            let mut state = inputs.clone();
            state.limits.window = window;
            state.limits.alibi = Some(slope);
            let result = compute(&state).map_err(|e| {
                Problem::new(
                    cx.doc,
                    slopes.at,
                    format!(
                        "with the window {} and the slope {}: {e}",
                        window_name(window),
                        js_number(slope)
                    ),
                    w.example.value.clone(),
                    "windows and slopes the engine accepts for this example",
                )
            })?;
            row.push(Shown::new(&result, w.digits));
        }
        states.push(row);
    }
    let names: Vec<String> = windows.iter().map(|&x| window_name(x)).collect();
    let slope_names: Vec<String> = slopes.value.iter().map(|&s| js_number(s)).collect();
    let view = View {
        rows: inputs.query_labels(),
        cols: inputs.key_labels(),
        shown: &states[start_window][start_slope],
        state: state_text(&names[start_window], &slope_names[start_slope]),
    };
    let offer = format!(
        "The controls offer the windows {} and the slopes {}.",
        names.join("; "),
        slope_names.join("; ")
    );
    let markdown = format!(
        "**Try it.** {}\n\n{} {offer}\n\n{}{}",
        prompt.trim(),
        view.state,
        view.markdown_bias(),
        view.markdown_weights()
    );
    let data = json!({
        "queries": view.rows,
        "keys": view.cols,
        "windows": names,
        "slopes": slope_names,
        "attrs": windows.iter().map(|&x| window_attr(x)).collect::<Vec<_>>(),
        "states": states.iter().map(|row| row.iter().map(|s| json!({
            "bias": s.bias, "weights": s.weights, "output": s.output, "shade": s.shade,
        })).collect::<Vec<_>>()).collect::<Vec<_>>(),
    });
    let mut html = format!(
        "<div class=\"widget window-alibi\" data-qkv-widget=\"window-alibi\" id=\"widget-{}\" data-qkv-window=\"{}\" data-qkv-slope=\"{}\">\n",
        escape(id),
        window_attr(windows[start_window]),
        slope_names[start_slope]
    );
    html.push_str(&json_script("data-qkv-data", &data));
    let _ = writeln!(html, "<p class=\"prompt\"><strong>Try it.</strong> {}</p>", inline_markdown(prompt));
    html.push_str("<div class=\"controls\" hidden>\n");
    html.push_str(&radios(id, "window", "Window", &names, start_window));
    html.push_str(&radios(id, "slope", "ALiBi slope m", &slope_names, start_slope));
    html.push_str("</div>\n");
    let _ = writeln!(html, "<p class=\"state\" data-qkv-state>{}</p>", escape(&view.state));
    html.push_str(&view.html_tables());
    // The script says here what each new state shows.
    html.push_str("<p class=\"offscreen\" data-qkv-announce aria-live=\"polite\"></p>\n</div>\n");
    Ok((markdown, html))
}

/// A group of radio buttons, one per choice, `checked` chosen.
pub(super) fn radios(id: &str, name: &str, legend: &str, choices: &[String], checked: usize) -> String {
    let mut out = format!("<fieldset data-qkv-control=\"{name}\"><legend>{legend}</legend>");
    for (i, choice) in choices.iter().enumerate() {
        let _ = write!(
            out,
            "<label><input type=\"radio\" name=\"{}-{name}\" value=\"{i}\"{}> {}</label>",
            escape(id),
            if i == checked { " checked" } else { "" },
            escape(choice)
        );
    }
    out.push_str("</fieldset>\n");
    out
}

/// One state's numbers, with the labels of their rows and columns.
struct View<'s> {
    rows: Vec<String>,
    cols: Vec<String>,
    shown: &'s Shown,
    state: String,
}

/// Caption of the bias table.
const BIAS: &str = "Bias added to each score, $m \\cdot (j - i)$";
/// Caption of the weights table.
const WEIGHTS: &str = "Weights and outputs";

impl View<'_> {
    fn markdown_header(&self, extra: &str) -> String {
        let mut out = String::from("| query ↓ · key → |");
        for c in &self.cols {
            let _ = write!(out, " {} |", c.replace('|', "\\|"));
        }
        out.push_str(extra);
        out.push_str("\n|:--|");
        out.push_str(&"--:|".repeat(self.cols.len() + usize::from(!extra.is_empty())));
        out.push('\n');
        out
    }

    fn markdown_bias(&self) -> String {
        let mut out = format!("{BIAS}:\n\n{}", self.markdown_header(""));
        for (r, row) in self.rows.iter().zip(&self.shown.bias) {
            let cells: Vec<&str> = row.iter().map(|b| b.as_deref().unwrap_or("masked")).collect();
            let _ = writeln!(out, "| **{}** | {} |", r.replace('|', "\\|"), cells.join(" | "));
        }
        out
    }

    fn markdown_weights(&self) -> String {
        let mut out = format!("\n{WEIGHTS}:\n\n{}", self.markdown_header(" output |"));
        for ((r, row), output) in self.rows.iter().zip(&self.shown.weights).zip(&self.shown.output) {
            let cells: Vec<&str> = row.iter().map(|b| b.as_deref().unwrap_or("0 (masked)")).collect();
            let _ = writeln!(
                out,
                "| **{}** | {} | {} |",
                r.replace('|', "\\|"),
                cells.join(" | "),
                vector(output)
            );
        }
        out
    }

    /// A table's title (outside its scroll box, so a narrow column never hides it), its box
    /// (named `label`) and its head.
    fn html_header(&self, title: &str, label: &str, extra: &str) -> String {
        let mut out = format!(
            "<p class=\"pane-title\">{}</p>\n{}<table class=\"heatmap\">\n<thead><tr><th scope=\"col\" class=\"corner\">query ↓ · key →</th>",
            inline_markdown(title),
            scroll_box(label)
        );
        for c in &self.cols {
            let _ = write!(out, "<th scope=\"col\">{}</th>", escape(c));
        }
        out.push_str(extra);
        out.push_str("</tr></thead>\n<tbody>\n");
        out
    }

    fn html_tables(&self) -> String {
        let mut out = String::from("<div class=\"panes\">\n");
        out.push_str(&self.html_header(BIAS, "Bias added to each score", ""));
        for (i, r) in self.rows.iter().enumerate() {
            let r = escape(r);
            let _ = write!(out, "<tr><th scope=\"row\">{r}</th>");
            for (j, c) in self.cols.iter().enumerate() {
                out.push_str(&cell(&format!("bias:{r}:{}", escape(c)), self.shown.bias[i][j].as_deref(), ""));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody>\n</table></div>\n");
        let width = self.shown.output.first().map_or(1, Vec::len);
        // One output column is set apart from the weights by a rule (the stylesheet's `outputs`).
        let span = if width > 1 { format!(" colspan=\"{width}\"") } else { " class=\"outputs\"".to_string() };
        out.push_str(&self.html_header(
            WEIGHTS,
            "Attention weights",
            &format!("<th scope=\"col\"{span}>output</th>"),
        ));
        for (i, r) in self.rows.iter().enumerate() {
            let r = escape(r);
            let _ = write!(out, "<tr><th scope=\"row\">{r}</th>");
            for (j, c) in self.cols.iter().enumerate() {
                let style = format!(" style=\"--w: {:.4}\"", self.shown.shade[i][j]);
                out.push_str(&cell(
                    &format!("weight:{r}:{}", escape(c)),
                    self.shown.weights[i][j].as_deref(),
                    &style,
                ));
            }
            let output = &self.shown.output[i];
            if let [x] = output.as_slice() {
                let _ = write!(out, "<td data-qkv-readout=\"output:{r}\" class=\"outputs\">{x}</td>");
            } else {
                for (c, x) in output.iter().enumerate() {
                    let _ = write!(out, "<td data-qkv-readout=\"output:{r}:{}\">{x}</td>", c + 1);
                }
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody>\n</table></div>\n</div>\n");
        out
    }
}

/// A readout cell: its number, or a dash that says "masked" to a screen reader where the key is
/// hidden (the script writes the same).
fn cell(readout: &str, text: Option<&str>, attrs: &str) -> String {
    match text {
        Some(x) => format!("<td data-qkv-readout=\"{readout}\"{attrs}>{x}</td>"),
        None => format!(
            "<td data-qkv-readout=\"{readout}\" data-qkv-masked><span aria-hidden=\"true\">–</span><span class=\"offscreen\">masked</span></td>"
        ),
    }
}

/// An output as the tables write it: one number, or `(a, b)`.
fn vector(parts: &[String]) -> String {
    if let [one] = parts { one.clone() } else { format!("({})", parts.join(", ")) }
}

#[cfg(test)]
mod tests;
