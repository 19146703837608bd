//! [`Authenticator`]: the configured keys and tenants. A presented key is hashed, and its
//! digest compared in constant time (`subtle`) with the ones stored under the same 8-byte
//! prefix; with no keys configured every caller is anonymous.

use std::collections::HashMap;
use std::sync::Arc;

use ringmaster_config::{ApiKey, Tenant, key_digest};
use subtle::ConstantTimeEq;

use crate::Refusal;
use crate::caller::{Account, Buckets, Caller, TenantEntry, limited};
use crate::shared::SharedBuckets;

/// The configured keys and tenants.
#[derive(Debug)]
pub struct Authenticator {
    /// Keys by the first 8 bytes of their digest (the rest is compared in constant time).
    keys: HashMap<u64, Vec<(Arc<Account>, Caller)>>,
    /// Every caller when no key is configured (cloned per request: no allocation).
    anonymous: Caller,
    /// The keys and tenants it was built from, each with what was built for it, so that a
    /// rebuild keeps the buckets (and labels) of whatever did not change.
    built: Built,
}

/// What an [`Authenticator`] was built from.
#[derive(Debug, Default)]
struct Built {
    keys: Vec<(ApiKey, Arc<Account>, Caller)>,
    tenants: Vec<(Tenant, Arc<TenantEntry>)>,
    shared: Option<Arc<dyn SharedBuckets>>,
    /// The next key label's number.
    next_label: usize,
}

impl Authenticator {
    /// Builds the key table (the config has checked that every key's tenant exists).
    pub fn new(keys: &[ApiKey], tenants: &[Tenant]) -> Self {
        Self::with_shared(keys, tenants, None)
    }

    /// [`Self::new`], with the limits kept in a store the fleet's replicas share (`None`: this
    /// process's own buckets).
    pub fn with_shared(
        keys: &[ApiKey],
        tenants: &[Tenant],
        shared: Option<Arc<dyn SharedBuckets>>,
    ) -> Self {
        Self::build(
            keys,
            tenants,
            &Built {
                shared,
                ..Built::default()
            },
        )
    }

    /// The table for `keys` and `tenants` (whose every named tenant exists), keeping the
    /// buckets and label of each key and tenant that is the same in `self`: a change to one
    /// key's limits refills that key's buckets only.
    pub fn rebuilt(&self, keys: &[ApiKey], tenants: &[Tenant]) -> Self {
        Self::build(keys, tenants, &self.built)
    }

    /// The keys it holds.
    pub fn configured_keys(&self) -> Vec<ApiKey> {
        self.built.keys.iter().map(|(k, _, _)| k.clone()).collect()
    }

    /// The tenants it holds.
    pub fn configured_tenants(&self) -> Vec<Tenant> {
        self.built.tenants.iter().map(|(t, _)| t.clone()).collect()
    }

    /// The tenant named `name`, as configured.
    pub fn tenant(&self, name: &str) -> Option<&Tenant> {
        self.built
            .tenants
            .iter()
            .map(|(t, _)| t)
            .find(|t| t.name == name)
    }

    /// Each key's label (`key#N`, as in logs) by its digest.
    pub fn label_of(&self, digest: &[u8; 32]) -> Option<Arc<str>> {
        self.built
            .keys
            .iter()
            .find(|(k, _, _)| &k.digest == digest)
            .map(|(_, _, caller)| caller.key_label.clone())
    }

    fn build(keys: &[ApiKey], tenants: &[Tenant], before: &Built) -> Self {
        let shared = before.shared.clone();
        let built_tenants: Vec<(Tenant, Arc<TenantEntry>)> = tenants
            .iter()
            .map(|t| {
                let kept = before
                    .tenants
                    .iter()
                    .find(|(old, _)| old == t)
                    .map(|(_, entry)| entry.clone());
                let entry = kept.unwrap_or_else(|| {
                    Arc::new(TenantEntry {
                        name: t.name.clone(),
                        buckets: Buckets::new(format!("tenant:{}", t.name), &t.limits),
                        models: t.models.clone(),
                    })
                });
                (t.clone(), entry)
            })
            .collect();
        let tenant_entries: HashMap<&str, Arc<TenantEntry>> = built_tenants
            .iter()
            .map(|(t, entry)| (t.name.as_str(), entry.clone()))
            .collect();
        let mut next_label = before.next_label;
        let mut table: HashMap<u64, Vec<(Arc<Account>, Caller)>> = HashMap::new();
        let mut built_keys = Vec::with_capacity(keys.len());
        for key in keys {
            let tenant = key
                .tenant
                .as_deref()
                .and_then(|t| tenant_entries.get(t).cloned());
            // Kept when the key and the tenant entry it draws on are both unchanged.
            let kept = before.keys.iter().find(|(old, account, _)| {
                old == key
                    && match &tenant {
                        Some(entry) => Arc::ptr_eq(entry, &account.tenant),
                        None => old.tenant.is_none(),
                    }
            });
            let (account, caller) = match kept {
                Some((_, account, caller)) => (account.clone(), caller.clone()),
                None => {
                    let label = before
                        .keys
                        .iter()
                        .find(|(old, _, _)| old.digest == key.digest)
                        .map_or_else(
                            || {
                                next_label += 1;
                                format!("key#{}", next_label - 1)
                            },
                            |(_, _, caller)| caller.key_label.to_string(),
                        );
                    let tenant = tenant.unwrap_or_else(|| {
                        // A key without a tenant is its own.
                        Arc::new(TenantEntry {
                            name: label.clone(),
                            // Named by the key's digest, not its label: replicas with the
                            // keys in another order share the same buckets.
                            buckets: Buckets {
                                id: format!("tenant:key:{}", hex8(&key.digest)),
                                ..Buckets::default()
                            },
                            models: None,
                        })
                    });
                    let account = Arc::new(Account {
                        digest: key.digest,
                        buckets: Buckets::new(format!("key:{}", hex8(&key.digest)), &key.limits),
                        tenant: tenant.clone(),
                        models: key.models.clone(),
                        shared: shared.clone(),
                    });
                    let caller = Caller {
                        tier: key.tier.as_str().into(),
                        key_label: label.into(),
                        // A key without a tenant is its own, named by its label (its
                        // place in the list): the owner takes no name from that.
                        owner: crate::caller::owner_id(
                            &key.digest,
                            key.tenant.as_deref().unwrap_or_default(),
                        )
                        .into(),
                        tenant: tenant.name.as_str().into(),
                        account: Some(account.clone()),
                    };
                    (account, caller)
                }
            };
            table
                .entry(prefix(&key.digest))
                .or_default()
                .push((account.clone(), caller.clone()));
            built_keys.push((key.clone(), account, caller));
        }
        Self {
            keys: table,
            anonymous: Caller::unlimited("anonymous", "anonymous"),
            built: Built {
                keys: built_keys,
                tenants: built_tenants,
                shared,
                next_label,
            },
        }
    }

    /// Whether any key is configured.
    pub fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The tenant of the key presented, if it is a valid key (for counting a refusal by
    /// tenant; charges nothing).
    pub fn tenant_of(&self, presented: Option<&str>) -> Option<std::sync::Arc<str>> {
        let digest = key_digest(presented?);
        self.keys
            .get(&prefix(&digest))?
            .iter()
            .find(|(account, _)| bool::from(account.digest.ct_eq(&digest)))
            .map(|(_, caller)| caller.tenant.clone())
    }

    /// The caller of the key presented, if it is a valid key (for the rate-limit headers of a
    /// refusal; charges nothing).
    pub fn caller_of(&self, presented: Option<&str>) -> Option<Caller> {
        let digest = key_digest(presented?);
        self.keys
            .get(&prefix(&digest))?
            .iter()
            .find(|(account, _)| bool::from(account.digest.ct_eq(&digest)))
            .map(|(_, caller)| caller.clone())
    }

    /// Authenticates the key a request presented and charges one request to its key's and
    /// tenant's buckets (with shared limits, the request is charged with the rest of the
    /// admission: [`Caller::admit_shared`], [`Caller::take_request`]).
    pub fn check(&self, presented: Option<&str>) -> Result<Caller, Refusal> {
        if self.keys.is_empty() {
            return Ok(self.anonymous.clone());
        }
        let presented = presented.ok_or(Refusal::MissingKey)?;
        let digest = key_digest(presented);
        let (account, caller) = self
            .keys
            .get(&prefix(&digest))
            .and_then(|candidates| {
                candidates
                    .iter()
                    .find(|(account, _)| bool::from(account.digest.ct_eq(&digest)))
            })
            .ok_or(Refusal::InvalidKey)?;
        if account.shared.is_some() {
            return Ok(caller.clone());
        }
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

/// The first 8 bytes of a key's digest, as hex: its buckets' shared id (not a secret).
fn hex8(digest: &[u8; 32]) -> String {
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn prefix(digest: &[u8; 32]) -> u64 {
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}
