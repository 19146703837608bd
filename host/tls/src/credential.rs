//! What a gateway and its `ringmaster worker`s prove to each other on a split request: a
//! secret they share (`[workers] secret_env` on the gateway, `--secret-env` on a worker; the
//! environment variable `RINGMASTER_WORKER_SECRET` by default), and HMAC-SHA256 tags made
//! with it.
//!
//! - A **leg's credential** (header `x-ringmaster-leg-credential`,
//!   `ringmaster_wire::reserved::LEG_CREDENTIAL_HEADER`) tags the leg's id (the
//!   `x-request-id` both legs share) and its `kv_transfer_params` as sent: only the gateway
//!   can ask a worker to keep a prompt's blocks or to fetch another worker's, so a client that
//!   reaches a worker cannot make it call an address of its choosing or plant blocks.
//! - A **fetch's credential** tags the id of the blocks a decode worker fetches from a prefill
//!   worker: only a worker of the fleet reads the blocks (they hold a prompt's tokens).
//!
//! The two tags are domain-separated, so one can never stand for the other. Comparison is the
//! `hmac` crate's, in constant time. This module owns the secret and the tags, nothing of
//! HTTP (it sits with TLS as the other half of what gateways and workers trust each other
//! by); the worker decides what a missing or wrong tag costs (`ringmaster_worker::transfer`).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The environment variable that holds the shared secret unless configured otherwise.
pub const DEFAULT_SECRET_ENV: &str = "RINGMASTER_WORKER_SECRET";

/// The shortest secret accepted, bytes: 128 bits, the strength of the tag's key.
pub const MIN_SECRET_BYTES: usize = 16;

/// A secret that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// Shorter than [`MIN_SECRET_BYTES`].
    #[error(
        "the worker secret in {env} is {len} bytes; it must be at least {MIN_SECRET_BYTES} (for \
         example: openssl rand -hex 32)"
    )]
    TooShort {
        /// Where it was read from.
        env: String,
        /// Its length.
        len: usize,
    },
}

/// The secret the workers share with their gateways.
#[derive(Clone)]
pub struct WorkerSecret {
    key: Vec<u8>,
}

impl std::fmt::Debug for WorkerSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerSecret(..)")
    }
}

impl WorkerSecret {
    /// The secret in the environment variable `env` (`None`: unset or empty).
    pub fn from_env(env: &str) -> Result<Option<Self>, SecretError> {
        match std::env::var(env) {
            Ok(value) if !value.is_empty() => Self::new(env, value.as_bytes()).map(Some),
            _ => Ok(None),
        }
    }

    /// `key` as the secret (`source` names where it came from, for the error).
    pub fn new(source: &str, key: &[u8]) -> Result<Self, SecretError> {
        if key.len() < MIN_SECRET_BYTES {
            return Err(SecretError::TooShort {
                env: source.to_owned(),
                len: key.len(),
            });
        }
        Ok(Self { key: key.to_vec() })
    }

    fn mac(&self, domain: &str, parts: &[&str]) -> Hmac<Sha256> {
        // A key of any length is accepted by HMAC: this cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        mac.update(domain.as_bytes());
        for part in parts {
            // Each part's length first, so that no two different lists tag alike.
            mac.update(&(part.len() as u64).to_le_bytes());
            mac.update(part.as_bytes());
        }
        mac
    }

    /// The credential of a leg with id `leg_id` carrying `params` (the `kv_transfer_params`
    /// JSON text exactly as sent), as lowercase hex.
    pub fn leg_credential(&self, leg_id: &str, params: &str) -> String {
        hex::encode(
            self.mac("ringmaster-leg-v1", &[leg_id, params])
                .finalize()
                .into_bytes(),
        )
    }

    /// Whether `presented` is the credential of that leg.
    pub fn verify_leg(&self, leg_id: &str, params: &str, presented: &str) -> bool {
        verify(self.mac("ringmaster-leg-v1", &[leg_id, params]), presented)
    }

    /// The credential of a fetch of the blocks kept under `transfer_id`.
    pub fn fetch_credential(&self, transfer_id: &str) -> String {
        hex::encode(
            self.mac("ringmaster-fetch-v1", &[transfer_id])
                .finalize()
                .into_bytes(),
        )
    }

    /// Whether `presented` is the credential of that fetch.
    pub fn verify_fetch(&self, transfer_id: &str, presented: &str) -> bool {
        verify(self.mac("ringmaster-fetch-v1", &[transfer_id]), presented)
    }
}

fn verify(mac: Hmac<Sha256>, presented: &str) -> bool {
    match hex::decode(presented.trim()) {
        Ok(tag) => mac.verify_slice(&tag).is_ok(),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(key: &str) -> WorkerSecret {
        WorkerSecret::new("test", key.as_bytes()).unwrap()
    }

    #[test]
    fn a_credential_holds_for_its_leg_alone_and_under_its_secret_alone() {
        let ours = secret("0123456789abcdef-ours");
        let tag = ours.leg_credential("req-1", r#"{"do_remote_decode":true}"#);
        assert_eq!(tag.len(), 64);
        assert!(ours.verify_leg("req-1", r#"{"do_remote_decode":true}"#, &tag));
        assert!(!ours.verify_leg("req-2", r#"{"do_remote_decode":true}"#, &tag));
        assert!(!ours.verify_leg("req-1", r#"{"do_remote_decode": true}"#, &tag));
        assert!(!secret("0123456789abcdef-theirs").verify_leg(
            "req-1",
            r#"{"do_remote_decode":true}"#,
            &tag
        ));
        // The parts are length-prefixed: moving a boundary changes the tag.
        assert_ne!(
            ours.leg_credential("ab", "c"),
            ours.leg_credential("a", "bc")
        );
        // A fetch's tag never stands for a leg's, nor the reverse.
        let fetch = ours.fetch_credential("req-1");
        assert!(ours.verify_fetch("req-1", &fetch));
        assert!(!ours.verify_leg("req-1", "", &fetch));
        assert!(!ours.verify_fetch("req-1", &ours.leg_credential("req-1", "")));
        assert!(!ours.verify_fetch("req-1", "not hex"));
        assert!(!ours.verify_fetch("req-1", ""));
    }

    #[test]
    fn a_short_secret_is_refused_and_never_printed() {
        let err = WorkerSecret::new("RINGMASTER_WORKER_SECRET", b"short").unwrap_err();
        assert!(err.to_string().contains("at least 16"), "{err}");
        assert_eq!(
            format!("{:?}", secret("0123456789abcdef")),
            "WorkerSecret(..)"
        );
    }
}
