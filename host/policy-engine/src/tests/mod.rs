//! Tests of the engine: loading, routing, the sandbox's limits and fault handling.
//!
//! Most run against small components written in component text ([`components`]), so they need
//! no guest toolchain. The `fixture_*` tests run the built policies and fixtures in
//! `policies/dist` (`cargo xtask policies`); when those are missing they are skipped with a
//! note, unless `RINGMASTER_REQUIRE_POLICIES` is set, which makes a missing one a failure.

mod components;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use components::Router;

use crate::policy::Probe;
use crate::*;

/// The tests' engine settings: a deadline generous enough that a test thread descheduled on a
/// busy machine is not mistaken for a runaway policy. Tests of the deadline set their own.
fn config() -> EngineConfig {
    EngineConfig {
        max_instances: 32,
        call_deadline: Duration::from_secs(2),
        ..EngineConfig::default()
    }
}

/// A deadline short enough for a test to wait it out, long enough not to fire on a busy
/// machine by accident.
const TEST_DEADLINE: Duration = Duration::from_millis(50);

fn engine() -> PolicyEngine {
    PolicyEngine::new(config()).expect("engine")
}

fn no_config() -> BTreeMap<String, String> {
    BTreeMap::new()
}

/// A cluster answering like the gateway's: the ring maps a key to `servers[key % n]`.
///
/// `ring.lookup-bounded` answers the *next* server (`servers[(key + 1) % n]`), so a test can
/// tell which of the two a policy asked.
#[derive(Debug, Clone)]
struct FakeHost {
    servers: Vec<ServerView>,
    /// Prefill servers beside them (a 0.3.0 router sees them).
    prefill: Vec<ServerView>,
    prefix_matches: Vec<(String, u32)>,
    prefill_backlog: Vec<(String, u64)>,
    /// How long answering `prefix-matches` takes (the host's matching of a long prompt).
    prefix_delay: Duration,
}

impl FakeHost {
    fn new(ids: &[&str]) -> Self {
        Self {
            servers: ids
                .iter()
                .map(|id| ServerView {
                    id: (*id).to_owned(),
                    healthy: true,
                    weight: 1,
                    kv_blocks_total: 1000,
                    ..ServerView::default()
                })
                .collect(),
            prefill: Vec::new(),
            prefix_matches: Vec::new(),
            prefill_backlog: Vec::new(),
            prefix_delay: Duration::ZERO,
        }
    }

    /// These servers as decode servers, with prefill servers `ids` beside them.
    fn with_prefill(mut self, ids: &[&str]) -> Self {
        for server in &mut self.servers {
            server.role = PolicyRole::Decode;
        }
        self.prefill = ids
            .iter()
            .map(|id| ServerView {
                id: (*id).to_owned(),
                role: PolicyRole::Prefill,
                healthy: true,
                weight: 1,
                kv_blocks_total: 1000,
                ..ServerView::default()
            })
            .collect();
        self
    }

    fn eight() -> Self {
        Self::new(&["s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7"])
    }

    fn owner(&self, key: u64) -> &str {
        &self.servers[(key % self.servers.len() as u64) as usize].id
    }
}

impl RouterHost for FakeHost {
    fn ring_lookup(&self, key: u64) -> Option<String> {
        (!self.servers.is_empty()).then(|| self.owner(key).to_owned())
    }
    fn ring_candidates(&self, key: u64, n: u32) -> Vec<String> {
        (0..u64::from(n).min(self.servers.len() as u64))
            .map(|i| self.owner(key.wrapping_add(i)).to_owned())
            .collect()
    }
    fn ring_lookup_bounded(&self, key: u64) -> Option<String> {
        self.ring_lookup(key.wrapping_add(1))
    }
    fn servers(&self) -> Vec<ServerView> {
        self.servers.clone()
    }
    fn server(&self, id: &str) -> Option<ServerView> {
        self.servers.iter().find(|s| s.id == id).cloned()
    }
    fn prefix_matches(&self) -> Vec<(String, u32)> {
        std::thread::sleep(self.prefix_delay);
        self.prefix_matches.clone()
    }
    fn prefill_backlog(&self) -> Vec<(String, u64)> {
        self.prefill_backlog.clone()
    }
    fn prefill_servers(&self) -> Vec<ServerView> {
        self.prefill.clone()
    }
    fn prefill_routable(&self, id: &str) -> bool {
        self.prefill.iter().any(|s| s.id == id && s.healthy)
    }
}

fn request(key: u64) -> PolicyRequest {
    PolicyRequest {
        id: format!("req_{key:x}"),
        model: "m".into(),
        tier: "standard".into(),
        routing_key: key,
        prefix_hashes: vec![key, key ^ 1, key ^ 2],
        prompt_tokens: 100,
        max_tokens: 50,
        priority: 3,
        ..PolicyRequest::default()
    }
}

/// Asserts the engine still loads and runs a good policy.
fn assert_engine_works(engine: &PolicyEngine) {
    let policy = engine
        .load_router(
            "still-works",
            &components::router(Router::Lookup),
            no_config(),
        )
        .expect("a good policy still loads");
    let host = FakeHost::eight();
    assert_eq!(
        policy.route(&host, &request(5)).unwrap(),
        RouteDecision::Route("s5".into())
    );
}

fn message(err: &PolicyError) -> String {
    err.to_string()
}

#[test]
fn routes_by_the_ring_and_counts_only_real_calls() {
    let engine = engine();
    let policy = engine
        .load_router("lookup", &components::router(Router::Lookup), no_config())
        .unwrap();
    let host = FakeHost::eight();
    for key in 0..50u64 {
        let decision = policy.route(&host, &request(key)).unwrap();
        assert_eq!(
            decision,
            RouteDecision::Route(host.owner(key).to_owned()),
            "key {key}"
        );
    }
    let empty = FakeHost::new(&[]);
    assert_eq!(
        policy.route(&empty, &request(1)).unwrap(),
        RouteDecision::Reject("empty ring".into())
    );
    assert_eq!(policy.faults(), FaultCounts::default());
    // The probe calls at load time did not count.
    assert_eq!(
        engine.policy_counters(),
        vec![("lookup".to_owned(), "routed_total".to_owned(), 51)]
    );
    let info = policy.info();
    assert_eq!(info.name, "lookup");
    assert_eq!(info.hash.len(), 32);
    assert_eq!(info.size, components::router(Router::Lookup).len());
    assert!(format!("{policy:?}").contains("lookup"));
}

#[test]
fn config_is_served_and_answers_are_checked() {
    let engine = engine();
    let pin = |server: &str| BTreeMap::from([("pin".to_owned(), server.to_owned())]);
    let bytes = components::router(Router::Lookup);

    // A pin to a server that exists in the probe cluster passes the probes.
    let policy = engine
        .load_router("pinned", &bytes, pin("probe-2"))
        .unwrap();
    let host = FakeHost::new(&["probe-1", "probe-2"]);
    assert_eq!(
        policy.route(&host, &request(1)).unwrap(),
        RouteDecision::Route("probe-2".into())
    );

    // A pin to a server the probe cluster lacks fails them, naming the answer.
    let err = engine.load_router("pinned", &bytes, pin("s9")).unwrap_err();
    assert!(matches!(err, PolicyError::ProbeFailed(_)), "{err:?}");
    assert!(
        message(&err).contains("\"s9\"") && message(&err).contains("invalid-answer"),
        "{err}"
    );

    // Loaded anyway (probes skipped), its answers are checked against the live pool.
    let policy = engine
        .load_router_with("pinned", &bytes, pin("s2"), Probe::Skip)
        .unwrap();
    assert_eq!(
        policy.route(&FakeHost::eight(), &request(1)).unwrap(),
        RouteDecision::Route("s2".into())
    );
    let mut drained = FakeHost::eight();
    drained.servers[2].healthy = false;
    let fault = policy.route(&drained, &request(1)).unwrap_err();
    assert!(matches!(fault, PolicyFault::InvalidAnswer(_)), "{fault:?}");
    assert_eq!(fault.kind(), "invalid-answer");
    assert_eq!(policy.faults().invalid_answer, 1);
    // An invalid answer does not poison the instance.
    assert!(policy.route(&FakeHost::eight(), &request(1)).is_ok());
}

#[test]
fn refuses_bytes_that_are_not_a_component() {
    let engine = engine();
    for bytes in [
        &b""[..],
        b"hello, world",
        b"\0asm\x01\0\0\0",
        b"\0asm\x02\0\0\0",
    ] {
        let err = engine.load_router("junk", bytes, no_config()).unwrap_err();
        assert!(matches!(err, PolicyError::NotAComponent(_)), "{err:?}");
        assert!(message(&err).contains("`junk`"), "{err}");
    }
    let err = engine
        .load_router("core", b"\0asm\x01\0\0\0", no_config())
        .unwrap_err();
    assert!(message(&err).contains("core WebAssembly module"), "{err}");
    // A component header followed by garbage fails to compile.
    let err = engine
        .load_router("garbage", b"\0asm\x0d\0\x01\0garbage", no_config())
        .unwrap_err();
    assert!(matches!(err, PolicyError::Compile(_)), "{err:?}");
    assert_engine_works(&engine);
}

#[test]
fn refuses_invalid_config() {
    for config in [
        EngineConfig {
            call_deadline: Duration::ZERO,
            ..config()
        },
        EngineConfig {
            epoch_tick: Duration::from_secs(3),
            ..config()
        },
        EngineConfig {
            instantiate_deadline: Duration::from_micros(500),
            ..config()
        },
        EngineConfig {
            memory_limit_bytes: 100,
            ..config()
        },
        EngineConfig {
            max_instances: 0,
            ..config()
        },
        EngineConfig {
            fuel: Some(0),
            ..config()
        },
    ] {
        let err = PolicyEngine::new(config).unwrap_err();
        assert!(matches!(err, PolicyError::Engine(_)), "{err:?}");
    }
}

#[test]
fn refuses_a_component_for_another_world() {
    let engine = engine();
    let err = engine
        .load_router("filter", &components::safety(), no_config())
        .unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err:?}");
    let text = message(&err);
    assert!(
        text.contains("`route`") && text.contains("safety-filter policy"),
        "{text}"
    );

    let err = engine
        .load_safety("router", &components::router(Router::Lookup), no_config())
        .unwrap_err();
    assert!(
        message(&err).contains("`check-input`") && message(&err).contains("router policy"),
        "{err}"
    );

    let err = engine
        .load_router("admission", &components::admission(), no_config())
        .unwrap_err();
    assert!(message(&err).contains("admission policy"), "{err}");

    let err = engine
        .load_admission("router", &components::router(Router::Lookup), no_config())
        .unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err:?}");

    let err = engine
        .load_router(
            "mistyped",
            &components::route_with_the_wrong_type(),
            no_config(),
        )
        .unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err:?}");
    assert!(message(&err).contains("wrong type"), "{err}");
    assert_engine_works(&engine);
}

#[test]
fn refuses_imports_the_host_does_not_grant() {
    let engine = engine();
    let secrets = r#"(import "ringmaster:policy/secrets@0.1.0" (instance
        (export "get" (func (result string)))))"#;
    let err = engine
        .load_router(
            "nosy",
            &components::router(Router::ExtraImport(secrets)),
            no_config(),
        )
        .unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err:?}");
    assert!(
        message(&err).contains("`ringmaster:policy/secrets@0.1.0`"),
        "{err}"
    );

    // WASI outside 0.2's core interfaces is refused by the linker, which names it.
    let http = r#"(import "wasi:http/outgoing-handler@0.2.0" (instance
        (export "handle" (func))))"#;
    let err = engine
        .load_router(
            "online",
            &components::router(Router::ExtraImport(http)),
            no_config(),
        )
        .unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err:?}");
    assert!(
        message(&err).contains("wasi:http/outgoing-handler@0.2.0"),
        "{err}"
    );

    // A ring import is not granted to a safety filter.
    let err = engine
        .load_safety("router", &components::router(Router::Lookup), no_config())
        .unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err:?}");

    // WASI 0.2 itself is linked (with nothing granted): a policy may import it.
    let random = r#"(import "wasi:random/random@0.2.0" (instance
        (export "get-random-u64" (func (result u64)))))"#;
    engine
        .load_router(
            "random",
            &components::router(Router::ExtraImport(random)),
            no_config(),
        )
        .expect("WASI 0.2 imports link");
    assert_engine_works(&engine);
}

#[test]
fn a_trap_at_start_fails_the_load() {
    let engine = engine();
    let err = engine
        .load_router(
            "trap-on-start",
            &components::router(Router::TrapOnStart),
            no_config(),
        )
        .unwrap_err();
    assert!(matches!(err, PolicyError::Instantiate(_)), "{err:?}");
    assert!(message(&err).contains("trap"), "{err}");
    assert_engine_works(&engine);
}

#[test]
fn a_trap_drops_the_instance_and_the_next_call_works() {
    let engine = engine();
    let policy = engine
        .load_router("flaky", &components::router(Router::Lookup), no_config())
        .unwrap();
    let host = FakeHost::eight();
    for round in 0..5u64 {
        let fault = policy.route(&host, &request(0xdead)).unwrap_err();
        assert!(
            matches!(&fault, PolicyFault::Trap(m) if !m.contains("cannot enter")),
            "{fault:?}"
        );
        assert_eq!(fault.kind(), "trap");
        let key = round * 7 + 1;
        assert_eq!(
            policy.route(&host, &request(key)).unwrap(),
            RouteDecision::Route(host.owner(key).to_owned())
        );
    }
    assert_eq!(
        policy.faults(),
        FaultCounts {
            trap: 5,
            ..FaultCounts::default()
        }
    );
}

#[test]
fn a_policy_that_always_panics() {
    let engine = engine();
    let bytes = components::router(Router::Panics);
    let err = engine
        .load_router("panics", &bytes, no_config())
        .unwrap_err();
    assert!(matches!(err, PolicyError::ProbeFailed(_)), "{err:?}");
    assert!(message(&err).contains("trap"), "{err}");

    let policy = engine
        .load_router_with("panics", &bytes, no_config(), Probe::Skip)
        .unwrap();
    let host = FakeHost::eight();
    for _ in 0..3 {
        let fault = policy.route(&host, &request(1)).unwrap_err();
        assert!(
            matches!(&fault, PolicyFault::Trap(m) if !m.contains("cannot enter")),
            "{fault:?}"
        );
    }
    assert_eq!(policy.faults().trap, 3);
    assert_engine_works(&engine);
}

#[test]
fn nonsense_answers_fail_the_probe_and_count() {
    let engine = engine();
    let bytes = components::router(Router::Nonsense);
    let err = engine
        .load_router("nonsense", &bytes, no_config())
        .unwrap_err();
    assert!(matches!(err, PolicyError::ProbeFailed(_)), "{err:?}");
    assert!(message(&err).contains("no-such-server"), "{err}");

    let policy = engine
        .load_router_with("nonsense", &bytes, no_config(), Probe::Skip)
        .unwrap();
    for _ in 0..2 {
        let fault = policy.route(&FakeHost::eight(), &request(1)).unwrap_err();
        assert!(
            matches!(&fault, PolicyFault::InvalidAnswer(m) if m.contains("no-such-server")),
            "{fault:?}"
        );
    }
    assert_eq!(policy.faults().invalid_answer, 2);
}

#[test]
fn an_endless_loop_hits_the_deadline() {
    let engine = PolicyEngine::new(EngineConfig {
        call_deadline: TEST_DEADLINE,
        ..config()
    })
    .unwrap();
    let bytes = components::router(Router::LoopForever);
    let err = engine.load_router("loop", &bytes, no_config()).unwrap_err();
    assert!(matches!(err, PolicyError::ProbeFailed(_)), "{err:?}");
    assert!(message(&err).contains("deadline"), "{err}");

    let policy = engine
        .load_router_with("loop", &bytes, no_config(), Probe::Skip)
        .unwrap();
    for _ in 0..3 {
        let started = Instant::now();
        let fault = policy.route(&FakeHost::eight(), &request(1)).unwrap_err();
        let took = started.elapsed();
        assert_eq!(fault, PolicyFault::Deadline);
        assert!(
            took >= Duration::from_millis(4),
            "stopped too early: {took:?}"
        );
        // 5 ms deadline + one 1 ms tick; generous for a loaded CI machine.
        assert!(
            took < Duration::from_millis(500),
            "stopped too late: {took:?}"
        );
    }
    assert_eq!(policy.faults().deadline, 3);
    assert_engine_works(&engine);
}

#[test]
fn fuel_makes_the_deadline_deterministic() {
    let engine = PolicyEngine::new(EngineConfig {
        fuel: Some(2_000_000),
        ..config()
    })
    .unwrap();
    let err = engine
        .load_router(
            "loop",
            &components::router(Router::LoopForever),
            no_config(),
        )
        .unwrap_err();
    assert!(message(&err).contains("fuel"), "{err}");
    let policy = engine
        .load_router_with(
            "loop",
            &components::router(Router::LoopForever),
            no_config(),
            Probe::Skip,
        )
        .unwrap();
    for _ in 0..3 {
        assert_eq!(
            policy.route(&FakeHost::eight(), &request(1)),
            Err(PolicyFault::Deadline)
        );
    }
    assert_eq!(policy.faults().deadline, 3);
    // A well-behaved policy runs within the same budget.
    assert_engine_works(&engine);
}

#[test]
fn memory_is_capped() {
    let engine = PolicyEngine::new(EngineConfig {
        memory_limit_bytes: 2 * 1024 * 1024,
        ..config()
    })
    .unwrap();
    let bytes = components::router(Router::AllocForever);
    let err = engine.load_router("hog", &bytes, no_config()).unwrap_err();
    assert!(matches!(err, PolicyError::ProbeFailed(_)), "{err:?}");
    assert!(message(&err).contains("memory"), "{err}");

    let policy = engine
        .load_router_with("hog", &bytes, no_config(), Probe::Skip)
        .unwrap();
    for _ in 0..2 {
        assert_eq!(
            policy.route(&FakeHost::eight(), &request(1)),
            Err(PolicyFault::OutOfMemory)
        );
    }
    assert_eq!(policy.faults().memory, 2);
    assert_engine_works(&engine);
}

#[test]
fn a_fresh_instance_is_made_when_the_pool_is_empty() {
    let engine = engine();
    let policy = engine
        .load_router("lookup", &components::router(Router::Lookup), no_config())
        .unwrap();
    assert_eq!(policy.core().drain(), 1);
    let host = FakeHost::eight();
    assert_eq!(
        policy.route(&host, &request(3)).unwrap(),
        RouteDecision::Route("s3".into())
    );
}

#[test]
fn calls_from_many_threads() {
    let engine = engine();
    let policy = engine
        .load_router("lookup", &components::router(Router::Lookup), no_config())
        .unwrap();
    let host = FakeHost::eight();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (policy, host) = (policy.clone(), &host);
            scope.spawn(move || {
                for i in 0..200u64 {
                    let key = t * 1000 + i;
                    assert_eq!(
                        policy.route(host, &request(key)).unwrap(),
                        RouteDecision::Route(host.owner(key).to_owned())
                    );
                }
            });
        }
    });
    assert_eq!(policy.faults(), FaultCounts::default());
}

#[test]
fn admission_verdicts() {
    let engine = engine();
    let policy = engine
        .load_admission("fifo", &components::admission(), no_config())
        .unwrap();
    let host = FakeHost::eight();
    let load = |queued, servers| AdmissionLoad {
        in_flight: 10,
        queued,
        queue_capacity: 8,
        servers,
    };
    assert_eq!(
        policy.admit(&host, &request(1), &load(0, 8)).unwrap(),
        AdmissionVerdict::Accept(3)
    );
    assert_eq!(
        policy.admit(&host, &request(1), &load(2, 0)).unwrap(),
        AdmissionVerdict::Queue
    );
    assert_eq!(
        policy.admit(&host, &request(1), &load(8, 8)).unwrap(),
        AdmissionVerdict::Reject {
            reason: "queue full".into(),
            retry_after_ms: 250
        }
    );
    assert_eq!(policy.faults(), FaultCounts::default());
}

#[test]
fn safety_verdicts_and_traps() {
    let engine = engine();
    let policy = engine
        .load_safety("shouting", &components::safety(), no_config())
        .unwrap();
    assert_eq!(policy.check_input("hello").unwrap(), SafetyVerdict::Allow);
    assert_eq!(
        policy.check_input("!hello").unwrap(),
        SafetyVerdict::Block("shouting".into())
    );
    assert_eq!(
        policy.check_output("!x", false).unwrap(),
        SafetyVerdict::Block("shouting".into())
    );
    assert!(matches!(
        policy.check_output("#boom", true),
        Err(PolicyFault::Trap(_))
    ));
    assert_eq!(
        policy.check_output("fine", true).unwrap(),
        SafetyVerdict::Allow
    );
    assert_eq!(policy.faults().trap, 1);
}

/// A fresh, empty directory under the system's temporary directory.
fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ringmaster-policy-{tag}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn count_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let path = e.path();
                    if path.is_dir() { count_files(&path) } else { 1 }
                })
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn compiled_components_are_cached_on_disk() {
    let dir = temp_dir("cache");
    let config = EngineConfig {
        cache_dir: Some(dir.clone()),
        ..config()
    };
    let bytes = components::router(Router::Lookup);
    let first = PolicyEngine::new(config.clone()).unwrap();
    first.load_router("lookup", &bytes, no_config()).unwrap();
    assert_eq!(first.cache_stats(), Some(CacheStats { hits: 0, misses: 1 }));
    assert!(count_files(&dir) >= 1, "the cache directory got no files");

    // A second engine with the same settings loads it from disk.
    let second = PolicyEngine::new(config).unwrap();
    let policy = second.load_router("lookup", &bytes, no_config()).unwrap();
    assert_eq!(
        second.cache_stats(),
        Some(CacheStats { hits: 1, misses: 0 })
    );
    assert!(policy.route(&FakeHost::eight(), &request(2)).is_ok());

    // Fuel changes the generated code: a fuel engine does not reuse the epoch artifact.
    let fuel = PolicyEngine::new(EngineConfig {
        cache_dir: Some(dir.clone()),
        fuel: Some(1_000_000),
        ..EngineConfig::default()
    })
    .unwrap();
    fuel.load_router("lookup", &bytes, no_config()).unwrap();
    assert_eq!(fuel.cache_stats(), Some(CacheStats { hits: 0, misses: 1 }));
    assert_eq!(engine().cache_stats(), None);
    let _ = std::fs::remove_dir_all(&dir);
}

// --- The built policies and fixtures in `policies/dist` ------------------------------------

fn dist(relative: &str) -> Option<Vec<u8>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../policies/dist")
        .join(relative);
    match std::fs::read(&path) {
        Ok(bytes) => Some(bytes),
        Err(e) if std::env::var_os("RINGMASTER_REQUIRE_POLICIES").is_some() => {
            panic!(
                "{}: {e} (build it with `cargo xtask policies`)",
                path.display()
            )
        }
        Err(_) => {
            eprintln!(
                "skipped: {} is missing (build it with `cargo xtask policies`)",
                path.display()
            );
            None
        }
    }
}

#[test]
fn fixture_consistent_hash_follows_the_bounded_ring() {
    let Some(bytes) = dist("consistent-hash.wasm") else {
        return;
    };
    let engine = engine();
    let policy = engine
        .load_router("consistent-hash", &bytes, no_config())
        .unwrap();
    let host = FakeHost::eight();
    for i in 0..64u64 {
        let request = request(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let expected = host.ring_lookup_bounded(request.routing_key).unwrap();
        assert_eq!(
            policy.route(&host, &request).unwrap(),
            RouteDecision::Route(expected)
        );
    }
    assert_eq!(
        policy.route(&FakeHost::new(&[]), &request(1)).unwrap(),
        RouteDecision::Reject("no healthy GPU server".into())
    );
    assert_eq!(policy.faults(), FaultCounts::default());
}

#[test]
fn fixture_a_router_sees_the_door_a_request_came_in_by() {
    let Some(bytes) = dist("fixtures/door-router.wasm") else {
        return;
    };
    let engine = engine();
    let policy = engine
        .load_router("door-router", &bytes, no_config())
        .unwrap();
    let host = FakeHost::new(&["gpu-a", "gpu-b", "gpu-c"]);
    for (door, expected) in [
        ("responses", "gpu-c"),
        ("messages", "gpu-a"),
        ("chat_completions", "gpu-a"),
        ("completions", "gpu-a"),
    ] {
        let request = PolicyRequest { door, ..request(7) };
        assert_eq!(
            policy.route(&host, &request).unwrap(),
            RouteDecision::Route(expected.into()),
            "door {door}"
        );
    }
    assert_eq!(policy.faults(), FaultCounts::default());
}

#[test]
fn fixture_cache_aware_prefers_the_longest_cached_prefix() {
    let Some(bytes) = dist("cache-aware.wasm") else {
        return;
    };
    let engine = engine();
    let policy = engine
        .load_router("cache-aware", &bytes, no_config())
        .unwrap();
    let mut host = FakeHost::eight();
    // No server holds the prefix: the bounded ring decides.
    assert_eq!(
        policy.route(&host, &request(10)).unwrap(),
        RouteDecision::Route(host.ring_lookup_bounded(10).unwrap())
    );
    // s5 holds all three prefix hashes of the request, s2 one.
    host.prefix_matches = vec![("s2".into(), 1), ("s5".into(), 3)];
    assert_eq!(
        policy.route(&host, &request(10)).unwrap(),
        RouteDecision::Route("s5".into())
    );
    let counters = engine.policy_counters();
    for counter in ["decision_cache", "decision_ring"] {
        assert!(
            counters.contains(&("cache-aware".to_owned(), counter.to_owned(), 1)),
            "{counters:?}"
        );
    }

    // A malformed configuration value traps, so it fails the load's probes.
    let bad = BTreeMap::from([("cache_threshold".to_owned(), "banana".to_owned())]);
    let err = engine.load_router("cache-aware", &bytes, bad).unwrap_err();
    assert!(matches!(err, PolicyError::ProbeFailed(_)), "{err:?}");
}

#[test]
fn fixture_prefix_affinity_weighs_cache_against_queued_prefill() {
    let Some(bytes) = dist("prefix-affinity.wasm") else {
        return;
    };
    let engine = engine();
    let policy = engine
        .load_router("prefix-affinity", &bytes, no_config())
        .unwrap();
    let mut host = FakeHost::eight();
    // A 1,600-token prompt of 16 prefix hashes.
    let mut req = request(10);
    req.prefix_hashes = (0..16).collect();
    req.prompt_tokens = 1600;
    // Nothing cached: the key's first server on the ring.
    assert_eq!(
        policy.route(&host, &req).unwrap(),
        RouteDecision::Route(host.owner(10).to_owned())
    );
    // Every server holds a 4-hash system prompt: that decides nothing...
    host.prefix_matches = host.servers.iter().map(|s| (s.id.clone(), 4)).collect();
    assert_eq!(
        policy.route(&host, &req).unwrap(),
        RouteDecision::Route(host.owner(10).to_owned())
    );
    // ...but s3 holding 8 more does...
    host.prefix_matches[3].1 = 12;
    assert_eq!(
        policy.route(&host, &req).unwrap(),
        RouteDecision::Route("s3".into())
    );
    // ...until the prefill queued there outweighs what its cache saves.
    host.prefill_backlog = vec![("s3".to_owned(), 200_000)];
    assert_eq!(
        policy.route(&host, &req).unwrap(),
        RouteDecision::Route(host.owner(10).to_owned())
    );
}

#[test]
fn the_hosts_prefix_matching_does_not_count_against_the_deadline() {
    let Some(bytes) = dist("cache-aware.wasm") else {
        return;
    };
    let engine = PolicyEngine::new(EngineConfig {
        call_deadline: TEST_DEADLINE,
        ..config()
    })
    .unwrap();
    let policy = engine
        .load_router("cache-aware", &bytes, no_config())
        .unwrap();
    let mut host = FakeHost::eight();
    host.prefix_matches = vec![("s5".into(), 3)];
    // Three call deadlines of host work inside one call: the policy's own time is what counts.
    host.prefix_delay = 3 * TEST_DEADLINE;
    assert_eq!(
        policy.route(&host, &request(10)).unwrap(),
        RouteDecision::Route("s5".into())
    );
}

#[test]
fn fixture_every_built_router_loads() {
    let engine = engine();
    let host = FakeHost::eight();
    for name in [
        "consistent-hash",
        "cache-aware",
        "prefix-affinity",
        "kv-cost",
        "weighted-scorers",
        "prefix-cache",
        "least-loaded",
        "round-robin",
    ] {
        let Some(bytes) = dist(&format!("{name}.wasm")) else {
            continue;
        };
        let policy = engine.load_router(name, &bytes, no_config()).unwrap();
        for key in 0..16 {
            match policy.route(&host, &request(key)).unwrap() {
                RouteDecision::Route(id) => assert!(host.routable(&id), "{name}: {id}"),
                RouteDecision::Reject(reason) => panic!("{name} rejected: {reason}"),
                RouteDecision::Pair { decode, .. } => panic!("{name} answered a pair on {decode}"),
            }
        }
    }
}

#[test]
fn fixture_tiered_is_not_a_router() {
    let Some(bytes) = dist("tiered.wasm") else {
        return;
    };
    let engine = engine();
    let err = engine
        .load_router("tiered", &bytes, no_config())
        .unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err:?}");
    assert!(message(&err).contains("admission policy"), "{err}");
    engine
        .load_admission("tiered", &bytes, no_config())
        .unwrap();
}

#[test]
fn fixture_blocklist_is_a_safety_filter() {
    let Some(bytes) = dist("blocklist.wasm") else {
        return;
    };
    let engine = engine();
    let err = engine
        .load_router("blocklist", &bytes, no_config())
        .unwrap_err();
    assert!(matches!(err, PolicyError::WrongWorld(_)), "{err:?}");
    let policy = engine
        .load_safety("blocklist", &bytes, no_config())
        .unwrap();
    assert_eq!(
        policy
            .check_input("What is the capital of France?")
            .unwrap(),
        SafetyVerdict::Allow
    );
}

#[test]
fn fixture_faulty_policies_are_contained() {
    // 2 MiB: a Rust fixture starts at about 1.1 MiB, so its first 1 MiB allocation is refused
    // at once (filling the default 32 MiB takes longer than the default deadline here).
    let engine = PolicyEngine::new(EngineConfig {
        memory_limit_bytes: 2 * 1024 * 1024,
        call_deadline: TEST_DEADLINE,
        ..config()
    })
    .unwrap();
    let host = FakeHost::eight();
    let load = |name: &str| dist(&format!("fixtures/{name}.wasm"));

    if let Some(bytes) = load("trap-on-start") {
        let err = engine
            .load_router("trap-on-start", &bytes, no_config())
            .unwrap_err();
        assert!(
            matches!(
                err,
                PolicyError::Instantiate(_) | PolicyError::ProbeFailed(_)
            ),
            "{err:?}"
        );
    }
    if let Some(bytes) = load("imports-forbidden") {
        let err = engine
            .load_router("imports-forbidden", &bytes, no_config())
            .unwrap_err();
        assert!(
            matches!(
                err,
                PolicyError::WrongWorld(_) | PolicyError::Instantiate(_)
            ),
            "{err:?}"
        );
        assert!(message(&err).contains("import"), "{err}");
    }
    type Expected = fn(&PolicyFault) -> bool;
    let cases: [(&str, Expected); 4] = [
        ("loop-forever", |f| *f == PolicyFault::Deadline),
        ("alloc-forever", |f| *f == PolicyFault::OutOfMemory),
        ("answer-nonsense", |f| {
            matches!(f, PolicyFault::InvalidAnswer(_))
        }),
        ("panics", |f| matches!(f, PolicyFault::Trap(_))),
    ];
    for (name, expected) in cases {
        let Some(bytes) = load(name) else {
            continue;
        };
        let err = engine.load_router(name, &bytes, no_config()).unwrap_err();
        assert!(
            matches!(err, PolicyError::ProbeFailed(_)),
            "{name}: {err:?}"
        );
        let policy = engine
            .load_router_with(name, &bytes, no_config(), Probe::Skip)
            .unwrap();
        for _ in 0..2 {
            let fault = policy.route(&host, &request(1)).unwrap_err();
            assert!(expected(&fault), "{name}: {fault:?}");
        }
        assert_eq!(policy.faults().total(), 2, "{name}");
    }
    assert_engine_works(&engine);
}

/// The floor under a router call: the hand-written `Lookup` router (no guest allocator, one
/// import) through the engine, with a request like the benchmark's (32 prefix hashes).
/// `cargo test --release -p ringmaster-policy-engine -- --ignored --nocapture abi_floor`.
#[test]
#[ignore = "a measurement, not a check"]
fn abi_floor() {
    let engine = PolicyEngine::new(EngineConfig::default()).unwrap();
    let policy = engine
        .load_router("lookup", &components::router(Router::Lookup), no_config())
        .unwrap();
    let host = FakeHost::eight();
    let mut request = request(7);
    request.session_id = Some("session-7".into());
    request.prefix_hashes = (0..32).collect();
    let mut per_call = Vec::new();
    for _ in 0..50 {
        let started = Instant::now();
        for _ in 0..2_000 {
            std::hint::black_box(policy.route(&host, std::hint::black_box(&request)).ok());
        }
        per_call.push(started.elapsed().as_nanos() as f64 / 2_000.0);
    }
    per_call.sort_by(f64::total_cmp);
    eprintln!(
        "hand-written router through the engine: median {:.0} ns per call",
        per_call[25]
    );
}

/// A 0.2.0 router is called through the request resource; a 0.1.0 one (the component-text
/// routers here) with the record, in the same engine.
#[test]
fn fixture_both_contract_versions_load_side_by_side() {
    let Some(v2) = dist("consistent-hash.wasm") else {
        return;
    };
    let engine = engine();
    let new = engine.load_router("v2", &v2, no_config()).unwrap();
    let old = engine
        .load_router("v1", &components::router(Router::Lookup), no_config())
        .unwrap();
    assert_eq!((new.contract(), old.contract()), ("0.3.0", "0.1.0"));
    assert!(!new.learns() && !old.learns());
    let host = FakeHost::eight();
    for key in 0..20u64 {
        // consistent-hash asks `lookup-bounded` (the next server in FakeHost), the 0.1.0
        // component `lookup`: each read its key through its own contract.
        let next = host.owner(key.wrapping_add(1)).to_owned();
        assert_eq!(
            new.route(&host, &request(key)).unwrap(),
            RouteDecision::Route(next)
        );
        let owner = host.owner(key).to_owned();
        assert_eq!(
            old.route(&host, &request(key)).unwrap(),
            RouteDecision::Route(owner)
        );
    }
}

fn outcome(server: &str, key: u64, ttft_us: Option<u64>, error: Option<&str>) -> Outcome {
    Outcome {
        request_id: format!("req_{key}"),
        routing_key: key,
        server: server.to_owned(),
        as_decided: true,
        ttft_us,
        prompt_tokens: 100,
        cached_tokens: 50,
        output_tokens: 10,
        error: error.map(str::to_owned),
    }
}

/// `learned-ttft` keeps its routing history and what it learned in `state`, which every warm
/// instance shares, and learns from `observe`: a server that gets slow loses its keys.
#[test]
fn fixture_a_learning_router_shares_state_across_instances_and_learns() {
    let Some(bytes) = dist("learned-ttft.wasm") else {
        return;
    };
    let engine = engine();
    let policy = engine.load_router("learner", &bytes, no_config()).unwrap();
    assert!(policy.learns());
    let host = FakeHost::eight();
    // FakeHost's candidates for key k are s(k), s(k+1): both unmeasured, the first wins.
    let first = policy.route(&host, &request(3)).unwrap();
    assert_eq!(first, RouteDecision::Route("s3".into()));
    // Another instance (the warm ones are dropped) remembers the key through `state`.
    policy.core().drain();
    policy
        .observe(&outcome("s4", 3, Some(100_000), None))
        .unwrap();
    assert_eq!(policy.route(&host, &request(3)).unwrap(), first, "sticky");
    // s3 turns out far slower than s4: the key moves.
    for _ in 0..20 {
        policy
            .observe(&outcome("s3", 3, Some(2_000_000), None))
            .unwrap();
    }
    policy.core().drain();
    assert_eq!(
        policy.route(&host, &request(3)).unwrap(),
        RouteDecision::Route("s4".into())
    );
    let usage = policy.state_usage();
    assert!(
        usage.entries >= 3,
        "{usage:?}: the key's route, two servers' TTFT, the count"
    );
    assert_eq!(policy.faults(), FaultCounts::default());
    // A router that does not learn ignores outcomes.
    let Some(plain) = dist("consistent-hash.wasm") else {
        return;
    };
    let plain = engine.load_router("plain", &plain, no_config()).unwrap();
    plain
        .observe(&outcome("s1", 1, None, Some("reset")))
        .unwrap();
}

/// A new version keeps its name's `state` store unless loaded with `StateMode::Fresh`; the
/// version it replaces keeps its own store until it is dropped.
#[test]
fn fixture_state_is_kept_or_fresh_across_a_swap() {
    let Some(bytes) = dist("learned-ttft.wasm") else {
        return;
    };
    let engine = engine();
    let host = FakeHost::eight();
    let v1 = engine.load_router("slot", &bytes, no_config()).unwrap();
    v1.route(&host, &request(1)).unwrap();
    let held = v1.state_usage().entries;
    assert!(held >= 1);
    let kept = engine
        .load_router_with_state("slot", &bytes, no_config(), StateMode::Keep)
        .unwrap();
    assert_eq!(kept.state_usage().entries, held);
    let fresh = engine
        .load_router_with_state("slot", &bytes, no_config(), StateMode::Fresh)
        .unwrap();
    assert_eq!(fresh.state_usage().entries, 0);
    assert_eq!(
        v1.state_usage().entries,
        held,
        "the old version's store is untouched"
    );
    // The fresh store is now the name's: the next kept version shares it.
    fresh.route(&host, &request(2)).unwrap();
    let next = engine.load_router("slot", &bytes, no_config()).unwrap();
    assert_eq!(next.state_usage().entries, fresh.state_usage().entries);
    // Another name has its own store.
    let other = engine.load_router("other", &bytes, no_config()).unwrap();
    assert_eq!(other.state_usage().entries, 0);
}

/// The state store's caps hold whatever a policy writes.
#[test]
fn fixture_state_is_bounded() {
    let Some(bytes) = dist("learned-ttft.wasm") else {
        return;
    };
    let engine = PolicyEngine::new(EngineConfig {
        state_max_entries: 16,
        ..config()
    })
    .unwrap();
    let policy = engine.load_router("bounded", &bytes, no_config()).unwrap();
    let host = FakeHost::eight();
    for key in 0..200u64 {
        policy.route(&host, &request(key)).unwrap();
    }
    let usage = policy.state_usage();
    assert_eq!((usage.entries, usage.max_entries), (16, 16), "{usage:?}");
}

/// The built-in routers as built against 0.1.0 (`contract-0.1.0/`, from before the contract
/// moved) and 0.2.0 (`contract-0.2.0/`) still load, are called through their contract (the
/// record, the resource), and decide exactly as their 0.3.0 builds of the same source do.
#[test]
fn fixture_routers_built_against_older_contracts_decide_as_their_new_builds() {
    for name in ["consistent-hash", "prefix-affinity"] {
        let Some(new) = dist(&format!("{name}.wasm")) else {
            return;
        };
        let committed = |version: &str| {
            std::fs::read(
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("src/tests/contract-{version}/{name}.wasm")),
            )
            .expect("the committed older build")
        };
        let engine = engine();
        let oldest = engine
            .load_router("oldest", &committed("0.1.0"), no_config())
            .unwrap();
        let old = engine
            .load_router("old", &committed("0.2.0"), no_config())
            .unwrap();
        let new = engine.load_router("new", &new, no_config()).unwrap();
        assert_eq!(
            (oldest.contract(), old.contract(), new.contract()),
            ("0.1.0", "0.2.0", "0.3.0")
        );
        let mut host = FakeHost::eight();
        host.prefix_matches = vec![("s2".into(), 3), ("s5".into(), 1)];
        host.prefill_backlog = vec![("s2".into(), 40_000), ("s6".into(), 900)];
        for key in 0..64u64 {
            let mut req = request(key.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            req.prompt_tokens = 100 + (key as u32 % 7) * 2_000;
            req.session_id = (key % 3 == 0).then(|| format!("s-{key}"));
            let answer = new.route(&host, &req).unwrap();
            assert_eq!(
                oldest.route(&host, &req).unwrap(),
                answer,
                "{name}, key {key}"
            );
            assert_eq!(old.route(&host, &req).unwrap(), answer, "{name}, key {key}");
        }
    }
}

/// A 0.2.0 learning router still loads as a learning router and hears outcomes.
#[test]
fn a_learning_router_built_against_0_2_0_still_learns() {
    let bytes = std::fs::read(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("src/tests/contract-0.2.0/learned-ttft.wasm"),
    )
    .expect("the committed 0.2.0 build");
    let engine = engine();
    let policy = engine
        .load_router("learned-0.2.0", &bytes, no_config())
        .unwrap();
    assert_eq!(policy.contract(), "0.2.0");
    assert!(policy.learns());
    let host = FakeHost::eight();
    assert!(matches!(
        policy.route(&host, &request(5)).unwrap(),
        RouteDecision::Route(_)
    ));
}

/// The built-in pair routers answer pairs: a long prompt split between a prefill server and
/// a decode server, one every server holds kept whole; and a 0.2.0-style fleet (no prefill
/// servers) is served whole. A pair naming a server that is not a prefill server is a fault.
#[test]
fn fixture_pair_routers_split_long_prompts_and_keep_cached_ones_whole() {
    let engine = engine();
    for name in ["pair-prefix", "pair-llm-d", "pair-dynamo", "pair-split"] {
        let Some(bytes) = dist(&format!("{name}.wasm")) else {
            return;
        };
        let policy = engine.load_router(name, &bytes, no_config()).unwrap();
        assert_eq!(policy.contract(), "0.3.0");
        let host = FakeHost::new(&["d0", "d1"]).with_prefill(&["p0", "p1"]);
        let mut long = request(42);
        long.prompt_tokens = 20_000;
        long.prefix_hashes = (0..40).collect();
        match policy.route(&host, &long).unwrap() {
            RouteDecision::Pair {
                decode,
                prefill: Some(prefill),
                reason,
            } => {
                assert!(decode.starts_with('d'), "{name}: {decode}");
                assert!(prefill.starts_with('p'), "{name}: {prefill} ({reason})");
            }
            other => panic!("{name} did not split a long prompt: {other:?}"),
        }
        let whole_fleet = FakeHost::new(&["s0", "s1"]);
        match policy.route(&whole_fleet, &long).unwrap() {
            RouteDecision::Pair {
                prefill: None,
                decode,
                ..
            } => assert!(decode.starts_with('s')),
            other => panic!("{name} split on a fleet of whole servers: {other:?}"),
        }
    }
    // A cached prompt: the decode server holds all of it.
    let Some(bytes) = dist("pair-prefix.wasm") else {
        return;
    };
    let policy = engine
        .load_router("pair-prefix-cached", &bytes, no_config())
        .unwrap();
    let mut host = FakeHost::new(&["d0", "d1"]).with_prefill(&["p0"]);
    host.prefix_matches = vec![("d1".into(), 40)];
    let mut cached = request(43);
    cached.prompt_tokens = 20_000;
    cached.prefix_hashes = (0..40).collect();
    assert!(matches!(
        policy.route(&host, &cached).unwrap(),
        RouteDecision::Pair { prefill: None, decode, .. } if decode == "d1"
    ));
}

#[test]
fn a_cache_directory_that_cannot_be_made_leaves_the_engine_without_a_cache() {
    // Under a file: no directory can be made there (a read-only root without a writable home
    // fails the same way).
    let file = tempfile::NamedTempFile::new().unwrap();
    let engine = PolicyEngine::new(EngineConfig {
        cache_dir: Some(file.path().join("cache")),
        ..config()
    })
    .expect("the engine starts without its cache");
    assert_engine_works(&engine);
}
