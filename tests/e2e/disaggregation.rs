//! Split requests over real sockets: prefill and decode servers of vLLM with
//! `NixlConnector` and of SGLang (the fake servers of `ringmaster_tests::pd_upstream`, which
//! check every field and the legs' order as the engines' sources define them), and of this
//! process's simulated servers; what a failed leg does; what the client, the metrics and
//! explain see.

use std::time::Duration;

use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
use ringmaster_tests::pd_upstream::{
    PREFILL_CACHED, PdEngine, PdFault, PdLog, PdRole, PdServer, SharedLog,
};
use serde_json::{Value, json};

use crate::support::{TestGateway, eventually, metric_sum};

/// A `[[servers]]` entry: id, address and the role's keys.
fn server(id: &str, url: &str, role: &str) -> String {
    format!("[[servers]]\nid = \"{id}\"\naddress = \"{url}\"\n{role}\n")
}

const NIXL_PREFILL: &str = "role = \"prefill\"\ndisaggregation = \"vllm-nixl\"";
const NIXL_DECODE: &str = "role = \"decode\"\ndisaggregation = \"vllm-nixl\"";

fn gateway_config(extra: &str, servers: &[String]) -> String {
    format!(
        "models = [\"fake\"]\n[disaggregation]\nmin_uncached_tokens = 16\n{extra}\n{}",
        servers.concat()
    )
}

/// A chat request with a prompt long enough to split (some 500 tokens), its own token limits
/// and stream options.
fn long_chat(topic: &str) -> Value {
    json!({
        "model": "fake",
        "max_tokens": 40,
        "min_tokens": 3,
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": format!("{topic}: {}", "lorem ipsum dolor ".repeat(120))}],
    })
}

fn log() -> SharedLog {
    SharedLog::default()
}

fn read(log: &SharedLog) -> std::sync::MutexGuard<'_, PdLog> {
    log.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The usage a chat stream's last usage chunk reports.
fn streamed_usage(body: &str) -> Value {
    body.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| chunk.get("usage").filter(|u| !u.is_null()).cloned())
        .next_back()
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nixl_pair_prefills_then_decodes_with_the_params_verbatim() {
    let log = log();
    let prefill = PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::None, &log).await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log).await;
    let gw = TestGateway::start(&gateway_config(
        "",
        &[
            server("p0", &prefill.url(), NIXL_PREFILL),
            server("d0", &decode.url(), NIXL_DECODE),
        ],
    ))
    .await;
    let response = gw.post_chat(&long_chat("chat")).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ringmaster-server"], "d0");
    let body = response.text().await.unwrap();
    assert!(body.contains("one ") && body.contains("three"), "{body}");
    // The client's usage counts the prefill's cached tokens, not the transferred prompt.
    let usage = streamed_usage(&body);
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], PREFILL_CACHED,
        "{usage}"
    );
    {
        let log = read(&log);
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        let roles: Vec<PdRole> = log.legs.iter().map(|leg| leg.1).collect();
        assert_eq!(roles, [PdRole::Prefill, PdRole::Decode]);
        let decode_body = &log.legs[1].2;
        assert!(decode_body.get("kv_transfer_params").is_some());
        // The decode leg is the request as it was.
        assert_eq!(decode_body["max_tokens"], 40);
        assert_eq!(decode_body["min_tokens"], 3);
        assert_eq!(decode_body["stream"], true);
        assert_eq!(
            log.legs[0].3, log.legs[1].3,
            "one X-Request-Id for both legs"
        );
    }
    // The other doors map their own token limits onto the legs.
    let messages = json!({"model": "fake", "max_tokens": 30, "stream": false,
        "messages": [{"role": "user", "content": format!("messages: {}", "lorem ipsum dolor ".repeat(120))}]});
    assert_eq!(gw.post_messages(&messages).await.status(), 200);
    let responses = gw
        .client
        .post(gw.url("/v1/responses"))
        .json(&json!({"model": "fake", "max_output_tokens": 25,
                      "input": format!("responses: {}", "lorem ipsum dolor ".repeat(120))}))
        .send()
        .await
        .unwrap();
    assert_eq!(responses.status(), 200);
    {
        let log = read(&log);
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        assert_eq!(log.legs.len(), 6, "three pairs");
        assert_eq!(log.legs[3].2["max_tokens"], 30);
        assert_eq!(log.legs[5].2["max_tokens"], 25);
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_pair_decisions_total",
            "outcome=\"split\""
        ),
        3.0
    );
    assert_eq!(
        metric_sum(&metrics, "ringmaster_prefill_legs_total", "outcome=\"ok\""),
        3.0
    );
    let servers = gw.servers().await;
    let roles: Vec<(&str, &str)> = servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["role"].as_str().unwrap(),
                s["disaggregation"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(roles, [("prefill", "vllm-nixl"), ("decode", "vllm-nixl")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_that_returns_no_params_leaves_the_prompt_to_the_decode_server() {
    let log = log();
    let prefill =
        PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::NoParams, &log).await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log).await;
    let gw = TestGateway::start(&gateway_config(
        "",
        &[
            server("p0", &prefill.url(), NIXL_PREFILL),
            server("d0", &decode.url(), NIXL_DECODE),
        ],
    ))
    .await;
    assert_eq!(gw.post_chat(&long_chat("no params")).await.status(), 200);
    {
        let log = read(&log);
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        assert_eq!(log.legs.len(), 2);
        assert!(log.legs[1].2.get("kv_transfer_params").is_none());
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_prefill_legs_total",
            "outcome=\"no_params\""
        ),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prefill_goes_to_the_next_prefill_server_then_whole_to_the_decode_server() {
    let log = log();
    let broken = PdServer::start(
        PdEngine::VllmNixl,
        PdRole::Prefill,
        PdFault::Unavailable,
        &log,
    )
    .await;
    let working = PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::None, &log).await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log).await;
    let gw = TestGateway::start(&gateway_config(
        "",
        &[
            server("p-broken", &broken.url(), NIXL_PREFILL),
            server("p-working", &working.url(), NIXL_PREFILL),
            server("d0", &decode.url(), NIXL_DECODE),
        ],
    ))
    .await;
    // Until the broken one has been tried once, some request goes to it first.
    let mut tried_broken_first = false;
    for i in 0..12 {
        let before = read(&log).legs.len();
        let response = gw.post_chat(&long_chat(&format!("topic {i}"))).await;
        assert_eq!(response.status(), 200);
        let log = read(&log);
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        let legs: Vec<&str> = log.legs[before..]
            .iter()
            .map(|leg| leg.0.split(':').next().unwrap())
            .collect();
        let last = log.legs.last().unwrap();
        assert_eq!(last.1, PdRole::Decode);
        assert!(
            last.2.get("kv_transfer_params").is_some(),
            "the decode leg got the working prefill's params: {legs:?}"
        );
        if legs == ["prefill", "prefill", "decode"] {
            tried_broken_first = true;
            break;
        }
    }
    assert!(
        tried_broken_first,
        "no request was tried on the broken prefill server"
    );
    let metrics = gw.metrics().await;
    assert!(
        metric_sum(
            &metrics,
            "ringmaster_prefill_legs_total",
            "outcome=\"failed\""
        ) >= 1.0
    );

    // With no working prefill server left, the decode server serves the request whole.
    let log2 = self::log();
    let broken = PdServer::start(
        PdEngine::VllmNixl,
        PdRole::Prefill,
        PdFault::Unavailable,
        &log2,
    )
    .await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log2).await;
    let gw = TestGateway::start(&gateway_config(
        "",
        &[
            server("p-broken", &broken.url(), NIXL_PREFILL),
            server("d0", &decode.url(), NIXL_DECODE),
        ],
    ))
    .await;
    let response = gw.post_chat(&long_chat("alone")).await;
    assert_eq!(response.status(), 200);
    let log2 = read(&log2);
    assert_eq!(log2.legs.len(), 2);
    assert!(log2.legs[1].2.get("kv_transfer_params").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_prefill_failure_decode_serves_the_request_whole_at_once() {
    let log = log();
    let broken = PdServer::start(
        PdEngine::VllmNixl,
        PdRole::Prefill,
        PdFault::Unavailable,
        &log,
    )
    .await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log).await;
    let working = PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::None, &log).await;
    let gw = TestGateway::start(&gateway_config(
        "on_prefill_failure = \"decode\"",
        &[
            server("p-broken", &broken.url(), NIXL_PREFILL),
            server("p-working", &working.url(), NIXL_PREFILL),
            server("d0", &decode.url(), NIXL_DECODE),
        ],
    ))
    .await;
    for i in 0..8 {
        assert_eq!(
            gw.post_chat(&long_chat(&format!("t{i}"))).await.status(),
            200
        );
    }
    let log = read(&log);
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    // Every failed prefill is followed by the decode leg straight away, whole.
    for pair in log.legs.windows(2) {
        if pair[0].0.starts_with("prefill") && pair[0].0.ends_with(&broken.addr.port().to_string())
        {
            assert_eq!(pair[1].1, PdRole::Decode);
            assert!(pair[1].2.get("kv_transfer_params").is_none());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_decode_is_served_whole_by_the_next_server() {
    let log = log();
    let prefill = PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::None, &log).await;
    let decode = PdServer::start(
        PdEngine::VllmNixl,
        PdRole::Decode,
        PdFault::Unavailable,
        &log,
    )
    .await;
    let whole = FakeUpstream::start(Behavior::Vllm, 3).await;
    let gw = TestGateway::start(&gateway_config(
        "",
        &[
            server("p0", &prefill.url(), NIXL_PREFILL),
            server("d-broken", &decode.url(), NIXL_DECODE),
            server("whole", &whole.url(), ""),
        ],
    ))
    .await;
    let mut split_then_retried = false;
    for i in 0..12 {
        let response = gw.post_chat(&long_chat(&format!("d{i}"))).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-ringmaster-server"], "whole");
        if response.headers()["x-ringmaster-attempts"] == "2" {
            split_then_retried = true;
        }
    }
    assert!(
        split_then_retried,
        "no request went to the broken decode server first"
    );
    let log = read(&log);
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    assert!(log.legs.iter().any(|leg| leg.1 == PdRole::Prefill));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglang_legs_go_at_once_with_one_bootstrap_room_and_their_ranks() {
    let log = log();
    let prefill = PdServer::start(
        PdEngine::Sglang {
            bootstrap_port: 9123,
        },
        PdRole::Prefill,
        PdFault::None,
        &log,
    )
    .await;
    let decode = PdServer::start(
        PdEngine::Sglang {
            bootstrap_port: 9123,
        },
        PdRole::Decode,
        PdFault::None,
        &log,
    )
    .await;
    let gw = TestGateway::start(&gateway_config(
        "",
        &[
            server(
                "p0",
                &prefill.url(),
                "role = \"prefill\"\ndisaggregation = \"sglang\"\nbootstrap_port = 9123\ndp_rank = 1",
            ),
            server(
                "d0",
                &decode.url(),
                "role = \"decode\"\ndisaggregation = \"sglang\"\ndp_rank = 0",
            ),
        ],
    ))
    .await;
    let response = gw.post_chat(&long_chat("sglang")).await;
    assert_eq!(response.status(), 200);
    let body = response.text().await.unwrap();
    assert!(body.contains("three"), "{body}");
    let log = read(&log);
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    assert_eq!(log.legs.len(), 2);
    let mut bodies: Vec<Value> = log.legs.iter().map(|leg| leg.2.clone()).collect();
    bodies.sort_by_key(|b| b.get("disagg_prefill_dp_rank").is_some());
    let (prefill_body, decode_body) = (&bodies[0], &bodies[1]);
    assert_eq!(prefill_body["routed_dp_rank"], 1);
    assert_eq!(decode_body["routed_dp_rank"], 0);
    assert_eq!(decode_body["disagg_prefill_dp_rank"], 1);
    // Apart from the ranks, one body for both legs.
    let strip = |body: &Value| {
        let mut body = body.clone();
        for key in ["routed_dp_rank", "disagg_prefill_dp_rank"] {
            body.as_object_mut().unwrap().remove(key);
        }
        body
    };
    assert_eq!(strip(prefill_body), strip(decode_body));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_ends_both_sglang_legs() {
    let log = log();
    let engine = PdEngine::Sglang {
        bootstrap_port: 8998,
    };
    let prefill = PdServer::start(engine, PdRole::Prefill, PdFault::Hold, &log).await;
    let decode = PdServer::start(engine, PdRole::Decode, PdFault::HoldStream, &log).await;
    let gw = TestGateway::start(&gateway_config(
        "",
        &[
            server(
                "p0",
                &prefill.url(),
                "role = \"prefill\"\ndisaggregation = \"sglang\"",
            ),
            server(
                "d0",
                &decode.url(),
                "role = \"decode\"\ndisaggregation = \"sglang\"",
            ),
        ],
    ))
    .await;
    let mut response = gw.post_chat(&long_chat("leave")).await;
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("one"));
    drop(response);
    assert!(
        eventually(Duration::from_secs(10), async || read(&log).cancelled.len()
            == 2)
        .await,
        "both legs end: {:?}",
        read(&log).cancelled
    );
    assert!(read(&log).violations.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_decode_server_would_mostly_find_cached_is_not_split() {
    let log = log();
    let prefill = PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::None, &log).await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log).await;
    let servers = [
        server("p0", &prefill.url(), NIXL_PREFILL),
        server("d0", &decode.url(), NIXL_DECODE),
    ];
    let toml = gateway_config("", &servers)
        .replace("min_uncached_tokens = 16", "min_uncached_tokens = 1000000");
    let gw = TestGateway::start(&toml).await;
    let explained = gw
        .admin(reqwest::Method::POST, "/admin/route/explain")
        .await
        .json(&long_chat("explain"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(explained["pair"]["outcome"], "bypass", "{explained}");
    assert!(
        explained["pair"]["why"]
            .as_str()
            .unwrap()
            .contains("min_uncached_tokens"),
        "{explained}"
    );
    assert_eq!(gw.post_chat(&long_chat("bypass")).await.status(), 200);
    {
        let log = read(&log);
        assert_eq!(log.legs.len(), 1);
        assert_eq!(log.legs[0].1, PdRole::Decode);
        assert!(log.legs[0].2.get("kv_transfer_params").is_none());
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_pair_decisions_total",
            "outcome=\"bypass\""
        ),
        1.0
    );

    // And explain names the prefill server when it would split.
    let gw = TestGateway::start(&gateway_config("", &servers)).await;
    let explained = gw
        .admin(reqwest::Method::POST, "/admin/route/explain")
        .await
        .json(&long_chat("explain"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(explained["pair"]["outcome"], "split", "{explained}");
    assert_eq!(explained["pair"]["prefill"], "p0", "{explained}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulated_servers_hand_the_prompt_over_and_the_decode_server_keeps_it() {
    // The gateway estimates what a server holds in 256-byte chunks of the prompt: a
    // threshold of 100 tokens tells a cached prompt (its last chunk to compute) from a new one.
    let gw = TestGateway::start(
        "[simulator]\ntime_scale = 0.01\n[disaggregation]\nmin_uncached_tokens = 100\n\
         [[servers]]\naddress = \"sim://p0\"\nrole = \"prefill\"\n\
         [[servers]]\naddress = \"sim://d0\"\nrole = \"decode\"\n",
    )
    .await;
    let prompt = "lorem ipsum dolor ".repeat(100);
    let ask = |max_tokens: u32| {
        json!({"model": "sim-llama-3-8b", "max_tokens": max_tokens,
               "messages": [{"role": "user", "content": prompt}]})
    };
    let response = gw.post_messages(&ask(20)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ringmaster-server"], "d0");
    let reply: Value = response.json().await.unwrap();
    assert_eq!(reply["usage"]["output_tokens"], 20, "{reply}");
    let servers = gw.servers().await;
    let engine = |id: &str| {
        servers["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .unwrap()["engine"]
            .clone()
    };
    // The prefill server computed the prompt and one token; the decode server found all
    // but its last tokens in its cache.
    let (p, d) = (engine("p0"), engine("d0"));
    assert_eq!(p["generated_tokens_total"], 1, "{p}");
    let prompt_tokens = d["prompt_tokens_total"].as_u64().unwrap();
    let handed = d["cached_prompt_tokens_total"].as_u64().unwrap();
    assert!(prompt_tokens > 100 && handed >= prompt_tokens - 16, "{d}");
    assert_eq!(d["generated_tokens_total"], 20, "{d}");
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_prefill_legs_total", "outcome=\"ok\""),
        1.0
    );
    // The next turn finds the prompt on the decode server: not worth splitting.
    let response = gw.post_messages(&ask(5)).await;
    assert_eq!(response.status(), 200);
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_pair_decisions_total",
            "outcome=\"bypass\""
        ),
        1.0
    );
}

/// Pair routers (`ringmaster:policy@0.3.0`) decide the split themselves, and are A/B tested
/// and shadowed like any router: two built-in pair routers share the traffic, each request
/// split as its variant says, a third decides on copies (its agreement read on the decode
/// server) and never serves, and explain shows the router's own reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pair_routers_decide_the_split_and_are_ab_tested_like_any_router() {
    let log = log();
    let prefill = PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::None, &log).await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log).await;
    let toml = gateway_config(
        "[[policies.router]]\nname = \"prefix\"\nsource = \"builtin:pair-prefix\"\nweight = 50\n\
         config = { min_uncached_tokens = \"0\" }\n\
         [[policies.router]]\nname = \"split\"\nsource = \"builtin:pair-split\"\nweight = 50\n\
         [[policies.router]]\nname = \"llm-d-shadow\"\nsource = \"builtin:pair-llm-d\"\nshadow = true\n",
        &[
            server("p0", &prefill.url(), NIXL_PREFILL),
            server("d0", &decode.url(), NIXL_DECODE),
        ],
    );
    let gw = TestGateway::start(&toml).await;
    let mut variants = std::collections::BTreeSet::new();
    for i in 0..16 {
        let response = gw.post_chat(&long_chat(&format!("ab {i}"))).await;
        assert_eq!(response.status(), 200);
        variants.insert(
            response.headers()["x-ringmaster-variant"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(
        variants.into_iter().collect::<Vec<_>>(),
        ["prefix", "split"],
        "both variants served, the shadow none"
    );
    let experiments: Value = gw
        .admin(reqwest::Method::GET, "/admin/experiments")
        .await
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let shadow = &experiments["shadow"];
    assert_eq!(shadow["name"], "llm-d-shadow", "{experiments}");
    // A shadow call past its deadline on a loaded machine is a fault, not a decision.
    let decisions = shadow["decisions"].as_u64().unwrap();
    assert!(
        (14..=16).contains(&decisions),
        "{decisions} shadow decisions"
    );
    // One decode server: the shadow's pair names the same one as the live router's.
    assert_eq!(
        shadow["agreement_rate"].as_f64().unwrap(),
        1.0,
        "{experiments}"
    );
    {
        let log = read(&log);
        assert!(log.violations.is_empty(), "{:?}", log.violations);
        let prefills = log
            .legs
            .iter()
            .filter(|leg| leg.1 == PdRole::Prefill)
            .count();
        assert_eq!(prefills, 16, "every request split by both routers");
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_pair_decisions_total",
            "outcome=\"split\""
        ),
        16.0
    );
    assert_eq!(
        metric_sum(&metrics, "ringmaster_policy_faults_total", ""),
        0.0
    );
    let explained = gw
        .admin(reqwest::Method::POST, "/admin/route/explain")
        .await
        .json(&long_chat("explain the pair"))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(explained["pair"]["outcome"], "split", "{explained}");
    assert_eq!(explained["pair"]["prefill"], "p0", "{explained}");
    let why = explained["pair"]["why"].as_str().unwrap();
    assert!(
        why.contains("prefill and decode chosen apart") || why.contains("would compute"),
        "the router's own reason: {why}"
    );
}

/// A prefill server added while the gateway runs (`POST /admin/servers` with its role, as
/// discovery adds servers) takes prefill legs from the next request on, and the pool's
/// listing shows its part.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_server_added_at_run_time_takes_prefill_legs() {
    let log = log();
    let prefill = PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::None, &log).await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log).await;
    let gw = TestGateway::start(&gateway_config(
        "",
        &[server("d0", &decode.url(), NIXL_DECODE)],
    ))
    .await;
    let alone = gw.post_chat(&long_chat("before")).await;
    assert_eq!(alone.status(), 200);
    let _ = alone.text().await;
    assert!(read(&log).legs.iter().all(|leg| leg.1 != PdRole::Prefill));

    let added = gw
        .admin(reqwest::Method::POST, "/admin/servers?wait=true")
        .await
        .json(
            &json!({"id": "p0", "address": prefill.url(), "role": "prefill",
                      "disaggregation": "vllm-nixl"}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let added: Value = added.json().await.unwrap();
    assert_eq!(added["role"], "prefill", "{added}");
    assert_eq!(added["disaggregation"], "vllm-nixl", "{added}");

    let split = eventually(Duration::from_secs(10), async || {
        let response = gw.post_chat(&long_chat("after")).await;
        assert_eq!(response.status(), 200);
        let _ = response.text().await;
        read(&log).legs.iter().any(|leg| leg.1 == PdRole::Prefill)
    })
    .await;
    assert!(split, "no prefill leg after the prefill server was added");
    {
        let log = read(&log);
        assert!(log.violations.is_empty(), "{:?}", log.violations);
    }
    let listed: Value = gw
        .admin(reqwest::Method::GET, "/admin/servers")
        .await
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let roles: Vec<(String, String)> = listed["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap().to_owned(),
                s["role"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        roles.contains(&("p0".to_owned(), "prefill".to_owned())),
        "{listed}"
    );
    assert!(
        roles.contains(&("d0".to_owned(), "decode".to_owned())),
        "{listed}"
    );
}

/// A pair router rolled out progressively (declared with a rollout in the config) ramps in
/// and is promoted like any router, its requests split as it says throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pair_router_is_rolled_out_step_by_step() {
    let log = log();
    let prefill = PdServer::start(PdEngine::VllmNixl, PdRole::Prefill, PdFault::None, &log).await;
    let decode = PdServer::start(PdEngine::VllmNixl, PdRole::Decode, PdFault::None, &log).await;
    let gw = TestGateway::start(&gateway_config(
        "[[policies.router]]\nname = \"default\"\nsource = \"builtin:prefix-affinity\"\n\
         [[policies.router]]\nname = \"pair\"\nsource = \"builtin:pair-llm-d\"\n\
         rollout = [50, 100]\nrollout_step = \"1s\"\nrollout_min_samples = 5\n",
        &[
            server("p0", &prefill.url(), NIXL_PREFILL),
            server("d0", &decode.url(), NIXL_DECODE),
        ],
    ))
    .await;
    let mut sent = 0;
    let promoted = eventually(Duration::from_secs(60), async || {
        for _ in 0..4 {
            let response = gw.post_chat(&long_chat(&format!("rollout {sent}"))).await;
            sent += 1;
            assert_eq!(response.status(), 200);
            let _ = response.text().await;
        }
        let experiments: Value = gw
            .admin(reqwest::Method::GET, "/admin/experiments")
            .await
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        experiments["rollout"]["phase"]["state"] == "promoted"
    })
    .await;
    assert!(
        promoted,
        "the pair router's rollout was not promoted after {sent} requests"
    );
    let response = gw.post_chat(&long_chat("after the rollout")).await;
    assert_eq!(response.headers()["x-ringmaster-variant"], "pair");
    let _ = response.text().await;
    let log = read(&log);
    assert!(log.violations.is_empty(), "{:?}", log.violations);
    let prefills = log
        .legs
        .iter()
        .filter(|leg| leg.1 == PdRole::Prefill)
        .count();
    assert_eq!(prefills, sent + 1, "every request split, by either router");
}
