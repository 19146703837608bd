//! Ringmaster's admin API: every `/admin/…` handler, mounted into a gateway at start
//! ([`mount`]). It changes the gateway only through the gateway's own parts (the pool's
//! membership, the policy slots, the recorder), and explains a decision by running the
//! request path's own prepare phase and router ([`explain`]), never a copy of them.
//!
//! It is off unless an admin token is configured (`admin_token` or `RINGMASTER_ADMIN_TOKEN`);
//! every call must present it as `Authorization: Bearer TOKEN` or `x-admin-token`. The token
//! is compared in constant time (`subtle`) and never logged. Nothing here holds a lock
//! across an await.
//!
//! - [`servers`]: `GET|POST /admin/servers`, `DELETE /admin/servers/{id}`, `/admin/record`;
//! - [`policies`]: `GET /admin/policies`, `PUT|POST|DELETE /admin/policies/…`;
//! - [`experiments`]: `GET /admin/experiments`;
//! - [`explain`]: `POST /admin/route/explain`.

#![deny(missing_docs)]

pub mod experiments;
pub mod explain;
pub mod policies;
pub mod servers;

use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_gateway::respond::json_response;
use ringmaster_gateway::{Gateway, ResponseBody};
use subtle::ConstantTimeEq;

use crate::experiments::experiments_json;
use crate::explain::explain;
use crate::policies::{policies_json, put_router, put_single, slot_error};
use crate::servers::{add_server, record_json, remove_server, servers_json};

/// The admin API as a gateway's `/admin/` routes.
#[derive(Debug)]
pub struct Admin;

impl ringmaster_gateway::AdminRoutes for Admin {
    fn handle<'a>(
        &'a self,
        gateway: &'a Arc<Gateway>,
        req: Request<Incoming>,
    ) -> ringmaster_gateway::AdminFuture<'a> {
        Box::pin(handle(gateway, req))
    }
}

/// Mounts the admin API on `gateway`.
pub fn mount(gateway: &Gateway) {
    gateway.mount_admin(Arc::new(Admin));
}

/// Handles `/admin/…`.
pub async fn handle(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let Some(token) = gateway.config().admin_token.as_deref() else {
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
            gateway.router().remove(&variant).map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::POST, "/admin/policies/router/rollback") => {
            let variant = query_param(&req, "variant")
                .ok_or_else(|| ApiError::invalid("variant: query parameter required"))?;
            gateway.router().rollback(&variant).map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::PUT, "/admin/policies/admission") => {
            let slot = gateway.admission().clone();
            put_single(gateway, req, move |name, bytes| {
                slot.slot.install(name, bytes, None)
            })
            .await
        }
        (Method::PUT, "/admin/policies/safety-filter") => {
            let slot = gateway.safety().clone();
            put_single(gateway, req, move |name, bytes| {
                slot.slot.install(name, bytes, None)
            })
            .await
        }
        (Method::POST, "/admin/policies/admission/rollback") => {
            gateway.admission().slot.rollback().map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::POST, "/admin/policies/safety-filter/rollback") => {
            gateway.safety().slot.rollback().map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::DELETE, "/admin/policies/admission") => {
            gateway.admission().slot.remove().map_err(slot_error)?;
            Ok(json_response(StatusCode::OK, &policies_json(gateway)))
        }
        (Method::DELETE, "/admin/policies/safety-filter") => {
            gateway.safety().slot.remove().map_err(slot_error)?;
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
fn presented_token_matches(headers: &http::HeaderMap, token: &str) -> bool {
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-admin-token").and_then(|v| v.to_str().ok()));
    // `subtle` compares without an early exit on the first differing byte.
    presented.is_some_and(|p| bool::from(p.trim().as_bytes().ct_eq(token.as_bytes())))
}

/// A query parameter's value.
fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.uri().query()?.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        (key == name).then(|| value.to_owned())
    })
}
