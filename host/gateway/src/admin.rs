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

use ringmaster_api::{ApiError, Door, ErrorKind, read_json as parse_json};
use ringmaster_policy_engine::StateMode;
use ringmaster_pool::{PoolError, Server};
use subtle::ConstantTimeEq;

use crate::Gateway;
use crate::auth::Caller;
use crate::body::ResponseBody;
use crate::call::{Call, CallInput};
use crate::config::RawServer;
use crate::experiment_stats::{self, summarize};
use crate::policy::{SlotError, Variant};
use crate::respond::{json_response, read_json_body};

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
            Ok(json_response(StatusCode::OK, &experiments_json(gateway)))
        }
        (Method::PUT, "/admin/policies/router") => put_router(gateway, req).await,
        (Method::DELETE, "/admin/policies/router") => {
            let variant = query_param(&req, "variant")
                .ok_or_else(|| ApiError::invalid("variant: query parameter required"))?;
            gateway.router.remove(&variant).map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::POST, "/admin/policies/router/rollback") => {
            let variant = query_param(&req, "variant")
                .ok_or_else(|| ApiError::invalid("variant: query parameter required"))?;
            gateway.router.rollback(&variant).map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::PUT, "/admin/policies/admission") => {
            let slot = gateway.admission.clone();
            put_single(gateway, req, move |name, bytes| {
                slot.slot.install(name, bytes, None)
            })
            .await
        }
        (Method::PUT, "/admin/policies/safety-filter") => {
            let slot = gateway.safety.clone();
            put_single(gateway, req, move |name, bytes| {
                slot.slot.install(name, bytes, None)
            })
            .await
        }
        (Method::POST, "/admin/policies/admission/rollback") => {
            gateway.admission.slot.rollback().map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::POST, "/admin/policies/safety-filter/rollback") => {
            gateway.safety.slot.rollback().map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::DELETE, "/admin/policies/admission") => {
            gateway.admission.slot.remove().map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::DELETE, "/admin/policies/safety-filter") => {
            gateway.safety.slot.remove().map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (
            _,
            "/admin/policies/router"
            | "/admin/policies/admission"
            | "/admin/policies/safety-filter"
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

/// `/admin/record`: the traffic recording's state, after switching it on or off when asked.
/// Only the file named in the config (`[record] path`) is ever written: the admin API cannot
/// choose where the gateway writes.
fn record_json(
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

fn presented_token_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-admin-token").and_then(|v| v.to_str().ok()));
    // `subtle` compares without an early exit on the first differing byte.
    presented.is_some_and(|p| bool::from(p.trim().as_bytes().ct_eq(token.as_bytes())))
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
    let spec = crate::config::server_spec(&raw).map_err(ApiError::invalid)?;
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
        PoolError::Model { .. } => ApiError::invalid(error.to_string()),
    }
}

/// `POST /admin/route/explain`: a request's routing decision, nothing run. The body goes
/// through the request path's own prepare phase (the door's parser, the configured session
/// headers, the model's pool, the routing key and prefix hashes, the request as policies see
/// it) and the router slot's own variant pick, policy call and carrying-out, with nothing
/// counted. `?door=chat|completions` explains an OpenAI body (Messages by default);
/// `?tier=T` the decision for a caller of tier `T`.
async fn explain(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let door = match query_param(&req, "door").as_deref() {
        None | Some("messages") => Door::Messages,
        Some("chat") => Door::Chat,
        Some("completions") => Door::Completions,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "door: {other:?} is not one of \"messages\", \"chat\", \"completions\""
            )));
        }
    };
    let tier = query_param(&req, "tier").unwrap_or_else(|| "anonymous".to_owned());
    let session = crate::doors::session_header(req.headers(), &gateway.config.session_headers)?;
    let passed_headers =
        crate::doors::passed_headers(req.headers(), &gateway.config.policies.pass_headers);
    let body = read_json_body(gateway, req).await?;
    let input = CallInput {
        door,
        body,
        session,
        caller: Caller::unlimited(&tier, "admin-explain"),
        passed_headers,
        queue_timeout: None,
        streamed: None,
    };
    let call = Call::prepare(gateway, input, std::time::Instant::now(), "explain")?;
    let snapshot = &call.pool;
    let explained = gateway.router.explain(
        &gateway.pool,
        snapshot,
        (&call.input, call.chat()),
        &call.policy,
    );
    if let Some(reason) = &explained.rejected {
        return Err(ApiError::new(
            ErrorKind::Overloaded,
            format!("the router policy would decline the request: {reason}"),
        ));
    }
    let decision = explained
        .decision
        .ok_or_else(|| ApiError::new(ErrorKind::Overloaded, "no GPU servers in the pool"))?;
    let input = &call.input;
    let prefix_matches: Vec<_> =
        crate::policy::prefix_matches(snapshot, gateway.pool.prefixes(), (input, call.chat()))
            .into_iter()
            .map(|m| {
                json!({
                    "server": m.server,
                    "hashes": m.hashes,
                    "tokens": m.tokens,
                    "source": m.source.as_str(),
                })
            })
            .collect();
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
    let preferred = decision.preferred.as_ref().map_or("?", |s| s.id());
    let why = match (decision.reason, &explained.fault) {
        (_, Some(fault)) => format!(
            "the router policy faulted ({}); the host's ring decided instead",
            fault.kind()
        ),
        (ringmaster_pool::DecisionReason::Affinity, None) => {
            "the routing key's owner on the ring is under its bounded-load cap".to_owned()
        }
        (ringmaster_pool::DecisionReason::BoundedLoadSpill, None) => format!(
            "the key's owner {preferred} is at its bounded-load cap; the next server clockwise under its cap takes it"
        ),
        (ringmaster_pool::DecisionReason::RoundRobin, None) => {
            "round-robin: the next server in turn".to_owned()
        }
        (ringmaster_pool::DecisionReason::Policy, None) => {
            "the router policy chose this server, under its bounded-load cap".to_owned()
        }
        (ringmaster_pool::DecisionReason::PolicyOverCap, None) => format!(
            "the router policy chose {preferred}, which is at its bounded-load cap; the ring spilled it onward"
        ),
        (ringmaster_pool::DecisionReason::Failover, None) => format!(
            "{preferred} is unreachable or ejected; the next routable server on the ring takes it"
        ),
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "router": explained.variant.as_ref().map_or_else(
                || "native ring".to_owned(),
                |v| format!("{} ({})", v.name, v.policy.info().hash),
            ),
            "variant": explained.variant.as_ref().map(|v| v.name.to_string()),
            "policy_chose": explained.chosen,
            "routing_key": {
                "source": input.source.as_str(),
                "hash": format!("{:016x}", input.key),
            },
            "prefix_hashes": input.prefix_hashes.len(),
            "prefix_matches": prefix_matches,
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

/// Largest component accepted by `PUT /admin/policies/…` (Python and JavaScript components
/// run to 20 MB).
const MAX_COMPONENT_BYTES: usize = 64 * 1024 * 1024;

fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| value.to_owned())
    })
}

fn slot_error(error: SlotError) -> ApiError {
    match error {
        SlotError::UnknownVariant(_) => ApiError::not_found(error.to_string()),
        SlotError::Policy(_) | SlotError::NoPreviousVersion(_) | SlotError::Invalid(_) => {
            ApiError::invalid(error.to_string())
        }
    }
}

/// The request body as component bytes, under [`MAX_COMPONENT_BYTES`].
async fn component_bytes(req: Request<Incoming>) -> Result<bytes::Bytes, ApiError> {
    use http_body_util::{BodyExt, Limited};
    Ok(Limited::new(req.into_body(), MAX_COMPONENT_BYTES)
        .collect()
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorKind::RequestTooLarge,
                format!("components are limited to {MAX_COMPONENT_BYTES} bytes"),
            )
        })?
        .to_bytes())
}

/// Runs a load (compile, pre-instantiate, probe) off the async threads and answers with the
/// slots' state, whether anything changed and how long the load took.
async fn load_and_answer(
    gateway: &Arc<Gateway>,
    load: impl FnOnce() -> Result<bool, SlotError> + Send + 'static,
) -> Result<Response<ResponseBody>, ApiError> {
    let started = std::time::Instant::now();
    let changed = tokio::task::spawn_blocking(load)
        .await
        .map_err(|e| ApiError::internal(format!("policy load task failed: {e}")))?
        .map_err(slot_error)?;
    let mut body = policies_json(gateway);
    body["changed"] = json!(changed);
    body["load_ms"] = json!(started.elapsed().as_secs_f64() * 1000.0);
    Ok(json_response(StatusCode::OK, &body))
}

/// `PUT /admin/policies/router?variant=NAME[&weight=N][&shadow=true][&state=keep|fresh]` with
/// the component's bytes as the body: creates the variant or swaps its version. `state`
/// (default `keep`) says whether the new version keeps the variant's `state` store.
async fn put_router(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let variant = query_param(&req, "variant").unwrap_or_else(|| "default".to_owned());
    let weight = match query_param(&req, "weight") {
        None => None,
        Some(w) => Some(
            w.parse::<u32>()
                .ok()
                .filter(|w| *w <= 1_000_000)
                .ok_or_else(|| {
                    ApiError::invalid(format!("weight: {w:?} is not a whole number up to 1000000"))
                })?,
        ),
    };
    let shadow = matches!(query_param(&req, "shadow").as_deref(), Some("true" | "1"));
    let state = match query_param(&req, "state") {
        None => StateMode::Keep,
        Some(text) => StateMode::parse(&text).ok_or_else(|| {
            ApiError::invalid(format!(
                "state: {text:?} is neither `keep` (the new version keeps the variant's state \
                 store) nor `fresh` (it starts with an empty one)"
            ))
        })?,
    };
    let bytes = component_bytes(req).await?;
    let router = gateway.router.clone();
    load_and_answer(gateway, move || {
        router.install_with_state(&variant, &bytes, weight, shadow, None, state)
    })
    .await
}

/// `PUT /admin/policies/{admission|safety-filter}[?name=NAME]` with the component's bytes:
/// swaps the slot's version (the name defaults to the installed one, else the slot's).
async fn put_single(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    install: impl FnOnce(&str, &[u8]) -> Result<bool, SlotError> + Send + 'static,
) -> Result<Response<ResponseBody>, ApiError> {
    let slot = req.uri().path().trim_start_matches("/admin/policies/");
    let current = match slot {
        "admission" => gateway.admission.slot.current().map(|c| c.name.to_string()),
        _ => gateway.safety.slot.current().map(|c| c.name.to_string()),
    };
    let default_name = if slot == "admission" {
        "admission"
    } else {
        "safety"
    };
    let name = query_param(&req, "name")
        .or(current)
        .unwrap_or_else(|| default_name.to_owned());
    let bytes = component_bytes(req).await?;
    load_and_answer(gateway, move || install(&name, &bytes)).await
}

/// A single slot's state for `GET /admin/policies`.
fn single_json<P: crate::slot::SlotPolicy>(slot: &crate::slot::PolicySlot<P>) -> serde_json::Value {
    let Some(installed) = slot.current() else {
        return serde_json::Value::Null;
    };
    let mut entry = policy_json(
        &installed.name,
        installed.policy.info(),
        installed.policy.faults(),
        installed
            .history
            .iter()
            .map(|p| p.info().hash.clone())
            .collect(),
    );
    entry["config"] = json!(installed.config);
    entry
}

fn policy_json(
    name: &str,
    info: &ringmaster_policy_engine::PolicyInfo,
    faults: ringmaster_policy_engine::FaultCounts,
    previous: Vec<String>,
) -> serde_json::Value {
    json!({
        "name": name,
        "hash": info.hash,
        "size": info.size,
        "loaded_at": humantime_secs(info.loaded_at),
        "faults": {
            "trap": faults.trap,
            "deadline": faults.deadline,
            "memory": faults.memory,
            "invalid_answer": faults.invalid_answer,
            "instantiate": faults.instantiate,
        },
        "previous_versions": previous,
    })
}

fn variant_json(variant: &Variant, shadow: bool) -> serde_json::Value {
    let mut entry = policy_json(
        &variant.name,
        variant.policy.info(),
        variant.policy.faults(),
        variant
            .history
            .iter()
            .map(|p| p.info().hash.clone())
            .collect(),
    );
    entry["shadow"] = json!(shadow);
    entry["weight"] = json!(variant.weight);
    entry["config"] = json!(variant.config);
    entry["contract"] = json!(variant.policy.contract());
    entry["learns"] = json!(variant.policy.learns());
    let state = variant.policy.state_usage();
    entry["state"] = json!({
        "entries": state.entries,
        "bytes": state.bytes,
        "max_entries": state.max_entries,
        "max_bytes": state.max_bytes,
    });
    entry
}

fn humantime_secs(at: std::time::SystemTime) -> f64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn policies_json(gateway: &Gateway) -> serde_json::Value {
    let set = gateway.router.current();
    json!({
        "router": {
            "variants": set.variants.iter().map(|v| variant_json(v, false)).collect::<Vec<_>>(),
            "shadow": set.shadow.as_ref().map(|v| variant_json(v, true)),
            "native_fallback": gateway.pool.strategy().as_str(),
        },
        "admission": {
            "policy": single_json(&gateway.admission.slot),
            "queued": gateway.admission.queued(),
            "queue_capacity": gateway.admission.queue_capacity(),
        },
        "safety_filter": {
            "policy": single_json(&gateway.safety.slot),
        },
    })
}

fn experiments_json(gateway: &Gateway) -> serde_json::Value {
    use std::sync::atomic::Ordering::Relaxed;
    let set = gateway.router.current();
    let summaries: Vec<_> = set
        .variants
        .iter()
        .map(|v| {
            let samples = v.stats.ttft_samples();
            let summary = summarize(&samples);
            (samples, summary)
        })
        .collect();
    let control = summaries.first();
    let variants: Vec<_> = set
        .variants
        .iter()
        .zip(&summaries)
        .enumerate()
        .map(|(i, (variant, (samples, summary)))| {
            let stats = &variant.stats;
            let requests = stats.requests.load(Relaxed);
            let prompt = stats.prompt_tokens.load(Relaxed);
            let mut entry = json!({
                "name": &*variant.name,
                "weight": variant.weight,
                "hash": variant.policy.info().hash,
                "requests": requests,
                "errors": stats.errors.load(Relaxed),
                "error_rate": if requests == 0 { 0.0 } else { stats.errors.load(Relaxed) as f64 / requests as f64 },
                "faults": stats.faults.load(Relaxed),
                "prefix_cache_hit_ratio": if prompt == 0 { 0.0 } else { stats.cached_tokens.load(Relaxed) as f64 / prompt as f64 },
                "ttft_seconds": summary.as_ref().map(|s| json!({"samples": s.n, "mean": s.mean, "p50": s.p50, "p99": s.p99})),
            });
            if i > 0
                && let Some((control_samples, Some(a))) = control
                && let Some(b) = summary.as_ref()
            {
                let verdict = experiment_stats::verdict(a, b);
                entry["ttft_vs_control"] = json!({
                    "control": &*set.variants[0].name,
                    "samples": [a.n, b.n],
                    "verdict": verdict,
                    "mean_difference_seconds": b.mean - a.mean,
                    // Valid however often it is read (the verdict comes from it).
                    "always_valid_ci95": experiment_stats::always_valid(a, b),
                    // Valid for one look at a fixed sample size.
                    "welch": experiment_stats::welch(a, b),
                    "p50_difference_ci95": experiment_stats::bootstrap_quantile_difference(control_samples, samples, 0.5),
                    "p99_difference_ci95": experiment_stats::bootstrap_quantile_difference(control_samples, samples, 0.99),
                    "method": "verdict from the always-valid interval (mixture SPRT, Johari et al. 2017) once both arms have 30 samples; Welch with Satterthwaite df for a single look; percentile bootstrap for p50 and p99",
                });
            }
            if i > 0 {
                let control_stats = &set.variants[0].stats;
                let ratio = |s: &crate::policy::VariantStats| {
                    let prompt = s.prompt_tokens.load(Relaxed);
                    (prompt > 0).then(|| s.cached_tokens.load(Relaxed) as f64 / prompt as f64)
                };
                let (control_cache, cache) = (control_stats.cache_samples(), stats.cache_samples());
                entry["hit_ratio_vs_control"] = json!({
                    "control": &*set.variants[0].name,
                    "difference": ratio(stats).zip(ratio(control_stats)).map(|(b, a)| b - a),
                    // For one look, over the last requests of each arm (the TTFT window).
                    "ci95": experiment_stats::bootstrap_hit_ratio_difference(&control_cache, &cache),
                    // Valid however often it is read: the mean per-request hit fraction.
                    "per_request_always_valid_ci95":
                        experiment_stats::always_valid_hit_fraction(&control_cache, &cache),
                    "method": "ci95: percentile bootstrap over requests of the token-weighted hit ratio (sum cached / sum prompt), for one look, once both arms have 30 requests; per_request_always_valid_ci95: mixture SPRT (as for TTFT) on the difference of the mean per-request hit fraction, valid at every look",
                });
            }
            entry
        })
        .collect();
    let shadow = set.shadow.as_ref().map(|shadow| {
        let decisions = shadow.stats.shadow_decisions.load(Relaxed);
        let agreements = shadow.stats.shadow_agreements.load(Relaxed);
        json!({
            "name": &*shadow.name,
            "hash": shadow.policy.info().hash,
            "decisions": decisions,
            "agreement_rate": if decisions == 0 { 0.0 } else { agreements as f64 / decisions as f64 },
            "faults": shadow.stats.faults.load(Relaxed),
            "would_be_load": shadow.stats.shadow_load(),
        })
    });
    json!({ "variants": variants, "shadow": shadow })
}
