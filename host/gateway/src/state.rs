//! The one state a running gateway shares: its configuration, its pool, its slots and gates,
//! its metrics and what its operations keep (the recording, the last errors, the stored
//! responses). Each room reads the parts it needs through these fields and accessors; only
//! start-up ([`crate::start`]) builds it.

use std::sync::Arc;

use ringmaster_config::Config;
use ringmaster_pool::{Pool, autoscale};
use ringmaster_responses as responses;
use ringmaster_serve::{conn, overload};
use ringmaster_slots::router::RouterSlot;
use ringmaster_telemetry::{recent, record};

use crate::admission::AdmissionGate;
use crate::body::ResponseBody;
use crate::collectors;
use crate::metrics::Metrics;
use crate::safety::SafetyGate;

/// A running gateway's shared state.
#[derive(Debug)]
pub struct Gateway {
    pub(crate) config: Config,
    pub(crate) pool: Arc<Pool>,
    pub(crate) router: Arc<RouterSlot>,
    pub(crate) admission: Arc<AdmissionGate>,
    pub(crate) safety: Arc<SafetyGate>,
    /// The API keys and tenants now (they change live: `/admin/keys`, `/admin/tenants`).
    pub(crate) keys: ringmaster_tenancy::KeyBook,
    pub(crate) metrics: Metrics,
    pub(crate) recorder: Option<record::TraceRecorder>,
    pub(crate) streams: Arc<ringmaster_serve::resume::Streams>,
    /// The `/admin/` routes, once mounted ([`Gateway::mount_admin`]).
    pub(crate) admin: std::sync::OnceLock<Arc<dyn AdminRoutes>>,
    /// The fleet this gateway is a replica of (`None`: a process alone).
    pub(crate) cluster: Option<Arc<ringmaster_cluster::Cluster>>,
    /// The last error answers, for the status page.
    pub(crate) recent_errors: recent::RecentErrors,
    /// When it started (the status page's uptime).
    pub(crate) started: std::time::Instant,
    /// Cancelled when the gateway stops accepting: long-lived streams of its own (the
    /// status page's events) end then, so a graceful shutdown does not wait out its grace.
    pub(crate) stopping: tokio_util::sync::CancellationToken,
    /// The open client connections under their cap.
    pub(crate) connections: Arc<conn::Connections>,
    /// The bounds past which new requests are shed.
    pub(crate) overload: Arc<overload::OverloadGuard>,
    /// The system-prompt lines the doors take out (`[routing] volatile_prefix`), compiled.
    pub(crate) volatile: ringmaster_api::VolatileLines,
    /// What the doors do with fields they do not know (`[api] unknown_fields`).
    pub(crate) unknown_fields: ringmaster_api::UnknownFields,
    /// The Responses door's stored responses (in memory, or the fleet's Redis) and those in
    /// flight.
    pub(crate) responses: Arc<responses::Responses>,
    /// The public listener's TLS (`[tls]`; `None`: plain HTTP).
    pub(crate) tls: Option<Arc<ringmaster_tls::ServerTls>>,
    /// The admin listener's TLS (`[admin] cert`).
    pub(crate) admin_tls: Option<Arc<ringmaster_tls::ServerTls>>,
    /// The secret a split request's legs to `ringmaster worker`s are signed with
    /// (`[workers] secret_env`; `None`: unsigned, and the workers serve them whole).
    pub(crate) worker_secret: Option<ringmaster_tls::credential::WorkerSecret>,
}

impl Gateway {
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

    /// The API keys and tenants now.
    pub fn keys(&self) -> &ringmaster_tenancy::KeyBook {
        &self.keys
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

    pub(crate) fn limits<'a>(
        &'a self,
        snapshot: &'a ringmaster_pool::PoolSnapshot,
    ) -> ringmaster_api::Limits<'a> {
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
        dyn std::future::Future<
                Output = Result<http::Response<ResponseBody>, ringmaster_api::ApiError>,
            > + Send
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
