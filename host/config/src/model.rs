//! `[model]` and `[simulator]`: how model (`gguf:`) servers run (CPU threads and kernels, or
//! a GPU) and the simulated servers' cost model, validated as far as the file goes.
//!
//! Both are overrides of the engine's own defaults: a key left out stays `None` here and the
//! engine's default applies when the pool builds its servers (`ringmaster_pool::ServerTemplates`),
//! which also runs the checks only the engine can make (whether this CPU has the kernels asked
//! for, how the simulator's numbers fit together).

use std::time::Duration;

use super::error::{ConfigError, duration_ms, invalid};
use super::raw::{RawModel, RawSimulator};
use crate::servers::GpuPlacement;

/// The CPU kernels `[model] kernels` may name besides `auto`.
pub const KERNEL_NAMES: [&str; 3] = ["avx2", "avx", "scalar"];

/// `[model]`: overrides of the model servers' defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelSettings {
    /// Kernel threads per model server (1 to 256).
    pub threads: Option<usize>,
    /// The kernels' instruction set, one of [`KERNEL_NAMES`] (`None`: the best this CPU has).
    pub kernels: Option<&'static str>,
    /// KV-pool blocks per model server (at least 1).
    pub kv_blocks: Option<u32>,
}

/// `[simulator]`: overrides of the simulated servers' defaults (`SimCostModel`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SimulatorSettings {
    /// Modelled seconds → real seconds; 1.0 is real time.
    pub time_scale: Option<f64>,
    /// KV blocks of 16 tokens per server.
    pub kv_blocks: Option<u32>,
    /// Most sequences running at once per server.
    pub max_running: Option<u32>,
    /// Tokens per engine step.
    pub step_token_budget: Option<u32>,
    /// Prompt tokens per engine step while sequences decode.
    pub prefill_tokens_while_decoding: Option<u32>,
    /// Prefill speed, tokens per second.
    pub prefill_tokens_per_s: Option<f64>,
    /// Decode step at batch 1.
    pub decode_step_base: Option<Duration>,
    /// Extra decode-step time per running sequence.
    pub decode_step_per_seq: Option<Duration>,
}

pub(crate) fn gpu_placement(raw: &RawModel) -> Result<Option<GpuPlacement>, ConfigError> {
    let ordinal = match raw.device.as_deref() {
        None | Some("cpu") => return Ok(None),
        Some("cuda") => 0,
        Some(other) => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                invalid(
                    "model.device",
                    format!("{other:?} is not cpu, cuda or cuda:N"),
                )
            })?,
    };
    if !cfg!(feature = "cuda") {
        return Err(invalid(
            "model.device",
            "this build has no CUDA support: build with --features cuda",
        ));
    }
    Ok(Some(GpuPlacement {
        ordinal,
        kv_blocks: raw.kv_blocks,
    }))
}

pub(crate) fn model_settings(raw: RawModel) -> Result<ModelSettings, ConfigError> {
    if let Some(threads) = raw.threads
        && (threads == 0 || threads > 256)
    {
        return Err(invalid("model.threads", "must be 1 to 256"));
    }
    let kernels = match raw.kernels.as_deref() {
        None | Some("auto") => None,
        Some(name) => Some(*KERNEL_NAMES.iter().find(|k| **k == name).ok_or_else(|| {
            invalid(
                "model.kernels",
                format!("{name:?} is not one of auto, avx2, avx, scalar"),
            )
        })?),
    };
    if raw.kv_blocks == Some(0) {
        return Err(invalid("model.kv_blocks", "must be at least 1"));
    }
    Ok(ModelSettings {
        threads: raw.threads,
        kernels,
        kv_blocks: raw.kv_blocks,
    })
}

pub(crate) fn simulator_settings(raw: RawSimulator) -> Result<SimulatorSettings, ConfigError> {
    let duration = |key: &str, ms: Option<f64>| ms.map(|ms| duration_ms(key, ms)).transpose();
    Ok(SimulatorSettings {
        time_scale: raw.time_scale,
        kv_blocks: raw.kv_blocks,
        max_running: raw.max_running,
        step_token_budget: raw.step_token_budget,
        prefill_tokens_while_decoding: raw.prefill_tokens_while_decoding,
        prefill_tokens_per_s: raw.prefill_tokens_per_s,
        decode_step_base: duration("simulator.decode_step_base_ms", raw.decode_step_base_ms)?,
        decode_step_per_seq: duration(
            "simulator.decode_step_per_seq_ms",
            raw.decode_step_per_seq_ms,
        )?,
    })
}
