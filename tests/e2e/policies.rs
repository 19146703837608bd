//! Router policies over real sockets: the default variant, hot swap (and refusing bad
//! components while the gateway keeps serving), A/B variants, the shadow, experiments.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{TestGateway, hello, metric_sum};

/// A committed component from `policies/dist`.
pub fn component(name: &str) -> Vec<u8> {
    let path = format!(
        "{}/../policies/dist/{name}.wasm",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

async fn put_router(gw: &TestGateway, query: &str, bytes: Vec<u8>) -> reqwest::Response {
    gw.admin(Method::PUT, &format!("/admin/policies/router?{query}"))
        .await
        .header("content-type", "application/wasm")
        .body(bytes)
        .send()
        .await
        .unwrap()
}

async fn policies(gw: &TestGateway) -> Value {
    gw.admin_json(Method::GET, "/admin/policies").await
}

/// `GET /admin/policies` names where each version came from, not only its hash; and a
/// `PUT` with a weight and no body changes the weight (once an error about contract 0.1.0,
/// from trying to load zero bytes as a component), while a bodiless `PUT` without one says
/// what the body must be.
#[tokio::test]
async fn the_listing_names_sources_and_a_bodiless_put_sets_a_weight() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    assert_eq!(
        put_router(&gw, "variant=candidate&weight=10", component("round-robin"))
            .await
            .status(),
        200
    );
    let mut hand_built = component("round-robin");
    // A custom section changes the bytes, not the component: no built-in's hash.
    hand_built.extend_from_slice(&[0, 5, 4, b'n', b'o', b't', b'e']);
    assert_eq!(
        put_router(&gw, "variant=mine&weight=5", hand_built)
            .await
            .status(),
        200
    );
    let listed = policies(&gw).await;
    let variants = listed["router"]["variants"].as_array().unwrap();
    let source = |name: &str| {
        variants
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| v["source"].as_str().unwrap().to_owned())
            .unwrap()
    };
    assert_eq!(source("default"), "builtin:prefix-affinity", "{listed}");
    assert_eq!(source("candidate"), "builtin:round-robin", "{listed}");
    assert_eq!(source("mine"), "pushed", "{listed}");

    let reweighted = put_router(&gw, "variant=candidate&weight=40", Vec::new()).await;
    assert_eq!(reweighted.status(), 200);
    let listed = policies(&gw).await;
    let weight = listed["router"]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "candidate")
        .unwrap()["weight"]
        .clone();
    assert_eq!(weight, 40, "{listed}");

    let bare = put_router(&gw, "variant=candidate", Vec::new()).await;
    assert_eq!(bare.status(), 400);
    let text = bare.text().await.unwrap();
    assert!(
        text.contains("the body must be the component's bytes"),
        "{text}"
    );
    assert!(!text.contains("0.1.0"), "{text}");
}

#[tokio::test]
async fn the_default_router_is_the_prefix_affinity_component() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let listed = policies(&gw).await;
    let variants = listed["router"]["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 1);
    assert_eq!(variants[0]["name"], "default");
    let same: Value = put_router(&gw, "variant=default", component("prefix-affinity"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(same["changed"], false, "it runs builtin:prefix-affinity");
    let response = gw.post_messages(&hello(4)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ringmaster-variant"], "default");
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_routing_decisions_total",
            "variant=\"default\""
        ),
        1.0
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_variant_requests_total",
            "variant=\"default\""
        ),
        1.0
    );
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_routing_seconds_count",
            "variant=\"default\""
        ) == 1.0
    );
}

#[tokio::test]
async fn swapping_the_same_bytes_is_a_no_op_and_a_new_version_keeps_history() {
    let gw = TestGateway::simulated(2, 0.0, "").await;
    let same: Value = put_router(&gw, "variant=default", component("prefix-affinity"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(same["changed"], false);
    let swapped = put_router(&gw, "variant=default", component("cache-aware")).await;
    assert_eq!(swapped.status(), 200);
    let swapped: Value = swapped.json().await.unwrap();
    assert_eq!(swapped["changed"], true);
    let variant = &swapped["router"]["variants"][0];
    assert_eq!(variant["previous_versions"].as_array().unwrap().len(), 1);
    assert_eq!(gw.post_messages(&hello(2)).await.status(), 200);
    let rolled = gw
        .admin_call(
            Method::POST,
            "/admin/policies/router/rollback?variant=default",
        )
        .await;
    assert_eq!(rolled.status(), 200);
    let after: Value = rolled.json().await.unwrap();
    assert_eq!(
        after["router"]["variants"][0]["hash"],
        same["router"]["variants"][0]["hash"]
    );
    let nothing_left = gw
        .admin_call(
            Method::POST,
            "/admin/policies/router/rollback?variant=default",
        )
        .await;
    assert_eq!(nothing_left.status(), 400);
}

#[tokio::test]
async fn bad_components_are_refused_and_the_last_good_version_stays() {
    let gw = TestGateway::simulated(2, 0.0, "").await;
    let good = policies(&gw).await["router"]["variants"][0]["hash"].clone();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "not a component",
            b"\0asm this is not wasm at all".to_vec(),
            "",
        ),
        (
            "random bytes",
            (0..4096u32)
                .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
                .collect(),
            "",
        ),
        ("another world", component("tiered"), ""),
        (
            "forbidden import",
            component("fixtures/imports-forbidden"),
            "evil",
        ),
        ("traps at start", component("fixtures/trap-on-start"), ""),
        ("loops forever", component("fixtures/loop-forever"), ""),
        ("allocates forever", component("fixtures/alloc-forever"), ""),
        (
            "answers nonsense",
            component("fixtures/answer-nonsense"),
            "",
        ),
        ("panics", component("fixtures/panics"), ""),
    ];
    for (what, bytes, needle) in cases {
        let started = Instant::now();
        let response = put_router(&gw, "variant=default", bytes).await;
        assert_eq!(response.status(), 400, "{what}");
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            !message.is_empty() && message.contains(needle),
            "{what}: {message}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{what} took {:?}",
            started.elapsed()
        );
        // The gateway keeps serving on the last good version.
        assert_eq!(
            policies(&gw).await["router"]["variants"][0]["hash"],
            good,
            "{what}"
        );
        assert_eq!(gw.post_messages(&hello(2)).await.status(), 200, "{what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_swaps_under_steady_load_fail_no_request() {
    let gw = Arc::new(TestGateway::simulated(4, 0.001, "").await);
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (gw, stop, ok, failed) = (gw.clone(), stop.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let mut request = hello(8);
                    request["messages"][0]["content"] = json!(format!("client {c} request {i}"));
                    request["stream"] = json!(i.is_multiple_of(2));
                    let response = gw.post_messages(&request).await;
                    let good = response.status() == 200
                        && response
                            .text()
                            .await
                            .is_ok_and(|t| !t.contains("event: error"));
                    if good {
                        ok.fetch_add(1, Ordering::Relaxed)
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed)
                    };
                    i += 1;
                }
            })
        })
        .collect();
    let versions = [component("consistent-hash"), component("cache-aware")];
    let mut put_to_first_request = Vec::new();
    let mut load_ms = Vec::new();
    for swap in 0..100 {
        let put_sent = Instant::now();
        let response = put_router(&gw, "variant=default", versions[(swap + 1) % 2].clone()).await;
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, 200, "swap {swap}: {body}");
        assert_eq!(body["changed"], true, "swap {swap}");
        load_ms.push(body["load_ms"].as_f64().unwrap());
        // The PUT returns once the version is published: the next request runs on it.
        let first = gw.post_messages(&hello(1)).await;
        assert_eq!(first.status(), 200);
        assert_eq!(
            first.headers()["x-ringmaster-policy-version"],
            body["router"]["variants"][0]["hash"].as_str().unwrap(),
            "swap {swap}: the first request ran on the new version"
        );
        put_to_first_request.push(put_sent.elapsed().as_secs_f64() * 1000.0);
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    put_to_first_request.sort_by(f64::total_cmp);
    load_ms.sort_by(f64::total_cmp);
    eprintln!(
        "100 swaps under load: {} requests ok, {} failed; load (compile, pre-instantiate, probe) \
         p50 {:.2} ms, max {:.2} ms; PUT sent to first request on the new version answered: \
         p50 {:.2} ms, max {:.2} ms",
        ok.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        load_ms[50],
        load_ms[99],
        put_to_first_request[50],
        put_to_first_request[99],
    );
    assert_eq!(failed.load(Ordering::Relaxed), 0);
    assert!(ok.load(Ordering::Relaxed) > 100);
}

#[tokio::test]
async fn ab_variants_are_sticky_per_session_and_compared() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let added = put_router(
        &gw,
        "variant=candidate&weight=100",
        component("least-loaded"),
    )
    .await;
    assert_eq!(added.status(), 200);
    let mut seen = std::collections::HashMap::new();
    for session in 0..40 {
        for turn in 0..3 {
            let response = gw
                .client
                .post(gw.url("/v1/messages"))
                .header("x-session-id", format!("session-{session}"))
                .json(&hello(2))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
            let variant = response.headers()["x-ringmaster-variant"]
                .to_str()
                .unwrap()
                .to_owned();
            let first = seen.entry(session).or_insert_with(|| variant.clone());
            assert_eq!(
                *first, variant,
                "session {session} turn {turn} changed variant"
            );
        }
    }
    let default_count = seen.values().filter(|v| *v == "default").count();
    assert!(
        default_count > 5 && default_count < 35,
        "50/50 split, got {default_count}/40"
    );
    let experiments: Value = gw.admin_json(Method::GET, "/admin/experiments").await;
    let variants = experiments["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 2);
    assert_eq!(
        variants[0]["requests"].as_u64().unwrap() + variants[1]["requests"].as_u64().unwrap(),
        120
    );
    assert!(
        variants[0]["ttft_seconds"]["p99"].as_f64().unwrap()
            >= variants[0]["ttft_seconds"]["p50"].as_f64().unwrap()
    );
    let diff = &variants[1]["ttft_vs_control"];
    assert_eq!(diff["control"], "default");
    let ci = diff["always_valid_ci95"].as_array().unwrap();
    assert!(ci[0].as_f64().unwrap() <= ci[1].as_f64().unwrap());
    let welch = diff["welch"]["ci95"].as_array().unwrap();
    assert!(
        welch[0].as_f64().unwrap() >= ci[0].as_f64().unwrap(),
        "the always-valid interval is the wider"
    );
    let samples = diff["samples"].as_array().unwrap();
    let enough = samples.iter().all(|n| n.as_u64().unwrap() >= 30);
    let verdict = diff["verdict"].as_str().unwrap();
    assert_eq!(verdict == "collecting", !enough, "{diff}");
    // The hit ratio's comparison: an interval once both arms have 30 requests, around the
    // difference of the two ratios.
    let hits = &variants[1]["hit_ratio_vs_control"];
    assert_eq!(hits["control"], "default");
    let difference = hits["difference"].as_f64().unwrap();
    assert!((-1.0..=1.0).contains(&difference), "{hits}");
    match hits["ci95"].as_array() {
        Some(ci) => {
            assert!(enough, "{hits}");
            let (lo, hi) = (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap());
            assert!(lo <= hi && (-1.0..=1.0).contains(&lo) && (-1.0..=1.0).contains(&hi));
        }
        None => assert!(!enough, "{hits}"),
    }
    // And the always-valid one, over the same requests (each counted once).
    match hits["per_request_always_valid_ci95"].as_array() {
        Some(ci) => {
            let (lo, hi) = (ci[0].as_f64().unwrap(), ci[1].as_f64().unwrap());
            assert!(lo <= hi, "{hits}");
        }
        // None only where the bootstrap has nothing either, or found no variation at all.
        None => assert!(
            hits["ci95"]
                .as_array()
                .is_none_or(|ci| ci[0].as_f64() == ci[1].as_f64()),
            "{hits}"
        ),
    }
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_ttft_seconds_count",
            "variant=\"candidate\""
        ) > 0.0
    );
    // Removing the candidate sends everything back to the default.
    let removed = gw
        .admin_call(Method::DELETE, "/admin/policies/router?variant=candidate")
        .await;
    assert_eq!(removed.status(), 200);
    let after = gw.post_messages(&hello(2)).await;
    assert_eq!(after.headers()["x-ringmaster-variant"], "default");
}

#[tokio::test]
async fn a_shadow_decides_without_acting() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let added = put_router(
        &gw,
        "variant=rr-shadow&shadow=true",
        component("round-robin"),
    )
    .await;
    assert_eq!(added.status(), 200);
    for i in 0..20 {
        let mut request = hello(2);
        request["messages"][0]["content"] = json!(format!("question {i}"));
        let response = gw.post_messages(&request).await;
        assert_eq!(
            response.headers()["x-ringmaster-variant"],
            "default",
            "the shadow never serves"
        );
    }
    let experiments: Value = gw.admin_json(Method::GET, "/admin/experiments").await;
    let shadow = &experiments["shadow"];
    assert_eq!(shadow["name"], "rr-shadow");
    // A shadow call that overruns its 5 ms deadline on a loaded machine is a fault, not a
    // decision; all but a couple must be decisions.
    let decisions = shadow["decisions"].as_u64().unwrap();
    assert!(
        (18..=20).contains(&decisions),
        "{decisions} shadow decisions"
    );
    let rate = shadow["agreement_rate"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&rate));
    let would_be: u64 = shadow["would_be_load"]
        .as_object()
        .unwrap()
        .values()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(would_be, decisions);
    // Round-robin spreads its would-be load over all four servers.
    assert_eq!(shadow["would_be_load"].as_object().unwrap().len(), 4);
}

#[tokio::test]
async fn a_faulting_router_falls_back_then_rolls_back() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let original = policies(&gw).await["router"]["variants"][0]["hash"].clone();
    let swapped = put_router(
        &gw,
        "variant=default",
        component("fixtures/faults-on-demand"),
    )
    .await;
    assert_eq!(swapped.status(), 200, "the fixture passes the load probes");
    let chaos = || async {
        gw.client
            .post(gw.url("/v1/messages"))
            .header("x-session-id", "chaos")
            .json(&hello(2))
            .send()
            .await
            .unwrap()
    };
    // Each fault is contained: the native ring routes the request.
    for i in 1..=4 {
        assert_eq!(chaos().await.status(), 200, "chaos request {i}");
        let listed = policies(&gw).await;
        assert_ne!(
            listed["router"]["variants"][0]["hash"], original,
            "rolled back too early"
        );
        assert_eq!(listed["router"]["variants"][0]["faults"]["trap"], i);
    }
    // An ordinary request on the faulty version succeeds and ends the fault streak.
    assert_eq!(gw.post_messages(&hello(2)).await.status(), 200);
    for _ in 0..4 {
        assert_eq!(chaos().await.status(), 200);
    }
    assert_ne!(
        policies(&gw).await["router"]["variants"][0]["hash"],
        original
    );
    // The fifth fault in a row rolls the variant back to its previous version.
    assert_eq!(chaos().await.status(), 200);
    let listed = policies(&gw).await;
    assert_eq!(listed["router"]["variants"][0]["hash"], original);
    assert_eq!(chaos().await.status(), 200);
    let metrics = gw.metrics().await;
    let faults = metric_sum(&metrics, "ringmaster_policy_faults_total", "kind=\"trap\"");
    assert_eq!(faults, 9.0, "{metrics}");
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_routing_decisions_total",
            "reason=\"fallback\""
        ),
        9.0
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_http_responses_total",
            "route=\"messages\",status=\"200\""
        ),
        11.0,
        "every request succeeded"
    );
}

fn variant<'a>(listed: &'a Value, name: &str) -> &'a Value {
    listed["router"]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no variant {name}: {listed}"))
}

/// A learning router (built against the current contract, 0.3.0) behind a real gateway: every
/// request it decided is handed to its `observe`, what it keeps in `state` survives a swap,
/// and `state=fresh` starts it over.
#[tokio::test]
async fn a_learning_router_hears_every_outcome_and_keeps_its_state_across_swaps() {
    let gw = TestGateway::simulated(3, 0.0, "").await;
    let put: Value = put_router(&gw, "variant=default", component("learned-ttft"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(put["changed"], true, "{put}");
    let listed = policies(&gw).await;
    let learner = variant(&listed, "default");
    assert_eq!(
        (learner["contract"].as_str(), learner["learns"].as_bool()),
        (Some("0.3.0"), Some(true))
    );
    assert_eq!(
        learner["state"]["entries"], 0,
        "probes leave nothing behind: {learner}"
    );

    for i in 0..6 {
        let body = json!({
            "model": "sim-llama-3-8b",
            "max_tokens": 4,
            "metadata": {"user_id": format!("session-{}", i % 3)},
            "messages": [{"role": "user", "content": format!("Hello number {i}")}],
        });
        let response = gw.post_messages(&body).await;
        assert_eq!(response.status(), 200);
        response.bytes().await.unwrap();
    }
    // `observe` runs once each request has ended: its counter, the servers' learned TTFTs
    // and the routing history all live in `state`.
    let deadline = Instant::now() + Duration::from_secs(5);
    let entries = loop {
        let listed = policies(&gw).await;
        let entries = variant(&listed, "default")["state"]["entries"]
            .as_u64()
            .unwrap();
        // 3 routing keys + at least one server's TTFT + the `observed` counter.
        if entries >= 5 || Instant::now() > deadline {
            break entries;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(entries >= 5, "state holds {entries} entries");
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_policy_faults_total", ""),
        0.0,
        "no fault in route or observe"
    );

    // A swap (other config, so a new version) keeps the store; `state=fresh` empties it.
    let kept: Value = put_router(&gw, "variant=default&weight=50", component("learned-ttft"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(kept["changed"], true, "{kept}");
    let listed = policies(&gw).await;
    assert_eq!(variant(&listed, "default")["state"]["entries"], entries);
    let fresh = put_router(
        &gw,
        "variant=default&state=fresh",
        component("learned-ttft"),
    )
    .await;
    assert_eq!(fresh.status(), 200);
    let listed = policies(&gw).await;
    assert_eq!(variant(&listed, "default")["state"]["entries"], 0);
    let bad = put_router(
        &gw,
        "variant=default&state=maybe",
        component("learned-ttft"),
    )
    .await;
    assert_eq!(bad.status(), 400);
    let text = bad.text().await.unwrap();
    assert!(text.contains("state") && text.contains("fresh"), "{text}");
}

/// A component built against `ringmaster:policy@0.1.0` (the built-in consistent-hash from
/// before the contract moved, committed in `host/policy-engine/src/tests/contract-0.1.0/`)
/// still loads into a running gateway and serves, beside a variant of the current contract
/// (0.3.0).
#[tokio::test]
async fn a_component_built_against_0_1_0_is_pushed_and_serves() {
    let gw = TestGateway::simulated(3, 0.0, "").await;
    let path = format!(
        "{}/../host/policy-engine/src/tests/contract-0.1.0/consistent-hash.wasm",
        env!("CARGO_MANIFEST_DIR")
    );
    let old = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let put = put_router(&gw, "variant=old&weight=100", old).await;
    assert_eq!(put.status(), 200, "{}", put.text().await.unwrap());
    let put = put_router(
        &gw,
        "variant=default&weight=0",
        component("consistent-hash"),
    )
    .await;
    assert_eq!(put.status(), 200);
    let listed = policies(&gw).await;
    assert_eq!(variant(&listed, "old")["contract"], "0.1.0");
    assert_eq!(variant(&listed, "default")["contract"], "0.3.0");
    for i in 0..5 {
        let body = json!({
            "model": "sim-llama-3-8b",
            "max_tokens": 4,
            "messages": [{"role": "user", "content": format!("Hello from an old router {i}")}],
        });
        let response = gw.post_messages(&body).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-ringmaster-variant"], "old");
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_routing_decisions_total",
            "variant=\"old\""
        ),
        5.0
    );
}
