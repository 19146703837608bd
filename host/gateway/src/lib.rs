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
pub mod config;
pub mod error;
pub mod metrics;
pub mod pool;
pub mod routing;
mod service;

use std::sync::Arc;

pub use config::{Config, RawConfig};
pub use service::serve;

use crate::auth::Authenticator;
use crate::metrics::Metrics;
use crate::pool::{Pool, PoolError};

/// A running gateway's shared state.
#[derive(Debug)]
pub struct Gateway {
    config: Config,
    pool: Arc<Pool>,
    auth: Authenticator,
    metrics: Metrics,
}

impl Gateway {
    /// Starts the configured servers and builds the gateway. Needs a tokio runtime.
    pub fn start(config: Config) -> Result<Arc<Self>, PoolError> {
        let pool = Arc::new(Pool::start(
            &config.servers,
            config.strategy,
            config.ring.clone(),
            config.simulator.clone(),
        )?);
        Ok(Arc::new(Self {
            auth: Authenticator::new(&config.api_keys),
            metrics: Metrics::new(pool.clone()),
            pool,
            config,
        }))
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
