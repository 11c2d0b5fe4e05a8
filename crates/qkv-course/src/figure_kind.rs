//! The kinds of figure a lesson can declare: shared by the declarations (which read the name),
//! the figure builder and the regions that show them.

/// The names authors write in `kind = "..."` for the kinds of an enum, written once beside each
/// kind: `NAMES` in order, `name` (a match, so a kind left out does not compile) and `from_name`.
macro_rules! named_kinds {
    ($kind:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $kind {
            /// The names authors write in `kind = "..."`.
            pub(crate) const NAMES: &'static [&'static str] = &[$($name),+];

            /// The name authors write in `kind = "..."`.
            pub(crate) fn name(self) -> &'static str {
                match self {
                    $($kind::$variant => $name),+
                }
            }

            /// The kind of a name from `NAMES`.
            pub(crate) fn from_name(name: &str) -> Option<Self> {
                match name {
                    $($name => Some($kind::$variant),)+
                    _ => None,
                }
            }
        }
    };
}
pub(crate) use named_kinds;

/// The kinds of figure a `qkv figure` block can ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FigureKind {
    /// The weight matrix of an example, masked cells marked.
    Heatmap,
    /// Keys and one query as arrows in the plane, with that query's weights.
    QueryDiagram,
    /// Weights and output as the query sweeps the circle through its current position.
    ScoreCurve,
    /// Monte Carlo: variance of `q · k` against `d_k`, raw and divided by `sqrt(d_k)`.
    ScalingVariance,
    /// Monte Carlo: the largest softmax weight against `d_k`, raw and scaled scores.
    ScalingSaturation,
    /// A `qkv tiled` trace: each block's maximum, the running maximum `m` and sum `l`.
    TileTrace,
    /// Measured numbers from a data file (a benchmark's times), one line per series.
    Measurements,
}

named_kinds!(FigureKind {
    Heatmap => "heatmap",
    QueryDiagram => "query-diagram",
    ScoreCurve => "score-curve",
    ScalingVariance => "scaling-variance",
    ScalingSaturation => "scaling-saturation",
    TileTrace => "tile-trace",
    Measurements => "measurements",
});

impl FigureKind {
    /// Whether the figure draws an example (and so needs `example`): an attention example, or a
    /// `qkv tiled` block for a tile trace.
    pub(crate) fn needs_example(self) -> bool {
        matches!(self, Self::Heatmap | Self::QueryDiagram | Self::ScoreCurve | Self::TileTrace)
    }

    /// Whether it follows one query (and so needs `query`).
    pub(crate) fn needs_query(self) -> bool {
        matches!(self, Self::QueryDiagram | Self::ScoreCurve)
    }

    /// The fields it reads besides `id`, `kind` and `caption`: a field of another kind's is an
    /// error, where it would be ignored.
    pub(crate) fn fields(self) -> &'static [&'static str] {
        match self {
            // A heatmap outlines `query`'s row; the others draw that query.
            Self::Heatmap | Self::QueryDiagram | Self::ScoreCurve => &["example", "query"],
            Self::TileTrace => &["example"],
            Self::ScalingVariance | Self::ScalingSaturation => &["seed", "trials", "dims"],
            Self::Measurements => &["data"],
        }
    }

    /// Every kind's name and [`fields`](Self::fields).
    pub(crate) fn all_fields() -> Vec<(&'static str, &'static [&'static str])> {
        Self::NAMES.iter().filter_map(|&name| Some((name, Self::from_name(name)?.fields()))).collect()
    }
}
