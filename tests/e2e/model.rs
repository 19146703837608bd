//! SmolLM2 behind the gateway over real sockets: a `gguf:` server with `[model]` settings
//! answers an Anthropic request with real text, serves the repeated prompt from its prefix
//! cache, and refuses tools. Needs the model (`cargo xtask model`); required when
//! `RINGMASTER_REQUIRE_MODEL` is set, as in `tests/run`.

use serde_json::{Value, json};

use crate::support::{TestGateway, metric_sum};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm_answers_through_the_gateway() {
    let Some(path) = crate::support::model_path() else {
        return;
    };
    let gw = TestGateway::start(&format!(
        "models = [\"smollm\"]\n[model]\nthreads = 1\nkernels = \"auto\"\nkv_blocks = 256\n\
         [[servers]]\naddress = \"gguf:{}\"\nid = \"smollm\"\n",
        path.display()
    ))
    .await;
    let ask = json!({
        "model": "smollm",
        "max_tokens": 24,
        "temperature": 0,
        "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
    });
    let first: Value = gw.post_messages(&ask).await.json().await.unwrap();
    assert_eq!(
        first["content"][0]["text"], "The capital of France is Paris.",
        "{first}"
    );
    assert_eq!(first["stop_reason"], "end_turn");
    let second: Value = gw.post_messages(&ask).await.json().await.unwrap();
    assert_eq!(second["content"], first["content"]);
    assert!(
        second["usage"]["cache_read_input_tokens"].as_u64().unwrap() >= 16,
        "{second}"
    );
    // A model's engine has no tool-calling chat template (simulated servers simulate calls):
    // a request that offers tools is refused, naming the feature.
    let mut with_tools = ask.clone();
    with_tools["tools"] = json!([{"name": "get_weather", "input_schema": {"type": "object"}}]);
    let reply = gw.post_messages(&with_tools).await;
    assert_eq!(reply.status(), 400);
    let body: Value = reply.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("tools:") && message.contains("not supported"),
        "{message}"
    );
    let metrics = gw.metrics().await;
    assert!(metric_sum(&metrics, "ringmaster_server_model_load_seconds", "") > 0.0);
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_kv_blocks_total", ""),
        256.0
    );
}
