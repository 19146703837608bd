//! The Messages API, models, health, readiness and metrics endpoints.

use serde_json::json;

use crate::support::{TestGateway, hello, metric_sum, sse_events};

#[tokio::test]
async fn non_streaming_reply_has_the_anthropic_shape() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let response = gw.post_messages(&hello(12)).await;
    assert_eq!(response.status(), 200);
    assert!(
        response.headers()["request-id"]
            .to_str()
            .unwrap()
            .starts_with("req_")
    );
    assert!(response.headers().contains_key("x-ringmaster-server"));
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(body["id"].as_str().unwrap().starts_with("msg_"));
    assert_eq!(body["type"], "message");
    assert_eq!(body["role"], "assistant");
    assert_eq!(body["model"], "sim-llama-3-8b");
    assert_eq!(body["content"][0]["type"], "text");
    assert!(!body["content"][0]["text"].as_str().unwrap().is_empty());
    let stop = body["stop_reason"].as_str().unwrap();
    assert!(stop == "end_turn" || stop == "max_tokens", "{stop}");
    let usage = &body["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0);
    assert!(usage["output_tokens"].as_u64().unwrap() <= 12);
    assert_eq!(usage["cache_creation_input_tokens"], 0);
    assert!(usage["cache_read_input_tokens"].is_u64());
}

#[tokio::test]
async fn max_tokens_and_stop_sequences_end_the_reply() {
    let gw = TestGateway::simulated(1, 0.0, "").await;
    let body: serde_json::Value = gw.post_messages(&hello(3)).await.json().await.unwrap();
    assert_eq!(body["stop_reason"], "max_tokens");
    assert_eq!(body["usage"]["output_tokens"], 3);
    // Learn the deterministic reply, then stop on its third word.
    let full: serde_json::Value = gw.post_messages(&hello(64)).await.json().await.unwrap();
    let text = full["content"][0]["text"].as_str().unwrap().to_owned();
    let third = text.split_whitespace().nth(2).unwrap().to_owned();
    let mut request = hello(64);
    request["stop_sequences"] = json!([format!(" {third}")]);
    let stopped: serde_json::Value = gw.post_messages(&request).await.json().await.unwrap();
    assert_eq!(stopped["stop_reason"], "stop_sequence");
    assert_eq!(stopped["stop_sequence"], format!(" {third}"));
    let stopped_text = stopped["content"][0]["text"].as_str().unwrap();
    assert!(text.starts_with(stopped_text));
    assert!(
        !stopped_text.contains(&format!(" {third}")),
        "the stop sequence is not part of the text"
    );
    assert!(stopped_text.len() < text.len());
}

#[tokio::test]
async fn streaming_sends_anthropic_events_in_order() {
    let gw = TestGateway::simulated(2, 0.0, "").await;
    let mut request = hello(20);
    request["stream"] = json!(true);
    let response = gw.post_messages(&request).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    assert!(response.headers().contains_key("request-id"));
    let events = sse_events(&response.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..3], ["message_start", "ping", "content_block_start"]);
    assert_eq!(
        names[names.len() - 3..],
        ["content_block_stop", "message_delta", "message_stop"]
    );
    let deltas = &names[3..names.len() - 3];
    assert!(!deltas.is_empty() && deltas.iter().all(|n| *n == "content_block_delta"));
    for (name, data) in &events {
        assert_eq!(
            data["type"],
            name.as_str(),
            "data.type matches the event name"
        );
    }
    let start = &events[0].1["message"];
    assert!(start["id"].as_str().unwrap().starts_with("msg_"));
    assert!(start["usage"]["input_tokens"].as_u64().unwrap() > 0);
    let text: String = events[3..events.len() - 3]
        .iter()
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_owned())
        .collect();
    // The same request without streaming gives the same deterministic text.
    let plain: serde_json::Value = gw.post_messages(&hello(20)).await.json().await.unwrap();
    assert_eq!(plain["content"][0]["text"], text.as_str());
    let delta = &events[events.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], plain["stop_reason"]);
    assert_eq!(
        delta["usage"]["output_tokens"],
        plain["usage"]["output_tokens"]
    );
}

#[tokio::test]
async fn repeated_prefix_is_served_from_cache_and_reported() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let system = "You are a meticulous assistant for a travel agency. ".repeat(60);
    let request = json!({
        "model": "sim-llama-3-8b", "max_tokens": 8, "system": system,
        "messages": [{"role": "user", "content": "Suggest a weekend in Lisbon"}],
    });
    let first = gw.post_messages(&request).await;
    let first_server = first.headers()["x-ringmaster-server"]
        .to_str()
        .unwrap()
        .to_owned();
    let first: serde_json::Value = first.json().await.unwrap();
    let second = gw.post_messages(&request).await;
    assert_eq!(
        second.headers()["x-ringmaster-server"].to_str().unwrap(),
        first_server,
        "same key, same server"
    );
    let second: serde_json::Value = second.json().await.unwrap();
    assert_eq!(first["usage"]["cache_read_input_tokens"], 0);
    let cached = second["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    let computed = second["usage"]["input_tokens"].as_u64().unwrap();
    assert!(
        cached > 10 * computed,
        "cached {cached}, computed {computed}"
    );
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(&metrics, "ringmaster_server_cached_prompt_tokens_total", "") >= cached as f64
    );
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_server_prefix_cache_hit_ratio",
            &format!("server=\"{first_server}\"")
        ) > 0.4
    );
}

#[tokio::test]
async fn models_health_ready_and_metrics() {
    let gw = TestGateway::simulated(1, 0.0, "").await;
    let models: serde_json::Value = gw
        .client
        .get(gw.url("/v1/models"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "sim-llama-3-8b");
    assert_eq!(models["data"][0]["type"], "model");
    assert_eq!(models["has_more"], false);
    let one = gw
        .client
        .get(gw.url("/v1/models/sim-llama-3-8b"))
        .send()
        .await
        .unwrap();
    assert_eq!(one.status(), 200);
    let missing = gw
        .client
        .get(gw.url("/v1/models/nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    for path in ["/healthz", "/readyz"] {
        let response = gw.client.get(gw.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert!(response.headers().contains_key("request-id"));
    }
    gw.post_messages(&hello(4)).await;
    let metrics = gw.metrics().await;
    for family in [
        "ringmaster_server_requests_total",
        "ringmaster_server_in_flight",
        "ringmaster_server_kv_blocks_used",
        "ringmaster_server_kv_usage_ratio",
        "ringmaster_server_prefix_cache_hit_ratio",
        "ringmaster_ttft_seconds_bucket",
        "ringmaster_request_duration_seconds_bucket",
        "ringmaster_routing_decisions_total",
        "ringmaster_http_responses_total",
    ] {
        assert!(metrics.contains(family), "missing {family} in:\n{metrics}");
    }
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_requests_total", ""),
        1.0
    );
    assert_eq!(
        metric_sum(&metrics, "ringmaster_ttft_seconds_count", ""),
        1.0
    );
    // The engine's step counters: the one request decoded its 4 tokens (the last sampled
    // token is never computed, so 3 decode steps) after prefilling its whole prompt.
    let prompt = metric_sum(&metrics, "ringmaster_server_prompt_tokens_total", "");
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_prefill_tokens_total", ""),
        prompt
    );
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_decode_tokens_total", ""),
        3.0
    );
    let steps = metric_sum(&metrics, "ringmaster_server_steps_total", "");
    assert!(steps >= 4.0, "{steps} steps");
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_step_tokens_total", ""),
        prompt + 3.0
    );
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_step_sequences_total", ""),
        steps
    );
    assert!(metric_sum(&metrics, "ringmaster_server_step_budget_tokens_total", "") >= steps);
    assert!(metric_sum(&metrics, "ringmaster_server_busy_seconds_total", "") >= 0.0);
    // One request alone never waits: no step ran under load, and it decoded in every step
    // it was ready to.
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_server_loaded_step_capacity_tokens_total",
            ""
        ),
        0.0
    );
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_decode_ready_total", ""),
        3.0
    );
    for family in [
        "ringmaster_server_batch_size",
        "ringmaster_server_model_load_seconds",
    ] {
        assert!(metrics.contains(family), "missing {family}");
    }
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_routing_decisions_total",
            "reason=\"affinity\""
        ),
        1.0
    );
}
