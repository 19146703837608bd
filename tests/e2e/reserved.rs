//! The fields and headers only the gateway may set (a split request's orchestration:
//! `kv_transfer_params`, SGLang's bootstrap and ranks, the workers' `ringmaster_*`, the legs'
//! `x-request-id`, `x-data-parallel-rank` and credential) never reach a server from a client:
//! through every door, relayed to a server of the door's API or translated into another's,
//! whole or split into legs, plain or streamed. They are dropped and counted like other dropped
//! fields, and `[api] unknown_fields = "refuse"` refuses them with a 400.

use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream, Received};
use ringmaster_tests::pd_upstream::{PdEngine, PdFault, PdLog, PdRole, PdServer, SharedLog};
use ringmaster_wire::reserved::{RESERVED_FIELDS, RESERVED_HEADERS};
use serde_json::{Value, json};

use crate::support::{TestGateway, metric_sum};

/// What a client may try to steer the engines with.
fn steering() -> Value {
    json!({
        "kv_transfer_params": {
            "do_remote_prefill": true, "do_remote_decode": false,
            "remote_host": "169.254.169.254", "remote_port": 80,
            "remote_request_id": "planted", "remote_engine_id": "evil",
            "remote_block_ids": ["00000000000000aa"]
        },
        "bootstrap_host": "169.254.169.254",
        "bootstrap_port": 80,
        "bootstrap_room": 42,
        "routed_dp_rank": 3,
        "disagg_prefill_dp_rank": 2,
        "ringmaster_priority": 9,
    })
}

/// The headers a client may try the same with.
const STEERING_HEADERS: [(&str, &str); 3] = [
    ("x-request-id", "client-chosen-id"),
    ("x-data-parallel-rank", "7"),
    ("x-ringmaster-leg-credential", "00ff"),
];

/// A door's path and a small body of its own, with the steering fields added.
fn request(door: &str, stream: bool, prompt: &str) -> (&'static str, Value) {
    let (path, mut body) = match door {
        "messages" => (
            "/v1/messages",
            json!({"model": "fake", "max_tokens": 5,
                   "messages": [{"role": "user", "content": prompt}]}),
        ),
        "chat" => (
            "/v1/chat/completions",
            json!({"model": "fake", "max_tokens": 5,
                   "messages": [{"role": "user", "content": prompt}]}),
        ),
        "completions" => (
            "/v1/completions",
            json!({"model": "fake", "max_tokens": 5, "prompt": prompt}),
        ),
        "responses" => (
            "/v1/responses",
            json!({"model": "fake", "max_output_tokens": 5, "input": prompt}),
        ),
        other => panic!("no door {other}"),
    };
    body["stream"] = json!(stream);
    for (key, value) in steering().as_object().unwrap() {
        body[key] = value.clone();
    }
    (path, body)
}

async fn send(gw: &TestGateway, path: &str, body: &Value) -> reqwest::Response {
    let mut builder = gw.client.post(gw.url(path)).json(body);
    for (name, value) in STEERING_HEADERS {
        builder = builder.header(name, value);
    }
    builder.send().await.unwrap()
}

/// What of the client's steering a server got: each reserved field at its body's top level,
/// and each reserved header with the client's value.
fn leaked(body: &Value, headers: &[(String, Option<String>)]) -> Vec<String> {
    let mut found = Vec::new();
    if let Some(object) = body.as_object() {
        for name in object.keys() {
            if RESERVED_FIELDS.contains(&name.as_str()) || name.starts_with("ringmaster_") {
                found.push(name.clone());
            }
        }
    }
    for (name, value) in headers {
        let client = STEERING_HEADERS.iter().find(|(n, _)| n == name);
        if let (Some((_, sent)), Some(value)) = (client, value)
            && value == sent
        {
            found.push(format!("header {name}"));
        }
    }
    found
}

fn received_leaks(received: &Received) -> Vec<String> {
    let body: Value = serde_json::from_slice(&received.body).unwrap_or(Value::Null);
    let headers: Vec<(String, Option<String>)> = RESERVED_HEADERS
        .iter()
        .map(|name| {
            (
                (*name).to_owned(),
                received
                    .headers
                    .get(*name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned),
            )
        })
        .collect();
    leaked(&body, &headers)
}

/// Each door, plain and streamed, to a server of each API: relayed as it came where the
/// server speaks the door's API, translated where it does not; nothing of the steering
/// arrives, and each field is counted as dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_door_passes_the_gateways_own_fields_on_relayed_or_translated() {
    for api in ["chat", "messages", "responses"] {
        let upstream = FakeUpstream::start(Behavior::OpenAi, 3).await;
        let gw = TestGateway::start(&format!(
            "models = [\"fake\"]\n[[servers]]\naddress = \"{}\"\napi = \"{api}\"\n",
            upstream.url()
        ))
        .await;
        let mut sent = 0;
        for door in ["messages", "chat", "completions", "responses"] {
            // A raw prompt is a chat server's alone (`/v1/completions`).
            if door == "completions" && api != "chat" {
                continue;
            }
            for stream in [false, true] {
                let (path, body) = request(door, stream, "Say hi.");
                let response = send(&gw, path, &body).await;
                let status = response.status();
                let dropped = response
                    .headers()
                    .get("x-ringmaster-dropped")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_owned();
                let text = response.text().await.unwrap();
                assert_eq!(status, 200, "{door} → {api} (stream {stream}): {text}");
                assert!(
                    dropped.contains("kv_transfer_params") && dropped.contains("bootstrap_room"),
                    "{door} → {api} (stream {stream}): x-ringmaster-dropped {dropped:?}"
                );
                sent += 1;
            }
        }
        let received = upstream.received();
        assert_eq!(received.len(), sent, "{api}: one request per call");
        for got in &received {
            assert_eq!(
                received_leaks(got),
                Vec::<String>::new(),
                "{api} server got on {}: {}",
                got.path,
                String::from_utf8_lossy(&got.body)
            );
        }
        let metrics = gw.metrics().await;
        for field in [
            "kv_transfer_params",
            "bootstrap_room",
            "ringmaster_priority",
        ] {
            assert_eq!(
                metric_sum(
                    &metrics,
                    "ringmaster_dropped_fields_total",
                    &format!("field=\"{field}\"")
                ),
                sent as f64,
                "{api}: {field} counted once per request"
            );
        }
    }
}

/// `[api] unknown_fields = "refuse"`: a body carrying a field only the gateway sets is
/// refused, naming it, and no server is asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refuse_refuses_the_gateways_own_fields_naming_them() {
    let upstream = FakeUpstream::start(Behavior::OpenAi, 3).await;
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[api]\nunknown_fields = \"refuse\"\n[[servers]]\naddress = \"{}\"\n",
        upstream.url()
    ))
    .await;
    for door in ["messages", "chat", "completions", "responses"] {
        let (path, mut body) = request(door, false, "Say hi.");
        let object = body.as_object_mut().unwrap();
        object.retain(|key, _| key != "ringmaster_priority" && !key.starts_with("bootstrap"));
        object.remove("routed_dp_rank");
        object.remove("disagg_prefill_dp_rank");
        let response = send(&gw, path, &body).await;
        assert_eq!(response.status(), 400, "{door}");
        let error: Value = response.json().await.unwrap();
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("kv_transfer_params: a field only the gateway sets"),
            "{door}: {error}"
        );
    }
    // A worker's own field, on its own, is refused too.
    let (path, mut body) = request("chat", false, "Say hi.");
    body.as_object_mut()
        .unwrap()
        .retain(|key, _| !RESERVED_FIELDS.contains(&key.as_str()));
    let error: Value = send(&gw, path, &body).await.json().await.unwrap();
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("ringmaster_priority: a field only the gateway sets"),
        "{error}"
    );
    assert!(upstream.received().is_empty(), "no server was asked");
}

fn read(log: &SharedLog) -> std::sync::MutexGuard<'_, PdLog> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Split requests: vLLM NIXL's legs carry the gateway's `kv_transfer_params` (the prefill
/// asked for a remote decode, the decode the prefill's answer) and the gateway's id, SGLang's
/// the gateway's bootstrap room; none of the client's, plain or streamed, by every door.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_legs_carry_the_gateways_orchestration_never_the_clients() {
    for engine in ["vllm-nixl", "sglang"] {
        let log = SharedLog::default();
        let (pd_engine, prefill_role, decode_role) = match engine {
            "vllm-nixl" => (
                PdEngine::VllmNixl,
                "role = \"prefill\"\ndisaggregation = \"vllm-nixl\"",
                "role = \"decode\"\ndisaggregation = \"vllm-nixl\"",
            ),
            _ => (
                PdEngine::Sglang {
                    bootstrap_port: 9123,
                },
                "role = \"prefill\"\ndisaggregation = \"sglang\"\nbootstrap_port = 9123",
                "role = \"decode\"\ndisaggregation = \"sglang\"",
            ),
        };
        let prefill = PdServer::start(pd_engine, PdRole::Prefill, PdFault::None, &log).await;
        let decode = PdServer::start(pd_engine, PdRole::Decode, PdFault::None, &log).await;
        let gw = TestGateway::start(&format!(
            // `wait`: a prefill leg still draining must not send the next request whole (an
            // SGLang decode server takes no whole request).
            "models = [\"fake\"]\n[disaggregation]\nmin_uncached_tokens = 16\nwhen_prefill_busy = \"wait\"\n\
             [[servers]]\nid = \"p0\"\naddress = \"{}\"\n{prefill_role}\n\
             [[servers]]\nid = \"d0\"\naddress = \"{}\"\n{decode_role}\n",
            prefill.url(),
            decode.url()
        ))
        .await;
        let mut pairs = 0;
        for door in ["chat", "messages", "responses"] {
            for stream in [false, true] {
                // A prompt of its own each, so that no server holds it yet: every one split.
                let long = format!("{door} {stream}: {}", "lorem ipsum dolor ".repeat(120));
                let (path, body) = request(door, stream, &long);
                let response = send(&gw, path, &body).await;
                let status = response.status();
                let text = response.text().await.unwrap();
                assert_eq!(
                    status,
                    200,
                    "{engine}, {door} (stream {stream}): {text}; {:?}",
                    read(&log).violations
                );
                pairs += 1;
            }
        }
        let log = read(&log);
        assert!(log.violations.is_empty(), "{engine}: {:?}", log.violations);
        assert_eq!(log.legs.len(), 2 * pairs, "{engine}: every request split");
        for (server, role, body, request_id) in &log.legs {
            let what = format!("{engine} {server} {role:?}");
            assert_ne!(request_id.as_deref(), Some("client-chosen-id"), "{what}");
            let object = body.as_object().unwrap();
            // A server the gateway takes for a `ringmaster worker` gets the gateway's own
            // priority, never the client's.
            assert_ne!(body["ringmaster_priority"], 9, "{what}");
            assert_ne!(body["routed_dp_rank"], 3, "{what}");
            assert_ne!(body["disagg_prefill_dp_rank"], 2, "{what}");
            match engine {
                "vllm-nixl" => {
                    let params = &body["kv_transfer_params"];
                    assert_ne!(params["remote_host"], "169.254.169.254", "{what}: {params}");
                    assert_ne!(params["remote_request_id"], "planted", "{what}: {params}");
                    for key in ["bootstrap_host", "bootstrap_port", "bootstrap_room"] {
                        assert!(!object.contains_key(key), "{what}: {key}");
                    }
                }
                _ => {
                    assert!(!object.contains_key("kv_transfer_params"), "{what}");
                    assert_ne!(body["bootstrap_room"], 42, "{what}");
                    assert_ne!(body["bootstrap_host"], "169.254.169.254", "{what}");
                    assert_eq!(body["bootstrap_port"], 9123, "{what}");
                }
            }
        }
    }
}
