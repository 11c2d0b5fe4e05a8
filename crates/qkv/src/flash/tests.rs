//! The work split: key splits depend on the problem size only and tile the keys exactly.

use super::*;

/// The key ranges of [`key_splits`], in order, in whole key blocks.
fn splits(n_rows: usize, n_keys: usize) -> Vec<Range<usize>> {
    key_splits(n_rows, n_keys, QUERY_BLOCK, KEY_BLOCK).ranges().collect()
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

#[test]
fn paged_blocks_that_are_not_whole_panels_split_at_blocks() {
    let paged = |block_size| {
        StoredKeys::<f32>::Paged(PagedKeys {
            storage: &[],
            block_stride: 0,
            table: &[],
            block_size,
            key_lanes: block_size.next_multiple_of(16),
            panels_at: 0,
            values_at: 0,
            key_dim: 1,
            value_stride: 1,
            scales: &[],
            scales_stride: 0,
            scales_at: 0,
        })
    };
    // Whole panels: splits at key blocks, which are whole panels of any block too.
    assert_eq!(paged(48).split_unit(16), KEY_BLOCK);
    // Otherwise at the least common multiple of a key block and a block.
    assert_eq!(paged(24).split_unit(16), 384);
    assert_eq!(paged(5).split_unit(16), 640);
    for unit in [384, 640] {
        let splits: Vec<Range<usize>> = key_splits(1, 16384, QUERY_BLOCK, unit).ranges().collect();
        assert!(splits.len() > 1 && splits.iter().all(|r| r.start % unit == 0), "{splits:?}");
        assert_eq!(splits.last().map(|r| r.end), Some(16384));
    }
}
