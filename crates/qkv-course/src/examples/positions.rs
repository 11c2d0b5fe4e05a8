//! `qkv positions` declarations: an attention example with positions, two ways: rotary position
//! embeddings (RoPE: each query and key rotated by its position) and sinusoidal encodings (added
//! to the queries and keys), with a sweep that moves one query along the positions, its key a
//! fixed distance behind.

use toml::de::DeTable;

use super::{Field, Reader};

/// The fields of a `qkv positions` block.
pub(super) const FIELDS: &[&str] = &["id", "example", "query", "key", "distance", "positions", "base"];

/// The most positions a sweep walks: each is shown and cited.
pub(crate) const MAX_POSITIONS: usize = 12;

/// A `qkv positions` block, as written.
#[derive(Debug, Clone)]
pub(crate) struct PositionsDecl {
    /// The attention example; token `i` stands at position `i`.
    pub example: Field<String>,
    /// The query and the key the sweep follows.
    pub query: Field<String>,
    pub key: Field<String>,
    /// How many positions the key stands behind the query in the sweep.
    pub distance: Field<usize>,
    /// How many positions the query takes in the sweep (from `distance` on).
    pub positions: Field<usize>,
    /// The base of the rotation angles, `θ_i = base^(-2i/d)`; 10000 unless given.
    pub base: Option<Field<f64>>,
}

impl Reader<'_> {
    /// Reads a `qkv positions` block; `None` when a required field is missing or wrong.
    pub(super) fn positions(&mut self, table: &DeTable<'_>) -> Option<PositionsDecl> {
        let example = self.required(table, "example", |r, v| r.string(v, "the id of an attention example"));
        let query = self.required(table, "query", |r, v| r.string(v, "a query token of the example"));
        let key = self.required(table, "key", |r, v| r.string(v, "a key token of the example"));
        let distance = self.required(table, "distance", Reader::whole);
        let positions = self.required(table, "positions", Reader::whole);
        let base = table.get("base").and_then(|v| self.number(v));
        if let (Some(v), Some(p)) = (table.get("positions"), &positions)
            && !(2..=MAX_POSITIONS).contains(&p.value)
        {
            self.wrong(v, &format!("2 to {MAX_POSITIONS} positions"), "`positions = 8`: each is shown");
            return None;
        }
        if let (Some(v), Some(b)) = (table.get("base"), &base)
            && b.value <= 1.0
        {
            self.wrong(v, "a base above 1", "`base = 10000`, as in the papers");
            return None;
        }
        Some(PositionsDecl {
            example: example?,
            query: query?,
            key: key?,
            distance: distance?,
            positions: positions?,
            base,
        })
    }
}
