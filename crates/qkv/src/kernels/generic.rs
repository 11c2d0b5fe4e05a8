//! The microkernels, written once for every level: `#[inline(always)]` functions generic over a
//! level's [`Simd`] primitives and its register tile (const parameters), instantiated inside each
//! level's `#[target_feature]` entry functions (`level_kernels!`).
//!
//! Bounds: every load goes through a slice whose length the loop makes known (`chunks_exact`,
//! a fixed-length reslice per row), so the compiler drops the checks from the inner loops.

use std::cell::Cell;

use ndarray::{ArrayView1, ArrayView2};

use super::Scalar;
use super::simd::{Load, Simd, exp_shifted};
use super::{Element, KEY_BLOCK, Rows, RowsMut, ScoreTile, ValueRows, Weights, larger_magnitude};

/// The most lanes any level has (AVX-512's 16 f32): the size of the scratch for partial vectors.
const MAX_LANES: usize = 16;

/// See [`super::Kernels::scores`]: tiles of `MR` rows × `NV` vectors of keys (one panel).
#[inline(always)]
pub(super) fn scores<T: Scalar, E: Element, S: Load<T, E>, const MR: usize, const NV: usize>(
    simd: S,
    tile: ScoreTile<'_, T, E>,
    group_keys: Option<&dyn Fn(usize) -> usize>,
) {
    let ScoreTile { q, scale, d, rows, real_rows, keys, panels, s, stride, row_max, maxima: _ } = tile;
    debug_assert!(scale == T::one(), "queries of the lane layout are packed scaled");
    // A constant stride keeps the stores' bounds checks out of the tiles (a runtime one added 2%
    // to the score kernel's instructions).
    assert_eq!(stride, KEY_BLOCK, "rows of scores a vector level's key block apart");
    let width = NV * S::LANES;
    let panel_len = d * width;
    // Every tile folds its maxima into these (a fill here is a plain memset; a "first panel sets
    // them" flag in the tile cost a select per row).
    row_max[..rows * S::LANES].fill(T::neg_infinity());
    for p in 0..panels {
        let panel = &keys[p * panel_len..(p + 1) * panel_len];
        for g in (0..rows).step_by(MR) {
            let vectors = match group_keys {
                Some(keys) => keys(g).saturating_sub(p * width).div_ceil(S::LANES),
                None => NV,
            };
            if vectors == 0 {
                continue;
            }
            let tile = ScoreGroup {
                q: &q[g * d..(g + MR) * d],
                panel,
                // Exactly the tile's rows: the stores below need no bounds checks.
                s: &mut s[g * KEY_BLOCK + p * width..][..(MR - 1) * KEY_BLOCK + width],
                row_max: &mut row_max[g * S::LANES..(g + MR) * S::LANES],
            };
            // A causal diagonal, or a last panel partly filled with keys, needs only the first
            // vectors of a panel: fewer accumulators. A
            // group of fewer real rows (a decoding step's few stacked heads) computes only them.
            match (vectors, real_rows.saturating_sub(g)) {
                (1, _) if NV > 1 => tile.run::<S, MR, MR, 1, NV>(simd),
                (2, _) if NV > 2 => tile.run::<S, MR, MR, 2, NV>(simd),
                (3, _) if NV > 3 => tile.run::<S, MR, MR, 3, NV>(simd),
                (_, 1) if MR > 1 => tile.run::<S, MR, 1, NV, NV>(simd),
                (_, 2) if MR > 2 => tile.run::<S, MR, 2, NV, NV>(simd),
                (_, 3) if MR > 3 => tile.run::<S, MR, 3, NV, NV>(simd),
                (_, 4) if MR > 4 => tile.run::<S, MR, 4, NV, NV>(simd),
                (_, 5) if MR > 5 => tile.run::<S, MR, 5, NV, NV>(simd),
                _ => tile.run::<S, MR, MR, NV, NV>(simd),
            }
        }
    }
}

/// One group of `MR` packed query rows against one key panel (stored as `E`).
struct ScoreGroup<'a, T, E> {
    q: &'a [T],
    panel: &'a [E],
    s: &'a mut [T],
    row_max: &'a mut [T],
}

impl<T: Scalar, E: Element> ScoreGroup<'_, T, E> {
    /// The first `R` of the group's `MR` rows against the first `NV` vectors of an `NP`-vector
    /// panel: the accumulators stay in registers across the whole `d` loop and are stored once,
    /// their lane-wise maxima folded into `row_max`. The scores of the rows past `R` (zero
    /// queries that pad the group) are zeros, as their products would be.
    #[inline(always)]
    fn run<S: Load<T, E>, const MR: usize, const R: usize, const NV: usize, const NP: usize>(self, simd: S) {
        let lanes = S::LANES;
        let mut acc = [[simd.zero(); NV]; R];
        // Two components per iteration: half the loop's own instructions and exits.
        let (q_pairs, panel_pairs) = (self.q.chunks_exact(2 * MR), self.panel.chunks_exact(2 * NP * lanes));
        let (q_last, panel_last) = (q_pairs.remainder(), panel_pairs.remainder());
        for (a, b) in q_pairs.zip(panel_pairs) {
            outer_product_step::<T, E, S, R, NV>(simd, &mut acc, &a[..R], &b[..NP * lanes]);
            outer_product_step::<T, E, S, R, NV>(simd, &mut acc, &a[MR..MR + R], &b[NP * lanes..]);
        }
        if !q_last.is_empty() {
            outer_product_step::<T, E, S, R, NV>(simd, &mut acc, q_last, panel_last);
        }
        for r in R..MR {
            self.s[r * KEY_BLOCK..][..NV * lanes].fill(T::zero());
        }
        for (r, acc) in acc.iter().enumerate() {
            let row = &mut self.s[r * KEY_BLOCK..][..NV * lanes];
            for (v, &x) in acc.iter().enumerate() {
                simd.store(x, &mut row[v * lanes..]);
            }
            let max = &mut self.row_max[r * lanes..][..lanes];
            simd.store(acc.iter().fold(simd.load(max), |m, &x| simd.max(m, x)), max);
        }
    }
}

/// `N` vectors from `x`, vector `i` from `x[i * stride..]`. A plain loop, as in [`rows`], not
/// `std::array::from_fn`: the compiler did not always inline that one's closure wrapper, and the
/// widening intrinsics in it, outside the level's `#[target_feature]` entry, became calls (a bf16
/// decoding step on AVX2 ran at a fifth of f32's rate).
#[inline(always)]
fn load_vectors<T: Scalar, E: Element, S: Load<T, E>, const N: usize>(
    simd: S,
    x: &[E],
    stride: usize,
) -> [S::V; N] {
    let mut vectors = [simd.zero(); N];
    for (i, v) in vectors.iter_mut().enumerate() {
        *v = simd.load_stored(&x[i * stride..][..S::LANES]);
    }
    vectors
}

/// `N` rows of `x`, `stride` apart, `len` elements each. A plain loop (see [`load_vectors`]):
/// where `std::array::from_fn` was not inlined, the rows of `P` lost their fixed stride and
/// every weight read in `P·V` was checked against its row's length (a quarter more instructions).
#[inline(always)]
fn rows<X, const N: usize>(x: &[X], stride: usize, len: usize) -> [&[X]; N] {
    let mut rows = [&x[..0]; N];
    for (i, row) in rows.iter_mut().enumerate() {
        *row = &x[i * stride..][..len];
    }
    rows
}

/// One outer product added to a register tile, `acc[r][v] += a[r] · b[v]` (`b` loaded as `NV`
/// vectors): one component `c` of a score tile (`a = Q[.., c]`, `b = K[c, ..]`) or one weight row
/// `r` of a transposed tile (`a = P[r, j ..]`, `b = X_r`).
#[inline(always)]
fn outer_product_step<T: Scalar, E: Element, S: Load<T, E>, const MR: usize, const NV: usize>(
    simd: S,
    acc: &mut [[S::V; NV]; MR],
    a: &[T],
    b: &[E],
) {
    let lanes = S::LANES;
    let b: [S::V; NV] = load_vectors(simd, b, lanes);
    for (acc, &a) in acc.iter_mut().zip(&a[..MR]) {
        let a = simd.splat(a);
        for (acc, &b) in acc.iter_mut().zip(&b) {
            *acc = simd.mul_add(a, b, *acc);
        }
    }
}

/// See [`super::Kernels::direct_scores`]: at most four query rows. Register tiles of `R` rows ×
/// `N` keys (eight accumulators, independent chains that hide the multiply-add latency); each key
/// vector is loaded once for all rows and folded into the keys' magnitude from the same load.
#[inline(always)]
pub(super) fn direct_scores<T: Scalar, E: Element<Compute = T>, S: Load<T, E>>(
    simd: S,
    q: &[T],
    rows: usize,
    keys: ArrayView2<E>,
    s: &mut [T],
) -> T {
    if keys.nrows() == 0 {
        return T::zero();
    }
    match rows {
        1 => direct_rows::<T, E, S, 1, 4>(simd, q, keys, s),
        2 => direct_rows::<T, E, S, 2, 4>(simd, q, keys, s),
        3 => direct_rows::<T, E, S, 3, 2>(simd, q, keys, s),
        4 => direct_rows::<T, E, S, 4, 2>(simd, q, keys, s),
        _ => panic!("direct scores take at most four query rows, not {rows}"),
    }
}

/// [`direct_scores`] for exactly `R` query rows, `N` keys at a time (the last group filled up
/// with the last key again, whose extra scores are not stored); `R · N` is at most 8. Keys side
/// by side are cut into groups as one slice; a head's rows of a wider tensor are taken row by
/// row (taken so, keys side by side made a batch of decoding steps 3–14% slower on a Zen 5).
#[inline(always)]
fn direct_rows<T: Scalar, E: Element<Compute = T>, S: Load<T, E>, const R: usize, const N: usize>(
    simd: S,
    q: &[T],
    keys: ArrayView2<E>,
    s: &mut [T],
) -> T {
    fn contiguous<E>(row: ArrayView1<'_, E>) -> &[E] {
        row.to_slice().expect("decoding reads key rows that are contiguous each")
    }
    let (n_keys, d) = keys.dim();
    // Each row of a group of length `d` to the compiler too, which then drops the loads' checks.
    #[inline(always)]
    fn group_of<'k, E, const N: usize>(
        rows: &mut impl Iterator<Item = &'k [E]>,
        last: &'k [E],
    ) -> [&'k [E]; N] {
        let mut group = [last; N];
        for row in group.iter_mut() {
            *row = &rows.next().unwrap_or(last)[..last.len()];
        }
        group
    }
    match keys.to_slice() {
        Some(side_by_side) => {
            let last = &side_by_side[(n_keys - 1) * d..];
            let full = side_by_side.chunks_exact(N * d);
            let rest = full.remainder();
            let last_group = (!rest.is_empty()).then(|| group_of(&mut rest.chunks_exact(d), last));
            let groups = full.map(|group| rows(group, d, d)).chain(last_group);
            direct_groups::<T, E, S, R, N>(simd, q, groups, (n_keys, d), s)
        }
        None => {
            let last = contiguous(keys.row(n_keys - 1));
            let mut rows = keys.rows().into_iter().map(contiguous);
            let groups = (0..n_keys.div_ceil(N)).map(|_| group_of(&mut rows, last));
            direct_groups::<T, E, S, R, N>(simd, q, groups, (n_keys, d), s)
        }
    }
}

/// [`direct_rows`] over `groups` of `N` key rows each, `n_keys` keys of `d` in all.
#[inline(always)]
fn direct_groups<'k, T, E, S, const R: usize, const N: usize>(
    simd: S,
    q: &[T],
    groups: impl Iterator<Item = [&'k [E]; N]>,
    (n_keys, d): (usize, usize),
    s: &mut [T],
) -> T
where
    T: Scalar,
    E: Element<Compute = T> + 'k,
    S: Load<T, E>,
{
    let lanes = S::LANES;
    let vectors = d / lanes;
    let whole = vectors * lanes;
    let q_rows: [&[T]; R] = rows(q, d, d);
    let (mut magnitude, mut tail_magnitude) = (simd.zero(), T::zero());
    for (group, key_rows) in groups.enumerate() {
        let mut acc = [[simd.zero(); N]; R];
        for c in 0..vectors {
            let at = c * lanes;
            let mut k = [simd.zero(); N];
            for (k, key) in k.iter_mut().zip(&key_rows) {
                *k = simd.load_stored(&key[at..at + lanes]);
            }
            for &k in &k {
                magnitude = simd.fold_magnitude(magnitude, k);
            }
            for (acc, q_row) in acc.iter_mut().zip(&q_rows) {
                let x = simd.load(&q_row[at..at + lanes]);
                for (acc, &k) in acc.iter_mut().zip(&k) {
                    *acc = simd.mul_add(x, k, *acc);
                }
            }
        }
        // The R·N dot products, reduced four at a time.
        let mut flat = [simd.zero(); 8];
        for (r, acc) in acc.iter().enumerate() {
            flat[r * N..(r + 1) * N].copy_from_slice(acc);
        }
        let mut dots = [T::zero(); 8];
        dots[..4].copy_from_slice(&simd.reduce_add4([flat[0], flat[1], flat[2], flat[3]]));
        if R * N > 4 {
            dots[4..].copy_from_slice(&simd.reduce_add4([flat[4], flat[5], flat[6], flat[7]]));
        }
        let real = N.min(n_keys - N * group);
        for (r, q_row) in q_rows.iter().enumerate() {
            let out = &mut s[r * KEY_BLOCK + N * group..][..real];
            for (i, (out, key)) in out.iter_mut().zip(&key_rows).enumerate() {
                let mut dot = dots[r * N + i];
                if whole < d {
                    if r == 0 {
                        tail_magnitude =
                            key[whole..].iter().fold(tail_magnitude, |m, &x| larger_magnitude(m, x.widen()));
                    }
                    dot = q_row[whole..].iter().zip(&key[whole..]).fold(dot, |a, (&x, &y)| a + x * y.widen());
                }
                *out = dot;
            }
        }
    }
    finish_magnitude::<T, T, S>(simd, magnitude, &[tail_magnitude])
}

/// See [`super::Kernels::magnitude`].
#[inline(always)]
pub(super) fn magnitude<T: Scalar, E: Element<Compute = T>, S: Load<T, E>>(simd: S, x: &[E]) -> T {
    let chunks = x.chunks_exact(S::LANES);
    let tail = chunks.remainder();
    finish_magnitude(simd, fold_magnitudes(simd, simd.zero(), chunks), tail)
}

/// `acc` with the magnitudes of the vectors `chunks` folded in.
#[inline(always)]
fn fold_magnitudes<'x, T: Scalar, E: Element<Compute = T> + 'x, S: Load<T, E>>(
    simd: S,
    mut acc: S::V,
    chunks: impl Iterator<Item = &'x [E]>,
) -> S::V {
    for chunk in chunks {
        acc = simd.fold_magnitude(acc, simd.load_stored(chunk));
    }
    acc
}

/// The largest of the magnitudes folded into `acc` and those of `tail`, NaN winning over all.
#[inline(always)]
fn finish_magnitude<T: Scalar, E: Element<Compute = T>, S: Simd<T>>(simd: S, acc: S::V, tail: &[E]) -> T {
    let mut lanes = [T::zero(); MAX_LANES];
    simd.store(acc, &mut lanes);
    let tail = tail.iter().map(|x| x.widen());
    lanes[..S::LANES].iter().copied().chain(tail).fold(T::zero(), larger_magnitude)
}

/// See [`super::Kernels::row_maxima`].
#[inline(always)]
pub(super) fn row_maxima<T: Scalar, S: Simd<T>>(simd: S, rows: Rows<'_, T>, len: usize, out: &mut [T]) {
    for (r, out) in out.iter_mut().enumerate().take(rows.rows) {
        let row = &rows.data[r * rows.stride..][..len];
        let mut chunks = row.chunks_exact(S::LANES);
        let first = simd.load(chunks.next().expect("a row of at least one vector"));
        *out = simd.reduce_max(chunks.fold(first, |m, x| simd.max(m, simd.load(x))));
    }
}

/// See [`super::Kernels::exp_rows`].
#[inline(always)]
pub(super) fn exp_rows<T: Scalar, S: Simd<T>>(
    simd: S,
    rows: RowsMut<'_, T>,
    len: usize,
    maxima: &[T],
    sums: &mut [T],
) {
    for r in 0..rows.rows {
        let row = &mut rows.data[r * rows.stride..][..len];
        let max = maxima[r];
        if max == T::neg_infinity() {
            row.fill(T::zero());
            sums[r] = T::zero();
            continue;
        }
        let shift = simd.splat(max);
        let mut sum = simd.zero();
        for x in row.chunks_exact_mut(S::LANES) {
            let e = exp_shifted(simd, simd.load(x), shift);
            simd.store(e, x);
            sum = simd.add(sum, e);
        }
        sums[r] = simd.reduce_add(sum);
    }
}

/// See [`super::Kernels::exp_differences`].
#[inline(always)]
pub(super) fn exp_differences<T: Scalar, S: Simd<T>>(simd: S, a: &[T], b: &[T], out: &mut [T]) {
    let lanes = S::LANES;
    for ((a, b), out) in a.chunks(lanes).zip(b.chunks(lanes)).zip(out.chunks_mut(lanes)) {
        // A partial last chunk goes through a scratch vector: the extra lanes compute exp(0).
        let (mut va, mut vb, mut e) =
            ([T::zero(); MAX_LANES], [T::zero(); MAX_LANES], [T::zero(); MAX_LANES]);
        va[..a.len()].copy_from_slice(a);
        vb[..b.len()].copy_from_slice(b);
        simd.store(exp_shifted(simd, simd.load(&va), simd.load(&vb)), &mut e);
        out.copy_from_slice(&e[..out.len()]);
    }
}

/// See [`super::Kernels::accumulate_values`]: groups of `MR` rows × `NC` vectors of values, and
/// rows left over (a few queries: decoding) one at a time × `NC1` vectors. With `MEASURE`, also
/// returns the values' magnitude ([`super::Kernels::accumulate_values_measuring`]): where a tile
/// reads each value row in one pass, the first tile folds it from its loads; otherwise it is
/// measured in a pass of its own first. Without, returns zero.
#[inline(always)]
pub(super) fn accumulate_values<
    T: Scalar,
    E: Element<Compute = T>,
    S: Load<T, E>,
    const MR: usize,
    const NC: usize,
    const NC1: usize,
    const MEASURE: bool,
>(
    simd: S,
    weights: Weights<'_, T>,
    alpha: &[T],
    values: ValueRows<'_, E>,
    o: &mut [T],
) -> T {
    let Weights { p, rows, n_keys } = weights;
    if n_keys == 0 {
        // Nothing to add: only the rescale.
        for (o, &a) in o.chunks_exact_mut(values.vectors * S::LANES).zip(&alpha[..rows]) {
            o.iter_mut().for_each(|x| *x = *x * a);
        }
        return T::zero();
    }
    let o_stride = values.vectors * S::LANES;
    let groups = rows / MR * MR;
    // Rows that fit one register tile (a decoding step) read each value row once, from memory.
    // Where a row takes several column passes, walking every key for one column and then the
    // next strides a whole row per key, a pattern the prefetchers follow badly; so these rows
    // take the keys a short run at a time, every column of a run before the next, and ask for
    // the next run's rows ahead (a row read in one pass goes down the rows in order already).
    // A step of 32/8 heads, d = 128, over 16384 cached positions went from 17.9 to 14.2 ms on
    // 2 Zen 3 threads.
    // Four or five rows alone (a decoding step's stacked heads, fewer than a tile: 32 query heads
    // over 8) take one tile of their own height, each value vector loaded and widened once for
    // all of them rather than once per row; fewer rows keep the wider one-row tile, whose chains
    // of multiply-adds are longer.
    let few = if groups == 0 && (4..MR).contains(&rows) { rows } else { 0 };
    let one_pass = if groups > 0 || few > 0 { values.vectors <= NC } else { values.vectors <= NC1 };
    let run = if rows <= MR && !one_pass { VALUE_RUN } else { n_keys };
    let ones = [T::one(); MR];
    let prefetching = run < n_keys;
    // Values measured by the tiles that read each row in one pass; rows read a column pass at a
    // time are measured first, in a pass of their own, which also brings the block in ahead of
    // the runs (fused into the runs, a GQA step of 32/8 heads over 16384 keys in memory ran 5%
    // slower on one Zen 3 thread).
    let measure_in_tiles = MEASURE && one_pass;
    let measured = Cell::new(if MEASURE && !one_pass {
        // A loop, not a closure per run: one left out of line would lose the level's features.
        let mut acc = simd.zero();
        for run in values.runs(n_keys, values.vectors * S::LANES) {
            acc = fold_magnitudes(simd, acc, run.chunks_exact(S::LANES));
        }
        finish_magnitude::<T, T, S>(simd, acc, &[])
    } else {
        T::zero()
    });
    for first in (0..n_keys).step_by(run) {
        let n_keys = run.min(n_keys - first);
        // The accumulator is rescaled once, before the first run adds to it.
        let alpha = if first == 0 { alpha } else { &ones[..rows.min(MR)] };
        if prefetching {
            // The rows after this run, asked for now (the next run's, or the next block's where
            // `values` goes on): a run is too short for the prefetchers to ramp up on their own.
            let next = values.v.get((first + run) * values.stride..).unwrap_or_default();
            if values.stride == o_stride {
                super::prefetch(&next[..(run * o_stride).min(next.len())]);
            } else {
                // Rows apart (read in place from a wider tensor): each row alone, not the rows of
                // other heads between them. Row by row for all rows, a few instructions a row
                // made a step of 8 heads over 2 at AVX2 1.18 times as slow.
                for row in next.chunks(values.stride).take(run) {
                    super::prefetch(&row[..o_stride.min(row.len())]);
                }
            }
        }
        let values = ValueRows { v: &values.v[first * values.stride..], ..values };
        let tile = |r: usize, height: usize| ValueTile {
            p: &p[r * KEY_BLOCK + first..],
            n_keys,
            alpha: &alpha[r..r + height],
            values,
            o_stride,
            measured: &measured,
        };
        // The first tile of the run (rows from 0) reads every value row of it: that one measures
        // them when asked.
        for g in (0..groups).step_by(MR) {
            let o = &mut o[g * o_stride..(g + MR) * o_stride];
            tile(g, MR).columns_measuring::<S, MR, NC>(measure_in_tiles && g == 0, simd, o);
        }
        match few {
            4 => tile(0, 4).columns_measuring::<S, 4, NC>(measure_in_tiles, simd, &mut o[..4 * o_stride]),
            5 => tile(0, 5).columns_measuring::<S, 5, NC>(measure_in_tiles, simd, &mut o[..5 * o_stride]),
            _ => {
                for r in groups..rows {
                    let o = &mut o[r * o_stride..(r + 1) * o_stride];
                    tile(r, 1).columns_measuring::<S, 1, NC1>(measure_in_tiles && r == 0, simd, o);
                }
            }
        }
    }
    measured.get()
}

/// Keys per run when few rows take a block of values (see [`accumulate_values`]): 16 value rows
/// of d = 128 in f32 are 8 KiB, and the accumulators are stored and reloaded once per run, a few
/// percent of its multiply-adds.
const VALUE_RUN: usize = 16;

/// The operands of `P·V` register tiles: rows of `p` from its start, values stored as `E`; with
/// `MEASURE`, the tiles gather the magnitude of the values they read into `measured`.
#[derive(Clone, Copy)]
struct ValueTile<'a, T, E, const MEASURE: bool = false> {
    p: &'a [T],
    n_keys: usize,
    alpha: &'a [T],
    values: ValueRows<'a, E>,
    o_stride: usize,
    measured: &'a Cell<T>,
}

impl<T: Scalar, E: Element<Compute = T>> ValueTile<'_, T, E> {
    /// Every column of the tile ([`VectorTile::columns`]), measuring its values if `measure`.
    #[inline(always)]
    fn columns_measuring<S: Load<T, E>, const MR: usize, const NC: usize>(
        self,
        measure: bool,
        simd: S,
        o: &mut [T],
    ) {
        if measure {
            let ValueTile { p, n_keys, alpha, values, o_stride, measured } = self;
            let tile: ValueTile<T, E, true> = ValueTile { p, n_keys, alpha, values, o_stride, measured };
            tile.columns::<S, MR, NC>(simd, o);
        } else {
            self.columns::<S, MR, NC>(simd, o);
        }
    }
}

/// A register tile over the vectors of a value-like row (`P·V` and `Pᵀ·X` alike): `run` computes
/// the `MR × NC` block at vector `c`, and `columns` walks every vector with it.
trait VectorTile<T: Scalar, E: Element>: Copy {
    /// Vectors in each output row.
    fn vectors(&self) -> usize;

    /// One `MR × NC` tile from vector `c` into `o`.
    fn run<S: Load<T, E>, const MR: usize, const NC: usize>(self, simd: S, c: usize, o: &mut [T]);

    /// Every column of `MR` rows: groups of `NC` vectors, then the rest four, two and one at a
    /// time. (One at a time, a decoding step's row of d = 64 at AVX-512, four vectors under a
    /// tile of eight, walked every key four times with one chain of multiply-adds each.)
    #[inline(always)]
    fn columns<S: Load<T, E>, const MR: usize, const NC: usize>(self, simd: S, o: &mut [T]) {
        let vectors = self.vectors();
        let mut c = 0;
        while c + NC <= vectors {
            self.run::<S, MR, NC>(simd, c, o);
            c += NC;
        }
        if NC > 4 && c + 4 <= vectors {
            self.run::<S, MR, 4>(simd, c, o);
            c += 4;
        }
        if NC > 2 && c + 2 <= vectors {
            self.run::<S, MR, 2>(simd, c, o);
            c += 2;
        }
        while c < vectors {
            self.run::<S, MR, 1>(simd, c, o);
            c += 1;
        }
    }
}

impl<T: Scalar, E: Element<Compute = T>, const MEASURE: bool> VectorTile<T, E>
    for ValueTile<'_, T, E, MEASURE>
{
    #[inline(always)]
    fn vectors(&self) -> usize {
        self.values.vectors
    }

    /// One `MR × NC` tile from value vector `c`: `O·α` is loaded into the accumulators, every key
    /// adds `P[r, j] · V_j`, and the result is stored once; with `MEASURE`, the value vectors are
    /// folded into the magnitude as they are loaded.
    #[inline(always)]
    fn run<S: Load<T, E>, const MR: usize, const NC: usize>(self, simd: S, c: usize, o: &mut [T]) {
        let lanes = S::LANES;
        let ValueTile { p, n_keys, alpha, values, o_stride, measured } = self;
        let column = c * lanes;
        // Rows of `p` a constant stride apart: the broadcasts address them with fixed offsets.
        let p_rows: [&[T]; MR] = rows(p, KEY_BLOCK, n_keys);
        let mut acc = [[simd.zero(); NC]; MR];
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = simd.splat(alpha[r]);
            let o_row = &o[r * o_stride + column..][..NC * lanes];
            for (k, acc) in acc.iter_mut().enumerate() {
                *acc = simd.mul(simd.load(&o_row[k * lanes..]), a);
            }
        }
        let mut magnitude = simd.zero();
        // Whole strides, so that the column range checked in the loop is the same every time; a
        // last row that ends the caller's tensor, short of a whole stride, alone (peeled in every
        // case, the rows' loop took 3.5% more instructions at AVX2 in a decoding step).
        let (v_rows, v_last) = if values.v.len() >= n_keys * values.stride {
            (values.v, None)
        } else {
            let (v_rows, v_last) = values.split_last(n_keys, values.vectors * lanes);
            (v_rows, Some(v_last))
        };
        for (j, v_row) in (0..n_keys).zip(v_rows.chunks_exact(values.stride)) {
            let v_row = &v_row[column..];
            add_value_row::<T, E, S, MR, NC, MEASURE>(simd, (&p_rows, j), v_row, &mut acc, &mut magnitude);
        }
        if let Some(v_last) = v_last {
            let last = (&p_rows, n_keys - 1);
            add_value_row::<T, E, S, MR, NC, MEASURE>(
                simd,
                last,
                &v_last[column..],
                &mut acc,
                &mut magnitude,
            );
        }
        store_tile(simd, &acc, o, o_stride, column);
        if MEASURE {
            measured.set(larger_magnitude(measured.get(), finish_magnitude::<T, T, S>(simd, magnitude, &[])));
        }
    }
}

/// Adds `P[r, j] · V_j` for the tile's `MR` rows to `acc`: `v` is value row `j` from the tile's
/// first column; with `MEASURE`, its vectors are folded into `magnitude`. A function rather than
/// a closure, which the compiler did not inline: its intrinsics outside the level's
/// `#[target_feature]` entry became calls.
#[inline(always)]
fn add_value_row<
    T: Scalar,
    E: Element<Compute = T>,
    S: Load<T, E>,
    const MR: usize,
    const NC: usize,
    const MEASURE: bool,
>(
    simd: S,
    (p_rows, j): (&[&[T]; MR], usize),
    v: &[E],
    acc: &mut [[S::V; NC]; MR],
    magnitude: &mut S::V,
) {
    let lanes = S::LANES;
    if MEASURE {
        // Few rows (decoding): the weights first, then each value vector loaded, folded and used
        // before the next, so that the vectors of a row are not all live at once beside the
        // accumulators and the fold's registers (on AVX2 a row of 8 vectors spilled).
        let mut w = [simd.zero(); MR];
        for (w, p_row) in w.iter_mut().zip(p_rows) {
            *w = simd.splat(p_row[j]);
        }
        for k in 0..NC {
            let v = simd.load_stored(&v[k * lanes..][..lanes]);
            *magnitude = simd.fold_magnitude(*magnitude, v);
            for r in 0..MR {
                acc[r][k] = simd.mul_add(w[r], v, acc[r][k]);
            }
        }
    } else {
        let v: [S::V; NC] = load_vectors(simd, &v[..NC * lanes], lanes);
        for r in 0..MR {
            let w = simd.splat(p_rows[r][j]);
            for k in 0..NC {
                acc[r][k] = simd.mul_add(w, v[k], acc[r][k]);
            }
        }
    }
}

/// Stores an `MR × NC` block of accumulators into rows `o_stride` apart of `o`, from `column`.
#[inline(always)]
fn store_tile<T: Scalar, E: Element, S: Load<T, E>, const MR: usize, const NC: usize>(
    simd: S,
    acc: &[[S::V; NC]; MR],
    o: &mut [T],
    o_stride: usize,
    column: usize,
) {
    let lanes = S::LANES;
    for (r, acc) in acc.iter().enumerate() {
        let o_row = &mut o[r * o_stride + column..][..NC * lanes];
        for (k, &x) in acc.iter().enumerate() {
            simd.store(x, &mut o_row[k * lanes..]);
        }
    }
}

/// See [`super::Kernels::accumulate_transposed`]: groups of `MR` output rows (keys) × `NC`
/// vectors, the keys left over one at a time. For each weight row `r` the `MR` weights of a group
/// are side by side in `P`'s row, so the broadcasts read one short run per row.
#[inline(always)]
pub(super) fn accumulate_transposed<
    T: Scalar,
    E: Element,
    S: Load<T, E>,
    const MR: usize,
    const NC: usize,
>(
    simd: S,
    weights: Weights<'_, T>,
    values: ValueRows<'_, E>,
    o: &mut [T],
) {
    let Weights { p, rows, n_keys } = weights;
    let o_stride = values.vectors * S::LANES;
    let groups = n_keys / MR * MR;
    let tile = |first| TransposedTile { p: &p[first..], rows, values, o_stride };
    for g in (0..groups).step_by(MR) {
        tile(g).columns::<S, MR, NC>(simd, &mut o[g * o_stride..(g + MR) * o_stride]);
    }
    for j in groups..n_keys {
        tile(j).columns::<S, 1, NC>(simd, &mut o[j * o_stride..(j + 1) * o_stride]);
    }
}

/// The operands of `Pᵀ·X` register tiles: `p` from the group's first key (column), `rows` weight
/// rows of [`KEY_BLOCK`] scalars, the rows `X_r` stored as `E`.
#[derive(Clone, Copy)]
struct TransposedTile<'a, T, E> {
    p: &'a [T],
    rows: usize,
    values: ValueRows<'a, E>,
    o_stride: usize,
}

impl<T: Scalar, E: Element> VectorTile<T, E> for TransposedTile<'_, T, E> {
    #[inline(always)]
    fn vectors(&self) -> usize {
        self.values.vectors
    }

    /// One `MR × NC` tile from vector `c`: loaded once, every weight row adds `P[r, j] · X_r` to
    /// output row `j`, stored once.
    #[inline(always)]
    fn run<S: Load<T, E>, const MR: usize, const NC: usize>(self, simd: S, c: usize, o: &mut [T]) {
        let lanes = S::LANES;
        let TransposedTile { p, rows, values, o_stride } = self;
        let column = c * lanes;
        let mut acc = [[simd.zero(); NC]; MR];
        for (j, acc) in acc.iter_mut().enumerate() {
            let o_row = &o[j * o_stride + column..][..NC * lanes];
            for (k, acc) in acc.iter_mut().enumerate() {
                *acc = simd.load(&o_row[k * lanes..]);
            }
        }
        if let Some(last) = rows.checked_sub(1) {
            // Every row but the last as whole rows of `X` and of `P` (`chunks_exact`: the slices'
            // lengths are the strides, so the loop checks no bounds), then the last row alone.
            let (x_rows, x_last) = values.v.split_at(last * values.stride);
            let (p_rows, p_last) = p.split_at(last * KEY_BLOCK);
            for (x_row, w) in x_rows.chunks_exact(values.stride).zip(p_rows.chunks_exact(KEY_BLOCK)) {
                let x_row = &x_row[column..column + NC * lanes];
                outer_product_step::<T, E, S, MR, NC>(simd, &mut acc, &w[..MR], x_row);
            }
            let x_last = &x_last[column..column + NC * lanes];
            outer_product_step::<T, E, S, MR, NC>(simd, &mut acc, &p_last[..MR], x_last);
        }
        store_tile(simd, &acc, o, o_stride, column);
    }
}

/// See [`super::Kernels::scale_columns`]: whole vectors, then the last few columns one by one.
#[inline(always)]
pub(super) fn scale_columns<T: Scalar, S: Simd<T>>(simd: S, rows: RowsMut<'_, T>, scales: &[T]) {
    let len = scales.len();
    let whole = len / S::LANES * S::LANES;
    let (vectors, rest) = scales.split_at(whole);
    for r in 0..rows.rows {
        let row = &mut rows.data[r * rows.stride..][..len];
        let (row_vectors, row_rest) = row.split_at_mut(whole);
        for (x, scale) in row_vectors.chunks_exact_mut(S::LANES).zip(vectors.chunks_exact(S::LANES)) {
            simd.store(simd.mul(simd.load(x), simd.load(scale)), x);
        }
        row_rest.iter_mut().zip(rest).for_each(|(x, &scale)| *x = *x * scale);
    }
}

/// See [`super::Kernels::softmax_gradient`].
#[inline(always)]
pub(super) fn softmax_gradient<T: Scalar, S: Simd<T>>(
    simd: S,
    p: Rows<'_, T>,
    dp: RowsMut<'_, T>,
    len: usize,
    delta: &[T],
) {
    for (r, &delta) in delta.iter().enumerate().take(dp.rows) {
        let p_row = &p.data[r * p.stride..][..len];
        let dp_row = &mut dp.data[r * dp.stride..][..len];
        let delta = simd.splat(delta);
        for (x, w) in dp_row.chunks_exact_mut(S::LANES).zip(p_row.chunks_exact(S::LANES)) {
            let gradient = simd.sub(simd.load(x), delta);
            simd.store(simd.mul(simd.load(w), gradient), x);
        }
    }
}
