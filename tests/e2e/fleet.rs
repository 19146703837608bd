//! Gateway replicas sharing one Redis (`--cluster`): three `ringmaster serve` processes on
//! loopback, each with the same configuration file, and what they must agree on: the
//! membership and policies an admin changes on any one, the A/B variant and server of every
//! session, a tenant's limit, the load on each server; and what happens when Redis or a
//! replica dies.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::fleet_support::{Replica, TestRedis, fleet_config};
use crate::support::eventually;

async fn three(redis: &TestRedis, config: &std::path::Path) -> Vec<Replica> {
    let mut replicas = Vec::new();
    for i in 0..3 {
        replicas.push(Replica::start(config, Some(&redis.url()), &format!("r{i}")).await);
    }
    replicas
}

fn server_ids(servers: &Value) -> Vec<String> {
    let mut ids: Vec<String> = servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["state"] == "active")
        .map(|s| s["id"].as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    ids
}

fn body(text: &str, max_tokens: u32) -> Value {
    json!({
        "model": "sim-llama-3-8b", "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_change_on_one_replica_holds_on_all_and_a_late_replica_starts_on_it() {
    let redis = TestRedis::start("membership").await;
    let config = fleet_config("membership", 3, 0.0, "");
    let replicas = three(&redis, &config).await;
    let added = replicas[0]
        .admin(Method::POST, "/admin/servers?wait=true")
        .json(&json!({"address": "sim://gpu-9", "id": "gpu-9"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let added: Value = added.json().await.unwrap();
    assert_eq!(added["applied_everywhere"], true, "{added}");
    let revision = added["revision"].as_u64().unwrap();
    let removed: Value = replicas[2]
        .admin_json(Method::DELETE, "/admin/servers/gpu-1?wait=true")
        .await;
    assert_eq!(
        removed["revision"].as_u64(),
        Some(revision + 1),
        "{removed}"
    );
    assert_eq!(removed["applied_everywhere"], true);
    let expected = vec!["gpu-0", "gpu-2", "gpu-9"];
    for replica in &replicas {
        let servers = replica.admin_json(Method::GET, "/admin/servers").await;
        assert_eq!(server_ids(&servers), expected, "replica {}", replica.name);
    }
    // A refused change reaches no replica: a duplicate is refused where it is asked.
    let duplicate = replicas[1]
        .admin(Method::POST, "/admin/servers")
        .json(&json!({"address": "sim://gpu-9", "id": "gpu-9"}))
        .send()
        .await
        .unwrap();
    assert_eq!(duplicate.status(), 409);
    // The cluster view: three replicas, each at the head.
    let cluster = replicas[1].admin_json(Method::GET, "/admin/cluster").await;
    let head = cluster["cluster"]["head_revision"].as_u64().unwrap();
    assert!(head > revision, "{cluster}");
    let listed = cluster["replicas"].as_array().unwrap();
    assert_eq!(listed.len(), 3, "{cluster}");
    for replica in listed {
        assert!(
            replica["servers"].as_object().unwrap().len() >= 3,
            "{replica}"
        );
    }
    // A replica started now applies the log before it serves: it has the fleet's servers.
    let late = Replica::start(&config, Some(&redis.url()), "late").await;
    let servers = late.admin_json(Method::GET, "/admin/servers").await;
    assert_eq!(server_ids(&servers), expected);
    // The audit trail is the fleet's: any replica lists the changes every replica made, newest
    // first, with who, the answer and the revision.
    let audit = late.admin_json(Method::GET, "/admin/audit").await;
    let entries = audit["entries"].as_array().unwrap();
    let seen: Vec<(&str, &str, &str, u64)> = entries
        .iter()
        .map(|e| {
            (
                e["replica"].as_str().unwrap(),
                e["method"].as_str().unwrap(),
                e["path"].as_str().unwrap(),
                e["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("r1", "POST", "/admin/servers", 409),
            ("r2", "DELETE", "/admin/servers/gpu-1?wait=true", 200),
            ("r0", "POST", "/admin/servers?wait=true", 201),
        ],
        "{audit}"
    );
    assert!(entries.iter().all(|e| e["token"] == "admin"));
    // The revision each change became, and what it was made to.
    assert_eq!(entries[1]["revision"].as_u64(), Some(revision + 1));
    assert_eq!(
        entries[1]["object"],
        json!({"server": {"id": "gpu-1", "address": "sim://gpu-1"}}),
        "{audit}"
    );
    assert_eq!(entries[2]["revision"].as_u64(), Some(revision));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_sends_each_session_to_the_same_variant_and_server_after_a_swap_on_one() {
    let redis = TestRedis::start("variants").await;
    let config = fleet_config("variants", 4, 0.0, "");
    let replicas = three(&redis, &config).await;
    let candidate = ringmaster_policy_engine::builtin::builtin("consistent-hash").unwrap();
    let swapped = replicas[1]
        .admin(
            Method::PUT,
            "/admin/policies/router?variant=candidate&weight=100&wait=true",
        )
        .body(candidate.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(swapped.status(), 200, "{}", swapped.text().await.unwrap());
    let mut variants_seen = std::collections::BTreeSet::new();
    for session in 0..1000 {
        let request = body(&format!("Question {session} about the fleet"), 4);
        let id = format!("session-{session}");
        let first = replicas[0].explain(&request, &id).await;
        for replica in &replicas[1..] {
            assert_eq!(
                replica.explain(&request, &id).await,
                first,
                "session {session} on {}",
                replica.name
            );
        }
        variants_seen.insert(first.0.to_string());
    }
    assert_eq!(
        variants_seen.len(),
        2,
        "both variants serve: {variants_seen:?}"
    );
    // The experiment's figures are the fleet's: requests through every replica count.
    for (i, replica) in replicas.iter().enumerate() {
        for n in 0..10 {
            let response = replica
                .client
                .post(replica.url("/v1/messages"))
                .header("x-session-id", format!("traffic-{i}-{n}"))
                .json(&body("Hello", 4))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status(), 200);
        }
    }
    let total = async || {
        let experiments = replicas[2]
            .admin_json(Method::GET, "/admin/experiments")
            .await;
        experiments["variants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["requests"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert!(
        eventually(Duration::from_secs(5), async || total().await == 30).await,
        "the experiment counts {} requests, not the fleet's 30",
        total().await
    );
}

/// Sends `requests` requests with `key`, spread in turn over `replicas`; returns how many
/// were let in.
async fn admitted(replicas: &[&Replica], key: &str, requests: usize) -> usize {
    let mut ok = 0;
    for n in 0..requests {
        let replica = replicas[n % replicas.len()];
        let response = replica
            .client
            .post(replica.url("/v1/messages"))
            .header("x-api-key", key)
            .json(&body("Hello", 2))
            .send()
            .await
            .unwrap();
        match response.status().as_u16() {
            200 => ok += 1,
            429 => {}
            other => panic!("unexpected status {other}"),
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_limit_holds_across_replicas_and_is_per_replica_without_the_cluster() {
    const LIMIT: usize = 30;
    let extra = format!(
        "[[tenants]]\nname = \"acme\"\nrequests_per_minute = {LIMIT}\n\
         [[api_keys]]\nkey = \"sk-acme-0001\"\ntenant = \"acme\"\n"
    );
    // A generous deadline: a debug build on a busy test machine is slower than production.
    let clustered = fleet_config(
        "limits",
        2,
        0.0,
        &format!("{extra}[cluster]\ndeadline_ms = 200\n"),
    );
    let config = fleet_config("limits-alone", 2, 0.0, &extra);
    let redis = TestRedis::start("limits").await;
    let replicas = three(&redis, &clustered).await;
    let started = Instant::now();
    let ok = admitted(
        &replicas.iter().collect::<Vec<_>>(),
        "sk-acme-0001",
        3 * LIMIT,
    )
    .await;
    // The bucket refills at LIMIT per minute while the test runs.
    let refill = started.elapsed().as_secs_f64() * LIMIT as f64 / 60.0;
    let bound = (LIMIT as f64 + refill) * 1.05;
    assert!(
        ok >= LIMIT && ok as f64 <= bound,
        "{ok} requests let in over three replicas for a limit of {LIMIT} (bound {bound:.1})"
    );
    drop(replicas);
    // Alone, each replica keeps its own bucket: about three times the limit.
    let alone: Vec<Replica> = {
        let mut v = Vec::new();
        for i in 0..3 {
            v.push(Replica::start(&config, None, &format!("alone-{i}")).await);
        }
        v
    };
    let ok = admitted(&alone.iter().collect::<Vec<_>>(), "sk-acme-0001", 3 * LIMIT).await;
    assert!(
        ok >= 3 * LIMIT - 3,
        "without --cluster each replica lets in its own {LIMIT}: {ok} of {}",
        3 * LIMIT
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_large_enough_to_slice_holds_across_replicas_with_most_admissions_off_redis() {
    // 2,400 a minute refills 2 requests per 50 ms: each replica takes slices of 2.
    const LIMIT: usize = 2_400;
    let extra = format!(
        "[[tenants]]\nname = \"bulk\"\nrequests_per_minute = {LIMIT}\n\
         [[api_keys]]\nkey = \"sk-bulk-0001\"\ntenant = \"bulk\"\n\
         [cluster]\ndeadline_ms = 200\n"
    );
    let config = fleet_config("slices", 2, 0.0, &extra);
    let redis = TestRedis::start("slices").await;
    let replicas = three(&redis, &config).await;
    let started = Instant::now();
    let sent = LIMIT + LIMIT / 4;
    // Four senders at once, so replicas draw on the bucket side by side.
    let counts = futures_util::future::join_all((0..4).map(|i| {
        let mine: Vec<&Replica> = (0..3).map(|r| &replicas[(r + i) % 3]).collect();
        async move { admitted(&mine, "sk-bulk-0001", sent / 4).await }
    }))
    .await;
    let ok: usize = counts.iter().sum();
    let refill = started.elapsed().as_secs_f64() * LIMIT as f64 / 60.0;
    let bound = (LIMIT as f64 + refill) * 1.05;
    assert!(
        ok as f64 <= bound && ok as f64 >= LIMIT as f64 * 0.95,
        "{ok} let in over three replicas for a limit of {LIMIT} (bound {bound:.0})"
    );
    let mut sliced = 0.0;
    for replica in &replicas {
        let metrics = replica
            .client
            .get(replica.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        sliced +=
            crate::support::metric_sum(&metrics, "ringmaster_cluster_slice_admissions_total", "");
    }
    assert!(
        sliced >= ok as f64 / 4.0,
        "only {sliced} of {ok} admissions were paid from slices"
    );
}

/// `/admin/route/explain` for the probe session on `replica`: (chosen, total in flight seen).
async fn probe(replica: &Replica, request: &Value) -> (Value, u64) {
    let explained: Value = replica
        .admin(Method::POST, "/admin/route/explain")
        .header("x-session-id", "probe")
        .json(request)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let total = explained["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["in_flight"].as_u64().unwrap())
        .sum();
    (explained["chosen"].clone(), total)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounded_load_walk_skips_a_server_filled_through_another_replica() {
    let redis = TestRedis::start("load").await;
    // Slow servers (a long answer stays in flight for seconds) and a cap of exactly the fair
    // share (load factor 1), so that a few requests fill one.
    let config = fleet_config(
        "load",
        4,
        1.0,
        "[routing]
load_factor = 1.0
",
    );
    let replicas = three(&redis, &config).await;
    let request = body("probe", 4);
    let (target, _) = probe(&replicas[0], &request).await;
    // Requests for the probe's own session, sent through replica 1 one at a time until
    // replica 1 itself would walk past the probe's server.
    let mut fillers = Vec::new();
    let mut walked_on_1 = false;
    for n in 0..16u64 {
        let client = replicas[1].client.clone();
        let url = replicas[1].url("/v1/messages");
        fillers.push(tokio::spawn(async move {
            client
                .post(url)
                .header("x-session-id", "probe")
                .json(&body("Tell me a long story", 2000))
                .send()
                .await
                .map(|r| r.status().as_u16())
        }));
        assert!(
            eventually(Duration::from_secs(5), async || probe(
                &replicas[1],
                &request
            )
            .await
            .1 > n)
            .await,
            "filler {n} is not in flight"
        );
        if probe(&replicas[1], &request).await.0 != target {
            walked_on_1 = true;
            break;
        }
    }
    assert!(walked_on_1, "replica 1 never filled {target}");
    // Replica 0 sent nothing, yet it sees the fleet's load and walks past the server too.
    let walked_on_0 = eventually(Duration::from_secs(5), async || {
        probe(&replicas[0], &request).await.0 != target
    })
    .await;
    assert!(
        walked_on_0,
        "replica 0 still sends the probe to {target}, filled through replica 1"
    );
    for filler in fillers {
        filler.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_under_load_fails_no_request() {
    let mut redis = TestRedis::start("faults").await;
    let extra = "[[tenants]]\nname = \"acme\"\nrequests_per_minute = 100000\n\
                 [[api_keys]]\nkey = \"sk-acme-0002\"\ntenant = \"acme\"\n";
    let config = fleet_config("faults", 3, 0.0, extra);
    let replicas = three(&redis, &config).await;
    let load = |replica: &Replica, offset: usize| {
        let client = replica.client.clone();
        let url = replica.url("/v1/messages");
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for n in 0..150 {
                let status = client
                    .post(&url)
                    .header("x-api-key", "sk-acme-0002")
                    .header("x-session-id", format!("s-{offset}-{n}"))
                    .json(&body("Hello", 2))
                    .send()
                    .await
                    .map_or(0, |r| r.status().as_u16());
                statuses.push(status);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            statuses
        })
    };
    let running: Vec<_> = replicas
        .iter()
        .enumerate()
        .map(|(i, r)| load(r, i))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.kill();
    tokio::time::sleep(Duration::from_millis(800)).await;
    redis.restart().await;
    for job in running {
        let statuses = job.await.unwrap();
        assert!(
            statuses.iter().all(|s| *s == 200),
            "failed requests: {:?}",
            statuses.iter().filter(|s| **s != 200).collect::<Vec<_>>()
        );
    }
    // Back: the replicas re-register and follow the log again.
    let added = replicas[0]
        .admin(Method::POST, "/admin/servers?wait=true")
        .json(&json!({"address": "sim://gpu-7", "id": "gpu-7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let added: Value = added.json().await.unwrap();
    assert_eq!(added["applied_everywhere"], true, "{added}");
    for replica in &replicas {
        let servers = replica.admin_json(Method::GET, "/admin/servers").await;
        assert!(server_ids(&servers).contains(&"gpu-7".to_owned()));
    }
    let cluster = replicas[2].admin_json(Method::GET, "/admin/cluster").await;
    assert_eq!(
        cluster["replicas"].as_array().unwrap().len(),
        3,
        "{cluster}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_leaves_the_cluster_and_its_load_drops_out() {
    let redis = TestRedis::start("leases").await;
    let config = fleet_config("leases", 2, 1.0, "");
    let mut replicas = three(&redis, &config).await;
    // Long requests in flight through replica 2.
    let mut long = Vec::new();
    for n in 0..6 {
        let client = replicas[2].client.clone();
        let url = replicas[2].url("/v1/messages");
        long.push(tokio::spawn(async move {
            let _ = client
                .post(url)
                .header("x-session-id", format!("long-{n}"))
                .json(&body("Tell me a long story", 400))
                .send()
                .await;
        }));
    }
    let remote_in_flight = async |replica: &Replica| {
        let explained: Value = replica
            .admin(Method::POST, "/admin/route/explain")
            .json(&body("probe", 4))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        explained["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["in_flight"].as_u64().unwrap() - c["in_flight_here"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert!(
        eventually(Duration::from_secs(5), async || remote_in_flight(
            &replicas[0]
        )
        .await
            >= 6)
        .await,
        "replica 0 does not see replica 2's requests"
    );
    replicas[2].kill();
    let gone_at = Instant::now();
    assert!(
        eventually(Duration::from_secs(8), async || {
            let cluster = replicas[0].admin_json(Method::GET, "/admin/cluster").await;
            cluster["replicas"].as_array().unwrap().len() == 2
        })
        .await,
        "the killed replica's lease did not lapse"
    );
    assert!(
        eventually(Duration::from_secs(5), async || remote_in_flight(
            &replicas[0]
        )
        .await
            == 0)
        .await,
        "the killed replica's in-flight requests still count"
    );
    assert!(gone_at.elapsed() < Duration::from_secs(8));
    for job in long {
        job.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_added_on_one_replica_admits_on_all_within_a_second_and_its_removal_too() {
    let redis = TestRedis::start("keys").await;
    let config = fleet_config("keys", 1, 0.0, "[[api_keys]]\nkey = \"sk-fleet-base-01\"\n");
    let replicas = three(&redis, &config).await;
    let chat = async |replica: &Replica, key: Option<&str>| {
        let mut request = replica
            .client
            .post(format!("{}/v1/messages", replica.base))
            .json(&body("Which key?", 2));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.send().await.unwrap().status().as_u16()
    };
    let tenant = replicas[0]
        .admin(Method::POST, "/admin/tenants")
        .json(&json!({"name": "acme", "requests_per_minute": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(tenant.status(), 201);
    let added = replicas[1]
        .admin(Method::POST, "/admin/keys")
        .json(&json!({"tenant": "acme", "tier": "gold"}))
        .send()
        .await
        .unwrap();
    let asked = Instant::now();
    assert_eq!(added.status(), 201);
    let added: Value = added.json().await.unwrap();
    let key = added["key"].as_str().unwrap().to_owned();
    let id = added["id"].as_str().unwrap().to_owned();
    assert!(key.starts_with("sk-rm-") && key.len() == 70, "{added}");
    for replica in &replicas {
        let admitted = eventually(Duration::from_secs(1), async || {
            chat(replica, Some(&key)).await == 200
        })
        .await;
        assert!(
            admitted,
            "replica {} never admitted the new key",
            replica.name
        );
        assert_eq!(chat(replica, None).await, 401);
    }
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    // Listed by id and tenant on every replica; the key itself is never shown again.
    let listed = replicas[2].admin_json(Method::GET, "/admin/keys").await;
    assert_eq!(listed["keys"][1]["id"], id.as_str());
    assert_eq!(listed["keys"][1]["tenant"], "acme");
    assert!(!listed.to_string().contains(&key));
    // A tenant with keys stays; the key's removal holds everywhere.
    let in_use = replicas[2]
        .admin(Method::DELETE, "/admin/tenants/acme")
        .send()
        .await
        .unwrap();
    assert_eq!(in_use.status(), 409);
    let removed = replicas[2]
        .admin(Method::DELETE, &format!("/admin/keys/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    for replica in &replicas {
        let refused = eventually(Duration::from_secs(1), async || {
            chat(replica, Some(&key)).await == 401
        })
        .await;
        assert!(
            refused,
            "replica {} still admits the removed key",
            replica.name
        );
    }
}

/// Stored responses belong to the key that made them, not to its place in the key list:
/// after a restart with the keys reordered and one inserted in front (the `key#N` labels all
/// shift), each key still reads its own responses and gets 404 for the other's, and cannot
/// continue the other's conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_responses_stay_with_their_key_when_the_keys_are_reordered_across_a_restart() {
    const ALICE: &str = "sk-owner-alice-0123456789";
    const BOB: &str = "sk-owner-bob-0123456789";
    const CAROL: &str = "sk-owner-carol-0123456789";
    let redis = TestRedis::start("owners").await;
    let keys = |order: &[&str]| {
        order
            .iter()
            .map(|key| format!("[[api_keys]]\nkey = \"{key}\"\n"))
            .collect::<String>()
    };
    let store = async |replica: &Replica, key: &str, text: &str| -> String {
        let response = replica
            .client
            .post(replica.url("/v1/responses"))
            .bearer_auth(key)
            .json(&json!({"model": "sim-llama-3-8b", "max_output_tokens": 4, "input": text}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        let stored: Value = response.json().await.unwrap();
        stored["id"].as_str().unwrap().to_owned()
    };
    let read = async |replica: &Replica, key: &str, id: &str| -> u16 {
        replica
            .client
            .get(replica.url(&format!("/v1/responses/{id}")))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    let config = fleet_config("owners", 1, 0.0, &keys(&[ALICE, BOB]));
    let mut first = Replica::start(&config, Some(&redis.url()), "r0").await;
    let alices = store(&first, ALICE, "Alice's question").await;
    let bobs = store(&first, BOB, "Bob's question").await;
    assert_eq!(read(&first, ALICE, &alices).await, 200);
    assert_eq!(read(&first, BOB, &alices).await, 404);
    first.kill();
    // Carol in front, Bob before Alice: Bob is now where Alice was (`key#1` → `key#2`, …).
    let config = fleet_config("owners-reordered", 1, 0.0, &keys(&[CAROL, BOB, ALICE]));
    let second = Replica::start(&config, Some(&redis.url()), "r0").await;
    for (key, own, other) in [(ALICE, &alices, &bobs), (BOB, &bobs, &alices)] {
        assert_eq!(read(&second, key, own).await, 200, "{key} reads its own");
        assert_eq!(
            read(&second, key, other).await,
            404,
            "{key} reads not the other's"
        );
        assert_eq!(
            read(&second, CAROL, own).await,
            404,
            "the new key reads neither"
        );
    }
    let continued = second
        .client
        .post(second.url("/v1/responses"))
        .bearer_auth(BOB)
        .json(&json!({"model": "sim-llama-3-8b", "max_output_tokens": 4,
                      "input": "And then?", "previous_response_id": alices}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        continued.status(),
        404,
        "Bob cannot continue Alice's conversation"
    );
}
