//! Ringmaster's policy engine: routing, admission and safety-filter decisions made by
//! sandboxed WebAssembly components that target the `ringmaster:policy@0.1.0` worlds
//! (`wit/policy.wit`).
//!
//! This crate owns the Wasm runtime and nothing else: one wasmtime [`Engine`](wasmtime::Engine)
//! (component model, pooling allocator, copy-on-write memory images, an optional on-disk cache
//! of compiled code), the host side of the policy interfaces (`ring`, `cluster`, `log`,
//! `metrics`, `config`) and a pool of warm instances per loaded policy. It knows nothing about
//! HTTP, the server pool or the ring's algorithm: the gateway answers a router's questions
//! through [`RouterHost`], and decides what a [`PolicyFault`] means for the request.
//!
//! # Using it
//!
//! ```no_run
//! # use std::collections::BTreeMap;
//! # use ringmaster_policy_engine::*;
//! # fn demo(host: &dyn RouterHost, request: &PolicyRequest) -> Result<(), PolicyError> {
//! let engine = PolicyEngine::new(EngineConfig::default())?;
//! let bytes = std::fs::read("policies/dist/consistent-hash.wasm").unwrap();
//! // Compile (cached) → check the world → pre-instantiate → instantiate → probe.
//! let router = engine.load_router("consistent-hash", &bytes, BTreeMap::new())?;
//! match router.route(host, request) {
//!     Ok(RouteDecision::Route(server)) => { /* send it there */ }
//!     Ok(RouteDecision::Reject(reason)) => { /* 529 with the reason */ }
//!     Err(fault) => { /* the native ring decides; the fault is already counted */ }
//! }
//! # Ok(()) }
//! ```
//!
//! Loading is slow (compiling takes tens of milliseconds for a Rust policy and seconds for
//! Python or JavaScript, less when the cache holds it): call the `load_*` methods off the
//! request path. Calls are fast: a call takes a warm instance from the policy's pool, runs it
//! under a deadline and a memory cap, and puts it back.
//!
//! # What can go wrong
//!
//! Loading fails with a [`PolicyError`] that says what to fix: bytes that are not a component,
//! a component for another world or importing something the host does not grant, a compile
//! error, a trap while instantiating, or a probe (a few synthetic calls) that faulted or
//! answered nonsense. A call never fails the request: a trap, an overrun of
//! [`EngineConfig::call_deadline`], memory beyond [`EngineConfig::memory_limit_bytes`] or an
//! invalid answer comes back as a [`PolicyFault`], is counted by kind ([`FaultCounts`]), and the
//! instance that faulted is dropped (a trap poisons a component instance); the next call gets a
//! fresh one from the policy's `InstancePre`.
//!
//! # The sandbox
//!
//! Policies get no files, no network and no environment. Components built by componentize-py
//! or componentize-js import all of WASI 0.2, so WASI is linked with a context that grants
//! nothing (stdin closed, stdout and stderr discarded, no preopens, no sockets, no variables);
//! clocks and randomness are the host's. Prompt text reaches only the safety filter.

#![deny(missing_docs)]

mod engine;
mod error;
mod host;
mod policy;
mod probe;
mod types;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::time::Duration;

pub use engine::{CacheStats, PolicyEngine};

/// The content hash a loaded version is known by ([`PolicyInfo::hash`]): hex xxh3-128 of the
/// component's bytes. Slots compare it before loading, so an unchanged reload is a no-op.
pub fn content_hash(bytes: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(bytes))
}
/// Ringmaster's cache folder for this user: `$RINGMASTER_CACHE_DIR`, else
/// `$XDG_CACHE_HOME/ringmaster`, else `~/.cache/ringmaster`; `None` with none of them set.
pub fn user_cache_root() -> Option<PathBuf> {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    var("RINGMASTER_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| var("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("ringmaster")))
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".cache/ringmaster")))
}

/// Where the gateway caches compiled components unless configured otherwise:
/// [`user_cache_root`]`/policies`.
pub fn default_cache_dir() -> Option<PathBuf> {
    user_cache_root().map(|root| root.join("policies"))
}

pub use error::{FaultCounts, PolicyError, PolicyFault};
pub use policy::{AdmissionPolicy, RouterPolicy, SafetyPolicy};
pub use types::{
    AdmissionLoad, AdmissionVerdict, PolicyInfo, PolicyRequest, RouteDecision, RouterHost,
    SafetyVerdict, ServerView,
};

/// How long one policy call may run before it is interrupted (a [`PolicyFault::Deadline`]).
///
/// A routing decision costs microseconds; 5 ms leaves room for Python and JavaScript policies
/// (tens to hundreds of microseconds a call) while bounding what a runaway policy adds to a
/// request. With epoch interruption the call is stopped between this and one
/// [`DEFAULT_EPOCH_TICK`] later.
pub const DEFAULT_CALL_DEADLINE: Duration = Duration::from_millis(5);

/// How often the engine's ticker thread advances the epoch that deadlines are counted in.
///
/// A deadline is rounded up to whole ticks, plus one so that it is never cut short; a finer
/// tick makes deadlines more precise and costs a thread wake-up per tick.
pub const DEFAULT_EPOCH_TICK: Duration = Duration::from_millis(1);

/// The most linear memory one policy instance may hold, in bytes, summed over its memories.
///
/// A Rust or C policy uses tens of KiB, Python about 4 MiB; growth past the cap fails, and a
/// call that then traps counts as [`PolicyFault::OutOfMemory`].
pub const DEFAULT_MEMORY_LIMIT: usize = 32 * 1024 * 1024;

/// How many component instances the pooling allocator has room for, over all policies.
///
/// Each warm instance holds a slot; each slot reserves (but does not commit) a few GiB of
/// address space per linear memory, so this also bounds the engine's address-space footprint.
pub const DEFAULT_MAX_INSTANCES: u32 = 256;

/// How many idle instances a policy keeps warm for the next calls.
///
/// Calls running at once each need an instance; an instance that finds the pool full when it
/// is returned is dropped. It should be at least the number of threads that make decisions.
pub const DEFAULT_WARM_INSTANCES: usize = 16;

/// How long instantiating a policy (running its start-up code) may take.
///
/// Python and JavaScript components initialise their interpreter here (about 1 ms); a start
/// function that runs longer than this fails the load (or, later, the call that needed a fresh
/// instance).
pub const DEFAULT_INSTANTIATE_DEADLINE: Duration = Duration::from_millis(100);

/// In fuel mode, how many times a call's fuel instantiation may burn.
pub const INSTANTIATE_FUEL_FACTOR: u64 = 20;

/// The most table elements one policy instance may have in one table (Python needs ~5.7 k,
/// JavaScript ~7.7 k).
pub const TABLE_ELEMENTS_LIMIT: usize = 20_000;

/// How the engine runs policies. Every budget has a named default; override the fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineConfig {
    /// The per-call deadline ([`DEFAULT_CALL_DEADLINE`]). Ignored when `fuel` is set.
    pub call_deadline: Duration,
    /// The epoch tick deadlines are counted in ([`DEFAULT_EPOCH_TICK`]).
    pub epoch_tick: Duration,
    /// The per-instance memory cap ([`DEFAULT_MEMORY_LIMIT`]).
    pub memory_limit_bytes: usize,
    /// When set, each call gets this much fuel instead of a wall-clock deadline: a budget in
    /// Wasm instructions (roughly) that makes overruns deterministic, for offline tests and
    /// reports. It costs more per call than epoch interruption.
    pub fuel: Option<u64>,
    /// Where compiled components are cached, keyed by their bytes and the engine's settings
    /// (`None`: no cache). Relative paths are taken from the current directory.
    pub cache_dir: Option<PathBuf>,
    /// The pooling allocator's capacity in component instances ([`DEFAULT_MAX_INSTANCES`]).
    pub max_instances: u32,
    /// Idle instances kept per policy ([`DEFAULT_WARM_INSTANCES`]).
    pub warm_instances: usize,
    /// The deadline for instantiating a policy and for each probe call while it loads
    /// ([`DEFAULT_INSTANTIATE_DEADLINE`]).
    pub instantiate_deadline: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            call_deadline: DEFAULT_CALL_DEADLINE,
            epoch_tick: DEFAULT_EPOCH_TICK,
            memory_limit_bytes: DEFAULT_MEMORY_LIMIT,
            fuel: None,
            cache_dir: None,
            max_instances: DEFAULT_MAX_INSTANCES,
            warm_instances: DEFAULT_WARM_INSTANCES,
            instantiate_deadline: DEFAULT_INSTANTIATE_DEADLINE,
        }
    }
}
