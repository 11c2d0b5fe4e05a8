//! The work split: key splits depend on the problem size only and tile the keys exactly; query
//! blocks tile the rows in whole tiles, evenly.

use super::*;
use crate::kernels::KEY_BLOCK;

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
    assert_eq!(paged(48).split_unit(16, KEY_BLOCK), KEY_BLOCK);
    // Otherwise at the least common multiple of a key block and a block.
    assert_eq!(paged(24).split_unit(16, KEY_BLOCK), 384);
    assert_eq!(paged(5).split_unit(16, KEY_BLOCK), 640);
    // A level of longer key blocks (AMX's 512 keys).
    assert_eq!(paged(24).split_unit(16, 512), 1536);
    for unit in [384, 640] {
        let splits: Vec<Range<usize>> = key_splits(1, 16384, QUERY_BLOCK, unit).ranges().collect();
        assert!(splits.len() > 1 && splits.iter().all(|r| r.start % unit == 0), "{splits:?}");
        assert_eq!(splits.last().map(|r| r.end), Some(16384));
    }
}

#[test]
fn query_blocks_share_the_tiles_evenly_in_a_multiple_of_the_threads() {
    assert_eq!(query_blocks(256, 6, 48, 2), [48, 42, 42, 42, 42, 40]);
    assert_eq!(query_blocks(256, 6, 48, 1), [48, 42, 42, 42, 42, 40]);
    assert_eq!(query_blocks(512, 6, 48, 2), [48, 48, 42, 42, 42, 42, 42, 42, 42, 42, 42, 38]);
    assert_eq!(query_blocks(96, 6, 48, 1), [48, 48]);
    assert_eq!(query_blocks(96, 6, 48, 3), [36, 30, 30]);
    // Never an empty block: at most one per tile.
    assert_eq!(query_blocks(1, 6, 48, 4), [1]);
    assert_eq!(query_blocks(13, 6, 48, 8), [6, 6, 1]);
    assert_eq!(query_blocks(0, 6, 48, 2), [0; 0]);
    for n_rows in 1..400 {
        for threads in 1..5 {
            let lens = query_blocks(n_rows, 6, 48, threads);
            assert_eq!(lens.iter().sum::<usize>(), n_rows, "{n_rows} rows, {threads} threads");
            let (last, whole) = lens.split_last().expect("a block");
            assert!(*last > 0 && lens.iter().all(|&len| len <= 48));
            assert!(whole.iter().all(|&len| len.is_multiple_of(6)));
            let tiles = |len: usize| len.div_ceil(6);
            let (most, least) = (lens.iter().map(|&l| tiles(l)).max(), lens.iter().map(|&l| tiles(l)).min());
            assert!(most.zip(least).is_some_and(|(m, l)| m - l <= 1), "{lens:?}");
            assert!(lens.len().is_multiple_of(threads) || lens.len() == n_rows.div_ceil(6), "{lens:?}");
        }
    }
}

#[test]
fn keys_are_long_above_four_mebibytes_and_sizes_past_usize_do_not_overflow() {
    assert!(!long_keys(0, 0, 4) && !long_keys(0, 136, 4) && !long_keys(8200, 0, 4));
    // 8192 keys of d_k = d_v = 64 in f32 are exactly 4 MiB: not long; one key more is.
    assert!(!long_keys(8192, 128, 4) && long_keys(8193, 128, 4));
    // bf16 reaches it at twice the keys.
    assert!(!long_keys(16384, 128, 2) && long_keys(16385, 128, 2));
    assert!(long_keys(usize::MAX, usize::MAX, usize::MAX) && long_keys(usize::MAX, 1, 1));
}
