//! The largest things a lesson may declare and show. A lesson never needs more, and past them
//! the generated text, pages and figures stop being readable (a 10,000-token example once made
//! 17 MB of HTML and an unreadable heatmap): each limit is a content error that names it.

/// Rows of an attention example (queries, keys, values, embeddings) and entries of the list of a
/// `softmax`, `dot` or `weighted-sum` block.
pub(crate) const MAX_ROWS: usize = 64;
/// Components of one query, key, value or embedding, and columns of a projection.
pub(crate) const MAX_WIDTH: usize = 64;
/// Queries, keys or vector components one table, worked example or figure shows.
pub(crate) const MAX_SHOWN: usize = 16;
/// Points on the x axis of a Monte Carlo figure.
pub(crate) const MAX_DIMS: usize = 16;
/// The largest `d_k` a Monte Carlo figure samples.
pub(crate) const MAX_DIM: usize = 4096;
/// Random numbers a Monte Carlo figure draws, `trials × Σ dims` (the lesson's use about 2 million):
/// it keeps a debug build of the lesson within seconds.
pub(crate) const MAX_SAMPLES: usize = 20_000_000;

/// `Err` with a sentence naming the limit when `count` things are more than `limit`:
/// "70 keys, more than the 64 an example may have".
pub(crate) fn at_most(count: usize, limit: usize, what: &str, holder: &str) -> Result<(), String> {
    if count <= limit { Ok(()) } else { Err(format!("{count} {what}, more than the {limit} {holder}")) }
}

/// `Err` naming the limit when a matrix of an example has more rows, or longer rows, than an
/// example may have; `rows_are` says what its rows are (`keys`, `rows`).
pub(crate) fn matrix(rows: &[Vec<f64>], rows_are: &str) -> Result<(), String> {
    at_most(rows.len(), MAX_ROWS, rows_are, "an example may have")?;
    let width = rows.first().map_or(0, Vec::len);
    at_most(width, MAX_WIDTH, &format!("numbers in each of its {rows_are}"), "a row may have")
}
