//! `GET /admin/experiments`: the router slot's variants compared with its first (the
//! control): TTFT and error rates with always-valid intervals, the p50 and p99 differences,
//! the cache hit ratio, and the shadow's agreement. In a cluster, every figure is the
//! fleet's: this replica's own plus what the other replicas published in their leases.

use std::collections::HashMap;

use ringmaster_experiments::VariantFigures;
use ringmaster_experiments::stats::{self as experiment_stats, summarize};
use ringmaster_gateway::Gateway;
use serde_json::json;

/// The experiments, with `others` (variant name → the other replicas' summed figures) added
/// to this replica's own.
pub(crate) fn experiments_json(
    gateway: &Gateway,
    others: &HashMap<String, VariantFigures>,
) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let set = gateway.router().current();
    let figures: Vec<VariantFigures> = set
        .variants
        .iter()
        .map(|v| {
            let mut figures = v.stats.figures(usize::MAX);
            if let Some(other) = others.get(&*v.name) {
                figures.add(other);
            }
            figures
        })
        .collect();
    let summaries: Vec<_> = figures
        .iter()
        .map(|f| (f.ttft.clone(), summarize(&f.ttft)))
        .collect();
    let control = summaries.first();
    let variants: Vec<_> = set
        .variants
        .iter()
        .zip(&summaries)
        .zip(&figures)
        .enumerate()
        .map(|(i, ((variant, (samples, summary)), stats))| {
            let requests = stats.requests;
            let mut entry = json!({
                "name": &*variant.name,
                "weight": variant.weight,
                "hash": variant.policy.info().hash,
                "requests": requests,
                "errors": stats.errors,
                "error_rate": if requests == 0 { 0.0 } else { stats.errors as f64 / requests as f64 },
                "faults": stats.faults,
                "prefix_cache_hit_ratio": stats.hit_ratio().unwrap_or(0.0),
                "cached_tokens": {
                    "reported": stats.cached_tokens,
                    "prompt": stats.prompt_tokens,
                    "reachable": stats.reachable_cached_tokens,
                    "achieved": stats.achieved_cached_tokens,
                    "achieved_of_reachable": stats.reach_ratio(),
                },
                "ttft_seconds": summary.as_ref().map(|s| json!({"samples": s.n, "mean": s.mean, "p50": s.p50, "p99": s.p99})),
            });
            if i > 0
                && let Some((control_samples, Some(a))) = control
                && let Some(b) = summary.as_ref()
            {
                let verdict = experiment_stats::verdict(a, b);
                entry["ttft_vs_control"] = json!({
                    "control": &*set.variants[0].name,
                    "samples": [a.n, b.n],
                    "verdict": verdict,
                    "mean_difference_seconds": b.mean - a.mean,
                    // Valid however often it is read (the verdict comes from it).
                    "always_valid_ci95": experiment_stats::always_valid(a, b),
                    // Valid for one look at a fixed sample size.
                    "welch": experiment_stats::welch(a, b),
                    "p50_difference_ci95": experiment_stats::bootstrap_quantile_difference(control_samples, samples, 0.5),
                    "p99_difference_ci95": experiment_stats::bootstrap_quantile_difference(control_samples, samples, 0.99),
                    "method": "verdict from the always-valid interval (mixture SPRT, Johari et al. 2017) once both arms have 30 samples; Welch with Satterthwaite df for a single look; percentile bootstrap for p50 and p99",
                });
            }
            if i > 0 {
                let control_stats = &figures[0];
                let (control_cache, cache) = (&control_stats.cache, &stats.cache);
                entry["hit_ratio_vs_control"] = json!({
                    "control": &*set.variants[0].name,
                    "difference": stats.hit_ratio().zip(control_stats.hit_ratio()).map(|(b, a)| b - a),
                    // For one look, over the last requests of each arm (the TTFT window).
                    "ci95": experiment_stats::bootstrap_hit_ratio_difference(control_cache, cache),
                    // Valid however often it is read: the mean per-request hit fraction.
                    "per_request_always_valid_ci95":
                        experiment_stats::always_valid_hit_fraction(control_cache, cache),
                    "method": "ci95: percentile bootstrap over requests of the token-weighted hit ratio (sum cached / sum prompt), for one look, once both arms have 30 requests; per_request_always_valid_ci95: mixture SPRT (as for TTFT) on the difference of the mean per-request hit fraction, valid at every look",
                });
            }
            entry
        })
        .collect();
    let shadow = set.shadow.as_ref().map(|shadow| {
        let decisions = shadow.stats.shadow_decisions.load(Relaxed);
        let agreements = shadow.stats.shadow_agreements.load(Relaxed);
        json!({
            "name": &*shadow.name,
            "hash": shadow.policy.info().hash,
            "decisions": decisions,
            "agreement_rate": if decisions == 0 { 0.0 } else { agreements as f64 / decisions as f64 },
            "faults": shadow.stats.faults.load(Relaxed),
            "would_be_load": shadow.stats.shadow_load(),
        })
    });
    let rollout = crate::rollout::rollout_json(gateway, others);
    json!({ "variants": variants, "shadow": shadow, "rollout": rollout })
}
