//! The element types the engine computes in: `f32` (the fast path) and `f64`.

use std::fmt::{Debug, Display};

use ndarray::LinalgScalar;
use num_traits::Float;

/// The supertrait that seals [`Real`]: public, so that `Real` may name it, in a private module,
/// so that no other crate can name or implement it. It carries the kernels' element interface
/// (each type's SIMD vectors and dispatch), which stays out of the public API.
mod sealed {
    /// Implemented by `f32` and `f64` alone.
    pub trait Sealed: crate::kernels::Element<Compute = Self> + crate::kernels::Exp2 {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element the engine accepts: `f32` or `f64`.
///
/// Sealed: its supertrait `Sealed` lives in a private module, so no other crate can implement
/// `Real`, and the kernels may specialise on exactly these two types. Every other supertrait is
/// a public trait of `num-traits` or `ndarray`.
///
/// ```
/// fn total<T: qkv::Real>(xs: &[T]) -> f64 {
///     xs.iter().map(|x| x.to_f64_exact()).sum()
/// }
/// assert_eq!(total(&[1.5_f32, 2.5]), 4.0);
/// ```
pub trait Real:
    Float + LinalgScalar + Send + Sync + Debug + Display + Default + sealed::Sealed + 'static
{
    /// The name of the type, for messages (`"f32"`, `"f64"`).
    const NAME: &'static str;

    /// Widens to `f64` exactly.
    fn to_f64_exact(self) -> f64;

    /// Narrows from `f64`, rounding to nearest.
    fn from_f64_round(value: f64) -> Self;
}

impl Real for f32 {
    const NAME: &'static str = "f32";

    fn to_f64_exact(self) -> f64 {
        f64::from(self)
    }

    fn from_f64_round(value: f64) -> Self {
        value as f32
    }
}

impl Real for f64 {
    const NAME: &'static str = "f64";

    fn to_f64_exact(self) -> f64 {
        self
    }

    fn from_f64_round(value: f64) -> Self {
        value
    }
}
