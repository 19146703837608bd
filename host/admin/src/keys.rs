//! `/admin/keys` and `/admin/tenants`: API keys and tenants changed while the gateway runs
//! (scope `operate`; listing needs `read`). A new key is made here and shown once, in the
//! answer to its creation; only its SHA-256 travels on (the change log of a cluster, every
//! replica's table). Limits changed on a key or a tenant apply to the next request; the
//! buckets of what a change did not touch keep their state. The configuration file stays the
//! starting point: a restart without a cluster begins from it again.

use std::sync::Arc;

use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::read_json as parse_json;
use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_config::{ApiKey, RawApiKey, RawTenant, Tenant, key_digest, key_id};
use ringmaster_gateway::respond::{json_response, read_any_json_body};
use ringmaster_gateway::{Gateway, ResponseBody};
use ringmaster_tenancy::BookError;
use serde_json::json;

use crate::changes::{Applier, Change, done_fields, make};

/// A key as the admin API shows it: its id and label, never its digest.
fn key_json(key: &ApiKey, label: Option<&str>) -> serde_json::Value {
    json!({
        "id": key_id(&key.digest),
        "label": label,
        "tier": key.tier,
        "tenant": key.tenant,
        "models": key.models,
        "requests_per_minute": key.limits.requests_per_minute,
        "input_tokens_per_minute": key.limits.input_tokens_per_minute,
        "output_tokens_per_minute": key.limits.output_tokens_per_minute,
    })
}

fn tenant_json(tenant: &Tenant) -> serde_json::Value {
    json!({
        "name": tenant.name,
        "models": tenant.models,
        "fallback": tenant.fallback,
        "requests_per_minute": tenant.limits.requests_per_minute,
        "input_tokens_per_minute": tenant.limits.input_tokens_per_minute,
        "output_tokens_per_minute": tenant.limits.output_tokens_per_minute,
    })
}

/// `GET /admin/keys`.
pub(crate) fn list_keys(gateway: &Gateway) -> Response<ResponseBody> {
    let auth = gateway.keys().current();
    let keys: Vec<_> = auth
        .configured_keys()
        .iter()
        .map(|k| key_json(k, auth.label_of(&k.digest).as_deref()))
        .collect();
    json_response(StatusCode::OK, &json!({ "keys": keys }))
}

/// `GET /admin/tenants`.
pub(crate) fn list_tenants(gateway: &Gateway) -> Response<ResponseBody> {
    let tenants: Vec<_> = gateway
        .keys()
        .current()
        .configured_tenants()
        .iter()
        .map(tenant_json)
        .collect();
    json_response(StatusCode::OK, &json!({ "tenants": tenants }))
}

/// A new key: `sk-rm-` and 64 hex digits from the operating system's random source.
fn new_secret() -> String {
    format!(
        "sk-rm-{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// `POST /admin/keys`: a key with the body's tier, tenant, models and limits. The gateway
/// makes the key and answers it once; `key_sha256` registers a key made elsewhere instead.
pub(crate) async fn add_key(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    req: Request<Incoming>,
    everywhere: bool,
) -> Result<Response<ResponseBody>, ApiError> {
    let body = read_any_json_body(gateway, req).await?;
    let mut value: serde_json::Value = parse_json(&body)?;
    let fields = value
        .as_object_mut()
        .ok_or_else(|| ApiError::invalid("the body must be a JSON object"))?;
    if fields.contains_key("key") {
        return Err(ApiError::invalid(
            "key: the gateway makes the key and shows it once; send key_sha256 to register \
             one made elsewhere",
        ));
    }
    let secret = (!fields.contains_key("key_sha256")).then(new_secret);
    if let Some(secret) = &secret {
        fields.insert("key_sha256".into(), hex_digest(&key_digest(secret)).into());
    }
    let raw: RawApiKey = serde_json::from_value(value.clone())
        .map_err(|e| ApiError::invalid(format!("key: {e}")))?;
    let key = ringmaster_config::keys::api_key(
        "key",
        raw,
        &gateway.keys().current().configured_tenants(),
    )
    .map_err(|e| ApiError::invalid(e.to_string()))?;
    let done = make(
        gateway,
        applier,
        Change::PutKey { key: value },
        None,
        everywhere,
    )
    .await?;
    let label = gateway.keys().current().label_of(&key.digest);
    let mut answer = key_json(&key, label.as_deref());
    if let Some(secret) = secret {
        answer["key"] = secret.into();
    }
    done_fields(&mut answer, &done);
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// `DELETE /admin/keys/{id}`.
pub(crate) async fn remove_key(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    id: String,
) -> Result<Response<ResponseBody>, ApiError> {
    let keys = gateway.keys().current().configured_keys();
    if !keys.iter().any(|k| key_id(&k.digest) == id) {
        return Err(ApiError::not_found(format!("no API key has the id {id:?}")));
    }
    if keys.len() == 1 && !gateway.config().listen.ip().is_loopback() {
        return Err(ApiError::new(
            ErrorKind::Conflict,
            "this is the last API key and the gateway listens beyond loopback: without keys \
             it would serve anyone; add another key first",
        ));
    }
    let done = make(
        gateway,
        applier,
        Change::RemoveKey { id: id.clone() },
        None,
        false,
    )
    .await?;
    let mut answer = json!({ "id": id, "removed": done.changed });
    done_fields(&mut answer, &done);
    Ok(json_response(StatusCode::OK, &answer))
}

/// `POST /admin/tenants`: adds a tenant, or replaces the one of that name (its limits
/// apply to the next request).
pub(crate) async fn put_tenant(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let body = read_any_json_body(gateway, req).await?;
    let value: serde_json::Value = parse_json(&body)?;
    let raw: RawTenant = serde_json::from_value(value.clone())
        .map_err(|e| ApiError::invalid(format!("tenant: {e}")))?;
    let tenant = ringmaster_config::keys::tenant("tenant", raw)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let done = make(
        gateway,
        applier,
        Change::PutTenant { tenant: value },
        None,
        false,
    )
    .await?;
    let mut answer = tenant_json(&tenant);
    done_fields(&mut answer, &done);
    Ok(json_response(StatusCode::CREATED, &answer))
}

/// `DELETE /admin/tenants/{name}`: refused while keys belong to it.
pub(crate) async fn remove_tenant(
    gateway: &Arc<Gateway>,
    applier: Option<&Arc<Applier>>,
    name: String,
) -> Result<Response<ResponseBody>, ApiError> {
    let auth = gateway.keys().current();
    if !auth.configured_tenants().iter().any(|t| t.name == name) {
        return Err(ApiError::not_found(format!("no tenant is named {name:?}")));
    }
    let users = auth
        .configured_keys()
        .iter()
        .filter(|k| k.tenant.as_deref() == Some(name.as_str()))
        .count();
    if users > 0 {
        return Err(book_error(BookError::TenantInUse { name, keys: users }));
    }
    let done = make(
        gateway,
        applier,
        Change::RemoveTenant { name: name.clone() },
        None,
        false,
    )
    .await?;
    let mut answer = json!({ "name": name, "removed": done.changed });
    done_fields(&mut answer, &done);
    Ok(json_response(StatusCode::OK, &answer))
}

/// A refused change to the keys or tenants as the error an admin client gets.
pub(crate) fn book_error(error: BookError) -> ApiError {
    match error {
        BookError::UnknownTenant(_) => ApiError::invalid(error.to_string()),
        BookError::TenantInUse { .. } => ApiError::new(ErrorKind::Conflict, error.to_string()),
    }
}

/// Carries out a key or tenant change on `gateway` (this replica's table).
pub(crate) fn carry_out(gateway: &Gateway, change: &Change) -> Result<bool, ApiError> {
    let book = gateway.keys();
    match change {
        Change::PutKey { key } => {
            let raw: RawApiKey = serde_json::from_value(key.clone())
                .map_err(|e| ApiError::invalid(format!("key: {e}")))?;
            let key =
                ringmaster_config::keys::api_key("key", raw, &book.current().configured_tenants())
                    .map_err(|e| ApiError::invalid(e.to_string()))?;
            tracing::info!(key = %key_id(&key.digest), tenant = ?key.tenant, "keys.key_put");
            book.put_key(key).map_err(book_error)?;
            Ok(true)
        }
        Change::RemoveKey { id } => {
            let removed = book.remove_key(id);
            tracing::info!(key = %id, removed, "keys.key_removed");
            Ok(removed)
        }
        Change::PutTenant { tenant } => {
            let raw: RawTenant = serde_json::from_value(tenant.clone())
                .map_err(|e| ApiError::invalid(format!("tenant: {e}")))?;
            let tenant = ringmaster_config::keys::tenant("tenant", raw)
                .map_err(|e| ApiError::invalid(e.to_string()))?;
            tracing::info!(tenant = %tenant.name, "keys.tenant_put");
            book.put_tenant(tenant);
            Ok(true)
        }
        Change::RemoveTenant { name } => {
            let removed = book.remove_tenant(name).map_err(book_error)?;
            tracing::info!(tenant = %name, removed, "keys.tenant_removed");
            Ok(removed)
        }
        _ => Ok(false),
    }
}

fn hex_digest(digest: &[u8; 32]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}
