//! Traces: a `ringmaster serve` process exporting OTLP to an in-test receiver (HTTP and gRPC),
//! with a fake upstream that records the `traceparent` it was sent. The span tree, the GenAI
//! attributes, the client's trace continued, the context sent on, retries and sampling.

use std::time::Duration;

use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
use ringmaster_tests::otlp_receiver::{OtlpReceiver, ReceivedSpan};
use serde_json::json;

use crate::fleet_support::Replica;

/// A config for one gateway in front of `servers` (OpenAI-compatible fakes serving `fake`)
/// exporting to `receiver` as `telemetry` adds.
fn config(name: &str, servers: &[String], telemetry: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ringmaster-telemetry-{name}-{}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut toml = format!(
        "admin_token = \"{}\"\nmodels = [\"fake\"]\n[telemetry]\n{telemetry}\n",
        crate::support::ADMIN_TOKEN
    );
    for url in servers {
        toml.push_str(&format!("[[servers]]\naddress = \"{url}\"\n"));
    }
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn child<'a>(
    spans: &'a [ReceivedSpan],
    parent: &ReceivedSpan,
    name: &str,
) -> Vec<&'a ReceivedSpan> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.name == name)
        .collect()
}

/// `POST /v1/chat/completions` with `body`, inside the trace `traceparent` names if any.
async fn chat(
    gateway: &Replica,
    traceparent: Option<&str>,
    body: serde_json::Value,
) -> reqwest::Response {
    let mut request = gateway
        .client
        .post(gateway.url("/v1/chat/completions"))
        .json(&body);
    if let Some(value) = traceparent {
        request = request.header("traceparent", value);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn a_request_is_one_trace_continued_from_the_client_and_sent_on_to_the_server() {
    let receiver = OtlpReceiver::start().await;
    let upstream = FakeUpstream::start(Behavior::Vllm, 5).await;
    let path = config(
        "tree",
        &[upstream.url()],
        &format!(
            "otlp_endpoint = \"{}\"\nservice_name = \"gateway-under-test\"",
            receiver.url()
        ),
    );
    let gateway = Replica::start(&path, None, "traced").await;

    // A streamed OpenAI request inside the client's own trace.
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let response = chat(
        &gateway,
        Some(&traceparent),
        json!({
            "model": "fake", "max_tokens": 8, "stream": true,
            "messages": [{"role": "user", "content": "trace me, please"}],
        }),
    )
    .await;
    assert_eq!(response.status(), 200);
    let request_id = response.headers()["request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let body = response.text().await.unwrap();
    assert!(body.contains("[DONE]"), "{body}");

    let spans = receiver
        .trace(CLIENT_TRACE, 4, Duration::from_secs(20))
        .await;
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let root = spans
        .iter()
        .find(|s| s.parent_span_id == CLIENT_SPAN)
        .unwrap_or_else(|| panic!("no span continues the client's: {names:?}"));
    // The request: a server span named by the GenAI conventions.
    assert_eq!(root.name, "chat fake");
    assert_eq!(root.kind, 2, "server");
    assert_eq!(root.service, "gateway-under-test");
    assert_eq!(root.transport, "http");
    assert_eq!(root.str("gen_ai.operation.name"), Some("chat"));
    assert_eq!(root.str("gen_ai.provider.name"), Some("openai"));
    assert_eq!(root.str("gen_ai.request.model"), Some("fake"));
    assert_eq!(root.str("gen_ai.response.model"), Some("fake"));
    assert_eq!(root.int("gen_ai.request.max_tokens"), Some(8));
    assert!(
        root.int("gen_ai.usage.input_tokens").unwrap() > 0,
        "{root:?}"
    );
    assert_eq!(root.int("gen_ai.usage.output_tokens"), Some(5));
    assert_eq!(
        root.attributes["gen_ai.response.finish_reasons"],
        json!(["end_turn"])
    );
    assert_eq!(root.str("ringmaster.request_id"), Some(request_id.as_str()));
    assert_eq!(root.str("request_id"), Some(request_id.as_str()));
    assert_eq!(root.int("http.response.status_code"), Some(200));
    assert!(
        root.events.iter().any(|e| e == "gen_ai.first_token"),
        "{root:?}"
    );
    assert!(
        root.attributes["gen_ai.server.time_to_first_token"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    // The span lasts until the stream's end, after its children.
    for span in spans.iter().filter(|s| s.span_id != root.span_id) {
        assert!(
            span.end_ns <= root.end_ns,
            "{} ends after the request",
            span.name
        );
    }

    let admission = child(&spans, root, "admission");
    assert_eq!(admission.len(), 1, "{names:?}");
    assert_eq!(
        admission[0].attributes["ringmaster.admission.queued"],
        json!(false)
    );

    let route = child(&spans, root, "route");
    assert_eq!(route.len(), 1, "{names:?}");
    let route = route[0];
    assert_eq!(route.str("ringmaster.policy.slot"), Some("router"));
    assert_eq!(route.str("ringmaster.policy.variant"), Some("default"));
    assert!(
        route
            .str("ringmaster.policy.version")
            .is_some_and(|v| v.len() >= 16),
        "{route:?}"
    );
    assert!(
        route.int("ringmaster.policy.duration_us").is_some(),
        "{route:?}"
    );
    assert_eq!(
        route.str("ringmaster.routing.server"),
        Some(upstream.addr.to_string().as_str())
    );
    assert_eq!(route.attributes["ringmaster.routing.spilled"], json!(false));
    assert_eq!(route.int("ringmaster.routing.in_flight"), Some(1));
    assert_eq!(route.int("ringmaster.routing.candidates"), Some(1));
    assert!(route.str("ringmaster.routing.reason").is_some());
    assert!(route.int("ringmaster.routing.uncached_tokens").is_some());

    let attempts = child(&spans, root, "upstream");
    assert_eq!(attempts.len(), 1, "{names:?}");
    let attempt = attempts[0];
    assert_eq!(attempt.kind, 3, "client");
    assert_eq!(attempt.int("ringmaster.attempt"), Some(1));
    assert_eq!(attempt.str("ringmaster.attempt.outcome"), Some("ok"));
    assert_eq!(
        attempt.str("server.address"),
        Some(upstream.addr.to_string().as_str())
    );

    // The server was sent the attempt's span as its parent, in the client's trace.
    let sent = upstream.traceparents.lock().unwrap().clone();
    assert_eq!(
        sent,
        [Some(format!("00-{CLIENT_TRACE}-{}-01", attempt.span_id))]
    );

    // The trace as a picture (the README's is one of these).
    let picture = std::env::var_os("RINGMASTER_TRACE_SVG").map_or_else(
        || std::env::temp_dir().join(format!("ringmaster-trace-{}.svg", std::process::id())),
        std::path::PathBuf::from,
    );
    ringmaster_tests::otlp_receiver::waterfall(&spans, &picture).unwrap();
    assert!(
        std::fs::read_to_string(&picture)
            .unwrap()
            .contains("upstream")
    );

    // A request without a trace context starts a new trace of its own (Messages door).
    let response = gateway
        .client
        .post(gateway.url("/v1/messages"))
        .json(&json!({
            "model": "fake", "max_tokens": 8,
            "messages": [{"role": "user", "content": "a new trace"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let request_id = response.headers()["request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut new_root = None;
    for _ in 0..200 {
        new_root = receiver
            .spans()
            .into_iter()
            .find(|s| s.str("ringmaster.request_id") == Some(request_id.as_str()));
        if new_root.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let new_root = new_root.expect("the second request's span arrives");
    assert_ne!(new_root.trace_id, CLIENT_TRACE);
    assert_eq!(new_root.parent_span_id, "", "a root");
    assert_eq!(new_root.str("gen_ai.provider.name"), Some("anthropic"));
    let sent = upstream.traceparents.lock().unwrap().clone();
    assert!(
        sent[1].as_deref().unwrap().contains(&new_root.trace_id),
        "{sent:?}"
    );
}

#[tokio::test]
async fn a_retry_is_a_second_attempt_span_with_its_reason_and_a_failure_marks_the_request() {
    let receiver = OtlpReceiver::start().await;
    let first = FakeUpstream::start(Behavior::Status500, 1).await;
    let second = FakeUpstream::start(Behavior::Status500, 1).await;
    // gRPC this time.
    let path = config(
        "retry",
        &[first.url(), second.url()],
        &format!(
            "otlp_endpoint = \"{}\"\nprotocol = \"grpc\"",
            receiver.url()
        ),
    );
    let gateway = Replica::start(&path, None, "retried").await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let response = chat(
        &gateway,
        Some(&traceparent),
        json!({
            "model": "fake", "max_tokens": 8,
            "messages": [{"role": "user", "content": "both servers fail"}],
        }),
    )
    .await;
    assert!(response.status().is_server_error(), "{}", response.status());
    let spans = receiver
        .trace(CLIENT_TRACE, 5, Duration::from_secs(20))
        .await;
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let root = spans
        .iter()
        .find(|s| s.parent_span_id == CLIENT_SPAN)
        .unwrap_or_else(|| panic!("{names:?}"));
    assert_eq!(root.transport, "grpc");
    assert_eq!(root.status, 2, "the request failed: {root:?}");
    assert_eq!(root.str("error.type"), Some("overloaded_error"));
    let mut attempts = child(&spans, root, "upstream");
    attempts.sort_by_key(|s| s.int("ringmaster.attempt"));
    assert_eq!(attempts.len(), 2, "{names:?}");
    assert_eq!(attempts[0].str("ringmaster.retry.reason"), None);
    let reason = attempts[1].str("ringmaster.retry.reason").unwrap();
    assert!(reason.contains("500"), "{reason}");
    for attempt in &attempts {
        assert_eq!(attempt.status, 2, "{attempt:?}");
        assert!(
            attempt
                .str("ringmaster.attempt.outcome")
                .is_some_and(|o| o != "ok")
        );
    }
    assert_ne!(
        attempts[0].str("server.address"),
        attempts[1].str("server.address"),
        "a retry goes to the other server"
    );
}

#[tokio::test]
async fn unsampled_traces_export_nothing_but_a_client_s_sampled_trace_is_kept() {
    let receiver = OtlpReceiver::start().await;
    let upstream = FakeUpstream::start(Behavior::OpenAi, 2).await;
    let path = config(
        "sampling",
        &[upstream.url()],
        &format!("otlp_endpoint = \"{}\"\nsample_ratio = 0.0", receiver.url()),
    );
    let gateway = Replica::start(&path, None, "sampled").await;
    let body = json!({
        "model": "fake", "max_tokens": 4,
        "messages": [{"role": "user", "content": "sampled?"}],
    });
    for _ in 0..5 {
        assert_eq!(chat(&gateway, None, body.clone()).await.status(), 200);
    }
    // The client decided: its sampled trace is recorded even at ratio 0.
    let kept_trace = "0af7651916cd43dd8448eb211c80319c";
    let traceparent = format!("00-{kept_trace}-b7ad6b7169203331-01");
    assert_eq!(
        chat(&gateway, Some(&traceparent), body.clone())
            .await
            .status(),
        200
    );
    let spans = receiver.trace(kept_trace, 4, Duration::from_secs(20)).await;
    assert!(spans.len() >= 4, "{spans:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let others: Vec<_> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id != kept_trace)
        .collect();
    assert!(others.is_empty(), "unsampled requests exported {others:?}");
    // Unsampled requests still pass a context on (flag 00): the server may continue it.
    let sent = upstream.traceparents.lock().unwrap().clone();
    assert_eq!(sent.len(), 6);
    assert!(
        sent[..5]
            .iter()
            .all(|t| t.as_deref().is_none_or(|t| t.ends_with("-00"))),
        "{sent:?}"
    );
}

#[tokio::test]
async fn without_telemetry_a_client_s_traceparent_is_passed_on_unchanged() {
    let upstream = FakeUpstream::start(Behavior::OpenAi, 2).await;
    let gateway = crate::support::TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\n",
        upstream.url()
    ))
    .await;
    let traceparent = format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01");
    let response = gateway
        .client
        .post(gateway.url("/v1/chat/completions"))
        .header("traceparent", &traceparent)
        .header("tracestate", "vendor=1")
        .json(&json!({
            "model": "fake", "max_tokens": 4,
            "messages": [{"role": "user", "content": "passed on"}],
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        upstream.traceparents.lock().unwrap().clone(),
        [Some(traceparent)]
    );
}
