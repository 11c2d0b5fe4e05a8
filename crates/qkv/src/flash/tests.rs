//! The work split: key splits depend on the problem size only and tile the keys exactly.

use super::*;

/// The key ranges of [`key_splits`], in order.
fn splits(n_rows: usize, n_keys: usize) -> Vec<Range<usize>> {
    key_splits(n_rows, n_keys, QUERY_BLOCK).ranges().collect()
}

/// A query block as large as any level's.
const QUERY_BLOCK: usize = 48;

#[test]
fn many_query_blocks_never_split_keys() {
    assert_eq!(splits(4 * QUERY_BLOCK, 100_000), vec![0..100_000]);
}

#[test]
fn decoding_splits_long_key_sequences_into_whole_blocks() {
    for (n_q, n_k) in [(1, 16384), (1, 1000), (3, 5000), (200, 4097), (1, 70_000)] {
        let splits = splits(n_q, n_k);
        assert_eq!(splits.first().map(|r| r.start), Some(0), "{n_q} x {n_k}");
        assert_eq!(splits.last().map(|r| r.end), Some(n_k), "{n_q} x {n_k}");
        for pair in splits.windows(2) {
            assert_eq!(pair[0].end, pair[1].start);
            assert_eq!(pair[0].start % KEY_BLOCK, 0);
            assert_eq!(pair[0].len() % KEY_BLOCK, 0);
        }
        assert!(splits.len() <= MAX_SPLITS);
    }
    assert_eq!(splits(1, 16384).len(), 16);
    assert_eq!(splits(1, 1000).len(), 1);
}
