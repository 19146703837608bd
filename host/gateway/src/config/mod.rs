//! Gateway configuration: raw TOML → validated [`Config`].
//!
//! [`RawConfig`] mirrors the TOML file (every key optional, unknown keys refused); the binary
//! lays CLI flags over it, then [`RawConfig::validate`] checks every invariant and produces a
//! [`Config`], the only type the rest of the gateway sees. The embedded default (four simulated
//! servers on loopback) is `default-config.toml`, compiled in. This module does no I/O beyond
//! reading the file it is given.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use ringmaster_gpu_runtime::model::{Isa, ModelOptions};
use ringmaster_gpu_runtime::{EngineConfig, SimCostModel};
use ringmaster_ring::{MAX_VNODES_PER_WEIGHT, RingConfig};
use serde::Deserialize;

use crate::routing::PrefixHashing;
pub use ringmaster_pool::{GpuPlacement, ServerAddress, ServerSpec, Strategy};

mod upstream;
pub use upstream::{MAX_ATTEMPTS, RawRetry, RawUpstream, RetryPolicy};

/// The embedded default configuration.
pub const DEFAULT_CONFIG_TOML: &str = include_str!("../../default-config.toml");
/// Default listen address: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8080";
/// Default model name served by the simulated servers.
pub const DEFAULT_MODEL: &str = "sim-llama-3-8b";
/// Default body limit (Anthropic's own limit for the Messages API is 32 MB; 16 MiB leaves room
/// for long contexts while bounding memory per connection).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Default ceiling on `max_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 8192;
/// Default number of requests waiting inside one GPU server before the gateway calls it full;
/// when every server is full, new requests get 529 `overloaded_error`.
pub const DEFAULT_MAX_WAITING_PER_SERVER: u32 = 1024;
/// Default time given to in-flight requests at shutdown.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// Environment variable that supplies the admin token when the file does not.
pub const ADMIN_TOKEN_ENV: &str = "RINGMASTER_ADMIN_TOKEN";
/// Shortest admin token accepted: a guessable token is worse than none.
pub const MIN_ADMIN_TOKEN_CHARS: usize = 16;

/// A configuration problem, named precisely.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TOML is malformed or has unknown keys.
    #[error("config is not valid: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value breaks an invariant.
    #[error("config key `{key}`: {problem}")]
    Invalid {
        /// The key, dotted.
        key: String,
        /// What is wrong.
        problem: String,
    },
}

fn invalid(key: impl Into<String>, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        problem: problem.into(),
    }
}

/// The TOML file as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `listen`: address to bind.
    pub listen: Option<String>,
    /// `models`: model names accepted in requests.
    pub models: Option<Vec<String>>,
    /// `admin_token`: enables the admin API.
    pub admin_token: Option<String>,
    /// `access_log`: one INFO line per request (otherwise they are DEBUG).
    pub access_log: Option<bool>,
    /// `[aliases]`: public model name → the name servers serve.
    pub aliases: Option<std::collections::BTreeMap<String, String>>,
    /// `[[api_keys]]`.
    pub api_keys: Option<Vec<RawApiKey>>,
    /// `[limits]`.
    pub limits: Option<RawLimits>,
    /// `[routing]`.
    pub routing: Option<RawRouting>,
    /// `[[servers]]`.
    pub servers: Option<Vec<RawServer>>,
    /// `[simulator]`.
    pub simulator: Option<RawSimulator>,
    /// `[policies]`.
    pub policies: Option<RawPolicies>,
    /// `[model]`.
    pub model: Option<RawModel>,
    /// `[upstream]`.
    pub upstream: Option<upstream::RawUpstream>,
    /// `[retry]`.
    pub retry: Option<upstream::RawRetry>,
}

/// `[model]`: how `gguf:` servers run their model (on the CPU, or on a GPU with `device`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawModel {
    /// Kernel threads per model server (default 1). More threads than free cores slows
    /// every step down.
    pub threads: Option<usize>,
    /// `auto`, `avx2`, `avx` or `scalar` (default `auto`: the best this CPU has).
    pub kernels: Option<String>,
    /// KV-cache blocks of 16 tokens per model server (default 2048 on the CPU; on a GPU, 90%
    /// of the memory free after the weights).
    pub kv_blocks: Option<u32>,
    /// `cpu` (default), or `cuda` / `cuda:N`: model servers run on that GPU (a build with the
    /// `cuda` feature).
    pub device: Option<String>,
}

/// `[policies]`: the policy engine and the router slot.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPolicies {
    /// Per-call deadline, milliseconds.
    pub call_deadline_ms: Option<u64>,
    /// Memory cap per policy instance, MiB.
    pub memory_limit_mb: Option<usize>,
    /// Directory for compiled components (off when absent).
    pub cache_dir: Option<String>,
    /// `[[policies.router]]`: router variants and the shadow.
    pub router: Option<Vec<RawRouterVariant>>,
    /// `[policies.admission]`: the admission policy and the gateway's queue.
    pub admission: Option<RawAdmission>,
    /// `[policies.safety]`: the safety filter.
    pub safety: Option<RawSafety>,
    /// Request headers passed to policies in `request.headers` (names, any case).
    pub pass_headers: Option<Vec<String>>,
}

/// `[policies.admission]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmission {
    /// Name (metric label; default `admission`).
    pub name: Option<String>,
    /// `builtin:NAME` or a path to a `.wasm` component.
    pub source: String,
    /// The policy's own key/value configuration.
    pub config: Option<std::collections::BTreeMap<String, toml::Value>>,
    /// Requests that may wait in the gateway's queue.
    pub queue_capacity: Option<u32>,
    /// How long a request may wait in the queue, milliseconds.
    pub queue_timeout_ms: Option<u64>,
}

/// `[policies.safety]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSafety {
    /// Name (metric label; default `safety`).
    pub name: Option<String>,
    /// `builtin:NAME` or a path to a `.wasm` component.
    pub source: String,
    /// The policy's own key/value configuration.
    pub config: Option<std::collections::BTreeMap<String, toml::Value>>,
    /// Output bytes per check.
    pub window_bytes: Option<usize>,
    /// Block text when the filter faults (default: allow it).
    pub fail_closed: Option<bool>,
}

/// One `[[policies.router]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouterVariant {
    /// Variant name (a metric label).
    pub name: String,
    /// `builtin:NAME` or a path to a `.wasm` component.
    pub source: String,
    /// Share of traffic (default 100).
    pub weight: Option<u32>,
    /// Decide on a copy of each request without acting.
    pub shadow: Option<bool>,
    /// The policy's own key/value configuration.
    pub config: Option<std::collections::BTreeMap<String, toml::Value>>,
}

/// One `[[api_keys]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApiKey {
    /// The secret.
    pub key: String,
    /// The key's tier (for admission policies; default `"default"`).
    pub tier: Option<String>,
    /// Requests per minute allowed for this key; unlimited when absent.
    pub requests_per_minute: Option<u32>,
}

/// `[limits]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLimits {
    /// Largest request body, bytes.
    pub max_body_bytes: Option<usize>,
    /// Largest `max_tokens`.
    pub max_output_tokens: Option<u32>,
    /// Waiting requests per server before it counts as full.
    pub max_waiting_per_server: Option<u32>,
    /// Seconds in-flight requests get at shutdown.
    pub shutdown_grace_seconds: Option<u64>,
}

/// `[routing]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouting {
    /// `"consistent-hash"` or `"round-robin"`.
    pub strategy: Option<String>,
    /// Virtual nodes per unit of weight.
    pub vnodes_per_weight: Option<u32>,
    /// Bounded-load factor `c`.
    pub load_factor: Option<f64>,
    /// Prefix-hash chunk size, bytes.
    pub prefix_chunk_bytes: Option<usize>,
    /// Most prefix hashes per request.
    pub max_prefix_hashes: Option<usize>,
}

/// One `[[servers]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// `sim://NAME` or `gguf:PATH` (later: `http://host:port`).
    pub address: String,
    /// Id on the ring; defaults to the address's name.
    pub id: Option<String>,
    /// Ring weight, default 1.
    pub weight: Option<u32>,
    /// The models it serves; default: what a remote server's `/v1/models` lists, and until
    /// that is known (or for a server in this process) any model the gateway accepts.
    pub models: Option<Vec<String>>,
}

/// `[simulator]`: overrides of the simulated servers' model (see `SimCostModel`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSimulator {
    /// Modelled seconds → real seconds; 1.0 is real time.
    pub time_scale: Option<f64>,
    /// KV blocks of 16 tokens per server.
    pub kv_blocks: Option<u32>,
    /// Most sequences running at once per server.
    pub max_running: Option<u32>,
    /// Tokens per engine step.
    pub step_token_budget: Option<u32>,
    /// Prefill speed, tokens per second.
    pub prefill_tokens_per_s: Option<f64>,
    /// Decode step at batch 1, milliseconds.
    pub decode_step_base_ms: Option<f64>,
    /// Extra decode-step time per running sequence, milliseconds.
    pub decode_step_per_seq_ms: Option<f64>,
}

/// An API key and what it grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKey {
    /// The secret (never logged).
    pub key: String,
    /// Its tier.
    pub tier: String,
    /// Its rate limit.
    pub requests_per_minute: Option<NonZeroU32>,
}

/// Where a policy's component comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicySource {
    /// One embedded in the binary.
    Builtin(String),
    /// A file, reloaded when it changes.
    File(std::path::PathBuf),
}

impl std::fmt::Display for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Builtin(name) => write!(f, "builtin:{name}"),
            Self::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A router variant to load at start.
#[derive(Clone, Debug, PartialEq)]
pub struct RouterVariantSpec {
    /// Name.
    pub name: String,
    /// Component source.
    pub source: PolicySource,
    /// Traffic weight.
    pub weight: u32,
    /// Shadow instead of live.
    pub shadow: bool,
    /// Its configuration.
    pub config: std::collections::BTreeMap<String, String>,
}

/// The policy in a single-policy slot (admission or safety filter).
#[derive(Clone, Debug, PartialEq)]
pub struct SlotPolicySpec {
    /// Name (metric label, log tag).
    pub name: String,
    /// Component source.
    pub source: PolicySource,
    /// Its configuration.
    pub config: std::collections::BTreeMap<String, String>,
}

/// The policy engine's settings and every slot's contents.
#[derive(Clone, Debug)]
pub struct PoliciesConfig {
    /// Engine limits.
    pub engine: ringmaster_policy_engine::EngineConfig,
    /// Router variants (empty: the native strategy routes).
    pub router: Vec<RouterVariantSpec>,
    /// The admission policy (none: every request is admitted).
    pub admission: Option<SlotPolicySpec>,
    /// Requests that may wait in the gateway's queue.
    pub queue_capacity: u32,
    /// How long a request may wait in the queue.
    pub queue_timeout: Duration,
    /// The safety filter (none: nothing is filtered).
    pub safety: Option<SlotPolicySpec>,
    /// Output bytes per safety check.
    pub safety_window_bytes: usize,
    /// Block when the safety filter faults.
    pub safety_fail_closed: bool,
    /// Lower-case header names passed to policies.
    pub pass_headers: Vec<String>,
}

impl PoliciesConfig {
    /// Every configured policy that comes from a file, as `(slot, name, path)`.
    pub fn files(&self) -> Vec<(&'static str, &str, &std::path::Path)> {
        let router = self.router.iter().map(|v| ("router", &v.name, &v.source));
        let admission = self
            .admission
            .iter()
            .map(|p| ("admission", &p.name, &p.source));
        let safety = self
            .safety
            .iter()
            .map(|p| ("safety-filter", &p.name, &p.source));
        router
            .chain(admission)
            .chain(safety)
            .filter_map(|(slot, name, source)| match source {
                PolicySource::File(path) => Some((slot, name.as_str(), path.as_path())),
                PolicySource::Builtin(_) => None,
            })
            .collect()
    }
}

/// Validates one `[[servers]]` entry (the config file's and `POST /admin/servers`').
pub fn server_spec(raw: &RawServer) -> Result<ServerSpec, String> {
    ServerSpec::new(
        &raw.address,
        raw.id.as_deref(),
        raw.weight,
        raw.models.as_deref(),
    )
}

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Address to bind.
    pub listen: SocketAddr,
    /// Models accepted.
    pub models: Vec<String>,
    /// Admin token; `None` turns the admin API off.
    pub admin_token: Option<String>,
    /// One INFO line per request (`access_log = true`); off, they are DEBUG lines.
    pub access_log: bool,
    /// Public model names and the served names they stand for.
    pub aliases: std::collections::BTreeMap<String, String>,
    /// API keys; empty means no authentication (loopback only).
    pub api_keys: Vec<ApiKey>,
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Largest `max_tokens`.
    pub max_output_tokens: u32,
    /// Waiting requests per server before it counts as full.
    pub max_waiting_per_server: u32,
    /// Time in-flight requests get at shutdown.
    pub shutdown_grace: Duration,
    /// Routing strategy.
    pub strategy: Strategy,
    /// Ring parameters.
    pub ring: RingConfig,
    /// Prefix hashing.
    pub prefix_hashing: PrefixHashing,
    /// Servers at start.
    pub servers: Vec<ServerSpec>,
    /// Template for simulated servers (name filled in per server).
    pub simulator: EngineConfig,
    /// How model (`gguf:`) servers run.
    pub model: ModelOptions,
    /// The GPU model servers run on; `None` for the CPU.
    pub model_gpu: Option<GpuPlacement>,
    /// Policies.
    pub policies: PoliciesConfig,
    /// How remote servers' clients behave.
    pub upstream: ringmaster_pool::remote::UpstreamSettings,
    /// When a failed request is tried on another server.
    pub retry: RetryPolicy,
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
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
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

        let admin_token = self
            .admin_token
            .or_else(|| env(ADMIN_TOKEN_ENV))
            .filter(|t| !t.is_empty());
        if let Some(token) = &admin_token
            && token.chars().count() < MIN_ADMIN_TOKEN_CHARS
        {
            return Err(invalid(
                "admin_token",
                format!("must be at least {MIN_ADMIN_TOKEN_CHARS} characters"),
            ));
        }

        let mut api_keys = Vec::new();
        for (i, raw) in self.api_keys.unwrap_or_default().into_iter().enumerate() {
            if raw.key.len() < 8 || raw.key.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(invalid(
                    format!("api_keys[{i}].key"),
                    "must be at least 8 characters with no whitespace",
                ));
            }
            if api_keys.iter().any(|k: &ApiKey| k.key == raw.key) {
                return Err(invalid(format!("api_keys[{i}].key"), "duplicate key"));
            }
            let requests_per_minute = match raw.requests_per_minute {
                None => None,
                Some(n) => Some(NonZeroU32::new(n).ok_or_else(|| {
                    invalid(
                        format!("api_keys[{i}].requests_per_minute"),
                        "must be at least 1",
                    )
                })?),
            };
            api_keys.push(ApiKey {
                key: raw.key,
                tier: raw.tier.unwrap_or_else(|| "default".to_owned()),
                requests_per_minute,
            });
        }
        if api_keys.is_empty() && !listen.ip().is_loopback() {
            return Err(invalid(
                "listen",
                format!(
                    "refusing to listen on non-loopback address {listen} without API keys; add [[api_keys]] or listen on 127.0.0.1"
                ),
            ));
        }

        let limits = self.limits.unwrap_or_default();
        let max_body_bytes = limits.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
        if max_body_bytes < 1024 {
            return Err(invalid("limits.max_body_bytes", "must be at least 1024"));
        }
        let max_output_tokens = limits
            .max_output_tokens
            .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
        if max_output_tokens == 0 {
            return Err(invalid("limits.max_output_tokens", "must be at least 1"));
        }
        let max_waiting_per_server = limits
            .max_waiting_per_server
            .unwrap_or(DEFAULT_MAX_WAITING_PER_SERVER);
        if max_waiting_per_server == 0 {
            return Err(invalid(
                "limits.max_waiting_per_server",
                "must be at least 1",
            ));
        }
        let shutdown_grace = limits
            .shutdown_grace_seconds
            .map_or(DEFAULT_SHUTDOWN_GRACE, Duration::from_secs);

        let routing = self.routing.unwrap_or_default();
        let strategy = match routing.strategy.as_deref().unwrap_or("consistent-hash") {
            "consistent-hash" => Strategy::ConsistentHash,
            "round-robin" => Strategy::RoundRobin,
            other => {
                return Err(invalid(
                    "routing.strategy",
                    format!("{other:?}: expected \"consistent-hash\" or \"round-robin\""),
                ));
            }
        };
        let defaults = RingConfig::default();
        let ring = RingConfig::new(
            routing
                .vnodes_per_weight
                .unwrap_or(defaults.vnodes_per_weight),
            routing.load_factor.unwrap_or(defaults.load_factor),
        )
        .map_err(|e| {
            invalid(
                "routing",
                format!("{e} (vnodes_per_weight 1..={MAX_VNODES_PER_WEIGHT}, load_factor >= 1.0)"),
            )
        })?;
        let prefix_hashing = PrefixHashing {
            chunk_bytes: routing
                .prefix_chunk_bytes
                .unwrap_or(crate::routing::DEFAULT_PREFIX_CHUNK_BYTES),
            max_hashes: routing
                .max_prefix_hashes
                .unwrap_or(crate::routing::DEFAULT_MAX_PREFIX_HASHES),
        };
        if !(16..=65536).contains(&prefix_hashing.chunk_bytes) {
            return Err(invalid(
                "routing.prefix_chunk_bytes",
                "must be between 16 and 65536",
            ));
        }
        if prefix_hashing.max_hashes > 65536 {
            return Err(invalid(
                "routing.max_prefix_hashes",
                "must be at most 65536",
            ));
        }

        let mut servers: Vec<ServerSpec> = Vec::new();
        for (i, raw) in self.servers.unwrap_or_default().iter().enumerate() {
            let spec = server_spec(raw).map_err(|p| invalid(format!("servers[{i}]"), p))?;
            if servers.iter().any(|s| s.id == spec.id) {
                return Err(invalid(
                    format!("servers[{i}]"),
                    format!("duplicate id {:?}", spec.id),
                ));
            }
            servers.push(spec);
        }

        let simulator = simulator_config(self.simulator.unwrap_or_default())?;
        let raw_model = self.model.unwrap_or_default();
        let model_gpu = gpu_placement(&raw_model)?;
        let model = model_config(raw_model)?;
        let policies = policies_config(self.policies.unwrap_or_default(), strategy)?;
        let upstream = upstream::upstream_settings(self.upstream.unwrap_or_default())?;
        let retry = upstream::retry_policy(self.retry.unwrap_or_default())?;

        Ok(Config {
            listen,
            models,
            admin_token,
            access_log: self.access_log.unwrap_or(false),
            aliases,
            api_keys,
            max_body_bytes,
            max_output_tokens,
            max_waiting_per_server,
            shutdown_grace,
            strategy,
            ring,
            prefix_hashing,
            servers,
            simulator,
            model,
            model_gpu,
            policies,
            upstream,
            retry,
        })
    }
}

fn policies_config(raw: RawPolicies, strategy: Strategy) -> Result<PoliciesConfig, ConfigError> {
    let mut engine = ringmaster_policy_engine::EngineConfig::default();
    if let Some(ms) = raw.call_deadline_ms {
        if !(1..=10_000).contains(&ms) {
            return Err(invalid(
                "policies.call_deadline_ms",
                "must be between 1 and 10000",
            ));
        }
        engine.call_deadline = Duration::from_millis(ms);
    }
    if let Some(mb) = raw.memory_limit_mb {
        if !(1..=4096).contains(&mb) {
            return Err(invalid(
                "policies.memory_limit_mb",
                "must be between 1 and 4096",
            ));
        }
        engine.memory_limit_bytes = mb * 1024 * 1024;
    }
    engine.cache_dir = raw.cache_dir.map(std::path::PathBuf::from);
    let mut router = Vec::new();
    for (i, variant) in raw.router.unwrap_or_default().into_iter().enumerate() {
        let key = format!("policies.router[{i}]");
        let source = policy_source(&key, &variant.source)?;
        if router
            .iter()
            .any(|v: &RouterVariantSpec| v.name == variant.name)
        {
            return Err(invalid(
                format!("{key}.name"),
                format!("duplicate variant {:?}", variant.name),
            ));
        }
        let shadow = variant.shadow.unwrap_or(false);
        if shadow && router.iter().any(|v: &RouterVariantSpec| v.shadow) {
            return Err(invalid(
                format!("{key}.shadow"),
                "only one shadow variant is allowed",
            ));
        }
        router.push(RouterVariantSpec {
            name: variant.name,
            source,
            weight: variant.weight.unwrap_or(100),
            shadow,
            config: policy_config(variant.config),
        });
    }
    let mut queue_capacity = crate::admission::DEFAULT_QUEUE_CAPACITY;
    let mut queue_timeout = crate::admission::DEFAULT_QUEUE_TIMEOUT;
    let admission = match raw.admission {
        None => None,
        Some(a) => {
            if let Some(n) = a.queue_capacity {
                if n > 1_000_000 {
                    return Err(invalid(
                        "policies.admission.queue_capacity",
                        "must be at most 1000000",
                    ));
                }
                queue_capacity = n;
            }
            if let Some(ms) = a.queue_timeout_ms {
                if !(1..=3_600_000).contains(&ms) {
                    return Err(invalid(
                        "policies.admission.queue_timeout_ms",
                        "must be between 1 and 3600000",
                    ));
                }
                queue_timeout = Duration::from_millis(ms);
            }
            Some(SlotPolicySpec {
                name: slot_policy_name("policies.admission.name", a.name, "admission")?,
                source: policy_source("policies.admission", &a.source)?,
                config: policy_config(a.config),
            })
        }
    };
    let mut safety_window_bytes = crate::safety::DEFAULT_OUTPUT_WINDOW_BYTES;
    let mut safety_fail_closed = false;
    let safety = match raw.safety {
        None => None,
        Some(f) => {
            if let Some(n) = f.window_bytes {
                if !(16..=1_048_576).contains(&n) {
                    return Err(invalid(
                        "policies.safety.window_bytes",
                        "must be between 16 and 1048576",
                    ));
                }
                safety_window_bytes = n;
            }
            safety_fail_closed = f.fail_closed.unwrap_or(false);
            Some(SlotPolicySpec {
                name: slot_policy_name("policies.safety.name", f.name, "safety")?,
                source: policy_source("policies.safety", &f.source)?,
                config: policy_config(f.config),
            })
        }
    };
    let mut pass_headers = Vec::new();
    for (i, name) in raw.pass_headers.unwrap_or_default().into_iter().enumerate() {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(invalid(
                format!("policies.pass_headers[{i}]"),
                format!("{name:?} is not a valid header name"),
            ));
        }
        pass_headers.push(name.to_ascii_lowercase());
    }
    if router.is_empty() && strategy == Strategy::ConsistentHash {
        router.push(RouterVariantSpec {
            name: "default".to_owned(),
            source: PolicySource::Builtin("consistent-hash".to_owned()),
            weight: 100,
            shadow: false,
            config: Default::default(),
        });
    }
    Ok(PoliciesConfig {
        engine,
        router,
        admission,
        queue_capacity,
        queue_timeout,
        safety,
        safety_window_bytes,
        safety_fail_closed,
        pass_headers,
    })
}

/// `builtin:NAME` or a file path, checked.
fn policy_source(key: &str, source: &str) -> Result<PolicySource, ConfigError> {
    match source.strip_prefix("builtin:") {
        Some(name) => {
            if crate::builtin::builtin(name).is_none() {
                return Err(invalid(
                    format!("{key}.source"),
                    format!(
                        "no built-in policy {name:?}; built-ins: {}",
                        crate::builtin::builtin_names()
                    ),
                ));
            }
            Ok(PolicySource::Builtin(name.to_owned()))
        }
        None if source.is_empty() => Err(invalid(
            format!("{key}.source"),
            "must be builtin:NAME or a path to a .wasm component",
        )),
        None => Ok(PolicySource::File(std::path::PathBuf::from(source))),
    }
}

/// A policy's configuration as the strings the `config` import hands out.
fn policy_config(
    raw: Option<std::collections::BTreeMap<String, toml::Value>>,
) -> std::collections::BTreeMap<String, String> {
    raw.unwrap_or_default()
        .into_iter()
        .map(|(k, v)| {
            let text = match v {
                toml::Value::String(s) => s,
                other => other.to_string(),
            };
            (k, text)
        })
        .collect()
}

fn slot_policy_name(key: &str, name: Option<String>, default: &str) -> Result<String, ConfigError> {
    let name = name.unwrap_or_else(|| default.to_owned());
    if name.is_empty() || name.len() > 64 {
        return Err(invalid(key, "must be 1 to 64 characters"));
    }
    Ok(name)
}

fn gpu_placement(raw: &RawModel) -> Result<Option<GpuPlacement>, ConfigError> {
    let ordinal = match raw.device.as_deref() {
        None | Some("cpu") => return Ok(None),
        Some("cuda") => 0,
        Some(other) => other
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| {
                invalid(
                    "model.device",
                    format!("{other:?} is not cpu, cuda or cuda:N"),
                )
            })?,
    };
    if !cfg!(feature = "cuda") {
        return Err(invalid(
            "model.device",
            "this build has no CUDA support: build with --features cuda",
        ));
    }
    Ok(Some(GpuPlacement {
        ordinal,
        kv_blocks: raw.kv_blocks,
    }))
}

fn model_config(raw: RawModel) -> Result<ModelOptions, ConfigError> {
    let mut model = ModelOptions::default();
    if let Some(threads) = raw.threads {
        if threads == 0 || threads > 256 {
            return Err(invalid("model.threads", "must be 1 to 256"));
        }
        model.threads = threads;
    }
    if let Some(kernels) = raw.kernels
        && kernels != "auto"
    {
        let isa = Isa::from_name(&kernels).ok_or_else(|| {
            invalid(
                "model.kernels",
                format!("{kernels:?} is not one of auto, avx2, avx, scalar"),
            )
        })?;
        if !isa.available() {
            return Err(invalid(
                "model.kernels",
                format!("this CPU does not support the {kernels} kernels"),
            ));
        }
        model.isa = Some(isa);
    }
    if let Some(blocks) = raw.kv_blocks {
        if blocks == 0 {
            return Err(invalid("model.kv_blocks", "must be at least 1"));
        }
        model.kv_blocks = blocks;
    }
    Ok(model)
}

fn simulator_config(raw: RawSimulator) -> Result<EngineConfig, ConfigError> {
    let mut engine = EngineConfig::simulated("template");
    let mut cost = SimCostModel::default();
    if let Some(v) = raw.time_scale {
        engine.time_scale = v;
    }
    if let Some(v) = raw.kv_blocks {
        engine.kv_blocks = v;
    }
    if let Some(v) = raw.max_running {
        engine.max_running = v;
    }
    if let Some(v) = raw.step_token_budget {
        engine.step_token_budget = v;
    }
    if let Some(v) = raw.prefill_tokens_per_s {
        cost.prefill_tokens_per_s = v;
    }
    if let Some(v) = raw.decode_step_base_ms {
        cost.decode_step_base = duration_ms("simulator.decode_step_base_ms", v)?;
    }
    if let Some(v) = raw.decode_step_per_seq_ms {
        cost.decode_step_per_seq = duration_ms("simulator.decode_step_per_seq_ms", v)?;
    }
    engine.cost = cost;
    engine
        .validate()
        .map_err(|e| invalid("simulator", e.to_string()))?;
    Ok(engine)
}

fn duration_ms(key: &str, ms: f64) -> Result<Duration, ConfigError> {
    if !ms.is_finite() || ms < 0.0 {
        return Err(invalid(
            key,
            format!("{ms} is not a non-negative number of milliseconds"),
        ));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_device_is_the_cpu_or_a_cuda_ordinal() {
        let parse = |device: &str| {
            gpu_placement(&RawModel {
                device: Some(device.to_owned()),
                kv_blocks: Some(100),
                ..RawModel::default()
            })
        };
        assert_eq!(parse("cpu").unwrap(), None);
        assert_eq!(gpu_placement(&RawModel::default()).unwrap(), None);
        if cfg!(feature = "cuda") {
            assert_eq!(
                parse("cuda:1").unwrap(),
                Some(GpuPlacement {
                    ordinal: 1,
                    kv_blocks: Some(100)
                })
            );
            assert_eq!(parse("cuda").unwrap().map(|g| g.ordinal), Some(0));
        } else {
            let err = parse("cuda:1").unwrap_err().to_string();
            assert!(err.contains("--features cuda"), "{err}");
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn embedded_default_is_four_simulated_servers_on_loopback() {
        let config = RawConfig::embedded_default()
            .validate_with_env(no_env)
            .unwrap();
        assert_eq!(config.servers.len(), 4);
        assert!(config.listen.ip().is_loopback());
        assert_eq!(config.listen.port(), 8080);
        assert!(config.admin_token.is_none());
        assert_eq!(config.strategy, Strategy::ConsistentHash);
    }

    #[test]
    fn refuses_public_listen_without_keys() {
        let raw = RawConfig::from_toml("listen = \"0.0.0.0:8080\"").unwrap();
        let err = raw.validate_with_env(no_env).unwrap_err().to_string();
        assert!(err.contains("without API keys"), "{err}");
        let raw = RawConfig::from_toml(
            "listen = \"0.0.0.0:8080\"\n[[api_keys]]\nkey = \"sk-test-123456\"",
        )
        .unwrap();
        assert!(raw.validate_with_env(no_env).is_ok());
    }

    #[test]
    fn admin_token_comes_from_env_when_file_has_none() {
        let config = RawConfig::default()
            .validate_with_env(|n| (n == ADMIN_TOKEN_ENV).then(|| "a".repeat(20)))
            .unwrap();
        assert_eq!(config.admin_token.as_deref(), Some("a".repeat(20).as_str()));
        let err = RawConfig::default()
            .validate_with_env(|_| Some("short".into()))
            .unwrap_err();
        assert!(err.to_string().contains("admin_token"));
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("listen = \"nowhere\"", "listen"),
            ("bogus = 1", "unknown field"),
            ("[routing]\nstrategy = \"random\"", "routing.strategy"),
            ("[routing]\nload_factor = 0.5", "routing"),
            (
                "[[servers]]\naddress = \"http://10.0.0.1\"",
                "http://HOST:PORT",
            ),
            (
                "[[servers]]\naddress = \"https://10.0.0.1:9000\"",
                "plain http://",
            ),
            (
                "[[servers]]\naddress = \"sim://a\"\n[[servers]]\naddress = \"sim://a\"",
                "duplicate id",
            ),
            ("[[servers]]\naddress = \"sim://a\"\nweight = 0", "weight"),
            (
                "[simulator]\ndecode_step_base_ms = -1",
                "decode_step_base_ms",
            ),
            ("models = []", "models"),
            ("[model]\nthreads = 0", "model.threads"),
            ("[model]\nkernels = \"neon\"", "model.kernels"),
            ("[model]\nkv_blocks = 0", "model.kv_blocks"),
            ("[model]\ndevice = \"tpu:0\"", "model.device"),
            ("[model]\ndevice = \"cuda:x\"", "model.device"),
            (
                "[policies.admission]\nsource = \"builtin:nope\"",
                "policies.admission.source",
            ),
            (
                "[policies.admission]\nsource = \"builtin:tiered\"\nqueue_timeout_ms = 0",
                "policies.admission.queue_timeout_ms",
            ),
            (
                "[policies.safety]\nsource = \"builtin:blocklist\"\nwindow_bytes = 1",
                "policies.safety.window_bytes",
            ),
            ("[policies.safety]\nsource = \"\"", "policies.safety.source"),
            (
                "[policies]\npass_headers = [\"bad header\"]",
                "pass_headers[0]",
            ),
        ];
        for (toml, needle) in cases {
            let err = RawConfig::from_toml(toml)
                .and_then(|raw| raw.validate_with_env(no_env))
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{toml}: {err}");
        }
    }

    #[test]
    fn slots_and_their_settings_are_read() {
        let config = RawConfig::from_toml(
            "[policies]\npass_headers = [\"X-Team\"]\n\
             [policies.admission]\nsource = \"builtin:tiered\"\nqueue_capacity = 8\n\
             queue_timeout_ms = 250\nconfig = { \"priority.gold\" = 200 }\n\
             [policies.safety]\nsource = \"/etc/ringmaster/filter.wasm\"\nwindow_bytes = 64\n\
             fail_closed = true",
        )
        .unwrap()
        .validate_with_env(no_env)
        .unwrap();
        let policies = &config.policies;
        let admission = policies.admission.as_ref().unwrap();
        assert_eq!(admission.name, "admission");
        assert_eq!(admission.source, PolicySource::Builtin("tiered".into()));
        assert_eq!(admission.config["priority.gold"], "200");
        assert_eq!(policies.queue_capacity, 8);
        assert_eq!(policies.queue_timeout, Duration::from_millis(250));
        assert_eq!(policies.safety_window_bytes, 64);
        assert!(policies.safety_fail_closed);
        assert_eq!(policies.pass_headers, ["x-team"]);
        let files = policies.files();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].0, "safety-filter");
    }

    /// Every example configuration and the README's annotated one validate.
    #[test]
    fn example_configurations_are_valid() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut checked = 0;
        for entry in std::fs::read_dir(root.join("examples/configs")).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&path).unwrap();
                RawConfig::from_toml(&text)
                    .and_then(|raw| raw.validate_with_env(no_env))
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                checked += 1;
            }
        }
        assert!(checked >= 2);
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let block = readme
            .split("```toml\n")
            .nth(1)
            .and_then(|rest| rest.split("```").next())
            .expect("the README has a TOML block");
        // The README's listen address is public, which needs API keys: it has one.
        RawConfig::from_toml(block)
            .and_then(|raw| raw.validate_with_env(no_env))
            .unwrap_or_else(|e| panic!("README configuration: {e}"));
    }
}
