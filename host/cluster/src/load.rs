//! Load seen by every replica: each replica publishes, per server, the requests it has in
//! flight there and the prefill work it has queued ahead of them, at the next [`LOAD_TICK`]
//! after any change (and every [`LOAD_INTERVAL`] regardless); every replica keeps the
//! others' last reports ([`FleetLoad`]) and hands the sums to the gateway. Pub/sub is lossy
//! on purpose: a lost report is replaced by the next, and a replica whose reports stop (or
//! whose lease lapses) drops out of the sums after [`LOAD_STALE`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use tracing::{debug, warn};

use crate::Cluster;

/// How often a replica publishes its load when nothing moves (so that a report lost on
/// pub/sub is soon replaced).
pub const LOAD_INTERVAL: Duration = Duration::from_millis(100);
/// How often a replica looks at its load: a change is published at the next tick, so the
/// others see it within about this long (changes within one tick go out as one report).
pub const LOAD_TICK: Duration = Duration::from_millis(10);
/// A report older than this no longer counts.
pub const LOAD_STALE: Duration = Duration::from_secs(3);

/// One server's load from one replica: (requests in flight, prefill tokens queued).
pub type ServerLoad = (u64, u64);

/// One replica's report.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct Report {
    replica: String,
    servers: BTreeMap<String, ServerLoad>,
}

/// Where the local load is read from, and where the fleet's sums go (the gateway's side).
pub trait LoadSide: Send + Sync {
    /// This replica's load per server now.
    fn local(&self) -> BTreeMap<String, ServerLoad>;
    /// The other replicas' load per server (servers absent: none).
    fn remote(&self, totals: &HashMap<String, ServerLoad>);
}

/// A replica's last report: when it came, and its load per server.
type Received = (Instant, BTreeMap<String, ServerLoad>);

/// The other replicas' last reports.
#[derive(Debug, Default)]
pub struct FleetLoad {
    reports: Mutex<HashMap<String, Received>>,
}

impl FleetLoad {
    fn record(&self, report: Report) {
        self.reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(report.replica, (Instant::now(), report.servers));
    }

    /// Forgets replicas that are not live any more.
    pub(crate) fn retain(&self, live: &[String]) {
        self.reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|replica, _| live.iter().any(|l| l == replica));
    }

    /// The sums over the other replicas' fresh reports, per server.
    pub fn totals(&self) -> HashMap<String, ServerLoad> {
        let mut reports = self.reports.lock().unwrap_or_else(PoisonError::into_inner);
        reports.retain(|_, (at, _)| at.elapsed() < LOAD_STALE);
        let mut totals: HashMap<String, ServerLoad> = HashMap::new();
        for (_, servers) in reports.values() {
            for (server, (in_flight, prefill)) in servers {
                let total = totals.entry(server.clone()).or_default();
                total.0 += in_flight;
                total.1 += prefill;
            }
        }
        totals
    }

    /// How many other replicas reported recently.
    pub fn reporting(&self) -> usize {
        self.reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter(|(at, _)| at.elapsed() < LOAD_STALE)
            .count()
    }
}

impl Cluster {
    fn load_channel(&self) -> String {
        self.key("load")
    }

    /// Publishes this replica's load on changes and at an interval, and hands the others'
    /// sums to `side` as they arrive, until `self` is dropped elsewhere.
    pub async fn share_load(self: Arc<Self>, side: Arc<dyn LoadSide>) {
        tokio::spawn(self.clone().publish_load(side.clone()));
        let weak = Arc::downgrade(&self);
        drop(self);
        loop {
            let Some(cluster) = weak.upgrade() else {
                return;
            };
            let subscribed = async {
                let mut pubsub = cluster.client().get_async_pubsub().await?;
                pubsub.subscribe(cluster.load_channel()).await?;
                Ok::<_, redis::RedisError>(pubsub)
            };
            let pubsub = match tokio::time::timeout(Duration::from_secs(2), subscribed).await {
                Ok(Ok(pubsub)) => pubsub,
                Ok(Err(error)) => {
                    debug!(%error, "cluster.load_subscribe_failed");
                    drop(cluster);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
                Err(_) => {
                    debug!("cluster.load_subscribe_timed_out");
                    drop(cluster);
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    continue;
                }
            };
            let me = cluster.replica().to_owned();
            drop(cluster);
            let mut messages = pubsub.into_on_message();
            let mut sweep = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    message = messages.next() => {
                        let Some(message) = message else { break };
                        let Some(cluster) = weak.upgrade() else { return };
                        let payload: Vec<u8> = message.get_payload_bytes().to_vec();
                        match serde_json::from_slice::<Report>(&payload) {
                            Ok(report) if report.replica == me => {}
                            Ok(report) => {
                                cluster.load.record(report);
                                side.remote(&cluster.load.totals());
                            }
                            Err(e) => warn!(error = %e, "cluster.load_unreadable"),
                        }
                    }
                    _ = sweep.tick() => {
                        let Some(cluster) = weak.upgrade() else { return };
                        side.remote(&cluster.load.totals());
                    }
                }
            }
            // The subscription ended (Redis went away): the others' load is unknown now.
            if let Some(cluster) = weak.upgrade() {
                cluster.load.retain(&[]);
            }
            side.remote(&HashMap::new());
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn publish_load(self: Arc<Self>, side: Arc<dyn LoadSide>) {
        let weak = Arc::downgrade(&self);
        drop(self);
        let mut tick = tokio::time::interval(LOAD_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = BTreeMap::new();
        let mut last_at = Instant::now() - LOAD_INTERVAL;
        loop {
            tick.tick().await;
            let Some(cluster) = weak.upgrade() else {
                return;
            };
            let now = side.local();
            if last_at.elapsed() < LOAD_INTERVAL && !changed(&last, &now) {
                continue;
            }
            let report = Report {
                replica: cluster.replica().to_owned(),
                servers: now.clone(),
            };
            let mut conn = cluster.conn();
            let body = serde_json::to_vec(&report).expect("a report serializes");
            let published = cluster
                .within(
                    crate::CONTROL_DEADLINE,
                    redis::cmd("PUBLISH")
                        .arg(cluster.load_channel())
                        .arg(body)
                        .query_async::<i64>(&mut conn),
                )
                .await;
            if published.is_ok() {
                last = now;
                last_at = Instant::now();
            }
        }
    }
}

/// Whether any server's load changed (or a server left) since the last report. Every change
/// counts: a bounded-load cap is a handful of requests, and a stale count of one or two is
/// what sends a conversation's next turn off its warm server.
fn changed(last: &BTreeMap<String, ServerLoad>, now: &BTreeMap<String, ServerLoad>) -> bool {
    last != now
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_fresh_reports_and_forgets_the_dead() {
        let load = FleetLoad::default();
        let report = |replica: &str, a: u64| Report {
            replica: replica.into(),
            servers: BTreeMap::from([("a".to_owned(), (a, 10 * a))]),
        };
        load.record(report("r1", 3));
        load.record(report("r2", 4));
        assert_eq!(load.totals()["a"], (7, 70));
        load.record(report("r1", 1));
        assert_eq!(load.totals()["a"], (5, 50));
        load.retain(&["r2".to_owned()]);
        assert_eq!(load.totals()["a"], (4, 40));
        assert_eq!(load.reporting(), 1);
    }

    #[test]
    fn any_change_is_published_at_the_next_tick() {
        let at = |n, tokens| BTreeMap::from([("a".to_owned(), (n, tokens))]);
        assert!(!changed(&at(2, 100), &at(2, 100)));
        assert!(changed(&at(2, 100), &at(3, 100)));
        assert!(changed(&at(2, 100), &at(2, 0)), "a prefill began");
        assert!(changed(&at(2, 100), &BTreeMap::new()), "a server left");
    }
}
