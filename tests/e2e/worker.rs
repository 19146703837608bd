//! Worker mode over real sockets: the OpenAI endpoints (plain and streamed), health, models,
//! load and the KV event stream on a simulated engine, and SmolLM2 through a worker when the
//! model is in the cache (required when `RINGMASTER_REQUIRE_MODEL` is set, as in `tests/run`),
//! whole and split between a prefill and a decode worker.

use std::time::Duration;

use futures_util::StreamExt;
use ringmaster_gpu_runtime::{EngineConfig, EngineHandle};
use ringmaster_tls::credential::WorkerSecret;
use ringmaster_worker::Worker;
use ringmaster_worker::transfer::{Peer, Role, Trust};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The default model name clients ask for, as an alias of the name the test workers serve.
const SIM_ALIAS: &str = "[aliases]\n\"sim-llama-3-8b\" = \"sim\"\n";

struct TestWorker {
    base: String,
    client: reqwest::Client,
    _stop: oneshot::Sender<()>,
}

impl TestWorker {
    async fn start(engine: EngineHandle, model: &str) -> Self {
        Self::start_as(engine, model, Role::Both).await
    }

    async fn start_as(engine: EngineHandle, model: &str, role: Role) -> Self {
        Self::start_trusting(engine, model, role, Trust::default()).await
    }

    async fn start_trusting(engine: EngineHandle, model: &str, role: Role, trust: Trust) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, engine, model, role, trust)
    }

    fn serve(
        listener: TcpListener,
        engine: EngineHandle,
        model: &str,
        role: Role,
        trust: Trust,
    ) -> Self {
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(ringmaster_worker::serve(
            Worker::trusting(engine, model, role, trust),
            listener,
            async move {
                let _ = stopped.await;
            },
        ));
        Self {
            base,
            client: reqwest::Client::new(),
            _stop: stop,
        }
    }

    /// `HOST:PORT`, as a gateway reaches it.
    fn authority(&self) -> String {
        self.base.trim_start_matches("http://").to_owned()
    }

    async fn metrics(&self) -> String {
        crate::support::get_text(&self.client, &format!("{}/metrics", self.base)).await
    }

    async fn simulated() -> Self {
        let mut config = EngineConfig::simulated("worker-test");
        config.time_scale = 0.0;
        Self::start(EngineHandle::spawn(config).unwrap(), "sim").await
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let response = self
            .client
            .post(format!("{}{path}", self.base))
            .json(body)
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }

    async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        (status, response.json().await.unwrap())
    }
}

/// The secret the test fleets' workers share with their gateway.
const FLEET_SECRET: &str = "the test fleet's shared secret";

/// The environment a test gateway of such a fleet reads (`[workers] secret_env`'s default).
fn fleet_env(name: &str) -> Option<String> {
    (name == "RINGMASTER_WORKER_SECRET").then(|| FLEET_SECRET.to_owned())
}

fn fleet_secret() -> WorkerSecret {
    WorkerSecret::new("test", FLEET_SECRET.as_bytes()).unwrap()
}

/// A worker's trust in the test fleet: its secret, and `peers` to fetch blocks from.
fn trust(peers: &[String]) -> Trust {
    Trust {
        secret: Some(fleet_secret()),
        peers: peers.iter().map(|p| Peer::parse(p).unwrap()).collect(),
    }
}

/// A system prompt long enough to fill several 16-token blocks.
fn system() -> String {
    (0..60).map(|i| format!("rule{i} ")).collect()
}

fn chat(text: &str, max_tokens: u32) -> Value {
    json!({
        "model": "sim",
        "max_tokens": max_tokens,
        "messages": [
            {"role": "system", "content": system()},
            {"role": "user", "content": text},
        ],
    })
}

/// The `data:` payloads of an SSE body, in order.
fn sse_data(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|frame| frame.strip_prefix("data: "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_completions_answer_and_report_cached_prompt_tokens() {
    let w = TestWorker::simulated().await;
    let (status, first) = w.post("/v1/chat/completions", &chat("Hello", 8)).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["model"], "sim");
    assert!(first["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &first["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(!choice["message"]["content"].as_str().unwrap().is_empty());
    // The simulated model's replies are longer than 8 tokens.
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(first["usage"]["completion_tokens"], 8);
    let prompt = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["total_tokens"].as_u64().unwrap(), prompt + 8);
    // The same system prompt again: its full blocks come from the prefix cache.
    let (_, second) = w.post("/v1/chat/completions", &chat("Hi again", 8)).await;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= 48, "{cached} cached tokens");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_chat_sends_role_text_finish_usage_then_done() {
    let w = TestWorker::simulated().await;
    let mut body = chat("Stream please", 6);
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let response = w
        .client
        .post(format!("{}/v1/chat/completions", w.base))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let data = sse_data(&response.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert!(!text.is_empty());
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage = &chunks[chunks.len() - 1];
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_take_a_raw_prompt_plain_and_streamed() {
    let w = TestWorker::simulated().await;
    let (status, reply) = w
        .post(
            "/v1/completions",
            &json!({"prompt": "Once upon a time", "max_tokens": 5}),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(reply["object"], "text_completion");
    assert!(!reply["choices"][0]["text"].as_str().unwrap().is_empty());
    assert_eq!(reply["usage"]["completion_tokens"], 5);
    let response = w
        .client
        .post(format!("{}/v1/completions", w.base))
        .json(&json!({"prompt": "Once upon a time", "max_tokens": 5, "stream": true}))
        .send()
        .await
        .unwrap();
    let data = sse_data(&response.text().await.unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_models_and_load_describe_the_worker() {
    let w = TestWorker::simulated().await;
    let (status, health) = w.get("/health").await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let (_, models) = w.get("/v1/models").await;
    assert_eq!(models["data"][0]["id"], "sim");
    w.post("/v1/chat/completions", &chat("Hello", 4)).await;
    let (status, load) = w.get("/load").await;
    assert_eq!(status, 200);
    assert!(load["kv_blocks_total"].as_u64().unwrap() > 0);
    assert_eq!(load["requests_finished"], 1);
    assert!(load["steps"].as_u64().unwrap() >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_openai_errors_with_the_right_status() {
    let w = TestWorker::simulated().await;
    let raw = w
        .client
        .post(format!("{}/v1/chat/completions", w.base))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), 400);
    let body: Value = raw.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let mut wrong_model = chat("Hi", 4);
    wrong_model["model"] = json!("gpt-4");
    let (status, body) = w.post("/v1/chat/completions", &wrong_model).await;
    assert_eq!(status, 400);
    assert!(body["error"]["message"].as_str().unwrap().contains("gpt-4"));
    // Prompt plus max_tokens that can never fit the KV cache: refused, not queued forever.
    let (status, body) = w
        .post("/v1/chat/completions", &chat("Hi", 100_000_000))
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = w.get("/v1/nothing").await;
    assert_eq!(status, 404);
    let (status, _) = w.get("/v1/completions").await;
    assert_eq!(status, 405);
}

/// Reads `stream` until `done` holds on the events seen so far (10 s at most).
async fn read_events(
    stream: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let chunk = stream.next().await.expect("the stream stays open").unwrap();
            seen.push_str(std::str::from_utf8(&chunk).unwrap());
            let events: Vec<Value> = sse_data(&seen)
                .iter()
                .map(|d| serde_json::from_str(d).unwrap())
                .collect();
            if done(&events) {
                return events;
            }
        }
    })
    .await
    .expect("the events arrive")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_events_stream_the_blocks_a_request_stores() {
    let w = TestWorker::simulated().await;
    let events = w
        .client
        .get(format!("{}/kv/events", w.base))
        .send()
        .await
        .unwrap();
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let mut stream = events.bytes_stream();
    let first = read_events(&mut stream, |e| !e.is_empty()).await;
    assert_eq!(first[0], json!({"type": "snapshot", "hashes": []}));

    // The worker hands out its tokenizer, so the hashes can be computed outside it.
    let (status, tokenizer) = w.get("/tokenizer").await;
    assert_eq!(status, 200);
    assert_eq!(tokenizer["block_size"], 16);
    let spec: ringmaster_gpu_runtime::TokenizerSpec =
        serde_json::from_value(tokenizer["tokenizer"].clone()).unwrap();
    assert_eq!(
        tokenizer["fingerprint"],
        format!("{:016x}", spec.fingerprint())
    );
    let prompt = spec.build().unwrap().encode_chat(
        Some(&system()),
        &[ringmaster_gpu_runtime::ChatMessage {
            role: ringmaster_gpu_runtime::Role::User,
            text: "Hello".into(),
            ..Default::default()
        }],
    );
    let expected: Vec<String> = ringmaster_gpu_runtime::block::block_hashes(&prompt)
        .iter()
        .map(|h| format!("{:016x}", h.0))
        .collect();
    // The ~70-token prompt fills at least four blocks.
    assert!(expected.len() >= 4);

    w.post("/v1/chat/completions", &chat("Hello", 4)).await;
    // One block a frame, or a run of them as one `stored_many` frame.
    let stored = |events: &[Value]| -> Vec<String> {
        events
            .iter()
            .flat_map(|e| match e["type"].as_str() {
                Some("stored") => vec![e["hash"].as_str().unwrap().to_owned()],
                Some("stored_many") => e["hashes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|h| h.as_str().unwrap().to_owned())
                    .collect(),
                _ => Vec::new(),
            })
            .collect()
    };
    let events = read_events(&mut stream, |e| stored(e).len() >= expected.len()).await;
    assert_eq!(stored(&events)[..expected.len()], expected[..]);

    // A later subscriber starts from a snapshot that holds them.
    let late = w
        .client
        .get(format!("{}/kv/events", w.base))
        .send()
        .await
        .unwrap();
    let mut late = late.bytes_stream();
    let snapshot = read_events(&mut late, |e| !e.is_empty()).await;
    assert_eq!(snapshot[0]["type"], "snapshot");
    let held: Vec<&str> = snapshot[0]["hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h.as_str().unwrap())
        .collect();
    assert!(expected.iter().all(|h| held.contains(&h.as_str())));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm_answers_through_a_worker() {
    let Some(path) = crate::support::model_path() else {
        return;
    };
    let options = ringmaster_gpu_runtime::model::ModelOptions {
        kv_blocks: 256,
        threads: 1,
        isa: None,
    };
    let executor = ringmaster_gpu_runtime::model::ModelExecutor::load(&path, &options).unwrap();
    let mut config = EngineConfig::simulated("smollm");
    config.kv_blocks = 256;
    config.max_running = 4;
    config.step_token_budget = 256;
    let engine = EngineHandle::spawn_with_executor(config, executor).unwrap();
    let w = TestWorker::start(engine, "smollm2-135m-instruct").await;
    let (status, reply) = w
        .post(
            "/v1/chat/completions",
            &json!({
                "model": "smollm2-135m-instruct",
                "temperature": 0,
                "max_tokens": 24,
                "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
            }),
        )
        .await;
    assert_eq!(status, 200, "{reply}");
    assert_eq!(
        reply["choices"][0]["message"]["content"],
        "The capital of France is Paris."
    );
    assert_eq!(reply["choices"][0]["finish_reason"], "stop");
}

fn smollm_engine(path: &std::path::Path) -> EngineHandle {
    let options = ringmaster_gpu_runtime::model::ModelOptions {
        kv_blocks: 256,
        threads: 1,
        isa: None,
    };
    let executor = ringmaster_gpu_runtime::model::ModelExecutor::load(path, &options).unwrap();
    let mut config = EngineConfig::simulated("smollm");
    config.kv_blocks = 256;
    config.max_running = 4;
    config.step_token_budget = 256;
    EngineHandle::spawn_with_executor(config, executor).unwrap()
}

/// A real two-leg generation: the gateway sends the prefill leg to one SmolLM2 worker, which
/// keeps the prompt's KV blocks; the decode worker fetches them, decodes, and answers with
/// the tokens a worker serving the request whole gives at temperature 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_split_between_two_smollm_workers_answers_as_it_would_whole() {
    let Some(path) = crate::support::model_path() else {
        return;
    };
    const MODEL: &str = "smollm2-135m-instruct";
    let prefill =
        TestWorker::start_trusting(smollm_engine(&path), MODEL, Role::Prefill, trust(&[])).await;
    let decode = TestWorker::start_trusting(
        smollm_engine(&path),
        MODEL,
        Role::Decode,
        trust(&[prefill.authority()]),
    )
    .await;
    let whole = TestWorker::start(smollm_engine(&path), MODEL).await;
    let ask = |stream: bool| {
        json!({
            "model": MODEL,
            "temperature": 0,
            "max_tokens": 24,
            "stream": stream,
            "messages": [{"role": "user", "content": "Name the planets of the solar system in \
                order from the sun, one a line, and say for each one whether it has rings."}],
        })
    };
    let (status, reference) = whole.post("/v1/chat/completions", &ask(false)).await;
    assert_eq!(status, 200, "{reference}");
    let reference = reference["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let gw = crate::support::TestGateway::start_with_env(&format!(
        "[disaggregation]\nmin_uncached_tokens = 8\n\
         [[servers]]\nid = \"p\"\naddress = \"{}\"\nrole = \"prefill\"\ndisaggregation = \"ringmaster\"\n\
         [[servers]]\nid = \"d\"\naddress = \"{}\"\nrole = \"decode\"\ndisaggregation = \"ringmaster\"\n",
        prefill.base, decode.base
    ), fleet_env)
    .await;
    assert!(
        crate::support::eventually(Duration::from_secs(10), async || {
            gw.get_json("/v1/models").await["data"][0]["id"] == MODEL
        })
        .await,
        "the workers' model is discovered"
    );
    let response = gw.post_chat(&ask(false)).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-ringmaster-server"], "d");
    let reply: Value = response.json().await.unwrap();
    assert_eq!(
        reply["choices"][0]["message"]["content"],
        reference.as_str()
    );
    // The decode worker found the prompt's blocks in its cache (fetched from the prefill
    // worker); the prefill worker computed the prompt and one token.
    let (_, decode_load) = decode.get("/load").await;
    let (_, prefill_load) = prefill.get("/load").await;
    assert_eq!(prefill_load["generated_tokens_total"], 1, "{prefill_load}");
    assert!(
        decode_load["cached_prompt_tokens_total"].as_u64().unwrap() >= 16,
        "{decode_load}"
    );
    assert!(
        decode_load["prefill_tokens_total"].as_u64().unwrap() < 16,
        "the decode worker computed only the prompt's last tokens: {decode_load}"
    );
    let metrics = gw.metrics().await;
    assert_eq!(
        crate::support::metric_sum(&metrics, "ringmaster_prefill_legs_total", "outcome=\"ok\""),
        1.0
    );
    // Streamed, another question: the same tokens as served whole.
    let question =
        "Name the moons of Mars and of Jupiter that people found before 1700, and who found each.";
    let mut plain = ask(false);
    plain["messages"][0]["content"] = json!(question);
    let (_, whole_reply) = whole.post("/v1/chat/completions", &plain).await;
    let expected = whole_reply["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut streamed = ask(true);
    streamed["messages"][0]["content"] = json!(question);
    let text = gw.post_chat(&streamed).await.text().await.unwrap();
    let got: String = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(got, expected);
    assert_eq!(
        crate::support::metric_sum(
            &gw.metrics().await,
            "ringmaster_prefill_legs_total",
            "outcome=\"ok\""
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_routes_to_workers_over_http() {
    let a = TestWorker::simulated().await;
    let b = TestWorker::simulated().await;
    // The workers serve "sim" (their /v1/models says so); clients ask for the default name.
    let gw = crate::support::TestGateway::start(&format!(
        "{SIM_ALIAS}[[servers]]\naddress = \"{}\"\n[[servers]]\naddress = \"{}\"\n",
        a.base, b.base
    ))
    .await;
    // A plain reply, with the worker's usage.
    let response = gw.post_messages(&crate::support::hello(8)).await;
    assert_eq!(response.status(), 200);
    let reply: Value = response.json().await.unwrap();
    assert!(!reply["content"][0]["text"].as_str().unwrap().is_empty());
    assert_eq!(reply["stop_reason"], "max_tokens");
    assert_eq!(reply["usage"]["output_tokens"], 8);
    // Streamed, through the Anthropic event sequence.
    let mut streamed = crate::support::hello(5);
    streamed["stream"] = json!(true);
    let text = gw.post_messages(&streamed).await.text().await.unwrap();
    let events: Vec<String> = crate::support::sse_events(&text)
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(events.first().map(String::as_str), Some("message_start"));
    assert_eq!(events.last().map(String::as_str), Some("message_stop"));
    assert!(events.iter().any(|e| e == "content_block_delta"));
    // One session's two requests with a long shared prefix: the ring sends both to one worker
    // (keyed on the session), whose prefix cache serves the second.
    let long = |question: &str| {
        json!({
            "model": "sim-llama-3-8b",
            "max_tokens": 4,
            "metadata": {"user_id": "session-7"},
            "system": system(),
            "messages": [{"role": "user", "content": question}],
        })
    };
    gw.post_messages(&long("first")).await;
    let second: Value = gw
        .post_messages(&long("second"))
        .await
        .json()
        .await
        .unwrap();
    let cached = second["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(cached >= 48, "{cached} cached tokens");
    // The workers' load reaches the gateway's metrics once polled.
    assert!(
        crate::support::eventually(Duration::from_secs(5), async || {
            let metrics = gw.metrics().await;
            crate::support::metric_sum(&metrics, "ringmaster_server_kv_blocks_total", "") > 0.0
                && crate::support::metric_sum(&metrics, "ringmaster_server_steps_total", "") > 0.0
        })
        .await,
        "worker load in the gateway's metrics"
    );
}

/// What the gateway's explain endpoint says each server holds of `body`'s prompt.
async fn explained_matches(gw: &crate::support::TestGateway, body: &Value) -> Vec<Value> {
    let explained: Value = gw
        .admin(reqwest::Method::POST, "/admin/route/explain")
        .await
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    explained["prefix_matches"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_sees_what_each_worker_reports_it_caches() {
    // Small pools (64 blocks, 1,024 tokens), so a worker's cache can be made to evict.
    let small = || async {
        let mut config = EngineConfig::simulated("worker-small");
        config.time_scale = 0.0;
        config.kv_blocks = 64;
        TestWorker::start(EngineHandle::spawn(config).unwrap(), "sim").await
    };
    let (a, b) = (small().await, small().await);
    let gw = crate::support::TestGateway::start(&format!(
        "{SIM_ALIAS}[[servers]]\nid = \"a\"\naddress = \"{}\"\n[[servers]]\nid = \"b\"\naddress = \"{}\"\n",
        a.base, b.base
    ))
    .await;
    // Both event streams connect (an empty snapshot each) before any request.
    assert!(
        crate::support::eventually(Duration::from_secs(10), async || {
            let metrics = gw.metrics().await;
            crate::support::metric_sum(&metrics, "ringmaster_server_kv_report_live", "") == 2.0
        })
        .await,
        "both workers' KV reports are live"
    );
    // About 1.7 kB (six 256-byte prefix chunks) and 250 tokens (15 blocks).
    let body = json!({
        "model": "sim-llama-3-8b",
        "max_tokens": 4,
        "system": system().repeat(4),
        "messages": [{"role": "user", "content": "What is a ring?"}],
    });
    for m in explained_matches(&gw, &body).await {
        assert_eq!(
            (m["source"].as_str(), m["hashes"].as_u64()),
            (Some("reported"), Some(0)),
            "{m}"
        );
    }
    let reply: Value = gw.post_messages(&body).await.json().await.unwrap();
    assert_eq!(reply["stop_reason"], "max_tokens", "{reply}");
    // The worker that served it reports the prompt's blocks; the other holds none of it.
    let mut holder = String::new();
    assert!(
        crate::support::eventually(Duration::from_secs(10), async || {
            let matches = explained_matches(&gw, &body).await;
            let holding: Vec<&Value> = matches
                .iter()
                .filter(|m| m["hashes"].as_u64().unwrap() > 0)
                .collect();
            if let [one] = holding[..]
                && one["source"] == "reported"
                && one["tokens"].as_u64().unwrap() >= 192
            {
                holder = one["server"].as_str().unwrap().to_owned();
                true
            } else {
                false
            }
        })
        .await,
        "one worker reports the prompt cached: {:?}",
        explained_matches(&gw, &body).await
    );
    // Flood that worker directly (the gateway routes none of it) with other prompts until its
    // 64-block pool evicts the first one: the gateway learns it from the events alone.
    let worker = if holder == "a" { &a } else { &b };
    for i in 0..24 {
        let (status, _) = worker
            .post(
                "/v1/chat/completions",
                &json!({
                    "model": "sim",
                    "max_tokens": 2,
                    "messages": [
                        {"role": "system", "content": format!("flood {i} {}", system().repeat(2))},
                        {"role": "user", "content": "Hi"},
                    ],
                }),
            )
            .await;
        assert_eq!(status, 200);
    }
    assert!(
        crate::support::eventually(Duration::from_secs(10), async || {
            explained_matches(&gw, &body)
                .await
                .iter()
                .all(|m| m["source"] == "reported" && m["hashes"] == 0)
        })
        .await,
        "the eviction reached the gateway: {:?}",
        explained_matches(&gw, &body).await
    );
    let metrics = gw.metrics().await;
    assert!(
        crate::support::metric_sum(
            &metrics,
            "ringmaster_server_kv_reported_blocks",
            &format!("server=\"{holder}\"")
        ) > 0.0
    );
    // One snapshot per worker (no reconnection), and the holder's stores and evictions.
    assert_eq!(
        crate::support::metric_sum(&metrics, "ringmaster_server_kv_report_snapshots_total", ""),
        2.0
    );
    assert!(
        crate::support::metric_sum(
            &metrics,
            "ringmaster_server_kv_report_events_total",
            &format!("server=\"{holder}\"")
        ) >= 64.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_is_down_is_a_503_with_retry_after() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let gw = crate::support::TestGateway::start(&format!(
        "[[servers]]\naddress = \"http://127.0.0.1:{port}\"\n"
    ))
    .await;
    // Before the first load poll fails the request itself finds the worker unreachable;
    // after it the gateway knows every worker is down. Both are a 503 with a retry-after.
    for _ in 0..2 {
        let response = gw.post_messages(&crate::support::hello(4)).await;
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        let body: Value = response.json().await.unwrap();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("cannot be reached") || message.contains("can be reached"),
            "{message}"
        );
        tokio::time::sleep(Duration::from_millis(600)).await;
    }
}

/// A peer of the fleet that hands out whatever blocks it is given (a compromised or buggy
/// prefill worker), counting the connections it accepts.
struct BlockPeer {
    authority: String,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    serving: std::sync::Arc<std::sync::Mutex<bytes::Bytes>>,
}

impl BlockPeer {
    async fn start() -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let serving = std::sync::Arc::new(std::sync::Mutex::new(bytes::Bytes::new()));
        let (counted, served) = (connections.clone(), serving.clone());
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let body = served.lock().unwrap().clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let header = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = stream.write_all(header.as_bytes()).await;
                    let _ = stream.write_all(&body).await;
                });
            }
        });
        Self {
            authority,
            connections,
            serving,
        }
    }

    fn serve(&self, handoff: &ringmaster_gpu_runtime::KvHandoff) {
        *self.serving.lock().unwrap() = ringmaster_worker::transfer::encode(handoff);
    }

    fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The simulated engine the transfer tests' workers run (deterministic replies).
fn sim_engine() -> EngineHandle {
    let mut config = EngineConfig::simulated("worker-test");
    config.time_scale = 0.0;
    EngineHandle::spawn(config).unwrap()
}

/// POSTs `body` as leg `pair` of a split request, with `credential` if any.
async fn post_leg(
    worker: &TestWorker,
    body: &Value,
    pair: &str,
    credential: Option<&str>,
) -> Value {
    let mut request = worker
        .client
        .post(format!("{}/v1/chat/completions", worker.base))
        .header("x-request-id", pair)
        .json(body);
    if let Some(credential) = credential {
        request = request.header("x-ringmaster-leg-credential", credential);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}

/// `body` with `params` as its `kv_transfer_params`, and the credential the gateway would
/// give that leg of pair `pair`.
fn leg(body: &Value, params: &Value, pair: &str) -> (Value, String) {
    let mut leg = body.clone();
    leg["kv_transfer_params"] = params.clone();
    let text = serde_json::to_string(params).unwrap();
    (leg, fleet_secret().leg_credential(pair, &text))
}

/// What a reply says and how many of its prompt tokens came from the cache.
fn said(reply: &Value) -> (String, u64) {
    (
        reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned(),
        reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    )
}

/// A worker takes a transfer only from its gateway: a leg without the fleet's credential,
/// with another fleet's, or naming a prefill worker outside its allow-list is served whole
/// (no connection is made to the address the body chose), and blocks that are not the
/// request's own are refused by the engine; each is counted by reason, and every answer is
/// the one the request gets served whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_transfer_is_refused_and_the_answer_is_still_right() {
    let prefill = TestWorker::start_trusting(sim_engine(), "sim", Role::Prefill, trust(&[])).await;
    let planter = BlockPeer::start().await;
    let outsider = BlockPeer::start().await;
    let decode = TestWorker::start_trusting(
        sim_engine(),
        "sim",
        Role::Decode,
        trust(&[prefill.authority(), planter.authority.clone()]),
    )
    .await;
    let whole = TestWorker::start(sim_engine(), "sim").await;
    let question = |n: u32| chat(&format!("Question {n}: what is in a ring?"), 12);
    let reference = |n: u32| {
        let whole = &whole;
        async move { said(&whole.post("/v1/chat/completions", &question(n)).await.1).0 }
    };
    let prefill_params = json!({"do_remote_decode": true, "do_remote_prefill": false});

    // A prefill leg without the credential is served whole: no parameters, nothing kept.
    let mut unsigned = question(1);
    unsigned["kv_transfer_params"] = prefill_params.clone();
    let reply = post_leg(&prefill, &unsigned, "p-unsigned", None).await;
    assert!(reply.get("kv_transfer_params").is_none(), "{reply}");
    let kept = prefill
        .client
        .get(format!("{}/kv/transfer/p-unsigned", prefill.base))
        .header(
            "x-ringmaster-leg-credential",
            fleet_secret().fetch_credential("p-unsigned"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(kept.status(), 404, "nothing kept for an unsigned leg");

    // The gateway's own prefill leg: its blocks are kept, and handed only to the fleet.
    let (signed, credential) = leg(&question(1), &prefill_params, "p1");
    let prefilled = post_leg(&prefill, &signed, "p1", Some(&credential)).await;
    let params = prefilled["kv_transfer_params"].clone();
    assert_eq!(params["remote_request_id"], "p1", "{prefilled}");
    let stolen = prefill
        .client
        .get(format!("{}/kv/transfer/p1", prefill.base))
        .send()
        .await
        .unwrap();
    assert_eq!(stolen.status(), 403, "a fetch without the credential");

    // Decode legs the gateway did not sign: none, or another fleet's.
    let decode_leg = |params: &Value| {
        let mut body = question(1);
        body["kv_transfer_params"] = params.clone();
        body
    };
    let theirs = WorkerSecret::new("test", b"another fleet's secret")
        .unwrap()
        .leg_credential("p1", &serde_json::to_string(&params).unwrap());
    for credential in [None, Some(theirs.as_str())] {
        let reply = post_leg(&decode, &decode_leg(&params), "p1", credential).await;
        assert_eq!(said(&reply).0, reference(1).await, "served whole");
    }
    // A signed leg naming an address outside the allow-list: never called.
    let mut elsewhere = params.clone();
    let (host, port) = outsider.authority.split_once(':').unwrap();
    elsewhere["remote_host"] = json!(host);
    elsewhere["remote_port"] = json!(port.parse::<u16>().unwrap());
    let (body, credential) = leg(&question(1), &elsewhere, "p1");
    let reply = post_leg(&decode, &body, "p1", Some(&credential)).await;
    assert_eq!(said(&reply).0, reference(1).await);
    assert_eq!(
        outsider.connections(),
        0,
        "no connection to the body's address"
    );

    // The genuine leg, on a decode worker that has not seen the question: the blocks move,
    // and the answer is the same.
    let fresh = TestWorker::start_trusting(
        sim_engine(),
        "sim",
        Role::Decode,
        trust(&[prefill.authority()]),
    )
    .await;
    let (body, credential) = leg(&question(1), &params, "p1");
    let reply = post_leg(&fresh, &body, "p1", Some(&credential)).await;
    let (text, cached) = said(&reply);
    assert_eq!(text, reference(1).await);
    assert!(cached >= 48, "{cached} tokens from the prefill's blocks");

    // A peer of the fleet that hands over blocks that are not the request's own.
    let genuine = |asked: Value, pair: &'static str| {
        let prefill = &prefill;
        let prefill_params = &prefill_params;
        async move {
            let (body, credential) = leg(&asked, prefill_params, pair);
            post_leg(prefill, &body, pair, Some(&credential)).await;
            let fetched = prefill
                .client
                .get(format!("{}/kv/transfer/{pair}", prefill.base))
                .header(
                    "x-ringmaster-leg-credential",
                    fleet_secret().fetch_credential(pair),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(fetched.status(), 200);
            ringmaster_worker::transfer::decode(&fetched.bytes().await.unwrap()).unwrap()
        }
    };
    let mut relabelled = genuine(question(3), "p3").await;
    relabelled.blocks[1].hash = ringmaster_gpu_runtime::block::BlockHash(0xdead_beef);
    // Another tenant's prompt, from its first token on.
    let mut another = question(3);
    another["messages"][0]["content"] = json!(format!("Another tenant. {}", system()));
    let others = genuine(another, "p4").await;
    let (host, port) = planter.authority.split_once(':').unwrap();
    let planted_params = json!({
        "do_remote_prefill": true, "do_remote_decode": false,
        "remote_engine_id": "e", "remote_request_id": "planted",
        "remote_host": host, "remote_port": port.parse::<u16>().unwrap(),
    });
    for (handoff, n, reason) in [(relabelled, 3, "hash"), (others, 3, "tokens")] {
        planter.serve(&handoff);
        let (body, credential) = leg(&question(n), &planted_params, "planted");
        let reply = post_leg(&decode, &body, "planted", Some(&credential)).await;
        assert_eq!(said(&reply).0, reference(n).await, "{reason}: still right");
        let metrics = decode.metrics().await;
        assert_eq!(
            crate::support::metric_sum(
                &metrics,
                "ringmaster_kv_import_refused_total",
                &format!("reason=\"{reason}\"")
            ),
            1.0,
            "{metrics}"
        );
    }
    assert_eq!(planter.connections(), 2);
    let metrics = decode.metrics().await;
    for (reason, count) in [("credential", 2.0), ("peer", 1.0)] {
        assert_eq!(
            crate::support::metric_sum(
                &metrics,
                "ringmaster_kv_import_refused_total",
                &format!("reason=\"{reason}\"")
            ),
            count,
            "{reason}: {metrics}"
        );
    }
    assert_eq!(
        crate::support::metric_sum(
            &prefill.metrics().await,
            "ringmaster_kv_export_refused_total",
            ""
        ),
        1.0
    );
}
