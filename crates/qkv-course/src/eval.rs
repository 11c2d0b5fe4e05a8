//! Evaluation: every declaration computed once with the engine's deterministic f64 reference path,
//! references between blocks resolved (across sections too), results kept as [`Node`] trees.

use std::collections::HashMap;

use ndarray::Array2;

use crate::error::Problem;
use crate::examples::{
    AttentionDecl, Condition, Decl, DeclKind, Field, Input, Limits, Mask, Operand, unequal_rows,
};
use crate::limits::{self, MAX_ROWS, MAX_WIDTH};
use crate::values::{Miss, Node, Resolve};

mod block;
mod gradient;
mod multi_head;
mod positions;
mod sequence;

pub(crate) use block::{BlockResult, NormRow, Order, TokenPass, length};
pub(crate) use gradient::GradientResult;
pub(crate) use positions::{PositionsResult, angle as positions_angle, sinusoid as positions_sinusoid};

/// The resolved inputs of an attention example.
#[derive(Debug, Clone)]
pub(crate) struct AttentionInputs {
    pub tokens: Option<Vec<String>>,
    /// Labels of the queries when they differ from the keys' (cross-attention).
    pub query_tokens: Option<Vec<String>>,
    pub queries: Vec<Vec<f64>>,
    pub keys: Vec<Vec<f64>>,
    pub values: Vec<Vec<f64>>,
    pub mask: Option<Mask>,
    /// Key lengths, padding, a window and ALiBi, as the engine takes them.
    pub limits: Limits,
    /// What multiplies the scores, if not the default `1/√d_k`.
    pub scale: Option<ScoreScale>,
    /// The embeddings and projections the queries, keys and values came from, if they did.
    pub projection: Option<Projection>,
}

/// What multiplies an example's scores in place of the default `1/√d_k`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum ScoreScale {
    /// A scale as the author gave it.
    Given(f64),
    /// A temperature `T`: `1/(T·√d_k)`, for whatever `d_k` the example's keys have.
    Temperature(f64),
}

impl ScoreScale {
    /// The multiplier for keys `d_k` wide.
    pub(crate) fn for_width(self, d_k: usize) -> f64 {
        match self {
            ScoreScale::Given(scale) => scale,
            ScoreScale::Temperature(t) => 1.0 / (t * (d_k as f64).sqrt()),
        }
    }
}

/// What an example's queries, keys and values were projected from: `Q = X_q W_q`,
/// `K = X_kv W_k`, `V = X_kv W_v` (`x_kv` is `None` for self-attention, where both are `x`).
#[derive(Debug, Clone)]
pub(crate) struct Projection {
    pub x_q: Vec<Vec<f64>>,
    pub x_kv: Option<Vec<Vec<f64>>>,
    pub w_q: Vec<Vec<f64>>,
    pub w_k: Vec<Vec<f64>>,
    pub w_v: Vec<Vec<f64>>,
}

impl AttentionInputs {
    /// Labels of the query rows: `query_tokens`, else the tokens when there is one per row,
    /// else `1..`.
    pub(crate) fn query_labels(&self) -> Vec<String> {
        labels(
            if self.query_tokens.is_some() { &self.query_tokens } else { &self.tokens },
            self.queries.len(),
        )
    }

    /// Whether queries and keys go by the same labels (self-attention), so one table row can
    /// show a token's query, key and value together.
    pub(crate) fn self_attention(&self) -> bool {
        self.query_labels() == self.key_labels()
    }

    /// Labels of the key rows.
    pub(crate) fn key_labels(&self) -> Vec<String> {
        labels(&self.tokens, self.keys.len())
    }

    /// Engine options for these inputs; `masks` (from [`Self::masks`]) must outlive them.
    pub(crate) fn options<'a>(&'a self, masks: &'a MaskArrays) -> qkv::AttentionOptions<'a, f64> {
        let (keep, real) = (&masks.keep, &masks.real);
        let mut options = qkv::AttentionOptions::new();
        if let Some(length) = &self.limits.key_length {
            options = options.key_lengths(std::slice::from_ref(length));
        }
        if let Some(real) = real {
            options = options.key_padding(qkv::KeyPadding::new(real.view()));
        }
        if let Some([before, after]) = self.limits.window {
            options = options.sliding_window(qkv::SlidingWindow::new(before, after));
        }
        if let Some(slope) = &self.limits.alibi {
            options = options.alibi(qkv::Alibi::new(std::slice::from_ref(slope)));
        }
        if let Some(s) = self.scale {
            options = options.scale(s.for_width(self.keys.first().map_or(0, Vec::len)));
        }
        if self.mask == Some(Mask::Causal) {
            options = options.causal(qkv::CausalMask::BottomRight);
        }
        if let Some(k) = keep {
            options = options.keep_mask(qkv::KeepMask::new(k.view()));
        }
        options
    }

    /// The masks the engine takes as arrays: the keep table and the keys that are not padding.
    pub(crate) fn masks(&self) -> MaskArrays {
        let keep = match &self.mask {
            Some(Mask::Keep(rows)) => {
                let n = rows.first().map_or(0, Vec::len);
                Array2::from_shape_vec((rows.len(), n), rows.concat()).ok()
            }
            _ => None,
        };
        let real = self.limits.key_padding.as_ref().map(|padding| padding.iter().map(|p| !p).collect());
        MaskArrays { keep, real }
    }
}

/// An example's masks as the engine's options borrow them.
pub(crate) struct MaskArrays {
    keep: Option<Array2<bool>>,
    real: Option<ndarray::Array1<bool>>,
}

pub(crate) fn labels(tokens: &Option<Vec<String>>, n: usize) -> Vec<String> {
    match tokens {
        Some(t) if t.len() == n => t.clone(),
        _ => (1..=n).map(|i| i.to_string()).collect(),
    }
}

/// A matrix from rows (all rows have equal length; checked when the inputs were read).
pub(crate) fn array(rows: &[Vec<f64>]) -> Array2<f64> {
    let n = rows.first().map_or(0, Vec::len);
    Array2::from_shape_vec((rows.len(), n), rows.concat()).unwrap_or_else(|_| Array2::zeros((0, 0)))
}

/// What an attention example computed.
#[derive(Debug, Clone)]
pub(crate) struct AttentionResult {
    pub scores: Array2<f64>,
    pub weights: Array2<f64>,
    pub output: Array2<f64>,
    pub traces: Vec<qkv::QueryTrace>,
}

/// The computed part of a record, kept typed for the generators.
#[derive(Debug, Clone)]
// A lesson holds a few dozen records: boxing the large variant would only add noise to the
// many places that match on it.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Computed {
    Attention {
        inputs: AttentionInputs,
        result: Result<AttentionResult, String>,
    },
    Softmax(qkv::QueryTrace),
    Dot {
        q: Vec<f64>,
        k: Vec<f64>,
        trace: qkv::QueryTrace,
    },
    WeightedSum {
        weights: Vec<f64>,
        values: Vec<f64>,
        terms: Vec<f64>,
        output: f64,
    },
    /// A named matrix: its rows and their labels.
    Matrix {
        labels: Vec<String>,
        rows: Vec<Vec<f64>>,
    },
    MultiHead(Box<MultiHeadResult>),
    Decode(Box<DecodeResult>),
    Tiled(Box<TiledResult>),
    /// A `measurements` figure's data file: only its record, which prose cites.
    Measured,
    /// A Transformer block: both orders of layer norm around a multi-head example.
    Block(Box<BlockResult>),
    /// The backward of an attention example under a squared-error loss, and descent steps.
    Gradient(Box<GradientResult>),
    /// An attention example with positions: rotary and sinusoidal, and a sweep.
    Positions(Box<PositionsResult>),
}

/// A decoded example: each token's step as an attention example of one query over the keys
/// cached so far (its own included).
#[derive(Debug, Clone)]
pub(crate) struct DecodeResult {
    /// How many tokens the prompt holds (attended at once, as a prefill).
    pub prompt: usize,
    /// Each token's label and its step.
    pub steps: Vec<(String, AttentionInputs, AttentionResult)>,
}

/// One query of an example through the tiled online softmax.
#[derive(Debug, Clone)]
pub(crate) struct TiledResult {
    pub inputs: AttentionInputs,
    /// The query's index among the example's queries.
    pub query: usize,
    pub trace: qkv::TiledTrace,
    /// The blocks' partial results merged, as a second way to the same output.
    pub merged: qkv::PartialAttention<f64>,
    /// The query's output from attention over every key at once, which the tiles must reach.
    pub attention: Vec<f64>,
}

/// What a multi-head example computed: each head as an attention example, their outputs side by
/// side, and that projected by `W_o`.
#[derive(Debug, Clone)]
pub(crate) struct MultiHeadResult {
    /// Labels of the rows (one per token).
    pub tokens: Vec<String>,
    pub x: Vec<Vec<f64>>,
    /// Each head's name, inputs and result.
    pub heads: Vec<(String, AttentionInputs, AttentionResult)>,
    pub concat: Vec<Vec<f64>>,
    pub w_o: Vec<Vec<f64>>,
    pub output: Vec<Vec<f64>>,
}

impl Computed {
    /// What `rest` (path segments below a record) names, when it picks a part that computes by
    /// itself: `heads.NAME` of a multi-head example is that head, an attention example. The part
    /// and how many segments it took; the record itself and 0 otherwise.
    pub(crate) fn part(self, rest: &[String]) -> (Computed, usize) {
        match (self, rest) {
            (Computed::MultiHead(m), [heads, name, ..])
                if heads == "heads" && m.heads.iter().any(|(n, _, _)| n == name) =>
            {
                let (_, inputs, result) = m.heads.into_iter().find(|(n, _, _)| n == name).expect("checked");
                (Computed::Attention { inputs, result: Ok(result) }, 2)
            }
            (Computed::Decode(d), [token, ..]) if d.steps.iter().any(|(t, _, _)| t == token) => {
                let (_, inputs, result) = d.steps.into_iter().find(|(t, _, _)| t == token).expect("checked");
                (Computed::Attention { inputs, result: Ok(result) }, 1)
            }
            // `attn.pre` of a block is the multi-head attention its pre-norm order ran.
            (Computed::Block(b), [attn, order, rest @ ..])
                if attn == "attn" && Order::from_name(order).is_some() =>
            {
                let order = Order::from_name(order).expect("checked");
                let (_, m, _) = b.orders.into_iter().find(|(o, _, _)| *o == order).expect("both orders");
                let (part, taken) = Computed::MultiHead(Box::new(m)).part(rest);
                (part, taken + 2)
            }
            // `rope` and `sinusoid` of a positions block are attention examples.
            (Computed::Positions(p), [name, ..]) if p.example(name).is_some() => {
                let (inputs, result) = p.example(name).cloned().expect("checked");
                (Computed::Attention { inputs, result: Ok(result) }, 1)
            }
            // `steps.N` of a gradient block is the example after step N (`steps.0`, the start).
            (Computed::Gradient(g), [steps, n, ..])
                if steps == "steps" && n.parse::<usize>().is_ok_and(|n| n < g.steps.len()) =>
            {
                let step = g.steps.into_iter().nth(n.parse().expect("checked")).expect("checked");
                (Computed::Attention { inputs: step.inputs, result: Ok(step.result) }, 2)
            }
            (computed, _) => (computed, 0),
        }
    }
}

/// One evaluated declaration.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    pub computed: Computed,
    pub node: Node,
}

/// All declarations of the lesson, evaluated on demand with memoisation.
pub(crate) struct Evaluator<'d> {
    /// Section id of each document.
    pub sections: &'d [String],
    /// Declarations by qualified id `section.id`.
    pub decls: HashMap<String, &'d Decl>,
    records: HashMap<String, Option<Record>>,
    /// The lesson's data files (`data/NAME.toml` → text), for the figures that draw them.
    pub data: &'d std::collections::BTreeMap<String, String>,
    /// Qualified ids of blocks that failed to parse: references to them stay quiet (the block's
    /// own error says what is wrong).
    pub broken: std::collections::HashSet<String>,
    /// Declarations being evaluated right now, to catch reference cycles.
    in_progress: std::collections::HashSet<String>,
    pub problems: Vec<Problem>,
}

/// A resolved path: the record's qualified id and the path inside it.
pub(crate) struct Target<'p> {
    pub key: String,
    pub rest: Vec<&'p str>,
}

impl<'d> Evaluator<'d> {
    pub(crate) fn new(
        sections: &'d [String],
        decls: HashMap<String, &'d Decl>,
        data: &'d std::collections::BTreeMap<String, String>,
    ) -> Self {
        Self {
            sections,
            decls,
            data,
            records: HashMap::new(),
            broken: Default::default(),
            in_progress: Default::default(),
            problems: Vec::new(),
        }
    }

    /// Splits `path` (written in document `doc`) into a declaration and the rest:
    /// `attention.sentence.love.output` names section `attention`; `sentence.love.output` is local.
    pub(crate) fn target<'p>(&self, doc: usize, path: &'p str) -> Result<Target<'p>, String> {
        let segments: Vec<&str> = path.split('.').collect();
        if segments.len() >= 2 && self.sections.iter().any(|s| s == segments[0]) {
            let key = format!("{}.{}", segments[0], segments[1]);
            if self.computes(&key) {
                return Ok(Target { key, rest: segments[2..].to_vec() });
            }
        }
        let key = format!("{}.{}", self.sections[doc], segments[0]);
        if self.computes(&key) {
            return Ok(Target { key, rest: segments[1..].to_vec() });
        }
        let qualified = segments.get(..2).map(|s| s.join("."));
        if self.broken.contains(&key) || qualified.is_some_and(|q| self.broken.contains(&q)) {
            return Err(String::new());
        }
        let mut known: Vec<String> = self
            .decls
            .iter()
            .filter(|(_, d)| d.kind.computes())
            .filter_map(|(k, _)| {
                let (s, id) = k.split_once('.')?;
                Some(if s == self.sections[doc] { id.to_string() } else { k.clone() })
            })
            .collect();
        known.sort();
        if known.is_empty() {
            return Err("the id of a `qkv` block, but the lesson declares none".into());
        }
        let ids: Vec<&str> = known.iter().map(String::as_str).collect();
        Err(match crate::error::closest(segments[0], &ids) {
            // The nearest id first: the list can be long.
            Some(near) => format!("`{near}`, the example id nearest to it (the ids: {})", known.join(", ")),
            None => format!("an example id: {}", known.join(", ")),
        })
    }

    /// Whether `key` names a declaration with values (not a figure, quiz or widget).
    fn computes(&self, key: &str) -> bool {
        self.decls.get(key).is_some_and(|d| d.kind.computes())
    }

    /// The record of a declaration (evaluated once); `None` if it failed (a problem was recorded).
    pub(crate) fn record(&mut self, key: &str) -> Option<Record> {
        if let Some(r) = self.records.get(key) {
            return r.clone();
        }
        let decl = *self.decls.get(key)?;
        if !self.in_progress.insert(key.to_string()) {
            let mut cycle: Vec<&str> = self.in_progress.iter().map(String::as_str).collect();
            cycle.sort_unstable();
            self.fail(
                decl,
                decl.id_at,
                format!("`{}` depends on itself through references", decl.id),
                format!("id = \"{}\"", decl.id),
                format!("references that end in literal numbers (blocks involved: {})", cycle.join(", ")),
            );
            return None;
        }
        let record = self.evaluate(decl);
        self.in_progress.remove(key);
        self.records.insert(key.to_string(), record.clone());
        record
    }

    fn fail(
        &mut self,
        decl: &Decl,
        at: usize,
        message: impl Into<String>,
        found: impl Into<String>,
        expected: impl Into<String>,
    ) {
        self.problems.push(Problem::new(decl.doc, at, message, found, expected));
    }

    fn vector(&mut self, decl: &Decl, field: &Field<Input<Vec<f64>>>, name: &str) -> Option<Vec<f64>> {
        match &field.value {
            Input::Literal(xs) => Some(xs.clone()),
            Input::Rows(_) => unreachable!("only matrices are read row by row"),
            Input::Ref(path) => match self.resolve(decl.doc, path) {
                Ok(node) => match node.as_vector() {
                    Some(v) => Some(v),
                    None => {
                        self.fail(
                            decl,
                            field.at,
                            format!("`{name}` refers to a value that is not a list of numbers"),
                            path.clone(),
                            "a path to a list, e.g. `other.weights`",
                        );
                        None
                    }
                },
                Err(expected) => {
                    self.fail(decl, field.at, format!("unknown reference `{path}`"), path.clone(), expected);
                    None
                }
            },
        }
    }

    fn matrix(
        &mut self,
        decl: &Decl,
        field: &Field<Input<Vec<Vec<f64>>>>,
        name: &str,
    ) -> Option<Vec<Vec<f64>>> {
        match &field.value {
            Input::Literal(rows) => Some(rows.clone()),
            Input::Rows(rows) => {
                let resolved: Vec<Vec<f64>> =
                    rows.iter().map(|row| self.vector(decl, row, name)).collect::<Option<_>>()?;
                if let Some((bad, message)) = unequal_rows(&resolved) {
                    let found = match &rows[bad].value {
                        Input::Ref(path) => format!("\"{path}\" = {:?}", resolved[bad]),
                        _ => format!("{:?}", resolved[bad]),
                    };
                    self.fail(
                        decl,
                        rows[bad].at,
                        format!("`{name}`: {message}"),
                        found,
                        "rows of equal length",
                    );
                    return None;
                }
                Some(resolved)
            }
            Input::Ref(path) => match self.resolve(decl.doc, path) {
                Ok(node) => match node.as_matrix() {
                    Some(m) => Some(m),
                    None => {
                        self.fail(
                            decl,
                            field.at,
                            format!("`{name}` refers to a value that is not a matrix"),
                            path.clone(),
                            "a path to rows of numbers, e.g. `other.values`",
                        );
                        None
                    }
                },
                Err(expected) => {
                    self.fail(decl, field.at, format!("unknown reference `{path}`"), path.clone(), expected);
                    None
                }
            },
        }
    }

    /// A labelled matrix named by reference (`x = "emb"`) is taken row by row, by position: were
    /// the example's `tokens` to list its labels in another order, each token would silently get
    /// another token's row. So a token that labels another row of the matrix is an error at the
    /// tokens' field; `false` when it was reported.
    fn rows_in_token_order(
        &mut self,
        decl: &Decl,
        (field, name): (&Field<Input<Vec<Vec<f64>>>>, &str),
        (tokens, tokens_name): (Option<&Field<Vec<String>>>, &str),
    ) -> bool {
        let (Input::Ref(path), Some(tokens)) = (&field.value, tokens) else { return true };
        let Ok(node) = self.resolve(decl.doc, path) else { return true };
        let labels = node.children();
        let moved = tokens.value.iter().enumerate().find_map(|(i, token)| {
            let j = labels.iter().position(|l| l == token).filter(|&j| j != i)?;
            Some((i, j, token))
        });
        let Some((i, j, token)) = moved else { return true };
        self.fail(
            decl,
            tokens.at,
            format!(
                "`{tokens_name}` puts `{token}` at row {} but `{name} = \"{path}\"` labels row {} `{token}`: its rows are taken by position, so each token would get another's row",
                i + 1,
                j + 1
            ),
            format!("{:?}", tokens.value),
            format!("the tokens in the order of `{path}`'s rows: {labels:?}"),
        );
        false
    }

    fn evaluate(&mut self, decl: &Decl) -> Option<Record> {
        match &decl.kind {
            DeclKind::Attention(a) => self.attention(decl, a),
            DeclKind::Softmax { scores: field } => {
                let scores = self.vector(decl, field, "scores")?;
                self.within(decl, field.at, scores.len(), MAX_ROWS, "scores")?;
                // A softmax is one attention row: one query of width 1 against keys holding the scores.
                let q = Array2::from_elem((1, 1), 1.0);
                let k = Array2::from_shape_vec((scores.len(), 1), scores.clone()).ok()?;
                let v = Array2::zeros((scores.len(), 1));
                let trace = self.engine(
                    decl,
                    qkv::trace_query(
                        q.view(),
                        k.view(),
                        v.view(),
                        0,
                        &qkv::AttentionOptions::new().scale(1.0),
                    ),
                )?;
                if let Some((i, x)) = first_non_finite(&trace.shifted) {
                    let message = format!(
                        "softmax `{}` overflows: score {} minus the largest one is {x}",
                        decl.id,
                        i + 1
                    );
                    self.fail(
                        decl,
                        field.at,
                        message,
                        String::new(),
                        "scores whose spread stays below about 1.8e308",
                    );
                    return None;
                }
                let node = Node::Map(vec![
                    ("scores", Node::vector(&trace.scores)),
                    ("max", Node::Number(trace.max.unwrap_or(f64::NAN))),
                    ("shifted", Node::vector(&trace.shifted)),
                    ("exp", Node::vector(&trace.exponentials)),
                    ("sum", Node::Number(trace.sum)),
                    ("weights", Node::vector(&trace.weights)),
                ]);
                Some(Record { computed: Computed::Softmax(trace), node })
            }
            DeclKind::Dot { q, k } => {
                let (q_at, k_at) = (q.at, k.at);
                let q = self.vector(decl, q, "q")?;
                let k = self.vector(decl, k, "k")?;
                self.within(decl, q_at, q.len(), MAX_WIDTH, "components")?;
                if q.len() != k.len() || q.is_empty() {
                    self.fail(
                        decl,
                        k_at.max(q_at),
                        format!("`q` has {} numbers but `k` has {}", q.len(), k.len()),
                        format!("{k:?}"),
                        "q and k of the same length",
                    );
                    return None;
                }
                let qa = Array2::from_shape_vec((1, q.len()), q.clone()).ok()?;
                let ka = Array2::from_shape_vec((1, k.len()), k.clone()).ok()?;
                let v = Array2::zeros((1, 1));
                let trace = self.engine(
                    decl,
                    qkv::trace_query(qa.view(), ka.view(), v.view(), 0, &qkv::AttentionOptions::new()),
                )?;
                if let Some((_, x)) = first_non_finite(&[trace.dot_products[0], trace.scores[0]]) {
                    let at = if largest(&q) >= largest(&k) { q_at } else { k_at };
                    let message = format!("dot product `{}` overflows: q·k is {x}", decl.id);
                    self.fail(
                        decl,
                        at,
                        message,
                        String::new(),
                        "q and k small enough that q·k stays below about 1.8e308",
                    );
                    return None;
                }
                let node = Node::Map(vec![
                    ("q", Node::vector(&q)),
                    ("k", Node::vector(&k)),
                    ("d_k", Node::Number(q.len() as f64)),
                    ("sqrt_d_k", Node::Number((q.len() as f64).sqrt())),
                    ("dot", Node::Number(trace.dot_products[0])),
                    ("scale", Node::Number(trace.scale)),
                    ("scaled", Node::Number(trace.scores[0])),
                ]);
                Some(Record { computed: Computed::Dot { q, k, trace }, node })
            }
            DeclKind::WeightedSum { weights, values } => {
                let at = values.at;
                let weights = self.vector(decl, weights, "weights")?;
                let values = self.vector(decl, values, "values")?;
                self.within(decl, at, values.len(), MAX_ROWS, "values")?;
                if weights.len() != values.len() {
                    self.fail(
                        decl,
                        at,
                        format!("`weights` has {} numbers but `values` has {}", weights.len(), values.len()),
                        format!("{values:?}"),
                        "one value per weight",
                    );
                    return None;
                }
                let terms: Vec<f64> = weights.iter().zip(&values).map(|(a, v)| a * v).collect();
                let output = terms.iter().sum();
                if let Some((_, x)) = first_non_finite(&[terms.as_slice(), &[output]].concat()) {
                    let message = format!("weighted sum `{}` overflows: it reaches {x}", decl.id);
                    self.fail(
                        decl,
                        at,
                        message,
                        String::new(),
                        "weights and values small enough that the sum stays below about 1.8e308",
                    );
                    return None;
                }
                let node = Node::Map(vec![
                    ("weights", Node::vector(&weights)),
                    ("values", Node::vector(&values)),
                    ("terms", Node::vector(&terms)),
                    ("output", Node::Number(output)),
                ]);
                Some(Record { computed: Computed::WeightedSum { weights, values, terms, output }, node })
            }
            DeclKind::Matrix { rows, labels } => self.matrix_block(decl, rows, labels.as_ref()),
            DeclKind::MultiHead(m) => self.multi_head(decl, m),
            DeclKind::Decode { example, prompt } => self.decode(decl, example, prompt),
            DeclKind::Tiled { example, query, block } => self.tiled(decl, example, query, block),
            DeclKind::Figure(f) => {
                // A `measurements` figure's numbers, for the prose to cite. A file that is missing
                // or does not read is the figure region's error, at its `data` field.
                let data =
                    f.data.as_ref().filter(|_| f.kind == crate::figure_kind::FigureKind::Measurements)?;
                let m = crate::measured::parse(&data.value, self.data.get(&data.value)?).ok()?;
                Some(Record { node: m.node(), computed: Computed::Measured })
            }
            DeclKind::Block(b) => self.block(decl, b),
            DeclKind::Gradient(g) => self.gradient(decl, g),
            DeclKind::Positions(p) => self.positions(decl, p),
            DeclKind::Page(_) | DeclKind::Claims { .. } => None,
        }
    }

    /// A problem for an example past [`limits::matrix`].
    fn too_large(&mut self, decl: &Decl, at: usize, message: String) {
        let expected = format!(
            "an example of at most {MAX_ROWS} rows of at most {MAX_WIDTH} numbers: small enough to follow by hand"
        );
        self.fail(decl, at, message, String::new(), expected);
    }

    /// `Some(())` when `count` is within `limit`; else a problem at `at`.
    fn within(&mut self, decl: &Decl, at: usize, count: usize, limit: usize, what: &str) -> Option<()> {
        match limits::at_most(count, limit, what, "a computation may have") {
            Ok(()) => Some(()),
            Err(message) => {
                let message = format!("`{}` has {message}", decl.id);
                self.fail(
                    decl,
                    at,
                    message,
                    String::new(),
                    "a computation small enough to read in worked steps",
                );
                None
            }
        }
    }

    fn engine<T>(&mut self, decl: &Decl, result: Result<T, qkv::AttentionError>) -> Option<T> {
        match result {
            Ok(t) => Some(t),
            Err(e) => {
                self.fail(
                    decl,
                    decl.start,
                    format!("the engine rejected example `{}`: {e}", decl.id),
                    format!("id = \"{}\"", decl.id),
                    "inputs of matching shapes",
                );
                None
            }
        }
    }

    fn attention(&mut self, decl: &Decl, a: &AttentionDecl) -> Option<Record> {
        let n = self.problems.len();
        let base = match &a.from {
            Some(from) => Some(self.example_of(decl, from)?.0),
            None => None,
        };
        let mut inputs = base.unwrap_or(AttentionInputs {
            tokens: None,
            query_tokens: None,
            queries: Vec::new(),
            keys: Vec::new(),
            values: Vec::new(),
            mask: None,
            limits: Limits::default(),
            scale: None,
            projection: None,
        });
        if let Some(t) = &a.tokens {
            inputs.tokens = Some(t.value.clone());
        }
        if let Some(t) = &a.query_tokens {
            inputs.query_tokens = Some(t.value.clone());
        }
        match self.project(decl, a, &mut inputs) {
            Ok(()) => {}
            Err(None) => return None,
            // The engine refused the projections, as the example expects: that is its result.
            Err(Some(error)) => {
                let result = Err(error);
                let node = attention_node(&inputs, &result);
                return Some(Record { computed: Computed::Attention { inputs, result }, node });
            }
        }
        for (field, name, slot) in [
            (&a.queries, "queries", &mut inputs.queries),
            (&a.keys, "keys", &mut inputs.keys),
            (&a.values, "values", &mut inputs.values),
        ] {
            if let Some(f) = field
                && let Some(m) = self.matrix(decl, f, name)
            {
                *slot = m;
            }
        }
        if let Some(m) = &a.mask {
            inputs.mask = Some(m.value.clone());
        }
        let limits = &a.limits;
        if let Some(f) = &limits.key_length {
            inputs.limits.key_length = Some(f.value);
        }
        if let Some(f) = &limits.key_padding {
            inputs.limits.key_padding = Some(f.value.clone());
        }
        if let Some(f) = &limits.window {
            inputs.limits.window = Some(f.value);
        }
        if let Some(f) = &limits.alibi {
            inputs.limits.alibi = Some(f.value);
        }
        if let Some(s) = &a.scale {
            inputs.scale = Some(ScoreScale::Given(s.value));
        }
        if let Some(t) = &a.temperature {
            if !(t.value > 0.0 && t.value.is_finite()) {
                self.fail(
                    decl,
                    t.at,
                    format!("`temperature` is {}: a temperature is a positive number", t.value),
                    String::new(),
                    "a positive number: below 1 sharpens the weights, above 1 flattens them",
                );
                return None;
            }
            inputs.scale = Some(ScoreScale::Temperature(t.value));
        }
        if self.problems.len() > n {
            return None;
        }
        // Limits first: nothing below needs to run on an example no lesson could show.
        for (name, rows) in [("queries", &inputs.queries), ("keys", &inputs.keys), ("values", &inputs.values)]
        {
            if let Err(message) = limits::matrix(rows, name) {
                let at = blame(decl, a, &[name, "x", "x_q", "x_kv", "w_q", "w_k", "w_v"]);
                self.too_large(decl, at, format!("example `{}` has {message}", decl.id));
                return None;
            }
        }
        let labelled = [
            (&a.query_tokens, "query_tokens", inputs.queries.len(), "queries", "query"),
            (&a.tokens, "tokens", inputs.keys.len(), "keys", "key"),
        ];
        for (field, name, rows, plural, row) in labelled {
            if let Some(tokens) = field
                && tokens.value.len() != rows
            {
                self.fail(
                    decl,
                    tokens.at,
                    format!("`{name}` names {} tokens but there are {rows} {plural}", tokens.value.len()),
                    format!("{:?}", tokens.value),
                    format!("one token name per {row} row"),
                );
                return None;
            }
        }
        if let Some(problem) = limit_problem(decl, a, &inputs) {
            self.problems.push(problem);
            return None;
        }
        let result = match (compute(&inputs), a.expect_error) {
            (Ok(r), false) => {
                if let Some(o) = overflow(&inputs, &r) {
                    // Blame the inputs, not the citation that would show the inf or NaN.
                    let q_max = largest(inputs.queries.iter().flatten());
                    let fields: &[&str] = match o.key {
                        None => &["values", "x", "x_kv", "w_v"],
                        Some(_) if q_max >= largest(inputs.keys.iter().flatten()) => {
                            &["queries", "keys", "x", "x_q", "x_kv", "w_q", "w_k", "scale", "temperature"]
                        }
                        Some(_) => {
                            &["keys", "queries", "x", "x_kv", "x_q", "w_k", "w_q", "scale", "temperature"]
                        }
                    };
                    let expected = match o.key {
                        None => {
                            "values small enough that each query's weighted sum of them stays below about 1.8e308"
                        }
                        Some(_) => {
                            "queries and keys small enough that every score, and the spread of each query's scores, stay below about 1.8e308"
                        }
                    };
                    let at = blame(decl, a, fields);
                    self.fail(
                        decl,
                        at,
                        format!("example `{}` overflows: {}", decl.id, o.what),
                        String::new(),
                        expected,
                    );
                    return None;
                }
                Ok(r)
            }
            (Err(e), true) => Err(e.to_string()),
            (Err(e), false) => {
                // Point at the field the engine names, when this block wrote it.
                let at = match &e {
                    qkv::AttentionError::KeyWidth { .. } => {
                        a.keys.as_ref().or(a.queries.as_ref()).map(|f| f.at)
                    }
                    qkv::AttentionError::ValueRows { .. } => a.values.as_ref().map(|f| f.at),
                    _ => None,
                };
                // An empty `found` is filled with the source line when the error is located.
                self.fail(
                    decl,
                    at.unwrap_or(decl.id_at),
                    format!("the engine rejected example `{}`: {e}", decl.id),
                    String::new(),
                    "queries and keys of equal width, one value row per key, or `expect_error = true` to show the error",
                );
                return None;
            }
            (Ok(_), true) => {
                self.fail(
                    decl,
                    decl.id_at,
                    format!(
                        "example `{}` has `expect_error = true` but the engine computed it without error",
                        decl.id
                    ),
                    format!("id = \"{}\"", decl.id),
                    "inputs the engine rejects, or no `expect_error`",
                );
                return None;
            }
        };
        let node = attention_node(&inputs, &result);
        Some(Record { computed: Computed::Attention { inputs, result }, node })
    }
}

impl Evaluator<'_> {
    /// The one finite number `path` names in document `doc`; the problem (placed at `at`) says
    /// what was expected.
    pub(crate) fn number(&mut self, doc: usize, path: &str, at: usize) -> Result<f64, Problem> {
        let node = self.resolve(doc, path).map_err(|expected| {
            Problem::new(doc, at, format!("unknown reference `{path}`"), path, expected)
        })?;
        node.as_number().filter(|x| x.is_finite()).ok_or_else(|| {
            Problem::new(
                doc,
                at,
                format!("`{path}` is not one finite number"),
                path,
                "`PATH`, a path down to one number, such as `quiz_softmax.weights.1`",
            )
        })
    }

    /// Both sides of `condition` (written in document `doc`), and whether it holds.
    pub(crate) fn compare(
        &mut self,
        doc: usize,
        condition: &Field<Condition>,
    ) -> Result<(bool, f64, f64), Problem> {
        let mut side = |operand: &Operand| match operand {
            Operand::Number(x) => Ok(*x),
            Operand::Path(p) => self.number(doc, p, condition.at),
        };
        let (a, b) = (side(&condition.value.left)?, side(&condition.value.right)?);
        Ok((condition.value.op.holds(a, b), a, b))
    }
}

impl Resolve for Evaluator<'_> {
    /// Resolves `path` to a node, evaluating what it needs. Errors say what was expected.
    fn resolve(&mut self, doc: usize, path: &str) -> Result<Node, String> {
        let target = self.target(doc, path)?;
        let Some(record) = self.record(&target.key) else {
            // The declaration's own error is reported; this reference adds nothing.
            return Err(String::new());
        };
        match record.node.lookup(&target.rest) {
            Ok(node) => Ok(node.clone()),
            Err(Miss { segment, known }) => {
                let prefix: Vec<&str> =
                    path.split('.').take(path.split('.').count() - target.rest.len() + segment).collect();
                if known.is_empty() {
                    Err(format!("`{}` is a single value; nothing below it", prefix.join(".")))
                } else {
                    Err(format!("after `{}`: one of {}", prefix.join("."), known.join(", ")))
                }
            }
        }
    }
}

impl Evaluator<'_> {
    /// Projects the embeddings of an attention block, if it has any, into `inputs`: `x` for
    /// self-attention, `x_q` and `x_kv` for cross-attention. `Err(None)` if that failed (a problem
    /// was recorded); `Err(Some(message))` if the engine refused them and the block expects an
    /// error.
    fn project(
        &mut self,
        decl: &Decl,
        a: &AttentionDecl,
        inputs: &mut AttentionInputs,
    ) -> Result<(), Option<String>> {
        let (x_q, x_kv, names) = match (&a.x, &a.x_q, &a.x_kv) {
            (Some(x), _, _) => (x, x, ["x", "x"]),
            (None, Some(x_q), Some(x_kv)) => (x_q, x_kv, ["x_q", "x_kv"]),
            _ => return Ok(()),
        };
        let ordered = if a.x.is_some() {
            self.rows_in_token_order(decl, (x_q, "x"), (a.tokens.as_ref(), "tokens"))
        } else {
            self.rows_in_token_order(decl, (x_q, "x_q"), (a.query_tokens.as_ref(), "query_tokens"))
                && self.rows_in_token_order(decl, (x_kv, "x_kv"), (a.tokens.as_ref(), "tokens"))
        };
        if !ordered {
            return Err(None);
        }
        let x_q = self.matrix(decl, x_q, names[0]);
        let x_kv = if a.x.is_some() { x_q.clone() } else { self.matrix(decl, x_kv, names[1]) };
        let ws: Vec<_> = [(&a.w_q, "w_q"), (&a.w_k, "w_k"), (&a.w_v, "w_v")]
            .into_iter()
            .map(|(w, name)| w.as_ref().and_then(|w| self.matrix(decl, w, name)))
            .collect();
        let (Some(x_q), Some(x_kv), [Some(w_q), Some(w_k), Some(w_v)]) = (x_q, x_kv, ws.as_slice()) else {
            return Err(None);
        };
        let matrices = [(names[0], &x_q), (names[1], &x_kv), ("w_q", w_q), ("w_k", w_k), ("w_v", w_v)];
        for (name, m) in matrices {
            if let Err(message) = limits::matrix(m, "rows") {
                self.too_large(
                    decl,
                    blame(decl, a, &[name]),
                    format!("`{name}` of `{}` has {message}", decl.id),
                );
                return Err(None);
            }
        }
        let projections = qkv::Projections { w_q: array(w_q), w_k: array(w_k), w_v: array(w_v), w_o: None };
        let projected = if a.x.is_some() {
            projections.project(array(&x_q).view())
        } else {
            projections.project_cross(array(&x_q).view(), array(&x_kv).view())
        };
        let projected = match projected {
            Ok(p) => p,
            Err(e) if a.expect_error => return Err(Some(e.to_string())),
            Err(e) => {
                let at = match &e {
                    qkv::AttentionError::ProjectionShape { argument, .. } => blame(decl, a, &[argument]),
                    _ => decl.start,
                };
                self.fail(
                    decl,
                    at,
                    format!("the engine rejected example `{}`: {e}", decl.id),
                    String::new(),
                    "projections whose rows match the width of the embeddings they multiply",
                );
                return Err(None);
            }
        };
        for (name, m, w) in [
            ("queries", &projected.queries, "w_q"),
            ("keys", &projected.keys, "w_k"),
            ("values", &projected.values, "w_v"),
        ] {
            if let Some(x) = m.iter().find(|x| !x.is_finite()) {
                let side = if name == "queries" { names[0] } else { names[1] };
                let at = blame(decl, a, &[side, w]);
                self.fail(
                    decl,
                    at,
                    format!(
                        "example `{}` overflows: projecting `{side}` with `{w}` gives {name} of {x}",
                        decl.id
                    ),
                    String::new(),
                    "embeddings and projections small enough that their products stay below about 1.8e308",
                );
                return Err(None);
            }
        }
        let rows = |m: &Array2<f64>| m.rows().into_iter().map(|r| r.to_vec()).collect::<Vec<_>>();
        inputs.projection = Some(Projection {
            x_kv: a.x.is_none().then(|| x_kv.clone()),
            x_q,
            w_q: w_q.clone(),
            w_k: w_k.clone(),
            w_v: w_v.clone(),
        });
        inputs.queries = rows(&projected.queries);
        inputs.keys = rows(&projected.keys);
        inputs.values = rows(&projected.values);
        Ok(())
    }
}

/// An example computed by the engine's f64 reference: scores, weights, output and the trace of
/// every query.
pub(crate) fn compute(inputs: &AttentionInputs) -> Result<AttentionResult, qkv::AttentionError> {
    let (q, k, v) = (array(&inputs.queries), array(&inputs.keys), array(&inputs.values));
    let masks = inputs.masks();
    let options = inputs.options(&masks);
    let full = qkv::reference::attention(q.view(), k.view(), v.view(), &options)?;
    let traces = (0..q.nrows())
        .map(|i| qkv::trace_query(q.view(), k.view(), v.view(), i, &options))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(AttentionResult {
        scores: full.scores.into_inner(),
        weights: full.weights.into_inner(),
        output: full.output,
        traces,
    })
}

/// A key limit that does not fit the example's keys, at the field that sets it (the engine would
/// name only its own argument).
fn limit_problem(decl: &Decl, a: &AttentionDecl, inputs: &AttentionInputs) -> Option<Problem> {
    let n_keys = inputs.keys.len();
    let at = |f: Option<usize>| f.or(a.from.as_ref().map(|f| f.at)).unwrap_or(decl.id_at);
    if let Some(length) = inputs.limits.key_length
        && length > n_keys
    {
        return Some(Problem::new(
            decl.doc,
            at(a.limits.key_length.as_ref().map(|f| f.at)),
            format!("`key_length = {length}` but example `{}` has {n_keys} keys", decl.id),
            format!("key_length = {length}"),
            format!("at most {n_keys}: how many of the keys are real, the rest being padding"),
        ));
    }
    if let Some(padding) = &inputs.limits.key_padding
        && padding.len() != n_keys
    {
        return Some(Problem::new(
            decl.doc,
            at(a.limits.key_padding.as_ref().map(|f| f.at)),
            format!("`key_padding` has {} flags but example `{}` has {n_keys} keys", padding.len(), decl.id),
            format!("{padding:?}"),
            "one `true` (padding) or `false` (a real key) per key",
        ));
    }
    inputs
        .limits
        .alibi
        .and_then(|slope| negative_slope(decl, at(a.limits.alibi.as_ref().map(|f| f.at)), slope))
}

/// A negative ALiBi slope, on an attention example or a head of a multi-head one (at `at`): the
/// engine would take it, and favour far keys over near ones.
fn negative_slope(decl: &Decl, at: usize, slope: f64) -> Option<Problem> {
    (slope < 0.0).then(|| {
        Problem::new(
            decl.doc,
            at,
            format!("an ALiBi slope of {slope} would favour far keys over near ones"),
            format!("alibi = {slope}"),
            "a slope of 0 or more, such as `0.5` (the paper's are 1/2, 1/4, … for 8 heads: 2^-1 … 2^-8)",
        )
    })
}

/// Where to point a problem of block `a`: the first of `fields` it writes, else its `from`,
/// else its id.
fn blame(decl: &Decl, a: &AttentionDecl, fields: &[&str]) -> usize {
    let matrix = |f: &Option<Field<Input<Vec<Vec<f64>>>>>| f.as_ref().map(|f| f.at);
    fields
        .iter()
        .find_map(|&name| match name {
            "queries" => matrix(&a.queries),
            "keys" => matrix(&a.keys),
            "values" => matrix(&a.values),
            "x" => matrix(&a.x),
            "x_q" => matrix(&a.x_q),
            "x_kv" => matrix(&a.x_kv),
            "w_q" => matrix(&a.w_q),
            "w_k" => matrix(&a.w_k),
            "w_v" => matrix(&a.w_v),
            "scale" => a.scale.as_ref().map(|f| f.at),
            "temperature" => a.temperature.as_ref().map(|f| f.at),
            _ => None,
        })
        .or(a.from.as_ref().map(|f| f.at))
        .unwrap_or(decl.id_at)
}

/// The first number of `xs` that is not finite, with its index.
fn first_non_finite(xs: &[f64]) -> Option<(usize, f64)> {
    xs.iter().copied().enumerate().find(|(_, x)| !x.is_finite())
}

/// The largest magnitude among some numbers.
fn largest<'a>(xs: impl IntoIterator<Item = &'a f64>) -> f64 {
    xs.into_iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// A number of an evaluated example that overflowed although every input is finite.
pub(crate) struct Overflow {
    /// What overflowed, as a phrase: "q·k for query `I` and key `love` is inf".
    pub what: String,
    /// The key involved, or `None` when the output overflowed.
    pub key: Option<usize>,
}

/// The first overflow in an example's traces: a dot product, a visible score or its distance
/// from the row's largest score (scores), or a weighted value or output (values).
pub(crate) fn overflow(inputs: &AttentionInputs, result: &AttentionResult) -> Option<Overflow> {
    let (ql, kl) = (inputs.query_labels(), inputs.key_labels());
    for (i, t) in result.traces.iter().enumerate() {
        for (j, key) in kl.iter().enumerate() {
            let stages = [
                ("q·k", t.dot_products[j], true),
                ("the scaled score", t.scores[j], t.kept[j]),
                ("the score minus the largest one", t.shifted[j], t.kept[j]),
            ];
            if let Some((stage, x, _)) = stages.into_iter().find(|&(_, x, visible)| visible && !x.is_finite())
            {
                let what = format!("{stage} for query `{}` and key `{key}` is {x}", ql[i]);
                return Some(Overflow { what, key: Some(j) });
            }
        }
        let terms = t.weighted_values.iter().flatten().chain(&t.output);
        if let Some(x) = terms.copied().find(|x| !x.is_finite()) {
            return Some(Overflow {
                what: format!("the output of query `{}` reaches {x}", ql[i]),
                key: None,
            });
        }
    }
    None
}

pub(crate) fn rows_node(labels: &[String], rows: &[Vec<f64>]) -> Node {
    Node::labelled(labels, rows.iter().map(|r| Node::vector(r)))
}

fn matrix_node(row_labels: &[String], col_labels: &[String], m: &Array2<f64>) -> Node {
    Node::labelled(
        row_labels,
        m.rows().into_iter().map(|r| Node::labelled(col_labels, r.iter().map(|&x| Node::Number(x)))),
    )
}

pub(crate) fn attention_node(inputs: &AttentionInputs, result: &Result<AttentionResult, String>) -> Node {
    let (ql, kl) = (inputs.query_labels(), inputs.key_labels());
    let d_k = inputs.queries.first().map_or(0, Vec::len) as f64;
    let mut fields = vec![
        ("tokens", Node::numbered(inputs.tokens.iter().flatten().map(|t| Node::Text(t.clone())))),
        ("queries", rows_node(&ql, &inputs.queries)),
        ("keys", rows_node(&kl, &inputs.keys)),
        ("values", rows_node(&kl, &inputs.values)),
        ("d_k", Node::Number(d_k)),
        ("sqrt_d_k", Node::Number(d_k.sqrt())),
    ];
    // Only cross-attention examples have them; listing them everywhere would only add noise.
    if let Some(q) = &inputs.query_tokens {
        fields.insert(1, ("query_tokens", Node::numbered(q.iter().map(|t| Node::Text(t.clone())))));
    }
    if let Some(p) = &inputs.projection {
        let numbered = |rows: &[Vec<f64>]| Node::numbered(rows.iter().map(|r| Node::vector(r)));
        match &p.x_kv {
            None => fields.push(("x", rows_node(&kl, &p.x_q))),
            Some(x_kv) => {
                fields.push(("x_q", rows_node(&ql, &p.x_q)));
                fields.push(("x_kv", rows_node(&kl, x_kv)));
            }
        }
        fields.extend([("w_q", numbered(&p.w_q)), ("w_k", numbered(&p.w_k)), ("w_v", numbered(&p.w_v))]);
    }
    match result {
        Err(e) => fields.push(("error", Node::Text(e.clone()))),
        Ok(r) => {
            let scale = r.traces.first().map_or(f64::NAN, |t| t.scale);
            fields.push(("scale", Node::Number(scale)));
            // The temperature as given, or the one a given scale amounts to: `1/(scale·√d_k)`.
            let temperature = match inputs.scale {
                None => 1.0,
                Some(ScoreScale::Temperature(t)) => t,
                Some(ScoreScale::Given(_)) => 1.0 / (scale * d_k.sqrt()),
            };
            fields.push(("temperature", Node::Number(temperature)));
            fields.push(("scores", matrix_node(&ql, &kl, &r.scores)));
            fields.push(("weights", matrix_node(&ql, &kl, &r.weights)));
            fields.push((
                "output",
                rows_node(&ql, &r.output.rows().into_iter().map(|x| x.to_vec()).collect::<Vec<_>>()),
            ));
            let per_query = ql.iter().zip(&r.traces).map(|(_, t)| {
                let mut fields = vec![
                    ("query", Node::vector(&t.query)),
                    ("dot", Node::labelled(&kl, t.dot_products.iter().map(|&x| Node::Number(x)))),
                ];
                // ALiBi's term: what a visible score holds beyond the scaled dot product.
                if inputs.limits.alibi.is_some() {
                    let bias = t.scores.iter().zip(&t.dot_products).zip(&t.kept);
                    let bias =
                        bias.map(|((s, d), &kept)| Node::Number(if kept { s - d * t.scale } else { 0.0 }));
                    fields.push(("bias", Node::labelled(&kl, bias)));
                }
                fields.extend([
                    ("scores", Node::labelled(&kl, t.scores.iter().map(|&x| Node::Number(x)))),
                    ("max", Node::Number(t.max.unwrap_or(f64::NAN))),
                    ("shifted", Node::labelled(&kl, t.shifted.iter().map(|&x| Node::Number(x)))),
                    ("exp", Node::labelled(&kl, t.exponentials.iter().map(|&x| Node::Number(x)))),
                    ("sum", Node::Number(t.sum)),
                    ("weights", Node::labelled(&kl, t.weights.iter().map(|&x| Node::Number(x)))),
                    ("terms", rows_node(&kl, &t.weighted_values)),
                    ("output", Node::vector(&t.output)),
                ]);
                Node::Map(fields)
            });
            // Per-query traces sit beside the fields, so `sentence.love.output` reads naturally;
            // a field name wins over a token of the same name.
            let mut items: Vec<(String, Node)> =
                fields.into_iter().map(|(k, n)| (k.to_string(), n)).collect();
            items.extend(ql.iter().cloned().zip(per_query));
            return Node::Record(items);
        }
    }
    Node::Record(fields.into_iter().map(|(k, n)| (k.to_string(), n)).collect())
}
