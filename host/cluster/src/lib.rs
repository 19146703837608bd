//! Ringmaster's replicas on Redis: what gateways running side by side share, and nothing of
//! what they do with it. It owns the Redis connection and every key under the cluster's
//! namespace; it must not know the gateway, the pool or a policy (the gateway's side reads
//! and applies what this crate carries, as plain JSON and numbers).
//!
//! - [`log`]: configuration as one revisioned log (a Redis Stream whose entry ids are the
//!   revisions), appended by a compare-and-set script so two admins cannot fork it, and
//!   followed by every replica in order;
//! - [`blobs`]: policy components by content hash (SHA-256), written once;
//! - [`lease`]: each replica's lease (a key with a time to live): its name, the revision it has
//!   applied, its view of the servers' health and its experiment statistics;
//! - [`buckets`]: fleet-wide token buckets, one atomic script per admission on Redis's clock
//!   (or none, when the slices this replica holds pay it: [`slices`]), settled after the
//!   reply in batches;
//! - [`load`]: each replica's in-flight counts and prefill backlog per server, fanned out on
//!   pub/sub (lossy by design: the next report replaces the last);
//! - [`responses`]: the Responses API's stored responses, with a time to live.
//!
//! Why Redis: one dependency does every job (a stream as a watchable log, scripts for atomic
//! compare-and-set and buckets, keys with a time to live for leases, pub/sub for load); etcd
//! watches better but cannot take a bucket per request; NATS has no atomic script.
//!
//! Every call has a deadline ([`ClusterSpec::deadline`] on the request path); a call that
//! fails or misses it marks the cluster down ([`Cluster::is_up`]) until one succeeds, and the
//! gateway falls back to what it holds locally.

#![deny(missing_docs)]

pub mod audit;
pub mod blobs;
pub mod buckets;
pub mod lease;
pub mod load;
pub mod log;
pub mod responses;
pub mod slices;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tracing::{info, warn};

/// How to join a cluster.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSpec {
    /// `redis://HOST:PORT/DB`, `rediss://HOST:PORT/DB` (TLS) or `redis+unix:///path/to/socket`.
    pub url: String,
    /// This replica's name in leases and logs (defaults to the gateway's host:port).
    pub replica: String,
    /// The prefix of every key, so that two fleets can share one Redis (`ringmaster`).
    pub namespace: String,
    /// How long the request path waits for Redis before it falls back to local buckets.
    pub deadline: Duration,
    /// When Redis is down: admit on local buckets (limit ÷ live replicas, the default), or
    /// refuse requests that draw on a bucket (`false`).
    pub fail_open: bool,
    /// How long a lease lives unless renewed; replicas renew it three times as often.
    pub lease_ttl: Duration,
    /// For a `rediss://` url: the CA file (`None`: the system's roots) and a client
    /// certificate with its key.
    pub tls: ClusterTls,
}

/// The TLS files of a `rediss://` Redis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterTls {
    /// The CA certificates (PEM) Redis's certificate must chain to.
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for `tls-auth-clients yes`.
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl ClusterSpec {
    /// A spec with the defaults: namespace `ringmaster`, a 5 ms deadline, fail open, 3 s leases.
    pub fn new(url: impl Into<String>, replica: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            replica: replica.into(),
            namespace: "ringmaster".into(),
            deadline: Duration::from_millis(5),
            fail_open: true,
            lease_ttl: Duration::from_secs(3),
            tls: ClusterTls::default(),
        }
    }
}

/// Why a cluster call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A TLS file could not be read.
    #[error("cluster {what} {path}: {source}")]
    TlsFile {
        /// `ca_file`, `client_cert` or `client_key`.
        what: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The URL is not one Redis understands.
    #[error("cluster url {url:?}: {source}")]
    Url {
        /// The URL given.
        url: String,
        /// Why it was refused.
        source: redis::RedisError,
    },
    /// Redis answered with an error, or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis did not answer within the deadline.
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    /// The log moved on since the change was validated (compare-and-set lost).
    #[error(
        "the configuration log is at revision {head}, not {expected}: another admin change landed first"
    )]
    Conflict {
        /// The revision the change was validated against.
        expected: u64,
        /// The log's head now.
        head: u64,
    },
    /// Something in Redis is not what this version wrote.
    #[error("unreadable cluster data at {key}: {reason}")]
    Decode {
        /// The key.
        key: String,
        /// What was wrong.
        reason: String,
    },
}

/// A gateway's connection to its cluster.
#[derive(Debug)]
pub struct Cluster {
    spec: ClusterSpec,
    client: redis::Client,
    conn: ConnectionManager,
    up: AtomicBool,
    load: load::FleetLoad,
    applied: log::Applied,
    pending: buckets::Pending,
    slices: slices::Slices,
    /// Admissions decided on local buckets because Redis did not answer in time.
    local_draws: std::sync::atomic::AtomicU64,
    /// Admissions paid from the slices this replica holds, without a round trip.
    slice_draws: std::sync::atomic::AtomicU64,
    /// Renews the lease at once (a revision was applied: `?wait=true` callers watch leases).
    pub(crate) lease_nudge: tokio::sync::Notify,
    /// The live replicas' names, as the last read of the leases found them.
    live: std::sync::Mutex<Vec<String>>,
}

/// The Redis client for `spec`: over TLS (rustls, the name checked against the certificate)
/// for a `rediss://` url, with its CA and client certificate when given.
fn open_client(spec: &ClusterSpec) -> Result<redis::Client, ClusterError> {
    let refused = |source| ClusterError::Url {
        url: spec.url.clone(),
        source,
    };
    if !spec.url.starts_with("rediss://") {
        return redis::Client::open(spec.url.as_str()).map_err(refused);
    }
    // The redis crate builds its TLS configuration on the process's default provider: ring,
    // as everywhere in Ringmaster (an error only says one is installed already).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let read = |what: &'static str, path: &std::path::Path| {
        std::fs::read(path).map_err(|source| ClusterError::TlsFile {
            what,
            path: path.to_owned(),
            source,
        })
    };
    let root_cert = spec
        .tls
        .ca_file
        .as_deref()
        .map(|path| read("ca_file", path))
        .transpose()?;
    let client_tls = match &spec.tls.client_cert {
        None => None,
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read("client_cert", cert)?,
            client_key: read("client_key", key)?,
        }),
    };
    redis::Client::build_with_tls(
        spec.url.as_str(),
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(refused)
}

impl Cluster {
    /// Connects (a bounded number of tries over about `connect_for`), so that a replica whose
    /// Redis is not there yet says so at start rather than serving alone.
    pub async fn connect(
        spec: ClusterSpec,
        connect_for: Duration,
    ) -> Result<Arc<Self>, ClusterError> {
        let client = open_client(&spec)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(2)))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(200));
        let started = tokio::time::Instant::now();
        let conn = loop {
            match ConnectionManager::new_with_config(client.clone(), config.clone()).await {
                Ok(conn) => break conn,
                Err(error) if started.elapsed() < connect_for => {
                    warn!(url = %spec.url, %error, "cluster.connect_retry");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => return Err(error.into()),
            }
        };
        info!(url = %spec.url, replica = %spec.replica, namespace = %spec.namespace, "cluster.connected");
        Ok(Arc::new(Self {
            load: load::FleetLoad::default(),
            applied: log::Applied::default(),
            pending: buckets::Pending::default(),
            slices: slices::Slices::default(),
            live: std::sync::Mutex::new(Vec::new()),
            lease_nudge: tokio::sync::Notify::new(),
            local_draws: std::sync::atomic::AtomicU64::new(0),
            slice_draws: std::sync::atomic::AtomicU64::new(0),
            spec,
            client,
            conn,
            up: AtomicBool::new(true),
        }))
    }

    /// How this replica joined.
    pub fn spec(&self) -> &ClusterSpec {
        &self.spec
    }

    /// This replica's name.
    pub fn replica(&self) -> &str {
        &self.spec.replica
    }

    /// Whether the last call to Redis succeeded.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Counts an admission decided on local buckets (Redis did not answer in time).
    pub fn note_local_draw(&self) {
        self.local_draws.fetch_add(1, Ordering::Relaxed);
    }

    /// Admissions decided on local buckets so far.
    pub fn local_draws(&self) -> u64 {
        self.local_draws.load(Ordering::Relaxed)
    }

    /// Admissions paid from this replica's slices of the shared buckets so far.
    pub fn slice_draws(&self) -> u64 {
        self.slice_draws.load(Ordering::Relaxed)
    }

    /// The other replicas' last-known load.
    pub fn fleet_load(&self) -> &load::FleetLoad {
        &self.load
    }

    /// How many replicas hold a lease (this one included; at least one), as last read.
    pub fn live_replicas(&self) -> u32 {
        let live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        u32::try_from(live.len()).unwrap_or(u32::MAX).max(1)
    }

    /// Whether this replica judges the fleet's experiments and rollouts: Redis answers, and
    /// its name sorts first among the live leases as the lease loop last read them (about
    /// once a second; a judge that dies is replaced once its lease lapses).
    pub fn judges(&self) -> bool {
        let live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.is_up() && live.iter().min().map(String::as_str) == Some(self.replica())
    }

    /// Records the live leases: the count, and the replicas whose load still counts.
    pub(crate) fn set_live_replicas(&self, leases: &[lease::LiveLease]) {
        let names: Vec<String> = leases.iter().map(|l| l.lease.replica.clone()).collect();
        self.load.retain(&names);
        *self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = names;
    }

    /// A key under the namespace.
    pub(crate) fn key(&self, rest: &str) -> String {
        format!("{}:{rest}", self.spec.namespace)
    }

    /// A connection for one call (the manager multiplexes and reconnects).
    pub(crate) fn conn(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// A dedicated connection, for blocking reads and pub/sub that must not hold up the
    /// shared one.
    pub(crate) async fn dedicated(
        &self,
    ) -> Result<redis::aio::MultiplexedConnection, ClusterError> {
        // Its reads block for up to a second: the default response timeout would cut them.
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(500)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        Ok(self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?)
    }

    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// Runs `call` within `deadline`, recording whether Redis answered.
    pub(crate) async fn within<T>(
        &self,
        deadline: Duration,
        call: impl std::future::Future<Output = Result<T, redis::RedisError>>,
    ) -> Result<T, ClusterError> {
        let outcome = match tokio::time::timeout(deadline, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(ClusterError::Redis(error)),
            Err(_) => Err(ClusterError::Timeout(deadline)),
        };
        self.mark(outcome.is_ok());
        outcome
    }

    /// Records whether Redis answered, logging each change of state once.
    pub(crate) fn mark(&self, answered: bool) {
        let was = self.up.swap(answered, Ordering::Relaxed);
        if was != answered {
            if answered {
                info!(replica = %self.spec.replica, "cluster.redis_back");
            } else {
                warn!(replica = %self.spec.replica, "cluster.redis_down: serving on the last revision with local limits");
            }
        }
    }
}

/// The deadline of calls off the request path (admin changes, leases, reads of the log).
pub const CONTROL_DEADLINE: Duration = Duration::from_secs(2);
