//! The gateway as one replica of a fleet ([`ringmaster_cluster`]): the adapters through which
//! the cluster reads and feeds this gateway's parts, and the tasks that keep them going. It
//! owns no shared state itself: the buckets' rules stay in tenancy, the counts in the pool,
//! the figures in the experiments; the configuration log is applied by the admin API's
//! applier, which owns the changes.
//!
//! - [`PoolLoad`]: this replica's per-server load out, the others' sums into the pool;
//! - [`ReplicaReport`]: what this replica's lease says of the servers and the experiments.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};

use ringmaster_cluster::Cluster;
use ringmaster_cluster::lease::LeaseReport;
use ringmaster_cluster::load::{LoadSide, ServerLoad};
use ringmaster_pool::Pool;
use serde_json::json;

use crate::state::Gateway;

/// Samples of each window a replica publishes per variant (its lease stays small).
pub const PUBLISHED_SAMPLES: usize = 2_000;

/// The pool's load, out to the other replicas and in from them.
#[derive(Debug)]
pub struct PoolLoad {
    pool: Arc<Pool>,
}

impl PoolLoad {
    /// The load of `pool`.
    pub fn new(pool: Arc<Pool>) -> Self {
        Self { pool }
    }
}

impl LoadSide for PoolLoad {
    fn local(&self) -> BTreeMap<String, ServerLoad> {
        let snapshot = self.pool.snapshot();
        snapshot
            .servers
            .iter()
            .chain(snapshot.draining.iter())
            .map(|s| (s.id().to_owned(), (s.in_flight(), s.prefill_backlog())))
            .collect()
    }

    fn remote(&self, totals: &HashMap<String, ServerLoad>) {
        let snapshot = self.pool.snapshot();
        for server in snapshot.servers.iter().chain(snapshot.draining.iter()) {
            let (in_flight, prefill) = totals.get(server.id()).copied().unwrap_or_default();
            server.set_remote_load(in_flight, prefill);
        }
    }
}

/// What this replica's lease carries: each server's state as it sees it, and each router
/// variant's figures.
#[derive(Debug)]
pub struct ReplicaReport {
    pub(crate) gateway: Weak<Gateway>,
}

impl LeaseReport for ReplicaReport {
    fn report(&self) -> (serde_json::Value, serde_json::Value) {
        let Some(gateway) = self.gateway.upgrade() else {
            return (json!({}), json!({}));
        };
        let snapshot = gateway.pool.snapshot();
        let servers: serde_json::Map<String, serde_json::Value> = snapshot
            .servers
            .iter()
            .chain(snapshot.draining.iter())
            .map(|s| {
                let state = if s.is_draining() {
                    "draining"
                } else if !s.is_routable() {
                    "unreachable"
                } else {
                    "healthy"
                };
                (
                    s.id().to_owned(),
                    json!({ "state": state, "in_flight": s.in_flight() }),
                )
            })
            .collect();
        let set = gateway.router.current();
        let experiments: serde_json::Map<String, serde_json::Value> = set
            .variants
            .iter()
            .map(|v| {
                (
                    v.name.to_string(),
                    serde_json::to_value(v.stats.figures(PUBLISHED_SAMPLES)).unwrap_or_default(),
                )
            })
            .collect();
        (servers.into(), experiments.into())
    }
}

/// The cluster's state on each scrape: whether Redis answers, the revisions, the replicas,
/// and how many admissions fell back to local buckets.
#[derive(Debug)]
pub(crate) struct ClusterCollector {
    pub(crate) cluster: Arc<Cluster>,
}

impl prometheus_client::collector::Collector for ClusterCollector {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::MetricType;
        use prometheus_client::metrics::counter::ConstCounter;
        use prometheus_client::metrics::gauge::ConstGauge;
        let cluster = &self.cluster;
        for (name, help, value) in [
            (
                "cluster_redis_up",
                "1 when the cluster's Redis answered the last call, else 0 (limits are local, the configuration stays at its revision)",
                i64::from(cluster.is_up()),
            ),
            (
                "cluster_applied_revision",
                "The configuration log's revision this replica has applied",
                i64::try_from(cluster.applied().get()).unwrap_or(i64::MAX),
            ),
            (
                "cluster_live_replicas",
                "Replicas holding a lease, as this one last read them",
                i64::from(cluster.live_replicas()),
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family)?;
        }
        let family = encoder.encode_descriptor(
            "cluster_local_limit_admissions",
            "Admissions decided on this replica's own buckets (limit / live replicas) because Redis did not answer within the deadline",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(cluster.local_draws()).encode(family)?;
        let family = encoder.encode_descriptor(
            "cluster_slice_admissions",
            "Admissions paid from this replica's slices of the shared buckets, without a Redis round trip",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(cluster.slice_draws()).encode(family)?;
        Ok(())
    }
}

impl Gateway {
    /// The cluster this gateway is a replica of, if any.
    pub fn cluster(&self) -> Option<&Arc<Cluster>> {
        self.cluster.as_ref()
    }
}
