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

fn options(kv_blocks: u32) -> ModelOptions {
    ModelOptions {
        kv_blocks,
        threads: 1,
        isa: None,
    }
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
fn an_embedding_table_of_the_wrong_shape_is_refused() {
    // The gguf_metadata fuzz target's first finding: a one-dimensional table panicked.
    for (name, dims) in [("embed-1d", vec![256]), ("embed-narrow", vec![8, 128])] {
        let table = Tensor::zeros(dims.as_slice(), candle_core::DType::F32, &Device::Cpu).unwrap();
        let path = write_gguf(
            name,
            &llama_metadata("llama"),
            &[(
                "token_embd.weight",
                QTensor::quantize(&table, GgmlDType::F32).unwrap(),
            )],
        );
        let err = refused(&path);
        assert!(err.contains("token_embd.weight has shape"), "{err}");
    }
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
fn a_bpe_tokenizer_rebuilt_from_its_spec_tokenizes_alike() {
    let Some(path) = model_path() else { return };
    let file = ModelFile::open(&path).unwrap();
    let tokenizer = GgufTokenizer::from_file(&file).unwrap();
    let spec = tokenizer.spec();
    let json = serde_json::to_vec(&spec).unwrap();
    let back: crate::TokenizerSpec = serde_json::from_slice(&json).unwrap();
    assert_eq!(back.fingerprint(), spec.fingerprint());
    assert_ne!(spec.fingerprint(), crate::TokenizerSpec::Sim.fingerprint());
    let rebuilt = back.build().unwrap();
    let messages = [crate::ChatMessage {
        role: crate::Role::User,
        text: "Hello world 12345, it's <|im_end|> déjà vu 🦀".into(),
        ..Default::default()
    }];
    for system in [None, Some("You are terse.")] {
        assert_eq!(
            rebuilt.encode_chat(system, &messages),
            tokenizer.encode_chat(system, &messages)
        );
    }
    for id in [0, 1, 2, 300, 49151] {
        assert_eq!(rebuilt.token_bytes(id), tokenizer.token_bytes(id));
        assert_eq!(rebuilt.is_end_of_turn(id), tokenizer.is_end_of_turn(id));
    }
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

/// A greedy request for `question`.
fn greedy_request(question: &str, max_tokens: u32) -> crate::GenerateRequest {
    crate::GenerateRequest {
        request_id: "test".into(),
        system: None,
        messages: vec![crate::ChatMessage {
            role: crate::Role::User,
            text: question.into(),
            ..Default::default()
        }],
        max_tokens,
        stop_sequences: Vec::new(),
        sampling: crate::SamplingParams {
            temperature: Some(0.0),
            ..Default::default()
        },
        prompt: None,
        priority: 0,
        tools: None,
        effort: None,
        output_format: None,
    }
}

/// A stream's text and cached prompt tokens.
async fn read(mut stream: crate::GenerationStream) -> (String, u32) {
    let mut text = String::new();
    let mut cached = 0;
    while let Some(event) = stream.next().await {
        match event {
            crate::GenerateEvent::Started { cached_tokens, .. } => cached = cached_tokens,
            crate::GenerateEvent::Token { text: piece } => text.push_str(&piece),
            crate::GenerateEvent::Finished { .. } => break,
            crate::GenerateEvent::Failed { message } => panic!("a local engine failed: {message}"),
            crate::GenerateEvent::ToolCall { .. } => panic!("a local engine called a tool"),
            crate::GenerateEvent::Reasoning { .. } => panic!("a local engine reasoned apart"),
        }
    }
    (text, cached)
}

/// Greedy generation through the whole engine: paged blocks, chunked prefill, the scheduler.
async fn generate(handle: &crate::EngineHandle, question: &str, max_tokens: u32) -> (String, u32) {
    read(handle.submit(greedy_request(question, max_tokens)).unwrap()).await
}

fn smollm_engine(path: &std::path::Path, name: &str) -> crate::EngineHandle {
    let executor = ModelExecutor::load(path, &options(512)).unwrap();
    let mut config = crate::EngineConfig::simulated(name);
    config.kv_blocks = 512;
    config.max_running = 8;
    config.step_token_budget = 256;
    crate::EngineHandle::spawn_with_executor(config, executor).unwrap()
}

/// A real model's shapes carried without its weights, and random weights of those shapes that
/// load and run with the real tokenizer (the device run's model for timing).
#[test]
fn a_model_of_smollm_shapes_with_random_weights_loads_and_runs() {
    let Some(path) = model_path() else { return };
    let dir = std::env::temp_dir().join(format!("ringmaster-shapes-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shapes = dir.join("shapes.gguf");
    super::synthetic::write_shapes(&path, &shapes).unwrap();
    let size = std::fs::metadata(&shapes).unwrap().len();
    assert!(size < 4_000_000, "{size} bytes of metadata");
    // Narrow the shapes (the real 135M weights take long in a debug build), keep the tokenizer.
    let mut reader = std::io::BufReader::new(std::fs::File::open(&shapes).unwrap());
    let content = gguf_file::Content::read(&mut reader).unwrap();
    assert_eq!(
        content.metadata["ringmaster.shapes.vocab"]
            .to_u64()
            .unwrap(),
        49_152
    );
    let mut metadata: Vec<(String, Value)> = content.metadata.into_iter().collect();
    for (key, value) in &mut metadata {
        match key.as_str() {
            "llama.embedding_length" => *value = Value::U32(64),
            "llama.attention.head_count" => *value = Value::U32(4),
            "llama.attention.head_count_kv" => *value = Value::U32(2),
            "llama.feed_forward_length" => *value = Value::U32(128),
            "llama.block_count" => *value = Value::U32(2),
            _ => {}
        }
    }
    let narrow = dir.join("narrow.gguf");
    let refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    gguf_file::write(&mut std::fs::File::create(&narrow).unwrap(), &refs, &[]).unwrap();
    let model = dir.join("random.gguf");
    super::synthetic::write_random(&narrow, &model, 7).unwrap();
    let mut executor = ModelExecutor::load(&model, &options(8)).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        (
            executor.model().config.hidden,
            executor.model().config.layers
        ),
        (64, 2)
    );
    assert_eq!(executor.model().config.vocab, 49_152);
    let prompt = chat(&executor.gguf_tokenizer().clone(), "Hello");
    let table: Vec<crate::block::BlockId> = (0..4).map(crate::block::BlockId).collect();
    let logits = executor
        .forward(&[llama::SeqInput {
            table: &table,
            start: 0,
            tokens: &prompt,
            logits: true,
        }])
        .unwrap()
        .remove(0)
        .unwrap();
    assert_eq!(logits.len(), 49_152);
    assert!(logits.iter().all(|v| v.is_finite()));
}

/// The device bench's harness on the CPU executor: the dry run of every figure the GPU run
/// prints (`benches/streams.rs`), with the GPU profile's step sizing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_streams_harness_measures_smollm_on_the_cpu() {
    let Some(path) = model_path() else { return };
    let executor = ModelExecutor::load(&path, &options(128)).unwrap();
    let mut config = crate::EngineConfig {
        max_running: 2,
        ..crate::EngineConfig::simulated("harness")
    }
    .sized_for_gpu();
    config.kv_blocks = 128;
    let engine = crate::EngineHandle::spawn_with_executor(config, executor).unwrap();
    let run = crate::measure::StreamsRun {
        streams: 3,
        max_tokens: 4,
        temperature: 1.0,
        salt: 0,
    };
    let f = crate::measure::run_streams(&engine, &run).await.unwrap();
    assert_eq!(f.tokens, 12, "{f:?}");
    assert!(f.per_stream_tok_s_min > 0.0 && f.ttft_p99_ms > 0.0, "{f:?}");
    // Three prompts and two places: the first step left one waiting and was filled.
    assert!(f.fill_under_load.is_some_and(|v| v > 0.0), "{f:?}");
    assert_eq!(f.decode_occupancy, Some(1.0));
    assert!(f.busy_fraction > 0.0 && f.mean_step_ms > 0.0, "{f:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm_decodes_from_the_kv_blocks_another_engine_prefilled_as_it_would_whole() {
    let Some(path) = model_path() else { return };
    let (prefill, decode, whole) = (
        smollm_engine(&path, "prefill"),
        smollm_engine(&path, "decode"),
        smollm_engine(&path, "whole"),
    );
    let question = "Name the planets of the solar system in order from the sun, one a line, \
                    and say for each one whether it has rings.";
    let (reference, _) = generate(&whole, question, 40).await;
    let (stream, handoff) = prefill
        .submit_prefill(greedy_request(question, 40))
        .unwrap();
    let (first, _) = read(stream).await;
    let handoff = handoff.await.unwrap();
    assert!(handoff.blocks.len() >= 2, "{} blocks", handoff.blocks.len());
    let crate::KvContents::Bytes { block_bytes, data } = &handoff.contents else {
        panic!("a model hands over its blocks' contents");
    };
    assert_eq!(data.len(), handoff.blocks.len() * block_bytes);
    let (decoded, cached) = read(
        decode
            .submit_with_kv(greedy_request(question, 40), handoff.clone())
            .unwrap(),
    )
    .await;
    assert_eq!(
        decoded, reference,
        "the same tokens at temperature 0 as served whole"
    );
    assert!(
        reference.starts_with(&first),
        "{first:?} leads {reference:?}"
    );
    assert!(
        cached as usize >= (handoff.blocks.len() - 1) * crate::BLOCK_SIZE,
        "cached {cached}"
    );
    // The decode engine keeps the blocks it received.
    assert_eq!(
        decode.cached_prefix_blocks(&handoff.hashes()),
        handoff.blocks.len()
    );
    let (again, cached_again) = generate(&decode, question, 40).await;
    assert_eq!(again, reference);
    assert!(cached_again >= cached);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm_answers_through_the_paged_engine_and_reuses_the_cached_prefix() {
    let Some(path) = model_path() else { return };
    let executor = ModelExecutor::load(&path, &options(512)).unwrap();
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

#[tokio::test]
async fn a_request_past_the_context_or_the_kv_pool_is_refused_at_submit() {
    let Some(path) = model_path() else { return };
    let executor = ModelExecutor::load(&path, &options(64)).unwrap();
    let mut config = crate::EngineConfig::simulated("smollm");
    config.kv_blocks = 64;
    let handle = crate::EngineHandle::spawn_with_executor(config, executor).unwrap();
    let ask = |max_tokens| crate::GenerateRequest {
        request_id: "too-long".into(),
        system: None,
        messages: vec![crate::ChatMessage {
            role: crate::Role::User,
            text: "Hello".into(),
            ..Default::default()
        }],
        max_tokens,
        stop_sequences: Vec::new(),
        sampling: Default::default(),
        prompt: None,
        priority: 0,
        tools: None,
        effort: None,
        output_format: None,
    };
    // Past SmolLM2's 8192-token context.
    let err = handle.submit(ask(9000)).err().unwrap();
    assert!(
        matches!(
            err,
            crate::EngineError::ContextTooLong {
                context_tokens: 8192,
                ..
            }
        ),
        "{err}"
    );
    // Within the context but past the 64-block (1024-token) pool: it could never fit.
    let err = handle.submit(ask(2000)).err().unwrap();
    assert!(
        matches!(err, crate::EngineError::PromptTooLong { .. }),
        "{err}"
    );
    assert!(handle.submit(ask(100)).is_ok());
}

#[test]
fn the_paged_pass_equals_a_contiguous_one_token_for_token() {
    let Some(path) = model_path() else { return };
    let mut executor = ModelExecutor::load(&path, &options(64)).unwrap();
    let tokenizer = executor.gguf_tokenizer().clone();
    let prompt = tokenizer.encode_chat(
        None,
        &[crate::ChatMessage {
            role: crate::Role::User,
            text: "Name three colours.".into(),
            ..Default::default()
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
        let mut tokens = prompt.clone();
        let mut done = 0usize;
        let mut out = Vec::new();
        while out.len() < steps {
            let end = done.saturating_add(chunk).min(tokens.len());
            let input = llama::SeqInput {
                table,
                start: done,
                tokens: &tokens[done..end],
                logits: end == tokens.len(),
            };
            let logits = executor
                .model
                .forward(&executor.cpu, &mut executor.kv, &[input])
                .unwrap()
                .remove(0);
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

fn chat(tokenizer: &GgufTokenizer, text: &str) -> Vec<u32> {
    tokenizer.encode_chat(
        None,
        &[crate::ChatMessage {
            role: crate::Role::User,
            text: text.into(),
            ..Default::default()
        }],
    )
}

/// Greedy tokens from the engine's own pass, in one go per step.
fn greedy(executor: &mut ModelExecutor, prompt: &[u32], steps: usize) -> Vec<u32> {
    let table: Vec<crate::block::BlockId> = (0..16).map(crate::block::BlockId).collect();
    let mut tokens = prompt.to_vec();
    let mut done = 0;
    let mut out = Vec::new();
    while out.len() < steps {
        let input = llama::SeqInput {
            table: &table,
            start: done,
            tokens: &tokens[done..],
            logits: true,
        };
        let logits = executor
            .model
            .forward(&executor.cpu, &mut executor.kv, &[input])
            .unwrap()
            .remove(0)
            .unwrap();
        done = tokens.len();
        let next = sampler::argmax(&logits);
        out.push(next);
        tokens.push(next);
    }
    out
}

#[test]
fn the_int8_engine_agrees_with_an_f32_reference_built_on_candle() {
    let Some(path) = model_path() else { return };
    let mut executor = ModelExecutor::load(&path, &options(16)).unwrap();
    let tokenizer = executor.gguf_tokenizer().clone();
    let mut file = ModelFile::open(&path).unwrap();
    let reference = reference::Reference::load(&mut file).unwrap();
    let mut reference_kv = reference::ReferenceKv::new(&reference.config, 16);
    let table: Vec<crate::block::BlockId> = (0..16).map(crate::block::BlockId).collect();
    let prompt = chat(
        &tokenizer,
        "What is the capital of France? Answer in one sentence.",
    );
    // The prompt's logits: the same top token, and close as vectors.
    let ours = executor
        .model
        .forward(
            &executor.cpu,
            &mut executor.kv,
            &[llama::SeqInput {
                table: &table,
                start: 0,
                tokens: &prompt,
                logits: true,
            }],
        )
        .unwrap()
        .remove(0)
        .unwrap();
    let theirs = reference
        .forward(&mut reference_kv, &table, 0, &prompt, true)
        .unwrap()
        .unwrap();
    assert_eq!(sampler::argmax(&ours), sampler::argmax(&theirs));
    let dot: f64 = ours
        .iter()
        .zip(&theirs)
        .map(|(a, b)| f64::from(*a) * f64::from(*b))
        .sum();
    let norm = |v: &[f32]| v.iter().map(|a| f64::from(*a).powi(2)).sum::<f64>().sqrt();
    let cosine = dot / (norm(&ours) * norm(&theirs));
    assert!(cosine > 0.995, "cosine {cosine}");
    // Greedy continuations agree token for token.
    let mut tokens = prompt.clone();
    let mut expected = Vec::new();
    let mut done = 0;
    while expected.len() < 10 {
        let logits = reference
            .forward(&mut reference_kv, &table, done, &tokens[done..], true)
            .unwrap()
            .unwrap();
        done = tokens.len();
        let next = sampler::argmax(&logits);
        expected.push(next);
        tokens.push(next);
    }
    assert_eq!(greedy(&mut executor, &prompt, 10), expected);
}

#[test]
fn a_sequence_computes_the_same_alone_and_in_a_batch() {
    let Some(path) = model_path() else { return };
    let mut executor = ModelExecutor::load(&path, &options(64)).unwrap();
    let tokenizer = executor.gguf_tokenizer().clone();
    let a = chat(&tokenizer, "Name three colours.");
    let b = chat(&tokenizer, "Count to five.");
    let table_a: Vec<crate::block::BlockId> = (0..8).map(crate::block::BlockId).collect();
    let table_b: Vec<crate::block::BlockId> = (8..16).map(crate::block::BlockId).collect();
    let input = |table, tokens| llama::SeqInput {
        table,
        start: 0,
        tokens,
        logits: true,
    };
    let cpu = &executor.cpu;
    let alone_a = executor
        .model
        .forward(cpu, &mut executor.kv, &[input(&table_a, &a)])
        .unwrap();
    let alone_b = executor
        .model
        .forward(cpu, &mut executor.kv, &[input(&table_b, &b)])
        .unwrap();
    let together = executor
        .model
        .forward(
            cpu,
            &mut executor.kv,
            &[input(&table_a, &a), input(&table_b, &b)],
        )
        .unwrap();
    assert_eq!(together[0], alone_a[0]);
    assert_eq!(together[1], alone_b[0]);
    // A decode row batched with the other sequence's prefill: the same logits as alone.
    let next = [sampler::argmax(alone_a[0].as_ref().unwrap())];
    let decode = llama::SeqInput {
        table: &table_a,
        start: a.len(),
        tokens: &next,
        logits: true,
    };
    let alone = executor
        .model
        .forward(cpu, &mut executor.kv, &[decode])
        .unwrap();
    let mixed = executor
        .model
        .forward(cpu, &mut executor.kv, &[input(&table_b, &b), decode])
        .unwrap();
    assert_eq!(mixed[1], alone[0]);
}

#[test]
fn a_forward_past_the_table_or_vocabulary_is_an_error_not_a_panic() {
    let Some(path) = model_path() else { return };
    let mut executor = ModelExecutor::load(&path, &options(4)).unwrap();
    let cpu = &executor.cpu;
    let table = [crate::block::BlockId(0)];
    let long = vec![1u32; 17];
    let err = executor
        .model
        .forward(
            cpu,
            &mut executor.kv,
            &[llama::SeqInput {
                table: &table,
                start: 0,
                tokens: &long,
                logits: true,
            }],
        )
        .unwrap_err();
    assert!(
        matches!(err, llama::ForwardError::OutOfRange { .. }),
        "{err}"
    );
    let outside = [crate::block::BlockId(9)];
    let err = executor
        .model
        .forward(
            cpu,
            &mut executor.kv,
            &[llama::SeqInput {
                table: &outside,
                start: 0,
                tokens: &[1],
                logits: true,
            }],
        )
        .unwrap_err();
    assert!(matches!(err, llama::ForwardError::BadBlock(9)), "{err}");
    let err = executor
        .model
        .forward(
            cpu,
            &mut executor.kv,
            &[llama::SeqInput {
                table: &table,
                start: 0,
                tokens: &[u32::MAX],
                logits: true,
            }],
        )
        .unwrap_err();
    assert!(matches!(err, llama::ForwardError::BadToken(_)), "{err}");
}

#[test]
fn two_threads_compute_the_same_bits_as_one() {
    let Some(path) = model_path() else { return };
    let run = |threads: usize| {
        let mut executor = ModelExecutor::load(
            &path,
            &ModelOptions {
                kv_blocks: 16,
                threads,
                isa: None,
            },
        )
        .unwrap();
        let prompt = chat(&executor.gguf_tokenizer().clone(), "Name three colours.");
        let table: Vec<crate::block::BlockId> = (0..16).map(crate::block::BlockId).collect();
        let mut tokens = prompt.clone();
        let mut all = Vec::new();
        let mut done = 0;
        // The prompt (rows ≥ threads: split by rows), then decodes (one row: split by head group).
        for _ in 0..4 {
            let logits = executor
                .forward(&[llama::SeqInput {
                    table: &table,
                    start: done,
                    tokens: &tokens[done..],
                    logits: true,
                }])
                .unwrap()
                .remove(0)
                .unwrap();
            done = tokens.len();
            tokens.push(sampler::argmax(&logits));
            all.push(logits);
        }
        all
    };
    assert!(run(1) == run(2), "logits differ between 1 and 2 threads");
}

/// The GPU executor against the CPU one (feature `cuda`; skipped without a device or model).
#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use crate::BLOCK_SIZE;
    use crate::block::BlockId;
    use crate::model::llama::SeqInput;
    use ringmaster_cuda::llama::GpuSeq;

    /// SmolLM2 on GPU 0, or `None` with a note saying why the test is skipped.
    fn gpu_executor(blocks: u32) -> Option<crate::model::GpuExecutor> {
        let path = model_path()?;
        match crate::model::GpuExecutor::load(&path, 0, Some(blocks)) {
            Ok(executor) => Some(executor),
            Err(e) => {
                eprintln!("skipping: no CUDA device ({e})");
                None
            }
        }
    }

    fn cosine(a: &[f32], b: &[f32]) -> f32 {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (norm(a) * norm(b))
    }

    fn argmax(v: &[f32]) -> usize {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i)
    }

    /// A one-layer llama (`llama_metadata`'s shape) with deterministic pseudo-random F32 weights, written to a temporary
    /// GGUF: the GPU check needs no model download (the device machine has no network).
    fn synthetic_llama() -> PathBuf {
        let (hidden, ffn, vocab) = (256usize, 512usize, 320usize);
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut tensor = |rows: usize, cols: usize, scale: f32| {
            let values: Vec<f32> = (0..rows * cols)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    ((state % 2001) as f32 / 1000.0 - 1.0) * scale
                })
                .collect();
            let t = Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap();
            QTensor::quantize(&t, GgmlDType::F32).unwrap()
        };
        let ones = |n: usize| {
            let t = Tensor::ones((n,), candle_core::DType::F32, &Device::Cpu).unwrap();
            QTensor::quantize(&t, GgmlDType::F32).unwrap()
        };
        let mut tensors = vec![
            ("token_embd.weight".to_owned(), tensor(vocab, hidden, 1.0)),
            ("output_norm.weight".to_owned(), ones(hidden)),
        ];
        for l in 0..1 {
            let name = |s: &str| format!("blk.{l}.{s}.weight");
            tensors.push((name("attn_norm"), ones(hidden)));
            tensors.push((name("attn_q"), tensor(hidden, hidden, 0.1)));
            tensors.push((name("attn_k"), tensor(hidden / 2, hidden, 0.1)));
            tensors.push((name("attn_v"), tensor(hidden / 2, hidden, 0.1)));
            tensors.push((name("attn_output"), tensor(hidden, hidden, 0.1)));
            tensors.push((name("ffn_norm"), ones(hidden)));
            tensors.push((name("ffn_gate"), tensor(ffn, hidden, 0.1)));
            tensors.push((name("ffn_up"), tensor(ffn, hidden, 0.1)));
            tensors.push((name("ffn_down"), tensor(hidden, ffn, 0.1)));
        }
        let (names, values): (Vec<String>, Vec<QTensor>) = tensors.into_iter().unzip();
        let named: Vec<(&str, QTensor)> = names.iter().map(String::as_str).zip(values).collect();
        write_gguf("gpu-synthetic", &llama_metadata("llama"), &named)
    }

    #[test]
    fn gpu_forward_matches_the_cpu_forward_on_a_synthetic_model() {
        // The model is built and read both ways first, so a machine without a GPU still
        // checks everything up to the device.
        let path = synthetic_llama();
        let cpu_model = llama::Llama::load(&mut ModelFile::open(&path).unwrap()).unwrap();
        let host = super::super::gpu::host_model(&mut ModelFile::open(&path).unwrap()).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(host.layers.len(), 1);
        assert_eq!(host.layers[0].qkv.rows, 256 + 2 * 128);
        assert_eq!(host.embed.rows, cpu_model.config.vocab);
        if !ringmaster_cuda::driver_present() {
            eprintln!(
                "skipping: no CUDA device ({})",
                ringmaster_cuda::CudaError::NoDriver
            );
            return;
        }
        let cpu = ringmaster_kernels::Cpu::new(1).unwrap();
        let tokens: Vec<u32> = (0..41u32).map(|i| i * 37 % 320).collect();
        let table = [5u32, 2, 7];
        let cpu_table: Vec<BlockId> = table.iter().map(|b| BlockId(*b)).collect();
        // Both steps: the first (the baseline) and the second (cuBLAS, the new attention).
        for path in [ringmaster_cuda::StepPath::V1, ringmaster_cuda::StepPath::V2] {
            let device = ringmaster_cuda::Device::open_for(0, host.shape.head_dim, path).unwrap();
            let mut gpu = ringmaster_cuda::llama::GpuLlama::load(
                device,
                host.clone(),
                ringmaster_cuda::llama::KvBudget::Blocks(8),
            )
            .unwrap();
            let mut kv = llama::PagedKv::new(&cpu_model.config, 8);
            // The prompt, then one decode token reading the first 40 positions from the pool.
            for (start, end) in [(0, 40), (40, 41)] {
                let want = cpu_model
                    .forward(
                        &cpu,
                        &mut kv,
                        &[SeqInput {
                            table: &cpu_table,
                            start,
                            tokens: &tokens[start..end],
                            logits: true,
                        }],
                    )
                    .unwrap()[0]
                    .clone()
                    .unwrap();
                let seq = [GpuSeq {
                    table: &table,
                    start,
                    tokens: &tokens[start..end],
                    logits: true,
                }];
                let got = gpu.forward(&seq).unwrap()[0].clone().unwrap();
                assert_eq!(argmax(&got), argmax(&want), "{path:?} {start}..{end}");
                let c = cosine(&got, &want);
                assert!(c > 0.99, "{path:?} {start}..{end}: cosine {c}");
                if path != ringmaster_cuda::StepPath::V2 {
                    continue;
                }
                // The sampling kernel against its Rust mirror on the same logits: the same
                // token but for float near-ties at a boundary.
                let mut same = 0;
                let draws = 60;
                for i in 0..draws {
                    let draw = sampler::Draw {
                        temperature: [1.0, 0.7, 0.0][i % 3],
                        top_k: [0, 50, 5][i % 3],
                        top_p: [1.0, 0.9, 0.5][(i / 3) % 3],
                        uniform: sampler::uniform(i as u64, 3),
                    };
                    let row = super::super::gpu::row_sampling(&draw);
                    let token = gpu.sample_step(&seq, &[row]).unwrap()[0].unwrap();
                    if token == draw.pick(&got) {
                        same += 1;
                    }
                }
                assert!(
                    same >= draws - 1,
                    "{same} of {draws} draws equal the mirror's"
                );
            }
            if path == ringmaster_cuda::StepPath::V2 {
                // A batched decode padded to a graph bucket (3 rows in a bucket of 4): captured,
                // replayed, and eager all draw the same greedy tokens.
                let tables = [[1u32, 3, 6], [0, 4, 5], [5u32, 2, 7]];
                let decode: Vec<GpuSeq<'_>> = tables
                    .iter()
                    .enumerate()
                    .map(|(i, table)| GpuSeq {
                        table,
                        start: 30 + i,
                        tokens: &tokens[i..i + 1],
                        logits: true,
                    })
                    .collect();
                let greedy = [ringmaster_cuda::llama::RowSampling {
                    temperature: 0.0,
                    top_k: 0,
                    top_p: 1.0,
                    uniform: 0.0,
                }; 3];
                gpu.set_graphs(false);
                let eager = gpu.sample_step(&decode, &greedy).unwrap();
                gpu.set_graphs(true);
                let captured = gpu.sample_step(&decode, &greedy).unwrap();
                assert_eq!(gpu.take_graph_error(), None);
                assert_eq!(gpu.graph_buckets(), vec![4]);
                let replayed = gpu.sample_step(&decode, &greedy).unwrap();
                assert_eq!(eager, captured);
                assert_eq!(eager, replayed);
                assert!(eager.iter().all(Option::is_some));
            }
        }
    }

    #[test]
    fn gpu_logits_match_the_cpu_model_in_one_batch_with_shared_blocks() {
        let Some(mut gpu) = gpu_executor(64) else {
            return;
        };
        let mut cpu = ModelExecutor::load(&model_path().unwrap(), &options(64)).unwrap();
        let tokenizer = cpu.gguf_tokenizer().clone();
        let prompt = chat(
            &tokenizer,
            "What is the capital of France? Answer in one sentence.",
        );
        let table: Vec<u32> = (0..prompt.len().div_ceil(BLOCK_SIZE) as u32 + 1).collect();
        let cpu_table: Vec<BlockId> = table.iter().map(|b| BlockId(*b)).collect();
        let want = cpu
            .forward(&[SeqInput {
                table: &cpu_table,
                start: 0,
                tokens: &prompt,
                logits: true,
            }])
            .unwrap()[0]
            .clone()
            .unwrap();
        // The prompt in two chunks through the paged pool, then a second sequence that shares
        // every full block of the first and computes only its tail: all in device memory.
        let split = prompt.len() / 2;
        let first = gpu
            .forward(&[GpuSeq {
                table: &table,
                start: 0,
                tokens: &prompt[..split],
                logits: false,
            }])
            .unwrap();
        assert!(first[0].is_none());
        let shared = (prompt.len() / BLOCK_SIZE) * BLOCK_SIZE;
        let mut other_table = table[..shared / BLOCK_SIZE].to_vec();
        other_table.push(60);
        let got = gpu
            .forward(&[
                GpuSeq {
                    table: &table,
                    start: split,
                    tokens: &prompt[split..],
                    logits: true,
                },
                GpuSeq {
                    table: &other_table,
                    start: shared,
                    tokens: &prompt[shared..],
                    logits: true,
                },
            ])
            .unwrap();
        for logits in got {
            let logits = logits.unwrap();
            assert_eq!(argmax(&logits), argmax(&want));
            let c = cosine(&logits, &want);
            assert!(c > 0.99, "cosine {c}");
        }
        // Bad input is refused, not launched.
        assert!(
            gpu.forward(&[GpuSeq {
                table: &[1000],
                start: 0,
                tokens: &prompt[..4],
                logits: true,
            }])
            .is_err()
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn smollm_answers_on_the_gpu_through_the_engine() {
        let Some(gpu) = gpu_executor(512) else {
            return;
        };
        let mut config = crate::EngineConfig::simulated("smollm-gpu");
        config.kv_blocks = gpu.kv_blocks();
        config.max_running = 8;
        config.step_token_budget = 256;
        let handle = crate::EngineHandle::spawn_with_executor(config, gpu).unwrap();
        let question = "What is the capital of France? Answer in one sentence.";
        let (first, _) = generate(&handle, question, 24).await;
        assert!(first.contains("Paris"), "{first}");
        let (second, cached) = generate(&handle, question, 24).await;
        assert_eq!(second, first);
        assert!(cached >= 16, "cached {cached} tokens");
    }
}
