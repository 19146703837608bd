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
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arc_swap::ArcSwap;
use ringmaster_policy_engine::{
    PolicyEngine, PolicyError, PolicyFault, PolicyRequest, RouteDecision, RouterHost, RouterPolicy,
    ServerView, StateMode,
};
use tracing::{info, warn};

pub use ringmaster_experiments::{TTFT_SAMPLES_PER_VARIANT, VariantStats};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::routing::RoutingInput;
use ringmaster_pool::kv_view::{ChatPrompt, PromptBlocks, in_prefix_units};
use ringmaster_pool::prefix_index::PrefixIndex;
use ringmaster_pool::{CapGuard, Decision, InFlight, Pool, PoolSnapshot};

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
    update: Mutex<()>,
    rollback_after_faults: u32,
    guard: CapGuard,
    ring_load_factor: f64,
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
            update: Mutex::new(()),
            rollback_after_faults: DEFAULT_ROLLBACK_AFTER_FAULTS,
            guard: CapGuard::default(),
            ring_load_factor: ringmaster_ring::DEFAULT_LOAD_FACTOR,
        }
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
        let _guard = self.update.lock().unwrap_or_else(|e| e.into_inner());
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
    pub fn set_weight(&self, name: &str, weight: u32) -> Result<bool, SlotError> {
        let _guard = self.update.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.set.load_full();
        let old = current
            .variants
            .iter()
            .find(|v| &*v.name == name)
            .cloned()
            .ok_or_else(|| SlotError::UnknownVariant(name.to_owned()))?;
        if old.weight == weight {
            return Ok(false);
        }
        let updated = Arc::new(old.successor(
            old.policy.clone(),
            old.history.clone(),
            weight,
            old.config.clone(),
        ));
        let mut next = RouterSet {
            variants: current.variants.clone(),
            shadow: current.shadow.clone(),
        };
        if let Some(slot) = next.variants.iter_mut().find(|v| &*v.name == name) {
            *slot = updated;
        }
        self.set.store(Arc::new(next));
        Ok(true)
    }

    /// Removes a variant or the shadow.
    pub fn remove(&self, name: &str) -> Result<(), SlotError> {
        let _guard = self.update.lock().unwrap_or_else(|e| e.into_inner());
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
        if snapshot.servers.is_empty() {
            return RouteOutcome::NoServers;
        }
        let view = PoolView::new(snapshot, pool, input, chat);
        let variant = set.pick(input.key).cloned();
        let mut fault = None;
        let routed = match &variant {
            None => pool.route_on(snapshot, input),
            Some(variant) => match variant.policy.route(&view, request) {
                Ok(RouteDecision::Route(id)) => {
                    variant.consecutive_faults.store(0, Ordering::Relaxed);
                    pool.assign_on(snapshot, &id, input, self.guard)
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
        in_flight.charge_prefill(view.uncached_tokens(decision.server.id(), request.prompt_tokens));
        if let Some(variant) = &variant {
            variant.stats.requests.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(shadow) = &set.shadow {
            self.run_shadow(shadow, &view, request, decision.server.id());
        }
        RouteOutcome::Routed(Box::new(Routed {
            decision,
            in_flight,
            variant,
            fault,
        }))
    }

    fn on_fault(&self, variant: &Arc<Variant>, fault: &PolicyFault) {
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
            Ok(RouteDecision::Route(id)) => {
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
        };
        let Some(variant) = variant else {
            explained.decision = pool.explain_on(snapshot, input);
            return explained;
        };
        let view = PoolView::new(snapshot, pool, input, chat);
        match variant.policy.route(&view, request) {
            Ok(RouteDecision::Route(id)) => {
                explained.decision = pool.explain_assign_on(snapshot, &id, input, self.guard);
                explained.chosen = Some(id);
            }
            Ok(RouteDecision::Reject(reason)) => explained.rejected = Some(reason),
            Err(fault) => {
                explained.fault = Some(fault);
                explained.decision = pool.explain_on(snapshot, input);
            }
        }
        explained
    }
}

/// The pool as a router policy's imports see it during one call.
pub(crate) struct PoolView<'a> {
    snapshot: &'a PoolSnapshot,
    prefixes: &'a PrefixIndex,
    input: &'a RoutingInput,
    chat: ChatPrompt<'a>,
    /// The request's prefix matches, computed once (on the first ask) for every variant and
    /// every call that asks (the shadow's included).
    matches: std::sync::OnceLock<Vec<(String, u32)>>,
}

impl<'a> PoolView<'a> {
    /// The view of `snapshot` for the request `input` describes.
    pub(crate) fn new(
        snapshot: &'a PoolSnapshot,
        pool: &'a Pool,
        input: &'a RoutingInput,
        chat: ChatPrompt<'a>,
    ) -> Self {
        Self {
            snapshot,
            prefixes: pool.prefixes(),
            input,
            chat,
            matches: std::sync::OnceLock::new(),
        }
    }

    fn view(server: &ringmaster_pool::Server) -> ServerView {
        let load = server.engine().load();
        ServerView {
            id: server.id().to_owned(),
            healthy: !server.is_draining(),
            weight: server.weight(),
            in_flight: u32::try_from(server.in_flight()).unwrap_or(u32::MAX),
            waiting: load.waiting,
            kv_blocks_used: load.kv_blocks_used,
            kv_blocks_total: load.kv_blocks_total,
        }
    }
}

impl RouterHost for PoolView<'_> {
    fn ring_lookup(&self, key: u64) -> Option<String> {
        let i = self.snapshot.ring.lookup(key)?;
        Some(self.snapshot.servers[i].id().to_owned())
    }

    fn ring_candidates(&self, key: u64, n: u32) -> Vec<String> {
        self.snapshot
            .ring
            .candidates(key, n as usize)
            .into_iter()
            .map(|i| self.snapshot.servers[i].id().to_owned())
            .collect()
    }

    fn ring_lookup_bounded(&self, key: u64) -> Option<String> {
        let loads: Vec<u64> = self
            .snapshot
            .servers
            .iter()
            .map(|s| s.in_flight())
            .collect();
        let choice = self.snapshot.ring.lookup_bounded(key, &loads).ok()??;
        Some(self.snapshot.servers[choice.member].id().to_owned())
    }

    fn servers(&self) -> Vec<ServerView> {
        self.snapshot
            .servers
            .iter()
            .map(|s| Self::view(s))
            .collect()
    }

    fn server(&self, id: &str) -> Option<ServerView> {
        self.snapshot.server(id).map(|s| Self::view(s))
    }

    // Checked on every answer: skip the engine load report that a full view reads.
    fn routable(&self, id: &str) -> bool {
        self.snapshot.server(id).is_some_and(|s| !s.is_draining())
    }

    fn prefix_matches(&self) -> Vec<(String, u32)> {
        self.matches
            .get_or_init(|| {
                prefix_matches(self.snapshot, self.prefixes, (self.input, self.chat))
                    .into_iter()
                    .filter(|m| m.hashes > 0)
                    .map(|m| (m.server, m.hashes))
                    .collect()
            })
            .clone()
    }

    fn prefill_backlog(&self) -> Vec<(String, u64)> {
        self.snapshot
            .servers
            .iter()
            .filter_map(|s| {
                let tokens = s.prefill_backlog();
                (tokens > 0).then(|| (s.id().to_owned(), tokens))
            })
            .collect()
    }
}

impl PoolView<'_> {
    /// The prompt tokens of the request that `server` is expected to compute: all of them,
    /// less the share of its prefix hashes the server was found to hold when some call
    /// asked for the prefix matches (the ring alone never does; then no credit is given).
    fn uncached_tokens(&self, server: &str, prompt_tokens: u32) -> u64 {
        let held = self
            .matches
            .get()
            .map_or(0, |matches| matched_hashes(matches, server));
        let chunks = self.input.prompt_chunks.max(self.input.prefix_hashes.len());
        if chunks == 0 || held == 0 {
            return u64::from(prompt_tokens);
        }
        let held = (held as usize).min(chunks);
        u64::from(prompt_tokens) * (chunks - held) as u64 / chunks as u64
    }
}

fn matched_hashes(matches: &[(String, u32)], server: &str) -> u32 {
    matches
        .iter()
        .find(|(id, _)| id == server)
        .map_or(0, |(_, n)| *n)
}

/// Where a server's prefix match came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatchSource {
    /// The server's own report of its cache (see [`crate::kv_view`]), or, when more, the
    /// prompts of the requests in flight there (held once prefilled, before the report
    /// shows them).
    Reported,
    /// The gateway's routing history ([`PrefixIndex`]): the server reports nothing now.
    Estimated,
}

impl MatchSource {
    /// A stable name for the explain endpoint.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Reported => "reported",
            Self::Estimated => "estimated",
        }
    }
}

/// How much of one request's prompt one server holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    /// The server.
    pub server: String,
    /// Leading prefix hashes held (the unit of `cluster.prefix-matches`).
    pub hashes: u32,
    /// Leading prompt tokens held, when the server reports its cache.
    pub tokens: Option<usize>,
    /// Where the answer came from.
    pub source: MatchSource,
}

/// For every server in `snapshot`, how much of the prompt of `input` it holds: from the
/// server's own report of its cache when it has one, else from the routing history.
pub fn prefix_matches(
    snapshot: &PoolSnapshot,
    prefixes: &PrefixIndex,
    (input, chat): (&RoutingInput, ChatPrompt<'_>),
) -> Vec<PrefixMatch> {
    let mut estimated: Option<Vec<(usize, u32)>> = None;
    let mut blocks = PromptBlocks::new(chat);
    let hashes = input.prefix_hashes.len();
    snapshot
        .servers
        .iter()
        .map(|s| {
            let reported = s.cache_scheme().and_then(|scheme| {
                let (prompt_blocks, prompt_tokens) = blocks.under(&scheme);
                let held = s.held_blocks(prompt_blocks)?;
                Some((held, prompt_tokens))
            });
            match reported {
                Some((held, prompt_tokens)) => PrefixMatch {
                    server: s.id().to_owned(),
                    hashes: in_prefix_units(held, prompt_tokens, input.prompt_chunks, hashes)
                        .max(s.pending_prefix(&input.prefix_hashes)),
                    tokens: Some((held * ringmaster_gpu_runtime::BLOCK_SIZE).min(prompt_tokens)),
                    source: MatchSource::Reported,
                },
                None => {
                    let by_slot =
                        estimated.get_or_insert_with(|| prefixes.matches(&input.prefix_hashes));
                    PrefixMatch {
                        server: s.id().to_owned(),
                        hashes: by_slot
                            .iter()
                            .find(|(slot, _)| *slot == s.slot())
                            .map_or(0, |(_, n)| *n),
                        tokens: None,
                        source: MatchSource::Estimated,
                    }
                }
            }
        })
        .collect()
}
