//! `[[fallback]]`: a model's requests spill to another pool (a hosted provider with its own
//! key, here a fake OpenAI server that demands it) when its own servers cannot take them,
//! under the provider's model name, and come back when they return; a tenant kept off
//! fallbacks is refused instead; each spill counted by pool and reason.

use reqwest::Method;
use ringmaster_tests::fake_upstream::{Behavior, Demands, FakeUpstream};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::{TestGateway, metric_sum};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_spill_to_the_fallback_pool_while_the_own_servers_are_gone_and_come_back() {
    let own = FakeUpstream::start(Behavior::OpenAi, 3).await;
    let provider = FakeUpstream::serve_demanding(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Behavior::OpenAi,
        3,
        Demands {
            tls: None,
            headers: vec![("authorization".into(), "Bearer sk-provider".into())],
        },
    );
    let toml = format!(
        "models = [\"llama\"]\n\
         [[tenants]]\nname = \"acme\"\n\
         [[tenants]]\nname = \"on-prem-only\"\nfallback = false\n\
         [[api_keys]]\nkey = \"sk-acme-0001\"\ntenant = \"acme\"\n\
         [[api_keys]]\nkey = \"sk-onprem-001\"\ntenant = \"on-prem-only\"\n\
         [[servers]]\nid = \"own\"\naddress = \"{}\"\nmodels = [\"llama\"]\n\
         [[servers]]\nid = \"provider\"\naddress = \"{}\"\npool = \"hosted\"\n\
         models = [\"gpt-4o-mini\"]\napi_key_env = \"PROVIDER_KEY\"\n\
         [[fallback]]\npool = \"hosted\"\nmodels = [\"llama\"]\nmodel = \"gpt-4o-mini\"\n",
        own.url(),
        provider.url()
    );
    let env = |name: &str| (name == "PROVIDER_KEY").then(|| "sk-provider".to_owned());
    let gw = TestGateway::start_with_env(&toml, env).await;
    let chat = async |key: &str| {
        gw.client
            .post(gw.url("/v1/chat/completions"))
            .bearer_auth(key)
            .json(&json!({"model": "llama", "max_tokens": 3,
                "messages": [{"role": "user", "content": "Where do I go?"}]}))
            .send()
            .await
            .unwrap()
    };
    let header = |r: &reqwest::Response, name: &str| {
        r.headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };

    // The own server takes it while it is there; the provider's server is in no model's pool.
    let r = chat("sk-acme-0001").await;
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "x-ringmaster-server").as_deref(), Some("own"));
    assert_eq!(header(&r, "x-ringmaster-fallback"), None);
    let models: Value = gw
        .client
        .get(gw.url("/v1/models"))
        .bearer_auth("sk-acme-0001")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!models.to_string().contains("gpt-4o-mini"), "{models}");

    // Drained: the provider takes it, under its own model name and with its key.
    let drained = gw.admin_call(Method::DELETE, "/admin/servers/own").await;
    assert!(drained.status().is_success());
    for _ in 0..3 {
        let r = chat("sk-acme-0001").await;
        assert_eq!(r.status(), 200);
        assert_eq!(
            header(&r, "x-ringmaster-server").as_deref(),
            Some("provider")
        );
        assert_eq!(
            header(&r, "x-ringmaster-fallback").as_deref(),
            Some("hosted")
        );
        let body: Value = r.json().await.unwrap();
        assert!(body["usage"]["completion_tokens"].as_u64().unwrap() > 0);
    }
    assert_eq!(provider.last_request_json()["model"], "gpt-4o-mini");
    assert_eq!(
        provider
            .unauthorized
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    let metrics = gw.metrics().await;
    assert_eq!(
        metric_sum(
            &metrics,
            "ringmaster_fallback_requests_total",
            "pool=\"hosted\",reason=\"no_server\""
        ),
        3.0,
        "{metrics}"
    );
    // A tenant kept on the fleet's own servers is refused rather than spilled.
    let refused = chat("sk-onprem-001").await;
    assert_eq!(refused.status(), 503);

    // Back (under a new id: the old one is still draining): the own server takes the
    // model's requests again.
    let added = gw
        .admin(Method::POST, "/admin/servers")
        .await
        .json(&json!({"id": "own-again", "address": own.url(), "models": ["llama"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201, "{}", added.text().await.unwrap());
    let r = chat("sk-acme-0001").await;
    assert_eq!(r.status(), 200);
    assert_eq!(
        header(&r, "x-ringmaster-server").as_deref(),
        Some("own-again")
    );
    assert_eq!(header(&r, "x-ringmaster-fallback"), None);
    let servers = gw.servers().await;
    let provider_entry = servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["id"] == "provider")
        .unwrap()
        .clone();
    assert_eq!(provider_entry["pool"], "hosted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_spills_only_for_a_rule_that_names_overload() {
    let own = FakeUpstream::start(Behavior::OpenAi, 3).await;
    // The engine's own figures: 50 waiting, past the gateway's bound of 8.
    own.set_metrics(Some(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{engine=\"0\",model_name=\"llama\"} 4.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{engine=\"0\",model_name=\"llama\"} 50.0\n",
    ));
    let reserve = FakeUpstream::start(Behavior::OpenAi, 3).await;
    let config = |when: &str| {
        format!(
            "models = [\"llama\"]\n[limits]\nmax_waiting_per_server = 8\n\
             [[servers]]\nid = \"own\"\naddress = \"{}\"\nmodels = [\"llama\"]\n\
             [[servers]]\nid = \"reserve\"\naddress = \"{}\"\npool = \"reserve\"\n\
             models = [\"llama\"]\n\
             [[fallback]]\npool = \"reserve\"\nwhen = [{when}]\n",
            own.url(),
            reserve.url()
        )
    };
    for (when, spills) in [
        ("\"overloaded\"", true),
        ("\"no_server\", \"policy\"", false),
    ] {
        let gw = TestGateway::start(&config(when)).await;
        let full = crate::support::eventually(std::time::Duration::from_secs(5), async || {
            gw.servers().await["servers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["id"] == "own" && s["engine"]["waiting"] == 50)
        })
        .await;
        assert!(full, "{}", gw.servers().await);
        let r = gw
            .post_chat(&json!({"model": "llama", "max_tokens": 3,
                "messages": [{"role": "user", "content": "Anyone free?"}]}))
            .await;
        if spills {
            assert_eq!(r.status(), 200);
            assert_eq!(
                r.headers()["x-ringmaster-fallback"].to_str().unwrap(),
                "reserve"
            );
            assert_eq!(
                metric_sum(
                    &gw.metrics().await,
                    "ringmaster_fallback_requests_total",
                    "pool=\"reserve\",reason=\"overloaded\""
                ),
                1.0
            );
        } else {
            assert_eq!(r.status(), 503, "{}", r.text().await.unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_router_policy_declines_spills_for_a_rule_that_names_policy() {
    // The hostile fixture routes like the ring, and declines a request that asks it to
    // (`x-attack: huge-reject`, with a 4 MiB reason): the rule for `policy` takes that one.
    let own = FakeUpstream::start(Behavior::OpenAi, 3).await;
    let reserve = FakeUpstream::start(Behavior::OpenAi, 3).await;
    let hostile = format!(
        "{}/../policies/dist/fixtures/hostile.wasm",
        env!("CARGO_MANIFEST_DIR")
    );
    let gw = TestGateway::start(&format!(
        "models = [\"llama\"]\n[policies]\npass_headers = [\"x-attack\"]\n\
         [[policies.router]]\nname = \"hostile\"\nsource = \"{hostile}\"\n\
         [[servers]]\nid = \"own\"\naddress = \"{}\"\nmodels = [\"llama\"]\n\
         [[servers]]\nid = \"reserve\"\naddress = \"{}\"\npool = \"reserve\"\nmodels = [\"llama\"]\n\
         [[fallback]]\npool = \"reserve\"\nwhen = [\"policy\"]\n",
        own.url(),
        reserve.url()
    ))
    .await;
    let ask = async |attack: Option<&str>| {
        let mut request = gw
            .client
            .post(gw.url("/v1/chat/completions"))
            .json(&json!({"model": "llama", "max_tokens": 3,
                "messages": [{"role": "user", "content": "Where to?"}]}));
        if let Some(attack) = attack {
            request = request.header("x-attack", attack);
        }
        request.send().await.unwrap()
    };
    let routed = ask(None).await;
    assert_eq!(routed.status(), 200);
    assert_eq!(routed.headers()["x-ringmaster-server"], "own");
    let spilled = ask(Some("huge-reject")).await;
    assert_eq!(spilled.status(), 200, "{}", spilled.text().await.unwrap());
    assert_eq!(spilled.headers()["x-ringmaster-server"], "reserve");
    assert_eq!(spilled.headers()["x-ringmaster-fallback"], "reserve");
    assert_eq!(
        metric_sum(
            &gw.metrics().await,
            "ringmaster_fallback_requests_total",
            "pool=\"reserve\",reason=\"policy\""
        ),
        1.0
    );
}
