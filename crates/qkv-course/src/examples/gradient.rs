//! `qkv gradient` declarations: the backward of an attention example under a squared-error loss
//! against a target output, and a few gradient-descent steps on its queries, keys and values.

use toml::de::DeTable;

use super::{Field, Input, Reader};

/// The fields of a `qkv gradient` block.
pub(super) const FIELDS: &[&str] = &["id", "example", "target", "learning_rate", "steps"];

/// The most gradient steps a block takes: every step is shown and cited.
pub(crate) const MAX_STEPS: usize = 8;

/// A `qkv gradient` block, as written.
#[derive(Debug, Clone)]
pub(crate) struct GradientDecl {
    /// The attention example whose queries, keys and values are trained.
    pub example: Field<String>,
    /// The output wanted: the loss is `½ Σ (O − target)²`.
    pub target: Field<Input<Vec<Vec<f64>>>>,
    /// The step size: `Q ← Q − rate · ∂L/∂Q` (and `K`, `V`).
    pub learning_rate: Field<f64>,
    /// How many steps to take (1 unless given).
    pub steps: Option<Field<usize>>,
}

impl Reader<'_> {
    /// Reads a `qkv gradient` block; `None` when a required field is missing or wrong.
    pub(super) fn gradient(&mut self, table: &DeTable<'_>) -> Option<GradientDecl> {
        let example = self.required(table, "example", |r, v| r.string(v, "the id of an attention example"));
        let target = self.required(table, "target", Reader::matrix);
        let learning_rate = self.required(table, "learning_rate", Reader::number);
        let steps = table.get("steps").and_then(|v| self.whole(v));
        if let (Some(v), Some(r)) = (table.get("learning_rate"), &learning_rate)
            && r.value <= 0.0
        {
            self.wrong(
                v,
                "a positive learning rate",
                "`learning_rate = 0.5`: a step downhill, so above zero",
            );
            return None;
        }
        if let (Some(v), Some(s)) = (table.get("steps"), &steps)
            && !(1..=MAX_STEPS).contains(&s.value)
        {
            self.wrong(v, &format!("1 to {MAX_STEPS} steps"), "`steps = 4`: each step is shown and cited");
            return None;
        }
        Some(GradientDecl { example: example?, target: target?, learning_rate: learning_rate?, steps })
    }
}
