//! The paged KV cache against full attention over each sequence's prefix: every batched attend
//! compared, sequence by sequence, with `multi_head_attention` (bottom-right causal mask, and every
//! `CacheOptions` option with the logsumexp) and the f64 reference head by head, at every SIMD
//! level, on ragged batches, after forks, truncations and freed blocks reused; random operation
//! sequences against a plain model; and its errors.

use std::collections::BTreeMap;

use ndarray::{Array2, Array3, ArrayView2, Axis, concatenate, s};
use proptest::prelude::*;
use qkv::{
    AttentionOptions, CacheOptions, CausalMask, PagedKvCache, PagedShape, SequenceId, SimdLevel,
    SlidingWindow, Storage,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::problem::{assert_close, error_bound, levels};

/// What a sequence should hold: per layer, its keys `[kv_heads, len, d_k]` and values.
#[derive(Clone)]
struct Held {
    k: Vec<Array3<f32>>,
    v: Vec<Array3<f32>>,
    /// The first position the cache still holds (after `evict_before`).
    first: usize,
}

/// A paged cache beside a plain model of it (a key and value array per sequence and layer), with
/// random inputs.
struct Harness {
    level: SimdLevel,
    shape: PagedShape,
    query_heads: usize,
    cache: PagedKvCache<f32>,
    held: BTreeMap<SequenceIdKey, (SequenceId, Held)>,
    rng: ChaCha8Rng,
}

/// `SequenceId` has no order of its own; its index is unique among live sequences.
type SequenceIdKey = usize;

impl Harness {
    fn new(level: SimdLevel, shape: PagedShape, group: usize, seed: u64) -> Harness {
        let cache = PagedKvCache::for_level(shape, level).unwrap();
        let rng = ChaCha8Rng::seed_from_u64(seed);
        Harness { level, shape, query_heads: shape.kv_heads * group, cache, held: BTreeMap::new(), rng }
    }

    fn random(&mut self, heads: usize, n: usize, d: usize) -> Array3<f32> {
        Array3::from_shape_simple_fn((heads, n, d), || self.rng.random_range(-1.0..1.0))
    }

    fn add(&mut self) -> SequenceId {
        let seq = self.cache.add_sequence();
        let empty = |d| (0..self.shape.layers).map(|_| Array3::zeros((self.shape.kv_heads, 0, d))).collect();
        let held = Held { k: empty(self.shape.key_dim), v: empty(self.shape.value_dim), first: 0 };
        self.held.insert(seq.index(), (seq, held));
        seq
    }

    /// A new sequence for each of `lengths`, holding that many random positions at every layer.
    fn add_holding(&mut self, lengths: &[usize]) -> Vec<SequenceId> {
        lengths
            .iter()
            .map(|&len| {
                let seq = self.add();
                self.append(seq, len);
                seq
            })
            .collect()
    }

    fn held(&mut self, seq: SequenceId) -> &mut Held {
        &mut self.held.get_mut(&seq.index()).expect("a live sequence").1
    }

    /// Appends `n` random positions to `seq` at `layer`, in the cache and the model.
    fn append_layer(&mut self, seq: SequenceId, layer: usize, n: usize) {
        let PagedShape { kv_heads, key_dim, value_dim, .. } = self.shape;
        let (k, v) = (self.random(kv_heads, n, key_dim), self.random(kv_heads, n, value_dim));
        self.cache.layer(layer).unwrap().append(seq, k.view(), v.view()).unwrap();
        let held = self.held(seq);
        held.k[layer] = concatenate![Axis(1), held.k[layer], k];
        held.v[layer] = concatenate![Axis(1), held.v[layer], v];
    }

    /// Appends `n` positions at every layer, as a decoder's forward pass does.
    fn append(&mut self, seq: SequenceId, n: usize) {
        for layer in 0..self.shape.layers {
            self.append_layer(seq, layer, n);
        }
    }

    fn fork(&mut self, seq: SequenceId) -> SequenceId {
        let child = self.cache.fork(seq).unwrap();
        let held = self.held(seq).clone();
        self.held.insert(child.index(), (child, held));
        child
    }

    fn truncate(&mut self, seq: SequenceId, len: usize) {
        self.cache.truncate(seq, len).unwrap();
        let held = self.held(seq);
        for a in held.k.iter_mut().chain(held.v.iter_mut()) {
            let keep = len.min(a.shape()[1]);
            *a = a.slice(s![.., ..keep, ..]).to_owned();
        }
    }

    /// Evicts the blocks of `seq` before `position`'s, in the cache and the model.
    fn evict(&mut self, seq: SequenceId, position: usize) {
        self.cache.evict_before(seq, position).unwrap();
        let first = self.cache.first_held(seq).unwrap();
        // Whole blocks go, and never come back.
        let before = self.held(seq).first;
        assert_eq!(first, before.max(position / self.shape.block_size * self.shape.block_size));
        self.held(seq).first = first;
    }

    fn free(&mut self, seq: SequenceId) {
        self.cache.free(seq).unwrap();
        self.held.remove(&seq.index());
    }

    /// One batched attend at `layer` with `n_q` new queries for each sequence of `batch` (random,
    /// packed along axis 1); each sequence's rows must match full attention over its prefix.
    /// Returns the packed output.
    fn check(&mut self, layer: usize, batch: &[(SequenceId, usize)]) -> Array3<f32> {
        self.check_with(layer, batch, Kind::Plain)
    }

    /// [`check`](Self::check) under `kind`'s options, the logsumexp compared too, with a random
    /// keep mask where `kind` has one (`[n_queries, longest]`, each sequence's columns its own
    /// positions, some rows hiding everything).
    fn check_with(&mut self, layer: usize, batch: &[(SequenceId, usize)], kind: Kind) -> Array3<f32> {
        let mut offsets = vec![0];
        offsets.extend(batch.iter().scan(0, |end, &(_, n)| {
            *end += n;
            Some(*end)
        }));
        let total = *offsets.last().unwrap();
        let q = self.random(self.query_heads, total, self.shape.key_dim);
        let sequences: Vec<SequenceId> = batch.iter().map(|&(seq, _)| seq).collect();
        let lengths: Vec<usize> =
            batch.iter().map(|&(seq, _)| self.held[&seq.index()].1.k[layer].shape()[1]).collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let mut keep = Array2::from_elem((total, longest), false);
        for (i, &len) in lengths.iter().enumerate() {
            for (r, row) in (offsets[i]..offsets[i + 1]).enumerate() {
                let own = len - (offsets[i + 1] - offsets[i]) + r;
                for j in 0..longest {
                    keep[[row, j]] = row % 5 != 3 && (j == own || self.rng.random_bool(0.6));
                }
            }
        }
        let slopes: Vec<f32> =
            (0..self.query_heads).map(|h| 0.05 + 0.3 * h as f32 / self.query_heads as f32).collect();
        let sinks = crate::cache_options::test_sinks(self.query_heads);
        let options = kind.options(&slopes, &sinks, keep.view());
        let mut paged = self.cache.layer(layer).unwrap();
        // Pre-filled with NaN: an element the call forgets to write fails the comparison.
        let mut got = Array3::from_elem((self.query_heads, total, self.shape.value_dim), f32::NAN);
        let mut lse = Array2::from_elem((self.query_heads, total), f32::NAN);
        paged
            .attend_with_into(&sequences, &offsets, q.view(), &options, got.view_mut(), Some(lse.view_mut()))
            .unwrap();
        let with = paged.attend_with(&sequences, &offsets, q.view(), &options).unwrap();
        assert_eq!(with, got, "attend_with and attend_with_into agree");
        if let Kind::Plain = kind {
            assert_eq!(
                paged.attend(&sequences, &offsets, q.view()).unwrap(),
                got,
                "attend and attend_with_into agree"
            );
        }
        let group = self.query_heads / self.shape.kv_heads;
        for (i, &(seq, n_q)) in batch.iter().enumerate() {
            // The positions the cache holds, from the first that eviction left.
            let held = &self.held[&seq.index()].1;
            let first = held.first;
            let (k, v) = (held.k[layer].slice(s![.., first.., ..]), held.v[layer].slice(s![.., first.., ..]));
            let rows = offsets[i]..offsets[i + 1];
            let q = q.slice(s![.., rows.clone(), ..]);
            let own_keep = keep.slice(s![rows.clone(), first..lengths[i]]);
            let dense = kind.options(&slopes, &sinks, own_keep).dense().simd(self.level);
            let full = qkv::multi_head_attention_with_lse(
                q.insert_axis(Axis(0)),
                k.insert_axis(Axis(0)),
                v.insert_axis(Axis(0)),
                &dense,
            )
            .unwrap();
            for h in 0..self.query_heads {
                let ctx = format!(
                    "{} {kind:?} {:?}, layer {layer}, batch lengths {lengths:?}, sequences[{i}]: {n_q} queries, head {h}",
                    self.level, self.shape
                );
                let (qh, kh, vh) =
                    (q.slice(s![h, .., ..]), k.slice(s![h / group, .., ..]), v.slice(s![h / group, .., ..]));
                // One head's options: its own ALiBi slope and sink.
                let head_options = kind.options(&slopes[h..=h], &sinks[h..=h], own_keep).dense();
                let want = qkv::reference::attention(qh, kh, vh, &head_options).unwrap();
                let want_lse =
                    qkv::reference::attention_with_lse(qh, kh, vh, &head_options).unwrap().logsumexp;
                let (weights_bound, bound) = error_bound(&want, &vh.to_owned());
                let got_head = got.slice(s![h, rows.clone(), ..]).to_owned();
                assert_close(&format!("paged vs reference {ctx}"), &got_head, &want.output, bound);
                let full_head = full.output.slice(s![0, h, .., ..]).mapv(f64::from);
                assert_close(&format!("paged vs multi_head_attention {ctx}"), &got_head, &full_head, bound);
                for (r, (&g, &w)) in lse.slice(s![h, rows.clone()]).iter().zip(&want_lse).enumerate() {
                    let close = if w == f64::NEG_INFINITY {
                        g == f32::NEG_INFINITY
                    } else {
                        (f64::from(g) - w).abs() <= 2e-5 * (weights_bound + lengths[i] as f64)
                    };
                    assert!(close, "logsumexp {ctx} row {r}: got {g}, want {w}");
                }
            }
        }
        got
    }

    /// A decoding step for every live sequence: one position appended at every layer, then one
    /// query each, checked at every layer.
    fn decode_all(&mut self) {
        let live: Vec<SequenceId> = self.held.values().map(|(seq, _)| *seq).collect();
        for &seq in &live {
            self.append(seq, 1);
        }
        let batch: Vec<(SequenceId, usize)> = live.iter().map(|&seq| (seq, 1)).collect();
        for layer in 0..self.shape.layers {
            self.check(layer, &batch);
        }
    }
}

/// The options of a checked attend ([`Harness::check_with`]).
#[derive(Debug, Clone, Copy)]
enum Kind {
    Plain,
    Window,
    Alibi,
    /// A scale and a soft-cap.
    Softcap,
    /// A keep mask (a tree's ancestors), some rows hiding everything.
    Keep,
    /// Attention sinks, one per query head.
    Sinks,
    /// Everything at once.
    All,
}

impl Kind {
    /// The options, with `slopes` and `sinks` one per query head and `keep` the step's keep mask.
    fn options<'a>(
        self,
        slopes: &'a [f32],
        sinks: &'a [f32],
        keep: ArrayView2<'a, bool>,
    ) -> CacheOptions<'a> {
        let o = CacheOptions::new();
        match self {
            Kind::Plain => o,
            Kind::Window => o.sliding_window(SlidingWindow::new(40, 0)),
            Kind::Alibi => o.alibi(slopes),
            Kind::Softcap => o.scale(1.5).logit_softcap(2.0),
            Kind::Keep => o.keep_mask(keep),
            Kind::Sinks => o.sinks(sinks),
            Kind::All => o
                .scale(1.2)
                .sinks(sinks)
                .sliding_window(SlidingWindow::new(150, 0))
                .alibi(slopes)
                .logit_softcap(3.0)
                .keep_mask(keep),
        }
    }
}

/// Block sizes at `level`: a single key panel, three panels, 192 positions (past a key tile of
/// 128, not a multiple of it), vLLM's 16, and sizes whose keys are padded to whole panels at
/// every level: 5 (less than a panel) and 150 (past a key tile, a part of a panel over).
fn block_sizes(level: SimdLevel) -> [usize; 6] {
    let panel = PagedKvCache::<f32>::block_granularity(level).unwrap();
    [panel, 3 * panel, 192, 16, 5, 150]
}

/// Widths, grouped-query sharing and block sizes at every level.
fn configurations() -> Vec<(SimdLevel, PagedShape, usize)> {
    let mut configurations = Vec::new();
    for level in levels() {
        for (i, block_size) in block_sizes(level).into_iter().enumerate() {
            let (kv_heads, group, key_dim, value_dim) =
                [(2, 4, 16, 24), (1, 1, 1, 1), (3, 2, 17, 5), (1, 2, 8, 8), (2, 1, 4, 3), (1, 4, 33, 16)][i];
            let shape = PagedShape::new(2, kv_heads, key_dim, value_dim, block_size, 1200 / block_size + 12);
            configurations.push((level, shape, group));
        }
    }
    configurations
}

#[test]
fn ragged_batches_match_full_attention_over_each_prefix() {
    for (seed, (level, shape, group)) in configurations().into_iter().enumerate() {
        let mut harness = Harness::new(level, shape, group, seed as u64);
        // Lengths 1, off the panel and block sizes, past a key tile, and one far longer.
        let lengths = [1, 17, shape.block_size + 3, 130, 700];
        let sequences: Vec<SequenceId> = lengths.iter().map(|_| harness.add()).collect();
        for (&seq, &len) in sequences.iter().zip(&lengths) {
            harness.append(seq, len);
        }
        // Prefill chunks of different sizes (a sequence with none takes no part), then decoding.
        let chunks = [1, 3, 0, 5, 2];
        let batch: Vec<(SequenceId, usize)> = sequences.iter().copied().zip(chunks).collect();
        harness.check(0, &batch);
        harness.check(1, &batch);
        for _ in 0..2 {
            harness.decode_all();
        }
    }
}

/// Every option of the cached path, on a ragged batch of prefill chunks and then decoding steps.
#[test]
fn every_option_matches_full_attention_over_each_prefix() {
    let kinds = [Kind::Window, Kind::Alibi, Kind::Softcap, Kind::Keep, Kind::Sinks, Kind::All];
    for (seed, (level, shape, group)) in configurations().into_iter().enumerate() {
        let mut harness = Harness::new(level, shape, group, 300 + seed as u64);
        let sequences = harness.add_holding(&[1, 45, shape.block_size + 3, 200]);
        // Each configuration meets two of the options, in turn.
        for kind in [kinds[seed % kinds.len()], kinds[(seed + 2) % kinds.len()]] {
            let chunks = [1, 4, 0, 7];
            let batch: Vec<(SequenceId, usize)> = sequences.iter().copied().zip(chunks).collect();
            harness.check_with(0, &batch, kind);
            for &seq in &sequences {
                harness.append(seq, 1);
            }
            let step: Vec<(SequenceId, usize)> = sequences.iter().map(|&seq| (seq, 1)).collect();
            harness.check_with(shape.layers - 1, &step, kind);
        }
    }
}

#[test]
fn packed_prefill_of_several_prompts_is_one_call() {
    for (seed, (level, shape, group)) in configurations().into_iter().enumerate() {
        let mut harness = Harness::new(level, shape, group, 100 + seed as u64);
        let prompts = [9, 1, 200, 33];
        let batch: Vec<(SequenceId, usize)> = prompts
            .iter()
            .map(|&len| {
                let seq = harness.add();
                harness.append(seq, len);
                (seq, len)
            })
            .collect();
        harness.check(1, &batch);
    }
}

#[test]
fn long_sequences_split_their_keys_beside_short_ones() {
    // A decoding step over 2049 positions splits its keys between tasks; the short sequences of
    // the same batch then have splits with nothing in them. Blocks whose keys are padded to whole
    // panels (5 and 24 positions) split at blocks, never inside a panel.
    for (level, block_size) in levels().into_iter().flat_map(|level| [(level, 64), (level, 5), (level, 24)]) {
        let shape = PagedShape::new(1, 2, 32, 24, block_size, 2560 / block_size);
        let mut harness = Harness::new(level, shape, 4, 7);
        let (long, short) = (harness.add(), harness.add());
        harness.append(long, 2049);
        harness.append(short, 5);
        harness.check(0, &[(long, 1), (short, 1)]);
        harness.check(0, &[(short, 2), (long, 3)]);
    }
}

#[test]
fn a_fork_shares_its_prefix_and_neither_side_changes_the_other() {
    for (seed, (level, shape, group)) in configurations().into_iter().enumerate() {
        let mut harness = Harness::new(level, shape, group, 200 + seed as u64);
        let parent = harness.add();
        // Two full blocks and a partial one.
        let partial = (shape.block_size / 2 + 1).min(5);
        harness.append(parent, 2 * shape.block_size + partial);
        let child = harness.fork(parent);
        assert_eq!(harness.cache.block_table(child).unwrap(), harness.cache.block_table(parent).unwrap());
        let free = harness.cache.free_blocks();
        harness.check(0, &[(parent, 2)]);
        // The parent's numbers for fixed queries, before the child writes anything.
        let q = harness.random(harness.query_heads, 2, shape.key_dim);
        let attend =
            |h: &mut Harness| h.cache.layer(0).unwrap().attend(&[parent], &[0, 2], q.view()).unwrap();
        let parent_before = attend(&mut harness);
        // The child's first append copies the shared partial block, and only that one.
        harness.append(child, 3.min(shape.block_size - partial));
        assert_eq!(harness.cache.free_blocks(), free - 1);
        let (p, c) = (harness.cache.block_table(parent).unwrap(), harness.cache.block_table(child).unwrap());
        assert_eq!(p[..2], c[..2], "full blocks stay shared");
        assert_ne!(p[2], c[2], "the partial block was copied");
        harness.append(child, shape.block_size + 1);
        assert_eq!(
            attend(&mut harness),
            parent_before,
            "a child's appends leave the parent's numbers alone, bit for bit"
        );
        // The parent diverges too, copying nothing: the child left the partial block to it.
        let free = harness.cache.free_blocks();
        harness.append(parent, 1);
        assert_eq!(harness.cache.free_blocks(), free, "the parent now holds its partial block alone");
        harness.check(0, &[(child, 1), (parent, 1)]);
        harness.check_with(0, &[(child, 1), (parent, 1)], Kind::All);
        harness.check(1, &[(parent, 2), (child, 4)]);
        harness.decode_all();
    }
}

#[test]
fn a_fork_between_layers_copies_what_each_layer_writes() {
    // A fork while a decoder's layers take their turns: layer 0 holds one position more than
    // layer 1, and the shared blocks are written by both.
    for (seed, (level, shape, group)) in configurations().into_iter().enumerate() {
        let mut harness = Harness::new(level, shape, group, 300 + seed as u64);
        let parent = harness.add();
        harness.append(parent, shape.block_size - 1);
        harness.append_layer(parent, 0, 1);
        let child = harness.fork(parent);
        harness.append_layer(child, 1, 1);
        harness.append_layer(parent, 1, 1);
        harness.append(child, 2);
        harness.append(parent, shape.block_size);
        for layer in 0..2 {
            harness.check(layer, &[(parent, 1), (child, 3)]);
        }
    }
}

#[test]
fn truncate_then_append_matches_the_shorter_prefix() {
    for (seed, (level, shape, group)) in configurations().into_iter().enumerate() {
        let mut harness = Harness::new(level, shape, group, 400 + seed as u64);
        let seq = harness.add();
        harness.append(seq, 3 * shape.block_size + (shape.block_size / 2 + 1).min(7));
        let free = harness.cache.free_blocks();
        // Back into the second block: the third and fourth return to the pool.
        harness.truncate(seq, shape.block_size + 2);
        assert_eq!(harness.cache.free_blocks(), free + 2);
        assert_eq!(harness.cache.len(seq).unwrap(), shape.block_size + 2);
        harness.check(0, &[(seq, 2)]);
        harness.append(seq, 5);
        harness.check(1, &[(seq, 5)]);
        // A fork, then the parent rolls back into the shared block and writes there: a copy.
        let child = harness.fork(seq);
        harness.truncate(seq, 3);
        harness.append(seq, 4);
        harness.check(0, &[(seq, 4), (child, 1)]);
        harness.check_with(0, &[(seq, 4), (child, 1)], Kind::All);
        harness.truncate(child, 0);
        harness.append(child, 2);
        harness.check(1, &[(child, 2), (seq, 1)]);
    }
}

/// A sequence that once held a key too large for the queries refuses steps while that key is
/// held, alone or in a batch, and takes them again once it is not (cut by `truncate`, or its
/// block let go by `evict_before`): then its step equals, bit for bit, that of a sequence that
/// never held it. Every level, f32, bf16 and int8 storage, blocks of 4 positions.
fn check_huge_key_let_go<E: qkv::CacheStorage>(level: SimdLevel) {
    let (kv_heads, d) = (2, 8);
    let shape = PagedShape::new(1, kv_heads, d, d, 4, 16);
    let mut cache = PagedKvCache::<E>::for_level(shape, level).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(13);
    let mut random = |n: usize| {
        Array3::from_shape_simple_fn((kv_heads, n, d), || E::Appended::from_f32(rng.random_range(-1.0..1.0)))
    };
    let (k, v, new_k, new_v) = (random(10), random(10), random(3), random(3));
    // Key 5 (of the second block) of 1e21 against queries of 1e18: a score could pass f32's 3.4e38.
    let huge = |position: usize| {
        let mut huge = k.clone();
        huge.slice_mut(s![.., position, ..]).fill(E::Appended::from_f32(1e21));
        huge
    };
    let q = Array3::from_shape_fn((4, 1, d), |(h, _, c)| ((h * 7 + c) % 5) as f32 * 0.5e18 - 1e18);
    let what = format!("{level} {}", E::NAME);
    let [cut, never, evicted, never_evicted] = [(); 4].map(|_| cache.add_sequence());
    for (seq, keys) in [(cut, huge(5)), (never, k.clone()), (evicted, huge(1)), (never_evicted, k.clone())] {
        cache.layer(0).unwrap().append(seq, keys.view(), v.view()).unwrap();
    }
    let step = |cache: &mut PagedKvCache<E>, seqs: &[SequenceId]| {
        let offsets: Vec<usize> = (0..=seqs.len()).collect();
        let q = concatenate(Axis(1), &vec![q.view(); seqs.len()]).unwrap();
        let (mut out, mut lse) = (Array3::<f32>::zeros((4, seqs.len(), d)), Array2::zeros((4, seqs.len())));
        let mut layer = cache.layer(0).unwrap();
        layer.attend_with_into(
            seqs,
            &offsets,
            q.view(),
            &CacheOptions::new(),
            out.view_mut(),
            Some(lse.view_mut()),
        )?;
        Ok((out, lse))
    };
    let overflow = |result: Result<(Array3<f32>, Array2<f32>), qkv::AttentionError>| {
        let error = result.unwrap_err();
        assert!(matches!(error, qkv::AttentionError::CacheOverflow { layer: 0 }), "{what}: {error}");
    };
    for _ in 0..2 {
        overflow(step(&mut cache, &[cut]));
        overflow(step(&mut cache, &[never, cut]));
    }
    step(&mut cache, &[never]).unwrap();
    for seq in [cut, never] {
        cache.truncate(seq, 5).unwrap();
        cache.layer(0).unwrap().append(seq, new_k.view(), new_v.view()).unwrap();
    }
    overflow(step(&mut cache, &[evicted, cut]));
    for seq in [evicted, never_evicted] {
        cache.evict_before(seq, 4).unwrap();
    }
    for (got, want) in [(cut, never), (evicted, never_evicted)] {
        let (got, want) = (step(&mut cache, &[got]).unwrap(), step(&mut cache, &[want]).unwrap());
        assert_eq!(got, want, "{what}: output and logsumexp");
        assert!(got.0.iter().all(|x| x.is_finite()), "{what}");
    }
    step(&mut cache, &[cut, evicted, never]).unwrap();
    // The huge key again: refused again.
    cache.layer(0).unwrap().append(cut, huge(0).slice(s![.., ..1, ..]), v.slice(s![.., ..1, ..])).unwrap();
    overflow(step(&mut cache, &[cut]));
}

#[test]
fn a_huge_key_blocks_steps_only_while_it_is_held() {
    for level in levels() {
        check_huge_key_let_go::<f32>(level);
        check_huge_key_let_go::<half::bf16>(level);
        check_huge_key_let_go::<qkv::Q8>(level);
    }
}

#[test]
fn a_sliding_window_generation_runs_in_the_windows_blocks() {
    for (seed, (level, shape, group)) in configurations().into_iter().enumerate() {
        let mut harness = Harness::new(level, shape, group, 450 + seed as u64);
        let window = 40;
        let (a, b) = (harness.add(), harness.add());
        harness.append(a, 3 * shape.block_size + 5);
        harness.append(b, 2);
        // A generation far longer than the pool holds, evicting what the window has left behind:
        // the pool never runs out, and every step matches attention over the positions held.
        let steps = shape.blocks * shape.block_size + 3;
        let checked = [0, 1, steps / 2, steps - 1];
        for step in 0..steps {
            for seq in [a, b] {
                harness.append(seq, 1);
                let len = harness.cache.len(seq).unwrap();
                // This step's query, at `len - 1`, sees `window` positions back (`Kind::Window`).
                harness.evict(seq, (len - 1).saturating_sub(window));
            }
            if checked.contains(&step) {
                for layer in 0..shape.layers {
                    harness.check(layer, &[(a, 1), (b, 1)]);
                    harness.check_with(layer, &[(b, 1), (a, 1)], Kind::Window);
                    // ALiBi's distances still count from position 0. (Every option at once
                    // includes a window of 150, which reaches what this generation let go: an
                    // error, `a_window_reaching_evicted_positions_is_an_error`.)
                    harness.check_with(layer, &[(a, 1)], Kind::Alibi);
                }
            }
        }
        let held = |seq| harness.cache.block_table(seq).unwrap().len();
        assert!(held(a) <= window.div_ceil(shape.block_size) + 1, "{level}: {} blocks held", held(a));
        // Rotary angles and ALiBi distances count from position 0: positions keep their numbers.
        assert_eq!(harness.cache.len(a).unwrap(), 3 * shape.block_size + 5 + steps);
        // Forks share the window; truncating into evicted positions is an error naming them.
        let child = harness.fork(a);
        harness.append(child, 2);
        harness.check(0, &[(child, 2), (a, 1)]);
        let first = harness.cache.first_held(child).unwrap();
        let error = harness.cache.truncate(child, first.saturating_sub(1)).unwrap_err().to_string();
        if first > 0 {
            assert!(error.contains(&format!("the positions before {first} were evicted")), "{error}");
        }
        let len = harness.cache.len(b).unwrap();
        let error = harness.cache.evict_before(b, len + 1).unwrap_err().to_string();
        assert!(error.contains(&format!("holds only {len}")), "{error}");
    }
}

#[test]
fn freed_blocks_are_reused_and_keep_nothing_of_before() {
    for (seed, (level, shape, group)) in configurations().into_iter().enumerate() {
        let mut harness = Harness::new(level, shape, group, 500 + seed as u64);
        let old = harness.add();
        harness.append(old, 2 * shape.block_size + 9);
        let old_blocks = harness.cache.block_table(old).unwrap().to_vec();
        let free = harness.cache.free_blocks();
        harness.free(old);
        assert_eq!(harness.cache.free_blocks(), free + old_blocks.len());
        assert!(harness.cache.len(old).is_err(), "a freed sequence's id names nothing");
        // The new sequence takes the freed blocks (the last freed first), whose lanes still
        // hold the old keys.
        let new = harness.add();
        assert_eq!(new.index(), old.index(), "the slot is reused");
        assert!(harness.cache.len(old).is_err(), "even once its slot is reused");
        harness.append(new, 3);
        assert_eq!(harness.cache.block_table(new).unwrap(), &old_blocks[old_blocks.len() - 1..]);
        harness.check(0, &[(new, 3)]);
        harness.append(new, shape.block_size);
        harness.check(1, &[(new, 1)]);
    }
}

#[test]
fn results_do_not_depend_on_the_thread_count() {
    let shape = PagedShape::new(1, 2, 64, 64, 64, 100);
    let mut harness = Harness::new(SimdLevel::dispatched().unwrap(), shape, 4, 9);
    let sequences = harness.add_holding(&[4097, 1, 300, 65]);
    let q = harness.random(8, 4 * 3, 64);
    let offsets = [0, 3, 4, 10, 12];
    let outputs: Vec<Array3<f32>> = [1, 2, 3]
        .into_iter()
        .map(|threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| harness.cache.layer(0).unwrap().attend(&sequences, &offsets, q.view()).unwrap())
        })
        .collect();
    assert!(outputs.windows(2).all(|w| w[0] == w[1]), "1, 2 and 3 threads give the same bits");
}

#[test]
fn a_sequence_gets_the_same_bits_alone_or_in_any_batch() {
    // A long sequence splits its keys between tasks, a short one does not: each sequence's
    // splits follow its own length and queries, so batching never changes a bit of its rows.
    let shape = PagedShape::new(1, 2, 32, 40, 64, 120);
    for level in levels() {
        let mut harness = Harness::new(level, shape, 4, 11);
        let lengths = [4097, 1, 300, 1500, 65];
        let sequences = harness.add_holding(&lengths);
        // Queries per sequence: a decoding step for most, a short prefill tail for two.
        let n_queries = [1, 1, 3, 1, 2];
        let q: Vec<Array3<f32>> = n_queries.iter().map(|&n| harness.random(8, n, 32)).collect();
        let attend = |harness: &mut Harness, members: &[usize]| {
            let ids: Vec<SequenceId> = members.iter().map(|&m| sequences[m]).collect();
            let mut offsets = vec![0];
            for &m in members {
                offsets.push(offsets.last().unwrap() + n_queries[m]);
            }
            let views: Vec<_> = members.iter().map(|&m| q[m].view()).collect();
            let packed = concatenate(Axis(1), &views).unwrap();
            let out = harness.cache.layer(0).unwrap().attend(&ids, &offsets, packed.view()).unwrap();
            members
                .iter()
                .zip(offsets.windows(2))
                .map(|(&m, at)| (m, out.slice(s![.., at[0]..at[1], ..]).to_owned()))
                .collect::<Vec<_>>()
        };
        let alone: Vec<Array3<f32>> =
            (0..lengths.len()).map(|m| attend(&mut harness, &[m]).remove(0).1).collect();
        for batch in [vec![0, 1, 2, 3, 4], vec![4, 3, 2, 1, 0], vec![1, 0], vec![2, 4, 3]] {
            for (m, rows) in attend(&mut harness, &batch) {
                assert!(
                    rows == alone[m],
                    "{level}: sequence {m} of length {} in batch {batch:?}",
                    lengths[m]
                );
            }
        }
    }
}

/// An operation of the random sequences below; sequences are picked by position among the live
/// ones, lengths as fractions.
#[derive(Debug, Clone)]
enum Op {
    Add,
    Append { seq: usize, n: usize },
    AppendLayer { seq: usize, layer: usize, n: usize },
    Fork { seq: usize },
    Truncate { seq: usize, keep: f64 },
    Evict { seq: usize, before: f64 },
    Free { seq: usize },
    Attend { layer: usize, queries: Vec<usize> },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => Just(Op::Add),
        3 => (0..8_usize, prop_oneof![1..4_usize, 1..80_usize]).prop_map(|(seq, n)| Op::Append { seq, n }),
        1 => (0..8_usize, 0..2_usize, 1..20_usize).prop_map(|(seq, layer, n)| Op::AppendLayer { seq, layer, n }),
        1 => (0..8_usize).prop_map(|seq| Op::Fork { seq }),
        1 => (0..8_usize, 0.0..1.0).prop_map(|(seq, keep)| Op::Truncate { seq, keep }),
        1 => (0..8_usize, 0.0..1.0).prop_map(|(seq, before)| Op::Evict { seq, before }),
        1 => (0..8_usize).prop_map(|seq| Op::Free { seq }),
        2 => (0..2_usize, proptest::collection::vec(0..4_usize, 8)).prop_map(|(layer, queries)| Op::Attend { layer, queries }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Random lives of sequences (added, appended layer by layer, forked, rolled back, freed)
    /// against the model: every attend matches full attention, the pool never loses a block, and
    /// a full pool refuses an append without changing anything.
    #[test]
    fn random_operations_match_a_plain_model(
        ops in proptest::collection::vec(op(), 1..40),
        level in 0..3_usize,
        size in 0..3_usize,
    ) {
        let levels = levels();
        let level = levels[level % levels.len()];
        // A whole panel, vLLM's 16, and a size padded to whole panels at every level.
        let block_size = [PagedKvCache::<f32>::block_granularity(level).unwrap(), 16, 7][size];
        let shape = PagedShape::new(2, 2, 8, 12, block_size, 512 / block_size);
        let mut harness = Harness::new(level, shape, 2, 11);
        for op in ops {
            let live: Vec<SequenceId> = harness.held.values().map(|(seq, _)| *seq).collect();
            let pick = |i: usize| live.get(i % live.len().max(1)).copied();
            match op {
                Op::Add => { harness.add(); }
                Op::Append { seq, n } => if let Some(seq) = pick(seq) {
                    for layer in 0..2 {
                        try_append(&mut harness, seq, layer, n);
                    }
                },
                Op::AppendLayer { seq, layer, n } => if let Some(seq) = pick(seq) {
                    try_append(&mut harness, seq, layer, n);
                },
                Op::Fork { seq } => if let Some(seq) = pick(seq) { harness.fork(seq); },
                Op::Truncate { seq, keep } => if let Some(seq) = pick(seq) {
                    let len = harness.cache.len(seq).unwrap();
                    let first = harness.cache.first_held(seq).unwrap();
                    harness.truncate(seq, ((len as f64 * keep) as usize).max(first));
                },
                Op::Evict { seq, before } => if let Some(seq) = pick(seq) {
                    let shortest = harness.held(seq).k.iter().map(|k| k.shape()[1]).min().unwrap();
                    harness.evict(seq, (shortest as f64 * before) as usize);
                },
                Op::Free { seq } => if let Some(seq) = pick(seq) { harness.free(seq); },
                Op::Attend { layer, queries } => {
                    let batch: Vec<(SequenceId, usize)> = live
                        .iter()
                        .zip(queries)
                        .map(|(&seq, n)| {
                            let held = harness.cache.layer(layer).unwrap().len(seq).unwrap();
                            (seq, n.min(held - harness.cache.first_held(seq).unwrap().min(held)))
                        })
                        .collect();
                    harness.check(layer, &batch);
                }
            }
            // Every block is free or held, and a held block by exactly the tables that hold it.
            let mut holders = vec![0_usize; shape.blocks];
            for (seq, _) in harness.held.values() {
                for &block in harness.cache.block_table(*seq).unwrap() {
                    holders[block as usize] += 1;
                }
            }
            prop_assert_eq!(holders.iter().filter(|&&h| h == 0).count(), harness.cache.free_blocks());
        }
    }
}

/// Appends if the pool has room; otherwise checks that the refusal changed nothing.
fn try_append(harness: &mut Harness, seq: SequenceId, layer: usize, n: usize) {
    let PagedShape { kv_heads, key_dim, value_dim, block_size, .. } = harness.shape;
    let len = harness.cache.layer(layer).unwrap().len(seq).unwrap();
    let table = harness.cache.block_table(seq).unwrap().to_vec();
    // The table starts at the first block eviction left.
    let first = harness.cache.first_held(seq).unwrap() / block_size;
    let shared = table[len / block_size - first..].len();
    let room = harness.cache.free_blocks()
        >= (len + n).div_ceil(block_size).saturating_sub(first + table.len()) + shared;
    if room {
        harness.append_layer(seq, layer, n);
        return;
    }
    let (k, v) = (Array3::zeros((kv_heads, n, key_dim)), Array3::zeros((kv_heads, n, value_dim)));
    let free = harness.cache.free_blocks();
    let refused = harness.cache.layer(layer).unwrap().append(seq, k.view(), v.view());
    if refused.is_ok() {
        // Room after all: the blocks it wrote into were not shared. Keep the model in step.
        let held = harness.held(seq);
        held.k[layer] = concatenate![Axis(1), held.k[layer], k];
        held.v[layer] = concatenate![Axis(1), held.v[layer], v];
        return;
    }
    assert!(refused.unwrap_err().to_string().contains("free blocks but the pool has"));
    assert_eq!(harness.cache.free_blocks(), free);
    assert_eq!(harness.cache.block_table(seq).unwrap(), table.as_slice());
    assert_eq!(harness.cache.layer(layer).unwrap().len(seq).unwrap(), len);
}

#[test]
fn errors_name_the_sequence_the_argument_and_the_shapes() {
    let shape = PagedShape::new(2, 2, 3, 5, 64, 2);
    let mut cache = PagedKvCache::<f32>::new(shape).unwrap();
    let err = |e: qkv::AttentionError| e.to_string();
    assert_eq!(err(cache.layer(2).err().unwrap()), "layer 2 is out of range: the KV cache has 2 layers");
    let (a, b) = (cache.add_sequence(), cache.add_sequence());
    let mut layer = cache.layer(1).unwrap();
    let (k, v) = (Array3::<f32>::zeros((2, 3, 3)), Array3::<f32>::zeros((2, 3, 5)));
    assert_eq!(
        err(layer.append(a, k.view(), Array3::zeros((2, 2, 5)).view()).unwrap_err()),
        "layer 1 of the paged KV cache takes values of shape [2, 3, 5], not [2, 2, 5]: one value for \
         every key, one [n_new, value_dim] block per key/value head"
    );
    let mut bad = k.clone();
    bad[[1, 2, 0]] = f32::NAN;
    assert_eq!(
        err(layer.append(a, bad.view(), v.view()).unwrap_err()),
        "keys[1, 2, 0] is NaN: attention needs finite inputs"
    );
    assert_eq!(layer.len(a).unwrap(), 0, "a failed append writes nothing");
    layer.append(a, k.view(), v.view()).unwrap();
    let big = (Array3::<f32>::zeros((2, 126, 3)), Array3::<f32>::zeros((2, 126, 5)));
    assert_eq!(
        err(layer.append(a, big.0.view(), big.1.view()).unwrap_err()),
        "appending 126 positions to sequence 0 (layer 1, holding 3) needs 2 free blocks but the pool \
         has 1 of its 2: free finished sequences, or make the pool larger"
    );
    let q = Array3::<f32>::zeros((4, 2, 3));
    assert_eq!(
        err(layer.attend(&[a, b], &[0, 1, 2], q.view()).unwrap_err()),
        "layer 1 of the paged KV cache takes the queries of sequences[1] (sequence 1) of shape [4, at \
         most 0, 3], not [4, 1, 3]: the queries are the last positions held, so append their keys and \
         values first"
    );
    for (offsets, why) in [
        (&[0, 2][..], "one offset per sequence and one for the end"),
        (&[1, 1, 2], "they start at 0 and end at the number of packed rows"),
        (&[0, 1, 3], "they start at 0 and end at the number of packed rows"),
        (&[0, 2, 1, 2], "one offset per sequence and one for the end"),
    ] {
        assert_eq!(
            err(layer.attend(&[a, b], offsets, q.view()).unwrap_err()),
            format!("query_offsets {:?} do not fit 2 sequences and 2 packed rows: {why}", offsets)
        );
    }
    assert_eq!(
        err(layer.attend(&[a, a, a], &[0, 2, 1, 2], q.view()).unwrap_err()),
        "query_offsets [0, 2, 1, 2] do not fit 3 sequences and 2 packed rows: they never decrease"
    );
    // A sequence listed twice is refused (its queries would both be its last position), and the
    // check leaves nothing behind for the next step.
    for _ in 0..2 {
        assert_eq!(
            err(layer.attend(&[a, a], &[0, 1, 2], q.view()).unwrap_err()),
            "sequences[1] repeats sequences[0] (sequence 0): a step takes each sequence once, its queries the \
             last positions it holds"
        );
        layer.attend(&[a], &[0, 2], q.view()).unwrap();
    }
    assert_eq!(
        err(layer.attend(&[a], &[0, 2], Array3::<f32>::zeros((3, 2, 3)).view()).unwrap_err()),
        "layer 1 of the paged KV cache takes queries of shape [a multiple of 2, 2, 3], not [3, 2, 3]: \
         query heads a positive multiple of the key/value heads, each query as wide as the keys"
    );
    let mut out = Array3::<f32>::zeros((4, 2, 4));
    assert_eq!(
        err(layer.attend_into(&[a], &[0, 2], q.view(), out.view_mut()).unwrap_err()),
        "layer 1 of the paged KV cache takes output of shape [4, 2, 5], not [4, 2, 4]: one value-wide row per query"
    );
    // The options' shapes: a keep mask is as wide as the longest sequence (a holds 3).
    let (keep, slopes) = (Array2::from_elem((2, 2), true), [0.5_f32; 3]);
    let mut out = Array3::<f32>::zeros((4, 2, 5));
    for (options, message) in [
        (
            CacheOptions::new().keep_mask(keep.view()),
            "keep_mask of shape [2, 3], not [2, 2]: one row per new query, one column per position held",
        ),
        (CacheOptions::new().alibi(&slopes), "alibi slopes of shape [4], not [3]: one slope per query head"),
    ] {
        assert_eq!(
            err(layer.attend_with_into(&[a], &[0, 2], q.view(), &options, out.view_mut(), None).unwrap_err()),
            format!("layer 1 of the paged KV cache takes {message}")
        );
    }
    let mut lse = Array2::<f32>::zeros((4, 3));
    assert_eq!(
        err(layer
            .attend_with_into(
                &[a],
                &[0, 2],
                q.view(),
                &CacheOptions::new(),
                out.view_mut(),
                Some(lse.view_mut())
            )
            .unwrap_err()),
        "layer 1 of the paged KV cache takes logsumexp of shape [4, 2], not [4, 3]: one per query row"
    );
    assert_eq!(
        err(cache.truncate(a, 4).unwrap_err()),
        "sequence 0 holds 3 positions: it cannot be truncated to 4 (truncation only removes positions)"
    );
    cache.free(b).unwrap();
    assert_eq!(err(cache.fork(b).unwrap_err()), "sequence 1 is not in the paged KV cache: it was freed");
    assert!(cache.free(b).is_err(), "freeing twice is an error, not a double release");
    // A later sequence takes the freed slot: the old id still names nothing, and says why.
    let later = cache.add_sequence();
    assert_eq!(later.index(), b.index());
    assert_eq!(
        err(cache.len(b).unwrap_err()),
        "sequence 1 is not in the paged KV cache: it was freed, and its slot now holds a later sequence, under an id of its own"
    );
    cache.free(later).unwrap();
    // Another cache's first sequence has `a`'s slot and generation: every call here refuses it.
    let mut other = PagedKvCache::<f32>::new(shape).unwrap();
    let theirs = other.add_sequence();
    assert_eq!(theirs.index(), a.index());
    let unknown = "sequence 0 is not in the paged KV cache: the id comes from another cache";
    assert_eq!(err(cache.len(theirs).unwrap_err()), unknown);
    let (k, v) = (Array3::<f32>::zeros((2, 1, 3)), Array3::<f32>::zeros((2, 1, 5)));
    assert_eq!(err(cache.layer(0).unwrap().append(theirs, k.view(), v.view()).unwrap_err()), unknown);
    assert_eq!(err(cache.layer(0).unwrap().attend(&[theirs], &[0, 1], k.view()).unwrap_err()), unknown);
    for refused in [cache.fork(theirs).err(), cache.truncate(theirs, 0).err(), cache.free(theirs).err()] {
        assert_eq!(err(refused.unwrap()), unknown);
    }
    assert_eq!((cache.len(a).unwrap(), other.len(theirs).unwrap()), (3, 0), "neither cache changed");
    // Keys and queries of 1e19: a score could reach 1e38, past what f32 holds with room to spare.
    let huge = Array3::from_elem((2, 1, 3), 1e19_f32);
    cache.layer(0).unwrap().append(a, huge.view(), Array3::zeros((2, 1, 5)).view()).unwrap();
    assert_eq!(
        err(cache
            .layer(0)
            .unwrap()
            .attend(&[a], &[0, 1], Array3::from_elem((2, 1, 3), 1e19).view())
            .unwrap_err()),
        "layer 0 of the KV cache: its keys and values with these queries could overflow an f32 score or sum; \
         scale the inputs down (positions already appended with huge keys or values stay until truncate cuts them)"
    );
    assert_eq!(
        err(PagedKvCache::<f32>::new(shape.with_blocks(0)).err().unwrap()),
        "the paged KV cache's shape [layers, kv_heads, key_dim, value_dim, block_size, blocks] [2, 2, 3, 5, 64, 0] \
         is empty: a pool needs at least one layer, key/value head and block, blocks of at least one position, \
         and keys and values at least one component wide"
    );
}

/// A window that reaches positions `evict_before` let go is an error naming them (its queries
/// would see fewer keys than the window says); one that stops at the first position held is not.
#[test]
fn a_window_reaching_evicted_positions_is_an_error() {
    let shape = PagedShape::new(1, 1, 2, 1, 64, 5);
    let mut cache = PagedKvCache::<f32>::new(shape).unwrap();
    let (other, seq) = (cache.add_sequence(), cache.add_sequence());
    let kv = |n| (Array3::<f32>::zeros((1, n, 2)), Array3::<f32>::ones((1, n, 1)));
    let (k, v) = kv(200);
    cache.layer(0).unwrap().append(seq, k.view(), v.view()).unwrap();
    let (k, v) = kv(3);
    cache.layer(0).unwrap().append(other, k.view(), v.view()).unwrap();
    cache.evict_before(seq, 130).unwrap();
    assert_eq!(cache.first_held(seq).unwrap(), 128);
    let q = Array3::<f32>::zeros((1, 3, 2));
    let step = |cache: &mut PagedKvCache<f32>, before: usize| {
        let options = CacheOptions::new().sliding_window(SlidingWindow::new(before, 0));
        cache.layer(0).unwrap().attend_with(&[other, seq], &[0, 1, 3], q.view(), &options).map(|_| ())
    };
    // The first of the two queries, at position 198, sees back to 198 - before.
    assert_eq!(
        step(&mut cache, 71).unwrap_err().to_string(),
        "sequences[1] (sequence 1): the sliding window of its query at position 198 reaches back to position \
         127, but the positions before 128 were evicted: evict only the positions no query will see again \
         (before the next query's position - window.before)"
    );
    step(&mut cache, 70).unwrap();
    // Without a window the queries see what is held, as evict_before says.
    cache.layer(0).unwrap().attend(&[other, seq], &[0, 1, 3], q.view()).unwrap();
}

#[test]
fn a_pool_too_large_to_allocate_is_an_error_not_a_panic() {
    // usize::MAX blocks overflow the size arithmetic; 2^32 blocks overflow the block table's
    // entries; 2^24 blocks of a real model's 64 positions need 2^47 bytes, which the allocator
    // refuses whatever the machine's memory.
    let model = PagedShape::new(32, 8, 128, 128, 64, 1 << 24);
    for (shape, why) in [
        (
            model.with_blocks(usize::MAX / 2).with_layers(1),
            "more blocks than a block table's u32 entries can name",
        ),
        // 2^32 blocks of one head of 64 positions of 128 + 128 f32 fit a usize: the message gives
        // their size (2^48 bytes, and 8 per block of bookkeeping), then the table's limit.
        (
            model.with_blocks(1 << 32).with_layers(1).with_kv_heads(1),
            "needs 281509336449024 bytes of f32 storage, which is more blocks than a block table's u32 \
             entries can name",
        ),
        (
            model.with_blocks(1 << 31).with_block_size(1 << 40),
            "more than an address space holds (isize::MAX bytes)",
        ),
        (model, "which the allocator refused"),
    ] {
        for level in levels() {
            let message = PagedKvCache::<f32>::for_level(shape, level).err().expect("too large").to_string();
            assert!(message.starts_with("PagedKvCache shape ["), "{message}");
            assert!(message.contains(why), "{message}");
        }
        assert!(PagedKvCache::<half::bf16>::new(shape).is_err());
    }
}

/// A ragged batch over a cache of `E` (half precision): each sequence's rows must match full
/// attention in f32 over the same rounded keys, values and queries.
/// A pool of `E` against the reference over its widened keys and values, with queries of `E`,
/// or of f32 that `E` cannot hold (`f32_queries`), widened to f32 as a step takes them.
fn check_half_precision<E: Storage>(level: SimdLevel, seed: u64, f32_queries: bool) {
    let block_size = PagedKvCache::<E>::block_granularity(level).unwrap();
    let shape = PagedShape::new(1, 2, 16, 12, block_size, 64);
    let mut cache = PagedKvCache::<E>::for_level(shape, level).unwrap();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rounded = |heads, n, d| {
        Array3::from_shape_simple_fn((heads, n, d), || E::from_f32(rng.random_range(-1.0..1.0)))
    };
    let lengths = [1, 2 * block_size + 1, 150];
    let n_queries = [1, 3, 2];
    let held: Vec<(SequenceId, Array3<E>, Array3<E>)> = lengths
        .iter()
        .map(|&len| {
            let seq = cache.add_sequence();
            let (k, v) = (rounded(2, len, 16), rounded(2, len, 12));
            cache.layer(0).unwrap().append(seq, k.view(), v.view()).unwrap();
            (seq, k, v)
        })
        .collect();
    let q = rounded(4, n_queries.iter().sum(), 16).mapv(E::to_f32);
    // f32 queries off the grid of `E`: a pool that rounded them would fail the comparison.
    let q = if f32_queries { q.mapv(|x| x + 1e-3 * x.signum() / 3.0) } else { q };
    let sequences: Vec<SequenceId> = held.iter().map(|(seq, _, _)| *seq).collect();
    let offsets = [0, 1, 4, 6];
    let got = if f32_queries {
        cache.layer(0).unwrap().attend(&sequences, &offsets, q.view()).unwrap()
    } else {
        cache.layer(0).unwrap().attend(&sequences, &offsets, q.mapv(E::from_f32).view()).unwrap()
    };
    let widen = |a: &Array3<E>| a.mapv(E::to_f32);
    let options = AttentionOptions::new().causal(CausalMask::BottomRight).simd(level);
    for (i, (_, k, v)) in held.iter().enumerate() {
        let q = q.slice(s![.., offsets[i]..offsets[i + 1], ..]).to_owned();
        let (k, v) = (widen(k), widen(v));
        for h in 0..4 {
            let (qh, kh, vh) =
                (q.slice(s![h, .., ..]), k.slice(s![h / 2, .., ..]), v.slice(s![h / 2, .., ..]));
            let want = qkv::reference::attention(qh, kh, vh, &options).unwrap();
            let (_, bound) = error_bound(&want, &vh.to_owned());
            let got = got.slice(s![h, offsets[i]..offsets[i + 1], ..]).to_owned();
            assert_close(&format!("{level} {} sequences[{i}] head {h}", E::NAME), &got, &want.output, bound);
        }
    }
}

#[test]
fn half_precision_caches_match_full_attention_over_the_rounded_values() {
    for (seed, level) in levels().into_iter().enumerate() {
        for f32_queries in [false, true] {
            check_half_precision::<half::bf16>(level, seed as u64, f32_queries);
            check_half_precision::<half::f16>(level, 10 + seed as u64, f32_queries);
        }
    }
}
