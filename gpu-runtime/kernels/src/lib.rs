//! Internal to `ringmaster-gpu-runtime`: the CPU kernels its model executor runs on. Use the
//! engine crate; this one has no stable API of its own.
//!
//! It owns three things and nothing else:
//!
//! - [`Q8Matrix`] and [`Q8Rows`]: weights and activations in blocks of [`QK8`] signed bytes
//!   with one `f32` scale per block (GGML's Q8_0 layout, with the scale widened to `f32` and the
//!   bytes and scales kept in separate arrays so the inner loop loads aligned runs of bytes);
//!   [`Q4Matrix`], weights in 4-bit blocks with a scale and minimum (GGML's Q4_1 layout), for
//!   when reading the weights is the bound; [`Weights`], either.
//! - [`Cpu`]: the instruction set chosen for this machine ([`Isa`]: AVX2, AVX+FMA, or scalar)
//!   and the thread pool, and the operations that use them: [`Cpu::matmul_q8`] (one pass over the
//!   weights for every activation row, so a batch costs little more than one row),
//!   [`Cpu::matmul`] for either format, [`Cpu::dot`], [`Cpu::axpy`] and [`Cpu::parallel_rows`].
//! - The unsafe inner loops (module `simd`). A [`Cpu`] exists only for an instruction set the
//!   running CPU has, and every inner loop checks its slices' lengths before it starts, which is
//!   what makes the safe functions here sound.
//!
//! It must not know about models, tokens or caches: it multiplies matrices.

#![deny(missing_docs)]

mod cpu;
mod q4;
mod q8;
mod simd;
mod weights;

pub use cpu::Cpu;
pub use q4::Q4Matrix;
pub use q8::{Q8Matrix, Q8Rows, QK8};
pub use simd::{AttentionShape, Isa};
pub use weights::{Format, Weights};

/// Why a kernel could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// The instruction set asked for is not on this CPU.
    #[error("this CPU does not support the {0} kernels (it supports: {1})")]
    Unsupported(&'static str, String),
    /// A matrix whose row length is not a multiple of the block size.
    #[error(
        "a {rows}×{cols} matrix cannot be quantized in blocks of {QK8}: {cols} is not a multiple of {QK8}"
    )]
    Shape {
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// The values do not fill the shape.
    #[error("{len} values do not make a {rows}×{cols} matrix")]
    Length {
        /// Values given.
        len: usize,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
    },
    /// Matrices of different formats stacked together.
    #[error("matrices of different block formats cannot be stacked")]
    MixedFormats,
    /// Zero threads, or the thread pool could not start.
    #[error("cannot start {threads} kernel threads: {why}")]
    Threads {
        /// Threads asked for.
        threads: usize,
        /// Why not.
        why: String,
    },
}
