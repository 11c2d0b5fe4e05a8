//! Tests of the query_diagram figure.
