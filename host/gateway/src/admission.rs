//! The admission gate: asks the admission policy whether a request runs now, waits in the
//! gateway's queue, or is refused, and carries the answer out.
//!
//! A waiting request holds a [`QueuedTicket`], its place in the fair order
//! ([`ringmaster_slots::queue`]: tier priority with aging, then the tenants' virtual token counters).
//! Only the head of the queue waits for a request anywhere to release its server slot (or a
//! short poll interval), then asks the policy again with the new load; the others sleep until
//! they become the head. A request leaves the queue when the policy accepts it, refuses it, or
//! its wait passes its deadline (the configured timeout, or the request's own
//! `x-ringmaster-queue-timeout-ms` when shorter: 529, with `retry-after`). A client that goes away while queued leaves the queue at once (its future
//! is dropped). A fault of the policy admits the request with its default priority: the gate
//! fails open, like the router slot falls back to the ring. With no admission policy every
//! request is admitted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use ringmaster_policy_engine::{AdmissionLoad, AdmissionPolicy, AdmissionVerdict, PolicyRequest};
use tracing::debug;

use crate::metrics::{AdmissionLabels, FaultLabels, Metrics};
use ringmaster_api::error::{ApiError, ErrorKind};
use ringmaster_pool::kv_view::ChatPrompt;
use ringmaster_pool::{Pool, PoolSnapshot};
use ringmaster_slots::queue::{FairQueue, Place};
use ringmaster_slots::router::PoolView;
use ringmaster_slots::routing::RoutingInput;
use ringmaster_slots::single::PolicySlot;

pub use ringmaster_config::policies::DEFAULT_QUEUE_CAPACITY;
pub use ringmaster_config::policies::DEFAULT_QUEUE_TIMEOUT;
/// A queued request re-asks the policy at least this often, even without a wake-up (a server
/// added to the pool frees capacity without releasing a slot).
const QUEUE_POLL: Duration = Duration::from_millis(100);

/// The admission slot and its queue.
#[derive(Debug)]
pub struct AdmissionGate {
    /// The slot holding the admission policy.
    pub slot: PolicySlot<AdmissionPolicy>,
    queue_capacity: u32,
    queue_timeout: Duration,
    queued: AtomicU32,
    /// Who runs next, and the tenants' served-token counters.
    pub order: FairQueue,
}

/// Who is asking to be admitted, for the queue's order and the autoscaling signal.
#[derive(Clone, Copy, Debug)]
pub struct Asking<'a> {
    /// The caller's tenant.
    pub tenant: &'a str,
    /// Estimated tokens of the request: prompt plus `max_tokens`.
    pub tokens: u64,
    /// The request's own limit on its wait, when shorter than the gateway's.
    pub deadline: Option<Duration>,
}

/// A request's place in the queue; leaving the queue (any way) drops it, which wakes the next
/// head.
struct QueuedTicket<'a> {
    gate: &'a AdmissionGate,
    place: Place,
}

impl Drop for QueuedTicket<'_> {
    fn drop(&mut self) {
        self.gate.order.leave(self.place.id);
        self.gate.queued.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AdmissionGate {
    /// An empty gate with a queue of `queue_capacity` and a wait limit of `queue_timeout`,
    /// its waiters ordered by `order`.
    pub fn new(
        slot: PolicySlot<AdmissionPolicy>,
        queue_capacity: u32,
        queue_timeout: Duration,
        order: FairQueue,
    ) -> Self {
        Self {
            slot,
            queue_capacity,
            queue_timeout,
            queued: AtomicU32::new(0),
            order,
        }
    }

    /// Requests waiting in the queue now.
    pub fn queued(&self) -> u32 {
        self.queued.load(Ordering::Acquire)
    }

    /// The queue's capacity.
    pub fn queue_capacity(&self) -> u32 {
        self.queue_capacity
    }

    /// Whether an admission policy is installed (else nobody ever queues, and the fair order's
    /// counters are not kept).
    pub fn is_active(&self) -> bool {
        self.slot.current().is_some()
    }

    /// Admits `request` (setting its priority), waiting in the queue while the policy says so.
    ///
    /// The first question is asked on `snapshot`, the request's own; after a wait in the
    /// queue the pool has moved on, so later ones take a fresh snapshot. Only the head of the
    /// queue asks again (when a server slot is freed, or every [`QUEUE_POLL`]); the others
    /// sleep until they are the head. Returns whether the request waited (then the caller's
    /// snapshot is stale too).
    pub async fn admit(
        &self,
        pool: &Pool,
        snapshot: &Arc<PoolSnapshot>,
        metrics: &Metrics,
        (input, chat): (&RoutingInput, ChatPrompt<'_>),
        request: &mut PolicyRequest,
        asking: Asking<'_>,
    ) -> Result<bool, ApiError> {
        // No policy: nothing to ask, nothing to wait for (and no waiter to register).
        if self.slot.current().is_none() {
            return Ok(false);
        }
        let mut ticket: Option<QueuedTicket<'_>> = None;
        let mut queued_at: Option<Instant> = None;
        let timeout = asking
            .deadline
            .map_or(self.queue_timeout, |d| d.min(self.queue_timeout));
        loop {
            // Registered before asking, so a slot released while the policy runs still wakes us.
            let released = pool.released().notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let current;
            let snapshot = if ticket.is_none() {
                snapshot
            } else {
                current = pool.snapshot();
                &current
            };
            let Some(verdict) = self.ask(
                pool,
                snapshot,
                metrics,
                (input, chat),
                request,
                ticket.is_some(),
            ) else {
                self.order.served(
                    asking.tenant,
                    request.prompt_tokens,
                    ringmaster_slots::queue::INPUT_WEIGHT,
                );
                return Ok(queued_at.is_some());
            };
            match verdict {
                AdmissionVerdict::Accept(priority) => {
                    request.priority = priority;
                    if let Some(at) = queued_at {
                        metrics
                            .admission_queue_wait_seconds
                            .observe(at.elapsed().as_secs_f64());
                    }
                    self.order.served(
                        asking.tenant,
                        request.prompt_tokens,
                        ringmaster_slots::queue::INPUT_WEIGHT,
                    );
                    return Ok(queued_at.is_some());
                }
                AdmissionVerdict::Reject {
                    reason,
                    retry_after_ms,
                } => {
                    return Err(ApiError::new(
                        ErrorKind::RateLimit,
                        format!("the admission policy refused the request: {reason}"),
                    )
                    .with_retry_after(Duration::from_millis(u64::from(retry_after_ms))));
                }
                AdmissionVerdict::Queue => {}
            }
            if ticket.is_none() {
                if self.queued.fetch_add(1, Ordering::AcqRel) >= self.queue_capacity {
                    self.queued.fetch_sub(1, Ordering::AcqRel);
                    metrics.admission_queue_full.inc();
                    return Err(ApiError::new(
                        ErrorKind::Overloaded,
                        format!(
                            "the gateway's queue is full ({} waiting); retry shortly",
                            self.queue_capacity
                        ),
                    )
                    .with_retry_after(Duration::from_secs(1)));
                }
                let place = self.order.join(&request.tier, asking.tenant, asking.tokens);
                ticket = Some(QueuedTicket { gate: self, place });
                queued_at = Some(Instant::now());
                debug!(queued = self.queued(), "admission.queued");
            }
            let Some(ticket) = ticket.as_ref() else {
                continue;
            };
            // Wait until this request is the head and a slot may be free, or its time is up.
            loop {
                let waited = queued_at.map_or(Duration::ZERO, |at| at.elapsed());
                let Some(left) = timeout.checked_sub(waited) else {
                    metrics.admission_queue_timeouts.inc();
                    return Err(ApiError::new(
                        ErrorKind::Overloaded,
                        format!(
                            "the request waited {timeout:?} in the gateway's queue without a free server; retry shortly"
                        ),
                    )
                    .with_retry_after(Duration::from_secs(1)));
                };
                if self.order.is_head(ticket.place.id) {
                    let _ = tokio::time::timeout(left.min(QUEUE_POLL), released.as_mut()).await;
                    if self.order.is_head(ticket.place.id) {
                        break;
                    }
                    // Overtaken while waiting (a higher tier arrived): the new head asks.
                    self.order.wake_head_now();
                } else {
                    let _ = tokio::time::timeout(left, ticket.place.wake.notified()).await;
                }
            }
        }
    }

    /// One question to the policy; `None` when there is no policy or it faulted (admit).
    fn ask(
        &self,
        pool: &Pool,
        snapshot: &PoolSnapshot,
        metrics: &Metrics,
        (input, chat): (&RoutingInput, ChatPrompt<'_>),
        request: &PolicyRequest,
        requeued: bool,
    ) -> Option<AdmissionVerdict> {
        let installed = self.slot.current()?;
        let view = PoolView::new(snapshot, pool, input, chat);
        let in_flight: u64 = snapshot.servers.iter().map(|s| s.in_flight()).sum();
        // A request that already waits is not counted against itself.
        let queued = self.queued().saturating_sub(u32::from(requeued));
        let load = AdmissionLoad {
            in_flight: u32::try_from(in_flight).unwrap_or(u32::MAX),
            queued,
            queue_capacity: self.queue_capacity,
            servers: u32::try_from(snapshot.servers.iter().filter(|s| !s.is_draining()).count())
                .unwrap_or(u32::MAX),
        };
        let outcome = installed.policy.admit(&view, request, &load);
        let verdict_label = match &outcome {
            Ok(AdmissionVerdict::Accept(_)) => "accept",
            Ok(AdmissionVerdict::Queue) => "queue",
            Ok(AdmissionVerdict::Reject { .. }) => "reject",
            Err(_) => "fault",
        };
        metrics
            .admission_decisions
            .get_or_create(&AdmissionLabels {
                verdict: verdict_label,
            })
            .inc();
        match outcome {
            Ok(verdict) => {
                self.slot.succeeded(&installed);
                Some(verdict)
            }
            Err(fault) => {
                metrics
                    .policy_faults
                    .get_or_create(&FaultLabels {
                        slot: "admission",
                        variant: installed.name.to_string(),
                        kind: fault.kind(),
                    })
                    .inc();
                self.slot.faulted(&installed, &fault);
                None
            }
        }
    }
}
