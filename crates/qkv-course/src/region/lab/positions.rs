//! `lab POSITIONS`: rotary position embeddings and sinusoidal encodings in NumPy: one query moved
//! along the positions with its key a fixed distance behind, each score printed both ways; and
//! what it prints, from the positions block's record.

use std::fmt::Write;

use super::{Lab, py_fixed};
use crate::eval::PositionsResult;

/// The notebook's title.
pub(super) const TITLE: &str = "Where a token is: RoPE and sinusoids, in NumPy";

/// The notebook's introduction.
pub(super) const INTRO: &str = "Rotate a query and a key by their positions (RoPE), or add sinusoids to them, and move the query along while its key stays a fixed distance behind: one score stays put, the other does not. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.";

/// The program and its printout.
pub(super) fn lab(p: &PositionsResult, digits: usize) -> Lab {
    let list = |xs: &[f64]| {
        format!("np.array([{}])", xs.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", "))
    };
    let mut code = String::from("import numpy as np\n\n");
    let _ = writeln!(code, "q = {}  # the query of {:?}", list(&p.query_vector), p.query);
    let _ = writeln!(code, "k = {}  # the key of {:?}", list(&p.key_vector), p.key);
    let _ = writeln!(code, "base, distance, positions = {:?}, {}, {}\n", p.base, p.distance, p.sweep.len());
    code.push_str(
        "def angles(m, d):  # position m times each pair's angle base^(-2i/d)\n    return m * base ** (-np.arange(0, d, 2) / d)\n\n",
    );
    code.push_str(
        "def rotate(x, m):  # RoPE: turn each pair (x[2i], x[2i+1]) by its angle\n    a, b = x[0::2], x[1::2]\n    c, s = np.cos(angles(m, len(x))), np.sin(angles(m, len(x)))\n    out = np.empty_like(x)\n    out[0::2], out[1::2] = a * c - b * s, a * s + b * c\n    return out\n\n",
    );
    code.push_str(
        "def sinusoid(m, d):  # the original Transformer's encoding: sin and cos of the same angles\n    out = np.empty(d)\n    out[0::2], out[1::2] = np.sin(angles(m, d)), np.cos(angles(m, d))\n    return out\n\n",
    );
    let _ = writeln!(
        code,
        "def show(x, digits={digits}):\n    return f\"{{round(x, digits) + 0.0:.{{digits}}f}}\"\n"
    );
    code.push_str(
        "scale = 1 / np.sqrt(len(q))\nfor key_at in range(positions):\n    query_at = key_at + distance\n",
    );
    code.push_str("    rope = rotate(q, query_at) @ rotate(k, key_at) * scale\n");
    code.push_str("    added = (q + sinusoid(query_at, len(q))) @ (k + sinusoid(key_at, len(k))) * scale\n");
    code.push_str(
        "    print(f\"query at {query_at}, key at {key_at}: RoPE {show(rope)}, sinusoids {show(added)}\")\n",
    );
    let mut printed = String::new();
    for s in &p.sweep {
        let _ = writeln!(
            printed,
            "query at {}, key at {}: RoPE {}, sinusoids {}",
            s.query_position,
            s.key_position,
            py_fixed(s.rope_score, digits),
            py_fixed(s.sinusoid_score, digits)
        );
    }
    Lab { code, printed }
}
