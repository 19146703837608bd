//! The simulated server's cost model: how long a step would take on real hardware.
//!
//! This module owns the numbers that make the simulated executor behave like one H100 (80 GB)
//! serving a Llama-3-8B-class model in bf16 (DESIGN.md, "The simulated GPU server's defaults"):
//! the KV-cache size in blocks, the prefill rate, and the decode step time. It only turns a
//! step's shape (how many decode sequences, how many prefill tokens) into a duration; it must
//! not know about requests, blocks or clocks: the engine applies the time scale and sleeps.
//!
//! Every default is overridable through [`SimCostModel`]'s public fields and
//! [`crate::EngineConfig`].

use std::time::Duration;

use crate::EngineError;

/// Bytes of KV cache one token occupies in a Llama-3-8B-class model in bf16:
/// 32 layers × 8 KV heads × 128 head dims × 2 (K and V) × 2 bytes = 131,072 B = 128 KiB.
pub const KV_BYTES_PER_TOKEN: u64 = 32 * 8 * 128 * 2 * 2;

/// Bytes of GPU memory left for the KV cache on one H100 80 GB: vLLM's default
/// `gpu_memory_utilization` of 0.9 leaves 72 GB, minus ~16 GB of bf16 weights (8B parameters ×
/// 2 bytes) and ~1 GB of activations and CUDA graphs, ≈ 55 GB.
pub const KV_MEMORY_BYTES: u64 = 55_000_000_000;

/// KV-cache blocks of [`crate::BLOCK_SIZE`] tokens in the simulated server:
/// 55e9 B / 131,072 B per token = 419,616 tokens; / 16 = 26,226 blocks.
pub const DEFAULT_KV_BLOCKS: u32 =
    (KV_MEMORY_BYTES / KV_BYTES_PER_TOKEN / crate::BLOCK_SIZE as u64) as u32;

/// Uncached prompt tokens computed per second. An 8B model needs ~16 GFLOP per token
/// (2 × parameters); at a realistic ~40% of the H100's ~990 dense bf16 TFLOP/s that is ~25k
/// tokens/s of pure matmul, and attention, sampling and scheduling overheads bring served
/// prefill throughput down to the order of 10k tokens/s. SGLang's gateway mock worker uses 8k.
pub const DEFAULT_PREFILL_TOKENS_PER_S: f64 = 10_000.0;

/// The fixed cost of one forward pass (one engine step): at batch 1, a decode step has to
/// stream all ~16 GB of weights from HBM (~4.8 ms at 3.35 TB/s) plus kernel launches, sampling
/// and scheduling, ~8 ms in practice. Every step pays it, including a step that only computes
/// prefill chunks: no forward pass is cheaper than reading the weights once.
pub const DEFAULT_DECODE_STEP_BASE: Duration = Duration::from_millis(8);

/// Extra step time per sequence decoding in the step: decode is memory-bound, so batching is
/// nearly free at first; each sequence adds its KV reads and sampling, on the order of 0.1 ms.
pub const DEFAULT_DECODE_STEP_PER_SEQ: Duration = Duration::from_micros(100);

/// Most sequences running at once. Past a few hundred sequences the decode step stops being
/// memory-bound and the KV reads dominate; 256 is vLLM's default `max_num_seqs`.
pub const DEFAULT_MAX_RUNNING: u32 = 256;

/// Most tokens computed in one step (decode tokens plus prefill chunks). 8192 is vLLM v1's
/// default `max_num_batched_tokens` with chunked prefill on a large GPU: big enough to keep
/// prefill efficient, small enough to keep decode steps from stalling behind a long prompt.
pub const DEFAULT_STEP_TOKEN_BUDGET: u32 = 8192;

/// Most prompt tokens a step computes while sequences are decoding in it (Sarathi-Serve's
/// stall-free batching): a long prompt's prefill then takes more steps, but no step is long
/// enough to stall the running replies. At the default cost model a step with 512 prefill
/// tokens and 256 decodes takes 8 + 25.6 + 51.2 ≈ 85 ms, under the 100 ms a token may take.
/// A step with no decode takes the whole `step_token_budget`.
pub const DEFAULT_PREFILL_TOKENS_WHILE_DECODING: u32 = 512;

/// How long a step takes on the modelled hardware.
///
/// `duration = decode_step_base + decode_step_per_seq × decode_seqs + prefill_tokens /
/// prefill_tokens_per_s`: the base is paid by every step, decode or prefill (see
/// [`DEFAULT_DECODE_STEP_BASE`]).
#[derive(Clone, Debug, PartialEq)]
pub struct SimCostModel {
    /// Uncached prompt tokens computed per second ([`DEFAULT_PREFILL_TOKENS_PER_S`]).
    pub prefill_tokens_per_s: f64,
    /// Fixed cost of every step ([`DEFAULT_DECODE_STEP_BASE`]).
    pub decode_step_base: Duration,
    /// Extra cost per decoding sequence ([`DEFAULT_DECODE_STEP_PER_SEQ`]).
    pub decode_step_per_seq: Duration,
}

impl Default for SimCostModel {
    fn default() -> Self {
        Self {
            prefill_tokens_per_s: DEFAULT_PREFILL_TOKENS_PER_S,
            decode_step_base: DEFAULT_DECODE_STEP_BASE,
            decode_step_per_seq: DEFAULT_DECODE_STEP_PER_SEQ,
        }
    }
}

impl SimCostModel {
    /// The modelled duration of a step that decodes `decode_seqs` sequences (one token each)
    /// and computes `prefill_tokens` prompt tokens.
    pub fn step_duration(&self, decode_seqs: usize, prefill_tokens: usize) -> Duration {
        let decode = self.decode_step_per_seq * decode_seqs as u32;
        let prefill = Duration::from_secs_f64(prefill_tokens as f64 / self.prefill_tokens_per_s);
        self.decode_step_base + decode + prefill
    }

    /// Checks that the model can be used: the prefill rate must be finite and positive.
    pub fn validate(&self) -> Result<(), EngineError> {
        if !(self.prefill_tokens_per_s.is_finite() && self.prefill_tokens_per_s > 0.0) {
            return Err(EngineError::InvalidConfig(format!(
                "prefill_tokens_per_s must be finite and positive, got {}",
                self.prefill_tokens_per_s
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_design() {
        assert_eq!(KV_BYTES_PER_TOKEN, 128 * 1024);
        assert_eq!(DEFAULT_KV_BLOCKS, 26_226);
        let tokens = u64::from(DEFAULT_KV_BLOCKS) * crate::BLOCK_SIZE as u64;
        assert!((400_000..440_000).contains(&tokens), "~420k tokens of KV");
    }

    #[test]
    fn step_duration_adds_base_decode_and_prefill() {
        let m = SimCostModel::default();
        assert_eq!(m.step_duration(1, 0), Duration::from_micros(8_100));
        assert_eq!(m.step_duration(100, 0), Duration::from_millis(18));
        assert_eq!(m.step_duration(0, 1000), Duration::from_millis(108));
        assert_eq!(m.step_duration(10, 500), Duration::from_millis(59));
    }

    #[test]
    fn validate_rejects_a_zero_rate() {
        let m = SimCostModel {
            prefill_tokens_per_s: 0.0,
            ..SimCostModel::default()
        };
        assert!(m.validate().is_err());
        assert!(SimCostModel::default().validate().is_ok());
    }
}
