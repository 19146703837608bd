//! `ringmaster policy check`: whether a component loads as one of the policy worlds under the
//! sandbox (no files, network or environment; the engine's deadline and memory cap), and
//! what it costs: size, compile time, load time from the compiled-component cache, the time
//! of a fresh instantiation, and the time per call against a synthetic fleet of eight servers.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ringmaster_policy_engine::{
    EngineConfig, PolicyEngine, PolicyError, PolicyFault, PolicyRequest, PolicyRole, RouteDecision,
    RouterHost, ServerView,
};

use crate::{KitError, Result, io_error};

/// Calls timed per check.
pub const CALLS: usize = 2_000;

/// Fresh instantiations timed per check.
pub const INSTANTIATIONS: usize = 25;

/// What a check found.
#[derive(Clone, Debug)]
pub struct Report {
    /// The world the component targets (`learning-router` for a router exporting `observe`).
    pub world: &'static str,
    /// The `ringmaster:policy` version it was built against.
    pub contract: &'static str,
    /// Its size in bytes.
    pub size: usize,
    /// Compiling it and running the load probes, with an empty cache.
    pub compile: Duration,
    /// Loading it again from the compiled-component cache.
    pub cached_load: Duration,
    /// The median of [`INSTANTIATIONS`] fresh instantiations (start-up code included),
    /// outside the warm pool: what a call pays when no warm instance is free.
    pub instantiate: Duration,
    /// Median time per call (routers only), over [`CALLS`] calls.
    pub call_median: Option<Duration>,
    /// The 99th percentile of the same.
    pub call_p99: Option<Duration>,
    /// Median fuel (about one unit per Wasm instruction) per call, on an engine in fuel mode
    /// (routers only): its cost in instructions, the same on every machine.
    pub call_fuel: Option<u64>,
    /// What it answered to the first synthetic request it answered (routers only).
    pub sample_answer: Option<String>,
    /// Calls that faulted (each would have fallen back to the ring), and the first fault.
    pub faults: (usize, Option<String>),
}

/// Checks `path`. `scratch` is an empty directory for the compiled-component cache.
pub fn check(path: &Path, scratch: &Path) -> Result<Report> {
    let bytes = std::fs::read(path).map_err(io_error(path))?;
    let config = |cache: Option<&Path>| EngineConfig {
        cache_dir: cache.map(Path::to_path_buf),
        ..EngineConfig::default()
    };
    let cold = PolicyEngine::new(config(Some(scratch)))?;
    let started = Instant::now();
    let (world, contract, router, instantiate) = load_any(&cold, &bytes)?;
    let compile = started.elapsed();
    let warm = PolicyEngine::new(config(Some(scratch)))?;
    let started = Instant::now();
    load_any(&warm, &bytes)?;
    let cached_load = started.elapsed();
    let (mut call_median, mut call_p99, mut sample_answer) = (None, None, None);
    let mut call_fuel = None;
    let mut faults = (0, None);
    if let Some(router) = router {
        let fleet = SyntheticFleet::eight();
        let mut times = Vec::with_capacity(CALLS);
        for i in 0..CALLS {
            let request = SyntheticFleet::request(i as u64, 16, 1_000);
            let started = Instant::now();
            let answer = router.route(&fleet, &request);
            times.push(started.elapsed());
            match answer {
                Ok(answer) => {
                    sample_answer.get_or_insert_with(|| match answer {
                        RouteDecision::Route(id) => format!("route to {id}"),
                        RouteDecision::Reject(reason) => format!("reject: {reason}"),
                        RouteDecision::Pair {
                            decode,
                            prefill: Some(prefill),
                            reason,
                        } => format!("split: prefill on {prefill}, decode on {decode} ({reason})"),
                        RouteDecision::Pair {
                            decode,
                            prefill: None,
                            reason,
                        } => format!("whole on {decode} ({reason})"),
                    });
                }
                // A fault is counted, not fatal: in a gateway each one falls back to the
                // ring, and a deadline overrun on a busy machine says little by itself.
                Err(fault) => {
                    faults.0 += 1;
                    faults.1.get_or_insert_with(|| fault.to_string());
                }
            }
        }
        times.sort();
        call_median = Some(times[times.len() / 2]);
        call_p99 = Some(times[times.len() * 99 / 100]);
        call_fuel = fuel_per_call(&bytes, scratch)?;
    }
    Ok(Report {
        world,
        contract,
        size: bytes.len(),
        compile,
        cached_load,
        instantiate,
        call_median,
        call_p99,
        call_fuel,
        sample_answer,
        faults,
    })
}

/// Fuel calls measured per check (fuel is deterministic: fewer calls suffice).
const FUEL_CALLS: usize = 200;

/// The median fuel a router burns per call on the synthetic fleet, from an engine in fuel
/// mode with a generous budget.
fn fuel_per_call(bytes: &[u8], scratch: &Path) -> Result<Option<u64>> {
    let engine = PolicyEngine::new(EngineConfig {
        fuel: Some(1_000_000_000),
        cache_dir: Some(scratch.join("fuel")),
        ..EngineConfig::default()
    })?;
    let router = engine.load_router("check-fuel", bytes, BTreeMap::new())?;
    let fleet = SyntheticFleet::eight();
    let mut burned: Vec<u64> = (0..FUEL_CALLS)
        .filter_map(|i| {
            let request = SyntheticFleet::request(i as u64, 16, 1_000);
            router.route(&fleet, &request).ok()?;
            router.last_call_fuel()
        })
        .collect();
    burned.sort_unstable();
    Ok(burned.get(burned.len() / 2).copied())
}

/// Loads `bytes` as a router, else an admission policy, else a safety filter; with the
/// median time of a fresh instantiation.
fn load_any(
    engine: &PolicyEngine,
    bytes: &[u8],
) -> Result<(
    &'static str,
    &'static str,
    Option<ringmaster_policy_engine::RouterPolicy>,
    Duration,
)> {
    fn median(
        mut instantiate: impl FnMut() -> std::result::Result<Duration, PolicyFault>,
    ) -> Result<Duration> {
        let mut times = (0..INSTANTIATIONS)
            .map(|_| instantiate())
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|fault| KitError::Project(format!("a fresh instantiation failed: {fault}")))?;
        times.sort();
        Ok(times[times.len() / 2])
    }
    let config = BTreeMap::new();
    let router = match engine.load_router("check", bytes, config.clone()) {
        Ok(router) => {
            let instantiate = median(|| router.time_instantiation())?;
            let world = if router.learns() {
                "learning-router"
            } else {
                "router"
            };
            return Ok((world, router.contract(), Some(router), instantiate));
        }
        Err(PolicyError::WrongWorld(why)) => why,
        Err(other) => return Err(other.into()),
    };
    let admission = match engine.load_admission("check", bytes, config.clone()) {
        Ok(policy) => {
            let instantiate = median(|| policy.time_instantiation())?;
            return Ok(("admission", policy.contract(), None, instantiate));
        }
        Err(PolicyError::WrongWorld(why)) => why,
        Err(other) => return Err(other.into()),
    };
    match engine.load_safety("check", bytes, config) {
        Ok(policy) => Ok((
            "safety-filter",
            policy.contract(),
            None,
            median(|| policy.time_instantiation())?,
        )),
        Err(PolicyError::WrongWorld(safety)) => Err(KitError::Project(format!(
            "not a component for any ringmaster:policy world:\n  router: {router}\n  \
             admission: {admission}\n  safety-filter: {safety}"
        ))),
        Err(other) => Err(other.into()),
    }
}

/// A fleet that answers a router's host calls from plain values: servers, the prefix
/// matches and prefill backlogs of the request being decided, and a ring that maps a key to
/// server `key mod n` (then clockwise); and, for pair routers, prefill servers beside it. For
/// checking and testing a policy without a gateway.
#[derive(Clone, Debug, Default)]
pub struct SyntheticFleet {
    /// The servers a request may be routed to, in ring order.
    pub servers: Vec<ServerView>,
    /// `cluster.prefix-matches` (of the servers and of the prefill servers).
    pub matches: Vec<(String, u32)>,
    /// `cluster.prefill-backlog` (of the servers and of the prefill servers).
    pub backlog: Vec<(String, u64)>,
    /// `cluster.prefill-servers`.
    pub prefill: Vec<ServerView>,
}

impl SyntheticFleet {
    /// `n` healthy servers `gpu-0`… with `in_flight` requests each (repeated over the fleet).
    pub fn new(n: usize, in_flight: &[u32]) -> Self {
        let servers = (0..n)
            .map(|i| ServerView {
                id: format!("gpu-{i}"),
                role: PolicyRole::Both,
                healthy: true,
                weight: 1,
                in_flight: in_flight
                    .get(i % in_flight.len().max(1))
                    .copied()
                    .unwrap_or(0),
                waiting: (i % 2) as u32,
                kv_blocks_used: (i as u32 * 997) % 26_000,
                kv_blocks_total: 26_000,
            })
            .collect();
        Self {
            servers,
            ..Self::default()
        }
    }

    /// What `check` routes against: eight servers with some load, the prompt cached on
    /// three, prefill queued on two.
    pub fn eight() -> Self {
        let id = |i: usize| format!("gpu-{i}");
        Self {
            matches: vec![(id(1), 12), (id(4), 6), (id(6), 2)],
            backlog: vec![(id(1), 9_000), (id(2), 400)],
            ..Self::new(8, &[0, 1, 2, 3, 4])
        }
    }

    /// This fleet disaggregated: its servers decode servers, with `n` prefill servers
    /// `prefill-0`… beside them (idle, holding nothing).
    pub fn with_prefill(mut self, n: usize) -> Self {
        for server in &mut self.servers {
            server.role = PolicyRole::Decode;
        }
        self.prefill = (0..n)
            .map(|i| ServerView {
                id: format!("prefill-{i}"),
                role: PolicyRole::Prefill,
                healthy: true,
                weight: 1,
                in_flight: 0,
                waiting: 0,
                kv_blocks_used: 0,
                kv_blocks_total: 26_000,
            })
            .collect();
        self
    }

    /// The `i`-th synthetic request, with its own routing key: `prompt_tokens` tokens in
    /// `prefix_hashes` prefix hashes.
    pub fn request(i: u64, prefix_hashes: u64, prompt_tokens: u32) -> PolicyRequest {
        PolicyRequest {
            id: format!("req_synthetic{i}"),
            model: "check".into(),
            tier: "standard".into(),
            routing_key: i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5bd1_e995,
            prefix_hashes: (0..prefix_hashes).map(|h| h ^ i).collect(),
            prompt_tokens,
            max_tokens: 64,
            door: "messages",
            ..PolicyRequest::default()
        }
    }

    fn id(&self, key: u64) -> String {
        self.servers[(key % self.servers.len() as u64) as usize]
            .id
            .clone()
    }
}

impl RouterHost for SyntheticFleet {
    fn ring_lookup(&self, key: u64) -> Option<String> {
        (!self.servers.is_empty()).then(|| self.id(key))
    }
    fn ring_candidates(&self, key: u64, n: u32) -> Vec<String> {
        (0..u64::from(n).min(self.servers.len() as u64))
            .map(|i| self.id(key.wrapping_add(i)))
            .collect()
    }
    fn ring_lookup_bounded(&self, key: u64) -> Option<String> {
        // The first healthy server clockwise (the synthetic ring bounds no loads).
        (0..self.servers.len() as u64)
            .map(|i| self.id(key.wrapping_add(i)))
            .find(|id| self.routable(id))
    }
    fn servers(&self) -> Vec<ServerView> {
        self.servers.clone()
    }
    fn server(&self, id: &str) -> Option<ServerView> {
        self.servers.iter().find(|s| s.id == id).cloned()
    }
    fn prefix_matches(&self) -> Vec<(String, u32)> {
        self.matches
            .iter()
            .filter(|(id, _)| !self.is_prefill(id))
            .cloned()
            .collect()
    }
    fn prefill_backlog(&self) -> Vec<(String, u64)> {
        self.backlog
            .iter()
            .filter(|(id, _)| !self.is_prefill(id))
            .cloned()
            .collect()
    }
    fn prefill_servers(&self) -> Vec<ServerView> {
        self.prefill.clone()
    }
    fn prefill_prefix_matches(&self) -> Vec<(String, u32)> {
        self.matches
            .iter()
            .filter(|(id, _)| self.is_prefill(id))
            .cloned()
            .collect()
    }
    fn prefill_servers_backlog(&self) -> Vec<(String, u64)> {
        self.backlog
            .iter()
            .filter(|(id, _)| self.is_prefill(id))
            .cloned()
            .collect()
    }
    fn prefill_routable(&self, id: &str) -> bool {
        self.prefill.iter().any(|s| s.id == id && s.healthy)
    }
}

impl SyntheticFleet {
    fn is_prefill(&self, id: &str) -> bool {
        self.prefill.iter().any(|s| s.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_built_in_router_checks_and_a_non_component_says_why() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let scratch = std::env::temp_dir().join(format!("ringmaster-check-{}", std::process::id()));
        std::fs::create_dir_all(&scratch).unwrap();
        let component = root.join("policies/dist/prefix-affinity.wasm");
        if component.is_file() {
            let report = check(&component, &scratch).unwrap();
            assert_eq!(report.world, "router");
            assert!(report.call_median.is_some());
            // Not every call need answer in time on a busy machine; most do.
            assert!(report.faults.0 < CALLS / 2, "{:?}", report.faults);
            assert!(report.sample_answer.unwrap().starts_with("route to gpu-"));
        }
        let junk = scratch.join("junk.wasm");
        std::fs::write(&junk, b"not wasm").unwrap();
        assert!(check(&junk, &scratch).is_err());
        let _ = std::fs::remove_dir_all(&scratch);
    }
}
