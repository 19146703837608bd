//! Fleet-wide token buckets: one script takes from every bucket a request draws on, all or
//! nothing, on Redis's clock, and grants this replica slices that pay the next admissions
//! without a round trip ([`Cluster::take`], [`crate::slices`]); what the reply settles later
//! (input corrected to the server's count, output as it streams, refunds) is batched per
//! bucket and sent every few milliseconds ([`Cluster::charge`]). Buckets are hashes
//! `bucket:ID` of (level, time); one left alone expires once it would be full again.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ringmaster_tenancy::{Drawn, SharedBuckets};
use tracing::debug;

use crate::slices::slice_of;
use crate::{Cluster, ClusterError};

/// One bucket a request draws on: tenancy's, which this crate keeps for the fleet.
pub use ringmaster_tenancy::Draw;

/// What [`Cluster::take`] decided.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Taken {
    /// Every bucket paid.
    Paid,
    /// The bucket at this index of the draws cannot pay yet; it can in `wait`.
    Short {
        /// Its index.
        index: usize,
        /// Until it can.
        wait: Duration,
    },
}

// Levels refill continuously at size per minute; a take needs min(amount, size) (a request
// larger than the bucket waits for a full one); a debt check needs a level of at least zero.
// All are checked before any is taken. Each bucket then also grants up to its draw's slice
// (`crate::slices`) of what is left, taken from the level. A bucket's key expires once it
// would be full again. Numbers travel as strings (a Lua number returned is truncated).
const TAKE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local levels = {}
for i, key in ipairs(KEYS) do
  local size = tonumber(ARGV[4 * i - 3])
  local amount = tonumber(ARGV[4 * i - 2])
  local rate = size / 60000
  local s = redis.call('HMGET', key, 'l', 't')
  local level = tonumber(s[1]) or size
  local at = tonumber(s[2]) or now
  level = math.min(size, level + math.max(0, now - at) * rate)
  levels[i] = level
  local needed = 0
  if ARGV[4 * i - 1] ~= 'd' then needed = math.min(amount, size) end
  if level < needed then
    return {tostring(i), tostring(math.ceil((needed - level) / rate))}
  end
end
local out = {'0', '0'}
for i, key in ipairs(KEYS) do
  local size = tonumber(ARGV[4 * i - 3])
  local rate = size / 60000
  local level = levels[i]
  if ARGV[4 * i - 1] ~= 'd' then level = level - tonumber(ARGV[4 * i - 2]) end
  local grant = math.min(tonumber(ARGV[4 * i]), math.max(0, level))
  level = level - grant
  out[i + 2] = tostring(grant)
  redis.call('HSET', key, 'l', tostring(level), 't', now)
  redis.call('PEXPIRE', key, math.max(1000, math.ceil((size - level) / rate) + 1000))
end
return out
";

// Charges (positive) and refunds (negative), refunds capped at the bucket's size.
const CHARGE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for i, key in ipairs(KEYS) do
  local size = tonumber(ARGV[2 * i - 1])
  local delta = tonumber(ARGV[2 * i])
  local rate = size / 60000
  local s = redis.call('HMGET', key, 'l', 't')
  local level = tonumber(s[1]) or size
  local at = tonumber(s[2]) or now
  level = math.min(size, math.min(size, level + math.max(0, now - at) * rate) - delta)
  redis.call('HSET', key, 'l', tostring(level), 't', now)
  redis.call('PEXPIRE', key, math.max(1000, math.ceil((size - level) / rate) + 1000))
end
return 0
";

static TAKE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(TAKE));
static CHARGE_SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(CHARGE));

/// Charges waiting to be sent: bucket id → (size, delta, since when it waits).
#[derive(Debug, Default)]
pub(crate) struct Pending {
    charges: Mutex<HashMap<String, (u32, f64, Instant)>>,
}

/// How often pending charges are sent.
pub const CHARGE_INTERVAL: Duration = Duration::from_millis(20);
/// Charges older than this are dropped when Redis stays away: a per-minute bucket has
/// refilled whatever they would have taken.
pub const CHARGE_KEPT: Duration = Duration::from_secs(60);

impl Cluster {
    fn bucket_key(&self, id: &str) -> String {
        self.key(&format!("bucket:{id}"))
    }

    /// Takes from every bucket of `draws` or from none: from the slices this replica holds
    /// when they cover every draw, else in one script within the request path's deadline,
    /// which also grants fresh slices ([`crate::slices`]).
    pub async fn take(&self, draws: &[Draw]) -> Result<Taken, ClusterError> {
        if draws.is_empty() {
            return Ok(Taken::Paid);
        }
        if self.slices.pay(
            draws
                .iter()
                .map(|d| (d.id.as_str(), d.amount, d.debt_check)),
        ) {
            self.slice_draws
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Ok(Taken::Paid);
        }
        let mut invocation = TAKE_SCRIPT.prepare_invoke();
        for draw in draws {
            invocation
                .key(self.bucket_key(&draw.id))
                .arg(draw.per_minute)
                .arg(draw.amount)
                .arg(if draw.debt_check { "d" } else { "t" })
                .arg(slice_of(draw.per_minute));
        }
        let mut conn = self.conn();
        let answer: Vec<String> = self
            .within(self.spec.deadline, invocation.invoke_async(&mut conn))
            .await?;
        let number = |i: usize| -> Result<f64, ClusterError> {
            answer
                .get(i)
                .and_then(|n| n.parse::<f64>().ok())
                .ok_or_else(|| ClusterError::Decode {
                    key: "bucket take".into(),
                    reason: format!("unexpected answer {answer:?}"),
                })
        };
        let index = number(0)? as u64;
        if index != 0 {
            return Ok(Taken::Short {
                index: usize::try_from(index - 1).unwrap_or(0),
                wait: Duration::from_millis(number(1)? as u64),
            });
        }
        for (i, draw) in draws.iter().enumerate() {
            self.slices
                .grant(&draw.id, draw.per_minute, number(i + 2).unwrap_or(0.0));
        }
        Ok(Taken::Paid)
    }

    /// Queues a charge (`delta` > 0) or refund (`delta` < 0) to bucket `id` of size
    /// `per_minute`; sent with the others within [`CHARGE_INTERVAL`].
    pub fn charge(&self, id: &str, per_minute: u32, delta: f64) {
        let delta = self.slices.settle(id, delta);
        if delta == 0.0 {
            return;
        }
        self.queue_charge(id, per_minute, delta);
    }

    /// Queues `delta` for the shared bucket, past the slices.
    fn queue_charge(&self, id: &str, per_minute: u32, delta: f64) {
        let mut pending = self
            .pending
            .charges
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = pending
            .entry(id.to_owned())
            .or_insert((per_minute, 0.0, Instant::now()));
        entry.0 = per_minute;
        entry.1 += delta;
    }

    /// Sends the pending charges every [`CHARGE_INTERVAL`] until `self` is dropped elsewhere.
    /// A batch Redis does not take is kept and sent again, up to [`CHARGE_KEPT`].
    pub async fn send_charges(self: Arc<Self>) {
        let weak = Arc::downgrade(&self);
        drop(self);
        let mut tick = tokio::time::interval(CHARGE_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(cluster) = weak.upgrade() else {
                return;
            };
            for (id, per_minute, left) in cluster.slices.expired(Instant::now()) {
                if left != 0.0 {
                    cluster.queue_charge(&id, per_minute, -left);
                }
            }
            let batch: Vec<_> = std::mem::take(
                &mut *cluster
                    .pending
                    .charges
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner),
            )
            .into_iter()
            .filter(|(_, (_, delta, _))| *delta != 0.0)
            .collect();
            if batch.is_empty() {
                continue;
            }
            if let Err(e) = cluster.send_batch(&batch).await {
                debug!(error = %e, charges = batch.len(), "cluster.charges_kept");
                let mut pending = cluster
                    .pending
                    .charges
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                for (id, (size, delta, since)) in batch {
                    if since.elapsed() > CHARGE_KEPT {
                        continue;
                    }
                    let entry = pending.entry(id).or_insert((size, 0.0, since));
                    entry.1 += delta;
                    entry.2 = entry.2.min(since);
                }
            }
        }
    }

    async fn send_batch(
        &self,
        batch: &[(String, (u32, f64, Instant))],
    ) -> Result<(), ClusterError> {
        let mut invocation = CHARGE_SCRIPT.prepare_invoke();
        for (id, (size, delta, _)) in batch {
            invocation.key(self.bucket_key(id)).arg(*size).arg(*delta);
        }
        let mut conn = self.conn();
        self.within(
            crate::CONTROL_DEADLINE,
            invocation.invoke_async::<()>(&mut conn),
        )
        .await
    }
}

/// Tenancy's shared buckets are the fleet's: a draw is [`Cluster::take`]; Redis not answering
/// within the deadline falls back to the replica's local buckets (counted).
impl SharedBuckets for Cluster {
    fn draw<'a>(
        &'a self,
        draws: &'a [Draw],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Drawn> + Send + 'a>> {
        Box::pin(async move {
            match self.take(draws).await {
                Ok(Taken::Paid) => Drawn::Paid,
                Ok(Taken::Short { index, wait }) => Drawn::Short { index, wait },
                Err(error) => {
                    self.note_local_draw();
                    debug!(%error, "cluster.buckets_local");
                    Drawn::Unavailable
                }
            }
        })
    }

    fn charge(&self, id: &str, per_minute: u32, delta: f64) {
        Cluster::charge(self, id, per_minute, delta);
    }

    fn is_up(&self) -> bool {
        Cluster::is_up(self)
    }

    fn live_replicas(&self) -> u32 {
        Cluster::live_replicas(self)
    }

    fn fail_open(&self) -> bool {
        self.spec().fail_open
    }
}
