//! [`ModelExecutor`]: the [`Executor`] that runs a GGUF llama model on the CPU.
//!
//! Each step it computes every scheduled sequence's new tokens through the paged KV pool (see
//! [`super::llama`]) and samples where the plan says so. It keeps no per-sequence KV of its own:
//! only the seed a sequence without one was given, so that its draws survive preemption.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use super::ModelError;
use super::gguf::ModelFile;
use super::llama::{Llama, PagedKv};
use super::sampler;
use super::tokenizer::GgufTokenizer;
use crate::block::SeqId;
use crate::executor::{Executor, SampledToken, StepOutcome, StepPlan};
use crate::tokenizer::Tokenizer;

/// A llama model on the CPU, with its tokenizer and KV pool.
#[derive(Debug)]
pub struct ModelExecutor {
    pub(super) model: Llama,
    pub(super) kv: PagedKv,
    tokenizer: Arc<GgufTokenizer>,
    seeds: HashMap<SeqId, u64>,
    seed_base: u64,
}

impl ModelExecutor {
    /// Loads the model at `path` with a KV pool of `kv_blocks` blocks (the engine's
    /// `kv_blocks` must be the same number).
    pub fn load(path: &Path, kv_blocks: u32) -> Result<Self, ModelError> {
        let mut file = ModelFile::open(path)?;
        let tokenizer = GgufTokenizer::from_file(&file).map_err(|why| ModelError::Unsupported {
            path: path.display().to_string(),
            why,
        })?;
        let model = Llama::load(&mut file)?;
        let kv = PagedKv::new(&model.config, kv_blocks as usize);
        let seed_base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Ok(Self {
            model,
            kv,
            tokenizer: Arc::new(tokenizer),
            seeds: HashMap::new(),
            seed_base,
        })
    }

    /// The model.
    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// The model's tokenizer.
    pub fn gguf_tokenizer(&self) -> &Arc<GgufTokenizer> {
        &self.tokenizer
    }

    /// Bytes the KV pool takes when full.
    pub fn kv_bytes(&self) -> usize {
        self.kv.bytes()
    }
}

impl Executor for ModelExecutor {
    fn execute(&mut self, plan: &StepPlan) -> StepOutcome {
        let started = Instant::now();
        let mut sampled = Vec::new();
        for seq in &plan.seqs {
            let start = seq.num_computed_tokens as usize;
            let logits = match self.model.forward(
                &mut self.kv,
                &seq.block_table,
                start,
                &seq.new_token_ids,
                seq.sample,
            ) {
                Ok(logits) => logits,
                Err(e) => {
                    // The scheduler never plans past the block table; a failure here is a bug,
                    // and ending the turn is the least harmful answer.
                    tracing::error!(seq = seq.seq_id.0, error = %e, "model.forward_failed");
                    if seq.sample {
                        sampled.push(SampledToken {
                            seq_id: seq.seq_id,
                            token_id: self.end_of_turn_id(),
                        });
                    }
                    continue;
                }
            };
            if let Some(logits) = logits {
                let seed = match seq.sampling.seed {
                    Some(seed) => seed,
                    None => *self.seeds.entry(seq.seq_id).or_insert(
                        self.seed_base ^ seq.seq_id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    ),
                };
                let position = seq.num_computed_tokens + seq.new_token_ids.len() as u32;
                sampled.push(SampledToken {
                    seq_id: seq.seq_id,
                    token_id: sampler::sample(&logits, &seq.sampling, seed, position),
                });
            }
        }
        StepOutcome {
            sampled,
            duration: started.elapsed(),
        }
    }

    fn tokenizer(&self) -> Arc<dyn Tokenizer> {
        self.tokenizer.clone()
    }

    fn runs_blocking(&self) -> bool {
        true
    }

    fn sequence_finished(&mut self, seq_id: SeqId) {
        self.seeds.remove(&seq_id);
    }
}

impl ModelExecutor {
    fn end_of_turn_id(&self) -> u32 {
        (0..self.model.config.vocab as u32)
            .find(|id| self.tokenizer.is_end_of_turn(*id))
            .unwrap_or(0)
    }
}
