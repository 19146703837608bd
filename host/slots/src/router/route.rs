//! The router slot at work: one request routed (the variant's policy decides, the pool
//! carries it out under the cap, a fault falls back to the ring and is counted, the shadow
//! decides alongside), and the same decision explained with nothing counted.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use ringmaster_policy_engine::{PolicyFault, PolicyRequest, RouteDecision};
use ringmaster_pool::kv_view::ChatPrompt;
use ringmaster_pool::{Decision, Pool, PoolSnapshot};
use tracing::warn;

use super::pair::{self, PairPlan};
use super::view::PoolView;
use super::{Pair, RouteOutcome, Routed, RouterSlot, Seen, Variant};
use ringmaster_pool::RoutingInput;

impl RouterSlot {
    /// Routes one request: the variant's policy decides (or the ring, when there is none or it
    /// faults) and the pool carries it out.
    ///
    /// Everything is decided on `snapshot`, the request's one view of the pool.
    pub fn route(
        &self,
        pool: &Pool,
        snapshot: &PoolSnapshot,
        (input, chat): (&RoutingInput, ChatPrompt<'_>),
        request: &PolicyRequest,
    ) -> RouteOutcome {
        let set = self.set.load();
        let variant = set.pick(input.key).cloned();
        self.route_by(
            (pool, snapshot),
            (input, chat),
            request,
            (variant, set.shadow.as_ref()),
        )
    }

    /// Routes one request on the native ring alone, with no policy and no shadow: a request
    /// in a spill-over pool (`[[fallback]]`), whose servers the router's policies do not
    /// choose among (they decided, or declined, on the model's own).
    pub fn route_natively(
        &self,
        pool: &Pool,
        snapshot: &PoolSnapshot,
        (input, chat): (&RoutingInput, ChatPrompt<'_>),
        request: &PolicyRequest,
    ) -> RouteOutcome {
        self.route_by((pool, snapshot), (input, chat), request, (None, None))
    }

    /// [`Self::route`] by `variant` (`None`: the ring), with `shadow` deciding alongside.
    fn route_by(
        &self,
        (pool, snapshot): (&Pool, &PoolSnapshot),
        (input, chat): (&RoutingInput, ChatPrompt<'_>),
        request: &PolicyRequest,
        (variant, shadow): (Option<Arc<Variant>>, Option<&Arc<Variant>>),
    ) -> RouteOutcome {
        if snapshot.servers.is_empty() {
            return RouteOutcome::NoServers;
        }
        let view = PoolView::new(snapshot, pool, input, chat);
        let mut fault = None;
        let mut policy_time = None;
        // A 0.3.0 router's own pair: its prefill server (none: whole) and why.
        let mut routers_pair: Option<(Option<String>, String)> = None;
        let routed = match &variant {
            None => pool.route_on(snapshot, input),
            Some(variant) => match timed(&mut policy_time, || variant.policy.route(&view, request))
            {
                Ok(RouteDecision::Route(id)) => {
                    variant.consecutive_faults.store(0, Ordering::Relaxed);
                    pool.assign_on(snapshot, &id, input, self.guard)
                }
                Ok(RouteDecision::Pair {
                    decode,
                    prefill,
                    reason,
                }) => {
                    variant.consecutive_faults.store(0, Ordering::Relaxed);
                    routers_pair = Some((prefill, reason));
                    pool.assign_on(snapshot, &decode, input, self.guard)
                }
                Ok(RouteDecision::Reject(reason)) => {
                    variant.consecutive_faults.store(0, Ordering::Relaxed);
                    return RouteOutcome::Rejected {
                        variant: variant.clone(),
                        reason,
                    };
                }
                Err(policy_fault) => {
                    self.on_fault(variant, &policy_fault);
                    fault = Some(policy_fault);
                    pool.route_on(snapshot, input)
                }
            },
        };
        let Some((decision, mut in_flight)) = routed else {
            return RouteOutcome::NoServers;
        };
        let reach = view.reach(decision.server.id(), request.prompt_tokens);
        let uncached = view.uncached_tokens(decision.server.id(), request.prompt_tokens);
        let pair = self.pair_for(
            (pool, snapshot),
            &decision.server,
            routers_pair,
            (uncached, request.prompt_tokens),
            (input, chat),
        );
        let prefill = pair.count(pool, input);
        if prefill.is_none() {
            // A split request's decode server computes only the prompt's last tokens.
            in_flight.charge_prefill(uncached);
        }
        if let Some(variant) = &variant {
            variant.stats.requests.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(shadow) = shadow {
            self.run_shadow(shadow, &view, request, decision.server.id());
        }
        RouteOutcome::Routed(Box::new(Routed {
            seen: Seen {
                cached_hashes: view.matched(decision.server.id()),
                uncached_tokens: uncached,
                policy_time,
                candidates: snapshot.servers.len(),
                reach,
            },
            decision,
            in_flight,
            variant,
            fault,
            pair: Pair {
                outcome: pair.outcome,
                why: pair.why,
                prefill,
            },
        }))
    }

    /// The pair for a request routed to `decode`: the router's own (`routers_pair`: the
    /// prefill server it named, or none, and why) when it gave one, else the host's rule over
    /// the `uncached` of `prompt_tokens` the decode server would compute. Routing and
    /// explaining both ask here, so that explain shows what routing does.
    fn pair_for(
        &self,
        (pool, snapshot): (&Pool, &PoolSnapshot),
        decode: &Arc<ringmaster_pool::Server>,
        routers_pair: Option<(Option<String>, String)>,
        (uncached, prompt_tokens): (u64, u32),
        prompt: (&RoutingInput, ChatPrompt<'_>),
    ) -> PairPlan {
        match routers_pair {
            Some((prefill, reason)) => pair::chosen(
                pool,
                snapshot,
                decode,
                (prefill.as_deref(), reason),
                prompt,
                prompt_tokens,
            ),
            None => pair::plan(
                pool,
                snapshot,
                decode,
                (uncached, prompt_tokens),
                prompt,
                &self.pair_rule,
            ),
        }
    }

    pub(super) fn on_fault(&self, variant: &Arc<Variant>, fault: &PolicyFault) {
        variant.stats.faults.fetch_add(1, Ordering::Relaxed);
        let in_a_row = variant.consecutive_faults.fetch_add(1, Ordering::Relaxed) + 1;
        warn!(variant = %variant.name, kind = fault.kind(), in_a_row, "policy.fault");
        if in_a_row >= self.rollback_after_faults && !variant.history.is_empty() {
            let hash = variant.policy.info().hash.clone();
            let _ = self.rollback_if(&variant.name, Some(&hash));
        }
    }

    fn run_shadow(
        &self,
        shadow: &Arc<Variant>,
        view: &PoolView<'_>,
        request: &PolicyRequest,
        live: &str,
    ) {
        shadow
            .stats
            .shadow_decisions
            .fetch_add(1, Ordering::Relaxed);
        match shadow.policy.route(view, request) {
            Ok(RouteDecision::Route(id) | RouteDecision::Pair { decode: id, .. }) => {
                if id == live {
                    shadow
                        .stats
                        .shadow_agreements
                        .fetch_add(1, Ordering::Relaxed);
                }
                shadow.stats.record_shadow_choice(id);
            }
            Ok(RouteDecision::Reject(_)) => {}
            Err(fault) => self.on_fault(shadow, &fault),
        }
    }
}

/// What routing would decide for a request now, with nothing counted: the explain endpoint's
/// answer, from the same variant pick, policy call and carrying-out the path uses.
#[derive(Debug)]
pub struct Explained {
    /// The variant whose policy decided (`None`: the native ring).
    pub variant: Option<Arc<Variant>>,
    /// The server the policy named, if it named one.
    pub chosen: Option<String>,
    /// The decision carried out (`None`: no servers, or the policy refused).
    pub decision: Option<Decision>,
    /// The policy's refusal, if it refused.
    pub rejected: Option<String>,
    /// The fault that made the ring decide instead, if any.
    pub fault: Option<PolicyFault>,
    /// Whether the request would be split, and with which prefill server.
    pub pair: Option<PairPlan>,
}

impl RouterSlot {
    /// What [`Self::route`] would decide on `snapshot` now, counting nothing and charging
    /// no fault. The policy runs once, as it would for the request.
    pub fn explain(
        &self,
        pool: &Pool,
        snapshot: &PoolSnapshot,
        (input, chat): (&RoutingInput, ChatPrompt<'_>),
        request: &PolicyRequest,
    ) -> Explained {
        let set = self.set.load();
        let variant = set.pick(input.key).cloned();
        let mut explained = Explained {
            variant: variant.clone(),
            chosen: None,
            decision: None,
            rejected: None,
            fault: None,
            pair: None,
        };
        let view = PoolView::new(snapshot, pool, input, chat);
        let mut routers_pair: Option<(Option<String>, String)> = None;
        match &variant {
            None => explained.decision = pool.explain_on(snapshot, input),
            Some(variant) => match variant.policy.route(&view, request) {
                Ok(RouteDecision::Route(id)) => {
                    explained.decision = pool.explain_assign_on(snapshot, &id, input, self.guard);
                    explained.chosen = Some(id);
                }
                Ok(RouteDecision::Pair {
                    decode,
                    prefill,
                    reason,
                }) => {
                    explained.decision =
                        pool.explain_assign_on(snapshot, &decode, input, self.guard);
                    explained.chosen = Some(decode);
                    routers_pair = Some((prefill, reason));
                }
                Ok(RouteDecision::Reject(reason)) => explained.rejected = Some(reason),
                Err(fault) => {
                    explained.fault = Some(fault);
                    explained.decision = pool.explain_on(snapshot, input);
                }
            },
        }
        if let Some(decision) = &explained.decision {
            let server = decision.server.id();
            view.reach(server, request.prompt_tokens);
            explained.pair = Some(self.pair_for(
                (pool, snapshot),
                &decision.server,
                routers_pair,
                (
                    view.uncached_tokens(server, request.prompt_tokens),
                    request.prompt_tokens,
                ),
                (input, chat),
            ));
        }
        explained
    }
}

/// `call`'s answer, its time kept in `took`.
fn timed<T>(took: &mut Option<std::time::Duration>, call: impl FnOnce() -> T) -> T {
    let started = std::time::Instant::now();
    let answer = call();
    *took = Some(started.elapsed());
    answer
}
