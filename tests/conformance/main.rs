//! Policy conformance: every router component (the built-in ones and the examples) runs
//! every case under `tests/conformance/cases/` through the policy engine. See the README
//! beside this file for the layout and the expected outcomes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ringmaster_policy_engine::{
    EngineConfig, PolicyEngine, PolicyError, PolicyRequest, RouteDecision, RouterHost,
};
use ringmaster_policy_kit::check::SyntheticFleet;
use serde::Deserialize;

/// Each call's budget in Wasm instructions (roughly).
const FUEL_PER_CALL: u64 = 20_000_000;

/// Routers that do not promise the same answer to the same request.
const NOT_DETERMINISTIC: [&str; 1] = ["round-robin"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    description: String,
    servers: usize,
    #[serde(default)]
    unhealthy: Vec<usize>,
    /// In-flight requests, repeated over the fleet.
    #[serde(default)]
    in_flight: Vec<u32>,
    /// (server index, leading prefix hashes held).
    #[serde(default)]
    matches: Vec<(usize, u32)>,
    /// (server index, prefill backlog in tokens).
    #[serde(default)]
    backlog: Vec<(usize, u64)>,
    prefix_hashes: u64,
    prompt_tokens: u32,
    calls: u64,
    expect: String,
    /// This case's budget per call, when it needs more than [`FUEL_PER_CALL`].
    fuel: Option<u64>,
    /// Prefill servers beside the fleet (`prefill-0`…; the fleet's servers are then decode
    /// servers): what 0.3.0 routers may name in a pair.
    #[serde(default)]
    prefill: usize,
    /// Of those, the unhealthy ones.
    #[serde(default)]
    prefill_unhealthy: Vec<usize>,
}

/// The case's fleet: its servers (the unhealthy ones draining), matches and backlogs.
fn fleet(case: &Case) -> SyntheticFleet {
    let mut fleet = SyntheticFleet::new(case.servers, &case.in_flight);
    if case.prefill > 0 {
        fleet = fleet.with_prefill(case.prefill);
    }
    for i in &case.unhealthy {
        fleet.servers[*i].healthy = false;
    }
    for i in &case.prefill_unhealthy {
        fleet.prefill[*i].healthy = false;
    }
    // An index past the fleet's servers names a prefill server (`servers + j` is `prefill-j`).
    let id = |i: usize| {
        if i < case.servers {
            format!("gpu-{i}")
        } else {
            format!("prefill-{}", i - case.servers)
        }
    };
    fleet.matches = case.matches.iter().map(|(i, n)| (id(*i), *n)).collect();
    fleet.backlog = case.backlog.iter().map(|(i, n)| (id(*i), *n)).collect();
    fleet
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every router component there is: built-in ones, and the examples that were built.
fn routers() -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let dist = root().join("policies/dist");
    for entry in std::fs::read_dir(&dist).expect("policies/dist") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "wasm") {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            found.push((name, path));
        }
    }
    for entry in std::fs::read_dir(root().join("examples")).expect("examples") {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let component = dir.join(format!("{name}.wasm"));
        if component.is_file() {
            found.push((name, component));
        } else if dir.join("ringmaster-policy.toml").is_file() {
            assert!(
                std::env::var_os("RINGMASTER_REQUIRE_POLICIES").is_none(),
                "{} is not built: tests/run builds it",
                component.display()
            );
            eprintln!("skipped {name}: not built");
        }
    }
    found.sort();
    found
}

fn cases() -> Vec<(String, Case)> {
    let dir = root().join("tests/conformance/cases");
    let mut cases: Vec<(String, Case)> = std::fs::read_dir(&dir)
        .expect("tests/conformance/cases")
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(path.join("case.toml"))
                .unwrap_or_else(|e| panic!("{name}/case.toml: {e}"));
            let case: Case =
                toml::from_str(&text).unwrap_or_else(|e| panic!("{name}/case.toml: {e}"));
            (name, case)
        })
        .collect();
    cases.sort_by(|a, b| a.0.cmp(&b.0));
    cases
}

fn request(case: &Case, call: u64) -> PolicyRequest {
    SyntheticFleet::request(call, case.prefix_hashes, case.prompt_tokens)
}

#[test]
fn every_router_passes_every_case() {
    let routers = routers();
    let cases = cases();
    assert!(routers.len() >= 9, "too few routers found: {routers:?}");
    // One engine per budget; compiled components are shared through a cache folder, so each
    // is compiled once.
    let cache = std::env::temp_dir().join(format!("ringmaster-conformance-{}", std::process::id()));
    let mut engines: BTreeMap<u64, PolicyEngine> = BTreeMap::new();
    let mut failures = Vec::new();
    let mut checked = std::collections::BTreeSet::new();
    for (case_name, case) in &cases {
        let fuel = case.fuel.unwrap_or(FUEL_PER_CALL);
        let engine = engines.entry(fuel).or_insert_with(|| {
            PolicyEngine::new(EngineConfig {
                fuel: Some(fuel),
                cache_dir: Some(cache.clone()),
                ..EngineConfig::default()
            })
            .unwrap()
        });
        for (name, path) in &routers {
            let bytes = std::fs::read(path).unwrap();
            let first = match engine.load_router(name, &bytes, BTreeMap::new()) {
                Ok(router) => router,
                // An admission policy or a safety filter.
                Err(PolicyError::WrongWorld(_)) => continue,
                Err(e) => panic!("{name} does not load: {e}"),
            };
            let second = engine
                .load_router(&format!("{name}-again"), &bytes, BTreeMap::new())
                .unwrap();
            checked.insert(name.clone());
            let fleet = fleet(case);
            for call in 0..case.calls {
                let req = request(case, call);
                let mut fail = |why: String| {
                    failures.push(format!(
                        "{name} / {case_name} ({}): call {call}: {why}",
                        case.description
                    ));
                };
                let answer = match first.route(&fleet, &req) {
                    Ok(answer) => answer,
                    Err(fault) => {
                        fail(format!("faulted: {fault}"));
                        break;
                    }
                };
                let ok = match (&answer, case.expect.as_str()) {
                    (RouteDecision::Route(id), "healthy-server") => fleet.routable(id),
                    // A pair decodes on a healthy server, and prefills (if it splits) on a
                    // healthy prefill server.
                    (
                        RouteDecision::Pair {
                            decode, prefill, ..
                        },
                        "healthy-server",
                    ) => {
                        fleet.routable(decode)
                            && prefill.as_ref().is_none_or(|p| fleet.prefill_routable(p))
                    }
                    (RouteDecision::Reject(_), "reject") => true,
                    (_, "healthy-server" | "reject") => false,
                    (_, other) => panic!("{case_name}: unknown expectation {other:?}"),
                };
                if !ok {
                    fail(format!("answered {answer:?}, expected {}", case.expect));
                    break;
                }
                if !NOT_DETERMINISTIC.contains(&name.as_str()) {
                    match second.route(&fleet, &req) {
                        Ok(again) if again == answer => {}
                        other => {
                            fail(format!(
                                "a fresh instance answered {other:?}, not {answer:?}"
                            ));
                            break;
                        }
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&cache);
    assert!(
        checked.len() >= 9,
        "too few router components loaded: {checked:?}"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Swap and rollback, for every router: each is installed as a variant of a slot, swapped
/// for another version (the built-in `least-loaded`, or `round-robin` for `least-loaded`
/// itself), rolled back, and must then run again under its own hash and answer a healthy
/// fleet.
#[test]
fn every_router_swaps_and_rolls_back() {
    use ringmaster_slots::router::RouterSlot;
    let cache = std::env::temp_dir().join(format!(
        "ringmaster-conformance-swap-{}",
        std::process::id()
    ));
    let engine = PolicyEngine::new(EngineConfig {
        fuel: Some(FUEL_PER_CALL),
        cache_dir: Some(cache.clone()),
        ..EngineConfig::default()
    })
    .unwrap();
    let slot = RouterSlot::new(engine);
    let read =
        |name: &str| std::fs::read(root().join(format!("policies/dist/{name}.wasm"))).unwrap();
    let healthy_case = cases()
        .into_iter()
        .find(|(name, _)| name == "healthy-fleet")
        .expect("the healthy-fleet case")
        .1;
    let fleet = fleet(&healthy_case);
    let mut checked = 0;
    for (name, path) in routers() {
        let bytes = std::fs::read(&path).unwrap();
        let variant = format!("v-{name}");
        match slot.install(&variant, &bytes, None, false, None) {
            Ok(true) => {}
            Ok(false) => panic!("{name}: a new variant reported no change"),
            Err(ringmaster_slots::router::SlotError::Policy(PolicyError::WrongWorld(_))) => {
                continue;
            }
            Err(e) => panic!("{name} does not install: {e}"),
        }
        let hash = ringmaster_policy_engine::content_hash(&bytes);
        let other = read(if name == "least-loaded" {
            "round-robin"
        } else {
            "least-loaded"
        });
        assert!(
            slot.install(&variant, &other, None, false, None).unwrap(),
            "{name}: swap"
        );
        let running = |slot: &RouterSlot| {
            slot.current()
                .variants
                .iter()
                .find(|v| *v.name == *variant)
                .map(|v| (v.policy.info().hash.clone(), v.history.len()))
                .unwrap()
        };
        assert_ne!(running(&slot).0, hash, "{name}: the swap took effect");
        slot.rollback(&variant).unwrap();
        assert_eq!(running(&slot), (hash.clone(), 0), "{name}: rolled back");
        let set = slot.current();
        let back = set.variants.iter().find(|v| *v.name == *variant).unwrap();
        match back.policy.route(&fleet, &request(&healthy_case, 1)) {
            Ok(RouteDecision::Route(id)) => assert!(fleet.routable(&id), "{name}: {id}"),
            // A pair router answers a pair; on this fleet of servers taking whole requests,
            // whole on a routable one.
            Ok(RouteDecision::Pair {
                decode,
                prefill: None,
                ..
            }) => assert!(fleet.routable(&decode), "{name}: {decode}"),
            other => panic!("{name} after its rollback: {other:?}"),
        }
        slot.remove(&variant).unwrap();
        checked += 1;
    }
    let _ = std::fs::remove_dir_all(&cache);
    assert!(checked >= 9, "too few routers swapped: {checked}");
}
