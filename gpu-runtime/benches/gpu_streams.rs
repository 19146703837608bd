//! SmolLM2-135M on a CUDA GPU through the whole engine: TTFT (p50, p99) and decode tokens/s per
//! stream with 32 concurrent streams, beside the same load at 1 stream.
//!
//! `cargo bench -p ringmaster-gpu-runtime --features cuda --bench gpu_streams` on a machine
//! with an NVIDIA GPU (`gpu-runtime/cuda/gpu-check.sh` runs it). Without a device it says so and
//! exits. Settings (environment): `RINGMASTER_MODEL` (the GGUF; default: the model cache),
//! `RINGMASTER_BENCH_STREAMS` (default 32), `RINGMASTER_BENCH_TOKENS` (decode tokens per stream,
//! default 128).
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringmaster_gpu_runtime::model::{GpuExecutor, default_model_path};
use ringmaster_gpu_runtime::{
    ChatMessage, EngineConfig, EngineHandle, GenerateEvent, GenerateRequest, Role, SamplingParams,
};

/// One stream's timings.
#[derive(Debug)]
struct StreamResult {
    ttft: Duration,
    decode: Duration,
    tokens: usize,
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn stream(engine: EngineHandle, i: usize, max_tokens: u32) -> StreamResult {
    // A distinct ~200-token prompt per stream: nothing shared but the chat template.
    let question = format!(
        "Request {i}: summarise, in plain words, why a paged KV cache lets a server batch many \
         conversations at once. {}",
        "Mention memory, prefixes and preemption. ".repeat(12)
    );
    let started = Instant::now();
    let mut events = engine
        .submit(GenerateRequest {
            request_id: format!("stream-{i}"),
            system: None,
            messages: vec![ChatMessage {
                role: Role::User,
                text: question,
                ..Default::default()
            }],
            max_tokens,
            stop_sequences: Vec::new(),
            sampling: SamplingParams {
                temperature: Some(1.0),
                seed: Some(i as u64),
                ..Default::default()
            },
            prompt: None,
            priority: 0,
            tools: None,
            effort: None,
            output_format: None,
        })
        .expect("submit");
    let mut first = None;
    let mut tokens = 0;
    while let Some(event) = events.next().await {
        match event {
            GenerateEvent::Token { .. } => {
                first.get_or_insert_with(|| started.elapsed());
                tokens += 1;
            }
            GenerateEvent::Finished { .. } | GenerateEvent::Failed { .. } => break,
            GenerateEvent::Started { .. }
            | GenerateEvent::ToolCall { .. }
            | GenerateEvent::Reasoning { .. } => {}
        }
    }
    let ttft = first.unwrap_or_else(|| started.elapsed());
    StreamResult {
        ttft,
        decode: started.elapsed().saturating_sub(ttft),
        tokens,
    }
}

fn run(engine: &EngineHandle, runtime: &tokio::runtime::Runtime, streams: usize, tokens: u32) {
    let started = Instant::now();
    let results: Vec<StreamResult> = runtime.block_on(async {
        let tasks: Vec<_> = (0..streams)
            .map(|i| tokio::spawn(stream(engine.clone(), i, tokens)))
            .collect();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.expect("stream task"));
        }
        results
    });
    let wall = started.elapsed().as_secs_f64();
    let mut ttft: Vec<f64> = results.iter().map(|r| r.ttft.as_secs_f64() * 1e3).collect();
    ttft.sort_by(f64::total_cmp);
    let per_stream: Vec<f64> = results
        .iter()
        .filter(|r| r.tokens > 1 && !r.decode.is_zero())
        .map(|r| (r.tokens - 1) as f64 / r.decode.as_secs_f64())
        .collect();
    let mean = per_stream.iter().sum::<f64>() / per_stream.len().max(1) as f64;
    let total: usize = results.iter().map(|r| r.tokens).sum();
    println!(
        "{streams:>3} streams: TTFT p50 {:.1} ms, p99 {:.1} ms; decode {mean:.1} tok/s per stream \
         (mean of {}), {:.0} tok/s in all over {wall:.2} s",
        percentile(&ttft, 0.5),
        percentile(&ttft, 0.99),
        per_stream.len(),
        total as f64 / wall,
    );
}

fn main() {
    let path = std::env::var_os("RINGMASTER_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(default_model_path);
    if !path.is_file() {
        println!(
            "skipping: no model at {} (run `cargo xtask model`)",
            path.display()
        );
        return;
    }
    let streams = env_usize("RINGMASTER_BENCH_STREAMS", 32);
    let tokens = env_usize("RINGMASTER_BENCH_TOKENS", 128) as u32;
    let executor = match GpuExecutor::load(&path, 0, None) {
        Ok(executor) => executor,
        Err(e) => {
            println!("skipping: no CUDA device ({e})");
            return;
        }
    };
    println!(
        "{} on {}: weights {:.0} MB, {} KV blocks, loaded in {:.2} s",
        path.display(),
        executor.device_name(),
        executor.weight_bytes() as f64 / 1e6,
        executor.kv_blocks(),
        executor.load_time().as_secs_f64()
    );
    let mut config = EngineConfig::simulated("gpu-bench");
    config.kv_blocks = executor.kv_blocks();
    config.max_running = streams.max(1) as u32 * 2;
    config.step_token_budget = 8192;
    config.time_scale = 1.0;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("runtime");
    let engine = runtime
        .block_on(async { EngineHandle::spawn_with_executor(config, executor) })
        .expect("engine");
    // A warm-up stream, then 1 stream and the full count side by side.
    run(&engine, &runtime, 1, 8);
    run(&engine, &runtime, 1, tokens);
    run(&engine, &runtime, streams, tokens);
}
