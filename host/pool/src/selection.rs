//! Which server gets a request: the bounded-load walk on the ring, the
//! carrying-out of a router policy's choice under the host's cap, failover past servers that
//! are unreachable or ejected, and the retry's next candidate. One short lock around "read
//! loads, pick, count the request in flight", so the cap holds exactly at every assignment.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::input::RoutingInput;
use crate::server::{InFlight, Server};
use crate::snapshot::PoolSnapshot;
use ringmaster_config::CapGuard;

/// Why a server was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionReason {
    /// The key's owner on the ring was under its cap.
    Affinity,
    /// The owner was at its bounded-load cap; the next server clockwise under cap took it.
    BoundedLoadSpill,
    /// A router policy chose this server.
    Policy,
    /// A router policy chose a server at its bounded-load cap; the ring spilled it onward.
    PolicyOverCap,
    /// The key's owner (or the policy's choice) is unreachable or ejected, or failed this
    /// request already: the next routable server on the ring took it.
    Failover,
}

impl DecisionReason {
    /// Stable name for metrics and the explain endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Affinity => "affinity",
            Self::BoundedLoadSpill => "bounded-load-spill",
            Self::Policy => "policy",
            Self::PolicyOverCap => "policy-over-cap",
            Self::Failover => "failover",
        }
    }
}

/// A routing decision.
#[derive(Clone, Debug)]
pub struct Decision {
    /// The chosen server.
    pub server: Arc<Server>,
    /// Why.
    pub reason: DecisionReason,
    /// The key's owner on the ring (the affinity choice), for consistent hashing.
    pub preferred: Option<Arc<Server>>,
    /// Servers passed over for being at their cap, in ring order.
    pub skipped: Vec<Arc<Server>>,
    /// The chosen server's bounded-load cap at decision time (consistent hashing only).
    pub capacity: Option<u64>,
    /// The chosen server's in-flight count including this request.
    pub load_after: u64,
}

impl crate::Pool {
    /// Picks a server for `input` and counts the request in flight there. `None` when the pool
    /// has no active server.
    pub fn route(&self, input: &RoutingInput) -> Option<(Decision, InFlight)> {
        self.route_on(&self.snapshot.load(), input)
    }

    /// [`Self::route`] on `snapshot`, the one the request's other decisions were made on.
    pub fn route_on(
        &self,
        snapshot: &PoolSnapshot,
        input: &RoutingInput,
    ) -> Option<(Decision, InFlight)> {
        if snapshot.servers.is_empty() {
            return None;
        }
        let mut loads = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        let decision = self.decide(snapshot, input, &mut loads)?;
        Some(self.count(decision, input, loads))
    }

    /// Sends the request to the server a router policy chose on `snapshot`, counting it in
    /// flight, unless that server is no longer routable or (under [`CapGuard::Host`]) is at
    /// its bounded-load cap now: then the ring decides. `None` with no servers.
    pub fn assign_on(
        &self,
        snapshot: &PoolSnapshot,
        chosen: &str,
        input: &RoutingInput,
        guard: CapGuard,
    ) -> Option<(Decision, InFlight)> {
        if snapshot.servers.is_empty() {
            return None;
        }
        let mut loads = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        let decision = self.carry_out(snapshot, chosen, input, guard, &mut loads)?;
        Some(self.count(decision, input, loads))
    }

    /// What [`Self::assign_on`] would decide now, without counting anything.
    pub fn explain_assign_on(
        &self,
        snapshot: &PoolSnapshot,
        chosen: &str,
        input: &RoutingInput,
        guard: CapGuard,
    ) -> Option<Decision> {
        if snapshot.servers.is_empty() {
            return None;
        }
        self.carry_out(snapshot, chosen, input, guard, &mut Vec::new())
    }

    /// A router policy's choice, carried out: the chosen server, or the ring's decision when
    /// it is unroutable or at its cap.
    fn carry_out(
        &self,
        snapshot: &PoolSnapshot,
        chosen: &str,
        input: &RoutingInput,
        guard: CapGuard,
        loads: &mut Vec<u64>,
    ) -> Option<Decision> {
        let position = snapshot.servers.iter().position(|s| s.id == chosen);
        let decision = match position {
            Some(i) if !snapshot.servers[i].is_routable() => {
                let mut failover = self.decide(snapshot, input, loads)?;
                failover.reason = DecisionReason::Failover;
                failover.preferred = Some(snapshot.servers[i].clone());
                failover
            }
            Some(i) => {
                loads.clear();
                loads.extend(snapshot.servers.iter().map(|s| s.fleet_in_flight()));
                let total: u64 = loads.iter().sum();
                let capacity = match guard {
                    CapGuard::Host { load_factor: None } => snapshot.ring.capacity(i, total),
                    CapGuard::Host {
                        load_factor: Some(factor),
                    } => snapshot.ring.capacity_with(i, total, factor),
                    CapGuard::Policy => u64::MAX,
                };
                if loads[i] < capacity {
                    Decision {
                        server: snapshot.servers[i].clone(),
                        reason: DecisionReason::Policy,
                        // The key's owner, so the decision can be labelled affinity or not.
                        preferred: snapshot
                            .ring
                            .lookup(input.key)
                            .map(|owner| snapshot.servers[owner].clone()),
                        skipped: Vec::new(),
                        capacity: (guard != CapGuard::Policy).then_some(capacity),
                        load_after: loads[i] + 1,
                    }
                } else {
                    let mut spilled = self.decide(snapshot, input, loads)?;
                    spilled.reason = DecisionReason::PolicyOverCap;
                    spilled.preferred = Some(snapshot.servers[i].clone());
                    spilled
                }
            }
            None => self.decide(snapshot, input, loads)?,
        };
        Some(decision)
    }

    /// For a retry: the next routable server on the ring for `input` that is not in `tried`
    /// (ids), preferring one under its cap, counted in flight. `None` when every routable
    /// server was tried.
    pub fn reassign(
        &self,
        snapshot: &PoolSnapshot,
        input: &RoutingInput,
        tried: &[String],
    ) -> Option<(Decision, InFlight)> {
        let mut loads = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        let mut decision = self.walk(snapshot, input, &mut loads, tried)?;
        decision.reason = DecisionReason::Failover;
        Some(self.count(decision, input, loads))
    }

    /// Counts a request's prefill leg in flight on `server` (a prefill server, off the
    /// ring: the pair's decision chose it) and records the request's prefixes against it,
    /// which it will hold once it has prefilled them.
    pub fn count_leg(&self, server: &Arc<Server>, input: &RoutingInput) -> InFlight {
        let lock = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        let decision = Decision {
            server: server.clone(),
            reason: DecisionReason::Policy,
            preferred: None,
            skipped: Vec::new(),
            capacity: None,
            load_after: 0,
        };
        self.count(decision, input, lock).1
    }

    /// The bounded-load walk over routable servers not in `exclude`: the first with room,
    /// else the first routable one over its cap. With nothing to exclude, an unroutable
    /// owner still gets the request when no server is routable (it may be back; if not, the
    /// client hears why).
    pub(crate) fn walk(
        &self,
        snapshot: &PoolSnapshot,
        input: &RoutingInput,
        loads: &mut Vec<u64>,
        exclude: &[String],
    ) -> Option<Decision> {
        let servers = &snapshot.servers;
        loads.clear();
        loads.extend(servers.iter().map(|s| s.fleet_in_flight()));
        let usable =
            |i: usize| servers[i].is_routable() && !exclude.iter().any(|id| *id == servers[i].id);
        let order = snapshot.ring.candidates(input.key, servers.len());
        let preferred = *order.first()?;
        let total: u64 = (0..servers.len())
            .filter(|&i| usable(i))
            .map(|i| loads[i])
            .sum();
        let mut skipped = Vec::new();
        let mut over_cap = None;
        for &i in &order {
            if !usable(i) {
                skipped.push(servers[i].clone());
                continue;
            }
            let capacity = snapshot.ring.capacity(i, total);
            if loads[i] < capacity {
                return Some(Decision {
                    server: servers[i].clone(),
                    reason: if i == preferred {
                        DecisionReason::Affinity
                    } else {
                        DecisionReason::Failover
                    },
                    preferred: Some(servers[preferred].clone()),
                    skipped,
                    capacity: Some(capacity),
                    load_after: loads[i] + 1,
                });
            }
            over_cap.get_or_insert((i, capacity));
            skipped.push(servers[i].clone());
        }
        let (i, capacity) = match over_cap {
            Some(found) => found,
            None if exclude.is_empty() => (preferred, snapshot.ring.capacity(preferred, total)),
            None => return None,
        };
        Some(Decision {
            server: servers[i].clone(),
            reason: DecisionReason::Failover,
            preferred: Some(servers[preferred].clone()),
            skipped: Vec::new(),
            capacity: Some(capacity),
            load_after: loads[i] + 1,
        })
    }

    /// Counts the decided request in flight (while the route lock is held) and records its
    /// prefixes against the server.
    pub(crate) fn count(
        &self,
        decision: Decision,
        input: &RoutingInput,
        lock: std::sync::MutexGuard<'_, Vec<u64>>,
    ) -> (Decision, InFlight) {
        let server = decision.server.clone();
        let after = server.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        drop(lock);
        server.peak_in_flight.fetch_max(after, Ordering::Relaxed);
        server.requests_total.fetch_add(1, Ordering::Relaxed);
        self.prefixes.record(server.slot, &input.prefix_hashes);
        {
            let mut pending = server.pending.lock().unwrap_or_else(|e| e.into_inner());
            for hash in &input.prefix_hashes {
                *pending.entry(*hash).or_insert(0) += 1;
            }
        }
        (
            Decision {
                load_after: after,
                ..decision
            },
            InFlight {
                server,
                hashes: input.prefix_hashes.clone(),
                prefill: 0,
            },
        )
    }

    /// What [`Self::route_on`] would decide on `snapshot` (a model's pool) now, without
    /// counting anything.
    pub fn explain_on(&self, snapshot: &PoolSnapshot, input: &RoutingInput) -> Option<Decision> {
        if snapshot.servers.is_empty() {
            return None;
        }
        let mut loads = Vec::new();
        self.decide(snapshot, input, &mut loads)
    }

    pub(crate) fn decide(
        &self,
        snapshot: &PoolSnapshot,
        input: &RoutingInput,
        loads: &mut Vec<u64>,
    ) -> Option<Decision> {
        let servers = &snapshot.servers;
        if !servers.iter().all(|s| s.is_routable()) {
            return self.walk(snapshot, input, loads, &[]);
        }
        loads.clear();
        loads.extend(servers.iter().map(|s| s.fleet_in_flight()));
        let choice = snapshot.ring.lookup_bounded(input.key, loads).ok()??;
        let server = servers[choice.member].clone();
        Some(Decision {
            reason: if choice.spilled() {
                DecisionReason::BoundedLoadSpill
            } else {
                DecisionReason::Affinity
            },
            preferred: Some(servers[choice.preferred].clone()),
            skipped: choice.skipped.iter().map(|&i| servers[i].clone()).collect(),
            capacity: Some(choice.capacity),
            load_after: loads[choice.member] + 1,
            server,
        })
    }
}
