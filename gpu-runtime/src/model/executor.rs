//! [`ModelExecutor`]: the [`Executor`] that runs a GGUF llama model on the CPU.
//!
//! Each step it computes every scheduled sequence's new tokens in one batched forward pass
//! through the paged KV pool (see [`super::llama`]) and samples where the plan says so. It keeps
//! no per-sequence KV of its own: only the seed a sequence without one was given, so that its
//! draws survive preemption.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmaster_kernels::{Cpu, Isa};

use super::ModelError;
use super::gguf::ModelFile;
use super::llama::{Llama, PagedKv, SeqInput};
use super::sampler;
use super::tokenizer::GgufTokenizer;
use crate::block::{BlockId, SeqId};
use crate::executor::{Executor, SampledToken, StepOutcome, StepPlan};
use crate::handoff::KvContents;
use crate::tokenizer::Tokenizer;

/// How to run a model.
#[derive(Clone, Debug)]
pub struct ModelOptions {
    /// KV-pool blocks (the engine's `kv_blocks` must be the same number).
    pub kv_blocks: u32,
    /// Kernel threads. One per model server is the safe choice on a shared box: more threads
    /// than free cores makes every step wait for the slowest.
    pub threads: usize,
    /// The kernels' instruction set; `None` picks the best this CPU has.
    pub isa: Option<Isa>,
}

impl Default for ModelOptions {
    fn default() -> Self {
        Self {
            kv_blocks: 2048,
            threads: 1,
            isa: None,
        }
    }
}

/// A llama model on the CPU, with its tokenizer and KV pool.
#[derive(Debug)]
pub struct ModelExecutor {
    pub(super) model: Llama,
    pub(super) kv: PagedKv,
    pub(super) cpu: Cpu,
    tokenizer: Arc<GgufTokenizer>,
    sampler: StepSampler,
    load_time: Duration,
}

impl ModelExecutor {
    /// Loads the model at `path`.
    pub fn load(path: &Path, options: &ModelOptions) -> Result<Self, ModelError> {
        let started = Instant::now();
        let unsupported = |why: String| ModelError::Unsupported {
            path: path.display().to_string(),
            why,
        };
        let cpu = match options.isa {
            Some(isa) => Cpu::with_isa(isa, options.threads),
            None => Cpu::new(options.threads),
        }
        .map_err(|e| unsupported(e.to_string()))?;
        let mut file = ModelFile::open(path)?;
        let tokenizer = GgufTokenizer::from_file(&file).map_err(unsupported)?;
        let model = Llama::load(&mut file)?;
        let kv = PagedKv::new(&model.config, options.kv_blocks as usize);
        let sampler = StepSampler::new(&tokenizer, model.config.vocab);
        Ok(Self {
            model,
            kv,
            cpu,
            tokenizer: Arc::new(tokenizer),
            sampler,
            load_time: started.elapsed(),
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

    /// The kernels in use.
    pub fn cpu(&self) -> &Cpu {
        &self.cpu
    }

    /// One batched forward pass outside the engine (benchmarks, tests): the caller owns the
    /// block tables, so it must not run while an engine drives this executor.
    pub fn forward(
        &mut self,
        seqs: &[SeqInput<'_>],
    ) -> Result<Vec<Option<Vec<f32>>>, super::llama::ForwardError> {
        self.model.forward(&self.cpu, &mut self.kv, seqs)
    }

    /// How long loading took (reading, requantizing, allocating the pool).
    pub fn load_time(&self) -> Duration {
        self.load_time
    }
}

impl Executor for ModelExecutor {
    fn execute(&mut self, plan: &StepPlan) -> StepOutcome {
        let started = Instant::now();
        let inputs: Vec<SeqInput<'_>> = plan
            .seqs
            .iter()
            .map(|seq| SeqInput {
                table: &seq.block_table,
                start: seq.num_computed_tokens as usize,
                tokens: &seq.new_token_ids,
                logits: seq.sample,
            })
            .collect();
        let logits = match self.model.forward(&self.cpu, &mut self.kv, &inputs) {
            Ok(logits) => logits,
            Err(e) => {
                // The scheduler never plans past the block table and the tokenizer never makes
                // an id past the vocabulary; a failure here is a bug, and ending the sampling
                // sequences' turns is the least harmful answer.
                tracing::error!(step = plan.step, error = %e, "model.forward_failed");
                vec![None; plan.seqs.len()]
            }
        };
        let sampled = self.sampler.sample(plan, logits);
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

    fn max_positions(&self) -> Option<usize> {
        Some(self.model.config.context)
    }

    fn sequence_finished(&mut self, seq_id: SeqId) {
        self.sampler.finished(seq_id);
    }

    fn export_blocks(&self, blocks: &[BlockId]) -> KvContents {
        KvContents::Bytes {
            block_bytes: self.kv.block_bytes(),
            data: self.kv.read_blocks(blocks),
        }
    }

    fn accepts(&self, contents: &KvContents) -> bool {
        matches!(contents, KvContents::Bytes { block_bytes, .. } if *block_bytes == self.kv.block_bytes())
    }

    fn import_blocks(&mut self, blocks: &[(usize, BlockId)], contents: &KvContents) {
        if let KvContents::Bytes { data, .. } = contents {
            self.kv.write_blocks(blocks, data);
        }
    }
}

/// The sampling half of a step, shared by the CPU and GPU executors: each sequence's seed (a
/// sequence without one gets one, kept so its draws survive preemption) and the draw from its
/// logits.
#[derive(Debug)]
pub(super) struct StepSampler {
    seeds: HashMap<SeqId, u64>,
    seed_base: u64,
    end_of_turn: u32,
}

impl StepSampler {
    /// A sampler for a model with `vocab` ids under `tokenizer`.
    pub(super) fn new(tokenizer: &GgufTokenizer, vocab: usize) -> Self {
        let seed_base = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let end_of_turn = (0..vocab as u32)
            .find(|id| tokenizer.is_end_of_turn(*id))
            .unwrap_or(0);
        Self {
            seeds: HashMap::new(),
            seed_base,
            end_of_turn,
        }
    }

    /// Draws the next token of every sequence the plan samples, from its logits (`None` when
    /// the forward pass failed: the turn ends, the least harmful answer to a bug).
    pub(super) fn sample(
        &mut self,
        plan: &StepPlan,
        logits: Vec<Option<Vec<f32>>>,
    ) -> Vec<SampledToken> {
        let mut sampled = Vec::new();
        for (seq, logits) in plan.seqs.iter().zip(logits) {
            if !seq.sample {
                continue;
            }
            let Some(logits) = logits else {
                sampled.push(SampledToken {
                    seq_id: seq.seq_id,
                    token_id: self.end_of_turn,
                });
                continue;
            };
            let draw = self.draw(seq);
            sampled.push(SampledToken {
                seq_id: seq.seq_id,
                token_id: draw.pick(&logits),
            });
        }
        sampled
    }

    /// How `seq` draws its next token: its seed (or the one it was given) and output position.
    pub(super) fn draw(&mut self, seq: &crate::executor::ScheduledSeq) -> sampler::Draw {
        let seed = match seq.sampling.seed {
            Some(seed) => seed,
            None => *self
                .seeds
                .entry(seq.seq_id)
                .or_insert(self.seed_base ^ seq.seq_id.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        };
        let position = seq.num_computed_tokens + seq.new_token_ids.len() as u32;
        sampler::Draw::new(&seq.sampling, seed, position)
    }

    /// The token ending a turn: what a sequence gets when its step failed.
    #[cfg(feature = "cuda")]
    pub(super) fn end_of_turn(&self) -> u32 {
        self.end_of_turn
    }

    /// Forgets a finished sequence's seed.
    pub(super) fn finished(&mut self, seq_id: SeqId) {
        self.seeds.remove(&seq_id);
    }
}
