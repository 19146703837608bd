//! API keys, tenants, and their limits.
//!
//! A request names its key in `x-api-key` (Anthropic's header) or `Authorization: Bearer`
//! (OpenAI's). Keys are held only as SHA-256 digests (the config may give the digest itself,
//! `key_sha256`, so that it holds no secret at all): a presented key is hashed, and its digest
//! is compared in constant time (`subtle`) with the ones stored under the same 8-byte prefix.
//! With no keys configured the gateway is open, which the config allows only on loopback.
//! Each key belongs to a tenant (its own when it names none) and a tier, and may be limited to
//! some models (403 `permission_error` otherwise).
//!
//! Limits are token buckets ([`Bucket`]), per key and per tenant, for requests, input tokens
//! and output tokens per minute. A bucket refills continuously up to its per-minute size. A
//! request is let in when every bucket it draws on can pay: one request on arrival
//! ([`Authenticator::check`]); its estimated input tokens, and no output tokens owed, once its
//! body is read ([`Caller::admit`]). Output tokens are charged as they stream
//! ([`Caller::charge_output`]), so an output bucket can go into debt, and the next request
//! waits until it is paid back. A refusal is a 429 `rate_limit_error` with `retry-after`; every
//! answer carries the `anthropic-ratelimit-*` headers of the tightest bucket of each kind.
//! Keys never reach a log line. This module knows nothing of routing or HTTP bodies.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::{ApiKey, RateLimits, Tenant};
use crate::error::{ApiError, ErrorKind};

/// The SHA-256 digest of an API key, as keys are stored.
pub fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// A token bucket that refills continuously to `size` per minute, and that output charges may
/// drive below zero (a debt the refill pays back).
#[derive(Debug)]
pub struct Bucket {
    size: f64,
    per_second: f64,
    /// (level, when it was last brought up to date).
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    /// A full bucket of `per_minute`.
    pub fn per_minute(per_minute: u32) -> Self {
        let size = f64::from(per_minute);
        Self {
            size,
            per_second: size / 60.0,
            state: Mutex::new((size, Instant::now())),
        }
    }

    /// The bucket's level now.
    fn level(&self, state: &mut (f64, Instant), now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(state.1).as_secs_f64();
        state.0 = (state.0 + elapsed * self.per_second).min(self.size);
        state.1 = now;
        state.0
    }

    /// How long until the level reaches `amount` (zero when it is there).
    fn wait_for(&self, level: f64, amount: f64) -> Duration {
        if level >= amount {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((amount - level) / self.per_second)
    }

    /// Takes `amount` if the level covers it; else how long until it would.
    pub fn try_take(&self, amount: f64) -> Result<(), Duration> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        // A request larger than the whole bucket can never be covered: it waits for a full one.
        let needed = amount.min(self.size);
        if level >= needed {
            state.0 -= amount;
            Ok(())
        } else {
            Err(self.wait_for(level, needed))
        }
    }

    /// How long until the bucket is out of debt (zero when it is not in debt).
    pub fn debt_wait(&self) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        self.wait_for(level, 0.0)
    }

    /// Charges `amount`, into debt if need be.
    pub fn charge(&self, amount: f64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        state.0 = level - amount;
    }

    /// Gives `amount` back (an estimate that was too high), up to the bucket's size.
    pub fn refund(&self, amount: f64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        state.0 = (level + amount).min(self.size);
    }

    /// (size, whole units left, time until full) for the rate-limit headers.
    pub fn report(&self) -> (u64, u64, Duration) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let level = self.level(&mut state, Instant::now());
        (
            self.size as u64,
            level.max(0.0) as u64,
            self.wait_for(level, self.size),
        )
    }
}

/// The buckets of one key or one tenant.
#[derive(Debug, Default)]
struct Buckets {
    requests: Option<Bucket>,
    input: Option<Bucket>,
    output: Option<Bucket>,
}

impl Buckets {
    fn new(limits: &RateLimits) -> Self {
        let bucket = |n: Option<std::num::NonZeroU32>| n.map(|n| Bucket::per_minute(n.get()));
        Self {
            requests: bucket(limits.requests_per_minute),
            input: bucket(limits.input_tokens_per_minute),
            output: bucket(limits.output_tokens_per_minute),
        }
    }

    fn is_empty(&self) -> bool {
        self.requests.is_none() && self.input.is_none() && self.output.is_none()
    }
}

/// A tenant: its buckets, shared by all its keys.
#[derive(Debug)]
struct TenantEntry {
    name: String,
    buckets: Buckets,
    models: Option<Vec<String>>,
}

/// A key: its buckets, its tenant's, and what it may use.
#[derive(Debug)]
pub struct Account {
    digest: [u8; 32],
    buckets: Buckets,
    tenant: Arc<TenantEntry>,
    models: Option<Vec<String>>,
}

impl Account {
    /// The buckets a request draws on: the key's, then its tenant's.
    fn all(&self) -> [(&Buckets, &'static str); 2] {
        [
            (&self.buckets, "this API key"),
            (&self.tenant.buckets, "this API key's tenant"),
        ]
    }

    fn limited(&self) -> bool {
        !self.buckets.is_empty() || !self.tenant.buckets.is_empty()
    }
}

/// Who is calling, once authenticated.
#[derive(Clone, Debug)]
pub struct Caller {
    /// The key's tier (`"anonymous"` when authentication is off).
    pub tier: String,
    /// A short, non-secret label of the key for logs (`key#3`).
    pub key_label: String,
    /// The key's tenant (`"anonymous"` when authentication is off): fair sharing and limits.
    pub tenant: String,
    /// The key's buckets and permissions (`None`: authentication off, or an in-process caller).
    account: Option<Arc<Account>>,
}

impl PartialEq for Caller {
    fn eq(&self, other: &Self) -> bool {
        self.tier == other.tier && self.key_label == other.key_label && self.tenant == other.tenant
    }
}

impl Caller {
    /// A caller with no key, limits or model restrictions (in-process callers: the replay).
    pub fn unlimited(tier: &str, label: &str) -> Self {
        Self {
            tier: tier.to_owned(),
            key_label: label.to_owned(),
            tenant: label.to_owned(),
            account: None,
        }
    }

    /// Whether any token bucket applies (else charging is skipped entirely).
    pub fn is_limited(&self) -> bool {
        self.account.as_ref().is_some_and(|a| a.limited())
    }

    /// Lets the request's body in: the model must be one the key and tenant may use, the
    /// input-token buckets must cover `input_tokens`, and no output-token bucket may be in
    /// debt. Charges the input tokens.
    pub fn admit(&self, model: &str, input_tokens: u32) -> Result<(), ApiError> {
        self.may_use(model)?;
        let Some(account) = &self.account else {
            return Ok(());
        };
        self.check_output_debt(account)?;
        self.take_input(account, input_tokens)
    }

    /// Whether the key and its tenant may use `model` (403 `permission_error` otherwise).
    pub fn may_use(&self, model: &str) -> Result<(), ApiError> {
        let Some(account) = &self.account else {
            return Ok(());
        };
        for (models, whose) in [
            (&account.models, "this API key"),
            (&account.tenant.models, "this API key's tenant"),
        ] {
            if let Some(models) = models
                && !models.iter().any(|m| m == model)
            {
                return Err(ApiError::new(
                    ErrorKind::PermissionDenied,
                    format!(
                        "{whose} may not use the model {model:?}; it may use: {}",
                        models.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    fn check_output_debt(&self, account: &Account) -> Result<(), ApiError> {
        for (buckets, whose) in account.all() {
            if let Some(output) = &buckets.output {
                let wait = output.debt_wait();
                if !wait.is_zero() {
                    return Err(limited(whose, "output tokens", wait));
                }
            }
        }
        Ok(())
    }

    fn take_input(&self, account: &Account, input_tokens: u32) -> Result<(), ApiError> {
        let amount = f64::from(input_tokens);
        let [(key, key_whose), (tenant, tenant_whose)] = account.all();
        if let Some(bucket) = &key.input {
            bucket
                .try_take(amount)
                .map_err(|wait| limited(key_whose, "input tokens", wait))?;
        }
        if let Some(bucket) = &tenant.input
            && let Err(wait) = bucket.try_take(amount)
        {
            if let Some(bucket) = &key.input {
                bucket.refund(amount);
            }
            return Err(limited(tenant_whose, "input tokens", wait));
        }
        Ok(())
    }

    /// Corrects the input charge once the server counted the prompt (`estimated` was charged).
    pub fn settle_input(&self, estimated: u32, counted: u32) {
        let Some(account) = &self.account else {
            return;
        };
        for (buckets, _) in account.all() {
            if let Some(bucket) = &buckets.input {
                if counted > estimated {
                    bucket.charge(f64::from(counted - estimated));
                } else {
                    bucket.refund(f64::from(estimated - counted));
                }
            }
        }
    }

    /// Charges `tokens` generated tokens to the output buckets.
    pub fn charge_output(&self, tokens: u32) {
        let Some(account) = &self.account else {
            return;
        };
        for (buckets, _) in account.all() {
            if let Some(bucket) = &buckets.output {
                bucket.charge(f64::from(tokens));
            }
        }
    }

    /// The `anthropic-ratelimit-*` headers (and OpenAI's `x-ratelimit-*` when `openai`): for
    /// each kind, the bucket (key's or tenant's) with the least left.
    pub fn rate_limit_headers(&self, headers: &mut HeaderMap, openai: bool) {
        let Some(account) = &self.account else {
            return;
        };
        type Pick = fn(&Buckets) -> Option<&Bucket>;
        let kinds: [(&str, Pick); 3] = [
            ("requests", |b| b.requests.as_ref()),
            ("input-tokens", |b| b.input.as_ref()),
            ("output-tokens", |b| b.output.as_ref()),
        ];
        for (kind, pick) in kinds {
            let tightest = account
                .all()
                .into_iter()
                .filter_map(|(b, _)| pick(b).map(Bucket::report))
                .min_by_key(|(_, left, _)| *left);
            let Some((size, left, full_in)) = tightest else {
                continue;
            };
            let reset = humantime::format_rfc3339_seconds(SystemTime::now() + full_in).to_string();
            for (suffix, value) in [
                ("limit", size.to_string()),
                ("remaining", left.to_string()),
                ("reset", reset),
            ] {
                let name = format!("anthropic-ratelimit-{kind}-{suffix}");
                insert(headers, &name, &value);
            }
            if openai && kind != "output-tokens" {
                let short = if kind == "requests" {
                    "requests"
                } else {
                    "tokens"
                };
                insert(
                    headers,
                    &format!("x-ratelimit-limit-{short}"),
                    &size.to_string(),
                );
                insert(
                    headers,
                    &format!("x-ratelimit-remaining-{short}"),
                    &left.to_string(),
                );
                insert(
                    headers,
                    &format!("x-ratelimit-reset-{short}"),
                    &format!("{:.3}s", full_in.as_secs_f64()),
                );
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

fn limited(whose: &str, what: &str, wait: Duration) -> ApiError {
    // Whole seconds, rounded up: `retry-after` has no fractions.
    let wait = Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
        .max(Duration::from_secs(1));
    ApiError::new(
        ErrorKind::RateLimit,
        format!(
            "rate limit exceeded: {whose}'s {what} per minute are used up; retry in {} s",
            wait.as_secs()
        ),
    )
    .with_retry_after(wait)
}

/// The configured keys and tenants.
#[derive(Debug)]
pub struct Authenticator {
    /// Keys by the first 8 bytes of their digest (the rest is compared in constant time).
    keys: HashMap<u64, Vec<(Arc<Account>, Caller)>>,
}

impl Authenticator {
    /// Builds the key table (the config has checked that every key's tenant exists).
    pub fn new(keys: &[ApiKey], tenants: &[Tenant]) -> Self {
        let tenant_entries: HashMap<&str, Arc<TenantEntry>> = tenants
            .iter()
            .map(|t| {
                (
                    t.name.as_str(),
                    Arc::new(TenantEntry {
                        name: t.name.clone(),
                        buckets: Buckets::new(&t.limits),
                        models: t.models.clone(),
                    }),
                )
            })
            .collect();
        let mut table: HashMap<u64, Vec<(Arc<Account>, Caller)>> = HashMap::new();
        for (i, key) in keys.iter().enumerate() {
            let label = format!("key#{i}");
            let tenant = key
                .tenant
                .as_deref()
                .and_then(|t| tenant_entries.get(t).cloned())
                .unwrap_or_else(|| {
                    // A key without a tenant is its own.
                    Arc::new(TenantEntry {
                        name: label.clone(),
                        buckets: Buckets::default(),
                        models: None,
                    })
                });
            let account = Arc::new(Account {
                digest: key.digest,
                buckets: Buckets::new(&key.limits),
                tenant: tenant.clone(),
                models: key.models.clone(),
            });
            let caller = Caller {
                tier: key.tier.clone(),
                key_label: label,
                tenant: tenant.name.clone(),
                account: Some(account.clone()),
            };
            table
                .entry(prefix(&key.digest))
                .or_default()
                .push((account, caller));
        }
        Self { keys: table }
    }

    /// Whether any key is configured.
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Authenticates the request and charges one request to its key's and tenant's buckets.
    pub fn check(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        if self.keys.is_empty() {
            return Ok(Caller::unlimited("anonymous", "anonymous"));
        }
        let presented = presented_key(headers).ok_or_else(|| {
            ApiError::new(
                ErrorKind::Authentication,
                "missing API key: send it in the x-api-key header (or Authorization: Bearer)",
            )
        })?;
        let digest = key_digest(presented);
        let (account, caller) = self
            .keys
            .get(&prefix(&digest))
            .and_then(|candidates| {
                candidates
                    .iter()
                    .find(|(account, _)| bool::from(account.digest.ct_eq(&digest)))
            })
            .ok_or_else(|| ApiError::new(ErrorKind::Authentication, "invalid API key"))?;
        let [(key, key_whose), (tenant, tenant_whose)] = account.all();
        if let Some(bucket) = &key.requests {
            bucket
                .try_take(1.0)
                .map_err(|wait| limited(key_whose, "requests", wait))?;
        }
        if let Some(bucket) = &tenant.requests
            && let Err(wait) = bucket.try_take(1.0)
        {
            if let Some(bucket) = &key.requests {
                bucket.refund(1.0);
            }
            return Err(limited(tenant_whose, "requests", wait));
        }
        Ok(caller.clone())
    }
}

fn prefix(digest: &[u8; 32]) -> u64 {
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
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
        assert_eq!(auth.check(&HeaderMap::new()).unwrap().tier, "anonymous");
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
        let caller = auth.check(&headers("x-api-key", "sk-good-key")).unwrap();
        assert_eq!(caller.tier, "gold");
        assert_eq!(caller.tenant, "key#0");
        assert!(
            auth.check(&headers("authorization", "Bearer sk-good-key"))
                .is_ok()
        );
        let limited = auth
            .check(&headers("x-api-key", "sk-good-key"))
            .unwrap_err();
        assert_eq!(limited.kind(), ErrorKind::RateLimit);
        assert!(limited.message().contains("this API key's requests"));
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
        };
        let mut a = key("sk-acme-one", "gold", RateLimits::default());
        a.tenant = Some("acme".into());
        let mut b = key("sk-acme-two", "free", RateLimits::default());
        b.tenant = Some("acme".into());
        let auth = Authenticator::new(&[a, b], &[tenant]);
        let one = auth.check(&headers("x-api-key", "sk-acme-one")).unwrap();
        let two = auth.check(&headers("x-api-key", "sk-acme-two")).unwrap();
        assert_eq!((one.tenant.as_str(), two.tenant.as_str()), ("acme", "acme"));
        assert_eq!(
            one.admit("m2", 10).unwrap_err().kind(),
            ErrorKind::PermissionDenied
        );
        one.admit("m1", 900).unwrap();
        // The tenant's input bucket is shared: the other key finds it nearly empty.
        let err = two.admit("m1", 500).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::RateLimit);
        assert!(
            err.message().contains("tenant's input tokens"),
            "{}",
            err.message()
        );
        // Output charged as it streams puts the tenant into debt: no new request until paid.
        two.admit("m1", 10).unwrap();
        one.charge_output(150);
        let err = two.admit("m1", 1).unwrap_err();
        assert!(err.message().contains("output tokens"), "{}", err.message());
        let mut headers = HeaderMap::new();
        one.rate_limit_headers(&mut headers, false);
        assert_eq!(headers["anthropic-ratelimit-input-tokens-limit"], "1000");
        assert_eq!(headers["anthropic-ratelimit-output-tokens-remaining"], "0");
        assert!(headers.contains_key("anthropic-ratelimit-output-tokens-reset"));
        assert!(!headers.contains_key("anthropic-ratelimit-requests-limit"));
    }

    #[test]
    fn a_bucket_refills_and_pays_back_debt() {
        let bucket = Bucket::per_minute(60);
        bucket.try_take(60.0).unwrap();
        let wait = bucket.try_take(1.0).unwrap_err();
        assert!(
            wait <= Duration::from_secs(1) && wait > Duration::from_millis(900),
            "{wait:?}"
        );
        bucket.charge(60.0);
        let debt = bucket.debt_wait();
        assert!(debt > Duration::from_secs(59), "{debt:?}");
        // A request larger than the bucket waits for a full bucket, not forever.
        let big = Bucket::per_minute(10);
        big.try_take(100.0).unwrap();
    }
}
