//! Trace replay on the modelled clock: routing quality measured through the real routing
//! code, in process, deterministically, at whatever speed the machine allows.
//!
//! A [`Scenario`] names a trace (or a made-up coding agent's traffic: [`agent`]), a fleet of
//! simulated servers (how many, their KV capacity) and the routers to compare. [`run_scenario`] reads the trace ([`trace`]), reconstructs its
//! conversations, renders each request as a Messages request ([`render`]), replays it once per
//! router through a fresh gateway ([`run`]) on tokio's paused clock, computes the two oracles
//! from the trace alone ([`oracle`]), and summarises ([`report`]). Nothing here listens on a
//! socket or reads the wall clock; what a replay reports depends only on the scenario.
//!
//! This crate must not change how the gateway routes: it only calls it.

pub mod agent;
pub mod goodput;
pub mod oracle;
pub mod publish;
pub mod render;
pub mod report;
pub mod run;
pub mod trace;

use std::path::{Path, PathBuf};

use ringmaster_config::LocalCacheView;
use serde::{Deserialize, Serialize};

use crate::oracle::Hits;
use crate::report::PolicySummary;

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// The scenario file is unreadable or invalid.
    #[error("scenario: {0}")]
    Scenario(String),
    /// The trace could not be read.
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    /// The gateway configuration built for the replay is invalid.
    #[error("the replay's gateway configuration is invalid: {0}")]
    Config(String),
    /// The gateway did not start (a policy failed to load, for instance).
    #[error("the gateway did not start: {0}")]
    Start(String),
    /// The replay itself failed.
    #[error("the replay failed: {0}")]
    Run(String),
}

/// The simulated fleet a scenario runs on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fleet {
    /// Servers.
    pub servers: usize,
    /// KV blocks of 16 tokens per server (`None`: the simulator's default).
    pub kv_blocks: Option<u32>,
    /// The ring's bounded-load factor.
    pub load_factor: f64,
    /// Prefix hashes per request (of 256 prompt bytes each).
    pub max_prefix_hashes: usize,
    /// `[policies] router_bounded_load`: `policy` (the gateway's default) or `host`.
    pub router_bounded_load: Option<String>,
    /// `[policies] router_load_factor`.
    pub router_load_factor: Option<f64>,
    /// `[record] path`: the gateway records the replayed traffic as a trace there.
    pub record: Option<PathBuf>,
    /// Servers (`replay-N`) that run this many times slower than the others.
    pub slowdown: std::collections::BTreeMap<String, f64>,
    /// How many of the servers are prefill servers (`prefill-N`; the others are decode
    /// servers, `decode-N`); 0: every server takes whole requests (`replay-N`).
    pub prefill_servers: usize,
    /// `[disaggregation]` for a fleet with prefill servers: the pair rule's threshold, and
    /// the KV link (GB/s, µs).
    pub pair: PairRun,
}

/// The disaggregation settings of one run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PairRun {
    /// `[disaggregation] min_uncached_tokens` (`None`: the gateway's default).
    pub min_uncached_tokens: Option<u32>,
    /// `link_gbps` (`None`: the default).
    pub link_gbps: Option<f64>,
    /// `link_latency_us` (`None`: the default).
    pub link_latency_us: Option<f64>,
    /// `when_prefill_busy` (`None`: the default, `decode`).
    pub when_prefill_busy: Option<&'static str>,
}

/// What to replay, as a TOML file says it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    /// The trace, relative to the scenario file (none for `format = "agent"`).
    trace: Option<String>,
    /// `mooncake` (JSONL with prefix hashes; the default) or `azure` (CSV of arrivals and
    /// token counts, prefixes from `[synthetic]`).
    format: Option<String>,
    /// `[synthetic]`: the prefix model for a trace without prefixes.
    synthetic: Option<RawSynthetic>,
    /// Replay only the first N requests.
    requests: Option<usize>,
    /// Simulated servers (default 8).
    servers: Option<usize>,
    /// KV blocks per server (default: the simulator's).
    kv_blocks: Option<u32>,
    /// Bounded-load factor (default 1.25).
    load_factor: Option<f64>,
    /// Prefix hashes per request (default 512).
    max_prefix_hashes: Option<usize>,
    /// `{ "replay-N" = F }`: servers that run F times slower than the simulator's model.
    slowdown: Option<std::collections::BTreeMap<String, f64>>,
    /// How the host guards the routers' choices: `policy` (the default: each router decides
    /// alone, as the peers' algorithms do) or `host`.
    router_bounded_load: Option<String>,
    /// The router slot's own bounded-load factor.
    router_load_factor: Option<f64>,
    /// Record the replayed traffic as a trace (relative to the scenario file).
    record: Option<String>,
    /// How routing learns what the servers hold, one run per view and router:
    /// `in_process` (the default), `vllm_events`, `routing_history`.
    cache_views: Option<Vec<String>>,
    /// Routers to compare: `native`, `builtin:NAME`, or a component path (relative to the
    /// scenario file).
    routers: Vec<String>,
    /// `[[scale]]`: servers added or removed during the replay.
    #[serde(default)]
    scale: Vec<RawScaleEvent>,
    /// `[agent]`: the made-up coding agent's traffic (with `format = "agent"`).
    agent: Option<RawAgent>,
    /// `[disaggregation]`: a goodput sweep over fleet layouts, pair rules and rates instead
    /// of one run per router.
    disaggregation: Option<RawGoodput>,
    /// Claude Code's billing line, one run per entry: `none` (the trace as it is), `raw` (the
    /// line leads every system prompt, and the gateway keeps it: `[routing] volatile_prefix =
    /// []`), `hygiene` (the line is there, and the gateway takes it out, as by default).
    billing_line: Option<Vec<String>>,
}

/// `[disaggregation]` in a scenario (see [`goodput`]).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGoodput {
    /// `aggregated` and `xPyD` layouts of the scenario's servers.
    layouts: Vec<String>,
    /// The host pair rules compared on each disaggregated layout (default: the gateway's).
    pair_rules: Option<Vec<RawPairRule>>,
    /// Routers answering the pair themselves, replayed on each disaggregated layout.
    #[serde(default)]
    pair_routers: Vec<String>,
    /// Multiples of the trace's arrival rate.
    rates: Vec<f64>,
    /// `[[disaggregation.slo]]`: the SLOs goodput is measured against.
    slo: Vec<RawSlo>,
    /// The share of requests that must meet both (default 0.9).
    attainment: Option<f64>,
    /// The KV link, GB/s.
    link_gbps: Option<f64>,
    /// Its setup time, µs.
    link_latency_us: Option<f64>,
}

/// One SLO of a goodput sweep.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlo {
    name: String,
    ttft_s: f64,
    itl_s: f64,
}

/// One pair rule of a goodput sweep: `[disaggregation]`'s keys.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPairRule {
    min_uncached_tokens: Option<u32>,
    when_prefill_busy: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    sessions: Option<u32>,
    turns_min: Option<u32>,
    turns_max: Option<u32>,
    shared_tokens: Option<u32>,
    first_message_tokens: Option<u32>,
    tool_result_min: Option<u32>,
    tool_result_max: Option<u32>,
    output_min: Option<u32>,
    output_max: Option<u32>,
    session_every_s: Option<f64>,
    think_min_s: Option<f64>,
    think_max_s: Option<f64>,
    seed: Option<u64>,
}

/// Whether the requests carry Claude Code's billing line, and what the gateway does with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum BillingLine {
    /// No line: the trace as it is.
    None,
    /// The line, kept by the gateway (`[routing] volatile_prefix = []`).
    Raw,
    /// The line, taken out by the gateway (its default).
    Hygiene,
}

impl BillingLine {
    /// Its name in a scenario.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Raw => "raw",
            Self::Hygiene => "hygiene",
        }
    }

    fn parse(name: &str) -> Result<Self, String> {
        match name {
            "none" => Ok(Self::None),
            "raw" => Ok(Self::Raw),
            "hygiene" => Ok(Self::Hygiene),
            other => Err(format!(
                "billing_line: {other:?} is not one of none, raw, hygiene"
            )),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSynthetic {
    groups: Option<u32>,
    shared_fraction: Option<f64>,
    seed: Option<u64>,
}

/// How a scenario's trace file is read.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum TraceFormat {
    /// Mooncake's JSONL, prefixes included.
    Mooncake,
    /// Azure's CSV, with made-up prefixes.
    Azure(trace::SyntheticPrefixes),
    /// No file: a made-up coding agent's sessions.
    Agent(agent::AgentTrace),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScaleEvent {
    /// Modelled seconds from the start.
    at_s: f64,
    /// A server to add (a name: it becomes `sim://NAME`).
    add: Option<String>,
    /// A server to remove (its id: `replay-N` for the scenario's own).
    remove: Option<String>,
}

/// A server added or taken off during a replay.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScaleEvent {
    /// Modelled seconds from the start.
    pub at_s: f64,
    /// What changes.
    pub change: ScaleChange,
}

/// One change of the fleet.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum ScaleChange {
    /// A simulated server of this name joins.
    Add(String),
    /// The server of this id leaves (it drains).
    Remove(String),
}

/// A replay to run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Scenario {
    /// The trace file.
    pub trace: PathBuf,
    /// How it is read.
    pub format: TraceFormat,
    /// Replay only the first N requests.
    pub requests: Option<usize>,
    /// The fleet.
    pub fleet: Fleet,
    /// Routers to compare.
    pub routers: Vec<String>,
    /// The views of the servers' caches each router is run with (`[simulator] cache_view`).
    pub cache_views: Vec<&'static str>,
    /// Servers added or removed during the replay, in time order.
    pub scale: Vec<ScaleEvent>,
    /// The billing-line runs (one run per entry, view and router).
    pub billing_lines: Vec<BillingLine>,
    /// A goodput sweep instead of one run per router (see [`goodput`]).
    pub goodput: Option<goodput::GoodputSpec>,
}

impl Scenario {
    /// Reads a scenario file.
    pub fn from_file(path: &Path) -> Result<Self, ReplayError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ReplayError::Scenario(format!("cannot read {}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::from_toml(&text, base)
            .map_err(|e| ReplayError::Scenario(format!("{}: {e}", path.display())))
    }

    /// Parses a scenario; relative paths are taken from `base`.
    pub fn from_toml(text: &str, base: &Path) -> Result<Self, String> {
        let raw: RawScenario = toml::from_str(text).map_err(|e| e.to_string())?;
        let servers = raw.servers.unwrap_or(8);
        if servers == 0 {
            return Err("servers: must be at least 1".into());
        }
        if raw.routers.is_empty() {
            return Err("routers: name at least one (native, builtin:NAME or a path)".into());
        }
        let slowdown = raw.slowdown.clone().unwrap_or_default();
        for (server, factor) in &slowdown {
            let known = server
                .strip_prefix("replay-")
                .and_then(|i| i.parse::<usize>().ok())
                .is_some_and(|i| i < servers);
            if !known || !(0.1..=100.0).contains(factor) {
                return Err(format!(
                    "slowdown: {server:?} = {factor}: name a server replay-0..replay-{} and a \
                     factor between 0.1 and 100",
                    servers - 1
                ));
            }
        }
        let cache_views = match raw.cache_views {
            None => vec![LocalCacheView::InProcess.name()],
            Some(views) if views.is_empty() => {
                return Err("cache_views: name at least one view".into());
            }
            Some(views) => views
                .iter()
                .map(|v| LocalCacheView::parse(v).map(LocalCacheView::name))
                .collect::<Result<_, _>>()
                .map_err(|e| format!("cache_views: {e}"))?,
        };
        let load_factor = raw.load_factor.unwrap_or(1.25);
        if !(load_factor.is_finite() && load_factor >= 1.0) {
            return Err("load_factor: must be at least 1.0".into());
        }
        let routers = raw
            .routers
            .into_iter()
            .map(|r| {
                if r == "native" || r.starts_with("builtin:") {
                    r
                } else {
                    base.join(r).display().to_string()
                }
            })
            .collect();
        let mut scale = Vec::with_capacity(raw.scale.len());
        for (i, event) in raw.scale.into_iter().enumerate() {
            if !(event.at_s.is_finite() && event.at_s >= 0.0) {
                return Err(format!("scale[{i}].at_s: must be a time of at least 0"));
            }
            let change = match (event.add, event.remove) {
                (Some(name), None) => ScaleChange::Add(name),
                (None, Some(id)) => ScaleChange::Remove(id),
                _ => return Err(format!("scale[{i}]: name exactly one of add and remove")),
            };
            scale.push(ScaleEvent {
                at_s: event.at_s,
                change,
            });
        }
        scale.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
        let format = match raw.format.as_deref() {
            None | Some("mooncake") => {
                if raw.synthetic.is_some() {
                    return Err("synthetic: only for format = \"azure\"".into());
                }
                TraceFormat::Mooncake
            }
            Some("agent") => {
                let d = agent::AgentTrace::default();
                let raw = raw.agent.clone().unwrap_or_default();
                TraceFormat::Agent(agent::AgentTrace {
                    sessions: raw.sessions.unwrap_or(d.sessions).max(1),
                    turns_min: raw.turns_min.unwrap_or(d.turns_min).max(1),
                    turns_max: raw.turns_max.unwrap_or(d.turns_max).max(1),
                    shared_tokens: raw.shared_tokens.unwrap_or(d.shared_tokens),
                    first_message_tokens: raw
                        .first_message_tokens
                        .unwrap_or(d.first_message_tokens)
                        .max(1),
                    tool_result_min: raw.tool_result_min.unwrap_or(d.tool_result_min),
                    tool_result_max: raw.tool_result_max.unwrap_or(d.tool_result_max),
                    output_min: raw.output_min.unwrap_or(d.output_min).max(1),
                    output_max: raw.output_max.unwrap_or(d.output_max).max(1),
                    session_every_s: raw.session_every_s.unwrap_or(d.session_every_s),
                    think_min_s: raw.think_min_s.unwrap_or(d.think_min_s),
                    think_max_s: raw.think_max_s.unwrap_or(d.think_max_s),
                    seed: raw.seed.unwrap_or(d.seed),
                })
            }
            Some("azure") => {
                let d = trace::SyntheticPrefixes::default();
                let raw = raw.synthetic.unwrap_or(RawSynthetic {
                    groups: None,
                    shared_fraction: None,
                    seed: None,
                });
                let shared_fraction = raw.shared_fraction.unwrap_or(d.shared_fraction);
                if !(0.0..=1.0).contains(&shared_fraction) {
                    return Err("synthetic.shared_fraction: must be from 0 to 1".into());
                }
                TraceFormat::Azure(trace::SyntheticPrefixes {
                    groups: raw.groups.unwrap_or(d.groups).max(1),
                    shared_fraction,
                    seed: raw.seed.unwrap_or(d.seed),
                })
            }
            Some(other) => {
                return Err(format!("format: {other:?} is not mooncake, azure or agent"));
            }
        };
        if raw.agent.is_some() && !matches!(format, TraceFormat::Agent(_)) {
            return Err("agent: only for format = \"agent\"".into());
        }
        let billing_lines = match raw.billing_line {
            None => vec![BillingLine::None],
            Some(lines) if lines.is_empty() => {
                return Err("billing_line: name at least one of none, raw, hygiene".into());
            }
            Some(lines) => lines
                .iter()
                .map(|l| BillingLine::parse(l))
                .collect::<Result<_, _>>()?,
        };
        let goodput = raw
            .disaggregation
            .map(|spec| goodput_spec(spec, servers))
            .transpose()?;
        let trace = match (&format, raw.trace) {
            (TraceFormat::Agent(_), None) => PathBuf::from("made-up-coding-agent-sessions"),
            (TraceFormat::Agent(_), Some(_)) => {
                return Err(
                    "trace: format = \"agent\" makes its own requests; name no trace".into(),
                );
            }
            (_, Some(trace)) => base.join(trace),
            (_, None) => return Err("trace: field required (the trace file)".into()),
        };
        Ok(Self {
            format,
            scale,
            trace,
            requests: raw.requests,
            fleet: Fleet {
                servers,
                kv_blocks: raw.kv_blocks,
                load_factor,
                max_prefix_hashes: raw.max_prefix_hashes.unwrap_or(512),
                router_bounded_load: raw.router_bounded_load,
                router_load_factor: raw.router_load_factor,
                record: raw.record.map(|r| base.join(r)),
                slowdown,
                prefill_servers: 0,
                pair: PairRun::default(),
            },
            routers,
            cache_views,
            billing_lines,
            goodput,
        })
    }

    /// The replays it takes: one per router, view and billing line; or, for a goodput
    /// sweep, one per router, layout, pair rule and rate.
    pub fn runs(&self) -> usize {
        match &self.goodput {
            Some(spec) => {
                let rows: usize = spec
                    .layouts
                    .iter()
                    .map(|l| {
                        if l.prefill == 0 {
                            1
                        } else {
                            spec.pair_rules.len()
                        }
                    })
                    .sum();
                let disaggregated = spec.layouts.iter().filter(|l| l.prefill > 0).count();
                (self.routers.len() * rows + spec.pair_routers.len() * disaggregated)
                    * spec.rates.len()
            }
            None => self.routers.len() * self.cache_views.len() * self.billing_lines.len(),
        }
    }

    /// The fleet's total KV capacity in trace blocks (of 512 tokens).
    pub fn capacity_trace_blocks(&self) -> usize {
        let per_server = self
            .fleet
            .kv_blocks
            .unwrap_or(ringmaster_gpu_runtime::DEFAULT_KV_BLOCKS) as usize;
        per_server * self.fleet.servers * ringmaster_gpu_runtime::BLOCK_SIZE
            / trace::TRACE_BLOCK_TOKENS as usize
    }
}

fn goodput_spec(raw: RawGoodput, servers: usize) -> Result<goodput::GoodputSpec, String> {
    let layouts = raw
        .layouts
        .iter()
        .map(|name| goodput::Layout::parse(name, servers))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("disaggregation.layouts: {e}"))?;
    if layouts.is_empty() {
        return Err("disaggregation.layouts: name at least one layout".into());
    }
    if raw.rates.is_empty()
        || raw.rates.iter().any(|r| !(r.is_finite() && *r > 0.0))
        || raw.rates.windows(2).any(|w| w[1] <= w[0])
    {
        return Err("disaggregation.rates: positive multiples of the trace's rate, rising".into());
    }
    let positive = |name: &str, value: f64| {
        if value.is_finite() && value > 0.0 {
            Ok(value)
        } else {
            Err(format!("disaggregation.{name}: must be above 0"))
        }
    };
    let attainment = raw.attainment.unwrap_or(0.9);
    if !(attainment > 0.0 && attainment <= 1.0) {
        return Err("disaggregation.attainment: must be above 0 and at most 1".into());
    }
    let pair_rules = raw
        .pair_rules
        .unwrap_or_else(|| vec![RawPairRule::default()])
        .into_iter()
        .map(|rule| {
            let when_prefill_busy = match rule.when_prefill_busy.as_deref() {
                None => None,
                Some("decode") => Some("decode"),
                Some("wait") => Some("wait"),
                Some(other) => {
                    return Err(format!(
                        "disaggregation.pair_rules: when_prefill_busy {other:?} is not decode or wait"
                    ));
                }
            };
            Ok(goodput::PairRule {
                min_uncached_tokens: rule.min_uncached_tokens,
                when_prefill_busy,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    if !raw.pair_routers.is_empty() && layouts.iter().all(|l| l.prefill == 0) {
        return Err(
            "disaggregation.pair_routers: name a disaggregated layout (xPyD) for them to pair on"
                .into(),
        );
    }
    Ok(goodput::GoodputSpec {
        layouts,
        pair_rules,
        pair_routers: raw.pair_routers,
        rates: raw.rates,
        slos: if raw.slo.is_empty() {
            return Err("disaggregation.slo: name at least one SLO".into());
        } else {
            raw.slo
                .into_iter()
                .map(|slo| {
                    Ok(goodput::Slo {
                        ttft_s: positive("slo.ttft_s", slo.ttft_s)?,
                        itl_s: positive("slo.itl_s", slo.itl_s)?,
                        name: slo.name,
                    })
                })
                .collect::<Result<_, String>>()?
        },
        attainment,
        link_gbps: raw.link_gbps,
        link_latency_us: raw.link_latency_us,
    })
}

/// Everything a scenario's replay produced.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// What was replayed.
    pub scenario: Scenario,
    /// Requests replayed.
    pub requests: usize,
    /// Of those, later turns of a conversation in the trace.
    pub follow_ups: usize,
    /// One shared LRU of the fleet's total capacity.
    pub shared_lru: Hits,
    /// One cache that never forgets.
    pub unbounded: Hits,
    /// Per router.
    pub routers: Vec<PolicySummary>,
    /// Per router, what each run measured (for the plots).
    #[serde(skip)]
    pub runs: Vec<run::RunData>,
    /// The goodput sweep's rows, when the scenario asks for one.
    pub goodput: Vec<goodput::GoodputRow>,
}

impl Report {
    /// The Markdown table of the routers and oracles.
    pub fn table(&self) -> String {
        report::table(&self.routers, self.shared_lru, self.unbounded)
    }
}

/// The runtime a replay runs in: one thread, the clock paused (see [`run`]).
pub fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
}

/// Replays `scenario` once per router. `progress` hears each router's name as it starts.
pub async fn run_scenario(
    scenario: &Scenario,
    mut progress: impl FnMut(&str),
) -> Result<Report, ReplayError> {
    let mut requests = match scenario.format {
        TraceFormat::Mooncake => trace::load_mooncake(&scenario.trace, scenario.requests)?,
        TraceFormat::Azure(prefixes) => {
            trace::load_azure(&scenario.trace, scenario.requests, prefixes)?
        }
        TraceFormat::Agent(shape) => shape.requests(),
    };
    if let Some(limit) = scenario.requests {
        requests.truncate(limit);
    }
    let (parents, turns) = match scenario.format {
        // The made-up sessions know their turns.
        TraceFormat::Agent(_) => {
            let turns = agent::earlier_turns(&requests);
            let parents = turns.iter().map(|t| (!t.is_empty()).then_some(0)).collect();
            (parents, turns)
        }
        _ => {
            let parents = trace::previous_turns(&requests);
            let turns = earlier_turns(&requests, &parents);
            (parents, turns)
        }
    };
    let shared_lru = oracle::shared_lru(&requests, scenario.capacity_trace_blocks());
    let unbounded = oracle::unbounded(&requests);
    let mut routers = Vec::new();
    let mut runs = Vec::new();
    let mut goodput_rows = Vec::new();
    if let Some(spec) = &scenario.goodput {
        for router in &scenario.routers {
            let rows = goodput::sweep(
                &scenario.fleet,
                router,
                spec,
                (&requests, &turns),
                |label| progress(&format!("{router} · {label}")),
            )
            .await?;
            goodput_rows.extend(rows.into_iter().map(|mut row| {
                if scenario.routers.len() > 1 {
                    row.label = format!("{router} · {}", row.label);
                }
                row
            }));
        }
        goodput_rows.extend(
            goodput::sweep_pair_routers(&scenario.fleet, spec, (&requests, &turns), |label| {
                progress(label)
            })
            .await?,
        );
    }
    for view in scenario
        .cache_views
        .iter()
        .filter(|_| scenario.goodput.is_none())
    {
        for router in &scenario.routers {
            for line in &scenario.billing_lines {
                // With several views or lines, each row says which.
                let mut label = router.clone();
                if scenario.cache_views.len() > 1 {
                    label = format!("{label} · {view}");
                }
                if scenario.billing_lines.len() > 1 {
                    label = format!("{label} · billing line {}", line.name());
                }
                progress(&label);
                let data = run::replay(
                    &scenario.fleet,
                    (router, view, *line),
                    &requests,
                    &turns,
                    &scenario.scale,
                )
                .await?;
                routers.push(report::summarise(&label, &data, shared_lru, unbounded));
                runs.push(data);
            }
        }
    }
    Ok(Report {
        scenario: scenario.clone(),
        requests: requests.len(),
        follow_ups: parents.iter().filter(|p| p.is_some()).count(),
        shared_lru,
        unbounded,
        routers,
        runs,
        goodput: goodput_rows,
    })
}

/// For each request, the complete-block counts of its earlier turns, oldest first.
pub fn earlier_turns(
    requests: &[trace::TraceRequest],
    parents: &[Option<usize>],
) -> Vec<Vec<usize>> {
    let mut turns: Vec<Vec<usize>> = Vec::with_capacity(requests.len());
    for parent in parents {
        let chain = match parent {
            Some(p) => {
                let mut chain = turns[*p].clone();
                chain.push(requests[*p].complete_blocks());
                chain
            }
            None => Vec::new(),
        };
        turns.push(chain);
    }
    turns
}
