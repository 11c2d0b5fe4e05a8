//! Tests of the heatmap figure.
