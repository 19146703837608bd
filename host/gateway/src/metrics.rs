//! Prometheus metrics for everything an operator watches.
//!
//! Request-path metrics (responses, latency histograms, routing decisions) are updated as
//! requests go by. Per-server state (in flight, KV blocks, prefix-cache hits) is owned by the
//! pool and the engines, so a [`Collector`] reads it at scrape time instead of copying it on
//! every change. Every family is prefixed `ringmaster_`. This module never sees a prompt.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::admission::AdmissionGate;
use crate::policy::RouterSlot;
use ringmaster_pool::Pool;

/// Label set with one `server` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabel {
    /// Server id.
    pub server: String,
}

/// Label set of HTTP responses.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    /// Route name (`messages`, `models`, `admin`, …).
    pub route: &'static str,
    /// HTTP status.
    pub status: u16,
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
    /// `status-5xx`, `status-4xx`, `broken`, `refused`.
    pub outcome: &'static str,
}

/// Label set of admission decisions.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    /// `accept`, `queue`, `reject`, or `fault` (the request was admitted).
    pub verdict: &'static str,
}

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
    /// Policy faults by slot, variant and kind.
    pub policy_faults: Family<FaultLabels, Counter>,
    /// The chosen server's in-flight count over its bounded-load cap, at each assignment
    /// (never above 1 while the bounded-load ring routes).
    pub routing_load_to_cap: Histogram,
    /// Generations cancelled because the client went away.
    pub client_disconnects: Counter,
    /// Attempts to start a request on a server, by outcome (a retry is one more attempt).
    pub upstream_attempts: Family<AttemptLabels, Counter>,
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
}

impl Metrics {
    /// Registers every family, including the collectors over `pool` and `router`.
    pub fn new(pool: Arc<Pool>, router: Arc<RouterSlot>, admission: Arc<AdmissionGate>) -> Self {
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
        let policy_faults = Family::<FaultLabels, Counter>::default();
        registry.register(
            "policy_faults",
            "Policy faults by slot, variant and kind (each fell back to the native ring)",
            policy_faults.clone(),
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
        let upstream_attempts = Family::<AttemptLabels, Counter>::default();
        registry.register(
            "upstream_attempts",
            "Attempts to start a request on a server, by outcome; failures before the first token are retried on the next server",
            upstream_attempts.clone(),
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
        registry.register_collector(Box::new(ServerCollector { pool }));
        registry.register_collector(Box::new(PolicyCollector { router, admission }));
        Self {
            registry,
            responses,
            ttft_seconds,
            request_duration_seconds,
            routing_seconds,
            routing_decisions,
            policy_faults,
            routing_load_to_cap,
            client_disconnects,
            upstream_attempts,
            admission_decisions,
            admission_queue_wait_seconds,
            admission_queue_full,
            admission_queue_timeouts,
            safety_verdicts,
            cold_start_seconds,
        }
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

/// Reads per-variant totals, shadow agreement and policy-emitted counters on each scrape.
#[derive(Debug)]
struct PolicyCollector {
    router: Arc<RouterSlot>,
    admission: Arc<AdmissionGate>,
}

impl Collector for PolicyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let set = self.router.current();
        let variants: Vec<_> = set.variants.iter().chain(set.shadow.iter()).collect();
        type Read = fn(&crate::policy::VariantStats) -> u64;
        let counters: [(&str, &str, Read); 7] = [
            (
                "variant_requests",
                "Requests routed through the router variant",
                |s| s.requests.load(Relaxed),
            ),
            (
                "variant_errors",
                "Requests of the variant that ended in an error",
                |s| s.errors.load(Relaxed),
            ),
            ("variant_faults", "Faults of the variant's policy", |s| {
                s.faults.load(Relaxed)
            }),
            (
                "variant_prompt_tokens",
                "Prompt tokens of the variant's finished requests",
                |s| s.prompt_tokens.load(Relaxed),
            ),
            (
                "variant_cached_prompt_tokens",
                "Of those, served from the prefix cache",
                |s| s.cached_tokens.load(Relaxed),
            ),
            (
                "shadow_decisions",
                "Decisions the shadow variant made on copies of requests",
                |s| s.shadow_decisions.load(Relaxed),
            ),
            (
                "shadow_agreements",
                "Shadow decisions equal to the live decision",
                |s| s.shadow_agreements.load(Relaxed),
            ),
        ];
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for variant in &variants {
                let label = VariantLabel {
                    variant: variant.name.to_string(),
                };
                ConstCounter::new(read(&variant.stats)).encode(family.encode_family(&label)?)?;
            }
        }
        let family = encoder.encode_descriptor(
            "admission_queued",
            "Requests waiting in the gateway's admission queue",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(self.admission.queued())).encode(family)?;
        let mut family = encoder.encode_descriptor(
            "policy_counter",
            "Counters emitted by policies through the metrics import",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (policy, counter, value) in self.router.engine().policy_counters() {
            let labels = PolicyCounterLabels { policy, counter };
            ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Labels of a policy-emitted counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PolicyCounterLabels {
    policy: String,
    counter: String,
}

/// Reads per-server state from the pool on each scrape.
#[derive(Debug)]
struct ServerCollector {
    pool: Arc<Pool>,
}

impl Collector for ServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snapshot = self.pool.snapshot();
        let servers: Vec<_> = snapshot
            .servers
            .iter()
            .chain(snapshot.draining.iter())
            .map(|s| {
                (
                    ServerLabel {
                        server: s.id().to_owned(),
                    },
                    s.clone(),
                    s.engine().load(),
                )
            })
            .collect();
        type Read = fn(&ringmaster_pool::Server, &ringmaster_gpu_runtime::LoadReport) -> f64;
        let gauges: [(&str, &str, Read); 14] = [
            (
                "server_routable",
                "1 while new requests may go to the server: not draining, reachable (its last health poll answered) and not ejected after consecutive failures",
                |s, _| if s.is_routable() { 1.0 } else { 0.0 },
            ),
            (
                "server_kv_reported_blocks",
                "Blocks in the server's prefix cache as the server reports it (its KV event stream for a worker)",
                |s, _| s.reported_cache().0 as f64,
            ),
            (
                "server_kv_report_live",
                "1 while the gateway's view of the server's cache follows the server's own reports; 0 while it falls back to routing history",
                |s, _| if s.reported_cache().1 { 1.0 } else { 0.0 },
            ),
            (
                "server_batch_size",
                "Sequences in the server's last engine step",
                |_, l| f64::from(l.last_batch_size),
            ),
            (
                "server_model_load_seconds",
                "How long loading the server's model took (0 for simulated servers)",
                |s, _| s.model_load().map_or(0.0, |d| d.as_secs_f64()),
            ),
            (
                "server_in_flight",
                "Requests routed to the server and not finished",
                |s, _| s.in_flight() as f64,
            ),
            (
                "server_running",
                "Sequences in the server's running batch",
                |_, l| f64::from(l.running),
            ),
            (
                "server_waiting",
                "Requests queued inside the server",
                |_, l| f64::from(l.waiting),
            ),
            (
                "server_kv_blocks_used",
                "KV blocks referenced by live sequences",
                |_, l| f64::from(l.kv_blocks_used),
            ),
            (
                "server_kv_blocks_cached",
                "Unreferenced KV blocks still holding a cached prefix",
                |_, l| f64::from(l.kv_blocks_cached),
            ),
            (
                "server_kv_blocks_total",
                "KV blocks in the server's pool",
                |_, l| f64::from(l.kv_blocks_total),
            ),
            (
                "server_kv_usage_ratio",
                "Fraction of KV blocks referenced by live sequences",
                |_, l| {
                    if l.kv_blocks_total == 0 {
                        0.0
                    } else {
                        f64::from(l.kv_blocks_used) / f64::from(l.kv_blocks_total)
                    }
                },
            ),
            (
                "server_prefix_cache_hit_ratio",
                "Prompt tokens served from the prefix cache over all prompt tokens",
                |_, l| {
                    if l.prompt_tokens_total == 0 {
                        0.0
                    } else {
                        l.cached_prompt_tokens_total as f64 / l.prompt_tokens_total as f64
                    }
                },
            ),
            (
                "server_draining",
                "1 while a removed server finishes its requests",
                |s, _| if s.is_draining() { 1.0 } else { 0.0 },
            ),
        ];
        for (name, help, read) in gauges {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (label, server, load) in &servers {
                ConstGauge::new(read(server, load)).encode(family.encode_family(label)?)?;
            }
        }
        type Count = fn(&ringmaster_pool::Server, &ringmaster_gpu_runtime::LoadReport) -> u64;
        let counters: [(&str, &str, Count); 14] = [
            (
                "server_kv_report_events",
                "KV events applied from a worker's event stream (a snapshot counts one per block; 0 for engines in this process, read directly)",
                |s, _| s.reported_cache_events().0,
            ),
            (
                "server_kv_report_snapshots",
                "Snapshots applied from a worker's event stream: one per (re)connection",
                |s, _| s.reported_cache_events().1,
            ),
            ("server_steps", "Engine steps run", |_, l| l.steps),
            (
                "server_step_sequences",
                "Sequences scheduled, summed over steps (over server_steps: the mean batch size)",
                |_, l| l.step_sequences_total,
            ),
            (
                "server_step_tokens",
                "Tokens computed, summed over steps",
                |_, l| l.step_tokens_total,
            ),
            (
                "server_step_budget_tokens",
                "The step token budget, summed over steps (server_step_tokens over this: batch utilisation)",
                |_, l| l.step_budget_tokens_total,
            ),
            (
                "server_prefill_tokens",
                "Prompt tokens computed (prefill, including recompute after preemption)",
                |_, l| l.prefill_tokens_total,
            ),
            ("server_decode_tokens", "Decode tokens computed", |_, l| {
                l.decode_tokens_total
            }),
            (
                "server_requests",
                "Requests routed to the server",
                |s, _| s.requests_total(),
            ),
            (
                "server_prompt_tokens",
                "Prompt tokens the server received",
                |_, l| l.prompt_tokens_total,
            ),
            (
                "server_cached_prompt_tokens",
                "Prompt tokens served from the server's prefix cache",
                |_, l| l.cached_prompt_tokens_total,
            ),
            (
                "server_generated_tokens",
                "Tokens the server generated",
                |_, l| l.generated_tokens_total,
            ),
            (
                "server_cancelled_requests",
                "Requests cancelled inside the server",
                |_, l| l.requests_cancelled,
            ),
            (
                "server_preemptions",
                "Sequences preempted for KV memory",
                |_, l| l.preemptions,
            ),
        ];
        for (name, help, read) in counters {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (label, server, load) in &servers {
                ConstCounter::new(read(server, load)).encode(family.encode_family(label)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "server_busy_seconds",
            "Time the server's executor spent computing steps (tokens over it: tokens per second)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (label, _, load) in &servers {
            ConstCounter::new(load.busy_seconds_total).encode(family.encode_family(label)?)?;
        }
        Ok(())
    }
}
