//! Tests of the line_chart figure.
