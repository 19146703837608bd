//! The admission and safety-filter slots over real sockets: the tiered policy queueing and
//! refusing under load, the blocklist refusing prompts and cutting replies off, swapping and
//! removing both slots through the admin API.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::policies::component;
use crate::support::{TestGateway, hello, metric_sum, sse_events};

/// One server that runs one request at a time; the rest queue (capacity 2) or are refused.
const TIERED: &str = r#"
[policies.admission]
source = "builtin:tiered"
queue_capacity = 2
queue_timeout_ms = 30000
config = { max_in_flight_per_server = 1, retry_after_ms = 3000 }
"#;

fn prompt(text: &str, max_tokens: u32) -> Value {
    json!({
        "model": "sim-llama-3-8b",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": text}],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiered_admission_queues_then_refuses_with_retry_after() {
    let gw = std::sync::Arc::new(TestGateway::simulated(1, 1.0, TIERED).await);
    // Six at once against one slot: one runs, two wait, the rest are refused.
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let gw = gw.clone();
            tokio::spawn(async move {
                let response = gw.post_messages(&prompt(&format!("request {i}"), 24)).await;
                let status = response.status().as_u16();
                let retry_after = response
                    .headers()
                    .get("retry-after")
                    .map(|v| v.to_str().unwrap().to_owned());
                let body: Value = response.json().await.unwrap();
                (status, retry_after, body)
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let served = outcomes.iter().filter(|(s, ..)| *s == 200).count();
    let refused: Vec<_> = outcomes.iter().filter(|(s, ..)| *s == 429).collect();
    // Two requests that both saw one free queue place were both told to queue; the second to
    // arrive finds the gateway's queue full, which is a 529 (overloaded, retry in 1 s).
    let overloaded: Vec<_> = outcomes.iter().filter(|(s, ..)| *s == 529).collect();
    assert!(
        served >= 3,
        "the running and the queued requests are served: {outcomes:?}"
    );
    assert!(!refused.is_empty(), "a full queue refuses: {outcomes:?}");
    assert_eq!(served + refused.len() + overloaded.len(), 6, "{outcomes:?}");
    for (_, retry_after, body) in &overloaded {
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert_eq!(body["error"]["type"], "overloaded_error");
    }
    for (_, retry_after, body) in &refused {
        assert_eq!(
            retry_after.as_deref(),
            Some("3"),
            "the policy's retry-after"
        );
        assert_eq!(body["error"]["type"], "rate_limit_error");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("queue is full"), "{message}");
    }
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_admission_decisions_total",
            "verdict=\"queue\""
        ) >= 1.0
    );
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_admission_queue_wait_seconds_count",
            ""
        ) >= 2.0
    );
    assert_eq!(metric_sum(&metrics, "ringmaster_admission_queued", ""), 0.0);
}

#[tokio::test]
async fn a_request_waiting_past_the_queue_timeout_is_refused() {
    let config = TIERED.replace("queue_timeout_ms = 30000", "queue_timeout_ms = 150");
    let gw = std::sync::Arc::new(TestGateway::simulated(1, 1.0, &config).await);
    let long = {
        let gw = gw.clone();
        // About 2.4 s of modelled decoding: holds the only slot well past the timeout.
        tokio::spawn(async move { gw.post_messages(&prompt("a long one", 300)).await.status() })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let waited = gw.post_messages(&prompt("a short one", 4)).await;
    assert_eq!(waited.status(), 529);
    assert!(waited.headers().contains_key("retry-after"));
    let body: Value = waited.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("waited"),
        "{body}"
    );
    assert_eq!(long.await.unwrap(), 200);
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_admission_queue_timeouts_total", ""),
        1.0
    );
}

/// Words the simulated model says often (and "forbidden" for prompts).
const BLOCKLIST: &str = r#"
[policies.safety]
source = "builtin:blocklist"
window_bytes = 32
config = { patterns = "forbidden, the, of, and, to, in, is" }
"#;

fn assert_clean(text: &str) {
    let lower = text.to_lowercase();
    for pattern in ["the", "of", "and", "to", "in", "is"] {
        assert!(
            !lower.contains(pattern),
            "blocked text {pattern:?} reached the client: {text:?}"
        );
    }
}

#[tokio::test]
async fn the_blocklist_refuses_a_prompt_and_cuts_a_reply_off() {
    let gw = TestGateway::simulated(2, 0.0, BLOCKLIST).await;
    let refused = gw
        .post_messages(&prompt("say something FORBIDDEN please", 8))
        .await;
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("safety filter blocked the prompt"),
        "{message}"
    );
    assert!(message.contains("blocklist rule 0"), "{message}");

    let plain: Value = gw
        .post_messages(&prompt("Hey", 200))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(plain["stop_reason"], "refusal", "{plain}");
    assert_clean(plain["content"][0]["text"].as_str().unwrap());

    let mut streamed = prompt("Hey", 200);
    streamed["stream"] = json!(true);
    let body = gw.post_messages(&streamed).await.text().await.unwrap();
    let events = sse_events(&body);
    let text: String = events
        .iter()
        .filter(|(e, _)| e == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    assert_clean(&text);
    let names: Vec<_> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "refusal");
    assert_eq!(plain["content"][0]["text"].as_str().unwrap(), text);

    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_safety_verdicts_total",
            "stage=\"input\",verdict=\"block\""
        ),
        1.0
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_safety_verdicts_total",
            "stage=\"output\",verdict=\"block\""
        ),
        2.0
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_policy_counter_total",
            "counter=\"blocked_output\""
        ),
        2.0
    );
}

#[tokio::test]
async fn an_allowing_filter_holds_back_nothing() {
    let plain = TestGateway::simulated(2, 0.0, "").await;
    let filtered = TestGateway::simulated(
        2,
        0.0,
        &BLOCKLIST.replace(
            "forbidden, the, of, and, to, in, is",
            "never-said-by-the-model",
        ),
    )
    .await;
    for stream in [false, true] {
        let mut request = prompt("Tell me everything", 150);
        request["stream"] = json!(stream);
        let a = plain.post_messages(&request).await.text().await.unwrap();
        let b = filtered.post_messages(&request).await.text().await.unwrap();
        let text = |body: &str| -> String {
            if stream {
                sse_events(body)
                    .iter()
                    .filter(|(e, _)| e == "content_block_delta")
                    .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
                    .collect()
            } else {
                let v: Value = serde_json::from_str(body).unwrap();
                v["content"][0]["text"].as_str().unwrap().to_owned()
            }
        };
        assert!(
            text(&a).len() > 300,
            "a reply long enough for several windows"
        );
        assert_eq!(text(&a), text(&b), "stream: {stream}");
    }
}

#[tokio::test]
async fn admission_and_safety_slots_swap_roll_back_and_empty_through_the_admin_api() {
    let gw = TestGateway::simulated(2, 0.0, "").await;
    let listed: Value = gw.admin_json(Method::GET, "/admin/policies").await;
    assert!(listed["admission"]["policy"].is_null());
    assert!(listed["safety_filter"]["policy"].is_null());

    let put = |path: &'static str, bytes: Vec<u8>| {
        let gw = &gw;
        async move {
            gw.admin(Method::PUT, path)
                .await
                .body(bytes)
                .send()
                .await
                .unwrap()
        }
    };
    // A router component in the admission slot is for another world: refused.
    let wrong = put("/admin/policies/admission", component("consistent-hash")).await;
    assert_eq!(wrong.status(), 400);
    let why: Value = wrong.json().await.unwrap();
    assert!(
        why["error"]["message"]
            .as_str()
            .unwrap()
            .contains("admission"),
        "{why}"
    );
    let tiered = put("/admin/policies/admission", component("tiered")).await;
    assert_eq!(tiered.status(), 200);
    let tiered: Value = tiered.json().await.unwrap();
    assert_eq!(tiered["admission"]["policy"]["name"], "admission");
    assert_eq!(gw.post_messages(&hello(2)).await.status(), 200);

    let blocklist = put(
        "/admin/policies/safety-filter?name=words",
        component("blocklist"),
    )
    .await;
    assert_eq!(blocklist.status(), 200);
    let listed: Value = blocklist.json().await.unwrap();
    assert_eq!(listed["safety_filter"]["policy"]["name"], "words");
    // No patterns configured: everything passes.
    assert_eq!(gw.post_messages(&hello(2)).await.status(), 200);
    let rollback = gw
        .admin_call(Method::POST, "/admin/policies/safety-filter/rollback")
        .await;
    assert_eq!(rollback.status(), 400, "nothing to roll back to");

    for slot in ["admission", "safety-filter"] {
        let removed = gw
            .admin_call(Method::DELETE, &format!("/admin/policies/{slot}"))
            .await;
        assert_eq!(removed.status(), 200, "{slot}");
    }
    let listed: Value = gw.admin_json(Method::GET, "/admin/policies").await;
    assert!(listed["admission"]["policy"].is_null());
    assert!(listed["safety_filter"]["policy"].is_null());
    assert_eq!(gw.post_messages(&hello(2)).await.status(), 200);
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_admission_decisions_total",
            "verdict=\"accept\""
        ) >= 1.0
    );
}
