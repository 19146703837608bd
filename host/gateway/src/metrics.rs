//! Prometheus metrics for everything an operator watches.
//!
//! Request-path metrics (responses, latency histograms, routing decisions) are updated as
//! requests go by. Per-server and per-policy state is owned by the pool, the engines and the
//! slots, so collectors ([`crate::collectors`], registered from the top) read it at scrape time
//! instead of copying it on every change; this module knows none of those parts. Every family is prefixed `ringmaster_`. This module never sees a prompt.

use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Label set with one `server` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabel {
    /// Server id.
    pub server: String,
}

/// Label set of a server's role in a disaggregated fleet.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabels {
    /// Server id.
    pub server: String,
    /// `both`, `prefill` or `decode`.
    pub role: &'static str,
    /// How its KV cache moves: `vllm-nixl`, `sglang`, `ringmaster`, or empty.
    pub disaggregation: &'static str,
}

/// Label set of HTTP responses.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    /// Route name (`messages`, `models`, `admin`, …).
    pub route: &'static str,
    /// HTTP status.
    pub status: u16,
}

/// Label set of requests spilled to a `[[fallback]]` pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FallbackLabels {
    /// The spill-over pool.
    pub pool: String,
    /// `no_server`, `overloaded` or `policy`.
    pub reason: &'static str,
}

/// Label set of routing decisions.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    /// Router variant (`native` when the ring decided without a policy).
    pub variant: String,
    /// `affinity`, `bounded-load-spill`, `round-robin`, `policy-other`, `policy-over-cap`,
    /// `fallback` (a policy fault; the ring decided).
    pub reason: &'static str,
}

/// Label set with one `variant` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VariantLabel {
    /// Router variant (`native` when no policy decided).
    pub variant: String,
}

/// Label set of policy faults.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FaultLabels {
    /// Policy slot (`router`, `admission`, `safety-filter`).
    pub slot: &'static str,
    /// Variant.
    pub variant: String,
    /// `trap`, `deadline`, `memory`, `invalid-answer`, `instantiate`.
    pub kind: &'static str,
}

/// Label set of upstream attempts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    /// `ok`, or why the attempt failed: `unreachable`, `timeout`, `status-429`, `status-503`,
    /// `status-5xx`, `status-4xx`, `broken`, `refused`, `engine` (a local engine refused it).
    pub outcome: &'static str,
}

/// Label set of disaggregation decisions and prefill legs.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// What became of it (see the metric's help).
    pub outcome: &'static str,
}

/// Label set of rate-limit refusals.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RateLimitLabels {
    /// The caller's tenant (its key's name when it has none).
    pub tenant: String,
    /// Which bucket ran dry: `requests`, `input tokens` or `output tokens`.
    pub limit: &'static str,
    /// Whose bucket: `this API key` or `this API key's tenant`.
    pub bucket: &'static str,
}

/// Label set of admission decisions.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `accept`, `queue`, `reject`, or `fault` (the request was admitted).
    pub verdict: &'static str,
}

/// Label set of a field a request's server never saw.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DroppedLabels {
    /// The door (`messages`, `chat_completions`, `completions`, `responses`).
    pub door: &'static str,
    /// The field, without indices (`context_management`, `messages.content.colour`); past
    /// [`MAX_DROPPED_FIELD_LABELS`] distinct names, `other`.
    pub field: String,
}

/// Label set of a door and a router variant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DoorVariantLabels {
    /// The door.
    pub door: &'static str,
    /// Router variant (`native` when no policy decided).
    pub variant: String,
}

/// Most distinct field names `ringmaster_dropped_fields_total` labels: the rest count as
/// `other`, so that clients inventing fields cannot grow the series without bound.
pub const MAX_DROPPED_FIELD_LABELS: usize = 200;

/// Longest field name a label keeps.
const MAX_DROPPED_FIELD_CHARS: usize = 96;

/// Label set of safety-filter verdicts.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SafetyLabels {
    /// `input` (the prompt) or `output` (a window of the reply).
    pub stage: &'static str,
    /// `allow`, `block`, or `fault` (decided by `fail_closed`).
    pub verdict: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The gateway's metrics.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// HTTP responses by route and status.
    pub responses: Family<ResponseLabels, Counter>,
    /// Time from request arrival to the first generated token, by variant.
    pub ttft_seconds: HistogramFamily<VariantLabel>,
    /// Time from request arrival to the last byte of the answer, by variant.
    pub request_duration_seconds: HistogramFamily<VariantLabel>,
    /// Time spent deciding where a request goes (policy call included), by variant.
    pub routing_seconds: HistogramFamily<VariantLabel>,
    /// Routing decisions by variant and reason.
    pub routing_decisions: Family<DecisionLabels, Counter>,
    /// Requests spilled to a `[[fallback]]` pool, by pool and reason.
    pub fallback_requests: Family<FallbackLabels, Counter>,
    /// Policy faults by slot, variant and kind.
    pub policy_faults: Family<FaultLabels, Counter>,
    /// Router variants the guardrails stopped (weight set to 0), by variant.
    pub guardrail_stops: Family<VariantLabel, Counter>,
    /// The chosen server's in-flight count over its bounded-load cap, at each assignment
    /// (never above 1 while the bounded-load ring routes).
    pub routing_load_to_cap: Histogram,
    /// Generations cancelled because the client went away.
    pub client_disconnects: Counter,
    /// Client connections cut off for taking nothing for `client_send_timeout_ms`.
    pub slow_client_disconnects: Counter,
    /// TLS handshakes that failed (a client that speaks no TLS or nothing in common, one
    /// without the certificate mutual TLS asks for, or a handshake past the head timeout).
    pub tls_handshake_failures: Counter,
    /// Attempts to start a request on a server, by outcome (a retry is one more attempt).
    pub upstream_attempts: Family<AttemptLabels, Counter>,
    /// Requests routed, by whether they were split between a prefill and a decode server.
    pub pair_decisions: Family<OutcomeLabels, Counter>,
    /// Prefill legs of split requests, by outcome.
    pub prefill_legs: Family<OutcomeLabels, Counter>,
    /// Requests refused by a token bucket, by tenant and bucket.
    pub rate_limit_refusals: Family<RateLimitLabels, Counter>,
    /// Admission policy answers by verdict (a queued request is asked again on each wake-up).
    pub admission_decisions: Family<AdmissionLabels, Counter>,
    /// Time admitted requests spent in the gateway's queue.
    pub admission_queue_wait_seconds: Histogram,
    /// Requests refused because the gateway's queue was full.
    pub admission_queue_full: Counter,
    /// Requests refused because they waited in the queue past the timeout.
    pub admission_queue_timeouts: Counter,
    /// Safety-filter verdicts by stage.
    pub safety_verdicts: Family<SafetyLabels, Counter>,
    /// Seconds from process start to accepting requests (set once by the binary).
    pub cold_start_seconds: Gauge<f64, AtomicU64>,
    /// Client connections: open, and ended by the gateway (timeouts, the cap).
    pub connections: ringmaster_serve::conn::ConnectionMetrics,
    /// The overload guard: requests pending and shed, resident memory.
    pub overload: ringmaster_serve::overload::OverloadMetrics,
    /// Request bodies refused for arriving too slowly (`body_read_timeout_ms`).
    pub body_read_timeouts: Counter,
    /// Fields of requests that their server never saw, by door and field.
    pub dropped_fields: Family<DroppedLabels, Counter>,
    /// The field names labelled so far (bounded).
    dropped_names: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Prompt tokens the servers reported reading from their prefix caches, by door and
    /// variant.
    pub prefix_cached_tokens: Family<DoorVariantLabels, Counter>,
    /// Prompt tokens the servers reported, cached or not, by door and variant.
    pub prompt_tokens: Family<DoorVariantLabels, Counter>,
    /// Of each finished request's prompt tokens (its server's count), those the best-placed
    /// candidate held at the routing decision, as the gateway's cache view estimated them,
    /// by variant.
    pub reachable_cached_tokens: Family<VariantLabel, Counter>,
    /// Of each finished request's prompt tokens, those the chosen server held at the
    /// decision, by variant.
    pub achieved_cached_tokens: Family<VariantLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family, including the collectors over `pool` and `router`.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ringmaster");
        let responses = Family::<ResponseLabels, Counter>::default();
        registry.register(
            "http_responses",
            "HTTP responses by route and status",
            responses.clone(),
        );
        let ttft_seconds: HistogramFamily<VariantLabel> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "ttft_seconds",
            "Time from request arrival to the first generated token",
            ttft_seconds.clone(),
        );
        let request_duration_seconds: HistogramFamily<VariantLabel> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "request_duration_seconds",
            "Time from request arrival to the end of the answer",
            request_duration_seconds.clone(),
        );
        let routing_seconds: HistogramFamily<VariantLabel> =
            Family::new_with_constructor(routing_histogram);
        registry.register(
            "routing_seconds",
            "Time spent deciding where a request goes, policy call included",
            routing_seconds.clone(),
        );
        let routing_decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "routing_decisions",
            "Routing decisions by variant and reason",
            routing_decisions.clone(),
        );
        let fallback_requests = Family::<FallbackLabels, Counter>::default();
        registry.register(
            "fallback_requests",
            "Requests spilled to a [[fallback]] pool, by pool and reason",
            fallback_requests.clone(),
        );
        let policy_faults = Family::<FaultLabels, Counter>::default();
        registry.register(
            "policy_faults",
            "Policy faults by slot, variant and kind (each fell back to the native ring)",
            policy_faults.clone(),
        );
        let guardrail_stops = Family::<VariantLabel, Counter>::default();
        registry.register(
            "guardrail_stops",
            "Router variants the guardrails stopped (weight set to 0) for being worse than the control beyond doubt",
            guardrail_stops.clone(),
        );
        let routing_load_to_cap = Histogram::new([0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0]);
        registry.register(
            "routing_load_to_cap_ratio",
            "Chosen server's in-flight requests over its bounded-load cap, at assignment",
            routing_load_to_cap.clone(),
        );
        let client_disconnects = Counter::default();
        registry.register(
            "client_disconnects",
            "Generations cancelled because the client disconnected",
            client_disconnects.clone(),
        );
        let slow_client_disconnects = Counter::default();
        registry.register(
            "slow_client_disconnects",
            "Client connections cut off for accepting nothing of a reply for client_send_timeout_ms",
            slow_client_disconnects.clone(),
        );
        let tls_handshake_failures = Counter::default();
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed: no TLS or nothing in common, no client certificate where mutual TLS asks for one, or past the head timeout",
            tls_handshake_failures.clone(),
        );
        let upstream_attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "upstream_attempts",
            "Attempts to start a request on a server, by outcome; failures before the first token are retried on the next server",
            upstream_attempts.clone(),
        );
        let pair_decisions = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "pair_decisions",
            "Requests routed, by whether they were split between a prefill and a decode server: split, whole (a server that takes whole requests), bypass (the decode server would compute fewer prompt tokens than min_uncached_tokens), no_prefill_server, prefill_busy (the least busy prefill server has more work ahead than the decode server would doing the prompt itself)",
            pair_decisions.clone(),
        );
        let prefill_legs = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "prefill_legs",
            "Prefill legs of split requests, by outcome: ok, no_params (the prefill returned no kv_transfer_params; the decode server computed the prompt), failed (then retried on another prefill server or served whole on the decode server), refused",
            prefill_legs.clone(),
        );
        let rate_limit_refusals = Family::<RateLimitLabels, Counter>::default();
        registry.register(
            "rate_limit_refusals",
            "Requests refused by a token bucket (429), by tenant, limit and bucket",
            rate_limit_refusals.clone(),
        );
        let admission_decisions = Family::<AdmissionLabels, Counter>::default();
        registry.register(
            "admission_decisions",
            "Admission policy answers by verdict (fault: the request was admitted)",
            admission_decisions.clone(),
        );
        let admission_queue_wait_seconds = latency_histogram();
        registry.register(
            "admission_queue_wait_seconds",
            "Time admitted requests waited in the gateway's queue",
            admission_queue_wait_seconds.clone(),
        );
        let admission_queue_full = Counter::default();
        registry.register(
            "admission_queue_full",
            "Requests refused because the gateway's queue was full",
            admission_queue_full.clone(),
        );
        let admission_queue_timeouts = Counter::default();
        registry.register(
            "admission_queue_timeouts",
            "Requests refused after waiting in the queue past the timeout",
            admission_queue_timeouts.clone(),
        );
        let safety_verdicts = Family::<SafetyLabels, Counter>::default();
        registry.register(
            "safety_verdicts",
            "Safety-filter verdicts by stage (input, output) and verdict",
            safety_verdicts.clone(),
        );
        let cold_start_seconds = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "cold_start_seconds",
            "Seconds from process start to accepting requests (models loaded, policies ready)",
            cold_start_seconds.clone(),
        );
        let connections = ringmaster_serve::conn::ConnectionMetrics::default();
        registry.register(
            "client_connections",
            "Client connections open now",
            connections.open.clone(),
        );
        registry.register(
            "client_connections_closed",
            "Client connections the gateway ended, by reason: header_timeout (a request head not sent in time), idle_timeout (keep-alive unused), refused (over max_connections)",
            connections.closed.clone(),
        );
        let overload = ringmaster_serve::overload::OverloadMetrics::default();
        registry.register(
            "overload_shed",
            "Requests shed at the door (529/503 with retry-after) because the gateway was over a bound, by reason: pending (requests inside it), memory (resident set)",
            overload.shed.clone(),
        );
        registry.register(
            "pending_requests",
            "Requests inside the gateway (arrived at a door, not yet answered in full)",
            overload.pending.clone(),
        );
        registry.register(
            "resident_memory_bytes",
            "The gateway process's resident memory, as the overload guard last sampled it",
            overload.resident_bytes.clone(),
        );
        let body_read_timeouts = Counter::default();
        registry.register(
            "body_read_timeouts",
            "Request bodies refused with 408 for not arriving whole within body_read_timeout_ms",
            body_read_timeouts.clone(),
        );
        let dropped_fields = Family::<DroppedLabels, Counter>::default();
        registry.register(
            "dropped_fields",
            "Fields of requests their server never saw (known but not carried, or unknown), by door and field: see x-ringmaster-dropped",
            dropped_fields.clone(),
        );
        let prefix_cached_tokens = Family::<DoorVariantLabels, Counter>::default();
        registry.register(
            "prefix_cached_tokens",
            "Prompt tokens the servers reported reading from their prefix caches, by door and router variant",
            prefix_cached_tokens.clone(),
        );
        let prompt_tokens = Family::<DoorVariantLabels, Counter>::default();
        registry.register(
            "prompt_tokens",
            "Prompt tokens the servers reported, cached or not, by door and router variant",
            prompt_tokens.clone(),
        );
        let reachable_cached_tokens = Family::<VariantLabel, Counter>::default();
        registry.register(
            "routing_reachable_cached_tokens",
            "Of each finished request's prompt tokens (its server's count), those the best-placed candidate server held at the routing decision (the gateway's cache view), by variant",
            reachable_cached_tokens.clone(),
        );
        let achieved_cached_tokens = Family::<VariantLabel, Counter>::default();
        registry.register(
            "routing_achieved_cached_tokens",
            "Of each finished request's prompt tokens (its server's count), those the chosen server held at the routing decision (the gateway's cache view), by variant",
            achieved_cached_tokens.clone(),
        );
        Self {
            dropped_fields,
            dropped_names: std::sync::Mutex::new(std::collections::HashSet::new()),
            prefix_cached_tokens,
            prompt_tokens,
            reachable_cached_tokens,
            achieved_cached_tokens,
            connections,
            overload,
            body_read_timeouts,
            registry,
            responses,
            ttft_seconds,
            request_duration_seconds,
            routing_seconds,
            routing_decisions,
            policy_faults,
            guardrail_stops,
            routing_load_to_cap,
            client_disconnects,
            slow_client_disconnects,
            tls_handshake_failures,
            upstream_attempts,
            pair_decisions,
            prefill_legs,
            rate_limit_refusals,
            admission_decisions,
            admission_queue_wait_seconds,
            admission_queue_full,
            admission_queue_timeouts,
            safety_verdicts,
            cold_start_seconds,
            fallback_requests,
        }
    }

    /// Adds a collector read at every scrape (the state other parts own; see
    /// [`crate::collectors`]).
    pub fn register_collector(&mut self, collector: Box<dyn Collector>) {
        self.registry.register_collector(collector);
    }

    /// Counts a field a request of `door` dropped, under a bounded set of names.
    pub fn dropped_field(&self, door: &'static str, field: &str) {
        let mut field: String = field.chars().take(MAX_DROPPED_FIELD_CHARS).collect();
        {
            let mut names = self
                .dropped_names
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if !names.contains(&field) {
                if names.len() < MAX_DROPPED_FIELD_LABELS {
                    names.insert(field.clone());
                } else {
                    field = "other".to_owned();
                }
            }
        }
        self.dropped_fields
            .get_or_create(&DroppedLabels { door, field })
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// 1 ms to ~65 s, doubling.
fn latency_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.001, 2.0, 17,
    ))
}

/// 1 µs to ~16 ms, doubling.
fn routing_histogram() -> Histogram {
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        1e-6, 2.0, 15,
    ))
}
