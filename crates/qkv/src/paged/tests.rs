//! The pool's storage and bookkeeping: keys land in their blocks' panel lanes, values in padded
//! rows; each block's count is the number of tables holding it; the pool never moves.

use ndarray::Array3;

use super::*;

#[test]
fn keys_land_in_their_blocks_panel_lanes_and_values_in_padded_rows() {
    for level in SimdLevel::ALL.into_iter().filter(|level| level.is_supported()) {
        let block_size = 2 * PagedKvCache::<f32>::block_granularity(level).unwrap();
        let shape = PagedShape::new(2, 2, 3, 5, block_size, 8);
        let mut cache = PagedKvCache::<f32>::for_level(shape, level).unwrap();
        let (other, seq) = (cache.add_sequence(), cache.add_sequence());
        // Key j of head h is [j, j + 0.25, j + 0.5] + 100 h; value j is [j, -j, j, -j, j].
        let len = block_size + block_size / 2 + 1;
        let k = Array3::from_shape_fn((2, len, 3), |(h, j, c)| (100 * h + j) as f32 + 0.25 * c as f32);
        let v =
            Array3::from_shape_fn((2, len, 5), |(_, j, c)| if c % 2 == 0 { j as f32 } else { -(j as f32) });
        let mut layer = cache.layer(1).unwrap();
        // Another sequence takes a block between the two parts, so that those of `seq` are not
        // neighbours.
        layer.append(seq, k.slice(s![.., ..5, ..]), v.slice(s![.., ..5, ..])).unwrap();
        layer.append(other, Array3::ones((2, 1, 3)).view(), Array3::ones((2, 1, 5)).view()).unwrap();
        layer.append(seq, k.slice(s![.., 5.., ..]), v.slice(s![.., 5.., ..])).unwrap();
        let at = cache.block_layout;
        let CachedLayout { key_panel, value_stride } = at.layout;
        let table = cache.block_table(seq).unwrap();
        assert_eq!(table.len(), 2);
        assert_ne!(table[1], table[0] + 1, "{level}: the other sequence took a block in between");
        for (b, &block) in table.iter().enumerate() {
            let block = &cache.storage[block as usize * at.stride..][..at.stride];
            for head in 0..2 {
                let positions = b * block_size..len.min((b + 1) * block_size);
                let keys = k.slice(s![head, positions.clone(), ..]);
                let mut packed = vec![0.0; block_size * 3];
                for (p, panel) in packed.chunks_exact_mut(key_panel * 3).enumerate() {
                    kernels::pack_key_panel(keys, p * key_panel, key_panel, kernels::Layout::Lanes, panel);
                }
                let panels = &block[at.panels_at(1, head)..][..block_size * 3];
                assert_eq!(panels, packed.as_slice(), "{level} block {b} head {head}");
                for (i, j) in positions.enumerate() {
                    let row = &block[at.values_at(1, head) + i * value_stride..][..value_stride];
                    assert_eq!(&row[..5], v.slice(s![head, j, ..]).as_slice().unwrap(), "{level} value {j}");
                    assert!(row[5..].iter().all(|&x| x == 0.0), "{level} value {j} padding");
                }
                // Layer 0 was never written.
                assert!(block[at.panels_at(0, head)..at.panels_at(1, 0)].iter().all(|&x| x == 0.0));
            }
        }
    }
}

#[test]
fn each_block_counts_the_tables_that_hold_it_and_the_pool_never_moves() {
    let shape = PagedShape::new(1, 1, 4, 4, 64, 6);
    let mut cache = PagedKvCache::<f32>::new(shape).unwrap();
    let storage = (cache.storage.as_ptr(), cache.storage.len());
    let append = |cache: &mut PagedKvCache<f32>, seq, n| {
        let kv = Array3::from_elem((1, n, 4), 1.0);
        cache.layer(0).unwrap().append(seq, kv.view(), kv.view())
    };
    let holders = |cache: &PagedKvCache<f32>| cache.pool.holders.clone();
    let a = cache.add_sequence();
    append(&mut cache, a, 100).unwrap();
    assert_eq!(holders(&cache), [1, 1, 0, 0, 0, 0]);
    let b = cache.fork(a).unwrap();
    let c = cache.fork(b).unwrap();
    assert_eq!(holders(&cache), [3, 3, 0, 0, 0, 0]);
    // Writing into the shared partial block copies it for the writer alone.
    append(&mut cache, c, 1).unwrap();
    assert_eq!(holders(&cache), [3, 2, 1, 0, 0, 0]);
    assert_eq!(cache.block_table(c).unwrap(), [0, 2]);
    // A truncation to a block boundary lets go of the partial block; the next append takes a new one.
    cache.truncate(b, 64).unwrap();
    assert_eq!(holders(&cache), [3, 1, 1, 0, 0, 0]);
    append(&mut cache, b, 1).unwrap();
    assert_eq!(holders(&cache), [3, 1, 1, 1, 0, 0]);
    // Block 1 is now a's alone: a writes into it in place.
    append(&mut cache, a, 1).unwrap();
    assert_eq!(cache.block_table(a).unwrap(), [0, 1]);
    // A full pool refuses, and nothing changes.
    let d = cache.fork(a).unwrap();
    assert_eq!(holders(&cache), [4, 2, 1, 1, 0, 0]);
    let refused = append(&mut cache, d, 64 * 3);
    assert!(matches!(refused, Err(AttentionError::PoolFull { needed: 4, free: 2, .. })), "{refused:?}");
    assert_eq!(holders(&cache), [4, 2, 1, 1, 0, 0]);
    for seq in [a, b, c, d] {
        cache.free(seq).unwrap();
    }
    assert_eq!(holders(&cache), [0; 6]);
    assert_eq!(cache.free_blocks(), 6);
    assert_eq!((cache.storage.as_ptr(), cache.storage.len()), storage);
}
