//! Training attention (`qkv gradient`): the gradients of a squared-error loss with respect to an
//! example's queries, keys and values, from the engine's f64 reference backward
//! (`qkv::reference::attention_backward`) and, beside it, the engine's fast tiled backward on
//! the saved logsumexp (`multi_head_attention_with_lse` and `multi_head_attention_backward`, one
//! head); each query's row worked out step by step (`dP`, `δ`, `dS`, the softmax's Jacobian);
//! and gradient-descent steps, each one's forward again from the engine.

use ndarray::{Array2, Array4, Axis};

use super::{AttentionInputs, AttentionResult, Computed, Evaluator, Record, array, compute, rows_node};
use crate::examples::{Decl, GradientDecl};
use crate::values::Node;

type Matrix = Vec<Vec<f64>>;

/// The names of a gradient block's own values, beside which each query's row is listed.
const FIELDS: &[&str] = &[
    "learning_rate",
    "loss",
    "loss_after",
    "drop",
    "norm2",
    "first_order_drop",
    "queries",
    "keys",
    "values",
    "target",
    "output",
    "d_output",
    "d_queries",
    "d_keys",
    "d_values",
    "lse",
    "steps",
];

/// How far the fast backward may be from the reference on a lesson's small example, in f64.
const FAST_TOLERANCE: f64 = 1e-9;

/// One query's row of the backward, worked out from the forward's weights.
#[derive(Debug, Clone)]
pub(crate) struct RowBackward {
    /// `∂L/∂O_i = O_i − target_i`.
    pub d_output: Vec<f64>,
    /// `dP_ij = dO_i · v_j`, per key.
    pub dp: Vec<f64>,
    /// `δ_i = Σ_j P_ij dP_ij`, which equals `dO_i · O_i`.
    pub delta: f64,
    /// `dS_ij = P_ij (dP_ij − δ_i)`, per key.
    pub ds: Vec<f64>,
    /// `dQ_i = scale · Σ_j dS_ij k_j`.
    pub d_query: Vec<f64>,
}

/// One state of the descent: the inputs, their forward, the loss and the gradients.
#[derive(Debug, Clone)]
pub(crate) struct DescentStep {
    pub inputs: AttentionInputs,
    pub result: AttentionResult,
    pub loss: f64,
    /// The reference's gradients at this state.
    pub d_queries: Matrix,
    pub d_keys: Matrix,
    pub d_values: Matrix,
}

/// What a gradient block computed.
#[derive(Debug, Clone)]
pub(crate) struct GradientResult {
    pub target: Matrix,
    pub learning_rate: f64,
    /// The start (step 0), then the state after each step.
    pub steps: Vec<DescentStep>,
    /// Each query's row of the backward at the start.
    pub rows: Vec<RowBackward>,
    /// Each query's logsumexp at the start, `m + ln l`: what FlashAttention keeps of the forward.
    pub lse: Vec<f64>,
}

impl GradientResult {
    /// Labels of the queries and of the keys.
    pub(crate) fn labels(&self) -> (Vec<String>, Vec<String>) {
        (self.steps[0].inputs.query_labels(), self.steps[0].inputs.key_labels())
    }

    /// The softmax's Jacobian for query `i` at the start: `∂p_j/∂s_k = p_j (δ_jk − p_k)`.
    pub(crate) fn jacobian(&self, i: usize) -> Matrix {
        let p = &self.steps[0].result.traces[i].weights;
        (0..p.len())
            .map(|j| (0..p.len()).map(|k| p[j] * (f64::from(u8::from(j == k)) - p[k])).collect())
            .collect()
    }
}

fn rows(a: &Array2<f64>) -> Matrix {
    a.rows().into_iter().map(|r| r.to_vec()).collect()
}

/// `½ Σ (O − target)²` and `O − target`.
fn loss(output: &Array2<f64>, target: &Matrix) -> (f64, Matrix) {
    let d: Matrix =
        rows(output).iter().zip(target).map(|(o, t)| o.iter().zip(t).map(|(o, t)| o - t).collect()).collect();
    (0.5 * d.iter().flatten().map(|x| x * x).sum::<f64>(), d)
}

/// The forward and the reference's gradients at `inputs`.
fn state(inputs: AttentionInputs, target: &Matrix) -> Result<DescentStep, qkv::AttentionError> {
    let result = compute(&inputs)?;
    let (loss, d_output) = loss(&result.output, target);
    let masks = inputs.masks();
    let options = inputs.options(&masks);
    let (q, k, v) = (array(&inputs.queries), array(&inputs.keys), array(&inputs.values));
    let g =
        qkv::reference::attention_backward(q.view(), k.view(), v.view(), array(&d_output).view(), &options)?;
    Ok(DescentStep {
        d_queries: rows(&g.dq),
        d_keys: rows(&g.dk),
        d_values: rows(&g.dv),
        inputs,
        result,
        loss,
    })
}

/// The engine's fast backward (one batch, one head) from its own forward's logsumexp: its
/// largest difference from the reference's gradients.
fn fast_difference(step: &DescentStep, target: &Matrix) -> Result<f64, qkv::AttentionError> {
    let four = |m: &Matrix| array(m).insert_axis(Axis(0)).insert_axis(Axis(0));
    let inputs = &step.inputs;
    let (q, k, v): (Array4<f64>, Array4<f64>, Array4<f64>) =
        (four(&inputs.queries), four(&inputs.keys), four(&inputs.values));
    let masks = inputs.masks();
    let options = inputs.options(&masks);
    let forward = qkv::multi_head_attention_with_lse(q.view(), k.view(), v.view(), &options)?;
    let (_, d_output) =
        loss(&forward.output.index_axis(Axis(0), 0).index_axis(Axis(0), 0).to_owned(), target);
    let g = qkv::multi_head_attention_backward(
        q.view(),
        k.view(),
        v.view(),
        &forward,
        four(&d_output).view(),
        &options,
    )?;
    let pairs = [(&g.dq, &step.d_queries), (&g.dk, &step.d_keys), (&g.dv, &step.d_values)];
    Ok(pairs
        .iter()
        .flat_map(|(fast, reference)| fast.iter().zip(reference.iter().flatten()).map(|(a, b)| (a - b).abs()))
        .fold(0.0, f64::max))
}

/// Query `i`'s row of the backward from the forward's trace.
fn row_backward(trace: &qkv::QueryTrace, keys: &Matrix, values: &Matrix, d_output: &[f64]) -> RowBackward {
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let dp: Vec<f64> = values.iter().map(|v| dot(d_output, v)).collect();
    let delta = dot(&trace.weights, &dp);
    let ds: Vec<f64> = trace.weights.iter().zip(&dp).map(|(p, g)| p * (g - delta)).collect();
    let width = keys.first().map_or(0, Vec::len);
    let d_query =
        (0..width).map(|c| trace.scale * ds.iter().zip(keys).map(|(s, k)| s * k[c]).sum::<f64>()).collect();
    RowBackward { d_output: d_output.to_vec(), dp, delta, ds, d_query }
}

impl Evaluator<'_> {
    /// A `qkv gradient` block.
    pub(super) fn gradient(&mut self, decl: &Decl, g: &GradientDecl) -> Option<Record> {
        let (inputs, result) = self.example_of(decl, &g.example)?;
        if let Err(e) = result {
            self.fail(
                decl,
                g.example.at,
                format!("`{}` fails: {e}", g.example.value),
                g.example.value.clone(),
                "an example that computes",
            );
            return None;
        }
        // Each query's row sits beside the record's own fields, so no label may be one of them.
        if let Some(label) = inputs.query_labels().into_iter().find(|l| FIELDS.contains(&l.as_str())) {
            self.fail(
                decl,
                g.example.at,
                format!(
                    "token `{label}` of `{}` is also the name of a gradient block's field",
                    g.example.value
                ),
                g.example.value.clone(),
                format!("token labels other than {}", FIELDS.join(", ")),
            );
            return None;
        }
        let target = self.matrix(decl, &g.target, "target")?;
        let n_values = inputs.values.first().map_or(0, Vec::len);
        if target.len() != inputs.queries.len() || target.iter().any(|r| r.len() != n_values) {
            self.fail(
                decl,
                g.target.at,
                format!("`target` of `{}` is not shaped as the example's output", decl.id),
                format!("{} rows", target.len()),
                format!("{} rows of {n_values} numbers: one wanted output per query", inputs.queries.len()),
            );
            return None;
        }
        let rate = g.learning_rate.value;
        let n_steps = g.steps.as_ref().map_or(1, |s| s.value);
        let engine_error = |this: &mut Self, e: qkv::AttentionError| {
            this.fail(
                decl,
                decl.id_at,
                format!("the engine rejected `{}`: {e}", decl.id),
                format!("id = \"{}\"", decl.id),
                "an example the engine computes",
            );
        };
        let mut steps = Vec::with_capacity(n_steps + 1);
        let mut current = inputs;
        for s in 0..=n_steps {
            let step = match state(current.clone(), &target) {
                Ok(step) => step,
                Err(e) => {
                    engine_error(self, e);
                    return None;
                }
            };
            if !step.loss.is_finite()
                || step
                    .d_queries
                    .iter()
                    .chain(&step.d_keys)
                    .chain(&step.d_values)
                    .flatten()
                    .any(|x| !x.is_finite())
            {
                self.fail(
                    decl,
                    g.learning_rate.at,
                    format!("step {s} of `{}` overflows", decl.id),
                    String::new(),
                    "a smaller learning rate or fewer steps",
                );
                return None;
            }
            let descend = |m: &Matrix, d: &Matrix| -> Matrix {
                m.iter().zip(d).map(|(r, g)| r.iter().zip(g).map(|(x, g)| x - rate * g).collect()).collect()
            };
            current = step.inputs.clone();
            current.queries = descend(&step.inputs.queries, &step.d_queries);
            current.keys = descend(&step.inputs.keys, &step.d_keys);
            current.values = descend(&step.inputs.values, &step.d_values);
            // The new queries, keys and values are the trained ones, not a projection any more.
            current.projection = None;
            steps.push(step);
        }
        let start = &steps[0];
        let (_, d_output) = loss(&start.result.output, &target);
        let rows: Vec<RowBackward> = start
            .result
            .traces
            .iter()
            .zip(&d_output)
            .map(|(t, d)| row_backward(t, &start.inputs.keys, &start.inputs.values, d))
            .collect();
        let lse = start.result.traces.iter().map(qkv::QueryTrace::logsumexp).collect();
        // The fast backward rounds in another order (and differently at each SIMD level), so its
        // numbers are not committed; every build checks that it agrees with the reference.
        match fast_difference(start, &target) {
            Ok(d) if d <= FAST_TOLERANCE => {}
            Ok(d) => {
                self.fail(
                    decl,
                    decl.id_at,
                    format!(
                        "the engine's fast backward differs from its reference by {d:e} on `{}`",
                        decl.id
                    ),
                    format!("id = \"{}\"", decl.id),
                    format!("gradients that agree within {FAST_TOLERANCE:e}, as the engine's tests require"),
                );
                return None;
            }
            Err(e) => {
                engine_error(self, e);
                return None;
            }
        }
        let result = GradientResult { target, learning_rate: rate, steps, rows, lse };
        let node = gradient_node(&result);
        Some(Record { computed: Computed::Gradient(Box::new(result)), node })
    }
}

fn gradient_node(g: &GradientResult) -> Node {
    let (ql, kl) = g.labels();
    let start = &g.steps[0];
    let (_, d_output) = loss(&start.result.output, &g.target);
    let norm2: f64 =
        start.d_queries.iter().chain(&start.d_keys).chain(&start.d_values).flatten().map(|x| x * x).sum();
    let numbers = |labels: &[String], xs: &[f64]| Node::labelled(labels, xs.iter().map(|&x| Node::Number(x)));
    let mut entries: Vec<(String, Node)> = vec![
        ("learning_rate".into(), Node::Number(g.learning_rate)),
        ("loss".into(), Node::Number(start.loss)),
        ("loss_after".into(), Node::Number(g.steps[1].loss)),
        ("drop".into(), Node::Number(start.loss - g.steps[1].loss)),
        ("norm2".into(), Node::Number(norm2)),
        // What the gradient predicts the first step's drop to be, to first order: η‖g‖².
        ("first_order_drop".into(), Node::Number(g.learning_rate * norm2)),
        ("queries".into(), rows_node(&ql, &start.inputs.queries)),
        ("keys".into(), rows_node(&kl, &start.inputs.keys)),
        ("values".into(), rows_node(&kl, &start.inputs.values)),
        ("target".into(), rows_node(&ql, &g.target)),
        ("output".into(), rows_node(&ql, &rows(&start.result.output))),
        ("d_output".into(), rows_node(&ql, &d_output)),
        ("d_queries".into(), rows_node(&ql, &start.d_queries)),
        ("d_keys".into(), rows_node(&kl, &start.d_keys)),
        ("d_values".into(), rows_node(&kl, &start.d_values)),
        ("lse".into(), numbers(&ql, &g.lse)),
    ];
    let steps = g.steps.iter().skip(1).map(|s| {
        Node::Map(vec![
            ("loss", Node::Number(s.loss)),
            ("queries", rows_node(&ql, &s.inputs.queries)),
            ("keys", rows_node(&kl, &s.inputs.keys)),
            ("values", rows_node(&kl, &s.inputs.values)),
            ("output", rows_node(&ql, &rows(&s.result.output))),
            (
                "weights",
                Node::labelled(&ql, s.result.weights.rows().into_iter().map(|r| numbers(&kl, &r.to_vec()))),
            ),
        ])
    });
    entries.push(("steps".into(), Node::numbered(steps)));
    for (i, ((label, row), trace)) in ql.iter().zip(&g.rows).zip(&start.result.traces).enumerate() {
        let p = &trace.weights;
        let jacobian = g.jacobian(i).into_iter().map(|r| numbers(&kl, &r)).collect::<Vec<_>>();
        entries.push((
            label.clone(),
            Node::Map(vec![
                ("weights", numbers(&kl, p)),
                ("d_output", Node::vector(&row.d_output)),
                ("dp", numbers(&kl, &row.dp)),
                ("delta", Node::Number(row.delta)),
                ("ds", numbers(&kl, &row.ds)),
                ("jacobian", Node::labelled(&kl, jacobian)),
                ("d_query", Node::vector(&row.d_query)),
            ]),
        ));
    }
    Node::Record(entries)
}
