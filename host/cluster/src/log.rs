//! The configuration log: every admin change as one revision of a Redis Stream whose entry
//! ids are the revisions (`N-0`), beside a head counter. A change is appended by a script that
//! compares the head with the revision the change was validated against ([`Cluster::append`]),
//! so two admins on two replicas cannot fork the log: the one that loses re-validates on the
//! new head. Each replica applies revisions strictly in order ([`Cluster::follow`]) and
//! publishes the revision it has applied ([`Cluster::applied`]).
//!
//! The log holds changes, not state: every replica must start from the same configuration
//! file, and Redis must keep its data across restarts (`appendonly yes`), or the log is lost
//! with it (detected: a head below a replica's applied revision is logged as an error, and the
//! replica keeps its configuration and follows the new log from its head).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use serde::Serialize;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::{CONTROL_DEADLINE, Cluster, ClusterError};

/// One revision of the log.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Entry {
    /// Its revision (1, 2, …).
    pub revision: u64,
    /// The change, as the admin side wrote it.
    pub change: serde_json::Value,
    /// The replica that appended it.
    pub by: String,
}

/// Applies one revision to a replica (the gateway's side). An `Err` is logged and the revision
/// still counts as applied: a change this replica cannot carry out (a component that does not
/// compile here) must not stop it from following the rest.
pub trait Apply: Send + Sync {
    /// Applies `entry`.
    fn apply<'a>(
        &'a self,
        entry: &'a Entry,
    ) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send + 'a>>;
}

const APPEND: &str = r"
local head = tonumber(redis.call('GET', KEYS[1]) or '0')
if head ~= tonumber(ARGV[1]) then return {0, head} end
local n = head + 1
redis.call('XADD', KEYS[2], n .. '-0', 'change', ARGV[2], 'by', ARGV[3])
redis.call('SET', KEYS[1], n)
return {1, n}
";

static APPEND_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(APPEND));

/// How many entries one read fetches.
const PAGE: usize = 256;

/// The revision state a replica keeps: what it has applied, and its watchers.
#[derive(Debug)]
pub struct Applied {
    tx: watch::Sender<u64>,
}

impl Default for Applied {
    fn default() -> Self {
        Self {
            tx: watch::Sender::new(0),
        }
    }
}

impl Applied {
    /// The revision applied last.
    pub fn get(&self) -> u64 {
        *self.tx.borrow()
    }

    fn set(&self, revision: u64) {
        self.tx.send_replace(revision);
    }

    /// Waits until revision `revision` is applied, or `timeout` passes (then `false`).
    pub async fn wait_for(&self, revision: u64, timeout: Duration) -> bool {
        let mut rx = self.tx.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|applied| *applied >= revision))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}

impl Cluster {
    fn head_key(&self) -> String {
        self.key("config:head")
    }

    fn log_key(&self) -> String {
        self.key("config:log")
    }

    /// The revision this replica has applied.
    pub fn applied(&self) -> &Applied {
        &self.applied
    }

    /// The log's head revision (0: empty).
    pub async fn head(&self) -> Result<u64, ClusterError> {
        let mut conn = self.conn();
        let key = self.head_key();
        let head: Option<u64> = self
            .within(
                CONTROL_DEADLINE,
                redis::cmd("GET").arg(&key).query_async(&mut conn),
            )
            .await?;
        Ok(head.unwrap_or(0))
    }

    /// Appends `change` as revision `expected + 1`, if the head is still `expected`.
    pub async fn append(
        &self,
        expected: u64,
        change: &serde_json::Value,
    ) -> Result<u64, ClusterError> {
        let mut conn = self.conn();
        let mut invocation = APPEND_SCRIPT.prepare_invoke();
        invocation
            .key(self.head_key())
            .key(self.log_key())
            .arg(expected)
            .arg(change.to_string())
            .arg(self.replica());
        let (appended, revision): (u64, u64) = self
            .within(CONTROL_DEADLINE, invocation.invoke_async(&mut conn))
            .await?;
        if appended == 1 {
            info!(revision, by = self.replica(), "cluster.appended");
            Ok(revision)
        } else {
            Err(ClusterError::Conflict {
                expected,
                head: revision,
            })
        }
    }

    /// The entries after `revision` (at most one page).
    pub async fn entries_after(&self, revision: u64) -> Result<Vec<Entry>, ClusterError> {
        let mut conn = self.conn();
        let key = self.log_key();
        let reply: Value = self
            .within(
                CONTROL_DEADLINE,
                redis::cmd("XRANGE")
                    .arg(&key)
                    .arg(format!("({revision}-0"))
                    .arg("+")
                    .arg("COUNT")
                    .arg(PAGE)
                    .query_async(&mut conn),
            )
            .await?;
        parse_entries(&key, &reply)
    }

    /// Applies every entry after the applied revision until the head, in order. Returns the
    /// revision applied.
    pub async fn catch_up(&self, apply: &dyn Apply) -> Result<u64, ClusterError> {
        loop {
            let from = self.applied.get();
            let entries = self.entries_after(from).await?;
            if entries.is_empty() {
                self.check_head(from).await?;
                return Ok(from);
            }
            for entry in &entries {
                self.apply_one(apply, entry).await;
            }
        }
    }

    async fn apply_one(&self, apply: &dyn Apply, entry: &Entry) {
        let expected = self.applied.get() + 1;
        if entry.revision != expected {
            warn!(
                revision = entry.revision,
                expected, "cluster.log_gap: applying the next revision there is"
            );
        }
        match apply.apply(entry).await {
            Ok(()) => debug!(revision = entry.revision, by = %entry.by, "cluster.applied"),
            Err(reason) => {
                error!(revision = entry.revision, by = %entry.by, %reason, "cluster.apply_failed")
            }
        }
        self.applied.set(entry.revision);
        self.lease_nudge.notify_one();
    }

    /// A head below the applied revision means the log was lost (Redis restarted without its
    /// data): keep the configuration, follow the new log from its head.
    async fn check_head(&self, applied: u64) -> Result<(), ClusterError> {
        let head = self.head().await?;
        if head < applied {
            error!(
                head,
                applied,
                "cluster.log_lost: Redis holds an older log than this replica applied (run Redis with appendonly yes); keeping the current configuration and following from the head"
            );
            self.applied.set(head);
        }
        Ok(())
    }

    /// Follows the log until `self` is dropped elsewhere: blocks on the stream for new
    /// entries and applies them in order; on a Redis failure, keeps serving on the applied
    /// revision, and catches up when Redis answers again.
    pub async fn follow(self: Arc<Self>, apply: Arc<dyn Apply>) {
        let weak = Arc::downgrade(&self);
        drop(self);
        let mut dedicated = None;
        loop {
            let Some(cluster) = weak.upgrade() else {
                return;
            };
            if dedicated.is_none() {
                match cluster.dedicated().await {
                    Ok(conn) => {
                        // Anything appended while the connection was down.
                        if let Err(e) = cluster.catch_up(apply.as_ref()).await {
                            warn!(error = %e, "cluster.catch_up_failed");
                        }
                        dedicated = Some(conn);
                    }
                    Err(e) => {
                        cluster.mark(false);
                        debug!(error = %e, "cluster.follow_reconnect");
                        drop(cluster);
                        tokio::time::sleep(Duration::from_millis(250)).await;
                        continue;
                    }
                }
            }
            let conn = dedicated.as_mut().expect("connected above");
            let key = cluster.log_key();
            let from = cluster.applied.get();
            let read = tokio::time::timeout(
                Duration::from_secs(3),
                redis::cmd("XREAD")
                    .arg("BLOCK")
                    .arg(1000)
                    .arg("COUNT")
                    .arg(PAGE)
                    .arg("STREAMS")
                    .arg(&key)
                    .arg(format!("{from}-0"))
                    .query_async::<Value>(conn),
            )
            .await;
            match read {
                Ok(Ok(Value::Nil)) => {
                    cluster.mark(true);
                    if let Err(e) = cluster.check_head(from).await {
                        debug!(error = %e, "cluster.head_unreadable");
                    }
                }
                Ok(Ok(reply)) => {
                    cluster.mark(true);
                    match parse_xread(&key, &reply) {
                        Ok(entries) => {
                            for entry in &entries {
                                cluster.apply_one(apply.as_ref(), entry).await;
                            }
                        }
                        Err(e) => {
                            error!(error = %e, "cluster.log_unreadable");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
                Ok(Err(e)) => {
                    cluster.mark(false);
                    warn!(error = %e, "cluster.follow_failed");
                    dedicated = None;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(_) => {
                    cluster.mark(false);
                    dedicated = None;
                }
            }
        }
    }
}

fn decode(key: &str, reason: impl Into<String>) -> ClusterError {
    ClusterError::Decode {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// XREAD's reply: `[[stream, entries]]`.
fn parse_xread(key: &str, reply: &Value) -> Result<Vec<Entry>, ClusterError> {
    let Value::Array(streams) = reply else {
        return Err(decode(key, "XREAD reply is not an array"));
    };
    let mut out = Vec::new();
    for stream in streams {
        match stream {
            Value::Array(pair) if pair.len() == 2 => out.extend(parse_entries(key, &pair[1])?),
            _ => return Err(decode(key, "XREAD stream is not [name, entries]")),
        }
    }
    Ok(out)
}

/// XRANGE's reply: `[[id, [field, value, …]], …]`.
fn parse_entries(key: &str, reply: &Value) -> Result<Vec<Entry>, ClusterError> {
    let Value::Array(items) = reply else {
        return Err(decode(key, "entries are not an array"));
    };
    items
        .iter()
        .map(|item| {
            let Value::Array(pair) = item else {
                return Err(decode(key, "entry is not [id, fields]"));
            };
            let [id, Value::Array(fields)] = pair.as_slice() else {
                return Err(decode(key, "entry is not [id, fields]"));
            };
            let id = text(id).ok_or_else(|| decode(key, "entry id is not text"))?;
            let revision = id
                .split_once('-')
                .and_then(|(ms, _)| ms.parse().ok())
                .ok_or_else(|| decode(key, format!("entry id {id:?} is not a revision")))?;
            let mut change = None;
            let mut by = String::new();
            for field in fields.chunks(2) {
                let [name, value] = field else { continue };
                match text(name).as_deref() {
                    Some("change") => {
                        let raw = text(value).unwrap_or_default();
                        change = Some(serde_json::from_str(&raw).map_err(|e| {
                            decode(key, format!("revision {revision}: change is not JSON: {e}"))
                        })?);
                    }
                    Some("by") => by = text(value).unwrap_or_default(),
                    _ => {}
                }
            }
            Ok(Entry {
                revision,
                change: change
                    .ok_or_else(|| decode(key, format!("revision {revision} has no change")))?,
                by,
            })
        })
        .collect()
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn reads_entries_and_refuses_what_it_cannot_read() {
        let reply = Value::Array(vec![Value::Array(vec![
            bulk("7-0"),
            Value::Array(vec![
                bulk("change"),
                bulk(r#"{"op":"remove_server","id":"a"}"#),
                bulk("by"),
                bulk("gw-1"),
            ]),
        ])]);
        let entries = parse_entries("k", &reply).unwrap();
        assert_eq!(entries[0].revision, 7);
        assert_eq!(entries[0].by, "gw-1");
        assert_eq!(entries[0].change["id"], "a");
        let bad = Value::Array(vec![Value::Array(vec![
            bulk("x-0"),
            Value::Array(vec![bulk("change"), bulk("{}")]),
        ])]);
        assert!(parse_entries("k", &bad).is_err());
        let not_json = Value::Array(vec![Value::Array(vec![
            bulk("1-0"),
            Value::Array(vec![bulk("change"), bulk("{")]),
        ])]);
        assert!(
            parse_entries("k", &not_json)
                .unwrap_err()
                .to_string()
                .contains("not JSON")
        );
    }
}
