//! The example policies under `examples/`, built from source by `tests/run`, loaded by a
//! started gateway and serving real requests.

use serde_json::json;

use crate::support::{TestGateway, metric_sum, required_file};

/// The built component of `examples/NAME` (`NAME.wasm` beside its sources), or `None` when
/// it was not built and the run does not require it.
fn built_example(name: &str) -> Option<std::path::PathBuf> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name)
        .join(format!("{name}.wasm"));
    required_file(
        path,
        "RINGMASTER_REQUIRE_POLICIES",
        &format!("tests/run builds it with `ringmaster policy build examples/{name}`"),
    )
}

/// Serves a growing conversation through the router component at `path` (variant `name`):
/// every answer is 200 from that variant, later turns stay where their cache is, and the
/// policy never faults.
async fn serves_a_conversation(path: &std::path::Path, name: &str) {
    let gw = TestGateway::simulated(
        4,
        0.0,
        // A generous deadline: this is about serving through the component, not its speed
        // (an interpreted guest under a loaded test machine can overrun 5 ms).
        &format!(
            "[policies]\ncall_deadline_ms = 1000\n[[policies.router]]\nname = {name:?}\nsource = {:?}\n",
            path.display().to_string()
        ),
    )
    .await;
    let conversation = |turns: usize| {
        let mut messages = Vec::new();
        for i in 0..turns {
            messages.push(json!({"role": "user", "content": format!("Question {i} about a long shared document. {}", "Context words. ".repeat(200))}));
            messages.push(json!({"role": "assistant", "content": format!("Answer {i}.")}));
        }
        messages.push(json!({"role": "user", "content": "And the next question?"}));
        json!({"model": "sim-llama-3-8b", "max_tokens": 8, "messages": messages})
    };
    let mut servers = Vec::new();
    for turns in 0..4 {
        let response = gw.post_messages(&conversation(turns)).await;
        assert_eq!(response.status(), 200);
        assert_eq!(response.headers()["x-ringmaster-variant"], name);
        servers.push(
            response.headers()["x-ringmaster-server"]
                .to_str()
                .unwrap()
                .to_owned(),
        );
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["type"], "message");
    }
    // Each later turn carries the earlier ones: the server holding them is the cheapest.
    assert!(
        servers.windows(2).skip(1).all(|w| w[0] == w[1]),
        "later turns left their cache: {servers:?}"
    );
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_policy_faults_total", ""),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_routing_decisions_total",
            "reason=\"fallback\""
        ),
        0.0
    );
}

#[tokio::test]
async fn the_python_router_serves_requests_and_follows_the_cache() {
    if let Some(path) = built_example("python-router") {
        serves_a_conversation(&path, "python").await;
    }
}

#[tokio::test]
async fn the_javascript_router_serves_requests_and_follows_the_cache() {
    if let Some(path) = built_example("js-router") {
        serves_a_conversation(&path, "js").await;
    }
}

#[tokio::test]
async fn the_c_router_serves_requests_and_follows_the_cache() {
    if let Some(path) = built_example("c-router") {
        serves_a_conversation(&path, "c").await;
    }
}

#[tokio::test]
async fn the_python_admission_policy_runs_short_prompts_and_refuses_long_ones() {
    if let Some(path) = built_example("python-admission") {
        admits_short_prompts_and_refuses_long_ones(&path).await;
    }
}

#[tokio::test]
async fn the_javascript_admission_policy_runs_short_prompts_and_refuses_long_ones() {
    if let Some(path) = built_example("js-admission") {
        admits_short_prompts_and_refuses_long_ones(&path).await;
    }
}

#[tokio::test]
async fn the_c_admission_policy_runs_short_prompts_and_refuses_long_ones() {
    if let Some(path) = built_example("c-admission") {
        admits_short_prompts_and_refuses_long_ones(&path).await;
    }
}

/// The admission sample (the same logic in each language) in a gateway's admission slot.
async fn admits_short_prompts_and_refuses_long_ones(path: &std::path::Path) {
    let gw = TestGateway::simulated(
        2,
        0.0,
        &format!(
            "[policies]\ncall_deadline_ms = 1000\n[policies.admission]\nsource = {:?}\n",
            path.display().to_string()
        ),
    )
    .await;
    let short = json!({"model": "sim-llama-3-8b", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello"}]});
    assert_eq!(gw.post_messages(&short).await.status(), 200);
    // Far over its 100,000-token limit.
    let long = json!({"model": "sim-llama-3-8b", "max_tokens": 4,
        "messages": [{"role": "user", "content": "many words ".repeat(70_000)}]});
    let refused = gw.post_messages(&long).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["retry-after"], "1");
    let body: serde_json::Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("this gateway admits"), "{message}");
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_policy_faults_total", ""),
        0.0
    );
}

#[tokio::test]
async fn the_c_safety_filter_refuses_a_prompt_and_cuts_a_reply_off() {
    if let Some(path) = built_example("c-safety") {
        refuses_a_prompt_and_cuts_a_reply_off(&path).await;
    }
}

#[tokio::test]
async fn the_python_safety_filter_refuses_a_prompt_and_cuts_a_reply_off() {
    if let Some(path) = built_example("python-safety") {
        refuses_a_prompt_and_cuts_a_reply_off(&path).await;
    }
}

#[tokio::test]
async fn the_javascript_safety_filter_refuses_a_prompt_and_cuts_a_reply_off() {
    if let Some(path) = built_example("js-safety") {
        refuses_a_prompt_and_cuts_a_reply_off(&path).await;
    }
}

/// The safety-filter sample (the same logic in each language) in a gateway's safety slot.
async fn refuses_a_prompt_and_cuts_a_reply_off(path: &std::path::Path) {
    // Words the simulated model says often, so that its replies are cut off.
    let gw = TestGateway::simulated(
        2,
        0.0,
        &format!(
            "[policies]\ncall_deadline_ms = 1000\n[policies.safety]\nsource = {:?}\n\
             window_bytes = 32\nconfig = {{ patterns = \"forbidden, the, of, and, to, in, is\" }}\n",
            path.display().to_string()
        ),
    )
    .await;
    let refused = gw
        .post_messages(&json!({"model": "sim-llama-3-8b", "max_tokens": 8,
            "messages": [{"role": "user", "content": "say something FORBIDDEN please"}]}))
        .await;
    assert_eq!(refused.status(), 400);
    let body: serde_json::Value = refused.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the prompt contains \"forbidden\""),
        "{message}"
    );
    let reply: serde_json::Value = gw
        .post_messages(&json!({"model": "sim-llama-3-8b", "max_tokens": 200,
            "messages": [{"role": "user", "content": "Hey"}]}))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(reply["stop_reason"], "refusal", "{reply}");
    let text = reply["content"][0]["text"].as_str().unwrap().to_lowercase();
    for pattern in ["the", "of", "and", "to", "in", "is"] {
        assert!(
            !text.contains(pattern),
            "{pattern:?} reached the client: {text:?}"
        );
    }
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(&metrics, "ringmaster_policy_faults_total", ""),
        0.0,
        "{metrics}"
    );
}
