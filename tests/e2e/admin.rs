//! The admin API: auth, listing, adding, draining and explaining.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{ADMIN_TOKEN, TestGateway, eventually, hello};

#[tokio::test]
async fn admin_api_is_off_without_a_token() {
    let mut raw = ringmaster_gateway::RawConfig::from_toml("listen = \"127.0.0.1:0\"").unwrap();
    raw.admin_token = None;
    let config = raw.validate_with_env(|_| None).unwrap();
    let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let gateway = ringmaster_gateway::Gateway::start(config).unwrap();
    ringmaster_admin::mount(&gateway);
    tokio::spawn(ringmaster_gateway::serve(
        gateway,
        listener,
        std::future::pending(),
    ));
    let response = reqwest::Client::new()
        .get(format!("http://{addr}/admin/servers"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disabled")
    );
}

#[tokio::test]
async fn scoped_tokens_are_refused_past_their_scope_and_every_change_is_audited() {
    let gw = TestGateway::simulated(
        2,
        0.01,
        "[[admin.tokens]]\nname = \"dashboards\"\ntoken = \"dashboards-secret-0001\"\n\
         [[admin.tokens]]\nname = \"ops\"\ntoken = \"operations-secret-0002\"\n\
         scopes = [\"read\", \"operate\"]\n",
    )
    .await;
    let call = |token: &'static str, method: Method, path: &str| {
        gw.client.request(method, gw.url(path)).bearer_auth(token)
    };
    // Read: looks, but changes nothing.
    let servers = call("dashboards-secret-0001", Method::GET, "/admin/servers")
        .send()
        .await
        .unwrap();
    assert_eq!(servers.status(), 200);
    let refused = call("dashboards-secret-0001", Method::POST, "/admin/servers")
        .json(&json!({"address": "sim://gpu-7", "id": "gpu-7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    let message: Value = refused.json().await.unwrap();
    let message = message["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("dashboards") && message.contains("\"operate\""),
        "{message}"
    );
    // Operate: changes the fleet, but uploads no component.
    let added = call("operations-secret-0002", Method::POST, "/admin/servers")
        .json(&json!({"address": "sim://gpu-7", "id": "gpu-7"}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let upload = call(
        "operations-secret-0002",
        Method::PUT,
        "/admin/policies/router?variant=new",
    )
    .body(vec![0u8; 16])
    .send()
    .await
    .unwrap();
    assert_eq!(upload.status(), 403);
    let message: Value = upload.json().await.unwrap();
    assert!(
        message["error"]["message"]
            .as_str()
            .unwrap()
            .contains("\"policies\""),
        "{message}"
    );
    // An unknown token: 401, as before.
    let unknown = call("not-a-token-at-all-000", Method::GET, "/admin/servers")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 401);
    // Guessing goes on: recorded once per address and interval, saying how many it stands for.
    for _ in 0..3 {
        let guess = call(
            "not-a-token-at-all-001",
            Method::DELETE,
            "/admin/servers/gpu-0",
        )
        .send()
        .await
        .unwrap();
        assert_eq!(guess.status(), 401);
    }
    // The trail: each change (refused ones too) and the first refused token, newest first,
    // by name and address; never a read.
    let audit = gw.admin_json(Method::GET, "/admin/audit").await;
    let entries = audit["entries"].as_array().unwrap();
    let seen: Vec<(Option<&str>, &str, &str, u64)> = entries
        .iter()
        .map(|e| {
            (
                e["token"].as_str(),
                e["method"].as_str().unwrap(),
                e["path"].as_str().unwrap(),
                e["status"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (None, "GET", "/admin/servers", 401),
            (
                Some("ops"),
                "PUT",
                "/admin/policies/router?variant=new",
                403
            ),
            (Some("ops"), "POST", "/admin/servers", 201),
            (Some("dashboards"), "POST", "/admin/servers", 403),
        ],
        "{audit}"
    );
    for entry in entries {
        assert!(
            entry["address"]
                .as_str()
                .is_some_and(|a| a.starts_with("127.0.0.1:")),
            "{entry}"
        );
    }
    // What the change was made to.
    assert_eq!(
        entries[2]["object"],
        json!({"server": {"id": "gpu-7", "address": "sim://gpu-7"}}),
        "{audit}"
    );
    assert!(
        !audit.to_string().contains("secret"),
        "no token in the trail"
    );
}

#[tokio::test]
async fn admin_needs_the_token() {
    let gw = TestGateway::simulated(2, 0.0, "").await;
    let none = gw
        .client
        .get(gw.url("/admin/servers"))
        .send()
        .await
        .unwrap();
    assert_eq!(none.status(), 401);
    let wrong = gw
        .client
        .get(gw.url("/admin/servers"))
        .bearer_auth("not-the-token-at-all")
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let header = gw
        .client
        .get(gw.url("/admin/servers"))
        .header("x-admin-token", ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(header.status(), 200);
}

#[tokio::test]
async fn list_add_remove_servers() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let listed = gw.servers().await;
    assert_eq!(listed["servers"].as_array().unwrap().len(), 4);
    let first = &listed["servers"][0];
    assert_eq!(first["state"], "active");
    assert!(first["engine"]["kv_blocks_total"].as_u64().unwrap() > 20_000);

    let added = gw
        .admin(Method::POST, "/admin/servers")
        .await
        .json(&json!({"address": "sim://gpu-4", "weight": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    let added: Value = added.json().await.unwrap();
    assert_eq!(added["id"], "gpu-4");
    assert_eq!(added["weight"], 2);
    let duplicate = gw
        .admin(Method::POST, "/admin/servers")
        .await
        .json(&json!({"address": "sim://gpu-4"}))
        .send()
        .await
        .unwrap();
    assert_eq!(duplicate.status(), 409);
    for bad in [
        json!({"address": "gopher://x"}),
        json!({"address": "sim://ok", "weight": 0}),
        json!({"weight": 1}),
        json!({"address": "http://127.0.0.1"}),
    ] {
        let response = gw
            .admin(Method::POST, "/admin/servers")
            .await
            .json(&bad)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 400, "{bad}");
    }
    assert_eq!(gw.servers().await["servers"].as_array().unwrap().len(), 5);

    let missing = gw.admin_call(Method::DELETE, "/admin/servers/gpu-99").await;
    assert_eq!(missing.status(), 404);
    let removed = gw.admin_call(Method::DELETE, "/admin/servers/gpu-4").await;
    assert_eq!(removed.status(), 200);
    let gone = eventually(Duration::from_secs(5), async || {
        gw.servers().await["servers"].as_array().unwrap().len() == 4
    })
    .await;
    assert!(gone, "an idle removed server is reaped");
}

#[tokio::test]
async fn removing_a_server_drains_its_in_flight_requests() {
    let gw = TestGateway::simulated(1, 0.05, "").await;
    let mut request = hello(300);
    request["stream"] = json!(true);
    request["messages"][0]["content"] = json!("Write a long essay about lighthouses");
    let response = gw.post_messages(&request).await;
    let server = response.headers()["x-ringmaster-server"]
        .to_str()
        .unwrap()
        .to_owned();
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    let removed = gw
        .admin_call(Method::DELETE, &format!("/admin/servers/{server}"))
        .await;
    assert_eq!(removed.status(), 200);
    let listed = gw.servers().await;
    assert_eq!(listed["servers"][0]["state"], "draining");
    // New requests find no server, but the in-flight stream finishes normally.
    assert_eq!(gw.post_messages(&hello(2)).await.status(), 529);
    let mut rest = String::from_utf8(first.to_vec()).unwrap();
    while let Some(chunk) = body.next().await {
        rest.push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
    }
    assert!(
        rest.contains("event: message_stop"),
        "the drained stream completed"
    );
    let reaped = eventually(Duration::from_secs(5), async || {
        gw.servers().await["servers"].as_array().unwrap().is_empty()
    })
    .await;
    assert!(reaped);
}

#[tokio::test]
async fn explain_shows_key_candidates_and_choice() {
    let gw = TestGateway::simulated(4, 0.0, "").await;
    let body = json!({
        "model": "sim-llama-3-8b", "max_tokens": 16,
        "system": "Shared system prompt. ".repeat(50),
        "messages": [{"role": "user", "content": "What is a ring?"}],
    });
    let explained: Value = gw
        .admin(Method::POST, "/admin/route/explain")
        .await
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(explained["routing_key"]["source"], "prefix");
    assert!(explained["prefix_hashes"].as_u64().unwrap() >= 4);
    let candidates = explained["candidates"].as_array().unwrap();
    assert_eq!(candidates.len(), 4);
    // The embedded default's router decides, as it does on the path.
    assert_eq!(explained["variant"], "default");
    assert_eq!(explained["reason"], "policy");
    assert_eq!(explained["chosen"], explained["policy_chose"]);
    // Explaining runs nothing; the real request then goes exactly where explain said.
    let real = gw.post_messages(&body).await;
    assert_eq!(
        real.headers()["x-ringmaster-server"].to_str().unwrap(),
        explained["chosen"].as_str().unwrap()
    );
    // A session header changes the key source.
    let by_session: Value = gw
        .admin(Method::POST, "/admin/route/explain")
        .await
        .header("x-session-id", "conv-42")
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(by_session["routing_key"]["source"], "session-header");
    let bad = gw
        .admin(Method::POST, "/admin/route/explain")
        .await
        .json(&json!({"model": "sim-llama-3-8b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// Regression (issue 23): explain read only `x-session-id`, so with Claude Code's header it
/// explained decisions the gateway did not make (2 of 12 sessions agreed). It now runs the
/// path's own prepare phase and router: for every configured session header, the server it
/// names is the one that answers.
#[tokio::test]
async fn explain_agrees_with_the_path_for_each_session_header() {
    let headers = ["x-session-id", "x-claude-code-session-id", "x-team-session"];
    let gw = TestGateway::simulated(
        4,
        0.0,
        "[routing]\nsession_headers = [\"x-session-id\", \"x-claude-code-session-id\", \"x-team-session\"]\n",
    )
    .await;
    for header in headers {
        for session in 0..12 {
            let body = json!({
                "model": "sim-llama-3-8b", "max_tokens": 4,
                "messages": [{"role": "user", "content": format!("Turn of session {session}")}],
            });
            let id = format!("{header}-{session}");
            let explained: Value = gw
                .admin(Method::POST, "/admin/route/explain")
                .await
                .header(header, &id)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            assert_eq!(
                explained["routing_key"]["source"], "session-header",
                "{header}"
            );
            let real = gw
                .client
                .post(gw.url("/v1/messages"))
                .header(header, &id)
                .json(&body)
                .send()
                .await
                .unwrap();
            assert_eq!(real.status(), 200);
            assert_eq!(
                real.headers()["x-ringmaster-server"].to_str().unwrap(),
                explained["chosen"].as_str().unwrap(),
                "{header}: session {session}"
            );
        }
    }
}

#[tokio::test]
async fn traffic_is_recorded_as_a_trace_and_switched_from_the_admin_api() {
    let dir = std::env::temp_dir().join(format!("ringmaster-e2e-record-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("traffic.jsonl");
    let extra = format!(
        "[record]\npath = {:?}\nenabled = false\n",
        path.display().to_string()
    );
    let gw = TestGateway::simulated(2, 0.0, &extra).await;
    let lines = || {
        std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(gw.post_messages(&hello(8)).await.status(), 200);
    assert!(lines().is_empty(), "switched off in the config");
    let on = gw.admin_json(Method::PUT, "/admin/record").await;
    assert_eq!(on["recording"], true);
    assert_eq!(gw.post_messages(&hello(8)).await.status(), 200);
    let recorded = lines();
    assert_eq!(recorded.len(), 1);
    let line = &recorded[0];
    assert!(line["input_length"].as_u64().unwrap() > 0);
    assert_eq!(line["output_length"], 8);
    assert_eq!(
        line["hash_ids"].as_array().unwrap().len() as u64,
        line["input_length"].as_u64().unwrap().div_ceil(512)
    );
    assert!(
        !std::fs::read_to_string(&path).unwrap().contains("Hello"),
        "never text"
    );
    let off = gw.admin_json(Method::DELETE, "/admin/record").await;
    assert_eq!(off["recording"], false);
    assert_eq!(gw.post_messages(&hello(8)).await.status(), 200);
    assert_eq!(lines().len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();

    // Without a configured file the admin API cannot start one.
    let plain = TestGateway::simulated(1, 0.0, "").await;
    assert_eq!(
        plain
            .admin_call(Method::PUT, "/admin/record")
            .await
            .status(),
        409
    );
}

#[tokio::test]
async fn the_status_document_streams_as_events_behind_the_token_and_ends_when_the_gateway_stops() {
    let mut gw = TestGateway::simulated(2, 0.01, "").await;
    for path in ["/admin/status", "/admin/events"] {
        let refused = gw.client.get(gw.url(path)).send().await.unwrap();
        assert_eq!(refused.status(), 401, "{path}");
    }
    // The page's files need no token and hold no data.
    let page = gw.client.get(gw.url("/ui")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(
        page.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("script-src 'self'")
    );
    assert!(!page.text().await.unwrap().contains("gpu-0"));

    let status = gw.admin_json(reqwest::Method::GET, "/admin/status").await;
    let ids: Vec<&str> = status["servers"]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["gpu-0", "gpu-1"]);
    let shares: f64 = status["servers"]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["ring_share"].as_f64().unwrap())
        .sum();
    assert!(
        (shares - 1.0).abs() < 1e-9,
        "the ring shares sum to one: {shares}"
    );

    let events = gw.admin_call(reqwest::Method::GET, "/admin/events").await;
    assert_eq!(events.status(), 200);
    assert_eq!(events.headers()["content-type"], "text/event-stream");
    let mut body = events.bytes_stream();
    let mut text = String::new();
    // The first document at once; after a request fails, the next one lists the error.
    while !text.contains("\n\n") {
        text.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
    }
    assert!(text.starts_with("event: status\ndata: {"), "{text}");
    let refused = gw
        .client
        .post(gw.url("/v1/messages"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let request_id = refused.headers()["request-id"].to_str().unwrap().to_owned();
    let next = tokio::time::timeout(Duration::from_secs(10), async {
        let mut text = String::new();
        while !text.contains(&request_id) {
            text.push_str(std::str::from_utf8(&body.next().await.unwrap().unwrap()).unwrap());
        }
        text
    })
    .await
    .expect("the error arrives as an event");
    assert!(next.contains("invalid_request_error"), "{next}");

    // Stopping the gateway ends the stream (a graceful shutdown does not wait on the page).
    gw.stop();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(chunk) = body.next().await {
            if chunk.is_err() {
                break;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the event stream outlived the gateway");
}

/// Every path the route tables answer is named in the documentation (`docs/admin-api.md` for
/// the admin API, `docs/api.md` for the client's), so the endpoint tables cannot fall behind
/// the code again: the literals are read from the route tables' own source.
#[test]
fn every_route_is_documented() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let literals = |source: &str, prefix: &str| -> Vec<String> {
        let mut found: Vec<String> = source
            .split('"')
            .skip(1)
            .step_by(2)
            .filter(|s| s.starts_with(prefix) && !s.contains(' '))
            .map(|s| s.trim_end_matches('/').to_owned())
            .collect();
        found.sort();
        found.dedup();
        found
    };
    let admin_doc = read("docs/admin-api.md");
    let admin = literals(&read("host/admin/src/lib.rs"), "/admin/");
    assert!(admin.len() >= 15, "{admin:?}");
    let missing: Vec<&String> = admin
        .iter()
        .filter(|p| !admin_doc.contains(p.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/admin-api.md does not name {missing:?}"
    );
    let api_doc = read("docs/api.md");
    let mut client = literals(&read("host/gateway/src/service.rs"), "/v1/");
    client.extend(["/healthz", "/readyz", "/metrics"].map(str::to_owned));
    let missing: Vec<&String> = client
        .iter()
        .filter(|p| !api_doc.contains(p.as_str()))
        .collect();
    assert!(missing.is_empty(), "docs/api.md does not name {missing:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_tenants_change_without_a_restart_under_the_operate_scope() {
    let gw = TestGateway::start(
        "[[api_keys]]\nkey = \"sk-config-key-01\"\n\
         [[admin.tokens]]\nname = \"viewer\"\ntoken = \"viewer-token-0123456789\"\nscopes = [\"read\"]\n\
         [simulator]\ntime_scale = 0.01\n[[servers]]\naddress = \"sim://gpu-0\"\n",
    )
    .await;
    let post = async |path: &str, body: Value| {
        gw.admin(Method::POST, path)
            .await
            .json(&body)
            .send()
            .await
            .unwrap()
    };
    let ask = async |key: &str| {
        gw.client
            .post(gw.url("/v1/messages"))
            .header("x-api-key", key)
            .json(&hello(2))
            .send()
            .await
            .unwrap()
            .status()
            .as_u16()
    };
    // A viewer may list but not change.
    let refused = gw
        .client
        .post(gw.url("/admin/keys"))
        .bearer_auth("viewer-token-0123456789")
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 403);
    assert!(refused.text().await.unwrap().contains("operate"));
    // A key for a tenant that does not exist is refused; a key given in the clear too.
    assert_eq!(
        post("/admin/keys", json!({"tenant": "acme"}))
            .await
            .status(),
        400
    );
    assert_eq!(
        post("/admin/keys", json!({"key": "sk-chosen-by-me"}))
            .await
            .status(),
        400
    );
    assert_eq!(
        post(
            "/admin/tenants",
            json!({"name": "acme", "requests_per_minute": 2})
        )
        .await
        .status(),
        201
    );
    let added: Value = post("/admin/keys", json!({"tenant": "acme", "tier": "gold"}))
        .await
        .json()
        .await
        .unwrap();
    let key = added["key"].as_str().unwrap().to_owned();
    let id = added["id"].as_str().unwrap().to_owned();
    // The tenant's limit holds for the new key at once, and a raised limit at once too.
    assert_eq!(ask(&key).await, 200);
    assert_eq!(ask(&key).await, 200);
    assert_eq!(ask(&key).await, 429);
    assert_eq!(
        post(
            "/admin/tenants",
            json!({"name": "acme", "requests_per_minute": 1000})
        )
        .await
        .status(),
        201
    );
    assert_eq!(ask(&key).await, 200);
    let tenants = gw.admin_json(Method::GET, "/admin/tenants").await;
    assert_eq!(tenants["tenants"][0]["requests_per_minute"], 1000);
    // Removed: refused at once; the configured key still admits.
    assert_eq!(
        gw.admin_call(Method::DELETE, &format!("/admin/keys/{id}"))
            .await
            .status(),
        200
    );
    assert_eq!(ask(&key).await, 401);
    assert_eq!(ask("sk-config-key-01").await, 200);
    assert_eq!(
        gw.admin_call(Method::DELETE, "/admin/keys/0000000000000000")
            .await
            .status(),
        404
    );
    assert_eq!(
        gw.admin_call(Method::DELETE, "/admin/tenants/acme")
            .await
            .status(),
        200
    );
    // Each change is in the audit trail, with the token's name.
    let audit = gw.admin_json(Method::GET, "/admin/audit").await;
    let paths: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.contains(&"/admin/tenants") && paths.contains(&"/admin/keys"),
        "{audit}"
    );
    // Each names what it changed: the tenant, the key by id with its tenant (a removed key
    // too, looked up before it went).
    let objects: Vec<&Value> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["status"].as_u64().unwrap() < 300)
        .map(|e| &e["object"])
        .collect();
    assert_eq!(objects[0], &json!({"tenant": "acme"}), "{audit}");
    assert_eq!(
        objects[1],
        &json!({"key": {"id": id, "tenant": "acme"}}),
        "{audit}"
    );
    assert!(
        objects.contains(&&json!({"key": {"id": id, "tenant": "acme", "tier": "gold"}})),
        "{audit}"
    );
}

#[tokio::test]
async fn the_cache_figures_add_up_in_one_unit_and_an_idle_servers_kv_shows_what_it_keeps() {
    let gw = TestGateway::simulated(1, 0.01, "").await;
    // One system prompt of 8-letter words for every turn: estimated at 4 bytes a token, it is
    // twice what the simulated server counts (a word a token), as a Claude Code prompt's
    // tools are a third of its estimate and none of a simulated server's count.
    let system = "abcdefgh ".repeat(1_500);
    for turn in 0..6 {
        let body = json!({"model": "sim-llama-3-8b", "max_tokens": 4, "system": system,
            "messages": [{"role": "user", "content": format!("question {turn}")}]});
        assert_eq!(gw.post_messages(&body).await.status(), 200);
    }
    let experiments = gw.admin_json(Method::GET, "/admin/experiments").await;
    let cached = &experiments["variants"][0]["cached_tokens"];
    let figure = |name: &str| cached[name].as_u64().unwrap();
    assert!(figure("prompt") >= 6 * 1_500, "{cached}");
    assert!(
        figure("achieved") > 0,
        "later turns found their prefix: {cached}"
    );
    // Summed at each decision in the estimate's tokens, achieved read about 16,000 beside a
    // prompt of about 9,000.
    assert!(
        figure("achieved") <= figure("reachable") && figure("reachable") <= figure("prompt"),
        "{cached}"
    );
    // The server is idle now: no block used, its session's prefix cached, beside its hit
    // ratio.
    let idle = eventually(Duration::from_secs(5), async || {
        let status = gw.admin_json(Method::GET, "/admin/status").await;
        status["servers"]["servers"][0]["kv_cache"]["used"] == 0
    })
    .await;
    assert!(idle, "the server went idle");
    let status = gw.admin_json(Method::GET, "/admin/status").await;
    let server = &status["servers"]["servers"][0];
    let kv = &server["kv_cache"];
    assert!(kv["cached"].as_u64().unwrap() >= 1_500 / 16, "{kv}");
    assert!(
        server["engine"]["prefix_cache_hit_ratio"].as_f64().unwrap() > 0.5,
        "{server}"
    );
    let summary = kv["summary"].as_str().unwrap();
    assert!(
        summary.starts_with("0 used, ") && summary.contains(" cached / "),
        "{summary}"
    );
    assert_eq!(
        kv["used"].as_u64().unwrap()
            + kv["cached"].as_u64().unwrap()
            + kv["free"].as_u64().unwrap(),
        kv["total"].as_u64().unwrap()
    );
}
