//! Which SIMD level the fast path's kernels run at: detected once, on first use, from the CPU, or
//! forced lower with the `QKV_SIMD` environment variable, and reported by [`simd_report`].

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::error::AttentionError;
use crate::kernels::Isa;

/// An instruction-set level of the fast path's kernels, from least to most capable. Every build
/// carries all the levels of its target; the engine picks the best one the CPU runs.
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
    /// AVX-512F (x86-64): 16 f32 lanes.
    Avx512,
    /// AVX512-BF16 (x86-64: AMD Zen 4 and later, Intel since Cooper Lake): bf16 inputs multiplied
    /// two by two in vector registers (`vdpbf16ps`), with their weights rounded to bf16 before
    /// `P·V` as at [`SimdLevel::Amx`], and everything else at [`SimdLevel::Avx512`]. Reads bf16
    /// subnormals as zero, as the instruction does. Needs AVX-512F and BW too.
    Avx512Bf16,
    /// AMX-BF16 (x86-64, Intel since Sapphire Rapids): bf16 inputs multiplied on the tile unit,
    /// 16 × 16 sums at a time, with their weights rounded to bf16 before `P·V` (as PyTorch's and
    /// FlashAttention's bf16 kernels round them), and everything else at [`SimdLevel::Avx512`].
    /// The tile unit reads bf16 subnormals (magnitudes below 2^-126) as zero. Needs AVX-512F, BW
    /// and BF16 too, and Linux to grant the process the tile state.
    Amx,
}

/// The environment variable that forces a level: `amx`, `avx512bf16`, `avx512`, `avx2` or
/// `baseline`.
pub(crate) const SIMD_VARIABLE: &str = "QKV_SIMD";

impl SimdLevel {
    /// Every level, lowest first.
    pub const ALL: [SimdLevel; 5] =
        [SimdLevel::Baseline, SimdLevel::Avx2, SimdLevel::Avx512, SimdLevel::Avx512Bf16, SimdLevel::Amx];

    /// The name `QKV_SIMD` and [`SimdLevel::from_str`] take: `baseline`, `avx2`, `avx512`,
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
            SimdLevel::Avx512 => "AVX-512F",
            SimdLevel::Avx2 => "AVX2+FMA",
            SimdLevel::Baseline if cfg!(target_arch = "x86_64") => "SSE2",
            SimdLevel::Baseline if cfg!(target_arch = "aarch64") => "NEON",
            SimdLevel::Baseline => "scalar",
        }
    }

    /// Whether this CPU runs the level.
    pub fn is_supported(self) -> bool {
        Isa::new(self).is_some()
    }

    /// The best level this CPU runs.
    pub fn detected() -> SimdLevel {
        SimdLevel::ALL.into_iter().rev().find(|level| level.is_supported()).unwrap_or(SimdLevel::Baseline)
    }

    /// The level the engine runs at unless a call asks for another: the detected one, or the one
    /// `QKV_SIMD` asks for. Fails if `QKV_SIMD` names no level or one this CPU does not run.
    pub fn dispatched() -> Result<SimdLevel, AttentionError> {
        dispatch().map(|(_, choice)| choice.level)
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SimdLevel {
    type Err = AttentionError;

    /// Parses a level's [`name`](SimdLevel::name).
    fn from_str(value: &str) -> Result<SimdLevel, AttentionError> {
        SimdLevel::ALL
            .into_iter()
            .find(|level| level.name() == value)
            .ok_or_else(|| AttentionError::UnknownSimdLevel { value: value.to_string() })
    }
}

/// The process-wide choice: made once, on first use.
#[derive(Debug, Clone, Copy)]
struct Choice {
    level: SimdLevel,
    /// Whether `QKV_SIMD` chose it (otherwise detection did).
    forced: bool,
}

/// The dispatched level's kernels and how it was chosen, decided on the first call and kept.
fn dispatch() -> Result<(Isa, Choice), AttentionError> {
    static DISPATCH: OnceLock<Result<(Isa, Choice), AttentionError>> = OnceLock::new();
    DISPATCH
        .get_or_init(|| {
            let (level, forced) = match std::env::var(SIMD_VARIABLE) {
                Ok(value) if !value.is_empty() => (value.parse::<SimdLevel>()?, true),
                _ => (SimdLevel::detected(), false),
            };
            let isa = Isa::new(level).ok_or(AttentionError::UnsupportedSimdLevel {
                requested: level,
                supported: SimdLevel::detected(),
                by: SIMD_VARIABLE,
            })?;
            Ok((isa, Choice { level, forced }))
        })
        .clone()
}

/// The kernels for a call: the level `requested` (from [`AttentionOptions::simd`]) if given and
/// supported, otherwise the dispatched one.
///
/// [`AttentionOptions::simd`]: crate::AttentionOptions::simd
pub(crate) fn kernels_for(requested: Option<SimdLevel>) -> Result<Isa, AttentionError> {
    match requested {
        None => dispatch().map(|(isa, _)| isa),
        Some(level) => Isa::new(level).ok_or(AttentionError::UnsupportedSimdLevel {
            requested: level,
            supported: SimdLevel::detected(),
            by: "AttentionOptions::simd",
        }),
    }
}

/// One line for logs and `--version` output: the level the kernels run at and why, e.g.
/// `avx2 (AVX2+FMA), the best this CPU runs` or `baseline (SSE2), forced by QKV_SIMD=baseline;
/// this CPU runs avx2`.
///
/// ```
/// let report = qkv::simd_report();
/// assert!(report.starts_with(qkv::SimdLevel::dispatched().map_or("no level", |l| l.name())));
/// ```
pub fn simd_report() -> String {
    let detected = SimdLevel::detected();
    match dispatch() {
        Ok((_, Choice { level, forced: false })) => {
            format!("{level} ({}), the best this CPU runs", level.instructions())
        }
        Ok((_, Choice { level, forced: true })) => format!(
            "{level} ({}), forced by {SIMD_VARIABLE}={level}; this CPU runs {detected}",
            level.instructions()
        ),
        Err(error) => format!("no level: {error}"),
    }
}
