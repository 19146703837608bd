//! `fleet-replay`: a Mooncake trace replayed on the wall clock over HTTP through one or more
//! gateway replicas (each request sent to one of them at random, seeded), for the fleet
//! benchmark (`tests/bench/fleet.sh`). Each request is the trace's rendered conversation turn
//! (`ringmaster-replay`'s renderer, so turns share text exactly where the trace shares blocks),
//! streamed; what comes back is the token hit ratio (cached over prompt tokens, as the servers
//! counted them) and the time to first token.
//!
//!   fleet-replay run --trace T.jsonl --limit 2000 --speedup 10 --seed 7 \
//!       --gateway http://127.0.0.1:18100 --gateway http://127.0.0.1:18101 --out run.json
//!   fleet-replay plot --runs runs.jsonl --out hit-ratio.svg
//!
//! `plot` draws the token hit ratio against the replica count, one line per mode (`cluster`,
//! `alone`), from the runs' JSON lines (each with `mode` and `replicas` added).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use futures_util::StreamExt;
use ringmaster_replay::{earlier_turns, render, trace};
use serde_json::{Value, json};

#[derive(Parser, Debug)]
enum Cli {
    /// Replay a trace through gateways.
    Run(Args),
    /// Plot the hit ratio against the replica count.
    Plot(PlotArgs),
}

#[derive(clap::Args, Debug)]
struct PlotArgs {
    /// The runs, one JSON object per line (`mode`, `replicas`, `token_hit_ratio`).
    #[arg(long)]
    runs: PathBuf,
    /// The SVG to write.
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args, Debug)]
struct Args {
    /// The Mooncake-format trace.
    #[arg(long)]
    trace: PathBuf,
    /// Replay its first N requests.
    #[arg(long, default_value_t = 2000)]
    limit: usize,
    /// Arrivals this many times faster than the trace's clock.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Seed of the choice of gateway per request.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// A gateway replica's base URL (repeat for several).
    #[arg(long = "gateway", required = true)]
    gateways: Vec<String>,
    /// Where to write the outcome (JSON).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Clone, Copy, Debug, Default)]
struct Outcome {
    ok: bool,
    ttft_s: f64,
    prompt_tokens: u64,
    cached_tokens: u64,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse() {
        Cli::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?
            .block_on(run(args)),
        Cli::Plot(args) => plot(&args),
    }
}

/// The hit ratio against the replica count, one line per mode.
fn plot(args: &PlotArgs) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let text = std::fs::read_to_string(&args.runs)
        .with_context(|| format!("reading {}", args.runs.display()))?;
    let mut lines: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let run: Value = serde_json::from_str(line)?;
        lines
            .entry(run["mode"].as_str().unwrap_or("?").to_owned())
            .or_default()
            .push((
                run["replicas"].as_f64().unwrap_or(0.0),
                run["token_hit_ratio"].as_f64().unwrap_or(0.0),
            ));
    }
    let top = lines.values().flatten().map(|p| p.1).fold(0.05, f64::max) * 1.2;
    let plot_error = |e: &dyn std::fmt::Display| anyhow::anyhow!("plotting: {e}");
    let root = SVGBackend::new(&args.out, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| plot_error(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Token hit ratio against gateway replicas (8 shared workers)",
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0.5f64..4.5f64, 0.0..top)
        .map_err(|e| plot_error(&e))?;
    chart
        .configure_mesh()
        .x_desc("replicas (requests spread at random)")
        .y_desc("token hit ratio")
        .x_labels(4)
        .draw()
        .map_err(|e| plot_error(&e))?;
    for (i, (mode, points)) in lines.into_iter().enumerate() {
        let points = medians(points);
        let colour = [BLUE, RED, GREEN][i % 3];
        let label = if mode == "cluster" {
            "with --cluster".to_owned()
        } else {
            "without --cluster".to_owned()
        };
        chart
            .draw_series(LineSeries::new(points.clone(), colour.stroke_width(2)))
            .map_err(|e| plot_error(&e))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, colour.filled())),
            )
            .map_err(|e| plot_error(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| plot_error(&e))?;
    root.present().map_err(|e| plot_error(&e))?;
    Ok(())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let requests = trace::load_mooncake(&args.trace, Some(args.limit))
        .with_context(|| format!("reading {}", args.trace.display()))?;
    let parents = trace::previous_turns(&requests);
    let turns = earlier_turns(&requests, &parents);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .pool_max_idle_per_host(256)
        .build()?;
    let gateways = Arc::new(args.gateways.clone());
    let start = Instant::now();
    let first = requests.first().map_or(Duration::ZERO, |r| r.arrival);
    let mut running = tokio::task::JoinSet::new();
    for (index, request) in requests.iter().enumerate() {
        let at = (request.arrival - first).div_f64(args.speedup.max(1e-9));
        tokio::time::sleep_until((start + at).into()).await;
        let pick = xxhash_rust::xxh3::xxh3_64_with_seed(&(index as u64).to_le_bytes(), args.seed);
        let url = format!(
            "{}/v1/messages",
            gateways[usize::try_from(pick % gateways.len() as u64).unwrap_or(0)]
        );
        let body = render::messages_body(request, &turns[index]);
        let client = client.clone();
        running.spawn(async move { one(&client, &url, body).await });
    }
    let mut outcomes = Vec::with_capacity(requests.len());
    while let Some(done) = running.join_next().await {
        outcomes.push(done?);
    }
    let ok: Vec<&Outcome> = outcomes.iter().filter(|o| o.ok).collect();
    let prompt: u64 = ok.iter().map(|o| o.prompt_tokens).sum();
    let cached: u64 = ok.iter().map(|o| o.cached_tokens).sum();
    let mut ttfts: Vec<f64> = ok.iter().map(|o| o.ttft_s).collect();
    ttfts.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        if ttfts.is_empty() {
            return 0.0;
        }
        let rank = ((ttfts.len() as f64 - 1.0) * q).round() as usize;
        ttfts[rank.min(ttfts.len() - 1)]
    };
    let report = json!({
        "requests": outcomes.len(),
        "ok": ok.len(),
        "gateways": args.gateways.len(),
        "token_hit_ratio": if prompt == 0 { 0.0 } else { cached as f64 / prompt as f64 },
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "ttft_p50_s": quantile(0.5),
        "ttft_p99_s": quantile(0.99),
        "makespan_s": start.elapsed().as_secs_f64(),
        "speedup": args.speedup,
    });
    std::fs::write(&args.out, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    use std::io::Write;
    writeln!(std::io::stdout(), "{report}")?;
    Ok(())
}

/// Sends one streamed request; reads its usage and its first token's time.
async fn one(client: &reqwest::Client, url: &str, body: Vec<u8>) -> Outcome {
    let sent = Instant::now();
    let mut outcome = Outcome::default();
    let Ok(response) = client
        .post(url)
        .header("content-type", "application/json")
        .header("anthropic-version", "2023-06-01")
        .body(body)
        .send()
        .await
    else {
        return outcome;
    };
    if !response.status().is_success() {
        return outcome;
    }
    let mut stream = response.bytes_stream();
    let mut buffer = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buffer.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            let Some(data) = text.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let Ok(value) = serde_json::from_str::<Value>(data) else {
                continue;
            };
            match value["type"].as_str() {
                Some("message_start") => {
                    let usage = &value["message"]["usage"];
                    let fresh = usage["input_tokens"].as_u64().unwrap_or(0);
                    let cached = usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
                    outcome.prompt_tokens = fresh + cached;
                    outcome.cached_tokens = cached;
                }
                Some("content_block_delta") if outcome.ttft_s == 0.0 => {
                    outcome.ttft_s = sent.elapsed().as_secs_f64();
                }
                Some("message_delta") => {
                    // The final usage, once the server counted the prompt.
                    let usage = &value["usage"];
                    if let Some(fresh) = usage["input_tokens"].as_u64() {
                        let cached = usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
                        outcome.prompt_tokens = fresh + cached;
                        outcome.cached_tokens = cached;
                    }
                }
                Some("message_stop") => outcome.ok = true,
                _ => {}
            }
        }
    }
    outcome
}

/// One point per replica count: the median of its repeats, in replica order.
fn medians(points: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    let mut by_count: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for (replicas, ratio) in points {
        by_count.entry(replicas as u64).or_default().push(ratio);
    }
    by_count
        .into_iter()
        .map(|(replicas, mut ratios)| {
            ratios.sort_by(f64::total_cmp);
            let mid = ratios.len() / 2;
            let median = if ratios.len() % 2 == 0 {
                (ratios[mid - 1] + ratios[mid]) / 2.0
            } else {
                ratios[mid]
            };
            (replicas as f64, median)
        })
        .collect()
}
