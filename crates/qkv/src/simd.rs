//! Which SIMD instruction set this build of the engine uses, and whether the CPU could do better.

use std::fmt;

/// An x86-64 SIMD level, from least to most capable (`Scalar` elsewhere).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SimdLevel {
    /// No vector instructions assumed beyond the target's baseline (not x86-64, or unknown).
    Scalar,
    /// SSE2, the x86-64 baseline: 4 f32 lanes.
    Sse2,
    /// AVX2 with FMA: 8 f32 lanes.
    Avx2,
    /// AVX-512F: 16 f32 lanes.
    Avx512,
}

impl SimdLevel {
    /// The level the engine was compiled for (`wide` picks its instructions at compile time, so
    /// this is what the kernels run with).
    pub const fn compiled() -> SimdLevel {
        if cfg!(target_feature = "avx512f") {
            SimdLevel::Avx512
        } else if cfg!(all(target_feature = "avx2", target_feature = "fma")) {
            SimdLevel::Avx2
        } else if cfg!(target_feature = "sse2") {
            SimdLevel::Sse2
        } else {
            SimdLevel::Scalar
        }
    }

    /// The best level the running CPU supports.
    pub fn detected() -> SimdLevel {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return SimdLevel::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
                return SimdLevel::Avx2;
            }
            SimdLevel::Sse2
        }
        #[cfg(not(target_arch = "x86_64"))]
        SimdLevel::Scalar
    }
}

impl fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Sse2 => "sse2",
            SimdLevel::Avx2 => "avx2+fma",
            SimdLevel::Avx512 => "avx512",
        })
    }
}

/// One line for logs and `--version` output: the compiled level, and a hint when the CPU could
/// run a better one (build with `-C target-cpu=native`).
pub fn simd_report() -> String {
    let (built, cpu) = (SimdLevel::compiled(), SimdLevel::detected());
    if cpu > built {
        format!("built for {built}; this CPU supports {cpu}: build with RUSTFLAGS=\"-C target-cpu=native\"")
    } else {
        format!("built for {built}")
    }
}
