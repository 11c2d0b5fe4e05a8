//! The SIMD microkernels of the fast path, behind a narrow interface ([`Kernels`]): a
//! register-blocked `S = Q·Kᵀ` tile with its row maxima, scores straight from key rows for
//! decoding, row maxima, exp-and-sum, the rescale factors, a register-blocked
//! `O = α·O + P·V` and, for the backward, the same tile on `Pᵀ` and the softmax's gradient; plus
//! packing the keys and queries into the layouts those tiles read.
//!
//! Nothing here knows about masks, the online softmax or threads: that is `flash.rs`.
//!
//! # Levels
//!
//! The kernels are compiled once per instruction-set level and chosen at run time ([`Isa`]):
//! AVX-512F (with DQ) and AVX2 + FMA with `core::arch` intrinsics on x86-64, and a baseline
//! through `wide` (SSE2 on x86-64, NEON on aarch64). Every kernel is written once, in
//! `kernels/generic.rs`, as an `#[inline(always)]` function generic over a level's
//! [`Simd`](simd::Simd) primitives (load, store, splat, fused multiply-add, max, add, mul, the
//! reductions; the exponential is built from them, or from AVX-512's instructions for its two
//! halves); each level's file implements those primitives and, through [`level_kernels!`], one
//! `#[target_feature]` entry function per kernel that instantiates the generic code with the
//! level's register tiles. So a level is its primitives and its tile sizes, nothing else.
//!
//! The x86 levels use intrinsics, not `wide`, because `wide` picks its instructions when it is
//! compiled: `#[target_feature]` around `wide` code changes nothing, and a default build ran
//! `f32x16` as four SSE2 pieces, 5.4× slower than native at n = 4096. The baseline keeps `wide`,
//! since the target's own instructions are exactly what it should run, and it keeps the non-x86
//! targets building.
//!
//! Two more x86-64 levels, for bf16 only, multiply in pairs (two bf16 products added into each
//! f32 lane): AMX (`tdpbf16ps` on the tile unit, `kernels/amx.rs`) and AVX512-BF16
//! (`vdpbf16ps` in vector registers, `kernels/avx512bf16.rs`). Their operands lie differently
//! ([`Layout::Pairs`]), so they are not `Simd` levels: `pair_level_kernels!` implements
//! `Kernels<f32, bf16>` for them from their own score and `P·V` tiles and AVX-512's kernels for
//! the rest. Every other element type runs AVX-512 at those levels (`element!`'s `pairs =` arm),
//! and so do decoding and the KV caches ([`Isa::vectors`]), whose layouts the pair tiles do not
//! read.
//!
//! `unsafe` lives only here: intrinsics, `asm!` (the AMX tile instructions, whose intrinsics are
//! not stable, and the system call that asks for the tile state) and calls into
//! `#[target_feature]` functions. Each is sound because a level's token type (`Avx2`, `Avx512`,
//! `Avx512Bf16`, `Amx`) can only be made by its `detect`, which checked the CPU with
//! `is_x86_feature_detected!`, and every kernel takes the token. `Amx::detect` also reads the
//! tile features from CPUID (the standard library does not detect them yet) and asks Linux for
//! the tile state (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), without which the first tile instruction
//! faults; off Linux it is not asked and the level is not offered.
//!
//! # Extending
//!
//! - A new kernel: a method on [`Kernels`], a generic function in `kernels/generic.rs` and an
//!   entry in [`level_kernels!`] (and in `pair_level_kernels!`, usually handing it to AVX-512).
//! - A new level: a file with its token (and `detect`), its `Simd` primitives (on x86, usually
//!   through `x86_simd!`) and its `level_kernels!` lines (one per element type), plus an [`Isa`]
//!   arm and its dispatch arm in `element!` here, and a `SimdLevel` variant in `level.rs`
//!   (ARCHITECTURE.md, "Where changes belong", lists the tests and messages that name levels).
//! - A new storage type: an `element!` line here, a `Load` per level, a `level_kernels!` line per
//!   level, and `Storage` in `element.rs`.

mod baseline;
mod generic;
mod simd;

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512bf16;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::convert::identity;
use std::mem::MaybeUninit;

use half::{bf16, f16};
use ndarray::{ArrayView, ArrayView2, ArrayViewMut, ArrayViewMut2, Axis, CowArray, Dimension};
use wide::bytemuck::Pod;

use crate::level::SimdLevel;

pub use simd::Exp2;

/// A type the kernels compute in: `f32` or `f64`. What the kernels need of it (arithmetic, the
/// exponential's constants, plain bits); the public [`crate::Real`] is sealed by it, so the
/// kernels never depend on the public element trait.
pub trait Scalar:
    Element<Compute = Self> + num_traits::Float + Exp2 + Default + Send + Sync + std::fmt::Debug + 'static
{
}

impl Scalar for f32 {}
impl Scalar for f64 {}

/// An element type the kernels read at every level: the computing types f32 and f64 (implied by
/// [`crate::Real`] through its sealing supertrait), the storage formats `half::bf16` and
/// `half::f16`, which they widen to f32 as they load them, and [`Q8`], an int8 cache's stored
/// integers, read as f32 and scaled per position. In a private module so that no other
/// crate can name or implement it.
pub trait Element: Pod + Send + Sync + Default + 'static {
    /// 64 bytes of elements, aligned to 64: the storage unit of [`Buffer`].
    type Line: Pod + Default + Send + Sync;
    /// The type the kernels compute in when they read this one: itself for f32 and f64, f32 for
    /// the half-precision formats.
    type Compute: Scalar;

    /// This element in the compute type, exactly (every bf16 and f16 is an f32).
    fn widen(self) -> Self::Compute;

    /// `x` rounded to this type (to nearest, ties to even; beyond the type's range, `±inf`): how
    /// a finished output row is stored in a half-precision output, rounded once.
    fn narrow(x: Self::Compute) -> Self;

    /// `a` in the compute type: `a` itself for f32 and f64, a widened copy for a half-precision
    /// format. For the paths that compute in the compute type alone (the blocked fallback).
    fn computed<D: Dimension>(a: ArrayView<'_, Self, D>) -> CowArray<'_, Self::Compute, D>;

    /// An output stored as this type, as the tiled path writes it (see [`OutRows`]).
    fn out_rows(out: ArrayViewMut2<'_, Self>) -> OutRows<'_, Self::Compute>;

    /// An output of this type in fresh memory (see `fresh.rs`), as the tiled path writes it: as
    /// it stands in the compute type ([`OutRows::Fresh`]), zeroed first in the others.
    fn fresh_rows(out: ArrayViewMut2<'_, MaybeUninit<Self>>) -> OutRows<'_, Self::Compute> {
        Self::out_rows(zeroed(out))
    }

    /// Runs `job` with this element type's kernels of the level `isa` stands for.
    fn dispatch<J: Job<Self>>(isa: Isa, job: J) -> J::Output;
}

/// The kernels a pair level (AMX, AVX512-BF16) runs for an element type: its `own` (bf16), or
/// its AVX-512 `vectors` (every other type).
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_macros))]
macro_rules! pair_kernels {
    (own, $level:expr) => {
        $level
    };
    (vectors, $level:expr) => {
        $level.vectors()
    };
}

/// Implements [`Element`] for one type: the dispatch is the same code for every type, but each
/// type needs the compiler to see that every level's token implements `Kernels` for it.
macro_rules! element {
    (
        $t:ty, $line:ty, $compute:ty, $widen:expr, $narrow:expr, $computed:expr, $out_rows:path,
        pairs = $pairs:ident $(; fresh_rows = $fresh_rows:path)?
    ) => {
        impl Element for $t {
            type Line = $line;
            type Compute = $compute;

            #[inline(always)]
            fn widen(self) -> $compute {
                $widen(self)
            }

            #[inline(always)]
            fn narrow(x: $compute) -> $t {
                $narrow(x)
            }

            fn computed<D: Dimension>(a: ArrayView<'_, $t, D>) -> CowArray<'_, $compute, D> {
                $computed(a)
            }

            fn out_rows(out: ArrayViewMut2<'_, $t>) -> OutRows<'_, $compute> {
                $out_rows(out)
            }

            $(
                fn fresh_rows(out: ArrayViewMut2<'_, MaybeUninit<$t>>) -> OutRows<'_, $compute> {
                    $fresh_rows(out)
                }
            )?

            fn dispatch<J: Job<Self>>(isa: Isa, job: J) -> J::Output {
                match isa {
                    #[cfg(target_arch = "x86_64")]
                    Isa::Amx(level) => job.run(pair_kernels!($pairs, level)),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512Bf16(level) => job.run(pair_kernels!($pairs, level)),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx512(level) => job.run(level),
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2(level) => job.run(level),
                    Isa::Baseline(level) => job.run(level),
                }
            }
        }
    };
}
// Only bf16 has pair kernels (the tiles, and AVX512-BF16's dot products): the other types run
// those levels' vectors, AVX-512.
element!(f32, wide::f32x16, f32, identity, identity, CowArray::from, OutRows::Computed, pairs = vectors;
    fresh_rows = OutRows::Fresh);
element!(f64, wide::f64x8, f64, identity, identity, CowArray::from, OutRows::Computed, pairs = vectors;
    fresh_rows = OutRows::Fresh);
element!(bf16, wide::f32x16, f32, bf16_to_f32, bf16::from_f32, widened_copy, OutRows::Bf16, pairs = own);
element!(f16, wide::f32x16, f32, f16_to_f32, f16::from_f32, widened_copy, OutRows::F16, pairs = vectors);
element!(Q8, [wide::i8x32; 2], f32, Q8::to_f32, Q8::nearest, widened_copy, Q8::no_output, pairs = vectors);

/// int8 storage for a KV cache, `KvCache<Q8>` or `PagedKvCache<Q8>`: llama.cpp's `q8_0` idea
/// with one scale per position and head for each key and value row, rather than per block of 32.
/// Appends take f32 keys and values; each row `x` (a key, `d_k` wide, after any rotary
/// embedding, or a value, `d_v` wide) is stored as `q = round(x / s)` with `s = max |x| / 127`
/// (an f32), so `|q| <= 127`, and `s` beside it (a row of zeros has `s = 0` and stores zeros).
/// Any width works: a row is one block. Steps take f32 (or bf16, f16) queries and dequantize
/// inside the kernels, never into a copy: the kernels widen the integers as they load them, a
/// key's scale multiplies its score (`s_k · (Q · q_k)`) and a value's its weight (`p · s_v`,
/// after the softmax's sum took `p`). Keys and values stay in the cache's panels and rows, one
/// byte an element, beside 8 bytes of scales a position and head: a decoding step reads
/// `d_k + d_v + 8` bytes a position against bf16's `2 · (d_k + d_v)`.
///
/// Error: each stored element is within `s / 2 = max |x| / 254` of the appended one (up to f32
/// rounding, a relative 2^-16 of that). So each score of a query `q` moves by at most
/// `δ = |scale| · ‖q‖₁ · max |k| / 254` (logit soft-capping only shrinks that), each weight by a
/// factor within `e^{±2δ}`, and each output element by at most
/// `(e^{2δ} - 1) · max |v| + max |v| / 254` from attention over the appended keys and values,
/// beyond f32's own rounding (`max` over the positions the step reads).
///
/// ```
/// use qkv::ndarray::Array3;
/// use qkv::{CacheShape, KvCache, Q8};
///
/// let shape = CacheShape::new(1, 1, 16, 4, 4);
/// let mut cache = KvCache::<Q8>::new(shape)?;
/// let mut layer = cache.layer(0)?;
/// let kv = Array3::from_shape_fn((1, 3, 4), |(_, p, c)| (p * 4 + c) as f32 / 10.0);
/// layer.append(kv.view(), kv.view())?; // f32 in, int8 stored
/// let out = layer.attend(Array3::<f32>::zeros((1, 1, 4)).view())?;
/// // Equal scores: the mean of the three values, within the quantization step of each row.
/// assert!((out[[0, 0, 0]] - 0.4).abs() < 1.1 / 254.0);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
///
/// (Defined with the kernels, which load it, and public as `qkv::Q8`. As an `Element` it widens
/// to the integer itself: the kernels load it into f32 lanes, and the scales are applied to the
/// scores and weights by `Kernels::scale_columns`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Q8(i8);

// SAFETY: `Q8` is a transparent `i8`: every bit pattern is a valid value, and zero is `Q8(0)`.
unsafe impl wide::bytemuck::Zeroable for Q8 {}
// SAFETY: as above; no padding, no interior mutability, `Copy` and `'static`.
unsafe impl Pod for Q8 {}

impl Q8 {
    /// The integer as an f32, exactly.
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f32::from(self.0)
    }

    /// `x` rounded to the nearest integer (halves away from zero) within `-127 ..= 127`; NaN
    /// gives 0. Quantizing divides by the scale first (see `kv_cache`).
    fn nearest(x: f32) -> Q8 {
        // An `as` cast saturates and takes NaN to 0; the clamp keeps the range symmetric.
        Q8(x.round().clamp(-127.0, 127.0) as i8)
    }

    /// No output is stored as `Q8`: outputs are `Storage` types (f32, bf16, f16), which `Q8` is
    /// not, so the tiled path never asks for these rows.
    fn no_output(_: ArrayViewMut2<'_, Q8>) -> OutRows<'_, f32> {
        unreachable!("no entry point takes an output stored as Q8")
    }
}

/// `x` as an f32, exactly: a bf16 is the upper half of an f32's bits. Unlike `bf16::to_f32`,
/// which tests for a NaN first (to quiet it), this is one shift a loop of them vectorises; a NaN
/// stays a NaN.
fn bf16_to_f32(x: bf16) -> f32 {
    f32::from_bits(u32::from(x.to_bits()) << 16)
}

/// `x` as an f32, exactly, without a branch, so that a loop of them vectorises (`f16::to_f32`
/// asks at each call whether the CPU has F16C, then converts one element): the exponent and
/// mantissa moved into f32's places read as 2^-112 times the value, normal or subnormal alike,
/// and a multiplication by 2^112 rebiases it exactly; an all-ones exponent (infinity, NaN)
/// becomes f32's.
fn f16_to_f32(x: f16) -> f32 {
    let bits = u32::from(x.to_bits());
    let (sign, magnitude) = ((bits & 0x8000) << 16, bits & 0x7fff);
    let finite = f32::from_bits(magnitude << 13) * f32::from_bits((127 + 112) << 23);
    let special = f32::from_bits((magnitude << 13) | 0x7f80_0000);
    let value = if magnitude >= 0x7c00 { special } else { finite };
    f32::from_bits(value.to_bits() | sign)
}

/// A copy of `a` widened to the compute type: [`Element::computed`] for a half-precision format.
fn widened_copy<E: Element, D: Dimension>(a: ArrayView<'_, E, D>) -> CowArray<'_, E::Compute, D> {
    CowArray::from(a.mapv(E::widen))
}

/// Output rows as the caller stores them: in the compute type `T`, or rounded once from it to a
/// half-precision format. An enum rather than a type parameter, so that the tiled path is
/// compiled once per input type, not once per pair of input and output types (which doubled the
/// engine tests' build).
///
/// `pub` only because the (sealed) `Element` trait names it; nothing outside the crate can.
pub enum OutRows<'out, T> {
    /// Stored in the compute type.
    Computed(ArrayViewMut2<'out, T>),
    /// Rounded to bf16 (under an f32 compute type).
    Bf16(ArrayViewMut2<'out, bf16>),
    /// Rounded to f16 (under an f32 compute type).
    F16(ArrayViewMut2<'out, f16>),
    /// In the compute type, in fresh memory that the tiled path writes once (see `fresh.rs`).
    Fresh(ArrayViewMut2<'out, MaybeUninit<T>>),
}

/// `out` with every element set to zero, as initialised elements.
pub(crate) fn zeroed<E: Element, D: Dimension>(
    mut out: ArrayViewMut<'_, MaybeUninit<E>, D>,
) -> ArrayViewMut<'_, E, D> {
    out.fill(MaybeUninit::new(E::zeroed()));
    // SAFETY: every element was written just above.
    unsafe { out.assume_init() }
}

/// An instruction-set level that this CPU runs, with the token that proves it.
#[derive(Debug, Clone, Copy)]
pub enum Isa {
    /// AMX-BF16 tiles for bf16 inputs, AVX-512 for the rest.
    #[cfg(target_arch = "x86_64")]
    Amx(amx::Amx),
    /// AVX512-BF16 dot products for bf16 inputs, AVX-512 for the rest.
    #[cfg(target_arch = "x86_64")]
    Avx512Bf16(avx512bf16::Avx512Bf16),
    /// AVX-512F with DQ.
    #[cfg(target_arch = "x86_64")]
    Avx512(avx512::Avx512),
    /// AVX2 with FMA.
    #[cfg(target_arch = "x86_64")]
    Avx2(avx2::Avx2),
    /// The target's baseline vectors, through `wide`.
    Baseline(baseline::Baseline),
}

impl Isa {
    /// The level `level` if this CPU supports it. Asks the CPU (`is_x86_feature_detected!`, whose
    /// answer the standard library caches), so callers keep the result rather than ask per tile.
    pub(crate) fn new(level: SimdLevel) -> Option<Isa> {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Amx => amx::Amx::detect().map(Isa::Amx),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Bf16 => avx512bf16::Avx512Bf16::detect().map(Isa::Avx512Bf16),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => avx512::Avx512::detect().map(Isa::Avx512),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => avx2::Avx2::detect().map(Isa::Avx2),
            SimdLevel::Baseline => Some(Isa::Baseline(baseline::Baseline)),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        }
    }

    /// This level's vector kernels: itself, or AVX-512 for the pair levels (AMX, AVX512-BF16).
    /// For the paths whose layouts the pair kernels do not read: decoding (scores straight from
    /// key rows, values read once) and the KV caches (keys written into panels a position at a
    /// time).
    pub(crate) fn vectors(self) -> Isa {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Amx(level) => Isa::Avx512(level.vectors()),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16(level) => Isa::Avx512(level.vectors()),
            isa => isa,
        }
    }

    /// The level the backward runs at: this one, or AVX-512 for AVX512-BF16 on a CPU where its
    /// dot products do not pay ([`Isa::pays`]). The backward takes only its score products from a
    /// pair level's tiles; the tile unit's made it 1.2–1.3× faster.
    pub(crate) fn backward(self) -> Isa {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16(level) if !level.pays() => Isa::Avx512(level.vectors()),
            isa => isa,
        }
    }

    /// Whether this level runs faster on this CPU than the levels below it: all do but
    /// AVX512-BF16 on Intel's CPUs ([`avx512bf16::Avx512Bf16::pays`]), which the engine runs only
    /// when asked for.
    pub(crate) fn pays(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16(level) => level.pays(),
            _ => true,
        }
    }

    /// Runs `job` with the kernels of this level for element type `E`.
    pub(crate) fn run<E: Element, J: Job<E>>(self, job: J) -> J::Output {
        E::dispatch(self, job)
    }
}

/// Work that is generic over a level's kernels: [`Isa::run`] calls [`Job::run`] with the chosen
/// level's [`Kernels`] for inputs stored as `E`, so the caller is compiled once per level and
/// picks one at run time.
pub trait Job<E: Element> {
    /// What the job returns.
    type Output;
    /// Does the work with `kernels`.
    fn run<K: Kernels<E::Compute, E>>(self, kernels: K) -> Self::Output;
}

/// Keys per score tile at the lane levels (not the pair levels, see [`Kernels::KEY_BLOCK`]) and
/// in the backward's tiles at every level: the stride of score and weight rows in every tile
/// their kernels read or write, fixed so that the `P·V` tile addresses its rows with constant
/// offsets. A multiple of every level's key panel (16 to 64 keys for f32); 128 measured about 10%
/// faster than 64 (the per-row work of the online softmax is spread over more keys). Decoding,
/// which runs at the vector levels ([`Isa::vectors`]), writes its scores in rows of it.
pub(crate) const KEY_BLOCK: usize = 128;

/// The most a weight may weigh against its row's running reference at a level that raises
/// references only when a score passes them by more than `ln` of it
/// ([`Kernels::RAISES_REFERENCES`]): `2^8`. The unnormalised sums are then at most this many times
/// what they are against each row's maximum, which `flash::stays_finite` leaves room for.
pub(crate) const REFERENCE_HEADROOM: f64 = 256.0;

/// The reference [`Kernels::exp_rows_raising`] leaves for a row whose scores reach `max` against
/// a running reference `reference`: unchanged while `max` is within the headroom; raised by the
/// least whole multiple of `ln 2` that reaches `max` beyond it, so that the weights already taken
/// against the old reference scale to the new one by an exact power of two; `max` itself where
/// `reference` is `-inf` (the row's first visible keys).
pub(crate) fn raised_reference<T: Scalar>(reference: T, max: T) -> T {
    let constant = |x: f64| T::from(x).expect("a float type holds a float constant");
    if reference == T::neg_infinity() {
        max
    } else if max > reference + constant(REFERENCE_HEADROOM.ln()) {
        let doublings = ((max - reference) * constant(std::f64::consts::LOG2_E)).ceil();
        reference + doublings * constant(std::f64::consts::LN_2)
    } else {
        reference
    }
}

/// One level's kernels computing in `T` over keys and values stored as `E` (`T` itself, or a
/// half-precision format widened as it is loaded): the whole interface between the algorithm
/// (`flash.rs`) and the SIMD code. The constants describe the layouts the kernels read; every
/// buffer is plain scalars, with lengths and strides in scalars.
pub trait Kernels<T: Scalar, E: Element<Compute = T> = T>: Copy + Send + Sync {
    /// Scalars per vector register. Score rows, value rows and output rows are padded to it.
    const LANES: usize;
    /// Keys per packed key panel (see [`pack_key_panel`]): the width of a score tile.
    const KEY_PANEL: usize;
    /// Query rows per register tile, of scores and of `P·V` alike. Packed queries come in groups
    /// of this many rows (zero rows pad the last group), so a block of queries is padded to a
    /// multiple of it.
    const TILE_ROWS: usize;
    /// Query rows per block of the tiled loop, a multiple of `TILE_ROWS`: the score tile
    /// (`QUERY_BLOCK × KEY_BLOCK`) and the output accumulator stay in cache as key blocks stream
    /// past.
    const QUERY_BLOCK: usize;
    /// Query rows per block where the keys and values a block reads are long (the tiled loop
    /// sets the length): every block streams them all from beyond L2, and a block of more rows
    /// streams them fewer times. A multiple of `TILE_ROWS`.
    const LONG_QUERY_BLOCK: usize = Self::QUERY_BLOCK;
    /// How packed keys, queries and values are laid out for the tiles (see [`Layout`]).
    const LAYOUT: Layout = Layout::Lanes;
    /// Keys per block of the tiled loop, a multiple of `KEY_PANEL`: [`KEY_BLOCK`] but at the pair
    /// levels (AMX, AVX512-BF16), whose products are fast enough that the online softmax's work
    /// per row and block shows.
    const KEY_BLOCK: usize = KEY_BLOCK;
    /// Scalars from one row of scores (and of the weights made from them) to the next in the
    /// tiled loop, at least `KEY_BLOCK`: `KEY_BLOCK` but at AMX, whose tiles read and write 16
    /// rows at a time (see `amx::SCORE_STRIDE`).
    const SCORE_STRIDE: usize = Self::KEY_BLOCK;
    /// Whether the tiled loop takes its weights from [`exp_rows_raising`](Self::exp_rows_raising),
    /// each row keeping its running reference until a score passes it by more than
    /// [`REFERENCE_HEADROOM`], rather than from each block's maxima: set where the score kernel
    /// finds maxima only in a pass of its own over the scores (AMX: the tile unit gives none).
    const RAISES_REFERENCES: bool = false;
    /// This level's kernels for operands already in `T` (itself where `E` is `T`): the backward
    /// takes its scores from `E` at a pair level and computes everything else from widened rows.
    type Widened: Kernels<T>;

    /// See [`Self::Widened`].
    fn widened(self) -> Self::Widened;

    /// `S = Q·Kᵀ` for whole groups of packed queries against whole key panels, and the lane-wise
    /// maxima of each row (see [`ScoreTile`]). `group_keys(g)`, when given, is how many of the
    /// tile's keys the group starting at row `g` needs: scores past them may be left stale (a
    /// causal tile on the diagonal, where they are hidden anyway, or a last panel only partly
    /// filled with keys), and then so are the maxima.
    fn scores(self, tile: ScoreTile<'_, T, E>, group_keys: Option<&dyn Fn(usize) -> usize>);

    /// `S[r, j] = Q_r · K_j` for a few query rows `q` (row after row, `d` scalars each) straight
    /// from the key rows `keys` (`[n_keys, d]`, each row contiguous, at most [`KEY_BLOCK`] keys):
    /// one dot product per pair, vectorised along `d`. For decoding, where packing the keys would
    /// cost more than using them once. `s` holds `rows` rows of [`KEY_BLOCK`] scalars (the vector
    /// levels', whose kernels the pair levels lend here, see [`Isa::vectors`]). Returns the
    /// keys' [`magnitude`](Self::magnitude), measured from the same loads.
    fn direct_scores(self, q: &[T], rows: usize, keys: ArrayView2<E>, s: &mut [T]) -> T;

    /// The largest `|x|` of `x`, or a non-finite result (NaN or infinity) if any element of `x` is
    /// NaN or infinite: decoding checks its keys and values with it as it reads them.
    fn magnitude(self, x: &[E]) -> T;

    /// `out[r]` = the largest of the first `len` scalars of row `r` of `rows` (`len` a positive
    /// multiple of `LANES`).
    fn row_maxima(self, rows: Rows<'_, T>, len: usize, out: &mut [T]);

    /// Replaces the first `len` scalars `s` of each row `r` (a multiple of `LANES`) by
    /// `exp(s - maxima[r])` and writes their sum to `sums[r]`; needs `s - maxima[r]` at most
    /// `ln(REFERENCE_HEADROOM)` (at most 0 where `maxima` are the rows' maxima), and `-inf`
    /// scores give exactly 0. A row whose maximum is `-inf` (nothing visible) becomes zeros.
    fn exp_rows(self, rows: RowsMut<'_, T>, len: usize, maxima: &[T], sums: &mut [T]);

    /// [`exp_rows`](Self::exp_rows) against each row's running reference `references[r]` rather
    /// than its maximum: weights may exceed 1, up to [`REFERENCE_HEADROOM`]. A row with a score
    /// above `references[r] + ln(REFERENCE_HEADROOM)` first has its reference raised by the
    /// least whole multiple of `ln 2` that reaches the row's maximum, so that no weight can pass
    /// the headroom (a reference of `-inf` becomes the row's maximum; a row with nothing visible
    /// keeps it and becomes zeros). Levels that set [`RAISES_REFERENCES`](Self::RAISES_REFERENCES)
    /// fold the check into the exponentials' pass; this default finds each row's maximum first.
    fn exp_rows_raising(self, rows: RowsMut<'_, T>, len: usize, references: &mut [T], sums: &mut [T]) {
        let RowsMut { data, stride, rows } = rows;
        for r in 0..rows {
            let row = &mut data[r * stride..];
            let mut max = [T::zero()];
            self.row_maxima(Rows { data: row, stride, rows: 1 }, len, &mut max);
            references[r] = raised_reference(references[r], max[0]);
            let one_row = RowsMut { data: row, stride, rows: 1 };
            self.exp_rows(one_row, len, &references[r..=r], &mut sums[r..=r]);
        }
    }

    /// `out[i] = exp(a[i] - b[i])` for `a[i] <= b[i]`: the online softmax's rescale factors.
    fn exp_differences(self, a: &[T], b: &[T], out: &mut [T]);

    /// `O_r = α_r · O_r + Σ_{j < n_keys} P[r, j] · V_j` for every row of `weights`; `o` holds
    /// `weights.rows` rows of `values.vectors · LANES` scalars. In the pair layout
    /// ([`Layout::Pairs`]) `weights.rows` is a multiple of `TILE_ROWS`.
    fn accumulate_values(self, weights: Weights<'_, T>, alpha: &[T], values: ValueRows<'_, E>, o: &mut [T]);

    /// [`accumulate_values`](Self::accumulate_values), returning the [`magnitude`](Self::magnitude)
    /// of the values it reads: the first `weights.n_keys` rows of `values.stride` scalars (in the
    /// pair layout, the whole pairs that hold them: an odd last key's partner is zero in packed
    /// values). The dense decoding step checks its values with it as it uses them. The lane
    /// levels fold it from the loads of `P·V` where a register tile reads each value row in one
    /// pass (a single query row of at most `one_row_value_vectors` vectors: d_v = 64 in f32 on
    /// AVX2); elsewhere, and at the pair levels, the values are measured first, in a pass of
    /// their own.
    fn accumulate_values_measuring(
        self,
        weights: Weights<'_, T>,
        alpha: &[T],
        values: ValueRows<'_, E>,
        o: &mut [T],
    ) -> T {
        let rows = match Self::LAYOUT {
            Layout::Lanes => weights.n_keys,
            Layout::Pairs => weights.n_keys.next_multiple_of(2),
        };
        let magnitude = value_magnitude(self, values, rows);
        self.accumulate_values(weights, alpha, values, o);
        magnitude
    }

    /// `O_j += Σ_{r < weights.rows} P[r, j] · X_r` for every `j < weights.n_keys`: the `P·V` tile
    /// on the transposed weights, for the backward's `dV += Pᵀ·dO` and `dK += dSᵀ·Q` (`values`
    /// holds the rows `X_r`, one per weight row). `o` holds `weights.n_keys` rows of
    /// `values.vectors · LANES` scalars.
    fn accumulate_transposed(self, weights: Weights<'_, T>, values: ValueRows<'_, E>, o: &mut [T]);

    /// `X[r, j] = X[r, j] · scales[j]` for `j < scales.len()` in each row of `rows`: a quantized
    /// cache's per-position scales applied to a tile of scores (the keys' scales) or of weights
    /// (the values'), so that the kernels read the stored integers as they are.
    fn scale_columns(self, rows: RowsMut<'_, T>, scales: &[T]);

    /// `dP[r, j] = P[r, j] · (dP[r, j] - delta[r])` over the first `len` scalars of each row (a
    /// multiple of `LANES`): the softmax's backward, turning the weights' gradient into the
    /// scores' gradient `dS` in place.
    fn softmax_gradient(self, p: Rows<'_, T>, dp: RowsMut<'_, T>, len: usize, delta: &[T]);
}

/// Rows of scalars: row `r` starts at `data[r * stride]`.
#[derive(Clone, Copy)]
pub struct Rows<'a, T> {
    /// The scalars.
    pub data: &'a [T],
    /// Scalars from one row's start to the next.
    pub stride: usize,
    /// How many rows.
    pub rows: usize,
}

/// Rows of scalars to write: row `r` starts at `data[r * stride]`.
pub struct RowsMut<'a, T> {
    /// The scalars.
    pub data: &'a mut [T],
    /// Scalars from one row's start to the next.
    pub stride: usize,
    /// How many rows.
    pub rows: usize,
}

/// How a level's tiles read their packed operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Vector lanes: key panels component-major (`[d][KEY_PANEL]`, see [`pack_key_panel`]),
    /// queries in groups of `TILE_ROWS` component-major and already scaled, value rows as they
    /// are (each padded to whole vectors).
    Lanes,
    /// Pairs, for instructions that multiply two bf16 per f32 lane (`tdpbf16ps`): key panels
    /// `[d / 2][KEY_PANEL][2]` (each key's components two by two, `d` padded to even with a
    /// zero), queries row after row as bf16 (`[rows][d]`, `d` padded alike, two to a scratch
    /// scalar) and not scaled, and value rows two by two (`[n / 2][stride][2]`: keys `2i` and
    /// `2i + 1` interleaved, column by column, a zero row after an odd last one). The weights
    /// `exp_rows` leaves for `accumulate_values` are bf16 at the start of each row of scores (two
    /// to a scalar).
    Pairs,
}

impl Layout {
    /// Components per packed key or query of width `d`.
    pub(crate) fn padded_dim(self, d: usize) -> usize {
        match self {
            Layout::Lanes => d,
            Layout::Pairs => d.next_multiple_of(2),
        }
    }
}

/// The operands of [`Kernels::scores`], the keys stored as `E`.
pub struct ScoreTile<'a, T, E = T> {
    /// Packed queries (see [`pack_queries`]): `rows · d` scalars.
    pub q: &'a [T],
    /// The factor the kernel applies to each score: 1 where the packed queries carry the scale
    /// ([`Layout::Lanes`]), the attention's scale where they do not.
    pub scale: T,
    /// The width of queries and keys.
    pub d: usize,
    /// Query rows, a multiple of [`Kernels::TILE_ROWS`].
    pub rows: usize,
    /// The rows that count, the first ones (at most `rows`): the scores of the zero rows that
    /// pad the last group past them may be written as zeros without computing them (the vector
    /// levels do).
    pub real_rows: usize,
    /// Packed key panels (see [`pack_key_panel`]), `panels · d · KEY_PANEL` scalars or more.
    pub keys: &'a [E],
    /// Panels to score against.
    pub panels: usize,
    /// The scores, `rows` rows of `stride` scalars: panel `p` at scalars `p · KEY_PANEL ..`.
    pub s: &'a mut [T],
    /// Scalars from one row of scores to the next: [`Kernels::SCORE_STRIDE`] of the level whose
    /// `accumulate_values` reads the weights (the backward's widened level at a pair level).
    pub stride: usize,
    /// `LANES` scalars per row: set to the lane-wise maximum of the row's computed scores, when
    /// `maxima` asks for them.
    pub row_max: &'a mut [T],
    /// Whether the caller reads `row_max`. Levels that fold the maxima into the products set them
    /// anyway; AMX, which finds them in a pass of its own, skips that pass without it.
    pub maxima: bool,
}

/// The weights `P` of one tile: `rows` rows of the level's [`Kernels::SCORE_STRIDE`] scalars each, of
/// which the first `n_keys` count.
#[derive(Clone, Copy)]
pub struct Weights<'a, T> {
    /// The weights.
    pub p: &'a [T],
    /// Query rows.
    pub rows: usize,
    /// Keys (and value rows) the tile covers.
    pub n_keys: usize,
}

/// Value rows as [`Kernels::accumulate_values`] reads them: row `j` of `vectors · LANES` scalars
/// at `v[j · stride]` (any alignment), from the tile's first key on. `v` may end where the last
/// row read ends: the caller's rows read in place (a head of flash-attn's `[total, heads, d]`,
/// whose stride spans the other heads) are read row by row, never a whole stride past the last.
/// In the pair layout ([`Layout::Pairs`]) values are always packed, `stride` scalars a row.
#[derive(Clone, Copy)]
pub struct ValueRows<'a, T> {
    /// The values.
    pub v: &'a [T],
    /// Scalars from one value row to the next (at least `vectors · LANES`).
    pub stride: usize,
    /// Vectors per row: the value width, rounded up to whole vectors.
    pub vectors: usize,
}

impl<'a, T> ValueRows<'a, T> {
    /// The first `n - 1` rows as whole strides (for `chunks_exact(stride)`, whose loops check no
    /// bounds) and row `n - 1` alone, `width` scalars; `n` is at least 1.
    #[inline(always)]
    pub(crate) fn split_last(&self, n: usize, width: usize) -> (&'a [T], &'a [T]) {
        let (rows, last) = self.v.split_at((n - 1) * self.stride);
        (rows, &last[..width])
    }

    /// The first `n` rows, `width` scalars each, as runs with nothing between them: all of them
    /// at once when they are side by side, else row by row (not what lies between rows a wider
    /// stride apart). For the values' magnitude ([`Kernels::magnitude`] of each run).
    #[inline(always)]
    pub(crate) fn runs(&self, n: usize, width: usize) -> impl Iterator<Item = &'a [T]> + use<'a, T> {
        let (rows, last) = if self.stride == width || n == 0 {
            (&self.v[..0], &self.v[..n * width])
        } else {
            self.split_last(n, width)
        };
        rows.chunks_exact(self.stride.max(1)).map(move |row| &row[..width]).chain([last])
    }
}

/// The largest magnitude of the first `n` rows of `values` ([`ValueRows::runs`]), by the level's
/// [`Kernels::magnitude`].
pub(crate) fn value_magnitude<T: Scalar, E: Element<Compute = T>, K: Kernels<T, E>>(
    kernels: K,
    values: ValueRows<'_, E>,
    n: usize,
) -> T {
    let runs = values.runs(n, values.vectors * K::LANES);
    runs.map(|run| kernels.magnitude(run)).fold(T::zero(), larger_magnitude)
}

/// Implements [`Kernels`] for one element type of one level: each kernel is an entry function
/// with the level's target features that instantiates the generic kernel with the level's
/// register tiles (`MR × NV` vectors of scores, `MR × NC` vectors of `P·V`, `NC1` vectors for a
/// single row of `P·V`), called under the proof that the token carries.
macro_rules! level_kernels {
    (
        $token:ty, $t:ty, stored = $e:ty $(, features = $features:literal)?;
        score_tile = $mr:literal x $nv:literal, value_tile = $mr2:literal x $nc:literal,
        one_row_value_vectors = $nc1:literal, query_block = $query_block:literal
        $(, long_query_block = $long_query_block:literal)?
    ) => {
        const _: () = assert!($mr == $mr2, "scores and P·V share the packed row groups");
        const _: () = assert!($query_block % $mr == 0, "blocks are whole groups of rows");
        $(const _: () = assert!($long_query_block % $mr == 0, "blocks are whole groups of rows");)?

        // In a block of its own, so that the helpers below are the impl's alone.
        const _: () = {
            /// `P·V` for both of the trait's entries, measuring the values if `measure`.
            $(#[target_feature(enable = $features)])?
            unsafe fn accumulate_values(
                level: $token,
                weights: $crate::kernels::Weights<'_, $t>,
                alpha: &[$t],
                values: $crate::kernels::ValueRows<'_, $e>,
                o: &mut [$t],
                measure: bool,
            ) -> $t {
                use $crate::kernels::generic::accumulate_values as tiles;
                if measure {
                    tiles::<$t, $e, $token, $mr, $nc, $nc1, true>(level, weights, alpha, values, o)
                } else {
                    tiles::<$t, $e, $token, $mr, $nc, $nc1, false>(level, weights, alpha, values, o)
                }
            }

            impl $crate::kernels::Kernels<$t, $e> for $token {
                const LANES: usize = <$token as $crate::kernels::simd::Simd<$t>>::LANES;
                const KEY_PANEL: usize = $nv * <$token as $crate::kernels::simd::Simd<$t>>::LANES;
                const TILE_ROWS: usize = $mr;
                const QUERY_BLOCK: usize = $query_block;
                $(const LONG_QUERY_BLOCK: usize = $long_query_block;)?
                type Widened = $token;

                fn widened(self) -> $token {
                    self
                }

                fn scores(
                    self,
                    tile: $crate::kernels::ScoreTile<'_, $t, $e>,
                    group_keys: Option<&dyn Fn(usize) -> usize>,
                ) {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(
                        level: $token,
                        tile: $crate::kernels::ScoreTile<'_, $t, $e>,
                        group_keys: Option<&dyn Fn(usize) -> usize>,
                    ) {
                        $crate::kernels::generic::scores::<$t, $e, $token, $mr, $nv>(level, tile, group_keys)
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, tile, group_keys) }
                }

                fn direct_scores(
                    self,
                    q: &[$t],
                    rows: usize,
                    keys: ndarray::ArrayView2<$e>,
                    s: &mut [$t],
                ) -> $t {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(
                        level: $token,
                        q: &[$t],
                        rows: usize,
                        keys: ndarray::ArrayView2<$e>,
                        s: &mut [$t],
                    ) -> $t {
                        $crate::kernels::generic::direct_scores::<$t, $e, $token>(level, q, rows, keys, s)
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, q, rows, keys, s) }
                }

                fn magnitude(self, x: &[$e]) -> $t {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(level: $token, x: &[$e]) -> $t {
                        $crate::kernels::generic::magnitude::<$t, $e, $token>(level, x)
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, x) }
                }

                fn row_maxima(self, rows: $crate::kernels::Rows<'_, $t>, len: usize, out: &mut [$t]) {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(
                        level: $token,
                        rows: $crate::kernels::Rows<'_, $t>,
                        len: usize,
                        out: &mut [$t],
                    ) {
                        $crate::kernels::generic::row_maxima::<$t, $token>(level, rows, len, out)
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, rows, len, out) }
                }

                fn exp_rows(
                    self,
                    rows: $crate::kernels::RowsMut<'_, $t>,
                    len: usize,
                    maxima: &[$t],
                    sums: &mut [$t],
                ) {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(
                        level: $token,
                        rows: $crate::kernels::RowsMut<'_, $t>,
                        len: usize,
                        maxima: &[$t],
                        sums: &mut [$t],
                    ) {
                        $crate::kernels::generic::exp_rows::<$t, $token>(level, rows, len, maxima, sums)
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, rows, len, maxima, sums) }
                }

                fn exp_differences(self, a: &[$t], b: &[$t], out: &mut [$t]) {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(level: $token, a: &[$t], b: &[$t], out: &mut [$t]) {
                        $crate::kernels::generic::exp_differences::<$t, $token>(level, a, b, out)
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, a, b, out) }
                }

                fn accumulate_values(
                    self,
                    weights: $crate::kernels::Weights<'_, $t>,
                    alpha: &[$t],
                    values: $crate::kernels::ValueRows<'_, $e>,
                    o: &mut [$t],
                ) {
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { accumulate_values(self, weights, alpha, values, o, false) };
                }

                fn accumulate_values_measuring(
                    self,
                    weights: $crate::kernels::Weights<'_, $t>,
                    alpha: &[$t],
                    values: $crate::kernels::ValueRows<'_, $e>,
                    o: &mut [$t],
                ) -> $t {
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { accumulate_values(self, weights, alpha, values, o, true) }
                }

                fn accumulate_transposed(
                    self,
                    weights: $crate::kernels::Weights<'_, $t>,
                    values: $crate::kernels::ValueRows<'_, $e>,
                    o: &mut [$t],
                ) {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(
                        level: $token,
                        weights: $crate::kernels::Weights<'_, $t>,
                        values: $crate::kernels::ValueRows<'_, $e>,
                        o: &mut [$t],
                    ) {
                        $crate::kernels::generic::accumulate_transposed::<$t, $e, $token, $mr, $nc>(
                            level, weights, values, o,
                        )
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, weights, values, o) }
                }

                fn scale_columns(self, rows: $crate::kernels::RowsMut<'_, $t>, scales: &[$t]) {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(level: $token, rows: $crate::kernels::RowsMut<'_, $t>, scales: &[$t]) {
                        $crate::kernels::generic::scale_columns::<$t, $token>(level, rows, scales)
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, rows, scales) }
                }

                fn softmax_gradient(
                    self,
                    p: $crate::kernels::Rows<'_, $t>,
                    dp: $crate::kernels::RowsMut<'_, $t>,
                    len: usize,
                    delta: &[$t],
                ) {
                    $(#[target_feature(enable = $features)])?
                    unsafe fn entry(
                        level: $token,
                        p: $crate::kernels::Rows<'_, $t>,
                        dp: $crate::kernels::RowsMut<'_, $t>,
                        len: usize,
                        delta: &[$t],
                    ) {
                        $crate::kernels::generic::softmax_gradient::<$t, $token>(level, p, dp, len, delta)
                    }
                    // SAFETY: `self` is the level's token, made only after its features were detected.
                    unsafe { entry(self, p, dp, len, delta) }
                }
            }
        };
    };
}
use level_kernels;

/// A zero-initialised buffer of `T` whose first element is aligned to 64 bytes, so that vector
/// loads of packed panels and score rows never straddle a cache line needlessly.
pub(crate) struct Buffer<T: Element> {
    lines: Vec<T::Line>,
    len: usize,
}

impl<T: Element> Buffer<T> {
    /// `len` zeros.
    pub(crate) fn zeros(len: usize) -> Self {
        Buffer { lines: vec![T::Line::default(); Self::lines(len)], len }
    }

    /// `len` zeros, or the allocator's refusal: for buffers whose size the caller chose (a KV
    /// cache's), where running out of memory is an error to report rather than an abort.
    pub(crate) fn try_zeros(len: usize) -> Result<Self, std::collections::TryReserveError> {
        let mut lines = Vec::new();
        lines.try_reserve_exact(Self::lines(len))?;
        lines.resize(Self::lines(len), T::Line::default());
        Ok(Buffer { lines, len })
    }

    /// Makes this `len` zeros, reusing its memory when it is large enough.
    pub(crate) fn reset_zeros(&mut self, len: usize) {
        self.lines.clear();
        self.lines.resize(Self::lines(len), T::Line::default());
        self.len = len;
    }

    /// The bytes of memory that hold `len` elements (whole cache lines).
    pub(crate) fn bytes_holding(len: usize) -> usize {
        Self::lines(len) * size_of::<T::Line>()
    }

    /// The bytes of memory this buffer holds.
    pub(crate) fn capacity_bytes(&self) -> usize {
        self.lines.capacity() * size_of::<T::Line>()
    }

    /// Lines that hold `len` elements.
    fn lines(len: usize) -> usize {
        len.div_ceil(size_of::<T::Line>() / size_of::<T>())
    }
}

impl<T: Element> std::ops::Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &wide::bytemuck::cast_slice(&self.lines)[..self.len]
    }
}

impl<T: Element> std::ops::DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut wide::bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

/// The larger of two magnitudes (see [`Kernels::magnitude`]), NaN winning over everything, so
/// that a non-finite input is never lost when partial magnitudes are combined.
pub(crate) fn larger_magnitude<T: Scalar>(a: T, b: T) -> T {
    if b.is_nan() || b.abs() > a { b.abs() } else { a }
}

/// Asks the caches for the lines of `data`, without waiting for them (a no-op off x86-64).
#[inline(always)]
pub(crate) fn prefetch<E>(data: &[E]) {
    #[cfg(target_arch = "x86_64")]
    for offset in (0..size_of_val(data)).step_by(64) {
        // SAFETY: the address is inside `data`; a prefetch reads nothing architecturally and
        // cannot fault, and SSE is part of x86-64.
        unsafe {
            let line = data.as_ptr().cast::<i8>().add(offset);
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = data;
}

/// Packs keys `first_key ..` (at most `width` of them) of `k` (`[n_k, d]`) into one panel of
/// `layout.padded_dim(d) · width` scalars: for each component `c`, `K[first_key .., c]` side by
/// side ([`Layout::Lanes`]), or each pair of components of each key side by side
/// ([`Layout::Pairs`]) (zeros past the
/// last key), so the score tile reads the panel front to back. A full panel overwrites every
/// element; a partial one clears the panel first.
///
/// The layout is the level's own because a panel is as wide as the level's score tile
/// ([`Kernels::KEY_PANEL`]: 16 keys for AVX2, 64 for AVX-512, in f32), so the tile reads it with
/// no stride; only the score and weight rows have one, [`Kernels::KEY_BLOCK`].
/// Packing is plain scalar code, so a layout per level costs nothing.
pub(crate) fn pack_key_panel<E: Element>(
    k: ArrayView2<E>,
    first_key: usize,
    width: usize,
    layout: Layout,
    panel: &mut [E],
) {
    let last = (first_key + width).min(k.nrows());
    if last - first_key < width || layout.padded_dim(k.ncols()) > k.ncols() {
        panel.fill(E::default());
    }
    let d = k.ncols();
    let keys = k.slice(ndarray::s![first_key..last, ..]);
    for (chunk, first_lane) in keys.axis_chunks_iter(Axis(0), PACK_LANES).zip((0..).step_by(PACK_LANES)) {
        match layout {
            Layout::Lanes => interleave(chunk, first_lane, width, panel),
            Layout::Pairs => {
                // A pair of 16-bit components is one 32-bit unit: the lane layout of those.
                let units = contiguous_rows(chunk).and_then(|rows| pair_rows(&rows));
                if let Some(units) = units
                    && let Ok(panel) = wide::bytemuck::try_cast_slice_mut(panel)
                {
                    interleave_rows(&units[..chunk.nrows()], d / 2, first_lane, width, panel);
                } else {
                    for (lane, key) in (first_lane..).zip(chunk.rows()) {
                        for (c, &x) in key.iter().enumerate() {
                            panel[c / 2 * 2 * width + 2 * lane + c % 2] = x;
                        }
                    }
                }
            }
        }
    }
}

/// Rows of 16-bit elements (each of even length) as rows of 32-bit units, each holding a pair of
/// elements, when all are aligned to 4 bytes (as rows of even width are).
fn pair_rows<'a, E: Element>(rows: &[&'a [E]]) -> Option<[&'a [u32]; PACK_LANES]> {
    let mut units: [&[u32]; PACK_LANES] = [&[]; PACK_LANES];
    for (unit, &row) in units.iter_mut().zip(rows) {
        *unit = pairs(row)?;
    }
    Some(units)
}

/// Keys [`pack_key_panel`] transposes at a time: eight loads down eight rows, then eight stores
/// side by side.
const PACK_LANES: usize = 8;

/// Writes keys (at most [`PACK_LANES`] of them) into lanes `first_lane ..` of a panel `width`
/// lanes wide: component `c` of key `i` at `panel[c · width + first_lane + i]`. Contiguous rows
/// go as slices; others element by element (ndarray's element iterator is much slower).
fn interleave<E: Pod>(keys: ArrayView2<E>, first_lane: usize, width: usize, panel: &mut [E]) {
    match contiguous_rows(keys) {
        Some(rows) => interleave_rows(&rows[..keys.nrows()], keys.ncols(), first_lane, width, panel),
        None => {
            for (lane, key) in (first_lane..).zip(keys.rows()) {
                for (c, &x) in key.iter().enumerate() {
                    panel[c * width + lane] = x;
                }
            }
        }
    }
}

/// The rows of `rows` (at most [`PACK_LANES`]) as slices, if each is contiguous; the slots past
/// them are empty.
fn contiguous_rows<A>(rows: ArrayView2<'_, A>) -> Option<[&[A]; PACK_LANES]> {
    let mut slices: [&[A]; PACK_LANES] = [&[]; PACK_LANES];
    for (i, slice) in slices.iter_mut().enumerate().take(rows.nrows()) {
        *slice = rows.index_axis_move(Axis(0), i).to_slice()?;
    }
    Some(slices)
}

/// [`interleave`] for rows as slices, the first `len` units of each.
fn interleave_rows<U: Pod>(rows: &[&[U]], len: usize, first_lane: usize, width: usize, panel: &mut [U]) {
    match <&[&[U]; PACK_LANES]>::try_from(rows) {
        // A whole group: the compiler unrolls the fixed-length inner loop.
        Ok(rows) => {
            let rows = rows.map(|row| &row[..len]);
            // Four-byte units (f32, pairs of 16-bit elements) go four columns at a time through
            // register transposes: one unit per load and store left 3 instructions per element.
            let done = if size_of::<U>() == 4 {
                let words = rows.map(wide::bytemuck::cast_slice::<U, f32>);
                transpose_words(words, first_lane, width, wide::bytemuck::cast_slice_mut(panel), identity)
            } else {
                0
            };
            for (c, out) in (done..len).zip(panel[done * width..].chunks_exact_mut(width)) {
                let out = &mut out[first_lane..first_lane + PACK_LANES];
                for (o, row) in out.iter_mut().zip(&rows) {
                    *o = row[c];
                }
            }
        }
        Err(_) => {
            for (c, out) in (0..len).zip(panel.chunks_exact_mut(width)) {
                for (o, row) in out[first_lane..].iter_mut().zip(rows) {
                    *o = row[c];
                }
            }
        }
    }
}

/// The whole groups of four columns of `ROWS` rows of 4-byte units (a multiple of four rows), each
/// four rows × four columns transposed in registers, passed through `map` and stored as four runs
/// of four lanes: component `c` of row `i` at `panel[c · width + first_lane + i]`. Returns the
/// columns done. Key units are only moved (`map` the identity: a pair of 16-bit elements read as
/// an f32 may be a NaN, which arithmetic would alter).
#[inline(always)]
fn transpose_words<const ROWS: usize>(
    rows: [&[f32]; ROWS],
    first_lane: usize,
    width: usize,
    panel: &mut [f32],
    map: impl Fn(wide::f32x4) -> wide::f32x4,
) -> usize {
    const { assert!(ROWS.is_multiple_of(4), "whole blocks of four rows") };
    let quads = rows[0].len() / 4;
    // Rows of exactly `quads` runs of four, and each run's four output rows cut once: the loop
    // checks each row's bound once per run, not per element.
    let rows = rows.map(|row| &row[..4 * quads]);
    for (q, out) in panel.chunks_exact_mut(4 * width).take(quads).enumerate() {
        // Split, not `chunks_exact_mut`: that divides by `width` each time.
        let (first, rest) = out.split_at_mut(width);
        let (second, rest) = rest.split_at_mut(width);
        let (third, fourth) = rest.split_at_mut(width);
        let mut out = [first, second, third, fourth].map(|row| &mut row[first_lane..first_lane + ROWS]);
        for (half, rows) in rows.chunks_exact(4).enumerate() {
            let block: [wide::f32x4; 4] = std::array::from_fn(|i| {
                wide::f32x4::new(rows[i][4 * q..4 * q + 4].try_into().expect("four"))
            });
            for (out, column) in out.iter_mut().zip(wide::f32x4::transpose(block)) {
                out[4 * half..4 * half + 4].copy_from_slice(map(column).as_array());
            }
        }
    }
    4 * quads
}

/// Writes one key (`d` elements of type `A`) into lane `lane` of a packed panel of `width` keys
/// stored as `E` (the layout of [`pack_key_panel`]): component `c` at `panel[c · width + lane]`,
/// each divided by `scale` as [`store_row`] stores it. For caches that fill their panels a
/// position at a time.
pub(crate) fn write_key_lane<A: Element<Compute = f32>, E: Element<Compute = f32>>(
    key: ndarray::ArrayView1<A>,
    scale: f32,
    lane: usize,
    width: usize,
    panel: &mut [E],
) {
    store_row(key, scale, panel[lane..].iter_mut().step_by(width));
}

/// Stores `row` (elements of type `A`) into `slots` as `E`, each element `x` as
/// `E::narrow(x / scale)`: a copy when `E` is `A` and `scale` is 1 (every f32, bf16 and f16 is an
/// f32, and rounds back to itself), the nearest integer of `x / scale` for [`Q8`]. A scale of 0
/// (a row of zeros) stores zeros.
pub(crate) fn store_row<'s, A: Element<Compute = f32>, E: Element<Compute = f32>>(
    row: ndarray::ArrayView1<A>,
    scale: f32,
    slots: impl Iterator<Item = &'s mut E>,
) {
    let store = |(slot, &x): (&mut E, &A)| {
        *slot = if scale == 0.0 { E::default() } else { E::narrow(x.widen() / scale) };
    };
    // Contiguous rows (the usual case) as slices: ndarray's element iterator is much slower.
    match row.as_slice() {
        Some(row) => slots.zip(row).for_each(store),
        None => slots.zip(row.iter()).for_each(store),
    }
}

/// Packs the value rows `v` in pairs ([`Layout::Pairs`]): rows `2i` and `2i + 1` interleaved,
/// column by column, at `out[2i · stride ..]` (`stride` scalars per row, at least `d_v`); `out`
/// holds `v.nrows().div_ceil(2) · 2 · stride` zeros.
pub(crate) fn pack_value_pairs<E: Element>(v: ArrayView2<E>, stride: usize, out: &mut [E]) {
    for (j, row) in v.rows().into_iter().enumerate() {
        let pair = &mut out[j / 2 * 2 * stride..][..2 * stride];
        match as_pairs(row.as_slice(), pair) {
            // Contiguous 16-bit rows: each unit of the pair row takes its half of the 32 bits.
            Some((row, pair)) => {
                let (row, shift) = (wide::bytemuck::cast_slice::<u32, u16>(row), 16 * (j % 2));
                let keep = !(0xffff_u32 << shift);
                for (o, &x) in pair.iter_mut().zip(row) {
                    *o = *o & keep | u32::from(x) << shift;
                }
            }
            _ => pair[j % 2..].iter_mut().step_by(2).zip(row).for_each(|(o, &x)| *o = x),
        }
    }
}

/// `row` (16-bit elements, of even length) and `out` as 32-bit units, each holding a pair of
/// elements, when both are 16-bit and aligned to 4 bytes (as rows of even width are); `None`
/// otherwise.
fn as_pairs<'a, E: Element>(row: Option<&'a [E]>, out: &'a mut [E]) -> Option<(&'a [u32], &'a mut [u32])> {
    Some((pairs(row?)?, wide::bytemuck::try_cast_slice_mut(out).ok()?))
}

/// `row` as 32-bit units, each holding a pair of elements, when they are 16-bit, of even number
/// and aligned to 4 bytes.
fn pairs<E: Element>(row: &[E]) -> Option<&[u32]> {
    let row = Some(row).filter(|row| size_of::<E>() == 2 && row.len() % 2 == 0)?;
    wide::bytemuck::try_cast_slice(row).ok()
}

/// Packs value row `v_row` (`d_v` scalars) into the first `d_v` scalars of `out`.
pub(crate) fn pack_value_row<E: Element>(v_row: ndarray::ArrayView1<E>, out: &mut [E]) {
    let out = &mut out[..v_row.len()];
    match v_row.as_slice() {
        Some(row) => out.copy_from_slice(row),
        None => out.iter_mut().zip(v_row).for_each(|(o, &x)| *o = x),
    }
}

/// Packs `rows` queries starting at `q`'s row `first` for the score tile of a level whose
/// tiles take `group_rows` rows and read `layout`, and returns the factor the scores still take.
///
/// [`Layout::Lanes`]: widened and times `scale`, in groups of `group_rows`, each component-major
/// (`[d][group_rows]`), so the score tile broadcasts consecutive scalars; returns 1. `out` holds
/// `rows.next_multiple_of(group_rows) · d` scalars; the rows that pad the last group are zeros.
///
/// [`Layout::Pairs`]: as bf16 (exactly, for bf16 inputs), row after row with `d` padded to even,
/// two to a scalar of `out`; times `scale` when that is exact (a power of two, as `1/√d` is for
/// d = 4, 16, 64 and 256: see `scale_exactly`) and then returns 1, otherwise unscaled, returning
/// `scale`. The padding rows and components are zeros.
pub(crate) fn pack_queries<T: Scalar, E: Element<Compute = T>>(
    q: ArrayView2<E>,
    first: usize,
    rows: usize,
    scale: T,
    (group_rows, layout): (usize, Layout),
    out: &mut [T],
) -> T {
    let d = q.ncols();
    let padded = rows.next_multiple_of(group_rows);
    if layout == Layout::Pairs {
        let depth = layout.padded_dim(d);
        let out: &mut [bf16] = &mut wide::bytemuck::cast_slice_mut(out)[..padded * depth];
        out.fill(bf16::ZERO);
        for (r, out) in out.chunks_exact_mut(depth).take(rows).enumerate() {
            let row = q.row(first + r);
            match row.as_slice() {
                // bf16 rows (the only inputs the pair tiles take) are copied as they are.
                Some(row) if std::any::TypeId::of::<E>() == std::any::TypeId::of::<bf16>() => {
                    out[..d].copy_from_slice(wide::bytemuck::cast_slice(row));
                }
                _ => out
                    .iter_mut()
                    .zip(row)
                    .for_each(|(o, &x)| *o = bf16::from_f64(x.widen().to_f64().unwrap_or(f64::NAN))),
            }
        }
        let factor = scale.to_f64().unwrap_or(f64::NAN);
        return if scale_exactly(out, factor) { T::one() } else { scale };
    }
    for (g, group) in out[..padded * d].chunks_exact_mut(group_rows * d).enumerate() {
        let real = group_rows.min(rows - g * group_rows);
        if real < group_rows {
            group.fill(T::zero());
        }
        let row = |r: usize| q.row(first + g * group_rows + r);
        // f32 rows four at a time through register transposes, as keys are packed, scaled on the
        // way (the same products as one at a time): the first `done` rows up to column `columns`.
        let (mut done, mut columns) = (0, 0);
        if std::any::TypeId::of::<E>() == std::any::TypeId::of::<f32>() {
            let factor: f32 = wide::bytemuck::cast(scale);
            let group: &mut [f32] = wide::bytemuck::cast_slice_mut(group);
            while done + 4 <= real {
                let rows: [Option<&[E]>; 4] = std::array::from_fn(|i| row(done + i).to_slice());
                if rows.iter().any(Option::is_none) {
                    break;
                }
                let rows = rows.map(|row| wide::bytemuck::cast_slice(row.unwrap_or_default()));
                columns = transpose_words(rows, done, group_rows, group, |x| x * wide::f32x4::splat(factor));
                done += 4;
            }
        }
        for r in 0..real {
            let from = if r < done { columns } else { 0 };
            let column =
                group.get_mut(from * group_rows + r..).unwrap_or_default().iter_mut().step_by(group_rows);
            let row = row(r);
            match row.as_slice() {
                Some(row) => column.zip(&row[from..]).for_each(|(o, &x)| *o = x.widen() * scale),
                None => column.zip(row.iter().skip(from)).for_each(|(o, &x)| *o = x.widen() * scale),
            }
        }
    }
    T::one()
}

/// Multiplies every element of `x` by `factor` if it is a power of two and every product is exact
/// (each nonzero element stays a normal number), by moving exponents; otherwise leaves `x` as it
/// was and returns false. Exact scaling commutes with the tiles' sums, so scores of queries scaled
/// here equal the unscaled scores times `factor`, and the kernels skip a pass over them.
fn scale_exactly(x: &mut [bf16], factor: f64) -> bool {
    const EXPONENT: u16 = 0x7f80;
    // bf16 keeps f32's exponent: bits 7 to 14.
    let (mantissa, exponent) = (factor.to_bits() & ((1 << 52) - 1), (factor.to_bits() >> 52) as i32 - 1023);
    if !(factor > 0.0 && mantissa == 0 && exponent.abs() < 127) {
        return false;
    }
    if exponent == 0 {
        return true;
    }
    // Branch-free, so that both passes vectorise: a nonzero element fits if its exponent field
    // and the moved one lie in 1..=254 (not zero, subnormal, infinite or NaN).
    let (low, high) = (1 - exponent.min(0), 254 - exponent.max(0));
    let fits = |b: &bf16| {
        let e = i32::from((b.to_bits() & EXPONENT) >> 7);
        b.to_bits() & 0x7fff == 0 || (low..=high).contains(&e)
    };
    if !x.iter().fold(true, |all, b| all & fits(b)) {
        return false;
    }
    let step = (exponent << 7) as u16;
    for b in x.iter_mut() {
        let bits = b.to_bits();
        *b = bf16::from_bits(bits.wrapping_add(step * u16::from(bits & 0x7fff != 0)));
    }
    true
}

/// Queries `first .. first + rows` of `q`, widened and times `scale`, row after row: the layout
/// of [`Kernels::direct_scores`].
pub(crate) fn pack_query_rows<T: Scalar, E: Element<Compute = T>>(
    q: ArrayView2<E>,
    first: usize,
    rows: usize,
    scale: T,
    out: &mut [T],
) {
    let d = q.ncols();
    for (r, out) in out.chunks_exact_mut(d).take(rows).enumerate() {
        for (o, &x) in out.iter_mut().zip(q.row(first + r)) {
            *o = x.widen() * scale;
        }
    }
}

#[cfg(test)]
mod tests;
