//! Starting a gateway on a loopback port, and small client helpers.

use std::net::SocketAddr;
use std::time::Duration;

use ringmaster_gateway::{Gateway, RawConfig};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// The admin token every test gateway uses.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

/// A gateway serving on a loopback port until dropped.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub client: reqwest::Client,
    shutdown: Option<oneshot::Sender<()>>,
}

impl TestGateway {
    /// Starts a gateway from TOML, with `admin_token` set and listen on 127.0.0.1:0 unless the
    /// TOML says otherwise.
    pub async fn start(toml: &str) -> Self {
        Self::start_with_env(toml, |_| None).await
    }

    /// [`Self::start`] with the environment the configuration reads (`api_key_env`).
    pub async fn start_with_env(toml: &str, env: impl Fn(&str) -> Option<String>) -> Self {
        let mut raw = RawConfig::from_toml(toml).expect("test config parses");
        raw.listen.get_or_insert_with(|| "127.0.0.1:0".to_owned());
        raw.admin_token
            .get_or_insert_with(|| ADMIN_TOKEN.to_owned());
        let config = raw.validate_with_env(env).expect("test config is valid");
        let listener = TcpListener::bind(config.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gateway = Gateway::start(config).expect("gateway starts");
        ringmaster_admin::mount(&gateway);
        let (tx, rx) = oneshot::channel();
        tokio::spawn(ringmaster_gateway::serve(gateway, listener, async {
            let _ = rx.await;
        }));
        Self {
            addr,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            shutdown: Some(tx),
        }
    }

    /// `servers` simulated servers at `time_scale`, after the TOML in `extra`.
    pub async fn simulated(servers: usize, time_scale: f64, extra: &str) -> Self {
        let scale = format!("[simulator]\ntime_scale = {time_scale}\n");
        let mut toml = if extra.contains("[simulator]\n") {
            extra.replace("[simulator]\n", &scale)
        } else {
            format!("{extra}\n{scale}")
        };
        toml.push('\n');
        for i in 0..servers {
            toml.push_str(&format!("[[servers]]\naddress = \"sim://gpu-{i}\"\n"));
        }
        Self::start(&toml).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn post_messages(&self, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url("/v1/messages"))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    /// A `POST /v1/chat/completions` (the OpenAI door) with `body`.
    pub async fn post_chat(&self, body: &Value) -> reqwest::Response {
        self.client
            .post(self.url("/v1/chat/completions"))
            .json(body)
            .send()
            .await
            .unwrap()
    }

    pub async fn admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, self.url(path))
            .bearer_auth(ADMIN_TOKEN)
    }

    /// Sends an admin request without a body.
    pub async fn admin_call(&self, method: reqwest::Method, path: &str) -> reqwest::Response {
        self.admin(method, path).await.send().await.unwrap()
    }

    /// Sends an admin request without a body and reads its JSON answer.
    pub async fn admin_json(&self, method: reqwest::Method, path: &str) -> Value {
        self.admin_call(method, path).await.json().await.unwrap()
    }

    /// `GET path` without credentials, read as JSON.
    pub async fn get_json(&self, path: &str) -> Value {
        self.client
            .get(self.url(path))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn servers(&self) -> Value {
        self.admin_json(reqwest::Method::GET, "/admin/servers")
            .await
    }

    pub async fn metrics(&self) -> String {
        get_text(&self.client, &self.url("/metrics")).await
    }
}

/// The body of `GET url`, as text.
pub async fn get_text(client: &reqwest::Client, url: &str) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

impl TestGateway {
    /// Stops taking connections and drains, as on SIGTERM.
    pub fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A minimal valid Messages body.
pub fn hello(max_tokens: u32) -> Value {
    json!({
        "model": "sim-llama-3-8b",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Hello there"}],
    })
}

/// Sums a metric family's samples whose label text contains `labels` (empty = all).
pub fn metric_sum(text: &str, name: &str, labels: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let series_name = series.split('{').next()?;
            (series_name == name && series.contains(labels)).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Parses an SSE body into (event, data) pairs.
pub fn sse_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|frame| !frame.trim().is_empty())
        // Comment-only frames (`: ping` keep-alives) carry no event.
        .filter(|frame| frame.lines().any(|l| !l.starts_with(':')))
        .map(|frame| {
            let mut event = String::new();
            let mut data = String::new();
            for line in frame.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    event = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            (
                event,
                serde_json::from_str(&data).expect("SSE data is JSON"),
            )
        })
        .collect()
}

/// Polls `check` until it returns true or `timeout` passes.
pub async fn eventually(timeout: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `path` when it is a file; otherwise `None` with a note, or a failure when `require` (an
/// environment variable `tests/run` sets) is set: `make` says how to get the file.
pub fn required_file(
    path: std::path::PathBuf,
    require: &str,
    make: &str,
) -> Option<std::path::PathBuf> {
    if path.is_file() {
        return Some(path);
    }
    assert!(
        std::env::var_os(require).is_none(),
        "{require} is set but {} is missing: {make}",
        path.display()
    );
    eprintln!("skipping: {} is missing ({make})", path.display());
    None
}

/// SmolLM2's path (`RINGMASTER_MODEL`, else the cache `cargo xtask model` fills), or `None`
/// with a note when it is missing; a missing model fails instead when
/// `RINGMASTER_REQUIRE_MODEL` is set, as in `tests/run`.
pub fn model_path() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("RINGMASTER_MODEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(ringmaster_gpu_runtime::model::default_model_path);
    required_file(path, "RINGMASTER_REQUIRE_MODEL", "run `cargo xtask model`")
}
