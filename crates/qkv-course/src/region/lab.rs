//! `lab EXAMPLE.TOKEN`: the NumPy laboratory for one query: a short program, what it prints (from
//! the engine's trace), and the same program as a Jupyter notebook for the site.

use std::fmt::Write;

use super::{Context, Generated, Kind};
use crate::error::Problem;
use crate::eval::{AttentionInputs, AttentionResult, Computed};
use crate::notebook;
use crate::pipeline::OutputFile;

pub(super) const KIND: Kind =
    Kind { name: "lab", usage: "`lab EXAMPLE.TOKEN`", options: &["digits"], generate };

fn generate(cx: &mut Context<'_, '_>) -> Result<Generated, Problem> {
    let named = cx.named(KIND.usage)?;
    let Computed::Attention { inputs, result: Ok(result) } = named.computed else {
        return Err(cx.problem(
            format!("`{}` is not an attention example that computes", cx.args[0]),
            "`EXAMPLE.TOKEN` of a `qkv attention` block",
        ));
    };
    let i = cx.query_index(&inputs, &named.rest)?;
    let lab = lab(&inputs, &result, i, cx.digits);
    let label = &inputs.query_labels()[i];
    let name = format!("notebooks/{}-{}.ipynb", named.key.replace('.', "-"), crate::html::slug(label));
    let title = format!("Attention for the query “{label}”, in NumPy");
    let intro = "Scaled dot-product attention in a few lines of NumPy: score every key, softmax, blend the values. The numbers come from the lesson's example; run the cell and compare the printout with the lesson.";
    let nb = notebook::notebook(&title, intro, &lab.code, &lab.printed);
    Ok(Generated {
        notebook: Some(OutputFile { name: name.clone(), text: nb }),
        ..cx.markdown(lab_markdown(&lab, &name))
    })
}

/// The NumPy laboratory for one query: the program, and what it prints (from the engine's trace).
struct Lab {
    code: String,
    printed: String,
}

fn py_rows(rows: &[Vec<f64>]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|r| format!("[{}]", r.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", ")))
        .collect();
    format!("np.array([{}])", rows.join(", "))
}

/// Writes the NumPy program for query `query_idx` and the text it prints.
fn lab(inputs: &AttentionInputs, result: &AttentionResult, query_idx: usize, digits: usize) -> Lab {
    let trace = &result.traces[query_idx];
    let labels = inputs.query_labels();
    let tokens: Vec<String> = inputs.key_labels().iter().map(|t| format!("{t:?}")).collect();
    let mut code = String::new();
    let _ = writeln!(code, "import numpy as np\n");
    let _ = writeln!(code, "tokens = [{}]", tokens.join(", "));
    let _ = writeln!(code, "Q = {}  # one query per row", py_rows(&inputs.queries));
    let _ = writeln!(code, "K = {}  # one key per row", py_rows(&inputs.keys));
    let _ = writeln!(code, "V = {}  # one value per row\n", py_rows(&inputs.values));
    let _ = writeln!(code, "q = Q[{query_idx}]  # the query of {:?}", labels[query_idx]);
    let default_scale = (trace.scale - 1.0 / (trace.query.len() as f64).sqrt()).abs() < 1e-15;
    if default_scale {
        let _ = writeln!(code, "scores = K @ q / np.sqrt(K.shape[1])  # step 1: score every key");
    } else {
        let _ = writeln!(code, "scores = (K @ q) * {:?}  # step 1: score every key", trace.scale);
    }
    if trace.kept.iter().any(|k| !k) {
        let keep: Vec<&str> = trace.kept.iter().map(|&k| if k { "True" } else { "False" }).collect();
        let _ = writeln!(code, "scores = np.where([{}], scores, -np.inf)  # the mask", keep.join(", "));
    }
    let _ = writeln!(code, "weights = np.exp(scores - scores.max())  # step 2: softmax...");
    let _ = writeln!(code, "weights = weights / weights.sum()        # ...normalized");
    let _ = writeln!(code, "output = weights @ V                     # step 3: blend the values\n");
    let _ = writeln!(
        code,
        "def show(xs):\n    return \", \".join(f\"{{x:.{digits}f}}\" for x in np.atleast_1d(xs))\n"
    );
    let _ = writeln!(code, "print(\"scores: \", show(scores))");
    let _ = writeln!(code, "print(\"weights:\", show(weights))");
    let _ = writeln!(code, "print(\"output: \", show(output))");
    let show = |xs: &[f64]| xs.iter().map(|x| py_fixed(*x, digits)).collect::<Vec<_>>().join(", ");
    let printed = format!(
        "scores:  {}\nweights: {}\noutput:  {}\n",
        show(&trace.scores),
        show(&trace.weights),
        show(&result.output.row(query_idx).to_vec())
    );
    Lab { code, printed }
}

/// What Python's `f"{x:.Nf}"` prints (it keeps negative zero and spells infinity `inf`).
fn py_fixed(x: f64, digits: usize) -> String {
    if x == f64::NEG_INFINITY { "-inf".to_string() } else { format!("{x:.digits$}") }
}

/// The lab as markdown: the program, what it prints, and the notebook link.
fn lab_markdown(lab: &Lab, notebook: &str) -> String {
    format!(
        "```python\n{}```\n\nIt prints:\n\n```text\n{}```\n\nThe same program as a Jupyter notebook: [{notebook}]({notebook}).\n",
        lab.code, lab.printed
    )
}
