//! `[workers]`: what the gateway shares with its `ringmaster worker`s. Today that is the
//! secret a split request's legs are signed with (`secret_env`, the environment variable that
//! holds it, `RINGMASTER_WORKER_SECRET` by default): a worker takes a leg, or hands over the
//! KV blocks it kept, only with a credential made from it (see `ringmaster_serve::credential`).
//!
//! The secret is read here, once, from the environment (never from the file, so a config can be
//! shared without it), checked for length, and carried redacted.

use crate::error::{ConfigError, invalid};
use crate::raw::RawWorkers;
use crate::servers::{Secret, ServerSpec};
use crate::{Connector, Role};

/// The environment variable holding the workers' secret unless `[workers] secret_env` names
/// another.
pub const DEFAULT_SECRET_ENV: &str = "RINGMASTER_WORKER_SECRET";

/// The shortest secret accepted, bytes (128 bits).
pub const MIN_SECRET_BYTES: usize = 16;

/// `[workers]`, validated.
#[derive(Clone, Debug, Default)]
pub struct WorkersSettings {
    /// The environment variable the secret was read from.
    pub secret_env: String,
    /// The secret (`None`: unset; legs to `ringmaster worker`s go unsigned, and the workers
    /// serve them whole).
    pub secret: Option<Secret>,
}

/// Validates `[workers]` against the servers configured: a remote server that takes a
/// split request's legs by `ringmaster worker`'s exchange needs the secret.
pub(crate) fn workers(
    raw: RawWorkers,
    servers: &[ServerSpec],
    env: &impl Fn(&str) -> Option<String>,
) -> Result<WorkersSettings, ConfigError> {
    let secret_env = match raw.secret_env {
        Some(name) if name.trim().is_empty() => {
            return Err(invalid(
                "workers.secret_env",
                "must name an environment variable",
            ));
        }
        Some(name) => name,
        None => DEFAULT_SECRET_ENV.to_owned(),
    };
    let secret = env(&secret_env).filter(|s| !s.is_empty());
    if let Some(secret) = &secret
        && secret.len() < MIN_SECRET_BYTES
    {
        return Err(invalid(
            "workers.secret_env",
            format!(
                "the secret in {secret_env} is {} bytes; it must be at least {MIN_SECRET_BYTES} \
                 (for example: openssl rand -hex 32)",
                secret.len()
            ),
        ));
    }
    let signed = servers.iter().find(|s| {
        s.role.role != Role::Both
            && s.role.connector == Some(Connector::Ringmaster)
            && !s.address.is_in_process()
    });
    if let (Some(server), None) = (signed, &secret) {
        return Err(invalid(
            "workers.secret_env",
            format!(
                "server {:?} takes split requests' legs as a ringmaster worker, which takes them \
                 only signed with the secret the workers share with their gateways: set \
                 {secret_env} here and for the workers (at least {MIN_SECRET_BYTES} bytes)",
                server.id
            ),
        ));
    }
    Ok(WorkersSettings {
        secret_env,
        secret: secret.map(Secret::new),
    })
}
