//! Who may call the admin API, and what they did: the operator token a call presents (as
//! `Authorization: Bearer TOKEN` or `x-admin-token`, compared by SHA-256 digest in constant
//! time, never logged), the scope its call needs ([`scope_of`]), and the audit trail of every
//! change (`GET /admin/audit`): who (the token's name), what (method, path and query), when,
//! how it ended (the status) and, in a cluster, the revision the fleet was at after it. A
//! gateway alone keeps the last [`KEPT`] entries in memory; a cluster keeps the fleet's in
//! Redis beside the configuration log, so every replica answers with every replica's changes.

use std::collections::VecDeque;
use std::sync::Mutex;

use http::{HeaderMap, Method};
use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_config::{AdminToken, Scope, key_digest};
use ringmaster_gateway::Gateway;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use subtle::ConstantTimeEq;
use tracing::{info, warn};

/// Audit entries a gateway alone keeps.
pub const KEPT: usize = 1_000;

/// The token `headers` present, among `tokens` (401 when none matches).
pub(crate) fn caller<'t>(
    tokens: &'t [AdminToken],
    headers: &HeaderMap,
) -> Result<&'t AdminToken, ApiError> {
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .or_else(|| headers.get("x-admin-token").and_then(|v| v.to_str().ok()))
        .map(|p| key_digest(p.trim()));
    let unknown = || {
        ApiError::new(
            ErrorKind::Authentication,
            "admin API: missing or wrong admin token (Authorization: Bearer TOKEN)",
        )
    };
    let presented = presented.ok_or_else(unknown)?;
    // Every token is compared (no early exit), each without one on the first differing byte.
    let mut found = None;
    for token in tokens {
        if bool::from(token.digest.ct_eq(&presented)) {
            found = Some(token);
        }
    }
    found.ok_or_else(unknown)
}

/// The scope a call needs: `read` to look (every `GET`, and explaining a route), `policies`
/// to upload a component (a `PUT` of one to a policy slot), `operate` for every other change.
pub(crate) fn scope_of(method: &Method, path: &str, has_body: bool) -> Scope {
    match (method, path) {
        (&Method::GET | &Method::HEAD, _) | (&Method::POST, "/admin/route/explain") => Scope::Read,
        (
            &Method::PUT,
            "/admin/policies/router"
            | "/admin/policies/admission"
            | "/admin/policies/safety-filter",
        ) if has_body => Scope::Policies,
        _ => Scope::Operate,
    }
}

/// 403 naming the scope `token` lacks for `method path`.
pub(crate) fn check(
    token: &AdminToken,
    scope: Scope,
    method: &Method,
    path: &str,
) -> Result<(), ApiError> {
    if token.may(scope) {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorKind::PermissionDenied,
        format!(
            "admin API: the token {:?} lacks the scope \"{}\" that {method} {path} needs (it has {})",
            token.name,
            scope.as_str(),
            token
                .scopes
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    ))
}

/// One change, as the trail keeps it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// When it was answered, ms since the Unix epoch.
    pub at_ms: u64,
    /// The token's name.
    pub token: String,
    /// `POST`, `PUT`, `DELETE`.
    pub method: String,
    /// The path and its query.
    pub path: String,
    /// The answer's status.
    pub status: u16,
    /// The replica that made it (in a cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// The revision this replica had applied once it answered (in a cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
}

/// The trail of a gateway alone (a cluster's is in Redis).
#[derive(Debug, Default)]
pub struct Audit {
    recent: Mutex<VecDeque<AuditEntry>>,
}

impl Audit {
    /// Records a change: a log line (`admin.audit`), and the entry in the trail.
    pub(crate) async fn record(&self, gateway: &Gateway, mut entry: AuditEntry) {
        if let Some(cluster) = gateway.cluster() {
            entry.replica = Some(cluster.replica().to_owned());
            entry.revision = Some(cluster.applied().get());
        }
        info!(
            token = %entry.token,
            method = %entry.method,
            path = %entry.path,
            status = entry.status,
            revision = ?entry.revision,
            "admin.audit"
        );
        if let Some(cluster) = gateway.cluster() {
            let text = serde_json::to_string(&entry).unwrap_or_default();
            if let Err(e) = cluster.push_audit(&text).await {
                warn!(error = %e, "admin.audit_not_kept");
            }
        }
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if recent.len() == KEPT {
            recent.pop_back();
        }
        recent.push_front(entry);
    }

    /// `GET /admin/audit`: the newest `limit` changes, newest first (the fleet's in a cluster).
    pub(crate) async fn list(&self, gateway: &Gateway, limit: usize) -> Result<Value, ApiError> {
        let entries: Vec<AuditEntry> = match gateway.cluster() {
            Some(cluster) => cluster
                .audit(limit)
                .await
                .map_err(|e| {
                    ApiError::new(
                        ErrorKind::Unavailable,
                        format!("the fleet's audit trail cannot be read: {e}"),
                    )
                })?
                .iter()
                .filter_map(|text| serde_json::from_str(text).ok())
                .collect(),
            None => self
                .recent
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .iter()
                .take(limit)
                .cloned()
                .collect(),
        };
        Ok(json!({ "entries": entries }))
    }
}

/// Now, ms since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(name: &str, secret: &str, scopes: &[Scope]) -> AdminToken {
        AdminToken {
            name: name.into(),
            digest: key_digest(secret),
            scopes: scopes.to_vec(),
        }
    }

    #[test]
    fn a_call_is_matched_to_its_token_and_needs_the_scope_of_what_it_does() {
        let tokens = [
            token("dashboards", "read-only-secret-0001", &[Scope::Read]),
            token(
                "ops",
                "operator-secret-00002",
                &[Scope::Read, Scope::Operate],
            ),
        ];
        let mut headers = HeaderMap::new();
        assert!(caller(&tokens, &headers).is_err());
        headers.insert(
            "authorization",
            "Bearer operator-secret-00002".parse().unwrap(),
        );
        assert_eq!(caller(&tokens, &headers).unwrap().name, "ops");
        headers.insert(
            "authorization",
            "Bearer nope-nope-nope-nope".parse().unwrap(),
        );
        assert!(caller(&tokens, &headers).is_err());
        let mut headers = HeaderMap::new();
        headers.insert("x-admin-token", "read-only-secret-0001".parse().unwrap());
        let dashboards = caller(&tokens, &headers).unwrap();
        assert_eq!(dashboards.name, "dashboards");

        assert_eq!(scope_of(&Method::GET, "/admin/servers", false), Scope::Read);
        assert_eq!(
            scope_of(&Method::POST, "/admin/route/explain", true),
            Scope::Read
        );
        assert_eq!(
            scope_of(&Method::POST, "/admin/servers", true),
            Scope::Operate
        );
        assert_eq!(
            scope_of(&Method::PUT, "/admin/policies/router", true),
            Scope::Policies
        );
        // A weight-only PUT uploads nothing.
        assert_eq!(
            scope_of(&Method::PUT, "/admin/policies/router", false),
            Scope::Operate
        );
        assert_eq!(
            scope_of(&Method::DELETE, "/admin/servers/gpu-0", false),
            Scope::Operate
        );
        let refused =
            check(dashboards, Scope::Operate, &Method::POST, "/admin/servers").unwrap_err();
        assert_eq!(refused.kind().status().as_u16(), 403);
        assert!(
            refused.message().contains("\"operate\""),
            "{}",
            refused.message()
        );
        assert!(check(dashboards, Scope::Read, &Method::GET, "/admin/servers").is_ok());
    }
}
