//! The policy slots: `GET /admin/policies` (every slot's versions, faults and history), and
//! loading, swapping, rolling back and removing router variants, the shadow, the admission
//! policy and the safety filter. A load (compile, pre-instantiate, probe) runs off the async
//! threads.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_gateway::policy::{SlotError, Variant};
use ringmaster_gateway::respond::json_response;
use ringmaster_gateway::slot::{PolicySlot, SlotPolicy};
use ringmaster_gateway::{Gateway, ResponseBody};
use ringmaster_policy_engine::StateMode;
use serde_json::json;

use crate::query_param;

/// Largest component accepted by `PUT /admin/policies/…` (Python and JavaScript components
/// run to 20 MB).
const MAX_COMPONENT_BYTES: usize = 64 * 1024 * 1024;

pub(crate) fn slot_error(error: SlotError) -> ApiError {
    match error {
        SlotError::UnknownVariant(_) => ApiError::not_found(error.to_string()),
        SlotError::Policy(_) | SlotError::NoPreviousVersion(_) | SlotError::Invalid(_) => {
            ApiError::invalid(error.to_string())
        }
    }
}

/// The request body as component bytes, under [`MAX_COMPONENT_BYTES`].
pub(crate) async fn component_bytes(req: Request<Incoming>) -> Result<bytes::Bytes, ApiError> {
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
pub(crate) async fn load_and_answer(
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
pub(crate) async fn put_router(
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
    let router = gateway.router().clone();
    load_and_answer(gateway, move || {
        router.install_with_state(&variant, &bytes, weight, shadow, None, state)
    })
    .await
}

/// `PUT /admin/policies/{admission|safety-filter}[?name=NAME]` with the component's bytes:
/// swaps the slot's version (the name defaults to the installed one, else the slot's).
pub(crate) async fn put_single(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    install: impl FnOnce(&str, &[u8]) -> Result<bool, SlotError> + Send + 'static,
) -> Result<Response<ResponseBody>, ApiError> {
    let slot = req.uri().path().trim_start_matches("/admin/policies/");
    let current = match slot {
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
    let bytes = component_bytes(req).await?;
    load_and_answer(gateway, move || install(&name, &bytes)).await
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

pub(crate) fn policies_json(gateway: &Gateway) -> serde_json::Value {
    let set = gateway.router().current();
    json!({
        "router": {
            "variants": set.variants.iter().map(|v| variant_json(v, false)).collect::<Vec<_>>(),
            "shadow": set.shadow.as_ref().map(|v| variant_json(v, true)),
            "native_fallback": "consistent-hash",
        },
        "admission": {
            "policy": single_json(&gateway.admission().slot),
            "queued": gateway.admission().queued(),
            "queue_capacity": gateway.admission().queue_capacity(),
        },
        "safety_filter": {
            "policy": single_json(&gateway.safety().slot),
        },
    })
}
