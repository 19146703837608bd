//! What a policy's store holds (WASI 0.2 with nothing granted, the memory limiter, the
//! version's shared name, config, counters and `state` store), the per-call context the
//! imports read, and the log and counter machinery behind them. The imports themselves are
//! generated and implemented in [`crate::imports`].
//!
//! # How a call reaches its `RouterHost`
//!
//! wasmtime's host functions and store data must be `'static`, but the gateway's
//! [`RouterHost`] borrows its pool snapshot for one request. The call's context ([`CallCx`]:
//! the host, the request and its id) is therefore put in a scoped thread-local for exactly the
//! duration of the guest call ([`with_call`]); an import reads it on the same thread, which is
//! the thread wasmtime runs synchronous host functions on. Setting it and reading it once
//! costs about 20 ns (`cost::call_context_cost`) and allocates nothing. An import called outside a call (from a start function) sees no
//! host and answers "nothing": `none`, an empty list.
//!
//! Nothing here may block or fail the call: log lines are rate-limited and dropped when over
//! the limit, invalid counter names are ignored (and logged once), and every import returns a
//! value rather than trapping unless the guest hands over an invalid string.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Instant;

use scoped_tls_hkt::scoped_thread_local;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxView, WasiView};

use crate::TABLE_ELEMENTS_LIMIT;
use crate::state::StateStore;
#[cfg(test)]
use crate::types::ServerView;
use crate::types::{Level, PolicyRequest, RouterHost};

/// Log lines a policy may write per second, over all its instances (the bucket refills at
/// this rate); lines over the limit are dropped and counted.
pub const LOG_LINES_PER_SECOND: f64 = 50.0;
/// Log lines a policy may write in a burst before the rate applies.
pub const LOG_BURST: f64 = 100.0;
/// Longest log line kept, in bytes; longer lines are cut.
pub const MAX_LOG_LINE_BYTES: usize = 1024;
/// Longest counter name accepted, in bytes (the WIT contract's limit).
pub const MAX_COUNTER_NAME_BYTES: usize = 64;
/// Distinct counter names one policy may create; adds to further names are ignored.
pub const MAX_COUNTERS_PER_POLICY: usize = 256;
/// The probe calls' scratch `state` store's caps (a handful of synthetic requests).
const PROBE_STATE_ENTRIES: u32 = 1024;
const PROBE_STATE_BYTES: u64 = 1 << 20;
/// Distinct invalid counter names reported per policy before the engine stops reporting.
const MAX_INVALID_NAMES_REPORTED: usize = 32;

/// The context of one call, visible to the imports while the guest runs.
#[derive(Clone, Copy)]
pub(crate) struct CallCx<'a> {
    /// Who answers `ring` and `cluster` (none for the safety filter).
    pub host: Option<&'a (dyn RouterHost + 'a)>,
    /// The request being decided, which 0.2.0's `request` getters read (none for the
    /// safety filter and `observe`).
    pub request: Option<&'a PolicyRequest>,
    /// The request's id, for log lines.
    pub request_id: &'a str,
    /// Whether `metrics.counter-add` counts (false while the engine probes a new policy, so
    /// synthetic calls do not show in its metrics).
    pub counting: bool,
}

scoped_thread_local!(static CALL: for<'a> CallCx<'a>);

/// Runs `f` (a guest call) with `cx` visible to the imports.
pub(crate) fn with_call<R>(cx: CallCx<'_>, f: impl FnOnce() -> R) -> R {
    CALL.set(cx, f)
}

pub(crate) fn current<R>(f: impl FnOnce(CallCx<'_>) -> R) -> Option<R> {
    if CALL.is_set() {
        Some(CALL.with(f))
    } else {
        None
    }
}

/// Asks the call's [`RouterHost`]; outside a call (or for a world without one), the default.
pub(crate) fn ask<R: Default>(f: impl FnOnce(&dyn RouterHost) -> R) -> R {
    current(|cx| cx.host.map(f)).flatten().unwrap_or_default()
}

/// Reads the call's request; `None` outside a call that has one.
pub(crate) fn current_request<R>(f: impl FnOnce(&PolicyRequest) -> R) -> Option<R> {
    current(|cx| cx.request.map(f)).flatten()
}

/// What every policy store holds.
pub(crate) struct StoreData {
    wasi: WasiCtx,
    table: ResourceTable,
    pub limiter: MemoryLimiter,
    pub policy: Arc<PolicyShared>,
    /// The epoch deadline the current call was armed with (`None` in fuel mode, where host
    /// work burns no fuel anyway).
    pub call_ticks: Option<u64>,
    /// Whether this call's one expensive host answer (`cluster.prefix-matches`) was given.
    pub prefix_matches_given: bool,
    /// Ticks the deadline is extended by once, when it is reached (set by the first
    /// `prefix-matches` answer of a call; see [`StoreData::prefix_matches`]).
    pub deadline_extension: Option<u64>,
}

impl StoreData {
    pub(crate) fn new(policy: Arc<PolicyShared>, memory_limit: usize) -> Self {
        // Nothing granted: no preopens, no environment, no arguments, stdin closed, stdout and
        // stderr discarded, every socket address denied and name lookup off.
        let wasi = WasiCtx::builder()
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(memory_limit),
            policy,
            call_ticks: None,
            prefix_matches_given: false,
            deadline_extension: None,
        }
    }

    /// `cluster.prefix-matches`, in either version.
    ///
    /// Matching the prompt against every server's cache is the host's work (it tokenizes the
    /// prompt per server scheme, milliseconds for a long one): it must not count against the
    /// policy's deadline. The first answer of a call grants one extension of a whole call
    /// deadline, taken when the deadline is reached (the store's epoch callback); later
    /// answers (the host memoizes) grant nothing, so a loop of calls cannot extend it.
    pub(crate) fn prefix_matches(&mut self) -> Vec<(String, u32)> {
        let matches = ask(|h| h.prefix_matches());
        if !std::mem::replace(&mut self.prefix_matches_given, true) {
            self.deadline_extension = self.call_ticks;
        }
        matches
    }
}

impl WasiView for StoreData {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// Caps an instance's linear memory (summed over its memories) and remembers a refusal, so a
/// trap that follows one is reported as [`PolicyFault::OutOfMemory`](crate::PolicyFault).
#[derive(Debug)]
pub(crate) struct MemoryLimiter {
    limit: usize,
    used: usize,
    last_growth: usize,
    /// Set when a growth was refused; cleared before each call.
    pub denied: bool,
}

impl MemoryLimiter {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            used: 0,
            last_growth: 0,
            denied: false,
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current);
        if self.used.saturating_add(growth) > self.limit {
            self.denied = true;
            return Ok(false);
        }
        self.used += growth;
        self.last_growth = growth;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.used -= self.last_growth;
        self.last_growth = 0;
        Ok(())
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= TABLE_ELEMENTS_LIMIT)
    }
}

/// What all instances of one policy version share: its name, config, counters and log budget.
#[derive(Debug)]
pub(crate) struct PolicyShared {
    pub name: String,
    pub config: BTreeMap<String, String>,
    pub counters: Arc<CounterSet>,
    /// The `state` store (shared with the versions before and after it, as its slot chose).
    pub state: Arc<StateStore>,
    /// The store the probe calls of a load see instead, so their synthetic requests leave
    /// nothing in the live one.
    probe_state: StateStore,
    log_budget: Mutex<TokenBucket>,
    logs_dropped: AtomicU64,
    invalid_names: Mutex<HashSet<String>>,
}

impl PolicyShared {
    pub(crate) fn new(
        name: &str,
        config: BTreeMap<String, String>,
        counters: Arc<CounterSet>,
        state: Arc<StateStore>,
    ) -> Self {
        Self {
            name: name.to_owned(),
            config,
            counters,
            state,
            probe_state: StateStore::new(PROBE_STATE_ENTRIES, PROBE_STATE_BYTES),
            log_budget: Mutex::new(TokenBucket::new(LOG_BURST, LOG_LINES_PER_SECOND)),
            logs_dropped: AtomicU64::new(0),
            invalid_names: Mutex::new(HashSet::new()),
        }
    }

    pub(crate) fn write_log(&self, level: Level, message: &str) {
        // `try_lock`: a contended bucket means another instance is logging right now; dropping
        // this line is better than waiting for it.
        let admitted = match self.log_budget.try_lock() {
            Ok(mut bucket) => bucket.take(Instant::now()),
            Err(_) => false,
        };
        if !admitted {
            self.logs_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let dropped = self.logs_dropped.swap(0, Ordering::Relaxed);
        let mut end = message.len().min(MAX_LOG_LINE_BYTES);
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        let message = &message[..end];
        let request_id = current(|cx| cx.request_id.to_owned()).unwrap_or_default();
        let policy = self.name.as_str();
        let line = escape_controls(message);
        match level {
            Level::Debug => {
                tracing::debug!(target: "policy", policy, request_id, dropped, "{line}")
            }
            Level::Info => tracing::info!(target: "policy", policy, request_id, dropped, "{line}"),
            Level::Warn => tracing::warn!(target: "policy", policy, request_id, dropped, "{line}"),
            Level::Error => {
                tracing::error!(target: "policy", policy, request_id, dropped, "{line}")
            }
        }
    }

    /// The `state` store the running call sees: the live one, or the probes' scratch store.
    pub(crate) fn state(&self) -> &StateStore {
        if current(|cx| cx.counting).unwrap_or(true) {
            &self.state
        } else {
            &self.probe_state
        }
    }

    /// Every configuration pair, sorted by key (`config.entries`).
    pub(crate) fn config_entries(&self) -> Vec<(String, String)> {
        self.config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub(crate) fn counter_add(&self, name: &str, value: u64) {
        if !current(|cx| cx.counting).unwrap_or(true) {
            return;
        }
        if !valid_counter_name(name) {
            self.report_invalid_name(
                name,
                "counter names are ASCII letters, digits and `_`, 1 to 64 bytes",
            );
            return;
        }
        if !self.counters.add(name, value) {
            self.report_invalid_name(name, "the policy already has the most counters allowed");
        }
    }

    fn report_invalid_name(&self, name: &str, why: &str) {
        let mut reported = self
            .invalid_names
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if reported.len() >= MAX_INVALID_NAMES_REPORTED || reported.contains(name) {
            return;
        }
        reported.insert(name.to_owned());
        let shown: String = name.chars().take(MAX_COUNTER_NAME_BYTES).collect();
        tracing::warn!(
            target: "policy",
            policy = self.name.as_str(),
            counter = %shown.escape_debug(),
            "policy.counter_ignored: {why}"
        );
    }
}

/// Escapes control characters (newlines above all), so a policy cannot forge log lines.
fn escape_controls(message: &str) -> Cow<'_, str> {
    if !message.chars().any(char::is_control) {
        return Cow::Borrowed(message);
    }
    let mut escaped = String::with_capacity(message.len() + 8);
    for c in message.chars() {
        if c.is_control() {
            escaped.extend(c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    Cow::Owned(escaped)
}

fn valid_counter_name(name: &str) -> bool {
    (1..=MAX_COUNTER_NAME_BYTES).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The counters one policy (by name, across its versions) has emitted.
#[derive(Debug, Default)]
pub(crate) struct CounterSet {
    counters: RwLock<HashMap<String, AtomicU64>>,
}

impl CounterSet {
    /// Adds to `name`; false when the set is full and `name` is new.
    fn add(&self, name: &str, value: u64) -> bool {
        {
            let counters = self.counters.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(c) = counters.get(name) {
                c.fetch_add(value, Ordering::Relaxed);
                return true;
            }
        }
        let mut counters = self
            .counters
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if counters.len() >= MAX_COUNTERS_PER_POLICY && !counters.contains_key(name) {
            return false;
        }
        counters
            .entry(name.to_owned())
            .or_default()
            .fetch_add(value, Ordering::Relaxed);
        true
    }

    pub(crate) fn snapshot(&self) -> Vec<(String, u64)> {
        let counters = self.counters.read().unwrap_or_else(PoisonError::into_inner);
        let mut out: Vec<_> = counters
            .iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
            .collect();
        out.sort();
        out
    }
}

/// A token bucket: `capacity` tokens, refilled at `rate` per second.
#[derive(Debug)]
struct TokenBucket {
    capacity: f64,
    rate: f64,
    tokens: f64,
    at: Instant,
}

impl TokenBucket {
    fn new(capacity: f64, rate: f64) -> Self {
        Self {
            capacity,
            rate,
            tokens: capacity,
            at: Instant::now(),
        }
    }

    fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_names() {
        assert!(valid_counter_name("routed_total"));
        assert!(valid_counter_name(&"a".repeat(64)));
        assert!(!valid_counter_name(&"a".repeat(65)));
        assert!(!valid_counter_name(""));
        assert!(!valid_counter_name("has-dash"));
        assert!(!valid_counter_name("ünï"));
    }

    #[test]
    fn log_lines_cannot_forge_lines() {
        assert_eq!(
            escape_controls("plain \"quoted\" line"),
            "plain \"quoted\" line"
        );
        assert_eq!(
            escape_controls("one\ntwo\r\x1b[31m"),
            "one\\ntwo\\r\\u{1b}[31m"
        );
    }

    #[test]
    fn counters_cap_distinct_names() {
        let set = CounterSet::default();
        for i in 0..MAX_COUNTERS_PER_POLICY {
            assert!(set.add(&format!("c{i}"), 1));
        }
        assert!(!set.add("one_too_many", 1));
        assert!(set.add("c0", 2));
        let snap = set.snapshot();
        assert_eq!(snap.len(), MAX_COUNTERS_PER_POLICY);
        assert!(snap.contains(&("c0".to_owned(), 3)));
    }

    #[test]
    fn token_bucket_refills() {
        let start = Instant::now();
        let mut bucket = TokenBucket::new(2.0, 10.0);
        bucket.at = start;
        assert!(bucket.take(start));
        assert!(bucket.take(start));
        assert!(!bucket.take(start));
        assert!(bucket.take(start + std::time::Duration::from_millis(100)));
    }

    #[test]
    fn limiter_counts_all_memories() {
        let mut l = MemoryLimiter::new(4 << 16);
        assert!(l.memory_growing(0, 2 << 16, None).unwrap());
        assert!(l.memory_growing(0, 2 << 16, None).unwrap());
        assert!(!l.denied);
        assert!(!l.memory_growing(2 << 16, 3 << 16, None).unwrap());
        assert!(l.denied);
    }
}

/// Measures the per-call cost of the scoped call context: setting it around a call and reading
/// it once per import. `cargo test --release -p ringmaster-policy-engine -- --ignored --nocapture
/// call_context_cost`.
#[cfg(test)]
mod cost {
    use super::*;

    struct Nobody;

    impl RouterHost for Nobody {
        fn ring_lookup(&self, key: u64) -> Option<String> {
            (key == u64::MAX).then(String::new)
        }
        fn ring_candidates(&self, _: u64, _: u32) -> Vec<String> {
            Vec::new()
        }
        fn ring_lookup_bounded(&self, _: u64) -> Option<String> {
            None
        }
        fn servers(&self) -> Vec<ServerView> {
            Vec::new()
        }
        fn server(&self, _: &str) -> Option<ServerView> {
            None
        }
        fn prefix_matches(&self) -> Vec<(String, u32)> {
            Vec::new()
        }
    }

    #[test]
    #[ignore = "a measurement, not a check"]
    fn call_context_cost() {
        const N: u64 = 10_000_000;
        let host = Nobody;
        let started = Instant::now();
        let mut hits = 0u64;
        for i in 0..N {
            let cx = CallCx {
                host: Some(&host),
                request: None,
                request_id: "req",
                counting: true,
            };
            hits += with_call(cx, || {
                u64::from(ask(|h| h.ring_lookup(std::hint::black_box(i))).is_some())
            });
        }
        let per = started.elapsed().as_nanos() as f64 / N as f64;
        eprintln!("scoped call context: set + one import read = {per:.1} ns ({hits})");
    }
}
