//! [`Cpu`]: the chosen instruction set and thread pool, and the operations that run on them.
//!
//! Threads: a pool of `threads` workers when `threads > 1`, none otherwise (one thread runs
//! the caller's loop directly, which is what tests and a box shared with other work want).
//! Work is split by output rows, so results never depend on the thread count: each output value
//! is computed by exactly one thread in a fixed order.

use rayon::prelude::*;

use crate::simd::{self, ActRow, Isa};
use crate::{KernelError, Q4Matrix, Q8Matrix, Q8Rows, Weights};

/// Row chunks per thread in a parallel matmul: more than one evens out a slow core.
const CHUNKS_PER_THREAD: usize = 4;

/// Kernels bound to an instruction set the running CPU has, and a thread count.
pub struct Cpu {
    isa: Isa,
    threads: usize,
    pool: Option<rayon::ThreadPool>,
}

impl std::fmt::Debug for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cpu")
            .field("isa", &self.isa)
            .field("threads", &self.threads)
            .finish()
    }
}

/// A raw output pointer shared by the matmul's row chunks, each of which writes a disjoint
/// set of indices.
#[derive(Clone, Copy)]
struct Output(*mut f32);
// SAFETY: the chunks of one matmul write disjoint indices, and the pointer does not outlive
// the call that borrowed the slice.
#[allow(unsafe_code)]
unsafe impl Send for Output {}
#[allow(unsafe_code)]
unsafe impl Sync for Output {}

impl Cpu {
    /// The best instruction set here, on `threads` threads.
    pub fn new(threads: usize) -> Result<Self, KernelError> {
        Self::with_isa(Isa::detect(), threads)
    }

    /// A given instruction set (an error when this CPU lacks it), on `threads` threads.
    pub fn with_isa(isa: Isa, threads: usize) -> Result<Self, KernelError> {
        if !isa.available() {
            let have = [Isa::Avx2, Isa::Avx, Isa::Scalar]
                .into_iter()
                .filter(|i| i.available())
                .map(Isa::name)
                .collect::<Vec<_>>()
                .join(", ");
            return Err(KernelError::Unsupported(isa.name(), have));
        }
        if threads == 0 {
            return Err(KernelError::Threads {
                threads,
                why: "at least one is needed".into(),
            });
        }
        let pool = if threads > 1 {
            Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("ringmaster-kernel-{i}"))
                    .build()
                    .map_err(|e| KernelError::Threads {
                        threads,
                        why: e.to_string(),
                    })?,
            )
        } else {
            None
        };
        Ok(Self { isa, threads, pool })
    }

    /// The instruction set in use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Threads in use.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// `out[m × w.rows() + r] = Σ_k w[r, k] · x[m, k]` for every activation row `m` and weight
    /// row `r`: each weight row is read once for all activation rows.
    ///
    /// # Panics
    /// If `x.cols() != w.cols()` or `out.len() != x.rows() × w.rows()` (a caller's bug).
    pub fn matmul_q8(&self, w: &Q8Matrix, x: &Q8Rows, out: &mut [f32]) {
        assert_eq!(x.cols(), w.cols(), "matmul inner dimensions");
        assert_eq!(out.len(), x.rows() * w.rows(), "matmul output length");
        let kernel = Q8Kernel { isa: self.isa, w };
        self.split_rows(w.rows(), out, |output, from, to| {
            matmul_rows(&kernel, x, output, w.rows(), (from, to))
        });
    }

    /// [`Cpu::matmul_q8`] for 4-bit weights.
    ///
    /// # Panics
    /// As [`Cpu::matmul_q8`].
    pub fn matmul_q4(&self, w: &Q4Matrix, x: &Q8Rows, out: &mut [f32]) {
        assert_eq!(x.cols(), w.cols(), "matmul inner dimensions");
        assert_eq!(out.len(), x.rows() * w.rows(), "matmul output length");
        let kernel = Q4Kernel { isa: self.isa, w };
        self.split_rows(w.rows(), out, |output, from, to| {
            matmul_rows(&kernel, x, output, w.rows(), (from, to))
        });
    }

    /// [`Cpu::matmul_q8`] or [`Cpu::matmul_q4`], by the weights' format.
    pub fn matmul(&self, w: &Weights, x: &Q8Rows, out: &mut [f32]) {
        match w {
            Weights::Q8(w) => self.matmul_q8(w, x, out),
            Weights::Q4(w) => self.matmul_q4(w, x, out),
        }
    }

    /// Runs `run(output, from, to)` over chunks of `rows` weight rows, on the pool's threads.
    fn split_rows<F>(&self, rows: usize, out: &mut [f32], run: F)
    where
        F: Fn(Output, usize, usize) + Send + Sync,
    {
        let output = Output(out.as_mut_ptr());
        match &self.pool {
            None => run(output, 0, rows),
            Some(pool) => {
                let chunks = (self.threads * CHUNKS_PER_THREAD).min(rows).max(1);
                let per = rows.div_ceil(chunks);
                pool.install(|| {
                    (0..chunks)
                        .into_par_iter()
                        .for_each(|c| run(output, (c * per).min(rows), ((c + 1) * per).min(rows)))
                });
            }
        }
    }

    /// Calls `f(i, row)` for every `row_len`-long row of `out`, on the pool's threads.
    pub fn parallel_rows<F>(&self, out: &mut [f32], row_len: usize, f: F)
    where
        F: Fn(usize, &mut [f32]) + Send + Sync,
    {
        match &self.pool {
            None => out
                .chunks_exact_mut(row_len)
                .enumerate()
                .for_each(|(i, row)| f(i, row)),
            Some(pool) => pool.install(|| {
                out.par_chunks_exact_mut(row_len)
                    .enumerate()
                    .for_each(|(i, row)| f(i, row))
            }),
        }
    }

    /// Softmax attention of one query (`heads × head_dim`) over the positions whose K/V start
    /// at `offsets` in the half-precision `k_pool`/`v_pool`, into `out`; `scores` is scratch
    /// space reused between calls.
    ///
    /// # Panics
    /// If the shapes disagree or an offset is outside the pools (a caller's bug).
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        &self,
        shape: simd::AttentionShape,
        q: &[f32],
        offsets: &[usize],
        k_pool: &[half::f16],
        v_pool: &[half::f16],
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        simd::attend(self.isa, shape, q, offsets, (k_pool, v_pool), scores, out)
    }

    /// `Σ a·b`.
    pub fn dot(&self, a: &[f32], b: &[f32]) -> f32 {
        simd::dot_f32(self.isa, a, b)
    }

    /// `y += alpha · x`.
    pub fn axpy(&self, alpha: f32, x: &[f32], y: &mut [f32]) {
        simd::axpy_f32(self.isa, alpha, x, y)
    }
}

/// `W` weight rows against `N` activation rows, for one weight format.
trait RowKernel: Sync {
    fn dot<const W: usize, const N: usize>(
        &self,
        w: [usize; W],
        a: [ActRow<'_>; N],
    ) -> [[f32; N]; W];
}

struct Q8Kernel<'a> {
    isa: Isa,
    w: &'a Q8Matrix,
}

impl RowKernel for Q8Kernel<'_> {
    fn dot<const W: usize, const N: usize>(
        &self,
        w: [usize; W],
        a: [ActRow<'_>; N],
    ) -> [[f32; N]; W] {
        simd::dot_q8(self.isa, w.map(|r| self.w.row(r)), a)
    }
}

struct Q4Kernel<'a> {
    isa: Isa,
    w: &'a Q4Matrix,
}

impl RowKernel for Q4Kernel<'_> {
    fn dot<const W: usize, const N: usize>(
        &self,
        w: [usize; W],
        a: [ActRow<'_>; N],
    ) -> [[f32; N]; W] {
        simd::dot_q4(self.isa, w.map(|r| self.w.row(r)), a)
    }
}

/// Weight rows `from..to` against every activation row. Groups of four activation rows go
/// one weight row at a time (each weight block is loaded once for four rows), then the
/// leftover rows one by one. Every output value is the same arithmetic in the same order either
/// way, so a row's result does not depend on where it falls in the batch.
fn matmul_rows<K: RowKernel>(
    kernel: &K,
    x: &Q8Rows,
    out: Output,
    rows: usize,
    (from, to): (usize, usize),
) {
    let m = x.rows();
    let act = |i: usize| -> ActRow<'_> {
        let (q, s) = x.row(i);
        (q, s, x.sums(i))
    };
    let write = |i: usize, r: usize, v: f32| {
        debug_assert!(i * rows + r < m * rows);
        // SAFETY: `i < m` and `r < rows`, inside the `m × rows` output; only the chunk that
        // owns row `r` writes these indices.
        #[allow(unsafe_code)]
        unsafe {
            *out.0.add(i * rows + r) = v
        };
    };
    let full = m - m % 4;
    for r in from..to {
        for i in (0..full).step_by(4) {
            let [v] = kernel.dot([r], [act(i), act(i + 1), act(i + 2), act(i + 3)]);
            for (j, v) in v.into_iter().enumerate() {
                write(i + j, r, v);
            }
        }
    }
    // Leftover activation rows (all of them at batch 1) go one weight row at a time, each row
    // streamed whole: measured on a 49152×576 int8 matrix read from memory, this is 1.9× the
    // rate of interleaving four weight rows (whose eight concurrent streams the prefetcher
    // serves worse), and no slower from cache.
    for i in full..m {
        for r in from..to {
            let [[v]] = kernel.dot([r], [act(i)]);
            write(i, r, v);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::Format;

    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut state = seed | 1;
        (0..n)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state % 2001) as f32 - 1000.0) / 250.0
            })
            .collect()
    }

    fn isas() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx, Isa::Avx2]
            .into_iter()
            .filter(|i| {
                let ok = i.available();
                if !ok {
                    eprintln!("skipping the {} kernels: this CPU lacks them", i.name());
                }
                ok
            })
            .collect()
    }

    /// The matmul of quantized operands, computed the slow way in f64.
    fn reference(w: &Weights, x: &Q8Rows) -> Vec<f64> {
        let mut wrow = vec![0.0; w.cols()];
        let mut out = vec![0.0; x.rows() * w.rows()];
        for r in 0..w.rows() {
            w.dequantize_row(r, &mut wrow);
            for m in 0..x.rows() {
                let (q, s) = x.row(m);
                out[m * w.rows() + r] = q
                    .iter()
                    .enumerate()
                    .map(|(k, q)| f64::from(*q) * f64::from(s[k / 32]) * f64::from(wrow[k]))
                    .sum();
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        #[test]
        fn every_isa_and_thread_count_agrees_with_the_reference(
            seed in any::<u64>(), rows in 1usize..40, m in 1usize..11, blocks in 1usize..6, threads in 1usize..4,
        ) {
            let cols = blocks * 32;
            let mut x = Q8Rows::new();
            x.quantize(&values(seed ^ 0xabc, m * cols), m, cols).unwrap();
            for format in [Format::Q8, Format::Q4] {
                let w = Weights::quantize(format, &values(seed, rows * cols), rows, cols).unwrap();
                let expected = reference(&w, &x);
                for isa in isas() {
                    let cpu = Cpu::with_isa(isa, threads).unwrap();
                    let mut out = vec![0.0; m * rows];
                    cpu.matmul(&w, &x, &mut out);
                    for (o, e) in out.iter().zip(&expected) {
                        prop_assert!((f64::from(*o) - e).abs() <= 1e-3 * (1.0 + e.abs()), "{} {format:?}: {o} vs {e}", isa.name());
                    }
                    // The same ISA gives the same bits on one thread.
                    let single = Cpu::with_isa(isa, 1).unwrap();
                    let mut again = vec![0.0; m * rows];
                    single.matmul(&w, &x, &mut again);
                    prop_assert_eq!(&out, &again);
                }
            }
        }

        #[test]
        fn dot_and_axpy_agree_across_isas(seed in any::<u64>(), n in 0usize..100) {
            let a = values(seed, n);
            let b = values(seed ^ 1, n);
            let expected: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            for isa in isas() {
                let cpu = Cpu::with_isa(isa, 1).unwrap();
                prop_assert!((f64::from(cpu.dot(&a, &b)) - expected).abs() < 1e-3 * (1.0 + expected.abs()));
                let mut y = b.clone();
                cpu.axpy(0.5, &a, &mut y);
                for ((y, a), b) in y.iter().zip(&a).zip(&b) {
                    prop_assert!((y - (b + 0.5 * a)).abs() < 1e-5);
                }
            }
        }
    }

    #[test]
    fn attention_agrees_across_isas_and_with_a_plain_softmax() {
        let shape = crate::AttentionShape {
            heads: 6,
            kv_heads: 2,
            head_dim: 16,
        };
        let kv_dim = shape.kv_heads * shape.head_dim;
        let positions = 9;
        let half =
            |v: Vec<f32>| -> Vec<half::f16> { v.into_iter().map(half::f16::from_f32).collect() };
        let k_pool = half(values(3, 12 * kv_dim));
        let v_pool = half(values(4, 12 * kv_dim));
        let q: Vec<f32> = values(5, shape.heads * shape.head_dim)
            .iter()
            .map(|v| v / 4.0)
            .collect();
        // Positions scattered over the pool, as block tables make them.
        let offsets: Vec<usize> = [7, 2, 11, 0, 5, 9, 1, 10, 3]
            .iter()
            .map(|s| s * kv_dim)
            .collect();
        let mut expected = vec![0.0f64; q.len()];
        for h in 0..shape.heads {
            let g = h / (shape.heads / shape.kv_heads);
            let hd = shape.head_dim;
            let scores: Vec<f64> = offsets
                .iter()
                .map(|at| {
                    (0..hd)
                        .map(|d| {
                            f64::from(q[h * hd + d]) * f64::from(k_pool[at + g * hd + d].to_f32())
                        })
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let max = scores.iter().copied().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for (w, at) in weights.iter().zip(&offsets) {
                for d in 0..hd {
                    expected[h * hd + d] += w / total * f64::from(v_pool[at + g * hd + d].to_f32());
                }
            }
        }
        assert_eq!(offsets.len(), positions);
        for isa in isas() {
            let cpu = Cpu::with_isa(isa, 1).unwrap();
            let mut out = vec![0.0; q.len()];
            let mut scores = Vec::new();
            cpu.attend(shape, &q, &offsets, &k_pool, &v_pool, &mut scores, &mut out);
            for (o, e) in out.iter().zip(&expected) {
                assert!(
                    (f64::from(*o) - e).abs() < 1e-4,
                    "{}: {o} vs {e}",
                    isa.name()
                );
            }
        }
    }

    #[test]
    fn a_batch_row_equals_the_same_row_alone() {
        for format in [Format::Q8, Format::Q4] {
            batch_row_alone(format);
        }
    }

    fn batch_row_alone(format: Format) {
        let (rows, cols) = (24, 96);
        let w = Weights::quantize(format, &values(7, rows * cols), rows, cols).unwrap();
        let all = values(8, 7 * cols);
        let mut batch = Q8Rows::new();
        batch.quantize(&all, 7, cols).unwrap();
        let cpu = Cpu::new(1).unwrap();
        let mut out = vec![0.0; 7 * rows];
        cpu.matmul(&w, &batch, &mut out);
        for m in 0..7 {
            let mut one = Q8Rows::new();
            one.quantize(&all[m * cols..(m + 1) * cols], 1, cols)
                .unwrap();
            let mut alone = vec![0.0; rows];
            cpu.matmul(&w, &one, &mut alone);
            assert_eq!(&out[m * rows..(m + 1) * rows], &alone[..], "row {m}");
        }
    }

    #[test]
    fn a_missing_instruction_set_or_zero_threads_is_refused() {
        assert!(
            Cpu::new(0)
                .unwrap_err()
                .to_string()
                .contains("at least one")
        );
        for isa in [Isa::Avx, Isa::Avx2] {
            if !isa.available() {
                let err = Cpu::with_isa(isa, 1).unwrap_err().to_string();
                assert!(err.contains(isa.name()), "{err}");
            }
        }
        assert_eq!(Isa::from_name("AVX2"), Some(Isa::Avx2));
        assert_eq!(Isa::from_name("neon"), None);
    }
}
