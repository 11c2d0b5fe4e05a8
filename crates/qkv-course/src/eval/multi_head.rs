//! Named matrices and multi-head examples: each head projected from one `x` with its own `W_q`
//! (and its own or a shared `W_k`, `W_v`), computed as an attention example by the engine's f64
//! reference, the heads' outputs side by side, then `W_o`.

use ndarray::Array2;

use super::{
    AttentionInputs, AttentionResult, Computed, Evaluator, MultiHeadResult, Projection, Record, ScoreScale,
    array, attention_node, compute, labels, negative_slope, overflow, rows_node,
};
use crate::examples::{Decl, Field, HeadKv, Input, Limits, MultiHeadDecl};
use crate::limits;
use crate::values::Node;

type Matrix = Vec<Vec<f64>>;

impl Evaluator<'_> {
    /// A `qkv matrix` block: its rows, labelled.
    pub(super) fn matrix_block(
        &mut self,
        decl: &Decl,
        rows: &Field<Input<Matrix>>,
        row_labels: Option<&Field<Vec<String>>>,
    ) -> Option<Record> {
        let m = self.matrix(decl, rows, "rows")?;
        if let Err(message) = limits::matrix(&m, "rows") {
            self.too_large(decl, rows.at, format!("matrix `{}` has {message}", decl.id));
            return None;
        }
        if let Some(l) = row_labels
            && l.value.len() != m.len()
        {
            self.fail(
                decl,
                l.at,
                format!("`labels` names {} rows but matrix `{}` has {}", l.value.len(), decl.id, m.len()),
                format!("{:?}", l.value),
                "one label per row",
            );
            return None;
        }
        let labels = labels(&row_labels.map(|l| l.value.clone()), m.len());
        let node = rows_node(&labels, &m);
        Some(Record { computed: Computed::Matrix { labels, rows: m }, node })
    }

    /// A `qkv multi-head` block.
    pub(super) fn multi_head(&mut self, decl: &Decl, m: &MultiHeadDecl) -> Option<Record> {
        if !self.rows_in_token_order(decl, (&m.x, "x"), (m.tokens.as_ref(), "tokens")) {
            return None;
        }
        let x = self.matrix(decl, &m.x, "x")?;
        self.multi_head_on(decl, m, x)
    }

    /// A multi-head example's heads and `W_o` on embeddings `x` (its own `x`, or what a
    /// Transformer block feeds it: their layer norm).
    pub(super) fn multi_head_on(&mut self, decl: &Decl, m: &MultiHeadDecl, x: Matrix) -> Option<Record> {
        let w_o = self.matrix(decl, &m.w_o, "w_o")?;
        for (name, field, rows) in [("x", &m.x, &x), ("w_o", &m.w_o, &w_o)] {
            if let Err(message) = limits::matrix(rows, "rows") {
                self.too_large(decl, field.at, format!("`{name}` of `{}` has {message}", decl.id));
                return None;
            }
        }
        if let Some(t) = &m.tokens
            && t.value.len() != x.len()
        {
            self.fail(
                decl,
                t.at,
                format!("`tokens` names {} tokens but `x` has {} rows", t.value.len(), x.len()),
                format!("{:?}", t.value),
                "one token name per row of `x`",
            );
            return None;
        }
        let tokens = labels(&m.tokens.as_ref().map(|t| t.value.clone()), x.len());
        let kv: Vec<(Matrix, Matrix)> = m
            .kv_heads
            .iter()
            .map(|h| Some((self.matrix(decl, &h.w_k, "w_k")?, self.matrix(decl, &h.w_v, "w_v")?)))
            .collect::<Option<_>>()?;
        let mut heads = Vec::new();
        let mut kv_of = Vec::new();
        for (h, head) in m.heads.iter().enumerate() {
            if let Some(p) = head.alibi.as_ref().and_then(|f| negative_slope(decl, f.at, f.value)) {
                self.problems.push(p);
                return None;
            }
            let w_q = self.matrix(decl, &head.w_q, "w_q")?;
            let ((w_k, w_v), shared) = match &head.kv {
                HeadKv::Own { w_k, w_v } => {
                    ((self.matrix(decl, w_k, "w_k")?, self.matrix(decl, w_v, "w_v")?), h)
                }
                HeadKv::Shared(k) => (kv[k.value].clone(), k.value),
            };
            kv_of.push(shared);
            let projections =
                qkv::Projections { w_q: array(&w_q), w_k: array(&w_k), w_v: array(&w_v), w_o: None };
            let projected = match projections.project(array(&x).view()) {
                Ok(p) => p,
                Err(e) => {
                    let at = match &e {
                        qkv::AttentionError::ProjectionShape { argument: "w_q", .. } => head.w_q.at,
                        _ => head.at,
                    };
                    self.fail(
                        decl,
                        at,
                        format!("the engine rejected head `{}` of `{}`: {e}", head.name, decl.id),
                        String::new(),
                        "projections whose rows match the width of `x`, and `w_k` as wide as `w_q`",
                    );
                    return None;
                }
            };
            let rows = |a: &Array2<f64>| a.rows().into_iter().map(|r| r.to_vec()).collect::<Vec<_>>();
            let inputs = AttentionInputs {
                tokens: Some(tokens.clone()),
                query_tokens: None,
                queries: rows(&projected.queries),
                keys: rows(&projected.keys),
                values: rows(&projected.values),
                mask: m.mask.as_ref().map(|f| f.value.clone()),
                limits: Limits {
                    key_length: m.limits.key_length.as_ref().map(|f| f.value),
                    key_padding: m.limits.key_padding.as_ref().map(|f| f.value.clone()),
                    window: m.limits.window.as_ref().map(|f| f.value),
                    alibi: head.alibi.as_ref().map(|f| f.value),
                },
                scale: m.scale.as_ref().map(|f| ScoreScale::Given(f.value)),
                projection: Some(Projection { x_q: x.clone(), x_kv: None, w_q, w_k, w_v }),
            };
            let result = match compute(&inputs) {
                Ok(r) => r,
                Err(e) => {
                    self.fail(
                        decl,
                        head.at,
                        format!("the engine rejected head `{}` of `{}`: {e}", head.name, decl.id),
                        String::new(),
                        "a mask and key limits that fit the tokens",
                    );
                    return None;
                }
            };
            if let Some(o) = overflow(&inputs, &result) {
                self.fail(
                    decl,
                    head.at,
                    format!("head `{}` of `{}` overflows: {}", head.name, decl.id, o.what),
                    String::new(),
                    "embeddings and projections small enough that every score stays below about 1.8e308",
                );
                return None;
            }
            heads.push((head.name.clone(), inputs, result));
        }
        // The heads' outputs side by side, one row per token, then W_o.
        let concat = concatenate(&heads, x.len(), &vec![true; heads.len()]);
        let width = concat.first().map_or(0, Vec::len);
        if w_o.len() != width {
            self.fail(
                decl,
                m.w_o.at,
                format!("`w_o` has {} rows but the heads' outputs side by side are {width} wide", w_o.len()),
                String::new(),
                format!("a `w_o` of {width} rows: the sum of the heads' value widths"),
            );
            return None;
        }
        let output = times(&concat, &w_o);
        if let Some(bad) = output.iter().flatten().find(|y| !y.is_finite()) {
            self.fail(
                decl,
                m.w_o.at,
                format!("the output of `{}` overflows: it reaches {bad}", decl.id),
                String::new(),
                "a `w_o` small enough that the output stays below about 1.8e308",
            );
            return None;
        }
        let head_nodes = heads
            .iter()
            .zip(&kv_of)
            .map(|((name, inputs, result), &kv)| {
                let mut node = attention_node(inputs, &Ok(result.clone()));
                // Which key/value head it reads, counted from 1: shared ones show who shares.
                if let Node::Record(entries) = &mut node {
                    entries.insert(0, ("kv_head".into(), Node::Number((kv + 1) as f64)));
                }
                (name.clone(), node)
            })
            .collect();
        let numbered = |rows: &[Vec<f64>]| Node::numbered(rows.iter().map(|r| Node::vector(r)));
        let node = Node::Record(vec![
            ("tokens".into(), Node::numbered(tokens.iter().map(|t| Node::Text(t.clone())))),
            ("x".into(), rows_node(&tokens, &x)),
            ("heads".into(), Node::Record(head_nodes)),
            ("concat".into(), rows_node(&tokens, &concat)),
            ("w_o".into(), numbered(&w_o)),
            ("output".into(), rows_node(&tokens, &output)),
        ]);
        let result = MultiHeadResult { tokens, x, heads, concat, w_o, output };
        Some(Record { computed: Computed::MultiHead(Box::new(result)), node })
    }
}

impl MultiHeadResult {
    /// The output when only the heads that `on` marks (one flag per head, in order) reach `W_o`:
    /// the others' outputs are zeros in the concatenation. With every head on it is `output`.
    pub(crate) fn output_with(&self, on: &[bool]) -> Matrix {
        times(&concatenate(&self.heads, self.tokens.len(), on), &self.w_o)
    }
}

/// The heads' outputs side by side, one row per token (of `n`); a head that `on` marks off
/// contributes zeros.
fn concatenate(heads: &[(String, AttentionInputs, AttentionResult)], n: usize, on: &[bool]) -> Matrix {
    (0..n)
        .map(|i| {
            heads
                .iter()
                .zip(on)
                .flat_map(|((_, _, r), &on)| {
                    r.output.row(i).iter().map(move |&y| if on { y } else { 0.0 }).collect::<Vec<_>>()
                })
                .collect()
        })
        .collect()
}

/// `a · b`, row by row.
fn times(a: &Matrix, b: &Matrix) -> Matrix {
    array(a).dot(&array(b)).rows().into_iter().map(|r| r.to_vec()).collect()
}
