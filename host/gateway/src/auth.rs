//! The HTTP side of tenancy ([`ringmaster_tenancy`]): the key a request presents
//! (`x-api-key`, Anthropic's header, else `Authorization: Bearer`, OpenAI's), a refusal as the
//! API error it is (401, 403, 429 with `retry-after`), and the rate-limit headers every answer
//! carries (`anthropic-ratelimit-*`, and OpenAI's `x-ratelimit-*` on the OpenAI doors).

use std::time::SystemTime;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use ringmaster_api::{ApiError, Door, ErrorKind};
pub use ringmaster_tenancy::{Authenticator, Caller, key_digest};
use ringmaster_tenancy::{LimitKind, Refusal};

use crate::metrics::Metrics;

/// Authenticates a request by the key it presents, charging one request.
pub(crate) fn authenticate(
    auth: &Authenticator,
    metrics: &Metrics,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    authenticate_at(auth, metrics, headers, Door::Messages)
}

/// [`authenticate`] at `door`: a 429 carries the rate-limit headers in that door's terms, as
/// every answer does.
pub(crate) fn authenticate_at(
    auth: &Authenticator,
    metrics: &Metrics,
    headers: &HeaderMap,
    door: Door,
) -> Result<Caller, ApiError> {
    let presented = presented_key(headers);
    auth.check(presented).map_err(|refusal| {
        if !matches!(refusal, Refusal::RateLimited { .. }) {
            return refused(refusal);
        }
        let tenant = auth.tenant_of(presented);
        count_refusal(metrics, tenant.as_deref().unwrap_or("unknown"), &refusal);
        match auth.caller_of(presented) {
            Some(caller) => refused_with_headers(refusal, &caller, door),
            None => refused(refusal),
        }
    })
}

/// A caller's refusal with its rate-limit headers (a 429 tells the client where it stands,
/// as every answer does).
pub(crate) fn refused_with_headers(refusal: Refusal, caller: &Caller, door: Door) -> ApiError {
    let mut headers = HeaderMap::new();
    rate_limit_headers(caller, &mut headers, door);
    let headers: Vec<(HeaderName, HeaderValue)> = headers
        .into_iter()
        .filter_map(|(name, value)| Some((name?, value)))
        .collect();
    refused(refusal).with_headers(headers)
}

/// Counts a token bucket's refusal by tenant and bucket (other refusals are not counted here).
pub(crate) fn count_refusal(metrics: &Metrics, tenant: &str, refusal: &Refusal) {
    if let Refusal::RateLimited { whose, what, .. } = refusal {
        metrics
            .rate_limit_refusals
            .get_or_create(&crate::metrics::RateLimitLabels {
                tenant: tenant.to_owned(),
                limit: what,
                bucket: whose,
            })
            .inc();
    }
}

/// [`authenticate`] for the endpoints that read no prompt: with the fleet's shared buckets,
/// the request is charged there now (on the prompt paths the admit phase charges it).
pub(crate) async fn authenticate_request(
    auth: &Authenticator,
    metrics: &Metrics,
    headers: &HeaderMap,
) -> Result<Caller, ApiError> {
    let caller = authenticate(auth, metrics, headers)?;
    caller.take_request().await.map_err(|refusal| {
        count_refusal(metrics, &caller.tenant, &refusal);
        refused(refusal)
    })?;
    Ok(caller)
}

/// A tenancy refusal as the API error a client gets.
pub(crate) fn refused(refusal: Refusal) -> ApiError {
    let kind = match &refusal {
        Refusal::MissingKey | Refusal::InvalidKey => ErrorKind::Authentication,
        Refusal::ModelNotAllowed { .. } => ErrorKind::PermissionDenied,
        Refusal::RateLimited { .. } => ErrorKind::RateLimit,
        Refusal::LimitsUnavailable => ErrorKind::Unavailable,
    };
    let error = ApiError::new(kind, refusal.to_string());
    match refusal.retry_after() {
        Some(after) => error.with_retry_after(after),
        None => error,
    }
}

/// The key in `x-api-key`, else in `Authorization: Bearer …`.
fn presented_key(headers: &HeaderMap) -> Option<&str> {
    if let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(key.trim());
    }
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The `anthropic-ratelimit-*` headers (and OpenAI's `x-ratelimit-*` on an OpenAI door): for
/// each kind, the bucket (key's or tenant's) with the least left.
pub(crate) fn rate_limit_headers(caller: &Caller, headers: &mut HeaderMap, door: Door) {
    for report in caller.rate_limits() {
        let kind = report.kind.as_str();
        let reset = humantime::format_rfc3339_seconds(SystemTime::now() + report.full_in);
        for (suffix, value) in [
            ("limit", report.limit.to_string()),
            ("remaining", report.remaining.to_string()),
            ("reset", reset.to_string()),
        ] {
            insert(
                headers,
                &format!("anthropic-ratelimit-{kind}-{suffix}"),
                &value,
            );
        }
        if door.openai_rate_limit_headers() && report.kind != LimitKind::OutputTokens {
            let short = if report.kind == LimitKind::Requests {
                "requests"
            } else {
                "tokens"
            };
            for (prefix, value) in [
                ("limit", report.limit.to_string()),
                ("remaining", report.remaining.to_string()),
                ("reset", format!("{:.3}s", report.full_in.as_secs_f64())),
            ] {
                insert(headers, &format!("x-ratelimit-{prefix}-{short}"), &value);
            }
        }
    }
}

fn insert(headers: &mut HeaderMap, name: &str, value: &str) {
    if let (Ok(name), Ok(value)) = (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(value),
    ) {
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_config::{ApiKey, RateLimits, Tenant};
    use std::num::NonZeroU32;

    #[test]
    fn keys_come_from_either_header_and_refusals_have_their_status() {
        let key = ApiKey {
            digest: key_digest("sk-good-key"),
            tier: "gold".into(),
            tenant: Some("acme".into()),
            models: None,
            limits: RateLimits::default(),
        };
        let tenant = Tenant {
            name: "acme".into(),
            limits: RateLimits {
                requests_per_minute: NonZeroU32::new(2),
                input_tokens_per_minute: NonZeroU32::new(1000),
                ..RateLimits::default()
            },
            models: None,
            fallback: true,
        };
        let auth = Authenticator::new(&[key], &[tenant]);
        let with = |name: &str, value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
            headers
        };
        assert_eq!(
            authenticate(&auth, &Metrics::new(), &HeaderMap::new())
                .unwrap_err()
                .kind(),
            ErrorKind::Authentication
        );
        let caller =
            authenticate(&auth, &Metrics::new(), &with("x-api-key", "sk-good-key")).unwrap();
        assert_eq!(&*caller.tier, "gold");
        assert!(
            authenticate(
                &auth,
                &Metrics::new(),
                &with("authorization", "Bearer sk-good-key")
            )
            .is_ok()
        );
        let limited =
            authenticate(&auth, &Metrics::new(), &with("x-api-key", "sk-good-key")).unwrap_err();
        assert_eq!(limited.kind(), ErrorKind::RateLimit);
        assert!(limited.retry_after().is_some());
        let mut headers = HeaderMap::new();
        rate_limit_headers(&caller, &mut headers, Door::Chat);
        assert_eq!(headers["anthropic-ratelimit-requests-limit"], "2");
        assert_eq!(headers["anthropic-ratelimit-input-tokens-limit"], "1000");
        assert_eq!(headers["x-ratelimit-limit-tokens"], "1000");
        assert!(headers.contains_key("anthropic-ratelimit-input-tokens-reset"));
        assert!(!headers.contains_key("anthropic-ratelimit-output-tokens-limit"));
    }
}
