//! `steps BLOCK.ORDER.TOKEN`: one token through a Transformer block, stage by stage: each layer
//! norm (mean, variance, the division), the attention's output for the token, each residual sum
//! and the feed-forward layer (its hidden layer, ReLU, its output).

use std::fmt::Write;

use super::{shown_all, tex};
use crate::eval::{NormRow, Order, TokenPass};
use crate::format::{Shown, relation, shown, sum_relation};

/// The worked steps of `pass` (token `label`, the block's `eps`) at `digits` decimals.
pub(super) fn block_steps(order: Order, pass: &TokenPass, label: &str, eps: f64, digits: usize) -> String {
    let v = |xs: &[f64]| shown_all(xs, digits);
    let token = super::tex_label(label);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "The token enters as $x_{{{token}}} =$ {}, {} numbers wide.\n",
        pieces(&v(&pass.x)),
        pass.x.len()
    );
    let mut step = 0;
    let mut line = |out: &mut String, title: &str, text: String| {
        step += 1;
        let _ = writeln!(out, "{step}. **{title}** {text}");
    };
    match order {
        Order::Pre => {
            line(&mut out, "Layer norm of the input.", norm(&pass.norm1, "x", "n_1", eps, digits));
            line(
                &mut out,
                "Attention.",
                format!(
                    "Every token's $n_1$ goes through the heads, and $W_o$ joins them: $a_{{{token}}} {}$ {}.",
                    rel(&v(&pass.attention)),
                    pieces(&v(&pass.attention))
                ),
            );
            line(&mut out, "Residual.", sum("h", &pass.x, &pass.attention, &pass.residual1, digits));
            line(
                &mut out,
                "Layer norm before the feed-forward layer.",
                norm(&pass.norm2, "h", "n_2", eps, digits),
            );
            feed_forward(&mut out, &mut line, pass, "n_2", digits);
            line(&mut out, "Residual.", sum("y", &pass.residual1, &pass.ffn, &pass.output, digits));
        }
        Order::Post => {
            line(
                &mut out,
                "Attention.",
                format!(
                    "Every token's $x$ goes through the heads, and $W_o$ joins them: $a_{{{token}}} {}$ {}.",
                    rel(&v(&pass.attention)),
                    pieces(&v(&pass.attention))
                ),
            );
            line(&mut out, "Residual.", sum(r"x + a", &pass.x, &pass.attention, &pass.residual1, digits));
            line(&mut out, "Layer norm of the sum.", norm(&pass.norm1, r"(x + a)", "h", eps, digits));
            feed_forward(&mut out, &mut line, pass, "h", digits);
            line(
                &mut out,
                "Residual.",
                sum(r"h + f", &pass.norm1.output, &pass.ffn, &pass.residual2, digits),
            );
            line(&mut out, "Layer norm of the sum.", norm(&pass.norm2, r"(h + f)", "y", eps, digits));
        }
    }
    let _ = writeln!(
        out,
        "\nThe block's output for the token: $y_{{{token}}} {}$ {}.",
        rel(&v(&pass.output)),
        pieces(&v(&pass.output))
    );
    out
}

/// A vector as pieces of inline math of two numbers each, `$(a, b,$ $c, d)$`: inline math never
/// wraps inside itself, and a vector of eight numbers is wider than a phone.
fn pieces(xs: &[Shown]) -> String {
    let chunks: Vec<String> =
        xs.chunks(2).map(|c| c.iter().map(tex).collect::<Vec<_>>().join(", ")).collect();
    let n = chunks.len();
    let piece = |(i, c): (usize, &String)| {
        let open = if i == 0 { "(" } else { "" };
        let close = if i + 1 == n { ")" } else { "," };
        format!("${open}{c}{close}$")
    };
    chunks.iter().enumerate().map(piece).collect::<Vec<_>>().join(" ")
}

/// `=` when every shown number is the value itself.
fn rel(xs: &[Shown]) -> &'static str {
    relation(xs.iter().all(|x| x.exact))
}

/// The feed-forward layer's three steps on `input` (named `name` in the formulas).
fn feed_forward(
    out: &mut String,
    line: &mut impl FnMut(&mut String, &str, String),
    pass: &TokenPass,
    name: &str,
    digits: usize,
) {
    let v = |xs: &[f64]| shown_all(xs, digits);
    let (hidden, relu, ffn) = (v(&pass.hidden), v(&pass.relu), v(&pass.ffn));
    line(
        out,
        "Feed-forward, first layer.",
        format!(
            "$u = {name} W_1 + b_1 {}$ {}: {} numbers, {}× the width.",
            rel(&hidden),
            pieces(&hidden),
            pass.hidden.len(),
            shown(pass.hidden.len() as f64 / pass.x.len() as f64, digits).text
        ),
    );
    let off = pass.hidden.iter().filter(|&&u| u <= 0.0).count();
    line(
        out,
        "ReLU.",
        format!(
            "$r = \\max(u, 0) {}$ {}: {off} of the {} units are off (0) for this token.",
            rel(&relu),
            pieces(&relu),
            pass.relu.len()
        ),
    );
    line(out, "Feed-forward, second layer.", format!("$f = r W_2 + b_2 {}$ {}.", rel(&ffn), pieces(&ffn)));
}

/// `lhs = a + b ≈ total`, component by component.
fn sum(lhs: &str, a: &[f64], b: &[f64], total: &[f64], digits: usize) -> String {
    let (sa, sb, st) = (shown_all(a, digits), shown_all(b, digits), shown_all(total, digits));
    let exact = (0..st.len()).all(|i| sum_relation(&[sa[i].clone(), sb[i].clone()], &st[i]) == "=");
    format!("${lhs} =$ {} $+$ {} ${}$ {}.", pieces(&sa), pieces(&sb), relation(exact), pieces(&st))
}

/// A layer norm's steps: the mean, the variance, and the division.
fn norm(n: &NormRow, input: &str, output: &str, eps: f64, digits: usize) -> String {
    let d = n.input.len();
    let (mean, variance, std) = (shown(n.mean, digits), shown(n.variance, digits), shown(n.std, digits));
    let out = shown_all(&n.output, digits);
    format!(
        "Mean $\\mu {} {}$ (the {d} numbers of ${input}$ added, divided by {d}); variance $\\sigma^2 {} {}$ (the mean squared distance from $\\mu$); $\\sqrt{{\\sigma^2 + \\epsilon}} {} {}$ with $\\epsilon = {}$. Then ${output} = ({input} - \\mu) / \\sqrt{{\\sigma^2 + \\epsilon}} {}$ {}.",
        relation(mean.exact),
        mean.text,
        relation(variance.exact),
        variance.text,
        relation(std.exact),
        std.text,
        crate::format::tex_number(&crate::format::shortest(eps, 0)),
        rel(&out),
        pieces(&out),
    )
}
