//! Concurrent streams through an engine, measured in the figures the specification's targets
//! are stated in: TTFT p50/p99, decode tokens/s per stream and in all, and the three batch
//! figures (the specification's utilisation, the fill under load, the decode occupancy) with
//! the step counts and times behind them, from the engine's own [`LoadReport`] counters.
//!
//! The same harness drives any executor, so the device bench (`benches/streams.rs`) is dry-run
//! on the CPU executor before device time is spent: every path and figure the GPU run prints
//! is exercised by this module's test in `cargo test`. It must not know which executor runs.

use std::time::{Duration, Instant};

use serde::Serialize;

use crate::{
    ChatMessage, EngineHandle, GenerateEvent, GenerateRequest, LoadReport, Role, SamplingParams,
};

/// One run: `streams` requests submitted at once (a burst), each generating exactly
/// `max_tokens` tokens (`ignore_eos`) at `temperature`.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamsRun {
    /// Concurrent streams.
    pub streams: usize,
    /// Tokens each stream generates.
    pub max_tokens: u32,
    /// Sampling temperature (0: greedy).
    pub temperature: f32,
    /// Makes this run's prompts differ from every other run's, so no prompt is a prefix-cache
    /// hit left by an earlier run.
    pub salt: usize,
}

/// What one run measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StreamsFigures {
    /// Concurrent streams.
    pub streams: usize,
    /// Sampling temperature.
    pub temperature: f32,
    /// Tokens generated in all.
    pub tokens: u64,
    /// Wall time of the run, seconds.
    pub wall_s: f64,
    /// Time to first token, milliseconds: median, 99th percentile, worst.
    pub ttft_p50_ms: f64,
    /// See `ttft_p50_ms`.
    pub ttft_p99_ms: f64,
    /// See `ttft_p50_ms`.
    pub ttft_max_ms: f64,
    /// Decode tokens/s per stream (its tokens after the first over the time after the first):
    /// median and slowest stream.
    pub per_stream_tok_s_p50: f64,
    /// See `per_stream_tok_s_p50`.
    pub per_stream_tok_s_min: f64,
    /// Tokens generated over the wall time.
    pub total_tok_s: f64,
    /// Engine steps in the run.
    pub steps: u64,
    /// Sequences per step.
    pub mean_batch: f64,
    /// The specification's batch utilisation: step tokens over the step budget.
    pub utilisation: f64,
    /// Over the steps that left requests waiting, tokens over what each step could hold
    /// (`None` when no step did).
    pub fill_under_load: Option<f64>,
    /// Decodes over sequences ready to decode, summed over steps.
    pub decode_occupancy: Option<f64>,
    /// Executor busy time over the wall time.
    pub busy_fraction: f64,
    /// Executor time per step, milliseconds.
    pub mean_step_ms: f64,
    /// Wall time not spent in the executor, per step, milliseconds (the engine, the runtime
    /// and the streams' consumers).
    pub host_ms_per_step: f64,
}

impl StreamsFigures {
    /// A Markdown table's header for [`StreamsFigures::row`].
    pub const HEADER: &'static str = "| streams | T | TTFT p50 ms | TTFT p99 ms | tok/s per stream (p50, min) | tok/s in all | steps | mean batch | utilisation | fill under load | decode occupancy | step ms | host ms/step |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |";

    /// This run as a row of [`StreamsFigures::HEADER`]'s table.
    pub fn row(&self) -> String {
        let share = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{:.1} %", v * 100.0));
        format!(
            "| {} | {} | {:.1} | {:.1} | {:.1}, {:.1} | {:.0} | {} | {:.1} | {:.1} % | {} | {} | {:.2} | {:.2} |",
            self.streams,
            self.temperature,
            self.ttft_p50_ms,
            self.ttft_p99_ms,
            self.per_stream_tok_s_p50,
            self.per_stream_tok_s_min,
            self.total_tok_s,
            self.steps,
            self.mean_batch,
            self.utilisation * 100.0,
            share(self.fill_under_load),
            share(self.decode_occupancy),
            self.mean_step_ms,
            self.host_ms_per_step,
        )
    }
}

/// Why a run could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// The engine refused a request.
    #[error("stream {stream} was refused: {why}")]
    Refused {
        /// Which stream.
        stream: usize,
        /// The engine's reason.
        why: String,
    },
    /// A stream failed or ended before its tokens.
    #[error("stream {stream} ended early: {why}")]
    Ended {
        /// Which stream.
        stream: usize,
        /// What it said.
        why: String,
    },
}

/// One stream's timings.
#[derive(Debug)]
struct StreamTimes {
    ttft: Duration,
    /// From the first token to the last.
    decode: Duration,
    tokens: u32,
}

/// A distinct ~190-token prompt (with SmolLM2's chat template) for stream `i` of run `salt`:
/// nothing shared but the template.
fn prompt(salt: usize, i: usize) -> String {
    format!(
        "Request {salt}-{i}: summarise, in plain words, why a paged KV cache lets a server batch \
         many conversations at once. {}",
        "Mention memory, prefixes and preemption. ".repeat(12)
    )
}

async fn one_stream(
    engine: EngineHandle,
    run: StreamsRun,
    i: usize,
) -> Result<StreamTimes, MeasureError> {
    let started = Instant::now();
    let mut events = engine
        .submit(GenerateRequest {
            request_id: format!("measure-{}-{i}", run.salt),
            system: None,
            messages: vec![ChatMessage {
                role: Role::User,
                text: prompt(run.salt, i),
                ..Default::default()
            }],
            max_tokens: run.max_tokens,
            stop_sequences: Vec::new(),
            sampling: SamplingParams {
                temperature: Some(run.temperature),
                seed: Some(i as u64),
                ignore_eos: true,
                ..Default::default()
            },
            prompt: None,
            priority: 0,
            tools: None,
            effort: None,
            output_format: None,
        })
        .map_err(|e| MeasureError::Refused {
            stream: i,
            why: e.to_string(),
        })?;
    let (mut first, mut last) = (None, None);
    while let Some(event) = events.next().await {
        match event {
            GenerateEvent::Token { .. } => {
                let now = started.elapsed();
                first.get_or_insert(now);
                last = Some(now);
            }
            GenerateEvent::Finished { output_tokens, .. } => {
                let ttft = first.unwrap_or_else(|| started.elapsed());
                return Ok(StreamTimes {
                    ttft,
                    decode: last.unwrap_or(ttft).saturating_sub(ttft),
                    tokens: output_tokens,
                });
            }
            GenerateEvent::Failed { message } => {
                return Err(MeasureError::Ended {
                    stream: i,
                    why: message,
                });
            }
            GenerateEvent::Started { .. }
            | GenerateEvent::ToolCall { .. }
            | GenerateEvent::Reasoning { .. } => {}
        }
    }
    Err(MeasureError::Ended {
        stream: i,
        why: "the stream closed without finishing".into(),
    })
}

/// The `p`-quantile of sorted values (nearest rank; 0 for none).
pub fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ratio(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// Runs `run` on `engine` (which must be idle, with `max_running` of at least `run.streams` to
/// measure a full batch) and measures it.
pub async fn run_streams(
    engine: &EngineHandle,
    run: &StreamsRun,
) -> Result<StreamsFigures, MeasureError> {
    let before = engine.load();
    let started = Instant::now();
    let tasks: Vec<_> = (0..run.streams)
        .map(|i| tokio::spawn(one_stream(engine.clone(), run.clone(), i)))
        .collect();
    let mut times = Vec::with_capacity(tasks.len());
    for (i, task) in tasks.into_iter().enumerate() {
        let result = task.await.map_err(|e| MeasureError::Ended {
            stream: i,
            why: e.to_string(),
        })?;
        times.push(result?);
    }
    let wall = started.elapsed().as_secs_f64();
    let after = engine.load();
    Ok(figures(run, &times, wall, &before, &after))
}

fn figures(
    run: &StreamsRun,
    times: &[StreamTimes],
    wall: f64,
    before: &LoadReport,
    after: &LoadReport,
) -> StreamsFigures {
    let delta = |f: fn(&LoadReport) -> u64| f(after).saturating_sub(f(before));
    let steps = delta(|l| l.steps);
    let busy = after.busy_seconds_total - before.busy_seconds_total;
    let mut ttft: Vec<f64> = times.iter().map(|t| t.ttft.as_secs_f64() * 1e3).collect();
    ttft.sort_by(f64::total_cmp);
    let mut rates: Vec<f64> = times
        .iter()
        .filter(|t| t.tokens > 1 && !t.decode.is_zero())
        .map(|t| f64::from(t.tokens - 1) / t.decode.as_secs_f64())
        .collect();
    rates.sort_by(f64::total_cmp);
    let tokens = delta(|l| l.generated_tokens_total);
    StreamsFigures {
        streams: run.streams,
        temperature: run.temperature,
        tokens,
        wall_s: wall,
        ttft_p50_ms: quantile(&ttft, 0.5),
        ttft_p99_ms: quantile(&ttft, 0.99),
        ttft_max_ms: ttft.last().copied().unwrap_or(0.0),
        per_stream_tok_s_p50: quantile(&rates, 0.5),
        per_stream_tok_s_min: rates.first().copied().unwrap_or(0.0),
        total_tok_s: tokens as f64 / wall.max(f64::MIN_POSITIVE),
        steps,
        mean_batch: ratio(delta(|l| l.step_sequences_total), steps).unwrap_or(0.0),
        utilisation: ratio(
            delta(|l| l.step_tokens_total),
            delta(|l| l.step_budget_tokens_total),
        )
        .unwrap_or(0.0),
        fill_under_load: ratio(
            delta(|l| l.loaded_step_tokens_total),
            delta(|l| l.loaded_step_capacity_tokens_total),
        ),
        decode_occupancy: ratio(
            delta(|l| l.decode_tokens_total),
            delta(|l| l.decode_ready_total),
        ),
        busy_fraction: busy / wall.max(f64::MIN_POSITIVE),
        mean_step_ms: busy * 1e3 / steps.max(1) as f64,
        host_ms_per_step: (wall - busy).max(0.0) * 1e3 / steps.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EngineConfig;

    #[tokio::test]
    async fn a_burst_on_the_simulated_engine_yields_every_figure() {
        let engine = EngineHandle::spawn(EngineConfig {
            time_scale: 0.0,
            max_running: 4,
            ..EngineConfig::simulated("measure")
        })
        .unwrap();
        let run = StreamsRun {
            streams: 6,
            max_tokens: 5,
            temperature: 1.0,
            salt: 1,
        };
        let f = run_streams(&engine, &run).await.unwrap();
        assert_eq!(f.tokens, 30);
        assert!(f.steps >= 5);
        assert!(f.ttft_p50_ms <= f.ttft_p99_ms && f.ttft_p99_ms <= f.ttft_max_ms);
        assert!(f.per_stream_tok_s_min > 0.0);
        assert!(f.per_stream_tok_s_min <= f.per_stream_tok_s_p50);
        assert!(f.mean_batch > 1.0 && f.mean_batch <= 4.0);
        assert!(f.utilisation > 0.0 && f.utilisation <= 1.0);
        // Six streams and four places: the first steps left two waiting.
        let fill = f.fill_under_load.expect("steps under load");
        assert!(fill > 0.0 && fill <= 1.0);
        assert_eq!(f.decode_occupancy, Some(1.0));
        assert!(f.row().starts_with("| 6 | 1 |"));
        assert_eq!(
            f.row().matches('|').count(),
            StreamsFigures::HEADER
                .lines()
                .next()
                .unwrap()
                .matches('|')
                .count()
        );
        let json = serde_json::to_value(&f).unwrap();
        assert_eq!(json["streams"], 6);
    }
}
