//! The engines' settings from the configuration's: the simulated servers' engine, the model
//! servers' options and the ring's layout, each the engine's defaults with the config's
//! overrides laid over them, then checked as only the engine can check them (whether this CPU
//! has the kernels asked for, whether the simulator's numbers fit together).
//!
//! The configuration is a leaf that knows none of these types; this is the one place they
//! meet. A bad value is a [`ConfigError`] naming the key, like any other in the file, and
//! `ringmaster check-config` reports it before `serve` would.

use ringmaster_config::{Config, ConfigError, ModelSettings, RingSettings, SimulatorSettings};
use ringmaster_gpu_runtime::model::{Isa, ModelOptions};
use ringmaster_gpu_runtime::{EngineConfig, SimCostModel};
use ringmaster_ring::RingConfig;

use crate::server::{ModelCatalogueSpec, ServerTemplates};

/// The simulated servers' engine: its defaults with `[simulator]` over them.
///
/// # Errors
///
/// A [`ConfigError`] on `simulator` when the engine refuses the result.
pub fn simulator_engine(settings: &SimulatorSettings) -> Result<EngineConfig, ConfigError> {
    let mut engine = EngineConfig::simulated("template");
    let mut cost = SimCostModel::default();
    let s = settings;
    engine.time_scale = s.time_scale.unwrap_or(engine.time_scale);
    engine.kv_blocks = s.kv_blocks.unwrap_or(engine.kv_blocks);
    engine.max_running = s.max_running.unwrap_or(engine.max_running);
    engine.step_token_budget = s.step_token_budget.unwrap_or(engine.step_token_budget);
    engine.prefill_tokens_while_decoding = s
        .prefill_tokens_while_decoding
        .unwrap_or(engine.prefill_tokens_while_decoding);
    cost.prefill_tokens_per_s = s.prefill_tokens_per_s.unwrap_or(cost.prefill_tokens_per_s);
    cost.decode_step_base = s.decode_step_base.unwrap_or(cost.decode_step_base);
    cost.decode_step_per_seq = s.decode_step_per_seq.unwrap_or(cost.decode_step_per_seq);
    engine.cost = cost;
    engine
        .validate()
        .map_err(|e| ConfigError::invalid("simulator", e.to_string()))?;
    Ok(engine)
}

/// The model servers' options: their defaults with `[model]` over them.
///
/// # Errors
///
/// A [`ConfigError`] on `model.kernels` when this CPU lacks the kernels named.
pub fn model_options(settings: &ModelSettings) -> Result<ModelOptions, ConfigError> {
    let mut options = ModelOptions::default();
    options.threads = settings.threads.unwrap_or(options.threads);
    options.kv_blocks = settings.kv_blocks.unwrap_or(options.kv_blocks);
    if let Some(name) = settings.kernels {
        let isa = Isa::from_name(name).ok_or_else(|| {
            ConfigError::invalid("model.kernels", format!("{name:?} is not a kernel set"))
        })?;
        if !isa.available() {
            return Err(ConfigError::invalid(
                "model.kernels",
                format!("this CPU does not support the {name} kernels"),
            ));
        }
        options.isa = Some(isa);
    }
    Ok(options)
}

/// The ring's layout from `[routing]`.
///
/// # Errors
///
/// A [`ConfigError`] on `routing` when the ring refuses it (the config checks the same
/// bounds, so only a drift between the two would).
pub fn ring_config(settings: &RingSettings) -> Result<RingConfig, ConfigError> {
    RingConfig::new(settings.vnodes_per_weight, settings.load_factor)
        .map_err(|e| ConfigError::invalid("routing", e.to_string()))
}

impl ServerTemplates {
    /// How `config` makes new servers.
    ///
    /// # Errors
    ///
    /// As [`simulator_engine`] and [`model_options`].
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        Ok(Self {
            simulator: simulator_engine(&config.simulator)?,
            model: model_options(&config.model)?,
            model_gpu: config.model_gpu,
            upstream: config.upstream.clone(),
            models: ModelCatalogueSpec {
                defaults: config.models.clone(),
                aliases: config.aliases.clone(),
                loadable: match config.lora.load_on_demand {
                    true => config
                        .lora
                        .adapters
                        .iter()
                        .map(|(name, source)| (name.clone(), source.base.clone()))
                        .collect(),
                    false => Default::default(),
                },
            },
            local_cache_view: config.local_cache_view,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_and_the_ring_agree_on_defaults_and_bounds() {
        use ringmaster_config::routing;
        assert_eq!(
            ring_config(&RingSettings::default()).unwrap(),
            RingConfig::default()
        );
        assert_eq!(
            routing::MAX_VNODES_PER_WEIGHT,
            ringmaster_ring::MAX_VNODES_PER_WEIGHT
        );
    }

    #[test]
    fn no_override_is_the_engines_default() {
        assert_eq!(
            format!(
                "{:?}",
                simulator_engine(&SimulatorSettings::default()).unwrap()
            ),
            format!("{:?}", EngineConfig::simulated("template"))
        );
        let options = model_options(&ModelSettings::default()).unwrap();
        let default = ModelOptions::default();
        assert_eq!(
            (options.threads, options.kv_blocks, options.isa),
            (default.threads, default.kv_blocks, default.isa)
        );
    }

    #[test]
    fn the_engine_refuses_what_does_not_fit_together() {
        let err = simulator_engine(&SimulatorSettings {
            max_running: Some(64),
            step_token_budget: Some(8),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("config key `simulator`"), "{err}");
    }

    #[test]
    fn every_kernel_name_the_config_takes_is_one_the_engine_knows() {
        for name in ringmaster_config::KERNEL_NAMES {
            assert!(Isa::from_name(name).is_some(), "{name}");
        }
    }
}
