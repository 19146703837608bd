//! Every admin change as a value ([`Change`]) and the one function that carries it out on a
//! gateway ([`carry_out`]). Alone, a gateway carries a change out when it is asked; in a
//! cluster, the change is appended to the configuration log and every replica, this one
//! included, carries it out when it applies that revision ([`Applier`]), so an admin call on
//! any replica changes all of them the same way. Components travel as content hashes: the
//! bytes are stored once in the cluster before the revision that names them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_cluster::log::{Apply, Entry};
use ringmaster_cluster::{Cluster, ClusterError};
use ringmaster_config::RawServer;
use ringmaster_config::rollout::RolloutPlan;
use ringmaster_gateway::Gateway;
use ringmaster_policy_engine::StateMode;
use ringmaster_pool::PoolError;
use ringmaster_slots::router::{RolloutStart, SlotError};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tracing::warn;

/// One admin change.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Change {
    /// `POST /admin/servers`: the server as its JSON body gave it.
    AddServer {
        /// The body.
        server: serde_json::Value,
    },
    /// `POST /admin/keys`: a key (its digest, never the key) with its tier, tenant, models
    /// and limits, added or replacing the key of the same digest.
    PutKey {
        /// The key's fields as `[[api_keys]]` has them, with `key_sha256`.
        key: serde_json::Value,
    },
    /// `DELETE /admin/keys/{id}`.
    RemoveKey {
        /// The key's id (the first 8 bytes of its digest, hex).
        id: String,
    },
    /// `POST /admin/tenants`: a tenant added or its limits replaced.
    PutTenant {
        /// The tenant as `[[tenants]]` has it.
        tenant: serde_json::Value,
    },
    /// `DELETE /admin/tenants/{name}`.
    RemoveTenant {
        /// The tenant.
        name: String,
    },
    /// `DELETE /admin/servers/{id}`: drain and remove.
    RemoveServer {
        /// The server.
        id: String,
    },
    /// `PUT /admin/policies/router`: create a variant or swap its version.
    PutRouter {
        /// The variant.
        variant: String,
        /// The component's content hash.
        component: String,
        /// Its weight, when given.
        weight: Option<u32>,
        /// Whether it is the shadow.
        shadow: bool,
        /// Whether the new version keeps the variant's state store.
        fresh_state: bool,
    },
    /// `POST /admin/policies/router/weight`: a variant's traffic weight.
    SetRouterWeight {
        /// The variant.
        variant: String,
        /// Its new weight.
        weight: u32,
    },
    /// `PUT /admin/policies/router?variant=V&rollout=…&step=…` (or `[[policies.router]]
    /// rollout`): load V as a candidate and ramp it in by the plan.
    StartRollout {
        /// The candidate.
        variant: String,
        /// The component's content hash.
        component: String,
        /// The steps, their least duration, the samples each needs.
        plan: RolloutPlan,
        /// When it starts (Unix milliseconds; every replica's step clock starts here).
        at_ms: u64,
        /// Whether a new version of an existing variant starts with an empty state store.
        fresh_state: bool,
    },
    /// The judge: the running rollout's next step (the last promotes the candidate).
    AdvanceRollout {
        /// The candidate.
        variant: String,
        /// The step it moves to.
        index: usize,
        /// When (Unix milliseconds).
        at_ms: u64,
        /// The candidate's requests over the fleet then.
        requests: u64,
    },
    /// The judge (a guardrail tripped) or an operator (`DELETE /admin/policies/router/rollout`).
    StopRollout {
        /// The candidate.
        variant: String,
        /// When (Unix milliseconds).
        at_ms: u64,
        /// Why.
        reason: String,
    },
    /// `DELETE /admin/policies/router?variant=`.
    RemoveRouter {
        /// The variant.
        variant: String,
    },
    /// `POST /admin/policies/router/rollback?variant=`.
    RollbackRouter {
        /// The variant.
        variant: String,
    },
    /// `PUT /admin/policies/{admission|safety-filter}`.
    PutSingle {
        /// `admission` or `safety-filter`.
        slot: String,
        /// The policy's name.
        name: String,
        /// The component's content hash.
        component: String,
    },
    /// `POST /admin/policies/{slot}/rollback`.
    RollbackSingle {
        /// The slot.
        slot: String,
    },
    /// `DELETE /admin/policies/{slot}`.
    RemoveSingle {
        /// The slot.
        slot: String,
    },
}

impl Change {
    /// The component this change loads, if any.
    fn component(&self) -> Option<&str> {
        match self {
            Self::PutRouter { component, .. }
            | Self::PutSingle { component, .. }
            | Self::StartRollout { component, .. } => Some(component),
            _ => None,
        }
    }
}

/// Carries `change` out on `gateway`. `bytes` is the component when the caller holds it;
/// else it is read from the cluster by its hash. A load (compile, pre-instantiate, probe)
/// runs off the async threads. Returns whether anything changed.
pub async fn carry_out(
    gateway: &Arc<Gateway>,
    change: &Change,
    bytes: Option<Bytes>,
) -> Result<bool, ApiError> {
    let bytes = match (change.component(), bytes) {
        (None, _) => Bytes::new(),
        (Some(_), Some(bytes)) => bytes,
        (Some(hash), None) => {
            let cluster = gateway.cluster().ok_or_else(|| {
                ApiError::internal("a component by hash needs a cluster to read it from")
            })?;
            Bytes::from(cluster.get_blob(hash).await.map_err(unavailable)?)
        }
    };
    match change.clone() {
        Change::AddServer { server } => {
            let raw: RawServer = serde_json::from_value(server)
                .map_err(|e| ApiError::invalid(format!("server: {e}")))?;
            let spec = ringmaster_config::server_spec(&raw).map_err(ApiError::invalid)?;
            let server = gateway.pool().add(&spec).map_err(pool_error)?;
            tracing::info!(server = server.id(), address = %server.address(), weight = server.weight(), "pool.server_added");
            Ok(true)
        }
        Change::PutKey { .. }
        | Change::RemoveKey { .. }
        | Change::PutTenant { .. }
        | Change::RemoveTenant { .. } => crate::keys::carry_out(gateway, change),
        Change::RemoveServer { id } => {
            let server = gateway.pool().remove(&id).map_err(pool_error)?;
            tracing::info!(
                server = server.id(),
                in_flight = server.in_flight(),
                "pool.server_draining"
            );
            Ok(true)
        }
        Change::PutRouter {
            variant,
            weight,
            shadow,
            fresh_state,
            ..
        } => {
            let router = gateway.router().clone();
            let state = if fresh_state {
                StateMode::Fresh
            } else {
                StateMode::Keep
            };
            load(move || router.install_with_state(&variant, &bytes, weight, shadow, None, state))
                .await
        }
        Change::StartRollout {
            variant,
            plan,
            at_ms,
            fresh_state,
            ..
        } => {
            let router = gateway.router().clone();
            load(move || {
                router.start_rollout(RolloutStart {
                    variant: &variant,
                    bytes: &bytes,
                    plan,
                    at_ms,
                    state: if fresh_state {
                        StateMode::Fresh
                    } else {
                        StateMode::Keep
                    },
                })
            })
            .await
        }
        Change::AdvanceRollout {
            variant,
            index,
            at_ms,
            requests,
        } => gateway
            .router()
            .advance_rollout(&variant, index, at_ms, requests)
            .map_err(slot_error),
        Change::StopRollout {
            variant,
            at_ms,
            reason,
        } => Ok(gateway.router().stop_rollout(&variant, at_ms, &reason)),
        Change::SetRouterWeight { variant, weight } => gateway
            .router()
            .set_weight(&variant, weight)
            .map_err(slot_error),
        Change::RemoveRouter { variant } => gateway
            .router()
            .remove(&variant)
            .map(|()| true)
            .map_err(slot_error),
        Change::RollbackRouter { variant } => gateway
            .router()
            .rollback(&variant)
            .map(|()| true)
            .map_err(slot_error),
        Change::PutSingle { slot, name, .. } => match slot.as_str() {
            "admission" => {
                let slot = gateway.admission().clone();
                load(move || slot.slot.install(&name, &bytes, None)).await
            }
            _ => {
                let slot = gateway.safety().clone();
                load(move || slot.slot.install(&name, &bytes, None)).await
            }
        },
        Change::RollbackSingle { slot } => match slot.as_str() {
            "admission" => gateway.admission().slot.rollback(),
            _ => gateway.safety().slot.rollback(),
        }
        .map(|()| true)
        .map_err(slot_error),
        Change::RemoveSingle { slot } => match slot.as_str() {
            "admission" => gateway.admission().slot.remove(),
            _ => gateway.safety().slot.remove(),
        }
        .map(|()| true)
        .map_err(slot_error),
    }
}

/// Runs a policy load off the async threads.
async fn load(
    work: impl FnOnce() -> Result<bool, SlotError> + Send + 'static,
) -> Result<bool, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("policy load task failed: {e}")))?
        .map_err(slot_error)
}

/// The cluster's failure as the error an admin client gets (503, retry shortly).
pub(crate) fn unavailable(error: ClusterError) -> ApiError {
    match error {
        ClusterError::Conflict { .. } => ApiError::new(ErrorKind::Conflict, error.to_string()),
        _ => ApiError::new(
            ErrorKind::Unavailable,
            format!("the cluster's Redis cannot take the change now: {error}"),
        )
        .with_retry_after(Duration::from_secs(1)),
    }
}

/// How many revisions' outcomes a replica remembers for the admin calls waiting on them.
const OUTCOMES_KEPT: usize = 256;

/// Applies the configuration log's revisions to a gateway, remembering each one's outcome for
/// the admin call on this replica that appended it.
#[derive(Debug)]
pub struct Applier {
    gateway: Weak<Gateway>,
    outcomes: Mutex<VecDeque<(u64, Result<bool, ApiError>)>>,
}

impl Applier {
    /// The applier of `gateway`'s revisions.
    pub fn new(gateway: &Arc<Gateway>) -> Arc<Self> {
        Arc::new(Self {
            gateway: Arc::downgrade(gateway),
            outcomes: Mutex::new(VecDeque::new()),
        })
    }

    /// The outcome of applying `revision` here, if it is remembered.
    pub fn outcome(&self, revision: u64) -> Option<Result<bool, ApiError>> {
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(r, _)| *r == revision)
            .map(|(_, outcome)| outcome.clone())
    }
}

impl Apply for Applier {
    fn apply<'a>(
        &'a self,
        entry: &'a Entry,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            let Some(gateway) = self.gateway.upgrade() else {
                return Err("the gateway is shutting down".into());
            };
            let outcome = match serde_json::from_value::<Change>(entry.change.clone()) {
                Ok(change) => carry_out(&gateway, &change, None).await,
                Err(e) => Err(ApiError::invalid(format!(
                    "revision {} is not a change this version knows: {e}",
                    entry.revision
                ))),
            };
            let reported = outcome
                .as_ref()
                .map(|_| ())
                .map_err(|e| e.message().to_owned());
            let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
            if outcomes.len() == OUTCOMES_KEPT {
                outcomes.pop_front();
            }
            outcomes.push_back((entry.revision, outcome));
            reported
        })
    }
}

/// What an admin change did: whether it changed anything, and in a cluster its revision and
/// whether every live replica had applied it before the answer (`?wait=true`).
#[derive(Debug)]
pub struct Done {
    /// Whether anything changed.
    pub changed: bool,
    /// The revision that carried it (cluster only).
    pub revision: Option<u64>,
    /// Whether every live replica applied it (asked with `?wait=true`).
    pub everywhere: Option<bool>,
}

/// How long an admin call waits for its revision to apply (here, then everywhere).
pub const APPLY_WAIT: Duration = Duration::from_secs(10);

tokio::task_local! {
    /// What the admin call being answered changed, for its audit entry (set by [`make`],
    /// read by `access::Audit`; outside an admin call, as for the rollout judge's own changes,
    /// there is none and nothing is noted).
    pub(crate) static CHANGED: std::cell::RefCell<Changed>;
}

/// What an admin call's changes were made to, and the revisions they became.
#[derive(Clone, Debug, Default)]
pub(crate) struct Changed {
    /// Each change's object ([`describe`]).
    pub(crate) objects: Vec<serde_json::Value>,
    /// The revision the last change became (cluster only).
    pub(crate) revision: Option<u64>,
}

fn note(object: Option<serde_json::Value>, revision: Option<u64>) {
    let _ = CHANGED.try_with(|changed| {
        let mut changed = changed.borrow_mut();
        if let Some(object) = object {
            changed.objects.push(object);
        }
        if revision.is_some() {
            changed.revision = revision;
        }
    });
}

/// What `change` is made to, as the audit trail names it: the server (id and address), the
/// key (id, tenant), the tenant, the slot and variant with the component's content hash
/// (`policy`), the rollout. Looked up on `gateway` before the change, so a removal still names
/// what it removed.
pub(crate) fn describe(change: &Change, gateway: &Gateway) -> serde_json::Value {
    let server_address = |id: &str| {
        let snapshot = gateway.pool().snapshot();
        snapshot
            .servers
            .iter()
            .chain(&snapshot.prefill)
            .chain(&snapshot.draining)
            .find(|s| s.id() == id)
            .map(|s| s.address().to_string())
    };
    let key_tenant = |id: &str| {
        gateway
            .keys()
            .current()
            .configured_keys()
            .into_iter()
            .find(|k| ringmaster_config::key_id(&k.digest) == id)
            .and_then(|k| k.tenant)
    };
    match change {
        Change::AddServer { server } => json!({"server": {
            "id": server.get("id").cloned().unwrap_or_else(|| server["address"].clone()),
            "address": server["address"],
        }}),
        Change::RemoveServer { id } => {
            json!({"server": {"id": id, "address": server_address(id)}})
        }
        Change::PutKey { key } => json!({"key": {
            "id": key["key_sha256"].as_str().map(|d| d.chars().take(16).collect::<String>()),
            "tenant": key["tenant"],
            "tier": key["tier"],
        }}),
        Change::RemoveKey { id } => json!({"key": {"id": id, "tenant": key_tenant(id)}}),
        Change::PutTenant { tenant } => json!({"tenant": tenant["name"]}),
        Change::RemoveTenant { name } => json!({"tenant": name}),
        Change::PutRouter {
            variant,
            component,
            weight,
            shadow,
            ..
        } => json!({"slot": "router", "variant": variant, "policy": component,
                    "weight": weight, "shadow": shadow}),
        Change::SetRouterWeight { variant, weight } => {
            json!({"slot": "router", "variant": variant, "weight": weight})
        }
        Change::StartRollout {
            variant,
            component,
            plan,
            ..
        } => json!({"slot": "router", "variant": variant, "policy": component,
                    "rollout": {"steps": plan.steps, "step_ms": plan.step_ms}}),
        Change::AdvanceRollout { variant, index, .. } => {
            json!({"slot": "router", "variant": variant, "rollout": {"step": index}})
        }
        Change::StopRollout {
            variant, reason, ..
        } => json!({"slot": "router", "variant": variant, "rollout": {"stopped": reason}}),
        Change::RemoveRouter { variant } | Change::RollbackRouter { variant } => {
            json!({"slot": "router", "variant": variant})
        }
        Change::PutSingle {
            slot,
            name,
            component,
        } => json!({"slot": slot, "policy_name": name, "policy": component}),
        Change::RollbackSingle { slot } | Change::RemoveSingle { slot } => json!({"slot": slot}),
    }
}

/// Makes `change`: alone, at once; in a cluster, as the next revision of the log (retried on
/// the new head when another change landed first), answered once this replica applied it,
/// and, when `everywhere`, once every live replica has.
pub async fn make(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    change: Change,
    bytes: Option<Bytes>,
    everywhere: bool,
) -> Result<Done, ApiError> {
    note(Some(describe(&change, gateway)), None);
    let (Some(cluster), Some(applier)) = (gateway.cluster(), applier) else {
        let changed = carry_out(gateway, &change, bytes).await?;
        return Ok(Done {
            changed,
            revision: None,
            everywhere: None,
        });
    };
    if let Some(bytes) = &bytes {
        cluster.put_blob(bytes).await.map_err(unavailable)?;
    }
    let body = serde_json::to_value(&change).expect("a change serializes");
    let revision = append(cluster, &body).await?;
    note(None, Some(revision));
    if !cluster.applied().wait_for(revision, APPLY_WAIT).await {
        return Err(ApiError::new(
            ErrorKind::Unavailable,
            format!(
                "revision {revision} was appended but not applied here within {APPLY_WAIT:?}; it will be"
            ),
        ));
    }
    let changed = applier.outcome(revision).unwrap_or(Ok(true))?;
    let everywhere = if everywhere {
        Some(applied_everywhere(cluster, revision, APPLY_WAIT).await)
    } else {
        None
    };
    Ok(Done {
        changed,
        revision: Some(revision),
        everywhere,
    })
}

/// Appends on the head this replica has applied; when another change landed first, catches
/// up and tries again on the new head.
async fn append(cluster: &Cluster, body: &serde_json::Value) -> Result<u64, ApiError> {
    for _ in 0..16 {
        let expected = cluster.applied().get();
        match cluster.append(expected, body).await {
            Ok(revision) => return Ok(revision),
            Err(ClusterError::Conflict { head, .. }) => {
                // The follower applies the newer revisions; the change is then made on them.
                if !cluster.applied().wait_for(head, APPLY_WAIT).await {
                    warn!(head, "cluster.catch_up_slow");
                }
            }
            Err(error) => return Err(unavailable(error)),
        }
    }
    Err(ApiError::new(
        ErrorKind::Conflict,
        "the configuration log kept moving: 16 other changes landed first; try again",
    ))
}

/// Waits until every live replica's lease reports `revision` applied (or `timeout`).
pub async fn applied_everywhere(cluster: &Cluster, revision: u64, timeout: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Ok(leases) = cluster.replicas().await
            && leases
                .iter()
                .all(|l| l.lease.applied >= revision || l.lease.replica == cluster.replica())
        {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A slot's refusal as the error an admin client gets.
pub(crate) fn slot_error(error: SlotError) -> ApiError {
    match error {
        SlotError::UnknownVariant(_) => ApiError::not_found(error.to_string()),
        SlotError::Policy(_) | SlotError::NoPreviousVersion(_) | SlotError::Invalid(_) => {
            ApiError::invalid(error.to_string())
        }
    }
}

/// The pool's refusal as the error an admin client gets.
pub(crate) fn pool_error(error: PoolError) -> ApiError {
    match error {
        PoolError::Duplicate(_) => ApiError::new(ErrorKind::Conflict, error.to_string()),
        PoolError::Unknown(_) => ApiError::not_found(error.to_string()),
        PoolError::Ring(_) => ApiError::invalid(error.to_string()),
        PoolError::Engine { .. } => ApiError::internal(error.to_string()),
        PoolError::Model { .. } | PoolError::Tls { .. } => ApiError::invalid(error.to_string()),
    }
}

/// A change's revision and reach, in its answer (cluster only).
pub(crate) fn done_fields(body: &mut serde_json::Value, done: &Done) {
    if let Some(revision) = done.revision {
        body["revision"] = json!(revision);
    }
    if let Some(everywhere) = done.everywhere {
        body["applied_everywhere"] = json!(everywhere);
    }
}
