//! Ringmaster's admin API: every `/admin/…` handler, mounted into a gateway at start
//! ([`mount`]). It changes the gateway only through the gateway's own parts (the pool's
//! membership, the policy slots, the recorder), and explains a decision by running the
//! request path's own prepare phase and router ([`explain`]), never a copy of them.
//!
//! It is off unless an operator token is configured (`admin_token` or
//! `RINGMASTER_ADMIN_TOKEN`, every scope; `[[admin.tokens]]`, named and scoped); every call
//! presents one as `Authorization: Bearer TOKEN` or `x-admin-token`, and needs its scope
//! (`read`, `operate`, `policies`; 403 naming the one missing). Every change goes into the
//! audit trail ([`access`], `GET /admin/audit`). Tokens are compared by digest in constant
//! time and never logged. Nothing here holds a lock across an await.
//!
//! - [`servers`]: `GET|POST /admin/servers`, `DELETE /admin/servers/{id}`, `/admin/record`;
//! - [`policies`]: `GET /admin/policies`, `PUT|POST|DELETE /admin/policies/…`;
//! - [`experiments`]: `GET /admin/experiments`;
//! - [`explain`]: `POST /admin/route/explain`;
//! - [`cluster`]: `GET /admin/cluster` (the replicas, their revisions and views);
//! - [`status`]: `GET /admin/status` and `GET /admin/events` (the status page's data, whole
//!   and as server-sent events); the page's own files at `/ui` (no data in them).
//!
//! Every change is a [`changes::Change`], made by [`changes::make`]: at once on a gateway
//! alone; as the next revision of the configuration log in a cluster, which every replica
//! applies ([`follow_cluster`]). `?wait=true` on a change answers once every live replica
//! has applied it.

#![deny(missing_docs)]

pub mod access;
pub mod changes;
pub mod cluster;
pub mod experiments;
pub mod explain;
mod guardrails;
mod keys;
pub mod policies;
pub mod rollout;
pub mod servers;
pub mod status;
mod ui;

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_gateway::respond::json_response;
use ringmaster_gateway::{Gateway, ResponseBody};

use crate::changes::{Applier, Change};
use crate::cluster::cluster_json;
use crate::experiments::experiments_json;
use crate::explain::explain;
use crate::policies::{parse_weight, policies_json, policy_change, put_router, put_single};
use crate::servers::{add_server, record_json, remove_server, servers_json};

/// The admin API as a gateway's `/admin/` routes.
#[derive(Debug)]
pub struct Admin {
    /// The applier of the configuration log (a cluster's replicas only).
    applier: Option<Arc<Applier>>,
    /// The trail of changes (a gateway alone's; a cluster's is in Redis).
    audit: access::Audit,
}

impl ringmaster_gateway::AdminRoutes for Admin {
    fn handle<'a>(
        &'a self,
        gateway: &'a Arc<Gateway>,
        req: Request<Incoming>,
    ) -> ringmaster_gateway::AdminFuture<'a> {
        Box::pin(handle(gateway, self, req))
    }
}

/// Mounts the admin API on a gateway alone (and, inside a Tokio runtime, starts its
/// rollout judge and guardrails).
pub fn mount(gateway: &Arc<Gateway>) {
    mount_with(gateway, None);
}

/// Mounts the admin API on a replica whose configuration log `applier` applies
/// ([`follow_cluster`]), or on a gateway alone (`None`), and inside a Tokio runtime starts
/// the rollout judge ([`rollout`]) and, with `[policies] guardrails`, the guardrails
/// ([`guardrails`]).
pub fn mount_with(gateway: &Arc<Gateway>, applier: Option<Arc<Applier>>) {
    if tokio::runtime::Handle::try_current().is_ok() {
        tokio::spawn(rollout::watch(Arc::downgrade(gateway), applier.clone()));
        if gateway.config().policies.guardrails {
            tokio::spawn(guardrails::watch(Arc::downgrade(gateway), applier.clone()));
        }
    }
    gateway.mount_admin(Arc::new(Admin {
        applier,
        audit: access::Audit::default(),
    }));
}

/// For a replica: applies the configuration log up to its head (so that the replica serves
/// the fleet's current revision before it takes a request), then follows it in the
/// background. `None` for a gateway alone.
pub async fn follow_cluster(
    gateway: &Arc<Gateway>,
) -> Result<Option<Arc<Applier>>, ringmaster_cluster::ClusterError> {
    let Some(cluster) = gateway.cluster() else {
        return Ok(None);
    };
    let applier = Applier::new(gateway);
    let revision = cluster.catch_up(applier.as_ref()).await?;
    tracing::info!(revision, replica = cluster.replica(), "cluster.caught_up");
    tokio::spawn(cluster.clone().follow(applier.clone()));
    Ok(Some(applier))
}

/// Handles `/admin/…` and `/ui`: the caller's token and scope checked, every change recorded
/// in the audit trail.
pub async fn handle(
    gateway: &Arc<Gateway>,
    admin: &Admin,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let tokens = &gateway.config().admin_tokens;
    if tokens.is_empty() {
        return Err(ApiError::not_found(
            "the admin API is disabled: set admin_token (or [[admin.tokens]]) in the config or \
             RINGMASTER_ADMIN_TOKEN",
        ));
    }
    let path = req.uri().path();
    if path == "/ui" || path.starts_with("/ui/") {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("method {} is not allowed on {path}", req.method()),
            ));
        }
        return ui::serve(path);
    }
    let address = req
        .extensions()
        .get::<ringmaster_gateway::PeerAddr>()
        .map(|peer| peer.0);
    let method = req.method().clone();
    let what = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    let token = match access::caller(tokens, req.headers()) {
        Ok(token) => token,
        Err(refused) => {
            // Who knocks without a key is what an audit is for too (rate-limited per address).
            let entry = access::AuditEntry::new(
                (None, address),
                (&method, what),
                refused.kind().status().as_u16(),
                changes::Changed::default(),
            );
            admin.audit.record_refusal(gateway, entry).await;
            // Refused on the head alone: the caller hears it once it has sent its body.
            return Err(ringmaster_gateway::respond::refuse_unread(req, refused).await);
        }
    };
    let path = req.uri().path().to_owned();
    let has_body = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .map_or(
            req.headers().contains_key(http::header::TRANSFER_ENCODING),
            |n| n != "0",
        );
    let scope = access::scope_of(&method, &path, has_body);
    let denied = access::check(token, scope, &method, &path).err();
    if scope == ringmaster_config::Scope::Read
        && let Some(denied) = denied
    {
        return Err(denied);
    }
    if path == "/admin/audit" {
        if method != Method::GET {
            return Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("method {method} is not allowed on {path}"),
            ));
        }
        let limit = query_param(&req, "limit")
            .and_then(|l| l.parse().ok())
            .unwrap_or(100usize)
            .clamp(1, ringmaster_cluster::audit::AUDIT_KEPT);
        return Ok(json_response(
            StatusCode::OK,
            &admin.audit.list(gateway, limit).await?,
        ));
    }
    if scope == ringmaster_config::Scope::Read {
        return route(gateway, admin.applier.as_ref(), req).await;
    }
    // A refused change is recorded too: who tried what is what an audit is for.
    let changed = std::cell::RefCell::new(changes::Changed::default());
    let (answer, changed) = match denied {
        Some(denied) => (
            Err(ringmaster_gateway::respond::refuse_unread(req, denied).await),
            changed.into_inner(),
        ),
        None => {
            changes::CHANGED
                .scope(changed, async {
                    let answer = route(gateway, admin.applier.as_ref(), req).await;
                    let changed = changes::CHANGED.with(|c| c.take());
                    (answer, changed)
                })
                .await
        }
    };
    let status = match &answer {
        Ok(response) => response.status().as_u16(),
        Err(e) => e.kind().status().as_u16(),
    };
    let entry = access::AuditEntry::new(
        (Some(&token.name), address),
        (&method, what),
        status,
        changed,
    );
    admin.audit.record(gateway, entry).await;
    answer
}

/// An authorized call to its handler.
async fn route(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let wait = matches!(query_param(&req, "wait").as_deref(), Some("true" | "1"));
    match (method.clone(), path.as_str()) {
        (Method::GET, "/admin/servers") => {
            Ok(json_response(StatusCode::OK, &servers_json(gateway)))
        }
        (Method::POST, "/admin/servers") => add_server(gateway, applier, req).await,
        (Method::GET, "/admin/keys") => Ok(keys::list_keys(gateway)),
        (Method::POST, "/admin/keys") => {
            let everywhere = query_param(&req, "wait").is_some_and(|w| w == "true" || w == "1");
            keys::add_key(gateway, applier, req, everywhere).await
        }
        (Method::DELETE, p) if p.starts_with("/admin/keys/") => {
            let id = p["/admin/keys/".len()..].to_owned();
            keys::remove_key(gateway, applier, id).await
        }
        (Method::GET, "/admin/tenants") => Ok(keys::list_tenants(gateway)),
        (Method::POST, "/admin/tenants") => keys::put_tenant(gateway, applier, req).await,
        (Method::DELETE, p) if p.starts_with("/admin/tenants/") => {
            let name = p["/admin/tenants/".len()..].to_owned();
            keys::remove_tenant(gateway, applier, name).await
        }
        (Method::DELETE, p) if p.starts_with("/admin/servers/") => {
            let id = p["/admin/servers/".len()..].to_owned();
            remove_server(gateway, applier, id, wait).await
        }
        (Method::GET, "/admin/cluster") => cluster_json(gateway).await,
        (Method::GET, "/admin/status") => status::status(gateway).await,
        (Method::GET, "/admin/events") => Ok(status::events(gateway)),
        (Method::POST, "/admin/route/explain") => explain(gateway, req).await,
        (Method::GET, "/admin/record") => record_json(gateway, None),
        (Method::PUT, "/admin/record") => record_json(gateway, Some(true)),
        (Method::DELETE, "/admin/record") => record_json(gateway, Some(false)),
        (Method::GET, "/admin/autoscale") => {
            Ok(json_response(StatusCode::OK, &gateway.autoscale()))
        }
        (Method::GET, "/admin/policies") => {
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::GET, "/admin/experiments") => {
            let others = crate::cluster::others_figures(gateway).await;
            Ok(json_response(
                StatusCode::OK,
                &experiments_json(gateway, &others),
            ))
        }
        (Method::PUT, "/admin/policies/router") => put_router(gateway, applier, req).await,
        (Method::DELETE, "/admin/policies/router") => {
            let variant = required(&req, "variant")?;
            policy_change(
                gateway,
                applier,
                Change::RemoveRouter { variant },
                None,
                wait,
            )
            .await
        }
        (Method::POST, "/admin/policies/router/rollback") => {
            let variant = required(&req, "variant")?;
            policy_change(
                gateway,
                applier,
                Change::RollbackRouter { variant },
                None,
                wait,
            )
            .await
        }
        (Method::DELETE, "/admin/policies/router/rollout") => {
            let Some(rollout) = gateway
                .router()
                .rollout()
                .filter(|r| r.phase == ringmaster_slots::router::RolloutPhase::Running)
            else {
                return Err(ApiError::not_found("no rollout is running"));
            };
            let change = Change::StopRollout {
                variant: rollout.variant,
                at_ms: rollout::now_ms(),
                reason: "stopped by an operator".to_owned(),
            };
            policy_change(gateway, applier, change, None, wait).await
        }
        (Method::POST | Method::PUT, "/admin/policies/router/weight") => {
            let variant = required(&req, "variant")?;
            let weight = parse_weight(&required(&req, "weight")?)?;
            let change = Change::SetRouterWeight { variant, weight };
            policy_change(gateway, applier, change, None, wait).await
        }
        (Method::PUT, "/admin/policies/admission" | "/admin/policies/safety-filter") => {
            put_single(gateway, applier, req).await
        }
        (
            Method::POST,
            "/admin/policies/admission/rollback" | "/admin/policies/safety-filter/rollback",
        ) => {
            let slot = single_slot(&path);
            policy_change(
                gateway,
                applier,
                Change::RollbackSingle { slot },
                None,
                wait,
            )
            .await
        }
        (Method::DELETE, "/admin/policies/admission" | "/admin/policies/safety-filter") => {
            let slot = single_slot(&path);
            policy_change(gateway, applier, Change::RemoveSingle { slot }, None, wait).await
        }
        (
            _,
            "/admin/policies/router"
            | "/admin/policies/admission"
            | "/admin/policies/safety-filter"
            | "/admin/policies/router/weight"
            | "/admin/policies/router/rollout"
            | "/admin/policies/router/rollback"
            | "/admin/policies/admission/rollback"
            | "/admin/policies/safety-filter/rollback",
        ) => Err(ApiError::new(
            ErrorKind::MethodNotAllowed,
            format!("method {method} is not allowed on {path}"),
        )),
        (_, p) if p.starts_with("/admin/policies/") => Err(ApiError::not_found(format!(
            "no policy slot at {p}; the slots are /admin/policies/router, \
             /admin/policies/admission and /admin/policies/safety-filter"
        ))),
        (
            _,
            "/admin/servers"
            | "/admin/route/explain"
            | "/admin/policies"
            | "/admin/experiments"
            | "/admin/cluster"
            | "/admin/status"
            | "/admin/events"
            | "/admin/record",
        ) => Err(ApiError::new(
            ErrorKind::MethodNotAllowed,
            format!("method {method} is not allowed on {path}"),
        )),
        _ => Err(ApiError::not_found(format!(
            "no admin route for {method} {path}"
        ))),
    }
}

/// A query parameter that must be there.
fn required(req: &Request<Incoming>, name: &str) -> Result<String, ApiError> {
    query_param(req, name)
        .ok_or_else(|| ApiError::invalid(format!("{name}: query parameter required")))
}

/// `admission` or `safety-filter`, from a single slot's path.
fn single_slot(path: &str) -> String {
    if path.starts_with("/admin/policies/admission") {
        "admission".into()
    } else {
        "safety-filter".into()
    }
}

/// A query parameter's value.
fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| value.to_owned())
    })
}
