//! [`KeyBook`]: the keys and tenants as they are now. They start as the configuration gives
//! them and change while the gateway runs (`POST/DELETE /admin/keys`, `/admin/tenants`): each
//! change builds a new [`Authenticator`] that keeps the buckets of whatever it did not touch,
//! and swaps it in whole, so a request sees one table from start to end and no request waits
//! for a change.

use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use ringmaster_config::{ApiKey, Tenant, key_id};

use crate::Authenticator;

/// Why a change to the keys or tenants was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookError {
    /// A key names a tenant that does not exist.
    #[error("no tenant is named {0:?}: add it first (POST /admin/tenants)")]
    UnknownTenant(String),
    /// Keys still belong to the tenant.
    #[error("the tenant {name:?} still has {keys} key(s): remove them first")]
    TenantInUse {
        /// The tenant.
        name: String,
        /// How many keys name it.
        keys: usize,
    },
}

/// The keys and tenants now.
#[derive(Debug)]
pub struct KeyBook {
    current: ArcSwap<Authenticator>,
    /// Held while a change is built, so that two changes never build on the same table.
    writing: Mutex<()>,
}

impl KeyBook {
    /// The book, starting with `authenticator`.
    pub fn new(authenticator: Authenticator) -> Self {
        Self {
            current: ArcSwap::from_pointee(authenticator),
            writing: Mutex::new(()),
        }
    }

    /// The table now (a request holds it for its authentication).
    pub fn current(&self) -> Arc<Authenticator> {
        self.current.load_full()
    }

    /// Adds `key`, or replaces the key with the same digest (its limits, tier, tenant,
    /// models). Its tenant must exist.
    pub fn put_key(&self, key: ApiKey) -> Result<(), BookError> {
        self.change(|keys, tenants| {
            if let Some(tenant) = &key.tenant
                && !tenants.iter().any(|t| &t.name == tenant)
            {
                return Err(BookError::UnknownTenant(tenant.clone()));
            }
            match keys.iter_mut().find(|k| k.digest == key.digest) {
                Some(old) => *old = key.clone(),
                None => keys.push(key.clone()),
            }
            Ok(())
        })
    }

    /// Removes the key whose id ([`key_id`]) is `id`; `false` when there is none.
    pub fn remove_key(&self, id: &str) -> bool {
        let mut found = false;
        let _ = self.change(|keys, _| {
            let before = keys.len();
            keys.retain(|k| key_id(&k.digest) != id);
            found = keys.len() < before;
            Ok(())
        });
        found
    }

    /// Adds `tenant`, or replaces the one of that name (its limits apply from now on).
    pub fn put_tenant(&self, tenant: Tenant) {
        let _ = self.change(|_, tenants| {
            match tenants.iter_mut().find(|t| t.name == tenant.name) {
                Some(old) => *old = tenant.clone(),
                None => tenants.push(tenant.clone()),
            }
            Ok(())
        });
    }

    /// Removes the tenant `name`; `Ok(false)` when there is none, refused while keys name it.
    pub fn remove_tenant(&self, name: &str) -> Result<bool, BookError> {
        let mut found = false;
        self.change(|keys, tenants| {
            let users = keys
                .iter()
                .filter(|k| k.tenant.as_deref() == Some(name))
                .count();
            if users > 0 {
                return Err(BookError::TenantInUse {
                    name: name.to_owned(),
                    keys: users,
                });
            }
            let before = tenants.len();
            tenants.retain(|t| t.name != name);
            found = tenants.len() < before;
            Ok(())
        })?;
        Ok(found)
    }

    /// Applies `edit` to copies of the keys and tenants and swaps in the table they make.
    fn change(
        &self,
        edit: impl FnOnce(&mut Vec<ApiKey>, &mut Vec<Tenant>) -> Result<(), BookError>,
    ) -> Result<(), BookError> {
        let _writing = self.writing.lock().unwrap_or_else(PoisonError::into_inner);
        let current = self.current.load_full();
        let mut keys = current.configured_keys();
        let mut tenants = current.configured_tenants();
        edit(&mut keys, &mut tenants)?;
        self.current
            .store(Arc::new(current.rebuilt(&keys, &tenants)));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use ringmaster_config::{RateLimits, key_digest};

    use super::*;

    fn key(secret: &str, tenant: Option<&str>, per_minute: u32) -> ApiKey {
        ApiKey {
            digest: key_digest(secret),
            tier: "default".into(),
            tenant: tenant.map(str::to_owned),
            models: None,
            limits: RateLimits {
                requests_per_minute: NonZeroU32::new(per_minute),
                ..RateLimits::default()
            },
        }
    }

    #[test]
    fn keys_and_tenants_change_live_and_untouched_buckets_stay_drawn() {
        let book = KeyBook::new(Authenticator::new(&[key("sk-first-key", None, 2)], &[]));
        // The first key uses up its two requests.
        let auth = book.current();
        auth.check(Some("sk-first-key")).unwrap();
        auth.check(Some("sk-first-key")).unwrap();
        assert!(auth.check(Some("sk-first-key")).is_err());
        assert!(auth.check(Some("sk-second-key")).is_err());

        // A key for a tenant that does not exist yet is refused; with the tenant, it admits.
        assert_eq!(
            book.put_key(key("sk-second-key", Some("acme"), 100)),
            Err(BookError::UnknownTenant("acme".into()))
        );
        book.put_tenant(Tenant {
            name: "acme".into(),
            limits: RateLimits::default(),
            models: None,
            fallback: true,
        });
        book.put_key(key("sk-second-key", Some("acme"), 100))
            .unwrap();
        let auth = book.current();
        let caller = auth.check(Some("sk-second-key")).unwrap();
        assert_eq!(&*caller.tenant, "acme");
        // The untouched key's bucket is still empty: a change refills nothing it did not touch.
        assert!(auth.check(Some("sk-first-key")).is_err());
        assert_eq!(
            auth.label_of(&key_digest("sk-first-key")).as_deref(),
            Some("key#0")
        );
        assert_eq!(
            auth.label_of(&key_digest("sk-second-key")).as_deref(),
            Some("key#1")
        );

        // A tenant with keys is not removed; once they are gone it is.
        assert!(matches!(
            book.remove_tenant("acme"),
            Err(BookError::TenantInUse { keys: 1, .. })
        ));
        assert!(book.remove_key(&key_id(&key_digest("sk-second-key"))));
        assert!(!book.remove_key(&key_id(&key_digest("sk-second-key"))));
        assert!(book.current().check(Some("sk-second-key")).is_err());
        assert_eq!(book.remove_tenant("acme"), Ok(true));
    }
}
