//! SmolLM2-135M on this CPU: prefill and decode tokens/s at batch 1 and 16, side by side with
//! llama.cpp's `llama-bench` on the same file and thread count in the same run, and TTFT with a
//! cached versus an uncached 1,000-token system prompt through the whole engine.
//!
//! `cargo bench -p ringmaster-gpu-runtime --bench model`. Settings (environment):
//! - `RINGMASTER_MODEL`: the GGUF (default: the model cache `cargo xtask model` fills).
//! - `RINGMASTER_BENCH_THREADS`: kernel threads, also given to llama-bench (default 1).
//! - `LLAMA_BENCH`: the `llama-bench` binary (default: where
//!   `gpu-runtime/benches/build-llama-bench.sh` puts it); without it that column is skipped.
//! - `RINGMASTER_BENCH_ROUNDS`: alternating rounds of the comparison whose median ratio is
//!   reported (default 3).
//!
//! Shapes follow llama-bench's defaults: prefill is one 512-token prompt (`pp512`), decode is
//! 128 tokens from an empty context (`tg128`); also reported: 128 decode tokens after the
//! 512-token prompt (attention then reads 512–640 positions). Batch 16 decodes 16 sequences,
//! each after its own 64-token prompt, for 64 steps.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ringmaster_gpu_runtime::block::BlockId;
use ringmaster_gpu_runtime::model::llama::SeqInput;
use ringmaster_gpu_runtime::model::{Isa, ModelExecutor, ModelOptions, default_model_path};

const PREFILL: usize = 512;
const DECODE: usize = 128;
const BATCH: usize = 16;
const BATCH_PROMPT: usize = 64;
const BATCH_STEPS: usize = 64;
const SYSTEM_TOKENS: usize = 1000;

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
    let threads: usize = std::env::var("RINGMASTER_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    println!("model {} · {threads} thread(s)", path.display());

    let llama = llama_bench(&path, threads);
    let mut rows = Vec::new();
    for isa in [Isa::detect(), Isa::Avx] {
        if !isa.available() || rows.iter().any(|(i, _)| *i == isa) {
            continue;
        }
        rows.push((isa, throughput(&path, threads, isa)));
    }
    println!();
    println!(
        "| engine | prefill tok/s (pp{PREFILL}) | decode tok/s, batch 1 (tg{DECODE}) | decode tok/s after the {PREFILL}-token prompt | decode tok/s, batch {BATCH} (sum) | batch {BATCH} / batch 1 |"
    );
    println!("|---|---|---|---|---|---|");
    for (isa, t) in &rows {
        println!(
            "| ringmaster, {} kernels | {:.0} | {:.1} | {:.1} | {:.0} | {:.2}× |",
            isa.name(),
            t.prefill,
            t.decode,
            t.decode_after_prompt,
            t.batch,
            t.batch / t.decode
        );
    }
    if let Some((pp, tg)) = llama {
        println!("| llama.cpp llama-bench | {pp:.0} | {tg:.1} | — | — | — |");
        for (isa, t) in &rows {
            println!(
                "| ratio ringmaster {} / llama.cpp | {:.2}× | {:.2}× | | | |",
                isa.name(),
                t.prefill / pp,
                t.decode / tg
            );
        }
    }
    rounds(&path, threads, llama);
    ttft(&path, threads);
}

/// Timings on a shared machine drift by ±15% from minute to minute, so the comparison is
/// repeated, alternating the two engines, and the median of each round's ratio is reported
/// (`RINGMASTER_BENCH_ROUNDS`, default 3; the first round reuses llama.cpp's figures from the
/// table above).
fn rounds(path: &std::path::Path, threads: usize, first: Option<(f64, f64)>) {
    let Some(first) = first else { return };
    let rounds: usize = std::env::var("RINGMASTER_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(3);
    let isa = Isa::detect();
    let mut prefill = Vec::new();
    let mut decode = Vec::new();
    let mut llama = Some(first);
    for round in 0..rounds {
        let Some((pp, tg)) = llama.take().or_else(|| llama_bench(path, threads)) else {
            return;
        };
        let ours = throughput(path, threads, isa);
        println!(
            "round {round}: prefill {:.2}×, decode {:.2}× ({} kernels over llama.cpp)",
            ours.prefill / pp,
            ours.decode / tg,
            isa.name()
        );
        prefill.push(ours.prefill / pp);
        decode.push(ours.decode / tg);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!();
    println!(
        "median of {rounds} alternating rounds, {} kernels / llama.cpp: prefill {:.2}×, decode (batch 1) {:.2}×",
        isa.name(),
        median(&mut prefill),
        median(&mut decode)
    );
}

struct Throughput {
    prefill: f64,
    decode: f64,
    decode_after_prompt: f64,
    batch: f64,
}

fn table(from: u32, blocks: u32) -> Vec<BlockId> {
    (from..from + blocks).map(BlockId).collect()
}

/// Deterministic ordinary-text-like token ids (the model's ids 1000..11000).
fn tokens(seed: usize, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| 1000 + ((i * 7919 + seed * 104_729) % 10_000) as u32)
        .collect()
}

fn throughput(path: &std::path::Path, threads: usize, isa: Isa) -> Throughput {
    let blocks_per_seq = ((PREFILL + DECODE) / 16 + 1) as u32;
    let mut executor = ModelExecutor::load(
        path,
        &ModelOptions {
            kv_blocks: blocks_per_seq * BATCH as u32,
            threads,
            isa: Some(isa),
        },
    )
    .expect("model loads");
    // Prefill: the median of 3 passes over one 512-token prompt.
    let prompt = tokens(1, PREFILL);
    let t0 = table(0, blocks_per_seq);
    let mut times = Vec::new();
    for _ in 0..3 {
        let started = Instant::now();
        let input = SeqInput {
            table: &t0,
            start: 0,
            tokens: &prompt,
            logits: true,
        };
        executor.forward(&[input]).expect("prefill");
        times.push(started.elapsed());
    }
    times.sort();
    let prefill = PREFILL as f64 / times[1].as_secs_f64();
    // Decode at batch 1 after that prompt.
    let started = Instant::now();
    for i in 0..DECODE {
        let token = [prompt[i % PREFILL]];
        let input = SeqInput {
            table: &t0,
            start: PREFILL + i,
            tokens: &token,
            logits: true,
        };
        executor.forward(&[input]).expect("decode");
    }
    let decode_after_prompt = DECODE as f64 / started.elapsed().as_secs_f64();
    // Decode at batch 1 from an empty context, as llama-bench's tg runs.
    let t1 = table(blocks_per_seq, blocks_per_seq);
    let started = Instant::now();
    for (i, token) in prompt.iter().take(DECODE).enumerate() {
        let token = [*token];
        let input = SeqInput {
            table: &t1,
            start: i,
            tokens: &token,
            logits: true,
        };
        executor.forward(&[input]).expect("decode");
    }
    let decode = DECODE as f64 / started.elapsed().as_secs_f64();
    // Batch 16: prefill 16 prompts, then decode all of them together.
    let tables: Vec<Vec<BlockId>> = (0..BATCH as u32)
        .map(|s| table(s * blocks_per_seq, blocks_per_seq))
        .collect();
    let prompts: Vec<Vec<u32>> = (0..BATCH).map(|s| tokens(s + 2, BATCH_PROMPT)).collect();
    let inputs: Vec<SeqInput<'_>> = (0..BATCH)
        .map(|s| SeqInput {
            table: &tables[s],
            start: 0,
            tokens: &prompts[s],
            logits: false,
        })
        .collect();
    executor.forward(&inputs).expect("batch prefill");
    let started = Instant::now();
    for step in 0..BATCH_STEPS {
        let next: Vec<[u32; 1]> = (0..BATCH)
            .map(|s| [prompts[s][step % BATCH_PROMPT]])
            .collect();
        let inputs: Vec<SeqInput<'_>> = (0..BATCH)
            .map(|s| SeqInput {
                table: &tables[s],
                start: BATCH_PROMPT + step,
                tokens: &next[s],
                logits: true,
            })
            .collect();
        executor.forward(&inputs).expect("batch decode");
    }
    let batch = (BATCH * BATCH_STEPS) as f64 / started.elapsed().as_secs_f64();
    println!(
        "{} kernels: prefill {prefill:.0} tok/s, decode {decode:.1} tok/s ({decode_after_prompt:.1} after the prompt), batch {BATCH} {batch:.0} tok/s",
        isa.name()
    );
    Throughput {
        prefill,
        decode,
        decode_after_prompt,
        batch,
    }
}

/// llama-bench's (prompt tok/s, generation tok/s), or `None` when it is not built.
fn llama_bench(path: &std::path::Path, threads: usize) -> Option<(f64, f64)> {
    let bin = std::env::var_os("LLAMA_BENCH")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("RINGMASTER_CACHE_DIR")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                        .join(".cache/ringmaster")
                });
            cache.join("llama.cpp/build/bin/llama-bench")
        });
    if !bin.is_file() {
        println!(
            "llama.cpp: no llama-bench at {} (gpu-runtime/benches/build-llama-bench.sh builds it); column skipped",
            bin.display()
        );
        return None;
    }
    let out = std::process::Command::new(&bin)
        .args([
            "-m",
            &path.display().to_string(),
            "-t",
            &threads.to_string(),
        ])
        .args([
            "-p",
            &PREFILL.to_string(),
            "-n",
            &DECODE.to_string(),
            "-r",
            "3",
            "-o",
            "json",
        ])
        .output()
        .ok()?;
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let mut pp = None;
    let mut tg = None;
    for run in runs.as_array()? {
        let ts = run["avg_ts"].as_f64()?;
        if run["n_prompt"].as_u64() == Some(PREFILL as u64) {
            pp = Some(ts);
        } else if run["n_gen"].as_u64() == Some(DECODE as u64) {
            tg = Some(ts);
        }
    }
    println!(
        "llama.cpp llama-bench: prefill {:.0} tok/s, decode {:.1} tok/s",
        pp?, tg?
    );
    Some((pp?, tg?))
}

/// TTFT through the engine with a 1,000-token system prompt: the first request computes it,
/// the next ones (other questions) find it in the prefix cache.
fn ttft(path: &std::path::Path, threads: usize) {
    let executor = ModelExecutor::load(
        path,
        &ModelOptions {
            kv_blocks: 512,
            threads,
            isa: None,
        },
    )
    .expect("model loads");
    let tokenizer = executor.gguf_tokenizer().clone();
    let mut config = ringmaster_gpu_runtime::EngineConfig::simulated("bench");
    config.kv_blocks = 512;
    config.max_running = 16;
    config.step_token_budget = 512;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let handle = runtime
        .block_on(async {
            ringmaster_gpu_runtime::EngineHandle::spawn_with_executor(config, executor)
        })
        .expect("engine");
    // A system prompt of about 1,000 tokens of ordinary policy text.
    let sentence = "Agents must answer politely, cite the relevant policy section, and escalate refunds above fifty dollars to a supervisor. ";
    let mut system = String::new();
    while tokenizer.encode(&system).len() < SYSTEM_TOKENS {
        system.push_str(sentence);
    }
    let questions = [
        "How do I reset my password?",
        "Where is my order?",
        "Can I get a refund?",
        "What are your opening hours?",
    ];
    let mut times = Vec::new();
    for (i, question) in questions.iter().enumerate() {
        let request = ringmaster_gpu_runtime::GenerateRequest {
            request_id: format!("ttft-{i}"),
            system: Some(system.clone()),
            messages: vec![ringmaster_gpu_runtime::ChatMessage {
                role: ringmaster_gpu_runtime::Role::User,
                text: (*question).into(),
                ..Default::default()
            }],
            max_tokens: 1,
            stop_sequences: Vec::new(),
            sampling: Default::default(),
            prompt: None,
            priority: 0,
            tools: None,
            effort: None,
            output_format: None,
        };
        let (elapsed, cached, prompt) = runtime.block_on(async {
            let started = Instant::now();
            let mut stream = handle.submit(request).expect("submit");
            let mut result = (Duration::ZERO, 0, 0);
            while let Some(event) = stream.next().await {
                if let ringmaster_gpu_runtime::GenerateEvent::Started {
                    prompt_tokens,
                    cached_tokens,
                } = event
                {
                    result = (started.elapsed(), cached_tokens, prompt_tokens);
                }
            }
            result
        });
        println!(
            "ttft request {i}: {:.1} ms ({prompt} prompt tokens, {cached} from the prefix cache)",
            elapsed.as_secs_f64() * 1e3
        );
        times.push(elapsed);
    }
    let cold = times[0].as_secs_f64();
    let mut warm: Vec<f64> = times[1..].iter().map(Duration::as_secs_f64).collect();
    warm.sort_by(f64::total_cmp);
    let warm = warm[warm.len() / 2];
    println!();
    println!("| TTFT, {SYSTEM_TOKENS}-token system prompt | ms |");
    println!("|---|---|");
    println!("| uncached (first request) | {:.1} |", cold * 1e3);
    println!(
        "| cached (median of the next {}) | {:.1} |",
        times.len() - 1,
        warm * 1e3
    );
    println!("| speed-up | {:.1}× |", cold / warm);
}
