//! Replica leases: each replica writes `replica:NAME` with a time to live and renews it three
//! times per lifetime, carrying the revision it has applied, what it sees of the servers'
//! health and its experiment statistics. A replica that dies stops renewing, its lease lapses,
//! and it drops out of [`Cluster::replicas`] (and of every total summed over them) within one
//! time to live.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::debug;

use crate::{CONTROL_DEADLINE, Cluster, ClusterError};

/// What a replica says of itself in its lease.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The replica's name.
    pub replica: String,
    /// The configuration revision it has applied.
    pub applied: u64,
    /// Unix milliseconds when it started.
    pub started_ms: u64,
    /// Its view of the servers (id → state), as the gateway writes it.
    #[serde(default)]
    pub servers: serde_json::Value,
    /// Its experiment statistics (variant → figures), as the gateway writes them.
    #[serde(default)]
    pub experiments: serde_json::Value,
}

/// A lease as read back, with its age.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LiveLease {
    /// The lease.
    #[serde(flatten)]
    pub lease: Lease,
    /// Milliseconds since it was last renewed.
    pub age_ms: u64,
}

/// What the gateway fills a lease with, each time it is renewed.
pub trait LeaseReport: Send + Sync {
    /// The servers' state (id → state) and the experiment statistics, as JSON.
    fn report(&self) -> (serde_json::Value, serde_json::Value);
}

impl Cluster {
    fn lease_key(&self, replica: &str) -> String {
        self.key(&format!("replica:{replica}"))
    }

    /// Writes this replica's lease now.
    pub async fn renew_lease(&self, lease: &Lease) -> Result<(), ClusterError> {
        let mut conn = self.conn();
        let key = self.lease_key(&lease.replica);
        let body = serde_json::to_string(lease).expect("a lease serializes");
        let ttl = u64::try_from(self.spec.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        self.within(
            CONTROL_DEADLINE,
            redis::cmd("SET")
                .arg(&key)
                .arg(body)
                .arg("PX")
                .arg(ttl)
                .query_async::<()>(&mut conn),
        )
        .await
    }

    /// Removes this replica's lease (a clean shutdown leaves at once).
    pub async fn drop_lease(&self) -> Result<(), ClusterError> {
        let mut conn = self.conn();
        let key = self.lease_key(self.replica());
        self.within(
            CONTROL_DEADLINE,
            redis::cmd("DEL").arg(&key).query_async::<()>(&mut conn),
        )
        .await
    }

    /// Every live lease, by replica name.
    pub async fn replicas(&self) -> Result<Vec<LiveLease>, ClusterError> {
        let mut conn = self.conn();
        let pattern = self.lease_key("*");
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = self
                .within(
                    CONTROL_DEADLINE,
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(500)
                        .query_async(&mut conn),
                )
                .await?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("GET").arg(key).cmd("PTTL").arg(key);
        }
        let replies: Vec<(Option<String>, i64)> = self
            .within(CONTROL_DEADLINE, pipe.query_async(&mut conn))
            .await?;
        let ttl = u64::try_from(self.spec.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        let mut live = Vec::new();
        for (key, (body, pttl)) in keys.iter().zip(replies) {
            // Gone between SCAN and GET: lapsed.
            let Some(body) = body else { continue };
            let lease: Lease = serde_json::from_str(&body).map_err(|e| ClusterError::Decode {
                key: key.clone(),
                reason: e.to_string(),
            })?;
            let left = u64::try_from(pttl).unwrap_or(0);
            live.push(LiveLease {
                lease,
                age_ms: ttl.saturating_sub(left),
            });
        }
        Ok(live)
    }

    /// Renews this replica's lease every third of its time to live, with the applied revision
    /// and `report`'s contents, and keeps the count of live replicas up to date, until `self`
    /// is dropped elsewhere.
    pub async fn keep_lease(self: Arc<Self>, report: Arc<dyn LeaseReport>) {
        let weak = Arc::downgrade(&self);
        let started_ms = unix_ms();
        let every = self.spec.lease_ttl / 3;
        drop(self);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let Some(nudged) = weak.upgrade() else {
                return;
            };
            tokio::select! {
                _ = tick.tick() => {}
                () = nudged.lease_nudge.notified() => {}
            }
            drop(nudged);
            let Some(cluster) = weak.upgrade() else {
                return;
            };
            let (servers, experiments) = report.report();
            let lease = Lease {
                replica: cluster.replica().to_owned(),
                applied: cluster.applied().get(),
                started_ms,
                servers,
                experiments,
            };
            if let Err(e) = cluster.renew_lease(&lease).await {
                debug!(error = %e, "cluster.lease_not_renewed");
                continue;
            }
            match cluster.replicas().await {
                Ok(live) => cluster.set_live_replicas(&live),
                Err(e) => debug!(error = %e, "cluster.replicas_unreadable"),
            }
        }
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
