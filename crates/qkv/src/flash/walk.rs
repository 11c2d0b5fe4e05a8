//! One block of query rows walking its key tiles: scores, masks, the online softmax and the
//! value products, tile by tile, and the softmax state they leave (merged across key splits,
//! written out once at the end).

use std::mem::MaybeUninit;
use std::ops::Range;

use super::packed::Packed;
use super::{Measured, OutBlock, Queries, StoredKeys};
use crate::element::Real;
use crate::kernels::{
    self, Buffer, Element, KEY_BLOCK, Kernels, Layout, OutRows, Rows, RowsMut, ScoreTile, Weights,
};
use crate::masking::MaskSet;
use crate::shape::Shape;
use crate::softmax;
use ndarray::{ArrayView2, ArrayViewMut2, Axis};

/// Everything a task of one head reads: inputs stored as `E`, computed in `T`.
pub(super) struct Problem<'p, T: Real, E: Element> {
    pub(super) shape: Shape,
    pub(super) q: Queries<'p, T, E>,
    /// Rows of `q` per query (stacked heads): row `r` takes the masks of query `r / rows_per_query`.
    pub(super) rows_per_query: usize,
    pub(super) source: StoredKeys<'p, E>,
    /// The keys when decoding: scores come from the key rows themselves
    /// (`Kernels::direct_scores`), with no packed keys.
    pub(super) key_rows: Option<ArrayView2<'p, E>>,
    pub(super) masks: MaskSet<'p, T>,
}

/// The buffers a block of query rows borrows while it runs, one set per thread (see
/// `work::map_items`), grown as needed and never shrunk. Every block writes what it reads of them
/// before reading it (queries packed, scores computed, maxima and sums folded), so nothing
/// carries over from one block to the next.
pub(super) struct Scratch<T: Real> {
    /// Packed, scaled queries.
    q: Vec<T>,
    /// A tile of scores, rows the level's `SCORE_STRIDE` apart, then weights.
    s: Buffer<T>,
    /// The score kernel's lane-wise row maxima.
    row_max: Buffer<T>,
    tile_max: Vec<T>,
    m_new: Vec<T>,
    sums: Vec<T>,
    /// Each row's rescale factor `exp(m - m_new)`.
    alpha: Vec<T>,
}

impl<T: Real> Default for Scratch<T> {
    fn default() -> Self {
        let (q, tile_max, m_new, sums, alpha) = Default::default();
        Scratch { q, s: Buffer::zeros(0), row_max: Buffer::zeros(0), tile_max, m_new, sums, alpha }
    }
}

/// The buffers one tile of scores uses and leaves (see [`Walk::next_tile`]): a [`Scratch`]'s,
/// cut to one query block's needs and shared by the blocks that walk their tiles in turn.
pub(super) struct TileBuffers<'s, T> {
    s: &'s mut [T],
    row_max: &'s mut [T],
    tile_max: &'s mut [T],
    m_new: &'s mut [T],
    sums: &'s mut [T],
    alpha: &'s mut [T],
}

impl<T: Real> Scratch<T> {
    /// The buffers for `blocks` blocks of `rows` query rows of width `d` each (`padded` with the
    /// register tile's zero rows) at the level of `K` (its lanes, and its rows of scores
    /// [`Kernels::SCORE_STRIDE`] apart), grown if they are shorter: each block's packed queries,
    /// one after another, and one tile's buffers, which the blocks share.
    pub(super) fn fit<E: Element<Compute = T>, K: Kernels<T, E>>(
        &mut self,
        (blocks, padded, rows): (usize, usize, usize),
        d: usize,
    ) -> (&mut [T], TileBuffers<'_, T>) {
        let Scratch { q, s, row_max, tile_max, m_new, sums, alpha } = self;
        let tile = TileBuffers {
            s: aligned_prefix(s, padded * K::SCORE_STRIDE),
            row_max: aligned_prefix(row_max, padded * K::LANES),
            tile_max: prefix(tile_max, rows),
            m_new: prefix(m_new, rows),
            sums: prefix(sums, rows),
            alpha: prefix(alpha, padded),
        };
        (prefix(q, blocks * padded * d), tile)
    }
}

/// The first `len` elements of `buffer`, grown with zeros if it is shorter.
pub(crate) fn prefix<T: Real>(buffer: &mut Vec<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        buffer.resize(len, T::zero());
    }
    &mut buffer[..len]
}

/// The first `len` elements of `buffer`, made anew (zeroed, aligned) if it is shorter.
pub(crate) fn aligned_prefix<T: Real>(buffer: &mut Buffer<T>, len: usize) -> &mut [T] {
    if buffer.len() < len {
        *buffer = Buffer::zeros(len);
    }
    &mut buffer[..len]
}

/// The online-softmax state of a block of query rows over some keys: running maximum `m` (a
/// reference within `ln(REFERENCE_HEADROOM)` below it where the level raises references lazily,
/// see [`Kernels::RAISES_REFERENCES`]), running sum `l` of `exp(s - m)`, and the unnormalised
/// output `o = Σ exp(s - m) · v` (`o_stride` scalars per row, the value width padded to whole
/// vectors; rows past `m.len()` pad the block to whole register tiles).
pub(super) struct State<T: Real> {
    m: Vec<T>,
    l: Vec<T>,
    o: Buffer<T>,
    o_stride: usize,
    /// The magnitudes of the keys and values read, when decoding.
    pub(super) measured: Measured<T>,
}

impl<'p, T: Real, E: Element<Compute = T>> Problem<'p, T, E> {
    /// The keys and values in `keys`, for the kernels of `K`.
    pub(super) fn packed<K: Kernels<T, E>>(&self, keys: Range<usize>) -> Packed<'p, E> {
        match &self.source {
            StoredKeys::Rows { k, v, v_tensor } => {
                Packed::new::<T, K>(*k, (*v, *v_tensor), keys, self.key_rows.is_none())
            }
            StoredKeys::Contiguous(cached) => Packed::cached::<T, K>(*cached, self.shape.value_dim),
            StoredKeys::Paged(paged) => Packed::paged::<T, K>(*paged, self.shape.value_dim),
        }
    }

    /// The query whose masks row `row` takes.
    fn query(&self, row: usize) -> usize {
        row / self.rows_per_query
    }

    /// The attention-sink logit of row `row`: its stacked head's (see [`MaskSet::sink`]).
    pub(super) fn sink(&self, row: usize) -> Option<T> {
        self.masks.sink(row % self.rows_per_query)
    }

    /// The state of queries `first .. first + rows` over the keys in `keys` (whole key blocks
    /// from a block boundary, except at the end).
    pub(super) fn attend_block<K: Kernels<T, E>>(
        &self,
        kernels: K,
        packed: &Packed<'p, E>,
        first: usize,
        rows: usize,
        keys: Range<usize>,
        scratch: &mut Scratch<T>,
    ) -> State<T> {
        let mut state = State::empty();
        self.attend_block_into(kernels, packed, first..first + rows, keys, scratch, &mut state);
        state
    }

    /// [`Self::attend_block`] of the rows `query_rows` into `state`, whose buffers are reused:
    /// it is reset first, so nothing of what it held carries over.
    pub(super) fn attend_block_into<K: Kernels<T, E>>(
        &self,
        kernels: K,
        packed: &Packed<'p, E>,
        query_rows: Range<usize>,
        keys: Range<usize>,
        scratch: &mut Scratch<T>,
        state: &mut State<T>,
    ) {
        let rows = query_rows.len();
        let (q, mut tile) = scratch.fit::<E, K>((1, self.padded_rows::<K>(rows), rows), self.shape.key_dim);
        if let Some(mut walk) = self.walk::<K>(packed, query_rows, keys, q, state) {
            while walk.next_tile(kernels, &mut tile) {}
        }
    }

    /// The rows a block of `rows` query rows computes: the packed score path computes whole
    /// register tiles, padded with zero queries whose scores (0) and outputs are never read; the
    /// direct path takes rows as they come.
    pub(super) fn padded_rows<K: Kernels<T, E>>(&self, rows: usize) -> usize {
        if self.key_rows.is_some() { rows } else { rows.next_multiple_of(K::TILE_ROWS) }
    }

    /// The walk of the rows `query_rows` over the tiles of `keys` (see [`Walk`]), its queries
    /// packed into `q` (`padded_rows · d_k` scalars) and `state` reset (its buffers reused, so
    /// nothing of what it held carries over); `None` when no key of `keys` is visible to the
    /// block, whose reset state is then its result.
    pub(super) fn walk<'w, K: Kernels<T, E>>(
        &'w self,
        packed: &'w Packed<'p, E>,
        query_rows: Range<usize>,
        keys: Range<usize>,
        q: &'w mut [T],
        state: &'w mut State<T>,
    ) -> Option<Walk<'w, 'p, T, E>> {
        let (first, rows) = (query_rows.start, query_rows.len());
        let padded = self.padded_rows::<K>(rows);
        let o_stride = packed.value_vectors * K::LANES;
        state.reset(rows, padded * o_stride, o_stride);
        // Causal, window and key length: keys before `from` and from `reach` on are hidden from
        // every row of the block (visible ranges only move forward with the query), so their
        // blocks are skipped; blocks inside `clean_keys` are visible to every row and need no mask.
        let block = BlockKeys::of(&self.masks, self.query(first), self.query(first + rows - 1));
        let reach = block.visible.end.min(keys.end);
        let from = packed.tile_start(keys.start, block.visible.start.max(keys.start), K::KEY_PANEL);
        if from >= reach {
            return None;
        }
        let scale = T::from_f64_round(self.masks.scale);
        let direct = self.key_rows.is_some();
        let score_scale = self.q.pack(direct, first, rows, scale, (K::TILE_ROWS, K::LAYOUT), &mut *q);
        Some(Walk {
            problem: self,
            packed,
            first,
            rows,
            padded,
            q,
            score_scale,
            clean_keys: block.clean,
            start: from,
            reach,
            state,
        })
    }
}

/// A query block's pass over its key tiles, a tile a call, so that the blocks of problems whose
/// keys lie interleaved in one tensor can take their tiles in turn (see `AttendCached::run`):
/// the block's packed queries and the factor its scores still take, the keys visible to every
/// row (`clean_keys`, see [`BlockKeys`]), where its next tile starts and where its keys end, and
/// its state.
pub(super) struct Walk<'w, 'p, T: Real, E: Element> {
    problem: &'w Problem<'p, T, E>,
    packed: &'w Packed<'p, E>,
    first: usize,
    rows: usize,
    padded: usize,
    q: &'w [T],
    score_scale: T,
    clean_keys: Range<usize>,
    start: usize,
    reach: usize,
    state: &'w mut State<T>,
}

impl<T: Real, E: Element<Compute = T>> Walk<'_, '_, T, E> {
    /// Runs the next tile into the state (scores, masks, the online softmax's update and
    /// `P·V`) with the buffers of `tile`, which it leaves for the next tile of any block; false
    /// when no tile was left.
    #[inline(always)]
    pub(super) fn next_tile<K: Kernels<T, E>>(&mut self, kernels: K, tile: &mut TileBuffers<'_, T>) -> bool {
        let (problem, packed, state) = (self.problem, self.packed, &mut *self.state);
        let (first, rows, padded, start, reach) =
            (self.first, self.rows, self.padded, self.start, self.reach);
        if start >= reach {
            return false;
        }
        let (q, score_scale, clean_keys) = (self.q, self.score_scale, self.clean_keys.clone());
        let (s, row_max, tile_max) = (&mut *tile.s, &mut *tile.row_max, &mut *tile.tile_max);
        let (m_new, sums, alpha) = (&mut *tile.m_new, &mut *tile.sums, &mut *tile.alpha);
        let masks = &problem.masks;
        let (d, lanes) = (problem.shape.key_dim, K::LANES);
        let o_stride = packed.value_vectors * lanes;
        let direct = problem.key_rows.is_some();
        let elementwise = masks.has_elementwise_masks();
        // Padding rows keep a factor of 1: their outputs are never read, but stay as without reuse.
        alpha[rows..padded].fill(T::one());
        // A tile ends where the stored keys stop lying side by side (a paged cache's block).
        let n_keys = K::KEY_BLOCK.min(reach - start).min(packed.contiguous_keys(start));
        let panels = n_keys.div_ceil(K::KEY_PANEL);
        // A causal tile on the diagonal: each group of rows needs the keys up to its last
        // row's visible end; the scores past it are hidden below.
        let trim = !elementwise && start + n_keys > clean_keys.end;
        // A last panel only partly filled with keys (8 keys in a panel of 64 at AVX-512) needs
        // only the vectors that hold them.
        let partial_panel = n_keys % K::KEY_PANEL != 0;
        // Rows keep their running references where the level raises them lazily, once every
        // row has one: a block with a row yet to see a key (the first, mostly) takes the
        // maxima, which the score kernel finds while the scores are fresh in L1.
        let raise = K::RAISES_REFERENCES && state.m.iter().all(|&m| m != T::neg_infinity());
        if let Some(k) = problem.key_rows {
            // Decoding runs at the vector levels (`Isa::vectors`), whose direct scores fill
            // rows of their `KEY_BLOCK`.
            assert_eq!(K::KEY_BLOCK, KEY_BLOCK, "decoding at a level of its own key block");
            // Split rather than sliced: `slice` took 2.5% of a bf16 decoding step.
            let keys = k.split_at(Axis(0), start).1.split_at(Axis(0), n_keys).0;
            let magnitude = kernels.direct_scores(q, rows, keys, &mut *s);
            state.measured.keys = kernels::larger_magnitude(state.measured.keys, magnitude);
        } else {
            let group_keys = |g: usize| match trim {
                true => {
                    let last = first + (g + K::TILE_ROWS).min(rows) - 1;
                    masks.visible_keys(problem.query(last)).end.saturating_sub(start).min(n_keys)
                }
                false => n_keys,
            };
            let tile = ScoreTile {
                q,
                scale: score_scale,
                d,
                rows: padded,
                real_rows: rows,
                keys: packed.key_block(start, d),
                panels,
                s: &mut *s,
                stride: K::SCORE_STRIDE,
                row_max: &mut *row_max,
                maxima: !raise,
            };
            kernels.scores(tile, (trim || partial_panel).then_some(&group_keys as &dyn Fn(usize) -> usize));
        }
        let scales = packed.scales(start, n_keys);
        if let Some(scales) = scales {
            // Quantized keys: each score takes its key's scale (`s_j · q·K_j`).
            kernels.scale_columns(RowsMut { data: &mut *s, stride: K::SCORE_STRIDE, rows }, scales.keys);
        }
        let used = n_keys.next_multiple_of(lanes);
        let clean = clean_keys.start <= start && start + n_keys <= clean_keys.end;
        let queries = |r: usize| problem.query(first + r);
        let tile = RowsMut { data: &mut s[..], stride: K::SCORE_STRIDE, rows };
        mask_tile(masks, &queries, tile, start..start + n_keys, used, clean);
        let weights = RowsMut { data: &mut *s, stride: K::SCORE_STRIDE, rows };
        if raise {
            m_new.copy_from_slice(&state.m);
            kernels.exp_rows_raising(weights, used, m_new, &mut *sums);
        } else {
            // The maxima the score kernel folded are exact for a tile without masks whose
            // panels hold only its own keys; otherwise masked pairs, padding or keys past
            // `reach` are in them, and the rows are scanned again.
            let fused_max = !direct && clean && n_keys == panels * K::KEY_PANEL && scales.is_none();
            if fused_max {
                kernels.row_maxima(Rows { data: row_max, stride: lanes, rows }, lanes, &mut *tile_max);
            } else {
                kernels.row_maxima(
                    Rows { data: weights.data, stride: K::SCORE_STRIDE, rows },
                    used,
                    &mut *tile_max,
                );
            }
            for r in 0..rows {
                m_new[r] = state.m[r].max(tile_max[r]);
            }
            kernels.exp_rows(weights, used, m_new, &mut *sums);
        }
        kernels.exp_differences(&state.m, m_new, &mut alpha[..rows]);
        for r in 0..rows {
            if m_new[r] == state.m[r] {
                // Exactly 1 where the reference stayed: a row with nothing visible yet (whose
                // `exp(-inf - -inf)` is no number) and, raising references, most rows.
                alpha[r] = T::one();
            }
            state.l[r] = state.l[r] * alpha[r] + sums[r];
            state.m[r] = m_new[r];
        }
        let values = packed.values_from(start);
        if let Some(scales) = scales {
            // Quantized values: each weight takes its value's scale, after the sums took it
            // as it was (`Σ p_j · s_j · V_j`).
            kernels.scale_columns(RowsMut { data: &mut *s, stride: K::SCORE_STRIDE, rows }, scales.values);
        }
        // Decoding checks the caller's values as `P·V` reads them
        // (`accumulate_values_measuring`); on a causal diagonal, whose groups stop short of
        // the tile's last rows, they are measured on their own.
        let mut measure = |magnitude: T| {
            state.measured.values = kernels::larger_magnitude(state.measured.values, magnitude);
        };
        if !trim {
            // A block smaller than a register tile (a decoding step's stacked heads) takes its
            // rows one by one at the lane levels: the padding rows of a tile would cost a third
            // of the work. The pair levels' tiles take whole groups of rows.
            let one_by_one = rows < K::TILE_ROWS && K::LAYOUT == Layout::Lanes;
            let weight_rows = if one_by_one { rows } else { padded };
            let weights = Weights { p: s, rows: weight_rows, n_keys };
            if direct {
                measure(kernels.accumulate_values_measuring(weights, alpha, values, &mut state.o));
            } else {
                kernels.accumulate_values(weights, alpha, values, &mut state.o);
            }
        } else {
            if direct {
                measure(kernels::value_magnitude(kernels, values, n_keys));
            }
            // A causal tile on the diagonal: each group of rows stops at the last key its
            // last row sees. The weights past it are exact zeros, so the sums are unchanged
            // and about half of the diagonal's `P·V` work is skipped.
            for g in (0..padded).step_by(K::TILE_ROWS) {
                let group = K::TILE_ROWS.min(padded - g);
                let last = first + (g + group).min(rows) - 1;
                let end = masks.visible_keys(problem.query(last)).end.clamp(start, start + n_keys);
                let weights = Weights { p: &s[g * K::SCORE_STRIDE..], rows: group, n_keys: end - start };
                let o = &mut state.o[g * o_stride..(g + group) * o_stride];
                kernels.accumulate_values(weights, &alpha[g..g + group], values, o);
            }
        }
        self.start += n_keys;
        true
    }
}

/// The keys a block of query rows (queries `first ..= last`) may see, from the ranges that the
/// causal mask, the window and the key length leave: key tiles outside `visible` are hidden from
/// every row and skipped; inside `clean` every row sees every key and no mask applies.
pub(crate) struct BlockKeys {
    pub(crate) visible: Range<usize>,
    pub(crate) clean: Range<usize>,
}

impl BlockKeys {
    /// The keys of the block of queries `first ..= last` (visible ranges only move forward with
    /// the query, so its first and last rows bound them).
    pub(crate) fn of<T: Real>(masks: &MaskSet<'_, T>, first: usize, last: usize) -> BlockKeys {
        let (first_visible, last_visible) = (masks.visible_keys(first), masks.visible_keys(last));
        let clean = if masks.has_elementwise_masks() { 0..0 } else { last_visible.start..first_visible.end };
        BlockKeys { visible: first_visible.start..last_visible.end, clean }
    }
}

/// Hides, in a tile of scores over keys `keys` (row `r` belonging to query `queries(r)`), every
/// pair the masks hide, and the lanes past the last key up to `used` (padding in the packed keys,
/// up to a whole vector), by writing `-inf`. A `clean` tile (every row sees every key, see
/// [`BlockKeys`]) needs only the padding.
pub(crate) fn mask_tile<T: Real>(
    masks: &MaskSet<'_, T>,
    queries: &dyn Fn(usize) -> usize,
    tile: RowsMut<'_, T>,
    keys: Range<usize>,
    used: usize,
    clean: bool,
) {
    let (start, n_keys) = (keys.start, keys.len());
    let elementwise = masks.has_elementwise_masks();
    let RowsMut { data: s, stride, rows } = tile;
    for r in 0..rows {
        let row = &mut s[r * stride..r * stride + used];
        // Lanes past the block's last key (padding in the packed keys) take no part.
        row[n_keys..].fill(T::neg_infinity());
        let query = queries(r);
        if elementwise {
            masks.apply_row(query, keys.clone(), &mut row[..n_keys]);
        } else if !clean {
            // Ranges alone: hide the keys outside the row's visible range, without the
            // per-pair checks of `apply_row` (same rule, from `visible_keys`).
            let visible = masks.visible_keys(query);
            let (lo, hi) = (visible.start.clamp(start, keys.end), visible.end.clamp(start, keys.end));
            row[..lo - start].fill(T::neg_infinity());
            row[hi - start..n_keys].fill(T::neg_infinity());
        }
    }
}

impl<T: Real> State<T> {
    /// A state of no rows, to be [`reset`](Self::reset).
    pub(super) fn empty() -> State<T> {
        State {
            m: Vec::new(),
            l: Vec::new(),
            o: Buffer::zeros(0),
            o_stride: 0,
            measured: Measured::nothing(),
        }
    }

    /// Empties the state for `rows` rows with an accumulator of `o_len` zeros, `o_stride` per
    /// row, keeping its memory where it is large enough.
    fn reset(&mut self, rows: usize, o_len: usize, o_stride: usize) {
        self.m.clear();
        self.m.resize(rows, T::neg_infinity());
        self.l.clear();
        self.l.resize(rows, T::zero());
        self.o.reset_zeros(o_len);
        self.o_stride = o_stride;
        self.measured = Measured::nothing();
    }

    /// Folds `other` (the same rows over other keys) into `self`: both are rescaled to the larger
    /// maximum before their sums and outputs are added.
    pub(super) fn merge(&mut self, other: &State<T>) {
        self.measured = self.measured.combine(other.measured);
        let stride = self.o_stride;
        for r in 0..self.m.len() {
            let m = self.m[r].max(other.m[r]);
            if m == T::neg_infinity() {
                continue;
            }
            let (a, b) = ((self.m[r] - m).exp(), (other.m[r] - m).exp());
            self.l[r] = self.l[r] * a + other.l[r] * b;
            self.m[r] = m;
            let (mine, theirs) =
                (&mut self.o[r * stride..(r + 1) * stride], &other.o[r * stride..(r + 1) * stride]);
            for (x, &y) in mine.iter_mut().zip(theirs) {
                *x = y.mul_add(b, *x * a);
            }
        }
    }

    /// Writes `o / l` into the block's output, rounded once to the output's type, and `m + ln l`
    /// into its logsumexp when asked for; a row with nothing visible (`l = 0`) gets zeros and a
    /// logsumexp of `-inf`. Row `r` is finished with its attention sink `sink(r)`
    /// ([`softmax::finish`]): this is where the sink joins the row, once, after every part and key
    /// split of the row has been merged.
    pub(super) fn write(&self, block: &mut OutBlock<T>, sink: &dyn Fn(usize) -> Option<T>) {
        let finished = |r: usize| softmax::finish(self.m[r], self.l[r], sink(r));
        if let Some(lse) = &mut block.lse {
            for (r, lse) in lse.iter_mut().enumerate() {
                *lse = finished(r).logsumexp();
            }
        }
        match &mut block.out {
            OutRows::Computed(out) => self.write_rows(out, &finished, |x| x),
            // Half outputs are made only under an f32 compute type (`Element::out_rows`), where
            // `to_f32` is exact: each element is rounded once, from the f32 result.
            OutRows::Bf16(out) => {
                self.write_rows(out, &finished, |x| half::bf16::from_f32(x.to_f32().unwrap_or(f32::NAN)))
            }
            OutRows::F16(out) => {
                self.write_rows(out, &finished, |x| half::f16::from_f32(x.to_f32().unwrap_or(f32::NAN)))
            }
            OutRows::Fresh(out) => self.write_rows(out, &finished, MaybeUninit::new),
        }
        block.written = true;
    }

    /// The finished rows (`finished(r)`, see [`Self::write`]) into `out`, each element stored
    /// with `narrow`.
    fn write_rows<O>(
        &self,
        out: &mut ArrayViewMut2<O>,
        finished: &dyn Fn(usize) -> softmax::Finished<T>,
        narrow: impl Fn(T) -> O,
    ) {
        for (r, mut out_row) in out.rows_mut().into_iter().enumerate() {
            let finished = finished(r);
            // Every element of the row is written (fresh rows are taken as written afterwards).
            let o = &self.o[r * self.o_stride..][..out_row.len()];
            let divide = |(x, &acc): (&mut O, &T)| *x = narrow(finished.output(acc));
            // A contiguous row as a slice, so that the divisions vectorise.
            match out_row.as_slice_mut() {
                Some(row) => row.iter_mut().zip(o).for_each(divide),
                None => out_row.iter_mut().zip(o).for_each(divide),
            }
        }
    }
}
