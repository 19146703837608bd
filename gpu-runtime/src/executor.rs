//! The executor boundary: what the scheduler asks for each step, and who computes it.
//!
//! This module owns the [`Executor`] trait, the step plan it receives ([`StepPlan`]) and the
//! outcome it returns ([`StepOutcome`]), plus the simulated executor [`SimExecutor`]. An
//! executor computes; it must not schedule: which sequences run, how many tokens each computes,
//! and which blocks hold their KV are decided by [`crate::scheduler`] and
//! [`crate::block`], one implementation for every executor.
//!
//! # Writing a model executor
//!
//! Each step, for every scheduled sequence, the plan gives the block table (the physical
//! blocks holding the sequence's KV, in order), how many tokens already have their KV computed,
//! and the new token ids to compute now: a chunk of the prompt (prefill) or the one token
//! sampled last step (decode). Token `i` of `new_token_ids` sits at position
//! `num_computed_tokens + i`, and its KV goes to slot `(position % BLOCK_SIZE)` of block
//! `block_table[position / BLOCK_SIZE]`. Attention reads positions `0..=position` through the
//! same table. When `sample` is set, the executor samples the next token from the logits of the
//! last new token and returns it in [`StepOutcome::sampled`]; it returns the step's wall-clock
//! duration in [`StepOutcome::duration`]. An executor whose steps take real compute time
//! should say so in [`Executor::runs_blocking`].
//!
//! # The simulated executor
//!
//! [`SimExecutor`] does no model math: it charges [`SimCostModel`] time for the step's shape
//! and generates one word of [`SIM_WORDS`] per token, chosen by hashing the prompt's
//! fingerprint, the sampling seed and the output position, so a given prompt and seed always
//! produce the same reply, even after preemption and recompute. The reply ends with
//! `<|im_end|>` after a length in [[`SIM_MIN_REPLY_TOKENS`], [`SIM_MAX_REPLY_TOKENS`]) derived
//! the same way. It takes tools, too ([`Executor::simulates_tool_calls`]): the engine answers
//! a request that offers them with a call where the simulated model would make one
//! ([`sim_tools`] holds the rule), streamed over the tokens this executor generates.

use std::sync::Arc;
use std::time::Duration;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::block::{BlockId, SeqId};
use crate::cost::SimCostModel;
use crate::handoff::KvContents;
use crate::request::SamplingParams;
use crate::tokenizer::{IM_END, SIM_WORDS, SimTokenizer, Tokenizer};

pub mod sim_tools;

/// Whether a scheduled sequence computes part of its prompt or one decode token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// A chunk of the prompt (or, after preemption, of prompt plus earlier output).
    Prefill,
    /// The one token sampled in the previous step.
    Decode,
}

/// One sequence's share of a step.
#[derive(Clone, Debug)]
pub struct ScheduledSeq {
    /// The sequence.
    pub seq_id: SeqId,
    /// Prefill chunk or decode token.
    pub kind: StepKind,
    /// The blocks holding the sequence's KV, in order; covers at least
    /// `num_computed_tokens + new_token_ids.len()` tokens.
    pub block_table: Vec<BlockId>,
    /// Tokens whose KV is already computed (from earlier steps or the prefix cache); the
    /// position of the first new token.
    pub num_computed_tokens: u32,
    /// The tokens to compute now.
    pub new_token_ids: Vec<u32>,
    /// Whether to sample the next token from the last new token's logits.
    pub sample: bool,
    /// Tokens in the request's prompt (output positions start here).
    pub prompt_len: u32,
    /// A stable hash of the prompt's token ids; the simulated executor's source of
    /// determinism.
    pub prompt_fingerprint: u64,
    /// How to sample.
    pub sampling: SamplingParams,
}

/// Everything one step computes.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    /// The step's number, counting from 0.
    pub step: u64,
    /// The scheduled sequences: decodes first, then prefill chunks.
    pub seqs: Vec<ScheduledSeq>,
}

impl StepPlan {
    /// Whether nothing is scheduled.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Tokens computed by the step.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.new_token_ids.len()).sum()
    }

    /// Sequences decoding in the step.
    pub fn num_decodes(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| s.kind == StepKind::Decode)
            .count()
    }

    /// Prompt tokens computed by the step.
    pub fn num_prefill_tokens(&self) -> usize {
        self.seqs
            .iter()
            .filter(|s| s.kind == StepKind::Prefill)
            .map(|s| s.new_token_ids.len())
            .sum()
    }
}

/// A token sampled for one sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampledToken {
    /// The sequence.
    pub seq_id: SeqId,
    /// The token.
    pub token_id: u32,
}

/// What a step produced.
#[derive(Clone, Debug, Default)]
pub struct StepOutcome {
    /// One token for every scheduled sequence with `sample` set.
    pub sampled: Vec<SampledToken>,
    /// How long the step took: modelled for a simulated executor, measured for a real one.
    /// The engine's clock advances by it (times `time_scale`).
    pub duration: Duration,
}

/// Computes steps. One implementation per back end; the engine drives it from one task.
pub trait Executor: Send + 'static {
    /// Computes one step.
    fn execute(&mut self, plan: &StepPlan) -> StepOutcome;

    /// The tokenizer matching this executor's model. Called once, when the engine spawns.
    /// Defaults to [`SimTokenizer`].
    fn tokenizer(&self) -> Arc<dyn Tokenizer> {
        Arc::new(SimTokenizer::new())
    }

    /// Whether [`execute`](Self::execute) does real work that would stall an async runtime;
    /// if so the engine runs it on tokio's blocking pool. Defaults to `false`.
    fn runs_blocking(&self) -> bool {
        false
    }

    /// The most positions (prompt plus output) a sequence can have, when the executor has a
    /// limit of its own (a model's context length); the engine rejects requests that could
    /// pass it. Defaults to none.
    fn max_positions(&self) -> Option<usize> {
        None
    }

    /// Whether the engine answers requests that offer tools as the simulated model does
    /// ([`sim_tools`]: text, or a call when one is forced or named). Defaults to `false`: the
    /// engine refuses such requests with [`crate::EngineError::ToolsUnsupported`], as a model
    /// executor needs a tool-calling chat template and a parser of the calls, which this
    /// crate's models have not.
    fn simulates_tool_calls(&self) -> bool {
        false
    }

    /// Called when a sequence leaves the engine for good (finished or cancelled), so that an
    /// executor keeping per-sequence state can drop it. Defaults to doing nothing.
    fn sequence_finished(&mut self, _seq_id: SeqId) {}

    /// The contents of `blocks`, for a decode engine of the same model (a prefill's
    /// handoff). Defaults to [`KvContents::Unavailable`]: the decode engine computes the
    /// prompt itself.
    fn export_blocks(&self, _blocks: &[BlockId]) -> KvContents {
        KvContents::Unavailable
    }

    /// Whether [`import_blocks`](Self::import_blocks) can write `contents` (another
    /// engine's blocks of the same model). Defaults to `false`.
    fn accepts(&self, _contents: &KvContents) -> bool {
        false
    }

    /// Writes the handed-over blocks' contents: `blocks` pairs each block's index in the
    /// handoff with the block of this executor's cache that takes it. Called only with
    /// contents [`accepts`](Self::accepts) said yes to.
    fn import_blocks(&mut self, _blocks: &[(usize, BlockId)], _contents: &KvContents) {}
}

/// Shortest simulated reply, in tokens (the end-of-turn token excluded): long enough that
/// streaming, stop sequences and the reply's own prefix-cache blocks (a full block is 16
/// tokens) show up in every reply.
pub const SIM_MIN_REPLY_TOKENS: u64 = 16;

/// Bound on simulated replies, in tokens (exclusive; the end-of-turn token excluded): the
/// length of a typical chat answer, and short enough at the simulated ~8 ms per token (about
/// 2 s at most in real time) to keep benchmarks and tests quick.
pub const SIM_MAX_REPLY_TOKENS: u64 = 256;

/// Hash seed separating the reply-length draw from the word draws.
const SIM_LENGTH_SEED: u64 = 0x6C65_6E67_7468; // "length"

/// The simulated executor: a cost model instead of model math.
#[derive(Clone, Debug)]
pub struct SimExecutor {
    cost: SimCostModel,
    word_ids: [u32; SIM_WORDS.len()],
}

impl SimExecutor {
    /// A simulated executor charging step time by `cost`.
    pub fn new(cost: SimCostModel) -> Self {
        Self {
            cost,
            word_ids: SimTokenizer::sim_word_ids(),
        }
    }

    /// The token the simulated model produces at output position `output_index` (0 for the
    /// first generated token) for a prompt with this fingerprint and seed.
    pub fn token_at(&self, prompt_fingerprint: u64, seed: Option<u64>, output_index: u64) -> u32 {
        self.sample(prompt_fingerprint, seed, output_index, false)
    }

    /// [`Self::token_at`], or with `ignore_eos` a word at every position: the reply then
    /// runs to `max_tokens`.
    fn sample(
        &self,
        prompt_fingerprint: u64,
        seed: Option<u64>,
        output_index: u64,
        ignore_eos: bool,
    ) -> u32 {
        let key = match seed {
            Some(seed) => xxh3_64_with_seed(&prompt_fingerprint.to_le_bytes(), seed),
            None => prompt_fingerprint,
        };
        let len = SIM_MIN_REPLY_TOKENS
            + xxh3_64_with_seed(&key.to_le_bytes(), SIM_LENGTH_SEED)
                % (SIM_MAX_REPLY_TOKENS - SIM_MIN_REPLY_TOKENS);
        if output_index >= len && !ignore_eos {
            return IM_END;
        }
        let word = xxh3_64_with_seed(&output_index.to_le_bytes(), key) % SIM_WORDS.len() as u64;
        self.word_ids[word as usize]
    }
}

impl Executor for SimExecutor {
    // No model, so no template stands in the way: the calls are as deterministic as the text.
    fn simulates_tool_calls(&self) -> bool {
        true
    }

    // A simulated cache holds nothing: a handoff moves only the modelled bytes.
    fn export_blocks(&self, _blocks: &[BlockId]) -> KvContents {
        KvContents::Modelled
    }

    fn accepts(&self, contents: &KvContents) -> bool {
        *contents == KvContents::Modelled
    }

    fn execute(&mut self, plan: &StepPlan) -> StepOutcome {
        let sampled = plan
            .seqs
            .iter()
            .filter(|s| s.sample)
            .map(|s| {
                let position = u64::from(s.num_computed_tokens) + s.new_token_ids.len() as u64;
                let output_index = position.saturating_sub(u64::from(s.prompt_len));
                SampledToken {
                    seq_id: s.seq_id,
                    token_id: self.sample(
                        s.prompt_fingerprint,
                        s.sampling.seed,
                        output_index,
                        s.sampling.ignore_eos,
                    ),
                }
            })
            .collect();
        StepOutcome {
            sampled,
            duration: self
                .cost
                .step_duration(plan.num_decodes(), plan.num_prefill_tokens()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seq(id: u64, kind: StepKind, computed: u32, new: usize, sample: bool) -> ScheduledSeq {
        ScheduledSeq {
            seq_id: SeqId(id),
            kind,
            block_table: vec![],
            num_computed_tokens: computed,
            new_token_ids: vec![7; new],
            sample,
            prompt_len: 100,
            prompt_fingerprint: 42,
            sampling: SamplingParams::default(),
        }
    }

    #[test]
    fn sim_replies_are_deterministic_words_ending_with_end_of_turn() {
        let ex = SimExecutor::new(SimCostModel::default());
        let reply: Vec<u32> = (0..300).map(|i| ex.token_at(42, None, i)).collect();
        let end = reply.iter().position(|&t| t == IM_END).unwrap() as u64;
        assert!((SIM_MIN_REPLY_TOKENS..SIM_MAX_REPLY_TOKENS).contains(&end));
        let tok = SimTokenizer::new();
        assert!(
            reply[..end as usize]
                .iter()
                .all(|&t| tok.decode(t).is_some())
        );
        let again: Vec<u32> = (0..300).map(|i| ex.token_at(42, None, i)).collect();
        assert_eq!(reply, again);
        let seeded: Vec<u32> = (0..300).map(|i| ex.token_at(42, Some(1), i)).collect();
        assert_ne!(reply, seeded, "the seed varies the text");
    }

    #[test]
    fn sim_samples_only_where_asked_and_charges_the_cost_model() {
        let mut ex = SimExecutor::new(SimCostModel::default());
        let plan = StepPlan {
            step: 0,
            seqs: vec![
                seq(1, StepKind::Decode, 120, 1, true),
                seq(2, StepKind::Prefill, 0, 64, false),
                seq(3, StepKind::Prefill, 64, 36, true),
            ],
        };
        let out = ex.execute(&plan);
        assert_eq!(out.sampled.len(), 2);
        assert_eq!(out.sampled[0].seq_id, SeqId(1));
        assert_eq!(out.sampled[0].token_id, ex.token_at(42, None, 21));
        assert_eq!(out.sampled[1].token_id, ex.token_at(42, None, 0));
        assert_eq!(out.duration, SimCostModel::default().step_duration(1, 100));
    }
}
