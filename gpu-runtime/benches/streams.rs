//! Concurrent streams through the whole engine on a real model: TTFT p50/p99, decode tokens/s
//! per stream and in all, and the batch figures (`ringmaster_gpu_runtime::measure`), on the
//! CPU executor or a CUDA GPU.
//!
//! `cargo bench -p ringmaster-gpu-runtime --bench streams` (add `--features cuda` for the GPU;
//! `gpu-runtime/cuda/device-run.sh` runs it on a lent machine). The CPU run is both the
//! CPU engine's sampling check (tokens/s at temperature 1 beside temperature 0, 8 streams,
//! rounds alternating) and a dry run of everything the GPU run prints. Settings (environment):
//! - `RINGMASTER_MODEL`: the GGUF (default: the model cache `cargo xtask model` fills).
//! - `RINGMASTER_BENCH_SHAPES`: instead of a model, a shapes file (`examples/model_shapes.rs`):
//!   a model of those shapes with random weights is written to a temporary file and timed
//!   (the figures hold for the real model: every stream's length is fixed).
//! - `RINGMASTER_BENCH_DEVICE`: `cpu` or `cuda` (default: `cuda` in a build with the feature).
//! - `RINGMASTER_BENCH_STREAMS`: stream counts (default `1,8,32,64` on a GPU, `8` on the CPU).
//! - `RINGMASTER_BENCH_TOKENS`: tokens per stream (default 128 on a GPU, 32 on the CPU).
//! - `RINGMASTER_BENCH_TEMPERATURES`: (default `1` on a GPU, `0,1` on the CPU).
//! - `RINGMASTER_BENCH_ROUNDS`: rounds of the whole set, alternating (default 1 on a GPU, 3 on
//!   the CPU); the CPU reports the median ratio of temperature 1 to 0.
//! - `RINGMASTER_BENCH_THREADS`: CPU kernel threads (default 1).
//! - `RINGMASTER_BENCH_KV_BLOCKS`: the GPU pool (default 32,768 blocks: 64 streams of 8k
//!   tokens, the same on any card, no pool of 90 % of memory to zero at load).
//! - `RINGMASTER_BENCH_OUT`: a folder for `streams.json` (every figure of every run).
//! - `RINGMASTER_GPU_PATH`: `v1` for the CUDA back end's first step (see `GpuExecutor`).
#![allow(clippy::print_stdout)]

use std::path::PathBuf;

use ringmaster_gpu_runtime::measure::{StreamsFigures, StreamsRun, run_streams};
use ringmaster_gpu_runtime::model::synthetic::bench_model;
use ringmaster_gpu_runtime::model::{ModelExecutor, ModelOptions};
use ringmaster_gpu_runtime::{EngineConfig, EngineHandle, Executor};

fn env_list<T: std::str::FromStr>(name: &str, default: &str) -> Vec<T> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .filter_map(|v| v.trim().parse().ok())
        .collect()
}

fn env_one<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // The temporary model is kept until the bench ends: its file is removed on drop.
    let (path, _random_model) = bench_model().expect("writing random weights of the shapes");
    if !path.is_file() {
        println!(
            "skipping: no model at {} (run `cargo xtask model`)",
            path.display()
        );
        return;
    }
    let default_device = if cfg!(feature = "cuda") {
        "cuda"
    } else {
        "cpu"
    };
    let device = std::env::var("RINGMASTER_BENCH_DEVICE").unwrap_or(default_device.to_owned());
    let gpu = device == "cuda";
    let streams: Vec<usize> = env_list(
        "RINGMASTER_BENCH_STREAMS",
        if gpu { "1,8,32,64" } else { "8" },
    );
    let tokens: u32 = env_one("RINGMASTER_BENCH_TOKENS", if gpu { 128 } else { 32 });
    let temperatures: Vec<f32> = env_list(
        "RINGMASTER_BENCH_TEMPERATURES",
        if gpu { "1" } else { "0,1" },
    );
    let rounds: usize = env_one("RINGMASTER_BENCH_ROUNDS", if gpu { 1 } else { 3 });
    let settings = Settings {
        path,
        streams,
        tokens,
        temperatures,
        rounds,
    };
    if gpu {
        if let Err(e) = run_gpu(&settings) {
            println!("skipping: no CUDA device ({e})");
        }
        return;
    }
    let most = settings.most();
    let threads = env_one("RINGMASTER_BENCH_THREADS", 1);
    let kv_blocks = (most * (tokens as usize + 256)).div_ceil(16) as u32 + 64;
    let executor = ModelExecutor::load(
        &settings.path,
        &ModelOptions {
            kv_blocks,
            threads,
            isa: None,
        },
    )
    .expect("loading the model");
    let label = format!(
        "the CPU ({} kernels, {threads} thread(s))",
        executor.cpu().isa().name()
    );
    bench(&settings, executor, &label, kv_blocks, false);
}

struct Settings {
    path: PathBuf,
    streams: Vec<usize>,
    tokens: u32,
    temperatures: Vec<f32>,
    rounds: usize,
}

impl Settings {
    fn most(&self) -> usize {
        self.streams.iter().copied().max().unwrap_or(1)
    }
}

fn bench<E: Executor>(settings: &Settings, executor: E, label: &str, kv_blocks: u32, gpu: bool) {
    let Settings {
        path,
        streams,
        tokens,
        temperatures,
        rounds,
    } = settings;
    println!("{} on {label}, {kv_blocks} KV blocks", path.display());
    let base = EngineConfig {
        max_running: (settings.most() as u32).max(1),
        kv_blocks,
        ..EngineConfig::simulated("streams-bench")
    };
    // The GPU's step profile, or the CPU worker's (512-token steps, the default prefill cap);
    // no modelled clock on either: step durations are measured.
    let config = if gpu {
        base.sized_for_gpu()
    } else {
        EngineConfig {
            step_token_budget: 512.max(base.max_running),
            time_scale: 0.0,
            ..base
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let engine = runtime
        .block_on(async { EngineHandle::spawn_with_executor(config, executor) })
        .expect("engine");

    let mut salt = 0;
    let mut measure = |streams: usize, max_tokens: u32, temperature: f32| {
        salt += 1;
        let run = StreamsRun {
            streams,
            max_tokens,
            temperature,
            salt,
        };
        runtime
            .block_on(run_streams(&engine, &run))
            .expect("a measured run")
    };
    // A warm-up with its own prompt: the measured 1-stream TTFT is then a cold prefill.
    measure(1, 8, 1.0);
    println!("{}", StreamsFigures::HEADER);
    let mut all = Vec::new();
    for _ in 0..*rounds {
        for &n in streams {
            for &t in temperatures {
                let f = measure(n, *tokens, t);
                println!("{}", f.row());
                all.push(f);
            }
        }
    }
    if temperatures.contains(&0.0) && temperatures.contains(&1.0) {
        let per_round = streams.len() * temperatures.len();
        for &n in streams {
            let mut ratios: Vec<f64> = all
                .chunks(per_round)
                .filter_map(|round| {
                    let at = |t: f32| round.iter().find(|f| f.streams == n && f.temperature == t);
                    Some(at(1.0)?.total_tok_s / at(0.0)?.total_tok_s)
                })
                .collect();
            ratios.sort_by(f64::total_cmp);
            if let Some(median) = ratios.get(ratios.len() / 2) {
                println!(
                    "{n} streams: tokens/s at temperature 1 over temperature 0, median of {} rounds: {median:.3} (target ≥ 0.90)",
                    ratios.len()
                );
            }
        }
    }
    if let Some(dir) = std::env::var_os("RINGMASTER_BENCH_OUT") {
        let file = PathBuf::from(dir).join("streams.json");
        let json = serde_json::json!({
            "model": path.display().to_string(),
            "device": label,
            "runs": all,
        });
        std::fs::write(&file, serde_json::to_vec_pretty(&json).expect("json"))
            .expect("writing the figures");
        println!("figures in {}", file.display());
    }
}

#[cfg(feature = "cuda")]
fn run_gpu(settings: &Settings) -> Result<(), String> {
    let blocks = env_one("RINGMASTER_BENCH_KV_BLOCKS", 32_768u32);
    let executor =
        ringmaster_gpu_runtime::model::GpuExecutor::load(&settings.path, 0, Some(blocks))
            .map_err(|e| e.to_string())?;
    let label = format!(
        "{} (step {}; weights {:.0} MB, loaded in {:.2} s)",
        executor.device_name(),
        executor.path_name(),
        executor.weight_bytes() as f64 / 1e6,
        executor.load_time().as_secs_f64()
    );
    let blocks = executor.kv_blocks();
    bench(settings, executor, &label, blocks, true);
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn run_gpu(_settings: &Settings) -> Result<(), String> {
    Err("this build has no CUDA support (--features cuda)".into())
}
