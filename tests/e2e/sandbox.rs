//! The sandbox attack suite: policies that behave on the load-time probes and then attack the
//! host (`policies/fixtures/hostile`, steered per request by `x-attack`), one that reaches for
//! WASI's environment, files and sockets (`wasi-snoop`), and one importing what the host never
//! grants (`imports-forbidden`). Each attack is contained: the request is still answered (the
//! native ring's fallback decision, or a bounded refusal), the fault is counted by kind in
//! `ringmaster_policy_faults_total` and in `/admin/policies`, repeated faults roll the version
//! back, and the gateway keeps serving; the last test runs them all at once under load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::Value;

use crate::policies::component;
use crate::support::{TestGateway, hello, metric_sum};

/// The gateway every attack meets: three servers, the attack header passed to policies, a
/// 20 ms call deadline (a debug build's slowest honest call is far under it).
async fn gateway() -> TestGateway {
    TestGateway::simulated(
        3,
        0.001,
        "[policies]\npass_headers = [\"x-attack\"]\ncall_deadline_ms = 20\n",
    )
    .await
}

async fn put(gw: &TestGateway, path: &str, bytes: Vec<u8>) -> reqwest::Response {
    gw.admin(Method::PUT, path)
        .await
        .header("content-type", "application/wasm")
        .body(bytes)
        .send()
        .await
        .unwrap()
}

async fn attack(gw: &TestGateway, name: &str) -> reqwest::Response {
    gw.client
        .post(gw.url("/v1/messages"))
        .header("x-attack", name)
        .json(&hello(2))
        .send()
        .await
        .unwrap()
}

fn default_variant(listed: &Value) -> &Value {
    &listed["router"]["variants"][0]
}

#[tokio::test]
async fn each_attack_is_contained_and_the_gateway_keeps_serving() {
    let gw = gateway().await;
    let original =
        default_variant(&gw.admin_json(Method::GET, "/admin/policies").await)["hash"].clone();
    let loaded = put(
        &gw,
        "/admin/policies/router?variant=default",
        component("fixtures/hostile"),
    )
    .await;
    assert_eq!(loaded.status(), 200, "the hostile router passes the probes");
    // (attack, the fault kind it must be counted as, or None where the call returns).
    let cases = [
        ("loop", Some("deadline")),
        ("alloc", Some("memory")),
        ("recurse", Some("trap")),
        ("trap", Some("trap")),
        ("ghost", Some("invalid-answer")),
        ("huge-route", Some("invalid-answer")),
        ("host-storm", Some("deadline")),
        ("log-flood", None),
        ("state-flood", None),
        ("counter-flood", None),
    ];
    for (name, kind) in cases {
        let before = gw.metrics().await;
        let started = Instant::now();
        let response = attack(&gw, name).await;
        let status = response.status();
        let body = response.text().await.unwrap();
        assert_eq!(status, 200, "{name}: {body}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{name} held its request {:?}",
            started.elapsed()
        );
        let after = gw.metrics().await;
        let faults = |m: &str, kind: &str| {
            metric_sum(
                m,
                "ringmaster_policy_faults_total",
                &format!("kind=\"{kind}\""),
            )
        };
        match kind {
            Some(kind) => {
                let seen: Vec<String> = after
                    .lines()
                    .filter(|l| l.starts_with("ringmaster_policy_faults_total"))
                    .map(str::to_owned)
                    .collect();
                assert_eq!(
                    faults(&after, kind) - faults(&before, kind),
                    1.0,
                    "{name} is counted as a {kind} fault: {seen:?}"
                );
                assert_eq!(
                    metric_sum(&after, "ringmaster_routing_decisions_total", "fallback")
                        - metric_sum(&before, "ringmaster_routing_decisions_total", "fallback"),
                    1.0,
                    "{name}: the native ring decided"
                );
            }
            None => {
                // A flood that returns may still run out of time; whatever it did, the
                // request was answered and nothing it wrote grew past its cap.
                let total = |m: &str| metric_sum(m, "ringmaster_policy_faults_total", "");
                assert!(total(&after) - total(&before) <= 1.0, "{name}");
            }
        }
        // The next honest request is routed by the policy itself (the streak ends).
        assert_eq!(gw.post_messages(&hello(2)).await.status(), 200, "{name}");
    }
    // The floods stayed under their caps: 256 counters, the state store's bounds.
    let metrics = gw.metrics().await;
    let counters = metrics
        .lines()
        .filter(|l| l.starts_with("ringmaster_policy_counter_total{") && l.contains("flood_"))
        .count();
    assert!(
        (1..=256).contains(&counters),
        "{counters} counters exported"
    );
    let listed = gw.admin_json(Method::GET, "/admin/policies").await;
    let variant = default_variant(&listed);
    let state = &variant["state"];
    assert!(
        state["bytes"].as_u64().unwrap() <= state["max_bytes"].as_u64().unwrap(),
        "{state}"
    );
    assert!(
        state["entries"].as_u64().unwrap() <= state["max_entries"].as_u64().unwrap(),
        "{state}"
    );
    assert_ne!(variant["hash"], original, "no rollback yet: no streak");
    // A huge refusal reaches the client bounded.
    let refused = attack(&gw, "huge-reject").await;
    assert_eq!(refused.status(), 529);
    let body = refused.text().await.unwrap();
    assert!(body.len() < 2048, "a {} byte refusal", body.len());
    assert!(body.contains('…'), "{body}");
    // Five traps in a row roll the hostile version back to the one before it.
    for _ in 0..5 {
        assert_eq!(attack(&gw, "trap").await.status(), 200);
    }
    let listed = gw.admin_json(Method::GET, "/admin/policies").await;
    assert_eq!(default_variant(&listed)["hash"], original, "rolled back");
    assert_eq!(attack(&gw, "trap").await.status(), 200);
}

#[tokio::test]
async fn wasi_gives_a_policy_no_environment_files_or_network() {
    let gw = gateway().await;
    let loaded = put(
        &gw,
        "/admin/policies/router?variant=default",
        component("fixtures/wasi-snoop"),
    )
    .await;
    assert_eq!(
        loaded.status(),
        200,
        "{}",
        loaded.text().await.unwrap_or_default()
    );
    for _ in 0..10 {
        let response = gw.post_messages(&hello(2)).await;
        let status = response.status();
        let body = response.text().await.unwrap();
        // A leak would come back as a 529 carrying what the policy found.
        assert_eq!(status, 200, "{body}");
        assert!(!body.contains("sandbox leaked"), "{body}");
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_policy_faults_total", ""),
        0.0,
        "the snoop's calls all returned: WASI answered empty, not with traps"
    );
    // A component importing what the host never grants is refused at load, naming it.
    let refused = put(
        &gw,
        "/admin/policies/router?variant=default",
        component("fixtures/imports-forbidden"),
    )
    .await;
    assert_eq!(refused.status(), 400);
    assert!(refused.text().await.unwrap().contains("evil:net"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_attack_at_once_under_load_loses_no_request() {
    let gw = Arc::new(gateway().await);
    // The hostile router as the default, the snoop as a variant beside it, and a safety
    // filter that traps on a word (failing open).
    let hostile = component("fixtures/hostile");
    assert_eq!(
        put(
            &gw,
            "/admin/policies/router?variant=default",
            hostile.clone()
        )
        .await
        .status(),
        200
    );
    let snoop = put(
        &gw,
        "/admin/policies/router?variant=snoop&weight=30",
        component("fixtures/wasi-snoop"),
    )
    .await;
    assert_eq!(snoop.status(), 200, "{}", snoop.text().await.unwrap());
    assert_eq!(
        put(
            &gw,
            "/admin/policies/safety-filter?name=chaos",
            component("fixtures/filter-faults-on-demand")
        )
        .await
        .status(),
        200
    );
    const ATTACKS: [&str; 12] = [
        "none",
        "loop",
        "alloc",
        "recurse",
        "trap",
        "ghost",
        "huge-route",
        "host-storm",
        "log-flood",
        "state-flood",
        "counter-flood",
        "none",
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let clients: Vec<_> = (0..4)
        .map(|c| {
            let (gw, stop, answered, failed) =
                (gw.clone(), stop.clone(), answered.clone(), failed.clone());
            tokio::spawn(async move {
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    let name = ATTACKS[(i * 5 + c) % ATTACKS.len()];
                    let mut body = hello(4);
                    body["stream"] = serde_json::json!(i.is_multiple_of(2));
                    if i % 7 == 3 {
                        body["messages"][0]["content"] = serde_json::json!("chaos now");
                    }
                    let response = gw
                        .client
                        .post(gw.url("/v1/messages"))
                        .header("x-attack", name)
                        .header("x-session-id", format!("s{c}-{i}"))
                        .json(&body)
                        .send()
                        .await;
                    match response {
                        Ok(r) if r.status() == 200 => {
                            let text = r.text().await.unwrap_or_default();
                            if text.contains("event: error") || text.contains("sandbox leaked") {
                                failed.lock().unwrap().push(format!("{name}: {text}"));
                            }
                        }
                        Ok(r) => {
                            let status = r.status();
                            let text = r.text().await.unwrap_or_default();
                            failed
                                .lock()
                                .unwrap()
                                .push(format!("{name}: {status} {text}"));
                        }
                        Err(e) => failed.lock().unwrap().push(format!("{name}: {e}")),
                    }
                    answered.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            })
        })
        .collect();
    // The attacker uploads the hostile version again whenever it was rolled back.
    let deadline = Instant::now() + Duration::from_secs(8);
    let mut uploads = 1;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let response = put(
            &gw,
            "/admin/policies/router?variant=default",
            hostile.clone(),
        )
        .await;
        assert_eq!(response.status(), 200);
        let changed: Value = response.json().await.unwrap();
        if changed["changed"] == true {
            uploads += 1;
        }
        assert_eq!(
            gw.client
                .get(gw.url("/healthz"))
                .send()
                .await
                .unwrap()
                .status(),
            200
        );
    }
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let failed = failed.lock().unwrap().clone();
    let answered = answered.load(Ordering::Relaxed);
    let metrics = gw.metrics().await;
    let kinds: Vec<(String, f64)> = ["deadline", "memory", "trap", "invalid-answer"]
        .iter()
        .map(|k| {
            (
                (*k).to_owned(),
                metric_sum(
                    &metrics,
                    "ringmaster_policy_faults_total",
                    &format!("kind=\"{k}\""),
                ),
            )
        })
        .collect();
    eprintln!(
        "all attacks at once: {answered} requests, {} failed, hostile uploaded {uploads} times \
         (each re-upload follows a rollback), faults by kind {kinds:?}",
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} failed: {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(answered > 50, "{answered} requests");
    assert!(
        uploads > 1,
        "the hostile version was rolled back at least once"
    );
    for (kind, count) in &kinds {
        assert!(*count >= 1.0, "no {kind} fault seen: {metrics}");
    }
    assert!(
        metric_sum(&metrics, "ringmaster_policy_faults_total", "slot=\"safety")
            + metric_sum(&metrics, "ringmaster_safety_verdicts_total", "fault")
            >= 1.0,
        "the filter's traps were counted"
    );
}
