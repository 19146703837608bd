//! SmolLM2 behind the gateway over real sockets: a `gguf:` server with `[model]` settings
//! answers an Anthropic request with real text and serves the repeated prompt from its
//! prefix cache. Needs the model (`cargo xtask model`); required when
//! `RINGMASTER_REQUIRE_MODEL` is set, as in `tests/run`.

use serde_json::{Value, json};

use crate::support::{TestGateway, metric_sum};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm_answers_through_the_gateway() {
    let path = std::env::var_os("RINGMASTER_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(ringmaster_gpu_runtime::model::default_model_path);
    if !path.is_file() {
        assert!(
            std::env::var_os("RINGMASTER_REQUIRE_MODEL").is_none(),
            "RINGMASTER_REQUIRE_MODEL is set but {} is missing: run `cargo xtask model`",
            path.display()
        );
        eprintln!("skipping: SmolLM2 is not at {}", path.display());
        return;
    }
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
    let metrics = gw.metrics().await;
    assert!(metric_sum(&metrics, "ringmaster_server_model_load_seconds", "") > 0.0);
    assert_eq!(
        metric_sum(&metrics, "ringmaster_server_kv_blocks_total", ""),
        256.0
    );
}
