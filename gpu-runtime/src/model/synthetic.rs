//! A real model's shapes without its weights, and a model of those shapes with random weights:
//! for timing on a machine the model cannot be carried to (a lent GPU takes 64 MiB per call;
//! SmolLM2-135M is 98 MB). Step times do not depend on the weights' values once every stream's
//! length is fixed (`ignore_eos`), so a model of the real shapes with the real tokenizer and
//! chat template times as the real one does.
//!
//! [`write_shapes`] keeps a GGUF's metadata (tokenizer and template included) and records the
//! tensor shapes it would need; [`write_random`] turns that into a loadable llama GGUF with
//! pseudo-random F16 weights. It must not be used for anything that reads the model's answers.

use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{self, Content, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::ModelError;
use super::gguf::ModelFile;

/// The metadata key holding the vocabulary size (a shapes file has no embedding tensor).
const VOCAB_KEY: &str = "ringmaster.shapes.vocab";
/// The metadata key saying the output head is its own tensor (not tied to the embedding).
const UNTIED_KEY: &str = "ringmaster.shapes.untied";

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io {
        path: path.display().to_string(),
        source,
    }
}

fn load(path: &Path, why: impl std::fmt::Display) -> ModelError {
    ModelError::Load {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

/// Writes `model`'s metadata and shapes, without its tensors, to `out` (SmolLM2-135M: ~1 MB).
pub fn write_shapes(model: &Path, out: &Path) -> Result<(), ModelError> {
    let file = ModelFile::open(model)?;
    let untied = file.has_tensor("output.weight");
    let mut metadata: Vec<(String, Value)> = file
        .content
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.push((VOCAB_KEY.into(), Value::U64(file.config.vocab as u64)));
    metadata.push((UNTIED_KEY.into(), Value::Bool(untied)));
    metadata.sort_by(|a, b| a.0.cmp(&b.0));
    let refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut writer = File::create(out).map_err(io(out))?;
    gguf_file::write(&mut writer, &refs, &[]).map_err(|e| load(out, e))
}

/// Writes a llama GGUF of `shapes`' shapes (from [`write_shapes`]) with pseudo-random F16
/// weights drawn from `seed` (matrices uniform in ±0.1, norms 1) to `out`.
pub fn write_random(shapes: &Path, out: &Path, seed: u64) -> Result<(), ModelError> {
    let mut reader = BufReader::new(File::open(shapes).map_err(io(shapes))?);
    let content = Content::read(&mut reader).map_err(|e| load(shapes, e))?;
    let number = |key: &str| -> Result<usize, ModelError> {
        let value = content
            .metadata
            .get(key)
            .ok_or_else(|| load(shapes, format!("metadata key {key} is missing")))?;
        value
            .to_u32()
            .map(|v| v as usize)
            .or_else(|_| value.to_u64().map(|v| v as usize))
            .map_err(|e| load(shapes, format!("{key}: {e}")))
    };
    let hidden = number("llama.embedding_length")?;
    let heads = number("llama.attention.head_count")?;
    let kv_heads = number("llama.attention.head_count_kv").unwrap_or(heads);
    let ffn = number("llama.feed_forward_length")?;
    let layers = number("llama.block_count")?;
    let vocab = number(VOCAB_KEY)?;
    if heads == 0 || kv_heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(load(shapes, "inconsistent attention shape"));
    }
    let kv_dim = hidden / heads * kv_heads;
    let untied = content
        .metadata
        .get(UNTIED_KEY)
        .and_then(|v| v.to_bool().ok())
        .unwrap_or(false);

    let mut state = seed | 1;
    let mut matrix = |rows: usize, cols: usize| -> Result<QTensor, ModelError> {
        let values: Vec<f32> = (0..rows * cols)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.2
            })
            .collect();
        let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).map_err(|e| load(out, e))?;
        QTensor::quantize(&t, GgmlDType::F16).map_err(|e| load(out, e))
    };
    let ones = |n: usize| -> Result<QTensor, ModelError> {
        let t =
            Tensor::ones((n,), candle_core::DType::F32, &Device::Cpu).map_err(|e| load(out, e))?;
        QTensor::quantize(&t, GgmlDType::F32).map_err(|e| load(out, e))
    };
    let mut tensors = vec![
        ("token_embd.weight".to_owned(), matrix(vocab, hidden)?),
        ("output_norm.weight".to_owned(), ones(hidden)?),
    ];
    if untied {
        tensors.push(("output.weight".to_owned(), matrix(vocab, hidden)?));
    }
    for l in 0..layers {
        let name = |s: &str| format!("blk.{l}.{s}.weight");
        tensors.push((name("attn_norm"), ones(hidden)?));
        tensors.push((name("attn_q"), matrix(hidden, hidden)?));
        tensors.push((name("attn_k"), matrix(kv_dim, hidden)?));
        tensors.push((name("attn_v"), matrix(kv_dim, hidden)?));
        tensors.push((name("attn_output"), matrix(hidden, hidden)?));
        tensors.push((name("ffn_norm"), ones(hidden)?));
        tensors.push((name("ffn_gate"), matrix(ffn, hidden)?));
        tensors.push((name("ffn_up"), matrix(ffn, hidden)?));
        tensors.push((name("ffn_down"), matrix(hidden, ffn)?));
    }
    let mut metadata: Vec<(&str, &Value)> = content
        .metadata
        .iter()
        .filter(|(k, _)| !k.starts_with("ringmaster.shapes."))
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    metadata.sort_by(|a, b| a.0.cmp(b.0));
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut writer = File::create(out).map_err(io(out))?;
    gguf_file::write(&mut writer, &metadata, &tensors).map_err(|e| load(out, e))
}

/// A model of a shapes file's shapes with random weights, in a temporary file removed when
/// this is dropped (the benches' model where the real one could not be carried).
#[derive(Debug)]
pub struct TemporaryModel {
    path: PathBuf,
}

impl TemporaryModel {
    /// Writes random weights of `shapes`' shapes (seed 42) to a file in the temporary folder.
    pub fn from_shapes(shapes: &Path) -> Result<Self, ModelError> {
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("ringmaster-random-{}-{n}.gguf", std::process::id()));
        let model = Self { path };
        write_random(shapes, &model.path, 42)?;
        Ok(model)
    }

    /// Where it is.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TemporaryModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The model a bench times: random weights of `RINGMASTER_BENCH_SHAPES`'s shapes when that is
/// set, else `RINGMASTER_MODEL`, else the model cache's. Keep the [`TemporaryModel`] until the
/// bench ends (its file goes with it).
pub fn bench_model() -> Result<(PathBuf, Option<TemporaryModel>), ModelError> {
    if let Some(shapes) = std::env::var_os("RINGMASTER_BENCH_SHAPES") {
        let model = TemporaryModel::from_shapes(Path::new(&shapes))?;
        return Ok((model.path().to_owned(), Some(model)));
    }
    let path = std::env::var_os("RINGMASTER_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(super::default_model_path);
    Ok((path, None))
}
