//! [`GpuExecutor`]: the [`Executor`] that runs a GGUF llama model on one CUDA GPU.
//!
//! It reads the file as the CPU model does (the same tensor checks, the same stacking of Q/K/V
//! and gate/up), hands the f32 weights to `ringmaster_cuda::llama::GpuLlama`, which quantizes
//! and uploads them and runs each step's batched forward pass over a paged pool in device
//! memory. On the second step (the default) each sampled row's draw goes with the step and the
//! device samples with the CPU sampler's definitions; on the first (`RINGMASTER_GPU_PATH=v1`)
//! the logits come back and the host samples with the CPU executor's sampler. The block manager, prefix
//! cache and scheduler stay the engine's; the engine's `kv_blocks` must equal
//! [`GpuExecutor::kv_blocks`], which is the pool it could allocate (by default 90 % of the
//! memory free after the weights).
//!
//! Built only with the `cuda` feature. Opening the device fails with a message (no driver, no
//! GPU, no NVRTC) instead of panicking, so a machine without CUDA is told why.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ringmaster_cuda::StepPath;
use ringmaster_cuda::llama::{
    GpuLlama, GpuSeq, HostLayer, HostLlama, HostMatrix, KvBudget, LlamaShape, RowSampling,
};

use super::ModelError;
use super::executor::StepSampler;
use super::gguf::ModelFile;
use super::llama::{read_tensor, rope_tables};
use super::tokenizer::GgufTokenizer;
use crate::block::{BLOCK_SIZE, SeqId};
use crate::executor::{Executor, SampledToken, StepOutcome, StepPlan};
use crate::tokenizer::Tokenizer;

/// Share of the memory free after the weights that the KV pool takes by default.
pub const DEFAULT_KV_MEMORY_FRACTION: f64 = 0.9;

/// A llama model on a GPU, with its tokenizer and KV pool.
#[derive(Debug)]
pub struct GpuExecutor {
    model: GpuLlama,
    context: usize,
    tokenizer: Arc<GgufTokenizer>,
    sampler: StepSampler,
    load_time: Duration,
}

impl GpuExecutor {
    /// Loads the model at `path` onto GPU `ordinal`, with a pool of `kv_blocks` blocks (or
    /// [`DEFAULT_KV_MEMORY_FRACTION`] of the free memory when `None`).
    pub fn load(path: &Path, ordinal: usize, kv_blocks: Option<u32>) -> Result<Self, ModelError> {
        let started = Instant::now();
        let display = path.display().to_string();
        let unsupported = |why: String| ModelError::Unsupported {
            path: display.clone(),
            why,
        };
        // The header says the head dimension the kernels are compiled for: the device opens
        // (or says why it cannot) before the weights are read.
        let mut file = ModelFile::open(path)?;
        let device =
            ringmaster_cuda::Device::open_for(ordinal, file.config.head_dim, StepPath::from_env())
                .map_err(|e| unsupported(format!("CUDA device {ordinal}: {e}")))?;
        let tokenizer = GgufTokenizer::from_file(&file).map_err(unsupported)?;
        let host = host_model(&mut file)?;
        let budget = match kv_blocks {
            Some(n) => KvBudget::Blocks(n as usize),
            None => KvBudget::FreeMemory(DEFAULT_KV_MEMORY_FRACTION),
        };
        let context = host.shape.context;
        let vocab = host.shape.vocab;
        let model = GpuLlama::load(device, host, budget).map_err(|e| ModelError::Load {
            path: display.clone(),
            why: e.to_string(),
        })?;
        Ok(Self {
            model,
            context,
            sampler: StepSampler::new(&tokenizer, vocab),
            tokenizer: Arc::new(tokenizer),
            load_time: started.elapsed(),
        })
    }

    /// KV blocks in the device pool: the engine's `kv_blocks` must be this.
    pub fn kv_blocks(&self) -> u32 {
        u32::try_from(self.model.kv_blocks()).unwrap_or(u32::MAX)
    }

    /// Bytes the weights take on the device.
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// The GPU's name.
    pub fn device_name(&self) -> String {
        self.model
            .device()
            .name()
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// The step in use: `v2` (decode steps replaying CUDA graphs), `v2-eager` (with
    /// `RINGMASTER_GPU_GRAPHS=0`, or after a capture failed), or `v1` (with
    /// `RINGMASTER_GPU_PATH=v1`).
    pub fn path_name(&self) -> &'static str {
        match (self.model.path(), self.model.graphs_enabled()) {
            (StepPath::V1, _) => "v1",
            (StepPath::V2, true) => "v2",
            (StepPath::V2, false) => "v2-eager",
        }
    }

    /// How long loading took (reading, uploading, allocating the pool).
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// The model itself, for a benchmark of the step alone: the caller owns the block tables,
    /// so it must not be used while an engine drives this executor.
    pub fn llama_mut(&mut self) -> &mut GpuLlama {
        &mut self.model
    }

    /// One batched forward pass outside the engine (tests, benchmarks): the caller owns the
    /// block tables, so it must not run while an engine drives this executor.
    pub fn forward(
        &mut self,
        seqs: &[GpuSeq<'_>],
    ) -> Result<Vec<Option<Vec<f32>>>, ringmaster_cuda::CudaError> {
        self.model.forward(seqs)
    }
}

impl Executor for GpuExecutor {
    fn execute(&mut self, plan: &StepPlan) -> StepOutcome {
        let started = Instant::now();
        let tables: Vec<Vec<u32>> = plan
            .seqs
            .iter()
            .map(|seq| seq.block_table.iter().map(|b| b.0).collect())
            .collect();
        let inputs: Vec<GpuSeq<'_>> = plan
            .seqs
            .iter()
            .zip(&tables)
            .map(|(seq, table)| GpuSeq {
                table,
                start: seq.num_computed_tokens as usize,
                tokens: &seq.new_token_ids,
                logits: seq.sample,
            })
            .collect();
        if self.model.path() == StepPath::V2 {
            return StepOutcome {
                sampled: self.sample_on_device(plan, &inputs),
                duration: started.elapsed(),
            };
        }
        let logits = match self.model.forward(&inputs) {
            Ok(logits) => logits,
            Err(e) => {
                // A shape error is a scheduler bug; a driver error a failing device. Either
                // way ending the sampling sequences' turns is the least harmful answer.
                tracing::error!(step = plan.step, error = %e, "gpu.forward_failed");
                vec![None; plan.seqs.len()]
            }
        };
        StepOutcome {
            sampled: self.sampler.sample(plan, logits),
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
        Some(self.context)
    }

    fn sequence_finished(&mut self, seq_id: SeqId) {
        self.sampler.finished(seq_id);
    }
}

impl GpuExecutor {
    /// The second step: each sampled sequence's draw goes to the device with the step, and
    /// only token ids come back.
    fn sample_on_device(&mut self, plan: &StepPlan, inputs: &[GpuSeq<'_>]) -> Vec<SampledToken> {
        let rows: Vec<RowSampling> = plan
            .seqs
            .iter()
            .filter(|seq| seq.sample && !seq.new_token_ids.is_empty())
            .map(|seq| row_sampling(&self.sampler.draw(seq)))
            .collect();
        let tokens = match self.model.sample_step(inputs, &rows) {
            Ok(tokens) => tokens,
            Err(e) => {
                tracing::error!(step = plan.step, error = %e, "gpu.step_failed");
                vec![None; plan.seqs.len()]
            }
        };
        if let Some(why) = self.model.take_graph_error() {
            tracing::warn!(step = plan.step, error = %why, "gpu.graphs_off");
        }
        plan.seqs
            .iter()
            .zip(tokens)
            .filter(|(seq, _)| seq.sample)
            .map(|(seq, token)| SampledToken {
                seq_id: seq.seq_id,
                token_id: token.unwrap_or_else(|| self.sampler.end_of_turn()),
            })
            .collect()
    }
}

/// A draw as the device's sampling kernel takes it (greedy as temperature 0).
pub(super) fn row_sampling(draw: &super::sampler::Draw) -> RowSampling {
    RowSampling {
        temperature: if draw.is_greedy() {
            0.0
        } else {
            draw.temperature
        },
        top_k: draw.top_k,
        top_p: draw.top_p,
        uniform: draw.uniform,
    }
}

/// Every weight of `file` in f32, stacked as the CPU model stacks them.
pub(super) fn host_model(file: &mut ModelFile) -> Result<HostLlama, ModelError> {
    let c = file.config.clone();
    let untied = file.has_tensor("output.weight");
    let mut matrix = |name: &str| -> Result<HostMatrix, ModelError> {
        let (values, rows, cols, _) = read_tensor(file, name)?;
        Ok(HostMatrix { values, rows, cols })
    };
    let stack = |parts: Vec<HostMatrix>| HostMatrix {
        rows: parts.iter().map(|p| p.rows).sum(),
        cols: parts.first().map_or(0, |p| p.cols),
        values: parts.into_iter().flat_map(|p| p.values).collect(),
    };
    let embed = matrix("token_embd.weight")?;
    let norm = matrix("output_norm.weight")?.values;
    let output = if untied {
        Some(matrix("output.weight")?)
    } else {
        None
    };
    let mut layers = Vec::with_capacity(c.layers);
    for l in 0..c.layers {
        let name = |s: &str| format!("blk.{l}.{s}.weight");
        let qkv = stack(vec![
            matrix(&name("attn_q"))?,
            matrix(&name("attn_k"))?,
            matrix(&name("attn_v"))?,
        ]);
        let gate_up = stack(vec![matrix(&name("ffn_gate"))?, matrix(&name("ffn_up"))?]);
        layers.push(HostLayer {
            attn_norm: matrix(&name("attn_norm"))?.values,
            qkv,
            wo: matrix(&name("attn_output"))?,
            ffn_norm: matrix(&name("ffn_norm"))?.values,
            gate_up,
            down: matrix(&name("ffn_down"))?,
        });
    }
    let (cos, sin) = rope_tables(&c);
    Ok(HostLlama {
        shape: LlamaShape {
            hidden: c.hidden,
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            ffn: c.ffn,
            vocab: c.vocab,
            context: c.context,
            rms_eps: c.rms_eps,
            block_size: BLOCK_SIZE,
        },
        embed,
        layers,
        norm,
        output,
        cos,
        sin,
    })
}
