//! Gateway configuration: raw TOML → validated [`Config`].
//!
//! [`RawConfig`] mirrors the TOML file (every key optional, unknown keys refused); the binary
//! lays CLI flags over it, then [`RawConfig::validate`] checks every invariant and produces a
//! [`Config`], the only type the rest of the gateway sees. The embedded default (four simulated
//! servers on loopback) is `default-config.toml`, compiled in. This module does no I/O beyond
//! reading the file it is given.
//!
//! The raw types are in `raw`, the one error type in `error`; the sections with rules of
//! their own are validated in their own files (`policies`, `model` for `[model]` and
//! `[simulator]`, `upstream` for `[upstream]` and `[retry]`); this file holds the top level,
//! the limits, routing, keys and servers, and the validated [`Config`].

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use ringmaster_gpu_runtime::EngineConfig;
use ringmaster_gpu_runtime::model::ModelOptions;
use ringmaster_ring::{MAX_VNODES_PER_WEIGHT, RingConfig};

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

mod error;
mod model;
mod policies;
mod raw;

pub use error::ConfigError;
pub use policies::{PoliciesConfig, PolicySource, RouterVariantSpec, SlotPolicySpec};
pub use raw::{
    RawAdmission, RawApiKey, RawAutoscale, RawConfig, RawLimits, RawModel, RawPolicies, RawRecord,
    RawRouterVariant, RawRouting, RawSafety, RawServer, RawSimulator, RawTenant,
};

use error::invalid;
use model::{gpu_placement, model_config, simulator_config};
use policies::policies_config;

/// How long a streamed reply may send nothing before it sends a `ping`, unless configured.
pub const DEFAULT_STREAM_PING: Duration = Duration::from_secs(5);

/// How long a 429 is held before it goes out, unless configured.
pub const DEFAULT_RATE_LIMIT_DELAY: Duration = Duration::from_millis(250);

/// How long a client may take nothing of a reply before it is cut off (nginx's
/// `send_timeout` is 60 s; a streamed token reply that stalls half that is already broken).
pub const DEFAULT_CLIENT_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// An API key and what it grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiKey {
    /// The secret's SHA-256 (the secret itself is not kept).
    pub digest: [u8; 32],
    /// Its tier.
    pub tier: String,
    /// Its `[[tenants]]` entry; `None`: its own tenant.
    pub tenant: Option<String>,
    /// The models it may use (`None`: all).
    pub models: Option<Vec<String>>,
    /// Its own limits.
    pub limits: RateLimits,
}

/// Per-minute limits of a key or a tenant; `None` is unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RateLimits {
    /// Requests per minute.
    pub requests_per_minute: Option<NonZeroU32>,
    /// Input tokens per minute.
    pub input_tokens_per_minute: Option<NonZeroU32>,
    /// Output tokens per minute.
    pub output_tokens_per_minute: Option<NonZeroU32>,
}

/// A tenant: limits shared by its keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    /// Its name.
    pub name: String,
    /// Its limits.
    pub limits: RateLimits,
    /// The models its keys may use (`None`: all).
    pub models: Option<Vec<String>>,
}

/// Validates a key's or tenant's three limits (`at` names the entry in messages).
fn rate_limits(at: &str, values: [Option<u32>; 3]) -> Result<RateLimits, ConfigError> {
    let [requests, input, output] = values;
    let one = |value: Option<u32>, field: &str| -> Result<Option<NonZeroU32>, ConfigError> {
        value
            .map(|n| {
                NonZeroU32::new(n)
                    .ok_or_else(|| invalid(format!("{at}.{field}"), "must be at least 1"))
            })
            .transpose()
    };
    Ok(RateLimits {
        requests_per_minute: one(requests, "requests_per_minute")?,
        input_tokens_per_minute: one(input, "input_tokens_per_minute")?,
        output_tokens_per_minute: one(output, "output_tokens_per_minute")?,
    })
}

/// A duration in milliseconds where 0 turns the feature off: `default` when absent, at most
/// `max_ms`.
fn optional_ms(
    value: Option<u64>,
    field: &str,
    default: Option<Duration>,
    max_ms: u64,
) -> Result<Option<Duration>, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Ok(None),
        Some(ms) if ms > max_ms => Err(invalid(field, format!("must be at most {max_ms}"))),
        Some(ms) => Ok(Some(Duration::from_millis(ms))),
    }
}

/// Validates `[autoscale]`.
fn autoscale_settings(
    raw: RawAutoscale,
) -> Result<crate::autoscale::AutoscaleSettings, ConfigError> {
    let defaults = crate::autoscale::AutoscaleSettings::default();
    let settings = crate::autoscale::AutoscaleSettings {
        scale_up: raw.scale_up.unwrap_or(defaults.scale_up),
        scale_down: raw.scale_down.unwrap_or(defaults.scale_down),
        server_capacity_tokens: raw
            .server_capacity_tokens
            .unwrap_or(defaults.server_capacity_tokens),
        tokens_per_request: raw
            .tokens_per_request
            .unwrap_or(defaults.tokens_per_request),
    };
    if !(settings.scale_down.is_finite() && settings.scale_up.is_finite())
        || settings.scale_down < 0.0
        || settings.scale_down >= settings.scale_up
    {
        return Err(invalid(
            "autoscale",
            "scale_down must be at least 0 and below scale_up",
        ));
    }
    if settings.server_capacity_tokens == 0 {
        return Err(invalid(
            "autoscale.server_capacity_tokens",
            "must be at least 1",
        ));
    }
    Ok(settings)
}

/// Validates a `models` allow-list. Its names are not checked against `models`: servers may
/// serve more models than the config names.
fn allowed_models(
    at: &str,
    models: Option<Vec<String>>,
) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(models) = models else {
        return Ok(None);
    };
    if models.is_empty() {
        return Err(invalid(
            format!("{at}.models"),
            "must name at least one model (leave it out for all)",
        ));
    }
    Ok(Some(models))
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
    /// Tenants the keys belong to.
    pub tenants: Vec<Tenant>,
    /// The autoscaling signal's settings.
    pub autoscale: crate::autoscale::AutoscaleSettings,
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
    /// Routing strategy.
    pub strategy: Strategy,
    /// Ring parameters.
    pub ring: RingConfig,
    /// Prefix hashing.
    pub prefix_hashing: PrefixHashing,
    /// Headers that carry a session id, in order (lower case).
    pub session_headers: Vec<http::HeaderName>,
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
    /// Where the gateway records its traffic as a trace (`[record] path`), if anywhere, and
    /// whether it records from the start (`[record] enabled`).
    pub record: Option<(std::path::PathBuf, bool)>,
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

        let autoscale = autoscale_settings(self.autoscale.unwrap_or_default())?;
        let mut tenants: Vec<Tenant> = Vec::new();
        for (i, raw) in self.tenants.unwrap_or_default().into_iter().enumerate() {
            let at = format!("tenants[{i}]");
            if raw.name.trim().is_empty() || raw.name.len() > 64 {
                return Err(invalid(format!("{at}.name"), "must be 1 to 64 characters"));
            }
            if tenants.iter().any(|t| t.name == raw.name) {
                return Err(invalid(
                    format!("{at}.name"),
                    format!("duplicate tenant {:?}", raw.name),
                ));
            }
            tenants.push(Tenant {
                limits: rate_limits(
                    &at,
                    [
                        raw.requests_per_minute,
                        raw.input_tokens_per_minute,
                        raw.output_tokens_per_minute,
                    ],
                )?,
                models: allowed_models(&at, raw.models)?,
                name: raw.name,
            });
        }
        let mut api_keys: Vec<ApiKey> = Vec::new();
        for (i, raw) in self.api_keys.unwrap_or_default().into_iter().enumerate() {
            let at = format!("api_keys[{i}]");
            let digest = match (raw.key, raw.key_sha256) {
                (Some(key), None) => {
                    if key.len() < 8 || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
                        return Err(invalid(
                            format!("{at}.key"),
                            "must be at least 8 characters with no whitespace",
                        ));
                    }
                    crate::auth::key_digest(&key)
                }
                (None, Some(hex_digest)) => {
                    let mut digest = [0u8; 32];
                    hex::decode_to_slice(hex_digest.trim(), &mut digest).map_err(|_| {
                        invalid(
                            format!("{at}.key_sha256"),
                            "must be 64 hexadecimal digits (a SHA-256)",
                        )
                    })?;
                    digest
                }
                (Some(_), Some(_)) => {
                    return Err(invalid(at, "give key or key_sha256, not both"));
                }
                (None, None) => {
                    return Err(invalid(
                        format!("{at}.key"),
                        "field required (or key_sha256)",
                    ));
                }
            };
            if api_keys.iter().any(|k| k.digest == digest) {
                return Err(invalid(at, "duplicate key"));
            }
            if let Some(tenant) = &raw.tenant
                && !tenants.iter().any(|t| &t.name == tenant)
            {
                return Err(invalid(
                    format!("{at}.tenant"),
                    format!("no [[tenants]] entry is named {tenant:?}"),
                ));
            }
            api_keys.push(ApiKey {
                digest,
                tier: raw.tier.unwrap_or_else(|| "default".to_owned()),
                limits: rate_limits(
                    &at,
                    [
                        raw.requests_per_minute,
                        raw.input_tokens_per_minute,
                        raw.output_tokens_per_minute,
                    ],
                )?,
                models: allowed_models(&at, raw.models)?,
                tenant: raw.tenant,
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
        let stream_ping = optional_ms(
            limits.stream_ping_ms,
            "limits.stream_ping_ms",
            Some(DEFAULT_STREAM_PING),
            600_000,
        )?;
        let resume_window = optional_ms(
            limits.resume_window_ms,
            "limits.resume_window_ms",
            None,
            3_600_000,
        )?;
        let rate_limit_delay = optional_ms(
            limits.rate_limit_delay_ms,
            "limits.rate_limit_delay_ms",
            Some(DEFAULT_RATE_LIMIT_DELAY),
            60_000,
        )?;
        let client_send_timeout = optional_ms(
            limits.client_send_timeout_ms,
            "limits.client_send_timeout_ms",
            Some(DEFAULT_CLIENT_SEND_TIMEOUT),
            3_600_000,
        )?;
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
        let session_headers = match &routing.session_headers {
            None => crate::routing::DEFAULT_SESSION_HEADERS
                .iter()
                .map(|h| http::HeaderName::from_static(h))
                .collect(),
            Some(names) => names
                .iter()
                .map(|name| {
                    http::HeaderName::from_bytes(name.trim().to_ascii_lowercase().as_bytes())
                        .map_err(|_| {
                            invalid(
                                "routing.session_headers",
                                format!("{name:?} is not a valid header name"),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
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
            models,
            admin_token,
            access_log: self.access_log.unwrap_or(false),
            aliases,
            api_keys,
            tenants,
            autoscale,
            max_body_bytes,
            max_output_tokens,
            max_waiting_per_server,
            stream_ping,
            resume_window,
            client_send_timeout,
            rate_limit_delay,
            shutdown_grace,
            strategy,
            ring,
            prefix_hashing,
            session_headers,
            servers,
            simulator,
            model,
            model_gpu,
            policies,
            upstream,
            retry,
            record,
        })
    }
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
    fn the_router_slots_bounded_load_guard_is_explicit() {
        use ringmaster_pool::CapGuard;
        let guard = |policies: &str| {
            RawConfig::from_toml(&format!("[policies]\n{policies}"))
                .unwrap()
                .validate_with_env(no_env)
                .map(|c| c.policies.router_guard)
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            guard(""),
            Ok(CapGuard::Policy),
            "the policy decides by default"
        );
        assert_eq!(
            guard("router_bounded_load = \"host\""),
            Ok(CapGuard::Host { load_factor: None })
        );
        assert_eq!(
            guard("router_load_factor = 2.0"),
            Ok(CapGuard::Host {
                load_factor: Some(2.0)
            })
        );
        assert_eq!(
            guard("router_bounded_load = \"policy\""),
            Ok(CapGuard::Policy)
        );
        let err = guard("router_bounded_load = \"nobody\"").unwrap_err();
        assert!(err.contains("router_bounded_load"), "{err}");
        let err = guard("router_load_factor = 0.5").unwrap_err();
        assert!(err.contains("at least 1.0"), "{err}");
        let err = guard("router_bounded_load = \"policy\"\nrouter_load_factor = 2.0").unwrap_err();
        assert!(err.contains("no effect"), "{err}");
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
    fn keys_are_kept_as_digests_and_tenants_must_exist() {
        let digest = crate::auth::key_digest("sk-test-123456");
        let hex_digest: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        let config = RawConfig::from_toml(&format!(
            "[[tenants]]\nname = \"acme\"\ninput_tokens_per_minute = 1000\n\
             [[api_keys]]\nkey_sha256 = \"{hex_digest}\"\ntenant = \"acme\"\nmodels = [\"m\"]"
        ))
        .unwrap()
        .validate_with_env(no_env)
        .unwrap();
        assert_eq!(config.api_keys[0].digest, digest);
        assert_eq!(config.api_keys[0].tenant.as_deref(), Some("acme"));
        assert_eq!(
            config.tenants[0].limits.input_tokens_per_minute,
            NonZeroU32::new(1000)
        );
        for (toml, field) in [
            (
                "[[api_keys]]\nkey = \"sk-test-123456\"\ntenant = \"nobody\"",
                "api_keys[0].tenant",
            ),
            (
                "[[api_keys]]\nkey_sha256 = \"abc\"",
                "api_keys[0].key_sha256",
            ),
            (
                "[[api_keys]]\nkey = \"sk-test-123456\"\nkey_sha256 = \"00\"",
                "not both",
            ),
            ("[[api_keys]]\ntier = \"gold\"", "api_keys[0].key"),
            (
                "[[api_keys]]\nkey = \"sk-test-123456\"\noutput_tokens_per_minute = 0",
                "output_tokens_per_minute",
            ),
            (
                "[[tenants]]\nname = \"a\"\n[[tenants]]\nname = \"a\"",
                "duplicate tenant",
            ),
            (
                "[autoscale]\nscale_up = 0.1\nscale_down = 0.5",
                "scale_down",
            ),
            ("[limits]\nstream_ping_ms = 9999999", "stream_ping_ms"),
        ] {
            let err = RawConfig::from_toml(toml)
                .unwrap()
                .validate_with_env(no_env)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{toml}: {err}");
        }
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
