//! The CUDA back end's step alone, without the engine: wall time per step (median and p99)
//! and its phases on the device (upload, layers, LM head, sampling, download; CUDA events) for
//! decode steps of 1 to 128 sequences at 256 and 1,024 positions, prefill chunks of 128, 512
//! and 2,048 tokens, and a mixed step (32 decodes beside a 512-token chunk). On the first step
//! (`RINGMASTER_GPU_PATH=v1`) the host sampling of the copied logits is timed beside it.
//!
//! `cargo bench -p ringmaster-gpu-runtime --features cuda --bench gpu_step`. Settings: the
//! model as the streams bench takes it (`RINGMASTER_MODEL`, or `RINGMASTER_BENCH_SHAPES` for
//! random weights of a model's shapes: timing does not depend on them), `RINGMASTER_BENCH_OUT`
//! (a folder for `gpu_step-<path>.json`). Without a device it says so and exits.
#![allow(clippy::print_stdout)]

use std::path::PathBuf;
use std::time::Instant;

use ringmaster_gpu_runtime::cuda::StepPath;
use ringmaster_gpu_runtime::cuda::llama::{GpuLlama, GpuSeq, RowSampling};
use ringmaster_gpu_runtime::measure::quantile;
use ringmaster_gpu_runtime::model::GpuExecutor;
use ringmaster_gpu_runtime::model::sampler::Draw;
use ringmaster_gpu_runtime::model::synthetic::bench_model;

const WARM_UP: usize = 10;
const TIMED: usize = 30;
const BLOCK: usize = ringmaster_gpu_runtime::BLOCK_SIZE;

/// One measured shape.
#[derive(Debug, serde::Serialize)]
struct Point {
    shape: String,
    tokens: usize,
    sampled: usize,
    step_ms_p50: f64,
    step_ms_p99: f64,
    /// Host sampling of the copied logits (first step only), per step.
    host_sampling_ms: f64,
    phases_ms: Vec<(&'static str, f32)>,
}

/// Runs `seqs` as one step `WARM_UP + TIMED` times, then once profiled.
fn measure(model: &mut GpuLlama, shape: String, seqs: &[GpuSeq<'_>]) -> Point {
    let sampled = seqs.iter().filter(|s| s.logits).count();
    let rows: Vec<RowSampling> = (0..sampled)
        .map(|i| RowSampling {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            uniform: (i as f32 + 0.5) / sampled as f32,
        })
        .collect();
    let draw = Draw {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        uniform: 0.5,
    };
    // Wall time of one step, and of its host sampling (the first step's).
    let step = |model: &mut GpuLlama| -> (f64, f64) {
        let started = Instant::now();
        let mut host_sampling = 0.0;
        match model.path() {
            StepPath::V2 => {
                model.sample_step(seqs, &rows).expect("a step");
            }
            StepPath::V1 => {
                let logits = model.forward(seqs).expect("a step");
                let sampling = Instant::now();
                for row in logits.iter().flatten() {
                    std::hint::black_box(draw.pick(row));
                }
                host_sampling = sampling.elapsed().as_secs_f64() * 1e3;
            }
        }
        (started.elapsed().as_secs_f64() * 1e3, host_sampling)
    };
    for _ in 0..WARM_UP {
        step(model);
    }
    let timed: Vec<(f64, f64)> = (0..TIMED).map(|_| step(model)).collect();
    let mut times: Vec<f64> = timed.iter().map(|t| t.0).collect();
    times.sort_by(f64::total_cmp);
    let host_sampling_ms = timed.iter().map(|t| t.1).sum::<f64>() / TIMED as f64;
    model.profile_next_step();
    step(model);
    Point {
        shape,
        tokens: seqs.iter().map(|s| s.tokens.len()).sum(),
        sampled,
        step_ms_p50: quantile(&times, 0.5),
        step_ms_p99: quantile(&times, 0.99),
        host_sampling_ms,
        phases_ms: model.last_phases().iter().map(|p| (p.name, p.ms)).collect(),
    }
}

fn main() {
    // The temporary model is kept until the bench ends: its file is removed on drop.
    let (path, _random_model) = bench_model().expect("writing random weights of the shapes");
    if !path.is_file() {
        println!("skipping: no model at {}", path.display());
        return;
    }
    let mut executor = match GpuExecutor::load(&path, 0, Some(16_384)) {
        Ok(executor) => executor,
        Err(e) => {
            println!("skipping: no CUDA device ({e})");
            return;
        }
    };
    let path_name = executor.path_name();
    println!(
        "the {path_name} step on {}, {} KV blocks",
        executor.device_name(),
        executor.kv_blocks()
    );
    let model = executor.llama_mut();
    let token = [1u32];
    let mut points = Vec::new();
    for context in [256usize, 1024] {
        let per_seq = (context + 1).div_ceil(BLOCK);
        for batch in [1usize, 8, 32, 64, 128] {
            let tables: Vec<Vec<u32>> = (0..batch)
                .map(|i| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect())
                .collect();
            let seqs: Vec<GpuSeq<'_>> = tables
                .iter()
                .map(|table| GpuSeq {
                    table,
                    start: context,
                    tokens: &token,
                    logits: true,
                })
                .collect();
            points.push(measure(
                model,
                format!("decode {batch} at {context}"),
                &seqs,
            ));
        }
    }
    let prompt: Vec<u32> = (0..2048u32).map(|i| 100 + i % 1000).collect();
    let long_table: Vec<u32> = (0..(2048 / BLOCK) as u32).collect();
    for chunk in [128usize, 512, 2048] {
        let seqs = [GpuSeq {
            table: &long_table,
            start: 0,
            tokens: &prompt[..chunk],
            logits: true,
        }];
        points.push(measure(model, format!("prefill {chunk}"), &seqs));
    }
    let per_seq = 257usize.div_ceil(BLOCK);
    let tables: Vec<Vec<u32>> = (0..32)
        .map(|i| (200 + i * per_seq) as u32..(200 + (i + 1) * per_seq) as u32)
        .map(|range| range.collect())
        .collect();
    let mut mixed: Vec<GpuSeq<'_>> = tables
        .iter()
        .map(|table| GpuSeq {
            table,
            start: 256,
            tokens: &token,
            logits: true,
        })
        .collect();
    mixed.push(GpuSeq {
        table: &long_table,
        start: 0,
        tokens: &prompt[..512],
        logits: false,
    });
    points.push(measure(
        model,
        "mixed: 32 decodes + 512 prefill".into(),
        &mixed,
    ));

    println!(
        "| step | shape | step ms p50 | p99 | host sampling ms | device phases ms |\n| --- | --- | ---: | ---: | ---: | --- |"
    );
    for p in &points {
        let phases: Vec<String> = p
            .phases_ms
            .iter()
            .map(|(name, ms)| format!("{name} {ms:.3}"))
            .collect();
        println!(
            "| {path_name} | {} | {:.3} | {:.3} | {:.3} | {} |",
            p.shape,
            p.step_ms_p50,
            p.step_ms_p99,
            p.host_sampling_ms,
            phases.join(", ")
        );
    }
    if let Some(dir) = std::env::var_os("RINGMASTER_BENCH_OUT") {
        let file = PathBuf::from(dir).join(format!("gpu_step-{path_name}.json"));
        let json = serde_json::json!({ "path": path_name, "points": points });
        std::fs::write(&file, serde_json::to_vec_pretty(&json).expect("json"))
            .expect("writing the figures");
        println!("figures in {}", file.display());
    }
}
