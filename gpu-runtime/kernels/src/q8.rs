//! The int8 block format: [`QK8`] signed bytes and one `f32` scale per block, value ≈ byte ×
//! scale. Quantizing a block maps its largest magnitude to ±127, so `-128` never occurs (the
//! AVX kernels rely on it: `|w| × a` fits a signed 16-bit pair sum).

use crate::KernelError;

/// Values per block.
pub const QK8: usize = 32;

/// Quantizes one block of [`QK8`] values into `out`, returning its scale.
fn quantize_block(values: &[f32], out: &mut [i8]) -> f32 {
    let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let scale = max / 127.0;
    let inverse = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    for (q, v) in out.iter_mut().zip(values) {
        *q = round_to_int(v * inverse).clamp(-127.0, 127.0) as i8;
    }
    scale
}

/// Rounds to the nearest integer, ties to even, with two additions: adding 1.5 × 2²³ pushes
/// the fraction out of an f32's mantissa under the default rounding mode. Exact for
/// |x| < 2²², which covers quantized values (|x| ≤ 127). `f32::round` is a libm call on
/// baseline x86-64, and this loop runs for every activation row of every matmul.
#[inline(always)]
fn round_to_int(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

pub(crate) fn check_shape(len: usize, rows: usize, cols: usize) -> Result<(), KernelError> {
    if !cols.is_multiple_of(QK8) {
        return Err(KernelError::Shape { rows, cols });
    }
    if rows.checked_mul(cols) != Some(len) {
        return Err(KernelError::Length { len, rows, cols });
    }
    Ok(())
}

/// A weight matrix, `rows × cols`, row-major, in int8 blocks.
#[derive(Clone, Debug)]
pub struct Q8Matrix {
    rows: usize,
    cols: usize,
    qs: Vec<i8>,
    scales: Vec<f32>,
}

impl Q8Matrix {
    /// Quantizes row-major `values` of shape `rows × cols` (`cols` a multiple of [`QK8`]).
    pub fn quantize(values: &[f32], rows: usize, cols: usize) -> Result<Self, KernelError> {
        check_shape(values.len(), rows, cols)?;
        let mut qs = vec![0i8; values.len()];
        let scales = values
            .chunks_exact(QK8)
            .zip(qs.chunks_exact_mut(QK8))
            .map(|(v, q)| quantize_block(v, q))
            .collect();
        Ok(Self {
            rows,
            cols,
            qs,
            scales,
        })
    }

    /// Stacks matrices with the same column count, one under the other (to run several
    /// projections of the same input as one pass).
    pub fn stack(parts: &[Q8Matrix]) -> Result<Self, KernelError> {
        let cols = parts.first().map_or(QK8, |p| p.cols);
        let rows: usize = parts.iter().map(|p| p.rows).sum();
        if let Some(odd) = parts.iter().find(|p| p.cols != cols) {
            return Err(KernelError::Length {
                len: odd.rows * odd.cols,
                rows: odd.rows,
                cols,
            });
        }
        Ok(Self {
            rows,
            cols,
            qs: parts.iter().flat_map(|p| p.qs.iter().copied()).collect(),
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
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
        self.qs.len() + 4 * self.scales.len()
    }

    /// Row `r` as values, into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let (qs, scales) = self.row(r);
        for ((out, qs), scale) in out
            .chunks_exact_mut(QK8)
            .zip(qs.chunks_exact(QK8))
            .zip(scales)
        {
            for (o, q) in out.iter_mut().zip(qs) {
                *o = f32::from(*q) * scale;
            }
        }
    }

    pub(crate) fn row(&self, r: usize) -> (&[i8], &[f32]) {
        let blocks = self.cols / QK8;
        (
            &self.qs[r * self.cols..(r + 1) * self.cols],
            &self.scales[r * blocks..(r + 1) * blocks],
        )
    }
}

/// Activation rows (one per token), quantized like [`Q8Matrix`]; reused between calls so a
/// forward pass allocates once.
#[derive(Clone, Debug, Default)]
pub struct Q8Rows {
    rows: usize,
    cols: usize,
    qs: Vec<i8>,
    scales: Vec<f32>,
    /// Per block, `scale × Σ bytes`: what a 4-bit weight block's minimum multiplies.
    sums: Vec<f32>,
}

impl Q8Rows {
    /// Empty rows.
    pub fn new() -> Self {
        Self::default()
    }

    /// Quantizes row-major `values` of shape `rows × cols` into these rows.
    pub fn quantize(
        &mut self,
        values: &[f32],
        rows: usize,
        cols: usize,
    ) -> Result<(), KernelError> {
        check_shape(values.len(), rows, cols)?;
        self.rows = rows;
        self.cols = cols;
        self.qs.resize(values.len(), 0);
        self.scales.resize(values.len() / QK8, 0.0);
        self.sums.resize(values.len() / QK8, 0.0);
        for (((v, q), s), sum) in values
            .chunks_exact(QK8)
            .zip(self.qs.chunks_exact_mut(QK8))
            .zip(self.scales.iter_mut())
            .zip(self.sums.iter_mut())
        {
            *s = quantize_block(v, q);
            *sum = *s * q.iter().map(|q| i32::from(*q)).sum::<i32>() as f32;
        }
        Ok(())
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns per row.
    pub fn cols(&self) -> usize {
        self.cols
    }

    pub(crate) fn row(&self, r: usize) -> (&[i8], &[f32]) {
        let blocks = self.cols / QK8;
        (
            &self.qs[r * self.cols..(r + 1) * self.cols],
            &self.scales[r * blocks..(r + 1) * blocks],
        )
    }

    pub(crate) fn sums(&self, r: usize) -> &[f32] {
        let blocks = self.cols / QK8;
        &self.sums[r * blocks..(r + 1) * blocks]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_within_half_a_step() {
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        let m = Q8Matrix::quantize(&values, 2, 32).unwrap();
        let mut back = vec![0.0; 32];
        for r in 0..2 {
            m.dequantize_row(r, &mut back);
            let step = values[r * 32..(r + 1) * 32]
                .iter()
                .fold(0.0f32, |a, v| a.max(v.abs()))
                / 127.0;
            for (b, v) in back.iter().zip(&values[r * 32..]) {
                assert!((b - v).abs() <= step / 2.0 + 1e-6, "{b} vs {v}");
            }
        }
    }

    #[test]
    fn rounding_is_to_the_nearest_integer_ties_to_even() {
        for (x, want) in [
            (0.4, 0.0),
            (0.6, 1.0),
            (-0.6, -1.0),
            (2.5, 2.0),
            (3.5, 4.0),
            (-126.7, -127.0),
        ] {
            assert_eq!(round_to_int(x), want, "{x}");
        }
    }

    #[test]
    fn zeros_quantize_to_zero_scale() {
        let m = Q8Matrix::quantize(&[0.0; 32], 1, 32).unwrap();
        let mut back = vec![1.0; 32];
        m.dequantize_row(0, &mut back);
        assert!(back.iter().all(|v| *v == 0.0));
    }

    #[test]
    fn bad_shapes_are_refused_with_the_shape() {
        let err = Q8Matrix::quantize(&[0.0; 30], 1, 30).unwrap_err();
        assert!(
            err.to_string().contains("30 is not a multiple of 32"),
            "{err}"
        );
        let err = Q8Matrix::quantize(&[0.0; 32], 2, 32).unwrap_err();
        assert!(
            err.to_string().contains("32 values do not make a 2×32"),
            "{err}"
        );
    }

    #[test]
    fn stacked_rows_keep_their_order() {
        let a = Q8Matrix::quantize(&[1.0; 32], 1, 32).unwrap();
        let b = Q8Matrix::quantize(&[2.0; 64], 2, 32).unwrap();
        let s = Q8Matrix::stack(&[a, b]).unwrap();
        assert_eq!(s.rows(), 3);
        let mut row = vec![0.0; 32];
        s.dequantize_row(0, &mut row);
        assert!((row[0] - 1.0).abs() < 1e-6);
        s.dequantize_row(2, &mut row);
        assert!((row[5] - 2.0).abs() < 1e-6);
    }
}
