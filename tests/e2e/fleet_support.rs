//! A fleet on loopback: a Redis of the test's own (Debian's `redis-server`, on a unix socket
//! in a temporary directory, its data kept in an append-only file so that a restart keeps the
//! log) and gateway replicas as real `ringmaster serve --cluster` processes.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{ADMIN_TOKEN, eventually};

/// A `redis-server` of the test's own.
pub struct TestRedis {
    dir: PathBuf,
    child: Option<Child>,
}

impl TestRedis {
    /// Starts one in a fresh directory.
    pub async fn start(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "ringmaster-fleet-{name}-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let mut redis = Self { dir, child: None };
        redis.spawn().await;
        redis
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("redis.sock")
    }

    /// The URL replicas join.
    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket().display())
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", "0", "--unixsocket"])
            .arg(self.socket())
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect(
                "redis-server is not installed: `apt-get install redis-server` (tests/run does it)",
            );
        self.child = Some(child);
        let socket = self.socket();
        assert!(
            eventually(Duration::from_secs(10), async || {
                std::os::unix::net::UnixStream::connect(&socket).is_ok()
            })
            .await,
            "redis-server did not start on {}",
            socket.display()
        );
    }

    /// Kills it (SIGKILL: no goodbye to its clients).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Starts it again on the same socket and data.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A gateway replica: a `ringmaster serve` process.
pub struct Replica {
    pub name: String,
    pub base: String,
    pub client: reqwest::Client,
    child: Option<Child>,
}

impl Replica {
    /// Starts `ringmaster serve -c CONFIG` (with `--cluster URL` when given) as `name`, and
    /// waits until it answers.
    pub async fn start(config: &Path, cluster: Option<&str>, name: &str) -> Self {
        let port = free_port();
        let mut command = Command::new(ringmaster_bin());
        command
            .args(["serve", "-c"])
            .arg(config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--replica", name])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(url) = cluster {
            command.args(["--cluster", url]);
        }
        let child = command.spawn().expect("ringmaster serve starts");
        let replica = Self {
            name: name.to_owned(),
            base: format!("http://127.0.0.1:{port}"),
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()
                .unwrap(),
            child: Some(child),
        };
        let health = replica.url("/healthz");
        let client = replica.client.clone();
        assert!(
            eventually(Duration::from_secs(30), async || {
                client
                    .get(&health)
                    .send()
                    .await
                    .is_ok_and(|r| r.status() == 200)
            })
            .await,
            "replica {name} did not start"
        );
        replica
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// An admin call.
    pub fn admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, self.url(path))
            .header("x-admin-token", ADMIN_TOKEN)
    }

    /// An admin call's JSON answer.
    pub async fn admin_json(&self, method: reqwest::Method, path: &str) -> Value {
        self.admin(method, path)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// What `/admin/route/explain` decides for `body` with `x-session-id: session`:
    /// (variant, chosen server).
    pub async fn explain(&self, body: &Value, session: &str) -> (Value, Value) {
        let explained: Value = self
            .admin(reqwest::Method::POST, "/admin/route/explain")
            .header("x-session-id", session)
            .json(body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (explained["variant"].clone(), explained["chosen"].clone())
    }

    /// Kills it (SIGKILL: no lease dropped, no goodbye).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A config file for replicas: admin token, the simulated servers, and `extra`.
pub fn fleet_config(dir_name: &str, servers: usize, time_scale: f64, extra: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "ringmaster-fleet-config-{dir_name}-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut toml = format!(
        "admin_token = \"{ADMIN_TOKEN}\"\n{extra}\n[simulator]\ntime_scale = {time_scale}\n"
    );
    for i in 0..servers {
        toml.push_str(&format!("[[servers]]\naddress = \"sim://gpu-{i}\"\n"));
    }
    let path = dir.join("gateway.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// The `ringmaster` binary beside this test binary (`target/debug/ringmaster`), which the
/// workspace build makes.
pub fn ringmaster_bin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let debug = exe.parent().and_then(Path::parent).unwrap();
    let bin = debug.join("ringmaster");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (cargo build -p ringmaster; tests/run does)",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
