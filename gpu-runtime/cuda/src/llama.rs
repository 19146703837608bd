//! The llama forward pass on one GPU, over a paged KV pool in device memory.
//!
//! The same computation as the CPU engine's `model::llama`, step for step: every sequence's new
//! tokens are stacked into one batch of rows; each weight matrix is read once per step by the
//! dequantizing int8 matmul; rotary embedding rotates Q and K in place inside the stacked QKV
//! rows; every row's K and V is written into its pool slot before any attention reads, so a
//! prompt chunk sees its own earlier tokens; attention reads K/V through the block tables, so a
//! prefix cached in shared blocks is read, never recomputed. Only the logits the caller asks
//! for are copied back.
//!
//! Weights arrive as f32 host matrices ([`HostLlama`], built by the engine crate from a GGUF
//! file) and are quantized here to int8 blocks of 32 with one f32 scale, the layout the
//! kernels read. The pool is f32, sized by the caller or from the device's free memory after
//! the weights ([`KvBudget`]). This module knows shapes and block tables, not requests.

use cudarc::driver::CudaSlice;

use crate::{CudaError, Device, DeviceQ8, QK, dim};

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

#[derive(Debug)]
struct DeviceLayer {
    attn_norm: CudaSlice<f32>,
    qkv: DeviceQ8,
    wo: DeviceQ8,
    ffn_norm: CudaSlice<f32>,
    gate_up: DeviceQ8,
    down: DeviceQ8,
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
        let mut weight_bytes = 0;
        let mut matrix = |m: &HostMatrix| -> Result<DeviceQ8, CudaError> {
            let (qs, scales) = quantize_q8(&m.values);
            weight_bytes += qs.len() + 4 * scales.len();
            device.upload_q8(&qs, &scales, m.rows, m.cols)
        };
        let embed = matrix(&host.embed)?;
        let mut layers = Vec::with_capacity(host.layers.len());
        for layer in &host.layers {
            layers.push(DeviceLayer {
                attn_norm: device.upload(&layer.attn_norm)?,
                qkv: matrix(&layer.qkv)?,
                wo: matrix(&layer.wo)?,
                ffn_norm: device.upload(&layer.ffn_norm)?,
                gate_up: matrix(&layer.gate_up)?,
                down: matrix(&layer.down)?,
            });
        }
        let output = host.output.as_ref().map(&mut matrix).transpose()?;
        let kv_dim = s.kv_heads * s.head_dim;
        let block_bytes = 2 * layers.len() * s.block_size * kv_dim * 4;
        let blocks = match budget {
            KvBudget::Blocks(n) => n,
            KvBudget::FreeMemory(fraction) => {
                let (free, _) = device.memory()?;
                ((free as f64 * fraction.clamp(0.0, 1.0)) as usize / block_bytes.max(1)).max(1)
            }
        };
        let floats = blocks * s.block_size * kv_dim;
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
        })
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

    /// Computes every sequence's new tokens, writing their K/V into the pool; returns, per
    /// sequence, its last token's logits when it asked for them.
    pub fn forward(&mut self, seqs: &[GpuSeq<'_>]) -> Result<Vec<Option<Vec<f32>>>, CudaError> {
        let s = self.shape;
        let (d, ffn, bs) = (s.hidden, s.ffn, s.block_size);
        let q_dim = s.heads * s.head_dim;
        let kv_dim = s.kv_heads * s.head_dim;
        let qkv_dim = q_dim + 2 * kv_dim;
        let (mut tokens, mut positions, mut slots) = (Vec::new(), Vec::new(), Vec::new());
        let (mut tables, mut table_offsets) = (Vec::new(), Vec::new());
        let mut wanted = Vec::new();
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
            let table_at = dim(tables.len())?;
            tables.extend(seq.table.iter().map(|b| *b as i32));
            for (j, token) in seq.tokens.iter().enumerate() {
                let p = seq.start + j;
                tokens.push(*token as i32);
                positions.push(dim(p)?);
                slots.push(dim(seq.table[p / bs] as usize * bs + p % bs)?);
                table_offsets.push(table_at);
            }
            if seq.logits && !seq.tokens.is_empty() {
                wanted.push((i, dim(tokens.len() - 1)?));
            }
        }
        let n = tokens.len();
        let mut result = vec![None; seqs.len()];
        if n == 0 {
            return Ok(result);
        }
        if tables.is_empty() {
            tables.push(0);
        }
        let dev = &self.device;
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
        if wanted.is_empty() {
            dev.stream.synchronize()?;
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
        let logits = dev.download(&logits)?;
        for (i, (seq, _)) in wanted.into_iter().enumerate() {
            result[seq] = Some(logits[i * vocab..(i + 1) * vocab].to_vec());
        }
        Ok(result)
    }
}
