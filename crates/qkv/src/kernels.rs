//! The SIMD microkernels of the fast path, behind a narrow interface: pack keys, values and
//! queries into the layouts the kernels read; a register-blocked `S = Q·Kᵀ` tile; the row maximum;
//! exp-and-sum; and a register-blocked `O = α·O + P·V`.
//!
//! Nothing here knows about masks, the online softmax or threads: that is `flash.rs`. Every
//! kernel is generic over [`Vector`], so `f32` (16 lanes) and `f64` (8 lanes) share the code.
//! There is no `unsafe`: the vectors are `wide`'s, and every load goes through a slice whose
//! bounds check the compiler hoists out of the inner loops (checked in the profiles).

mod vector;

use ndarray::ArrayView2;

pub use vector::Vector;

/// An element type with a vector type for the kernels. A supertrait of [`crate::Real`], in a
/// private module so that no other crate can name or implement it.
pub trait Element: Copy + Send + Sync + Default + 'static {
    /// The SIMD vector of this element type.
    type Vector: Vector<Scalar = Self>;
}

impl Element for f32 {
    type Vector = wide::f32x16;
}

impl Element for f64 {
    type Vector = wide::f64x8;
}

/// The vector type of `T`.
pub(crate) type V<T> = <T as Element>::Vector;

/// Vectors of keys per `Q·Kᵀ` microtile: a microtile is `SCORE_ROWS` queries × `KEY_VECTORS ·
/// LANES` keys (6 × 64 for f32), 24 accumulators, leaving registers for the four key loads and
/// the broadcast query element (the shape of the `gemm` crate's AVX-512 kernel; 8 × 32 measured
/// the same here).
pub(crate) const KEY_VECTORS: usize = 4;
/// Queries per `Q·Kᵀ` microtile.
pub(crate) const SCORE_ROWS: usize = 6;
/// Queries per `P·V` microtile.
pub(crate) const VALUE_ROWS: usize = 6;
/// Vectors of value columns per `P·V` microtile: 6 × 4 = 24 accumulators.
const VALUE_VECTORS: usize = 4;

/// Keys in one packed key panel (64 for f32, 32 for f64).
pub(crate) fn key_panel_width<T: Element>() -> usize {
    KEY_VECTORS * V::<T>::LANES
}

/// Vectors needed to hold `n` scalars.
pub(crate) fn vectors_for<T: Element>(n: usize) -> usize {
    n.div_ceil(V::<T>::LANES)
}

/// Packs keys `first_key ..` (at most [`key_panel_width`] of them) of `k` (`[n_k, d]`) into one
/// panel: for each component `c`, the vectors `K[first_key .., c]` side by side (zeros past the
/// last key), so the score kernel reads the panel front to back. A full panel overwrites every
/// element; a partial one clears the panel first.
pub(crate) fn pack_key_panel<T: Element>(k: ArrayView2<T>, first_key: usize, panel: &mut [V<T>]) {
    let width = key_panel_width::<T>();
    let last = (first_key + width).min(k.nrows());
    let out = V::<T>::scalars_mut(panel);
    if last - first_key < width {
        out.fill(T::default());
    }
    for (lane, key) in k.slice(ndarray::s![first_key..last, ..]).rows().into_iter().enumerate() {
        let column = out[lane..].iter_mut().step_by(width);
        // Contiguous rows (the usual case) as slices: ndarray's element iterator is much slower.
        match key.as_slice() {
            Some(key) => column.zip(key).for_each(|(o, &x)| *o = x),
            None => column.zip(key.iter()).for_each(|(o, &x)| *o = x),
        }
    }
}

/// Packs value row `v_row` (`d_v` scalars) into `out` (`vectors_for(d_v)` vectors, zero-padded).
pub(crate) fn pack_value_row<T: Element>(v_row: ndarray::ArrayView1<T>, out: &mut [V<T>]) {
    let out = &mut V::<T>::scalars_mut(out)[..v_row.len()];
    match v_row.as_slice() {
        Some(row) => out.copy_from_slice(row),
        None => out.iter_mut().zip(v_row).for_each(|(o, &x)| *o = x),
    }
}

/// Packs `rows` queries starting at `q`'s row `first`, times `scale`, into groups of
/// [`SCORE_ROWS`]: for each group, component-major (`[d][group rows]`), so the score kernel
/// broadcasts consecutive scalars. Returns nothing; `out` must hold `rows · d` scalars.
pub(crate) fn pack_queries<T: Element + crate::Real>(
    q: ArrayView2<T>,
    first: usize,
    rows: usize,
    scale: T,
    out: &mut [T],
) {
    let d = q.ncols();
    for g in (0..rows).step_by(SCORE_ROWS) {
        let mr = SCORE_ROWS.min(rows - g);
        let group = &mut out[g * d..(g + mr) * d];
        for r in 0..mr {
            let column = group[r..].iter_mut().step_by(mr);
            let row = q.row(first + g + r);
            match row.as_slice() {
                Some(row) => column.zip(row).for_each(|(o, &x)| *o = x * scale),
                None => column.zip(row.iter()).for_each(|(o, &x)| *o = x * scale),
            }
        }
    }
}

/// Queries `first .. first + rows` of `q`, times `scale`, row after row: the layout of
/// [`direct_scores`].
pub(crate) fn pack_query_rows<T: Element + crate::Real>(
    q: ArrayView2<T>,
    first: usize,
    rows: usize,
    scale: T,
    out: &mut [T],
) {
    let d = q.ncols();
    for (r, out) in out.chunks_exact_mut(d).take(rows).enumerate() {
        for (o, &x) in out.iter_mut().zip(q.row(first + r)) {
            *o = x * scale;
        }
    }
}

/// `S[r, j] = Q_r · K_j` for a few query rows (see [`pack_query_rows`]) straight from the key
/// rows `k` (each contiguous): a dot product per pair, vectorised along `d`. For decoding, where
/// packing the keys would cost more than using them once.
pub(crate) fn direct_scores<T: Element + crate::Real>(
    q: &[T],
    rows: usize,
    k: ArrayView2<T>,
    s: &mut [V<T>],
    s_stride: usize,
) {
    let (d, lanes) = (k.ncols(), V::<T>::LANES);
    let whole = d / lanes * lanes;
    let s = V::<T>::scalars_mut(s);
    let s_stride = s_stride * lanes;
    for (j, key) in k.rows().into_iter().enumerate() {
        let key = key.to_slice().expect("the caller passes contiguous key rows");
        for (r, q_row) in q.chunks_exact(d).take(rows).enumerate() {
            let mut acc = V::<T>::default();
            for c in (0..whole).step_by(lanes) {
                acc = V::<T>::load(&q_row[c..]).mul_add(V::<T>::load(&key[c..]), acc);
            }
            let tail = q_row[whole..].iter().zip(&key[whole..]).fold(T::zero(), |a, (&x, &y)| a + x * y);
            s[r * s_stride + j] = acc.reduce_add() + tail;
        }
    }
}

/// `S[r, key] = Q_r · K_key` for `rows` packed queries (see [`pack_queries`]) against `panels`
/// consecutive key panels, into `s` (`rows` rows of `s_stride` vectors, panel `p` at vectors
/// `KEY_VECTORS·p ..`). Also sets `row_max[r]` to the lane-wise maximum of each row's scores, so
/// that a tile that needs no masking has its row maxima without another pass (the first panel
/// sets it, the others fold into it: no fill beforehand, which the compiler turned into
/// scatters).
///
/// `group_keys(g)` is how many of the tile's keys the rows of the group starting at row `g`
/// need (`usize::MAX` for all): a full group of [`SCORE_ROWS`] computes only the vectors that
/// hold them, and skips the panels past them. The scores it leaves out are stale, so the caller
/// must hide them (a causal tile on the diagonal, where they are masked anyway).
#[allow(clippy::too_many_arguments)] // the operands of one GEMM-like call, each needed
pub(crate) fn scores<T: Element>(
    q: &[T],
    d: usize,
    rows: usize,
    keys: &[V<T>],
    panels: usize,
    s: &mut [V<T>],
    s_stride: usize,
    row_max: &mut [V<T>],
    group_keys: impl Fn(usize) -> usize,
) {
    let panel_len = d * KEY_VECTORS;
    let width = key_panel_width::<T>();
    for p in 0..panels {
        let panel = &keys[p * panel_len..(p + 1) * panel_len];
        for g in (0..rows).step_by(SCORE_ROWS) {
            let mr = SCORE_ROWS.min(rows - g);
            let needed = group_keys(g).saturating_sub(p * width);
            if needed == 0 {
                continue;
            }
            let q = &q[g * d..(g + mr) * d];
            let s = &mut s[g * s_stride + p * KEY_VECTORS..];
            let m = &mut row_max[g..g + mr];
            let first = p == 0;
            match (mr, vectors_for::<T>(needed)) {
                (6, 1) => score_tile::<T, 6, 1>(q, panel, s, s_stride, m, first),
                (6, 2) => score_tile::<T, 6, 2>(q, panel, s, s_stride, m, first),
                (6, 3) => score_tile::<T, 6, 3>(q, panel, s, s_stride, m, first),
                (6, _) => score_tile::<T, 6, KEY_VECTORS>(q, panel, s, s_stride, m, first),
                // Partial groups compute the whole panel: the extra scores are harmless.
                (5, _) => score_tile::<T, 5, KEY_VECTORS>(q, panel, s, s_stride, m, first),
                (4, _) => score_tile::<T, 4, KEY_VECTORS>(q, panel, s, s_stride, m, first),
                (3, _) => score_tile::<T, 3, KEY_VECTORS>(q, panel, s, s_stride, m, first),
                (2, _) => score_tile::<T, 2, KEY_VECTORS>(q, panel, s, s_stride, m, first),
                _ => score_tile::<T, 1, KEY_VECTORS>(q, panel, s, s_stride, m, first),
            }
        }
    }
}

/// One `MR × NV` register tile of scores (the first `NV` of a panel's [`KEY_VECTORS`]): the
/// accumulators stay in registers across the whole `d` loop and are stored once. Their maxima
/// set `row_max` for the `first` panel and fold into it for the others.
#[inline(always)]
fn score_tile<T: Element, const MR: usize, const NV: usize>(
    q: &[T],
    panel: &[V<T>],
    s: &mut [V<T>],
    s_stride: usize,
    row_max: &mut [V<T>],
    first: bool,
) {
    let mut acc = [[V::<T>::default(); NV]; MR];
    for (a, b) in q.chunks_exact(MR).zip(panel.chunks_exact(KEY_VECTORS)) {
        for r in 0..MR {
            let a = V::<T>::splat(a[r]);
            for v in 0..NV {
                acc[r][v] = a.mul_add(b[v], acc[r][v]);
            }
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        s[r * s_stride..r * s_stride + NV].copy_from_slice(acc);
        let start = if first { acc[0] } else { row_max[r] };
        row_max[r] = acc.iter().fold(start, |m, &x| m.max(x));
    }
}

/// The largest scalar in `row`.
pub(crate) fn row_max<T: Element>(row: &[V<T>]) -> T {
    let mut m = row[0];
    for &x in &row[1..] {
        m = m.max(x);
    }
    m.reduce_max()
}

/// `out[i] = exp(a[i] - b[i])` for `a[i] <= b[i]`: the online softmax's rescale factors of a
/// block of rows, a vector at a time.
pub(crate) fn exp_differences<T: Element>(a: &[T], b: &[T], out: &mut [T]) {
    let lanes = V::<T>::LANES;
    for ((a, b), out) in a.chunks(lanes).zip(b.chunks(lanes)).zip(out.chunks_mut(lanes)) {
        let (mut va, mut vb) = ([V::<T>::default()], [V::<T>::default()]);
        V::<T>::scalars_mut(&mut va)[..a.len()].copy_from_slice(a);
        V::<T>::scalars_mut(&mut vb)[..b.len()].copy_from_slice(b);
        let e = [va[0].exp_shifted(vb[0])];
        out.copy_from_slice(&V::<T>::scalars(&e)[..out.len()]);
    }
}

/// Replaces each score `s` in `row` by `exp(s - max)` and returns their sum. Needs `s <= max`
/// (true for the row maximum); `-inf` scores give exactly 0.
pub(crate) fn exp_and_sum<T: Element>(row: &mut [V<T>], max: T) -> T {
    let shift = V::<T>::splat(max);
    let mut sum = V::<T>::default();
    for x in row.iter_mut() {
        *x = x.exp_shifted(shift);
        sum = sum.add(*x);
    }
    sum.reduce_add()
}

/// The weights `P` of one tile: `rows` rows of `stride` vectors each, of which the first
/// `n_keys` scalars count.
#[derive(Clone, Copy)]
pub(crate) struct Weights<'a, T: Element> {
    pub(crate) p: &'a [V<T>],
    pub(crate) stride: usize,
    pub(crate) rows: usize,
    pub(crate) n_keys: usize,
}

/// `O_r = α_r · O_r + Σ_{j < n_keys} P[r, j] · V_j` for every row of `weights`: `v` holds the
/// values, `dv · LANES` scalars per key (packed by [`pack_value_row`], or the caller's own rows
/// when `d_v` is a whole number of vectors; any alignment), `o` the accumulators (`dv` vectors
/// per row).
pub(crate) fn accumulate_values<T: Element>(
    weights: Weights<'_, T>,
    alpha: &[T],
    v: &[T],
    dv: usize,
    o: &mut [V<T>],
) {
    let Weights { p, stride: p_stride, rows, n_keys } = weights;
    let p = V::<T>::scalars(p);
    let p_stride = p_stride * V::<T>::LANES;
    let v = &v[..n_keys * dv * V::<T>::LANES];
    for g in (0..rows).step_by(VALUE_ROWS) {
        let mr = VALUE_ROWS.min(rows - g);
        for c in (0..dv).step_by(VALUE_VECTORS) {
            let nc = VALUE_VECTORS.min(dv - c);
            let tile = ValueTile { p: &p[g * p_stride..], p_stride, n_keys, alpha: &alpha[g..], v, dv, c };
            let o = &mut o[g * dv..];
            match (mr, nc) {
                (6, 4) => tile.run::<6, 4>(o),
                (6, 3) => tile.run::<6, 3>(o),
                (6, 2) => tile.run::<6, 2>(o),
                (6, _) => tile.run::<6, 1>(o),
                (5, 4) => tile.run::<5, 4>(o),
                (4, 4) => tile.run::<4, 4>(o),
                (3, 4) => tile.run::<3, 4>(o),
                (2, 4) => tile.run::<2, 4>(o),
                (1, 4) => tile.run::<1, 4>(o),
                // Rare edges (few rows and a narrow last column group): one row at a time.
                (mr, nc) => {
                    for r in 0..mr {
                        let row = ValueTile { p: &tile.p[r * p_stride..], alpha: &tile.alpha[r..], ..tile };
                        let o = &mut o[r * dv..];
                        match nc {
                            4 => row.run::<1, 4>(o),
                            3 => row.run::<1, 3>(o),
                            2 => row.run::<1, 2>(o),
                            _ => row.run::<1, 1>(o),
                        }
                    }
                }
            }
        }
    }
}

/// The operands of one `P·V` register tile: rows of `p` from its start, value columns from
/// vector `c`.
#[derive(Clone, Copy)]
struct ValueTile<'a, T: Element> {
    p: &'a [T],
    p_stride: usize,
    n_keys: usize,
    alpha: &'a [T],
    v: &'a [T],
    dv: usize,
    c: usize,
}

impl<T: Element> ValueTile<'_, T> {
    #[inline(always)]
    fn run<const MR: usize, const NC: usize>(self, o: &mut [V<T>]) {
        let ValueTile { p, p_stride, n_keys, alpha, v, dv, c } = self;
        let p_rows: [&[T]; MR] = std::array::from_fn(|r| &p[r * p_stride..r * p_stride + n_keys]);
        let mut acc = [[V::<T>::default(); NC]; MR];
        for r in 0..MR {
            let a = V::<T>::splat(alpha[r]);
            for k in 0..NC {
                acc[r][k] = o[r * dv + c + k].mul(a);
            }
        }
        let lanes = V::<T>::LANES;
        for (j, v_row) in v.chunks_exact(dv * lanes).enumerate() {
            let v_row: [V<T>; NC] = std::array::from_fn(|k| V::<T>::load(&v_row[(c + k) * lanes..]));
            for r in 0..MR {
                let w = V::<T>::splat(p_rows[r][j]);
                for k in 0..NC {
                    acc[r][k] = w.mul_add(v_row[k], acc[r][k]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            o[r * dv + c..r * dv + c + NC].copy_from_slice(acc);
        }
    }
}

#[cfg(test)]
mod tests;
