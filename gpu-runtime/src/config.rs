//! The engine's configuration.
//!
//! This module owns [`EngineConfig`] and its validation. It must not start anything: the engine
//! reads a validated config in [`crate::EngineHandle::spawn`].

use crate::EngineError;
use crate::cost::{
    DEFAULT_KV_BLOCKS, DEFAULT_MAX_RUNNING, DEFAULT_PREFILL_TOKENS_WHILE_DECODING,
    DEFAULT_STEP_TOKEN_BUDGET, SimCostModel,
};

/// Most tokens per step for a model on a GPU ([`EngineConfig::sized_for_gpu`]): a step of
/// 2,048 tokens keeps a GPU's GEMMs efficient (M in the thousands) while a step with a full
/// prefill chunk stays a few milliseconds for a small model, so decoding never stalls behind a
/// prompt; a burst of 32 prompts of ~200 tokens is admitted in 3–4 steps.
pub const GPU_STEP_TOKEN_BUDGET: u32 = 2048;

/// Everything an engine needs to know before it starts.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The server's name, used in logs and [`crate::EngineHandle::name`]. Must not be empty.
    pub name: String,
    /// KV-cache blocks of [`crate::BLOCK_SIZE`] tokens ([`DEFAULT_KV_BLOCKS`]).
    pub kv_blocks: u32,
    /// Most sequences running at once ([`DEFAULT_MAX_RUNNING`]).
    pub max_running: u32,
    /// Most tokens computed per step ([`DEFAULT_STEP_TOKEN_BUDGET`]); at least `max_running`,
    /// so that every running sequence can decode in every step.
    pub step_token_budget: u32,
    /// Most prompt tokens in a step that also decodes
    /// ([`DEFAULT_PREFILL_TOKENS_WHILE_DECODING`]; at most `step_token_budget`): keeps
    /// decoding moving while long prompts prefill.
    pub prefill_tokens_while_decoding: u32,
    /// The simulated executor's cost model (also what the modelled clock runs on when the
    /// executor is simulated).
    pub cost: SimCostModel,
    /// Scale of the modelled clock: 1.0 sleeps in real time, 0.01 runs 100× faster, 0.0 never
    /// sleeps (each step only yields to the runtime).
    pub time_scale: f64,
}

impl EngineConfig {
    /// The simulated server with every default (DESIGN.md, "The simulated GPU server's
    /// defaults"), in real time.
    pub fn simulated(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            kv_blocks: DEFAULT_KV_BLOCKS,
            max_running: DEFAULT_MAX_RUNNING,
            step_token_budget: DEFAULT_STEP_TOKEN_BUDGET,
            prefill_tokens_while_decoding: DEFAULT_PREFILL_TOKENS_WHILE_DECODING,
            cost: SimCostModel::default(),
            time_scale: 1.0,
        }
    }

    /// The step sized for a model on a GPU: a [`GPU_STEP_TOKEN_BUDGET`]-token step (at least
    /// `max_running`) with [`EngineConfig::gpu_step`]'s rules. With the simulated H100's
    /// 8,192-token budget and 512-token prefill cap, a step that decodes can hold at most 6.6 %
    /// of its budget, so the batch utilisation could never say whether the GPU is full; here a
    /// step under load holds its whole budget.
    pub fn sized_for_gpu(self) -> Self {
        let budget = GPU_STEP_TOKEN_BUDGET.max(self.max_running);
        self.gpu_step(budget)
    }

    /// A step of `budget` tokens for a model on a GPU: everything the decodes leave may go to
    /// prefill (at least one token), and no modelled clock (a GPU step's duration is measured
    /// wall time, already spent). A budget under `max_running` fails [`Self::validate`].
    pub fn gpu_step(mut self, budget: u32) -> Self {
        self.step_token_budget = budget;
        self.prefill_tokens_while_decoding = budget.saturating_sub(self.max_running).max(1);
        self.time_scale = 0.0;
        self
    }

    /// Checks the invariants the engine relies on.
    pub fn validate(&self) -> Result<(), EngineError> {
        let invalid = |msg: String| Err(EngineError::InvalidConfig(msg));
        if self.name.is_empty() {
            return invalid("name must not be empty".into());
        }
        if self.kv_blocks == 0 {
            return invalid("kv_blocks must be at least 1".into());
        }
        if self.max_running == 0 {
            return invalid("max_running must be at least 1".into());
        }
        if self.step_token_budget < self.max_running {
            return invalid(format!(
                "step_token_budget ({}) must be at least max_running ({}) so every running sequence can decode each step",
                self.step_token_budget, self.max_running
            ));
        }
        if self.prefill_tokens_while_decoding == 0 {
            return invalid("prefill_tokens_while_decoding must be at least 1".into());
        }
        if !(self.time_scale.is_finite() && self.time_scale >= 0.0) {
            return invalid(format!(
                "time_scale must be finite and non-negative, got {}",
                self.time_scale
            ));
        }
        self.cost.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let c = EngineConfig::simulated("gpu-0");
        c.validate().unwrap();
        assert_eq!(c.kv_blocks, DEFAULT_KV_BLOCKS);
        assert_eq!((c.max_running, c.step_token_budget), (256, 8192));
    }

    #[test]
    fn the_gpu_profile_lets_prefill_fill_what_decodes_leave() {
        let c = EngineConfig::simulated("gpu-0").sized_for_gpu();
        c.validate().unwrap();
        assert_eq!(
            (c.step_token_budget, c.prefill_tokens_while_decoding),
            (2048, 1792)
        );
        assert_eq!(c.time_scale, 0.0);
        let wide = EngineConfig {
            max_running: 4096,
            ..EngineConfig::simulated("gpu-1")
        }
        .sized_for_gpu();
        wide.validate().unwrap();
        assert_eq!(
            (wide.step_token_budget, wide.prefill_tokens_while_decoding),
            (4096, 1)
        );
    }

    #[test]
    fn invalid_configs_are_rejected() {
        let base = EngineConfig::simulated("gpu-0");
        let cases = [
            EngineConfig {
                name: String::new(),
                ..base.clone()
            },
            EngineConfig {
                kv_blocks: 0,
                ..base.clone()
            },
            EngineConfig {
                max_running: 0,
                ..base.clone()
            },
            EngineConfig {
                step_token_budget: 100,
                ..base.clone()
            },
            EngineConfig {
                time_scale: -1.0,
                ..base.clone()
            },
            EngineConfig {
                time_scale: f64::NAN,
                ..base.clone()
            },
        ];
        for c in cases {
            assert!(
                matches!(c.validate(), Err(EngineError::InvalidConfig(_))),
                "{c:?}"
            );
        }
    }
}
