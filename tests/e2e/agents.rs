//! The requests coding agents send, over real sockets: Claude Code's and Codex's first requests
//! as they captured them (tests/agents/fixtures) through both doors to a strict OpenAI server,
//! to servers of their own APIs (relayed as they came), the billing line out of the routing
//! key, unknown fields passed, dropped or refused as configured, reasoning both ways, the
//! Responses door's store (retrieve, input items, delete, continue, cancel), a 429's headers,
//! a router told the door (`request.door`), and agent requests with random fields added still
//! served (a property test).

use proptest::prelude::*;
use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
use serde_json::{Value, json};

use crate::support::{TestGateway, metric_sum, sse_events};

/// A request an agent sent, as captured: its path, the headers that matter, its body.
fn fixture(name: &str) -> (String, Vec<(String, String)>, Value) {
    let path = format!("{}/agents/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let captured: Value = serde_json::from_str(&text).unwrap();
    let headers = captured["headers"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let mut body = captured["body"].clone();
    body["model"] = json!("fake");
    (captured["path"].as_str().unwrap().to_owned(), headers, body)
}

fn claude_code() -> (String, Vec<(String, String)>, Value) {
    fixture("claude-code-2.1.328.json")
}

fn codex() -> (String, Vec<(String, String)>, Value) {
    fixture("codex-0.169.0.json")
}

async fn gateway_with(server: &str, extra: &str) -> TestGateway {
    TestGateway::start(&format!(
        "models = [\"fake\"]\n{extra}\n[[servers]]\naddress = \"{server}\"\n"
    ))
    .await
}

async fn post(
    gw: &TestGateway,
    (path, headers, body): &(String, Vec<(String, String)>, Value),
) -> reqwest::Response {
    let mut request = gw.client.post(gw.url(path)).json(body);
    for (name, value) in headers {
        request = request.header(name, value);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn claude_codes_request_reaches_a_strict_openai_server_with_only_what_it_defines() {
    let server = FakeUpstream::start(Behavior::Strict, 3).await;
    let gw = gateway_with(&server.url(), "").await;
    let request = claude_code();
    let reply = post(&gw, &request).await;
    let dropped = reply
        .headers()
        .get("x-ringmaster-dropped")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
    let events = sse_events(&reply.text().await.unwrap());
    assert_eq!(events.last().unwrap().0, "message_stop", "{events:?}");
    for field in [
        "context_management",
        "cache_control",
        "thinking",
        "anthropic-beta",
    ] {
        assert!(dropped.contains(field), "{field} in {dropped:?}");
    }
    let sent = server.last_request_json();
    let sent_text = sent.to_string();
    assert!(
        !sent_text.contains("x-anthropic-billing-header"),
        "the billing line stays out"
    );
    assert!(sent.get("tool_choice").is_none() && sent.get("ringmaster_priority").is_none());
    assert_eq!(sent["messages"][0]["role"], "system");
    assert_eq!(sent["tools"].as_array().unwrap().len(), 12);
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_dropped_fields_total",
            "door=\"messages\",field=\"context_management\""
        ),
        1.0
    );
}

#[tokio::test]
async fn codexs_request_is_served_by_the_responses_door_as_its_event_sequence() {
    let server = FakeUpstream::start(Behavior::Strict, 3).await;
    let gw = gateway_with(&server.url(), "").await;
    let request = codex();
    let reply = post(&gw, &request).await;
    assert_eq!(reply.status(), 200, "{}", reply.text().await.unwrap());
    let dropped = reply.headers()["x-ringmaster-dropped"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        dropped.contains("tools.web_search") && dropped.contains("client_metadata"),
        "{dropped}"
    );
    let events = sse_events(&reply.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names[..3],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added"
        ]
    );
    // OpenAI's strict server stops at the length it was given: the response is incomplete.
    assert_eq!(*names.last().unwrap(), "response.incomplete");
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(
        completed["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(completed["output"][0]["content"][0]["text"], "tok tok tok ");
    assert_eq!(
        completed["usage"]["input_tokens_details"]["cached_tokens"],
        4
    );
    // The namespaced functions reach the server as functions of their own.
    let sent = server.last_request_json();
    let names: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"multi_agent_v1__close_agent"), "{names:?}");
    assert!(!names.iter().any(|n| n.contains("web_search")));
    assert_eq!(sent["messages"][0]["role"], "system");
}

#[tokio::test]
async fn a_server_of_the_clients_api_gets_its_body_as_it_came() {
    let server = FakeUpstream::start(Behavior::Vllm, 2).await;
    let gw = gateway_with(&server.url(), "").await;
    // Declared per server: the same address as a Messages server.
    let gw_messages = TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\napi = \"messages\"\n",
        server.url()
    ))
    .await;
    drop(gw);
    let request = claude_code();
    let reply = post(&gw_messages, &request).await;
    assert_eq!(reply.status(), 200);
    assert!(reply.headers().get("x-ringmaster-dropped").is_none());
    let events = sse_events(&reply.text().await.unwrap());
    assert_eq!(events.last().unwrap().0, "message_stop");
    let sent = server.last_request_json();
    for field in [
        "context_management",
        "thinking",
        "output_config",
        "metadata",
    ] {
        assert_eq!(sent[field], request.2[field], "{field} passes untouched");
    }
    assert_eq!(sent["model"], "fake");
    assert_eq!(
        sent["system"].as_array().unwrap().len(),
        2,
        "the billing line's block is out: {}",
        sent["system"]
    );
    // A Responses server gets the Responses body.
    let gw_responses = TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\napi = \"responses\"\n",
        server.url()
    ))
    .await;
    let request = codex();
    let reply = post(&gw_responses, &request).await;
    assert_eq!(reply.status(), 200);
    let events = sse_events(&reply.text().await.unwrap());
    assert_eq!(events.last().unwrap().0, "response.completed", "{events:?}");
    let sent = server.last_request_json();
    assert_eq!(sent["client_metadata"], request.2["client_metadata"]);
    assert_eq!(sent["tools"], request.2["tools"]);
    assert_eq!(sent["store"], false);
    // And a Messages client in front of a Responses server is translated.
    let reply = gw_responses
        .post_messages(&json!({"model": "fake", "max_tokens": 16,
            "messages": [{"role": "user", "content": "Hi"}]}))
        .await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["content"][0]["text"], "tok tok ");
    assert_eq!(server.last_request_json()["input"][0]["role"], "user");
}

#[tokio::test]
async fn a_whole_answer_of_the_clients_api_goes_back_as_the_server_sent_it() {
    let server = FakeUpstream::start(Behavior::Vllm, 3).await;
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[aliases]\nnick = \"fake\"\n[[servers]]\naddress = \"{}\"\n",
        server.url()
    ))
    .await;
    let ask = |model: &str| {
        json!({"model": model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Hi"}]})
    };
    // The same API and the same model name: the server's own answer (its id "x", no id of
    // the gateway's), and its usage still counted.
    let reply = gw.post_chat(&ask("fake")).await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["id"], "x", "the server's answer as it sent it: {body}");
    assert_eq!(body["choices"][0]["message"]["content"], "tok tok tok ");
    assert_eq!(body["usage"]["completion_tokens"], 3);
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_prompt_tokens_total", ""),
        12.0,
        "the relayed answer's usage is counted"
    );
    // An alias: the answer must name the client's model, so the gateway writes it.
    let reply = gw.post_chat(&ask("nick")).await;
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["model"], "nick", "{body}");
    assert!(
        body["id"].as_str().unwrap().starts_with("chatcmpl-"),
        "{body}"
    );
    // The Messages door to a Messages server: the server's message as it sent it.
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\napi = \"messages\"\n",
        server.url()
    ))
    .await;
    let reply = gw.post_messages(&ask("fake")).await;
    assert_eq!(reply.status(), 200);
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["id"], "msg_fake", "{body}");
    assert_eq!(body["content"][0]["text"], "tok tok tok ");
}

#[tokio::test]
async fn the_billing_line_changes_neither_the_routing_key_nor_the_prefix() {
    let body = |cch: &str| {
        json!({"model": "sim-llama-3-8b", "max_tokens": 8,
            "system": [{"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.328.593; cc_entrypoint=cli; cch={cch};")},
                       {"type": "text", "text": "You are Claude Code. ".repeat(60)}],
            "messages": [{"role": "user", "content": "Fix the bug."}]})
    };
    let explain = async |gw: &TestGateway, cch: &str| -> Value {
        gw.admin(reqwest::Method::POST, "/admin/route/explain")
            .await
            .json(&body(cch))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    };
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let (a, b) = (explain(&gw, "3f2a1").await, explain(&gw, "99b0c").await);
    assert_eq!(a["routing_key"], b["routing_key"], "{a}\n{b}");
    assert_eq!(a["volatile_lines"], 1);
    // Without the hygiene the key follows the line.
    let bare = TestGateway::simulated(4, 0.0, "[routing]\nvolatile_prefix = []\n").await;
    let (a, b) = (explain(&bare, "3f2a1").await, explain(&bare, "99b0c").await);
    assert_ne!(a["routing_key"], b["routing_key"]);
}

#[tokio::test]
async fn unknown_fields_pass_drop_or_refuse_as_the_operator_says() {
    let server = FakeUpstream::start(Behavior::Vllm, 1).await;
    let body = json!({"model": "fake", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi", "x_mood": "calm"}], "x_trace": {"a": 1}});
    let pass = gateway_with(&server.url(), "").await;
    let reply = pass.post_chat(&body).await;
    assert_eq!(reply.status(), 200);
    assert!(reply.headers().get("x-ringmaster-dropped").is_none());
    let sent = server.last_request_json();
    assert_eq!(sent["x_trace"], json!({"a": 1}));
    assert_eq!(sent["messages"][0]["x_mood"], "calm");
    // Translated (to the Messages door's client): dropped and named.
    let reply = pass
        .post_messages(&json!({"model": "fake", "max_tokens": 4, "x_trace": 1,
            "messages": [{"role": "user", "content": "Hi"}]}))
        .await;
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["x-ringmaster-dropped"], "x_trace");
    let drop = gateway_with(&server.url(), "[api]\nunknown_fields = \"drop\"\n").await;
    let reply = drop.post_chat(&body).await;
    assert_eq!(reply.status(), 200);
    assert_eq!(
        reply.headers()["x-ringmaster-dropped"],
        "messages.x_mood, x_trace"
    );
    let sent = server.last_request_json();
    assert!(sent.get("x_trace").is_none() && sent["messages"][0].get("x_mood").is_none());
    let refuse = gateway_with(&server.url(), "[api]\nunknown_fields = \"refuse\"\n").await;
    let reply = refuse.post_chat(&body).await;
    assert_eq!(reply.status(), 400);
    let error: Value = reply.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("messages.0.x_mood: unknown field"),
        "{error}"
    );
}

#[tokio::test]
async fn reasoning_is_asked_of_and_shown_from_a_reasoning_server() {
    let server = FakeUpstream::start(Behavior::Reasons, 2).await;
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\nreasoning = true\n",
        server.url()
    ))
    .await;
    let ask = |thinking: Value| {
        json!({"model": "fake", "max_tokens": 2048, "stream": true, "thinking": thinking,
            "messages": [{"role": "user", "content": "Why?"}]})
    };
    let reply = gw
        .post_messages(&ask(json!({"type": "enabled", "budget_tokens": 1024})))
        .await;
    assert_eq!(reply.status(), 200);
    assert!(reply.headers().get("x-ringmaster-dropped").is_none());
    let events = sse_events(&reply.text().await.unwrap());
    let start = events
        .iter()
        .find(|(n, _)| n == "content_block_start")
        .unwrap();
    assert_eq!(start.1["content_block"]["type"], "thinking");
    let thinking: String = events
        .iter()
        .filter_map(|(_, e)| e["delta"]["thinking"].as_str())
        .collect();
    assert_eq!(thinking, "Let me think.");
    assert_eq!(server.last_request_json()["reasoning_effort"], "low");
    // Not asked for: not shown.
    let reply = gw.post_messages(&ask(json!({"type": "disabled"}))).await;
    let events = sse_events(&reply.text().await.unwrap());
    assert!(
        events
            .iter()
            .all(|(_, e)| e["content_block"]["type"] != "thinking")
    );
    assert_eq!(server.last_request_json()["reasoning_effort"], "none");
    // The chat door passes it on as vLLM does; the Responses door as a reasoning item.
    let reply = gw
        .post_chat(&json!({"model": "fake", "messages": [{"role": "user", "content": "Why?"}]}))
        .await;
    let body: Value = reply.json().await.unwrap();
    assert_eq!(
        body["choices"][0]["message"]["reasoning_content"],
        "Let me think."
    );
    let reply = gw
        .client
        .post(gw.url("/v1/responses"))
        .json(&json!({"model": "fake", "input": "Why?", "reasoning": {"effort": "high"}}))
        .send()
        .await
        .unwrap();
    let body: Value = reply.json().await.unwrap();
    assert_eq!(body["output"][0]["type"], "reasoning", "{body}");
    assert_eq!(body["output"][1]["content"][0]["text"], "tok tok ");
    assert_eq!(server.last_request_json()["reasoning_effort"], "high");
    // A server without reasoning is told nothing, and the client is told so.
    let plain = FakeUpstream::start(Behavior::Strict, 2).await;
    let gw = gateway_with(&plain.url(), "").await;
    let reply = gw.post_messages(&ask(json!({"type": "adaptive"}))).await;
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.headers()["x-ringmaster-dropped"], "thinking");
}

async fn responses_json(
    gw: &TestGateway,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = gw.client.request(method, gw.url(path));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let reply = request.send().await.unwrap();
    let status = reply.status().as_u16();
    (status, reply.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn stored_responses_are_retrieved_continued_listed_deleted_and_cancelled() {
    let server = FakeUpstream::start(Behavior::Vllm, 3).await;
    let gw = gateway_with(&server.url(), "").await;
    let post = reqwest::Method::POST;
    let (status, first) = responses_json(
        &gw,
        post.clone(),
        "/v1/responses",
        Some(json!({"model": "fake", "input": "What is 2+2?", "metadata": {"run": "a"}})),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_"));
    assert_eq!(first["metadata"], json!({"run": "a"}));
    // Stored in the background: retrieved once it is.
    let path = format!("/v1/responses/{id}");
    let mut got = Value::Null;
    for _ in 0..50 {
        let (status, body) = responses_json(&gw, reqwest::Method::GET, &path, None).await;
        if status == 200 && body["status"] == "completed" {
            got = body;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(got["output"], first["output"]);
    // A follow-up continues the conversation: the server sees the earlier turn.
    let (status, second) = responses_json(
        &gw,
        post.clone(),
        "/v1/responses",
        Some(json!({"model": "fake", "input": "And 3+3?", "previous_response_id": id})),
    )
    .await;
    assert_eq!(status, 200, "{second}");
    let sent = server.last_request_json();
    let texts: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["What is 2+2?", "tok tok tok ", "And 3+3?"]);
    assert_eq!(second["previous_response_id"], id);
    let (status, items) = responses_json(
        &gw,
        reqwest::Method::GET,
        &format!("{path}/input_items?order=asc"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(items["data"][0]["content"][0]["text"], "What is 2+2?");
    assert!(items["first_id"].as_str().is_some());
    // Deleted: gone, and a follow-up on it is not found (in OpenAI's error shape).
    let (status, deleted) = responses_json(&gw, reqwest::Method::DELETE, &path, None).await;
    assert_eq!((status, deleted["deleted"].clone()), (200, json!(true)));
    let (status, error) = responses_json(&gw, reqwest::Method::GET, &path, None).await;
    assert_eq!(status, 404);
    assert!(error["error"]["message"].as_str().is_some(), "{error}");
    let (status, _) = responses_json(
        &gw,
        post.clone(),
        "/v1/responses",
        Some(json!({"model": "fake", "input": "x", "previous_response_id": id})),
    )
    .await;
    assert_eq!(status, 404);
    // Not stored: nothing to retrieve.
    let (_, unstored) = responses_json(
        &gw,
        post.clone(),
        "/v1/responses",
        Some(json!({"model": "fake", "input": "x", "store": false})),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (status, _) = responses_json(
        &gw,
        reqwest::Method::GET,
        &format!("/v1/responses/{}", unstored["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(status, 404);
    // A response in flight is cancelled: its stream ends failed, it is stored as cancelled.
    let paced = FakeUpstream::start(Behavior::Paced, 200).await;
    let slow = gateway_with(&paced.url(), "").await;
    let mut stream = slow
        .client
        .post(slow.url("/v1/responses"))
        .json(&json!({"model": "fake", "input": "Tell a long story", "stream": true}))
        .send()
        .await
        .unwrap();
    let first = stream.chunk().await.unwrap().unwrap();
    let created = sse_events(std::str::from_utf8(&first).unwrap());
    let id = created[0].1["response"]["id"].as_str().unwrap().to_owned();
    let (status, cancelled) =
        responses_json(&slow, post, &format!("/v1/responses/{id}/cancel"), None).await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["status"], "cancelled");
    let mut rest = Vec::new();
    while let Ok(Some(chunk)) = stream.chunk().await {
        rest.extend_from_slice(&chunk);
    }
    let events = sse_events(std::str::from_utf8(&rest).unwrap());
    assert_eq!(events.last().unwrap().0, "response.failed", "{events:?}");
}

#[tokio::test]
async fn a_refusal_for_a_rate_limit_carries_the_rate_limit_headers() {
    let key = "sk-agent-limited-0123456789";
    let gw = TestGateway::simulated(
        1,
        0.0,
        &format!(
            "[[api_keys]]\nkey = \"{key}\"\ntier = \"free\"\nrequests_per_minute = 1\n[limits]\nrate_limit_delay_ms = 0\n"
        ),
    )
    .await;
    let send = async || {
        gw.client
            .post(gw.url("/v1/messages"))
            .header("x-api-key", key)
            .json(&crate::support::hello(4))
            .send()
            .await
            .unwrap()
    };
    assert_eq!(send().await.status(), 200);
    let refused = send().await;
    assert_eq!(refused.status(), 429);
    for header in [
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-requests-remaining",
        "anthropic-ratelimit-requests-reset",
        "retry-after",
    ] {
        assert!(
            refused.headers().contains_key(header),
            "{header}: {:?}",
            refused.headers()
        );
    }
    assert_eq!(refused.headers()["anthropic-ratelimit-requests-limit"], "1");
}

/// A JSON value of a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i32>().prop_map(Value::from),
        "[a-z ]{0,12}".prop_map(Value::from),
    ];
    leaf.prop_recursive(2, 8, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            proptest::collection::btree_map("[a-z]{1,6}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// How many objects `value` holds (itself included).
fn count_objects(value: &Value) -> usize {
    match value {
        Value::Object(map) => 1 + map.values().map(count_objects).sum::<usize>(),
        Value::Array(list) => list.iter().map(count_objects).sum(),
        _ => 0,
    }
}

/// Puts `name: field` into the `n`th object of `value` (depth first); whether it found it.
fn insert_into_nth(value: &mut Value, n: &mut usize, name: &str, field: &Value) -> bool {
    match value {
        Value::Object(map) => {
            if *n == 0 {
                map.insert(name.to_owned(), field.clone());
                return true;
            }
            *n -= 1;
            map.values_mut().any(|v| insert_into_nth(v, n, name, field))
        }
        Value::Array(list) => list.iter_mut().any(|v| insert_into_nth(v, n, name, field)),
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Each agent's captured request, with fields nobody defines put anywhere in it, is still
    /// served (in front of a chat server, and of a server of the agent's own API).
    #[test]
    fn an_agents_request_with_unknown_fields_added_is_still_served(
        agent in 0usize..2,
        relay in any::<bool>(),
        additions in proptest::collection::vec(("x_[a-z]{2,8}", json_value(), any::<prop::sample::Index>()), 1..5),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (request, api) = if agent == 0 { (claude_code(), "messages") } else { (codex(), "responses") };
            let (path, headers, mut body) = request;
            body["stream"] = json!(false);
            let places = count_objects(&body);
            for (name, value, at) in additions {
                let mut n = at.index(places);
                prop_assert!(insert_into_nth(&mut body, &mut n, &name, &value));
            }
            let server = FakeUpstream::start(Behavior::Vllm, 2).await;
            let api_line = if relay { format!("api = \"{api}\"\n") } else { String::new() };
            let gw = TestGateway::start(&format!(
                "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\n{api_line}",
                server.url()
            )).await;
            let reply = post(&gw, &(path, headers, body)).await;
            let status = reply.status();
            let text = reply.text().await.unwrap();
            prop_assert_eq!(status, 200, "{}", text);
            Ok(())
        })?;
    }
}

/// Policies see the door (`request.door`): a router fixture that sends Responses requests to
/// the last server and every other door's to the first gets Codex's request to `b` and Claude
/// Code's and a chat request to `a`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_sees_the_door_a_request_came_in_by() {
    let ups = [
        FakeUpstream::start(Behavior::Vllm, 3).await,
        FakeUpstream::start(Behavior::Vllm, 3).await,
    ];
    let fixture = format!(
        "{}/../policies/dist/fixtures/door-router.wasm",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut toml = format!(
        "models = [\"fake\"]\n[[policies.router]]\nname = \"by-door\"\nsource = {}\n",
        toml::Value::String(fixture)
    );
    for (id, up) in ["a", "b"].iter().zip(&ups) {
        toml.push_str(&format!(
            "[[servers]]\nid = \"{id}\"\naddress = \"{}\"\n",
            up.url()
        ));
    }
    let gw = TestGateway::start(&toml).await;
    let served = || -> Vec<usize> {
        ups.iter()
            .map(|up| up.requests.load(std::sync::atomic::Ordering::Relaxed))
            .collect()
    };
    assert_eq!(post(&gw, &codex()).await.status(), 200);
    assert_eq!(served(), [0, 1], "a Responses request to the last server");
    assert_eq!(post(&gw, &claude_code()).await.status(), 200);
    let chat = json!({"model": "fake", "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(gw.post_chat(&chat).await.status(), 200);
    assert_eq!(served(), [2, 1], "the other doors' to the first");
}
