//! Ringmaster's tenancy: API keys, tenants, their token buckets, and the caller a request is
//! made for. It knows no HTTP (the gateway reads the key from the headers, and writes the
//! rate-limit headers from [`Caller::rate_limits`]) and no request format.
//!
//! Keys are held only as SHA-256 digests (the config may give the digest itself, so that it
//! holds no secret at all). Each key belongs to a tenant (its own when it names none) and a
//! tier, and may be limited to some models. Limits are token buckets ([`Bucket`]), per key and
//! per tenant, for requests, input tokens and output tokens per minute. A request is let in
//! when every bucket it draws on can pay: one request on arrival ([`Authenticator::check`]);
//! its estimated input tokens, and no output tokens owed, once its body is read
//! ([`Caller::admit`]). Output tokens are charged as they stream ([`Caller::charge_output`]),
//! so an output bucket can go into debt, and the next request waits until it is paid back.
//! Keys never reach a log line.

#![deny(missing_docs)]

mod book;
mod bucket;
mod caller;
mod keys;
pub mod shared;

use std::time::Duration;

pub use book::{BookError, KeyBook};
pub use bucket::Bucket;
pub use caller::{Caller, LimitKind, RateLimitReport};
pub use keys::Authenticator;
pub use ringmaster_config::key_digest;
pub use shared::{Draw, Drawn, SharedBuckets};

/// Why a caller may not go on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No key was presented, and keys are required.
    #[error("missing API key: send it in the x-api-key header (or Authorization: Bearer)")]
    MissingKey,
    /// The key is not one of the configured keys.
    #[error("invalid API key")]
    InvalidKey,
    /// The key or its tenant may not use the model.
    #[error("{whose} may not use the model {model:?}; it may use: {allowed}")]
    ModelNotAllowed {
        /// `this API key` or `this API key's tenant`.
        whose: &'static str,
        /// The model asked for.
        model: String,
        /// The models it may use.
        allowed: String,
    },
    /// A bucket is used up (or an output bucket is in debt).
    #[error("rate limit exceeded: {whose}'s {what} per minute are used up; retry in {} s", wait.as_secs())]
    RateLimited {
        /// `this API key` or `this API key's tenant`.
        whose: &'static str,
        /// `requests`, `input tokens` or `output tokens`.
        what: &'static str,
        /// Until it can pay, in whole seconds (at least one).
        wait: Duration,
    },
    /// The fleet's shared limits did not answer, and the fleet fails closed.
    #[error(
        "rate limits are unavailable (the cluster's store did not answer) and this gateway fails closed; retry shortly"
    )]
    LimitsUnavailable,
}

impl Refusal {
    /// When trying again can succeed, how long to wait.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::RateLimited { wait, .. } => Some(*wait),
            Self::LimitsUnavailable => Some(Duration::from_secs(1)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::NonZeroU32;
    use std::time::Duration;

    use ringmaster_config::{ApiKey, RateLimits, Tenant, key_digest};

    fn key(secret: &str, tier: &str, limits: RateLimits) -> ApiKey {
        ApiKey {
            digest: key_digest(secret),
            tier: tier.into(),
            tenant: None,
            models: None,
            limits,
        }
    }

    #[test]
    fn open_without_keys() {
        let auth = Authenticator::new(&[], &[]);
        assert!(!auth.is_enabled());
        assert_eq!(&*auth.check(None).unwrap().tier, "anonymous");
    }

    #[test]
    fn checks_keys_by_digest_and_limits_requests() {
        let auth = Authenticator::new(
            &[key(
                "sk-good-key",
                "gold",
                RateLimits {
                    requests_per_minute: NonZeroU32::new(2),
                    ..RateLimits::default()
                },
            )],
            &[],
        );
        assert_eq!(auth.check(None).unwrap_err(), Refusal::MissingKey);
        assert_eq!(auth.check(Some("sk-bad")).unwrap_err(), Refusal::InvalidKey);
        let caller = auth.check(Some("sk-good-key")).unwrap();
        assert_eq!(&*caller.tier, "gold");
        assert_eq!(&*caller.tenant, "key#0");
        assert!(auth.check(Some("sk-good-key")).is_ok());
        let limited = auth.check(Some("sk-good-key")).unwrap_err();
        assert!(
            limited.to_string().contains("this API key's requests"),
            "{limited}"
        );
        assert!(limited.retry_after().unwrap() >= Duration::from_secs(1));
    }

    #[test]
    fn a_tenant_shares_its_buckets_between_its_keys_and_limits_models() {
        let tenant = Tenant {
            name: "acme".into(),
            limits: RateLimits {
                input_tokens_per_minute: NonZeroU32::new(1000),
                output_tokens_per_minute: NonZeroU32::new(100),
                ..RateLimits::default()
            },
            models: Some(vec!["m1".into()]),
            fallback: true,
        };
        let mut a = key("sk-acme-one", "gold", RateLimits::default());
        a.tenant = Some("acme".into());
        let mut b = key("sk-acme-two", "free", RateLimits::default());
        b.tenant = Some("acme".into());
        let auth = Authenticator::new(&[a, b], &[tenant]);
        let one = auth.check(Some("sk-acme-one")).unwrap();
        let two = auth.check(Some("sk-acme-two")).unwrap();
        assert_eq!((&*one.tenant, &*two.tenant), ("acme", "acme"));
        assert!(matches!(
            one.admit("m2", 10).unwrap_err(),
            Refusal::ModelNotAllowed { .. }
        ));
        one.admit("m1", 900).unwrap();
        // The tenant's input bucket is shared: the other key finds it nearly empty.
        let err = two.admit("m1", 500).unwrap_err();
        assert!(err.retry_after().is_some());
        assert!(err.to_string().contains("tenant's input tokens"), "{err}");
        // Output charged as it streams puts the tenant into debt: no new request until paid.
        two.admit("m1", 10).unwrap();
        one.charge_output(150);
        let err = two.admit("m1", 1).unwrap_err();
        assert!(err.to_string().contains("output tokens"), "{err}");
        let reports = one.rate_limits();
        let of = |kind| reports.iter().find(|r| r.kind == kind);
        assert_eq!(of(LimitKind::InputTokens).unwrap().limit, 1000);
        assert_eq!(of(LimitKind::OutputTokens).unwrap().remaining, 0);
        assert!(of(LimitKind::OutputTokens).unwrap().full_in > Duration::ZERO);
        assert!(
            of(LimitKind::Requests).is_none(),
            "no request limit applies"
        );
    }
}
