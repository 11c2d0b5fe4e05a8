//! Tensors as the Python package hands them over: an address, an element type, a shape and
//! strides, viewed in place as `ndarray` views (no copy). The package (`python/qkv/_core.py`)
//! takes them from a torch tensor or a NumPy array, which Python keeps alive for the call.

use std::ptr::NonNull;

use ndarray::{ArrayView, ArrayViewMut, Dimension, ShapeBuilder};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use qkv::half::{bf16, f16};

/// Element types, numbered as `python/qkv/_core.py` numbers them (`_CODES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F64,
    Bf16,
    F16,
    Bool,
}

impl Dtype {
    /// The element type numbered `code`, if any.
    pub fn from_code(code: u8) -> Option<Dtype> {
        [Dtype::F32, Dtype::F64, Dtype::Bf16, Dtype::F16, Dtype::Bool].get(usize::from(code)).copied()
    }

    /// The name Python users know it by.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "float32",
            Dtype::F64 => "float64",
            Dtype::Bf16 => "bfloat16",
            Dtype::F16 => "float16",
            Dtype::Bool => "bool",
        }
    }
}

/// An element type a [`Raw`] may hold.
pub trait Element: Copy + 'static {
    /// Its [`Dtype`].
    const DTYPE: Dtype;
}

impl Element for f32 {
    const DTYPE: Dtype = Dtype::F32;
}
impl Element for f64 {
    const DTYPE: Dtype = Dtype::F64;
}
impl Element for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
}
impl Element for f16 {
    const DTYPE: Dtype = Dtype::F16;
}
impl Element for bool {
    const DTYPE: Dtype = Dtype::Bool;
}

/// `(address, dtype code, shape, strides in elements)`: a tensor's memory, borrowed for one call.
/// Holds no Python object, so it crosses into the code that runs without the GIL.
#[derive(Debug, Clone, FromPyObject)]
pub struct Raw(usize, u8, Vec<usize>, Vec<isize>);

impl Raw {
    /// A tensor at `address` of element type `code` (as `_CODES` numbers them).
    pub fn new(address: usize, code: u8, shape: Vec<usize>, strides: Vec<isize>) -> Raw {
        Raw(address, code, shape, strides)
    }

    /// The same memory broadcast to `shape`, of the same rank: an axis of length 1 that
    /// `shape` lengthens takes a stride of 0, as `torch.expand` gives it; every other axis
    /// keeps its length (the caller has checked that `shape` broadcasts).
    pub fn expanded(mut self, shape: &[usize]) -> Raw {
        for ((extent, stride), &to) in self.2.iter_mut().zip(self.3.iter_mut()).zip(shape) {
            if *extent == 1 && to != 1 {
                (*extent, *stride) = (to, 0);
            }
        }
        self
    }

    /// Its element type; `argument` names it in the error.
    pub fn dtype(&self, argument: &str) -> PyResult<Dtype> {
        Dtype::from_code(self.1)
            .ok_or_else(|| PyValueError::new_err(format!("{argument}: unknown dtype code {}", self.1)))
    }

    /// Checks the element type, rank, strides and alignment, and returns the pointer and the
    /// ndarray shape to view.
    fn parts<T: Element, D: Dimension>(
        &self,
        argument: &str,
    ) -> PyResult<(NonNull<T>, ndarray::StrideShape<D>)> {
        let (address, _, shape, strides) = (self.0, self.1, &self.2, &self.3);
        let dtype = self.dtype(argument)?;
        if dtype != T::DTYPE {
            return Err(PyValueError::new_err(format!(
                "{argument} has dtype {} where {} is needed",
                dtype.name(),
                T::DTYPE.name()
            )));
        }
        if D::NDIM.is_some_and(|n| n != shape.len()) || strides.len() != shape.len() {
            return Err(PyValueError::new_err(format!(
                "{argument} has {} dimensions {shape:?} where {} are needed",
                shape.len(),
                D::NDIM.unwrap_or(shape.len())
            )));
        }
        let strides: Vec<usize> = strides
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<Result<_, _>>()
            .map_err(|_| PyValueError::new_err(format!("{argument} has negative strides {strides:?}")))?;
        let empty = shape.contains(&0);
        let pointer = match NonNull::new(address as *mut T) {
            // An empty tensor may have no memory; ndarray still wants a non-null, aligned pointer.
            _ if empty => NonNull::dangling(),
            Some(p) if address % align_of::<T>() == 0 => p,
            _ => {
                return Err(PyValueError::new_err(format!(
                    "{argument} starts at address {address:#x}, not aligned for {}",
                    T::DTYPE.name()
                )));
            }
        };
        let mut dim = D::zeros(shape.len());
        dim.slice_mut().copy_from_slice(shape);
        let mut stride = D::zeros(shape.len());
        stride.slice_mut().copy_from_slice(&strides);
        Ok((pointer, dim.strides(stride)))
    }

    /// The tensor as a read-only view.
    ///
    /// # Safety
    /// The memory must hold the tensor the description says, alive and unwritten by others for
    /// `'a`.
    pub unsafe fn view<'a, T: Element, D: Dimension>(&self, argument: &str) -> PyResult<ArrayView<'a, T, D>> {
        let (pointer, shape) = self.parts::<T, D>(argument)?;
        // SAFETY: the caller vouches for the memory; `parts` checked rank, strides and alignment.
        Ok(unsafe { ArrayView::from_shape_ptr(shape, pointer.as_ptr()) })
    }

    /// The tensor as a writable view.
    ///
    /// # Safety
    /// As [`Raw::view`], and no element may be reachable by two indices (zero strides only on
    /// axes of length 1) nor through any other view for `'a`.
    pub unsafe fn view_mut<'a, T: Element, D: Dimension>(
        &self,
        argument: &str,
    ) -> PyResult<ArrayViewMut<'a, T, D>> {
        let (pointer, shape) = self.parts::<T, D>(argument)?;
        // SAFETY: as in `view`; the Python side allocates every output fresh and contiguous.
        Ok(unsafe { ArrayViewMut::from_shape_ptr(shape, pointer.as_ptr()) })
    }
}
