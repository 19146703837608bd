//! The gateway over TLS, with certificates made here (`rcgen`): both doors over HTTPS with
//! HTTP/1.1 and HTTP/2 (and curl's HTTP/2), the certificate rotated every second under load
//! with no failed request and the new certificate seen by new connections, a client without
//! a certificate refused on a mutual-TLS listener, and the admin API on a listener of its own.
//! Errors answered before a large body is read reach curl over HTTP/2 whole. A server whose
//! certificate is a self-signed CA is named with why in `/admin/servers`, and
//! `check-config --probe` says per server whether its TLS works.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use ringmaster_gateway::{Gateway, RawConfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::{Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::support::ADMIN_TOKEN;

/// A test CA and the certificates it signs.
struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        Self {
            issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap(),
        }
    }

    /// A certificate for `localhost` and 127.0.0.1: (cert PEM, key PEM, cert DER).
    fn leaf(&self) -> (String, String, CertificateDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().clone())
    }

    fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf, CertificateDer<'static>) {
        let (cert, key, der) = self.leaf();
        let cert_path = dir.join(format!("{name}.crt"));
        let key_path = dir.join(format!("{name}.key"));
        std::fs::write(&cert_path, cert).unwrap();
        std::fs::write(&key_path, key).unwrap();
        (cert_path, key_path, der)
    }

    fn write_ca(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, self.issuer.pem()).unwrap();
        path
    }
}

/// A rustls client trusting `ca`, offering h2 and HTTP/1.1, with an identity for mutual TLS.
fn client_config(ca: &Ca, identity: Option<(String, String)>) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.issuer.der().clone()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// An HTTPS client over one TLS connection, HTTP/2 or HTTP/1.1 as ALPN agreed (hyper's own
/// client: the tests' reqwest is built without TLS).
enum Https {
    One(hyper::client::conn::http1::SendRequest<http_body_util::Full<bytes::Bytes>>),
    Two(hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>),
}

/// A reply: its status, the HTTP version and the body.
type Reply = (u16, hyper::Version, bytes::Bytes);

impl Https {
    /// Connects to `addr` as `localhost` with `config`.
    async fn connect(
        config: &Arc<rustls::ClientConfig>,
        addr: SocketAddr,
    ) -> std::io::Result<Self> {
        let tcp = TcpStream::connect(addr).await?;
        let tls = tokio_rustls::TlsConnector::from(config.clone())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = hyper_util::rt::TokioIo::new(tls);
        let broken = |e: hyper::Error| std::io::Error::other(e.to_string());
        Ok(if h2 {
            let (send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .map_err(broken)?;
            tokio::spawn(conn);
            Self::Two(send)
        } else {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(broken)?;
            tokio::spawn(conn);
            Self::One(send)
        })
    }

    /// `method path` with `body` (JSON when there is one) and an admin token when asked.
    async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        admin: bool,
    ) -> std::io::Result<Reply> {
        use http_body_util::BodyExt;
        let mut request = http::Request::builder()
            .method(method)
            .header("host", "localhost")
            .header("content-type", "application/json");
        if admin {
            request = request.header("authorization", format!("Bearer {ADMIN_TOKEN}"));
        }
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let broken = |e: hyper::Error| std::io::Error::other(e.to_string());
        let response = match self {
            Self::One(send) => {
                let request = request
                    .uri(path)
                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                    .unwrap();
                send.send_request(request).await.map_err(broken)?
            }
            Self::Two(send) => {
                let request = request
                    .uri(format!("https://localhost{path}"))
                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                    .unwrap();
                send.send_request(request).await.map_err(broken)?
            }
        };
        let status = response.status().as_u16();
        let version = response.version();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(broken)?
            .to_bytes();
        Ok((status, version, bytes))
    }
}

/// One request on a new connection.
async fn once(
    config: &rustls::ClientConfig,
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> std::io::Result<Reply> {
    let config = Arc::new(config.clone());
    Https::connect(&config, addr)
        .await?
        .send(method, path, body, path.starts_with("/admin"))
        .await
}

/// A gateway from `toml` (simulated servers), its public and (if configured) admin
/// addresses; stops when the sender drops.
async fn start(toml: &str) -> (SocketAddr, Option<SocketAddr>, oneshot::Sender<()>) {
    let mut raw = RawConfig::from_toml(toml).unwrap();
    raw.listen = Some("127.0.0.1:0".into());
    raw.admin_token = Some(ADMIN_TOKEN.into());
    let config = raw.validate_with_env(|_| None).unwrap();
    let listener = TcpListener::bind(config.listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let admin = match &config.admin_listener {
        Some(admin) => Some(TcpListener::bind(admin.listen).await.unwrap()),
        None => None,
    };
    let admin_addr = admin.as_ref().map(|l| l.local_addr().unwrap());
    let gateway = Gateway::start(config).unwrap();
    ringmaster_admin::mount(&gateway);
    let (tx, rx) = oneshot::channel::<()>();
    let (admin_tx, admin_rx) = oneshot::channel::<()>();
    if let Some(admin) = admin {
        tokio::spawn(ringmaster_gateway::serve_admin(
            gateway.clone(),
            admin,
            async move {
                let _ = admin_rx.await;
            },
        ));
    }
    tokio::spawn(ringmaster_gateway::serve(gateway, listener, async move {
        let _ = rx.await;
        drop(admin_tx);
    }));
    (addr, admin_addr, tx)
}

const SIMULATED: &str = "models = [\"sim-llama-3-8b\"]\n[simulator]\ntime_scale = 0.01\n[[servers]]\naddress = \"sim://gpu-0\"\n";

fn messages() -> Value {
    json!({"model": "sim-llama-3-8b", "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hello over TLS"}]})
}

/// The certificate a new connection to `addr` is shown.
async fn presented(ca: &Ca, addr: SocketAddr) -> CertificateDer<'static> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config(ca, None)));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let stream = connector
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

#[tokio::test]
async fn both_doors_answer_over_https_with_http1_and_http2() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key, _) = ca.write(dir.path(), "gateway");
    let toml = format!(
        "{SIMULATED}[tls]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    let (addr, _, _stop) = start(&toml).await;
    let h2 = client_config(&ca, None);
    let (status, version, body) = once(&h2, addr, "POST", "/v1/messages", Some(&messages()))
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert_eq!(version, hyper::Version::HTTP_2, "ALPN chose h2");
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["type"], "message");
    // HTTP/1.1 over TLS, the OpenAI door.
    let mut http1 = client_config(&ca, None);
    http1.alpn_protocols = vec![b"http/1.1".to_vec()];
    let (status, version, _) = once(
        &http1,
        addr,
        "POST",
        "/v1/chat/completions",
        Some(&messages()),
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(version, hyper::Version::HTTP_11);
    // Plain HTTP on a TLS port: no answer, and the failed handshake is counted.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/healthz", addr.port()))
        .send()
        .await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success());
    let (_, _, metrics) = once(&h2, addr, "GET", "/metrics", None).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        crate::support::metric_sum(&metrics, "ringmaster_tls_handshake_failures_total", "") >= 1.0,
        "{metrics}"
    );
    // curl, HTTP/2 over TLS with the test CA.
    let ca_file = ca.write_ca(dir.path(), "ca.pem");
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--http2",
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code}",
        ])
        .arg("--cacert")
        .arg(&ca_file)
        .args(["-H", "content-type: application/json", "-d"])
        .arg(messages().to_string())
        .arg(format!("https://localhost:{}/v1/messages", addr.port()))
        .output()
        .await
        .expect("curl runs");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "2 200",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn a_certificate_rotated_every_second_under_load_fails_no_request() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key, first) = ca.write(dir.path(), "gateway");
    let toml = format!(
        "{SIMULATED}[tls]\ncert = {:?}\nkey = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    let (addr, _, _stop) = start(&toml).await;
    assert_eq!(presented(&ca, addr).await, first);
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let (stop_load, load_stopped) = tokio::sync::watch::channel(false);
    // Four clients: two keep their connection (one HTTP/2, one HTTP/1.1), two open a new one
    // for every request (each a handshake with whatever pair is current).
    let mut load = Vec::new();
    for (reuse, alpn) in [
        (true, "h2"),
        (true, "http/1.1"),
        (false, "h2"),
        (false, "http/1.1"),
    ] {
        let mut config = client_config(&ca, None);
        config.alpn_protocols = vec![alpn.as_bytes().to_vec()];
        let config = Arc::new(config);
        let (ok, failed) = (ok.clone(), failed.clone());
        let stopped = load_stopped.clone();
        load.push(tokio::spawn(async move {
            let mut kept: Option<Https> = None;
            while !*stopped.borrow() {
                let answer = async {
                    let mut conn = match kept.take() {
                        Some(conn) if reuse => conn,
                        _ => Https::connect(&config, addr).await?,
                    };
                    let reply = conn
                        .send("POST", "/v1/messages", Some(&messages()), false)
                        .await;
                    if reuse {
                        kept = Some(conn);
                    }
                    reply
                }
                .await;
                if matches!(answer, Ok((200, _, _))) {
                    ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let mut last = first;
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (cert_pem, key_pem, der) = ca.leaf();
        // The key first, then the certificate: a watcher that looks between the two writes
        // sees a mismatched pair, refuses it and keeps the old one until both are there.
        std::fs::write(&key, key_pem).unwrap();
        std::fs::write(&cert, cert_pem).unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let seen = presented(&ca, addr).await;
            if seen == der {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the new certificate is not served within 5 s"
            );
            assert!(seen == last, "only the old pair until the new one");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        last = der;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    stop_load.send(true).unwrap();
    for task in load {
        task.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    assert!(ok > 20, "load ran: {ok} requests");
    assert_eq!(failed, 0, "{failed} of {} requests failed", ok + failed);
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate_and_the_admin_api_has_its_own_listener()
{
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("server CA");
    let clients = Ca::new("client CA");
    let (cert, key, _) = ca.write(dir.path(), "gateway");
    let client_ca = clients.write_ca(dir.path(), "clients.pem");
    let toml = format!(
        "{SIMULATED}[tls]\ncert = {cert:?}\nkey = {key:?}\nclient_ca = {client_ca:?}\n[admin]\nlisten = \"127.0.0.1:0\"\n",
        cert = cert.display().to_string(),
        key = key.display().to_string(),
        client_ca = client_ca.display().to_string(),
    );
    let (addr, admin, _stop) = start(&toml).await;
    let admin = admin.expect("an admin listener");
    // No client certificate: refused in the handshake (TLS 1.3 tells the client at its first
    // read).
    let refused = once(
        &client_config(&ca, None),
        addr,
        "POST",
        "/v1/messages",
        Some(&messages()),
    )
    .await;
    assert!(refused.is_err(), "{refused:?}");
    // A certificate of another CA: refused too.
    let (stranger_cert, stranger_key, _) = ca.leaf();
    let refused = once(
        &client_config(&ca, Some((stranger_cert, stranger_key))),
        addr,
        "POST",
        "/v1/messages",
        Some(&messages()),
    )
    .await;
    assert!(refused.is_err(), "{refused:?}");
    // One the client CA signed: served.
    let (client_cert, client_key, _) = clients.leaf();
    let config = client_config(&ca, Some((client_cert, client_key)));
    let (status, _, _) = once(&config, addr, "POST", "/v1/messages", Some(&messages()))
        .await
        .unwrap();
    assert_eq!(status, 200);
    // The admin API is not on the public listener...
    let (status, _, body) = once(&config, addr, "GET", "/admin/servers", None)
        .await
        .unwrap();
    assert_eq!(status, 404);
    assert!(String::from_utf8_lossy(&body).contains("[admin] listen"));
    // ...but on its own (plain HTTP here: [admin] names no certificate), which serves no door.
    let admin_base = format!("http://{admin}");
    let plain = reqwest::Client::new();
    let servers: Value = plain
        .get(format!("{admin_base}/admin/servers"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        servers["servers"].as_array().map(Vec::len),
        Some(1),
        "{servers}"
    );
    let door = plain
        .post(format!("{admin_base}/v1/messages"))
        .json(&messages())
        .send()
        .await
        .unwrap();
    assert_eq!(door.status(), 404);
    let health = plain
        .get(format!("{admin_base}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
}

/// A fake server's TLS: `ca`'s certificate for localhost, and when `clients` is given, a
/// client certificate of that CA demanded.
fn upstream_tls(dir: &Path, ca: &Ca, clients: Option<&Ca>) -> Arc<rustls::ServerConfig> {
    let (cert, key, _) = ca.write(dir, "upstream");
    let chain = CertificateDer::pem_file_iter(&cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match clients {
        None => builder.with_no_client_auth(),
        Some(clients) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(clients.issuer.der().clone()).unwrap();
            builder.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .unwrap(),
            )
        }
    };
    let mut config = builder.with_single_cert(chain, key).unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_server_with_its_own_ca_a_client_certificate_and_credentials() {
    use ringmaster_tests::fake_upstream::{Behavior, Demands, FakeUpstream};

    use crate::support::{TestGateway, eventually};
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("upstream CA");
    let client_ca = Ca::new("gateway clients CA");
    let other_ca = Ca::new("someone else's CA");
    let ca_file = server_ca.write_ca(dir.path(), "upstream-ca.pem");
    let other_ca_file = other_ca.write_ca(dir.path(), "other-ca.pem");
    let (client_cert, client_key, _) = client_ca.write(dir.path(), "gateway-client");
    let upstream = FakeUpstream::serve_demanding(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Behavior::OpenAi,
        3,
        Demands {
            tls: Some(upstream_tls(dir.path(), &server_ca, Some(&client_ca))),
            headers: vec![
                ("authorization".into(), "Bearer sk-upstream-secret".into()),
                ("x-org".into(), "acme-secret-org".into()),
            ],
        },
    );
    // Read over TLS with the credentials, like every request: the engine's load comes from
    // its /metrics.
    upstream.set_metrics(Some(
        "# TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{engine=\"0\",model_name=\"fake\"} 2.0\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{engine=\"0\",model_name=\"fake\"} 5.0\n",
    ));
    let env = |name: &str| (name == "UPSTREAM_KEY").then(|| "sk-upstream-secret".to_owned());
    let config = |ca: &Path, client: bool, org: &str| {
        let mut toml = format!(
            "models = [\"fake\"]\n[[servers]]\nid = \"hosted\"\naddress = \"{}\"\n\
             ca_file = \"{}\"\napi_key_env = \"UPSTREAM_KEY\"\nheaders = {{ \"x-org\" = \"{org}\" }}\n",
            upstream.https_url(),
            ca.display()
        );
        if client {
            toml.push_str(&format!(
                "client_cert = \"{}\"\nclient_key = \"{}\"\n",
                client_cert.display(),
                client_key.display()
            ));
        }
        toml
    };
    let chat = json!({"model": "fake", "max_tokens": 3,
        "messages": [{"role": "user", "content": "Hello over https"}]});

    // Everything right: the request goes through, and the polls carry the credentials too.
    let gw = TestGateway::start_with_env(&config(&ca_file, true, "acme-secret-org"), env).await;
    let response = gw.post_chat(&chat).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    let body: Value = response.json().await.unwrap();
    assert!(
        !body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    let hosted = async || gw.servers().await["servers"][0].clone();
    assert!(
        eventually(Duration::from_secs(5), async || {
            hosted().await["engine"]["waiting"] == 5
        })
        .await,
        "the load was not read over TLS: {}",
        hosted().await
    );
    assert_eq!(upstream.unauthorized.load(Ordering::Relaxed), 0);
    // Shown by name only, never by value.
    let shown = gw.servers().await.to_string();
    assert_eq!(
        hosted().await["access"],
        json!({"tls": true, "ca_file": ca_file.display().to_string(),
            "client_cert": client_cert.display().to_string(),
            "api_key_env": "UPSTREAM_KEY", "headers": ["x-org"]})
    );
    assert!(
        !shown.contains("sk-upstream-secret") && !shown.contains("acme-secret-org"),
        "{shown}"
    );
    drop(gw);

    // HTTP/2 to it, agreed by ALPN (`[upstream] http2`): the same request, the same checks.
    let before = upstream.requests.load(Ordering::Relaxed);
    let gw = TestGateway::start_with_env(
        &format!(
            "{}[upstream]\nhttp2 = true\n",
            config(&ca_file, true, "acme-secret-org")
        ),
        env,
    )
    .await;
    let response = gw.post_chat(&chat).await;
    assert_eq!(response.status(), 200, "{}", response.text().await.unwrap());
    assert_eq!(upstream.requests.load(Ordering::Relaxed), before + 1);
    drop(gw);
    let answered = upstream.requests.load(Ordering::Relaxed);

    // A server's certificate from a CA the gateway was not told to trust: no request gets
    // there. Nor without the client certificate the server demands.
    for (ca, client) in [(&other_ca_file, true), (&ca_file, false)] {
        let gw = TestGateway::start_with_env(&config(ca, client, "acme-secret-org"), env).await;
        let response = gw.post_chat(&chat).await;
        assert!(response.status().is_server_error(), "{}", response.status());
        drop(gw);
    }
    assert_eq!(upstream.requests.load(Ordering::Relaxed), answered);

    // A wrong credential: the server refuses it, the client is told, nothing leaks.
    let gw = TestGateway::start_with_env(&config(&ca_file, true, "wrong-org"), env).await;
    let response = gw.post_chat(&chat).await;
    assert!(!response.status().is_success());
    let text = response.text().await.unwrap();
    assert!(!text.contains("sk-upstream-secret"), "{text}");
    assert!(upstream.unauthorized.load(Ordering::Relaxed) > 0);
}

/// A `redis-server` serving TLS only on a free loopback port with `ca`'s certificate for
/// localhost, demanding a client certificate of `clients`; killed on drop.
struct TlsRedis {
    child: std::process::Child,
    port: u16,
}

impl TlsRedis {
    async fn start(dir: &Path, ca: &Ca, clients: &Ca) -> Self {
        let (cert, key, _) = ca.write(dir, "redis");
        let clients_ca = clients.write_ca(dir, "redis-clients-ca.pem");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(&cert)
            .arg("--tls-key-file")
            .arg(&key)
            .arg("--tls-ca-cert-file")
            .arg(&clients_ca)
            .args(["--tls-auth-clients", "yes"])
            .arg("--dir")
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect(
                "redis-server is not installed: `apt-get install redis-server` (tests/run does it)",
            );
        let up = crate::support::eventually(Duration::from_secs(10), async || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        assert!(up, "redis-server did not start TLS on {port}");
        Self { child, port }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_reach_redis_over_tls_with_a_client_certificate() {
    use ringmaster_cluster::{Cluster, ClusterSpec, ClusterTls};
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("redis CA");
    let clients = Ca::new("replicas CA");
    let other = Ca::new("another CA");
    let redis = TlsRedis::start(dir.path(), &ca, &clients).await;
    let (client_cert, client_key, _) = clients.write(dir.path(), "replica");
    let ca_file = ca.write_ca(dir.path(), "redis-ca.pem");
    let other_ca_file = other.write_ca(dir.path(), "other-ca.pem");
    let spec = |ca: &Path, client: bool| {
        let mut spec = ClusterSpec::new(format!("rediss://localhost:{}/0", redis.port), "r1");
        spec.tls = ClusterTls {
            ca_file: Some(ca.to_owned()),
            client_cert: client.then(|| (client_cert.clone(), client_key.clone())),
        };
        spec
    };
    // Two replicas over TLS share the log: what one appends, the other reads.
    let one = Cluster::connect(spec(&ca_file, true), Duration::from_secs(5))
        .await
        .expect("connects over TLS with a client certificate");
    let two = Cluster::connect(spec(&ca_file, true), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(one.head().await.unwrap(), 0);
    one.append(0, &serde_json::json!({"op": "noop"}))
        .await
        .unwrap();
    assert_eq!(two.head().await.unwrap(), 1);
    // Without the client certificate Redis demands, or trusting another CA: no connection.
    for (ca, client) in [(&ca_file, false), (&other_ca_file, true)] {
        let refused = Cluster::connect(spec(ca, client), Duration::from_millis(300)).await;
        assert!(
            refused.is_err(),
            "connected with ca {ca:?}, client {client}"
        );
    }
}

/// `curl` POSTing the file `body` to `url` over HTTP/2 (prior knowledge on plain HTTP) with
/// `headers`: its exit status, the answer's status and body, and what curl said.
async fn curl_h2(url: &str, headers: &[&str], body: &Path) -> (i32, u16, String, String) {
    let mut command = tokio::process::Command::new("curl");
    command.args(["-sS", "--http2-prior-knowledge", "-w", "\n%{http_code}"]);
    for header in headers {
        command.args(["-H", header]);
    }
    let out = command
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .arg(url)
        .output()
        .await
        .expect("curl runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (answer, status) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    (
        out.status.code().unwrap_or(-1),
        status.trim().parse().unwrap_or(0),
        answer.to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http2_an_error_answered_before_the_body_is_read_reaches_curl_whole() {
    use crate::support::TestGateway;
    let gw = TestGateway::simulated(
        1,
        0.01,
        "[[api_keys]]\nkey = \"sk-the-right-key-01\"\n[limits]\nmax_body_bytes = 4194304",
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    // Bodies larger than HTTP/2's flow-control windows (1 MiB a stream here): curl is still
    // sending when the answer comes, which is when it used to lose the answer ("stream error in
    // the HTTP/2 framing layer").
    let body = |name: &str, bytes: usize| {
        let path = dir.path().join(name);
        let text = json!({"model": "sim-llama-3-8b", "max_tokens": 4,
            "messages": [{"role": "user", "content": "x".repeat(bytes)}]});
        std::fs::write(&path, text.to_string()).unwrap();
        path
    };
    let large = body("large.json", 3 << 20);
    let too_large = body("too-large.json", 6 << 20);
    let url = gw.url("/v1/messages");
    let json = "content-type: application/json";
    for (case, headers, file, status, says) in [
        (
            "a wrong key",
            vec!["x-api-key: sk-not-the-key-0000", json],
            &large,
            401,
            "authentication_error",
        ),
        (
            "a body that is no JSON",
            vec!["x-api-key: sk-the-right-key-01", "content-type: text/plain"],
            &large,
            415,
            "content-type must be application/json",
        ),
        (
            "a body over the limit",
            vec!["x-api-key: sk-the-right-key-01", json],
            &too_large,
            413,
            "larger than this gateway's limit",
        ),
    ] {
        for _ in 0..3 {
            let (code, got, answer, stderr) = curl_h2(&url, &headers, file).await;
            assert_eq!(code, 0, "{case}: curl failed: {stderr}");
            assert_eq!(got, status, "{case}: {answer} {stderr}");
            let error: Value = serde_json::from_str(&answer)
                .unwrap_or_else(|e| panic!("{case}: the error body is JSON ({e}): {answer:?}"));
            assert!(error.to_string().contains(says), "{case}: {error}");
        }
    }
    // And the right request on the same gateway is served.
    let (code, got, _, stderr) = curl_h2(
        &url,
        &["x-api-key: sk-the-right-key-01", json],
        &body("small.json", 100),
    )
    .await;
    assert_eq!((code, got), (0, 200), "{stderr}");
}

/// A certificate for localhost made as newcomers make one, in one step: self-signed, with
/// CA:TRUE. Its PEM file under `dir`, and a fake server's TLS serving it.
fn self_signed_ca_as_server(dir: &Path) -> (PathBuf, Arc<rustls::ServerConfig>) {
    let key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    let path = dir.join("self-signed.pem");
    std::fs::write(&path, cert.pem()).unwrap();
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (path, Arc::new(config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_self_signed_ca_certificate_on_an_https_server_is_named_with_why_in_admin_servers() {
    use ringmaster_tests::fake_upstream::{Behavior, Demands, FakeUpstream};

    use crate::support::{TestGateway, eventually};
    let dir = tempfile::tempdir().unwrap();
    let (ca_file, tls) = self_signed_ca_as_server(dir.path());
    let upstream = FakeUpstream::serve_demanding(
        TcpListener::bind("127.0.0.1:0").await.unwrap(),
        Behavior::OpenAi,
        3,
        Demands {
            tls: Some(tls),
            headers: Vec::new(),
        },
    );
    let gw = TestGateway::start(&format!(
        "models = [\"fake\"]\n[[servers]]\nid = \"hosted\"\naddress = \"{}\"\nca_file = \"{}\"\n",
        upstream.https_url(),
        ca_file.display()
    ))
    .await;
    let chat = json!({"model": "fake", "max_tokens": 3,
        "messages": [{"role": "user", "content": "Hello over https"}]});
    let response = gw.post_chat(&chat).await;
    assert_eq!(response.status(), 503);
    // The operator reads which server, that TLS failed, and what to do about it.
    let health = async || gw.servers().await["servers"][0]["health"].clone();
    let named = eventually(Duration::from_secs(5), async || {
        health().await["reason"]
            .as_str()
            .is_some_and(|r| r.contains("TLS handshake failed"))
    })
    .await;
    let health = health().await;
    assert!(named, "no reason given: {health}");
    assert_eq!(health["reachable"], false, "{health}");
    for said in [&health["reason"], &health["last_error"]["message"]] {
        let said = said.as_str().unwrap();
        assert!(
            said.contains("is a CA certificate used as a server certificate")
                && said.contains("make a CA and a leaf certificate signed by it"),
            "{said}"
        );
    }
    assert!(health["last_error"]["at_unix_ms"].as_u64().unwrap() > 0);
    assert_eq!(upstream.requests.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_config_probe_says_per_server_whether_its_tls_works_and_why_not() {
    use ringmaster_tests::fake_upstream::{Behavior, Demands, FakeUpstream};
    let dir = tempfile::tempdir().unwrap();
    let (self_signed, bad_tls) = self_signed_ca_as_server(dir.path());
    let serve = |tls| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        FakeUpstream::serve_demanding(
            TcpListener::from_std(listener).unwrap(),
            Behavior::OpenAi,
            3,
            Demands {
                tls: Some(tls),
                headers: Vec::new(),
            },
        )
    };
    let bad = serve(bad_tls);
    // Made as docs/deploying.md says: a CA, and a leaf it signs.
    let ca = Ca::new("upstream CA");
    let ca_file = ca.write_ca(dir.path(), "upstream-ca.pem");
    let good = serve(upstream_tls(dir.path(), &ca, None));
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "models = [\"fake\"]\n\
             [[servers]]\nid = \"good\"\naddress = \"{}\"\nca_file = \"{}\"\n\
             [[servers]]\nid = \"bad\"\naddress = \"{}\"\nca_file = \"{}\"\n",
            good.https_url(),
            ca_file.display(),
            bad.https_url(),
            self_signed.display()
        ),
    )
    .unwrap();
    let run = |probe: bool| {
        let mut command = tokio::process::Command::new(crate::fleet_support::ringmaster_bin());
        command.arg("check-config");
        if probe {
            command.arg("--probe");
        }
        command.arg(&config).output()
    };
    // Without --probe nothing is dialled: the file is valid.
    let checked = run(false).await.unwrap();
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    assert!(!String::from_utf8_lossy(&checked.stdout).contains("probe"));
    let probed = run(true).await.unwrap();
    let out = String::from_utf8_lossy(&probed.stdout);
    let err = String::from_utf8_lossy(&probed.stderr);
    assert!(!probed.status.success(), "a failed server fails the check");
    assert!(
        err.contains("1 of 2 remote servers failed the probe"),
        "{err}"
    );
    let line = |id: &str| {
        out.lines()
            .find(|l| l.trim_start().starts_with(&format!("probe      {id} (")))
            .unwrap_or_else(|| panic!("no probe line for {id}: {out}"))
            .to_owned()
    };
    assert!(line("good").ends_with("OK (TLSv1_3, http/1.1)"), "{out}");
    let bad_line = line("bad");
    assert!(
        bad_line.contains(&bad.https_url())
            && bad_line.contains("TLS handshake failed: the server's certificate is a CA certificate used as a server certificate"),
        "{bad_line}"
    );
}
