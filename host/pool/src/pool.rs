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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use ringmaster_ring::RingConfig;

use crate::prefix_index::{DEFAULT_PREFIX_INDEX_CAPACITY, PrefixIndex};
use crate::server::{PoolError, Server, ServerTemplates, start_server};
use crate::snapshot::{ModelCatalogue, PoolSnapshot, build_snapshot};
use ringmaster_config::servers::ServerSpec;

/// The live pool.
#[derive(Debug)]
pub struct Pool {
    pub(crate) snapshot: ArcSwap<PoolSnapshot>,
    /// Serialises decide-and-count; the Vec is scratch space for the loads.
    pub(crate) route_lock: Mutex<Vec<u64>>,
    /// Serialises snapshot rebuilds.
    pub(crate) update_lock: Mutex<()>,
    pub(crate) ring_config: RingConfig,
    pub(crate) templates: ServerTemplates,
    pub(crate) prefixes: PrefixIndex,
    pub(crate) released: Arc<tokio::sync::Notify>,
    pub(crate) catalogue: ModelCatalogue,
}

impl Pool {
    /// Starts every server in `specs` and builds the first snapshot. Needs a tokio runtime.
    pub fn start(
        specs: &[ServerSpec],
        ring_config: RingConfig,
        templates: impl Into<ServerTemplates>,
    ) -> Result<Self, PoolError> {
        let templates = templates.into();
        let released = Arc::new(tokio::sync::Notify::new());
        let catalogue = ModelCatalogue {
            defaults: templates.models.defaults.clone(),
            aliases: Arc::new(templates.models.aliases.clone()),
            loadable: templates.models.loadable.clone(),
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
                prefill: current.prefill.clone(),
                draining,
                version: current.version + 1,
                models: current.models.clone(),
                aliases: current.aliases.clone(),
                accepted: current.accepted.clone(),
                adapters: current.adapters.clone(),
                spill_pools: current.spill_pools.clone(),
                models_epoch: current.models_epoch,
            }));
        }
        reaped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backend;
    use crate::input::{KeySource, RoutingInput};
    use crate::selection::DecisionReason;
    use ringmaster_config::servers::ServerAddress;
    use ringmaster_gpu_runtime::EngineConfig;

    fn specs(n: usize) -> Vec<ServerSpec> {
        (0..n)
            .map(|i| ServerSpec {
                id: format!("gpu-{i}"),
                address: ServerAddress::Simulated {
                    name: format!("gpu-{i}"),
                    slowdown_percent: 100,
                },
                weight: 1,
                models: None,
                kv_events: None,
                tokenizer: None,
                protocol: Default::default(),
                role: Default::default(),
                access: Default::default(),
                pool: None,
            })
            .collect()
    }

    fn input(key: u64) -> RoutingInput {
        RoutingInput {
            key,
            source: KeySource::Prefix,
            prefix_hashes: vec![],
            prompt_chunks: 0,
        }
    }

    fn sim() -> EngineConfig {
        let mut config = EngineConfig::simulated("t");
        config.time_scale = 0.0;
        config
    }

    /// Runs one request with a long prompt on `server`'s engine to its end and returns the
    /// prompt's block hashes.
    async fn serve_a_long_prompt(server: &Server) -> Vec<ringmaster_gpu_runtime::block::BlockHash> {
        use ringmaster_gpu_runtime::{ChatMessage, GenerateEvent, GenerateRequest, Role};
        let Backend::Local(engine) = server.engine() else {
            panic!("a simulated server")
        };
        let text = (0..300)
            .map(|i| format!("w{i}"))
            .collect::<Vec<_>>()
            .join(" ");
        let request = GenerateRequest {
            request_id: "t".into(),
            system: None,
            messages: vec![ChatMessage {
                role: Role::User,
                text,
                ..Default::default()
            }],
            max_tokens: 2,
            stop_sequences: vec![],
            sampling: Default::default(),
            prompt: None,
            priority: 0,
            tools: None,
            effort: None,
            output_format: None,
        };
        let prompt = engine.tokenizer().encode_chat(None, &request.messages);
        let mut stream = engine.submit(request).unwrap();
        while let Some(event) = stream.next().await {
            if matches!(event, GenerateEvent::Finished { .. }) {
                break;
            }
        }
        ringmaster_gpu_runtime::block::block_hashes(&prompt)
    }

    #[tokio::test]
    async fn a_simulated_server_can_be_read_through_vllm_events_or_not_at_all() {
        use crate::server::CacheView;
        use ringmaster_config::LocalCacheView;
        for (view, expected) in [
            (LocalCacheView::InProcess, CacheView::InProcess),
            (LocalCacheView::VllmEvents, CacheView::EngineEvents),
            (LocalCacheView::RoutingHistory, CacheView::RoutingHistory),
        ] {
            let mut templates = crate::ServerTemplates::from(sim());
            templates.local_cache_view = view;
            let pool = Pool::start(&specs(1), RingConfig::default(), templates).unwrap();
            let server = pool.snapshot().servers[0].clone();
            assert_eq!(server.cache_view(), expected);
            let hashes = serve_a_long_prompt(&server).await;
            assert!(hashes.len() >= 10);
            let Backend::Local(engine) = server.engine() else {
                unreachable!()
            };
            assert_eq!(engine.cached_prefix_blocks(&hashes), hashes.len());
            match view {
                LocalCacheView::InProcess => {
                    assert_eq!(server.held_blocks(&hashes), Some(hashes.len()));
                }
                LocalCacheView::VllmEvents => {
                    // The feed runs beside the engine: let it read the step's batch.
                    for _ in 0..100 {
                        if server.held_blocks(&hashes) == Some(hashes.len()) {
                            break;
                        }
                        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                    }
                    assert_eq!(server.held_blocks(&hashes), Some(hashes.len()));
                    let (events, resyncs) = server.reported_cache_events();
                    assert!(events >= hashes.len() as u64, "{events} events");
                    assert_eq!(resyncs, 0);
                    assert_eq!(server.reported_cache(), (engine.cached_block_count(), true));
                }
                LocalCacheView::RoutingHistory => {
                    assert_eq!(server.held_blocks(&hashes), None, "routing reads nothing");
                    assert!(server.cache_scheme().is_some(), "token counts stay exact");
                }
            }
        }
    }

    #[tokio::test]
    async fn the_cap_guard_spills_at_its_own_factor_or_lets_the_policy_decide() {
        use ringmaster_config::CapGuard;
        let pool = Pool::start(&specs(2), RingConfig::default(), sim()).unwrap();
        let snapshot = pool.snapshot();
        let host = CapGuard::default();
        let wide = CapGuard::Host {
            load_factor: Some(2.0),
        };
        let mut held = Vec::new();
        // 1.25: cap = ceil(1.25 × (total + 1) / 2); gpu-0 takes 1, 2, then the 3rd spills.
        for expected in ["gpu-0", "gpu-0"] {
            let (d, g) = pool.assign_on(&snapshot, "gpu-0", &input(1), host).unwrap();
            assert_eq!(
                (d.server.id(), d.reason),
                (expected, DecisionReason::Policy)
            );
            held.push(g);
        }
        let (d, _) = pool.assign_on(&snapshot, "gpu-0", &input(1), host).unwrap();
        assert_eq!(d.reason, DecisionReason::PolicyOverCap);
        // With factor 2 the same choice fits: ceil(2 × 3 / 2) = 3 > 2.
        let (d, g) = pool.assign_on(&snapshot, "gpu-0", &input(1), wide).unwrap();
        assert_eq!((d.server.id(), d.reason), ("gpu-0", DecisionReason::Policy));
        held.push(g);
        // The policy alone: no cap at all.
        for _ in 0..10 {
            let (d, g) = pool
                .assign_on(&snapshot, "gpu-0", &input(1), CapGuard::Policy)
                .unwrap();
            assert_eq!((d.server.id(), d.capacity), ("gpu-0", None));
            held.push(g);
        }
        assert_eq!(snapshot.servers[0].in_flight(), 13);
    }

    #[tokio::test]
    async fn in_flight_prompts_count_as_pending_until_they_finish() {
        let pool = Pool::start(&specs(2), RingConfig::default(), sim()).unwrap();
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
    async fn the_prefill_backlog_counts_until_the_server_begins_or_the_request_ends() {
        let pool = Pool::start(&specs(1), RingConfig::default(), sim()).unwrap();
        let (first, mut first_guard) = pool.route(&input(1)).unwrap();
        let (_, mut second_guard) = pool.route(&input(2)).unwrap();
        let server = first.server.clone();
        assert_eq!(server.prefill_backlog(), 0, "nothing charged yet");
        first_guard.charge_prefill(1_000);
        second_guard.charge_prefill(300);
        assert_eq!(server.prefill_backlog(), 1_300);
        first_guard.prefilled();
        assert_eq!(server.prefill_backlog(), 300);
        first_guard.prefilled();
        assert_eq!(server.prefill_backlog(), 300, "released once");
        drop(first_guard);
        assert_eq!(server.prefill_backlog(), 300);
        // A request that ends before its first token (cancelled, failed) releases it too.
        drop(second_guard);
        assert_eq!(server.prefill_backlog(), 0);
    }

    #[tokio::test]
    async fn one_key_spills_once_its_owner_is_at_cap() {
        let pool = Pool::start(&specs(4), RingConfig::default(), sim()).unwrap();
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
        let pool = Pool::start(&specs(3), RingConfig::default(), sim()).unwrap();
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
}
