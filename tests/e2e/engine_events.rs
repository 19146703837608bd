//! vLLM's and SGLang's KV event streams (a test publisher sending their wire) followed by the
//! gateway: decisions checked through `POST /admin/route/explain`; gaps repaired from the
//! replay socket, gaps older than the buffer and publisher restarts resetting the view,
//! garbage and oversized batches refused without stopping the follower.

use std::time::Duration;

use reqwest::Method;
use ringmaster_gpu_runtime::{ChatMessage, Role, SimTokenizer, Tokenizer};
use ringmaster_kv_events::{Batch, BlockRemoved, BlockStored, Encoding, EngineHash, Event};
use ringmaster_tests::fake_upstream::{Behavior, FakeUpstream};
use ringmaster_tests::kv_publisher::{KvPublisher, ReplayShape};
use serde_json::{Value, json};

use crate::support::{TestGateway, eventually, metric_sum};

fn system() -> String {
    "You are a careful assistant for a fleet of GPU servers. ".repeat(12)
}

fn body_for(model: &str) -> Value {
    json!({
        "model": model, "max_tokens": 4,
        "system": system(),
        "messages": [{"role": "user", "content": "What is a ring?"}],
    })
}

/// The prompt's tokens as the engine (the simulated tokenizer here) renders them.
fn prompt_tokens() -> Vec<u32> {
    SimTokenizer::new().encode_chat(
        Some(&system()),
        &[ChatMessage {
            role: Role::User,
            text: "What is a ring?".into(),
            ..Default::default()
        }],
    )
}

fn batch(events: Vec<Event>) -> Batch {
    Batch {
        ts: 1.0,
        events,
        data_parallel_rank: Some(0),
    }
}

/// The prompt's full 16-token blocks as engine blocks of `size`, hashed `first..` (the
/// engine's own numbering, unrelated to the gateway's).
fn stored(size: usize, first: i128) -> (Event, Vec<EngineHash>) {
    let tokens = prompt_tokens();
    let full = tokens.len() / 16 * 16;
    let n = full / size;
    let hashes: Vec<EngineHash> = (first..first + n as i128).map(EngineHash::Int).collect();
    (
        Event::Stored(BlockStored {
            block_hashes: hashes.clone(),
            token_ids: tokens[..n * size].to_vec(),
            block_size: size as u32,
            medium: Some("GPU".into()),
            ..BlockStored::default()
        }),
        hashes,
    )
}

fn removed(hashes: Vec<EngineHash>) -> Event {
    Event::Removed(BlockRemoved {
        block_hashes: hashes,
        medium: Some("GPU".into()),
        group_idx: None,
    })
}

async fn explain(gw: &TestGateway) -> Value {
    explain_for(gw, "fake").await
}

async fn explain_for(gw: &TestGateway, model: &str) -> Value {
    gw.admin(Method::POST, "/admin/route/explain")
        .await
        .json(&body_for(model))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// Leading prompt tokens each server holds, by id.
async fn held(gw: &TestGateway) -> Vec<(String, u64)> {
    explain(gw).await["prefix_matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["source"], "reported", "{m}");
            (
                m["server"].as_str().unwrap().to_owned(),
                m["tokens"].as_u64().unwrap(),
            )
        })
        .collect()
}

async fn held_by(gw: &TestGateway, id: &str) -> u64 {
    held(gw)
        .await
        .into_iter()
        .find(|(s, _)| s == id)
        .map_or(0, |(_, t)| t)
}

async fn feed(gw: &TestGateway, id: &str) -> Value {
    let servers = gw.servers().await;
    servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == id)
        .unwrap()["kv_events"]
        .clone()
}

async fn gateway(servers: &[(&str, &FakeUpstream, &KvPublisher, &str)]) -> TestGateway {
    let mut toml = String::from("models = [\"fake\"]\n");
    for (id, upstream, publisher, format) in servers {
        toml.push_str(&format!(
            "[[servers]]\nid = \"{id}\"\naddress = \"{}\"\nkv_events = \"{}\"\n\
             kv_events_replay = \"{}\"\nkv_events_format = \"{format}\"\ntokenizer = \"sim\"\n",
            upstream.url(),
            publisher.endpoint,
            publisher.replay_endpoint,
        ));
    }
    let gw = TestGateway::start(&toml).await;
    for (id, ..) in servers {
        assert!(
            eventually(Duration::from_secs(20), async || {
                let feed = feed(&gw, id).await;
                feed["live"] == true && feed["feed"]["connected"] == true
            })
            .await,
            "{id}'s feed connects: {}",
            feed(&gw, id).await
        );
    }
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_goes_where_the_engine_reports_its_blocks_and_not_after_they_are_removed() {
    let (a_up, b_up) = (
        FakeUpstream::start(Behavior::Vllm, 3).await,
        FakeUpstream::start(Behavior::Vllm, 3).await,
    );
    // vLLM: positional msgspec structs, 16-token blocks. SGLang: maps, 1-token pages.
    let mut vllm = KvPublisher::start(Encoding::Positional, ReplayShape::VllmWithTopic, 64).await;
    let mut sglang =
        KvPublisher::start(Encoding::Tagged, ReplayShape::SglangWithoutTopic, 64).await;
    let gw = gateway(&[("a", &a_up, &vllm, "vllm"), ("b", &b_up, &sglang, "sglang")]).await;
    let servers = gw.servers().await;
    for s in servers["servers"].as_array().unwrap() {
        assert_eq!(s["cache_view"], "engine_events", "{s}");
        assert_eq!(s["kv_events"]["tokenizer"], "sim");
    }
    assert_eq!(held(&gw).await, vec![("a".into(), 0), ("b".into(), 0)]);
    let full = (prompt_tokens().len() / 16 * 16) as u64;

    // SGLang's pages: one token each, one event per page, each chained to the one before.
    let tokens = prompt_tokens();
    let pages: Vec<Event> = (0..full as usize)
        .map(|i| {
            Event::Stored(BlockStored {
                block_hashes: vec![EngineHash::Int(10_000 + i as i128)],
                parent_block_hash: i
                    .checked_sub(1)
                    .map(|p| EngineHash::Int(10_000 + p as i128)),
                token_ids: vec![tokens[i]],
                block_size: 1,
                ..BlockStored::default()
            })
        })
        .collect();
    sglang.publish(&batch(pages)).await;
    assert!(
        eventually(Duration::from_secs(10), async || held_by(&gw, "b").await
            == full)
        .await,
        "b holds the prompt: {:?}",
        held(&gw).await
    );
    let explained = explain(&gw).await;
    assert_eq!(explained["chosen"], "b", "{explained}");
    // Removed page by page from the end: b holds none of it past the first block's end.
    let gone: Vec<EngineHash> = (16..full as i128)
        .rev()
        .map(|i| EngineHash::Int(10_000 + i))
        .collect();
    sglang.publish(&batch(vec![removed(gone)])).await;
    assert!(
        eventually(Duration::from_secs(10), async || held_by(&gw, "b").await
            == 16)
        .await,
        "b keeps only the first block: {:?}",
        held(&gw).await
    );

    // vLLM's 16-token blocks with byte-string hashes on a.
    let (event, hashes) = stored(16, 0);
    let Event::Stored(mut as_bytes) = event else {
        unreachable!()
    };
    as_bytes.block_hashes = hashes
        .iter()
        .map(|h| match h {
            EngineHash::Int(n) => EngineHash::Bytes(n.to_be_bytes().to_vec()),
            other => other.clone(),
        })
        .collect();
    let bytes_hashes = as_bytes.block_hashes.clone();
    vllm.publish(&batch(vec![Event::Stored(as_bytes)])).await;
    assert!(
        eventually(Duration::from_secs(10), async || held_by(&gw, "a").await
            == full)
        .await,
        "a holds the prompt: {:?}",
        held(&gw).await
    );
    assert_eq!(explain(&gw).await["chosen"], "a");
    vllm.publish(&batch(vec![removed(bytes_hashes)])).await;
    assert!(
        eventually(Duration::from_secs(10), async || held_by(&gw, "a").await
            == 0)
        .await,
        "a's removal applied: {:?}",
        held(&gw).await
    );
    // b's first block is all that is left anywhere: the prompt goes there.
    assert_eq!(explain(&gw).await["chosen"], "b");
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_engine_kv_event_batches_total", ""),
        4.0
    );
    assert_eq!(
        metric_sum(&metrics, "ringmaster_engine_kv_event_connected", ""),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_restarts_and_garbage_are_handled_and_said() {
    let up = FakeUpstream::start(Behavior::Vllm, 3).await;
    // A replay buffer of 4 batches.
    let mut publisher =
        KvPublisher::start(Encoding::Positional, ReplayShape::VllmWithTopic, 4).await;
    // Published before the gateway starts: the join replays it.
    let (first, first_hashes) = stored(16, 0);
    publisher.publish(&batch(vec![first])).await;
    let gw = gateway(&[("a", &up, &publisher, "vllm")]).await;
    let full = (prompt_tokens().len() / 16 * 16) as u64;
    assert!(
        eventually(Duration::from_secs(10), async || held_by(&gw, "a").await
            == full)
        .await,
        "the join replayed the first batch: {}",
        feed(&gw, "a").await
    );
    let counter = async |name: &str| {
        metric_sum(
            &gw.metrics().await,
            &format!("ringmaster_engine_kv_event_{name}_total"),
            "",
        )
    };

    // A lost batch (the removal) is repaired from the replay before the next one applies.
    publisher.lose(&batch(vec![removed(first_hashes)]));
    publisher.publish(&batch(vec![Event::AllCleared])).await;
    let (again, again_hashes) = stored(16, 100);
    publisher.publish(&batch(vec![again])).await;
    assert!(
        eventually(Duration::from_secs(10), async || counter("gaps_repaired")
            .await
            == 1.0)
        .await,
        "{}",
        feed(&gw, "a").await
    );
    assert!(
        eventually(Duration::from_secs(10), async || held_by(&gw, "a").await
            == full)
        .await
    );
    assert_eq!(counter("resets").await, 0.0);

    // Six batches lost with a buffer of four: older than the buffer, so the view resets.
    for _ in 0..6 {
        publisher.lose(&batch(vec![removed(vec![EngineHash::Int(7)])]));
    }
    let (_, last) = stored(16, 200);
    let sequence = publisher
        .publish(&batch(vec![Event::Unknown("Heartbeat".into())]))
        .await;
    assert!(
        eventually(Duration::from_secs(10), async || counter("resets").await
            == 1.0)
        .await,
        "{}",
        feed(&gw, "a").await
    );
    assert!(
        eventually(Duration::from_secs(10), async || held_by(&gw, "a").await
            == 0)
        .await
    );
    assert_eq!(
        feed(&gw, "a").await["feed"]["last_sequence"],
        json!(sequence)
    );
    drop((again_hashes, last));

    // Garbage, a batch that is not msgpack, and an oversized batch: refused, counted.
    publisher.send(vec![b"only one part".to_vec()]).await;
    publisher
        .send(vec![
            b"kv".to_vec(),
            1u64.to_be_bytes().to_vec(),
            b"\xc1\xc1".to_vec(),
        ])
        .await;
    let huge = batch(vec![Event::AllCleared; 70_000]);
    publisher
        .send(vec![
            b"kv".to_vec(),
            99u64.to_be_bytes().to_vec(),
            ringmaster_kv_events::encode_batch(&huge, Encoding::Positional),
        ])
        .await;
    assert!(
        eventually(Duration::from_secs(10), async || counter("refused_frames")
            .await
            == 3.0)
        .await,
        "{}",
        feed(&gw, "a").await
    );

    // The engine restarts: its sequence starts over and its cache is empty.
    publisher.restart();
    let (fresh, _) = stored(16, 300);
    publisher.publish(&batch(vec![fresh])).await;
    assert!(
        eventually(Duration::from_secs(10), async || counter(
            "publisher_restarts"
        )
        .await
            == 1.0)
        .await,
        "{}",
        feed(&gw, "a").await
    );
    assert!(
        eventually(Duration::from_secs(10), async || held_by(&gw, "a").await
            == full)
        .await
    );
    let feed = feed(&gw, "a").await;
    assert_eq!(feed["feed"]["last_sequence"], 0, "{feed}");
    assert_eq!(feed["live"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_s_own_metrics_are_its_load() {
    let vllm = FakeUpstream::start(Behavior::Vllm, 3).await;
    let plain = FakeUpstream::start(Behavior::Vllm, 3).await;
    vllm.set_metrics(Some(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{engine=\"0\",model_name=\"fake\"} 3.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{engine=\"0\",model_name=\"fake\"} 7.0\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"fake\"} 0.25\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"4000\"} 1.0\n",
    ));
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\nid = \"vllm\"\naddress = \"{}\"\n\
         [[servers]]\nid = \"plain\"\naddress = \"{}\"\n",
        vllm.url(),
        plain.url()
    ))
    .await;
    let server = async |id: &str| {
        gw.servers().await["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["id"] == id)
            .unwrap()
            .clone()
    };
    assert!(
        eventually(Duration::from_secs(10), async || {
            let s = server("vllm").await;
            s["load_source"] == json!({"metrics": "vllm"}) && s["engine"]["waiting"] == 7
        })
        .await,
        "{}",
        server("vllm").await
    );
    let s = server("vllm").await;
    assert_eq!(s["engine"]["running"], 3);
    assert_eq!(s["engine"]["kv_blocks_used"], 1000);
    assert_eq!(s["engine"]["kv_blocks_total"], 4000);
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_waiting", "server=\"vllm\""),
        7.0
    );
    // A server whose /metrics holds no engine's families keeps the gateway's own view.
    assert!(
        eventually(
            Duration::from_secs(10),
            async || server("plain").await["load_source"] == "in_flight_only"
        )
        .await,
        "{}",
        server("plain").await
    );
    assert_eq!(server("plain").await["engine"]["waiting"], 0);
    // The engine's queue drains: the gateway follows within a poll or two.
    vllm.set_metrics(Some(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 1\n\
         # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n",
    ));
    assert!(
        eventually(
            Duration::from_secs(10),
            async || server("vllm").await["engine"]["waiting"] == 0
        )
        .await
    );
}

/// Tokens of the prompt each server holds for a request of `model`.
async fn held_for(gw: &TestGateway, model: &str) -> Vec<(String, u64)> {
    let explained = explain_for(gw, model).await;
    explained["prefix_matches"]
        .as_array()
        .unwrap_or_else(|| panic!("{explained}"))
        .iter()
        .map(|m| {
            (
                m["server"].as_str().unwrap().to_owned(),
                m["tokens"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// vLLM lists each LoRA adapter it has loaded at `/v1/models` with its base model as
/// `parent`, and keys the adapter's blocks apart (their `lora_name`): a request for the
/// adapter goes only to servers that list it, matches only the adapter's blocks, and the
/// gateway's own `/v1/models` lists the adapter with its parent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adapter_goes_to_the_servers_that_hold_it_and_matches_its_own_blocks() {
    let (a_up, b_up, c_up) = (
        FakeUpstream::start(Behavior::Vllm, 3).await,
        FakeUpstream::start(Behavior::Vllm, 3).await,
        FakeUpstream::start(Behavior::Vllm, 3).await,
    );
    for up in [&a_up, &b_up] {
        up.set_models(&[("fake", None), ("sql-lora", Some("fake"))]);
    }
    let mut a = KvPublisher::start(Encoding::Positional, ReplayShape::VllmWithTopic, 64).await;
    let mut b = KvPublisher::start(Encoding::Positional, ReplayShape::VllmWithTopic, 64).await;
    let c = KvPublisher::start(Encoding::Positional, ReplayShape::VllmWithTopic, 64).await;
    let gw = gateway(&[
        ("a", &a_up, &a, "vllm"),
        ("b", &b_up, &b, "vllm"),
        ("c", &c_up, &c, "vllm"),
    ])
    .await;
    assert!(
        eventually(Duration::from_secs(20), async || {
            let models = gw.get_json("/v1/models").await;
            models["data"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["id"] == "sql-lora" && m["parent"] == "fake")
        })
        .await,
        "the gateway lists the adapter with its base model"
    );
    let servers = gw.servers().await;
    let adapters: Vec<(String, Value)> = servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_str().unwrap().to_owned(), s["adapters"].clone()))
        .collect();
    assert_eq!(
        adapters,
        [
            ("a".to_owned(), json!({"sql-lora": "fake"})),
            ("b".to_owned(), json!({"sql-lora": "fake"})),
            ("c".to_owned(), json!({})),
        ]
    );

    // a's engine stores the prompt's blocks under the adapter, b's under the base model.
    let (Event::Stored(base), _) = stored(16, 1) else {
        unreachable!()
    };
    let adapter = BlockStored {
        lora_name: Some("sql-lora".into()),
        ..base.clone()
    };
    a.publish(&batch(vec![Event::Stored(adapter)])).await;
    b.publish(&batch(vec![Event::Stored(base)])).await;
    let full = (prompt_tokens().len() / 16 * 16) as u64;
    assert!(
        eventually(Duration::from_secs(10), async || {
            held_for(&gw, "sql-lora").await == [("a".to_owned(), full), ("b".to_owned(), 0)]
        })
        .await,
        "only the adapter's blocks match the adapter's request, and c is not asked: {:?}",
        held_for(&gw, "sql-lora").await
    );
    assert_eq!(explain_for(&gw, "sql-lora").await["chosen"], "a");
    assert_eq!(
        held_for(&gw, "fake").await,
        [
            ("a".to_owned(), 0),
            ("b".to_owned(), full),
            ("c".to_owned(), 0)
        ],
        "the base model's request matches none of the adapter's blocks"
    );
    assert_eq!(explain_for(&gw, "fake").await["chosen"], "b");

    // Served: only a and b ever see the adapter's requests, under its own name.
    for _ in 0..6 {
        let response = gw.post_messages(&body_for("sql-lora")).await;
        assert_eq!(response.status(), 200);
    }
    assert_eq!(c_up.requests.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_eq!(a_up.last_request_json()["model"], "sql-lora");
}

fn fake_models(up: &FakeUpstream) -> Vec<String> {
    up.models
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _)| id.clone())
        .collect()
}

/// `[lora] load_on_demand`: a request for a configured adapter that no server holds loads it
/// on the server routed to (vLLM's `/v1/load_lora_adapter`) and is served there under the
/// adapter's name; past `max_per_server` the adapter asked for least recently is unloaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_are_loaded_on_demand_and_the_least_recently_used_unloaded() {
    let up = FakeUpstream::start(Behavior::Vllm, 3).await;
    let toml = format!(
        "models = [\"fake\"]\n[[servers]]\nid = \"a\"\naddress = \"{}\"\n\
         [lora]\nload_on_demand = true\nmax_per_server = 1\nbusy_ms = 0\n\
         [lora.adapters.sql]\npath = \"/adapters/sql\"\nbase = \"fake\"\n\
         [lora.adapters.chat]\npath = \"/adapters/chat\"\nbase = \"fake\"\n",
        up.url()
    );
    let gw = TestGateway::start(&toml).await;
    let ask = async |model: &str| {
        let response = gw.post_messages(&body_for(model)).await;
        assert_eq!(response.status(), 200, "{model}");
        assert_eq!(up.last_request_json()["model"], model);
    };
    ask("sql").await;
    assert_eq!(
        fake_models(&up),
        ["fake", "sql"],
        "loaded where it was routed"
    );
    ask("sql").await;
    ask("chat").await;
    assert_eq!(
        fake_models(&up),
        ["fake", "chat"],
        "sql, least recent, unloaded"
    );
    ask("sql").await;
    assert_eq!(fake_models(&up), ["fake", "sql"]);
    let servers = gw.servers().await;
    let a = &servers["servers"][0];
    assert_eq!(
        a["adapter_loads"],
        json!({"loaded": 3, "load_failures": 0, "unloaded": 2}),
        "{a}"
    );
    assert_eq!(a["adapters"], json!({"sql": "fake"}));
    // An adapter the config does not name is not a model here.
    let response = gw.post_messages(&body_for("unknown-lora")).await;
    assert_eq!(response.status(), 404);
}

/// Policies see which adapters each server holds (`cluster.adapters`): a router fixture that
/// sends everything to the first server holding an adapter gets base-model requests to the
/// one server that lists one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_sees_each_server_s_adapters() {
    let ups = [
        FakeUpstream::start(Behavior::Vllm, 3).await,
        FakeUpstream::start(Behavior::Vllm, 3).await,
        FakeUpstream::start(Behavior::Vllm, 3).await,
    ];
    ups[2].set_models(&[("fake", None), ("sql-lora", Some("fake"))]);
    let fixture = format!(
        "{}/../policies/dist/fixtures/adapter-holder.wasm",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut toml = format!(
        "models = [\"fake\"]\n[[policies.router]]\nname = \"holder\"\nsource = {}\n",
        toml::Value::String(fixture)
    );
    for (id, up) in ["a", "b", "c"].iter().zip(&ups) {
        toml.push_str(&format!(
            "[[servers]]\nid = \"{id}\"\naddress = \"{}\"\n",
            up.url()
        ));
    }
    let gw = TestGateway::start(&toml).await;
    assert!(
        eventually(Duration::from_secs(20), async || {
            gw.servers().await["servers"][2]["adapters"] == json!({"sql-lora": "fake"})
        })
        .await,
        "c's adapter is discovered"
    );
    for _ in 0..4 {
        assert_eq!(gw.post_messages(&body_for("fake")).await.status(), 200);
    }
    let served: Vec<usize> = ups
        .iter()
        .map(|up| up.requests.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    assert_eq!(served, [0, 0, 4], "every request to the adapter's holder");
}
