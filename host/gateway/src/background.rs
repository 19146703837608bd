//! Every loop the gateway runs in the background, started here and nowhere else in this crate:
//! while it serves ([`Serving`]: the drained-server reaper, the policy-file watcher, the memory
//! watch, the TLS files' watch, stopped when serving stops), and for its life as a replica ([`join_fleet`]: the lease,
//! the load fan-out, the batched bucket charges). Each holds the gateway weakly and ends when
//! the gateway is dropped.
//!
//! Loops elsewhere, by design: the admin crate starts its judges (the rollout's, the
//! guardrails) and the configuration log's follower, which this crate does not know; the binary
//! reloads on SIGHUP (signals are the process's); the pool runs one follower per remote server
//! (its load poll, its KV events), owned by that server's client; the policy engine's epoch
//! ticker is its own thread.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::info;

use crate::fleet::{PoolLoad, ReplicaReport};
use crate::state::Gateway;

/// How often drained servers are looked at for removal.
const REAP_INTERVAL: Duration = Duration::from_millis(200);

/// The loops that run while the gateway serves; dropping this stops them.
pub(crate) struct Serving {
    tasks: Vec<JoinHandle<()>>,
}

impl Serving {
    /// Starts them (inside a Tokio runtime).
    pub(crate) fn start(gateway: &Arc<Gateway>) -> Self {
        let weak = Arc::downgrade(gateway);
        Self {
            tasks: vec![
                tokio::spawn(reap_drained(weak.clone())),
                tokio::spawn(crate::reload::watch_policy_files(weak)),
                tokio::spawn(ringmaster_serve::overload::watch_memory(Arc::downgrade(
                    &gateway.overload,
                ))),
            ]
            .into_iter()
            .chain(
                [&gateway.tls, &gateway.admin_tls]
                    .into_iter()
                    .flatten()
                    .map(|tls| tokio::spawn(ringmaster_tls::ServerTls::watch(Arc::downgrade(tls)))),
            )
            .collect(),
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Removes drained servers once their last request is over.
async fn reap_drained(gateway: Weak<Gateway>) {
    let mut tick = tokio::time::interval(REAP_INTERVAL);
    loop {
        tick.tick().await;
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        let reaped = gateway.pool.reap_drained();
        if reaped > 0 {
            info!(reaped, "pool.drained_servers_removed");
        }
    }
}

/// Starts the tasks that keep a replica in its fleet (none for a gateway alone): its lease,
/// the load fan-out and the batched bucket charges. (The configuration log is followed by
/// whoever applies it: the admin API.)
pub(crate) fn join_fleet(gateway: &Arc<Gateway>) {
    let Some(cluster) = gateway.cluster() else {
        return;
    };
    tokio::spawn(cluster.clone().keep_lease(Arc::new(ReplicaReport {
        gateway: Arc::downgrade(gateway),
    })));
    tokio::spawn(
        cluster
            .clone()
            .share_load(Arc::new(PoolLoad::new(gateway.pool.clone()))),
    );
    tokio::spawn(cluster.clone().send_charges());
}
