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

pub mod admission;
pub mod auth;
pub mod autoscale;
mod body;
pub mod call;
mod collectors;
pub mod conn;
pub mod doors;
pub mod fleet;
pub mod metrics;
pub mod overload;
pub mod recent;
pub mod record;
mod reply;
pub mod respond;
pub mod responses;
pub mod routing;
pub mod safety;
mod send_timeout;
mod service;

/// The API error (the `ringmaster-api` crate's), under the gateway's old path.
pub use ringmaster_api::error;

use std::sync::Arc;

/// The server pool (its own crate), re-exported under the gateway's old paths.
pub use ringmaster_pool as pool;
pub use ringmaster_pool::{kv_view, prefix_index, remote};

pub use body::ResponseBody;
pub use body::full as full_body;
/// The configuration (its own crate), re-exported under the gateway's old paths.
pub use ringmaster_config as config;
pub use ringmaster_config::{Config, RawConfig};
pub use service::{GUARDRAIL_INTERVAL, serve};

use ringmaster_policy_engine::PolicyEngine;

use crate::admission::AdmissionGate;
use crate::auth::Authenticator;
use crate::metrics::Metrics;
use ringmaster_slots::router::{RouterSlot, SlotError};
use crate::safety::SafetyGate;
use ringmaster_slots::single::{PolicySlot, SlotPolicy};
use ringmaster_config::{PolicySource, SlotPolicySpec};
use ringmaster_policy_engine::builtin;
use ringmaster_pool::{Pool, PoolError};

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
    #[error("{variant}: cannot read {path}: {source}")]
    ReadPolicy {
        /// The slot and variant (`router variant "default"`, `admission policy "tiered"`).
        variant: String,
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A configured policy was refused.
    #[error("{variant} ({source_name}): {error}")]
    LoadPolicy {
        /// The slot and variant.
        variant: String,
        /// Where its component came from.
        source_name: String,
        /// Why it was refused.
        error: SlotError,
    },
    /// The traffic recording (`[record]`) could not start.
    #[error(transparent)]
    Record(#[from] record::RecordError),
    /// A setting the configuration checked could not be applied.
    #[error("config: {0}")]
    Config(String),
    /// A setting the engine it configures refused (the CPU lacks the kernels named, the
    /// simulator's numbers do not fit together).
    #[error(transparent)]
    Settings(ringmaster_config::ConfigError),
}

/// A running gateway's shared state.
#[derive(Debug)]
pub struct Gateway {
    config: Config,
    pool: Arc<Pool>,
    router: Arc<RouterSlot>,
    admission: Arc<AdmissionGate>,
    safety: Arc<SafetyGate>,
    auth: Authenticator,
    metrics: Metrics,
    recorder: Option<record::TraceRecorder>,
    streams: Arc<reply::resume::Streams>,
    /// The `/admin/` routes, once mounted ([`Gateway::mount_admin`]).
    admin: std::sync::OnceLock<Arc<dyn AdminRoutes>>,
    /// The fleet this gateway is a replica of (`None`: a process alone).
    cluster: Option<Arc<ringmaster_cluster::Cluster>>,
    /// The last error answers, for the status page.
    recent_errors: recent::RecentErrors,
    /// When it started (the status page's uptime).
    started: std::time::Instant,
    /// Cancelled when the gateway stops accepting: long-lived streams of its own (the
    /// status page's events) end then, so a graceful shutdown does not wait out its grace.
    stopping: tokio_util::sync::CancellationToken,
    /// The open client connections under their cap.
    connections: Arc<conn::Connections>,
    /// The bounds past which new requests are shed.
    overload: Arc<overload::OverloadGuard>,
    /// The system-prompt lines the doors take out (`[routing] volatile_prefix`), compiled.
    volatile: ringmaster_api::VolatileLines,
    /// What the doors do with fields they do not know (`[api] unknown_fields`).
    unknown_fields: ringmaster_api::UnknownFields,
    /// The Responses door's stored responses (in memory, or the fleet's Redis) and those in
    /// flight.
    responses: Arc<responses::Responses>,
}

impl Gateway {
    /// Starts the configured servers, loads the configured policies and builds the gateway.
    /// Needs a tokio runtime.
    pub fn start(config: Config) -> Result<Arc<Self>, StartError> {
        Self::start_in(config, None)
    }

    /// [`Self::start`], as a replica of `cluster` when given: limits, load and experiment
    /// figures are the fleet's, and the replica's lease is kept. The configuration log is
    /// followed by the admin API's applier (`ringmaster-admin`).
    pub fn start_in(
        config: Config,
        cluster: Option<Arc<ringmaster_cluster::Cluster>>,
    ) -> Result<Arc<Self>, StartError> {
        let pool = Arc::new(Pool::start(
            &config.servers,
            pool::settings::ring_config(&config.ring).map_err(StartError::Settings)?,
            pool::ServerTemplates::from_config(&config).map_err(StartError::Settings)?,
        )?);
        let engine = PolicyEngine::new(policy_engine_config(&config.policies.engine))?;
        let router = Arc::new(
            RouterSlot::new(engine)
                .with_guard(config.policies.router_guard, config.ring.load_factor)
                .with_pair_rule(config.disaggregation),
        );
        for variant in &config.policies.router {
            let bytes = policy_bytes(&variant.source).map_err(|source| StartError::ReadPolicy {
                variant: format!("router variant {:?}", variant.name),
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
                    variant: format!("router variant {:?}", variant.name),
                    source_name: variant.source.to_string(),
                    error,
                })?;
        }
        let policies = &config.policies;
        let admission = Arc::new(AdmissionGate::new(
            start_slot(router.engine(), policies.admission.as_ref())?,
            policies.queue_capacity,
            policies.queue_timeout,
            ringmaster_slots::queue::FairQueue::new(policies.queue_aging, policies.queue_priority.clone()),
        ));
        let safety = Arc::new(SafetyGate::new(
            start_slot(router.engine(), policies.safety.as_ref())?,
            policies.safety_window_bytes,
            policies.safety_fail_closed,
        ));
        let recorder = config
            .record
            .as_ref()
            .map(|(path, enabled)| record::TraceRecorder::open(path, *enabled))
            .transpose()?;
        let shared = cluster.as_ref().map(|c| {
            Arc::new(fleet::FleetBuckets::new(c.clone()))
                as Arc<dyn ringmaster_tenancy::SharedBuckets>
        });
        let metrics = {
            let mut metrics = Metrics::new();
            metrics
                .register_collector(Box::new(collectors::ServerCollector { pool: pool.clone() }));
            if let Some(cluster) = &cluster {
                metrics.register_collector(Box::new(fleet::ClusterCollector {
                    cluster: cluster.clone(),
                }));
            }
            metrics.register_collector(Box::new(collectors::PolicyCollector {
                router: router.clone(),
                admission: admission.clone(),
                pool: pool.clone(),
                autoscale: config.autoscale,
            }));
            metrics
        };
        let client = config.client;
        let connections = Arc::new(conn::Connections::new(
            client
                .max_connections
                .resolve(conn::default_max_connections),
            metrics.connections.clone(),
        ));
        let overload = Arc::new(overload::OverloadGuard::new(
            client.max_pending_requests,
            match client.max_memory_bytes {
                ringmaster_config::limits::Bound::Auto => overload::default_max_resident(),
                ringmaster_config::limits::Bound::At(bytes) => Some(bytes),
                ringmaster_config::limits::Bound::Off => None,
            },
            metrics.overload.clone(),
        ));
        let volatile = ringmaster_api::VolatileLines::new(&config.volatile_prefix)
            .map_err(|e| StartError::Config(format!("routing.volatile_prefix: {e}")))?;
        let unknown_fields = match config.unknown_fields {
            ringmaster_config::UnknownFieldPolicy::Pass => ringmaster_api::UnknownFields::Pass,
            ringmaster_config::UnknownFieldPolicy::Drop => ringmaster_api::UnknownFields::Drop,
            ringmaster_config::UnknownFieldPolicy::Refuse => ringmaster_api::UnknownFields::Refuse,
        };
        let store: Arc<dyn responses::ResponseStore> = match &cluster {
            Some(cluster) => Arc::new(responses::FleetStore::new(
                cluster.clone(),
                config.responses.ttl,
            )),
            None => Arc::new(responses::LocalStore::new(
                config.responses.ttl,
                config.responses.max_bytes,
            )),
        };
        let responses = Arc::new(responses::Responses::new(store));
        let gateway = Arc::new(Self {
            volatile,
            unknown_fields,
            responses,
            connections,
            overload,
            recent_errors: recent::RecentErrors::default(),
            started: std::time::Instant::now(),
            stopping: tokio_util::sync::CancellationToken::new(),
            cluster: cluster.clone(),
            recorder,
            streams: reply::resume::Streams::new(config.resume_window),
            admin: std::sync::OnceLock::new(),
            auth: Authenticator::with_shared(&config.api_keys, &config.tenants, shared),
            metrics,
            pool,
            router,
            admission,
            safety,
            config,
        });
        gateway.join_fleet();
        Ok(gateway)
    }

    /// Where the traffic is recorded as a trace, when `[record]` is set.
    pub fn recorder(&self) -> Option<&record::TraceRecorder> {
        self.recorder.as_ref()
    }

    /// The admission gate.
    pub fn admission(&self) -> &Arc<AdmissionGate> {
        &self.admission
    }

    /// The safety gate.
    pub fn safety(&self) -> &Arc<SafetyGate> {
        &self.safety
    }

    /// The last error answers (the status page's).
    pub fn recent_errors(&self) -> &recent::RecentErrors {
        &self.recent_errors
    }

    /// The open client connections and their cap.
    pub fn connections(&self) -> &Arc<conn::Connections> {
        &self.connections
    }

    /// The overload guard.
    pub fn overload(&self) -> &Arc<overload::OverloadGuard> {
        &self.overload
    }

    /// Cancelled once the gateway stops taking connections.
    pub fn stopping(&self) -> &tokio_util::sync::CancellationToken {
        &self.stopping
    }

    /// How long it has run.
    pub fn uptime(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// The router slot: its variants, versions and experiment.
    pub fn router(&self) -> &Arc<RouterSlot> {
        &self.router
    }

    /// Re-reads every router variant whose component is a file and swaps in the ones that
    /// changed (SIGHUP, or the file watcher). A failure leaves that variant's running version
    /// in place and is logged with its reason.
    pub fn reload_policies(&self) -> Vec<(String, Result<bool, String>)> {
        let mut outcomes = Vec::new();
        for (slot, name, path) in self.config.policies.files() {
            let outcome = std::fs::read(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))
                .and_then(|bytes| {
                    match slot {
                        "router" => {
                            let shadow = self
                                .config
                                .policies
                                .router
                                .iter()
                                .any(|v| v.name == name && v.shadow);
                            self.router.install(name, &bytes, None, shadow, None)
                        }
                        "admission" => self.admission.slot.install(name, &bytes, None),
                        _ => self.safety.slot.install(name, &bytes, None),
                    }
                    .map_err(|e| e.to_string())
                });
            match &outcome {
                Ok(true) => {
                    tracing::info!(slot, policy = name, path = %path.display(), "policy.reloaded")
                }
                Ok(false) => {}
                Err(reason) => {
                    tracing::warn!(slot, policy = name, %reason, "policy.reload_refused")
                }
            }
            outcomes.push((format!("{slot}/{name}"), outcome));
        }
        outcomes
    }

    /// The policy files to watch, with their current modification stamps.
    fn policy_file_stamps(&self) -> Vec<Option<(std::time::SystemTime, u64)>> {
        self.config
            .policies
            .files()
            .into_iter()
            .map(|(_, _, path)| {
                std::fs::metadata(path)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len())))
            })
            .collect()
    }

    /// Mounts the `/admin/` routes (the `ringmaster-admin` crate's); a second mount is
    /// ignored. Without one, `/admin/` paths answer 404.
    pub fn mount_admin(&self, routes: Arc<dyn AdminRoutes>) {
        let _ = self.admin.set(routes);
    }

    /// The mounted `/admin/` routes.
    pub fn admin_routes(&self) -> Option<&Arc<dyn AdminRoutes>> {
        self.admin.get()
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The server pool.
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The autoscaling signal and recommendation now (`GET /admin/autoscale`).
    pub fn autoscale(&self) -> autoscale::AutoscaleReport {
        collectors::autoscale_report(&self.pool, &self.admission, &self.config.autoscale)
    }

    fn limits<'a>(&'a self, snapshot: &'a pool::PoolSnapshot) -> ringmaster_api::Limits<'a> {
        ringmaster_api::Limits {
            models: &snapshot.accepted,
            max_output_tokens: self.config.max_output_tokens,
            unknown_fields: self.unknown_fields,
            volatile: &self.volatile,
        }
    }

    /// The Responses door's stored responses and those in flight.
    pub fn responses(&self) -> &Arc<responses::Responses> {
        &self.responses
    }
}

/// What an admin route answers.
pub type AdminFuture<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = Result<http::Response<ResponseBody>, error::ApiError>>
            + Send
            + 'a,
    >,
>;

/// The `/admin/` routes, plugged in at start: the admin API is a crate of its own
/// (`ringmaster-admin`), which depends on the gateway, not the reverse.
pub trait AdminRoutes: Send + Sync + std::fmt::Debug {
    /// Answers an `/admin/…` request.
    fn handle<'a>(
        &'a self,
        gateway: &'a Arc<Gateway>,
        req: http::Request<hyper::body::Incoming>,
    ) -> AdminFuture<'a>;
}

/// The component bytes of a policy source.
pub fn policy_bytes(source: &PolicySource) -> std::io::Result<Vec<u8>> {
    match source {
        PolicySource::Builtin(name) => {
            builtin::builtin(name).map(<[u8]>::to_vec).ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!(
                        "no built-in policy {name:?}; built-ins: {}",
                        builtin::builtin_names()
                    ),
                )
            })
        }
        PolicySource::File(path) => std::fs::read(path),
    }
}

/// The policy engine's settings: its defaults with `[policies]`' limits over them.
pub fn policy_engine_config(
    settings: &ringmaster_config::PolicyEngineSettings,
) -> ringmaster_policy_engine::EngineConfig {
    let mut engine = ringmaster_policy_engine::EngineConfig::default();
    let s = settings;
    engine.call_deadline = s.call_deadline.unwrap_or(engine.call_deadline);
    engine.memory_limit_bytes = s.memory_limit_bytes.unwrap_or(engine.memory_limit_bytes);
    engine.state_max_entries = s.state_max_entries.unwrap_or(engine.state_max_entries);
    engine.state_max_bytes = s.state_max_bytes.unwrap_or(engine.state_max_bytes);
    engine.cache_dir = match &s.cache {
        ringmaster_config::ComponentCache::UserCache => {
            ringmaster_policy_engine::default_cache_dir()
        }
        ringmaster_config::ComponentCache::Dir(dir) => Some(dir.clone()),
        ringmaster_config::ComponentCache::Off => None,
    };
    engine
}

/// A single-policy slot with its configured policy loaded (empty when none is configured).
fn start_slot<P: SlotPolicy>(
    engine: &PolicyEngine,
    spec: Option<&SlotPolicySpec>,
) -> Result<PolicySlot<P>, StartError> {
    let slot = PolicySlot::new(engine.clone());
    if let Some(spec) = spec {
        let what = format!("{} policy {:?}", P::SLOT, spec.name);
        let bytes = policy_bytes(&spec.source).map_err(|source| StartError::ReadPolicy {
            variant: what.clone(),
            path: spec.source.to_string(),
            source,
        })?;
        slot.install(&spec.name, &bytes, Some(spec.config.clone()))
            .map_err(|error| StartError::LoadPolicy {
                variant: what,
                source_name: spec.source.to_string(),
                error,
            })?;
    }
    Ok(slot)
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
    if stamps.is_empty() {
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_config_names_the_built_ins_the_engine_embeds() {
        let embedded: Vec<&str> = super::builtin::BUILTIN_POLICIES
            .iter()
            .map(|(name, _)| *name)
            .collect();
        assert_eq!(
            embedded,
            ringmaster_config::policies::BUILTIN_POLICY_NAMES,
            "a built-in was added or renamed: update ringmaster_config::policies::BUILTIN_POLICY_NAMES"
        );
    }

    #[test]
    fn no_policy_setting_is_the_engines_default() {
        let mut expected = ringmaster_policy_engine::EngineConfig::default();
        expected.cache_dir = ringmaster_policy_engine::default_cache_dir();
        assert_eq!(super::policy_engine_config(&Default::default()), expected);
    }
}
