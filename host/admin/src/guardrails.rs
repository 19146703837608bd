//! The guardrails of a cluster: the same tests as a gateway alone runs (error rate, mean TTFT,
//! the TTFT tail; `ringmaster_experiments::guardrails`), on the fleet's figures (this replica's
//! plus every live replica's lease), and a stop made through the configuration log, so that
//! every replica stops the variant together. One replica judges at a time: the live replica
//! whose name sorts first; the compare-and-set log makes a second, late verdict harmless.

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

/// Every [`ringmaster_gateway::GUARDRAIL_INTERVAL`], while the gateway lives: when this
/// replica judges, stop (weight 0) each live candidate worse than the control beyond doubt.
pub(crate) async fn watch(gateway: Weak<Gateway>, applier: Arc<Applier>) {
    let mut tick = tokio::time::interval(ringmaster_gateway::GUARDRAIL_INTERVAL);
    loop {
        tick.tick().await;
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        if gateway.cluster().is_none() || !judges_here(&gateway) {
            continue;
        }
        // A running rollout's judge watches its candidate, and the slot's weights are the
        // rollout's until it ends.
        if gateway
            .router()
            .rollout()
            .is_some_and(|r| r.phase == ringmaster_slots::router::RolloutPhase::Running)
        {
            continue;
        }
        let others = crate::cluster::others_figures(&gateway).await;
        let set = gateway.router().current();
        let fleet = |v: &ringmaster_slots::router::Variant| {
            let mut figures = v.stats.figures(usize::MAX);
            if let Some(other) = others.get(&*v.name) {
                figures.add(other);
            }
            figures
        };
        let Some(control) = set.variants.first() else {
            continue;
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
            match make(&gateway, Some(&applier), change, None, false).await {
                Ok(done) => {
                    warn!(variant = %candidate.name, control = %control.name, reason = %why, revision = ?done.revision, "guardrail.stopped");
                    gateway
                        .metrics()
                        .guardrail_stops
                        .get_or_create(&ringmaster_gateway::metrics::VariantLabel {
                            variant: candidate.name.to_string(),
                        })
                        .inc();
                }
                Err(e) => {
                    info!(variant = %candidate.name, error = %e.message(), "guardrail.stop_not_logged")
                }
            }
        }
    }
}
