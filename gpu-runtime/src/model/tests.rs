//! Tests of the model path. Those that need SmolLM2 read it from `RINGMASTER_MODEL` or the
//! cache `cargo xtask model` fills; without it they skip with a note, unless
//! `RINGMASTER_REQUIRE_MODEL` is set (as in `tests/run`), which makes a missing model a failure.

use std::path::PathBuf;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use super::*;
use crate::tokenizer::Tokenizer;

/// Where `cargo xtask model` puts SmolLM2 unless `RINGMASTER_MODEL_DIR` says otherwise.
fn model_path() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("RINGMASTER_MODEL") {
        return Some(PathBuf::from(path));
    }
    let path = crate::model::default_model_path();
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("RINGMASTER_REQUIRE_MODEL").is_some() {
        panic!(
            "RINGMASTER_REQUIRE_MODEL is set but {} is missing: run `cargo xtask model`",
            path.display()
        );
    }
    eprintln!(
        "skipping: SmolLM2 is not at {} (run `cargo xtask model`)",
        path.display()
    );
    None
}

fn write_gguf(name: &str, metadata: &[(&str, Value)], tensors: &[(&str, QTensor)]) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "ringmaster-test-{}-{name}.gguf",
        std::process::id()
    ));
    let mut file = std::fs::File::create(&path).unwrap();
    let metadata: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (*k, v)).collect();
    let tensors: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (*k, v)).collect();
    gguf_file::write(&mut file, &metadata, &tensors).unwrap();
    path
}

fn llama_metadata(arch: &str) -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::String(arch.into())),
        ("llama.embedding_length", Value::U32(256)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.block_count", Value::U32(1)),
        ("llama.feed_forward_length", Value::U32(512)),
    ]
}

fn weights(dtype: GgmlDType) -> QTensor {
    let t = Tensor::zeros((8, 256), candle_core::DType::F32, &Device::Cpu).unwrap();
    QTensor::quantize(&t, dtype).unwrap()
}

fn refused(path: &std::path::Path) -> String {
    let err = ModelFile::open(path).unwrap_err().to_string();
    let _ = std::fs::remove_file(path);
    err
}

#[test]
fn another_architecture_is_refused_by_name() {
    let path = write_gguf(
        "gpt2",
        &llama_metadata("gpt2"),
        &[("token_embd.weight", weights(GgmlDType::F32))],
    );
    let err = refused(&path);
    assert!(
        err.contains("architecture \"gpt2\" is not supported"),
        "{err}"
    );
}

#[test]
fn an_unsupported_tensor_type_is_named() {
    let path = write_gguf(
        "q5k",
        &llama_metadata("llama"),
        &[
            ("token_embd.weight", weights(GgmlDType::F32)),
            ("blk.0.attn_q.weight", weights(GgmlDType::Q5K)),
        ],
    );
    let err = refused(&path);
    assert!(err.contains("blk.0.attn_q.weight has type Q5K"), "{err}");
}

#[test]
fn a_truncated_file_is_refused() {
    let path = write_gguf(
        "whole",
        &llama_metadata("llama"),
        &[
            ("token_embd.weight", weights(GgmlDType::Q8_0)),
            ("output_norm.weight", weights(GgmlDType::F32)),
            ("blk.0.attn_q.weight", weights(GgmlDType::Q4_1)),
        ],
    );
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 100]).unwrap();
    let err = refused(&path);
    assert!(err.contains("truncated"), "{err}");
    let path =
        std::env::temp_dir().join(format!("ringmaster-test-{}-short.gguf", std::process::id()));
    std::fs::write(&path, &bytes[..40]).unwrap();
    let err = refused(&path);
    assert!(err.contains("not a valid GGUF file"), "{err}");
    let path =
        std::env::temp_dir().join(format!("ringmaster-test-{}-text.gguf", std::process::id()));
    std::fs::write(&path, b"this is not a model").unwrap();
    let err = refused(&path);
    assert!(err.contains("not a valid GGUF file"), "{err}");
}

#[test]
fn smollm_tokens_match_the_reference_tokenizer() {
    let Some(path) = model_path() else { return };
    let file = ModelFile::open(&path).unwrap();
    let tokenizer = GgufTokenizer::from_file(&file).unwrap();
    // The reference (Hugging Face's tokenizer.json for SmolLM2): digits split one by one, no
    // prefix space.
    assert_eq!(
        tokenizer.encode("Hello world 12345, it's"),
        [19556, 905, 216, 33, 34, 35, 36, 37, 28, 357, 506]
    );
    let ids = tokenizer.encode("<|im_start|>user\nHi<|im_end|>");
    assert_eq!(ids[0], 1, "<|im_start|> is one special token");
    assert!(tokenizer.is_end_of_turn(*ids.last().unwrap()));
    let text: Vec<u8> = tokenizer
        .encode(" naïve café 42")
        .iter()
        .flat_map(|id| tokenizer.token_bytes(*id).into_owned())
        .collect();
    assert_eq!(String::from_utf8(text).unwrap(), " naïve café 42");
}

/// Greedy generation through the whole engine: paged blocks, chunked prefill, the scheduler.
async fn generate(handle: &crate::EngineHandle, question: &str, max_tokens: u32) -> (String, u32) {
    let mut stream = handle
        .submit(crate::GenerateRequest {
            request_id: "test".into(),
            system: None,
            messages: vec![crate::ChatMessage {
                role: crate::Role::User,
                text: question.into(),
            }],
            max_tokens,
            stop_sequences: Vec::new(),
            sampling: crate::SamplingParams {
                temperature: Some(0.0),
                ..Default::default()
            },
        })
        .unwrap();
    let mut text = String::new();
    let mut cached = 0;
    while let Some(event) = stream.next().await {
        match event {
            crate::GenerateEvent::Started { cached_tokens, .. } => cached = cached_tokens,
            crate::GenerateEvent::Token { text: piece } => text.push_str(&piece),
            crate::GenerateEvent::Finished { .. } => break,
        }
    }
    (text, cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm_answers_through_the_paged_engine_and_reuses_the_cached_prefix() {
    let Some(path) = model_path() else { return };
    let executor = ModelExecutor::load(&path, 512).unwrap();
    let mut config = crate::EngineConfig::simulated("smollm");
    config.kv_blocks = 512;
    config.max_running = 8;
    config.step_token_budget = 256;
    let handle = crate::EngineHandle::spawn_with_executor(config, executor).unwrap();
    let question = "What is the capital of France? Answer in one sentence.";
    let (first, cached_first) = generate(&handle, question, 24).await;
    assert_eq!(first.trim(), "The capital of France is Paris.");
    assert_eq!(cached_first, 0);
    // The same prompt again: its full blocks come from the prefix cache, the answer is equal.
    let (second, cached_second) = generate(&handle, question, 24).await;
    assert_eq!(second, first);
    assert!(cached_second >= 16, "cached {cached_second} tokens");
}

#[test]
fn the_paged_pass_equals_a_contiguous_one_token_for_token() {
    let Some(path) = model_path() else { return };
    let mut executor = ModelExecutor::load(&path, 64).unwrap();
    let tokenizer = executor.gguf_tokenizer().clone();
    let prompt = tokenizer.encode_chat(
        None,
        &[crate::ChatMessage {
            role: crate::Role::User,
            text: "Name three colours.".into(),
        }],
    );
    let steps = 12;
    // Contiguous: blocks 0, 1, 2, … in order; the whole prompt at once, then one token a step.
    let contiguous: Vec<crate::block::BlockId> = (0..8).map(crate::block::BlockId).collect();
    // Paged: the same sequence scattered over blocks in another order, the prompt in chunks of
    // 5 tokens (so chunks straddle block boundaries).
    let scattered: Vec<crate::block::BlockId> = [41, 7, 63, 12, 30, 2, 55, 19]
        .map(crate::block::BlockId)
        .to_vec();
    let run = |executor: &mut ModelExecutor, table: &[crate::block::BlockId], chunk: usize| {
        let model = &executor.model;
        let kv = &mut executor.kv;
        let mut tokens = prompt.clone();
        let mut done = 0usize;
        let mut out = Vec::new();
        while out.len() < steps {
            let end = done.saturating_add(chunk).min(tokens.len());
            let logits = model
                .forward(kv, table, done, &tokens[done..end], end == tokens.len())
                .unwrap();
            done = end;
            if let Some(logits) = logits {
                let next = sampler::argmax(&logits);
                out.push(next);
                tokens.push(next);
            }
        }
        out
    };
    let a = run(&mut executor, &contiguous, usize::MAX);
    let b = run(&mut executor, &scattered, 5);
    assert_eq!(a, b);
    let text: Vec<u8> = a
        .iter()
        .flat_map(|id| tokenizer.token_bytes(*id).into_owned())
        .collect();
    assert!(!String::from_utf8_lossy(&text).trim().is_empty());
}
