//! An example's queries taken in sequence: decoding, one token at a time over a KV cache, and
//! one query through the tiled online softmax (FlashAttention's inner loop), block by block.
//! Both are traced by the engine's f64 reference; the tests check them against the engine's own
//! `KvCache` and `attention` paths.

use ndarray::s;

use super::{
    AttentionInputs, AttentionResult, Computed, DecodeResult, Evaluator, Record, TiledResult, array,
    attention_node, compute,
};
use crate::examples::{Decl, Field, Mask};
use crate::values::Node;

impl Evaluator<'_> {
    /// The attention example (or head of a multi-head example) `field` names: its inputs and
    /// what it computed (an error for an `expect_error` example).
    pub(super) fn example_of(
        &mut self,
        decl: &Decl,
        field: &Field<String>,
    ) -> Option<(AttentionInputs, Result<AttentionResult, String>)> {
        let target = match self.target(decl.doc, &field.value) {
            Ok(t) => t,
            Err(expected) => {
                self.fail(
                    decl,
                    field.at,
                    format!("unknown reference `{}`", field.value),
                    field.value.clone(),
                    expected,
                );
                return None;
            }
        };
        // A broken example reports its own error.
        let record = self.record(&target.key)?;
        let rest: Vec<String> = target.rest.iter().map(|s| s.to_string()).collect();
        match record.computed.part(&rest) {
            (Computed::Attention { inputs, result }, taken) if taken == rest.len() => Some((inputs, result)),
            _ => {
                self.fail(
                    decl,
                    field.at,
                    format!("`{}` is not an attention example", field.value),
                    field.value.clone(),
                    "the id of a `qkv attention` block, such as `sentence` or `attention.sentence`, or `MULTIHEAD.heads.HEAD`",
                );
                None
            }
        }
    }

    /// Like [`Self::example_of`], for an example that must compute.
    fn computed_example(
        &mut self,
        decl: &Decl,
        field: &Field<String>,
    ) -> Option<(AttentionInputs, AttentionResult)> {
        match self.example_of(decl, field)? {
            (inputs, Ok(result)) => Some((inputs, result)),
            (_, Err(_)) => {
                self.fail(
                    decl,
                    field.at,
                    format!("`{}` is an example the engine rejects, with nothing to show here", field.value),
                    field.value.clone(),
                    "an example that computes",
                );
                None
            }
        }
    }

    /// A `qkv decode` block: the example's tokens decoded in order. Token `t` appends its key and
    /// value to the cache and attends over positions `0..=t`: the first `prompt` together (a
    /// prefill, each under the causal mask), the rest one step each.
    pub(super) fn decode(
        &mut self,
        decl: &Decl,
        example: &Field<String>,
        prompt: &Field<usize>,
    ) -> Option<Record> {
        let (inputs, _) = self.computed_example(decl, example)?;
        let n = inputs.keys.len();
        let unsupported = [
            (!inputs.self_attention(), "its queries are not its keys' tokens (cross-attention)"),
            (matches!(inputs.mask, Some(Mask::Keep(_))), "it has a mask table"),
            (inputs.limits != Default::default(), "it has key limits, a window or ALiBi"),
            (inputs.scale.is_some(), "it has a scale of its own"),
        ];
        if let Some((_, why)) = unsupported.iter().find(|(bad, _)| *bad) {
            self.fail(
                decl,
                example.at,
                format!("`{}` cannot be decoded with the engine's KV cache: {why}", example.value),
                example.value.clone(),
                "a self-attention example with the default scale, whose only mask is (or could be) causal",
            );
            return None;
        }
        if prompt.value == 0 || prompt.value > n {
            self.fail(
                decl,
                prompt.at,
                format!("a prompt of {} tokens, but `{}` has {n}", prompt.value, example.value),
                format!("prompt = {}", prompt.value),
                format!("a prompt of 1 to {n} tokens (the rest are decoded one at a time)"),
            );
            return None;
        }
        let labels = inputs.key_labels();
        let mut steps = Vec::new();
        for (t, label) in labels.iter().enumerate() {
            // What the cache holds once token t is appended, and token t's query.
            let cached = |rows: &[Vec<f64>]| rows[..=t].to_vec();
            let step = AttentionInputs {
                tokens: Some(labels[..=t].to_vec()),
                query_tokens: Some(vec![label.clone()]),
                queries: vec![inputs.queries[t].clone()],
                keys: cached(&inputs.keys),
                values: cached(&inputs.values),
                mask: None,
                limits: Default::default(),
                scale: None,
                projection: None,
            };
            let result = match compute(&step) {
                Ok(r) => r,
                Err(e) => {
                    self.fail(
                        decl,
                        decl.id_at,
                        format!("the engine rejected step {}: {e}", t + 1),
                        String::new(),
                        "an example that attends",
                    );
                    return None;
                }
            };
            steps.push((label.clone(), step, result));
        }
        let mut entries = vec![("prompt".to_string(), Node::Number(prompt.value as f64))];
        for (t, (label, step, result)) in steps.iter().enumerate() {
            let Node::Record(mut fields) = attention_node(step, &Ok(result.clone())) else { continue };
            // The step's own trace, beside what the cache holds: `gen.NLP.weights.I`.
            let trace = fields.iter().position(|(k, _)| k == label).map(|i| fields.remove(i).1);
            fields.retain(|(k, _)| ["keys", "values", "d_k", "sqrt_d_k", "scale"].contains(&k.as_str()));
            fields.insert(0, ("position".into(), Node::Number((t + 1) as f64)));
            // A prompt is appended whole, then attended under the causal mask.
            fields.insert(1, ("cache_length".into(), Node::Number((t + 1).max(prompt.value) as f64)));
            if let Some(Node::Map(trace)) = trace {
                fields.extend(trace.into_iter().map(|(k, n)| (k.to_string(), n)));
            }
            entries.push((label.clone(), Node::Record(fields)));
        }
        let node = Node::Record(entries);
        Some(Record {
            computed: Computed::Decode(Box::new(DecodeResult { prompt: prompt.value, steps })),
            node,
        })
    }

    /// A `qkv tiled` block: one query's online softmax over key blocks of `block` keys.
    pub(super) fn tiled(
        &mut self,
        decl: &Decl,
        example: &Field<String>,
        query: &Field<String>,
        block: &Field<usize>,
    ) -> Option<Record> {
        let (inputs, result) = self.computed_example(decl, example)?;
        let labels = inputs.query_labels();
        let Some(i) = labels.iter().position(|l| *l == query.value) else {
            self.fail(
                decl,
                query.at,
                format!("`{}` is not a query of `{}`", query.value, example.value),
                query.value.clone(),
                format!("one of {}", labels.join(", ")),
            );
            return None;
        };
        let (q, k, v) = (array(&inputs.queries), array(&inputs.keys), array(&inputs.values));
        let masks = inputs.masks();
        let options = inputs.options(&masks);
        let trace = match qkv::reference::trace_tiled(q.view(), k.view(), v.view(), i, block.value, &options)
        {
            Ok(t) => t,
            Err(e) => {
                self.fail(
                    decl,
                    block.at,
                    format!("the engine rejected the tiled trace of `{}`: {e}", decl.id),
                    format!("block = {}", block.value),
                    "a block of at least one key",
                );
                return None;
            }
        };
        let merged = trace
            .blocks
            .iter()
            .skip(1)
            .try_fold(trace.blocks[0].partial.clone(), |acc, b| acc.merge(&b.partial));
        let merged = match merged {
            Ok(m) => m,
            Err(e) => {
                self.fail(
                    decl,
                    decl.id_at,
                    format!("the blocks of `{}` do not merge: {e}", decl.id),
                    String::new(),
                    "blocks the engine can merge",
                );
                return None;
            }
        };
        let key_labels = inputs.key_labels();
        let number = |x: Option<f64>| Node::Number(x.unwrap_or(f64::NEG_INFINITY));
        let blocks = trace.blocks.iter().map(|b| {
            let keys = &key_labels[b.keys.clone()];
            let labelled = |xs: &[f64]| Node::labelled(keys, xs.iter().map(|&x| Node::Number(x)));
            Node::Map(vec![
                // Positions, counted from 1, so that prose can cite them ("keys 3 to 4"); a
                // citation shows numbers only, and the labels are the `scores` entries' names.
                ("first", Node::Number((b.keys.start + 1) as f64)),
                ("last", Node::Number(b.keys.end as f64)),
                ("scores", labelled(&b.scores)),
                ("max", number(b.block_max)),
                ("m_before", number(b.max_before)),
                ("m", number(b.max_after)),
                ("rescale", Node::Number(b.rescale)),
                ("exp", labelled(&b.exponentials)),
                ("l_before", Node::Number(b.sum_before)),
                ("l", Node::Number(b.sum_after)),
                ("acc", Node::vector(&b.accumulator)),
                ("output", Node::vector(&b.output)),
                (
                    "partial",
                    Node::Map(vec![
                        ("output", Node::vector(&b.partial.output.row(0).to_vec())),
                        ("lse", Node::Number(b.partial.logsumexp[0])),
                    ]),
                ),
            ])
        });
        let node = Node::Record(vec![
            ("query".into(), Node::Text(query.value.clone())),
            ("block".into(), Node::Number(block.value as f64)),
            ("scale".into(), Node::Number(trace.scale)),
            ("blocks".into(), Node::numbered(blocks)),
            ("m".into(), number(trace.max)),
            ("l".into(), Node::Number(trace.sum)),
            ("output".into(), Node::vector(&trace.output)),
            ("lse".into(), Node::Number(trace.logsumexp)),
            (
                "merged".into(),
                Node::Map(vec![
                    ("output", Node::vector(&merged.output.slice(s![0, ..]).to_vec())),
                    ("lse", Node::Number(merged.logsumexp[0])),
                ]),
            ),
        ]);
        Some(Record {
            computed: Computed::Tiled(Box::new(TiledResult {
                attention: result.output.row(i).to_vec(),
                inputs,
                query: i,
                trace,
                merged,
            })),
            node,
        })
    }
}
