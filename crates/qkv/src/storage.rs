//! Inputs stored in fewer bits than they are computed in: `half::bf16` and `half::f16` keys,
//! values and queries, widened to f32 as the kernels load them, with f32 scores, softmax and
//! accumulation.

use ndarray::{Array2, ArrayView2};

use crate::error::AttentionError;
use crate::flash;
use crate::kernels::Element;
use crate::mask::AttentionOptions;
use crate::shape::{Magnitudes, Shape};
use crate::simd;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type the engine stores keys, values and queries in and computes from in f32:
/// `f32` itself, `half::bf16` and `half::f16`. A [`KvCache`](crate::KvCache) holds any of them.
///
/// Sealed: each needs kernels that widen it as they load it.
///
/// ```
/// use qkv::Storage;
/// fn bytes_per_key<E: Storage>(key_dim: usize) -> usize {
///     key_dim * size_of::<E>()
/// }
/// assert_eq!(bytes_per_key::<half::bf16>(128), 256);
/// assert_eq!(half::bf16::NAME, "bf16");
/// // 1 + 2^-8 is halfway between two bf16 values (8 significant bits): it rounds to even, 1.
/// assert_eq!(half::bf16::from_f32(1.0 + 1.0 / 256.0).to_f32(), 1.0);
/// ```
pub trait Storage: Element<Compute = f32> + std::fmt::Debug + sealed::Sealed {
    /// The name of the type, for messages (`"f32"`, `"bf16"`, `"f16"`).
    const NAME: &'static str;

    /// Rounds an f32 to this type (to nearest, ties to even).
    fn from_f32(x: f32) -> Self;

    /// This value as an f32, exactly.
    fn to_f32(self) -> f32 {
        self.widen()
    }
}

impl Storage for f32 {
    const NAME: &'static str = "f32";

    fn from_f32(x: f32) -> f32 {
        x
    }
}

impl Storage for half::bf16 {
    const NAME: &'static str = "bf16";

    fn from_f32(x: f32) -> half::bf16 {
        half::bf16::from_f32(x)
    }
}

impl Storage for half::f16 {
    const NAME: &'static str = "f16";

    fn from_f32(x: f32) -> half::f16 {
        half::f16::from_f32(x)
    }
}

/// A half-precision [`Storage`] type: `half::bf16` or `half::f16`, what
/// [`attention_half`] takes.
///
/// ```
/// fn is_half<H: qkv::Half>() {}
/// is_half::<half::f16>();
/// ```
pub trait Half: Storage {}

impl Half for half::bf16 {}
impl Half for half::f16 {}

/// Scaled dot-product attention, output only, over half-precision inputs: like
/// [`attention`](crate::attention), with `q`, `k` and `v` stored as bf16 or f16 and computed in
/// f32 (scores, softmax and `P·V` alike). The kernels widen each key and value as they load it,
/// so a step bound by memory reads half the bytes of f32. Masks, bias and scale come in f32.
///
/// Inputs so large that an f32 score or sum could overflow are widened to f32 and take the
/// checked path of [`attention`](crate::attention), which names the query whose score overflows.
///
/// ```
/// use half::bf16;
/// use ndarray::array;
/// let q = array![[0.0_f32, 1.0]].mapv(bf16::from_f32);
/// let k = array![[1.0_f32, 0.0], [0.0, 1.0], [1.0, 1.0]].mapv(bf16::from_f32);
/// let v = array![[2.0_f32], [6.0], [4.0]].mapv(bf16::from_f32);
/// let out = qkv::attention_half(q.view(), k.view(), v.view(), &qkv::AttentionOptions::new())?;
/// assert!((out[[0, 0]] - 4.4067).abs() < 1e-4); // these inputs are exact in bf16
/// # Ok::<(), qkv::AttentionError>(())
/// ```
pub fn attention_half<H: Half>(
    q: ArrayView2<H>,
    k: ArrayView2<H>,
    v: ArrayView2<H>,
    options: &AttentionOptions<f32>,
) -> Result<Array2<f32>, AttentionError> {
    let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
    let masks = options.resolve(&shape)?;
    let kernels = simd::kernels_for(options.simd_level())?;
    let widened = || {
        let widen = |a: ArrayView2<H>| a.mapv(|x| x.widen());
        crate::attention(widen(q).view(), widen(k).view(), widen(v).view(), options)
    };
    // A non-finite input may sit in a key no query sees (accepted) or in one that is seen (an
    // error naming it): the f32 path sorts that out, as it does a possible overflow.
    let Ok(magnitudes) = Magnitudes::measure(&q, &k, &v) else { return widened() };
    if !flash::stays_finite(&shape, &magnitudes, &masks) {
        return widened();
    }
    let mut out = Array2::zeros((shape.n_queries, shape.value_dim));
    let head = flash::Head { q, k, v, out: out.view_mut(), lse: None, masks };
    flash::attend(kernels, &shape, 1, vec![head]);
    Ok(out)
}
