//! A client that disconnects mid-stream cancels its generation and frees its KV blocks.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;

use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};

use crate::support::{TestGateway, eventually, metric_sum};

#[tokio::test]
async fn disconnect_mid_stream_frees_kv_blocks() {
    // Real-time decode steps of 8 ms at a time scale of 0.5: a 4000-token reply would take
    // about 16 s, so the stream is certainly still running when the client leaves.
    let gw = TestGateway::simulated(1, 0.5, "").await;
    let request = json!({
        "model": "sim-llama-3-8b", "max_tokens": 4000, "stream": true,
        "system": "A long system prompt. ".repeat(200),
        "messages": [{"role": "user", "content": "Tell me a very long story"}],
    });
    let response = gw.post_messages(&request).await;
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("content_block_delta") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    let during = gw.metrics().await;
    assert!(
        metric_sum(&during, "ringmaster_server_kv_blocks_used", "") > 0.0,
        "blocks held while generating"
    );
    assert_eq!(metric_sum(&during, "ringmaster_server_in_flight", ""), 1.0);
    drop(body); // the client goes away

    let freed = eventually(Duration::from_secs(5), async || {
        let m = gw.metrics().await;
        metric_sum(&m, "ringmaster_server_kv_blocks_used", "") == 0.0
            && metric_sum(&m, "ringmaster_server_in_flight", "") == 0.0
            && metric_sum(&m, "ringmaster_server_running", "") == 0.0
    })
    .await;
    assert!(freed, "KV blocks were not freed:\n{}", gw.metrics().await);
    let after = gw.metrics().await;
    assert_eq!(
        metric_sum(&after, "ringmaster_client_disconnects_total", ""),
        1.0
    );
    assert_eq!(
        metric_sum(&after, "ringmaster_server_cancelled_requests_total", ""),
        1.0
    );
    // The prompt's blocks stay cached for the next request (freed, not forgotten).
    assert!(metric_sum(&after, "ringmaster_server_kv_blocks_cached", "") > 0.0);
}

#[tokio::test]
async fn disconnect_during_a_plain_reply_cancels_it() {
    let gw = TestGateway::simulated(1, 0.5, "").await;
    let request = json!({
        "model": "sim-llama-3-8b", "max_tokens": 4000,
        "messages": [{"role": "user", "content": "Tell me a very long story"}],
    });
    // The client gives up after 300 ms of a reply that would take ~16 s.
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let result = impatient
        .post(gw.url("/v1/messages"))
        .json(&request)
        .send()
        .await;
    assert!(result.unwrap_err().is_timeout());
    let cancelled = eventually(Duration::from_secs(5), async || {
        let m = gw.metrics().await;
        metric_sum(&m, "ringmaster_server_cancelled_requests_total", "") == 1.0
            && metric_sum(&m, "ringmaster_server_kv_blocks_used", "") == 0.0
            && metric_sum(&m, "ringmaster_server_in_flight", "") == 0.0
    })
    .await;
    assert!(
        cancelled,
        "the generation kept running:\n{}",
        gw.metrics().await
    );
    assert_eq!(
        metric_sum(
            &gw.metrics().await,
            "ringmaster_client_disconnects_total",
            ""
        ),
        1.0
    );
}

#[tokio::test]
async fn a_long_prompt_counts_in_its_servers_prefill_backlog_until_its_first_token() {
    // About 30k prompt tokens prefill in about 3 s modelled, 1.5 s at a time scale of 0.5.
    let gw = TestGateway::simulated(1, 0.5, "").await;
    let request = json!({
        "model": "sim-llama-3-8b", "max_tokens": 2000, "stream": true,
        "messages": [{"role": "user", "content": "many words ".repeat(15_000)}],
    });
    let client = reqwest::Client::new();
    let url = gw.url("/v1/messages");
    let sent = tokio::spawn(async move {
        client
            .post(url)
            .header("anthropic-version", "2023-06-01")
            .json(&request)
            .send()
            .await
            .unwrap()
    });
    let queued = eventually(Duration::from_secs(5), async || {
        metric_sum(
            &gw.metrics().await,
            "ringmaster_server_prefill_backlog_tokens",
            "",
        ) > 10_000.0
    })
    .await;
    assert!(
        queued,
        "no backlog while prefilling:\n{}",
        gw.metrics().await
    );
    let response = sent.await.unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("message_start") {
        seen.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    let during = gw.metrics().await;
    assert_eq!(
        metric_sum(&during, "ringmaster_server_prefill_backlog_tokens", ""),
        0.0,
        "the prompt left the backlog at its first token"
    );
    assert_eq!(metric_sum(&during, "ringmaster_server_in_flight", ""), 1.0);
    drop(body);
}

#[tokio::test]
async fn a_client_that_takes_nothing_is_cut_off_after_the_send_timeout() {
    use tokio::io::AsyncWriteExt;
    // A long, fast reply (60,000 chunks, about 7 MB of events): more than hyper's write
    // buffer and the sockets' buffers hold (Linux lets a send buffer grow to 4 MB), so a
    // client that reads nothing stalls the writes.
    let server = FakeUpstream::start(Behavior::Vllm, 60_000).await;
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[limits]\nmax_output_tokens = 100000\nclient_send_timeout_ms = 300\n\
         [[servers]]\naddress = \"{}\"\n",
        server.url()
    ))
    .await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(gw.addr).await.unwrap();
    let body = json!({
        "model": "fake", "max_tokens": 60000, "stream": true,
        "messages": [{"role": "user", "content": "Tell me everything"}],
    })
    .to_string();
    let request = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    // Reads nothing: the gateway gives up on the client.
    let cut_off = eventually(Duration::from_secs(20), async || {
        metric_sum(
            &gw.metrics().await,
            "ringmaster_slow_client_disconnects_total",
            "",
        ) >= 1.0
    })
    .await;
    assert!(cut_off, "the stalled client was not cut off");
    let cancelled = eventually(Duration::from_secs(5), async || {
        metric_sum(
            &gw.metrics().await,
            "ringmaster_client_disconnects_total",
            "",
        ) >= 1.0
    })
    .await;
    assert!(cancelled, "the reply was not dropped with the connection");
    drop(stream);
}
