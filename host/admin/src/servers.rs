//! The pool's membership (`GET|POST /admin/servers`, `DELETE /admin/servers/{id}`: added
//! servers start at once, removed ones drain), and the traffic recording (`/admin/record`).

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::read_json as parse_json;
use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_config::RawServer;
use ringmaster_gateway::respond::{json_response, read_any_json_body};
use ringmaster_gateway::{Gateway, ResponseBody};
use ringmaster_pool::Server;
use serde_json::json;

use crate::changes::{Applier, Change, done_fields, make};

pub(crate) fn record_json(
    gateway: &Gateway,
    switch: Option<bool>,
) -> Result<Response<ResponseBody>, ApiError> {
    let Some(recorder) = gateway.recorder() else {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            "no trace file is configured: set [record] path (and enabled = false to start \
             switched off) in the config",
        ));
    };
    if let Some(on) = switch {
        recorder.set_enabled(on);
    }
    Ok(json_response(
        StatusCode::OK,
        &serde_json::json!({
            "recording": recorder.is_recording(),
            "path": recorder.path().display().to_string(),
        }),
    ))
}

pub(crate) fn servers_json(gateway: &Gateway) -> serde_json::Value {
    let snapshot = gateway.pool().snapshot();
    let servers: Vec<_> = snapshot
        .servers
        .iter()
        .chain(snapshot.draining.iter())
        .map(|s| server_json(s))
        .collect();
    json!({
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
        "routable": server.is_routable(),
        // A remote server's health with its reasons: why it takes no requests (a failed TLS
        // handshake says what is wrong with its certificate), and its last failure.
        "health": match server.engine() {
            ringmaster_gateway::pool::Backend::Remote(worker) => {
                serde_json::to_value(worker.health_report()).unwrap_or_default()
            }
            ringmaster_gateway::pool::Backend::Local(_) => serde_json::Value::Null,
        },
        "in_flight": server.in_flight(),
        "peak_in_flight": server.peak_in_flight(),
        "requests_total": server.requests_total(),
        "prefill_backlog_tokens": server.fleet_prefill_backlog(),
        "cache_view": server.cache_view(),
        // A remote server's API and what it takes (this process's engines speak none).
        "api": match server.engine() {
            ringmaster_gateway::pool::Backend::Remote(_) => json!({
                "api": server.protocol().api.as_str(),
                "reasoning": server.protocol().reasoning,
                "keep_volatile": server.protocol().keep_volatile,
            }),
            ringmaster_gateway::pool::Backend::Local(_) => serde_json::Value::Null,
        },
        // How it is reached: paths and names only, never a key or a header's value.
        "access": access_json(server.address(), server.access()),
        // The spill-over pool it belongs to (`[[fallback]]`), if any.
        "pool": server.spill_pool(),
        // Its part in a disaggregated fleet.
        "role": server.role().role.as_str(),
        "disaggregation": server.role().connector.map(|c| c.as_str()),
        "bootstrap_port": server.role().bootstrap_port,
        "dp_rank": server.role().dp_rank,
        "adapters": server.adapters(),
        "adapter_loads": server.adapter_counts(),
        "load_source": server.load_source(),
        "kv_events": kv_events_json(server),
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

/// A server's engine KV event feed: where it is, what it has applied, what went wrong.
fn kv_events_json(server: &Server) -> serde_json::Value {
    let (Some((spec, tokenizer)), Some(report)) = (server.engine_feed_spec(), server.engine_feed())
    else {
        return serde_json::Value::Null;
    };
    let (blocks, live) = server.reported_cache();
    json!({
        "endpoint": spec.endpoint,
        "replay": spec.replay,
        "format": spec.format.name(),
        "tokenizer": tokenizer.map(|t| t.to_string()),
        "live": live,
        "blocks": blocks,
        "feed": report,
    })
}

/// What `/admin/servers` shows of a server's TLS and credentials.
fn access_json(
    address: &ringmaster_config::ServerAddress,
    access: &ringmaster_config::ServerAccess,
) -> serde_json::Value {
    json!({
        "tls": matches!(address, ringmaster_config::ServerAddress::Remote { tls: true, .. }),
        "ca_file": access.ca_file.as_ref().map(|p| p.display().to_string()),
        "client_cert": access.client_cert.as_ref().map(|(c, _)| c.display().to_string()),
        "api_key_env": access.api_key.as_ref().map(|(var, _)| var.as_str()),
        "headers": access.headers.iter().map(|(name, _)| name.as_str()).collect::<Vec<_>>(),
    })
}

/// `POST /admin/servers`: the server starts at once (on every replica, in a cluster).
pub(crate) async fn add_server(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let everywhere = matches!(
        crate::query_param(&req, "wait").as_deref(),
        Some("true" | "1")
    );
    let body = read_any_json_body(gateway, req).await?;
    let raw: RawServer = parse_json(&body)?;
    if raw.headers.is_some() {
        // The body is kept (the cluster's log, every replica's): no secret may be in it.
        return Err(ApiError::invalid(
            "headers: a server's extra headers may carry secrets and an added server's body is \
             kept in the change log; give them in the configuration file, or the key by \
             api_key_env (a variable's name, read by each replica)",
        ));
    }
    // Checked here, so that a server that cannot be added never reaches the log.
    let spec = ringmaster_config::server_spec(&raw).map_err(ApiError::invalid)?;
    let server: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| ApiError::invalid(format!("server: {e}")))?;
    let done = make(
        gateway,
        applier,
        Change::AddServer { server },
        None,
        everywhere,
    )
    .await?;
    let snapshot = gateway.pool().snapshot();
    let server = snapshot
        .server(&spec.id)
        .ok_or_else(|| ApiError::internal(format!("server {:?} was added but is gone", spec.id)))?;
    let mut answer = server_json(server);
    done_fields(&mut answer, &done);
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// `DELETE /admin/servers/{id}`: the server drains, then leaves.
pub(crate) async fn remove_server(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    id: String,
    everywhere: bool,
) -> Result<Response<ResponseBody>, ApiError> {
    let done = make(
        gateway,
        applier,
        Change::RemoveServer { id: id.clone() },
        None,
        everywhere,
    )
    .await?;
    let snapshot = gateway.pool().snapshot();
    let mut answer = match snapshot.draining.iter().find(|s| s.id() == id) {
        Some(server) => server_json(server),
        // Already drained and gone.
        None => json!({ "id": id, "state": "removed" }),
    };
    done_fields(&mut answer, &done);
    Ok(json_response(StatusCode::OK, &answer))
}
