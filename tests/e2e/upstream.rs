//! The gateway in front of OpenAI-compatible servers over loopback: every stream shape real
//! servers send finishes with the right usage, connections are reused, and faults (a server
//! that fails, hangs, sends garbage, breaks off, floods a line or dies mid-run) end every
//! request in a response or a well-formed error event, retried on another server when the
//! fault came before the first token.

use std::time::Duration;

use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
use serde_json::{Value, json};

use crate::support::TestGateway;

/// A gateway over `servers` (http:// URLs), serving the model `fake`.
async fn gateway(servers: &[String], extra: &str) -> TestGateway {
    let mut toml = format!("models = [\"fake\"]\n{extra}\n");
    for url in servers {
        toml.push_str(&format!("[[servers]]\naddress = \"{url}\"\n"));
    }
    TestGateway::start(&toml).await
}

fn body(stream: bool, session: &str) -> Value {
    json!({
        "model": "fake", "max_tokens": 16, "stream": stream,
        "metadata": {"user_id": session},
        "messages": [{"role": "user", "content": format!("hello from {session}")}],
    })
}

/// Sends one request with an `x-session-id`; returns status, headers and body text.
async fn send(
    gw: &TestGateway,
    stream: bool,
    session: &str,
) -> (u16, reqwest::header::HeaderMap, String) {
    let response = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("x-session-id", session)
        .json(&body(stream, session))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = tokio::time::timeout(Duration::from_secs(20), response.text())
        .await
        .expect("the reply ends")
        .unwrap();
    (status, headers, text)
}

/// The `data` of every SSE event of `text`, as JSON.
fn events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test]
async fn every_stream_shape_finishes_with_the_servers_usage() {
    // (shape, stop reason, input and cached tokens of the stream; a non-streamed request
    // gets the server's whole answer, whose usage is 8 + 4 cached unless it reports none).
    let cases = [
        (Behavior::Vllm, "end_turn", 12 - 4, 4),
        (Behavior::OpenAi, "max_tokens", 12 - 4, 4),
        (Behavior::UsageInFinish, "end_turn", 12 - 4, 4),
        // No usage at all: the output is counted, the prompt reads as 0.
        (Behavior::NoUsage, "end_turn", 0, 0),
        (Behavior::EofOnly, "end_turn", 0, 0),
        // A whole answer where a stream was asked.
        (Behavior::Whole, "end_turn", 12 - 4, 4),
        (Behavior::ToolCalls, "tool_use", 0, 0),
    ];
    for (behavior, stop_reason, stream_input, stream_cached) in cases {
        let (input_tokens, cached) = if behavior == Behavior::NoUsage {
            (0, 0)
        } else {
            (12 - 4, 4)
        };
        let server = FakeUpstream::start(behavior, 3).await;
        let gw = gateway(&[server.url()], "").await;
        let (status, _, text) = send(&gw, false, "s").await;
        assert_eq!(status, 200, "{behavior:?}: {text}");
        let reply: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(reply["content"][0]["text"], "tok tok tok ", "{behavior:?}");
        assert_eq!(reply["stop_reason"], stop_reason, "{behavior:?}");
        assert_eq!(reply["usage"]["output_tokens"], 3, "{behavior:?}");
        assert_eq!(reply["usage"]["input_tokens"], input_tokens, "{behavior:?}");
        assert_eq!(
            reply["usage"]["cache_read_input_tokens"], cached,
            "{behavior:?}"
        );

        let (status, _, text) = send(&gw, true, "s").await;
        assert_eq!(status, 200, "{behavior:?}");
        let events = events(&text);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds.first(),
            Some(&"message_start"),
            "{behavior:?}: {kinds:?}"
        );
        assert_eq!(
            kinds.last(),
            Some(&"message_stop"),
            "{behavior:?}: {kinds:?}"
        );
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "content_block_delta")
            .map(|e| e["delta"]["text"].as_str().unwrap())
            .collect();
        assert_eq!(text, "tok tok tok ", "{behavior:?}");
        let delta = events
            .iter()
            .find(|e| e["type"] == "message_delta")
            .unwrap();
        assert_eq!(delta["delta"]["stop_reason"], stop_reason, "{behavior:?}");
        assert_eq!(delta["usage"]["output_tokens"], 3, "{behavior:?}");
        assert_eq!(delta["usage"]["input_tokens"], stream_input, "{behavior:?}");
        assert_eq!(
            delta["usage"]["cache_read_input_tokens"], stream_cached,
            "{behavior:?}"
        );
    }
}

#[tokio::test]
async fn connections_to_a_server_are_reused() {
    let server = FakeUpstream::start(Behavior::Vllm, 4).await;
    let gw = gateway(&[server.url()], "").await;
    for i in 0..60 {
        let (status, _, _) = send(&gw, i % 2 == 0, &format!("s{i}")).await;
        assert_eq!(status, 200);
    }
    let connections = server
        .connections
        .load(std::sync::atomic::Ordering::Relaxed);
    // One for the requests, one for the health poll, one for the KV event follower's probes.
    assert!(
        connections <= 4,
        "{connections} connections for 60 sequential requests"
    );
}

/// Two servers, one good and one with `fault`; every request must succeed, those that met the
/// fault after a retry.
async fn retried_past(fault: Behavior, extra: &str) {
    let bad = FakeUpstream::start(fault, 3).await;
    let good = FakeUpstream::start(Behavior::Vllm, 3).await;
    let gw = gateway(&[bad.url(), good.url()], extra).await;
    let mut retried = 0;
    for i in 0..16 {
        let (status, headers, text) = send(&gw, i % 2 == 1, &format!("session-{i}")).await;
        assert_eq!(status, 200, "{fault:?}: {text}");
        if i % 2 == 1 {
            assert!(
                text.ends_with("data: {\"type\":\"message_stop\"}\n\n"),
                "{fault:?}: {text}"
            );
        } else {
            assert!(text.contains("tok tok tok"), "{fault:?}: {text}");
        }
        let attempts: u32 = headers["x-ringmaster-attempts"]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(
            headers["x-ringmaster-server"].to_str().unwrap(),
            good.addr.to_string(),
            "{fault:?}"
        );
        retried += u32::from(attempts > 1);
    }
    assert!(retried > 0, "{fault:?}: no request met the bad server");
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains("ringmaster_upstream_attempts_total{outcome=\"ok\"} 16"),
        "{fault:?}"
    );
}

#[tokio::test]
async fn a_server_answering_500_or_429_is_retried_on_the_next() {
    // Ejection off, so that every request whose key the bad server owns meets it.
    retried_past(Behavior::Status500, "[upstream]\neject_after_failures = 0").await;
    retried_past(Behavior::Status429, "[upstream]\neject_after_failures = 0").await;
}

#[tokio::test]
async fn a_hung_server_times_out_and_is_retried() {
    retried_past(
        Behavior::Hang,
        "[upstream]\nfirst_byte_timeout_ms = 300\nwhole_answer_timeout_ms = 300\neject_after_failures = 0",
    )
    .await;
}

#[tokio::test]
async fn garbage_or_a_break_before_the_first_token_is_retried() {
    retried_past(Behavior::Garbage, "[upstream]\neject_after_failures = 0").await;
    retried_past(
        Behavior::CloseBeforeFirst,
        "[upstream]\neject_after_failures = 0",
    )
    .await;
}

#[tokio::test]
async fn a_failure_after_tokens_ends_in_an_error_never_a_hang() {
    for fault in [Behavior::CloseAfterToken, Behavior::ErrorMidStream] {
        let server = FakeUpstream::start(fault, 3).await;
        let gw = gateway(&[server.url()], "").await;
        let (status, _, text) = send(&gw, true, "s").await;
        assert_eq!(status, 200, "{fault:?}");
        let events = events(&text);
        let last = events.last().unwrap();
        assert_eq!(last["type"], "error", "{fault:?}: {text}");
        assert!(
            events.iter().any(|e| e["type"] == "content_block_delta"),
            "{fault:?}: the token before the fault reached the client"
        );
        let (status, _, text) = send(&gw, false, "s").await;
        assert_eq!(status, 500, "{fault:?}: {text}");
        assert!(text.contains("api_error"), "{fault:?}: {text}");
    }
}

#[tokio::test]
async fn an_endless_line_is_cut_off_at_the_limit() {
    let server = FakeUpstream::start(Behavior::EndlessLine, 3).await;
    let gw = gateway(&[server.url()], "[upstream]\nmax_event_bytes = 65536").await;
    let (status, headers, text) = send(&gw, true, "s").await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("larger than 65536 bytes"), "{text}");
    assert!(headers.contains_key("retry-after"));
}

/// The fake server as its own process, so that it can be killed.
struct Process {
    child: std::process::Child,
    url: String,
}

impl Process {
    fn start() -> Self {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_fake-upstream"))
            .args(["--listen", &format!("127.0.0.1:{port}"), "--tokens", "3"])
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Self { child, url }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_server_killed_mid_run_is_retried_around_then_ejected() {
    let mut doomed = Process::start();
    let survivor = Process::start();
    let gw = gateway(
        &[doomed.url.clone(), survivor.url.clone()],
        "[upstream]\neject_after_failures = 2\neject_base_ms = 60000",
    )
    .await;
    for i in 0..8 {
        let (status, _, _) = send(&gw, i % 2 == 0, &format!("before-{i}")).await;
        assert_eq!(status, 200);
    }
    doomed.child.kill().unwrap();
    doomed.child.wait().unwrap();
    for i in 0..24 {
        let (status, headers, text) = send(&gw, i % 2 == 0, &format!("after-{i}")).await;
        assert_eq!(status, 200, "{text}");
        assert_eq!(
            headers["x-ringmaster-server"].to_str().unwrap(),
            survivor.url.trim_start_matches("http://")
        );
    }
    let doomed_id = doomed.url.trim_start_matches("http://");
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(&format!(
            "ringmaster_server_routable{{server=\"{doomed_id}\"}} 0"
        )),
        "the dead server is not routable"
    );
    // Whether it was also ejected depends on how many requests met it before the health
    // poll did; the counter is exported either way.
    assert!(
        metrics.contains(&format!(
            "ringmaster_server_ejections_total{{server=\"{doomed_id}\"}}"
        )),
        "the ejection counter is exported"
    );
    drop(survivor);
    // Nothing serves the model now: a 503 with retry-after, not a hang.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let (status, headers, text) = send(&gw, false, "last").await;
    assert_eq!(status, 503, "{text}");
    assert!(headers.contains_key("retry-after"));
}

#[tokio::test]
async fn each_model_goes_only_to_its_servers_and_aliases_resolve() {
    let alpha = FakeUpstream::start(Behavior::Vllm, 2).await;
    let beta = FakeUpstream::start(Behavior::Vllm, 2).await;
    let toml = format!(
        "models = [\"alpha\", \"beta\"]\n[aliases]\ngamma = \"beta\"\n\
         [[servers]]\naddress = \"{}\"\nmodels = [\"alpha\"]\n\
         [[servers]]\naddress = \"{}\"\nmodels = [\"beta\"]\n",
        alpha.url(),
        beta.url()
    );
    let gw = TestGateway::start(&toml).await;
    for (model, server) in [("alpha", &alpha), ("beta", &beta), ("gamma", &beta)] {
        for i in 0..8 {
            let mut request = body(i % 2 == 0, &format!("{model}-{i}"));
            request["model"] = json!(model);
            let response = gw.post_messages(&request).await;
            assert_eq!(response.status(), 200, "{model}");
            assert_eq!(
                response.headers()["x-ringmaster-server"].to_str().unwrap(),
                server.addr.to_string(),
                "{model} went to another model's server"
            );
        }
    }
    let mut unknown = body(false, "x");
    unknown["model"] = json!("delta");
    let response = gw.post_messages(&unknown).await;
    assert_eq!(response.status(), 404);
    let error: Value = response.json().await.unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("alpha, beta, gamma"), "{message}");
    let listed = gw.get_json("/v1/models").await;
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alpha", "beta", "gamma"]);
}

#[tokio::test]
async fn a_servers_models_are_discovered_from_its_model_list() {
    // The config names "other"; the server lists only "fake" at /v1/models.
    let server = FakeUpstream::start(Behavior::Vllm, 2).await;
    let gw_other = TestGateway::start(&format!(
        "models = [\"other\"]\n[[servers]]\naddress = \"{}\"\n",
        server.url()
    ))
    .await;
    let discovered = crate::support::eventually(Duration::from_secs(10), async || {
        let listed = gw_other.get_json("/v1/models").await;
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "fake")
    })
    .await;
    assert!(
        discovered,
        "the server's own model list reached the gateway"
    );
    let mut request = body(false, "s");
    request["model"] = json!("fake");
    assert_eq!(gw_other.post_messages(&request).await.status(), 200);
    // "other" is named by the config, but no server takes it once the server's list is
    // known: it is neither listed nor accepted (a 404, not a 503 that never ends).
    let mut request = body(false, "s");
    request["model"] = json!("other");
    let response = gw_other.post_messages(&request).await;
    assert_eq!(response.status(), 404);
    let listed = gw_other.get_json("/v1/models").await;
    assert!(
        listed["data"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["id"] != "other"),
        "{listed}"
    );
}

/// Regression (issue 23): with only remote servers and no `models`, the built-in default
/// model was listed though nothing serves it, and a request for it got 503 "retry shortly"
/// for ever. Only what some server takes (or an alias names) is listed and accepted.
#[tokio::test]
async fn only_models_a_server_takes_are_listed_and_accepted() {
    let server = FakeUpstream::start(Behavior::Vllm, 2).await;
    let gw = TestGateway::start(&format!("[[servers]]\naddress = \"{}\"\n", server.url())).await;
    let listed = crate::support::eventually(Duration::from_secs(10), async || {
        gw.get_json("/v1/models").await["data"]
            .as_array()
            .is_some_and(|data| data.len() == 1 && data[0]["id"] == "fake")
    })
    .await;
    assert!(listed, "{}", gw.get_json("/v1/models").await);
    let unserved = gw
        .post_messages(&json!({
            "model": "sim-llama-3-8b", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        }))
        .await;
    assert_eq!(unserved.status(), 404);
    let error: Value = unserved.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("available models: fake"),
        "{error}"
    );
    assert_eq!(gw.post_messages(&body(false, "s")).await.status(), 200);
}

/// With the default simulated servers running, a real server added for another model gets
/// every request for that model: the simulated servers serve the configured `models`, not
/// whatever is asked (they once shared the new model's pool, and took most of its requests).
#[tokio::test]
async fn a_server_added_for_another_model_gets_that_models_requests() {
    let gw = TestGateway::simulated(2, 0.0, "").await;
    let real = FakeUpstream::start(Behavior::Vllm, 3).await;
    let added = gw
        .admin(reqwest::Method::POST, "/admin/servers?wait=true")
        .await
        .json(&json!({"id": "qwen", "address": real.url(), "models": ["qwen3-8b"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    for i in 0..8 {
        let response = gw
            .post_chat(&json!({
                "model": "qwen3-8b",
                "max_tokens": 3,
                "messages": [{"role": "user", "content": format!("question {i}")}],
            }))
            .await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-ringmaster-server"], "qwen");
    }
    // The simulated model stays on the simulated servers.
    let response = gw.post_messages(&crate::support::hello(2)).await;
    assert_eq!(response.status(), 200);
    assert_ne!(response.headers()["x-ringmaster-server"], "qwen");
}
