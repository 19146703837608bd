//! One policy's replay: a gateway with simulated servers, built from the scenario, fed the
//! trace's requests at their arrival times through the Messages handler's core (the same
//! parsing, routing key, prefix hashes, admission, router policy, bounded loads and reply as
//! over HTTP, without sockets), on tokio's paused clock.
//!
//! This module owns driving one run and measuring what each request saw; it must not
//! summarise ([`crate::report`]) nor read files other than the policy's component. It must
//! run inside a current-thread runtime whose clock starts paused ([`crate::runtime`]): the
//! simulated servers sleep their modelled step times, and with the clock paused tokio jumps
//! straight to the next timer whenever nothing is runnable. A replay is then as fast as the
//! machine allows and its timings are the model's, the same on any machine.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use ringmaster_gateway::auth::Caller;
use ringmaster_gateway::call::{CallInput, handle};
use ringmaster_gateway::{Gateway, RawConfig};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::render::{REPLAY_MODEL, messages_body_as};
use crate::trace::TraceRequest;
use crate::{BillingLine, Fleet, ReplayError, ScaleChange, ScaleEvent};

/// The policies' call deadline in a replay. Deadlines are wall-clock time: at the gateway's
/// default (5 ms) a slow machine would fault calls a fast one completes, and a replay's
/// figures would depend on the machine. Policy faults are still counted and reported.
pub const POLICY_CALL_DEADLINE_MS: u64 = 1000;

/// How often each server's queue is sampled for the load-over-time plot.
pub const LOAD_SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// What one request saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Outcome {
    /// Index in the trace.
    pub index: usize,
    /// Modelled seconds from the replay's start to its arrival.
    pub arrival_s: f64,
    /// The server that served it.
    pub server: Option<String>,
    /// Arrival to the first token, seconds (`None` if it failed first).
    pub ttft_s: Option<f64>,
    /// Arrival to the last event, seconds.
    pub e2e_s: f64,
    /// Prompt tokens as the server counted them.
    pub prompt_tokens: u32,
    /// Of those, reused from the server's prefix cache.
    pub cached_tokens: u32,
    /// Tokens generated.
    pub output_tokens: u32,
    /// The mean gap between its tokens after the first, seconds (`None` with fewer than two).
    pub tpot_s: Option<f64>,
    /// Each gap between two of its tokens as the client got them, seconds (tokens that came
    /// in one frame: the first after the gap, the others 0).
    #[serde(skip)]
    pub gaps: Vec<f32>,
    /// Why it failed, if it did.
    pub error: Option<String>,
}

/// One sample of every server's queue.
#[derive(Clone, Debug, Serialize)]
pub struct LoadSample {
    /// Modelled seconds from the start.
    pub at_s: f64,
    /// Per server (in the order they joined the fleet): sequences running plus waiting.
    pub queued: Vec<u32>,
}

/// A server at the end of the run.
#[derive(Clone, Debug, Serialize)]
pub struct ServerTotals {
    /// Its id.
    pub id: String,
    /// Requests it finished.
    pub requests: u64,
    /// Modelled seconds its steps took.
    pub busy_s: f64,
    /// Preemptions for lack of KV blocks.
    pub preemptions: u64,
}

/// Keys sampled to measure how a scale event moves the ring's keys.
pub const SCALE_SAMPLE_KEYS: u64 = 10_000;

/// What one scale event did to the ring.
#[derive(Clone, Debug, Serialize)]
pub struct ScaleOutcome {
    /// Modelled seconds from the start.
    pub at_s: f64,
    /// `add NAME` or `remove ID`.
    pub change: String,
    /// Of [`SCALE_SAMPLE_KEYS`] sampled keys, how many changed owner.
    pub keys_moved: u64,
    /// Of those, how many moved between two servers that did not change (0 for a
    /// consistent-hash ring: only the added or removed server's keys move).
    pub moved_elsewhere: u64,
    /// Why the change failed, if it did.
    pub error: Option<String>,
}

/// Everything one run measured, before it is summarised.
#[derive(Clone, Debug, Serialize)]
pub struct RunData {
    /// Per request, in trace order.
    pub outcomes: Vec<Outcome>,
    /// The servers' queues over time.
    pub load: Vec<LoadSample>,
    /// Per server.
    pub servers: Vec<ServerTotals>,
    /// Routing decisions by reason (from the gateway's own metric).
    pub decisions: Vec<(String, u64)>,
    /// Policy faults that fell back to the native ring.
    pub policy_faults: u64,
    /// Assignments that left the chosen server over its bounded-load cap (the host enforces
    /// the cap, so this stays 0).
    pub over_cap: u64,
    /// Modelled seconds from the first arrival to the last reply.
    pub makespan_s: f64,
    /// Per scale event.
    pub scale: Vec<ScaleOutcome>,
    /// Requests by whether they were split between a prefill and a decode server.
    pub pairs: Vec<(String, u64)>,
}

/// The gateway configuration for a replay of `fleet` routed by `router` (`native`: the ring
/// without a policy; `builtin:NAME`; or a path to a component; either followed by
/// `?key=value&...` for the policy's own configuration), with routing reading the servers'
/// caches through `cache_view` (`[simulator] cache_view`).
pub fn gateway_config(fleet: &Fleet, (router, cache_view): (&str, &str)) -> String {
    gateway_config_with(fleet, (router, cache_view), true)
}

/// [`gateway_config`], with the gateway taking the volatile system-prompt lines out
/// (`hygiene`, its default) or keeping them (`[routing] volatile_prefix = []`).
pub fn gateway_config_with(
    fleet: &Fleet,
    (router, cache_view): (&str, &str),
    hygiene: bool,
) -> String {
    let mut toml = format!(
        "listen = \"127.0.0.1:0\"\nmodels = [\"{REPLAY_MODEL}\"]\n\
         [limits]\nmax_body_bytes = {}\nmax_output_tokens = 1000000\nmax_waiting_per_server = 1000000000\n\
         [routing]\nload_factor = {}\nmax_prefix_hashes = {}\n{}\
         [policies]\ncall_deadline_ms = {POLICY_CALL_DEADLINE_MS}\n",
        256 * 1024 * 1024,
        fleet.load_factor,
        fleet.max_prefix_hashes,
        if hygiene {
            ""
        } else {
            "volatile_prefix = []\n"
        },
    );
    if let Some(guard) = &fleet.router_bounded_load {
        toml.push_str(&format!(
            "router_bounded_load = {}\n",
            toml::Value::String(guard.clone())
        ));
    }
    if let Some(factor) = fleet.router_load_factor {
        toml.push_str(&format!("router_load_factor = {factor}\n"));
    }
    if let Some(path) = &fleet.record {
        let path = toml::Value::String(path.display().to_string());
        toml.push_str(&format!("[record]\npath = {path}\n"));
    }
    toml.push_str(&format!(
        "[simulator]\ntime_scale = 1.0\ncache_view = {}\n",
        toml::Value::String(cache_view.to_owned())
    ));
    if let Some(blocks) = fleet.kv_blocks {
        toml.push_str(&format!("kv_blocks = {blocks}\n"));
    }
    if fleet.prefill_servers == 0 {
        for i in 0..fleet.servers {
            let name = format!("replay-{i}");
            match fleet.slowdown.get(&name) {
                Some(factor) => toml.push_str(&format!(
                    "[[servers]]\naddress = \"sim://{name}?slowdown={factor}\"\n"
                )),
                None => toml.push_str(&format!("[[servers]]\naddress = \"sim://{name}\"\n")),
            }
        }
    } else {
        let pair = &fleet.pair;
        toml.push_str("[disaggregation]\n");
        if let Some(tokens) = pair.min_uncached_tokens {
            toml.push_str(&format!("min_uncached_tokens = {tokens}\n"));
        }
        if let Some(gbps) = pair.link_gbps {
            toml.push_str(&format!("link_gbps = {gbps}\n"));
        }
        if let Some(us) = pair.link_latency_us {
            toml.push_str(&format!("link_latency_us = {us}\n"));
        }
        if let Some(busy) = pair.when_prefill_busy {
            toml.push_str(&format!("when_prefill_busy = \"{busy}\"\n"));
        }
        for i in 0..fleet.prefill_servers {
            toml.push_str(&format!(
                "[[servers]]\naddress = \"sim://prefill-{i}\"\nrole = \"prefill\"\n"
            ));
        }
        for i in 0..fleet.servers.saturating_sub(fleet.prefill_servers) {
            toml.push_str(&format!(
                "[[servers]]\naddress = \"sim://decode-{i}\"\nrole = \"decode\"\n"
            ));
        }
    }
    if router != "native" {
        // `SOURCE?key=value&key=value`: the policy's own configuration.
        let (source, query) = router.split_once('?').unwrap_or((router, ""));
        let source = toml::Value::String(source.to_owned());
        toml.push_str(&format!(
            "[[policies.router]]\nname = \"replayed\"\nsource = {source}\n"
        ));
        let pairs: Vec<String> = query
            .split('&')
            .filter_map(|pair| pair.split_once('='))
            .map(|(k, v)| {
                format!(
                    "{} = {}",
                    toml::Value::String(k.to_owned()),
                    toml::Value::String(v.to_owned())
                )
            })
            .collect();
        if !pairs.is_empty() {
            toml.push_str(&format!("config = {{ {} }}\n", pairs.join(", ")));
        }
    }
    toml
}

/// Replays `requests` (with `turns[i]`, the complete-block counts of request `i`'s earlier
/// turns) through a fresh gateway routed by `router`.
pub async fn replay(
    fleet: &Fleet,
    (router, cache_view, line): (&str, &str, BillingLine),
    requests: &[TraceRequest],
    turns: &[Vec<usize>],
    scale: &[ScaleEvent],
) -> Result<RunData, ReplayError> {
    replay_at(
        fleet,
        (router, cache_view, line),
        (requests, turns),
        scale,
        1.0,
    )
    .await
}

/// [`replay`], the requests arriving `rate` times as often as the trace says (2.0: every gap
/// between two arrivals halved).
pub async fn replay_at(
    fleet: &Fleet,
    (router, cache_view, line): (&str, &str, BillingLine),
    (requests, turns): (&[TraceRequest], &[Vec<usize>]),
    scale: &[ScaleEvent],
    rate: f64,
) -> Result<RunData, ReplayError> {
    let hygiene = line != BillingLine::Raw;
    let config = RawConfig::from_toml(&gateway_config_with(fleet, (router, cache_view), hygiene))
        .and_then(RawConfig::validate)
        .map_err(|e| ReplayError::Config(e.to_string()))?;
    let gateway =
        Gateway::start(config).map_err(|e| ReplayError::Start(format!("{router}: {e}")))?;
    let start = Instant::now();
    let first_arrival = requests.first().map_or(Duration::ZERO, |r| r.arrival);
    let known = Arc::new(Mutex::new(gateway.pool().snapshot().servers.clone()));
    let (stop_sampler, stopped) = tokio::sync::oneshot::channel();
    let sampler = tokio::spawn(sample_loads(known.clone(), start, stopped));
    let mut running = JoinSet::new();
    let mut events = scale.iter().peekable();
    let mut scaled = Vec::new();
    for (index, request) in requests.iter().enumerate() {
        let arrival = (request.arrival - first_arrival).div_f64(rate);
        while let Some(event) = events.next_if(|e| Duration::from_secs_f64(e.at_s) <= arrival) {
            tokio::time::sleep_until(start + Duration::from_secs_f64(event.at_s)).await;
            scaled.push(apply_scale(&gateway, event, &known));
        }
        tokio::time::sleep_until(start + arrival).await;
        let body = Bytes::from(messages_body_as(
            request,
            &turns[index],
            line != BillingLine::None,
        ));
        running.spawn(one_request(gateway.clone(), index, body, start));
    }
    // Events after the last arrival still happen, while the last replies run.
    for event in events {
        tokio::time::sleep_until(start + Duration::from_secs_f64(event.at_s)).await;
        scaled.push(apply_scale(&gateway, event, &known));
    }
    let mut outcomes = vec![Outcome::default(); requests.len()];
    while let Some(done) = running.join_next().await {
        let outcome = done.map_err(|e| ReplayError::Run(format!("a request task failed: {e}")))?;
        let index = outcome.index;
        outcomes[index] = outcome;
    }
    let makespan_s = start.elapsed().as_secs_f64();
    let _ = stop_sampler.send(());
    let load = sampler.await.unwrap_or_default();
    let servers = lock(&known)
        .iter()
        .map(|server| {
            let load = server.engine().load();
            ServerTotals {
                id: server.id().to_owned(),
                requests: load.requests_finished,
                busy_s: load.busy_seconds_total,
                preemptions: load.preemptions,
            }
        })
        .collect();
    let metrics = gateway.metrics().encode();
    Ok(RunData {
        outcomes,
        load,
        servers,
        decisions: metric_by_label(&metrics, "ringmaster_routing_decisions_total", "reason"),
        policy_faults: metric_by_label(&metrics, "ringmaster_policy_faults_total", "kind")
            .iter()
            .map(|(_, n)| n)
            .sum(),
        over_cap: metric_sum(&metrics, "ringmaster_routing_load_to_cap_ratio_count", "")
            - metric_sum(
                &metrics,
                "ringmaster_routing_load_to_cap_ratio_bucket",
                "le=\"1.0\"",
            ),
        makespan_s,
        scale: scaled,
        pairs: metric_by_label(&metrics, "ringmaster_pair_decisions_total", "outcome"),
    })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Applies one scale event and measures which of [`SCALE_SAMPLE_KEYS`] sampled keys changed
/// owner on the ring.
fn apply_scale(
    gateway: &Gateway,
    event: &ScaleEvent,
    known: &Mutex<Vec<Arc<ringmaster_gateway::pool::Server>>>,
) -> ScaleOutcome {
    let pool = gateway.pool();
    let owners = |snapshot: &ringmaster_gateway::pool::PoolSnapshot| -> Vec<Option<String>> {
        (0..SCALE_SAMPLE_KEYS)
            .map(|i| {
                let key = xxhash_rust::xxh3::xxh3_64(&i.to_le_bytes());
                snapshot
                    .ring
                    .lookup(key)
                    .map(|m| snapshot.servers[m].id().to_owned())
            })
            .collect()
    };
    let before = owners(&pool.snapshot());
    let (change, changed_id, result) = match &event.change {
        ScaleChange::Add(name) => {
            let added =
                ringmaster_gateway::config::server_spec(&ringmaster_gateway::config::RawServer {
                    address: format!("sim://{name}"),
                    id: None,
                    weight: None,
                    models: None,
                    ..Default::default()
                })
                .and_then(|spec| pool.add(&spec).map_err(|e| e.to_string()));
            let id = added
                .as_ref()
                .map_or_else(|_| name.clone(), |s| s.id().to_owned());
            if let Ok(server) = &added {
                lock(known).push(server.clone());
            }
            (format!("add {name}"), id, added.map(drop))
        }
        ScaleChange::Remove(id) => (
            format!("remove {id}"),
            id.clone(),
            pool.remove(id).map(drop).map_err(|e| e.to_string()),
        ),
    };
    let after = owners(&pool.snapshot());
    let mut outcome = ScaleOutcome {
        at_s: event.at_s,
        change,
        keys_moved: 0,
        moved_elsewhere: 0,
        error: result.err(),
    };
    for (old, new) in before.iter().zip(&after) {
        if old != new {
            outcome.keys_moved += 1;
            let touches = |owner: &Option<String>| owner.as_deref() == Some(changed_id.as_str());
            if !touches(old) && !touches(new) {
                outcome.moved_elsewhere += 1;
            }
        }
    }
    outcome
}

async fn one_request(gateway: Arc<Gateway>, index: usize, body: Bytes, start: Instant) -> Outcome {
    let arrived = Instant::now();
    let mut outcome = Outcome {
        index,
        arrival_s: (arrived - start).as_secs_f64(),
        ..Outcome::default()
    };
    let call = CallInput {
        door: ringmaster_api::Door::Messages,
        queue_timeout: None,
        body,
        session: None,
        caller: Caller::unlimited("replay", "replay"),
        passed_headers: Vec::new(),
        trace_context: Vec::new(),
        relay_headers: Vec::new(),
        prior: None,
    };
    let request_id = format!("replay-{index}");
    let response = match handle(&gateway, call, std::time::Instant::now(), &request_id).await {
        Ok(response) => response,
        Err(error) => {
            outcome.e2e_s = arrived.elapsed().as_secs_f64();
            outcome.error = Some(error.to_string());
            return outcome;
        }
    };
    outcome.server = response
        .headers()
        .get("x-ringmaster-server")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut body = response.into_body();
    let mut first_token: Option<Instant> = None;
    let mut last_token: Option<Instant> = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        // A keep-alive comment (`: ping`) before the first event is not the first token.
        if outcome.ttft_s.is_none() && !data.starts_with(b":") {
            outcome.ttft_s = Some(arrived.elapsed().as_secs_f64());
        }
        let tokens = count(&data, b"\"content_block_delta\"");
        if tokens > 0 {
            let now = Instant::now();
            if let Some(last) = last_token {
                outcome.gaps.push((now - last).as_secs_f32());
                outcome.gaps.extend(std::iter::repeat_n(0.0, tokens - 1));
            } else {
                first_token = Some(now);
                outcome.gaps.extend(std::iter::repeat_n(0.0, tokens - 1));
            }
            last_token = Some(now);
        }
        read_events(&data, &mut outcome);
    }
    outcome.e2e_s = arrived.elapsed().as_secs_f64();
    if let (Some(first), Some(last)) = (first_token, last_token)
        && !outcome.gaps.is_empty()
    {
        outcome.tpot_s = Some((last - first).as_secs_f64() / outcome.gaps.len() as f64);
    }
    if outcome.error.is_none() && outcome.prompt_tokens == 0 {
        outcome.error = Some("the reply ended without its usage".to_owned());
    }
    outcome
}

/// How many times `needle` occurs in `haystack`.
fn count(haystack: &[u8], needle: &[u8]) -> usize {
    haystack
        .windows(needle.len())
        .filter(|window| *window == needle)
        .count()
}

/// Takes the usage (from `message_delta`) and any error event from one SSE frame.
fn read_events(frame: &[u8], outcome: &mut Outcome) {
    let text = String::from_utf8_lossy(frame);
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if !(data.contains("\"message_delta\"") || data.contains("\"error\"")) {
            continue;
        }
        let Ok(event) = serde_json::from_str::<serde_json::Value>(data) else {
            continue;
        };
        match event["type"].as_str() {
            Some("message_delta") => {
                let usage = &event["usage"];
                let count = |field: &str| usage[field].as_u64().unwrap_or(0) as u32;
                outcome.cached_tokens = count("cache_read_input_tokens");
                outcome.prompt_tokens = count("input_tokens") + outcome.cached_tokens;
                outcome.output_tokens = count("output_tokens");
            }
            Some("error") => {
                outcome.error = Some(event["error"]["message"].to_string());
            }
            _ => {}
        }
    }
}

/// Samples every server's queue (every server the run has had, in the order they joined)
/// each [`LOAD_SAMPLE_INTERVAL`] until `stop` fires.
async fn sample_loads(
    known: Arc<Mutex<Vec<Arc<ringmaster_gateway::pool::Server>>>>,
    start: Instant,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) -> Vec<LoadSample> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(LOAD_SAMPLE_INTERVAL);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => return samples,
        }
        let queued = lock(&known)
            .iter()
            .map(|s| {
                let load = s.engine().load();
                load.running + load.waiting
            })
            .collect();
        samples.push(LoadSample {
            at_s: start.elapsed().as_secs_f64(),
            queued,
        });
    }
}

/// Sums the samples of `name` whose labels contain `labels`, from the metrics text.
fn metric_sum(text: &str, name: &str, labels: &str) -> u64 {
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) || !rest.contains(labels) {
                return None;
            }
            let value = rest.rsplit_once(' ')?.1;
            value.parse::<f64>().ok()
        })
        .sum::<f64>() as u64
}

/// Sums the samples of the counter `name` by the value of `label`, from the metrics text.
fn metric_by_label(text: &str, name: &str, label: &str) -> Vec<(String, u64)> {
    let mut sums: Vec<(String, u64)> = Vec::new();
    let needle = format!("{label}=\"");
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !rest.starts_with('{') {
            continue;
        }
        let Some((labels, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        let Some(at) = labels.find(&needle) else {
            continue;
        };
        let after = &labels[at + needle.len()..];
        let key = after.split('"').next().unwrap_or_default().to_owned();
        let value = value.parse::<f64>().unwrap_or(0.0) as u64;
        match sums.iter_mut().find(|(k, _)| *k == key) {
            Some((_, sum)) => *sum += value,
            None => sums.push((key, value)),
        }
    }
    sums.sort();
    sums
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Scenario, TraceFormat, agent};

    /// A small made-up agent trace replayed three times through the Messages door, request by
    /// request: without the billing line, with it and the gateway's default `volatile_prefix`,
    /// and with it and `volatile_prefix = []`. The bodies of the last two are the same, each
    /// line new; only the gateway's taking the line out makes the `hygiene` run's servers see
    /// the prompts of the run without it, so were the gateway to stop, this fails.
    #[test]
    fn only_the_gateway_taking_the_line_out_gives_every_request_the_cache_it_has_without_it() {
        let scenario = Scenario::from_toml(
            "format = \"agent\"\nservers = 3\nrouters = [\"builtin:prefix-affinity\"]\n\
             [agent]\nsessions = 5\nturns_max = 8\n",
            std::path::Path::new("."),
        )
        .unwrap();
        let TraceFormat::Agent(shape) = scenario.format else {
            unreachable!("an agent scenario")
        };
        let requests = shape.requests();
        let turns = agent::earlier_turns(&requests);
        // Every body with the line carries one of its own.
        let lines: std::collections::HashSet<String> =
            requests.iter().map(crate::render::billing_line).collect();
        assert_eq!(lines.len(), requests.len());
        // A fresh runtime per run: each starts its paused clock at zero.
        let run = |line| {
            let data = crate::runtime()
                .unwrap()
                .block_on(replay(
                    &scenario.fleet,
                    ("builtin:prefix-affinity", "in_process", line),
                    &requests,
                    &turns,
                    &[],
                ))
                .unwrap();
            assert!(data.outcomes.iter().all(|o| o.error.is_none()));
            data.outcomes
        };
        let (none, kept, hygiene) = (
            run(BillingLine::None),
            run(BillingLine::Raw),
            run(BillingLine::Hygiene),
        );
        let cached = |outcomes: &[Outcome]| outcomes.iter().map(|o| o.cached_tokens).sum::<u32>();
        assert!(cached(&none) > 0);
        for ((n, k), h) in none.iter().zip(&kept).zip(&hygiene) {
            // Kept, the line reaches the server (more prompt); taken out, it does not.
            assert!(k.prompt_tokens > n.prompt_tokens, "{k:?} vs {n:?}");
            assert_eq!(
                (h.prompt_tokens, h.cached_tokens, &h.server),
                (n.prompt_tokens, n.cached_tokens, &n.server),
                "request {}",
                n.index
            );
        }
        // Kept, the line, new on every request, costs the engines' caches everything.
        assert!(
            cached(&kept) * 20 < cached(&none),
            "{} vs {}",
            cached(&kept),
            cached(&none)
        );
    }
}
