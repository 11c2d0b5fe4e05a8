//! Which SIMD level the fast path's kernels run at: the fastest the CPU runs, detected once, on
//! first use, or another the CPU runs that the `QKV_SIMD` environment variable forces; reported by
//! [`simd_report`].

use std::str::FromStr;
use std::sync::OnceLock;

use crate::error::AttentionError;
use crate::kernels::Isa;
use crate::level::SimdLevel;

/// The environment variable that forces a level: `amx`, `avx512bf16`, `avx512`, `avx2` or
/// `baseline`.
pub(crate) const SIMD_VARIABLE: &str = "QKV_SIMD";

impl SimdLevel {
    /// Whether this CPU runs the level.
    pub fn is_supported(self) -> bool {
        Isa::new(self).is_some()
    }

    /// The best level this CPU runs.
    pub fn detected() -> SimdLevel {
        SimdLevel::ALL.into_iter().rev().find(|level| level.is_supported()).unwrap_or(SimdLevel::Baseline)
    }

    /// The fastest level this CPU runs: the detected one, or the best below it where that one is
    /// slower on this CPU (AVX512-BF16 on Intel's CPUs, whose `vdpbf16ps` loses to AVX-512's
    /// widened FMA).
    pub(crate) fn fastest() -> SimdLevel {
        let pays = |level: &SimdLevel| Isa::new(*level).is_some_and(Isa::pays);
        SimdLevel::ALL.into_iter().rev().find(pays).unwrap_or(SimdLevel::Baseline)
    }

    /// The level the engine runs at unless a call asks for another: the fastest this CPU runs
    /// (the detected one, or a lower one where that is slower here), or the one `QKV_SIMD` asks
    /// for (in any case; unset, empty or blank asks for none). Fails if `QKV_SIMD` names no level
    /// or one this CPU does not run.
    pub fn dispatched() -> Result<SimdLevel, AttentionError> {
        dispatch().map(|(_, choice)| choice.level)
    }
}

impl FromStr for SimdLevel {
    type Err = AttentionError;

    /// Parses a level's [`name`](SimdLevel::name), in any case and with spaces around it (as an
    /// environment variable may hold it: `AVX2`, ` avx2`).
    fn from_str(value: &str) -> Result<SimdLevel, AttentionError> {
        SimdLevel::ALL
            .into_iter()
            .find(|level| level.name().eq_ignore_ascii_case(value.trim()))
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
                Ok(value) if !value.trim().is_empty() => (value.parse::<SimdLevel>()?, true),
                _ => (SimdLevel::fastest(), false),
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
/// `avx2 (AVX2+FMA), the best this CPU runs`, `avx512 (AVX-512F+DQ), the fastest this CPU runs
/// (avx512bf16 is slower here)` or `baseline (SSE2), forced by QKV_SIMD=baseline; this CPU runs
/// avx2`.
///
/// ```
/// let report = qkv::simd_report();
/// assert!(report.starts_with(qkv::SimdLevel::dispatched().map_or("no level", |l| l.name())));
/// ```
pub fn simd_report() -> String {
    let detected = SimdLevel::detected();
    match dispatch() {
        Ok((_, Choice { level, forced: false })) if level == detected => {
            format!("{level} ({}), the best this CPU runs", level.instructions())
        }
        Ok((_, Choice { level, forced: false })) => {
            format!(
                "{level} ({}), the fastest this CPU runs ({detected} is slower here)",
                level.instructions()
            )
        }
        Ok((_, Choice { level, forced: true })) => format!(
            "{level} ({}), forced by {SIMD_VARIABLE}={level}; this CPU runs {detected}",
            level.instructions()
        ),
        Err(error) => format!("no level: {error}"),
    }
}
