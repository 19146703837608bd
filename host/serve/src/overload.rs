//! The overload guard: past a bound on the requests inside the gateway or on its resident
//! memory, new requests are shed at the door (529 `overloaded_error` on Messages, 503 on the
//! OpenAI doors, both with `retry-after`) instead of the gateway growing until the kernel
//! kills it, which would lose every request in flight at once.
//!
//! A request counts as pending from its head's arrival until its response has gone out in
//! full ([`Pending`] dropped with the response body). Memory is the process's resident set,
//! sampled every [`MEMORY_SAMPLE_INTERVAL`] by [`watch_memory`] (a read of
//! `/proc/self/status`), so the check on the request path is two atomic loads. Health,
//! metrics, the admin API and the status page are never shed: an operator must be able to
//! see and act on an overloaded gateway. Envoy's overload manager is the model (its
//! `stop_accepting_requests` action at a heap bound).
//!
//! This module decides nothing about routing and holds no request data.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use ringmaster_api::{ApiError, ErrorKind};

/// How often the resident memory is read.
pub const MEMORY_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);
/// What a shed request is told to wait.
pub const SHED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a request was shed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ShedLabels {
    /// `pending` (requests inside the gateway) or `memory` (resident memory).
    pub reason: &'static str,
}

/// The guard's metrics.
#[derive(Clone, Debug, Default)]
pub struct OverloadMetrics {
    /// Requests shed, by reason.
    pub shed: Family<ShedLabels, Counter>,
    /// Requests inside the gateway now.
    pub pending: Gauge,
    /// The resident memory last sampled, bytes.
    pub resident_bytes: Gauge,
}

/// The bounds and what they are measured against.
#[derive(Debug)]
pub struct OverloadGuard {
    pending: AtomicUsize,
    max_pending: Option<usize>,
    resident: AtomicU64,
    max_resident: Option<u64>,
    metrics: OverloadMetrics,
}

impl OverloadGuard {
    /// Sheds past `max_pending` requests inside the gateway or `max_resident` bytes.
    pub fn new(
        max_pending: Option<usize>,
        max_resident: Option<u64>,
        metrics: OverloadMetrics,
    ) -> Self {
        let guard = Self {
            pending: AtomicUsize::new(0),
            max_pending,
            resident: AtomicU64::new(0),
            max_resident,
            metrics,
        };
        guard.sample_memory();
        guard
    }

    /// The bounds: (pending requests, resident bytes).
    pub fn bounds(&self) -> (Option<usize>, Option<u64>) {
        (self.max_pending, self.max_resident)
    }

    /// Requests inside the gateway now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Lets a request in (pending until the returned guard drops), or sheds it.
    pub fn admit(self: &Arc<Self>) -> Result<Pending, ApiError> {
        if let Some(max) = self.max_resident {
            let resident = self.resident.load(Ordering::Relaxed);
            if resident > max {
                return Err(self.shed(
                    "memory",
                    format!(
                        "the gateway is over its memory bound ({} MiB resident, bound {} MiB); retry shortly",
                        resident >> 20,
                        max >> 20
                    ),
                ));
            }
        }
        let before = self.pending.fetch_add(1, Ordering::AcqRel);
        if self.max_pending.is_some_and(|max| before >= max) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(self.shed(
                "pending",
                format!("the gateway holds {before} requests, its bound; retry shortly"),
            ));
        }
        self.metrics.pending.inc();
        Ok(Pending(self.clone()))
    }

    fn shed(&self, reason: &'static str, message: String) -> ApiError {
        self.metrics
            .shed
            .get_or_create(&ShedLabels { reason })
            .inc();
        tracing::debug!(reason, "request.shed");
        ApiError::new(ErrorKind::Overloaded, message).with_retry_after(SHED_RETRY_AFTER)
    }

    /// Reads the resident memory now.
    pub fn sample_memory(&self) {
        if let Some(bytes) = resident_bytes() {
            self.resident.store(bytes, Ordering::Relaxed);
            self.metrics
                .resident_bytes
                .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        }
    }

    /// Sets the resident memory as if sampled (the tests' way to reach the bound).
    #[cfg(test)]
    fn set_resident(&self, bytes: u64) {
        self.resident.store(bytes, Ordering::Relaxed);
    }
}

/// A request inside the gateway; dropped when its response is done.
#[derive(Debug)]
pub struct Pending(Arc<OverloadGuard>);

impl Drop for Pending {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.pending.dec();
    }
}

/// Samples the resident memory until the guard is dropped.
pub async fn watch_memory(guard: std::sync::Weak<OverloadGuard>) {
    let mut tick = tokio::time::interval(MEMORY_SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(guard) = guard.upgrade() else {
            return;
        };
        guard.sample_memory();
    }
}

/// The process's resident set (`VmRSS` in `/proc/self/status`), bytes.
pub fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    kib_field(&status, "VmRSS:").map(|kib| kib * 1024)
}

/// The memory the process may use: its cgroup's `memory.max` when it sets one, else the
/// machine's `MemTotal`.
pub fn memory_available() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| kib_field(&m, "MemTotal:"))
        .map(|kib| kib * 1024);
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    match (cgroup, total) {
        (Some(c), Some(t)) => Some(c.min(t)),
        (c, t) => c.or(t),
    }
}

/// The default memory bound: [`ringmaster_config::limits::DEFAULT_MEMORY_SHARE`] of
/// [`memory_available`] (`None` where that cannot be read: no bound).
pub fn default_max_resident() -> Option<u64> {
    memory_available()
        .map(|bytes| (bytes as f64 * ringmaster_config::limits::DEFAULT_MEMORY_SHARE) as u64)
}

/// `NAME:   1234 kB` in a `/proc` file.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(name))?;
    line[name.len()..].split_whitespace().next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_requests_past_the_bound_are_shed_until_one_ends() {
        let guard = Arc::new(OverloadGuard::new(
            Some(2),
            None,
            OverloadMetrics::default(),
        ));
        let a = guard.admit().unwrap();
        let _b = guard.admit().unwrap();
        let shed = guard.admit().unwrap_err();
        assert_eq!(shed.kind(), ErrorKind::Overloaded);
        assert_eq!(shed.retry_after(), Some(SHED_RETRY_AFTER));
        assert_eq!(guard.pending(), 2);
        drop(a);
        assert!(guard.admit().is_ok());
        assert_eq!(
            guard
                .metrics
                .shed
                .get_or_create(&ShedLabels { reason: "pending" })
                .get(),
            1
        );
    }

    #[test]
    fn memory_past_the_bound_sheds_and_below_it_admits() {
        let guard = Arc::new(OverloadGuard::new(
            None,
            Some(100 << 20),
            OverloadMetrics::default(),
        ));
        guard.set_resident(200 << 20);
        let shed = guard.admit().unwrap_err();
        assert!(shed.message().contains("200 MiB"), "{}", shed.message());
        assert_eq!(guard.pending(), 0, "a shed request is not pending");
        guard.set_resident(50 << 20);
        assert!(guard.admit().is_ok());
    }

    #[test]
    fn proc_files_are_read() {
        assert!(resident_bytes().is_some_and(|b| b > 1 << 20));
        assert!(memory_available().is_some_and(|b| b > 64 << 20));
        assert_eq!(kib_field("VmRSS:\t  2048 kB\n", "VmRSS:"), Some(2048));
        assert_eq!(kib_field("nothing", "VmRSS:"), None);
    }
}
