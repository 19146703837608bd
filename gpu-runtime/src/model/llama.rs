//! The llama forward pass over a paged KV cache, batched across sequences, on the int8 kernels
//! of `ringmaster-kernels`.
//!
//! **Weights** are requantized at load into one of the kernels' two block formats: 4-bit
//! blocks with a scale and minimum for tensors the file holds in 4 bits (Q4_0, Q4_1), int8
//! blocks for everything else (Q8_0, F16, F32). Decode at batch 1 reads every weight once per
//! token and is bound by memory, so it should read no more bytes than the file's precision
//! needs; batches and prefill are bound by arithmetic, which costs the same in both. The
//! projections that read the same input are stacked (Q, K and V; gate and up) so each is one
//! pass over memory. Activations are quantized to int8 blocks per row before each product.
//!
//! **Batching**: one [`Llama::forward`] computes the new tokens of every sequence in a step,
//! whether they are prompt chunks or single decode tokens. Their rows are stacked, so each
//! weight matrix is read once per step, not once per sequence; only attention runs per token,
//! because each token reads its own sequence's cache.
//!
//! **The paged cache**: K and V live in one pool per layer laid out `[block, slot, kv_head,
//! head_dim]`; a token at position `p` writes slot `p % BLOCK_SIZE` of block
//! `table[p / BLOCK_SIZE]`, and attention reads positions `0..=p` through the same table, so
//! blocks shared by a cached prefix are read by every sequence that holds them and never
//! recomputed. All of a step's K/V is written before any attention reads, so a prompt chunk
//! sees its own earlier tokens.
//!
//! A row's result never depends on what else is in the batch or on the thread count: the
//! kernels compute each output value in a fixed order.

use candle_core::Device;
use candle_core::quantized::GgmlDType;
use half::f16;
use half::slice::HalfFloatSliceExt;
use ringmaster_kernels::{AttentionShape, Cpu, Format, Q8Rows, Weights};

use super::ModelError;
use super::gguf::{LlamaConfig, ModelFile};
use crate::block::{BLOCK_SIZE, BlockId};

/// One transformer block's weights.
#[derive(Debug)]
struct Layer {
    attn_norm: Vec<f32>,
    /// Q, K and V stacked: `heads·head_dim + 2·kv_heads·head_dim` rows.
    qkv: Weights,
    wo: Weights,
    ffn_norm: Vec<f32>,
    /// Gate and up stacked: `2·ffn` rows.
    gate_up: Weights,
    down: Weights,
}

/// A loaded llama model.
#[derive(Debug)]
pub struct Llama {
    /// Its shape.
    pub config: LlamaConfig,
    embed: Weights,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// The output head; `None` when the file ties it to the embedding.
    output: Option<Weights>,
    /// `[context, head_dim / 2]` rotary tables.
    cos: Vec<f32>,
    sin: Vec<f32>,
}

/// The paged K/V pool: per layer, `blocks × BLOCK_SIZE` slots of `kv_heads × head_dim` values
/// in half precision (half the memory and half the attention reads of f32; K and V are computed
/// in f32 and rounded once, when stored).
#[derive(Debug)]
pub struct PagedKv {
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
    kv_dim: usize,
    blocks: usize,
}

impl PagedKv {
    /// A pool of `blocks` blocks for `config`. Its pages are committed as they are written.
    pub fn new(config: &LlamaConfig, blocks: usize) -> Self {
        let kv_dim = config.kv_heads * config.head_dim;
        let floats = blocks * BLOCK_SIZE * kv_dim;
        Self {
            k: (0..config.layers)
                .map(|_| vec![f16::ZERO; floats])
                .collect(),
            v: (0..config.layers)
                .map(|_| vec![f16::ZERO; floats])
                .collect(),
            kv_dim,
            blocks,
        }
    }

    /// Bytes the pool takes when full.
    pub fn bytes(&self) -> usize {
        self.blocks * self.block_bytes()
    }

    /// Bytes one block takes across all layers (K and V).
    pub fn block_bytes(&self) -> usize {
        2 * self.k.len() * BLOCK_SIZE * self.kv_dim * std::mem::size_of::<f16>()
    }

    /// The contents of `blocks`, [`block_bytes`](Self::block_bytes) each in block order:
    /// per block, every layer's keys then values (little-endian halves).
    pub fn read_blocks(&self, blocks: &[BlockId]) -> Vec<u8> {
        let slot = BLOCK_SIZE * self.kv_dim;
        let mut out = Vec::with_capacity(blocks.len() * self.block_bytes());
        for block in blocks {
            let start = block.0 as usize * slot;
            for layer in self.k.iter().chain(&self.v) {
                for value in &layer[start..start + slot] {
                    out.extend_from_slice(&value.to_le_bytes());
                }
            }
        }
        out
    }

    /// Writes blocks read by [`read_blocks`](Self::read_blocks) from a pool of the same
    /// model: `blocks` pairs each block's index in `data` with the block it goes to here.
    /// Blocks `data` is too short for are left alone.
    pub fn write_blocks(&mut self, blocks: &[(usize, BlockId)], data: &[u8]) {
        let slot = BLOCK_SIZE * self.kv_dim;
        let block_bytes = self.block_bytes();
        for &(index, block) in blocks {
            let Some(bytes) = data.get(index * block_bytes..(index + 1) * block_bytes) else {
                continue;
            };
            let start = block.0 as usize * slot;
            let mut halves = bytes
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]));
            for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
                for (value, half) in layer[start..start + slot].iter_mut().zip(&mut halves) {
                    *value = half;
                }
            }
        }
    }

    fn offset(&self, table: &[BlockId], position: usize) -> usize {
        let block = table[position / BLOCK_SIZE].0 as usize;
        (block * BLOCK_SIZE + position % BLOCK_SIZE) * self.kv_dim
    }
}

/// One sequence's share of a forward pass.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    /// Its blocks, in order; must cover `start + tokens.len()` positions.
    pub table: &'a [BlockId],
    /// The position of the first new token (tokens before it are in the cache).
    pub start: usize,
    /// The tokens to compute.
    pub tokens: &'a [u32],
    /// Whether to return the logits of the last token.
    pub logits: bool,
}

/// Why a forward pass could not run (a scheduler bug or a bad token id, never the model's).
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// Positions past the context or the block table.
    #[error(
        "positions {start}..{end} exceed the context ({context}) or the block table ({slots} slots)"
    )]
    OutOfRange {
        /// First position.
        start: usize,
        /// One past the last.
        end: usize,
        /// The model's context.
        context: usize,
        /// Slots the table covers.
        slots: usize,
    },
    /// A block id past the pool.
    #[error("block {0} is outside the KV pool")]
    BadBlock(u32),
    /// A token id past the vocabulary.
    #[error("token {0} is outside the vocabulary")]
    BadToken(u32),
}

/// Where one row of the stacked batch belongs.
#[derive(Clone, Copy, Debug)]
struct RowPlace {
    seq: usize,
    position: usize,
}

impl Llama {
    /// Reads every weight of `file` and requantizes it to int8 blocks.
    pub fn load(file: &mut ModelFile) -> Result<Self, ModelError> {
        let config = file.config.clone();
        let tied = !file.has_tensor("output.weight");
        let path = file.path.display().to_string();
        let failed = |why: String| ModelError::Load {
            path: path.clone(),
            why,
        };
        let mut read = |name: &str| read_tensor(file, name);
        let matrix = |(values, rows, cols, format): (Vec<f32>, usize, usize, Format)| {
            Weights::quantize(format, &values, rows, cols).map_err(|e| failed(e.to_string()))
        };
        let vector = |(values, ..): (Vec<f32>, usize, usize, Format)| values;
        // Stacked projections share one format: the widest of their parts.
        let stack = |parts: Vec<(Vec<f32>, usize, usize, Format)>| {
            let format = if parts.iter().all(|p| p.3 == Format::Q4) {
                Format::Q4
            } else {
                Format::Q8
            };
            let parts = parts
                .into_iter()
                .map(|(v, r, c, _)| matrix((v, r, c, format)))
                .collect::<Result<Vec<_>, _>>()?;
            Weights::stack(parts).map_err(|e| failed(e.to_string()))
        };
        let embed = matrix(read("token_embd.weight")?)?;
        let norm = vector(read("output_norm.weight")?);
        let mut layers = Vec::with_capacity(config.layers);
        for l in 0..config.layers {
            let name = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: vector(read(&name("attn_norm"))?),
                qkv: stack(vec![
                    read(&name("attn_q"))?,
                    read(&name("attn_k"))?,
                    read(&name("attn_v"))?,
                ])?,
                wo: matrix(read(&name("attn_output"))?)?,
                ffn_norm: vector(read(&name("ffn_norm"))?),
                gate_up: stack(vec![read(&name("ffn_gate"))?, read(&name("ffn_up"))?])?,
                down: matrix(read(&name("ffn_down"))?)?,
            });
        }
        let output = if tied {
            None
        } else {
            Some(matrix(read("output.weight")?)?)
        };
        let (cos, sin) = rope_tables(&config);
        Ok(Self {
            config,
            embed,
            layers,
            norm,
            output,
            cos,
            sin,
        })
    }

    /// Bytes the weights take in memory.
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.qkv.bytes() + l.wo.bytes() + l.gate_up.bytes() + l.down.bytes())
            .sum();
        layers + self.embed.bytes() + self.output.as_ref().map_or(0, Weights::bytes)
    }

    /// Computes every sequence's new tokens, writing their K/V into `kv`. Returns, per
    /// sequence, the logits of its last token when it asked for them.
    pub fn forward(
        &self,
        cpu: &Cpu,
        kv: &mut PagedKv,
        seqs: &[SeqInput<'_>],
    ) -> Result<Vec<Option<Vec<f32>>>, ForwardError> {
        let c = &self.config;
        let mut places = Vec::new();
        for (s, seq) in seqs.iter().enumerate() {
            let end = seq.start + seq.tokens.len();
            let slots = seq.table.len() * BLOCK_SIZE;
            if end > c.context || end > slots {
                return Err(ForwardError::OutOfRange {
                    start: seq.start,
                    end,
                    context: c.context,
                    slots,
                });
            }
            if let Some(bad) = seq.table.iter().find(|b| b.0 as usize >= kv.blocks) {
                return Err(ForwardError::BadBlock(bad.0));
            }
            if let Some(bad) = seq.tokens.iter().find(|t| **t as usize >= c.vocab) {
                return Err(ForwardError::BadToken(*bad));
            }
            places.extend((seq.start..end).map(|position| RowPlace { seq: s, position }));
        }
        let n = places.len();
        if n == 0 {
            return Ok(vec![None; seqs.len()]);
        }
        let d = c.hidden;
        let q_dim = c.heads * c.head_dim;
        let kv_dim = c.kv_heads * c.head_dim;
        let qkv_dim = q_dim + 2 * kv_dim;
        let ffn = c.ffn;

        let mut x = vec![0.0f32; n * d];
        let mut row = 0;
        for seq in seqs {
            for token in seq.tokens {
                self.embed
                    .dequantize_row(*token as usize, &mut x[row * d..(row + 1) * d]);
                row += 1;
            }
        }
        let mut h = vec![0.0f32; n * d];
        let mut quantized = Q8Rows::new();
        let mut qkv = vec![0.0f32; n * qkv_dim];
        let mut attended = vec![0.0f32; n * q_dim];
        let mut projected = vec![0.0f32; n * d];
        let mut gate_up = vec![0.0f32; n * 2 * ffn];
        let mut act = vec![0.0f32; n * ffn];
        // Shapes are fixed by the model; a quantize error would be a loader bug.
        let quantize = |q: &mut Q8Rows, values: &[f32], cols: usize| {
            q.quantize(values, values.len() / cols, cols)
                .expect("model dimensions are multiples of the block size (checked at load)")
        };

        // Where each position of each sequence sits in the pools: the same in every layer.
        let seq_offsets: Vec<Vec<usize>> = seqs
            .iter()
            .map(|seq| {
                (0..seq.start + seq.tokens.len())
                    .map(|p| kv.offset(seq.table, p))
                    .collect()
            })
            .collect();
        for (l, layer) in self.layers.iter().enumerate() {
            rms_norm(&x, &layer.attn_norm, c.rms_eps, &mut h);
            quantize(&mut quantized, &h, d);
            cpu.matmul(&layer.qkv, &quantized, &mut qkv);
            for (r, place) in places.iter().enumerate() {
                let row = &mut qkv[r * qkv_dim..(r + 1) * qkv_dim];
                let (q, rest) = row.split_at_mut(q_dim);
                let (k, v) = rest.split_at_mut(kv_dim);
                self.rotate(q, place.position);
                self.rotate(k, place.position);
                let at = seq_offsets[place.seq][place.position];
                kv.k[l][at..at + kv_dim].convert_from_f32_slice(k);
                kv.v[l][at..at + kv_dim].convert_from_f32_slice(v);
            }
            let (k_pool, v_pool) = (&kv.k[l], &kv.v[l]);
            let shape = AttentionShape {
                heads: c.heads,
                kv_heads: c.kv_heads,
                head_dim: c.head_dim,
            };
            if n >= cpu.threads() {
                cpu.parallel_rows(&mut attended, q_dim, |r, out| {
                    let place = places[r];
                    let offsets = &seq_offsets[place.seq][..=place.position];
                    let q = &qkv[r * qkv_dim..r * qkv_dim + q_dim];
                    let mut scores = Vec::new();
                    cpu.attend(shape, q, offsets, k_pool, v_pool, &mut scores, out);
                });
            } else {
                // Fewer rows than threads (decode): split each row by KV-head group instead,
                // as attention of one group over the pools shifted to that group's head.
                let group = c.heads / c.kv_heads;
                let group_shape = AttentionShape {
                    heads: group,
                    kv_heads: 1,
                    head_dim: c.head_dim,
                };
                cpu.parallel_rows(&mut attended, group * c.head_dim, |i, out| {
                    let (r, g) = (i / c.kv_heads, i % c.kv_heads);
                    let place = places[r];
                    let shift = g * c.head_dim;
                    let offsets: Vec<usize> = seq_offsets[place.seq][..=place.position]
                        .iter()
                        .map(|o| o + shift)
                        .collect();
                    let q = &qkv[r * qkv_dim + g * group * c.head_dim..][..group * c.head_dim];
                    let mut scores = Vec::new();
                    cpu.attend(group_shape, q, &offsets, k_pool, v_pool, &mut scores, out);
                });
            }
            quantize(&mut quantized, &attended, q_dim);
            cpu.matmul(&layer.wo, &quantized, &mut projected);
            add(&mut x, &projected);

            rms_norm(&x, &layer.ffn_norm, c.rms_eps, &mut h);
            quantize(&mut quantized, &h, d);
            cpu.matmul(&layer.gate_up, &quantized, &mut gate_up);
            for (a, gu) in act.chunks_exact_mut(ffn).zip(gate_up.chunks_exact(2 * ffn)) {
                let (gate, up) = gu.split_at(ffn);
                for ((a, g), u) in a.iter_mut().zip(gate).zip(up) {
                    *a = g / (1.0 + (-g).exp()) * u;
                }
            }
            quantize(&mut quantized, &act, ffn);
            cpu.matmul(&layer.down, &quantized, &mut projected);
            add(&mut x, &projected);
        }

        // Logits only for the last row of each sequence that asked.
        let mut wanted = Vec::new();
        let mut last = 0;
        for (s, seq) in seqs.iter().enumerate() {
            last += seq.tokens.len();
            if seq.logits && !seq.tokens.is_empty() {
                wanted.push((s, last - 1));
            }
        }
        let mut result = vec![None; seqs.len()];
        if wanted.is_empty() {
            return Ok(result);
        }
        let mut last_rows = Vec::with_capacity(wanted.len() * d);
        for (_, r) in &wanted {
            last_rows.extend_from_slice(&x[r * d..(r + 1) * d]);
        }
        let mut normed = vec![0.0; last_rows.len()];
        rms_norm(&last_rows, &self.norm, c.rms_eps, &mut normed);
        quantize(&mut quantized, &normed, d);
        let head = self.output.as_ref().unwrap_or(&self.embed);
        let vocab = head.rows();
        let mut logits = vec![0.0; wanted.len() * vocab];
        cpu.matmul(head, &quantized, &mut logits);
        for (i, (s, _)) in wanted.into_iter().enumerate() {
            result[s] = Some(logits[i * vocab..(i + 1) * vocab].to_vec());
        }
        Ok(result)
    }

    /// Rotates each head of `x` by `position` (interleaved pairs, as GGUF llama weights are
    /// laid out).
    fn rotate(&self, x: &mut [f32], position: usize) {
        let half = self.config.head_dim / 2;
        let cos = &self.cos[position * half..(position + 1) * half];
        let sin = &self.sin[position * half..(position + 1) * half];
        for head in x.chunks_exact_mut(self.config.head_dim) {
            for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                let (a, b) = (pair[0], pair[1]);
                pair[0] = a * cos[i] - b * sin[i];
                pair[1] = a * sin[i] + b * cos[i];
            }
        }
    }
}

/// One tensor of `file` dequantized to f32, with its rows, columns and the block format its
/// precision calls for (4-bit files stay 4-bit, everything else becomes int8).
pub(super) fn read_tensor(
    file: &mut ModelFile,
    name: &str,
) -> Result<(Vec<f32>, usize, usize, Format), ModelError> {
    let path = file.path.display().to_string();
    let failed = |why: String| ModelError::Load {
        path: path.clone(),
        why,
    };
    let q = file.tensor(name)?;
    let format = match q.dtype() {
        GgmlDType::Q4_0 | GgmlDType::Q4_1 => Format::Q4,
        _ => Format::Q8,
    };
    let (rows, cols) = match q.shape().dims() {
        [n] => (1, *n),
        [rows, cols] => (*rows, *cols),
        dims => return Err(failed(format!("{name} has shape {dims:?}"))),
    };
    let values = q
        .dequantize(&Device::Cpu)
        .and_then(|t| t.flatten_all()?.to_vec1::<f32>())
        .map_err(|e| failed(format!("{name}: {e}")))?;
    Ok((values, rows, cols, format))
}

/// Row-wise RMS norm of `x` (rows of `weight.len()`) into `out`.
fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (x, out) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = x.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inverse = 1.0 / (mean + eps).sqrt();
        for ((o, v), w) in out.iter_mut().zip(x).zip(weight) {
            *o = v * inverse * w;
        }
    }
}

fn add(x: &mut [f32], y: &[f32]) {
    for (x, y) in x.iter_mut().zip(y) {
        *x += y;
    }
}

/// `[context, head_dim / 2]` cosine and sine tables.
pub(super) fn rope_tables(c: &LlamaConfig) -> (Vec<f32>, Vec<f32>) {
    let half = c.head_dim / 2;
    let inverse: Vec<f32> = (0..half)
        .map(|i| 1.0 / c.rope_base.powf(2.0 * i as f32 / c.head_dim as f32))
        .collect();
    let mut cos = Vec::with_capacity(c.context * half);
    let mut sin = Vec::with_capacity(c.context * half);
    for p in 0..c.context {
        for f in &inverse {
            let angle = p as f32 * f;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}
