//! Rotary position embeddings (RoPE; Su et al., "RoFormer: Enhanced Transformer with Rotary
//! Position Embedding", 2021): each pair of a query's or key's components is rotated by an angle
//! proportional to its position, so that a query at position `p` and a key at position `s` score
//! `q·R(p - s)·k`, a function of the distance alone. The caches rotate keys as they are appended
//! and queries as a step stacks them, by absolute position; dense callers rotate with
//! [`Rotary::rotate`] and turn gradients back with [`Rotary::rotate_back`], as PyTorch models
//! apply RoPE outside their attention call.

use ndarray::{Array3, ArrayView3, ArrayViewMut2, CowArray, Ix3};
use num_traits::FromPrimitive;

use crate::element::Storage;
use crate::error::AttentionError;
use crate::finite::finite_magnitude;

/// Which components form a rotated pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotaryPairing {
    /// Component `i` with `i + dims / 2` (GPT-NeoX; Hugging Face's ports of LLaMA and Mistral,
    /// `rotate_half`, whose converted `W_q`, `W_k` rows are permuted to match; flash-attn's
    /// `rotary_interleaved=False`).
    HalfSplit,
    /// Components `2i` and `2i + 1` (GPT-J; Meta's LLaMA and Mistral's reference code, which
    /// rotate them as complex numbers; flash-attn's `rotary_interleaved=True`).
    Interleaved,
}

/// A rotary position embedding: pair `i` of the first [`dims`](Self::dims) components (of `d`)
/// turns by `position · position_scale · base^(-2i / dims)` radians.
///
/// ```
/// use qkv::Rotary;
/// // Hugging Face's LLaMA: base 10000, half-split pairs, every component.
/// let rope = Rotary::new(10_000.0);
/// let mut q = qkv::ndarray::array![[1.0_f32, 0.0]];
/// rope.rotate(q.view_mut(), 1)?; // position 1: one radian for the only pair
/// assert!((q[[0, 0]] - 1f32.cos()).abs() < 1e-6 && (q[[0, 1]] - 1f32.sin()).abs() < 1e-6);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct Rotary {
    /// The base of the frequencies, `θ` in the paper (10000 in LLaMA 2, 1e6 in Mistral 7B v0.2).
    pub base: f64,
    /// Which components pair up.
    pub pairing: RotaryPairing,
    /// Positions are multiplied by this before they turn anything: linear position
    /// interpolation (Chen et al., 2023) is `1 / factor`; 1 leaves them as they are.
    pub position_scale: f64,
    /// How many leading components rotate (GPT-NeoX's partial rotary); `None`: all of them.
    /// The rest pass through.
    pub dims: Option<usize>,
}

impl Rotary {
    /// Half-split pairs of every component, positions as they are.
    pub const fn new(base: f64) -> Self {
        Rotary { base, pairing: RotaryPairing::HalfSplit, position_scale: 1.0, dims: None }
    }

    /// The same with interleaved pairs (GPT-J).
    pub const fn interleaved(self) -> Self {
        Rotary { pairing: RotaryPairing::Interleaved, ..self }
    }

    /// The same with positions multiplied by `scale`.
    pub const fn position_scale(self, scale: f64) -> Self {
        Rotary { position_scale: scale, ..self }
    }

    /// The same rotating only the first `dims` components.
    pub const fn dims(self, dims: usize) -> Self {
        Rotary { dims: Some(dims), ..self }
    }

    /// Rotates each row of `x` (`[n, d]`: f32, f64, bf16 or f16), row `i` standing at position
    /// `first_position + i`; each component is computed in f64 and rounded once.
    pub fn rotate<E: Copy + Into<f64> + FromPrimitive>(
        &self,
        x: ArrayViewMut2<E>,
        first_position: usize,
    ) -> Result<(), AttentionError> {
        self.turn(x, first_position, 1.0)
    }

    /// Undoes [`rotate`](Self::rotate): the transpose of the rotation, which is what the gradient
    /// of a rotated query or key goes through on its way back (`dq = R(p)ᵀ · dq'`).
    pub fn rotate_back<E: Copy + Into<f64> + FromPrimitive>(
        &self,
        x: ArrayViewMut2<E>,
        first_position: usize,
    ) -> Result<(), AttentionError> {
        self.turn(x, first_position, -1.0)
    }

    /// Checks the embedding against rows of width `d`: a finite positive base, a finite scale,
    /// and an even number of rotated components, at most `d`.
    pub(crate) fn check(&self, d: usize) -> Result<usize, AttentionError> {
        let dims = self.dims.unwrap_or(d);
        let bad = |why| Err(AttentionError::InvalidRotary { base: self.base, dims, width: d, why });
        if !(self.base.is_finite() && self.base > 0.0) {
            return bad("the base must be finite and positive (10000 is the paper's)");
        }
        if !self.position_scale.is_finite() {
            return bad("the position scale must be finite");
        }
        if !dims.is_multiple_of(2) || dims > d || dims == 0 {
            return bad("the rotated components must be a positive even number, at most the width");
        }
        Ok(dims)
    }

    /// Rotates every row by `sign ·` its angles.
    fn turn<E: Copy + Into<f64> + FromPrimitive>(
        &self,
        mut x: ArrayViewMut2<E>,
        first: usize,
        sign: f64,
    ) -> Result<(), AttentionError> {
        let dims = self.check(x.ncols())?;
        let mut row = vec![0.0_f64; dims];
        let mut angles = Angles::default();
        for (i, mut out) in x.rows_mut().into_iter().enumerate() {
            self.turn_into(out.iter().copied(), &mut row, (first + i, sign), &mut angles);
            out.iter_mut().zip(&row).for_each(|(o, &r)| *o = E::from_f64(r).unwrap_or(*o));
        }
        Ok(())
    }

    /// `row` (the `dims` leading components of `x`, widened) rotated by `sign ·` the angles of
    /// `position`, which `angles` keeps for the next row at the same position.
    pub(crate) fn turn_into<E: Into<f64>>(
        &self,
        x: impl Iterator<Item = E>,
        row: &mut [f64],
        (position, sign): (usize, f64),
        angles: &mut Angles,
    ) {
        row.iter_mut().zip(x).for_each(|(r, e)| *r = e.into());
        let dims = row.len();
        let half = dims / 2;
        let at = (*self, position, sign.to_bits(), dims);
        if angles.at != Some(at) {
            let turn = sign * position as f64 * self.position_scale;
            angles.sin_cos.clear();
            angles
                .sin_cos
                .extend((0..half).map(|i| (turn * self.base.powf(-2.0 * i as f64 / dims as f64)).sin_cos()));
            angles.at = Some(at);
        }
        for (i, &(sin, cos)) in angles.sin_cos.iter().enumerate() {
            let (a, b) = match self.pairing {
                RotaryPairing::HalfSplit => (i, i + half),
                RotaryPairing::Interleaved => (2 * i, 2 * i + 1),
            };
            let (x, y) = (row[a], row[b]);
            row[a] = x * cos - y * sin;
            row[b] = x * sin + y * cos;
        }
    }
}

/// The sines and cosines of the angles of one position, kept for the rows that follow at the
/// same position (a step's query heads, a new token's key heads): a `powf` and a `sin_cos` for
/// every pair of every row cost a decoding step of 32 query heads, d = 128, over 1024 cached
/// positions more than its attention did.
#[derive(Debug, Default)]
pub(crate) struct Angles {
    /// The embedding, position, sign (as bits) and rotated width they are for.
    at: Option<(Rotary, usize, u64, usize)>,
    /// `(sin, cos)` of each pair's angle.
    sin_cos: Vec<(f64, f64)>,
}

/// How much larger a component's magnitude may grow under `rotary`: a pair turned keeps its norm,
/// so a component reaches at most `√2` times the pair's largest (the bound that the overflow
/// check takes for the queries, measured before their rotation).
pub(crate) fn rotation_growth(rotary: Option<&Rotary>) -> f64 {
    if rotary.is_some() { std::f64::consts::SQRT_2 } else { 1.0 }
}

/// Keys `k` (`[kv_heads, n, d_k]`, from position `first` on) as a cache stores them, and their
/// largest magnitude: checked finite, then rotated by `rotary` if the cache has one and measured
/// again after rotation, since that is what the scores read.
pub(crate) fn stored_keys<'k, E: Storage>(
    rotary: Option<&Rotary>,
    k: ArrayView3<'k, E>,
    first: usize,
) -> Result<(CowArray<'k, E, Ix3>, f64), AttentionError> {
    let magnitude = finite_magnitude("keys", &k)?;
    match rotary {
        None => Ok((CowArray::from(k), magnitude)),
        Some(rotary) => {
            let rotated = rotate_keys(rotary, k, first);
            // Finite before the rotation: a non-finite element now is one the rotation overflowed.
            let magnitude = finite_magnitude("keys", &rotated).map_err(|e| match e {
                AttentionError::NonFinite { index, .. } => {
                    AttentionError::RotatedKeyOverflow { index, storage: E::NAME }
                }
                other => other,
            })?;
            Ok((CowArray::from(rotated), magnitude))
        }
    }
}

/// Keys `k` (`[kv_heads, n, d_k]`) rotated by `rotary`, position `first` on: what a rotary cache
/// stores. Both caches store these.
fn rotate_keys<E: Storage>(rotary: &Rotary, k: ArrayView3<E>, first: usize) -> Array3<E> {
    let mut rotated = k.to_owned();
    let dims = rotary.dims.unwrap_or(k.shape()[2]);
    let mut row = vec![0.0_f64; dims];
    let mut angles = Angles::default();
    for mut head in rotated.outer_iter_mut() {
        for (i, mut key) in head.rows_mut().into_iter().enumerate() {
            let key_row = key.iter().map(|x| f64::from(x.to_f32()));
            rotary.turn_into(key_row, &mut row, (first + i, 1.0), &mut angles);
            // Through f32 to the storage type: a bf16 or f16 key is rounded from the f32 result.
            key.iter_mut().zip(&row).for_each(|(x, &r)| *x = E::from_f32(r as f32));
        }
    }
    rotated
}
