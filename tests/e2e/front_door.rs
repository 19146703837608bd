//! The front door over real sockets: the OpenAI API in front of OpenAI-compatible servers,
//! keys with tenants and token limits, the queue's per-request deadline, keep-alive pings,
//! `count_tokens`, and the autoscaling signal.

use std::time::Duration;

use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
use serde_json::{Value, json};

use crate::support::{TestGateway, metric_sum, sse_events};

fn chat(max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "fake",
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
        "messages": [{"role": "user", "content": "Hello there"}],
    })
}

/// The `data:` payloads of an OpenAI stream, `[DONE]` included.
fn data_lines(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn the_openai_api_in_front_of_openai_servers_plain_and_streamed() {
    for behavior in [Behavior::Vllm, Behavior::OpenAi, Behavior::UsageInFinish] {
        let server = FakeUpstream::start(behavior, 3).await;
        let gw = TestGateway::start(&format!(
            "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\n",
            server.url()
        ))
        .await;
        let reply = gw.post_chat(&chat(8, false)).await;
        assert_eq!(reply.status(), 200, "{behavior:?}");
        let body: Value = reply.json().await.unwrap();
        assert_eq!(body["object"], "chat.completion");
        assert_eq!(
            body["choices"][0]["message"]["content"], "tok tok tok ",
            "{behavior:?}"
        );
        let finish = body["choices"][0]["finish_reason"].as_str().unwrap();
        assert!(
            matches!(finish, "stop" | "length"),
            "{behavior:?}: {finish}"
        );
        assert_eq!(body["usage"]["completion_tokens"], 3, "{behavior:?}");
        assert_eq!(body["usage"]["prompt_tokens"], 12, "{behavior:?}");
        assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 4);

        let reply = gw.post_chat(&chat(8, true)).await;
        assert_eq!(reply.status(), 200);
        assert_eq!(reply.headers()["content-type"], "text/event-stream");
        let text = reply.text().await.unwrap();
        let data = data_lines(&text);
        assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "{text}");
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let content: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(content, "tok tok tok ", "{behavior:?}");
        let usage = chunks.last().unwrap();
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 3, "{behavior:?}");
        assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
        // The legacy completions endpoint sends a raw prompt to the server's /v1/completions.
        let reply = gw
            .client
            .post(gw.url("/v1/completions"))
            .json(&json!({"model": "fake", "prompt": "Once", "max_tokens": 4}))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 200);
        let body: Value = reply.json().await.unwrap();
        assert_eq!(body["object"], "text_completion");
        assert_eq!(body["choices"][0]["text"], "tok tok tok ");
    }
}

#[tokio::test]
async fn openai_errors_have_openai_shape_and_a_standard_overload_status() {
    let gw = TestGateway::simulated(1, 0.01, "models = [\"sim-llama-3-8b\"]").await;
    let reply = gw
        .post_chat(&json!({"model": "sim-llama-3-8b", "messages": [], "tools": []}))
        .await;
    assert_eq!(reply.status(), 400);
    assert!(reply.headers().contains_key("request-id"));
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages:")
    );
    assert!(body["error"].get("param").is_some());
    // The Messages door keeps Anthropic's shape.
    let reply = gw
        .client
        .post(gw.url("/v1/messages"))
        .json(&json!({"model": "sim-llama-3-8b", "messages": []}))
        .send()
        .await
        .unwrap();
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["type"], "error");
}

#[tokio::test]
async fn a_flooding_key_is_refused_while_another_key_is_served() {
    let gw = TestGateway::simulated(
        2,
        0.01,
        r#"models = ["sim-llama-3-8b"]
[[api_keys]]
key = "sk-flood-key-0001"
requests_per_minute = 5
[[api_keys]]
key = "sk-light-key-0001"
"#,
    )
    .await;
    let flood = {
        let client = gw.client.clone();
        let url = gw.url("/v1/messages");
        tokio::spawn(async move {
            let mut handles = Vec::new();
            for _ in 0..60 {
                let (client, url) = (client.clone(), url.clone());
                handles.push(tokio::spawn(async move {
                    let reply = client
                        .post(url)
                        .header("x-api-key", "sk-flood-key-0001")
                        .json(&crate::support::hello(4))
                        .send()
                        .await
                        .unwrap();
                    (
                        reply.status().as_u16(),
                        reply.headers().get("retry-after").cloned(),
                    )
                }));
            }
            let mut out = Vec::new();
            for h in handles {
                out.push(h.await.unwrap());
            }
            out
        })
    };
    for _ in 0..10 {
        let reply = gw
            .client
            .post(gw.url("/v1/messages"))
            .header("x-api-key", "sk-light-key-0001")
            .json(&crate::support::hello(4))
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status(), 200);
    }
    let flooded = flood.await.unwrap();
    let ok = flooded.iter().filter(|(s, _)| *s == 200).count();
    let limited: Vec<_> = flooded.iter().filter(|(s, _)| *s == 429).collect();
    assert_eq!(ok, 5, "the flood gets exactly its 5 requests a minute");
    assert_eq!(limited.len(), 55);
    assert!(limited.iter().all(|(_, after)| after.is_some()));
    // Each refusal is counted by tenant and bucket (a key without a tenant is its own).
    let metrics = gw.metrics().await;
    let counted: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("ringmaster_rate_limit_refusals_total{"))
        .collect();
    assert_eq!(counted.len(), 1, "{counted:?}");
    assert!(counted[0].contains(r#"limit="requests""#), "{counted:?}");
    assert!(
        counted[0].contains(r#"bucket="this API key""#),
        "{counted:?}"
    );
    assert!(counted[0].ends_with(" 55"), "{counted:?}");
}

#[tokio::test]
async fn output_tokens_are_charged_as_they_stream_and_refuse_the_next_request() {
    let gw = TestGateway::simulated(
        1,
        0.01,
        r#"models = ["sim-llama-3-8b"]
[[tenants]]
name = "small"
output_tokens_per_minute = 10
[[api_keys]]
key = "sk-small-key-0001"
tenant = "small"
"#,
    )
    .await;
    let mut body = crate::support::hello(30);
    body["ignore_eos"] = json!(true);
    body["stream"] = json!(true);
    let reply = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("x-api-key", "sk-small-key-0001")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    assert_eq!(
        reply.headers()["anthropic-ratelimit-output-tokens-limit"],
        "10"
    );
    let events = sse_events(&reply.text().await.unwrap());
    let delta = events.iter().find(|(e, _)| e == "message_delta").unwrap();
    assert_eq!(delta.1["usage"]["output_tokens"], 30);
    // 30 generated against 10 a minute: in debt, so the next request waits.
    let reply = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("x-api-key", "sk-small-key-0001")
        .json(&crate::support::hello(2))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 429);
    let after: u64 = reply.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(after >= 60, "20 tokens of debt at 10 a minute: {after} s");
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("output tokens")
    );
}

#[tokio::test]
async fn a_request_waits_no_longer_than_its_own_queue_deadline() {
    let gw = TestGateway::simulated(
        1,
        1.0,
        r#"models = ["sim-llama-3-8b"]
[policies.admission]
source = "builtin:tiered"
config = { max_in_flight_per_server = "1" }
"#,
    )
    .await;
    // One long request holds the only slot.
    let long = {
        let client = gw.client.clone();
        let url = gw.url("/v1/messages");
        let mut body = crate::support::hello(200);
        body["ignore_eos"] = json!(true);
        tokio::spawn(async move { client.post(url).json(&body).send().await.unwrap().status() })
    };
    assert!(
        crate::support::eventually(Duration::from_secs(5), async || {
            metric_sum(&gw.metrics().await, "ringmaster_server_in_flight", "") >= 1.0
        })
        .await
    );
    let started = std::time::Instant::now();
    let reply = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("x-ringmaster-queue-timeout-ms", "200")
        .json(&crate::support::hello(2))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 529);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let report = gw
        .admin_json(reqwest::Method::GET, "/admin/autoscale")
        .await;
    assert!(report["utilisation"].as_f64().unwrap() > 0.0, "{report}");
    assert!(report["recommendation"].is_string());
    assert_eq!(report["servers"], 1);
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("ringmaster_autoscale_utilisation"),
        "{metrics}"
    );
    long.abort();
}

#[tokio::test]
async fn an_idle_stream_sends_pings_at_the_configured_interval() {
    // A server five times slower than real time: 20 ms pings fall between its tokens.
    let gw = TestGateway::simulated(
        1,
        5.0,
        "models = [\"sim-llama-3-8b\"]\n[limits]\nstream_ping_ms = 20\n",
    )
    .await;
    let mut body = crate::support::hello(6);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    let text = gw.post_messages(&body).await.text().await.unwrap();
    let events = sse_events(&text);
    let pings = events.iter().filter(|(e, _)| e == "ping").count();
    assert!(pings >= 2, "the first ping, then keep-alives: {pings}");
    assert_eq!(events.last().unwrap().0, "message_stop");
}

/// A streamed hello through a gateway that pings every 100 ms (plus `limits` in its
/// `[limits]`, and `sections`) in front of one fake server that behaves as `behavior`: the
/// server, the gateway, the request sent and its response.
async fn early_stream(
    behavior: Behavior,
    limits: &str,
    sections: &str,
) -> (FakeUpstream, TestGateway, Value, reqwest::Response) {
    let server = FakeUpstream::start(behavior, 3).await;
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[limits]\nstream_ping_ms = 100\n{limits}{sections}\
         [[servers]]\naddress = \"{}\"\n",
        server.url()
    ))
    .await;
    let mut body = crate::support::hello(8);
    body["model"] = json!("fake");
    body["stream"] = json!(true);
    let response = gw.post_messages(&body).await;
    (server, gw, body, response)
}

#[tokio::test]
async fn a_stream_that_waits_for_its_first_token_starts_early_with_pings() {
    let (_server, gw, mut body, response) = early_stream(Behavior::SlowStart, "", "").await;
    assert_eq!(response.status(), 200);
    assert!(
        response.headers().get("x-ringmaster-server").is_none(),
        "started before a server was chosen for good"
    );
    let text = response.text().await.unwrap();
    assert!(text.starts_with(": ping\n\n: ping\n\n"), "{text}");
    let events = sse_events(&text);
    assert_eq!(events.first().unwrap().0, "message_start", "{text}");
    assert_eq!(events.last().unwrap().0, "message_stop");

    // The OpenAI door alike; a plain request waits for its answer as before.
    let reply = gw.post_chat(&chat(8, true)).await;
    let text = reply.text().await.unwrap();
    assert!(text.starts_with(": ping\n\n"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    body["stream"] = json!(false);
    let response = gw.post_messages(&body).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("x-ringmaster-server").is_some());
}

#[tokio::test]
async fn a_stream_that_started_early_is_resumable_by_its_request_id() {
    let (_server, gw, _, response) =
        early_stream(Behavior::SlowStart, "resume_window_ms = 5000\n", "").await;
    assert_eq!(response.status(), 200);
    let stream_id = response.headers()["x-ringmaster-stream-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        stream_id,
        response.headers()["request-id"].to_str().unwrap()
    );
    let text = response.text().await.unwrap();
    assert!(text.starts_with(": ping\n\n"), "started early: {text}");
    let resumed = gw
        .client
        .get(gw.url(&format!("/v1/streams/{stream_id}")))
        .header("last-event-id", "1")
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let rest = resumed.text().await.unwrap();
    let (ids, _) = ids_and_text(&rest);
    assert_eq!(ids.first(), Some(&2), "{rest}");
    assert!(rest.contains("message_stop"), "{rest}");
}

#[tokio::test]
async fn a_stream_that_started_early_ends_with_an_error_event_when_its_wait_fails() {
    let (_server, _gw, _, response) = early_stream(
        Behavior::Hang,
        "",
        "[upstream]\nfirst_byte_timeout_ms = 500\n[retry]\nattempts = 1\n",
    )
    .await;
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.starts_with(": ping\n\n"), "{text}");
    let events = sse_events(&text);
    assert_eq!(events.len(), 1, "{text}");
    let (name, error) = &events[0];
    assert_eq!(name, "error");
    assert_eq!(error["type"], "error");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no answer within"),
        "{error}"
    );
}

#[tokio::test]
async fn count_tokens_uses_the_pools_tokenizer() {
    let gw = TestGateway::simulated(1, 0.01, "models = [\"sim-llama-3-8b\"]").await;
    let reply = gw
        .client
        .post(gw.url("/v1/messages/count_tokens"))
        .json(&json!({
            "model": "sim-llama-3-8b",
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hello there, how are you today?"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["x-ringmaster-token-count"], "exact");
    let body: Value = reply.json().await.unwrap();
    assert!(body["input_tokens"].as_u64().unwrap() > 5, "{body}");
    // The same prompt through the Messages API reports the same count.
    let reply: Value = gw
        .post_messages(&json!({
            "model": "sim-llama-3-8b",
            "max_tokens": 1,
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "Hello there, how are you today?"}],
        }))
        .await
        .json()
        .await
        .unwrap();
    let usage = &reply["usage"];
    let counted = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert_eq!(body["input_tokens"].as_u64().unwrap(), counted);
}

/// The SSE ids and the text deltas in a piece of a stream.
fn ids_and_text(body: &str) -> (Vec<u64>, String) {
    let mut ids = Vec::new();
    let mut text = String::new();
    for frame in body.split("\n\n") {
        for line in frame.lines() {
            if let Some(id) = line.strip_prefix("id: ") {
                ids.push(id.parse().unwrap());
            }
            if let Some(data) = line.strip_prefix("data: ")
                && let Ok(event) = serde_json::from_str::<Value>(data)
                && event["type"] == "content_block_delta"
            {
                text.push_str(event["delta"]["text"].as_str().unwrap());
            }
        }
    }
    (ids, text)
}

#[tokio::test]
async fn a_client_that_reconnects_with_last_event_id_gets_the_rest() {
    let gw = TestGateway::simulated(
        1,
        1.0,
        "models = [\"sim-llama-3-8b\"]\n[limits]\nresume_window_ms = 5000\n",
    )
    .await;
    let mut body = crate::support::hello(40);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    let mut reply = gw.post_messages(&body).await;
    assert_eq!(reply.status(), 200);
    let stream_id = reply.headers()["x-ringmaster-stream-id"]
        .to_str()
        .unwrap()
        .to_owned();
    // Read until a few tokens are in, then go away mid-stream.
    let mut first = String::new();
    while ids_and_text(&first).1.len() < 5 {
        let chunk = reply.chunk().await.unwrap().expect("more of the stream");
        first.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    drop(reply);
    let (ids, text_before) = ids_and_text(&first);
    let last = *ids.last().unwrap();
    assert_eq!(
        ids,
        (1..=last).collect::<Vec<_>>(),
        "every event numbered in order"
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resumed = gw
        .client
        .get(gw.url(&format!("/v1/streams/{stream_id}")))
        .header("last-event-id", last.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), 200);
    let rest = resumed.text().await.unwrap();
    let (rest_ids, text_after) = ids_and_text(&rest);
    assert_eq!(
        rest_ids.first(),
        Some(&(last + 1)),
        "nothing missed, nothing twice"
    );
    assert!(rest.contains("message_stop"), "{rest}");
    let events = sse_events(&rest);
    let delta = events.iter().find(|(e, _)| e == "message_delta").unwrap();
    assert_eq!(delta.1["usage"]["output_tokens"], 40);
    // The sim's tokens are one word each: the two halves make the whole reply.
    let words = format!("{text_before}{text_after}")
        .split_whitespace()
        .count();
    assert_eq!(words, 40);
    // A stream another key started, or one never started, is not found.
    let missing = gw
        .client
        .get(gw.url("/v1/streams/msg_nope"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn without_a_resume_window_streams_are_not_resumable() {
    let gw = TestGateway::simulated(1, 0.01, "models = [\"sim-llama-3-8b\"]").await;
    let mut body = crate::support::hello(4);
    body["stream"] = json!(true);
    let reply = gw.post_messages(&body).await;
    assert!(!reply.headers().contains_key("x-ringmaster-stream-id"));
    let text = reply.text().await.unwrap();
    assert!(!text.contains("\nid: ") && !text.starts_with("id: "));
    let missing = gw
        .client
        .get(gw.url("/v1/streams/msg_x"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
}

#[tokio::test]
async fn a_resumable_stream_nobody_reads_for_the_window_is_cancelled() {
    let gw = TestGateway::simulated(
        1,
        1.0,
        "models = [\"sim-llama-3-8b\"]\n[limits]\nresume_window_ms = 300\n",
    )
    .await;
    let mut body = crate::support::hello(5000);
    body["stream"] = json!(true);
    body["ignore_eos"] = json!(true);
    let mut reply = gw.post_messages(&body).await;
    let _ = reply.chunk().await.unwrap();
    drop(reply);
    // Still generating just after the client left (it may come back)...
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        metric_sum(&gw.metrics().await, "ringmaster_server_in_flight", ""),
        1.0
    );
    // ...and cancelled once the window passed without a reader.
    assert!(
        crate::support::eventually(Duration::from_secs(5), async || {
            metric_sum(&gw.metrics().await, "ringmaster_server_in_flight", "") == 0.0
        })
        .await
    );
    let cancelled = metric_sum(
        &gw.metrics().await,
        "ringmaster_server_cancelled_requests_total",
        "",
    );
    assert!(cancelled >= 1.0, "{cancelled}");
}

#[tokio::test]
async fn an_openai_client_gets_its_servers_own_chunks_unless_something_must_change() {
    let server = FakeUpstream::start(Behavior::Vllm, 3).await;
    let gw = TestGateway::start(&format!(
        "models = [\"fake\", \"alias\"]\n[aliases]\n\"alias\" = \"fake\"\n\
         [[servers]]\naddress = \"{}\"\n",
        server.url()
    ))
    .await;
    let stream = async |model: &str| {
        let mut body = chat(8, true);
        body["model"] = json!(model);
        let reply = gw.post_chat(&body).await;
        reply.text().await.unwrap()
    };
    // Same model name, no filter: the server's chunks as it sent them (vLLM's usage in
    // every chunk, its id), then the usage chunk and [DONE] the client asked for.
    let text = stream("fake").await;
    let data = data_lines(&text);
    assert_eq!(
        data[0],
        r#"{"id":"chatcmpl-fake","object":"chat.completion.chunk","created":0,"model":"fake","choices":[{"index":0,"delta":{"role":"assistant","content":"tok "},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13,"prompt_tokens_details":{"cached_tokens":4}}}"#,
        "{text}"
    );
    let last_chunk: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(
        last_chunk["id"], "chatcmpl-fake",
        "one id for the whole reply"
    );
    assert_eq!(last_chunk["choices"], json!([]));
    assert_eq!(last_chunk["usage"]["completion_tokens"], 3);
    assert_eq!(data.last().unwrap(), "[DONE]");
    let finishes = data
        .iter()
        .filter(|d| d.contains(r#""finish_reason":"stop""#))
        .count();
    assert_eq!(finishes, 1, "the server's finish only: {text}");

    // Asked under an alias, the chunks must name the alias: written here.
    let text = stream("alias").await;
    let first: Value = serde_json::from_str(&data_lines(&text)[0]).unwrap();
    assert_eq!(first["model"], "alias");
    assert_ne!(first["id"], "chatcmpl-fake");
}
