//! Opening a GGUF file and checking, before any weight is read, that it is a llama model this
//! engine can run: the architecture, the hyper-parameters it needs, every tensor's type (Q4_0,
//! Q4_1, Q8_0, F16 or F32) and that every tensor's bytes are inside the file.

use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use candle_core::quantized::GgmlDType;
use candle_core::quantized::gguf_file::{Content, Value};

use super::ModelError;

/// The tensor types this engine runs.
pub const SUPPORTED_TYPES: [GgmlDType; 5] = [
    GgmlDType::Q4_0,
    GgmlDType::Q4_1,
    GgmlDType::Q8_0,
    GgmlDType::F16,
    GgmlDType::F32,
];

/// Reads a GGUF header from `reader` and checks it is a llama model this engine runs: the
/// architecture, the hyper-parameters, every tensor's type and that its bytes lie inside
/// what `reader` holds. `shown` names the file in errors. Any bytes give a header or a
/// [`ModelError`] (the `gguf_metadata` fuzz target's law).
pub fn check_header<R: Read + Seek>(
    reader: &mut R,
    shown: &str,
) -> Result<(Content, LlamaConfig), ModelError> {
    super::gguf_bounds::check_framing(reader).map_err(|why| ModelError::NotGguf {
        path: shown.to_owned(),
        why,
    })?;
    let content = Content::read(reader).map_err(|e| ModelError::NotGguf {
        path: shown.to_owned(),
        why: format!("{e}"),
    })?;
    let unsupported = |why: String| ModelError::Unsupported {
        path: shown.to_owned(),
        why,
    };
    let arch =
        meta_str(&content, "general.architecture").map_err(|why| unsupported(why.to_string()))?;
    if arch != "llama" {
        return Err(unsupported(format!(
            "architecture {arch:?} is not supported (only \"llama\")"
        )));
    }
    let config = llama_config(&content).map_err(unsupported)?;
    let file_len = reader
        .seek(SeekFrom::End(0))
        .map_err(|source| ModelError::Io {
            path: shown.to_owned(),
            source,
        })?;
    let mut names: Vec<_> = content.tensor_infos.keys().collect();
    names.sort();
    for name in names {
        let info = &content.tensor_infos[name];
        if !SUPPORTED_TYPES.contains(&info.ggml_dtype) {
            return Err(unsupported(format!(
                "tensor {name} has type {:?}; supported types are Q4_0, Q4_1, Q8_0, F16 and F32",
                info.ggml_dtype
            )));
        }
        // Offsets and sizes are the file's word: saturate rather than overflow.
        // (candle's elem_count multiplies unchecked: a crafted shape overflowed it).
        let elements = info
            .shape
            .dims()
            .iter()
            .fold(1usize, |count, &dim| count.saturating_mul(dim));
        let bytes =
            (elements / info.ggml_dtype.block_size()).saturating_mul(info.ggml_dtype.type_size());
        let end = content
            .tensor_data_offset
            .saturating_add(info.offset)
            .saturating_add(bytes as u64);
        if end > file_len {
            return Err(ModelError::NotGguf {
                path: shown.to_owned(),
                why: format!(
                    "truncated: tensor {name} ends at byte {end}, the file has {file_len}"
                ),
            });
        }
    }
    for required in [
        "token_embd.weight",
        "output_norm.weight",
        "blk.0.attn_q.weight",
    ] {
        if !content.tensor_infos.contains_key(required) {
            return Err(unsupported(format!("tensor {required} is missing")));
        }
    }
    Ok((content, config))
}

/// A llama model's shape, from the GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (fewer than `heads` with grouped-query attention).
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Feed-forward size.
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RMS-norm epsilon.
    pub rms_eps: f32,
    /// Longest context the model was trained for.
    pub context: usize,
}

/// An opened, checked GGUF file.
#[derive(Debug)]
pub struct ModelFile {
    /// Where it is.
    pub path: PathBuf,
    /// Its header: metadata and tensor directory.
    pub content: Content,
    /// The model's shape.
    pub config: LlamaConfig,
    reader: BufReader<File>,
}

impl ModelFile {
    /// Opens and checks `path`.
    pub fn open(path: &Path) -> Result<Self, ModelError> {
        let shown = path.display().to_string();
        let file = File::open(path).map_err(|source| ModelError::Io {
            path: shown.clone(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let (content, config) = check_header(&mut reader, &shown)?;
        Ok(Self {
            path: path.to_owned(),
            content,
            config,
            reader,
        })
    }

    /// Reads one tensor, as stored.
    pub fn tensor(&mut self, name: &str) -> Result<candle_core::quantized::QTensor, ModelError> {
        self.content
            .tensor(&mut self.reader, name, &candle_core::Device::Cpu)
            .map_err(|e| ModelError::Load {
                path: self.path.display().to_string(),
                why: format!("tensor {name}: {e}"),
            })
    }

    /// Whether a tensor is present.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }
}

fn meta<'a>(content: &'a Content, key: &str) -> Result<&'a Value, String> {
    content
        .metadata
        .get(key)
        .ok_or_else(|| format!("metadata key {key} is missing"))
}

/// A string metadata value.
pub fn meta_str<'a>(content: &'a Content, key: &str) -> Result<&'a str, String> {
    meta(content, key)?
        .to_string()
        .map(String::as_str)
        .map_err(|e| format!("metadata key {key}: {e}"))
}

fn meta_usize(content: &Content, key: &str) -> Result<usize, String> {
    let value = meta(content, key)?;
    value
        .to_u32()
        .map(|v| v as usize)
        .or_else(|_| value.to_u64().map(|v| v as usize))
        .map_err(|e| format!("metadata key {key}: {e}"))
}

fn meta_f32(content: &Content, key: &str) -> Result<f32, String> {
    meta(content, key)?
        .to_f32()
        .map_err(|e| format!("metadata key {key}: {e}"))
}

fn llama_config(content: &Content) -> Result<LlamaConfig, String> {
    let hidden = meta_usize(content, "llama.embedding_length")?;
    let heads = meta_usize(content, "llama.attention.head_count")?;
    let kv_heads = meta_usize(content, "llama.attention.head_count_kv").unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || hidden % heads != 0 || heads % kv_heads != 0 {
        return Err(format!(
            "inconsistent attention shape: hidden {hidden}, heads {heads}, kv heads {kv_heads}"
        ));
    }
    let vocab = match content.tensor_infos.get("token_embd.weight") {
        // A crafted file can give the table any rank (found by the gguf_metadata fuzz target).
        Some(info) => match info.shape.dims() {
            &[vocab, width] if width == hidden && vocab > 0 => vocab,
            dims => {
                return Err(format!(
                    "tensor token_embd.weight has shape {dims:?}, not [vocab, {hidden}]"
                ));
            }
        },
        None => return Err("tensor token_embd.weight is missing".into()),
    };
    let layers = meta_usize(content, "llama.block_count")?;
    if layers == 0 {
        return Err("llama.block_count is 0: a model needs at least one layer".into());
    }
    Ok(LlamaConfig {
        layers,
        hidden,
        heads,
        kv_heads,
        head_dim: hidden / heads,
        ffn: meta_usize(content, "llama.feed_forward_length")?,
        vocab,
        rope_base: meta_f32(content, "llama.rope.freq_base").unwrap_or(10_000.0),
        rms_eps: meta_f32(content, "llama.attention.layer_norm_rms_epsilon").unwrap_or(1e-5),
        context: meta_usize(content, "llama.context_length").unwrap_or(2048),
    })
}
