//! Ringmaster's configuration: the TOML file as written ([`RawConfig`]) → the validated
//! [`Config`], the only form the rest of the gateway sees.
//!
//! [`RawConfig`] mirrors the file (every key optional, unknown keys refused); the binary lays
//! CLI flags over it, then [`RawConfig::validate`] checks every invariant and produces a
//! [`Config`]. The embedded default (four simulated servers on loopback, the prefix-affinity
//! router) is `default-config.toml`, compiled in. Each section is validated in its own file
//! ([`keys`], [`limits`], [`routing`], [`servers`], [`policies`], `model` for `[model]` and
//! `[simulator]`, [`upstream`] for `[upstream]` and `[retry]`, [`autoscale`]), which owns its
//! defaults as named constants.
//!
//! This crate reads the file it is given and does nothing else: it starts nothing, and it is a
//! leaf, depending on no crate of ours. The crates it configures read its settings and turn
//! them into their own types where they start (the pool builds the engines' settings from
//! [`ModelSettings`] and [`SimulatorSettings`], the gateway the ring's and the policy
//! engine's), so that a change to an engine never rebuilds the configuration or the crates
//! that only need it (the tenancy, the doors).

#![deny(missing_docs)]

pub mod admin;
pub mod autoscale;
pub mod cluster;
pub mod disaggregation;
mod error;
pub mod fallback;
pub mod keys;
pub mod limits;
pub mod lora;
mod model;
pub mod policies;
mod raw;
pub mod rollout;
pub mod routing;
pub mod servers;
pub mod telemetry;
pub mod tls;
pub mod upstream;
pub mod workers;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

pub use admin::{AdminListener, AdminToken, Scope};
pub use autoscale::AutoscaleSettings;
pub use cluster::ClusterSettings;
pub use disaggregation::{
    Connector, DisaggregationSettings, PrefillFailure, Role, ServerRole, WhenPrefillBusy,
};
pub use error::ConfigError;
pub use fallback::{FallbackRule, SpillReason};
pub use keys::{ApiKey, RateLimits, Tenant, key_digest, key_id};
pub use lora::{AdapterSource, LoraSettings};
pub use model::{KERNEL_NAMES, ModelSettings, SimulatorSettings};
pub use policies::{
    CapGuard, ComponentCache, PoliciesConfig, PolicyEngineSettings, PolicySource,
    RouterVariantSpec, SlotPolicySpec,
};
pub use raw::{
    RawAdmission, RawApi, RawApiKey, RawAutoscale, RawCluster, RawConfig, RawDisaggregation,
    RawFallback, RawLimits, RawModel, RawPolicies, RawRecord, RawResponses, RawRouterVariant,
    RawRouting, RawSafety, RawServer, RawSimulator, RawTenant, RawWorkers,
};
pub use routing::{PrefixHashing, RingSettings};
pub use servers::{
    GpuPlacement, KvEventsFormat, KvEventsSpec, LocalCacheView, Secret, ServerAccess,
    ServerAddress, ServerApi, ServerProtocol, ServerSpec, TokenizerSource, server_spec,
    server_spec_with_env,
};
pub use telemetry::{OtlpExport, OtlpProtocol, TelemetrySettings};
pub use tls::TlsSettings;
pub use upstream::{MAX_ATTEMPTS, RawRetry, RawUpstream, RetryPolicy, UpstreamSettings};

use error::invalid;
use model::{gpu_placement, model_settings, simulator_settings};

/// The embedded default configuration.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../default-config.toml");
/// Default listen address: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default model name served by the simulated servers.
pub const DEFAULT_MODEL: &str = "sim-llama-3-8b";
/// Environment variable that supplies the admin token when the file does not.
pub const ADMIN_TOKEN_ENV: &str = "RINGMASTER_ADMIN_TOKEN";
/// Shortest admin token accepted: a guessable token is worse than none.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// What the doors do with a field their API does not define (`[api] unknown_fields`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum UnknownFieldPolicy {
    /// Passed on to a server that speaks the door's API, dropped and counted otherwise.
    #[default]
    Pass,
    /// Dropped and counted.
    Drop,
    /// Refused with a 400 naming it.
    Refuse,
}

/// How the Responses API's responses are kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResponseStoreSettings {
    /// How long one is kept.
    pub ttl: Duration,
    /// The most bytes a gateway alone keeps (a fleet keeps them in Redis).
    pub max_bytes: usize,
}

/// How long a stored response is kept unless `[responses] ttl_s` says otherwise: a working
/// day (OpenAI keeps them 30 days; a fleet's Redis is not a database).
pub const DEFAULT_RESPONSE_TTL: Duration = Duration::from_secs(24 * 3600);
/// The most memory a gateway alone gives stored responses unless `[responses] max_mb` says
/// otherwise (the least recently used go first).
pub const DEFAULT_RESPONSE_STORE_MB: usize = 256;

fn response_store(raw: RawResponses) -> Result<ResponseStoreSettings, ConfigError> {
    let ttl_s = raw.ttl_s.unwrap_or(DEFAULT_RESPONSE_TTL.as_secs());
    if !(1..=90 * 24 * 3600).contains(&ttl_s) {
        return Err(invalid(
            "responses.ttl_s",
            "must be between 1 and 7776000 (90 days)",
        ));
    }
    let max_mb = raw.max_mb.unwrap_or(DEFAULT_RESPONSE_STORE_MB);
    if !(1..=1 << 20).contains(&max_mb) {
        return Err(invalid("responses.max_mb", "must be between 1 and 1048576"));
    }
    Ok(ResponseStoreSettings {
        ttl: Duration::from_secs(ttl_s),
        max_bytes: max_mb * 1024 * 1024,
    })
}

fn unknown_fields(api: RawApi) -> Result<UnknownFieldPolicy, ConfigError> {
    match api.unknown_fields.as_deref() {
        None | Some("pass") => Ok(UnknownFieldPolicy::Pass),
        Some("drop") => Ok(UnknownFieldPolicy::Drop),
        Some("refuse") => Ok(UnknownFieldPolicy::Refuse),
        Some(other) => Err(invalid(
            "api.unknown_fields",
            format!("{other:?}: expected \"pass\", \"drop\" or \"refuse\""),
        )),
    }
}

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Address to bind.
    pub listen: SocketAddr,
    /// `[tls]`: the public listener's certificate (`None`: plain HTTP).
    pub tls: Option<TlsSettings>,
    /// `[admin] listen`: the admin API and `/ui` on a listener of their own (`None`: on the
    /// public one).
    pub admin_listener: Option<AdminListener>,
    /// The operator tokens (`admin_token` is one of them, named `admin`, with every scope);
    /// none: the admin API is off.
    pub admin_tokens: Vec<AdminToken>,
    /// Models accepted.
    pub models: Vec<String>,
    /// One INFO line per request (`access_log = true`); off, they are DEBUG lines.
    pub access_log: bool,
    /// Public model names and the served names they stand for.
    pub aliases: std::collections::BTreeMap<String, String>,
    /// API keys; empty means no authentication (loopback only).
    pub api_keys: Vec<ApiKey>,
    /// Tenants the keys belong to.
    pub tenants: Vec<Tenant>,
    /// The autoscaling signal's settings.
    pub autoscale: AutoscaleSettings,
    /// `[cluster]`: the Redis that replicas share (`None`: this process alone).
    pub cluster: Option<ClusterSettings>,
    /// `[lora]`: adapters loaded on demand.
    pub lora: LoraSettings,
    /// `[telemetry]`: request traces.
    pub telemetry: TelemetrySettings,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Largest `max_tokens`.
    pub max_output_tokens: u32,
    /// Waiting requests per server before it counts as full.
    pub max_waiting_per_server: u32,
    /// A streamed reply idle this long sends a `ping` (`None`: never).
    pub stream_ping: Option<Duration>,
    /// How long a stream outlives its last reader for a resume (`None`: not resumable).
    pub resume_window: Option<Duration>,
    /// How long a 429 is held before it goes out (`None`: at once).
    pub rate_limit_delay: Option<Duration>,
    /// A client that takes nothing of a reply for this long is cut off (`None`: never).
    pub client_send_timeout: Option<Duration>,
    /// Time in-flight requests get at shutdown.
    pub shutdown_grace: Duration,
    /// What one client connection may hold and for how long; the overload bounds.
    pub client: limits::ClientLimits,
    /// Ring parameters.
    pub ring: RingSettings,
    /// Prefix hashing.
    pub prefix_hashing: PrefixHashing,
    /// Headers that carry a session id, in order (lower case).
    pub session_headers: Vec<http::HeaderName>,
    /// Patterns of system-prompt lines that change per request (`[routing]
    /// volatile_prefix`), each a valid regular expression.
    pub volatile_prefix: Vec<String>,
    /// What the doors do with fields they do not know (`[api] unknown_fields`).
    pub unknown_fields: UnknownFieldPolicy,
    /// How the Responses API's responses are kept (`[responses]`).
    pub responses: ResponseStoreSettings,
    /// The rules for requests split between a prefill and a decode server
    /// (`[disaggregation]`).
    pub disaggregation: DisaggregationSettings,
    /// Servers at start.
    pub servers: Vec<ServerSpec>,
    /// What the gateway shares with its `ringmaster worker`s (`[workers]`).
    pub workers: workers::WorkersSettings,
    /// `[[fallback]]`: the spill-over rules, the first that covers a request used.
    pub fallback: Vec<FallbackRule>,
    /// Overrides of the simulated servers' defaults.
    pub simulator: SimulatorSettings,
    /// How routing learns what this process's engines hold (`[simulator] cache_view`).
    pub local_cache_view: LocalCacheView,
    /// How model (`gguf:`) servers run.
    pub model: ModelSettings,
    /// The GPU model servers run on; `None` for the CPU.
    pub model_gpu: Option<GpuPlacement>,
    /// Policies.
    pub policies: PoliciesConfig,
    /// How remote servers' clients behave.
    pub upstream: UpstreamSettings,
    /// When a failed request is tried on another server.
    pub retry: RetryPolicy,
    /// Where the gateway records its traffic as a trace (`[record] path`), if anywhere, and
    /// whether it records from the start (`[record] enabled`).
    pub record: Option<(std::path::PathBuf, bool)>,
    /// Settings the file uses that are deprecated, each with its replacement (the binary
    /// logs them at start).
    pub warnings: Vec<String>,
}

impl Config {
    /// The embedded default, validated.
    pub fn embedded_default() -> Self {
        RawConfig::embedded_default()
            .validate()
            .expect("the embedded default configuration is valid")
    }
}

impl RawConfig {
    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// Reads and parses a TOML file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.display().to_string(),
            error,
        })?;
        Self::from_toml(&text)
    }

    /// The embedded default.
    pub fn embedded_default() -> Self {
        Self::from_toml(DEFAULT_CONFIG_TOML).expect("the embedded default configuration parses")
    }

    /// Checks every invariant and builds the [`Config`]. The admin token falls back to
    /// `RINGMASTER_ADMIN_TOKEN` when the file sets none.
    pub fn validate(self) -> Result<Config, ConfigError> {
        self.validate_with_env(|name| std::env::var(name).ok())
    }

    /// [`Self::validate`] with an explicit environment, for tests.
    pub fn validate_with_env(
        self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let listen_text = self.listen.unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen: SocketAddr = listen_text.parse().map_err(|e| {
            invalid(
                "listen",
                format!("{listen_text:?} is not an IP:port address ({e})"),
            )
        })?;

        let models = self
            .models
            .unwrap_or_else(|| vec![DEFAULT_MODEL.to_owned()]);
        if models.is_empty() || models.iter().any(|m| m.trim().is_empty()) {
            return Err(invalid("models", "list at least one non-empty model name"));
        }

        let aliases = self.aliases.unwrap_or_default();
        for (alias, target) in &aliases {
            if alias.trim().is_empty() || target.trim().is_empty() {
                return Err(invalid("aliases", "names must not be empty"));
            }
            if alias == target {
                return Err(invalid(
                    format!("aliases.{alias}"),
                    "an alias must name another model",
                ));
            }
        }

        // Where the token came from is kept for its error: a newcomer who exported a short
        // `RINGMASTER_ADMIN_TOKEN` has no `admin_token` key to look for.
        let from_env = self.admin_token.is_none();
        let admin_token = self
            .admin_token
            .or_else(|| env(ADMIN_TOKEN_ENV))
            .filter(|t| !t.is_empty());
        if let Some(token) = &admin_token
            && token.chars().count() < MIN_ADMIN_TOKEN_CHARS
        {
            let problem = format!(
                "the admin token must be at least {MIN_ADMIN_TOKEN_CHARS} characters, and this \
                 one has {}",
                token.chars().count()
            );
            return Err(if from_env {
                ConfigError::Env {
                    variable: ADMIN_TOKEN_ENV.to_owned(),
                    problem,
                }
            } else {
                invalid("admin_token", problem)
            });
        }

        let (admin_listener, mut admin_tokens) = admin::admin(self.admin.unwrap_or_default())?;
        if let Some(token) = &admin_token {
            let digest = key_digest(token);
            if admin_tokens
                .iter()
                .any(|t| t.name == "admin" || t.digest == digest)
            {
                return Err(invalid(
                    "admin.tokens",
                    "admin_token is the token named \"admin\": no [[admin.tokens]] entry may \
                     take its name or its secret",
                ));
            }
            admin_tokens.insert(
                0,
                AdminToken {
                    name: "admin".to_owned(),
                    digest,
                    scopes: Scope::ALL.to_vec(),
                },
            );
        }

        let autoscale = autoscale::autoscale_settings(self.autoscale.unwrap_or_default())?;
        let cluster = self.cluster.map(cluster::cluster_settings).transpose()?;
        let lora = lora::lora_settings(self.lora.unwrap_or_default())?;
        let telemetry = telemetry::telemetry_settings(self.telemetry.unwrap_or_default(), &env)?;
        let (api_keys, tenants) = keys::keys_and_tenants(
            self.tenants.unwrap_or_default(),
            self.api_keys.unwrap_or_default(),
        )?;
        if api_keys.is_empty() && !listen.ip().is_loopback() {
            return Err(invalid(
                "listen",
                format!(
                    "refusing to listen on non-loopback address {listen} without API keys; add [[api_keys]] or listen on 127.0.0.1"
                ),
            ));
        }
        let limits = limits::limits(self.limits.unwrap_or_default())?;
        let routing = routing::routing(self.routing.unwrap_or_default())?;

        let mut servers: Vec<ServerSpec> = Vec::new();
        for (i, raw) in self.servers.unwrap_or_default().iter().enumerate() {
            let spec =
                server_spec_with_env(raw, &env).map_err(|p| invalid(format!("servers[{i}]"), p))?;
            if servers.iter().any(|s| s.id == spec.id) {
                return Err(invalid(
                    format!("servers[{i}]"),
                    format!("duplicate id {:?}", spec.id),
                ));
            }
            servers.push(spec);
        }

        let workers = workers::workers(self.workers.unwrap_or_default(), &servers, &env)?;

        let raw_simulator = self.simulator.unwrap_or_default();
        let local_cache_view = match raw_simulator.cache_view.as_deref() {
            None => LocalCacheView::default(),
            Some(name) => {
                LocalCacheView::parse(name).map_err(|e| invalid("simulator.cache_view", e))?
            }
        };
        let simulator = simulator_settings(raw_simulator)?;
        let raw_model = self.model.unwrap_or_default();
        let model_gpu = gpu_placement(&raw_model)?;
        let model = model_settings(raw_model)?;
        let policies = policies::policies_config(
            self.policies.unwrap_or_default(),
            (routing.router, routing.router_named),
        )?;
        let upstream = upstream::upstream_settings(self.upstream.unwrap_or_default())?;
        let retry = upstream::retry_policy(self.retry.unwrap_or_default())?;
        let record = match self.record {
            None => None,
            Some(record) if record.path.trim().is_empty() => {
                return Err(invalid("record.path", "must name a file"));
            }
            Some(record) => Some((
                std::path::PathBuf::from(record.path),
                record.enabled.unwrap_or(true),
            )),
        };

        Ok(Config {
            listen,
            tls: tls::public(self.tls.unwrap_or_default())?,
            admin_listener,
            admin_tokens,
            models,
            access_log: self.access_log.unwrap_or(false),
            aliases,
            api_keys,
            tenants,
            fallback: fallback::fallback(self.fallback.unwrap_or_default())?,
            autoscale,
            cluster,
            lora,
            telemetry,
            max_body_bytes: limits.max_body_bytes,
            max_output_tokens: limits.max_output_tokens,
            max_waiting_per_server: limits.max_waiting_per_server,
            stream_ping: limits.stream_ping,
            resume_window: limits.resume_window,
            client_send_timeout: limits.client_send_timeout,
            rate_limit_delay: limits.rate_limit_delay,
            shutdown_grace: limits.shutdown_grace,
            client: limits.client,
            ring: routing.ring,
            prefix_hashing: routing.prefix_hashing,
            session_headers: routing.session_headers,
            volatile_prefix: routing.volatile_prefix,
            unknown_fields: unknown_fields(self.api.unwrap_or_default())?,
            responses: response_store(self.responses.unwrap_or_default())?,
            disaggregation: disaggregation::settings(self.disaggregation.unwrap_or_default())?,
            servers,
            workers,
            simulator,
            local_cache_view,
            model,
            model_gpu,
            policies,
            upstream,
            retry,
            record,
            warnings: routing.warnings,
        })
    }
}

#[cfg(test)]
mod tests;
