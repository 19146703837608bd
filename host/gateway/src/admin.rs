//! The admin API: listing, adding and draining GPU servers, and explaining a routing decision.
//!
//! It is off unless an admin token is configured (`admin_token` or `RINGMASTER_ADMIN_TOKEN`);
//! every call must present it as `Authorization: Bearer TOKEN` or `x-admin-token`. The token is
//! compared in constant time and never logged. Changes to the pool go through [`crate::pool`],
//! which publishes a new snapshot; nothing here holds a lock across an await.

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;
use tracing::info;

use crate::Gateway;
use crate::api::{self, parse_json};
use crate::body::ResponseBody;
use crate::config::{RawServer, ServerSpec};
use crate::error::{ApiError, ErrorKind};
use crate::pool::{PoolError, Server};
use crate::routing::routing_input;
use crate::service::{json_response, read_json_body};

/// Handles `/admin/…`.
pub(crate) async fn handle(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let Some(token) = gateway.config.admin_token.as_deref() else {
        return Err(ApiError::not_found(
            "the admin API is disabled: set admin_token in the config or RINGMASTER_ADMIN_TOKEN",
        ));
    };
    if !presented_token_matches(req.headers(), token) {
        return Err(ApiError::new(
            ErrorKind::Authentication,
            "admin API: missing or wrong admin token (Authorization: Bearer TOKEN)",
        ));
    }
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    match (method.clone(), path.as_str()) {
        (Method::GET, "/admin/servers") => {
            Ok(json_response(StatusCode::OK, &servers_json(gateway)))
        }
        (Method::POST, "/admin/servers") => add_server(gateway, req).await,
        (Method::DELETE, p) if p.starts_with("/admin/servers/") => {
            remove_server(gateway, &p["/admin/servers/".len()..])
        }
        (Method::POST, "/admin/route/explain") => explain(gateway, req).await,
        (_, "/admin/servers" | "/admin/route/explain") => Err(ApiError::new(
            ErrorKind::MethodNotAllowed,
            format!("method {method} is not allowed on {path}"),
        )),
        _ => Err(ApiError::not_found(format!(
            "no admin route for {method} {path}"
        ))),
    }
}

fn presented_token_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-admin-token").and_then(|v| v.to_str().ok()));
    presented.is_some_and(|p| constant_time_eq(p.trim().as_bytes(), token.as_bytes()))
}

/// Compares without an early exit on the first differing byte.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn servers_json(gateway: &Gateway) -> serde_json::Value {
    let snapshot = gateway.pool.snapshot();
    let servers: Vec<_> = snapshot
        .servers
        .iter()
        .chain(snapshot.draining.iter())
        .map(|s| server_json(s))
        .collect();
    json!({
        "strategy": gateway.pool.strategy().as_str(),
        "ring_version": snapshot.version,
        "servers": servers,
    })
}

fn server_json(server: &Server) -> serde_json::Value {
    let load = server.engine().load();
    let hit_ratio = if load.prompt_tokens_total == 0 {
        0.0
    } else {
        load.cached_prompt_tokens_total as f64 / load.prompt_tokens_total as f64
    };
    json!({
        "id": server.id(),
        "address": server.address().to_string(),
        "weight": server.weight(),
        "state": if server.is_draining() { "draining" } else { "active" },
        "in_flight": server.in_flight(),
        "peak_in_flight": server.peak_in_flight(),
        "requests_total": server.requests_total(),
        "engine": {
            "running": load.running,
            "waiting": load.waiting,
            "kv_blocks_used": load.kv_blocks_used,
            "kv_blocks_cached": load.kv_blocks_cached,
            "kv_blocks_total": load.kv_blocks_total,
            "prompt_tokens_total": load.prompt_tokens_total,
            "cached_prompt_tokens_total": load.cached_prompt_tokens_total,
            "prefix_cache_hit_ratio": hit_ratio,
            "generated_tokens_total": load.generated_tokens_total,
            "requests_finished": load.requests_finished,
            "requests_cancelled": load.requests_cancelled,
            "preemptions": load.preemptions,
        },
    })
}

async fn add_server(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let body = read_json_body(gateway, req).await?;
    let raw: RawServer = parse_json(&body)?;
    let spec = ServerSpec::from_raw(&raw).map_err(ApiError::invalid)?;
    let server = gateway.pool.add(&spec).map_err(pool_error)?;
    info!(server = server.id(), address = %server.address(), weight = server.weight(), "pool.server_added");
    Ok(json_response(StatusCode::CREATED, &server_json(&server)))
}

fn remove_server(gateway: &Arc<Gateway>, id: &str) -> Result<Response<ResponseBody>, ApiError> {
    let server = gateway.pool.remove(id).map_err(pool_error)?;
    info!(
        server = server.id(),
        in_flight = server.in_flight(),
        "pool.server_draining"
    );
    Ok(json_response(StatusCode::OK, &server_json(&server)))
}

fn pool_error(error: PoolError) -> ApiError {
    match error {
        PoolError::Duplicate(_) => ApiError::new(ErrorKind::Conflict, error.to_string()),
        PoolError::Unknown(_) => ApiError::not_found(error.to_string()),
        PoolError::Ring(_) => ApiError::invalid(error.to_string()),
        PoolError::Engine { .. } => ApiError::internal(error.to_string()),
    }
}

async fn explain(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let session = req
        .headers()
        .get("x-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = read_json_body(gateway, req).await?;
    let request = api::parse_messages_request(&body, gateway.limits())?;
    let input = routing_input(&request, session.as_deref(), gateway.config.prefix_hashing);
    let snapshot = gateway.pool.snapshot();
    let decision = gateway
        .pool
        .explain(&input)
        .ok_or_else(|| ApiError::new(ErrorKind::Overloaded, "no GPU servers in the pool"))?;
    let total: u64 = snapshot.servers.iter().map(|s| s.in_flight()).sum();
    let candidates: Vec<_> = snapshot
        .ring
        .candidates(input.key, snapshot.servers.len())
        .into_iter()
        .map(|i| {
            let server = &snapshot.servers[i];
            json!({
                "id": server.id(),
                "in_flight": server.in_flight(),
                "capacity": snapshot.ring.capacity(i, total),
            })
        })
        .collect();
    let why = match decision.reason {
        crate::pool::DecisionReason::Affinity => {
            "the routing key's owner on the ring is under its bounded-load cap".to_owned()
        }
        crate::pool::DecisionReason::BoundedLoadSpill => format!(
            "the key's owner {} is at its bounded-load cap; the next server clockwise under its cap takes it",
            decision.preferred.as_ref().map_or("?", |s| s.id())
        ),
        crate::pool::DecisionReason::RoundRobin => {
            "round-robin strategy: the next server in turn".to_owned()
        }
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "strategy": gateway.pool.strategy().as_str(),
            "routing_key": {
                "source": input.source.as_str(),
                "hash": format!("{:016x}", input.key),
            },
            "prefix_hashes": input.prefix_hashes.len(),
            "candidates": candidates,
            "chosen": decision.server.id(),
            "reason": decision.reason.as_str(),
            "why": why,
            "preferred": decision.preferred.as_ref().map(|s| s.id()),
            "skipped": decision.skipped.iter().map(|s| s.id()).collect::<Vec<_>>(),
            "capacity": decision.capacity,
        }),
    ))
}
