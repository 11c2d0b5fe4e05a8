//! The instruction-set levels of the fast path's kernels, by name: the one list of levels that
//! the public API, the environment variable `QKV_SIMD` and the kernels' dispatch share. Which
//! levels this CPU runs is the kernels' to detect (`simd.rs` asks them).

use std::fmt;

/// An instruction-set level of the fast path's kernels, from least to most capable. Every build
/// carries all the levels of its target; the engine picks the fastest one the CPU runs (the best,
/// except [`SimdLevel::Avx512Bf16`] on Intel's CPUs).
///
/// ```
/// use qkv::SimdLevel;
/// let best = SimdLevel::detected();
/// assert!(best.is_supported() && SimdLevel::Baseline.is_supported());
/// assert_eq!("avx2".parse::<SimdLevel>()?, SimdLevel::Avx2);
/// // Every level this CPU runs gives the same answer, to rounding.
/// let options = qkv::AttentionOptions::<f32>::new().simd(SimdLevel::Baseline);
/// # let _ = options;
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// The target's own vectors, which every CPU of the target runs: SSE2 on x86-64 (4 f32
    /// lanes), NEON on aarch64.
    Baseline,
    /// AVX2 with FMA (x86-64): 8 f32 lanes; also F16C, which widens f16 keys and values.
    Avx2,
    /// AVX-512F with DQ (x86-64): 16 f32 lanes; DQ's `vreduceps` splits the softmax's exponent
    /// (every AVX-512 CPU but the Xeon Phi has DQ).
    Avx512,
    /// AVX512-BF16 (x86-64: AMD Zen 4 and later, Intel since Cooper Lake): bf16 inputs multiplied
    /// two by two in vector registers (`vdpbf16ps`), with their weights rounded to bf16 before
    /// `P·V` as at [`SimdLevel::Amx`], and everything else at [`SimdLevel::Avx512`]. Reads bf16
    /// subnormals as zero, as the instruction does. Needs AVX-512F, BW and DQ too. The engine
    /// runs it by default on AMD's CPUs; on Intel's, where [`SimdLevel::Avx512`] runs bf16 faster,
    /// only when asked for (`QKV_SIMD`, `AttentionOptions::simd`).
    Avx512Bf16,
    /// AMX-BF16 (x86-64, Intel since Sapphire Rapids): bf16 inputs multiplied on the tile unit,
    /// 16 × 16 sums at a time, with their weights rounded to bf16 before `P·V` (as PyTorch's and
    /// FlashAttention's bf16 kernels round them), and everything else at [`SimdLevel::Avx512`].
    /// The tile unit reads bf16 subnormals (magnitudes below 2^-126) as zero. Needs AVX-512F, BW,
    /// DQ and BF16 too, and Linux to grant the process the tile state.
    Amx,
}

impl SimdLevel {
    /// Every level, lowest first.
    pub const ALL: [SimdLevel; 5] =
        [SimdLevel::Baseline, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Avx512Bf16, SimdLevel::Amx];

    /// The name `QKV_SIMD` and `str::parse` take: `baseline`, `avx2`, `avx512`,
    /// `avx512bf16`, `amx`.
    pub const fn name(self) -> &'static str {
        match self {
            SimdLevel::Baseline => "baseline",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
            SimdLevel::Avx512Bf16 => "avx512bf16",
            SimdLevel::Amx => "amx",
        }
    }

    /// The instructions the level uses on this target, for reports: `AVX2+FMA`, `SSE2`, ….
    pub const fn instructions(self) -> &'static str {
        match self {
            SimdLevel::Amx => "AMX-BF16+AVX-512",
            SimdLevel::Avx512Bf16 => "AVX512-BF16",
            SimdLevel::Avx512 => "AVX-512F+DQ",
            SimdLevel::Avx2 => "AVX2+FMA",
            SimdLevel::Baseline if cfg!(target_arch = "x86_64") => "SSE2",
            SimdLevel::Baseline if cfg!(target_arch = "aarch64") => "NEON",
            SimdLevel::Baseline => "scalar",
        }
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
