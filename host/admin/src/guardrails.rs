//! The guardrails (`[policies] guardrails`): every few seconds, a live candidate router
//! variant worse than the control beyond doubt (error rate, mean TTFT, the TTFT tail;
//! `ringmaster_experiments::guardrails`) gets weight 0, so its traffic goes back to the others;
//! it stays loaded for a look at what happened. Alone, on this gateway's figures, stopped at
//! once; in a cluster, on the fleet's (this replica's plus every live replica's lease), stopped
//! through the configuration log so that every replica stops it together. One replica judges at
//! a time: the live replica whose name sorts first; the compare-and-set log makes a second, late
//! verdict harmless. This is the only guardrail loop: a gateway alone and a replica run it.

use std::sync::{Arc, Weak};

use ringmaster_experiments::guardrails::check_figures;
use ringmaster_gateway::Gateway;
use tracing::{info, warn};

use crate::changes::{Applier, Change, make};

/// Whether this gateway judges the fleet's experiments and rollouts: alone, always; in a
/// cluster, when it is the live replica whose name sorts first and Redis answers
/// ([`ringmaster_cluster::Cluster::judges`], from the lease loop's last read: no Redis call).
pub(crate) fn judges_here(gateway: &Gateway) -> bool {
    gateway.cluster().is_none_or(|cluster| cluster.judges())
}

/// How often the guardrails look at the experiment.
pub const GUARDRAIL_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Every [`GUARDRAIL_INTERVAL`], while the gateway lives and this replica judges: one
/// [`pass`].
pub(crate) async fn watch(gateway: Weak<Gateway>, applier: Option<Arc<Applier>>) {
    let mut tick = tokio::time::interval(GUARDRAIL_INTERVAL);
    loop {
        tick.tick().await;
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        if judges_here(&gateway) {
            pass(&gateway, applier.as_ref()).await;
        }
    }
}

/// Stops (weight 0) each live candidate worse than the control beyond doubt; returns the
/// variants stopped, with why.
pub(crate) async fn pass(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
) -> Vec<(String, String)> {
    let mut stopped = Vec::new();
    // A running rollout's judge watches its candidate, and the slot's weights are the
    // rollout's until it ends.
    if gateway
        .router()
        .rollout()
        .is_some_and(|r| r.phase == ringmaster_slots::router::RolloutPhase::Running)
    {
        return stopped;
    }
    // Alone: no other replica's figures.
    let others = crate::cluster::others_figures(gateway).await;
    let set = gateway.router().current();
    let fleet = |v: &ringmaster_slots::router::Variant| {
        let mut figures = v.stats.figures(usize::MAX);
        if let Some(other) = others.get(&*v.name) {
            figures.add(other);
        }
        figures
    };
    let Some(control) = set.variants.first() else {
        return stopped;
    };
    let control_figures = fleet(control);
    for candidate in set.variants.iter().skip(1).filter(|v| v.weight > 0) {
        let Some(why) = check_figures(&control_figures, &fleet(candidate)) else {
            continue;
        };
        let change = Change::SetRouterWeight {
            variant: candidate.name.to_string(),
            weight: 0,
        };
        match make(gateway, applier, change, None, false).await {
            Ok(done) if done.changed => {
                warn!(variant = %candidate.name, control = %control.name, reason = %why, revision = ?done.revision, "guardrail.stopped");
                gateway
                    .metrics()
                    .guardrail_stops
                    .get_or_create(&ringmaster_gateway::metrics::VariantLabel {
                        variant: candidate.name.to_string(),
                    })
                    .inc();
                stopped.push((candidate.name.to_string(), why));
            }
            Ok(_) => {}
            Err(e) => {
                info!(variant = %candidate.name, error = %e.message(), "guardrail.stop_not_logged")
            }
        }
    }
    stopped
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    const TWO_VARIANTS: &str = r#"
models = ["sim-llama-3-8b"]
[[servers]]
address = "sim://gpu-0"
[[policies.router]]
name = "control"
source = "builtin:least-loaded"
[[policies.router]]
name = "candidate"
source = "builtin:round-robin"
weight = 10
"#;

    fn weights(gateway: &Gateway) -> Vec<(String, u32)> {
        gateway
            .router()
            .current()
            .variants
            .iter()
            .map(|v| (v.name.to_string(), v.weight))
            .collect()
    }

    #[tokio::test]
    async fn a_candidate_failing_beyond_doubt_is_stopped_and_an_equal_one_is_not() {
        let config = ringmaster_config::RawConfig::from_toml(TWO_VARIANTS)
            .unwrap()
            .validate_with_env(|_| None)
            .unwrap();
        let gateway = Gateway::start(config).unwrap();
        let set = gateway.router().current();
        let (control, candidate) = (&set.variants[0], &set.variants[1]);
        // Equal so far (40 requests each, 1 error each, the same TTFTs): nothing happens.
        for (variant, errors) in [(control, 1), (candidate, 1)] {
            variant.stats.requests.store(40, Relaxed);
            variant.stats.errors.store(errors, Relaxed);
            for i in 0..40 {
                variant.stats.record_ttft(0.1 + f64::from(i % 5) * 0.01);
            }
        }
        assert!(pass(&gateway, None).await.is_empty());
        assert_eq!(
            weights(&gateway),
            [("control".to_owned(), 100), ("candidate".to_owned(), 10)]
        );
        // The candidate's requests start failing: 30 of 80.
        candidate.stats.requests.store(80, Relaxed);
        candidate.stats.errors.store(30, Relaxed);
        let stopped = pass(&gateway, None).await;
        assert_eq!(stopped.len(), 1, "{stopped:?}");
        assert_eq!(stopped[0].0, "candidate");
        assert!(stopped[0].1.starts_with("error rate"), "{}", stopped[0].1);
        assert_eq!(
            weights(&gateway),
            [("control".to_owned(), 100), ("candidate".to_owned(), 0)]
        );
        // Stopped once: a stopped candidate is not looked at again.
        assert!(pass(&gateway, None).await.is_empty());
    }
}
