//! The kinds of figure a lesson can declare: shared by the declarations (which read the name),
//! the figure builder and the regions that show them.

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

impl FigureKind {
    /// The names authors write in `kind = "..."`.
    pub(crate) const NAMES: &'static [&'static str] = &[
        "heatmap",
        "query-diagram",
        "score-curve",
        "scaling-variance",
        "scaling-saturation",
        "tile-trace",
        "measurements",
    ];

    pub(crate) fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "heatmap" => Self::Heatmap,
            "query-diagram" => Self::QueryDiagram,
            "score-curve" => Self::ScoreCurve,
            "scaling-variance" => Self::ScalingVariance,
            "scaling-saturation" => Self::ScalingSaturation,
            "tile-trace" => Self::TileTrace,
            "measurements" => Self::Measurements,
            _ => return None,
        })
    }

    /// Whether the figure draws an example (and so needs `example`): an attention example, or a
    /// `qkv tiled` block for a tile trace.
    pub(crate) fn needs_example(self) -> bool {
        matches!(self, Self::Heatmap | Self::QueryDiagram | Self::ScoreCurve | Self::TileTrace)
    }

    /// Whether it follows one query (and so needs `query`).
    pub(crate) fn needs_query(self) -> bool {
        matches!(self, Self::QueryDiagram | Self::ScoreCurve)
    }
}
