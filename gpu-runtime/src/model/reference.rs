//! Test-only: an independent llama forward pass on candle's F32 tensor ops, the oracle the
//! engine's own int8 pass ([`super::llama`]) is checked against.
//!
//! Weights are dequantized to F32 at load and every product goes through candle (the `gemm`
//! crate), so it shares no kernel with the engine; only the GGUF reading is common. K and V live in one pool per
//! layer laid out `[block, slot, kv_head, head_dim]`; a token at position `p` of a sequence
//! writes slot `p % BLOCK_SIZE` of block `block_table[p / BLOCK_SIZE]`, and attention gathers
//! positions `0..=p` through the same table, so blocks shared by a cached prefix are read by
//! every sequence that holds them and never recomputed.

use candle_core::{DType, Device, Tensor};

use super::ModelError;
use super::gguf::{LlamaConfig, ModelFile};
use crate::block::{BLOCK_SIZE, BlockId};

/// One transformer block's weights (`[out, in]` matrices).
#[derive(Debug)]
struct Layer {
    attn_norm: Tensor,
    wq: Tensor,
    wk: Tensor,
    wv: Tensor,
    wo: Tensor,
    ffn_norm: Tensor,
    w_gate: Tensor,
    w_up: Tensor,
    w_down: Tensor,
}

/// The model with F32 weights.
#[derive(Debug)]
pub struct Reference {
    /// Its shape.
    pub config: LlamaConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    /// The output head (the embedding matrix when the file ties them).
    output: Tensor,
    cos: Tensor,
    sin: Tensor,
}

/// The paged K/V pool: per layer, `blocks × BLOCK_SIZE` slots of `kv_heads × head_dim` floats.
#[derive(Debug)]
pub struct ReferenceKv {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    kv_dim: usize,
}

impl ReferenceKv {
    /// A pool of `blocks` blocks for `config`. Its pages are committed as they are written.
    pub fn new(config: &LlamaConfig, blocks: usize) -> Self {
        let kv_dim = config.kv_heads * config.head_dim;
        let floats = blocks * BLOCK_SIZE * kv_dim;
        Self {
            k: (0..config.layers).map(|_| vec![0.0; floats]).collect(),
            v: (0..config.layers).map(|_| vec![0.0; floats]).collect(),
            kv_dim,
        }
    }

    fn offset(&self, table: &[BlockId], position: usize) -> usize {
        let block = table[position / BLOCK_SIZE].0 as usize;
        (block * BLOCK_SIZE + position % BLOCK_SIZE) * self.kv_dim
    }
}

type Result<T> = candle_core::Result<T>;

impl Reference {
    /// Reads and dequantizes every weight of `file`.
    pub fn load(file: &mut ModelFile) -> std::result::Result<Self, ModelError> {
        let config = file.config.clone();
        let path = file.path.display().to_string();
        let load_err = |e: candle_core::Error| ModelError::Load {
            path: path.clone(),
            why: e.to_string(),
        };
        let tied = !file.has_tensor("output.weight");
        let mut get = |name: &str| -> std::result::Result<Tensor, ModelError> {
            let q = file.tensor(name)?;
            q.dequantize(&Device::Cpu).map_err(load_err)
        };
        let embed = get("token_embd.weight")?;
        let norm = get("output_norm.weight")?;
        let mut layers = Vec::with_capacity(config.layers);
        for l in 0..config.layers {
            let p = |s: &str| format!("blk.{l}.{s}.weight");
            layers.push(Layer {
                attn_norm: get(&p("attn_norm"))?,
                wq: get(&p("attn_q"))?,
                wk: get(&p("attn_k"))?,
                wv: get(&p("attn_v"))?,
                wo: get(&p("attn_output"))?,
                ffn_norm: get(&p("ffn_norm"))?,
                w_gate: get(&p("ffn_gate"))?,
                w_up: get(&p("ffn_up"))?,
                w_down: get(&p("ffn_down"))?,
            });
        }
        let output = if tied {
            embed.clone()
        } else {
            get("output.weight")?
        };
        let (cos, sin) = rope_tables(&config).map_err(|e| ModelError::Load {
            path: path.clone(),
            why: e.to_string(),
        })?;
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

    /// Computes `tokens` at positions `start..start + tokens.len()` of a sequence whose KV is
    /// in `table`, writing their K/V into `kv`. Returns the logits of the last token when
    /// `logits` is set.
    pub fn forward(
        &self,
        kv: &mut ReferenceKv,
        table: &[BlockId],
        start: usize,
        tokens: &[u32],
        logits: bool,
    ) -> Result<Option<Vec<f32>>> {
        let c = &self.config;
        let t = tokens.len();
        let total = start + t;
        if t == 0 || total > c.context || total > table.len() * BLOCK_SIZE {
            candle_core::bail!(
                "positions {start}..{total} exceed the context ({}) or the block table ({} slots)",
                c.context,
                table.len() * BLOCK_SIZE
            );
        }
        let ids = Tensor::new(tokens, &Device::Cpu)?;
        let mut x = self.embed.index_select(&ids, 0)?;
        let cos = self.cos.narrow(0, start, t)?;
        let sin = self.sin.narrow(0, start, t)?;
        let mask = causal_mask(start, t)?;
        let group = c.heads / c.kv_heads;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        for (l, layer) in self.layers.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &layer.attn_norm, c.rms_eps)?;
            let q = h
                .matmul(&layer.wq.t()?)?
                .reshape((t, c.heads, c.head_dim))?
                .transpose(0, 1)?
                .unsqueeze(0)?
                .contiguous()?;
            let k = h
                .matmul(&layer.wk.t()?)?
                .reshape((t, c.kv_heads, c.head_dim))?
                .transpose(0, 1)?
                .unsqueeze(0)?
                .contiguous()?;
            let v = h.matmul(&layer.wv.t()?)?;
            let q = candle_nn::rotary_emb::rope_i(&q, &cos, &sin)?.squeeze(0)?;
            let k = candle_nn::rotary_emb::rope_i(&k, &cos, &sin)?
                .squeeze(0)?
                .transpose(0, 1)?
                .contiguous()?;
            // Write the new tokens' K/V into their slots.
            let k_new = k.flatten_all()?.to_vec1::<f32>()?;
            let v_new = v.flatten_all()?.to_vec1::<f32>()?;
            for i in 0..t {
                let at = kv.offset(table, start + i);
                let from = i * kv.kv_dim;
                kv.k[l][at..at + kv.kv_dim].copy_from_slice(&k_new[from..from + kv.kv_dim]);
                kv.v[l][at..at + kv.kv_dim].copy_from_slice(&v_new[from..from + kv.kv_dim]);
            }
            // Gather positions 0..total through the block table.
            let mut k_all = Vec::with_capacity(total * kv.kv_dim);
            let mut v_all = Vec::with_capacity(total * kv.kv_dim);
            for p in 0..total {
                let at = kv.offset(table, p);
                k_all.extend_from_slice(&kv.k[l][at..at + kv.kv_dim]);
                v_all.extend_from_slice(&kv.v[l][at..at + kv.kv_dim]);
            }
            let expand = |data: Vec<f32>| -> Result<Tensor> {
                Tensor::from_vec(data, (total, c.kv_heads, c.head_dim), &Device::Cpu)?
                    .transpose(0, 1)?
                    .unsqueeze(1)?
                    .expand((c.kv_heads, group, total, c.head_dim))?
                    .reshape((c.heads, total, c.head_dim))
            };
            let k_all = expand(k_all)?;
            let v_all = expand(v_all)?;
            let scores = (q.matmul(&k_all.t()?)? * scale)?.broadcast_add(&mask)?;
            let probs = candle_nn::ops::softmax_last_dim(&scores)?;
            let attended = probs
                .matmul(&v_all)?
                .transpose(0, 1)?
                .reshape((t, c.heads * c.head_dim))?;
            x = (x + attended.matmul(&layer.wo.t()?)?)?;
            let h = candle_nn::ops::rms_norm(&x, &layer.ffn_norm, c.rms_eps)?;
            let gate = candle_nn::ops::silu(&h.matmul(&layer.w_gate.t()?)?)?;
            let up = h.matmul(&layer.w_up.t()?)?;
            x = (x + (gate * up)?.matmul(&layer.w_down.t()?)?)?;
        }
        if !logits {
            return Ok(None);
        }
        let last = x.narrow(0, t - 1, 1)?;
        let last = candle_nn::ops::rms_norm(&last, &self.norm, c.rms_eps)?;
        let out = last.matmul(&self.output.t()?)?.squeeze(0)?;
        Ok(Some(out.to_dtype(DType::F32)?.to_vec1::<f32>()?))
    }
}

/// `[context, head_dim / 2]` cosine and sine tables.
fn rope_tables(c: &LlamaConfig) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let inv: Vec<f32> = (0..half)
        .map(|i| 1.0 / c.rope_base.powf(2.0 * i as f32 / c.head_dim as f32))
        .collect();
    let mut angles = Vec::with_capacity(c.context * half);
    for p in 0..c.context {
        angles.extend(inv.iter().map(|f| p as f32 * f));
    }
    let angles = Tensor::from_vec(angles, (c.context, half), &Device::Cpu)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// `[t, start + t]`: 0 where query `i` (position `start + i`) may attend, −∞ after it.
fn causal_mask(start: usize, t: usize) -> Result<Tensor> {
    let total = start + t;
    let data: Vec<f32> = (0..t)
        .flat_map(|i| {
            (0..total).map(move |j| {
                if j <= start + i {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
        })
        .collect();
    Tensor::from_vec(data, (t, total), &Device::Cpu)?.unsqueeze(0)
}
