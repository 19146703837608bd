//! Summaries of replays: per policy, the figures the routing section of `BENCHMARKS.md`
//! quotes, as a table and as JSON.
//!
//! This module owns turning [`RunData`] into numbers and text; it must not run anything.

use serde::Serialize;

use crate::oracle::Hits;
use crate::run::RunData;

/// One policy's figures on one scenario.
#[derive(Clone, Debug, Serialize)]
pub struct PolicySummary {
    /// The router (`native`, `builtin:NAME` or a component's path).
    pub policy: String,
    /// Requests replayed.
    pub requests: usize,
    /// Of those, requests that failed.
    pub failed: usize,
    /// Cached prompt tokens over prompt tokens, as the servers counted them.
    pub token_hit_ratio: f64,
    /// Time to first token, seconds (modelled).
    pub ttft_p50_s: f64,
    /// 90th percentile.
    pub ttft_p90_s: f64,
    /// 99th percentile.
    pub ttft_p99_s: f64,
    /// Arrival to the last token, 99th percentile.
    pub e2e_p99_s: f64,
    /// Time per output token after the first, 99th percentile over requests.
    pub tpot_p99_s: f64,
    /// Requests per modelled second, over the whole run.
    pub throughput_rps: f64,
    /// Busiest server's finished requests over the mean.
    pub load_max_mean_requests: f64,
    /// Busiest server's busy time over the mean.
    pub load_max_mean_busy: f64,
    /// Hit ratio over the shared-LRU oracle's.
    pub vs_shared_lru: f64,
    /// Hit ratio over the unbounded oracle's.
    pub vs_unbounded: f64,
    /// Routing decisions by reason.
    pub decisions: Vec<(String, u64)>,
    /// Policy faults (each fell back to the ring).
    pub policy_faults: u64,
    /// Assignments over the bounded-load cap (0: the cap held).
    pub over_cap: u64,
    /// Prompt tokens the servers computed (not found in their caches): the prefill work.
    pub uncached_tokens: u64,
}

/// The figures of one run.
pub fn summarise(policy: &str, data: &RunData, lru: Hits, unbounded: Hits) -> PolicySummary {
    let ok: Vec<_> = data.outcomes.iter().filter(|o| o.error.is_none()).collect();
    let prompt: u64 = ok.iter().map(|o| u64::from(o.prompt_tokens)).sum();
    let cached: u64 = ok.iter().map(|o| u64::from(o.cached_tokens)).sum();
    let hit = if prompt == 0 {
        0.0
    } else {
        cached as f64 / prompt as f64
    };
    let mut ttft: Vec<f64> = ok.iter().filter_map(|o| o.ttft_s).collect();
    let mut e2e: Vec<f64> = ok.iter().map(|o| o.e2e_s).collect();
    let mut tpot: Vec<f64> = ok
        .iter()
        .filter(|o| o.output_tokens > 1)
        .filter_map(|o| {
            o.ttft_s
                .map(|first| (o.e2e_s - first) / f64::from(o.output_tokens - 1))
        })
        .collect();
    let requests: Vec<f64> = data.servers.iter().map(|s| s.requests as f64).collect();
    let busy: Vec<f64> = data.servers.iter().map(|s| s.busy_s).collect();
    PolicySummary {
        policy: policy.to_owned(),
        requests: data.outcomes.len(),
        failed: data.outcomes.len() - ok.len(),
        token_hit_ratio: hit,
        ttft_p50_s: percentile(&mut ttft, 0.50),
        ttft_p90_s: percentile(&mut ttft, 0.90),
        ttft_p99_s: percentile(&mut ttft, 0.99),
        e2e_p99_s: percentile(&mut e2e, 0.99),
        tpot_p99_s: percentile(&mut tpot, 0.99),
        throughput_rps: if data.makespan_s > 0.0 {
            ok.len() as f64 / data.makespan_s
        } else {
            0.0
        },
        load_max_mean_requests: max_over_mean(&requests),
        load_max_mean_busy: max_over_mean(&busy),
        vs_shared_lru: ratio(hit, lru.ratio()),
        vs_unbounded: ratio(hit, unbounded.ratio()),
        decisions: data.decisions.clone(),
        policy_faults: data.policy_faults,
        over_cap: data.over_cap,
        uncached_tokens: prompt - cached,
    }
}

/// The `q` quantile (nearest rank) of `values`, 0 when empty.
pub fn percentile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn max_over_mean(values: &[f64]) -> f64 {
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    let max = values.iter().copied().fold(0.0, f64::max);
    ratio(max, mean)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// The Markdown table of `summaries`, with the two oracles' rows.
pub fn table(summaries: &[PolicySummary], lru: Hits, unbounded: Hits) -> String {
    let mut out = String::from(
        "| router | token hit ratio | vs shared LRU | TTFT p50 / p90 / p99 | e2e p99 | TPOT p99 | load max/mean (requests / busy) | failed |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for s in summaries {
        out.push_str(&format!(
            "| {} | {:.1} % | {:.2}× | {} / {} / {} | {} | {} | {:.2} / {:.2} | {} |\n",
            s.policy,
            100.0 * s.token_hit_ratio,
            s.vs_shared_lru,
            seconds(s.ttft_p50_s),
            seconds(s.ttft_p90_s),
            seconds(s.ttft_p99_s),
            seconds(s.e2e_p99_s),
            seconds(s.tpot_p99_s),
            s.load_max_mean_requests,
            s.load_max_mean_busy,
            s.failed,
        ));
    }
    out.push_str(&format!(
        "| one shared LRU of the fleet's memory (computed) | {:.1} % | 1.00× | — | — | — | — | — |\n\
         | one unbounded cache (computed) | {:.1} % | {:.2}× | — | — | — | — | — |\n",
        100.0 * lru.ratio(),
        100.0 * unbounded.ratio(),
        ratio(unbounded.ratio(), lru.ratio()),
    ));
    out
}

fn seconds(s: f64) -> String {
    if s < 1.0 {
        format!("{:.0} ms", s * 1000.0)
    } else {
        format!("{s:.2} s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&mut v, 0.5), 50.0);
        assert_eq!(percentile(&mut v, 0.99), 99.0);
        assert_eq!(percentile(&mut v, 1.0), 100.0);
        assert_eq!(percentile(&mut [], 0.5), 0.0);
        assert_eq!(max_over_mean(&[1.0, 1.0, 4.0]), 2.0);
    }
}
