//! The engine: one wasmtime `Engine` and `Linker` for every policy, and the load pipeline
//! (check the bytes → compile, cached → check the world ([`crate::contract`]) →
//! pre-instantiate → instantiate once), whose result is the version's [`Core`]
//! ([`crate::instance`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use wasmtime::component::{Component, Linker};
use wasmtime::{Cache, CacheConfig, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use crate::contract::{World, check_header, check_world};
use crate::error::{FaultCounters, PolicyError, PolicyFault};
use crate::host::{CounterSet, PolicyShared};
use crate::instance::{Core, InstantiateError};
use crate::shared::EngineInner;
use crate::state::StateMode;
use crate::types::PolicyInfo;
use crate::{EngineConfig, TABLE_ELEMENTS_LIMIT};

/// Core instances the pooling allocator provides per component instance (a Rust policy has 1–2,
/// a componentize-py one about a dozen).
const CORE_INSTANCES_PER_COMPONENT: u32 = 20;
/// Linear memories provided per component instance.
const MEMORIES_PER_COMPONENT: u32 = 2;
/// Tables provided per component instance.
const TABLES_PER_COMPONENT: u32 = 4;
/// Smallest memory cap accepted: one Wasm page.
const MIN_MEMORY_LIMIT: usize = 64 * 1024;

/// The on-disk cache's counters since the engine started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheStats {
    /// Components loaded from the cache.
    pub hits: usize,
    /// Components compiled and written to the cache.
    pub misses: usize,
}

/// Loads policies and runs them. Cheap to clone (an `Arc` inside); one per process is enough.
#[derive(Clone)]
pub struct PolicyEngine {
    inner: Arc<EngineInner>,
}

impl fmt::Debug for PolicyEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PolicyEngine")
            .field("config", &self.inner.config)
            .field("cache", &self.cache_stats())
            .finish_non_exhaustive()
    }
}

impl PolicyEngine {
    /// Sets up the engine: validates `config`, creates the wasmtime engine (component model,
    /// pooling allocator sized by `max_instances` and `memory_limit_bytes`, copy-on-write
    /// memory images, the cache when `cache_dir` is set), links the host's imports, and starts
    /// the epoch ticker thread unless `fuel` is set. The thread ends once the engine and every
    /// policy loaded from it are dropped.
    pub fn new(config: EngineConfig) -> Result<Self, PolicyError> {
        validate(&config)?;
        let mut wt = wasmtime::Config::new();
        wt.wasm_component_model(true);
        if config.fuel.is_some() {
            wt.consume_fuel(true);
        } else {
            wt.epoch_interruption(true);
        }
        let instances = config.max_instances;
        let mut pool = PoolingAllocationConfig::new();
        pool.total_component_instances(instances)
            .total_core_instances(instances.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
            .total_memories(instances.saturating_mul(MEMORIES_PER_COMPONENT))
            .total_tables(instances.saturating_mul(TABLES_PER_COMPONENT))
            .max_memory_size(config.memory_limit_bytes)
            .table_elements(TABLE_ELEMENTS_LIMIT);
        wt.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        wt.memory_init_cow(true);

        // The cache only saves compile time: a directory that cannot be used (a read-only
        // root file system without a writable home) is said once, and the engine compiles
        // without it.
        let cache = config.cache_dir.as_ref().and_then(|dir| {
            let dir = std::path::absolute(dir).unwrap_or_else(|_| dir.clone());
            let mut cache_config = CacheConfig::new();
            cache_config.with_directory(&dir);
            match Cache::new(cache_config) {
                Ok(cache) => {
                    wt.cache(Some(cache.clone()));
                    Some(cache)
                }
                Err(e) => {
                    tracing::warn!(
                        dir = %dir.display(),
                        error = %format!("{e:#}"),
                        "policy.cache_unavailable"
                    );
                    None
                }
            }
        });

        let engine = Engine::new(&wt).map_err(|e| {
            PolicyError::Engine(format!(
                "cannot create the Wasm engine (max_instances = {instances}, memory_limit_bytes = {}): {e:#}",
                config.memory_limit_bytes
            ))
        })?;
        let mut linker = Linker::new(&engine);
        crate::imports::define_imports(&mut linker)
            .map_err(|e| PolicyError::Engine(format!("cannot link the policy imports: {e:#}")))?;
        if config.fuel.is_none() {
            spawn_ticker(&engine, config.epoch_tick)?;
        }
        Ok(Self {
            inner: Arc::new(EngineInner {
                call_ticks: ticks(config.call_deadline, config.epoch_tick),
                instantiate_ticks: ticks(config.instantiate_deadline, config.epoch_tick),
                engine,
                linker,
                config,
                cache,
                counters: Mutex::new(BTreeMap::new()),
                states: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// The configuration the engine runs with.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// Component instances alive in the pooling allocator now (warm ones and those in a
    /// call), out of [`EngineConfig::max_instances`]: what a soak watches for leaks.
    pub fn live_instances(&self) -> u64 {
        self.inner
            .engine
            .pooling_allocator_metrics()
            .map_or(0, |m| m.component_instances())
    }

    /// Hits and misses of the on-disk cache (`None` when it is off).
    pub fn cache_stats(&self) -> Option<CacheStats> {
        self.inner.cache.as_ref().map(|c| CacheStats {
            hits: c.cache_hits(),
            misses: c.cache_misses(),
        })
    }

    /// Every counter policies have emitted through `metrics.counter-add`, as
    /// `(policy name, counter name, total)`, sorted. Counters belong to the policy's name, so
    /// they keep counting across versions.
    pub fn policy_counters(&self) -> Vec<(String, String, u64)> {
        let sets: Vec<(String, Arc<CounterSet>)> = {
            let registry = self
                .inner
                .counters
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            registry
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        let mut out = Vec::new();
        for (policy, set) in sets {
            for (counter, value) in set.snapshot() {
                out.push((policy.clone(), counter, value));
            }
        }
        out
    }

    /// Compiles and checks a component for world `W`, and instantiates it once. Probing is the
    /// caller's (it knows the world's calls). `state` says which `state` store it gets; a fresh
    /// one becomes the name's store only once the load succeeded.
    pub(crate) fn load<W: World>(
        &self,
        name: &str,
        bytes: &[u8],
        config: BTreeMap<String, String>,
        state: StateMode,
    ) -> Result<Arc<Core<W>>, PolicyError> {
        let inner = &self.inner;
        check_header::<W>(name, bytes)?;
        let started = std::time::Instant::now();
        let component = Component::new(&inner.engine, bytes)
            .map_err(|e| PolicyError::Compile(format!("`{name}` failed to compile: {e:#}")))?;
        let compile_ms = started.elapsed().as_secs_f64() * 1000.0;
        let version = check_world::<W>(name, &component, &inner.engine)?;
        let pre = inner.linker.instantiate_pre(&component).map_err(|e| {
            PolicyError::WrongWorld(format!(
                "`{name}` cannot be linked as a {} policy: {e:#}",
                W::NAME
            ))
        })?;
        let mut export_indices = W::EXPORTS
            .iter()
            .map(|export| {
                component.get_export_index(None, export).ok_or_else(|| {
                    PolicyError::WrongWorld(format!("`{name}` does not export `{export}`"))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let optional: Vec<bool> = W::OPTIONAL_EXPORTS
            .iter()
            .map(|export| match component.get_export_index(None, export) {
                Some(index) if version.has_resources() => {
                    export_indices.push(index);
                    true
                }
                _ => false,
            })
            .collect();

        let counters = {
            let mut registry = inner
                .counters
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            registry.entry(name.to_owned()).or_default().clone()
        };
        let state_key = (W::NAME, name.to_owned());
        let state_store = match state {
            StateMode::Keep => inner
                .states
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(state_key.clone())
                .or_insert_with(|| Arc::new(inner.new_state()))
                .clone(),
            StateMode::Fresh => Arc::new(inner.new_state()),
        };
        let core = Arc::new(Core {
            info: PolicyInfo {
                name: name.to_owned(),
                hash: crate::content_hash(bytes),
                loaded_at: SystemTime::now(),
                size: bytes.len(),
            },
            engine: self.inner.clone(),
            shared: Arc::new(PolicyShared::new(
                name,
                config,
                counters,
                state_store.clone(),
            )),
            pre,
            version,
            export_indices,
            optional,
            warm: Mutex::new(Vec::new()),
            faults: FaultCounters::default(),
            last_call_fuel: std::sync::atomic::AtomicU64::new(u64::MAX),
        });
        let warm = core.instantiate().map_err(|e| match e {
            InstantiateError::Exports(e) => PolicyError::WrongWorld(format!(
                "`{name}` does not target the {} world: an export has the wrong type: {e:#}",
                W::NAME
            )),
            InstantiateError::Failed(fault) => PolicyError::Instantiate(format!(
                "`{name}` failed to instantiate: {}",
                inner.explain(&fault, true)
            )),
        })?;
        core.put(warm);
        if state == StateMode::Fresh {
            inner
                .states
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(state_key, state_store);
        }
        tracing::debug!(
            policy = name,
            world = W::NAME,
            contract = version.as_str(),
            hash = %core.info.hash,
            compile_ms,
            "policy.loaded"
        );
        Ok(core)
    }

    /// A fault, in words a policy author can act on.
    pub(crate) fn explain(&self, fault: &PolicyFault, instantiating: bool) -> String {
        self.inner.explain(fault, instantiating)
    }
}

fn validate(config: &EngineConfig) -> Result<(), PolicyError> {
    let bad = |what: String| {
        Err(PolicyError::Engine(format!(
            "invalid policy engine config: {what}"
        )))
    };
    if config.call_deadline.is_zero() {
        return bad("call_deadline must be more than zero".into());
    }
    if config.instantiate_deadline.is_zero() {
        return bad("instantiate_deadline must be more than zero".into());
    }
    let shortest = config.call_deadline.min(config.instantiate_deadline);
    if config.epoch_tick.is_zero() || config.epoch_tick > shortest {
        return bad(format!(
            "epoch_tick ({:?}) must be more than zero and at most call_deadline ({:?}) and \
             instantiate_deadline ({:?})",
            config.epoch_tick, config.call_deadline, config.instantiate_deadline
        ));
    }
    if config.memory_limit_bytes < MIN_MEMORY_LIMIT {
        return bad(format!(
            "memory_limit_bytes ({}) must be at least one Wasm page ({MIN_MEMORY_LIMIT})",
            config.memory_limit_bytes
        ));
    }
    if config.max_instances == 0 {
        return bad("max_instances must be at least 1".into());
    }
    if config.fuel == Some(0) {
        return bad("fuel must be more than zero when set".into());
    }
    Ok(())
}

/// Whole ticks covering `deadline`, plus one: the ticker may advance the epoch right after a
/// deadline is armed, so N ticks guarantee only N − 1 ticks of running time.
fn ticks(deadline: Duration, tick: Duration) -> u64 {
    let whole = deadline.as_nanos().div_ceil(tick.as_nanos().max(1));
    u64::try_from(whole).unwrap_or(u64::MAX / 2).max(1) + 1
}

fn spawn_ticker(engine: &Engine, tick: Duration) -> Result<(), PolicyError> {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("policy-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(tick);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .map(drop)
        .map_err(|e| PolicyError::Engine(format!("cannot start the epoch ticker thread: {e}")))
}
