//! The cache's storage: allocated once, never moved or grown by appends, laid out as the kernels
//! read it.

use ndarray::Array3;

use super::*;

/// The addresses and lengths of every buffer of the cache.
fn storage(cache: &KvCache<f32>) -> Vec<(*const f32, usize)> {
    let buffers = cache.layers.iter().flat_map(|layer| &layer.heads).flat_map(|h| [&h.panels, &h.values]);
    buffers.map(|b| (b.as_ptr(), b.len())).collect()
}

#[test]
fn appends_never_reallocate_or_move_the_storage() {
    let shape = CacheShape::new(2, 3, 300, 5, 7);
    for level in SimdLevel::ALL.into_iter().filter(|level| level.is_supported()) {
        let mut cache = KvCache::<f32>::for_level(shape, level).unwrap();
        let before = storage(&cache);
        for n_new in [1, 17, 128, 1, 153] {
            for layer in 0..2 {
                let k = Array3::from_elem((3, n_new, 5), 1.0);
                let v = Array3::from_elem((3, n_new, 7), 2.0);
                cache.layer(layer).unwrap().append(k.view(), v.view()).unwrap();
            }
            assert_eq!(storage(&cache), before, "{level}: after appending {n_new}");
        }
        assert_eq!(cache.layer(1).unwrap().len(), 300);
        cache.clear();
        assert_eq!(storage(&cache), before, "{level}: after clear");
    }
}

#[test]
fn keys_land_in_their_panel_lanes_and_values_in_padded_rows() {
    let shape = CacheShape::new(1, 1, 40, 3, 5);
    for level in SimdLevel::ALL.into_iter().filter(|level| level.is_supported()) {
        let mut cache = KvCache::<f32>::for_level(shape, level).unwrap();
        // Key j is [j, j + 0.25, j + 0.5]; value j is [j, -j, j, -j, j]. Appended in two parts.
        let k = Array3::from_shape_fn((1, 37, 3), |(_, j, c)| j as f32 + 0.25 * c as f32);
        let v =
            Array3::from_shape_fn((1, 37, 5), |(_, j, c)| if c % 2 == 0 { j as f32 } else { -(j as f32) });
        let mut layer = cache.layer(0).unwrap();
        layer.append(k.slice(s![.., ..20, ..]), v.slice(s![.., ..20, ..])).unwrap();
        layer.append(k.slice(s![.., 20.., ..]), v.slice(s![.., 20.., ..])).unwrap();
        let CachedLayout { key_panel, value_stride } = cache.layout;
        let head = &cache.layers[0].heads[0];
        let mut packed = vec![0.0; 37_usize.next_multiple_of(key_panel) * 3];
        for (p, panel) in packed.chunks_exact_mut(key_panel * 3).enumerate() {
            kernels::pack_key_panel(
                k.slice(s![0, .., ..]),
                p * key_panel,
                key_panel,
                kernels::Layout::Lanes,
                panel,
            );
        }
        assert_eq!(&head.panels[..packed.len()], packed.as_slice(), "{level}");
        for j in 0..37 {
            let row = &head.values[j * value_stride..(j + 1) * value_stride];
            assert_eq!(&row[..5], v.slice(s![0, j, ..]).as_slice().unwrap(), "{level} value {j}");
            assert!(row[5..].iter().all(|&x| x == 0.0), "{level} value {j} padding");
        }
    }
}

#[test]
fn a_ring_writes_position_p_into_slot_p_mod_capacity_and_never_moves() {
    let shape = CacheShape::new(1, 2, 21, 3, 5);
    for level in SimdLevel::ALL.into_iter().filter(|level| level.is_supported()) {
        let mut cache = KvCache::<f32>::with_window_for_level(shape, 10, level).unwrap();
        let before = storage(&cache);
        // Key p is [p, p + 0.25, p + 0.5] (head 1 negated); value p is [p; 5]. 100 positions in
        // appends of every size, one longer than the ring.
        let k = Array3::from_shape_fn((2, 100, 3), |(h, p, c)| {
            (1.0 - 2.0 * h as f32) * (p as f32 + 0.25 * c as f32)
        });
        let v = Array3::from_shape_fn((2, 100, 5), |(_, p, _)| p as f32);
        let mut layer = cache.layer(0).unwrap();
        let mut len = 0;
        for n_new in [1, 7, 20, 21, 25, 1, 13, 12] {
            layer
                .append(k.slice(s![.., len..len + n_new, ..]), v.slice(s![.., len..len + n_new, ..]))
                .unwrap();
            len += n_new;
        }
        assert_eq!((layer.len(), layer.held()), (100, 21));
        assert_eq!(storage(&cache), before, "{level}: appends past the capacity");
        let CachedLayout { key_panel, value_stride } = cache.layout;
        for (h, head) in cache.layers[0].heads.iter().enumerate() {
            for position in 100 - 21..100 {
                let slot = position % 21;
                let panel = &head.panels[slot / key_panel * key_panel * 3..][..key_panel * 3];
                let key: Vec<f32> = (0..3).map(|c| panel[c * key_panel + slot % key_panel]).collect();
                assert_eq!(key, k.slice(s![h, position, ..]).to_vec(), "{level} key {position}");
                assert_eq!(
                    &head.values[slot * value_stride..][..5],
                    &[position as f32; 5],
                    "{level} value {position}"
                );
            }
        }
        cache.clear();
        assert_eq!(cache.layer(0).unwrap().held(), 0);
        assert_eq!(storage(&cache), before, "{level}: after clear");
    }
}
