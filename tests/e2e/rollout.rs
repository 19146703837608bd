//! Progressive rollouts of a router, on a compressed clock (steps of a second): three
//! `ringmaster serve` replicas on one Redis, live traffic through all of them, a good
//! candidate ramped to 100 % (its judge killed half way, another replica finishing it, a
//! late replica starting on its outcome), and a bad one stopped at its first step; and the
//! same on a gateway alone, declared in its config.
//!
//! The fleet: two fast simulated servers at full ring weight, and one a hundred times slower at
//! the least weight. The ring (the control, `consistent-hash`) sends the slow one almost
//! nothing; `round-robin` (the bad candidate) sends it a third of its requests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::fleet_support::{Replica, TestRedis, fleet_config};
use crate::support::{TestGateway, eventually};

const SERVERS: &str = r#"
[[policies.router]]
name = "control"
source = "builtin:consistent-hash"

[[servers]]
address = "sim://gpu-0"
weight = 100
[[servers]]
address = "sim://gpu-1"
weight = 100
[[servers]]
address = "sim://gpu-slow?slowdown=100"
id = "gpu-slow"
weight = 1
"#;

/// A prompt long enough that its prefill shows a slow server's slowness.
fn request(n: u64) -> Value {
    let words: Vec<String> = (0..200).map(|i| format!("w{}", (i * 7 + n) % 97)).collect();
    json!({
        "model": "sim-llama-3-8b", "max_tokens": 2,
        "messages": [{"role": "user", "content": format!("Request {n}: {}", words.join(" "))}],
    })
}

/// The gateways traffic goes to (base URLs); a test takes one out before it kills it.
type Bases = Arc<Mutex<Vec<String>>>;

/// Traffic over `bases`, four at a time, each request its own session, until `stop` is set.
/// Returns how many failed.
fn traffic(bases: Bases, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<u64> {
    tokio::spawn(async move {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .unwrap();
        let next = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(AtomicU64::new(0));
        let mut senders = Vec::new();
        for _ in 0..4 {
            let (client, bases, stop) = (client.clone(), bases.clone(), stop.clone());
            let (next, failed) = (next.clone(), failed.clone());
            senders.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let base = {
                        let bases = bases.lock().unwrap();
                        bases[n as usize % bases.len()].clone()
                    };
                    let sent = client
                        .post(format!("{base}/v1/messages"))
                        .header("x-session-id", format!("rollout-{n}"))
                        .json(&request(n))
                        .send()
                        .await;
                    match sent {
                        Ok(r) if r.status() == 200 => {}
                        Ok(r) => {
                            eprintln!("request {n} via {base}: {}", r.status());
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            eprintln!("request {n} via {base}: {e}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }));
        }
        for sender in senders {
            sender.await.unwrap();
        }
        failed.load(Ordering::Relaxed)
    })
}

/// The live variants' weights, as `/admin/policies` lists them.
fn weights(policies: &Value) -> Vec<(String, u64)> {
    policies["router"]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_owned(),
                v["weight"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Waits (up to `timeout`) until `replica`'s rollout is in `phase`; returns its last reading.
async fn rollout_until(replica: &Replica, phase: &str, timeout: Duration) -> Value {
    let mut last = Value::Null;
    eventually(timeout, async || {
        last = replica.admin_json(Method::GET, "/admin/experiments").await["rollout"].clone();
        last["phase"]["state"] == phase
    })
    .await;
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_rolls_a_good_router_out_to_everyone_and_stops_a_bad_one_at_its_first_step() {
    let redis = TestRedis::start("rollout").await;
    let config = fleet_config("rollout", 0, 0.05, SERVERS);
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(Replica::start(&config, Some(&redis.url()), &format!("r{i}")).await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let bases: Bases = Arc::new(Mutex::new(
        replicas.iter().map(|r| r.base.clone()).collect(),
    ));
    let load = traffic(bases.clone(), stop.clone());
    let good = ringmaster_policy_engine::builtin::builtin("consistent-hash").unwrap();
    let started = replicas[1]
        .admin(
            Method::PUT,
            "/admin/policies/router?variant=good&rollout=10,50,100&step=1s&min_samples=40&wait=true",
        )
        .body(good.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200, "{}", started.text().await.unwrap());
    let started: Value = started.json().await.unwrap();
    assert_eq!(started["applied_everywhere"], true, "{started}");
    for replica in &replicas {
        let policies = replica.admin_json(Method::GET, "/admin/policies").await;
        assert_eq!(
            weights(&policies),
            [("control".to_owned(), 9_000), ("good".to_owned(), 1_000)],
            "replica {}",
            replica.name
        );
    }
    // While it runs, the weights are the rollout's.
    let refused = replicas[2]
        .admin(
            Method::POST,
            "/admin/policies/router/weight?variant=control&weight=5",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    // Half way, the judge (r0, the first name) dies; r1 takes over from the log.
    let half = {
        let mut last = Value::Null;
        let reached = eventually(Duration::from_secs(60), async || {
            last = replicas[2]
                .admin_json(Method::GET, "/admin/experiments")
                .await["rollout"]
                .clone();
            last["percent"] == 50 || last["phase"]["state"] != "running"
        })
        .await;
        assert!(reached, "the rollout never reached 50 %: {last}");
        last
    };
    assert_eq!(half["phase"]["state"], "running", "{half}");
    assert_eq!(half["step"], 2);
    assert!(half["next_step_at_ms"].is_u64(), "{half}");
    assert_eq!(half["guardrails"].as_array().unwrap().len(), 3, "{half}");
    bases.lock().unwrap().retain(|b| *b != replicas[0].base);
    tokio::time::sleep(Duration::from_millis(500)).await;
    replicas[0].kill();
    let done = rollout_until(&replicas[1], "promoted", Duration::from_secs(60)).await;
    assert_eq!(done["phase"]["state"], "promoted", "{done}");
    for replica in &replicas[1..] {
        let policies = replica.admin_json(Method::GET, "/admin/policies").await;
        assert_eq!(weights(&policies), [("good".to_owned(), 100)]);
    }
    // A replica that starts now replays the log: the rollout's outcome, not its start.
    let late = Replica::start(&config, Some(&redis.url()), "late").await;
    let policies = late.admin_json(Method::GET, "/admin/policies").await;
    assert_eq!(weights(&policies), [("good".to_owned(), 100)]);
    let experiments = late.admin_json(Method::GET, "/admin/experiments").await;
    assert_eq!(experiments["rollout"]["phase"]["state"], "promoted");

    // The bad candidate: a third of its requests on the slow server. The step cannot end
    // before 300 of its requests; a guardrail stops it first (the tail's looks at 200).
    let bad = ringmaster_policy_engine::builtin::builtin("round-robin").unwrap();
    let started = replicas[2]
        .admin(
            Method::PUT,
            "/admin/policies/router?variant=bad&rollout=20,50,100&step=1s&min_samples=300",
        )
        .body(bad.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200, "{}", started.text().await.unwrap());
    let stopped = rollout_until(&replicas[2], "stopped", Duration::from_secs(90)).await;
    assert_eq!(stopped["phase"]["state"], "stopped", "{stopped}");
    assert_eq!(stopped["step"], 1, "stopped at its first step: {stopped}");
    let reason = stopped["phase"]["reason"].as_str().unwrap();
    assert!(reason.starts_with("guardrail: "), "{reason}");
    for replica in [&replicas[1], &replicas[2], &late] {
        let policies = replica.admin_json(Method::GET, "/admin/policies").await;
        assert_eq!(
            weights(&policies),
            [("good".to_owned(), 100), ("bad".to_owned(), 0)],
            "replica {}",
            replica.name
        );
    }
    stop.store(true, Ordering::Relaxed);
    assert_eq!(load.await.unwrap(), 0, "no request failed for a rollout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_alone_runs_the_rollout_its_config_declares_and_an_operator_can_stop_one() {
    let gateway = TestGateway::start(&format!(
        "{SERVERS}\n\
         [[policies.router]]\nname = \"next\"\nsource = \"builtin:consistent-hash\"\n\
         rollout = [25, 100]\nrollout_step = \"1s\"\nrollout_min_samples = 20\n\
         [simulator]\ntime_scale = 0.05\n"
    ))
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(Arc::new(Mutex::new(vec![gateway.url("")])), stop.clone());
    let promoted = eventually(Duration::from_secs(60), async || {
        gateway.admin_json(Method::GET, "/admin/experiments").await["rollout"]["phase"]["state"]
            == "promoted"
    })
    .await;
    assert!(promoted, "the declared rollout was not promoted");
    let policies = gateway.admin_json(Method::GET, "/admin/policies").await;
    assert_eq!(weights(&policies), [("next".to_owned(), 100)]);
    // An operator starts another and stops it: the weights go back.
    let again = ringmaster_policy_engine::builtin::builtin("least-loaded").unwrap();
    let started = gateway
        .admin(
            Method::PUT,
            "/admin/policies/router?variant=other&rollout=5,100&step=1h",
        )
        .await
        .body(again.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200, "{}", started.text().await.unwrap());
    let stopped = gateway
        .admin_call(Method::DELETE, "/admin/policies/router/rollout")
        .await;
    assert_eq!(stopped.status(), 200);
    let policies = gateway.admin_json(Method::GET, "/admin/policies").await;
    assert_eq!(
        weights(&policies),
        [("next".to_owned(), 100), ("other".to_owned(), 0)]
    );
    let experiments = gateway.admin_json(Method::GET, "/admin/experiments").await;
    assert_eq!(
        experiments["rollout"]["phase"]["reason"],
        "stopped by an operator"
    );
    let none = gateway
        .admin_call(Method::DELETE, "/admin/policies/router/rollout")
        .await;
    assert_eq!(none.status(), 404);
    stop.store(true, Ordering::Relaxed);
    assert_eq!(load.await.unwrap(), 0);
}
