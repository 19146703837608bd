//! [`Caller`]: who is calling, once authenticated, and the buckets its requests draw on (its
//! key's, then its tenant's): a request's admission, the correction of its input charge once
//! the server counted the prompt, its output charged as it streams, and the report behind a
//! client's rate-limit headers.

use std::sync::Arc;
use std::time::Duration;

use ringmaster_config::RateLimits;

use crate::Refusal;
use crate::bucket::Bucket;
use crate::shared::{Draw, Drawn, SharedBuckets};

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
    /// Their id in a shared store (`key:HEX`, `tenant:NAME`), the same on every replica.
    pub(crate) id: String,
    pub(crate) requests: Option<Bucket>,
    pub(crate) input: Option<Bucket>,
    pub(crate) output: Option<Bucket>,
}

impl Buckets {
    pub(crate) fn new(id: String, limits: &RateLimits) -> Self {
        let bucket = |n: Option<std::num::NonZeroU32>| n.map(|n| Bucket::per_minute(n.get()));
        Self {
            id,
            requests: bucket(limits.requests_per_minute),
            input: bucket(limits.input_tokens_per_minute),
            output: bucket(limits.output_tokens_per_minute),
        }
    }

    /// The bucket of `kind`, if that limit applies.
    fn of(&self, kind: LimitKind) -> Option<&Bucket> {
        match kind {
            LimitKind::Requests => self.requests.as_ref(),
            LimitKind::InputTokens => self.input.as_ref(),
            LimitKind::OutputTokens => self.output.as_ref(),
        }
    }

    /// The shared id of its bucket of `kind`.
    fn shared_id(&self, kind: LimitKind) -> String {
        format!("{}:{}", self.id, kind.as_str())
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
    /// The fleet's shared buckets, when replicas share limits.
    pub(crate) shared: Option<Arc<dyn SharedBuckets>>,
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
    /// A short, non-secret label of the key for logs (`key#3`), by its place in the key list:
    /// it changes when keys are reordered, so nothing is ever owned by it.
    pub key_label: Arc<str>,
    /// Who owns what this caller stores (stored responses, resumable streams): a stable id
    /// derived from the key's digest and its tenant ([`owner_id`]), the same on every replica
    /// and across restarts whatever the keys' order (`"anonymous"` without keys).
    pub owner: Arc<str>,
    /// The key's tenant (`"anonymous"` when authentication is off): fair sharing and limits.
    pub tenant: Arc<str>,
    /// The key's buckets and permissions (`None`: authentication off, or an in-process caller).
    pub(crate) account: Option<Arc<Account>>,
}

impl PartialEq for Caller {
    fn eq(&self, other: &Self) -> bool {
        self.tier == other.tier
            && self.key_label == other.key_label
            && self.owner == other.owner
            && self.tenant == other.tenant
    }
}

/// The owner id of the key with `digest` in `tenant`: `owner-` and 32 hex digits of a SHA-256
/// over a domain tag, the tenant and the digest. Stable across restarts, replicas and any
/// order of the key list; it names neither the key nor its digest.
pub fn owner_id(digest: &[u8; 32], tenant: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(b"ringmaster-owner-v1\0");
    hasher.update((tenant.len() as u64).to_le_bytes());
    hasher.update(tenant.as_bytes());
    hasher.update(digest);
    let id = hasher.finalize();
    format!("owner-{}", hex::encode(&id[..16]))
}

impl Caller {
    /// A caller with no key, limits or model restrictions (in-process callers: the replay).
    pub fn unlimited(tier: &str, label: &str) -> Self {
        let label: Arc<str> = label.into();
        Self {
            tier: tier.into(),
            key_label: label.clone(),
            owner: label.clone(),
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

    /// Whether this caller's limits are the fleet's (checked by [`Self::admit_shared`] and
    /// [`Self::take_request`], which then do what [`Self::admit`] and the request charge of
    /// [`crate::Authenticator::check`] do alone).
    pub fn is_shared(&self) -> bool {
        self.account
            .as_ref()
            .is_some_and(|a| a.shared.is_some() && a.limited())
    }

    /// [`Self::admit`] on the fleet's buckets, with the request's own charge: one request,
    /// the estimated input tokens, no output owed, all in one atomic call. Without shared
    /// limits, the same as [`Self::admit`].
    pub async fn admit_shared(&self, model: &str, input_tokens: u32) -> Result<(), Refusal> {
        self.may_use(model)?;
        match &self.account {
            Some(account) if account.shared.is_some() => {
                self.draw_shared(account, Some(input_tokens)).await
            }
            _ => self.admit(model, input_tokens),
        }
    }

    /// Charges one request to the fleet's request buckets (the endpoints that read no
    /// prompt); nothing to do without shared limits, where the key check charged it.
    pub async fn take_request(&self) -> Result<(), Refusal> {
        match &self.account {
            Some(account) if account.shared.is_some() => self.draw_shared(account, None).await,
            _ => Ok(()),
        }
    }

    async fn draw_shared(
        &self,
        account: &Account,
        input_tokens: Option<u32>,
    ) -> Result<(), Refusal> {
        let shared = account.shared.as_ref().expect("checked by the caller");
        let mut draws = Vec::with_capacity(6);
        let mut labels = Vec::with_capacity(6);
        let mut wants = vec![(LimitKind::Requests, 1.0, false)];
        if let Some(tokens) = input_tokens {
            wants.push((LimitKind::InputTokens, f64::from(tokens), false));
            wants.push((LimitKind::OutputTokens, 0.0, true));
        }
        for (kind, amount, debt_check) in wants {
            for (buckets, whose) in account.all() {
                if let Some(bucket) = buckets.of(kind) {
                    draws.push(Draw {
                        id: buckets.shared_id(kind),
                        per_minute: bucket.size_per_minute(),
                        amount,
                        debt_check,
                    });
                    labels.push((whose, kind));
                }
            }
        }
        if draws.is_empty() {
            return Ok(());
        }
        match shared.draw(&draws).await {
            Drawn::Paid => Ok(()),
            Drawn::Short { index, wait } => {
                let (whose, kind) = labels[index.min(labels.len() - 1)];
                Err(limited(whose, what(kind), wait))
            }
            Drawn::Unavailable if shared.fail_open() => {
                self.draw_local(account, &draws, &labels, f64::from(shared.live_replicas()))
            }
            Drawn::Unavailable => Err(Refusal::LimitsUnavailable),
        }
    }

    /// The fleet's draws on this replica's own buckets, each counted `scale` times: a bucket
    /// worth limit ÷ live replicas, while the shared store is away.
    fn draw_local(
        &self,
        account: &Account,
        draws: &[Draw],
        labels: &[(&'static str, LimitKind)],
        scale: f64,
    ) -> Result<(), Refusal> {
        let bucket = |(whose, kind): (&'static str, LimitKind)| {
            account
                .all()
                .into_iter()
                .find(|(_, w)| *w == whose)
                .and_then(|(b, _)| b.of(kind))
        };
        let mut taken: Vec<(&Bucket, f64)> = Vec::new();
        for (draw, label) in draws.iter().zip(labels) {
            let Some(bucket) = bucket(*label) else {
                continue;
            };
            let outcome = if draw.debt_check {
                let wait = bucket.debt_wait();
                if wait.is_zero() { Ok(()) } else { Err(wait) }
            } else {
                bucket.try_take(draw.amount * scale)
            };
            if let Err(wait) = outcome {
                for (bucket, amount) in taken {
                    bucket.refund(amount);
                }
                return Err(limited(label.0, what(label.1), wait));
            }
            if !draw.debt_check {
                taken.push((bucket, draw.amount * scale));
            }
        }
        Ok(())
    }

    /// Charges `delta` (a refund when negative) to every bucket of `kind`: the fleet's when
    /// it answers, else this replica's stand-ins, scaled.
    fn settle(&self, account: &Account, kind: LimitKind, delta: f64) {
        let shared = account.shared.as_ref();
        for (buckets, _) in account.all() {
            let Some(bucket) = buckets.of(kind) else {
                continue;
            };
            match shared {
                Some(shared) if shared.is_up() => {
                    shared.charge(&buckets.shared_id(kind), bucket.size_per_minute(), delta);
                }
                _ => {
                    let scale = shared.map_or(1.0, |s| f64::from(s.live_replicas()));
                    if delta >= 0.0 {
                        bucket.charge(delta * scale);
                    } else {
                        bucket.refund(-delta * scale);
                    }
                }
            }
        }
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
        self.settle(
            account,
            LimitKind::InputTokens,
            f64::from(counted) - f64::from(estimated),
        );
    }

    /// Charges `tokens` generated tokens to the output buckets.
    pub fn charge_output(&self, tokens: u32) {
        let Some(account) = &self.account else {
            return;
        };
        self.settle(account, LimitKind::OutputTokens, f64::from(tokens));
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

/// What a kind of limit counts, in a refusal.
fn what(kind: LimitKind) -> &'static str {
    match kind {
        LimitKind::Requests => "requests",
        LimitKind::InputTokens => "input tokens",
        LimitKind::OutputTokens => "output tokens",
    }
}

/// The refusal of a bucket of `what` (`whose`) that can pay in `wait`.
pub(crate) fn limited(whose: &'static str, what: &'static str, wait: Duration) -> Refusal {
    // Whole seconds, rounded up: `retry-after` has no fractions.
    let wait = Duration::from_secs(wait.as_secs() + u64::from(wait.subsec_nanos() > 0))
        .max(Duration::from_secs(1));
    Refusal::RateLimited { whose, what, wait }
}
