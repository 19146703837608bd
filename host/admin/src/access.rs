//! Who may call the admin API, and what they did: the operator token a call presents (as
//! `Authorization: Bearer TOKEN` or `x-admin-token`, compared by SHA-256 digest in constant
//! time, never logged), the scope its call needs ([`scope_of`]), and the audit trail of every
//! change (`GET /admin/audit`): who (the token's name, and the caller's address), what (method,
//! path and query, and the object it changed: server id and address, key id and tenant,
//! tenant, slot, variant, the component's content hash, the rollout), when, how it ended (the
//! status) and, in a cluster, the revision the change became. Calls refused for a missing or
//! wrong token (401) are recorded too, at most one entry per address every
//! [`REFUSALS_EVERY`] (each saying how many it stands for), so a flood of guesses cannot
//! flood the trail. A gateway alone keeps the last [`KEPT`] entries in memory; a cluster
//! keeps the fleet's in Redis beside the configuration log, so every replica answers with
//! every replica's changes.

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

/// At most one entry per address for calls refused for their token in this long.
pub const REFUSALS_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Addresses whose refusals are tracked at once; past it the oldest are forgotten.
const REFUSING_ADDRESSES: usize = 4_096;

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
    /// The token's name (`None`: the call presented no known token, and was refused 401).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The caller's address (`IP:port`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `POST`, `PUT`, `DELETE`.
    pub method: String,
    /// The path and its query.
    pub path: String,
    /// The answer's status.
    pub status: u16,
    /// What it changed (see `changes::describe`); several objects as a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<Value>,
    /// The replica that made it (in a cluster).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// The revision the change became in the fleet's configuration log (in a cluster; none
    /// for a change refused before it was logged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revision: Option<u64>,
    /// Refusals from this address this entry stands for beyond itself (401s are recorded at
    /// most once per [`REFUSALS_EVERY`] per address).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub also_refused: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl AuditEntry {
    /// An entry for `method path` by `token` from `address`, answered `status`, with what the
    /// call changed.
    pub(crate) fn new(
        (token, address): (Option<&str>, Option<std::net::SocketAddr>),
        (method, path): (&Method, String),
        status: u16,
        changed: crate::changes::Changed,
    ) -> Self {
        let object = match changed.objects.len() {
            0 => None,
            1 => changed.objects.into_iter().next(),
            _ => Some(Value::Array(changed.objects)),
        };
        Self {
            at_ms: now_ms(),
            token: token.map(str::to_owned),
            address: address.map(|a| a.to_string()),
            method: method.to_string(),
            path,
            status,
            object,
            replica: None,
            revision: changed.revision,
            also_refused: 0,
        }
    }
}

/// The token refusals seen per address since each one's last entry.
#[derive(Debug, Default)]
struct Refusals {
    by_address: std::collections::HashMap<std::net::IpAddr, (std::time::Instant, u64)>,
}

impl Refusals {
    /// `Some(n)`: record this refusal, standing for `n` earlier ones not recorded; `None`:
    /// counted, not recorded (one from this address was recorded within [`REFUSALS_EVERY`]).
    fn admit(&mut self, address: std::net::IpAddr, now: std::time::Instant) -> Option<u64> {
        if self.by_address.len() >= REFUSING_ADDRESSES && !self.by_address.contains_key(&address) {
            self.by_address
                .retain(|_, (at, _)| now.duration_since(*at) < REFUSALS_EVERY);
            if self.by_address.len() >= REFUSING_ADDRESSES {
                self.by_address.clear();
            }
        }
        match self.by_address.get_mut(&address) {
            Some((at, skipped)) if now.duration_since(*at) < REFUSALS_EVERY => {
                *skipped += 1;
                None
            }
            Some((at, skipped)) => {
                let earlier = std::mem::take(skipped);
                *at = now;
                Some(earlier)
            }
            None => {
                self.by_address.insert(address, (now, 0));
                Some(0)
            }
        }
    }
}

/// The trail of a gateway alone (a cluster's is in Redis).
#[derive(Debug, Default)]
pub struct Audit {
    recent: Mutex<VecDeque<AuditEntry>>,
    refusals: Mutex<Refusals>,
}

impl Audit {
    /// Records a call refused for its token (401), unless one from its address was recorded
    /// within [`REFUSALS_EVERY`].
    pub(crate) async fn record_refusal(&self, gateway: &Gateway, mut entry: AuditEntry) {
        let address = entry
            .address
            .as_deref()
            .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
            .map(|a| a.ip());
        if let Some(address) = address {
            let admitted = self
                .refusals
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .admit(address, std::time::Instant::now());
            match admitted {
                Some(earlier) => entry.also_refused = earlier,
                None => return,
            }
        }
        self.record(gateway, entry).await;
    }

    /// Records a call: a log line (`admin.audit`), and the entry in the trail.
    pub(crate) async fn record(&self, gateway: &Gateway, mut entry: AuditEntry) {
        if let Some(cluster) = gateway.cluster() {
            entry.replica = Some(cluster.replica().to_owned());
        }
        let object = entry
            .object
            .as_ref()
            .map(serde_json::Value::to_string)
            .unwrap_or_default();
        info!(
            token = entry.token.as_deref().unwrap_or("(none)"),
            address = entry.address.as_deref().unwrap_or("-"),
            method = %entry.method,
            path = %entry.path,
            status = entry.status,
            object = %object,
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

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn token_refusals_are_recorded_once_per_address_per_interval_with_the_count_they_stand_for() {
        let mut refusals = Refusals::default();
        let start = std::time::Instant::now();
        let a: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let b: std::net::IpAddr = "10.0.0.2".parse().unwrap();
        assert_eq!(refusals.admit(a, start), Some(0));
        for _ in 0..5 {
            assert_eq!(
                refusals.admit(a, start + std::time::Duration::from_secs(1)),
                None
            );
        }
        assert_eq!(
            refusals.admit(b, start),
            Some(0),
            "another address is its own"
        );
        assert_eq!(refusals.admit(a, start + REFUSALS_EVERY), Some(5));
        assert_eq!(refusals.admit(a, start + 2 * REFUSALS_EVERY), Some(0));
        // A flood of addresses forgets the quiet ones, never grows past its bound.
        for i in 0..(2 * REFUSING_ADDRESSES as u32) {
            let address = std::net::IpAddr::from(std::net::Ipv4Addr::from(0x0b00_0000 + i));
            refusals.admit(address, start);
            assert!(refusals.by_address.len() <= REFUSING_ADDRESSES);
        }
    }
}
