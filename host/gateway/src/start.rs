//! Start-up: the configured servers started, the policies loaded into their slots, the gates
//! and metrics built, all into one [`Gateway`]; a replica of a fleet joins it here.

use std::sync::Arc;

use ringmaster_config::{Config, SlotPolicySpec};
use ringmaster_policy_engine::PolicyEngine;
use ringmaster_pool::{self as pool, Pool, PoolError};
use ringmaster_responses as responses;
use ringmaster_serve::{conn, overload};
use ringmaster_slots::router::{RouterSlot, SlotError};
use ringmaster_slots::single::{PolicySlot, SlotPolicy};
use ringmaster_slots::sources::{policy_bytes, policy_engine_config};
use ringmaster_telemetry::{recent, record};

use crate::admission::AdmissionGate;
use crate::auth::Authenticator;
use crate::metrics::Metrics;
use crate::safety::SafetyGate;
use crate::state::Gateway;
use crate::{collectors, fleet};

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
    /// A listener's certificate, key or client CA could not be used.
    #[error("{section}: {error}")]
    Tls {
        /// `tls` or `admin`.
        section: &'static str,
        /// Why.
        error: ringmaster_tls::TlsError,
    },
    /// An `https://` server's CA file or client certificate could not be used.
    #[error("servers {id:?}: {error}")]
    ServerTls {
        /// The server.
        id: String,
        /// Why.
        error: ringmaster_tls::TlsError,
    },
    /// A setting the engine it configures refused (the CPU lacks the kernels named, the
    /// simulator's numbers do not fit together).
    #[error(transparent)]
    Settings(ringmaster_config::ConfigError),
}

impl Gateway {
    /// Starts the configured servers, loads the configured policies and builds the gateway.
    /// Needs a tokio runtime.
    pub fn start(config: Config) -> Result<Arc<Self>, StartError> {
        Self::start_in(config, None)
    }

    /// Reads the listeners' certificates, keys and client CAs as [`Self::start`] would
    /// (`ringmaster check-config`).
    pub fn check_tls(config: &Config) -> Result<(), StartError> {
        server_tls("tls", config.tls.as_ref())?;
        server_tls(
            "admin",
            config.admin_listener.as_ref().and_then(|a| a.tls.as_ref()),
        )?;
        for server in &config.servers {
            if let ringmaster_config::ServerAddress::Remote { tls: true, .. } = server.address {
                let access = pool::remote::RemoteAccess::of(server);
                ringmaster_tls::client_config(&access.tls, &[b"http/1.1"]).map_err(|error| {
                    StartError::ServerTls {
                        id: server.id.clone(),
                        error,
                    }
                })?;
            }
        }
        Ok(())
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
            ringmaster_slots::queue::FairQueue::new(
                policies.queue_aging,
                policies.queue_priority.clone(),
            ),
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
        let shared = cluster
            .as_ref()
            .map(|c| c.clone() as Arc<dyn ringmaster_tenancy::SharedBuckets>);
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
        let tls = server_tls("tls", config.tls.as_ref())?;
        let admin_tls = server_tls(
            "admin",
            config.admin_listener.as_ref().and_then(|a| a.tls.as_ref()),
        )?;
        let worker_secret = match &config.workers.secret {
            Some(secret) => Some(
                ringmaster_tls::credential::WorkerSecret::new(
                    &config.workers.secret_env,
                    secret.expose().as_bytes(),
                )
                .map_err(|e| StartError::Config(format!("workers.secret_env: {e}")))?,
            ),
            None => None,
        };
        let gateway = Arc::new(Self {
            worker_secret,
            tls,
            admin_tls,
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
            streams: ringmaster_serve::resume::Streams::new(config.resume_window),
            admin: std::sync::OnceLock::new(),
            keys: ringmaster_tenancy::KeyBook::new(Authenticator::with_shared(
                &config.api_keys,
                &config.tenants,
                shared,
            )),
            metrics,
            pool,
            router,
            admission,
            safety,
            config,
        });
        crate::background::join_fleet(&gateway);
        Ok(gateway)
    }
}

/// A listener's TLS from its configured files, read now.
fn server_tls(
    section: &'static str,
    settings: Option<&ringmaster_config::TlsSettings>,
) -> Result<Option<Arc<ringmaster_tls::ServerTls>>, StartError> {
    settings
        .map(|s| {
            ringmaster_tls::ServerTls::load(ringmaster_tls::TlsFiles {
                cert: s.cert.clone(),
                key: s.key.clone(),
                client_ca: s.client_ca.clone(),
            })
            .map_err(|error| StartError::Tls { section, error })
        })
        .transpose()
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
