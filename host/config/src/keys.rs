//! `[[api_keys]]` and `[[tenants]]`: keys kept as SHA-256 digests, each with a tier, a tenant
//! and optionally the models it may use; per-minute limits of a key and of a tenant.

use std::num::NonZeroU32;

use sha2::{Digest, Sha256};

use crate::error::{ConfigError, invalid};
use crate::raw::{RawApiKey, RawTenant};

/// The SHA-256 digest of an API key, as keys are stored (`ringmaster key-hash` prints it).
pub fn key_digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// An API key and what it grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKey {
    /// The secret's SHA-256 (the secret itself is not kept).
    pub digest: [u8; 32],
    /// Its tier.
    pub tier: String,
    /// Its `[[tenants]]` entry; `None`: its own tenant.
    pub tenant: Option<String>,
    /// The models it may use (`None`: all).
    pub models: Option<Vec<String>>,
    /// Its own limits.
    pub limits: RateLimits,
}

/// Per-minute limits of a key or a tenant; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimits {
    /// Requests per minute.
    pub requests_per_minute: Option<NonZeroU32>,
    /// Input tokens per minute.
    pub input_tokens_per_minute: Option<NonZeroU32>,
    /// Output tokens per minute.
    pub output_tokens_per_minute: Option<NonZeroU32>,
}

/// A tenant: limits shared by its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// Its limits.
    pub limits: RateLimits,
    /// The models its keys may use (`None`: all).
    pub models: Option<Vec<String>>,
    /// Whether its requests may spill to a `[[fallback]]` pool.
    pub fallback: bool,
}

/// Validates a key's or tenant's three limits (`at` names the entry in messages).
fn rate_limits(at: &str, values: [Option<u32>; 3]) -> Result<RateLimits, ConfigError> {
    let [requests, input, output] = values;
    let one = |value: Option<u32>, field: &str| -> Result<Option<NonZeroU32>, ConfigError> {
        value
            .map(|n| {
                NonZeroU32::new(n)
                    .ok_or_else(|| invalid(format!("{at}.{field}"), "must be at least 1"))
            })
            .transpose()
    };
    Ok(RateLimits {
        requests_per_minute: one(requests, "requests_per_minute")?,
        input_tokens_per_minute: one(input, "input_tokens_per_minute")?,
        output_tokens_per_minute: one(output, "output_tokens_per_minute")?,
    })
}

/// Validates a `models` allow-list. Its names are not checked against `models`: servers may
/// serve more models than the config names.
fn allowed_models(
    at: &str,
    models: Option<Vec<String>>,
) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(models) = models else {
        return Ok(None);
    };
    if models.is_empty() {
        return Err(invalid(
            format!("{at}.models"),
            "must name at least one model (leave it out for all)",
        ));
    }
    Ok(Some(models))
}

/// Validates `[[tenants]]` and then `[[api_keys]]` (whose tenants must exist).
pub(crate) fn keys_and_tenants(
    raw_tenants: Vec<RawTenant>,
    raw_keys: Vec<RawApiKey>,
) -> Result<(Vec<ApiKey>, Vec<Tenant>), ConfigError> {
    let mut tenants: Vec<Tenant> = Vec::new();
    for (i, raw) in raw_tenants.into_iter().enumerate() {
        let at = format!("tenants[{i}]");
        let tenant = tenant(&at, raw)?;
        if tenants.iter().any(|t| t.name == tenant.name) {
            return Err(invalid(
                format!("{at}.name"),
                format!("duplicate tenant {:?}", tenant.name),
            ));
        }
        tenants.push(tenant);
    }
    let mut api_keys: Vec<ApiKey> = Vec::new();
    for (i, raw) in raw_keys.into_iter().enumerate() {
        let at = format!("api_keys[{i}]");
        let key = api_key(&at, raw, &tenants)?;
        if api_keys.iter().any(|k| k.digest == key.digest) {
            return Err(invalid(at, "duplicate key"));
        }
        api_keys.push(key);
    }
    Ok((api_keys, tenants))
}

/// Validates one tenant (`at` names it in messages): a `[[tenants]]` entry, or one
/// `POST /admin/tenants` adds.
pub fn tenant(at: &str, raw: RawTenant) -> Result<Tenant, ConfigError> {
    if raw.name.trim().is_empty() || raw.name.len() > 64 {
        return Err(invalid(format!("{at}.name"), "must be 1 to 64 characters"));
    }
    Ok(Tenant {
        limits: rate_limits(
            at,
            [
                raw.requests_per_minute,
                raw.input_tokens_per_minute,
                raw.output_tokens_per_minute,
            ],
        )?,
        models: allowed_models(at, raw.models)?,
        fallback: raw.fallback.unwrap_or(true),
        name: raw.name,
    })
}

/// Validates one key against the `tenants` it may name: an `[[api_keys]]` entry, or one
/// `POST /admin/keys` adds.
pub fn api_key(at: &str, raw: RawApiKey, tenants: &[Tenant]) -> Result<ApiKey, ConfigError> {
    let digest = match (raw.key, raw.key_sha256) {
        (Some(key), None) => {
            if key.len() < 8 || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(invalid(
                    format!("{at}.key"),
                    "must be at least 8 characters with no whitespace",
                ));
            }
            key_digest(&key)
        }
        (None, Some(hex_digest)) => {
            let mut digest = [0u8; 32];
            hex::decode_to_slice(hex_digest.trim(), &mut digest).map_err(|_| {
                invalid(
                    format!("{at}.key_sha256"),
                    "must be 64 hexadecimal digits (a SHA-256)",
                )
            })?;
            digest
        }
        (Some(_), Some(_)) => {
            return Err(invalid(at, "give key or key_sha256, not both"));
        }
        (None, None) => {
            return Err(invalid(
                format!("{at}.key"),
                "field required (or key_sha256)",
            ));
        }
    };
    if let Some(tenant) = &raw.tenant
        && !tenants.iter().any(|t| &t.name == tenant)
    {
        return Err(invalid(
            format!("{at}.tenant"),
            format!("no [[tenants]] entry is named {tenant:?}"),
        ));
    }
    Ok(ApiKey {
        digest,
        tier: raw.tier.unwrap_or_else(|| "default".to_owned()),
        limits: rate_limits(
            at,
            [
                raw.requests_per_minute,
                raw.input_tokens_per_minute,
                raw.output_tokens_per_minute,
            ],
        )?,
        models: allowed_models(at, raw.models)?,
        tenant: raw.tenant,
    })
}

/// A key's id, as the admin API names it: the first 8 bytes of its digest in hex (not
/// enough to find the key, enough to tell keys apart).
pub fn key_id(digest: &[u8; 32]) -> String {
    hex::encode(&digest[..8])
}
