//! Ringmaster's gateway: the Anthropic Messages API in front of a pool of GPU servers.
//!
//! A request passes through authentication and rate limits ([`auth`]), parsing and validation
//! ([`api`]), the routing key and prefix hashes ([`routing`]), the bounded-load ring over the
//! server pool ([`pool`]), and comes back as JSON or server-sent events ([`service`]). The admin
//! API ([`admin`]) changes the pool at run time; [`metrics`] exposes everything an operator
//! watches. Configuration is validated once ([`config`]) and only the validated form travels.
//!
//! The gateway knows no routing policy's logic beyond its built-in ring; it never logs a prompt
//! or a key. Start one with [`Gateway::start`] and [`serve`].

#![deny(missing_docs)]

mod admin;
pub mod api;
pub mod auth;
mod body;
pub mod builtin;
pub mod config;
pub mod error;
pub mod metrics;
pub mod policy;
pub mod pool;
pub mod prefix_index;
pub mod routing;
mod service;

use std::sync::Arc;

pub use config::{Config, RawConfig};
pub use service::serve;

use ringmaster_policy_engine::PolicyEngine;

use crate::auth::Authenticator;
use crate::config::PolicySource;
use crate::metrics::Metrics;
use crate::policy::{RouterSlot, SlotError};
use crate::pool::{Pool, PoolError};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A GPU server could not start.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// The policy engine could not start.
    #[error("policy engine: {0}")]
    Engine(#[from] ringmaster_policy_engine::PolicyError),
    /// A configured policy could not be read.
    #[error("router variant {variant:?}: cannot read {path}: {source}")]
    ReadPolicy {
        /// The variant.
        variant: String,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A configured policy was refused.
    #[error("router variant {variant:?} ({source_name}): {error}")]
    LoadPolicy {
        /// The variant.
        variant: String,
        /// Where its component came from.
        source_name: String,
        /// Why it was refused.
        error: SlotError,
    },
}

/// A running gateway's shared state.
#[derive(Debug)]
pub struct Gateway {
    config: Config,
    pool: Arc<Pool>,
    router: Arc<RouterSlot>,
    auth: Authenticator,
    metrics: Metrics,
}

impl Gateway {
    /// Starts the configured servers, loads the configured policies and builds the gateway.
    /// Needs a tokio runtime.
    pub fn start(config: Config) -> Result<Arc<Self>, StartError> {
        let pool = Arc::new(Pool::start(
            &config.servers,
            config.strategy,
            config.ring.clone(),
            config.simulator.clone(),
        )?);
        let engine = PolicyEngine::new(config.policies.engine.clone())?;
        let router = Arc::new(RouterSlot::new(engine));
        for variant in &config.policies.router {
            let bytes = policy_bytes(&variant.source).map_err(|source| StartError::ReadPolicy {
                variant: variant.name.clone(),
                path: variant.source.to_string(),
                source,
            })?;
            router
                .install(
                    &variant.name,
                    &bytes,
                    Some(variant.weight),
                    variant.shadow,
                    Some(variant.config.clone()),
                )
                .map_err(|error| StartError::LoadPolicy {
                    variant: variant.name.clone(),
                    source_name: variant.source.to_string(),
                    error,
                })?;
        }
        Ok(Arc::new(Self {
            auth: Authenticator::new(&config.api_keys),
            metrics: Metrics::new(pool.clone(), router.clone()),
            pool,
            router,
            config,
        }))
    }

    /// The router slot.
    pub fn router(&self) -> &Arc<RouterSlot> {
        &self.router
    }

    /// Re-reads every router variant whose component is a file and swaps in the ones that
    /// changed (SIGHUP, or the file watcher). A failure leaves that variant's running version
    /// in place and is logged with its reason.
    pub fn reload_policies(&self) -> Vec<(String, Result<bool, String>)> {
        let mut outcomes = Vec::new();
        for variant in &self.config.policies.router {
            let PolicySource::File(path) = &variant.source else {
                continue;
            };
            let outcome = std::fs::read(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|bytes| {
                    self.router
                        .install(&variant.name, &bytes, None, variant.shadow, None)
                        .map_err(|e| e.to_string())
                });
            match &outcome {
                Ok(true) => {
                    tracing::info!(variant = %variant.name, path = %path.display(), "policy.reloaded")
                }
                Ok(false) => {}
                Err(reason) => {
                    tracing::warn!(variant = %variant.name, %reason, "policy.reload_refused")
                }
            }
            outcomes.push((variant.name.clone(), outcome));
        }
        outcomes
    }

    /// The policy files to watch, with their current modification stamps.
    fn policy_file_stamps(&self) -> Vec<Option<(std::time::SystemTime, u64)>> {
        self.config
            .policies
            .router
            .iter()
            .map(|variant| match &variant.source {
                PolicySource::File(path) => std::fs::metadata(path)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len()))),
                PolicySource::Builtin(_) => None,
            })
            .collect()
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The server pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    fn limits(&self) -> api::Limits<'_> {
        api::Limits {
            models: &self.config.models,
            max_output_tokens: self.config.max_output_tokens,
        }
    }
}

/// The component bytes of a policy source.
pub fn policy_bytes(source: &PolicySource) -> std::io::Result<Vec<u8>> {
    match source {
        PolicySource::Builtin(name) => {
            builtin::builtin(name).map(<[u8]>::to_vec).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("no built-in policy {name:?}"),
                )
            })
        }
        PolicySource::File(path) => std::fs::read(path),
    }
}

/// How often configured policy files are checked for changes.
pub const POLICY_WATCH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Watches the configured policy files and reloads them when they change, until the gateway
/// is dropped.
pub(crate) async fn watch_policy_files(gateway: std::sync::Weak<Gateway>) {
    let mut stamps = match gateway.upgrade() {
        Some(gateway) => gateway.policy_file_stamps(),
        None => return,
    };
    if stamps.iter().all(Option::is_none) {
        return;
    }
    let mut tick = tokio::time::interval(POLICY_WATCH_INTERVAL);
    loop {
        tick.tick().await;
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        let now = gateway.policy_file_stamps();
        if now != stamps {
            stamps = now;
            let gateway = gateway.clone();
            let _ = tokio::task::spawn_blocking(move || gateway.reload_policies()).await;
        }
    }
}
