//! Every error a client can cause gets the right status and an Anthropic error naming it.

use serde_json::{Value, json};

use crate::support::{TestGateway, hello};

async fn expect_error(response: reqwest::Response, status: u16, kind: &str, needle: &str) {
    assert_eq!(response.status().as_u16(), status);
    assert!(response.headers().contains_key("request-id"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], kind, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(needle),
        "{message:?} should mention {needle:?}"
    );
}

async fn post_raw(
    gw: &TestGateway,
    content_type: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    gw.client
        .post(gw.url("/v1/messages"))
        .header("content-type", content_type)
        .body(body)
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn bad_requests_are_named() {
    let gw = TestGateway::simulated(1, 0.0, "[limits]\nmax_body_bytes = 4096").await;
    let json_type = "application/json";
    let cases: Vec<(&str, Vec<u8>, u16, &str, &str)> = vec![
        (json_type, b"{\"model\": ".to_vec(), 400, "invalid_request_error", "not valid JSON"),
        (json_type, br#"{"model":"sim-llama-3-8b","max_tokens":"many","messages":[]}"#.to_vec(), 400, "invalid_request_error", "invalid type"),
        (json_type, br#"{"model":"sim-llama-3-8b","messages":[{"role":"user","content":"hi"}]}"#.to_vec(), 400, "invalid_request_error", "max_tokens"),
        (json_type, br#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[]}"#.to_vec(), 400, "invalid_request_error", "messages"),
        (json_type, b"{\"model\":\"sim-llama-3-8b\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}".to_vec(), 400, "invalid_request_error", "UTF-8"),
        (json_type, br#"{"model":"claude-opus-9","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#.to_vec(), 404, "not_found_error", "claude-opus-9"),
        (json_type, vec![b' '; 5000], 413, "request_too_large", "4096"),
        ("text/plain", serde_json::to_vec(&hello(5)).unwrap(), 415, "invalid_request_error", "content-type"),
        ("application/json; charset=utf-8", br#"{"model":"sim-llama-3-8b","max_tokens":5,"messages":[{"role":"user","content":"hi"}],"temperature":3}"#.to_vec(), 400, "invalid_request_error", "temperature"),
    ];
    for (content_type, body, status, kind, needle) in cases {
        expect_error(
            post_raw(&gw, content_type, body).await,
            status,
            kind,
            needle,
        )
        .await;
    }
    // A body over the limit without a content-length (chunked) is refused too.
    let chunks =
        futures_util::stream::iter((0..10).map(|_| Ok::<_, std::io::Error>(vec![b' '; 1000])));
    let response = post_raw(&gw, json_type, reqwest::Body::wrap_stream(chunks)).await;
    expect_error(response, 413, "request_too_large", "limit").await;
    // Wrong method and unknown path.
    let response = gw.client.get(gw.url("/v1/messages")).send().await.unwrap();
    expect_error(response, 405, "invalid_request_error", "GET").await;
    let response = gw.client.get(gw.url("/v2/nothing")).send().await.unwrap();
    expect_error(response, 404, "not_found_error", "/v2/nothing").await;
    // The gateway still serves after all that.
    assert_eq!(gw.post_messages(&hello(2)).await.status(), 200);
}

#[tokio::test]
async fn api_keys_and_rate_limits() {
    let gw = TestGateway::simulated(
        1,
        0.0,
        "[[api_keys]]\nkey = \"sk-live-alpha\"\n[[api_keys]]\nkey = \"sk-live-beta\"\nrequests_per_minute = 2",
    )
    .await;
    let response = gw.post_messages(&hello(2)).await;
    expect_error(response, 401, "authentication_error", "x-api-key").await;
    let response = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("x-api-key", "sk-wrong")
        .json(&hello(2))
        .send()
        .await
        .unwrap();
    expect_error(response, 401, "authentication_error", "invalid").await;
    let ok = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("x-api-key", "sk-live-alpha")
        .json(&hello(2))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    for _ in 0..2 {
        let ok = gw
            .client
            .post(gw.url("/v1/messages"))
            .bearer_auth("sk-live-beta")
            .json(&hello(2))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), 200);
    }
    let limited = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("x-api-key", "sk-live-beta")
        .json(&hello(2))
        .send()
        .await
        .unwrap();
    assert!(
        limited.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    expect_error(limited, 429, "rate_limit_error", "rate limit").await;
}

#[tokio::test]
async fn no_servers_is_overloaded_and_not_ready() {
    let gw = TestGateway::simulated(1, 0.0, "").await;
    let removed = gw
        .admin(reqwest::Method::DELETE, "/admin/servers/gpu-0")
        .await
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 200);
    let response = gw.post_messages(&hello(2)).await;
    expect_error(response, 529, "overloaded_error", "no GPU servers").await;
    let ready = gw.client.get(gw.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
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

/// A pool whose only server cannot be reached is not ready: `/readyz` answers 503 once the
/// gateway finds it down, not 200 because a server is listed.
#[tokio::test]
async fn a_pool_of_unreachable_servers_is_not_ready() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = closed.local_addr().unwrap();
    drop(closed);
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\nid = \"down\"\naddress = \"http://{address}\"\n"
    ))
    .await;
    let not_ready = crate::support::eventually(std::time::Duration::from_secs(15), async || {
        gw.client
            .get(gw.url("/readyz"))
            .send()
            .await
            .is_ok_and(|r| r.status() == 503)
    })
    .await;
    assert!(not_ready, "/readyz stayed ready with its only server down");
    let body: Value = gw
        .client
        .get(gw.url("/readyz"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        body.to_string()
            .contains("none of the 1 GPU servers is reachable"),
        "{body}"
    );
}

#[tokio::test]
async fn a_prompt_that_can_never_fit_is_rejected_not_queued() {
    let gw = TestGateway::simulated(
        1,
        0.0,
        "[limits]\nmax_output_tokens = 100000\n[simulator]\nkv_blocks = 64",
    )
    .await;
    let request = json!({
        "model": "sim-llama-3-8b", "max_tokens": 2000,
        "messages": [{"role": "user", "content": "word ".repeat(2000)}],
    });
    let response = gw.post_messages(&request).await;
    expect_error(response, 400, "invalid_request_error", "too long").await;
}
