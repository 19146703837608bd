//! The llama step on one GPU, over a paged KV pool in device memory.
//!
//! The same computation as the CPU engine's `model::llama`, step for step: every sequence's new
//! tokens are stacked into one batch of rows; rotary embedding rotates Q and K in place inside
//! the stacked QKV rows; every row's K and V is written into its pool slot before any attention
//! reads, so a prompt chunk sees its own earlier tokens; attention reads K/V through the block
//! tables, so a prefix cached in shared blocks is read, never recomputed.
//!
//! Two implementations ([`StepPath`]). The second (default): cuBLAS SGEMM with M = the step's
//! tokens on weights dequantised once at load from the same int8 values the CPU kernels use;
//! the step's metadata and sampling rows written into one pinned buffer and copied once; a
//! workspace allocated once and reused; attention with its accumulator in registers; sampling
//! on the device ([`GpuLlama::sample_step`]), so only token ids come back, in the step's one
//! synchronisation; decode steps padded to a bucket and replayed from a CUDA graph captured on
//! the bucket's first step. The first (`v1`, the baseline measured on an H200): the int8 GEMV
//! kernel, fresh buffers each step, logits copied back for host sampling.
//!
//! Weights arrive as f32 host matrices ([`HostLlama`], built by the engine crate from a GGUF
//! file) and are quantized here to int8 blocks of 32 with one f32 scale. The pool is f32,
//! sized by the caller or from the device's free memory after the weights ([`KvBudget`]), plus
//! one scratch block for padding rows. This module knows shapes and block tables, not requests.

use cudarc::driver::{CudaEvent, CudaGraph, CudaSlice, CudaStream, PinnedHostSlice};

use crate::{CudaError, Device, DeviceDense, DeviceQ8, QK, StepPath, dim};

/// A llama model's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LlamaShape {
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Values per head.
    pub head_dim: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Positions the model was trained for.
    pub context: usize,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// Tokens per KV block.
    pub block_size: usize,
}

/// A row-major f32 matrix on the host.
#[derive(Clone, Debug, Default)]
pub struct HostMatrix {
    /// `rows × cols` values.
    pub values: Vec<f32>,
    /// Rows (outputs).
    pub rows: usize,
    /// Columns (inputs).
    pub cols: usize,
}

/// One transformer block's weights on the host, projections stacked as the CPU engine stacks
/// them.
#[derive(Clone, Debug, Default)]
pub struct HostLayer {
    /// Attention RMS norm weight.
    pub attn_norm: Vec<f32>,
    /// Q, K and V stacked.
    pub qkv: HostMatrix,
    /// Attention output.
    pub wo: HostMatrix,
    /// Feed-forward RMS norm weight.
    pub ffn_norm: Vec<f32>,
    /// Gate and up stacked.
    pub gate_up: HostMatrix,
    /// Down.
    pub down: HostMatrix,
}

/// A whole model on the host, ready to upload.
#[derive(Clone, Debug)]
pub struct HostLlama {
    /// Its shape.
    pub shape: LlamaShape,
    /// Token embedding.
    pub embed: HostMatrix,
    /// The blocks.
    pub layers: Vec<HostLayer>,
    /// Final RMS norm weight.
    pub norm: Vec<f32>,
    /// The output head; `None` when tied to the embedding.
    pub output: Option<HostMatrix>,
    /// `[context, head_dim / 2]` rotary cosines.
    pub cos: Vec<f32>,
    /// `[context, head_dim / 2]` rotary sines.
    pub sin: Vec<f32>,
}

/// How many KV blocks to allocate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvBudget {
    /// Exactly this many.
    Blocks(usize),
    /// As many as fit in this fraction of the memory free after the weights are uploaded
    /// (the rest is left for the step's activations and the driver).
    FreeMemory(f64),
}

/// One sequence's share of a step.
#[derive(Clone, Copy, Debug)]
pub struct GpuSeq<'a> {
    /// Its blocks, in order; must cover `start + tokens.len()` positions.
    pub table: &'a [u32],
    /// Position of the first new token.
    pub start: usize,
    /// The tokens to compute.
    pub tokens: &'a [u32],
    /// Whether to return its last token's logits.
    pub logits: bool,
}

/// How one sampled row draws its token on the device (the host sampler's `Draw`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowSampling {
    /// Temperature; 0 or less is greedy.
    pub temperature: f32,
    /// Top-k (0: no cut).
    pub top_k: u32,
    /// Top-p (1 or more: no cut).
    pub top_p: f32,
    /// The uniform draw in [0, 1).
    pub uniform: f32,
}

#[derive(Debug)]
struct DeviceLayer {
    attn_norm: CudaSlice<f32>,
    qkv: DeviceQ8,
    wo: DeviceQ8,
    ffn_norm: CudaSlice<f32>,
    gate_up: DeviceQ8,
    down: DeviceQ8,
    /// The second step's weights: the int8 values dequantised once at load.
    dense: Option<DenseLayer>,
}

#[derive(Debug)]
struct DenseLayer {
    qkv: DeviceDense,
    wo: DeviceDense,
    gate_up: DeviceDense,
    down: DeviceDense,
}

/// Batch sizes a decode step is padded to for a CUDA graph: one graph per size, captured the
/// first time a step of that size runs.
pub const DECODE_BUCKETS: [usize; 13] = [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256];

/// The smallest bucket holding `n` decodes; `None` past the largest (such a step runs eagerly).
pub fn decode_bucket(n: usize) -> Option<usize> {
    DECODE_BUCKETS.iter().copied().find(|b| *b >= n && n > 0)
}

/// Marks a padding row in [`Packed::wanted`]: sampled with the rest, its token dropped.
const PADDING: usize = usize::MAX;

/// `packed` (a decode step: one token per sequence, every one sampled) padded to `bucket` rows:
/// each padding row computes token 0 at position 0 into the scratch block, which no sequence
/// owns, so it writes nothing a sequence reads.
fn pad_decode(packed: &Packed, bucket: usize, scratch_block: i32, block_size: i32) -> Packed {
    let mut padded = packed.clone();
    let table_at = padded.tables.len() as i32;
    padded.tables.push(scratch_block);
    for row in packed.tokens.len()..bucket {
        padded.tokens.push(0);
        padded.positions.push(0);
        padded.slots.push(scratch_block * block_size);
        padded.table_offsets.push(table_at);
        padded.wanted.push((PADDING, row as i32));
    }
    padded
}

/// A captured step, kept with the model. cudarc leaves graphs `!Send` because it cannot know
/// how they are shared; this one is only ever launched by the model that owns it, from
/// whichever thread holds the model (one at a time), with the context bound by cudarc.
struct StepGraph(CudaGraph);

// SAFETY: see the type's documentation: the graph is moved with its model, never shared.
#[allow(unsafe_code)]
unsafe impl Send for StepGraph {}

impl std::fmt::Debug for StepGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StepGraph")
    }
}

/// Where each of the second step's inputs sits in its one metadata buffer, for `n` tokens and
/// `w` wanted rows: every position depends on `n` and `w` only, so a graph captured for a
/// shape reads the right places on every step of that shape. Sampling floats travel as their
/// bits.
#[derive(Clone, Debug, PartialEq, Eq)]
struct MetaLayout {
    tokens: std::ops::Range<usize>,
    positions: std::ops::Range<usize>,
    slots: std::ops::Range<usize>,
    table_offsets: std::ops::Range<usize>,
    picked: std::ops::Range<usize>,
    temperature: std::ops::Range<usize>,
    top_p: std::ops::Range<usize>,
    uniform: std::ops::Range<usize>,
    top_k: std::ops::Range<usize>,
    /// The tables run from here to the end of the buffer.
    tables: usize,
}

impl MetaLayout {
    fn new(n: usize, w: usize) -> Self {
        let at = |i: usize, len: usize| i..i + len;
        Self {
            tokens: at(0, n),
            positions: at(n, n),
            slots: at(2 * n, n),
            table_offsets: at(3 * n, n),
            picked: at(4 * n, w),
            temperature: at(4 * n + w, w),
            top_p: at(4 * n + 2 * w, w),
            uniform: at(4 * n + 3 * w, w),
            top_k: at(4 * n + 4 * w, w),
            tables: 4 * n + 5 * w,
        }
    }
}

/// Writes `packed` and `sampling` (empty: no sampling; greedy rows then) into `out` as
/// [`MetaLayout`] places them; returns the length used.
fn write_metadata(packed: &Packed, sampling: &[RowSampling], out: &mut [i32]) -> usize {
    let layout = MetaLayout::new(packed.tokens.len(), packed.wanted.len());
    let len = layout.tables + packed.tables.len();
    out[layout.tokens].copy_from_slice(&packed.tokens);
    out[layout.positions].copy_from_slice(&packed.positions);
    out[layout.slots].copy_from_slice(&packed.slots);
    out[layout.table_offsets].copy_from_slice(&packed.table_offsets);
    for (o, (_, row)) in out[layout.picked].iter_mut().zip(&packed.wanted) {
        *o = *row;
    }
    let bits = |f: f32| f.to_bits() as i32;
    let row = |i: usize| sampling.get(i).copied();
    for i in 0..packed.wanted.len() {
        let r = row(i);
        out[layout.temperature.start + i] = bits(r.map_or(0.0, |r| r.temperature));
        out[layout.top_p.start + i] = bits(r.map_or(1.0, |r| r.top_p));
        out[layout.uniform.start + i] = bits(r.map_or(0.0, |r| r.uniform));
        out[layout.top_k.start + i] = r.map_or(0, |r| i32::try_from(r.top_k).unwrap_or(i32::MAX));
    }
    out[layout.tables..len].copy_from_slice(&packed.tables);
    len
}

/// A step's host-side metadata, packed once (the per-token loop both steps share).
#[derive(Clone, Debug, Default, PartialEq)]
struct Packed {
    tokens: Vec<i32>,
    positions: Vec<i32>,
    slots: Vec<i32>,
    tables: Vec<i32>,
    table_offsets: Vec<i32>,
    /// (sequence index, row of its last token) for every sequence that wants logits.
    wanted: Vec<(usize, i32)>,
}

/// The second step's buffers, allocated for `capacity` tokens and `rows` sampled rows and
/// reused by every step that fits (a larger step reallocates them once).
#[derive(Debug)]
struct Workspace {
    capacity: usize,
    rows: usize,
    meta: CudaSlice<i32>,
    x: CudaSlice<f32>,
    h: CudaSlice<f32>,
    qkv: CudaSlice<f32>,
    attended: CudaSlice<f32>,
    projected: CudaSlice<f32>,
    gate_up: CudaSlice<f32>,
    act: CudaSlice<f32>,
    last: CudaSlice<f32>,
    normed: CudaSlice<f32>,
    logits: CudaSlice<f32>,
    /// Pinned host memory the metadata is written into and copied from (asynchronously: the
    /// step's one synchronisation comes after).
    staging: PinnedHostSlice<i32>,
    sampled: CudaSlice<i32>,
}

/// A llama model and its KV pool on one GPU.
#[derive(Debug)]
pub struct GpuLlama {
    device: Device,
    shape: LlamaShape,
    embed: DeviceQ8,
    layers: Vec<DeviceLayer>,
    norm: CudaSlice<f32>,
    output: Option<DeviceQ8>,
    cos: CudaSlice<f32>,
    sin: CudaSlice<f32>,
    k: Vec<CudaSlice<f32>>,
    v: Vec<CudaSlice<f32>>,
    blocks: usize,
    weight_bytes: usize,
    /// The LM head dequantised (second step); `None` on the first.
    dense_head: Option<DeviceDense>,
    workspace: Option<Workspace>,
    /// Timing events of the step being profiled (see [`GpuLlama::profile_next_step`]).
    profile: Option<Vec<(&'static str, CudaEvent)>>,
    /// The last profiled step's phases.
    phases: Vec<StepPhase>,
    /// The block padding rows write to: one past the pool the engine sees.
    scratch_block: usize,
    /// Decode steps replay a CUDA graph per bucket (the second step; `RINGMASTER_GPU_GRAPHS=0`
    /// turns it off).
    graphs_enabled: bool,
    /// The captured graphs, by bucket; cleared whenever the workspace is reallocated.
    graphs: Vec<(usize, StepGraph)>,
    /// Why capturing failed, once (graphs are off after it).
    graph_error: Option<String>,
}

/// One phase of a profiled step: device time between two events on the step's stream.
#[derive(Clone, Debug, PartialEq)]
pub struct StepPhase {
    /// `upload`, `layers` (embedding included), `lm_head`, `sampling` or `download`.
    pub name: &'static str,
    /// Milliseconds.
    pub ms: f32,
}

/// Records a timing event named `name` on `stream` when a step is being profiled.
fn mark(
    profile: &mut Option<Vec<(&'static str, CudaEvent)>>,
    stream: &CudaStream,
    name: &'static str,
) -> Result<(), CudaError> {
    if let Some(events) = profile {
        let timing = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
        events.push((name, stream.record_event(Some(timing))?));
    }
    Ok(())
}

/// The dense f32 values of an int8 matrix, exactly as the int8 kernels see them.
fn dequantize(qs: &[i8], scales: &[f32]) -> Vec<f32> {
    qs.iter()
        .enumerate()
        .map(|(i, q)| f32::from(*q) * scales[i / QK])
        .collect()
}

/// Quantizes `values` (a multiple of 32 long) to int8 blocks of 32 with one scale each
/// (absolute maximum over 127, as the CPU kernels' int8 format).
pub fn quantize_q8(values: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let mut qs = Vec::with_capacity(values.len());
    let mut scales = Vec::with_capacity(values.len() / QK);
    for block in values.chunks(QK) {
        let max = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let scale = max / 127.0;
        scales.push(scale);
        qs.extend(block.iter().map(|v| {
            if scale > 0.0 {
                (v / scale).round().clamp(-127.0, 127.0) as i8
            } else {
                0
            }
        }));
    }
    (qs, scales)
}

impl GpuLlama {
    /// Uploads `host` to `device` and allocates the KV pool.
    pub fn load(device: Device, host: HostLlama, budget: KvBudget) -> Result<Self, CudaError> {
        let shape = host.shape;
        let s = &shape;
        if s.heads == 0
            || s.kv_heads == 0
            || !s.heads.is_multiple_of(s.kv_heads)
            || s.head_dim > crate::MAX_HEAD_DIM
            || !s.head_dim.is_multiple_of(2)
            || s.block_size == 0
        {
            return Err(CudaError::Shape(format!("unsupported model shape {s:?}")));
        }
        let dense = device.path() == StepPath::V2;
        if dense && !s.head_dim.is_multiple_of(4) {
            return Err(CudaError::Shape(format!("unsupported model shape {s:?}")));
        }
        let mut weight_bytes = 0;
        let mut matrix = |m: &HostMatrix| -> Result<(DeviceQ8, Option<DeviceDense>), CudaError> {
            let (qs, scales) = quantize_q8(&m.values);
            weight_bytes += qs.len() + 4 * scales.len();
            let dense = if dense {
                weight_bytes += 4 * qs.len();
                Some(device.upload_dense(&dequantize(&qs, &scales), m.rows, m.cols)?)
            } else {
                None
            };
            Ok((device.upload_q8(&qs, &scales, m.rows, m.cols)?, dense))
        };
        let (embed, embed_dense) = matrix(&host.embed)?;
        let mut layers = Vec::with_capacity(host.layers.len());
        for layer in &host.layers {
            let (qkv, qkv_dense) = matrix(&layer.qkv)?;
            let (wo, wo_dense) = matrix(&layer.wo)?;
            let (gate_up, gate_up_dense) = matrix(&layer.gate_up)?;
            let (down, down_dense) = matrix(&layer.down)?;
            let dense = match (qkv_dense, wo_dense, gate_up_dense, down_dense) {
                (Some(qkv), Some(wo), Some(gate_up), Some(down)) => Some(DenseLayer {
                    qkv,
                    wo,
                    gate_up,
                    down,
                }),
                _ => None,
            };
            layers.push(DeviceLayer {
                attn_norm: device.upload(&layer.attn_norm)?,
                qkv,
                wo,
                ffn_norm: device.upload(&layer.ffn_norm)?,
                gate_up,
                down,
                dense,
            });
        }
        let (output, dense_head) = match host.output.as_ref().map(&mut matrix).transpose()? {
            Some((q8, dense)) => (Some(q8), dense),
            None => (None, embed_dense),
        };
        let kv_dim = s.kv_heads * s.head_dim;
        let block_bytes = 2 * layers.len() * s.block_size * kv_dim * 4;
        let blocks = match budget {
            KvBudget::Blocks(n) => n,
            KvBudget::FreeMemory(fraction) => {
                let (free, _) = device.memory()?;
                ((free as f64 * fraction.clamp(0.0, 1.0)) as usize / block_bytes.max(1)).max(1)
            }
        };
        // One block more than the engine sees: where a padded graph step's extra rows write.
        let floats = (blocks + 1) * s.block_size * kv_dim;
        let mut k = Vec::with_capacity(layers.len());
        let mut v = Vec::with_capacity(layers.len());
        for _ in 0..layers.len() {
            k.push(device.stream.alloc_zeros::<f32>(floats)?);
            v.push(device.stream.alloc_zeros::<f32>(floats)?);
        }
        Ok(Self {
            norm: device.upload(&host.norm)?,
            cos: device.upload(&host.cos)?,
            sin: device.upload(&host.sin)?,
            device,
            shape,
            embed,
            layers,
            output,
            k,
            v,
            blocks,
            weight_bytes,
            dense_head,
            workspace: None,
            profile: None,
            phases: Vec::new(),
            scratch_block: blocks,
            graphs_enabled: dense && std::env::var("RINGMASTER_GPU_GRAPHS").as_deref() != Ok("0"),
            graphs: Vec::new(),
            graph_error: None,
        })
    }

    /// The step this model runs.
    pub fn path(&self) -> StepPath {
        self.device.path()
    }

    /// Whether decode steps replay CUDA graphs (the second step only).
    pub fn set_graphs(&mut self, enabled: bool) {
        self.graphs_enabled = enabled && self.path() == StepPath::V2;
        if !self.graphs_enabled {
            self.graphs.clear();
        }
    }

    /// Why graphs were turned off, the first time it is asked after a failed capture.
    pub fn take_graph_error(&mut self) -> Option<String> {
        self.graph_error.take()
    }

    /// Whether decode steps replay CUDA graphs.
    pub fn graphs_enabled(&self) -> bool {
        self.graphs_enabled
    }

    /// Decode buckets with a captured graph.
    pub fn graph_buckets(&self) -> Vec<usize> {
        self.graphs.iter().map(|(b, _)| *b).collect()
    }

    /// Times the next step's phases on the device (CUDA events between them); read them with
    /// [`GpuLlama::last_phases`] after it. Costs a few event records: for benchmarks.
    pub fn profile_next_step(&mut self) {
        self.profile = Some(Vec::new());
    }

    /// The phases of the last profiled step, once it has finished.
    pub fn last_phases(&self) -> &[StepPhase] {
        &self.phases
    }

    /// Turns the events of a profiled step (finished: the step synchronised) into phases.
    fn finish_profile(&mut self) -> Result<(), CudaError> {
        let Some(events) = self.profile.take() else {
            return Ok(());
        };
        self.phases = events
            .windows(2)
            .map(|pair| {
                Ok(StepPhase {
                    name: pair[1].0,
                    ms: pair[0].1.elapsed_ms(&pair[1].1)?,
                })
            })
            .collect::<Result<_, CudaError>>()?;
        Ok(())
    }

    /// KV blocks in the pool.
    pub fn kv_blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes the weights take on the device.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The step's metadata: per token its id, position, pool slot and the offset of its
    /// sequence's block table; every table; the rows whose logits are wanted.
    fn pack(&self, seqs: &[GpuSeq<'_>]) -> Result<Packed, CudaError> {
        let s = self.shape;
        let bs = s.block_size;
        let mut packed = Packed::default();
        for (i, seq) in seqs.iter().enumerate() {
            let end = seq.start + seq.tokens.len();
            if end > s.context || end > seq.table.len() * bs {
                return Err(CudaError::Shape(format!(
                    "positions {}..{end} exceed the context ({}) or the block table ({} slots)",
                    seq.start,
                    s.context,
                    seq.table.len() * bs
                )));
            }
            if let Some(bad) = seq.table.iter().find(|b| **b as usize >= self.blocks) {
                return Err(CudaError::Shape(format!(
                    "block {bad} is outside the KV pool"
                )));
            }
            if let Some(bad) = seq.tokens.iter().find(|t| **t as usize >= s.vocab) {
                return Err(CudaError::Shape(format!(
                    "token {bad} is outside the vocabulary"
                )));
            }
            let table_at = dim(packed.tables.len())?;
            packed.tables.extend(seq.table.iter().map(|b| *b as i32));
            for (j, token) in seq.tokens.iter().enumerate() {
                let p = seq.start + j;
                packed.tokens.push(*token as i32);
                packed.positions.push(dim(p)?);
                packed
                    .slots
                    .push(dim(seq.table[p / bs] as usize * bs + p % bs)?);
                packed.table_offsets.push(table_at);
            }
            if seq.logits && !seq.tokens.is_empty() {
                packed.wanted.push((i, dim(packed.tokens.len() - 1)?));
            }
        }
        if packed.tables.is_empty() {
            packed.tables.push(0);
        }
        Ok(packed)
    }

    /// Computes every sequence's new tokens, writing their K/V into the pool; returns, per
    /// sequence, its last token's logits when it asked for them (either step; the second
    /// copies back only the wanted rows).
    pub fn forward(&mut self, seqs: &[GpuSeq<'_>]) -> Result<Vec<Option<Vec<f32>>>, CudaError> {
        match self.path() {
            StepPath::V2 => self.forward_v2(seqs),
            StepPath::V1 => self.forward_v1(seqs),
        }
    }

    /// The second step's forward pass, the wanted rows' logits copied back.
    fn forward_v2(&mut self, seqs: &[GpuSeq<'_>]) -> Result<Vec<Option<Vec<f32>>>, CudaError> {
        let packed = self.pack(seqs)?;
        let mut result = vec![None; seqs.len()];
        if packed.tokens.is_empty() {
            return Ok(result);
        }
        self.enqueue_v2(&packed, &[])?;
        let (w, vocab) = (packed.wanted.len(), self.shape.vocab);
        let mut host = vec![0.0f32; w * vocab];
        if w > 0 {
            let ws = self.workspace.as_ref().expect("enqueue_v2 made it");
            self.device
                .stream
                .memcpy_dtoh(&ws.logits.slice(..w * vocab), &mut host)?;
            mark(&mut self.profile, &self.device.stream, "download")?;
        }
        self.device.stream.synchronize()?;
        self.finish_profile()?;
        for (row, (seq, _)) in packed.wanted.iter().enumerate() {
            result[*seq] = Some(host[row * vocab..(row + 1) * vocab].to_vec());
        }
        Ok(result)
    }

    /// The second step whole: the forward pass, then each wanted row's token drawn on the
    /// device by `sampling` (one entry per sequence that asked for logits, in order); only the
    /// token ids come back, in the step's one synchronisation. `None` for the others.
    pub fn sample_step(
        &mut self,
        seqs: &[GpuSeq<'_>],
        sampling: &[RowSampling],
    ) -> Result<Vec<Option<u32>>, CudaError> {
        if self.path() != StepPath::V2 {
            return Err(CudaError::Shape(
                "device sampling runs on the second step only (RINGMASTER_GPU_PATH=v2)".into(),
            ));
        }
        let packed = self.pack(seqs)?;
        if sampling.len() != packed.wanted.len() {
            return Err(CudaError::Shape(format!(
                "{} sampling rows for {} sequences that want a token",
                sampling.len(),
                packed.wanted.len()
            )));
        }
        let mut result = vec![None; seqs.len()];
        if packed.tokens.is_empty() {
            return Ok(result);
        }
        let decode_only = packed.wanted.len() == packed.tokens.len();
        let bucket =
            decode_bucket(packed.tokens.len()).filter(|_| self.graphs_enabled && decode_only);
        let padded;
        let (packed, sampling) = match bucket {
            Some(bucket) => {
                padded = pad_decode(
                    &packed,
                    bucket,
                    dim(self.scratch_block)?,
                    dim(self.shape.block_size)?,
                );
                let mut rows = sampling.to_vec();
                rows.resize(
                    bucket,
                    RowSampling {
                        temperature: 0.0,
                        top_k: 0,
                        top_p: 1.0,
                        uniform: 0.0,
                    },
                );
                self.upload_v2(&padded, &rows)?;
                self.replay(bucket)?;
                (&padded, rows)
            }
            None => {
                self.enqueue_v2(&packed, sampling)?;
                (&packed, sampling.to_vec())
            }
        };
        debug_assert_eq!(sampling.len(), packed.wanted.len());
        let w = packed.wanted.len();
        let mut tokens = vec![0i32; w];
        if w > 0 {
            let ws = self.workspace.as_ref().expect("enqueue_v2 made it");
            self.device
                .stream
                .memcpy_dtoh(&ws.sampled.slice(..w), &mut tokens)?;
            mark(&mut self.profile, &self.device.stream, "download")?;
        }
        self.device.stream.synchronize()?;
        self.finish_profile()?;
        for ((seq, _), token) in packed.wanted.iter().zip(tokens) {
            if *seq != PADDING {
                result[*seq] = Some(u32::try_from(token).unwrap_or(0));
            }
        }
        Ok(result)
    }

    /// Runs the decode step of `bucket` rows whose inputs were just uploaded: its graph,
    /// captured now if this is the bucket's first step. A capture that fails turns graphs off
    /// (logged once by the caller's error) and runs the step eagerly.
    fn replay(&mut self, bucket: usize) -> Result<(), CudaError> {
        if self.graphs.iter().all(|(b, _)| *b != bucket) {
            let stream = self.device.stream.clone();
            // Events recorded inside a capture would become graph nodes: profile around it.
            let profile = self.profile.take();
            stream.begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )?;
            let captured = self.compute_v2(bucket, bucket, true);
            let graph = stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0));
            self.profile = profile;
            match (captured, graph) {
                (Ok(()), Ok(Some(graph))) => self.graphs.push((bucket, StepGraph(graph))),
                (captured, graph) => {
                    // Graphs off for good, this step eagerly (its inputs are uploaded).
                    self.graphs_enabled = false;
                    self.graphs.clear();
                    let why = captured
                        .err()
                        .map(|e| e.to_string())
                        .or_else(|| graph.err().map(|e| e.to_string()))
                        .unwrap_or_else(|| "the capture was empty".into());
                    self.graph_error = Some(CudaError::Graph(why).to_string());
                    return self.compute_v2(bucket, bucket, true);
                }
            }
        }
        let graph = &self
            .graphs
            .iter()
            .find(|(b, _)| *b == bucket)
            .expect("captured above")
            .1;
        graph.0.launch()?;
        mark(&mut self.profile, &self.device.stream, "graph")?;
        Ok(())
    }

    /// A workspace for `n` tokens and `w` sampled rows, reusing the current one if it fits.
    fn ensure_workspace(&mut self, n: usize, w: usize, meta: usize) -> Result<(), CudaError> {
        if let Some(ws) = &self.workspace
            && ws.capacity >= n
            && ws.rows >= w
            && ws.meta.len() >= meta
        {
            return Ok(());
        }
        let s = self.shape;
        // Round up so that a growing batch reallocates rarely.
        let capacity = n.next_power_of_two().max(64);
        let rows = w.next_power_of_two().max(8);
        let q_dim = s.heads * s.head_dim;
        let qkv_dim = q_dim + 2 * s.kv_heads * s.head_dim;
        let stream = &self.device.stream;
        let floats = |len: usize| stream.alloc_zeros::<f32>(len.max(1));
        let meta_capacity = meta.next_power_of_two().max(4096);
        // The graphs hold the old buffers' addresses: drop them before the buffers.
        self.graphs.clear();
        self.workspace = None;
        self.workspace = Some(Workspace {
            capacity,
            rows,
            meta: stream.alloc_zeros::<i32>(meta_capacity)?,
            x: floats(capacity * s.hidden)?,
            h: floats(capacity * s.hidden)?,
            qkv: floats(capacity * qkv_dim)?,
            attended: floats(capacity * q_dim)?,
            projected: floats(capacity * s.hidden)?,
            gate_up: floats(capacity * 2 * s.ffn)?,
            act: floats(capacity * s.ffn)?,
            last: floats(rows * s.hidden)?,
            normed: floats(rows * s.hidden)?,
            logits: floats(rows * s.vocab)?,
            // SAFETY: `write_metadata` writes every element a step's kernels read before the
            // copy; the rest is copied unread.
            #[allow(unsafe_code)]
            staging: unsafe { self.device.context.alloc_pinned::<i32>(meta_capacity)? },
            sampled: stream.alloc_zeros::<i32>(rows)?,
        });
        Ok(())
    }

    /// Queues the second step: one upload of the metadata, the layers with cuBLAS GEMMs and
    /// the register-only attention, the wanted rows' logits, and (with `sampling`) the
    /// sampling kernel. Nothing waits here.
    fn enqueue_v2(&mut self, packed: &Packed, sampling: &[RowSampling]) -> Result<(), CudaError> {
        self.upload_v2(packed, sampling)?;
        self.compute_v2(
            packed.tokens.len(),
            packed.wanted.len(),
            !sampling.is_empty(),
        )
    }

    /// The second step's uploads: the metadata in one copy, the sampling rows in two.
    fn upload_v2(&mut self, packed: &Packed, sampling: &[RowSampling]) -> Result<(), CudaError> {
        let n = packed.tokens.len();
        let w = packed.wanted.len();
        self.ensure_workspace(n, w, MetaLayout::new(n, w).tables + packed.tables.len())?;
        let dev = &self.device;
        let ws = self.workspace.as_mut().expect("just made");
        let profile = &mut self.profile;
        mark(profile, &dev.stream, "start")?;
        // Waits for the last copy out of the staging buffer (long done: every step ends in a
        // synchronisation), then one asynchronous copy of it all.
        write_metadata(packed, sampling, ws.staging.as_mut_slice()?);
        dev.stream.memcpy_htod(&ws.staging, &mut ws.meta)?;
        mark(profile, &dev.stream, "upload")?;
        Ok(())
    }

    /// The second step's kernels for `n` tokens and `w` wanted rows, on what
    /// [`GpuLlama::upload_v2`] left in the workspace (the tables run to the end of the
    /// metadata buffer, so every pointer depends only on `n` and `w`: a graph captured for a
    /// shape replays on any step of that shape). No allocation, no copy, no wait.
    fn compute_v2(&mut self, n: usize, w: usize, sample: bool) -> Result<(), CudaError> {
        let s = self.shape;
        let (d, ffn, bs) = (s.hidden, s.ffn, s.block_size);
        let q_dim = s.heads * s.head_dim;
        let kv_dim = s.kv_heads * s.head_dim;
        let qkv_dim = q_dim + 2 * kv_dim;
        let dev = &self.device;
        let ws = self
            .workspace
            .as_mut()
            .ok_or_else(|| CudaError::Shape("no workspace: nothing was uploaded".into()))?;
        let profile = &mut self.profile;
        let layout = MetaLayout::new(n, w);
        let ws_meta = &ws.meta;
        let tokens = ws_meta.slice(layout.tokens.clone());
        let positions = ws_meta.slice(layout.positions.clone());
        let slots = ws_meta.slice(layout.slots.clone());
        let table_offsets = ws_meta.slice(layout.table_offsets.clone());
        let picked = ws_meta.slice(layout.picked.clone());
        let tables = ws_meta.slice(layout.tables..);
        let rows = dim(n)? as u32;
        let (di, ffn_i, qkv_i) = (dim(d)?, dim(ffn)?, dim(qkv_dim)?);
        let (q_i, kv_i, hd_i) = (dim(q_dim)?, dim(kv_dim)?, dim(s.head_dim)?);
        let (heads_i, kv_heads_i, bs_i) = (dim(s.heads)?, dim(s.kv_heads)?, dim(bs)?);
        let total = (n * d) as i64;
        let n_i = dim(n)?;
        let add_blocks = (n * d).div_ceil(256) as u32;
        let silu_blocks = (n * ffn).div_ceil(256) as u32;
        let Workspace {
            x,
            h,
            qkv,
            attended,
            projected,
            gate_up,
            act,
            last,
            normed,
            logits,
            sampled,
            ..
        } = ws;
        let mut x = x.slice_mut(..n * d);
        let mut h = h.slice_mut(..n * d);
        let mut qkv = qkv.slice_mut(..n * qkv_dim);
        let mut attended = attended.slice_mut(..n * q_dim);
        let mut projected = projected.slice_mut(..n * d);
        let mut gate_up = gate_up.slice_mut(..n * 2 * ffn);
        let mut act = act.slice_mut(..n * ffn);

        launch!(dev, "embed_q8", (rows, 1, 1), (256, 1, 1);
            &self.embed.qs, &self.embed.scales, &tokens, &mut x, &di);
        for (l, layer) in self.layers.iter().enumerate() {
            let dense = layer.dense.as_ref().ok_or_else(|| {
                CudaError::Shape("the second step needs the dense weights".into())
            })?;
            let xr = x.as_view();
            launch!(dev, "rms_norm", (rows, 1, 1), (32, 1, 1);
                &xr, &layer.attn_norm, &mut h, &di, &s.rms_eps);
            dev.gemm(&dense.qkv, &h.as_view(), n, &mut qkv)?;
            launch!(dev, "rope_qk", (rows, 1, 1), (128, 1, 1);
                &mut qkv, &positions, &self.cos, &self.sin, &qkv_i, &heads_i, &kv_heads_i, &hd_i);
            let qkv_r = qkv.as_view();
            launch!(dev, "kv_store", (rows, 1, 1), (128, 1, 1);
                &qkv_r, &slots, &mut self.k[l], &mut self.v[l], &qkv_i, &q_i, &kv_i);
            launch!(dev, "paged_attention_v2", (rows, dim(s.heads)? as u32, 1), (128, 1, 1);
                &qkv_r, &self.k[l], &self.v[l], &tables, &table_offsets, &positions, &mut attended,
                &heads_i, &kv_heads_i, &bs_i, &qkv_i);
            dev.gemm(&dense.wo, &attended.as_view(), n, &mut projected)?;
            let projected_r = projected.as_view();
            launch!(dev, "add", (add_blocks, 1, 1), (256, 1, 1); &mut x, &projected_r, &total);
            let xr = x.as_view();
            launch!(dev, "rms_norm", (rows, 1, 1), (32, 1, 1);
                &xr, &layer.ffn_norm, &mut h, &di, &s.rms_eps);
            dev.gemm(&dense.gate_up, &h.as_view(), n, &mut gate_up)?;
            let gate_up_r = gate_up.as_view();
            launch!(dev, "silu_mul", (silu_blocks, 1, 1), (256, 1, 1);
                &gate_up_r, &mut act, &ffn_i, &n_i);
            dev.gemm(&dense.down, &act.as_view(), n, &mut projected)?;
            let projected_r = projected.as_view();
            launch!(dev, "add", (add_blocks, 1, 1), (256, 1, 1); &mut x, &projected_r, &total);
        }
        mark(profile, &dev.stream, "layers")?;
        if w == 0 {
            return Ok(());
        }
        let head = self
            .dense_head
            .as_ref()
            .ok_or_else(|| CudaError::Shape("the second step needs the dense LM head".into()))?;
        let vocab = s.vocab;
        let w_u = dim(w)? as u32;
        let mut last = last.slice_mut(..w * d);
        let mut normed = normed.slice_mut(..w * d);
        let mut logits = logits.slice_mut(..w * vocab);
        let xr = x.as_view();
        launch!(dev, "gather_rows", (w_u, 1, 1), (256, 1, 1); &xr, &picked, &mut last, &di);
        let last_r = last.as_view();
        launch!(dev, "rms_norm", (w_u, 1, 1), (32, 1, 1);
            &last_r, &self.norm, &mut normed, &di, &s.rms_eps);
        dev.gemm(head, &normed.as_view(), w, &mut logits)?;
        mark(profile, &dev.stream, "lm_head")?;
        if sample {
            let vocab_i = dim(vocab)?;
            // The sampling rows' floats are read as floats by the kernel (their bits travel).
            let temperature = ws_meta.slice(layout.temperature.clone());
            let top_p = ws_meta.slice(layout.top_p.clone());
            let uniform = ws_meta.slice(layout.uniform.clone());
            let top_k = ws_meta.slice(layout.top_k.clone());
            let mut sampled = sampled.slice_mut(..w);
            let logits_r = logits.as_view();
            launch!(dev, "sample_rows", (w_u, 1, 1), (1024, 1, 1);
                &logits_r, &vocab_i, &temperature, &top_k, &top_p, &uniform, &mut sampled);
            mark(profile, &dev.stream, "sampling")?;
        }
        Ok(())
    }

    /// The first step (`RINGMASTER_GPU_PATH=v1`), as it was measured on the H200: fresh
    /// buffers each step, the int8 GEMV kernel, the stack-accumulator attention, all wanted
    /// logits copied back.
    fn forward_v1(&mut self, seqs: &[GpuSeq<'_>]) -> Result<Vec<Option<Vec<f32>>>, CudaError> {
        let s = self.shape;
        let (d, ffn, bs) = (s.hidden, s.ffn, s.block_size);
        let q_dim = s.heads * s.head_dim;
        let kv_dim = s.kv_heads * s.head_dim;
        let qkv_dim = q_dim + 2 * kv_dim;
        let Packed {
            tokens,
            positions,
            slots,
            tables,
            table_offsets,
            wanted,
        } = self.pack(seqs)?;
        let n = tokens.len();
        let mut result = vec![None; seqs.len()];
        if n == 0 {
            return Ok(result);
        }
        let dev = &self.device;
        let profile = &mut self.profile;
        mark(profile, &dev.stream, "start")?;
        let tokens = dev.upload(&tokens)?;
        let positions = dev.upload(&positions)?;
        let slots = dev.upload(&slots)?;
        let tables = dev.upload(&tables)?;
        let table_offsets = dev.upload(&table_offsets)?;
        let zeros = |len: usize| dev.stream.alloc_zeros::<f32>(len);
        let mut x = zeros(n * d)?;
        let mut h = zeros(n * d)?;
        let mut qkv = zeros(n * qkv_dim)?;
        let mut attended = zeros(n * q_dim)?;
        let mut projected = zeros(n * d)?;
        let mut gate_up = zeros(n * 2 * ffn)?;
        let mut act = zeros(n * ffn)?;
        let rows = dim(n)? as u32;
        let (di, ffn_i, qkv_i) = (dim(d)?, dim(ffn)?, dim(qkv_dim)?);
        let (q_i, kv_i, hd_i) = (dim(q_dim)?, dim(kv_dim)?, dim(s.head_dim)?);
        let (heads_i, kv_heads_i, bs_i) = (dim(s.heads)?, dim(s.kv_heads)?, dim(bs)?);
        let total = (n * d) as i64;
        let n_i = dim(n)?;
        let add_blocks = (n * d).div_ceil(256) as u32;
        mark(profile, &dev.stream, "upload")?;

        launch!(dev, "embed_q8", (rows, 1, 1), (256, 1, 1);
            &self.embed.qs, &self.embed.scales, &tokens, &mut x, &di);
        for (l, layer) in self.layers.iter().enumerate() {
            launch!(dev, "rms_norm", (rows, 1, 1), (32, 1, 1);
                &x, &layer.attn_norm, &mut h, &di, &s.rms_eps);
            dev.matmul_q8(&layer.qkv, &h, n, &mut qkv)?;
            launch!(dev, "rope_qk", (rows, 1, 1), (128, 1, 1);
                &mut qkv, &positions, &self.cos, &self.sin, &qkv_i, &heads_i, &kv_heads_i, &hd_i);
            launch!(dev, "kv_store", (rows, 1, 1), (128, 1, 1);
                &qkv, &slots, &mut self.k[l], &mut self.v[l], &qkv_i, &q_i, &kv_i);
            launch!(dev, "paged_attention", (rows, dim(s.heads)? as u32, 1), (32, 1, 1);
                &qkv, &self.k[l], &self.v[l], &tables, &table_offsets, &positions, &mut attended,
                &heads_i, &kv_heads_i, &hd_i, &bs_i, &qkv_i);
            dev.matmul_q8(&layer.wo, &attended, n, &mut projected)?;
            launch!(dev, "add", (add_blocks, 1, 1), (256, 1, 1); &mut x, &projected, &total);
            launch!(dev, "rms_norm", (rows, 1, 1), (32, 1, 1);
                &x, &layer.ffn_norm, &mut h, &di, &s.rms_eps);
            dev.matmul_q8(&layer.gate_up, &h, n, &mut gate_up)?;
            let silu_blocks = (n * ffn).div_ceil(256) as u32;
            launch!(dev, "silu_mul", (silu_blocks, 1, 1), (256, 1, 1);
                &gate_up, &mut act, &ffn_i, &n_i);
            dev.matmul_q8(&layer.down, &act, n, &mut projected)?;
            launch!(dev, "add", (add_blocks, 1, 1), (256, 1, 1); &mut x, &projected, &total);
        }
        mark(profile, &dev.stream, "layers")?;
        if wanted.is_empty() {
            dev.stream.synchronize()?;
            self.finish_profile()?;
            return Ok(result);
        }
        let w = wanted.len();
        let picked: Vec<i32> = wanted.iter().map(|(_, r)| *r).collect();
        let picked = dev.upload(&picked)?;
        let mut last = zeros(w * d)?;
        let mut normed = zeros(w * d)?;
        launch!(dev, "gather_rows", (dim(w)? as u32, 1, 1), (256, 1, 1); &x, &picked, &mut last, &di);
        launch!(dev, "rms_norm", (dim(w)? as u32, 1, 1), (32, 1, 1);
            &last, &self.norm, &mut normed, &di, &s.rms_eps);
        let head = self.output.as_ref().unwrap_or(&self.embed);
        let vocab = head.rows();
        let mut logits = zeros(w * vocab)?;
        dev.matmul_q8(head, &normed, w, &mut logits)?;
        mark(profile, &dev.stream, "lm_head")?;
        let logits = dev.download(&logits)?;
        mark(profile, &dev.stream, "download")?;
        self.finish_profile()?;
        for (i, (seq, _)) in wanted.into_iter().enumerate() {
            result[seq] = Some(logits[i * vocab..(i + 1) * vocab].to_vec());
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_step_pads_to_the_smallest_bucket_that_holds_it() {
        assert_eq!(decode_bucket(0), None);
        assert_eq!(decode_bucket(1), Some(1));
        assert_eq!(decode_bucket(3), Some(4));
        assert_eq!(decode_bucket(17), Some(24));
        assert_eq!(decode_bucket(256), Some(256));
        assert_eq!(decode_bucket(257), None);
        for pair in DECODE_BUCKETS.windows(2) {
            assert!(pair[0] < pair[1]);
        }
    }

    #[test]
    fn padding_rows_write_only_the_scratch_block_and_are_marked() {
        let packed = Packed {
            tokens: vec![11, 12, 13],
            positions: vec![40, 7, 90],
            slots: vec![5 * 16 + 8, 2 * 16 + 7, 9 * 16 + 10],
            tables: vec![3, 5, 2, 4, 9],
            table_offsets: vec![0, 2, 3],
            wanted: vec![(0, 0), (1, 1), (2, 2)],
        };
        let padded = pad_decode(&packed, 8, 100, 16);
        assert_eq!(padded.tokens.len(), 8);
        assert_eq!(&padded.tokens[..3], &packed.tokens[..]);
        assert_eq!(padded.tables, vec![3, 5, 2, 4, 9, 100]);
        for row in 3..8 {
            assert_eq!(padded.tokens[row], 0);
            assert_eq!(padded.positions[row], 0);
            assert_eq!(padded.slots[row], 100 * 16);
            // Its one-block table is the scratch block.
            assert_eq!(padded.tables[padded.table_offsets[row] as usize], 100);
            assert_eq!(padded.wanted[row], (PADDING, row as i32));
        }
        // Every row is wanted in order: the sampled rows are the step's rows.
        for (row, (_, at)) in padded.wanted.iter().enumerate() {
            assert_eq!(*at, row as i32);
        }
    }

    #[test]
    fn the_metadata_lands_where_the_kernels_read_it() {
        let packed = Packed {
            tokens: vec![11, 12, 13],
            positions: vec![0, 1, 7],
            slots: vec![32, 33, 39],
            tables: vec![2, 9],
            table_offsets: vec![0, 0, 1],
            wanted: vec![(0, 1), (1, 2)],
        };
        let rows = [
            RowSampling {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
                uniform: 0.25,
            },
            RowSampling {
                temperature: 1.0,
                top_k: u32::MAX,
                top_p: 1.0,
                uniform: 0.5,
            },
        ];
        let mut out = vec![-1; 64];
        let len = write_metadata(&packed, &rows, &mut out);
        let layout = MetaLayout::new(3, 2);
        assert_eq!(len, layout.tables + 2);
        assert_eq!(&out[layout.tokens], &[11, 12, 13]);
        assert_eq!(&out[layout.positions], &[0, 1, 7]);
        assert_eq!(&out[layout.slots], &[32, 33, 39]);
        assert_eq!(&out[layout.table_offsets], &[0, 0, 1]);
        assert_eq!(&out[layout.picked], &[1, 2]);
        let float = |i: usize| f32::from_bits(out[i] as u32);
        assert_eq!(float(layout.temperature.start), 0.7);
        assert_eq!(float(layout.top_p.start + 1), 1.0);
        assert_eq!(float(layout.uniform.start), 0.25);
        assert_eq!(&out[layout.top_k], &[40, i32::MAX]);
        assert_eq!(&out[layout.tables..len], &[2, 9]);
        // Without sampling rows (a forward pass only): greedy placeholders.
        let mut bare = vec![-1; 64];
        let len = write_metadata(&packed, &[], &mut bare);
        assert_eq!(len, layout.tables + 2);
        assert_eq!(bare[layout.temperature.start], 0);
        assert_eq!(f32::from_bits(bare[layout.top_p.start] as u32), 1.0);
    }
}
