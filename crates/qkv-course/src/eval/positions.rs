//! Positions (`qkv positions`): an attention example with its tokens at positions `0, 1, …`,
//! two ways. Rotary position embeddings (RoPE, Su et al. 2021) rotate each pair of a query's and
//! a key's components by the position times the pair's angle `θ_i = base^(-2i/d)`; sinusoidal
//! encodings (Vaswani et al. 2017) add `sin` and `cos` of the same angles to them. Attention over
//! the results is the engine's f64 reference. A sweep moves one query along the positions with
//! its key a fixed distance behind, and records each score.
//!
//! The engine has no rotary path yet, so [`rotate`] is the course's own f64 computation, the one
//! place to switch to the engine's once it lands (the tests check it against an independent
//! complex-number rotation and NumPy).

use super::{AttentionInputs, AttentionResult, Computed, Evaluator, Record, attention_node, compute};
use crate::examples::{Decl, PositionsDecl};
use crate::values::Node;

/// The papers' base for the angles.
const DEFAULT_BASE: f64 = 10000.0;

/// The angle of pair `i` of `d` components: `base^(-2i/d)`.
pub(crate) fn angle(i: usize, d: usize, base: f64) -> f64 {
    base.powf(-2.0 * i as f64 / d as f64)
}

/// `x` rotated for `position` by the engine's rotary embedding (`qkv::Rotary`, GPT-J's
/// interleaved pairs: each `(x_2i, x_2i+1)` turned by `position · θ_i`), through its f64
/// reference, as the course takes every number.
pub(crate) fn rotate(x: &[f64], position: usize, base: f64) -> Vec<f64> {
    let row = ndarray::ArrayView2::from_shape((1, x.len()), x).expect("one row of the vector's length");
    qkv::reference::rotate(row, &qkv::Rotary::new(base).interleaved(), position).into_raw_vec_and_offset().0
}

/// The sinusoidal encoding of `position` in `d` components: `sin` and `cos` of `position · θ_i`.
pub(crate) fn sinusoid(position: f64, d: usize, base: f64) -> Vec<f64> {
    (0..d / 2)
        .flat_map(|i| {
            let (sin, cos) = (position * angle(i, d, base)).sin_cos();
            [sin, cos]
        })
        .collect()
}

/// One position of the sweep.
#[derive(Debug, Clone)]
pub(crate) struct SweepPoint {
    pub query_position: usize,
    pub key_position: usize,
    pub rope_query: Vec<f64>,
    pub rope_key: Vec<f64>,
    /// The scaled score after rotating both: the same at every point of a sweep.
    pub rope_score: f64,
    /// The scaled score with the encodings added: it changes along the sweep.
    pub sinusoid_score: f64,
}

/// What a positions block computed.
#[derive(Debug, Clone)]
pub(crate) struct PositionsResult {
    pub base: f64,
    /// The example with its queries and keys rotated, and its attention.
    pub rope: (AttentionInputs, AttentionResult),
    /// The example with the encodings added to its queries and keys, and its attention.
    pub sinusoid: (AttentionInputs, AttentionResult),
    pub query: String,
    pub key: String,
    /// The sweep's query and key before any position.
    pub query_vector: Vec<f64>,
    pub key_vector: Vec<f64>,
    pub distance: usize,
    /// The scaled score of the pair without any position, the same everywhere.
    pub plain_score: f64,
    pub sweep: Vec<SweepPoint>,
}

impl PositionsResult {
    /// The attention example a part of the record names: `rope` or `sinusoid`.
    pub(crate) fn example(&self, name: &str) -> Option<&(AttentionInputs, AttentionResult)> {
        match name {
            "rope" => Some(&self.rope),
            "sinusoid" => Some(&self.sinusoid),
            _ => None,
        }
    }
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

impl Evaluator<'_> {
    /// A `qkv positions` block.
    pub(super) fn positions(&mut self, decl: &Decl, p: &PositionsDecl) -> Option<Record> {
        let (inputs, result) = self.example_of(decl, &p.example)?;
        if result.is_err()
            || inputs.mask.is_some()
            || inputs.limits != Default::default()
            || inputs.scale.is_some()
        {
            self.fail(
                decl,
                p.example.at,
                format!(
                    "`{}` needs an example that computes, without masks or a scale of its own",
                    p.example.value
                ),
                p.example.value.clone(),
                "a plain attention example: positions are what this block adds",
            );
            return None;
        }
        let d = inputs.queries.first().map_or(0, Vec::len);
        if d % 2 != 0 || d == 0 {
            self.fail(
                decl,
                p.example.at,
                format!("`{}` has queries of {d} components; rotations turn them in pairs", p.example.value),
                p.example.value.clone(),
                "queries and keys of an even width",
            );
            return None;
        }
        let (ql, kl) = (inputs.query_labels(), inputs.key_labels());
        let pick =
            |this: &mut Self, field: &crate::examples::Field<String>, labels: &[String], what: &str| {
                let found = labels.iter().position(|l| *l == field.value);
                if found.is_none() {
                    this.fail(
                        decl,
                        field.at,
                        format!("`{}` is not {what} of `{}`", field.value, p.example.value),
                        field.value.clone(),
                        format!("one of {}", labels.join(", ")),
                    );
                }
                found
            };
        let qi = pick(self, &p.query, &ql, "a query");
        let kj = pick(self, &p.key, &kl, "a key");
        let (qi, kj) = (qi?, kj?);
        let base = p.base.as_ref().map_or(DEFAULT_BASE, |b| b.value);
        // Queries stand at the keys' positions, aligned at the end as the causal mask aligns them.
        let offset = inputs.keys.len() - inputs.queries.len().min(inputs.keys.len());
        let at = |i: usize| i + offset;
        let mut rope = inputs.clone();
        rope.queries = inputs.queries.iter().enumerate().map(|(i, q)| rotate(q, at(i), base)).collect();
        rope.keys = inputs.keys.iter().enumerate().map(|(j, k)| rotate(k, j, base)).collect();
        let mut sin = inputs.clone();
        sin.queries = inputs
            .queries
            .iter()
            .enumerate()
            .map(|(i, q)| add(q, &sinusoid(at(i) as f64, d, base)))
            .collect();
        sin.keys =
            inputs.keys.iter().enumerate().map(|(j, k)| add(k, &sinusoid(j as f64, d, base))).collect();
        for x in [&mut rope, &mut sin] {
            x.projection = None;
        }
        let (rope_result, sin_result) = match (compute(&rope), compute(&sin)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(e), _) | (_, Err(e)) => {
                self.fail(
                    decl,
                    decl.id_at,
                    format!("the engine rejected `{}`: {e}", decl.id),
                    String::new(),
                    "an example the engine computes",
                );
                return None;
            }
        };
        let scale = 1.0 / (d as f64).sqrt();
        let (q, k) = (&inputs.queries[qi], &inputs.keys[kj]);
        let sweep = (0..p.positions.value)
            .map(|s| {
                let (query_position, key_position) = (s + p.distance.value, s);
                let rope_query = rotate(q, query_position, base);
                let rope_key = rotate(k, key_position, base);
                let sinusoid_score = scale
                    * dot(
                        &add(q, &sinusoid(query_position as f64, d, base)),
                        &add(k, &sinusoid(key_position as f64, d, base)),
                    );
                SweepPoint {
                    query_position,
                    key_position,
                    rope_score: scale * dot(&rope_query, &rope_key),
                    rope_query,
                    rope_key,
                    sinusoid_score,
                }
            })
            .collect();
        let result = PositionsResult {
            base,
            rope: (rope, rope_result),
            sinusoid: (sin, sin_result),
            query: p.query.value.clone(),
            key: p.key.value.clone(),
            query_vector: q.clone(),
            key_vector: k.clone(),
            distance: p.distance.value,
            plain_score: scale * dot(q, k),
            sweep,
        };
        let node = positions_node(&result, d);
        Some(Record { computed: Computed::Positions(Box::new(result)), node })
    }
}

fn positions_node(r: &PositionsResult, d: usize) -> Node {
    let (rope, sin) = (&r.rope, &r.sinusoid);
    let positions = r.sweep.last().map_or(0, |s| s.query_position + 1);
    let sweep = r.sweep.iter().map(|s| {
        Node::Map(vec![
            ("query_position", Node::Number(s.query_position as f64)),
            ("key_position", Node::Number(s.key_position as f64)),
            ("rope_query", Node::vector(&s.rope_query)),
            ("rope_key", Node::vector(&s.rope_key)),
            ("rope_score", Node::Number(s.rope_score)),
            ("sinusoid_score", Node::Number(s.sinusoid_score)),
        ])
    });
    Node::Record(vec![
        ("base".into(), Node::Number(r.base)),
        ("distance".into(), Node::Number(r.distance as f64)),
        ("theta".into(), Node::numbered((0..d / 2).map(|i| Node::Number(angle(i, d, r.base))))),
        (
            "encoding".into(),
            Node::List(
                (0..positions)
                    .map(|p| (p.to_string(), Node::vector(&sinusoid(p as f64, d, r.base))))
                    .collect(),
            ),
        ),
        ("rope".into(), attention_node(&rope.0, &Ok(rope.1.clone()))),
        ("sinusoid".into(), attention_node(&sin.0, &Ok(sin.1.clone()))),
        ("plain_score".into(), Node::Number(r.plain_score)),
        ("sweep".into(), Node::numbered(sweep)),
    ])
}
