//! The router slot: which router policies run, how traffic is split between them, and what
//! happens when one misbehaves.
//!
//! The slot holds one or more *variants* (each a router policy version with a weight) and at
//! most one *shadow*, all in one immutable [`RouterSet`] published through `ArcSwap`, so a
//! request sees one consistent set and finishes on the versions it began with. A request's
//! variant is chosen by its routing key (sticky: every turn of a conversation stays in one
//! variant). A policy's answer is carried out by [`Pool::assign`], which keeps the bounded-load
//! cap as a host invariant. A fault (trap, deadline, memory, invalid answer) never fails the
//! request: the native ring decides instead, the fault is counted by kind, and after
//! [`DEFAULT_ROLLBACK_AFTER_FAULTS`] faults in a row the variant rolls back to its previous
//! version. The shadow decides on the same view without acting; the slot records how often it
//! agrees and where it would have sent traffic.
//!
//! Swapping is compile → pre-instantiate → probe (in the policy engine) → publish; an unchanged
//! content hash is a no-op; on failure the old version stays and the caller gets the reason.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use ringmaster_policy_engine::{PolicyEngine, PolicyError, PolicyFault, RouterPolicy, StateMode};
use tracing::{info, warn};

pub use ringmaster_experiments::{TTFT_SAMPLES_PER_VARIANT, VariantStats};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use ringmaster_pool::{CapGuard, Decision, InFlight};

pub mod pair;
mod rollout;
mod rollout_slot;
mod route;
#[cfg(test)]
mod tests;
mod view;

pub use rollout::{Rollout, RolloutPhase};
pub use rollout_slot::RolloutStart;
pub use route::Explained;
pub use view::PoolView;
pub use view::{MatchSource, PrefixMatch, prefix_matches};

/// Faults in a row after which a variant rolls back to its previous version.
pub const DEFAULT_ROLLBACK_AFTER_FAULTS: u32 = 5;
/// Earlier versions kept per variant for rollback; older ones are dropped with their warm
/// instances (every version holds instances from the engine's fixed pool).
pub const MAX_HISTORY_VERSIONS: usize = 4;
/// Seed of the variant-assignment hash (distinct from the ring's so the two are independent).
const ASSIGNMENT_SEED: u64 = 0xab7e_57ed;

/// Why a change to the slot was refused.
#[derive(Debug, thiserror::Error)]
pub enum SlotError {
    /// The component was refused by the policy engine.
    #[error("{0}")]
    Policy(#[from] PolicyError),
    /// No variant by that name.
    #[error("no router variant named {0:?}")]
    UnknownVariant(String),
    /// Nothing to roll back to.
    #[error("router variant {0:?} has no previous version")]
    NoPreviousVersion(String),
    /// A request for an impossible change.
    #[error("{0}")]
    Invalid(String),
}

/// One router variant at one version.
#[derive(Debug)]
pub struct Variant {
    /// Its name (a metric label).
    pub name: Arc<str>,
    /// Its share of traffic (ignored for the shadow).
    pub weight: u32,
    /// The running version.
    pub policy: RouterPolicy,
    /// Earlier versions, oldest first.
    pub history: Vec<RouterPolicy>,
    /// Its configuration (handed to every version).
    pub config: BTreeMap<String, String>,
    consecutive_faults: AtomicU32,
    /// Totals across versions.
    pub stats: Arc<VariantStats>,
}

impl Variant {
    fn successor(
        &self,
        policy: RouterPolicy,
        history: Vec<RouterPolicy>,
        weight: u32,
        config: BTreeMap<String, String>,
    ) -> Self {
        Self {
            name: self.name.clone(),
            weight,
            policy,
            history,
            config,
            consecutive_faults: AtomicU32::new(0),
            stats: self.stats.clone(),
        }
    }
}

/// The slot's variants and shadow at one instant.
#[derive(Debug, Default)]
pub struct RouterSet {
    /// Live variants (empty: the native ring routes).
    pub variants: Vec<Arc<Variant>>,
    /// The shadow, if any.
    pub shadow: Option<Arc<Variant>>,
}

impl RouterSet {
    /// The variant a routing key belongs to.
    pub fn pick(&self, key: u64) -> Option<&Arc<Variant>> {
        let total: u64 = self.variants.iter().map(|v| u64::from(v.weight)).sum();
        if total == 0 {
            return self.variants.first();
        }
        let mut bucket = xxh3_64_with_seed(&key.to_le_bytes(), ASSIGNMENT_SEED) % total;
        for variant in &self.variants {
            if bucket < u64::from(variant.weight) {
                return Some(variant);
            }
            bucket -= u64::from(variant.weight);
        }
        self.variants.last()
    }
}

/// Where a request went and which variant decided.
#[derive(Debug)]
pub struct Routed {
    /// The decision the pool carried out.
    pub decision: Decision,
    /// The request's slot on the server.
    pub in_flight: InFlight,
    /// The deciding variant (`None`: native ring).
    pub variant: Option<Arc<Variant>>,
    /// The fault that made the ring decide instead, if any.
    pub fault: Option<PolicyFault>,
    /// What the decision saw of the chosen server (for the request's trace).
    pub seen: Seen,
    /// Whether the request is split between a prefill server and the decision's.
    pub pair: Pair,
}

/// Whether a routed request is split, why, and its prefill leg when it is.
#[derive(Debug)]
pub struct Pair {
    /// Split or not.
    pub outcome: pair::PairOutcome,
    /// Why, in words.
    pub why: String,
    /// The prefill leg, when split.
    pub prefill: Option<pair::PrefillLeg>,
}

/// What a routing decision saw of the server it chose.
#[derive(Clone, Copy, Debug, Default)]
pub struct Seen {
    /// The prompt's leading prefix hashes the server was found to hold (`None`: no policy
    /// asked for the prefix matches).
    pub cached_hashes: Option<u32>,
    /// The prompt tokens it was charged to compute (after that credit).
    pub uncached_tokens: u64,
    /// The policy call's own time (`None`: the native ring decided alone).
    pub policy_time: Option<std::time::Duration>,
    /// Servers in the snapshot it decided on.
    pub candidates: usize,
    /// The prompt tokens the best-placed candidate held, and those the chosen one held, as
    /// the gateway's cache view estimated them: what the router could have had, and what it
    /// took.
    pub reach: (u64, u64),
}

/// What routing can answer besides a server.
#[derive(Debug)]
pub enum RouteOutcome {
    /// Routed.
    Routed(Box<Routed>),
    /// The policy refused the request.
    Rejected {
        /// The deciding variant.
        variant: Arc<Variant>,
        /// Its reason.
        reason: String,
    },
    /// No server in the pool.
    NoServers,
}

/// The router slot.
#[derive(Debug)]
pub struct RouterSlot {
    engine: PolicyEngine,
    set: ArcSwap<RouterSet>,
    /// Held by every change to the set; it guards the rollout's state with it, so a weight
    /// and the step that set it change together.
    update: Mutex<Option<Rollout>>,
    rollback_after_faults: u32,
    guard: CapGuard,
    ring_load_factor: f64,
    /// The host's pair rule (`[disaggregation]`).
    pair_rule: ringmaster_config::DisaggregationSettings,
}

/// Keys the host adds to every router policy's configuration, so that a policy knows the
/// bounded-load contract it runs under: `host.bounded_load` (`host`: the host spills a choice
/// at its cap; `policy`: the policy decides alone) and `host.load_factor` (the cap's factor
/// `c` in `ceil(c × (total + 1) × weight / total-weight)`, when the host guards).
pub const HOST_CONFIG_KEYS: [&str; 2] = ["host.bounded_load", "host.load_factor"];

impl RouterSlot {
    /// An empty slot (the native ring routes until a variant is added).
    pub fn new(engine: PolicyEngine) -> Self {
        Self {
            engine,
            set: ArcSwap::from_pointee(RouterSet::default()),
            update: Mutex::new(None),
            rollback_after_faults: DEFAULT_ROLLBACK_AFTER_FAULTS,
            guard: CapGuard::default(),
            ring_load_factor: ringmaster_config::routing::DEFAULT_LOAD_FACTOR,
            pair_rule: ringmaster_config::DisaggregationSettings::default(),
        }
    }

    /// The slot with `rule` deciding which requests are split between a prefill and a
    /// decode server (see [`pair`]).
    pub fn with_pair_rule(mut self, rule: ringmaster_config::DisaggregationSettings) -> Self {
        self.pair_rule = rule;
        self
    }

    /// The rules for split requests.
    pub fn pair_rule(&self) -> &ringmaster_config::DisaggregationSettings {
        &self.pair_rule
    }

    /// The slot with `guard` over its policies' choices, on a ring whose own factor is
    /// `ring_load_factor` (set before any policy is installed: each policy is told the guard
    /// in its configuration, see [`HOST_CONFIG_KEYS`]).
    pub fn with_guard(mut self, guard: CapGuard, ring_load_factor: f64) -> Self {
        self.guard = guard;
        self.ring_load_factor = ring_load_factor;
        self
    }

    /// How the host guards this slot's choices with the bounded-load cap.
    pub fn guard(&self) -> CapGuard {
        self.guard
    }

    /// A variant's configuration as its policy sees it: the operator's keys and the host's
    /// ([`HOST_CONFIG_KEYS`]; the host's win).
    fn policy_config(&self, config: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut seen = config.clone();
        seen.insert(
            HOST_CONFIG_KEYS[0].to_owned(),
            self.guard.as_str().to_owned(),
        );
        if let CapGuard::Host { load_factor } = self.guard {
            let factor = load_factor.unwrap_or(self.ring_load_factor);
            seen.insert(HOST_CONFIG_KEYS[1].to_owned(), factor.to_string());
        }
        seen
    }

    /// The policy engine.
    pub fn engine(&self) -> &PolicyEngine {
        &self.engine
    }

    /// The current set.
    pub fn current(&self) -> Arc<RouterSet> {
        self.set.load_full()
    }

    /// Loads `bytes` as variant `name` (or the shadow): creates it with `weight` if it does
    /// not exist, else swaps its version (and weight, if given). Returns whether anything
    /// changed (`false`: the same bytes are already running).
    ///
    /// The new version keeps the variant's `state` store, as a swap should by default.
    pub fn install(
        &self,
        name: &str,
        bytes: &[u8],
        weight: Option<u32>,
        shadow: bool,
        config: Option<BTreeMap<String, String>>,
    ) -> Result<bool, SlotError> {
        self.install_with_state(name, bytes, weight, shadow, config, StateMode::Keep)
    }

    /// [`install`](Self::install), saying whether the new version keeps the variant's `state`
    /// store or starts with a fresh one (the old version keeps its own until it is dropped).
    /// A fresh store with the same bytes still counts as a change.
    pub fn install_with_state(
        &self,
        name: &str,
        bytes: &[u8],
        weight: Option<u32>,
        shadow: bool,
        config: Option<BTreeMap<String, String>>,
        state: StateMode,
    ) -> Result<bool, SlotError> {
        let rollout = self.update.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rollout_running(&rollout)
            && r.variant == name
        {
            return Err(rolling_out(r));
        }
        self.install_locked(name, bytes, weight, shadow, config, state)
    }

    /// [`install_with_state`](Self::install_with_state) with the update lock held.
    fn install_locked(
        &self,
        name: &str,
        bytes: &[u8],
        weight: Option<u32>,
        shadow: bool,
        config: Option<BTreeMap<String, String>>,
        state: StateMode,
    ) -> Result<bool, SlotError> {
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(SlotError::Invalid(format!(
                "variant name {name:?}: use 1–64 ASCII letters, digits, '-', '_' or '.'"
            )));
        }
        let current = self.set.load_full();
        let existing = if shadow {
            current.shadow.clone().filter(|v| &*v.name == name)
        } else {
            current.variants.iter().find(|v| &*v.name == name).cloned()
        };
        let config = config
            .or_else(|| existing.as_ref().map(|v| v.config.clone()))
            .unwrap_or_default();
        if let Some(old) = &existing
            && old.policy.info().hash == ringmaster_policy_engine::content_hash(bytes)
            && old.config == config
            && weight.is_none_or(|w| w == old.weight)
            && state == StateMode::Keep
        {
            return Ok(false);
        }
        let started = Instant::now();
        let policy =
            self.engine
                .load_router_with_state(name, bytes, self.policy_config(&config), state)?;
        let mut next = RouterSet {
            variants: current.variants.clone(),
            shadow: current.shadow.clone(),
        };
        let variant = match &existing {
            Some(old) => {
                let mut history = old.history.clone();
                if old.policy.info().hash != policy.info().hash {
                    history.push(old.policy.clone());
                    if history.len() > MAX_HISTORY_VERSIONS {
                        history.remove(0);
                    }
                }
                Arc::new(old.successor(policy, history, weight.unwrap_or(old.weight), config))
            }
            None => Arc::new(Variant {
                name: name.into(),
                weight: weight.unwrap_or(if shadow { 0 } else { 100 }),
                policy,
                history: Vec::new(),
                config,
                consecutive_faults: AtomicU32::new(0),
                stats: Arc::new(VariantStats::default()),
            }),
        };
        info!(
            variant = name,
            shadow,
            hash = %variant.policy.info().hash,
            weight = variant.weight,
            contract = variant.policy.contract(),
            learns = variant.policy.learns(),
            state = state.as_str(),
            load_ms = started.elapsed().as_millis() as u64,
            "policy.swapped"
        );
        if shadow {
            next.shadow = Some(variant);
        } else if let Some(slot) = next.variants.iter_mut().find(|v| &*v.name == name) {
            *slot = variant;
        } else {
            next.variants.push(variant);
        }
        self.set.store(Arc::new(next));
        Ok(true)
    }

    /// Sets a live variant's traffic weight, keeping its version and history. Returns
    /// whether it changed.
    /// While a rollout runs, every weight is the rollout's: refused.
    pub fn set_weight(&self, name: &str, weight: u32) -> Result<bool, SlotError> {
        let rollout = self.update.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rollout_running(&rollout) {
            return Err(rolling_out(r));
        }
        if !self.current().variants.iter().any(|v| &*v.name == name) {
            return Err(SlotError::UnknownVariant(name.to_owned()));
        }
        Ok(self.set_weights_locked(&[(name.to_owned(), weight)]))
    }

    /// Sets the named live variants' weights in one new set (keeping versions and
    /// histories; names not in the slot are skipped), with the update lock held. Returns
    /// whether any changed.
    fn set_weights_locked(&self, weights: &[(String, u32)]) -> bool {
        let current = self.set.load_full();
        let mut changed = false;
        let variants = current
            .variants
            .iter()
            .map(|old| match weights.iter().find(|(n, _)| *n == *old.name) {
                Some(&(_, weight)) if weight != old.weight => {
                    changed = true;
                    Arc::new(old.successor(
                        old.policy.clone(),
                        old.history.clone(),
                        weight,
                        old.config.clone(),
                    ))
                }
                _ => old.clone(),
            })
            .collect();
        if changed {
            self.set.store(Arc::new(RouterSet {
                variants,
                shadow: current.shadow.clone(),
            }));
        }
        changed
    }

    /// Removes a variant or the shadow.
    /// While a rollout runs, its candidate and the variants it shares traffic with stay.
    pub fn remove(&self, name: &str) -> Result<(), SlotError> {
        let rollout = self.update.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = rollout_running(&rollout)
            && (r.variant == name || r.others.iter().any(|(n, _)| n == name))
        {
            return Err(rolling_out(r));
        }
        let current = self.set.load_full();
        let mut next = RouterSet {
            variants: current
                .variants
                .iter()
                .filter(|v| &*v.name != name)
                .cloned()
                .collect(),
            shadow: current.shadow.clone().filter(|v| &*v.name != name),
        };
        if next.variants.len() == current.variants.len()
            && next.shadow.is_some() == current.shadow.is_some()
        {
            return Err(SlotError::UnknownVariant(name.to_owned()));
        }
        next.variants.shrink_to_fit();
        self.set.store(Arc::new(next));
        info!(variant = name, "policy.removed");
        Ok(())
    }

    /// Puts a variant back on its previous version.
    pub fn rollback(&self, name: &str) -> Result<(), SlotError> {
        if let Some(r) = rollout_running(&self.update.lock().unwrap_or_else(|e| e.into_inner()))
            && r.variant == name
        {
            return Err(rolling_out(r));
        }
        self.rollback_if(name, None)
    }

    /// Rolls back unless the variant's running hash is no longer `expected` (someone else
    /// already swapped or rolled back).
    fn rollback_if(&self, name: &str, expected: Option<&str>) -> Result<(), SlotError> {
        let _guard = self.update.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.set.load_full();
        let find = |v: &&Arc<Variant>| &*v.name == name;
        let old = current
            .variants
            .iter()
            .find(find)
            .or(current.shadow.as_ref().filter(|v| &*v.name == name))
            .cloned()
            .ok_or_else(|| SlotError::UnknownVariant(name.to_owned()))?;
        if expected.is_some_and(|hash| old.policy.info().hash != hash) {
            return Ok(());
        }
        let mut history = old.history.clone();
        let previous = history
            .pop()
            .ok_or_else(|| SlotError::NoPreviousVersion(name.to_owned()))?;
        let rolled = Arc::new(old.successor(previous, history, old.weight, old.config.clone()));
        warn!(variant = name, from = %old.policy.info().hash, to = %rolled.policy.info().hash, "policy.rolled_back");
        let mut next = RouterSet {
            variants: current.variants.clone(),
            shadow: current.shadow.clone(),
        };
        if let Some(slot) = next.variants.iter_mut().find(|v| &*v.name == name) {
            *slot = rolled;
        } else {
            next.shadow = Some(rolled);
        }
        self.set.store(Arc::new(next));
        Ok(())
    }
}

/// The rollout in `state`, if it is running.
fn rollout_running(state: &Option<Rollout>) -> Option<&Rollout> {
    state.as_ref().filter(|r| r.phase == RolloutPhase::Running)
}

/// The refusal of a change that would take a running rollout's weights or candidate.
fn rolling_out(rollout: &Rollout) -> SlotError {
    SlotError::Invalid(format!(
        "router variant {:?} is rolling out (step {} of {}, {} %): the slot's weights and its \
         candidate are the rollout's until it ends; stop it first with \
         DELETE /admin/policies/router/rollout",
        rollout.variant,
        rollout.index + 1,
        rollout.plan.steps.len(),
        rollout.percent()
    ))
}
