//! Phase 3, route: the router slot's variant for the request's key decides on the call's pool
//! snapshot (or the native ring, when there is none or it faults), the pool carries the
//! decision out under the bounded-load cap and counts the request in flight. The decision is
//! counted (reason, variant, the policy call's time, faults, load to cap) and logged, and the
//! request's bookkeeping ([`Tracker`]) begins.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_config::SpillReason;
use ringmaster_policy_engine::PolicyFault;
use ringmaster_pool::{Decision, DecisionReason};
use tracing::debug;

use super::Call;
use crate::metrics::{DecisionLabels, FaultLabels, OutcomeLabels, VariantLabel};
use crate::state::Gateway;
use crate::track::{Observation, Reach, Tracker};
use ringmaster_slots::router::{RouteOutcome, Routed, RouterSlot};

impl Call {
    /// Phase 3: see the module's documentation.
    pub(crate) fn route(&mut self) -> Result<(Routed, Tracker), ApiError> {
        let gateway = &self.gateway;
        let span = self
            .trace
            .as_ref()
            .map(|parent| tracing::info_span!(parent: parent, "route", otel.kind = "internal"));
        let _entered = span.as_ref().map(tracing::Span::enter);
        let routing_started = Instant::now();
        // A spill-over pool is routed on its own ring: the router's policies choose among the
        // model's own servers (and may have declined there).
        let route = if self.spilled.is_some() {
            RouterSlot::route_natively
        } else {
            RouterSlot::route
        };
        let outcome = route(
            &gateway.router,
            &gateway.pool,
            &self.pool,
            (&self.input, self.chat()),
            &self.policy,
        );
        let routed = match outcome {
            RouteOutcome::Routed(routed) => *routed,
            RouteOutcome::Rejected { variant, reason } => {
                variant.stats.errors.fetch_add(1, Ordering::Relaxed);
                drop(_entered);
                return self.spill_or(
                    SpillReason::Policy,
                    ApiError::new(
                        ErrorKind::Overloaded,
                        format!("the router policy declined the request: {reason}"),
                    )
                    .with_retry_after(Duration::from_secs(1)),
                );
            }
            RouteOutcome::NoServers => {
                drop(_entered);
                return self.spill_or(
                    SpillReason::NoServer,
                    ApiError::new(ErrorKind::Overloaded, "no GPU servers in the pool")
                        .with_retry_after(Duration::from_secs(5)),
                );
            }
        };
        // What the decision could have had of the cache and what it took is counted when the
        // request finishes, in the tokens its server counted (the tracker's `reach`).
        let tracker = self.tracker(&routed);
        let reason = record_decision(
            gateway,
            &tracker,
            &routed.decision,
            routed.fault.as_ref(),
            routing_started.elapsed(),
        );
        gateway
            .metrics
            .pair_decisions
            .get_or_create(&OutcomeLabels {
                outcome: routed.pair.outcome.as_str(),
            })
            .inc();
        if let Some(span) = &span {
            describe_decision(span, &routed, &tracker, reason);
        }
        debug!(
            server = routed.decision.server.id(),
            pair = routed.pair.outcome.as_str(),
            prefill = routed.pair.prefill.as_ref().map(|leg| leg.server.id()),
            pair_why = %routed.pair.why,
            reason = routed.decision.reason.as_str(),
            variant = %tracker.label.variant,
            key_source = self.input.source.as_str(),
            prefix_hashes = self.input.prefix_hashes.len(),
            tier = %self.caller.tier,
            key = %self.caller.key_label,
            "request.routed"
        );
        Ok((routed, tracker))
    }

    /// Routes again in the `[[fallback]]` pool a rule names for `reason`, once; `refusal`
    /// when none takes the request (or it already spilled).
    fn spill_or(
        &mut self,
        reason: SpillReason,
        refusal: ApiError,
    ) -> Result<(Routed, Tracker), ApiError> {
        if self.spilled.is_some() {
            return Err(refusal);
        }
        let fleet = self.gateway.pool.snapshot();
        match super::spill::spill(
            &self.gateway,
            &fleet,
            &self.caller.tenant,
            &self.served_model,
            reason,
            false,
        ) {
            Some(to) => {
                self.spilled = Some(to.name);
                self.pool = to.pool;
                self.served_model = to.served_model;
                self.adapter = super::AdapterUse::None;
                self.route()
            }
            None => Err(refusal),
        }
    }

    /// The bookkeeping of a request routed as `routed` says.
    fn tracker(&self, routed: &Routed) -> Tracker {
        let gateway = &self.gateway;
        let Routed {
            decision,
            variant,
            fault,
            ..
        } = routed;
        // A learning router hears how each request it decided went (`observe`).
        let observation = variant
            .as_ref()
            .filter(|v| v.policy.learns() && fault.is_none())
            .map(|_| Observation {
                request_id: self.id.clone(),
                routing_key: self.policy.routing_key,
                decided: matches!(decision.reason, DecisionReason::Policy)
                    .then(|| decision.server.id().to_owned()),
                server: decision.server.id().to_owned(),
                ttft_us: AtomicU64::new(u64::MAX),
            });
        Tracker {
            gateway: gateway.clone(),
            charged: self
                .caller
                .is_limited()
                .then(|| (self.caller.clone(), self.request.estimated_tokens)),
            fair_share: gateway
                .admission
                .is_active()
                .then(|| self.caller.tenant.to_string()),
            observation,
            label: VariantLabel {
                variant: variant
                    .as_ref()
                    .map_or_else(|| "native".to_owned(), |v| v.name.to_string()),
            },
            variant: variant.clone(),
            door: self.request.door,
            started: self.started,
            reach: Reach {
                reachable: routed.seen.reach.0,
                achieved: routed.seen.reach.1,
                of: self.policy.prompt_tokens,
            },
            trace: self.trace.clone(),
            attempt_span: None,
            record: gateway.recorder().map(|r| {
                r.start(
                    self.started,
                    &self.input.prefix_hashes,
                    gateway.config.prefix_hashing.chunk_bytes,
                )
            }),
        }
    }
}

/// The routing decision on its span: which policy version decided, the server, what it saw
/// of that server's cache and load, whether the bounded-load walk spilled, the call's time.
fn describe_decision(
    span: &tracing::Span,
    routed: &ringmaster_slots::router::Routed,
    tracker: &Tracker,
    reason: &'static str,
) {
    use ringmaster_telemetry::SpanExt;
    use ringmaster_telemetry::semconv as k;
    let decision = &routed.decision;
    span.attribute(k::POLICY_SLOT, "router");
    span.attribute(k::POLICY_VARIANT, tracker.label.variant.clone());
    if let Some(variant) = &routed.variant {
        span.attribute(k::POLICY_VERSION, variant.policy.info().hash.clone());
    }
    if let Some(time) = routed.seen.policy_time {
        span.attribute(k::POLICY_DURATION_US, time.as_micros() as i64);
    }
    if let Some(fault) = &routed.fault {
        span.attribute(k::POLICY_FAULT, fault.kind());
    }
    span.attribute(k::ROUTING_SERVER, decision.server.id().to_owned());
    span.attribute(k::ROUTING_REASON, reason);
    span.attribute(k::ROUTING_PAIR, routed.pair.outcome.as_str());
    if let Some(leg) = &routed.pair.prefill {
        span.attribute(k::ROUTING_PREFILL_SERVER, leg.server.id().to_owned());
    }
    span.attribute(
        k::ROUTING_SPILLED,
        !decision.skipped.is_empty()
            || matches!(
                decision.reason,
                DecisionReason::BoundedLoadSpill | DecisionReason::PolicyOverCap
            ),
    );
    span.attribute(k::ROUTING_CANDIDATES, routed.seen.candidates as i64);
    if let Some(held) = routed.seen.cached_hashes {
        span.attribute(k::ROUTING_CACHED_BLOCKS, i64::from(held));
    }
    span.attribute(
        k::ROUTING_UNCACHED_TOKENS,
        routed.seen.uncached_tokens as i64,
    );
    span.attribute(k::ROUTING_IN_FLIGHT, decision.load_after as i64);
    if let Some(capacity) = decision.capacity {
        span.attribute(k::ROUTING_CAPACITY, capacity as i64);
    }
    let load = decision.server.engine().load();
    span.attribute(k::ROUTING_WAITING, i64::from(load.waiting));
    span.attribute(
        k::ROUTING_PREFILL_BACKLOG,
        decision.server.fleet_prefill_backlog() as i64,
    );
}

/// Counts a routing decision: its reason, the policy call's time, a fault, the load to cap.
/// Returns the reason as counted.
fn record_decision(
    gateway: &Gateway,
    tracker: &Tracker,
    decision: &Decision,
    fault: Option<&PolicyFault>,
    elapsed: Duration,
) -> &'static str {
    let reason = match (fault, decision.reason) {
        (Some(_), _) => "fallback",
        (None, DecisionReason::Policy) => {
            // `preferred` is the key's owner on the ring.
            if decision
                .preferred
                .as_ref()
                .is_some_and(|owner| owner.id() == decision.server.id())
            {
                "affinity"
            } else {
                "policy-other"
            }
        }
        (None, reason) => reason.as_str(),
    };
    gateway
        .metrics
        .routing_decisions
        .get_or_create(&DecisionLabels {
            variant: tracker.label.variant.clone(),
            reason,
        })
        .inc();
    gateway
        .metrics
        .routing_seconds
        .get_or_create(&tracker.label)
        .observe(elapsed.as_secs_f64());
    if let Some(fault) = fault {
        gateway
            .metrics
            .policy_faults
            .get_or_create(&FaultLabels {
                slot: "router",
                variant: tracker.label.variant.clone(),
                kind: fault.kind(),
            })
            .inc();
    }
    if let Some(capacity) = decision.capacity {
        gateway
            .metrics
            .routing_load_to_cap
            .observe(decision.load_after as f64 / capacity.max(1) as f64);
    }
    reason
}
