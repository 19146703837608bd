//! The engine: one wasmtime `Engine` and `Linker` for every policy, the load pipeline
//! (check the bytes → compile, cached → check the world → pre-instantiate → instantiate once),
//! and [`Core`], the per-version state every policy handle wraps: its `InstancePre`, its pool
//! of warm instances and its fault counters.
//!
//! A call ([`Core::call`]) takes a warm instance (or makes one from the `InstancePre`), arms
//! its deadline or fuel, runs the guest with the call's context visible to the imports, and
//! puts the instance back. An instance whose call failed is dropped, never reused: a trap
//! leaves a component instance unusable ("cannot enter component instance").

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use wasmtime::component::{Component, ComponentExportIndex, Instance, InstancePre, Linker};
use wasmtime::{
    Cache, CacheConfig, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, Trap,
    UpdateDeadline,
};

use crate::error::{FaultCounters, PolicyError, PolicyFault};
use crate::host::{self, CallCx, CounterSet, PolicyShared, StoreData};
use crate::state::{StateMode, StateStore};
use crate::types::PolicyInfo;
use crate::{EngineConfig, INSTANTIATE_FUEL_FACTOR, TABLE_ELEMENTS_LIMIT};

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

pub(crate) struct EngineInner {
    engine: Engine,
    linker: Linker<StoreData>,
    pub(crate) config: EngineConfig,
    call_ticks: u64,
    instantiate_ticks: u64,
    cache: Option<Cache>,
    counters: Mutex<BTreeMap<String, Arc<CounterSet>>>,
    /// Each policy's `state` store, by world and name: what the next version loaded under
    /// that name starts with ([`StateMode::Keep`]).
    states: Mutex<BTreeMap<(&'static str, String), Arc<StateStore>>>,
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

        let cache = match &config.cache_dir {
            None => None,
            Some(dir) => {
                let dir = std::path::absolute(dir).map_err(|e| {
                    PolicyError::Engine(format!("policy cache directory {}: {e}", dir.display()))
                })?;
                let mut cache_config = CacheConfig::new();
                cache_config.with_directory(&dir);
                let cache = Cache::new(cache_config).map_err(|e| {
                    PolicyError::Engine(format!(
                        "cannot use {} as the policy cache directory: {e:#}",
                        dir.display()
                    ))
                })?;
                wt.cache(Some(cache.clone()));
                Some(cache)
            }
        };

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
                Some(index) if version == Version::V0_2 => {
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

impl EngineInner {
    fn new_state(&self) -> StateStore {
        StateStore::new(self.config.state_max_entries, self.config.state_max_bytes)
    }

    fn explain(&self, fault: &PolicyFault, instantiating: bool) -> String {
        let config = &self.config;
        match fault {
            PolicyFault::Deadline => match (config.fuel, instantiating) {
                (Some(fuel), false) => {
                    format!("it ran out of its {fuel} units of fuel (an endless loop?)")
                }
                (Some(fuel), true) => format!(
                    "its start-up ran out of its {} units of fuel",
                    fuel.saturating_mul(INSTANTIATE_FUEL_FACTOR)
                ),
                (None, false) => format!(
                    "it ran past its {:?} deadline (an endless loop?)",
                    config.call_deadline
                ),
                (None, true) => format!(
                    "its start-up ran past the {:?} instantiate deadline",
                    config.instantiate_deadline
                ),
            },
            PolicyFault::OutOfMemory => format!(
                "it needed more than its memory cap of {} bytes",
                config.memory_limit_bytes
            ),
            PolicyFault::Trap(trap) => {
                format!("it trapped ({trap}; a panic or an uncaught exception?)")
            }
            PolicyFault::InvalidAnswer(answer) => answer.clone(),
            PolicyFault::Instantiate(why) => why.clone(),
        }
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

/// Refuses bytes that are not a component before handing them to the compiler, with a
/// message that says what they are instead.
fn check_header<W: World>(name: &str, bytes: &[u8]) -> Result<(), PolicyError> {
    const MAGIC: &[u8] = b"\0asm";
    const MODULE: [u8; 4] = [1, 0, 0, 0];
    const COMPONENT: [u8; 4] = [0x0d, 0, 1, 0];
    if bytes.len() < 8 || !bytes.starts_with(MAGIC) {
        return Err(PolicyError::NotAComponent(format!(
            "`{name}` is not WebAssembly ({} bytes that do not start with `\\0asm`): load a \
             component built for the {} world of ringmaster:policy@0.1.0",
            bytes.len(),
            W::NAME
        )));
    }
    match <[u8; 4]>::try_from(&bytes[4..8]) {
        Ok(MODULE) => Err(PolicyError::NotAComponent(format!(
            "`{name}` is a core WebAssembly module, not a component: turn it into one with \
             `wasm-tools component new` (or build it with the Ringmaster SDK) for the {} world",
            W::NAME
        ))),
        Ok(COMPONENT) => Ok(()),
        _ => Err(PolicyError::NotAComponent(format!(
            "`{name}` has an unknown WebAssembly version or layer ({:02x?}): expected a \
             component (0d 00 01 00)",
            &bytes[4..8]
        ))),
    }
}

/// Which `ringmaster:policy` contract a component was built against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// `0.1.0`: the request is a record, copied whole into every call.
    V0_1,
    /// `0.2.0`: the request is a resource with getters; `state` and `observe` exist.
    V0_2,
}

impl Version {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::V0_1 => "0.1.0",
            Self::V0_2 => "0.2.0",
        }
    }
}

/// The contract version a component's `ringmaster:policy` imports name. A component that
/// imports none of them (a safety filter that logs nothing) has the same calls in both
/// versions and is called as 0.1.0.
fn contract_version(
    name: &str,
    component: &Component,
    engine: &Engine,
) -> Result<Version, PolicyError> {
    let ty = component.component_type();
    let mut seen: Vec<&str> = Vec::new();
    for (import, _) in ty.imports(engine) {
        if let Some(rest) = import.strip_prefix("ringmaster:policy/") {
            let version = rest.split_once('@').map_or("", |(_, v)| v);
            if !seen.contains(&version) {
                seen.push(version);
            }
        }
    }
    match seen.as_slice() {
        [] | ["0.1.0"] => Ok(Version::V0_1),
        ["0.2.0"] => Ok(Version::V0_2),
        [one] => Err(PolicyError::WrongWorld(format!(
            "`{name}` was built against ringmaster:policy@{one}, which this gateway does not \
             know (it loads 0.2.0 and 0.1.0)",
            one = if one.is_empty() { "(no version)" } else { one }
        ))),
        many => Err(PolicyError::WrongWorld(format!(
            "`{name}` imports more than one version of ringmaster:policy ({}): build it against one",
            many.join(", ")
        ))),
    }
}

/// Checks the component's exports and imports against world `W` by name, so a mismatch gets
/// a message naming what is missing or extra (the linker then checks the types), and says
/// which contract version it targets.
fn check_world<W: World>(
    name: &str,
    component: &Component,
    engine: &Engine,
) -> Result<Version, PolicyError> {
    let ty = component.component_type();
    let exports: Vec<&str> = ty.exports(engine).map(|(n, _)| n).collect();
    let missing: Vec<&str> = W::EXPORTS
        .iter()
        .copied()
        .filter(|e| !exports.contains(e))
        .collect();
    if !missing.is_empty() {
        let guess = if exports.contains(&"route") {
            " (it looks like a router policy)"
        } else if exports.contains(&"admit") {
            " (it looks like an admission policy)"
        } else if exports.contains(&"check-input") {
            " (it looks like a safety-filter policy)"
        } else {
            ""
        };
        return Err(PolicyError::WrongWorld(format!(
            "`{name}` does not target the {} world: it does not export {}; it exports {}{guess}",
            W::NAME,
            quoted(&missing),
            if exports.is_empty() {
                "nothing".to_owned()
            } else {
                quoted(&exports)
            },
        )));
    }
    for (import, item) in ty.imports(engine) {
        if matches!(
            item.ty,
            wasmtime::component::types::ComponentItem::Type(_)
                | wasmtime::component::types::ComponentItem::Resource(_)
        ) {
            // A type the world `use`s at its top level (0.2.0's `request`) is imported as a
            // type: an alias of the interface's, which grants nothing.
            continue;
        }
        if import.starts_with("wasi:") {
            // WASI 0.2 is linked with nothing granted; an interface outside it (wasi:http...)
            // fails in the linker, which names it.
            continue;
        }
        let unversioned = import.split('@').next().unwrap_or(import);
        if !W::IMPORTS.contains(&unversioned) && unversioned != "ringmaster:policy/types" {
            return Err(PolicyError::WrongWorld(format!(
                "`{name}` imports `{import}`, which the host does not grant to a {} policy \
                 (it may import {} and WASI 0.2, which grants no files, network or environment)",
                W::NAME,
                quoted(W::IMPORTS),
            )));
        }
    }
    contract_version(name, component, engine)
}

fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the engine needs to know about a world to load and call its policies.
pub(crate) trait World: Sized + 'static {
    /// The world's name in `policy.wit`.
    const NAME: &'static str;
    /// The functions it must export.
    const EXPORTS: &'static [&'static str];
    /// The functions it may also export (0.2.0 only: `observe` for a learning router).
    const OPTIONAL_EXPORTS: &'static [&'static str] = &[];
    /// The `ringmaster:policy` interfaces it may import (unversioned).
    const IMPORTS: &'static [&'static str];
    /// Its typed exports, looked up once per instance.
    type Exports: Copy + Send + Sync + 'static;
    /// Looks up and type-checks the exports of a fresh instance of contract `version`.
    /// `indices` follow `EXPORTS`, then the `OPTIONAL_EXPORTS` that are present (`optional`
    /// says which: one flag per optional export).
    fn exports(
        instance: &Instance,
        store: &mut Store<StoreData>,
        version: Version,
        indices: &[ComponentExportIndex],
        optional: &[bool],
    ) -> wasmtime::Result<Self::Exports>;
}

/// Which limit a store is armed with before guest code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Budget {
    /// An ordinary call: `call_deadline` or `fuel`.
    Call,
    /// A probe call while loading: `instantiate_deadline`, or an ordinary call's fuel.
    Probe,
    /// Instantiation: `instantiate_deadline`, or `fuel` × the instantiate factor.
    Instantiate,
}

impl Budget {
    fn call(counting: bool) -> Self {
        if counting { Self::Call } else { Self::Probe }
    }
}

/// One warm instance: its store and typed exports.
struct Warm<E> {
    store: Store<StoreData>,
    exports: E,
}

enum InstantiateError {
    /// Instantiation itself failed (as a fault: trap, deadline, memory, or other).
    Failed(PolicyFault),
    /// An export is missing or has the wrong type.
    Exports(wasmtime::Error),
}

/// One loaded policy version: what every handle of it shares.
pub(crate) struct Core<W: World> {
    pub(crate) info: PolicyInfo,
    pub(crate) engine: Arc<EngineInner>,
    shared: Arc<PolicyShared>,
    pre: InstancePre<StoreData>,
    /// The contract it was built against.
    pub(crate) version: Version,
    export_indices: Vec<ComponentExportIndex>,
    /// Which of `W::OPTIONAL_EXPORTS` it has.
    pub(crate) optional: Vec<bool>,
    warm: Mutex<Vec<Warm<W::Exports>>>,
    pub(crate) faults: FaultCounters,
    /// In fuel mode, the fuel the last successful call burned (`u64::MAX`: none yet).
    last_call_fuel: std::sync::atomic::AtomicU64,
}

impl<W: World> Core<W> {
    /// Runs one guest call on a warm instance with `cx` visible to the imports.
    ///
    /// An error from `call` is classified into a fault, counted, and the instance dropped.
    pub(crate) fn call<R>(
        &self,
        cx: CallCx<'_>,
        call: impl FnOnce(&mut Store<StoreData>, W::Exports) -> wasmtime::Result<R>,
    ) -> Result<R, PolicyFault> {
        let mut warm = match self.take() {
            Ok(warm) => warm,
            Err(fault) => return Err(self.fault(fault)),
        };
        // A probe call (not counting) runs while a new version loads, often on a busy
        // gateway, and is each instance's first call: copy-on-write memory is still being
        // paged in. It gets the instantiate deadline so a load under traffic is not refused
        // for a few milliseconds of scheduling; an endless loop is still caught.
        let cx_counting = cx.counting;
        self.arm(&mut warm.store, Budget::call(cx.counting));
        let exports = warm.exports;
        let store = &mut warm.store;
        match host::with_call(cx, || call(store, exports)) {
            Ok(value) => {
                // `get_fuel` only in fuel mode: elsewhere it returns an error, whose creation
                // costs microseconds when backtraces are on (`RUST_BACKTRACE=1`).
                if let Some(budget) = self.engine.config.fuel
                    && cx_counting
                    && let Ok(left) = warm.store.get_fuel()
                {
                    self.last_call_fuel.store(
                        budget.saturating_sub(left),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
                self.put(warm);
                Ok(value)
            }
            Err(error) => {
                let fault = classify(&error, warm.store.data());
                tracing::debug!(
                    target: "policy",
                    policy = self.info.name.as_str(),
                    kind = fault.kind(),
                    error = %format!("{error:#}"),
                    "policy.fault_detail"
                );
                drop(warm);
                Err(self.fault(fault))
            }
        }
    }

    /// Counts `fault` and hands it back.
    pub(crate) fn fault(&self, fault: PolicyFault) -> PolicyFault {
        self.faults.count(&fault);
        fault
    }

    fn take(&self) -> Result<Warm<W::Exports>, PolicyFault> {
        let pooled = self
            .warm
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match pooled {
            Some(warm) => Ok(warm),
            None => self.instantiate().map_err(|e| match e {
                InstantiateError::Failed(fault) => {
                    PolicyFault::Instantiate(self.engine.explain(&fault, true))
                }
                InstantiateError::Exports(e) => PolicyFault::Instantiate(format!("{e:#}")),
            }),
        }
    }

    fn put(&self, warm: Warm<W::Exports>) {
        let mut pool = self.warm.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < self.engine.config.warm_instances.max(1) {
            pool.push(warm);
        }
    }

    fn arm(&self, store: &mut Store<StoreData>, budget: Budget) {
        store.data_mut().limiter.denied = false;
        store.data_mut().prefix_matches_given = false;
        store.data_mut().deadline_extension = None;
        store.data_mut().call_ticks = match (self.engine.config.fuel, budget) {
            (Some(_), _) => None,
            (None, Budget::Call) => Some(self.engine.call_ticks),
            (None, _) => Some(self.engine.instantiate_ticks),
        };
        match self.engine.config.fuel {
            Some(fuel) => {
                // Fuel does not depend on load, so a probe call gets an ordinary call's fuel.
                let fuel = if budget == Budget::Instantiate {
                    fuel.saturating_mul(INSTANTIATE_FUEL_FACTOR)
                } else {
                    fuel
                };
                // Cannot fail: fuel is enabled whenever `config.fuel` is set.
                let _ = store.set_fuel(fuel);
            }
            None => store.set_epoch_deadline(if budget != Budget::Call {
                self.engine.instantiate_ticks
            } else {
                self.engine.call_ticks
            }),
        }
    }

    fn instantiate(&self) -> Result<Warm<W::Exports>, InstantiateError> {
        let engine = &self.engine;
        let mut store = Store::new(
            &engine.engine,
            StoreData::new(self.shared.clone(), engine.config.memory_limit_bytes),
        );
        store.limiter(|data| &mut data.limiter);
        if engine.config.fuel.is_none() {
            // Reaching the deadline interrupts the call, unless host work the deadline must
            // not count (`StoreData::prefix_matches`) granted one extension.
            store.epoch_deadline_callback(|mut cx| match cx.data_mut().deadline_extension.take() {
                Some(ticks) => Ok(UpdateDeadline::Continue(ticks)),
                None => Err(Trap::Interrupt.into()),
            });
        }
        self.arm(&mut store, Budget::Instantiate);
        let cx = CallCx {
            host: None,
            request: None,
            request_id: "",
            counting: true,
        };
        let instance = host::with_call(cx, || self.pre.instantiate(&mut store))
            .map_err(|e| InstantiateError::Failed(classify_instantiate(&e, store.data())))?;
        let exports = W::exports(
            &instance,
            &mut store,
            self.version,
            &self.export_indices,
            &self.optional,
        )
        .map_err(InstantiateError::Exports)?;
        Ok(Warm { store, exports })
    }

    pub(crate) fn faults(&self) -> crate::FaultCounts {
        self.faults.snapshot()
    }

    pub(crate) fn state_usage(&self) -> crate::StateUsage {
        self.shared.state.usage()
    }

    /// In fuel mode, the fuel (about one unit per Wasm instruction) the last successful
    /// ordinary call burned; `None` in epoch mode or before the first call.
    pub(crate) fn last_call_fuel(&self) -> Option<u64> {
        let fuel = self
            .last_call_fuel
            .load(std::sync::atomic::Ordering::Relaxed);
        (fuel != u64::MAX).then_some(fuel)
    }

    /// Instantiates the component afresh, outside the warm pool, and drops the instance: what
    /// a call pays when no warm instance is free (its start-up code included).
    pub(crate) fn time_instantiation(&self) -> Result<std::time::Duration, PolicyFault> {
        let started = std::time::Instant::now();
        let warm = self.instantiate().map_err(|e| match e {
            InstantiateError::Failed(fault) => fault,
            InstantiateError::Exports(e) => PolicyFault::Instantiate(format!("{e:#}")),
        })?;
        let elapsed = started.elapsed();
        drop(warm);
        Ok(elapsed)
    }

    /// Drops every warm instance (tests: force the next call to instantiate).
    #[cfg(test)]
    pub(crate) fn drain(&self) -> usize {
        let mut pool = self.warm.lock().unwrap_or_else(PoisonError::into_inner);
        let n = pool.len();
        pool.clear();
        n
    }
}

impl<W: World> fmt::Debug for Core<W> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(W::NAME)
            .field("info", &self.info)
            .field("faults", &self.faults.snapshot())
            .finish_non_exhaustive()
    }
}

/// A failed call, as a fault.
fn classify(error: &wasmtime::Error, data: &StoreData) -> PolicyFault {
    match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt | Trap::OutOfFuel) => PolicyFault::Deadline,
        _ if data.limiter.denied => PolicyFault::OutOfMemory,
        Some(trap) => {
            let text = trap.to_string();
            PolicyFault::Trap(text.strip_prefix("wasm trap: ").unwrap_or(&text).to_owned())
        }
        None => PolicyFault::Trap(error.to_string()),
    }
}

/// A failed instantiation, as a fault (a non-trap error keeps its whole chain: it is usually
/// a pooling-allocator limit and the chain says which).
fn classify_instantiate(error: &wasmtime::Error, data: &StoreData) -> PolicyFault {
    match error.downcast_ref::<Trap>() {
        Some(_) => classify(error, data),
        None if data.limiter.denied => PolicyFault::OutOfMemory,
        None => PolicyFault::Instantiate(format!("{error:#}")),
    }
}
