//! The GPU server pool: which servers exist, how loaded they are, and which one gets a request.
//!
//! The ring and the server list that its member indices point into live in one immutable
//! [`PoolSnapshot`], published through `ArcSwap`: a reader never locks and never sees a ring
//! that disagrees with the server list. Adding or removing a server builds a new snapshot and
//! swaps it in; a removed server moves to `draining`, keeps serving the requests it already has,
//! and is dropped (its engine stops) once they finish.
//!
//! Routing takes one short lock around "read loads, pick, count the request in flight", so the
//! bounded-load cap holds exactly at every assignment even under concurrent requests. The
//! critical section is a ring walk over a handful of atomics (tens of nanoseconds). Requests
//! release their slot through the [`InFlight`] guard without taking the lock.
//!
//! This module owns no HTTP and no policy logic: it routes on a precomputed [`RoutingInput`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use ringmaster_gpu_runtime::{EngineConfig, EngineError, EngineHandle};
use ringmaster_ring::{Member, Ring, RingConfig, RingError};

use crate::config::{ServerAddress, ServerSpec, Strategy};
use crate::prefix_index::{DEFAULT_PREFIX_INDEX_CAPACITY, PrefixIndex};
use crate::routing::RoutingInput;

/// A pool change that could not be made.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// A server with this id is already in the pool (or still draining).
    #[error("a server with id {0:?} already exists")]
    Duplicate(String),
    /// No active server has this id.
    #[error("no server with id {0:?}")]
    Unknown(String),
    /// The ring rejected the member set.
    #[error("ring: {0}")]
    Ring(#[from] RingError),
    /// The server's engine could not start.
    #[error("cannot start server {id:?}: {source}")]
    Engine {
        /// The server.
        id: String,
        /// Why.
        source: EngineError,
    },
    /// The server's model could not be loaded.
    #[error("cannot start server {id:?}: {source}")]
    Model {
        /// The server.
        id: String,
        /// Why.
        source: ringmaster_gpu_runtime::model::ModelError,
    },
}

/// Sequences a CPU model server runs at once.
pub const MODEL_MAX_RUNNING: u32 = 16;
/// Tokens a CPU model server computes per step.
pub const MODEL_STEP_TOKEN_BUDGET: u32 = 512;

/// One GPU server as the gateway sees it.
#[derive(Debug)]
pub struct Server {
    id: String,
    /// Stable small number for the prefix index while the server lives.
    slot: usize,
    address: ServerAddress,
    weight: u32,
    engine: Backend,
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
    requests_total: AtomicU64,
    draining: AtomicBool,
    /// The pool's wake-up for requests waiting in the admission queue.
    released: Arc<tokio::sync::Notify>,
    /// How long loading its model took (model servers only).
    model_load: Option<std::time::Duration>,
    /// A local engine's tokenizer (a remote worker's is fetched; see [`Backend::cache_scheme`]).
    local_scheme: Option<crate::kv_view::Scheme>,
    /// Prefix hashes of the requests in flight here, counted: what the server will hold once
    /// it has prefilled them, before its cache reports them.
    pending: Mutex<HashMap<u64, u32>>,
    /// The models the config says it serves.
    configured_models: Option<Vec<String>>,
}

impl Server {
    /// Ring id.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// Address.
    pub fn address(&self) -> &ServerAddress {
        &self.address
    }
    /// Ring weight.
    pub fn weight(&self) -> u32 {
        self.weight
    }
    /// Slot in the prefix index.
    pub fn slot(&self) -> usize {
        self.slot
    }
    /// The engine that runs requests.
    pub fn engine(&self) -> &Backend {
        &self.engine
    }
    /// Requests the gateway has routed here that have not finished.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Acquire)
    }
    /// Highest `in_flight` seen at any assignment.
    pub fn peak_in_flight(&self) -> u64 {
        self.peak_in_flight.load(Ordering::Relaxed)
    }
    /// Requests routed here since it joined.
    pub fn requests_total(&self) -> u64 {
        self.requests_total.load(Ordering::Relaxed)
    }
    /// Whether it was removed and is finishing its last requests.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
    /// The models it serves: the config's list, else what a remote server reports; `None`
    /// while unknown (then it takes any model the gateway accepts).
    pub fn served_models(&self) -> Option<Vec<String>> {
        if let Some(models) = &self.configured_models {
            return Some(models.clone());
        }
        match &self.engine {
            Backend::Remote(worker) => worker.models(),
            Backend::Local(_) => None,
        }
    }
    /// Whether new requests may go there: not draining, reachable and not ejected.
    pub fn is_routable(&self) -> bool {
        !self.is_draining() && self.engine.is_reachable()
    }
    /// How long loading its model took (model servers only).
    pub fn model_load(&self) -> Option<std::time::Duration> {
        self.model_load
    }
    /// The tokenizer under which the server's cache is reported; `None` while unknown.
    pub fn cache_scheme(&self) -> Option<crate::kv_view::Scheme> {
        match &self.engine {
            Backend::Local(_) => self.local_scheme.clone(),
            Backend::Remote(worker) => worker.kv().scheme(),
        }
    }
    /// How many of `hashes` (a prompt's block hashes under [`Self::cache_scheme`]) lead in
    /// the server's own report of its cache; `None` while it has none.
    pub fn held_blocks(
        &self,
        hashes: &[ringmaster_gpu_runtime::block::BlockHash],
    ) -> Option<usize> {
        match &self.engine {
            Backend::Local(engine) => Some(engine.cached_prefix_blocks(hashes)),
            Backend::Remote(worker) => worker.kv().held_blocks(hashes),
        }
    }
    /// How many of `hashes` (a request's prefix hashes) lead the prompt of some request in
    /// flight here.
    pub fn pending_prefix(&self, hashes: &[u64]) -> u32 {
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let n = hashes
            .iter()
            .take_while(|h| pending.contains_key(h))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }
    /// A worker's event stream: events applied and snapshots taken (reconnections); zeros for
    /// an engine in this process, whose cache is read directly.
    pub fn reported_cache_events(&self) -> (u64, u64) {
        match &self.engine {
            Backend::Local(_) => (0, 0),
            Backend::Remote(worker) => (worker.kv().events_total(), worker.kv().resyncs_total()),
        }
    }
    /// Blocks in the server's reported cache, and whether the report is live.
    pub fn reported_cache(&self) -> (usize, bool) {
        match &self.engine {
            Backend::Local(engine) => (engine.cached_block_count(), true),
            Backend::Remote(worker) => (worker.kv().len(), worker.kv().is_synced()),
        }
    }
}

/// Holds one request's slot on a server; dropping it releases the slot.
#[derive(Debug)]
pub struct InFlight {
    server: Arc<Server>,
    /// The request's prefix hashes, counted in the server's `pending` until the drop.
    hashes: Vec<u64>,
}

impl InFlight {
    /// The server the request runs on.
    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if !self.hashes.is_empty() {
            let mut pending = self
                .server
                .pending
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            for hash in &self.hashes {
                if let Some(count) = pending.get_mut(hash) {
                    *count -= 1;
                    if *count == 0 {
                        pending.remove(hash);
                    }
                }
            }
        }
        self.server.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.server.released.notify_waiters();
    }
}

/// Why a server was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecisionReason {
    /// The key's owner on the ring was under its cap.
    Affinity,
    /// The owner was at its bounded-load cap; the next server clockwise under cap took it.
    BoundedLoadSpill,
    /// Round-robin strategy.
    RoundRobin,
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
            Self::RoundRobin => "round-robin",
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

/// The pool at one instant: a ring and the servers its member indices name.
#[derive(Debug)]
pub struct PoolSnapshot {
    /// The ring over `servers` (member `i` is `servers[i]`).
    pub ring: Ring,
    /// Active servers.
    pub servers: Vec<Arc<Server>>,
    /// Removed servers still finishing requests.
    pub draining: Vec<Arc<Server>>,
    /// Increases by one with every published change.
    pub version: u64,
    /// One pool per served model: its servers and a ring over them (empty inside those).
    pub models: BTreeMap<String, Arc<PoolSnapshot>>,
    /// Public names and the served names they stand for.
    pub aliases: Arc<BTreeMap<String, String>>,
    /// Every name a request may ask for (served names and aliases), sorted.
    pub accepted: Vec<String>,
    /// The servers' model sets this was built from (see [`Pool::snapshot`]).
    models_epoch: u64,
}

impl PoolSnapshot {
    /// Finds an active server by id.
    pub fn server(&self, id: &str) -> Option<&Arc<Server>> {
        self.servers.iter().find(|s| s.id == id)
    }

    /// The pool of the model a request names (through an alias, if it is one), with the
    /// served name; `None` for a model nobody serves.
    pub fn model(&self, name: &str) -> Option<(&str, &Arc<PoolSnapshot>)> {
        let served = self.aliases.get(name).map_or(name, String::as_str);
        self.models
            .get_key_value(served)
            .map(|(name, pool)| (name.as_str(), pool))
    }
}

/// Builds the snapshot of `servers`: the full ring and one pool per served model.
fn build_snapshot(
    servers: Vec<Arc<Server>>,
    draining: Vec<Arc<Server>>,
    version: u64,
    ring_config: &RingConfig,
    catalogue: &ModelCatalogue,
) -> Result<PoolSnapshot, RingError> {
    let models_epoch = catalogue.epoch.load(Ordering::Acquire);
    let served: Vec<Option<Vec<String>>> = servers.iter().map(|s| s.served_models()).collect();
    let mut names: BTreeSet<String> = catalogue.defaults.iter().cloned().collect();
    names.extend(served.iter().flatten().flatten().cloned());
    names.extend(catalogue.aliases.values().cloned());
    let mut models = BTreeMap::new();
    for name in &names {
        let members: Vec<Arc<Server>> = servers
            .iter()
            .zip(&served)
            .filter(|(_, models)| models.as_ref().is_none_or(|m| m.contains(name)))
            .map(|(s, _)| s.clone())
            .collect();
        let ring = build_ring(&members, ring_config)?;
        models.insert(
            name.clone(),
            Arc::new(PoolSnapshot {
                ring,
                servers: members,
                draining: Vec::new(),
                version,
                models: BTreeMap::new(),
                aliases: catalogue.aliases.clone(),
                accepted: Vec::new(),
                models_epoch,
            }),
        );
    }
    let mut accepted: Vec<String> = names.into_iter().collect();
    accepted.extend(catalogue.aliases.keys().cloned());
    accepted.sort();
    accepted.dedup();
    Ok(PoolSnapshot {
        ring: build_ring(&servers, ring_config)?,
        servers,
        draining,
        version,
        models,
        aliases: catalogue.aliases.clone(),
        accepted,
        models_epoch,
    })
}

/// What the pools per model are built from.
#[derive(Debug, Default)]
pub struct ModelCatalogue {
    /// The names a server of unknown models takes (the config's top-level `models`).
    pub defaults: Vec<String>,
    /// Public names and the served names they stand for.
    pub aliases: Arc<BTreeMap<String, String>>,
    /// Bumped whenever a server's reported model set changes; the next snapshot read rebuilds.
    pub epoch: Arc<AtomicU64>,
}

/// The live pool.
#[derive(Debug)]
pub struct Pool {
    snapshot: ArcSwap<PoolSnapshot>,
    /// Serialises decide-and-count; the Vec is scratch space for the loads.
    route_lock: Mutex<Vec<u64>>,
    /// Serialises snapshot rebuilds.
    update_lock: Mutex<()>,
    round_robin: AtomicU64,
    strategy: Strategy,
    ring_config: RingConfig,
    templates: ServerTemplates,
    prefixes: PrefixIndex,
    released: Arc<tokio::sync::Notify>,
    catalogue: ModelCatalogue,
}

/// How new servers are made: the simulated servers' engine template, and how model servers
/// run their model.
#[derive(Clone, Debug)]
pub struct ServerTemplates {
    /// Simulated servers (and the engine settings model servers start from).
    pub simulator: EngineConfig,
    /// Model (`gguf:`) servers.
    pub model: ringmaster_gpu_runtime::model::ModelOptions,
    /// The GPU model servers run on; `None` for the CPU.
    pub model_gpu: Option<crate::config::GpuPlacement>,
    /// How remote servers' clients behave.
    pub upstream: crate::remote::UpstreamSettings,
    /// The model names and aliases the pools per model are built from.
    pub models: ModelCatalogueSpec,
}

/// The config's part of the [`ModelCatalogue`].
#[derive(Clone, Debug, Default)]
pub struct ModelCatalogueSpec {
    /// The config's top-level `models`.
    pub defaults: Vec<String>,
    /// `[aliases]`.
    pub aliases: BTreeMap<String, String>,
}

impl From<EngineConfig> for ServerTemplates {
    fn from(simulator: EngineConfig) -> Self {
        Self {
            simulator,
            model: Default::default(),
            model_gpu: None,
            upstream: Default::default(),
            models: Default::default(),
        }
    }
}

/// What serves a pool server's requests: an engine in this process, or a remote worker.
#[derive(Debug, Clone)]
pub enum Backend {
    /// An engine in this process (simulated or a model).
    Local(EngineHandle),
    /// A `ringmaster worker` over HTTP.
    Remote(Arc<crate::remote::RemoteWorker>),
}

/// Why a request could not be started on a server.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The local engine refused it.
    #[error(transparent)]
    Engine(#[from] ringmaster_gpu_runtime::EngineError),
    /// The remote worker refused it or could not be reached.
    #[error(transparent)]
    Remote(#[from] crate::remote::RemoteError),
}

impl Backend {
    /// The server's load (a remote worker's as of its last poll).
    pub fn load(&self) -> ringmaster_gpu_runtime::LoadReport {
        match self {
            Self::Local(engine) => engine.load(),
            Self::Remote(worker) => worker.load(),
        }
    }

    /// Whether requests can reach it (a remote worker's last load poll succeeded).
    pub fn is_reachable(&self) -> bool {
        match self {
            Self::Local(_) => true,
            Self::Remote(worker) => worker.is_reachable(),
        }
    }
}

impl Pool {
    /// Starts every server in `specs` and builds the first snapshot. Needs a tokio runtime.
    pub fn start(
        specs: &[ServerSpec],
        strategy: Strategy,
        ring_config: RingConfig,
        templates: impl Into<ServerTemplates>,
    ) -> Result<Self, PoolError> {
        let templates = templates.into();
        let released = Arc::new(tokio::sync::Notify::new());
        let catalogue = ModelCatalogue {
            defaults: templates.models.defaults.clone(),
            aliases: Arc::new(templates.models.aliases.clone()),
            epoch: Arc::new(AtomicU64::new(0)),
        };
        let mut servers = Vec::with_capacity(specs.len());
        for (slot, spec) in specs.iter().enumerate() {
            if servers.iter().any(|s: &Arc<Server>| s.id == spec.id) {
                return Err(PoolError::Duplicate(spec.id.clone()));
            }
            servers.push(start_server(
                spec,
                slot,
                &templates,
                &released,
                &catalogue.epoch,
            )?);
        }
        let snapshot = build_snapshot(servers, Vec::new(), 1, &ring_config, &catalogue)?;
        Ok(Self {
            catalogue,
            snapshot: ArcSwap::from_pointee(snapshot),
            route_lock: Mutex::new(Vec::new()),
            update_lock: Mutex::new(()),
            round_robin: AtomicU64::new(0),
            strategy,
            ring_config,
            templates,
            prefixes: PrefixIndex::new(DEFAULT_PREFIX_INDEX_CAPACITY),
            released,
        })
    }

    /// Notified whenever a request releases its server slot (the admission queue waits on it).
    pub fn released(&self) -> &tokio::sync::Notify {
        &self.released
    }

    /// Requests in flight on active servers, and how many active servers there are.
    pub fn load(&self) -> (u64, usize) {
        let snapshot = self.snapshot();
        let in_flight = snapshot.servers.iter().map(|s| s.in_flight()).sum();
        (in_flight, snapshot.servers.len())
    }

    /// The gateway's estimate of which prefixes each server holds.
    pub fn prefixes(&self) -> &PrefixIndex {
        &self.prefixes
    }

    /// The current snapshot. When a server's reported models changed since it was built,
    /// the pools per model are rebuilt first (one atomic load when nothing changed).
    pub fn snapshot(&self) -> Arc<PoolSnapshot> {
        let snapshot = self.snapshot.load_full();
        if snapshot.models_epoch == self.catalogue.epoch.load(Ordering::Acquire) {
            return snapshot;
        }
        let _guard = self.update_lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot.load_full();
        match build_snapshot(
            current.servers.clone(),
            current.draining.clone(),
            current.version + 1,
            &self.ring_config,
            &self.catalogue,
        ) {
            Ok(next) => {
                let next = Arc::new(next);
                tracing::info!(models = ?next.accepted, "pool.models_changed");
                self.snapshot.store(next.clone());
                next
            }
            Err(e) => {
                tracing::warn!(error = %e, "pool.models_rebuild_failed");
                current
            }
        }
    }

    /// The routing strategy.
    pub fn strategy(&self) -> Strategy {
        self.strategy
    }

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

    /// Sends the request to the server a router policy chose, counting it in flight, unless
    /// that server is no longer active or is at its bounded-load cap now: then the ring decides
    /// (the cap is the host's invariant, whatever a policy answers). `None` with no servers.
    pub fn assign(&self, chosen: &str, input: &RoutingInput) -> Option<(Decision, InFlight)> {
        self.assign_on(&self.snapshot.load(), chosen, input)
    }

    /// [`Self::assign`] on `snapshot`, the one the policy decided on.
    pub fn assign_on(
        &self,
        snapshot: &PoolSnapshot,
        chosen: &str,
        input: &RoutingInput,
    ) -> Option<(Decision, InFlight)> {
        if snapshot.servers.is_empty() {
            return None;
        }
        let mut loads = self.route_lock.lock().unwrap_or_else(|e| e.into_inner());
        let position = snapshot.servers.iter().position(|s| s.id == chosen);
        let decision = match position {
            Some(i) if !snapshot.servers[i].is_routable() => {
                let mut failover = self.decide(snapshot, input, &mut loads)?;
                failover.reason = DecisionReason::Failover;
                failover.preferred = Some(snapshot.servers[i].clone());
                failover
            }
            Some(i) => {
                loads.clear();
                loads.extend(snapshot.servers.iter().map(|s| s.in_flight()));
                let total: u64 = loads.iter().sum();
                let capacity = snapshot.ring.capacity(i, total);
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
                        capacity: Some(capacity),
                        load_after: loads[i] + 1,
                    }
                } else {
                    let mut spilled = self.decide(snapshot, input, &mut loads)?;
                    spilled.reason = DecisionReason::PolicyOverCap;
                    spilled.preferred = Some(snapshot.servers[i].clone());
                    spilled
                }
            }
            None => self.decide(snapshot, input, &mut loads)?,
        };
        Some(self.count(decision, input, loads))
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

    /// The bounded-load walk over routable servers not in `exclude`: the first with room,
    /// else the first routable one over its cap. With nothing to exclude, an unroutable
    /// owner still gets the request when no server is routable (it may be back; if not, the
    /// client hears why).
    fn walk(
        &self,
        snapshot: &PoolSnapshot,
        input: &RoutingInput,
        loads: &mut Vec<u64>,
        exclude: &[String],
    ) -> Option<Decision> {
        let servers = &snapshot.servers;
        loads.clear();
        loads.extend(servers.iter().map(|s| s.in_flight()));
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
    fn count(
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
            },
        )
    }

    /// What [`Self::route`] would decide now, without counting anything.
    pub fn explain(&self, input: &RoutingInput) -> Option<Decision> {
        self.explain_on(&self.snapshot.load(), input)
    }

    /// [`Self::explain`] on `snapshot` (a model's pool).
    pub fn explain_on(&self, snapshot: &PoolSnapshot, input: &RoutingInput) -> Option<Decision> {
        if snapshot.servers.is_empty() {
            return None;
        }
        let mut loads = Vec::new();
        self.decide(snapshot, input, &mut loads)
    }

    fn decide(
        &self,
        snapshot: &PoolSnapshot,
        input: &RoutingInput,
        loads: &mut Vec<u64>,
    ) -> Option<Decision> {
        let servers = &snapshot.servers;
        match self.strategy {
            Strategy::RoundRobin => {
                let n = servers.len() as u64;
                if n == 0 {
                    return None;
                }
                let start = self.round_robin.fetch_add(1, Ordering::Relaxed);
                let i = (0..n)
                    .map(|k| ((start + k) % n) as usize)
                    .find(|&i| servers[i].is_routable())
                    .unwrap_or((start % n) as usize);
                let server = servers[i].clone();
                let load_after = server.in_flight() + 1;
                Some(Decision {
                    server,
                    reason: DecisionReason::RoundRobin,
                    preferred: None,
                    skipped: Vec::new(),
                    capacity: None,
                    load_after,
                })
            }
            Strategy::ConsistentHash if !servers.iter().all(|s| s.is_routable()) => {
                self.walk(snapshot, input, loads, &[])
            }
            Strategy::ConsistentHash => {
                loads.clear();
                loads.extend(servers.iter().map(|s| s.in_flight()));
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
    }

    /// Starts a server and publishes a snapshot with it on the ring.
    pub fn add(&self, spec: &ServerSpec) -> Result<Arc<Server>, PoolError> {
        let _guard = self.update_lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot.load_full();
        if current.server(&spec.id).is_some() || current.draining.iter().any(|s| s.id == spec.id) {
            return Err(PoolError::Duplicate(spec.id.clone()));
        }
        let used: Vec<usize> = current
            .servers
            .iter()
            .chain(current.draining.iter())
            .map(|s| s.slot)
            .collect();
        let slot = (0..)
            .find(|slot| !used.contains(slot))
            .expect("a free slot");
        let server = start_server(
            spec,
            slot,
            &self.templates,
            &self.released,
            &self.catalogue.epoch,
        )?;
        let mut servers = current.servers.clone();
        servers.push(server.clone());
        self.snapshot.store(Arc::new(build_snapshot(
            servers,
            current.draining.clone(),
            current.version + 1,
            &self.ring_config,
            &self.catalogue,
        )?));
        Ok(server)
    }

    /// Takes a server off the ring; it drains its in-flight requests and then stops.
    pub fn remove(&self, id: &str) -> Result<Arc<Server>, PoolError> {
        let _guard = self.update_lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot.load_full();
        let Some(position) = current.servers.iter().position(|s| s.id == id) else {
            return Err(PoolError::Unknown(id.to_owned()));
        };
        let mut servers = current.servers.clone();
        let removed = servers.remove(position);
        removed.draining.store(true, Ordering::Release);
        let mut draining = current.draining.clone();
        draining.push(removed.clone());
        self.snapshot.store(Arc::new(build_snapshot(
            servers,
            draining,
            current.version + 1,
            &self.ring_config,
            &self.catalogue,
        )?));
        Ok(removed)
    }

    /// Forgets drained servers that have no request left. Returns how many were dropped.
    pub fn reap_drained(&self) -> usize {
        if self
            .snapshot
            .load()
            .draining
            .iter()
            .all(|s| s.in_flight() > 0)
        {
            return 0;
        }
        let _guard = self.update_lock.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.snapshot.load_full();
        let draining: Vec<_> = current
            .draining
            .iter()
            .filter(|s| s.in_flight() > 0)
            .cloned()
            .collect();
        let reaped = current.draining.len() - draining.len();
        for gone in current.draining.iter().filter(|s| s.in_flight() == 0) {
            self.prefixes.forget(gone.slot);
        }
        if reaped > 0 {
            self.snapshot.store(Arc::new(PoolSnapshot {
                ring: current.ring.clone(),
                servers: current.servers.clone(),
                draining,
                version: current.version + 1,
                models: current.models.clone(),
                aliases: current.aliases.clone(),
                accepted: current.accepted.clone(),
                models_epoch: current.models_epoch,
            }));
        }
        reaped
    }
}

fn start_server(
    spec: &ServerSpec,
    slot: usize,
    templates: &ServerTemplates,
    released: &Arc<tokio::sync::Notify>,
    models_epoch: &Arc<AtomicU64>,
) -> Result<Arc<Server>, PoolError> {
    let mut model_load = None;
    let engine = match &spec.address {
        ServerAddress::Simulated { name } => {
            let mut config = templates.simulator.clone();
            config.name = name.clone();
            Backend::Local(
                EngineHandle::spawn(config).map_err(|source| PoolError::Engine {
                    id: spec.id.clone(),
                    source,
                })?,
            )
        }
        ServerAddress::Model { path, name } => {
            let mut config = templates.simulator.clone();
            config.name = name.clone();
            config.kv_blocks = templates.model.kv_blocks;
            config.max_running = MODEL_MAX_RUNNING;
            config.step_token_budget = MODEL_STEP_TOKEN_BUDGET;
            // Step durations are measured, not modelled: the clock must not add to them.
            config.time_scale = 1.0;
            let started = std::time::Instant::now();
            let engine = match templates.model_gpu {
                Some(gpu) => start_gpu_model(spec, path, gpu, config)?,
                None => {
                    let executor =
                        ringmaster_gpu_runtime::model::ModelExecutor::load(path, &templates.model)
                            .map_err(|source| PoolError::Model {
                                id: spec.id.clone(),
                                source,
                            })?;
                    tracing::info!(
                        server = %spec.id,
                        model = %path.display(),
                        load_ms = started.elapsed().as_millis() as u64,
                        kv_blocks = config.kv_blocks,
                        threads = templates.model.threads,
                        kernels = executor.cpu().isa().name(),
                        "pool.model_loaded"
                    );
                    EngineHandle::spawn_with_executor(config, executor).map_err(|source| {
                        PoolError::Engine {
                            id: spec.id.clone(),
                            source,
                        }
                    })?
                }
            };
            model_load = Some(started.elapsed());
            Backend::Local(engine)
        }
        ServerAddress::Remote { url, .. } => {
            tracing::info!(server = %spec.id, worker = %url, "pool.remote_worker");
            Backend::Remote(crate::remote::RemoteWorker::start_in_pool(
                url,
                templates.upstream.clone(),
                // A server whose models the config names needs no discovery.
                spec.models.is_none().then(|| models_epoch.clone()),
            ))
        }
    };
    let local_scheme = match &engine {
        Backend::Local(engine) => Some(crate::kv_view::Scheme::of(engine.tokenizer().clone())),
        Backend::Remote(_) => None,
    };
    Ok(Arc::new(Server {
        id: spec.id.clone(),
        slot,
        address: spec.address.clone(),
        weight: spec.weight,
        engine,
        in_flight: AtomicU64::new(0),
        peak_in_flight: AtomicU64::new(0),
        requests_total: AtomicU64::new(0),
        draining: AtomicBool::new(false),
        released: released.clone(),
        model_load,
        local_scheme,
        pending: Mutex::new(HashMap::new()),
        configured_models: spec.models.clone(),
    }))
}

/// A model server's engine on a GPU: the pool is the executor's, so the engine's `kv_blocks`
/// is taken from it.
#[cfg(feature = "cuda")]
fn start_gpu_model(
    spec: &ServerSpec,
    path: &std::path::Path,
    gpu: crate::config::GpuPlacement,
    mut config: EngineConfig,
) -> Result<EngineHandle, PoolError> {
    let started = std::time::Instant::now();
    let executor =
        ringmaster_gpu_runtime::model::GpuExecutor::load(path, gpu.ordinal, gpu.kv_blocks)
            .map_err(|source| PoolError::Model {
                id: spec.id.clone(),
                source,
            })?;
    config.kv_blocks = executor.kv_blocks();
    tracing::info!(
        server = %spec.id,
        model = %path.display(),
        gpu = %executor.device_name(),
        load_ms = started.elapsed().as_millis() as u64,
        kv_blocks = config.kv_blocks,
        "pool.model_loaded"
    );
    EngineHandle::spawn_with_executor(config, executor).map_err(|source| PoolError::Engine {
        id: spec.id.clone(),
        source,
    })
}

/// Without the `cuda` feature the config refuses a GPU placement, so this is never reached.
#[cfg(not(feature = "cuda"))]
fn start_gpu_model(
    spec: &ServerSpec,
    path: &std::path::Path,
    gpu: crate::config::GpuPlacement,
    _config: EngineConfig,
) -> Result<EngineHandle, PoolError> {
    Err(PoolError::Model {
        id: spec.id.clone(),
        source: ringmaster_gpu_runtime::model::ModelError::Unsupported {
            path: path.display().to_string(),
            why: format!(
                "GPU {} needs a build with CUDA support (--features cuda)",
                gpu.ordinal
            ),
        },
    })
}

fn build_ring(servers: &[Arc<Server>], config: &RingConfig) -> Result<Ring, RingError> {
    Ring::new(
        servers
            .iter()
            .map(|s| Member {
                id: s.id.clone(),
                weight: s.weight,
            })
            .collect(),
        config.clone(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::KeySource;

    fn specs(n: usize) -> Vec<ServerSpec> {
        (0..n)
            .map(|i| ServerSpec {
                id: format!("gpu-{i}"),
                address: ServerAddress::Simulated {
                    name: format!("gpu-{i}"),
                },
                weight: 1,
                models: None,
            })
            .collect()
    }

    fn input(key: u64) -> RoutingInput {
        RoutingInput {
            key,
            source: KeySource::Prefix,
            prefix_hashes: vec![],
            prompt_chunks: 0,
            chat: Default::default(),
        }
    }

    fn sim() -> EngineConfig {
        let mut config = EngineConfig::simulated("t");
        config.time_scale = 0.0;
        config
    }

    #[tokio::test]
    async fn in_flight_prompts_count_as_pending_until_they_finish() {
        let pool = Pool::start(
            &specs(2),
            Strategy::ConsistentHash,
            RingConfig::default(),
            sim(),
        )
        .unwrap();
        let with = |hashes: Vec<u64>| RoutingInput {
            prefix_hashes: hashes,
            ..input(9)
        };
        let (first, first_guard) = pool.route(&with(vec![1, 2, 3])).unwrap();
        let (second, second_guard) = pool.route(&with(vec![1, 2, 7])).unwrap();
        assert_eq!(first.server.id(), second.server.id(), "one key, one server");
        let server = first.server.clone();
        assert_eq!(server.pending_prefix(&[1, 2, 3, 4]), 3);
        assert_eq!(server.pending_prefix(&[1, 2, 7]), 3);
        assert_eq!(
            server.pending_prefix(&[5, 2]),
            0,
            "only leading hashes count"
        );
        drop(first_guard);
        assert_eq!(
            server.pending_prefix(&[1, 2, 3]),
            2,
            "the second still holds 1, 2"
        );
        drop(second_guard);
        assert_eq!(server.pending_prefix(&[1]), 0);
        assert!(server.pending.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn one_key_spills_once_its_owner_is_at_cap() {
        let pool = Pool::start(
            &specs(4),
            Strategy::ConsistentHash,
            RingConfig::default(),
            sim(),
        )
        .unwrap();
        let mut guards = Vec::new();
        let mut spilled = 0;
        for _ in 0..40 {
            let (decision, guard) = pool.route(&input(42)).unwrap();
            let snapshot = pool.snapshot();
            let total: u64 = snapshot.servers.iter().map(|s| s.in_flight()).sum();
            // The cap held at assignment: load_after <= ceil(1.25 * total / n).
            assert!(decision.load_after <= decision.capacity.unwrap());
            assert!(decision.load_after as f64 <= (1.25 * total as f64 / 4.0).ceil());
            if decision.reason == DecisionReason::BoundedLoadSpill {
                spilled += 1;
            }
            guards.push(guard);
        }
        assert!(spilled > 0);
        drop(guards);
        assert!(pool.snapshot().servers.iter().all(|s| s.in_flight() == 0));
    }

    #[tokio::test]
    async fn removed_servers_drain_then_disappear() {
        let pool = Pool::start(
            &specs(3),
            Strategy::ConsistentHash,
            RingConfig::default(),
            sim(),
        )
        .unwrap();
        let (decision, guard) = pool.route(&input(7)).unwrap();
        let id = decision.server.id().to_owned();
        pool.remove(&id).unwrap();
        assert!(matches!(pool.remove(&id), Err(PoolError::Unknown(_))));
        assert!(matches!(
            pool.add(&specs(3).into_iter().find(|s| s.id == id).unwrap()),
            Err(PoolError::Duplicate(_))
        ));
        let snapshot = pool.snapshot();
        assert_eq!(snapshot.servers.len(), 2);
        assert_eq!(snapshot.draining.len(), 1);
        assert!(snapshot.draining[0].is_draining());
        assert_eq!(pool.reap_drained(), 0, "still has a request");
        drop(guard);
        assert_eq!(pool.reap_drained(), 1);
        assert!(pool.snapshot().draining.is_empty());
        // The key now maps to a remaining server.
        let (again, _g) = pool.route(&input(7)).unwrap();
        assert_ne!(again.server.id(), id);
    }

    #[tokio::test]
    async fn round_robin_cycles() {
        let pool = Pool::start(
            &specs(3),
            Strategy::RoundRobin,
            RingConfig::default(),
            sim(),
        )
        .unwrap();
        let ids: Vec<_> = (0..6)
            .map(|_| pool.route(&input(1)).unwrap().0.server.id().to_owned())
            .collect();
        assert_eq!(ids[0..3], ids[3..6]);
        assert_ne!(ids[0], ids[1]);
    }
}
