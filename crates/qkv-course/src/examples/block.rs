//! `qkv block` declarations: a Transformer block around a multi-head example (its `x` is the
//! block's input, its heads and `W_o` the attention sublayer), with the feed-forward layer's
//! weights. The layer norms keep their learned scale at 1 and shift at 0, as at initialisation,
//! so they have no fields beyond `eps`.

use toml::de::DeTable;

use super::{Field, Input, Reader};

/// The fields of a `qkv block` block.
pub(super) const FIELDS: &[&str] = &["id", "attention", "w_1", "b_1", "w_2", "b_2", "eps"];

/// A `qkv block` block, as written.
#[derive(Debug, Clone)]
pub(crate) struct BlockDecl {
    /// The multi-head example whose `x` enters the block and whose heads and `W_o` attend.
    pub attention: Field<String>,
    /// The feed-forward layer: `relu(h W_1 + b_1) W_2 + b_2`.
    pub w_1: Field<Input<Vec<Vec<f64>>>>,
    pub b_1: Option<Field<Input<Vec<f64>>>>,
    pub w_2: Field<Input<Vec<Vec<f64>>>>,
    pub b_2: Option<Field<Input<Vec<f64>>>>,
    /// Added to the variance before its square root, so a row of equal numbers does not divide
    /// by zero; PyTorch's `LayerNorm` default unless given.
    pub eps: Option<Field<f64>>,
}

/// PyTorch's default `eps` for `LayerNorm`.
pub(crate) const DEFAULT_EPS: f64 = 1e-5;

impl Reader<'_> {
    /// Reads a `qkv block` block; `None` when a required field is missing or wrong (the problems
    /// say which).
    pub(super) fn block(&mut self, table: &DeTable<'_>) -> Option<BlockDecl> {
        let attention =
            self.required(table, "attention", |r, v| r.string(v, "the id of a `qkv multi-head` example"));
        let w_1 = self.required(table, "w_1", Reader::matrix);
        let w_2 = self.required(table, "w_2", Reader::matrix);
        let b_1 = table.get("b_1").and_then(|v| self.vector(v));
        let b_2 = table.get("b_2").and_then(|v| self.vector(v));
        let eps = table.get("eps").and_then(|v| self.number(v));
        if let (Some(v), Some(e)) = (table.get("eps"), &eps)
            && e.value <= 0.0
        {
            self.wrong(v, "a positive `eps`", "`eps = 1e-5` (PyTorch's default): a small number above zero");
            return None;
        }
        Some(BlockDecl { attention: attention?, w_1: w_1?, b_1, w_2: w_2?, b_2, eps })
    }
}
