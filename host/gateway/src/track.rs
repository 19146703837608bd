//! The call's accounting (its last phase): per-request bookkeeping that ends in the variant's statistics, the
//! latency histograms, the token buckets' output charges, the fair queue's counters, the
//! learning router's observation and the traffic recording. The reply state machine calls it
//! as the reply goes (the first token, each output token, the finish or the failure).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ringmaster_policy_engine::Outcome;
use ringmaster_telemetry::SpanExt;
use tracing::debug;

use crate::metrics::VariantLabel;
use crate::state::Gateway;
use ringmaster_slots::router::Variant;

/// What a learning router is told about a request it decided, gathered as the request runs.
pub(crate) struct Observation {
    pub(crate) request_id: String,
    pub(crate) routing_key: u64,
    /// The server the router chose (`None`: the host's ring chose, over its cap).
    pub(crate) decided: Option<String>,
    /// The server that served it (after retries).
    pub(crate) server: String,
    /// Microseconds to the first token (`u64::MAX`: none yet).
    pub(crate) ttft_us: AtomicU64,
}

/// What routing could have had of a request's prompt from the servers' caches (the most any
/// candidate held) and what it took (what the chosen server held), as the gateway's cache view
/// saw them at the decision: in tokens of the prompt's estimate (`of`, 4 bytes a token, tools
/// included).
///
/// They are counted when the request finishes, as the same shares of the prompt tokens its
/// server counted: summed at the decision in the estimate's tokens, they stood beside the
/// servers' counts as if in the same unit, and a variant's "achieved" read above its prompt
/// tokens (a Claude Code prompt's tools are a third of its estimate and none of a simulated
/// server's count; a failed request was decided but never counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Reach {
    /// The most tokens of the estimate any candidate held.
    pub(crate) reachable: u64,
    /// The tokens of the estimate the chosen server held.
    pub(crate) achieved: u64,
    /// The estimate's tokens.
    pub(crate) of: u32,
}

impl Reach {
    /// (reachable, achieved) as shares of `prompt_tokens`, the server's count: each at most
    /// `prompt_tokens`, achieved at most reachable.
    pub(crate) fn of_counted(&self, prompt_tokens: u32) -> (u64, u64) {
        let of = u64::from(self.of);
        if of == 0 {
            return (0, 0);
        }
        let share = |tokens: u64| tokens.min(of) * u64::from(prompt_tokens) / of;
        let reachable = share(self.reachable);
        (reachable, share(self.achieved).min(reachable))
    }
}

/// Per-request bookkeeping that ends in the variant's statistics and the latency histograms.
pub(crate) struct Tracker {
    pub(crate) gateway: Arc<Gateway>,
    /// The caller whose token buckets the reply charges, with the input tokens charged on
    /// the estimate (`None`: no bucket applies).
    pub(crate) charged: Option<(crate::auth::Caller, u32)>,
    /// The tenant whose virtual token counter the output is counted to (`None`: no admission
    /// policy, so no queue to order).
    pub(crate) fair_share: Option<String>,
    pub(crate) variant: Option<Arc<Variant>>,
    /// Set when the deciding variant learns.
    pub(crate) observation: Option<Observation>,
    pub(crate) label: VariantLabel,
    /// The door the request came in by (its cache figures are counted by door).
    pub(crate) door: ringmaster_api::Door,
    pub(crate) started: Instant,
    /// What the decision could have had of the prompt from the servers' caches, and what it
    /// took, counted when the request finishes.
    pub(crate) reach: Reach,
    /// The request's start as the traffic recording has it, when recording.
    pub(crate) record: Option<ringmaster_telemetry::record::RecordStart>,
    /// The request's span when traced: held until the reply ends, so it ends with it.
    pub(crate) trace: Option<tracing::Span>,
    /// The successful upstream attempt's span, held as long as the reply.
    pub(crate) attempt_span: Option<tracing::Span>,
}

impl Tracker {
    /// The server counted the prompt: the input charge is corrected to its count.
    pub(crate) fn counted_prompt(&self, prompt_tokens: u32) {
        if let Some((caller, estimated)) = &self.charged {
            caller.settle_input(*estimated, prompt_tokens);
        }
    }

    /// `tokens` more generated tokens, charged to the output buckets as they stream.
    pub(crate) fn generated(&self, tokens: u32) {
        if tokens == 0 {
            return;
        }
        if let Some((caller, _)) = &self.charged {
            caller.charge_output(tokens);
        }
        if let Some(tenant) = &self.fair_share {
            self.gateway.admission.order.served(
                tenant,
                tokens,
                ringmaster_slots::queue::OUTPUT_WEIGHT,
            );
        }
    }

    pub(crate) fn first_token(&self) {
        let ttft = self.started.elapsed().as_secs_f64();
        self.gateway
            .metrics
            .ttft_seconds
            .get_or_create(&self.label)
            .observe(ttft);
        if let Some(variant) = &self.variant {
            variant.stats.record_ttft(ttft);
        }
        if let Some(observation) = &self.observation {
            let micros = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
            observation.ttft_us.store(micros, Ordering::Relaxed);
        }
        if let Some(span) = &self.trace {
            use ringmaster_telemetry::semconv as k;
            span.event(k::EVENT_FIRST_TOKEN, Vec::new());
            span.attribute(k::GEN_AI_TIME_TO_FIRST_TOKEN, ttft);
        }
    }

    /// Tells a learning router how the request went. Runs once the last token (or the failure)
    /// is in, before the reply's closing events or body go out; a fault is counted like a
    /// routing fault.
    fn observe(&self, tokens: (u32, u32, u32), error: Option<&str>) {
        let (Some(variant), Some(observation)) = (&self.variant, &self.observation) else {
            return;
        };
        let ttft = observation.ttft_us.load(Ordering::Relaxed);
        let outcome = Outcome {
            request_id: observation.request_id.clone(),
            routing_key: observation.routing_key,
            server: observation.server.clone(),
            as_decided: observation.decided.as_deref() == Some(observation.server.as_str()),
            ttft_us: (ttft != u64::MAX).then_some(ttft),
            prompt_tokens: tokens.0,
            cached_tokens: tokens.1,
            output_tokens: tokens.2,
            error: error.map(str::to_owned),
        };
        if let Err(fault) = variant.policy.observe(&outcome) {
            debug!(variant = %variant.name, kind = fault.kind(), "policy.observe_fault");
            variant.stats.faults.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The reply ended with `finish` (`end_turn`, `max_tokens`, …) after the tokens counted.
    pub(crate) fn finished(
        &self,
        (prompt_tokens, cached_tokens, output_tokens): (u32, u32, u32),
        finish: &'static str,
    ) {
        if let Some(span) = &self.trace {
            use ringmaster_telemetry::semconv as k;
            span.attribute(k::GEN_AI_USAGE_INPUT_TOKENS, i64::from(prompt_tokens));
            span.attribute(k::GEN_AI_USAGE_OUTPUT_TOKENS, i64::from(output_tokens));
            span.attribute(k::USAGE_CACHED_TOKENS, i64::from(cached_tokens));
            span.attribute(
                k::GEN_AI_RESPONSE_FINISH_REASONS,
                opentelemetry_array(finish),
            );
        }
        if let (Some(recorder), Some(start)) = (self.gateway.recorder(), &self.record) {
            recorder.finish(start, prompt_tokens, output_tokens);
        }
        self.gateway
            .metrics
            .request_duration_seconds
            .get_or_create(&self.label)
            .observe(self.started.elapsed().as_secs_f64());
        let (reachable, achieved) = self.reach.of_counted(prompt_tokens);
        if let Some(variant) = &self.variant {
            variant.stats.record_cache(cached_tokens, prompt_tokens);
            variant.stats.record_reach(reachable, achieved);
        }
        let metrics = &self.gateway.metrics;
        metrics
            .reachable_cached_tokens
            .get_or_create(&self.label)
            .inc_by(reachable);
        metrics
            .achieved_cached_tokens
            .get_or_create(&self.label)
            .inc_by(achieved);
        let labels = crate::metrics::DoorVariantLabels {
            door: self.door.label(),
            variant: self.label.variant.clone(),
        };
        metrics
            .prefix_cached_tokens
            .get_or_create(&labels)
            .inc_by(u64::from(cached_tokens));
        metrics
            .prompt_tokens
            .get_or_create(&labels)
            .inc_by(u64::from(prompt_tokens));
        self.observe((prompt_tokens, cached_tokens, output_tokens), None);
    }

    pub(crate) fn failed(&self, why: &str) {
        if let Some(span) = &self.trace {
            span.failed(why);
        }
        if let Some(variant) = &self.variant {
            variant.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.observe((0, 0, 0), Some(why));
    }
}

/// A one-element string array attribute (`gen_ai.response.finish_reasons` is a list).
fn opentelemetry_array(item: &'static str) -> ringmaster_telemetry::Value {
    ringmaster_telemetry::Value::Array(ringmaster_telemetry::Array::String(vec![item.into()]))
}

#[cfg(test)]
mod tests {
    use super::Reach;

    #[test]
    fn the_cache_reach_is_counted_in_the_servers_tokens_never_above_its_prompt() {
        // A Claude Code turn on a simulated server: estimated at 30,000 tokens (its tools
        // included), counted 12,000 by the server; the chosen server held 28,000 of the
        // estimate, the best 29,000. Summed as estimated, "achieved" read 28,000 beside a
        // prompt of 12,000.
        let reach = Reach {
            reachable: 29_000,
            achieved: 28_000,
            of: 30_000,
        };
        assert_eq!(reach.of_counted(12_000), (11_600, 11_200));
        // Whatever the estimate said, never above the prompt counted.
        let over = Reach {
            reachable: 50_000,
            achieved: 40_000,
            of: 30_000,
        };
        assert_eq!(over.of_counted(1_000), (1_000, 1_000));
        // Nothing estimated, or nothing counted: nothing reached.
        assert_eq!(Reach::default().of_counted(5_000), (0, 0));
        assert_eq!(reach.of_counted(0), (0, 0));
    }
}
