//! The element types of the public API: [`Real`], what the engine computes in (`f32`, the fast
//! path, and `f64`), [`Storage`], what it stores keys, values and queries in (`f32`, `bf16`,
//! `f16`) and computes from in f32, and [`CacheStorage`], what a [`KvCache`](crate::KvCache) or
//! [`PagedKvCache`](crate::PagedKvCache) stores: a `Storage` type, or int8 ([`Q8`]).

use std::fmt::{Debug, Display};

use ndarray::{ArrayView1, LinalgScalar};

use crate::kernels::Element;
pub use crate::kernels::Q8;
use num_traits::Float;

/// The supertrait that seals [`Real`]: public, so that `Real` may name it, in a private module,
/// so that no other crate can name or implement it. It carries the kernels' element interface
/// (each type's SIMD vectors and dispatch), which stays out of the public API.
mod sealed {
    /// Implemented by `f32` and `f64` alone.
    pub trait Sealed: crate::kernels::Scalar {}
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

mod storage_sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type the engine stores keys, values and queries in and computes from in f32:
/// `f32` itself, `half::bf16` and `half::f16`. A [`KvCache`](crate::KvCache) holds any of them
/// (and int8, [`Q8`], which is a [`CacheStorage`] but not a `Storage`).
///
/// Sealed: each needs kernels that widen it as they load it.
///
/// ```
/// use qkv::Storage;
/// fn bytes_per_key<E: Storage>(key_dim: usize) -> usize {
///     key_dim * size_of::<E>()
/// }
/// assert_eq!(bytes_per_key::<qkv::half::bf16>(128), 256);
/// assert_eq!(qkv::half::bf16::NAME, "bf16");
/// // 1 + 2^-8 is halfway between two bf16 values (8 significant bits): it rounds to even, 1.
/// assert_eq!(qkv::half::bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
/// ```
pub trait Storage: Element<Compute = f32> + PartialEq + Debug + storage_sealed::Sealed {
    /// The name of the type, for messages (`"f32"`, `"bf16"`, `"f16"`).
    const NAME: &'static str;

    /// Rounds an f32 to this type (to nearest, ties to even; beyond the type's range, `±inf`).
    fn from_f32(x: f32) -> Self {
        Self::narrow(x)
    }

    /// This value as an f32, exactly.
    fn to_f32(self) -> f32 {
        self.widen()
    }
}

impl Storage for f32 {
    const NAME: &'static str = "f32";
}

impl Storage for half::bf16 {
    const NAME: &'static str = "bf16";
}

impl Storage for half::f16 {
    const NAME: &'static str = "f16";
}

/// A half-precision [`Storage`] type: `half::bf16` or `half::f16`, what
/// [`attention_half`](crate::attention_half) takes.
///
/// ```
/// fn is_half<H: qkv::Half>() {}
/// is_half::<qkv::half::f16>();
/// ```
pub trait Half: Storage {}

impl Half for half::bf16 {}
impl Half for half::f16 {}

mod cache_sealed {
    /// Seals [`super::CacheStorage`], and says whether the type keeps a scale per position.
    pub trait Sealed {
        /// Whether each position's key and value rows are stored divided by a scale of their
        /// own (int8), rather than as they are.
        const SCALED: bool;
    }
    impl<S: super::Storage> Sealed for S {
        const SCALED: bool = false;
    }
    impl Sealed for super::Q8 {
        const SCALED: bool = true;
    }
}

/// What a [`KvCache`](crate::KvCache) or [`PagedKvCache`](crate::PagedKvCache) stores its keys
/// and values as: any [`Storage`] type (f32,
/// `half::bf16`, `half::f16`), kept as appended, or [`Q8`], int8 quantized as appended. Every
/// `Storage` type is one, so code generic over `E: Storage` names `KvCache<E>` as before.
///
/// Sealed: each needs kernels that widen it as they load it.
///
/// ```
/// use qkv::CacheStorage;
/// assert_eq!(<qkv::Q8 as CacheStorage>::NAME, "int8");
/// assert_eq!(<qkv::half::bf16 as CacheStorage>::NAME, "bf16");
/// ```
pub trait CacheStorage: Element<Compute = f32> + Debug + cache_sealed::Sealed {
    /// The element type appends take: the type itself, or f32 for [`Q8`].
    type Appended: Storage;

    /// The name of the type, for messages (`"f32"`, `"bf16"`, `"f16"`, `"int8"`).
    const NAME: &'static str;
}

impl<S: Storage> CacheStorage for S {
    type Appended = S;
    const NAME: &'static str = <S as Storage>::NAME;
}

/// Appends take f32; each row is quantized with a scale of its own.
impl CacheStorage for Q8 {
    type Appended = f32;
    const NAME: &'static str = "int8";
}

/// The key magnitude a cache step's overflow check (`flash::stays_finite`) takes for keys of
/// magnitude at most `keys`: of an int8 cache at least 127, since the kernels multiply the
/// queries by the stored integers (up to 127) before the keys' scales shrink the products.
pub(crate) fn checked_key_magnitude<E: CacheStorage>(keys: f64) -> f64 {
    if E::SCALED { keys.max(f64::from(i8::MAX)) } else { keys }
}

/// The scale row `x` of a cache's keys or values is stored divided by: of an int8 cache,
/// `max |x| / 127` (0 for a row of zeros), so that every stored integer is within `-127 ..= 127`;
/// otherwise 1, a plain copy. Both caches quantize with it.
pub(crate) fn row_scale<E: CacheStorage>(x: ArrayView1<E::Appended>) -> f32 {
    if !E::SCALED {
        return 1.0;
    }
    x.iter().fold(0.0_f32, |m, &x| m.max(x.to_f32().abs())) / 127.0
}
