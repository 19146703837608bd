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
        let format = parts.first().map_or(Format::Q8, Weights::format);
        if parts.iter().any(|p| p.format() != format) {
            return Err(KernelError::MixedFormats);
        }
        let mut q8 = Vec::new();
        let mut q4 = Vec::new();
        for part in parts {
            match part {
                Self::Q8(m) => q8.push(m),
                Self::Q4(m) => q4.push(m),
            }
        }
        Ok(match format {
            Format::Q8 => Self::Q8(Q8Matrix::stack(&q8)?),
            Format::Q4 => Self::Q4(Q4Matrix::stack(&q4)?),
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacking_keeps_the_format_and_refuses_a_mix() {
        let q8 = || Weights::quantize(Format::Q8, &[0.5; 64], 2, 32).unwrap();
        let q4 = || Weights::quantize(Format::Q4, &[0.5; 32], 1, 32).unwrap();
        let stacked = Weights::stack(vec![q8(), q8()]).unwrap();
        assert_eq!((stacked.format(), stacked.rows()), (Format::Q8, 4));
        let stacked = Weights::stack(vec![q4(), q4(), q4()]).unwrap();
        assert_eq!((stacked.format(), stacked.rows()), (Format::Q4, 3));
        assert!(matches!(
            Weights::stack(vec![q8(), q4()]),
            Err(KernelError::MixedFormats)
        ));
    }
}
