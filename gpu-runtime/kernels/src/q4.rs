//! The 4-bit block format for weights: [`QK8`] values per block as nibbles in 16 bytes, with an
//! `f32` scale and minimum, value = nibble × scale + min (GGML's Q4_1 layout: byte `j` holds
//! value `j` in its low nibble and value `j + 16` in its high one). Half the bytes of
//! [`crate::Q8Matrix`], which is what batch-1 decode is bound by: it reads every weight once per
//! token.

use crate::KernelError;
use crate::q8::{QK8, check_shape};

/// A weight matrix, `rows × cols`, row-major, in 4-bit blocks.
#[derive(Clone, Debug)]
pub struct Q4Matrix {
    rows: usize,
    cols: usize,
    nibbles: Vec<u8>,
    scales: Vec<f32>,
    mins: Vec<f32>,
}

impl Q4Matrix {
    /// Quantizes row-major `values` of shape `rows × cols` (`cols` a multiple of [`QK8`]): each
    /// block's range is split in 15 steps from its minimum.
    pub fn quantize(values: &[f32], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(values.len(), rows, cols)?;
        let blocks = values.len() / QK8;
        let mut nibbles = vec![0u8; blocks * QK8 / 2];
        let mut scales = Vec::with_capacity(blocks);
        let mut mins = Vec::with_capacity(blocks);
        for (block, out) in values
            .chunks_exact(QK8)
            .zip(nibbles.chunks_exact_mut(QK8 / 2))
        {
            let min = block.iter().copied().fold(f32::INFINITY, f32::min);
            let max = block.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let scale = (max - min) / 15.0;
            let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
            let q = |v: f32| ((v - min) * inverse).round().clamp(0.0, 15.0) as u8;
            for j in 0..QK8 / 2 {
                out[j] = q(block[j]) | (q(block[j + QK8 / 2]) << 4);
            }
            scales.push(scale);
            mins.push(min);
        }
        Ok(Self {
            rows,
            cols,
            nibbles,
            scales,
            mins,
        })
    }

    /// Stacks matrices with the same column count, one under the other.
    pub fn stack(parts: &[Q4Matrix]) -> Result<Self, KernelError> {
        let cols = parts.first().map_or(QK8, |p| p.cols);
        if let Some(odd) = parts.iter().find(|p| p.cols != cols) {
            return Err(KernelError::Length {
                len: odd.rows * odd.cols,
                rows: odd.rows,
                cols,
            });
        }
        Ok(Self {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols,
            nibbles: parts
                .iter()
                .flat_map(|p| p.nibbles.iter().copied())
                .collect(),
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
            mins: parts.iter().flat_map(|p| p.mins.iter().copied()).collect(),
        })
    }

    /// Rows (outputs).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns (inputs).
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.nibbles.len() + 4 * (self.scales.len() + self.mins.len())
    }

    /// Row `r` as values, into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (nibbles, scales, mins) = self.row(r);
        for (b, out) in out.chunks_exact_mut(QK8).enumerate() {
            let bytes = &nibbles[b * QK8 / 2..(b + 1) * QK8 / 2];
            for j in 0..QK8 / 2 {
                out[j] = f32::from(bytes[j] & 0x0f) * scales[b] + mins[b];
                out[j + QK8 / 2] = f32::from(bytes[j] >> 4) * scales[b] + mins[b];
            }
        }
    }

    pub(crate) fn row(&self, r: usize) -> (&[u8], &[f32], &[f32]) {
        let blocks = self.cols / QK8;
        (
            &self.nibbles[r * self.cols / 2..(r + 1) * self.cols / 2],
            &self.scales[r * blocks..(r + 1) * blocks],
            &self.mins[r * blocks..(r + 1) * blocks],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_within_half_a_step() {
        let values: Vec<f32> = (0..64)
            .map(|i| ((i * 37) % 64) as f32 * 0.11 - 2.0)
            .collect();
        let m = Q4Matrix::quantize(&values, 2, 32).unwrap();
        let mut back = vec![0.0; 32];
        for r in 0..2 {
            m.dequantize_row(r, &mut back);
            let block = &values[r * 32..(r + 1) * 32];
            let step = (block.iter().copied().fold(f32::MIN, f32::max)
                - block.iter().copied().fold(f32::MAX, f32::min))
                / 15.0;
            for (b, v) in back.iter().zip(block) {
                assert!((b - v).abs() <= step / 2.0 + 1e-5, "{b} vs {v}");
            }
        }
    }

    #[test]
    fn sixteen_level_values_survive_exactly() {
        // What a Q4_1 file holds: 16 levels per block; requantizing must not move them.
        let values: Vec<f32> = (0..32).map(|i| (i % 16) as f32 * 0.25 - 1.0).collect();
        let m = Q4Matrix::quantize(&values, 1, 32).unwrap();
        let mut back = vec![0.0; 32];
        m.dequantize_row(0, &mut back);
        assert_eq!(back, values);
    }
}
