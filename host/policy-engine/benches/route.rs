//! Per-decision cost of a router policy through the engine, beside the same component called
//! on bare wasmtime, so the engine's own overhead (pool, deadline, context, validation) shows
//! as a delta.
//!
//! Needs the built policies: `cargo xtask policies` writes `policies/dist/*.wasm`. A policy
//! that is missing is skipped with a note.
//!
//! - `native-ring`: the host's own bounded-load ring lookup, the decision policies replace.
//! - `engine`: [`RouterPolicy::route`] against a fake [`RouterHost`]: warm-instance pool, epoch
//!   deadline, memory limiter, scoped call context, answer validation.
//! - `bare`: `bindgen!` bindings, one instance kept in one store, imports answered by a plain
//!   struct, no deadline, no pool, no validation.
//! - `NAME@0.1.0`: the same router built against `ringmaster:policy@0.1.0` (the request record
//!   copied in whole, `src/tests/contract-0.1.0/`), through the engine: what 0.2.0's request
//!   resource saves on the same logic.
//! - `bare-epoch`: `bare` on an engine with epoch interruption on, so the engine's delta splits
//!   into the checks epoch interruption compiles into the guest and the engine's own work.
//!
//! Time is the benchmark thread's CPU time (`/proc/thread-self/schedstat`, where readable),
//! not wall time: on a shared 2-core machine wall time mostly measures the other processes.

use std::collections::{BTreeMap, HashSet};
use std::hint::black_box;
use std::path::PathBuf;

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use ringmaster_policy_engine::{
    EngineConfig, PolicyEngine, PolicyRequest, RouteDecision, RouterHost, RouterPolicy, ServerView,
};
use wasmtime::component::{Component, HasSelf, Linker, ResourceTable};
use wasmtime::{Engine, Store};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

mod bare {
    wasmtime::component::bindgen!({
        world: "router",
        path: "../../wit/policy.wit",
        with: {
            "ringmaster:policy/types.request": super::BareRequest,
        },
    });
}

use bare::ringmaster::policy as wit;
use wasmtime::component::Resource;

/// The bare host's request resource: a placeholder; getters read [`Bare::current`].
#[derive(Debug)]
pub struct BareRequest;

const POLICIES: [&str; 3] = ["consistent-hash", "cache-aware", "prefix-affinity"];
/// The same routers built against `ringmaster:policy@0.1.0` (the request copied in whole),
/// timed through the engine beside their 0.2.0 builds.
const POLICIES_0_1: [&str; 2] = ["consistent-hash", "prefix-affinity"];
const SERVER_COUNTS: [usize; 2] = [8, 64];
const PREFIX_HASHES: u64 = 32;
/// Requests cycled through, so keys (and answers) vary between iterations.
const REQUESTS: usize = 64;

fn dist_0_1(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("src/tests/contract-0.1.0/{name}.wasm"))
}

fn dist(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../../policies/dist/{name}.wasm"))
}

/// The cluster both hosts answer from: `n` servers, some load, a prefix match on three.
#[derive(Clone)]
struct Cluster {
    servers: Vec<ServerView>,
    healthy: HashSet<String>,
}

impl Cluster {
    fn new(n: usize) -> Self {
        let servers = (0..n)
            .map(|i| {
                let i32 = i as u32;
                ServerView {
                    id: format!("gpu-{i}"),
                    role: ringmaster_policy_engine::PolicyRole::Both,
                    healthy: true,
                    weight: 1,
                    in_flight: i32 % 7,
                    waiting: i32 % 3,
                    kv_blocks_used: (i32 * 997) % 26_000,
                    kv_blocks_total: 26_000,
                }
            })
            .collect::<Vec<_>>();
        let healthy = servers
            .iter()
            .filter(|s| s.healthy)
            .map(|s| s.id.clone())
            .collect();
        Self { servers, healthy }
    }

    fn at(&self, key: u64) -> &ServerView {
        &self.servers[(key % self.servers.len() as u64) as usize]
    }

    fn prefix_matches(&self) -> Vec<(String, u32)> {
        self.servers
            .iter()
            .take(3)
            .zip([24u32, 12, 3])
            .map(|(s, n)| (s.id.clone(), n))
            .collect()
    }

    fn prefill_backlog(&self) -> Vec<(String, u64)> {
        self.servers
            .iter()
            .skip(1)
            .take(4)
            .zip([8_000u64, 500, 30_000, 2_000])
            .map(|(s, n)| (s.id.clone(), n))
            .collect()
    }
}

impl RouterHost for Cluster {
    fn ring_lookup(&self, key: u64) -> Option<String> {
        Some(self.at(key).id.clone())
    }
    fn ring_candidates(&self, key: u64, n: u32) -> Vec<String> {
        (0..u64::from(n).min(self.servers.len() as u64))
            .map(|i| self.at(key.wrapping_add(i)).id.clone())
            .collect()
    }
    fn ring_lookup_bounded(&self, key: u64) -> Option<String> {
        self.ring_lookup(key)
    }
    fn servers(&self) -> Vec<ServerView> {
        self.servers.clone()
    }
    fn server(&self, id: &str) -> Option<ServerView> {
        self.servers.iter().find(|s| s.id == id).cloned()
    }
    fn prefix_matches(&self) -> Vec<(String, u32)> {
        Cluster::prefix_matches(self)
    }
    fn prefill_backlog(&self) -> Vec<(String, u64)> {
        Cluster::prefill_backlog(self)
    }
    fn routable(&self, id: &str) -> bool {
        self.healthy.contains(id)
    }
}

/// A ring of `n` servers with the same loads as [`Cluster::new`].
fn native_ring(n: usize) -> (ringmaster_ring::Ring, Vec<u64>) {
    let members = (0..n)
        .map(|i| ringmaster_ring::Member::new(format!("gpu-{i}"), 1))
        .collect();
    let ring =
        ringmaster_ring::Ring::new(members, ringmaster_ring::RingConfig::default()).expect("ring");
    let loads = (0..n as u64).map(|i| i % 7).collect();
    (ring, loads)
}

fn requests() -> Vec<PolicyRequest> {
    (0..REQUESTS as u64)
        .map(|i| {
            let key = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            PolicyRequest {
                id: format!("req_{i:08}"),
                model: "llama-3-8b".into(),
                tier: "standard".into(),
                session_id: Some(format!("session-{i}")),
                routing_key: key,
                prefix_hashes: (0..PREFIX_HASHES)
                    .map(|h| key ^ h.wrapping_mul(31))
                    .collect(),
                prompt_tokens: 512,
                max_tokens: 256,
                priority: 1,
                stream: true,
                headers: Vec::new(),
                door: "messages",
            }
        })
        .collect()
}

/// The bare host's store data: the cluster, the requests and which one is being decided,
/// a plain map for `state`, and an empty WASI context.
struct Bare {
    cluster: Cluster,
    requests: Vec<PolicyRequest>,
    current: usize,
    state: std::collections::HashMap<String, Vec<u8>>,
    wasi: WasiCtx,
    table: ResourceTable,
}

impl Bare {
    fn request(&self) -> &PolicyRequest {
        &self.requests[self.current]
    }
}

impl WasiView for Bare {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn server(s: &ServerView) -> wit::types::Server {
    wit::types::Server {
        id: s.id.clone(),
        role: wit::types::Role::Both,
        healthy: s.healthy,
        weight: s.weight,
        in_flight: s.in_flight,
        waiting: s.waiting,
        kv_blocks_used: s.kv_blocks_used,
        kv_blocks_total: s.kv_blocks_total,
    }
}

impl wit::types::Host for Bare {}

impl wit::types::HostRequest for Bare {
    fn id(&mut self, _: Resource<BareRequest>) -> String {
        self.request().id.clone()
    }
    fn model(&mut self, _: Resource<BareRequest>) -> String {
        self.request().model.clone()
    }
    fn tier(&mut self, _: Resource<BareRequest>) -> String {
        self.request().tier.clone()
    }
    fn session_id(&mut self, _: Resource<BareRequest>) -> Option<String> {
        self.request().session_id.clone()
    }
    fn routing_key(&mut self, _: Resource<BareRequest>) -> u64 {
        self.request().routing_key
    }
    fn prefix_hash_count(&mut self, _: Resource<BareRequest>) -> u32 {
        self.request().prefix_hashes.len() as u32
    }
    fn prefix_hashes(&mut self, _: Resource<BareRequest>, start: u32, max: u32) -> Vec<u64> {
        let hashes = &self.request().prefix_hashes;
        let start = (start as usize).min(hashes.len());
        let end = start.saturating_add(max as usize).min(hashes.len());
        hashes[start..end].to_vec()
    }
    fn prompt_tokens(&mut self, _: Resource<BareRequest>) -> u32 {
        self.request().prompt_tokens
    }
    fn max_tokens(&mut self, _: Resource<BareRequest>) -> u32 {
        self.request().max_tokens
    }
    fn priority(&mut self, _: Resource<BareRequest>) -> u8 {
        self.request().priority
    }
    fn stream(&mut self, _: Resource<BareRequest>) -> bool {
        self.request().stream
    }
    fn header(&mut self, _: Resource<BareRequest>, _name: String) -> Option<String> {
        None
    }
    fn headers(&mut self, _: Resource<BareRequest>) -> Vec<(String, String)> {
        Vec::new()
    }
    fn door(&mut self, _: Resource<BareRequest>) -> String {
        self.request().door.to_owned()
    }
    fn drop(&mut self, _: Resource<BareRequest>) -> wasmtime::Result<()> {
        Ok(())
    }
}

impl wit::state::Host for Bare {
    fn get(&mut self, key: String) -> Option<Vec<u8>> {
        self.state.get(&key).cloned()
    }
    fn set(&mut self, key: String, value: Vec<u8>) -> bool {
        self.state.insert(key, value);
        true
    }
    fn remove(&mut self, key: String) -> bool {
        self.state.remove(&key).is_some()
    }
    fn add(&mut self, key: String, delta: i64) -> i64 {
        let entry = self.state.entry(key).or_insert_with(|| vec![0; 8]);
        let old = <[u8; 8]>::try_from(entry.as_slice()).map_or(0, i64::from_le_bytes);
        let new = old.wrapping_add(delta);
        *entry = new.to_le_bytes().to_vec();
        new
    }
    fn usage(&mut self) -> wit::state::Fill {
        wit::state::Fill {
            entries: self.state.len() as u32,
            bytes: 0,
            max_entries: u32::MAX,
            max_bytes: u64::MAX,
        }
    }
}

impl wit::ring::Host for Bare {
    fn lookup(&mut self, key: u64) -> Option<String> {
        self.cluster.ring_lookup(key)
    }
    fn candidates(&mut self, key: u64, n: u32) -> Vec<String> {
        self.cluster.ring_candidates(key, n)
    }
    fn lookup_bounded(&mut self, key: u64) -> Option<String> {
        self.cluster.ring_lookup_bounded(key)
    }
}

impl wit::cluster::Host for Bare {
    fn servers(&mut self) -> Vec<wit::types::Server> {
        self.cluster.servers.iter().map(server).collect()
    }
    fn prefill_servers(&mut self) -> Vec<wit::types::Server> {
        Vec::new()
    }
    fn get(&mut self, id: String) -> Option<wit::types::Server> {
        self.cluster.servers.iter().find(|s| s.id == id).map(server)
    }
    fn prefix_matches(&mut self) -> Vec<(String, u32)> {
        self.cluster.prefix_matches()
    }
    fn prefill_backlog(&mut self) -> Vec<(String, u64)> {
        self.cluster.prefill_backlog()
    }
    fn adapters(&mut self) -> Vec<(String, Vec<String>)> {
        Vec::new()
    }
}

impl wit::log::Host for Bare {
    fn write(&mut self, _level: wit::log::Level, _message: String) {}
}

impl wit::metrics::Host for Bare {
    fn counter_add(&mut self, _name: String, _value: u64) {}
}

impl wit::config::Host for Bare {
    fn get(&mut self, _key: String) -> Option<String> {
        None
    }
    fn entries(&mut self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// One bare call: point the host at request `i` and lend the guest the request.
fn bare_call(
    store: &mut Store<Bare>,
    router: &bare::Router,
    i: usize,
) -> wasmtime::Result<bare::Decision> {
    store.data_mut().current = i;
    router.call_route(&mut *store, Resource::new_borrow(0))
}

/// The benchmark thread's CPU time in nanoseconds, or wall time where the kernel does not say.
struct ThreadCpu {
    wall: WallTime,
    cpu: bool,
}

impl Default for ThreadCpu {
    fn default() -> Self {
        let cpu = thread_cpu_ns().is_some();
        if !cpu {
            eprintln!("note: no /proc/thread-self/schedstat: measuring wall time");
        }
        Self {
            wall: WallTime,
            cpu,
        }
    }
}

fn thread_cpu_ns() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok()
}

impl Measurement for ThreadCpu {
    type Intermediate = (Option<u64>, std::time::Instant);
    type Value = f64;

    fn start(&self) -> Self::Intermediate {
        (
            self.cpu.then(thread_cpu_ns).flatten(),
            std::time::Instant::now(),
        )
    }
    fn end(&self, (cpu, wall): Self::Intermediate) -> f64 {
        match (cpu, self.cpu.then(thread_cpu_ns).flatten()) {
            (Some(start), Some(end)) => end.saturating_sub(start) as f64,
            _ => wall.elapsed().as_nanos() as f64,
        }
    }
    fn add(&self, a: &f64, b: &f64) -> f64 {
        a + b
    }
    fn zero(&self) -> f64 {
        0.0
    }
    fn to_f64(&self, value: &f64) -> f64 {
        *value
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        self.wall.formatter()
    }
}

fn bench_route(c: &mut Criterion<ThreadCpu>) {
    let engine = PolicyEngine::new(EngineConfig::default()).expect("policy engine");
    // `bare`: wasmtime's defaults. `bare-epoch`: the same plus epoch interruption (the checks
    // it compiles into the guest), so the engine's delta splits into that and its own work.
    let bare_engines: Vec<(&str, Engine)> = vec![
        ("bare", Engine::default()),
        (
            "bare-epoch",
            Engine::new(wasmtime::Config::new().epoch_interruption(true)).expect("engine"),
        ),
    ];
    let requests = requests();

    let mut group = c.benchmark_group("route");
    // Equal samples, each long enough for the scheduler's CPU-time accounting (updated at
    // ticks and context switches) to be accurate.
    group.sampling_mode(SamplingMode::Flat);
    // The native decision the policies are measured against: the host's own bounded-load
    // ring lookup (what the gateway does with no policy, and on a fault).
    for n in SERVER_COUNTS {
        let (ring, loads) = native_ring(n);
        let mut i = 0;
        group.bench_function(format!("native-ring/{n}-servers"), |b| {
            b.iter(|| {
                i = (i + 1) % REQUESTS;
                ring.lookup_bounded(black_box(requests[i].routing_key), &loads)
                    .expect("lookup")
            })
        });
    }
    for policy in POLICIES {
        let Ok(bytes) = std::fs::read(dist(policy)) else {
            eprintln!(
                "skipping {policy}: {} is missing (run `cargo xtask policies`)",
                dist(policy).display()
            );
            continue;
        };
        let loaded = engine
            .load_router(policy, &bytes, BTreeMap::new())
            .expect("load through the engine");
        // Its 0.1.0 build, where there is one.
        let old = POLICIES_0_1
            .contains(&policy)
            .then(|| std::fs::read(dist_0_1(policy)).ok())
            .flatten()
            .map(|bytes| {
                engine
                    .load_router(&format!("{policy}@0.1.0"), &bytes, BTreeMap::new())
                    .expect("a 0.1.0 build loads")
            });
        for n in SERVER_COUNTS {
            let cluster = Cluster::new(n);
            if let Some(old) = &old {
                let mut i = 0;
                group.bench_function(format!("{policy}@0.1.0/{n}-servers/engine"), |b| {
                    b.iter(|| {
                        i = (i + 1) % REQUESTS;
                        old.route(&cluster, black_box(&requests[i]))
                    })
                });
            }

            for request in &requests {
                let decision = loaded.route(&cluster, request);
                assert!(
                    matches!(decision, Ok(RouteDecision::Route(_))),
                    "{decision:?}"
                );
            }
            let before = loaded.faults();
            let mut i = 0;
            group.bench_function(format!("{policy}/{n}-servers/engine"), |b| {
                b.iter(|| {
                    i = (i + 1) % REQUESTS;
                    // Not asserted: a call descheduled past the 5 ms deadline on a busy
                    // machine faults (the gateway would fall back). Faults are reported below.
                    loaded.route(&cluster, black_box(&requests[i]))
                })
            });
            let faults = loaded.faults().total() - before.total();
            if faults > 0 {
                eprintln!("{policy}/{n}-servers/engine: {faults} calls faulted during the run");
            }

            let mut bares: Vec<(&str, Store<Bare>, bare::Router)> = bare_engines
                .iter()
                .map(|(label, bare_engine)| {
                    let mut linker: Linker<Bare> = Linker::new(bare_engine);
                    wasmtime_wasi::p2::add_to_linker_sync(&mut linker).expect("wasi");
                    bare::Router::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
                        .expect("router imports");
                    let component = Component::new(bare_engine, &bytes).expect("compile");
                    let mut store = Store::new(
                        bare_engine,
                        Bare {
                            cluster: cluster.clone(),
                            requests: requests.clone(),
                            current: 0,
                            state: Default::default(),
                            wasi: WasiCtx::builder().build(),
                            table: ResourceTable::new(),
                        },
                    );
                    store.set_epoch_deadline(u64::MAX / 2);
                    let router = bare::Router::instantiate(&mut store, &component, &linker)
                        .expect("instantiate");
                    (*label, store, router)
                })
                .collect();
            for (label, store, router) in &mut bares {
                let mut i = 0;
                group.bench_function(format!("{policy}/{n}-servers/{label}"), |b| {
                    b.iter(|| {
                        i = (i + 1) % REQUESTS;
                        bare_call(store, router, black_box(i)).expect("bare call")
                    })
                });
            }
            interleaved(
                &format!("{policy}/{n}-servers"),
                &loaded,
                old.as_ref(),
                &cluster,
                &requests,
                &mut bares,
            );
        }
    }
    group.finish();
}

/// The same comparison with the variants interleaved in short blocks, so that whatever else
/// the machine is doing hits them alike: the median per-call time of each, over
/// [`INTERLEAVED_ROUNDS`] rounds of [`INTERLEAVED_BLOCK`] calls.
fn interleaved(
    name: &str,
    engine: &RouterPolicy,
    old: Option<&RouterPolicy>,
    cluster: &Cluster,
    requests: &[PolicyRequest],
    bares: &mut [(&str, Store<Bare>, bare::Router)],
) {
    let (ring, loads) = native_ring(cluster.servers.len());
    let mut native_ns = Vec::with_capacity(INTERLEAVED_ROUNDS);
    let mut engine_ns = Vec::with_capacity(INTERLEAVED_ROUNDS);
    let mut old_ns = Vec::with_capacity(INTERLEAVED_ROUNDS);
    let mut bare_ns: Vec<Vec<f64>> = vec![Vec::with_capacity(INTERLEAVED_ROUNDS); bares.len()];
    let time = |f: &mut dyn FnMut(usize)| {
        let started = std::time::Instant::now();
        for i in 0..INTERLEAVED_BLOCK {
            f(i % REQUESTS);
        }
        started.elapsed().as_nanos() as f64 / INTERLEAVED_BLOCK as f64
    };
    for _ in 0..INTERLEAVED_ROUNDS {
        native_ns.push(time(&mut |i| {
            let _ = black_box(ring.lookup_bounded(black_box(requests[i].routing_key), &loads));
        }));
        engine_ns.push(time(&mut |i| {
            let _ = black_box(engine.route(cluster, black_box(&requests[i])));
        }));
        if let Some(old) = old {
            old_ns.push(time(&mut |i| {
                let _ = black_box(old.route(cluster, black_box(&requests[i])));
            }));
        }
        for ((_, store, router), ns) in bares.iter_mut().zip(&mut bare_ns) {
            ns.push(time(&mut |i| {
                black_box(bare_call(store, router, black_box(i)).ok());
            }));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut line = format!(
        "interleaved {name}: native ring {:.0} ns, engine {:.0} ns",
        median(&mut native_ns),
        median(&mut engine_ns)
    );
    if !old_ns.is_empty() {
        line.push_str(&format!(", engine@0.1.0 {:.0} ns", median(&mut old_ns)));
    }
    for ((label, _, _), ns) in bares.iter().zip(&mut bare_ns) {
        line.push_str(&format!(", {label} {:.0} ns", median(ns)));
    }
    eprintln!("{line}");
}

/// Rounds of the interleaved comparison.
const INTERLEAVED_ROUNDS: usize = 200;
/// Calls per variant per round.
const INTERLEAVED_BLOCK: usize = 300;

/// Time to load a version (what a swap costs before it is published): compile, check the
/// world, pre-instantiate, instantiate once, and the probe calls. Wall time: compilation runs
/// on several threads. `cold`: no compilation cache; `cached`: the on-disk cache holds it.
fn bench_load(c: &mut Criterion<WallTime>) {
    let cache = std::env::temp_dir().join(format!("ringmaster-bench-cache-{}", std::process::id()));
    let cold = PolicyEngine::new(EngineConfig::default()).expect("policy engine");
    let cached = PolicyEngine::new(EngineConfig {
        cache_dir: Some(cache.clone()),
        ..EngineConfig::default()
    })
    .expect("policy engine");
    let mut group = c.benchmark_group("load");
    group.sample_size(10);
    for name in POLICIES {
        let Ok(bytes) = std::fs::read(dist(name)) else {
            eprintln!("skipping load/{name}: run `cargo xtask policies` first");
            continue;
        };
        for (label, engine) in [("cold", &cold), ("cached", &cached)] {
            // Fill the cache before measuring `cached`.
            engine
                .load_router(name, &bytes, BTreeMap::new())
                .expect("loads");
            group.bench_function(format!("{name}/{label}"), |b| {
                b.iter(|| {
                    black_box(
                        engine
                            .load_router(name, &bytes, BTreeMap::new())
                            .expect("loads"),
                    )
                })
            });
        }
    }
    group.finish();
    let _ = std::fs::remove_dir_all(cache);
}

criterion_group! {
    name = benches;
    config = Criterion::default().with_measurement(ThreadCpu::default());
    targets = bench_route
}
criterion_group! {
    name = loads;
    config = Criterion::default();
    targets = bench_load
}
criterion_main!(benches, loads);
