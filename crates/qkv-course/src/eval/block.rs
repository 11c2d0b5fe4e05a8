//! Transformer blocks (`qkv block`): a multi-head example's attention wrapped in residual
//! connections, layer norms and a feed-forward layer, in both orders: post-norm (Vaswani et al.
//! 2017, a norm after each residual sum) and pre-norm (a norm before each sublayer, the stream
//! itself never normalised).
//!
//! The attention is the engine's, through the multi-head evaluation: post-norm attends over the
//! example's own `x`, pre-norm over its layer norm. The engine has no layer norm and no
//! feed-forward layer, so these are computed here in plain f64 (checked in the tests against an
//! independent computation, and in the end-to-end tests against NumPy).

use super::{Computed, Evaluator, MultiHeadResult, Record, rows_node};
use crate::examples::{BlockDecl, DEFAULT_EPS, Decl, DeclKind, Field, HeadKv, Input};
use crate::limits;
use crate::values::Node;

type Matrix = Vec<Vec<f64>>;

/// Where the layer norms sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Before each sublayer, inside the residual branch: `x + f(LN(x))`.
    Pre,
    /// After each residual sum: `LN(x + f(x))`, as in the original Transformer.
    Post,
}

impl Order {
    /// Both orders, as the record lists them.
    pub(crate) const ALL: [Order; 2] = [Order::Pre, Order::Post];

    /// The name in paths (`block.pre.love`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Order::Pre => "pre",
            Order::Post => "post",
        }
    }

    /// The order a path segment names.
    pub(crate) fn from_name(name: &str) -> Option<Order> {
        Order::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// One layer norm of one row: `(x - mean) / sqrt(variance + eps)`, its scale 1 and shift 0.
#[derive(Debug, Clone)]
pub(crate) struct NormRow {
    pub input: Vec<f64>,
    pub mean: f64,
    /// The mean squared distance from the mean (divided by `d`, not `d - 1`, as PyTorch does).
    pub variance: f64,
    /// `sqrt(variance + eps)`.
    pub std: f64,
    pub output: Vec<f64>,
}

impl NormRow {
    fn new(input: &[f64], eps: f64) -> Self {
        let d = input.len() as f64;
        let mean = input.iter().sum::<f64>() / d;
        let variance = input.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / d;
        let std = (variance + eps).sqrt();
        let output = input.iter().map(|x| (x - mean) / std).collect();
        NormRow { input: input.to_vec(), mean, variance, std, output }
    }

    fn node(&self) -> Node {
        Node::Map(vec![
            ("mean", Node::Number(self.mean)),
            ("variance", Node::Number(self.variance)),
            ("std", Node::Number(self.std)),
            ("output", Node::vector(&self.output)),
        ])
    }
}

/// One token through one order of the block. Both orders have the same stages; only the wiring
/// differs (see [`BlockResult::pass`]).
#[derive(Debug, Clone)]
pub(crate) struct TokenPass {
    pub x: Vec<f64>,
    /// Pre-norm: the norm of `x`. Post-norm: the norm of `residual1`.
    pub norm1: NormRow,
    /// The multi-head output for this token.
    pub attention: Vec<f64>,
    /// `x + attention`.
    pub residual1: Vec<f64>,
    /// Pre-norm: the norm of `residual1`. Post-norm: the norm of `residual2`.
    pub norm2: NormRow,
    /// `h W_1 + b_1`, where `h` is what enters the feed-forward layer.
    pub hidden: Vec<f64>,
    /// `max(hidden, 0)`.
    pub relu: Vec<f64>,
    /// `relu W_2 + b_2`.
    pub ffn: Vec<f64>,
    /// Pre-norm: `residual1 + ffn`. Post-norm: `norm1 + ffn`.
    pub residual2: Vec<f64>,
    /// Pre-norm: `residual2`. Post-norm: the norm of `residual2`.
    pub output: Vec<f64>,
}

/// One stage of a token's pass, as tables, steps and the widget show it.
pub(crate) struct Stage<'a> {
    /// Its name in paths (`residual1`).
    pub name: &'static str,
    /// What it is, in TeX (`x + \operatorname{MHA}`).
    pub formula: &'static str,
    pub vector: &'a [f64],
}

impl TokenPass {
    /// The stages in the order the token meets them.
    pub(crate) fn stages(&self, order: Order) -> Vec<Stage<'_>> {
        match order {
            Order::Pre => vec![
                Stage { name: "x", formula: r"x", vector: &self.x },
                Stage { name: "norm1", formula: r"n_1 = \operatorname{LN}(x)", vector: &self.norm1.output },
                Stage { name: "attention", formula: r"a = \operatorname{MHA}(n_1)", vector: &self.attention },
                Stage { name: "residual1", formula: r"h = x + a", vector: &self.residual1 },
                Stage { name: "norm2", formula: r"n_2 = \operatorname{LN}(h)", vector: &self.norm2.output },
                Stage { name: "hidden", formula: r"u = n_2 W_1 + b_1", vector: &self.hidden },
                Stage { name: "relu", formula: r"r = \max(u, 0)", vector: &self.relu },
                Stage { name: "ffn", formula: r"f = r W_2 + b_2", vector: &self.ffn },
                Stage { name: "output", formula: r"y = h + f", vector: &self.output },
            ],
            Order::Post => vec![
                Stage { name: "x", formula: r"x", vector: &self.x },
                Stage { name: "attention", formula: r"a = \operatorname{MHA}(x)", vector: &self.attention },
                Stage { name: "residual1", formula: r"x + a", vector: &self.residual1 },
                Stage { name: "norm1", formula: r"h = \operatorname{LN}(x + a)", vector: &self.norm1.output },
                Stage { name: "hidden", formula: r"u = h W_1 + b_1", vector: &self.hidden },
                Stage { name: "relu", formula: r"r = \max(u, 0)", vector: &self.relu },
                Stage { name: "ffn", formula: r"f = r W_2 + b_2", vector: &self.ffn },
                Stage { name: "residual2", formula: r"h + f", vector: &self.residual2 },
                Stage { name: "output", formula: r"y = \operatorname{LN}(h + f)", vector: &self.output },
            ],
        }
    }

    fn node(&self, order: Order) -> Node {
        let mut fields = Vec::new();
        for stage in self.stages(order) {
            let node = match stage.name {
                "norm1" => self.norm1.node(),
                "output" if order == Order::Post => {
                    fields.push(("norm2", self.norm2.node()));
                    Node::vector(stage.vector)
                }
                "norm2" => self.norm2.node(),
                _ => Node::vector(stage.vector),
            };
            fields.push((stage.name, node));
        }
        // Each stage's length, `|v|`: what the layer norms reset and the stream accumulates.
        let lengths =
            self.stages(order).into_iter().map(|s| (s.name, Node::Number(length(s.vector)))).collect();
        fields.push(("lengths", Node::Map(lengths)));
        Node::Map(fields)
    }
}

/// Where a block's parameters go, and the floating-point operations of one token's pass over
/// the example's tokens (matrix products only, a multiply-add counted as 2).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Costs {
    /// `W_q`, `W_k`, `W_v` of every head (shared key/value heads once) and `W_o`.
    pub attention_params: f64,
    /// `W_1`, `b_1`, `W_2`, `b_2`.
    pub ffn_params: f64,
    /// Each layer norm's scale and shift, `2 d` a norm.
    pub norm_params: f64,
    /// Each weight of the projections and `W_o` used once: `2 ×` their count.
    pub projection_flops: f64,
    /// Scores and weighted values over `n` keys: `2 n (d_k + d_v)` per head.
    pub score_flops: f64,
    /// Each weight of `W_1` and `W_2` used once.
    pub ffn_flops: f64,
}

/// What a block computed.
#[derive(Debug, Clone)]
pub(crate) struct BlockResult {
    pub tokens: Vec<String>,
    pub x: Matrix,
    pub eps: f64,
    pub w_1: Matrix,
    pub b_1: Vec<f64>,
    pub w_2: Matrix,
    pub b_2: Vec<f64>,
    /// Per order (pre, post): the multi-head attention it ran and each token's pass.
    pub orders: Vec<(Order, MultiHeadResult, Vec<TokenPass>)>,
    pub costs: Costs,
}

impl BlockResult {
    /// The attention and the passes of one order.
    pub(crate) fn order(&self, order: Order) -> (&MultiHeadResult, &[TokenPass]) {
        let (_, m, passes) = self.orders.iter().find(|(o, _, _)| *o == order).expect("both orders");
        (m, passes)
    }

    /// The feed-forward layer on one row: its hidden layer, after ReLU, and its output.
    fn feed_forward(&self, h: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let hidden = affine(h, &self.w_1, &self.b_1);
        let relu: Vec<f64> = hidden.iter().map(|&u| u.max(0.0)).collect();
        let ffn = affine(&relu, &self.w_2, &self.b_2);
        (hidden, relu, ffn)
    }

    /// One token's pass, given its input and its attention output (attention mixes tokens; all
    /// the rest is per token).
    fn pass(&self, order: Order, x: &[f64], attention: &[f64]) -> TokenPass {
        let residual1 = add(x, attention);
        // The wiring is all that differs: where each norm reads, and what the second sum adds.
        let (norm1, norm2, hidden, relu, ffn, residual2, output) = match order {
            Order::Pre => {
                let norm1 = NormRow::new(x, self.eps);
                let norm2 = NormRow::new(&residual1, self.eps);
                let (hidden, relu, ffn) = self.feed_forward(&norm2.output);
                let residual2 = add(&residual1, &ffn);
                let output = residual2.clone();
                (norm1, norm2, hidden, relu, ffn, residual2, output)
            }
            Order::Post => {
                let norm1 = NormRow::new(&residual1, self.eps);
                let (hidden, relu, ffn) = self.feed_forward(&norm1.output);
                let residual2 = add(&norm1.output, &ffn);
                let norm2 = NormRow::new(&residual2, self.eps);
                let output = norm2.output.clone();
                (norm1, norm2, hidden, relu, ffn, residual2, output)
            }
        };
        TokenPass {
            x: x.to_vec(),
            norm1,
            attention: attention.to_vec(),
            residual1,
            norm2,
            hidden,
            relu,
            ffn,
            residual2,
            output,
        }
    }
}

/// `v W + b`.
fn affine(v: &[f64], w: &Matrix, b: &[f64]) -> Vec<f64> {
    (0..b.len()).map(|c| b[c] + v.iter().zip(w).map(|(x, row)| x * row[c]).sum::<f64>()).collect()
}

/// The Euclidean length of a vector.
pub(crate) fn length(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

impl Evaluator<'_> {
    /// A `qkv block` block.
    pub(super) fn block(&mut self, decl: &Decl, b: &BlockDecl) -> Option<Record> {
        let attention = &b.attention;
        let fail_attention = |this: &mut Self, message: String| {
            this.fail(
                decl,
                attention.at,
                message,
                attention.value.clone(),
                "the id of a `qkv multi-head` example: its `x` enters the block",
            );
        };
        let target = match self.target(decl.doc, &attention.value) {
            Ok(t) if t.rest.is_empty() => t,
            Ok(_) => {
                fail_attention(self, format!("`{}` names a value, not an example", attention.value));
                return None;
            }
            Err(expected) => {
                self.fail(
                    decl,
                    attention.at,
                    format!("unknown reference `{}`", attention.value),
                    attention.value.clone(),
                    expected,
                );
                return None;
            }
        };
        let head_decl = *self.decls.get(&target.key)?;
        let DeclKind::MultiHead(m) = &head_decl.kind else {
            fail_attention(self, format!("`{}` is not a multi-head example", attention.value));
            return None;
        };
        let post_record = self.record(&target.key)?;
        let Computed::MultiHead(post) = post_record.computed else {
            return None;
        };
        // The attention nodes of the orders, pre first: post-norm's is the example's own.
        let mut nodes = Vec::new();
        let x = post.x.clone();
        let d = x.first().map_or(0, Vec::len);
        let w_1 = self.matrix(decl, &b.w_1, "w_1")?;
        let w_2 = self.matrix(decl, &b.w_2, "w_2")?;
        let d_ff = w_1.first().map_or(0, Vec::len);
        let b_1 = self.bias(decl, b.b_1.as_ref(), "b_1", d_ff)?;
        let b_2 = self.bias(decl, b.b_2.as_ref(), "b_2", d)?;
        for (name, field, rows) in [("w_1", &b.w_1, &w_1), ("w_2", &b.w_2, &w_2)] {
            if let Err(message) = limits::matrix(rows, "rows") {
                self.too_large(decl, field.at, format!("`{name}` of `{}` has {message}", decl.id));
                return None;
            }
        }
        let width = post.output.first().map_or(0, Vec::len);
        let shapes = [
            (&b.w_1, w_1.len(), d, "w_1", "rows as the embeddings are wide"),
            (&b.w_2, w_2.len(), d_ff, "w_2", "rows as `w_1` has columns"),
            (&b.w_2, w_2.first().map_or(0, Vec::len), d, "w_2", "columns as the embeddings are wide"),
            (&b.w_1, width, d, "w_1", "`W_o` columns as the embeddings are wide (the residual adds them)"),
        ];
        for (field, found, wanted, name, what) in shapes {
            if found != wanted || wanted == 0 {
                self.fail(
                    decl,
                    field.at,
                    format!("`{name}` of `{}` does not fit: {found} where the block needs {wanted}", decl.id),
                    String::new(),
                    format!("as many {what} ({wanted})"),
                );
                return None;
            }
        }
        let eps = b.eps.as_ref().map_or(DEFAULT_EPS, |e| e.value);
        let costs = costs(m, &post, &w_1, &w_2, d);
        let mut result = BlockResult {
            tokens: post.tokens.clone(),
            x: x.clone(),
            eps,
            w_1,
            b_1,
            w_2,
            b_2,
            orders: Vec::new(),
            costs,
        };
        for order in Order::ALL {
            let attended = match order {
                Order::Post => {
                    nodes.push(post_record.node.clone());
                    (*post).clone()
                }
                Order::Pre => {
                    let normed: Matrix = x.iter().map(|row| NormRow::new(row, eps).output).collect();
                    let record = self.multi_head_on(head_decl, m, normed)?;
                    let Computed::MultiHead(attended) = record.computed else { return None };
                    nodes.push(record.node);
                    *attended
                }
            };
            let passes: Vec<TokenPass> =
                x.iter().zip(&attended.output).map(|(x, a)| result.pass(order, x, a)).collect();
            if let Some(bad) = passes.iter().flat_map(|p| &p.output).find(|y| !y.is_finite()) {
                self.fail(
                    decl,
                    b.w_2.at,
                    format!("the {}-norm output of `{}` overflows: it reaches {bad}", order.name(), decl.id),
                    String::new(),
                    "feed-forward weights small enough that the output stays below about 1.8e308",
                );
                return None;
            }
            result.orders.push((order, attended, passes));
        }
        let node = block_node(&result, nodes);
        Some(Record { computed: Computed::Block(Box::new(result)), node })
    }

    /// A bias of `n` numbers, zeros when the block has none.
    fn bias(
        &mut self,
        decl: &Decl,
        field: Option<&Field<Input<Vec<f64>>>>,
        name: &str,
        n: usize,
    ) -> Option<Vec<f64>> {
        let Some(field) = field else { return Some(vec![0.0; n]) };
        let b = self.vector(decl, field, name)?;
        if b.len() != n {
            self.fail(
                decl,
                field.at,
                format!("`{name}` of `{}` has {} numbers where the block needs {n}", decl.id, b.len()),
                format!("{b:?}"),
                format!("one number per column of its weight matrix ({n})"),
            );
            return None;
        }
        Some(b)
    }
}

/// What a block's parameters and one token's pass cost.
fn costs(
    m: &crate::examples::MultiHeadDecl,
    mh: &MultiHeadResult,
    w_1: &Matrix,
    w_2: &Matrix,
    d: usize,
) -> Costs {
    let size = |a: &Matrix| (a.len() * a.first().map_or(0, Vec::len)) as f64;
    let mut attention_params = size(&mh.w_o);
    let mut counted_kv = Vec::new();
    let n = mh.tokens.len() as f64;
    let mut score_flops = 0.0;
    for (head, (_, inputs, _)) in m.heads.iter().zip(&mh.heads) {
        let Some(p) = &inputs.projection else { continue };
        attention_params += size(&p.w_q);
        // A key/value head that several query heads share is one set of weights.
        let kv = match &head.kv {
            HeadKv::Own { .. } => None,
            HeadKv::Shared(k) => Some(k.value),
        };
        if kv.is_none() || !counted_kv.contains(&kv) {
            attention_params += size(&p.w_k) + size(&p.w_v);
            counted_kv.push(kv);
        }
        let (d_k, d_v) = (p.w_q.first().map_or(0, Vec::len), p.w_v.first().map_or(0, Vec::len));
        score_flops += 2.0 * n * (d_k + d_v) as f64;
    }
    let ffn_weights = size(w_1) + size(w_2);
    let ffn_biases = (w_1.first().map_or(0, Vec::len) + d) as f64;
    Costs {
        attention_params,
        ffn_params: ffn_weights + ffn_biases,
        norm_params: (2 * 2 * d) as f64,
        projection_flops: 2.0 * attention_params,
        score_flops,
        ffn_flops: 2.0 * ffn_weights,
    }
}

/// The record: inputs, both orders' attention and passes, and the costs.
/// `attention` holds each order's multi-head record, in the order of `b.orders`.
fn block_node(b: &BlockResult, attention: Vec<Node>) -> Node {
    let c = &b.costs;
    let numbered = |rows: &Matrix| Node::numbered(rows.iter().map(|r| Node::vector(r)));
    let mut entries: Vec<(String, Node)> = vec![
        ("tokens".into(), Node::numbered(b.tokens.iter().map(|t| Node::Text(t.clone())))),
        ("x".into(), rows_node(&b.tokens, &b.x)),
        ("d_model".into(), Node::Number(b.x.first().map_or(0, Vec::len) as f64)),
        ("d_ff".into(), Node::Number(b.b_1.len() as f64)),
        ("eps".into(), Node::Number(b.eps)),
        ("w_1".into(), numbered(&b.w_1)),
        ("b_1".into(), Node::vector(&b.b_1)),
        ("w_2".into(), numbered(&b.w_2)),
        ("b_2".into(), Node::vector(&b.b_2)),
    ];
    let attn = b.orders.iter().zip(attention).map(|((o, _, _), node)| (o.name().to_string(), node)).collect();
    entries.push(("attn".into(), Node::Record(attn)));
    for (order, _, passes) in &b.orders {
        let tokens = b.tokens.iter().cloned().zip(passes.iter().map(|p| p.node(*order))).collect();
        entries.push((order.name().into(), Node::Record(tokens)));
    }
    let params = c.attention_params + c.ffn_params + c.norm_params;
    entries.push((
        "params".into(),
        Node::Map(vec![
            ("attention", Node::Number(c.attention_params)),
            ("ffn", Node::Number(c.ffn_params)),
            ("norms", Node::Number(c.norm_params)),
            ("total", Node::Number(params)),
        ]),
    ));
    entries.push((
        "flops".into(),
        Node::Map(vec![
            ("projections", Node::Number(c.projection_flops)),
            ("scores", Node::Number(c.score_flops)),
            ("ffn", Node::Number(c.ffn_flops)),
            ("total", Node::Number(c.projection_flops + c.score_flops + c.ffn_flops)),
        ]),
    ));
    Node::Record(entries)
}
