//! The metrics read at scrape time from the state other parts own: every server's load, cache
//! and health (the pool), and every policy's totals, shadow agreement, emitted counters and the
//! admission queue (the slots). Registered from the top ([`crate::state::Gateway::start`]), so that
//! the parts they read never import the metrics that read them.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use crate::admission::AdmissionGate;
use crate::metrics::{RoleLabels, ServerLabel, VariantLabel};
use ringmaster_pool::Pool;
use ringmaster_slots::router::RouterSlot;

/// Reads per-variant totals, shadow agreement and policy-emitted counters on each scrape.
#[derive(Debug)]
pub(crate) struct PolicyCollector {
    pub(crate) router: Arc<RouterSlot>,
    pub(crate) admission: Arc<AdmissionGate>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) autoscale: ringmaster_pool::autoscale::AutoscaleSettings,
}

/// The autoscaling signal now: the admission queue's tokens and every active server's work.
pub(crate) fn autoscale_report(
    pool: &Pool,
    admission: &AdmissionGate,
    settings: &ringmaster_pool::autoscale::AutoscaleSettings,
) -> ringmaster_pool::autoscale::AutoscaleReport {
    let queued_tokens = admission.order.queued_tokens();
    ringmaster_pool::autoscale::assess_pool(settings, queued_tokens, &pool.snapshot())
}

impl Collector for PolicyCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::sync::atomic::Ordering::Relaxed;
        let set = self.router.current();
        let variants: Vec<_> = set.variants.iter().chain(set.shadow.iter()).collect();
        type Read = fn(&ringmaster_slots::router::VariantStats) -> u64;
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
        // A swap or a rollback changes a variant's load time: `changes()` over it counts them.
        type Gauge = fn(&ringmaster_slots::router::Variant) -> f64;
        let gauges: [(&str, &str, Gauge); 2] = [
            (
                "policy_loaded_timestamp_seconds",
                "When the running version of each router variant was loaded (Unix seconds)",
                |v| {
                    v.policy
                        .info()
                        .loaded_at
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64())
                },
            ),
            (
                "policy_previous_versions",
                "Earlier versions each router variant can roll back to",
                |v| v.history.len() as f64,
            ),
        ];
        for (name, help, read) in gauges {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for variant in &variants {
                let label = VariantLabel {
                    variant: variant.name.to_string(),
                };
                ConstGauge::new(read(variant)).encode(family.encode_family(&label)?)?;
            }
        }
        let family = encoder.encode_descriptor(
            "admission_queued",
            "Requests waiting in the gateway's admission queue",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(self.admission.queued())).encode(family)?;
        let report = autoscale_report(&self.pool, &self.admission, &self.autoscale);
        for (name, help, value) in [
            (
                "policy_instances",
                "Policy component instances alive in the pooling allocator (warm and in calls), out of max_instances",
                self.router.engine().live_instances() as f64,
            ),
            (
                "admission_queued_tokens",
                "Estimated tokens (prompt plus max_tokens) waiting in the admission queue",
                report.queued_tokens as f64,
            ),
            (
                "autoscale_utilisation",
                "The fleet's work over its capacity, in tokens (the autoscaling signal)",
                report.utilisation,
            ),
            (
                "autoscale_recommended_servers",
                "Servers that would bring the autoscaling signal between its thresholds",
                report.recommended_servers as f64,
            ),
        ] {
            let family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            ConstGauge::new(value).encode(family)?;
        }
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
pub(crate) struct ServerCollector {
    pub(crate) pool: Arc<Pool>,
}

impl Collector for ServerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let snapshot = self.pool.snapshot();
        let servers: Vec<ServerRow> = snapshot
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
        let gauges: [(&str, &str, Read); 15] = [
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
                "server_prefill_backlog_tokens",
                "Estimated prompt tokens routed to the server that it has not begun to answer, less their cache credit (what policies read as cluster.prefill-backlog)",
                |s, _| s.prefill_backlog() as f64,
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
        let mut family = encoder.encode_descriptor(
            "server_role",
            "1 for each server, labelled with its part in a disaggregated fleet (role: both, prefill or decode) and how its KV cache moves (disaggregation)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (label, server, _) in &servers {
            let role = server.role();
            ConstGauge::new(1.0).encode(family.encode_family(&RoleLabels {
                server: label.server.clone(),
                role: role.role.as_str(),
                disaggregation: role.connector.map_or("", |c| c.as_str()),
            })?)?;
        }
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
        let counters: [(&str, &str, Count); 18] = [
            (
                "server_ejections",
                "Times the server was taken off the ring after consecutive failed requests",
                |s, _| s.ejections_total(),
            ),
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
                "server_loaded_step_tokens",
                "Tokens computed in steps that left requests waiting (over server_loaded_step_capacity_tokens: the fill under load)",
                |_, l| l.loaded_step_tokens_total,
            ),
            (
                "server_loaded_step_capacity_tokens",
                "Tokens the steps that left requests waiting could have held",
                |_, l| l.loaded_step_capacity_tokens_total,
            ),
            (
                "server_decode_ready",
                "Sequences ready to decode when each step was scheduled, summed over steps (server_decode_tokens over this: decode occupancy)",
                |_, l| l.decode_ready_total,
            ),
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
        encode_import_refusals(&mut encoder, &servers)?;
        encode_engine_feeds(&mut encoder, &servers)
    }
}

/// One server as a scrape reads it: its label, the server, and its engine's load report.
type ServerRow = (
    ServerLabel,
    Arc<ringmaster_pool::Server>,
    ringmaster_gpu_runtime::LoadReport,
);

/// A server and why its engine refused a KV handoff.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct RefusalLabel {
    server: String,
    reason: &'static str,
}

/// The KV handoffs each engine (in this process, or a `ringmaster worker` through its load
/// report) refused because their blocks were not the request's own: the split requests whose
/// prompt was computed again, and a sign of a broken or hostile peer.
fn encode_import_refusals(
    encoder: &mut DescriptorEncoder<'_>,
    servers: &[ServerRow],
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(
        "kv_import_refused",
        "KV handoffs a server's engine refused, by reason: hash (a block's hash is not that of its tokens and parent), tokens (blocks that are not the request's prompt), shape (contents not of the engine's shape); the prompt was computed there instead",
        None,
        prometheus_client::metrics::MetricType::Counter,
    )?;
    for (label, _, load) in servers {
        for (reason, count) in [
            ("hash", load.kv_import_refused_hash),
            ("tokens", load.kv_import_refused_tokens),
            ("shape", load.kv_import_refused_shape),
        ] {
            let label = RefusalLabel {
                server: label.server.clone(),
                reason,
            };
            ConstCounter::new(count).encode(family.encode_family(&label)?)?;
        }
    }
    Ok(())
}

/// The counters of each engine KV event feed (servers with `kv_events` only).
fn encode_engine_feeds(
    encoder: &mut DescriptorEncoder<'_>,
    servers: &[ServerRow],
) -> Result<(), std::fmt::Error> {
    use ringmaster_pool::remote::engine_events::EngineFeedReport;
    let feeds: Vec<(&ServerLabel, EngineFeedReport)> = servers
        .iter()
        .filter_map(|(label, server, _)| server.engine_feed().map(|r| (label, r)))
        .collect();
    if feeds.is_empty() {
        return Ok(());
    }
    type Read = fn(&EngineFeedReport) -> u64;
    let counters: [(&str, &str, Read); 8] = [
        (
            "engine_kv_event_batches",
            "KV event batches applied from the engine's publisher (live and replayed)",
            |r| r.batches,
        ),
        (
            "engine_kv_event_blocks_stored",
            "Engine blocks the engine reported stored",
            |r| r.blocks_stored,
        ),
        (
            "engine_kv_event_blocks_removed",
            "Engine blocks the engine reported removed",
            |r| r.blocks_removed,
        ),
        (
            "engine_kv_event_orphan_blocks",
            "Stored blocks passed over because their parent was never seen (stored before the gateway joined, or lost in a gap)",
            |r| r.orphan_blocks,
        ),
        (
            "engine_kv_event_gaps_repaired",
            "Gaps in the event sequence closed from the engine's replay socket",
            |r| r.gaps_repaired,
        ),
        (
            "engine_kv_event_resets",
            "Times the server's view was reset to empty: a gap the replay could not close (or no replay socket), or an index past its bound",
            |r| r.resets,
        ),
        (
            "engine_kv_event_publisher_restarts",
            "Times the engine's publisher started over (sequence back to an earlier number)",
            |r| r.restarts,
        ),
        (
            "engine_kv_event_refused_frames",
            "Event frames refused: not three parts, not msgpack, not a batch, or over the size bounds",
            |r| r.refused_frames,
        ),
    ];
    let gauges: [(&str, &str, Read); 2] = [
        (
            "engine_kv_event_connected",
            "1 while the engine's KV event publisher is connected",
            |r| u64::from(r.connected),
        ),
        (
            "engine_kv_event_indexed_blocks",
            "Engine blocks in the gateway's index of the engine's cache",
            |r| r.engine_blocks,
        ),
    ];
    let families = counters
        .into_iter()
        .map(|c| (true, c))
        .chain(gauges.into_iter().map(|g| (false, g)));
    for (is_counter, (name, help, read)) in families {
        let kind = if is_counter {
            prometheus_client::metrics::MetricType::Counter
        } else {
            prometheus_client::metrics::MetricType::Gauge
        };
        let mut family = encoder.encode_descriptor(name, help, None, kind)?;
        for (label, report) in &feeds {
            let metric = family.encode_family(*label)?;
            if is_counter {
                ConstCounter::new(read(report)).encode(metric)?;
            } else {
                ConstGauge::new(read(report) as f64).encode(metric)?;
            }
        }
    }
    Ok(())
}
