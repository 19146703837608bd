//! `[limits]`' client side over raw sockets: a slowloris head and a silent connection are
//! closed at the head timeout, an idle keep-alive connection at the idle timeout while a busy
//! one never is, a slow body gets 408, oversized heads and too many headers get 431, the
//! connection cap refuses new connections with 503 while the open ones keep being served,
//! HTTP/2 refuses streams past its cap, and the overload guard sheds door requests with
//! 529/503 and `retry-after` (pending work and memory) while health and metrics answer.

use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{ADMIN_TOKEN, TestGateway, hello, metric_sum};

/// Sends `head` on a new connection and checks it is answered 431 and closed.
async fn assert_refused_431(addr: std::net::SocketAddr, head: &str) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(head.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut conn, Duration::from_secs(10))
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
}

/// Reads until the peer closes (`Ok(bytes)`) or `within` passes (`Err`).
async fn read_until_closed(stream: &mut TcpStream, within: Duration) -> Result<Vec<u8>, ()> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + within;
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return Err(()),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// One HTTP/1.1 request on `stream` (kept alive), the response head and body as text.
async fn request(stream: &mut TcpStream, head: &str) -> String {
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(
            n > 0,
            "closed before answering: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .and_then(|v| v.trim().parse::<usize>().ok())
                })
                .unwrap_or(0);
            if body.len() >= length {
                return text;
            }
        }
    }
}

const HEALTH: &str = "GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n";

#[tokio::test]
async fn slowloris_and_silent_connections_are_closed_at_the_head_timeout_while_others_are_served() {
    let gw = TestGateway::simulated(
        1,
        0.01,
        "[limits]\nheader_read_timeout_ms = 600\nidle_timeout_ms = 30000",
    )
    .await;
    let mut slow = Vec::new();
    for i in 0..200 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        if i % 2 == 0 {
            // Half a head: the request line and one header, never the blank line.
            s.write_all(b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\n")
                .await
                .unwrap();
        }
        slow.push(s);
    }
    let opened = Instant::now();
    // While they hang, a whole request on a new connection is answered at once.
    let answered = gw.post_messages(&hello(4)).await;
    assert_eq!(answered.status(), 200);
    // One more header every 200 ms keeps a slowloris "alive" against a per-read timeout;
    // the head timeout counts from its first byte.
    let mut trickle = TcpStream::connect(gw.addr).await.unwrap();
    let trickled = tokio::spawn(async move {
        let mut i = 0;
        while trickle
            .write_all(format!("POST /v1/messages HTTP/1.1\r\nx-{i}: a\r\n").as_bytes())
            .await
            .is_ok()
        {
            i += 1;
            tokio::time::sleep(Duration::from_millis(200)).await;
            if i > 100 {
                return Err(());
            }
        }
        Ok(i)
    });
    for mut s in slow {
        read_until_closed(&mut s, Duration::from_secs(10))
            .await
            .expect("the gateway closes a connection that sends no whole head");
    }
    let closed_after = opened.elapsed();
    assert!(
        closed_after < Duration::from_secs(8),
        "200 slow heads took {closed_after:?} to close"
    );
    let sent = trickled
        .await
        .unwrap()
        .expect("the trickling client was cut off");
    assert!(sent < 20, "a trickling head was cut off after {sent} lines");
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_client_connections_closed_total",
            "header_timeout"
        ) >= 201.0,
        "{metrics}"
    );
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_a_busy_silent_one_is_not() {
    use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
    // SlowStart: 600 ms without a byte, longer than the idle timeout.
    let upstream = FakeUpstream::serve(
        tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Behavior::SlowStart,
        4,
    );
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[limits]\nidle_timeout_ms = 300\nheader_read_timeout_ms = 5000\n\
         [[servers]]\naddress = \"{}\"\n",
        upstream.url()
    ))
    .await;
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    let answer = request(&mut conn, HEALTH).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Busy: a request that takes 600 ms with nothing on the wire.
    let body =
        json!({"model": "fake", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
            .to_string();
    let answer = request(
        &mut conn,
        &format!(
            "POST /v1/messages HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // Idle: closed about 300 ms after the last answer.
    let idle = Instant::now();
    read_until_closed(&mut conn, Duration::from_secs(5))
        .await
        .expect("an idle connection is closed");
    let waited = idle.elapsed();
    assert!(
        waited >= Duration::from_millis(250),
        "closed too early: {waited:?}"
    );
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_client_connections_closed_total",
            "idle_timeout"
        ) >= 1.0
    );
}

#[tokio::test]
async fn a_slow_body_is_refused_with_408() {
    let gw = TestGateway::simulated(1, 0.01, "[limits]\nbody_read_timeout_ms = 400").await;
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    conn.write_all(
        b"POST /v1/messages HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"model\":",
    )
    .await
    .unwrap();
    let started = Instant::now();
    let answer = read_until_closed(&mut conn, Duration::from_secs(10))
        .await
        .expect("answered and closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("invalid_request_error"), "{answer}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The same through the OpenAI door: its own shape.
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    conn.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{",
    )
    .await
    .unwrap();
    let answer = read_until_closed(&mut conn, Duration::from_secs(10))
        .await
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("request_timeout"), "{answer}");
    // An operator's component upload that trickles is refused the same way: the admin token
    // does not buy a connection held open forever.
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    conn.write_all(
        format!(
            "PUT /admin/policies/router?variant=slow HTTP/1.1\r\nhost: gw\r\n\
             authorization: Bearer {ADMIN_TOKEN}\r\ncontent-length: 100000\r\n\r\n\0asm"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let answer = read_until_closed(&mut conn, Duration::from_secs(10))
        .await
        .expect("answered and closed");
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 400 ms"), "{answer}");
    assert!(
        metric_sum(
            &gw.metrics().await,
            "ringmaster_body_read_timeouts_total",
            ""
        ) >= 3.0
    );
}

#[tokio::test]
async fn heads_over_the_size_or_header_count_get_431() {
    let gw = TestGateway::simulated(
        1,
        0.01,
        "[limits]\nmax_header_bytes = 16384\nmax_headers = 20",
    )
    .await;
    let big = format!(
        "GET /healthz HTTP/1.1\r\nhost: gw\r\nx-big: {}\r\n\r\n",
        "a".repeat(20_000)
    );
    assert_refused_431(gw.addr, &big).await;
    let mut many = String::from("GET /healthz HTTP/1.1\r\nhost: gw\r\n");
    for i in 0..30 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    assert_refused_431(gw.addr, &many).await;
    // Under both caps: served.
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    let mut fine = String::from("GET /healthz HTTP/1.1\r\nhost: gw\r\n");
    for i in 0..10 {
        fine.push_str(&format!("x-h{i}: {}\r\n", "v".repeat(500)));
    }
    fine.push_str("\r\n");
    assert!(request(&mut conn, &fine).await.starts_with("HTTP/1.1 200"));
}

#[tokio::test]
async fn past_the_connection_cap_new_connections_get_503_and_open_ones_are_served() {
    let gw = TestGateway::simulated(1, 0.01, "[limits]\nmax_connections = 20").await;
    let mut open = Vec::new();
    for _ in 0..20 {
        let mut conn = TcpStream::connect(gw.addr).await.unwrap();
        assert!(request(&mut conn, HEALTH).await.starts_with("HTTP/1.1 200"));
        open.push(conn);
    }
    for _ in 0..5 {
        let mut refused = TcpStream::connect(gw.addr).await.unwrap();
        let _ = refused.write_all(HEALTH.as_bytes()).await;
        let answer = read_until_closed(&mut refused, Duration::from_secs(5))
            .await
            .expect("a refused connection is closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(answer.contains("retry-after: 1"), "{answer}");
    }
    // Those it has are served, requests to the servers included.
    for conn in &mut open {
        assert!(request(conn, HEALTH).await.starts_with("HTTP/1.1 200"));
    }
    let body = hello(2).to_string();
    let answer = request(
        &mut open[0],
        &format!(
            "POST /v1/messages HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // A closed one frees its place.
    open.truncate(15);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    assert!(request(&mut conn, HEALTH).await.starts_with("HTTP/1.1 200"));
    let metrics = {
        let mut conn = TcpStream::connect(gw.addr).await.unwrap();
        request(&mut conn, "GET /metrics HTTP/1.1\r\nhost: gw\r\n\r\n").await
    };
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_client_connections_closed_total",
            "refused"
        ) >= 5.0
    );
    assert!(metric_sum(&metrics, "ringmaster_client_connections", "") >= 16.0);
}

/// An HTTP/2 frame: length, type, flags, stream, payload.
fn h2_frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    frame.extend_from_slice(&[kind, flags]);
    frame.extend_from_slice(&stream.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// A header block of literal fields without indexing (no Huffman), as HPACK allows.
fn hpack_literals(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00);
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(value.len() as u8);
        block.extend_from_slice(value.as_bytes());
    }
    block
}

/// Reads one HTTP/2 frame: (type, flags, stream, payload).
async fn read_h2_frame(stream: &mut TcpStream) -> (u8, u8, u32, Vec<u8>) {
    let mut head = [0u8; 9];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut head))
        .await
        .expect("a frame in time")
        .expect("a frame");
    let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let mut payload = vec![0u8; length];
    stream.read_exact(&mut payload).await.unwrap();
    let id = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    (head[3], head[4], id, payload)
}

#[tokio::test]
async fn http2_advertises_its_stream_cap_and_refuses_a_stream_past_it() {
    let gw = TestGateway::simulated(1, 0.01, "[limits]\nmax_concurrent_streams = 4").await;
    let mut conn = TcpStream::connect(gw.addr).await.unwrap();
    conn.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    conn.write_all(&h2_frame(0x4, 0, 0, &[])).await.unwrap();
    // The server's SETTINGS: MAX_CONCURRENT_STREAMS (0x3) = 4.
    let (kind, _, _, payload) = read_h2_frame(&mut conn).await;
    assert_eq!(kind, 0x4, "SETTINGS first");
    let advertised = payload
        .chunks(6)
        .find(|s| u16::from_be_bytes([s[0], s[1]]) == 0x3)
        .map(|s| u32::from_be_bytes([s[2], s[3], s[4], s[5]]));
    assert_eq!(advertised, Some(4));
    conn.write_all(&h2_frame(0x4, 0x1, 0, &[])).await.unwrap();
    // Five streams whose bodies never come: four are taken, the fifth refused.
    let block = hpack_literals(&[
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1/messages"),
        (":authority", "gw"),
        ("content-type", "application/json"),
    ]);
    for stream in [1u32, 3, 5, 7, 9] {
        conn.write_all(&h2_frame(0x1, 0x4, stream, &block))
            .await
            .unwrap();
    }
    let mut refused = None;
    for _ in 0..20 {
        let (kind, _, stream, payload) = read_h2_frame(&mut conn).await;
        if kind == 0x3 {
            refused = Some((
                stream,
                u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]),
            ));
            break;
        }
    }
    // REFUSED_STREAM is 0x7.
    assert_eq!(refused, Some((9, 0x7)));
}

#[tokio::test]
async fn past_the_pending_bound_door_requests_are_shed_and_operators_still_see() {
    // time_scale 1: 300 tokens take over two seconds.
    let gw = TestGateway::simulated(2, 1.0, "[limits]\nmax_pending_requests = 3").await;
    let long = json!({"model": "sim-llama-3-8b", "max_tokens": 300, "stream": true,
        "messages": [{"role": "user", "content": "a long answer"}]});
    let mut held = Vec::new();
    for _ in 0..3 {
        let response = gw.post_messages(&long).await;
        assert_eq!(response.status(), 200);
        held.push(response);
    }
    let shed = gw.post_messages(&hello(4)).await;
    assert_eq!(shed.status(), 529);
    assert_eq!(shed.headers()["retry-after"], "1");
    let body: serde_json::Value = shed.json().await.unwrap();
    assert_eq!(body["error"]["type"], "overloaded_error");
    let chat = gw
        .post_chat(&json!({"model": "sim-llama-3-8b", "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(chat.status(), 503);
    assert_eq!(chat.headers()["retry-after"], "1");
    let health = gw.client.get(gw.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_overload_shed_total", "pending"),
        2.0
    );
    assert_eq!(metric_sum(&metrics, "ringmaster_pending_requests", ""), 3.0);
    // The held streams finish whole; then requests are let in again.
    for response in held {
        let text = response.text().await.unwrap();
        assert!(text.contains("message_stop"), "{text}");
    }
    assert_eq!(gw.post_messages(&hello(4)).await.status(), 200);
    assert_eq!(
        metric_sum(&gw.metrics().await, "ringmaster_pending_requests", ""),
        0.0
    );
}

#[tokio::test]
async fn past_the_memory_bound_door_requests_are_shed() {
    // 64 MiB, the lowest bound, and 96 MiB of ballast written (so resident) in this process,
    // which the in-process gateway measures.
    let ballast = std::hint::black_box(vec![1u8; 96 << 20]);
    let gw = TestGateway::simulated(1, 0.01, "[limits]\nmax_memory_mb = 64").await;
    let metrics = gw.metrics().await;
    let resident = metric_sum(&metrics, "ringmaster_resident_memory_bytes", "");
    assert!(
        resident > 64.0 * 1024.0 * 1024.0,
        "the premise: this process holds more than 64 MiB ({resident} bytes)"
    );
    let shed = gw.post_messages(&hello(4)).await;
    assert_eq!(shed.status(), 529);
    assert_eq!(shed.headers()["retry-after"], "1");
    let text = shed.text().await.unwrap();
    assert!(text.contains("memory bound"), "{text}");
    let metrics = gw.metrics().await;
    assert!(metric_sum(&metrics, "ringmaster_overload_shed_total", "memory") >= 1.0);
    // Health and metrics are never shed.
    let health = gw.client.get(gw.url("/healthz")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    drop(ballast);
}

#[tokio::test]
async fn an_output_limit_above_the_gateways_is_served_at_it_and_the_answer_says_so() {
    let gw = TestGateway::simulated(1, 0.01, "[limits]\nmax_output_tokens = 12").await;
    let clamped = |response: &reqwest::Response| {
        response
            .headers()
            .get("x-ringmaster-clamped")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    // Claude Code's ask, plain: served (not refused), at most the limit, and said.
    let response = gw.post_messages(&hello(32_000)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(clamped(&response).as_deref(), Some("max_tokens=32000->12"));
    let body: serde_json::Value = response.json().await.unwrap();
    assert!(
        body["usage"]["output_tokens"].as_u64().unwrap() <= 12,
        "{body}"
    );
    // Streamed, by chat's newer field: the header comes with the stream's head.
    let response = gw
        .client
        .post(gw.url("/v1/chat/completions"))
        .json(
            &json!({"model": "sim-llama-3-8b", "max_completion_tokens": 500, "stream": true,
            "messages": [{"role": "user", "content": "Hello there"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        clamped(&response).as_deref(),
        Some("max_completion_tokens=500->12")
    );
    assert!(response.text().await.unwrap().contains("[DONE]"));
    // The Responses door's field.
    let response = gw
        .client
        .post(gw.url("/v1/responses"))
        .json(&json!({"model": "sim-llama-3-8b", "max_output_tokens": 64000, "input": "Hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        clamped(&response).as_deref(),
        Some("max_output_tokens=64000->12")
    );
    // At the limit: nothing to say.
    let response = gw.post_messages(&hello(12)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(clamped(&response), None);
    // Below 1 is still the client's mistake.
    assert_eq!(gw.post_messages(&hello(0)).await.status(), 400);
}

#[tokio::test]
async fn a_relayed_body_reaches_its_server_with_the_gateways_output_limit() {
    use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
    let server = FakeUpstream::start(Behavior::OpenAi, 3).await;
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[limits]\nmax_output_tokens = 12\n[[servers]]\naddress = \"{}\"\n",
        server.url()
    ))
    .await;
    let response = gw
        .post_chat(&json!({"model": "fake", "max_tokens": 32000,
            "messages": [{"role": "user", "content": "Hello"}]}))
        .await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert_eq!(
        response.headers()["x-ringmaster-clamped"],
        "max_tokens=32000->12"
    );
    // The server was asked for what the header says, not for what the client asked.
    assert_eq!(server.last_request_json()["max_tokens"], 12);
}
