//! The element types the engine computes in: `f32` (the fast path) and `f64`.

use std::fmt::{Debug, Display};

use ndarray::LinalgScalar;
use num_traits::Float;

use crate::kernels::{Element, Exp2};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element the engine accepts: `f32` or `f64`.
///
/// Sealed so that kernels may specialise on exactly these two types (`Element` gives each its
/// SIMD vector type).
pub trait Real:
    Float
    + LinalgScalar
    + Send
    + Sync
    + Debug
    + Display
    + Default
    + sealed::Sealed
    + Element<Compute = Self>
    + Exp2
    + 'static
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
