//! `steps POSITIONS`: rotary position embeddings worked out for the sweep's pair at two points of
//! the sweep: each rotation, each score, and the angle between the rotated vectors, which only the
//! distance sets.

use std::fmt::Write;

use super::{shown_all, tex_label, tuple};
use crate::eval::PositionsResult;
use crate::format::{relation, shown};

/// The worked rotations at the sweep's first and last points, at `digits` decimals.
pub(super) fn positions_steps(p: &PositionsResult, digits: usize) -> String {
    let v = |xs: &[f64]| shown_all(xs, digits);
    // What a vector turns into: `≈` before a rounded one, nothing before an exact one.
    let into = |xs: &[f64]| if v(xs).iter().all(|s| s.exact) { "" } else { "\\approx" };
    let n = |x: f64| shown(x, digits);
    let (q, k) = (tex_label(&p.query), tex_label(&p.key));
    let theta = crate::eval::positions_angle(0, p.sweep[0].rope_query.len(), p.base);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "The pair $(a, b)$ of a vector at position $m$ turns by the angle $m\\theta$, here with $\\theta_1 = {}$ for the first pair: it becomes $a \\cos m\\theta - b \\sin m\\theta$ and $a \\sin m\\theta + b \\cos m\\theta$.\n",
        n(theta).text
    );
    let points = [0, p.sweep.len() - 1];
    for (step, &s) in points.iter().enumerate() {
        let point = &p.sweep[s];
        let _ = writeln!(
            out,
            "{}. **Query at {}, key at {}.** $q_{{{q}}}$ turns by ${} \\theta$ into ${} {}$; $k_{{{k}}}$ by ${} \\theta$ into ${} {}$. Their scaled dot product is ${} {}$.",
            step + 1,
            point.query_position,
            point.key_position,
            point.query_position,
            into(&point.rope_query),
            tuple(&v(&point.rope_query)),
            point.key_position,
            into(&point.rope_key),
            tuple(&v(&point.rope_key)),
            relation(n(point.rope_score).exact),
            n(point.rope_score).text
        );
    }
    let _ = writeln!(
        out,
        "3. **Only the distance counts.** Both times the query turned {} steps of $\\theta$ further than the key, so the angle between them, and with it the score, is the same: ${}$ and ${}$. With the encodings added instead, the two scores are ${}$ and ${}$.",
        p.distance,
        n(p.sweep[0].rope_score).text,
        n(p.sweep[p.sweep.len() - 1].rope_score).text,
        n(p.sweep[0].sinusoid_score).text,
        n(p.sweep[p.sweep.len() - 1].sinusoid_score).text
    );
    out
}
