//! Fuzzes the values lowered into policies and lifted out of them: requests with any ids,
//! models, session ids, header names and values, prefix hashes and server lists go into the
//! built-in router, admission and safety components and the `hostile` fixture (whose answers
//! the fuzzer steers through `x-attack`); every answer is a valid decision (a routable server,
//! a bounded reason) or a typed fault, never a panic.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use ringmaster_policy_engine::{
    AdmissionLoad, AdmissionPolicy, AdmissionVerdict, EngineConfig, MAX_ANSWER_TEXT_BYTES,
    PolicyEngine, PolicyRequest, PolicyRole, RouteDecision, RouterHost, RouterPolicy, SafetyPolicy,
    SafetyVerdict, ServerView, builtin,
};

/// A cluster of the fuzzer's servers; the ring maps a key onto them by remainder.
struct Cluster(Vec<ServerView>);

impl RouterHost for Cluster {
    fn ring_lookup(&self, key: u64) -> Option<String> {
        let n = self.0.len() as u64;
        (n > 0).then(|| self.0[(key % n) as usize].id.clone())
    }
    fn ring_candidates(&self, key: u64, n: u32) -> Vec<String> {
        let len = self.0.len() as u64;
        (0..u64::from(n).min(len))
            .map(|i| self.0[(key.wrapping_add(i) % len) as usize].id.clone())
            .collect()
    }
    fn ring_lookup_bounded(&self, key: u64) -> Option<String> {
        self.ring_lookup(key)
    }
    fn servers(&self) -> Vec<ServerView> {
        self.0.clone()
    }
    fn server(&self, id: &str) -> Option<ServerView> {
        self.0.iter().find(|s| s.id == id).cloned()
    }
    fn prefix_matches(&self) -> Vec<(String, u32)> {
        self.0.iter().map(|s| (s.id.clone(), s.waiting)).collect()
    }
}

struct Policies {
    routers: Vec<RouterPolicy>,
    admission: AdmissionPolicy,
    safety: SafetyPolicy,
}

fn policies() -> &'static Policies {
    static POLICIES: OnceLock<Policies> = OnceLock::new();
    POLICIES.get_or_init(|| {
        let engine = PolicyEngine::new(EngineConfig {
            call_deadline: Duration::from_millis(20),
            ..EngineConfig::default()
        })
        .expect("an engine");
        let none = BTreeMap::new;
        let mut routers: Vec<RouterPolicy> = ["consistent-hash", "prefix-affinity", "least-loaded"]
            .iter()
            .map(|name| {
                engine
                    .load_router(name, builtin::builtin(name).expect("built in"), none())
                    .expect("a built-in router loads")
            })
            .collect();
        let hostile = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policies/dist/fixtures/hostile.wasm"
        );
        let bytes = std::fs::read(hostile).expect("policies/dist/fixtures/hostile.wasm");
        routers.push(
            engine
                .load_router("hostile", &bytes, none())
                .expect("the hostile fixture loads"),
        );
        Policies {
            routers,
            admission: engine
                .load_admission(
                    "tiered",
                    builtin::builtin("tiered").expect("built in"),
                    none(),
                )
                .expect("tiered loads"),
            safety: engine
                .load_safety(
                    "blocklist",
                    builtin::builtin("blocklist").expect("built in"),
                    none(),
                )
                .expect("blocklist loads"),
        }
    })
}

/// Attacks that answer at once (the looping ones would only spend the deadline).
const QUICK_ATTACKS: [&str; 6] = [
    "ghost",
    "huge-route",
    "huge-reject",
    "trap",
    "recurse",
    "none",
];

fn request(u: &mut Unstructured<'_>) -> libfuzzer_sys::arbitrary::Result<PolicyRequest> {
    let mut headers: Vec<(String, String)> = Arbitrary::arbitrary(u)?;
    headers.truncate(64);
    // The fuzzer picks the attack below, among the quick ones only.
    headers.retain(|(name, _)| !name.eq_ignore_ascii_case("x-attack"));
    let attack = QUICK_ATTACKS[usize::from(u8::arbitrary(u)?) % QUICK_ATTACKS.len()];
    headers.push(("x-attack".to_owned(), attack.to_owned()));
    let mut prefix_hashes: Vec<u64> = Arbitrary::arbitrary(u)?;
    prefix_hashes.truncate(4096);
    Ok(PolicyRequest {
        id: Arbitrary::arbitrary(u)?,
        model: Arbitrary::arbitrary(u)?,
        tier: Arbitrary::arbitrary(u)?,
        session_id: Arbitrary::arbitrary(u)?,
        routing_key: Arbitrary::arbitrary(u)?,
        prefix_hashes,
        prompt_tokens: Arbitrary::arbitrary(u)?,
        max_tokens: Arbitrary::arbitrary(u)?,
        priority: Arbitrary::arbitrary(u)?,
        stream: Arbitrary::arbitrary(u)?,
        headers,
        door: u.choose(&["messages", "chat_completions", "completions", "responses"])?,
    })
}

fn cluster(u: &mut Unstructured<'_>) -> libfuzzer_sys::arbitrary::Result<Cluster> {
    let n = usize::from(u8::arbitrary(u)? % 9);
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        servers.push(ServerView {
            id: Arbitrary::arbitrary(u)?,
            role: if bool::arbitrary(u)? {
                PolicyRole::Decode
            } else {
                PolicyRole::Both
            },
            healthy: Arbitrary::arbitrary(u)?,
            weight: Arbitrary::arbitrary(u)?,
            in_flight: Arbitrary::arbitrary(u)?,
            waiting: Arbitrary::arbitrary(u)?,
            kv_blocks_used: Arbitrary::arbitrary(u)?,
            kv_blocks_total: Arbitrary::arbitrary(u)?,
        });
    }
    Ok(Cluster(servers))
}

fuzz_target!(|bytes: &[u8]| {
    let mut u = Unstructured::new(bytes);
    let (Ok(request), Ok(cluster), Ok(text)) =
        (request(&mut u), cluster(&mut u), String::arbitrary(&mut u))
    else {
        return;
    };
    let policies = policies();
    for router in &policies.routers {
        match router.route(&cluster, &request) {
            Ok(RouteDecision::Route(id)) => assert!(cluster.routable(&id), "{id:?}"),
            Ok(RouteDecision::Reject(reason)) => assert!(reason.len() <= MAX_ANSWER_TEXT_BYTES),
            // This cluster has no prefill servers: a pair can only keep a request whole.
            Ok(RouteDecision::Pair {
                decode,
                prefill,
                reason,
            }) => {
                assert!(cluster.routable(&decode), "{decode:?}");
                assert_eq!(prefill, None);
                assert!(reason.len() <= MAX_ANSWER_TEXT_BYTES);
            }
            Err(_) => {}
        }
    }
    let load = AdmissionLoad {
        in_flight: u32::from(bytes.first().copied().unwrap_or(0)),
        queued: u32::from(bytes.last().copied().unwrap_or(0)),
        queue_capacity: 64,
        servers: cluster.0.len() as u32,
    };
    if let Ok(AdmissionVerdict::Reject { reason, .. }) =
        policies.admission.admit(&cluster, &request, &load)
    {
        assert!(reason.len() <= MAX_ANSWER_TEXT_BYTES);
    }
    for verdict in [
        policies.safety.check_input(&text),
        policies.safety.check_output(&text, text.len() % 2 == 0),
    ] {
        if let Ok(SafetyVerdict::Block(reason)) = verdict {
            assert!(reason.len() <= MAX_ANSWER_TEXT_BYTES);
        }
    }
});
