//! [`Caller`]: who is calling, once authenticated, and the buckets its requests draw on (its
//! key's, then its tenant's): a request's admission, the correction of its input charge once
//! the server counted the prompt, its output charged as it streams, and the report behind a
//! client's rate-limit headers.

use std::sync::Arc;
use std::time::Duration;

use ringmaster_config::RateLimits;

use crate::Refusal;
use crate::bucket::Bucket;

/// A kind of limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitKind {
    /// Requests per minute.
    Requests,
    /// Input tokens per minute.
    InputTokens,
    /// Output tokens per minute.
    OutputTokens,
}

impl LimitKind {
    /// Its name in Anthropic's headers (`anthropic-ratelimit-{name}-limit`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::InputTokens => "input-tokens",
            Self::OutputTokens => "output-tokens",
        }
    }
}

/// The tightest bucket of one kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimitReport {
    /// The kind.
    pub kind: LimitKind,
    /// The bucket's size per minute.
    pub limit: u64,
    /// Whole units left now.
    pub remaining: u64,
    /// Until the bucket is full again.
    pub full_in: Duration,
}

/// The buckets of one key or one tenant.
#[derive(Debug, Default)]
pub(crate) struct Buckets {
    pub(crate) requests: Option<Bucket>,
    pub(crate) input: Option<Bucket>,
    pub(crate) output: Option<Bucket>,
}

impl Buckets {
    pub(crate) fn new(limits: &RateLimits) -> Self {
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
pub(crate) struct TenantEntry {
    pub(crate) name: String,
    pub(crate) buckets: Buckets,
    pub(crate) models: Option<Vec<String>>,
}

/// A key: its buckets, its tenant's, and what it may use.
#[derive(Debug)]
pub struct Account {
    pub(crate) digest: [u8; 32],
    pub(crate) buckets: Buckets,
    pub(crate) tenant: Arc<TenantEntry>,
    pub(crate) models: Option<Vec<String>>,
}

impl Account {
    /// The buckets a request draws on: the key's, then its tenant's.
    pub(crate) fn all(&self) -> [(&Buckets, &'static str); 2] {
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
    pub tier: Arc<str>,
    /// A short, non-secret label of the key for logs (`key#3`).
    pub key_label: Arc<str>,
    /// The key's tenant (`"anonymous"` when authentication is off): fair sharing and limits.
    pub tenant: Arc<str>,
    /// The key's buckets and permissions (`None`: authentication off, or an in-process caller).
    pub(crate) account: Option<Arc<Account>>,
}

impl PartialEq for Caller {
    fn eq(&self, other: &Self) -> bool {
        self.tier == other.tier && self.key_label == other.key_label && self.tenant == other.tenant
    }
}

impl Caller {
    /// A caller with no key, limits or model restrictions (in-process callers: the replay).
    pub fn unlimited(tier: &str, label: &str) -> Self {
        let label: Arc<str> = label.into();
        Self {
            tier: tier.into(),
            key_label: label.clone(),
            tenant: label,
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
    pub fn admit(&self, model: &str, input_tokens: u32) -> Result<(), Refusal> {
        self.may_use(model)?;
        let Some(account) = &self.account else {
            return Ok(());
        };
        self.check_output_debt(account)?;
        self.take_input(account, input_tokens)
    }

    /// Whether the key and its tenant may use `model` (403 `permission_error` otherwise).
    pub fn may_use(&self, model: &str) -> Result<(), Refusal> {
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
                return Err(Refusal::ModelNotAllowed {
                    whose,
                    model: model.to_owned(),
                    allowed: models.join(", "),
                });
            }
        }
        Ok(())
    }

    fn check_output_debt(&self, account: &Account) -> Result<(), Refusal> {
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

    fn take_input(&self, account: &Account, input_tokens: u32) -> Result<(), Refusal> {
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

    /// For each kind of limit that applies, the tightest bucket (the key's or its tenant's):
    /// what a client's rate-limit headers say.
    pub fn rate_limits(&self) -> Vec<RateLimitReport> {
        let Some(account) = &self.account else {
            return Vec::new();
        };
        type Pick = fn(&Buckets) -> Option<&Bucket>;
        let kinds: [(LimitKind, Pick); 3] = [
            (LimitKind::Requests, |b| b.requests.as_ref()),
            (LimitKind::InputTokens, |b| b.input.as_ref()),
            (LimitKind::OutputTokens, |b| b.output.as_ref()),
        ];
        kinds
            .into_iter()
            .filter_map(|(kind, pick)| {
                let (limit, remaining, full_in) = account
                    .all()
                    .into_iter()
                    .filter_map(|(b, _)| pick(b).map(Bucket::report))
                    .min_by_key(|(_, left, _)| *left)?;
                Some(RateLimitReport {
                    kind,
                    limit,
                    remaining,
                    full_in,
                })
            })
            .collect()
    }
}

/// The refusal of a bucket of `what` (`whose`) that can pay in `wait`.
pub(crate) fn limited(whose: &'static str, what: &'static str, wait: Duration) -> Refusal {
    // Whole seconds, rounded up: `retry-after` has no fractions.
    let wait = Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
        .max(Duration::from_secs(1));
    Refusal::RateLimited { whose, what, wait }
}
