//! Shape validation at the public boundary: once a [`Shape`] exists, the paths inside take it as given.

use ndarray::ArrayView2;

use crate::element::Real;
use crate::error::AttentionError;

/// The validated sizes of one attention problem (one batch element, one head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Number of queries (`n_q`).
    pub n_queries: usize,
    /// Number of keys and of values (`n_k`).
    pub n_keys: usize,
    /// Width of queries and keys (`d_k`).
    pub key_dim: usize,
    /// Width of values and of the output (`d_v`).
    pub value_dim: usize,
}

impl Shape {
    /// Checks that `q: [n_q, d_k]`, `k: [n_k, d_k]`, `v: [n_k, d_v]` fit together, that widths are
    /// positive and that every element is finite. There may be no keys at all (`n_k = 0`): every
    /// query then attends to nothing, as a fully masked row does.
    ///
    /// ```
    /// let q = qkv::ndarray::Array2::<f32>::zeros((3, 8));
    /// let kv = qkv::ndarray::Array2::<f32>::zeros((5, 8));
    /// let shape = qkv::Shape::check(&q.view(), &kv.view(), &kv.view())?;
    /// assert_eq!((shape.n_queries, shape.n_keys, shape.key_dim, shape.value_dim), (3, 5, 8, 8));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn check<T: Real>(
        q: &ArrayView2<T>,
        k: &ArrayView2<T>,
        v: &ArrayView2<T>,
    ) -> Result<Shape, AttentionError> {
        Shape::check_measured(q, k, v).map(|(shape, _)| shape)
    }

    /// [`Shape::check`], also returning the inputs' largest magnitudes (from the same passes).
    pub(crate) fn check_measured<T: Real>(
        q: &ArrayView2<T>,
        k: &ArrayView2<T>,
        v: &ArrayView2<T>,
    ) -> Result<(Shape, Magnitudes), AttentionError> {
        let shape = Shape::of_dims(q.shape(), k.shape(), v.shape())?;
        Ok((shape, Magnitudes::measure(q, k, v)?))
    }

    /// The shape checks alone, without looking at elements. The last two axes of each shape are
    /// the matrix; leading (batch, head) axes are only reported in errors, so that a message
    /// names the shapes that were passed.
    pub(crate) fn of_dims(q: &[usize], k: &[usize], v: &[usize]) -> Result<Shape, AttentionError> {
        let last2 = |d: &[usize]| (d[d.len() - 2], d[d.len() - 1]);
        let (n_queries, query_width) = last2(q);
        let (n_keys, key_width) = last2(k);
        let (value_rows, value_dim) = last2(v);
        if key_width != query_width {
            return Err(AttentionError::KeyWidth {
                query_width,
                key_width,
                queries: q.into(),
                keys: k.into(),
            });
        }
        if value_rows != n_keys {
            return Err(AttentionError::ValueRows {
                key_rows: n_keys,
                value_rows,
                keys: k.into(),
                values: v.into(),
            });
        }
        if key_width == 0 {
            return Err(AttentionError::Empty {
                argument: "keys",
                shape: k.into(),
                why: "queries and keys need at least one component to take a dot product",
            });
        }
        if value_dim == 0 {
            return Err(AttentionError::Empty {
                argument: "values",
                shape: v.into(),
                why: "each value needs at least one component to blend",
            });
        }
        Ok(Shape { n_queries, n_keys, key_dim: key_width, value_dim })
    }

    /// Multiply-adds in `Q·Kᵀ` and `P·V` together, times two: the FLOP count benchmarks report.
    ///
    /// ```
    /// let shape = qkv::Shape { n_queries: 4, n_keys: 8, key_dim: 16, value_dim: 16 };
    /// assert_eq!(shape.flops(), 4.0 * 4.0 * 8.0 * 16.0);
    /// ```
    pub fn flops(&self) -> f64 {
        2.0 * self.n_queries as f64 * self.n_keys as f64 * (self.key_dim + self.value_dim) as f64
    }
}

/// The largest `|x|` of each input, measured while checking that they are finite: the fast path
/// bounds its intermediates with them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Magnitudes {
    pub(crate) queries: f64,
    pub(crate) keys: f64,
    pub(crate) values: f64,
}

/// `with_FIELD(self, value) -> Self` for `usize` fields of a `#[non_exhaustive]` shape, so that
/// its callers build it as `Shape::new(..).with_capacity(..)` and a later field is no breaking
/// change.
macro_rules! with_fields {
    ($shape:ident: $($with:ident($field:ident), $doc:literal;)*) => {
        impl $shape {
            $(
                #[doc = $doc]
                pub const fn $with(self, $field: usize) -> Self {
                    $shape { $field, ..self }
                }
            )*
        }
    };
}
pub(crate) use with_fields;
