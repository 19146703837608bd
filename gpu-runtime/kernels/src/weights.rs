//! [`Weights`]: a weight matrix in either block format, so the model chooses per matrix.

use crate::{KernelError, Q4Matrix, Q8Matrix};

/// The block formats a weight matrix can be kept in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// [`Q8Matrix`]: 8.5 bits per weight (with its `f32` scale: 9).
    Q8,
    /// [`Q4Matrix`]: 4 bits per weight plus an `f32` scale and minimum per 32 (6).
    Q4,
}

/// A weight matrix in one of the block formats.
#[derive(Clone, Debug)]
pub enum Weights {
    /// 8-bit blocks.
    Q8(Q8Matrix),
    /// 4-bit blocks.
    Q4(Q4Matrix),
}

impl Weights {
    /// Quantizes row-major `values` of shape `rows × cols` into `format`.
    pub fn quantize(
        format: Format,
        values: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<Self, KernelError> {
        Ok(match format {
            Format::Q8 => Self::Q8(Q8Matrix::quantize(values, rows, cols)?),
            Format::Q4 => Self::Q4(Q4Matrix::quantize(values, rows, cols)?),
        })
    }

    /// Stacks matrices of one format and column count, one under the other.
    pub fn stack(parts: Vec<Weights>) -> Result<Self, KernelError> {
        let q8: Option<Vec<Q8Matrix>> = parts
            .iter()
            .map(|p| match p {
                Self::Q8(m) => Some(m.clone()),
                Self::Q4(_) => None,
            })
            .collect();
        if let Some(q8) = q8 {
            return Ok(Self::Q8(Q8Matrix::stack(&q8)?));
        }
        let q4: Option<Vec<Q4Matrix>> = parts
            .into_iter()
            .map(|p| match p {
                Self::Q4(m) => Some(m),
                Self::Q8(_) => None,
            })
            .collect();
        match q4 {
            Some(q4) => Ok(Self::Q4(Q4Matrix::stack(&q4)?)),
            None => Err(KernelError::MixedFormats),
        }
    }

    /// Its format.
    pub fn format(&self) -> Format {
        match self {
            Self::Q8(_) => Format::Q8,
            Self::Q4(_) => Format::Q4,
        }
    }

    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        match self {
            Self::Q8(m) => m.rows(),
            Self::Q4(m) => m.rows(),
        }
    }

    /// Columns (inputs).
    pub fn cols(&self) -> usize {
        match self {
            Self::Q8(m) => m.cols(),
            Self::Q4(m) => m.cols(),
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Q8(m) => m.bytes(),
            Self::Q4(m) => m.bytes(),
        }
    }

    /// Row `r` as values, into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        match self {
            Self::Q8(m) => m.dequantize_row(r, out),
            Self::Q4(m) => m.dequantize_row(r, out),
        }
    }
}
