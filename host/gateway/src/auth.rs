//! API-key authentication and per-key rate limits.
//!
//! A request names its key in `x-api-key` (Anthropic's header) or `Authorization: Bearer`.
//! With no keys configured the gateway is open, which the config allows only on loopback.
//! Each key may carry a requests-per-minute quota, enforced by a GCRA limiter (`governor`);
//! a refusal carries how long to wait. Keys never reach a log line. This module knows nothing
//! of routing or HTTP bodies.

use std::collections::HashMap;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use http::HeaderMap;

use crate::config::ApiKey;
use crate::error::{ApiError, ErrorKind};

/// Who is calling, once authenticated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// The key's tier (`"anonymous"` when authentication is off).
    pub tier: String,
    /// A short, non-secret label of the key for logs (`key#3`).
    pub key_label: String,
}

#[derive(Debug)]
struct KeyEntry {
    caller: Caller,
    limiter: Option<DefaultDirectRateLimiter>,
}

/// The configured keys and their limiters.
#[derive(Debug)]
pub struct Authenticator {
    keys: HashMap<String, KeyEntry>,
    clock: DefaultClock,
}

impl Authenticator {
    /// Builds the key table.
    pub fn new(keys: &[ApiKey]) -> Self {
        let keys = keys
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let limiter = key
                    .requests_per_minute
                    .map(|rpm| RateLimiter::direct(Quota::per_minute(rpm)));
                (
                    key.key.clone(),
                    KeyEntry {
                        caller: Caller {
                            tier: key.tier.clone(),
                            key_label: format!("key#{i}"),
                        },
                        limiter,
                    },
                )
            })
            .collect();
        Self {
            keys,
            clock: DefaultClock::default(),
        }
    }

    /// Whether any key is configured.
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Authenticates the request and charges its key's rate limit.
    pub fn check(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        if self.keys.is_empty() {
            return Ok(Caller {
                tier: "anonymous".to_owned(),
                key_label: "none".to_owned(),
            });
        }
        let presented = presented_key(headers).ok_or_else(|| {
            ApiError::new(
                ErrorKind::Authentication,
                "missing API key: send it in the x-api-key header",
            )
        })?;
        let entry = self
            .keys
            .get(presented)
            .ok_or_else(|| ApiError::new(ErrorKind::Authentication, "invalid x-api-key"))?;
        if let Some(limiter) = &entry.limiter
            && let Err(not_until) = limiter.check()
        {
            let wait = not_until.wait_time_from(self.clock.now());
            let wait = Duration::from_secs(wait.as_secs() + 1);
            return Err(ApiError::new(
                ErrorKind::RateLimit,
                format!(
                    "rate limit exceeded for this API key; retry in {} s",
                    wait.as_secs()
                ),
            )
            .with_retry_after(wait));
        }
        Ok(entry.caller.clone())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;

    fn headers(name: &str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        h
    }

    #[test]
    fn open_without_keys() {
        let auth = Authenticator::new(&[]);
        assert!(!auth.is_enabled());
        assert_eq!(auth.check(&HeaderMap::new()).unwrap().tier, "anonymous");
    }

    #[test]
    fn checks_keys_and_limits() {
        let auth = Authenticator::new(&[ApiKey {
            key: "sk-good-key".into(),
            tier: "gold".into(),
            requests_per_minute: NonZeroU32::new(2),
        }]);
        assert_eq!(
            auth.check(&HeaderMap::new()).unwrap_err().kind(),
            ErrorKind::Authentication
        );
        assert_eq!(
            auth.check(&headers("x-api-key", "sk-bad"))
                .unwrap_err()
                .kind(),
            ErrorKind::Authentication
        );
        assert_eq!(
            auth.check(&headers("x-api-key", "sk-good-key"))
                .unwrap()
                .tier,
            "gold"
        );
        assert!(
            auth.check(&headers("authorization", "Bearer sk-good-key"))
                .is_ok()
        );
        let limited = auth
            .check(&headers("x-api-key", "sk-good-key"))
            .unwrap_err();
        assert_eq!(limited.kind(), ErrorKind::RateLimit);
        assert!(limited.retry_after().unwrap() >= Duration::from_secs(1));
    }
}
