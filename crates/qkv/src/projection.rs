//! Attention from embeddings: queries, keys and values as projections of embeddings, of one
//! sequence (self-attention) or of two (cross-attention: a decoder's queries over an encoder's
//! keys and values).

use ndarray::{Array2, ArrayView2};

use crate::attention::attention;
use crate::element::Real;
use crate::error::AttentionError;
use crate::finite::check_finite;
use crate::options::AttentionOptions;

/// The learned projections of an attention layer.
///
/// ```
/// use qkv::ndarray::Array2;
/// let eye = Array2::<f64>::eye(2);
/// let layer = qkv::Projections { w_q: eye.clone(), w_k: eye.clone(), w_v: eye, w_o: None };
/// let x = qkv::ndarray::array![[1.0, 0.0], [0.0, 1.0]];
/// let p = layer.project(x.view())?;
/// assert_eq!(p.keys, x);
/// let out = layer.self_attention(x.view(), &qkv::AttentionOptions::new())?;
/// assert_eq!(out.shape(), [2, 2]);
/// # Ok::<(), qkv::AttentionError>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Projections<T> {
    /// `W_Q`, `[d_model, d_k]`.
    pub w_q: Array2<T>,
    /// `W_K`, `[d_model, d_k]`.
    pub w_k: Array2<T>,
    /// `W_V`, `[d_model, d_v]`.
    pub w_v: Array2<T>,
    /// Optional output projection `W_O`, `[d_v, d_out]`.
    pub w_o: Option<Array2<T>>,
}

/// Queries, keys and values projected from embeddings.
#[derive(Debug, Clone, PartialEq)]
pub struct Projected<T> {
    /// `Q = X·W_Q`, `[n, d_k]`.
    pub queries: Array2<T>,
    /// `K = X·W_K`, `[n, d_k]`.
    pub keys: Array2<T>,
    /// `V = X·W_V`, `[n, d_v]`.
    pub values: Array2<T>,
}

impl<T: Real> Projections<T> {
    /// Projects embeddings `x` (`[n, d_model]`) to queries, keys and values.
    pub fn project(&self, x: ArrayView2<T>) -> Result<Projected<T>, AttentionError> {
        check_finite("x", &x)?;
        self.project_checked(x, x)
    }

    /// Projects for cross-attention: queries from `x_q` (`[n_q, d_q]`, say a decoder's states),
    /// keys and values from `x_kv` (`[n_k, d_kv]`, say an encoder's). `w_q` is `[d_q, d_k]`;
    /// `w_k` and `w_v` have `d_kv` rows.
    ///
    /// ```
    /// use qkv::ndarray::Array2;
    /// let layer = qkv::Projections {
    ///     w_q: Array2::<f32>::ones((4, 2)), // a decoder of width 4
    ///     w_k: Array2::ones((6, 2)),        // an encoder of width 6
    ///     w_v: Array2::ones((6, 3)),
    ///     w_o: None,
    /// };
    /// let p = layer.project_cross(Array2::zeros((1, 4)).view(), Array2::zeros((5, 6)).view())?;
    /// assert_eq!((p.queries.shape(), p.keys.shape(), p.values.shape()), (&[1, 2][..], &[5, 2][..], &[5, 3][..]));
    /// # Ok::<(), qkv::AttentionError>(())
    /// ```
    pub fn project_cross(
        &self,
        x_q: ArrayView2<T>,
        x_kv: ArrayView2<T>,
    ) -> Result<Projected<T>, AttentionError> {
        check_finite("x_q", &x_q)?;
        check_finite("x_kv", &x_kv)?;
        self.project_checked(x_q, x_kv)
    }

    /// Both projections once the embeddings are known to be finite.
    fn project_checked(
        &self,
        x_q: ArrayView2<T>,
        x_kv: ArrayView2<T>,
    ) -> Result<Projected<T>, AttentionError> {
        let d_model = x_kv.ncols();
        for (argument, w, width) in
            [("w_q", &self.w_q, x_q.ncols()), ("w_k", &self.w_k, d_model), ("w_v", &self.w_v, d_model)]
        {
            if w.nrows() != width {
                return Err(AttentionError::ProjectionShape {
                    argument,
                    expected: format!("[{width}, _]"),
                    found: w.shape().into(),
                    why: "it multiplies embeddings from the right, so its rows must match their width",
                });
            }
            check_finite(argument, w)?;
        }
        if self.w_k.ncols() != self.w_q.ncols() {
            return Err(AttentionError::ProjectionShape {
                argument: "w_k",
                expected: format!("[{d_model}, {}]", self.w_q.ncols()),
                found: self.w_k.shape().into(),
                why: "queries and keys meet in a dot product, so w_k needs as many columns as w_q",
            });
        }
        Ok(Projected { queries: x_q.dot(&self.w_q), keys: x_kv.dot(&self.w_k), values: x_kv.dot(&self.w_v) })
    }

    /// Self-attention of `x` over itself, then `W_O` if present: `[n, d_out]` (or `[n, d_v]`).
    pub fn self_attention(
        &self,
        x: ArrayView2<T>,
        options: &AttentionOptions<T>,
    ) -> Result<Array2<T>, AttentionError> {
        let p = self.project(x)?;
        let out = attention(p.queries.view(), p.keys.view(), p.values.view(), options)?;
        match &self.w_o {
            None => Ok(out),
            Some(w_o) if w_o.nrows() == out.ncols() => {
                check_finite("w_o", w_o)?;
                Ok(out.dot(w_o))
            }
            Some(w_o) => Err(AttentionError::ProjectionShape {
                argument: "w_o",
                expected: format!("[{}, _]", out.ncols()),
                found: w_o.shape().into(),
                why: "it maps the attention output, so its rows must match d_v",
            }),
        }
    }
}
