//! Progressive rollouts of router variants: starting one (`PUT /admin/policies/router?…
//! &rollout=1,5,25,50,100&step=10m`, or `[[policies.router]] rollout` at start), stopping
//! one (`DELETE /admin/policies/router/rollout`), how one reads in `GET /admin/experiments`,
//! and the judge that moves it: every [`ROLLOUT_TICK`], the replica that judges (the gateway
//! alone, or the live replica whose name sorts first) reads the fleet's figures for the
//! candidate and the control and stops the rollout when a guardrail trips, or advances it
//! when the step has lasted its time and seen its samples. Every move is a [`Change`], so in
//! a cluster it is a revision of the log that every replica applies, and a replica that
//! restarts resumes the rollout where the log left it. The slot's side (weights, promotion)
//! is `ringmaster_slots::router`'s.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use ringmaster_config::rollout::RolloutPlan;
use ringmaster_experiments::VariantFigures;
use ringmaster_experiments::guardrails::readings;
use ringmaster_gateway::Gateway;
use ringmaster_slots::router::{Rollout, RolloutPhase};
use serde_json::json;
use tracing::{info, warn};

use crate::changes::{Applier, Change, make};

/// How often the judge looks at a running rollout.
pub const ROLLOUT_TICK: Duration = Duration::from_millis(200);

/// What the judge does with a running rollout now.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Nothing yet: the step's time or samples are not there, and no guardrail tripped.
    Hold,
    /// The next step, with the candidate's requests now.
    Advance {
        /// The step to move to.
        index: usize,
        /// The candidate's requests over the fleet now.
        requests: u64,
    },
    /// A guardrail tripped: why.
    Stop(String),
}

/// The judge's verdict on `rollout` at `now_ms`, from the fleet's figures of its control and
/// candidate: a tripped guardrail stops it at any step; otherwise it advances once the step
/// has lasted its time and the candidate has had the plan's samples in it.
pub(crate) fn judge(
    rollout: &Rollout,
    control: &VariantFigures,
    candidate: &VariantFigures,
    now_ms: u64,
) -> Step {
    if let Some(why) = readings(control, candidate)
        .into_iter()
        .find_map(|r| r.breach)
    {
        return Step::Stop(why);
    }
    let due = rollout.next_step_at_ms().is_some_and(|at| now_ms >= at);
    let seen = candidate.requests.saturating_sub(rollout.requests_at_step);
    if due && seen >= rollout.plan.min_samples {
        Step::Advance {
            index: rollout.index + 1,
            requests: candidate.requests,
        }
    } else {
        Step::Hold
    }
}

/// The time now as the log records it (Unix milliseconds).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Each live variant's figures over the fleet: this replica's own plus the others' leases.
pub(crate) async fn fleet_figures(gateway: &Gateway) -> HashMap<String, VariantFigures> {
    let mut figures = crate::cluster::others_figures(gateway).await;
    for variant in &gateway.router().current().variants {
        figures
            .entry(variant.name.to_string())
            .or_default()
            .add(&variant.stats.figures(usize::MAX));
    }
    figures
}

/// The judge, while the gateway lives: starts the rollouts the config declares (once), and
/// moves the running one. `applier` is the replica's (a cluster), or `None` alone.
pub(crate) async fn watch(gateway: Weak<Gateway>, applier: Option<Arc<Applier>>) {
    let mut tick = tokio::time::interval(ROLLOUT_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut declared_started = false;
    loop {
        tick.tick().await;
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        if !crate::guardrails::judges_here(&gateway) {
            continue;
        }
        if !declared_started {
            declared_started = start_declared(&gateway, applier.as_ref()).await;
        }
        let Some(rollout) = gateway
            .router()
            .rollout()
            .filter(|r| r.phase == RolloutPhase::Running)
        else {
            continue;
        };
        let figures = fleet_figures(&gateway).await;
        let empty = VariantFigures::default();
        let control = figures.get(&rollout.control).unwrap_or(&empty);
        let candidate = figures.get(&rollout.variant).unwrap_or(&empty);
        let change = match judge(&rollout, control, candidate, now_ms()) {
            Step::Hold => continue,
            Step::Advance { index, requests } => Change::AdvanceRollout {
                variant: rollout.variant.clone(),
                index,
                at_ms: now_ms(),
                requests,
            },
            Step::Stop(reason) => {
                gateway
                    .metrics()
                    .guardrail_stops
                    .get_or_create(&ringmaster_gateway::metrics::VariantLabel {
                        variant: rollout.variant.clone(),
                    })
                    .inc();
                Change::StopRollout {
                    variant: rollout.variant.clone(),
                    at_ms: now_ms(),
                    reason: format!("guardrail: {reason}"),
                }
            }
        };
        if let Err(e) = make(&gateway, applier.as_ref(), change, None, false).await {
            warn!(variant = %rollout.variant, error = %e.message(), "rollout.move_not_made");
        }
    }
}

/// Starts each rollout `[[policies.router]]` declares, unless the slot already holds it
/// (resumed from the cluster's log, or ended there). Returns whether every one was handled.
async fn start_declared(gateway: &Arc<Gateway>, applier: Option<&Arc<Applier>>) -> bool {
    let mut done = true;
    for spec in &gateway.config().policies.router {
        let Some(plan) = &spec.rollout else {
            continue;
        };
        if gateway
            .router()
            .rollout()
            .is_some_and(|r| r.variant == spec.name)
        {
            continue;
        }
        let bytes = match ringmaster_slots::sources::policy_bytes(&spec.source) {
            Ok(bytes) => bytes::Bytes::from(bytes),
            Err(e) => {
                warn!(variant = %spec.name, error = %e, "rollout.declared_unreadable");
                continue;
            }
        };
        let change = Change::StartRollout {
            variant: spec.name.clone(),
            component: ringmaster_cluster::blobs::content_hash(&bytes),
            plan: plan.clone(),
            at_ms: now_ms(),
            fresh_state: false,
        };
        match make(gateway, applier, change, Some(bytes), false).await {
            Ok(_) => info!(variant = %spec.name, "rollout.declared_started"),
            Err(e) => {
                warn!(variant = %spec.name, error = %e.message(), "rollout.declared_not_started");
                done = false;
            }
        }
    }
    done
}

/// The plan a `PUT /admin/policies/router` asks for (`rollout`, `step`, `min_samples`), if
/// it asks for one.
pub(crate) fn plan_from_query(
    rollout: Option<String>,
    step: Option<String>,
    min_samples: Option<String>,
) -> Result<Option<RolloutPlan>, ringmaster_api::ApiError> {
    match rollout {
        None if step.is_some() || min_samples.is_some() => Err(ringmaster_api::ApiError::invalid(
            "step and min_samples need rollout=STEPS (e.g. rollout=1,5,25,50,100&step=10m)",
        )),
        None => Ok(None),
        Some(steps) => RolloutPlan::parse(&steps, step.as_deref(), min_samples.as_deref())
            .map(Some)
            .map_err(ringmaster_api::ApiError::invalid),
    }
}

/// The slot's rollout for `GET /admin/experiments`: the step, the next step's time, and each
/// guardrail's reading on the fleet's figures; `null` when none ever started.
pub(crate) fn rollout_json(
    gateway: &Gateway,
    others: &HashMap<String, VariantFigures>,
) -> serde_json::Value {
    let Some(rollout) = gateway.router().rollout() else {
        return serde_json::Value::Null;
    };
    let fleet = |name: &str| {
        let mut figures = others.get(name).cloned().unwrap_or_default();
        if let Some(v) = gateway
            .router()
            .current()
            .variants
            .iter()
            .find(|v| &*v.name == name)
        {
            figures.add(&v.stats.figures(usize::MAX));
        }
        figures
    };
    let candidate = fleet(&rollout.variant);
    let now = now_ms();
    json!({
        "variant": rollout.variant,
        "hash": rollout.hash,
        "control": rollout.control,
        "phase": rollout.phase,
        "steps": rollout.plan.steps,
        "step": rollout.index + 1,
        "percent": rollout.percent(),
        "step_seconds": rollout.plan.step_ms as f64 / 1000.0,
        "step_started_ms": rollout.step_started_ms,
        "next_step_at_ms": rollout.next_step_at_ms(),
        "next_step_in_seconds": rollout.next_step_at_ms().map(|at| at.saturating_sub(now) as f64 / 1000.0),
        "min_samples": rollout.plan.min_samples,
        "samples_this_step": candidate.requests.saturating_sub(rollout.requests_at_step),
        "guardrails": readings(&fleet(&rollout.control), &candidate),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_config::rollout::RolloutPlan;

    fn running(index: usize, requests_at_step: u64) -> Rollout {
        Rollout {
            variant: "next".into(),
            hash: "h".into(),
            plan: RolloutPlan::new(&[1, 5, 100], Duration::from_secs(10), Some(30)).unwrap(),
            control: "control".into(),
            others: vec![("control".into(), 100)],
            index,
            step_started_ms: 100_000,
            requests_at_step,
            phase: RolloutPhase::Running,
        }
    }

    fn figures(requests: u64, errors: u64, ttft: f64) -> VariantFigures {
        VariantFigures {
            requests,
            errors,
            ttft: (0..requests)
                .map(|i| ttft + (i % 5) as f64 * 0.001)
                .collect(),
            ..VariantFigures::default()
        }
    }

    #[test]
    fn a_step_advances_once_it_has_lasted_and_seen_its_samples() {
        let rollout = running(0, 0);
        let control = figures(400, 0, 0.1);
        // Too early, then too few samples, then both.
        assert_eq!(
            judge(&rollout, &control, &figures(40, 0, 0.1), 105_000),
            Step::Hold
        );
        assert_eq!(
            judge(&rollout, &control, &figures(20, 0, 0.1), 110_000),
            Step::Hold
        );
        assert_eq!(
            judge(&rollout, &control, &figures(40, 0, 0.1), 110_000),
            Step::Advance {
                index: 1,
                requests: 40
            }
        );
        // The samples count from the step's start.
        assert_eq!(
            judge(&running(1, 40), &control, &figures(60, 0, 0.1), 110_000),
            Step::Hold
        );
    }

    #[test]
    fn a_tripped_guardrail_stops_it_at_any_time() {
        let rollout = running(0, 0);
        let control = figures(400, 0, 0.1);
        let Step::Stop(why) = judge(&rollout, &control, &figures(60, 0, 0.5), 100_001) else {
            panic!("a candidate five times slower stops");
        };
        assert!(why.starts_with("mean TTFT"), "{why}");
        let Step::Stop(why) = judge(&rollout, &control, &figures(60, 30, 0.1), 100_001) else {
            panic!("a candidate failing half its requests stops");
        };
        assert!(why.starts_with("error rate"), "{why}");
    }
}
