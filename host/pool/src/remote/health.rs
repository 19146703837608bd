//! Why a request could not start on a server ([`RemoteError`], and whether another server can
//! help), and a server's passive health ([`Health`]): consecutive failures eject it for a
//! backoff that doubles with each ejection, and the last failure is kept, so that an operator
//! reads why a server takes no requests ([`HealthReport`], in `/admin/servers`) instead of
//! only the client's 503.

use std::sync::Mutex;
use std::sync::PoisonError;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::UpstreamSettings;

/// Why a request could not be started on a server.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The server could not be reached, reset the connection or did not answer in time.
    #[error("the server at {url} cannot be reached: {why}")]
    Unreachable {
        /// The server.
        url: String,
        /// What failed.
        why: String,
        /// Whether it was a timeout (for the attempt metric).
        timeout: bool,
    },
    /// The server refused the request as invalid (400: the client's to fix).
    #[error("{message}")]
    Refused {
        /// The server's message.
        message: String,
    },
    /// The server answered with an error status.
    #[error("the server at {url} answered {status}: {message}")]
    Failed {
        /// The server.
        url: String,
        /// Its status.
        status: u16,
        /// Its message.
        message: String,
    },
    /// The reply broke or reported an error before its first event.
    #[error("the server at {url} broke off the reply before it began: {why}")]
    Broken {
        /// The server.
        url: String,
        /// What happened.
        why: String,
    },
}

impl RemoteError {
    /// Whether another server (or a later try) can help: everything but a refusal and a
    /// 4xx other than 408 and 429.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Unreachable { .. } | Self::Broken { .. } => true,
            Self::Refused { .. } => false,
            Self::Failed { status, .. } => *status >= 500 || matches!(status, 408 | 429),
        }
    }

    /// A stable name for the attempt metric.
    pub fn outcome(&self) -> &'static str {
        match self {
            Self::Unreachable { timeout: true, .. } => "timeout",
            Self::Unreachable { .. } => "unreachable",
            Self::Refused { .. } => "refused",
            Self::Failed { status: 429, .. } => "status-429",
            Self::Failed { status: 503, .. } => "status-503",
            Self::Failed { status, .. } if *status >= 500 => "status-5xx",
            Self::Failed { .. } => "status-4xx",
            Self::Broken { .. } => "broken",
        }
    }
}

/// The last failure talking to a server (a request's or a load poll's).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LastError {
    /// What failed, in words (a failed TLS handshake says why first).
    pub message: String,
    /// When, milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
}

/// A remote server's health as an operator reads it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HealthReport {
    /// Whether its last load poll reached it.
    pub reachable: bool,
    /// Whether consecutive failures have it ejected now.
    pub ejected: bool,
    /// Why requests do not go there now (`None`: they do): the load poll's failure, or the
    /// last failure of those that ejected it.
    pub reason: Option<String>,
    /// The last failure, kept after the server recovers.
    pub last_error: Option<LastError>,
}

/// Passive outlier detection: consecutive failures eject a server for a while.
#[derive(Debug, Default)]
pub struct Health {
    consecutive_failures: AtomicU32,
    /// Ejections since the last success, which set the next backoff.
    ejections_in_a_row: AtomicU32,
    ejected_until: Mutex<Option<Instant>>,
    ejections_total: AtomicU64,
    last_error: Mutex<Option<LastError>>,
}

impl Health {
    /// Keeps `message` as the server's last failure.
    pub fn note_error(&self, message: String) {
        let at_unix_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(LastError {
            message,
            at_unix_ms,
        });
    }

    /// The server's last failure, if any.
    pub fn last_error(&self) -> Option<LastError> {
        self.last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Counts a request that reached the server and began.
    pub fn success(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.ejections_in_a_row.store(0, Ordering::Relaxed);
    }

    /// Counts a failed request; ejects the server when it is the `settings`' n-th in a row.
    /// Returns the ejection's length when this failure ejected it.
    pub fn failure(&self, settings: &UpstreamSettings) -> Option<Duration> {
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if settings.eject_after_failures == 0 || failures < settings.eject_after_failures {
            return None;
        }
        self.consecutive_failures.store(0, Ordering::Relaxed);
        let n = self.ejections_in_a_row.fetch_add(1, Ordering::Relaxed);
        let backoff = settings
            .eject_base
            .saturating_mul(1u32 << n.min(16))
            .min(settings.eject_max);
        *self
            .ejected_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now() + backoff);
        self.ejections_total.fetch_add(1, Ordering::Relaxed);
        Some(backoff)
    }

    /// Whether the server is ejected now.
    pub fn is_ejected(&self) -> bool {
        let mut until = self
            .ejected_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match *until {
            Some(t) if Instant::now() < t => true,
            Some(_) => {
                *until = None;
                false
            }
            None => false,
        }
    }

    /// Ejections so far.
    pub fn ejections_total(&self) -> u64 {
        self.ejections_total.load(Ordering::Relaxed)
    }
}
