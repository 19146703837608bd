//! The configuration file as written: serde types with `deny_unknown_fields`, every key
//! optional. Nothing here is checked; [`super::RawConfig::validate`] turns them into the
//! validated [`super::Config`], and only that travels.

use serde::Deserialize;

use super::upstream::{RawRetry, RawUpstream};

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
    /// `[tls]`: the public listener's certificate and key.
    pub tls: Option<crate::tls::RawTls>,
    /// `[admin]`: the admin API's own listener.
    pub admin: Option<RawAdmin>,
    /// `access_log`: one INFO line per request (otherwise they are DEBUG).
    pub access_log: Option<bool>,
    /// `[aliases]`: public model name → the name servers serve.
    pub aliases: Option<std::collections::BTreeMap<String, String>>,
    /// `[[api_keys]]`.
    pub api_keys: Option<Vec<RawApiKey>>,
    /// `[[tenants]]`: groups of keys sharing limits.
    pub tenants: Option<Vec<RawTenant>>,
    /// `[limits]`.
    pub limits: Option<RawLimits>,
    /// `[routing]`.
    pub routing: Option<RawRouting>,
    /// `[[servers]]`.
    pub servers: Option<Vec<RawServer>>,
    /// `[[fallback]]`: where a model's requests spill when its own servers cannot take them.
    pub fallback: Option<Vec<RawFallback>>,
    /// `[simulator]`.
    pub simulator: Option<RawSimulator>,
    /// `[record]`: the gateway's own traffic as a trace.
    pub record: Option<RawRecord>,
    /// `[policies]`.
    pub policies: Option<RawPolicies>,
    /// `[model]`.
    pub model: Option<RawModel>,
    /// `[upstream]`.
    pub upstream: Option<RawUpstream>,
    /// `[retry]`.
    pub retry: Option<RawRetry>,
    /// `[autoscale]`: the autoscaling signal's thresholds.
    pub autoscale: Option<RawAutoscale>,
    /// `[cluster]`: replicas sharing state on Redis.
    pub cluster: Option<RawCluster>,
    /// `[lora]`: LoRA adapters loaded on demand.
    pub lora: Option<crate::lora::RawLora>,
    /// `[telemetry]`: request traces over OTLP.
    pub telemetry: Option<crate::telemetry::RawTelemetry>,
    /// `[api]`: what the doors do with fields they do not know.
    pub api: Option<RawApi>,
    /// `[responses]`: the Responses API's stored responses.
    pub responses: Option<RawResponses>,
    /// `[disaggregation]`: the rules for requests split between a prefill and a decode
    /// server.
    pub disaggregation: Option<RawDisaggregation>,
    /// `[workers]`: what the gateway shares with its `ringmaster worker`s.
    pub workers: Option<RawWorkers>,
}

/// `[workers]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorkers {
    /// The environment variable holding the secret a split request's legs are signed with
    /// (default `RINGMASTER_WORKER_SECRET`).
    pub secret_env: Option<String>,
}

/// `[disaggregation]`: the rules for requests split between a prefill and a decode server.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDisaggregation {
    /// The host's pair rule: split a request only when the decode server would compute at
    /// least this many of its prompt tokens itself (default 256).
    pub min_uncached_tokens: Option<u32>,
    /// `retry` (another prefill server, then whole on the decode server; the default) or
    /// `decode` (whole on the decode server at once).
    pub on_prefill_failure: Option<String>,
    /// `decode` (the decode server computes the prompt when every prefill server has more
    /// work ahead than it would; the default) or `wait` (queue at the prefill server).
    pub when_prefill_busy: Option<String>,
    /// Simulated servers' KV link bandwidth, GB/s (default 50).
    pub link_gbps: Option<f64>,
    /// Simulated servers' KV link setup time per transfer, µs (default 100).
    pub link_latency_us: Option<f64>,
}

/// `[cluster]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCluster {
    /// Redis URL.
    pub url: Option<String>,
    /// This replica's name.
    pub name: Option<String>,
    /// Key prefix.
    pub namespace: Option<String>,
    /// The request path's wait for Redis, ms.
    pub deadline_ms: Option<u64>,
    /// Admit on local buckets while Redis is away.
    pub fail_open: Option<bool>,
    /// A `rediss://` Redis's CA certificates (PEM); default: the system's roots.
    pub ca_file: Option<String>,
    /// A client certificate (PEM) for a Redis that asks for one (`tls-auth-clients yes`).
    pub client_cert: Option<String>,
    /// Its private key (PEM).
    pub client_key: Option<String>,
}

/// `[autoscale]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAutoscale {
    /// Utilisation above which to scale up (0.7).
    pub scale_up: Option<f64>,
    /// Utilisation below which to scale down (0.2).
    pub scale_down: Option<f64>,
    /// Capacity of a server that reports no KV cache, tokens (32768).
    pub server_capacity_tokens: Option<u64>,
    /// Work of one in-flight request on such a server, tokens (1024).
    pub tokens_per_request: Option<u64>,
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
    /// Most entries in one policy's `state` store.
    pub state_max_entries: Option<u32>,
    /// Most MiB (keys and values) in one policy's `state` store.
    pub state_max_mb: Option<u64>,
    /// Directory for compiled components (default: `~/.cache/ringmaster/policies`; `""`: off).
    pub cache_dir: Option<String>,
    /// `[[policies.router]]`: router variants and the shadow.
    pub router: Option<Vec<RawRouterVariant>>,
    /// How the host guards the router policies' choices: `"policy"` (the policy decides
    /// alone; the default) or `"host"` (a choice at its bounded-load cap is spilled on the
    /// ring).
    pub router_bounded_load: Option<String>,
    /// Stop a candidate router variant (its weight to 0) once it is worse than the control
    /// beyond doubt on error rate or mean TTFT (default false).
    pub guardrails: Option<bool>,
    /// The router slot's own bounded-load factor (default: `[routing] load_factor`).
    pub router_load_factor: Option<f64>,
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
    /// Queue priority (0 to 255) per tier: higher tiers leave the queue first.
    pub queue_priority: Option<std::collections::BTreeMap<String, i64>>,
    /// Waiting this long raises a waiter one queue-priority level, milliseconds (10000).
    pub queue_aging_ms: Option<u64>,
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
    /// Ramp this variant in as a candidate: its percent of traffic at each step (e.g.
    /// `[1, 5, 25, 50, 100]`), raised while the guardrails hold; the last promotes it.
    pub rollout: Option<Vec<u32>>,
    /// Each rollout step's least duration (`"10m"`, `"30s"`; default 10 minutes).
    pub rollout_step: Option<String>,
    /// The candidate's requests each rollout step must see before it may advance.
    pub rollout_min_samples: Option<u64>,
}

/// One `[[api_keys]]` entry.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApiKey {
    /// The secret (hashed at load; only its digest is kept).
    pub key: Option<String>,
    /// The secret's SHA-256 as 64 hex digits, instead of `key`: the config then holds no
    /// secret (`ringmaster key-hash` prints it).
    pub key_sha256: Option<String>,
    /// The key's tier (for admission policies and the queue's order; default `"default"`).
    pub tier: Option<String>,
    /// The `[[tenants]]` entry the key belongs to; a key without one is its own tenant.
    pub tenant: Option<String>,
    /// The models the key may use; all when absent.
    pub models: Option<Vec<String>>,
    /// Requests per minute allowed for this key; unlimited when absent.
    pub requests_per_minute: Option<u32>,
    /// Input (prompt) tokens per minute for this key.
    pub input_tokens_per_minute: Option<u32>,
    /// Output (generated) tokens per minute for this key, charged as they stream.
    pub output_tokens_per_minute: Option<u32>,
}

/// One `[[tenants]]` entry: limits shared by every key that names it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTenant {
    /// The tenant's name (keys refer to it; a metric label).
    pub name: String,
    /// The models the tenant's keys may use; all when absent.
    pub models: Option<Vec<String>>,
    /// Requests per minute for all the tenant's keys together.
    pub requests_per_minute: Option<u32>,
    /// Input tokens per minute for all the tenant's keys together.
    pub input_tokens_per_minute: Option<u32>,
    /// Output tokens per minute for all the tenant's keys together.
    pub output_tokens_per_minute: Option<u32>,
    /// Whether the tenant's requests may spill to a `[[fallback]]` pool (default true; false
    /// for data that must stay on the fleet's own servers).
    pub fallback: Option<bool>,
}

/// One `[[fallback]]` rule.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFallback {
    /// The spill-over pool: the servers whose `pool` names it.
    pub pool: String,
    /// The models whose requests spill there; default: every model.
    pub models: Option<Vec<String>>,
    /// The name the pool's servers serve those models under (a hosted provider's model);
    /// default: the request's own.
    pub model: Option<String>,
    /// When: `no_server` (no server of the model can be reached), `overloaded` (every one's
    /// queue is full), `policy` (the router policy declined the request); default all three.
    pub when: Option<Vec<String>>,
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
    /// A streamed reply with nothing to send for this long sends a `ping`, milliseconds
    /// (5000; 0 turns pings off).
    pub stream_ping_ms: Option<u64>,
    /// How long a streamed reply outlives its client for a reconnect with `Last-Event-ID`,
    /// milliseconds (0, the default: streams are not resumable, a disconnect cancels at once).
    pub resume_window_ms: Option<u64>,
    /// How long a 429 is held before it is sent, milliseconds (250; 0: at once): a flooding
    /// client's connections then cannot crowd out other keys' requests.
    pub rate_limit_delay_ms: Option<u64>,
    /// A client that accepts nothing of a reply for this long is disconnected and its
    /// generation cancelled, milliseconds (30000; 0: never).
    pub client_send_timeout_ms: Option<u64>,
    /// A connection that has not sent a whole request head this long after its first byte
    /// (or after it opened) is closed, milliseconds (10000; 0: never).
    pub header_read_timeout_ms: Option<u64>,
    /// A keep-alive connection with no request for this long is closed, milliseconds
    /// (60000; 0: never).
    pub idle_timeout_ms: Option<u64>,
    /// A request body not read whole this long after its head is refused with 408,
    /// milliseconds (60000; 0: never).
    pub body_read_timeout_ms: Option<u64>,
    /// Largest request head (request line and headers), bytes (65536).
    pub max_header_bytes: Option<usize>,
    /// Most headers in one request (100).
    pub max_headers: Option<usize>,
    /// Most client connections open at once; new ones past it are refused (derived from
    /// the open-files limit; 0: no cap).
    pub max_connections: Option<usize>,
    /// Most concurrent streams on one HTTP/2 connection (128).
    pub max_concurrent_streams: Option<u32>,
    /// Requests inside the gateway (arrived, not yet answered in full) past which new
    /// requests are shed with 529/503 (10000; 0: no bound).
    pub max_pending_requests: Option<usize>,
    /// Resident memory past which new requests are shed, MiB (90 % of the memory the
    /// process may use; 0: no bound).
    pub max_memory_mb: Option<u64>,
}

/// `[routing]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRouting {
    /// The router policy when `[[policies.router]]` names none: `builtin:NAME` or a
    /// component file (default `builtin:prefix-affinity`).
    pub router: Option<String>,
    /// Deprecated: `"consistent-hash"` (the default router) or `"round-robin"` (the
    /// `builtin:round-robin` router).
    pub strategy: Option<String>,
    /// Virtual nodes per unit of weight.
    pub vnodes_per_weight: Option<u32>,
    /// Bounded-load factor `c`.
    pub load_factor: Option<f64>,
    /// Prefix-hash chunk size, bytes.
    pub prefix_chunk_bytes: Option<usize>,
    /// Most prefix hashes per request.
    pub max_prefix_hashes: Option<usize>,
    /// Request headers that carry a session id, the first present one winning (default:
    /// `x-session-id`, then Claude Code's `x-claude-code-session-id`, then Codex's
    /// `session-id`).
    pub session_headers: Option<Vec<String>>,
    /// Patterns (regular expressions) of system-prompt lines that change per request without
    /// changing its meaning: left out of the routing key, the prefix hashes and what servers
    /// see (default: Claude Code's `x-anthropic-billing-header:` line; `[]` for none).
    pub volatile_prefix: Option<Vec<String>>,
}

/// `[responses]`: the Responses API's stored responses.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawResponses {
    /// How long a stored response is kept, seconds (default a day).
    pub ttl_s: Option<u64>,
    /// The most memory stored responses take in a gateway alone, MiB (default 256; a fleet
    /// keeps them in Redis).
    pub max_mb: Option<usize>,
}

/// `[api]`: what the doors do with what they do not know.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawApi {
    /// A field the door's API does not define: `pass` (on to a server that speaks the same
    /// API, dropped and counted otherwise; the default), `drop`, or `refuse` (400).
    pub unknown_fields: Option<String>,
}

/// One `[[servers]]` entry.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServer {
    /// `sim://NAME`, `gguf:PATH` or `http://HOST:PORT`.
    pub address: String,
    /// Id on the ring; defaults to the address's name.
    pub id: Option<String>,
    /// Ring weight, default 1.
    pub weight: Option<u32>,
    /// The models it serves; default: what a remote server's `/v1/models` lists, and until
    /// that is known (or for a server in this process) any model the gateway accepts.
    pub models: Option<Vec<String>>,
    /// The engine's KV event publisher (`tcp://HOST:PORT`, vLLM's
    /// `--kv-events-config '{"publisher":"zmq","endpoint":…}'`, SGLang's `--kv-events-config`).
    pub kv_events: Option<String>,
    /// Its replay socket (`tcp://HOST:PORT`), to repair gaps in the stream.
    pub kv_events_replay: Option<String>,
    /// `vllm` (default) or `sglang`.
    pub kv_events_format: Option<String>,
    /// How the engine tokenizes: a Hugging Face model folder, a GGUF file, or `sim` (the
    /// simulated servers' tokenizer). Without it the routing-history estimate stays.
    pub tokenizer: Option<String>,
    /// The API it speaks: `chat` (OpenAI chat completions, the default), `messages`
    /// (Anthropic's) or `responses` (OpenAI's Responses).
    pub api: Option<String>,
    /// Whether it is a reasoning model that takes a reasoning effort and returns its
    /// reasoning (vLLM's `reasoning_content`, thinking blocks, reasoning items).
    pub reasoning: Option<bool>,
    /// Whether it gets the system-prompt lines `[routing] volatile_prefix` takes out (true
    /// only for Anthropic's own API, which checks Claude Code's billing line).
    pub keep_volatile: Option<bool>,
    /// `both` (whole requests; the default), `prefill` or `decode`.
    pub role: Option<String>,
    /// How a prefill or decode server's KV cache moves: `vllm-nixl`, `sglang` or
    /// `ringmaster` (this process's servers: always `ringmaster`).
    pub disaggregation: Option<String>,
    /// An SGLang prefill server's `--disaggregation-bootstrap-port` (default 8998).
    pub bootstrap_port: Option<u16>,
    /// The engine's data-parallel rank this entry stands for.
    pub dp_rank: Option<u32>,
    /// A spill-over pool this server belongs to (a `[[fallback]]` rule's `pool`): it then
    /// takes only requests that spill there, never a model's own.
    pub pool: Option<String>,
    /// An `https://` server's CA certificates (PEM); default: the system's roots.
    pub ca_file: Option<String>,
    /// A client certificate (PEM) for an `https://` server that asks for one; with
    /// `client_key`.
    pub client_cert: Option<String>,
    /// The client certificate's private key (PEM).
    pub client_key: Option<String>,
    /// The environment variable holding the server's API key, sent as `Authorization: Bearer`
    /// (OpenAI's APIs) or `x-api-key` (Anthropic's Messages). The name travels (a cluster's
    /// log, `/admin/servers`); the key never leaves the process that reads it.
    pub api_key_env: Option<String>,
    /// Extra headers sent with every request to the server (an organisation, a project, a
    /// gateway's own credential); their values are never shown or logged.
    pub headers: Option<std::collections::BTreeMap<String, String>>,
}

/// `[record]`: write every finished Messages request to a Mooncake-format trace (token counts
/// and prefix-block hashes, never text) for `ringmaster bench replay`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRecord {
    /// The trace file (appended to).
    pub path: String,
    /// Record from the start (default true); else only once the admin API switches it on.
    pub enabled: Option<bool>,
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
    /// Prompt tokens per engine step while sequences decode (stall-free batching).
    pub prefill_tokens_while_decoding: Option<u32>,
    /// Prefill speed, tokens per second.
    pub prefill_tokens_per_s: Option<f64>,
    /// Decode step at batch 1, milliseconds.
    pub decode_step_base_ms: Option<f64>,
    /// Extra decode-step time per running sequence, milliseconds.
    pub decode_step_per_seq_ms: Option<f64>,
    /// How routing learns what this process's engines hold: `in_process` (the default),
    /// `vllm_events` or `routing_history` (see `LocalCacheView`).
    pub cache_view: Option<String>,
}

/// `[admin]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdmin {
    /// Address of the admin listener (the admin API and `/ui` are then not on the public
    /// port).
    pub listen: Option<String>,
    /// Its certificate chain, PEM.
    pub cert: Option<std::path::PathBuf>,
    /// Its private key, PEM.
    pub key: Option<std::path::PathBuf>,
    /// For mutual TLS on it: the CA certificates (PEM) an operator's certificate must chain
    /// to.
    pub client_ca: Option<std::path::PathBuf>,
    /// `[[admin.tokens]]`: operator tokens, each with a name and scopes.
    pub tokens: Option<Vec<RawAdminToken>>,
}

/// One `[[admin.tokens]]` entry as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAdminToken {
    /// Who holds it, as the audit trail names them.
    pub name: Option<String>,
    /// The secret (hashed at load; at least 16 characters).
    pub token: Option<String>,
    /// The secret's SHA-256, 64 hex digits, instead of `token`.
    pub token_sha256: Option<String>,
    /// `read`, `operate`, `policies` (default `["read"]`).
    pub scopes: Option<Vec<String>>,
}
