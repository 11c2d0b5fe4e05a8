//! Tests of the score_curves figure.
