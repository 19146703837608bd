//! The policy slots: `GET /admin/policies` (every slot's versions, faults and history), and
//! loading, swapping, rolling back and removing router variants, the shadow, the admission
//! policy and the safety filter. A load (compile, pre-instantiate, probe) runs off the async
//! threads.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::ApiError;
use ringmaster_gateway::respond::{json_response, read_body_under};
use ringmaster_gateway::{Gateway, ResponseBody};
use ringmaster_policy_engine::StateMode;
use ringmaster_slots::router::Variant;
use ringmaster_slots::single::{PolicySlot, SlotPolicy};
use serde_json::json;

use crate::changes::{Applier, Change, done_fields, make};
use crate::query_param;

/// Largest component accepted by `PUT /admin/policies/…` (Python and JavaScript components
/// run to 20 MB).
const MAX_COMPONENT_BYTES: usize = 64 * 1024 * 1024;

/// The request body as component bytes, under [`MAX_COMPONENT_BYTES`] and the body read
/// timeout.
pub(crate) async fn component_bytes(
    gateway: &Gateway,
    req: Request<Incoming>,
) -> Result<bytes::Bytes, ApiError> {
    read_body_under(
        gateway,
        req,
        MAX_COMPONENT_BYTES,
        "components are limited to",
    )
    .await
}

/// Makes a policy change and answers with the slots' state, whether anything changed, how
/// long it took, and in a cluster its revision (and with `?wait=true`, whether every live
/// replica applied it).
pub(crate) async fn policy_change(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    change: Change,
    bytes: Option<bytes::Bytes>,
    everywhere: bool,
) -> Result<Response<ResponseBody>, ApiError> {
    let started = std::time::Instant::now();
    let done = make(gateway, applier, change, bytes, everywhere).await?;
    let mut body = policies_json(gateway);
    body["changed"] = json!(done.changed);
    body["load_ms"] = json!(started.elapsed().as_secs_f64() * 1000.0);
    done_fields(&mut body, &done);
    Ok(json_response(StatusCode::OK, &body))
}

/// A weight: a whole number up to 1,000,000.
pub(crate) fn parse_weight(text: &str) -> Result<u32, ApiError> {
    text.parse::<u32>()
        .ok()
        .filter(|w| *w <= 1_000_000)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "weight: {text:?} is not a whole number up to 1000000"
            ))
        })
}

/// `PUT /admin/policies/router?variant=NAME[&weight=N][&shadow=true][&state=keep|fresh]` with
/// the component's bytes as the body: creates the variant or swaps its version. `state`
/// (default `keep`) says whether the new version keeps the variant's `state` store. With no
/// body, `weight` alone sets the variant's weight.
pub(crate) async fn put_router(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let variant = query_param(&req, "variant").unwrap_or_else(|| "default".to_owned());
    let weight = query_param(&req, "weight")
        .map(|w| parse_weight(&w))
        .transpose()?;
    let shadow = matches!(query_param(&req, "shadow").as_deref(), Some("true" | "1"));
    let everywhere = matches!(query_param(&req, "wait").as_deref(), Some("true" | "1"));
    let fresh_state = match query_param(&req, "state") {
        None => false,
        Some(text) => matches!(
            StateMode::parse(&text).ok_or_else(|| {
                ApiError::invalid(format!(
                    "state: {text:?} is neither `keep` (the new version keeps the variant's state \
                     store) nor `fresh` (it starts with an empty one)"
                ))
            })?,
            StateMode::Fresh
        ),
    };
    let plan = crate::rollout::plan_from_query(
        query_param(&req, "rollout"),
        query_param(&req, "step"),
        query_param(&req, "min_samples"),
    )?;
    if plan.is_some() && (shadow || weight.is_some()) {
        return Err(ApiError::invalid(
            "rollout: a rolling-out candidate's weight is the rollout's, and a shadow takes no \
             traffic; drop weight and shadow",
        ));
    }
    let bytes = component_bytes(gateway, req).await?;
    if bytes.is_empty() {
        // No component: a weight alone changes the variant's weight (what an operator who
        // sent `PUT …?variant=V&weight=W` meant); anything else needs the bytes.
        return match (weight, plan, shadow) {
            (Some(weight), None, false) => {
                let change = Change::SetRouterWeight { variant, weight };
                policy_change(gateway, applier, change, None, everywhere).await
            }
            _ => Err(ApiError::invalid(
                "the body must be the component's bytes (a .wasm file); to change only a \
                 variant's weight, send the weight alone (PUT or POST \
                 /admin/policies/router/weight?variant=V&weight=W)",
            )),
        };
    }
    let component = ringmaster_cluster::blobs::content_hash(&bytes);
    let change = match plan {
        Some(plan) => Change::StartRollout {
            variant,
            component,
            plan,
            at_ms: crate::rollout::now_ms(),
            fresh_state,
        },
        None => Change::PutRouter {
            variant,
            component,
            weight,
            shadow,
            fresh_state,
        },
    };
    policy_change(gateway, applier, change, Some(bytes), everywhere).await
}

/// `PUT /admin/policies/{admission|safety-filter}[?name=NAME]` with the component's bytes:
/// swaps the slot's version (the name defaults to the installed one, else the slot's).
pub(crate) async fn put_single(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let slot = req
        .uri()
        .path()
        .trim_start_matches("/admin/policies/")
        .to_owned();
    let current = match slot.as_str() {
        "admission" => gateway
            .admission()
            .slot
            .current()
            .map(|c| c.name.to_string()),
        _ => gateway.safety().slot.current().map(|c| c.name.to_string()),
    };
    let default_name = if slot == "admission" {
        "admission"
    } else {
        "safety"
    };
    let name = query_param(&req, "name")
        .or(current)
        .unwrap_or_else(|| default_name.to_owned());
    let everywhere = matches!(query_param(&req, "wait").as_deref(), Some("true" | "1"));
    let bytes = component_bytes(gateway, req).await?;
    let change = Change::PutSingle {
        slot,
        name,
        component: ringmaster_cluster::blobs::content_hash(&bytes),
    };
    policy_change(gateway, applier, change, Some(bytes), everywhere).await
}

/// A single slot's state for `GET /admin/policies`.
pub(crate) fn single_json<P: SlotPolicy>(slot: &PolicySlot<P>) -> serde_json::Value {
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

pub(crate) fn policy_json(
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

pub(crate) fn variant_json(variant: &Variant, shadow: bool) -> serde_json::Value {
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

pub(crate) fn humantime_secs(at: std::time::SystemTime) -> f64 {
    at.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Where a loaded version came from, for the listing: `builtin:NAME` when its bytes are a
/// built-in's, the file the config names for it (a file source is reloaded when it changes),
/// else `pushed` (through this API, or by another replica).
fn source_of(gateway: &Gateway, slot: &str, name: &str, hash: &str) -> String {
    use ringmaster_config::PolicySource;
    if let Some(builtin) = ringmaster_policy_engine::builtin::builtin_by_hash(hash) {
        return format!("builtin:{builtin}");
    }
    let policies = &gateway.config().policies;
    let configured = match slot {
        "router" => policies
            .router
            .iter()
            .find(|v| v.name == name)
            .map(|v| &v.source),
        "admission" => policies.admission.as_ref().map(|p| &p.source),
        _ => policies.safety.as_ref().map(|p| &p.source),
    };
    match configured {
        Some(PolicySource::File(path)) => path.display().to_string(),
        _ => "pushed".to_owned(),
    }
}

/// Adds `source` to a listed policy (`Null`: an empty slot).
fn with_source(gateway: &Gateway, slot: &str, mut entry: serde_json::Value) -> serde_json::Value {
    if let (Some(name), Some(hash)) = (entry["name"].as_str(), entry["hash"].as_str()) {
        entry["source"] = json!(source_of(gateway, slot, name, hash));
    }
    entry
}

pub(crate) fn policies_json(gateway: &Gateway) -> serde_json::Value {
    let set = gateway.router().current();
    let router = |v, shadow| with_source(gateway, "router", variant_json(v, shadow));
    json!({
        "router": {
            "variants": set.variants.iter().map(|v| router(v, false)).collect::<Vec<_>>(),
            "shadow": set.shadow.as_ref().map(|v| router(v, true)),
            "native_fallback": "consistent-hash",
        },
        "admission": {
            "policy": with_source(gateway, "admission", single_json(&gateway.admission().slot)),
            "queued": gateway.admission().queued(),
            "queue_capacity": gateway.admission().queue_capacity(),
        },
        "safety_filter": {
            "policy": with_source(gateway, "safety", single_json(&gateway.safety().slot)),
        },
    })
}
