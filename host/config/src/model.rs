//! `[model]` and `[simulator]`: how model (`gguf:`) servers run (CPU threads and kernels, or
//! a GPU) and the simulated servers' cost model, validated.

use super::error::{ConfigError, duration_ms, invalid};
use super::raw::{RawModel, RawSimulator};
use crate::servers::GpuPlacement;
use ringmaster_gpu_runtime::model::{Isa, ModelOptions};
use ringmaster_gpu_runtime::{EngineConfig, SimCostModel};

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

pub(crate) fn model_config(raw: RawModel) -> Result<ModelOptions, ConfigError> {
    let mut model = ModelOptions::default();
    if let Some(threads) = raw.threads {
        if threads == 0 || threads > 256 {
            return Err(invalid("model.threads", "must be 1 to 256"));
        }
        model.threads = threads;
    }
    if let Some(kernels) = raw.kernels
        && kernels != "auto"
    {
        let isa = Isa::from_name(&kernels).ok_or_else(|| {
            invalid(
                "model.kernels",
                format!("{kernels:?} is not one of auto, avx2, avx, scalar"),
            )
        })?;
        if !isa.available() {
            return Err(invalid(
                "model.kernels",
                format!("this CPU does not support the {kernels} kernels"),
            ));
        }
        model.isa = Some(isa);
    }
    if let Some(blocks) = raw.kv_blocks {
        if blocks == 0 {
            return Err(invalid("model.kv_blocks", "must be at least 1"));
        }
        model.kv_blocks = blocks;
    }
    Ok(model)
}

pub(crate) fn simulator_config(raw: RawSimulator) -> Result<EngineConfig, ConfigError> {
    let mut engine = EngineConfig::simulated("template");
    let mut cost = SimCostModel::default();
    if let Some(v) = raw.time_scale {
        engine.time_scale = v;
    }
    if let Some(v) = raw.kv_blocks {
        engine.kv_blocks = v;
    }
    if let Some(v) = raw.max_running {
        engine.max_running = v;
    }
    if let Some(v) = raw.step_token_budget {
        engine.step_token_budget = v;
    }
    if let Some(v) = raw.prefill_tokens_while_decoding {
        engine.prefill_tokens_while_decoding = v;
    }
    if let Some(v) = raw.prefill_tokens_per_s {
        cost.prefill_tokens_per_s = v;
    }
    if let Some(v) = raw.decode_step_base_ms {
        cost.decode_step_base = duration_ms("simulator.decode_step_base_ms", v)?;
    }
    if let Some(v) = raw.decode_step_per_seq_ms {
        cost.decode_step_per_seq = duration_ms("simulator.decode_step_per_seq_ms", v)?;
    }
    engine.cost = cost;
    engine
        .validate()
        .map_err(|e| invalid("simulator", e.to_string()))?;
    Ok(engine)
}
