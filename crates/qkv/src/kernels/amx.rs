//! The AMX level: bf16 score and `P·V` tiles on Intel's tile unit (AMX-BF16, `tdpbf16ps`: a
//! 16 × 32 by 32 × 16 bf16 product added to 16 × 16 f32 sums in one instruction), with
//! AVX-512 for everything between the tiles (the softmax, the rescale, rounding the weights).
//! The tiles are why this level exists: on one core of the Intel Xeon of 2026-12-02,
//! `tdpbf16ps` ran about 2.4 TFLOP/s, against 0.21 for AVX-512 FMA.
//!
//! Only bf16 inputs take the tiles; every other element type runs the AVX-512 kernels at this
//! level, and so do the decoding and cache paths (see `Isa::vectors`), whose layouts the tiles
//! do not read.
//!
//! The tiles multiply bf16 by bf16, so the weights `P` are rounded to bf16 before `P·V`, as
//! PyTorch's and FlashAttention's bf16 kernels round them; scores, sums and the output stay f32.
//! What that costs, measured on random inputs (|q|, |k| ≤ 3, |v| ≤ 1, n = 4096, d = 64): a
//! largest error against the f64 reference of 7.2e-4 here and 3.0e-6 at AVX-512, against the
//! bound 3.9e-3 (2^-8 of the largest |v|). Queries are scaled before the tiles only where that
//! is exact (a power-of-two scale, moved into their exponents), otherwise the scale is applied to
//! the f32 scores: either way the scores are the exact products of the stored inputs, summed in
//! f32, times the scale.
//!
//! The tile registers are not known to the compiler: every kernel loads its own tile
//! configuration, uses registers `tmm0`–`tmm7` inside one call, and releases them before it
//! returns, so no tile state lives across calls or threads. Keeping the tiles configured across
//! calls measured no faster, so the simpler per-call setup stays.

use std::arch::asm;
use std::arch::x86_64::*;
use std::sync::OnceLock;

use half::bf16;

use super::avx512::Avx512;
use super::avx512bf16::{Avx512Bf16, add_odd_key, pair_level_kernels};
use super::{Layout, ScoreTile, ValueRows, Weights};

/// Proof that this CPU runs AMX-BF16 and AMX-TILE with AVX-512F, BW, DQ and BF16, and that the
/// operating system gave this process the tile state: only [`Amx::detect`] makes one.
#[derive(Debug, Clone, Copy)]
pub struct Amx(Avx512Bf16);

/// Keys per score tile column block, and value columns per `P·V` tile: 16 f32 per tile row.
const TILE: usize = 16;
/// bf16 components (or keys) per tile row of an `A` operand: 64 bytes.
const TILE_DEPTH: usize = 32;
/// Accumulator tiles per pass (`tmm0`–`tmm3`).
const SUMS: usize = 4;
/// Bytes of key panels (in [`scores`]) or of value columns (in [`accumulate_values`]) that every
/// group of 16 rows runs through before the next chunk: a chunk stays in L1 while the block's four
/// groups use it, where a whole block's keys or values (64 KiB at d = 64, more than L1) came from
/// L2 again for each group. On the Intel Xeon family 6 model 167 (`repeat --bf16 4096 4096 0 30`,
/// one thread, bench README of 2026-12-06): `P·V` in chunks of 16 KiB ran 0.92 of the time
/// without, 8 KiB 3% slower than 16 and 32 KiB level with it; the score kernel's chunks of 16 KiB
/// then 0.985 (d = 64), and at d = 128 0.947 against 0.969 for 32 KiB.
const CHUNK_BYTES: usize = 16 << 10;

/// Keys per block of the tiled loop at this level ([`super::Kernels::KEY_BLOCK`]), four times
/// the vector levels': with the products on the tiles, the work per row and block (maxima, the
/// rescale factors and the state's update, configuring the tiles for each kernel call) is a
/// larger share of a block. On the Intel Xeon family 6 model 207 (`repeat`, builds alternated):
/// 256 against 128 took bf16 n = 4096 6–9% less time, causal 10% and GQA 8/2 n = 1024 6%; 512
/// took 2–6% less again. At the vector levels 256 was no faster for f32 at AVX-512 and 3% slower
/// on causal f32 at AVX2, so they keep 128.
const KEY_BLOCK: usize = 512;
/// Scalars from one row of scores (then weights) to the next ([`super::Kernels::SCORE_STRIDE`]):
/// a block's 512 and a cache line. A tile store of scores or load of weights touches 16 rows at
/// once, and rows 2 KiB apart fall in 2 of L1's 64 sets, which hold 24 lines. On the Intel Xeon
/// family 6 model 167 (bench README, 2026-12-06; pairs against rows 512 apart): bf16 n = 4096
/// 0.95 of the time at one and two threads, GQA 8/2 n = 1024 0.95; causal and d = 128 level. Two
/// lines more ran level with one.
const SCORE_STRIDE: usize = KEY_BLOCK + TILE;

impl Amx {
    /// `Some` if the CPU has the features and Linux grants the tile data state (asked once per
    /// process with `arch_prctl(ARCH_REQ_XCOMP_PERM)`; every thread of the process may then use
    /// the tiles).
    pub(crate) fn detect() -> Option<Amx> {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        let vectors = Avx512Bf16::detect()?;
        // CPUID leaf 7, sub-leaf 0: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE (the standard
        // library's detection of these is not stable yet).
        let edx = __cpuid_count(7, 0).edx;
        let tiles = edx & (1 << 22) != 0 && edx & (1 << 24) != 0;
        (tiles && *GRANTED.get_or_init(request_tile_state)).then_some(Amx(vectors))
    }

    /// The AVX-512 level this one runs its vector kernels at.
    pub(crate) fn vectors(self) -> Avx512 {
        self.0.vectors()
    }
}

/// Asks Linux for permission to use the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
/// XFEATURE_XTILEDATA)`), without which the first tile instruction faults.
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_PRCTL: usize = 158;
    const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
    const XFEATURE_XTILEDATA: usize = 18;
    let result: isize;
    // SAFETY: the system call reads two integers and changes only this process's permissions;
    // `syscall` clobbers rcx and r11, declared here.
    unsafe {
        asm!(
            "syscall",
            inlateout("rax") ARCH_PRCTL as isize => result,
            in("rdi") ARCH_REQ_XCOMP_PERM,
            in("rsi") XFEATURE_XTILEDATA,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    result == 0
}

/// Other systems: not asked, so the level is not offered.
#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// A tile configuration (`ldtilecfg`'s 64-byte operand, palette 1): bytes per row and rows of
/// each of the eight tile registers (the entries past the eighth are reserved, zero).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

const _: () = assert!(size_of::<TileConfig>() == 64);

impl TileConfig {
    /// `tmm0`–`tmm3` sums of 16 × 16 f32, `tmm4` and `tmm5` a whole `A` (16 × 32 bf16) and `B`
    /// (16 pairs × 16 lanes), `tmm6` and `tmm7` the `A` and `B` of a shorter last step of
    /// `tail` bf16 components (even, below 32; none if 0).
    fn new(tail: usize) -> TileConfig {
        let mut config =
            TileConfig { palette: 1, start_row: 0, reserved: [0; 14], bytes_per_row: [0; 16], rows: [0; 16] };
        for t in 0..6 {
            config.bytes_per_row[t] = 64;
            config.rows[t] = 16;
        }
        if tail > 0 {
            config.bytes_per_row[6] = (2 * tail) as u16;
            config.rows[6] = 16;
            config.bytes_per_row[7] = 64;
            config.rows[7] = (tail / 2) as u8;
        }
        config
    }
}

/// The tile registers configured for one kernel call and released when it ends (also on a
/// panic), so that no tile state outlives the call.
struct Tiles(());

impl Tiles {
    /// Loads `config`.
    ///
    /// # Safety
    /// The CPU must run AMX-TILE with the tile state granted (an [`Amx`] token proves both).
    #[inline(always)]
    unsafe fn configure(config: &TileConfig) -> Tiles {
        // SAFETY: the caller guarantees AMX; `config` is a valid 64-byte palette-1 configuration.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config, options(nostack, readonly)) };
        Tiles(())
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: a `Tiles` exists only after `configure` ran on an AMX CPU.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// `tileloadd`: tile register `$tmm` from `rows` rows of its configured width, `stride` bytes
/// apart from `$ptr`.
macro_rules! tile_load {
    ($tmm:literal, $ptr:expr, $stride:expr) => {
        asm!(
            concat!("tileloadd ", $tmm, ", [{base} + {stride}*1]"),
            base = in(reg) $ptr,
            stride = in(reg) ($stride) as usize,
            options(nostack, readonly),
        )
    };
}

/// `tilestored`: tile register `$tmm` to its rows, `stride` bytes apart from `$ptr`.
macro_rules! tile_store {
    ($tmm:literal, $ptr:expr, $stride:expr) => {
        asm!(
            concat!("tilestored [{base} + {stride}*1], ", $tmm),
            base = in(reg) $ptr,
            stride = in(reg) ($stride) as usize,
            options(nostack),
        )
    };
}

/// `tdpbf16ps` into sum tile `sum` (0–3) from the `A` and `B` registers given.
macro_rules! tile_multiply {
    ($sum:expr, $a:literal, $b:literal) => {
        match $sum {
            0 => asm!(concat!("tdpbf16ps tmm0, ", $a, ", ", $b), options(nostack, nomem)),
            1 => asm!(concat!("tdpbf16ps tmm1, ", $a, ", ", $b), options(nostack, nomem)),
            2 => asm!(concat!("tdpbf16ps tmm2, ", $a, ", ", $b), options(nostack, nomem)),
            _ => asm!(concat!("tdpbf16ps tmm3, ", $a, ", ", $b), options(nostack, nomem)),
        }
    };
}

/// Sum tile `sum` (0–3) loaded from, or stored to, 16 rows `stride` bytes apart.
macro_rules! sum_tile {
    (load $sum:expr, $ptr:expr, $stride:expr) => {
        match $sum {
            0 => tile_load!("tmm0", $ptr, $stride),
            1 => tile_load!("tmm1", $ptr, $stride),
            2 => tile_load!("tmm2", $ptr, $stride),
            _ => tile_load!("tmm3", $ptr, $stride),
        }
    };
    (store $sum:expr, $ptr:expr, $stride:expr) => {
        match $sum {
            0 => tile_store!("tmm0", $ptr, $stride),
            1 => tile_store!("tmm1", $ptr, $stride),
            2 => tile_store!("tmm2", $ptr, $stride),
            _ => tile_store!("tmm3", $ptr, $stride),
        }
    };
    (zero $sum:expr) => {
        match $sum {
            0 => asm!("tilezero tmm0", options(nostack, nomem)),
            1 => asm!("tilezero tmm1", options(nostack, nomem)),
            2 => asm!("tilezero tmm2", options(nostack, nomem)),
            _ => asm!("tilezero tmm3", options(nostack, nomem)),
        }
    };
}

/// The bf16 of packed queries, which [`Layout::Pairs`] stores in the f32 scratch (two to a
/// scalar).
fn as_bf16(scalars: &[f32]) -> &[bf16] {
    wide::bytemuck::cast_slice(scalars)
}

/// `sum_j += A_c · B_{j, c}` for the sum tiles `j < count` over every step `c` of 32 bf16 (the
/// last one `tail` wide, in `tmm6`/`tmm7`): `a(c)` is where step `c`'s `A` starts (16 rows,
/// `a_stride` bytes apart), `b(j, c)` where sum `j`'s `B` does (pair rows `b_stride` apart). The
/// inner loop of both tile kernels.
///
/// # Safety
/// The tiles must be configured (`TileConfig::new(tail)`), and every tile the addresses name must
/// lie inside memory the caller may read.
#[inline(always)]
unsafe fn multiply_steps(
    (steps, tail): (usize, usize),
    count: usize,
    (a, a_stride): (impl Fn(usize) -> *const bf16, usize),
    (b, b_stride): (impl Fn(usize, usize) -> *const bf16, usize),
) {
    for step in 0..steps + usize::from(tail > 0) {
        let c = step * TILE_DEPTH;
        let whole = step < steps;
        // SAFETY: the caller guarantees the configuration and the addresses.
        unsafe {
            if whole {
                tile_load!("tmm4", a(c), a_stride);
            } else {
                tile_load!("tmm6", a(c), a_stride);
            }
            for j in 0..count {
                if whole {
                    tile_load!("tmm5", b(j, c), b_stride);
                    tile_multiply!(j, "tmm4", "tmm5");
                } else {
                    tile_load!("tmm7", b(j, c), b_stride);
                    tile_multiply!(j, "tmm6", "tmm7");
                }
            }
        }
    }
}

/// `S = scale · Q·Kᵀ` for groups of 16 packed query rows (`[rows][d_even]` bf16) against panels
/// of 16 keys (`[d_even / 2][16][2]` bf16), with the lane-wise row maxima when asked for.
///
/// # Safety
/// The CPU must run AMX-BF16 with the tile state granted and AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn scores(tile: ScoreTile<'_, f32, bf16>, group_keys: Option<&dyn Fn(usize) -> usize>) {
    let ScoreTile { q, d, rows, keys, panels, s, stride, row_max, maxima, scale, real_rows: _ } = tile;
    let depth = Layout::Pairs.padded_dim(d);
    let q = &as_bf16(q)[..rows * depth];
    let panel_len = TILE * depth;
    let keys = &keys[..panels * panel_len];
    assert!(rows % TILE == 0 && s.len() >= rows * stride && row_max.len() >= rows * TILE);
    assert!(panels * TILE <= stride, "a row of scores holds every panel's");
    let (steps, tail) = (depth / TILE_DEPTH, depth % TILE_DEPTH);
    // SAFETY: the caller guarantees AMX. Every tile load reads 16 rows (or `tail / 2` for the
    // last `B`) of at most 64 bytes inside `q` (rows `g .. g + 16` of `depth` bf16, from
    // component `c`) or inside `keys` (a panel's pair rows from `c / 2`); every store writes 16
    // rows of 16 f32 inside `s` (rows `g ..` of `stride`, keys `p · 16 ..`, within a row since
    // `panels · 16 <= stride`). The slices were cut to those lengths above.
    unsafe {
        let _tiles = Tiles::configure(&TileConfig::new(tail));
        // Group `g`'s products are issued before group `g - 16`'s scale and maxima: the tile
        // unit multiplies while the vector units scale, where in program order the scaling
        // (which waits for its group's tile stores) kept the next products out of reach.
        // Scores already scaled, whose maxima no one reads, need no vector half at all.
        let vector_half = maxima || scale != 1.0;
        let mut unscaled = None;
        // Whole passes of `SUMS` panels, at least one.
        let chunk_panels = (CHUNK_BYTES / (2 * panel_len) / SUMS).max(1) * SUMS;
        for chunk in (0..panels.max(1)).step_by(chunk_panels) {
            for g in (0..rows).step_by(TILE) {
                let needed = match group_keys {
                    Some(keys) => keys(g).div_ceil(TILE).min(panels),
                    None => panels,
                };
                let end = needed.min(chunk + chunk_panels);
                for first in (chunk..end).step_by(SUMS) {
                    let count = SUMS.min(end - first);
                    for j in 0..count {
                        sum_tile!(zero j);
                    }
                    let a = |c: usize| q[g * depth + c..].as_ptr();
                    let b = |j: usize, c: usize| keys[(first + j) * panel_len + c * TILE..].as_ptr();
                    multiply_steps((steps, tail), count, (a, 2 * depth), (b, 64));
                    for j in 0..count {
                        let out = s[g * stride + (first + j) * TILE..].as_mut_ptr();
                        sum_tile!(store j, out, 4 * stride);
                    }
                }
                // The chunk with the group's last panel (the first, if it has none) completes it.
                if chunk == needed.saturating_sub(1) / chunk_panels * chunk_panels
                    && let Some(group) = unscaled.replace((g, needed)).filter(|_| vector_half)
                {
                    scale_group(group, (s, stride), maxima.then_some(&mut *row_max), scale);
                }
            }
        }
        if let Some(group) = unscaled.filter(|_| vector_half) {
            scale_group(group, (s, stride), maxima.then_some(row_max), scale);
        }
    }
}

/// Scales the scores of the 16 rows from `g` (`stride` apart) over the first `needed` panels by
/// `scale` (unless it is 1: queries packed scaled, see `kernels::pack_queries`), and writes their
/// lane-wise maxima into `row_max` when given: the vector half of [`scores`].
///
/// # Safety
/// The CPU must run AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn scale_group(
    (g, needed): (usize, usize),
    (s, stride): (&mut [f32], usize),
    mut row_max: Option<&mut [f32]>,
    scale: f32,
) {
    let factor = _mm512_set1_ps(scale);
    for r in g..g + TILE {
        let row = &mut s[r * stride..][..needed * TILE];
        // SAFETY: the caller guarantees AVX-512F; every chunk and `row_max`'s slice hold 16 f32.
        unsafe {
            let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
            for x in row.chunks_exact_mut(TILE) {
                let mut scores = _mm512_loadu_ps(x.as_ptr());
                if scale != 1.0 {
                    scores = _mm512_mul_ps(scores, factor);
                    _mm512_storeu_ps(x.as_mut_ptr(), scores);
                }
                max = _mm512_max_ps(max, scores);
            }
            if let Some(row_max) = row_max.as_deref_mut() {
                _mm512_storeu_ps(row_max[r * TILE..][..TILE].as_mut_ptr(), max);
            }
        }
    }
}

/// `O_r = α_r · O_r + Σ_j P[r, j] · V_j` for groups of 16 rows, the weights as the pair levels'
/// `exp_rows` leaves them (bf16 at the start of each row of `SCORE_STRIDE` scalars) and the value
/// rows in pairs (`[n / 2][stride][2]` bf16, see [`Layout::Pairs`]).
///
/// # Safety
/// The CPU must run AMX-BF16 with the tile state granted, AVX-512F, BW and BF16.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn accumulate_values(
    weights: Weights<'_, f32>,
    alpha: &[f32],
    values: ValueRows<'_, bf16>,
    o: &mut [f32],
) {
    let Weights { p, rows, n_keys } = weights;
    let ValueRows { v, stride, vectors } = values;
    let o_stride = vectors * TILE;
    assert!(rows % TILE == 0 && o.len() >= rows * o_stride && stride >= o_stride);
    let o = &mut o[..rows * o_stride];
    // A row whose maximum did not move (most rows, once a few key blocks are in) keeps its sums.
    for (o, &a) in o.chunks_exact_mut(o_stride).zip(&alpha[..rows]).filter(|&(_, &a)| a != 1.0) {
        let a = _mm512_set1_ps(a);
        for x in o.chunks_exact_mut(TILE) {
            // SAFETY: the caller guarantees AVX-512F; `x` holds exactly 16 f32.
            unsafe { _mm512_storeu_ps(x.as_mut_ptr(), _mm512_mul_ps(_mm512_loadu_ps(x.as_ptr()), a)) };
        }
    }
    // The tiles take pairs of keys; an odd last key is added with vectors, so that its pair's
    // other half (a key no query of the tile may see) is never read.
    let paired = n_keys & !1;
    let tail = paired % TILE_DEPTH;
    let v = &v[..n_keys.div_ceil(2) * 2 * stride];
    // Rows of `2 · SCORE_STRIDE` bf16, each starting with its weights.
    let p = as_bf16(&p[..rows * SCORE_STRIDE]);
    // SAFETY: the caller guarantees AMX.
    let _tiles = unsafe { Tiles::configure(&TileConfig::new(tail)) };
    // Chunks of keys that one pass of `SUMS` value tiles reads `CHUNK_BYTES` of, a whole number
    // of tile steps, so that only the last chunk has the tail the tiles are configured for.
    let chunk_keys = (CHUNK_BYTES / (2 * SUMS * TILE) / TILE_DEPTH).max(1) * TILE_DEPTH;
    for chunk in (0..paired).step_by(chunk_keys) {
        let keys = chunk_keys.min(paired - chunk);
        for first in (0..vectors).step_by(SUMS) {
            let count = SUMS.min(vectors - first);
            for g in (0..rows).step_by(TILE) {
                let o = &mut o[g * o_stride..(g + TILE) * o_stride];
                // SAFETY: the tiles are configured, for the tail of the last chunk. The `A` loads
                // read 16 rows of at most 64 bytes of `p` (rows `g ..`, `4 · SCORE_STRIDE` bytes
                // apart, from key `chunk + c < paired`); the `B` loads read 16 (or `tail / 2`)
                // pair rows of 64 bytes of `v` from pair `(chunk + c) / 2` at column `t · 16`
                // (`4 · stride` bytes apart, all below pair `paired / 2 <= v.len() / (2 · stride)`);
                // the sums read and write 16 rows of 16 f32 of `o` at column `t · 16 < o_stride`.
                unsafe {
                    for j in 0..count {
                        sum_tile!(load j, o[(first + j) * TILE..].as_ptr(), 4 * o_stride);
                    }
                    let a = |c: usize| p[2 * g * SCORE_STRIDE + chunk + c..].as_ptr();
                    let b = |j: usize, c: usize| v[(chunk + c) * stride + (first + j) * 2 * TILE..].as_ptr();
                    let steps = (keys / TILE_DEPTH, keys % TILE_DEPTH);
                    multiply_steps(steps, count, (a, 4 * SCORE_STRIDE), (b, 4 * stride));
                    for j in 0..count {
                        sum_tile!(store j, o[(first + j) * TILE..].as_mut_ptr(), 4 * o_stride);
                    }
                }
            }
        }
    }
    if paired < n_keys {
        let key_row = &v[paired * stride..][..2 * o_stride];
        for g in (0..rows).step_by(TILE) {
            let o = &mut o[g * o_stride..(g + TILE) * o_stride];
            for r in 0..TILE {
                let weight = p[2 * (g + r) * SCORE_STRIDE + paired].to_f32();
                // SAFETY: the caller guarantees AVX-512F.
                unsafe { add_odd_key(weight, key_row, &mut o[r * o_stride..(r + 1) * o_stride]) };
            }
        }
    }
}

// 16 rows per tile; blocks of 64 rows, four tiles of rows over each key block.
// The tile unit gives no maxima: rows keep their references (`RAISES_REFERENCES`), which spares
// `scores` its pass over each row for them.
pair_level_kernels!(Amx, tile_rows = TILE, query_block = 64, key_block = KEY_BLOCK,
    score_stride = SCORE_STRIDE, raises_references = true;
    scores = scores, accumulate_values = accumulate_values);
