//! Handshakes over loopback with certificates made here (`rcgen`): the pair in use, a rotated
//! pair seen by the next connection only, a bad new pair refused with the old one kept, a
//! mutual-TLS listener refusing a client without a certificate, and a probe of a server's TLS
//! saying in words why its certificate is refused.

use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::CertificateError;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsConnector;

use super::*;

/// A test CA and what it signs.
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
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `names` and its key, PEM.
    fn leaf(&self, names: &[&str]) -> (String, String, CertificateDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem(), cert.der().clone())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// A listener that answers every handshake with `tls` and writes `ok`.
async fn listen(tls: Arc<ServerTls>) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                if let Ok(mut stream) = tls.accept(stream).await {
                    let _ = stream.write_all(b"ok").await;
                    let _ = stream.shutdown().await;
                }
            });
        }
    });
    addr
}

/// A client trusting `ca`, with `identity` (cert and key PEM) for mutual TLS.
fn client(ca: &Ca, identity: Option<(&str, &str)>) -> TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(ca.issuer.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
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
    config.alpn_protocols = vec![b"h2".to_vec()];
    TlsConnector::from(Arc::new(config))
}

/// Connects, reads the answer; the server's certificate and the answer, or the error.
async fn connect(
    connector: &TlsConnector,
    addr: std::net::SocketAddr,
) -> std::io::Result<(CertificateDer<'static>, Vec<u8>, Option<Vec<u8>>)> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").unwrap();
    let mut stream = connector.connect(name, tcp).await?;
    let (_, session) = stream.get_ref();
    let cert = session.peer_certificates().unwrap()[0].clone().into_owned();
    let alpn = session.alpn_protocol().map(<[u8]>::to_vec);
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await?;
    Ok((cert, answer, alpn))
}

#[tokio::test]
async fn a_rotated_pair_is_seen_by_the_next_connection_and_a_bad_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new("test CA");
    let (cert, key, first) = ca.leaf(&["localhost"]);
    let files = TlsFiles {
        cert: write(dir.path(), "cert.pem", &cert),
        key: write(dir.path(), "key.pem", &key),
        client_ca: None,
    };
    let tls = ServerTls::load(files.clone()).unwrap();
    let addr = listen(tls.clone()).await;
    let connector = client(&ca, None);
    let (seen, answer, alpn) = connect(&connector, addr).await.unwrap();
    assert_eq!(seen, first);
    assert_eq!(answer, b"ok");
    assert_eq!(alpn.as_deref(), Some(&b"h2"[..]), "ALPN agrees on h2");
    assert!(!tls.reload_if_changed().unwrap(), "nothing changed");

    // A new pair: the next handshake presents it.
    let (cert, key, second) = ca.leaf(&["localhost"]);
    std::fs::write(&files.cert, &cert).unwrap();
    std::fs::write(&files.key, &key).unwrap();
    assert!(tls.reload_if_changed().unwrap());
    let (seen, _, _) = connect(&connector, addr).await.unwrap();
    assert_eq!(seen, second);

    // A key that does not go with the certificate: refused, the pair in use kept, and not
    // tried again until the files change.
    let (_, other_key, _) = ca.leaf(&["localhost"]);
    std::fs::write(&files.key, &other_key).unwrap();
    let error = tls.reload_if_changed().unwrap_err();
    assert!(error.to_string().contains("key.pem"), "{error}");
    assert!(
        !tls.reload_if_changed().unwrap(),
        "refused once, not retried"
    );
    let (seen, _, _) = connect(&connector, addr).await.unwrap();
    assert_eq!(seen, second, "the old pair still serves");
    // And a file that is no PEM at all.
    std::fs::write(&files.cert, "not a certificate").unwrap();
    assert!(matches!(tls.reload(), Err(TlsError::Pem { .. })));
    let (seen, _, _) = connect(&connector, addr).await.unwrap();
    assert_eq!(seen, second);
}

#[tokio::test]
async fn a_mutual_tls_listener_refuses_a_client_without_a_certificate_of_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let stranger_ca = Ca::new("stranger CA");
    let (cert, key, _) = server_ca.leaf(&["localhost"]);
    let tls = ServerTls::load(TlsFiles {
        cert: write(dir.path(), "cert.pem", &cert),
        key: write(dir.path(), "key.pem", &key),
        client_ca: Some(write(dir.path(), "clients.pem", &client_ca.pem())),
    })
    .unwrap();
    let addr = listen(tls).await;
    // No certificate: the handshake (or the first read after it, in TLS 1.3) fails.
    assert!(connect(&client(&server_ca, None), addr).await.is_err());
    // A certificate of another CA: the same.
    let (cert, key, _) = stranger_ca.leaf(&["client"]);
    assert!(
        connect(&client(&server_ca, Some((&cert, &key))), addr)
            .await
            .is_err()
    );
    // One of the client CA's: served.
    let (cert, key, _) = client_ca.leaf(&["client"]);
    let (_, answer, _) = connect(&client(&server_ca, Some((&cert, &key))), addr)
        .await
        .unwrap();
    assert_eq!(answer, b"ok");
}

#[test]
fn files_that_are_missing_or_wrong_say_which_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let missing = TlsFiles {
        cert: dir.path().join("nope.pem"),
        key: dir.path().join("nokey.pem"),
        client_ca: None,
    };
    let error = ServerTls::load(missing).unwrap_err();
    assert!(error.to_string().contains("nope.pem"), "{error}");
    let ca = Ca::new("test CA");
    let (cert, _, _) = ca.leaf(&["localhost"]);
    let no_key = TlsFiles {
        cert: write(dir.path(), "cert.pem", &cert),
        key: write(dir.path(), "key.pem", &cert),
        client_ca: None,
    };
    let error = ServerTls::load(no_key).unwrap_err();
    assert!(error.to_string().contains("PRIVATE KEY"), "{error}");
}

/// A certificate for localhost made as newcomers make one: self-signed, with CA:TRUE (cert
/// and key PEM).
fn self_signed_ca_as_server() -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// A listener serving `cert` and `key` (PEM), written under `dir` as `name`.
async fn serving(dir: &Path, name: &str, (cert, key): (&str, &str)) -> std::net::SocketAddr {
    let tls = ServerTls::load(TlsFiles {
        cert: write(dir, &format!("{name}.crt"), cert),
        key: write(dir, &format!("{name}.key"), key),
        client_ca: None,
    })
    .unwrap();
    listen(tls).await
}

#[tokio::test]
async fn a_probe_says_why_a_servers_certificate_is_refused_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let timeout = Duration::from_secs(5);
    let ca = Ca::new("upstream CA");
    let ca_file = write(dir.path(), "ca.pem", &ca.pem());
    let trusting = |ca_file: &Path| {
        client_config(
            &ClientTlsFiles {
                ca_file: Some(ca_file.to_owned()),
                client_cert: None,
            },
            &[b"http/1.1"],
        )
        .unwrap()
    };
    // A CA and a leaf it signed, the CA in ca_file: the handshake a request makes works.
    let (cert, key, _) = ca.leaf(&["localhost"]);
    let good = serving(dir.path(), "good", (&cert, &key)).await;
    let agreed = probe(trusting(&ca_file), &good.to_string(), "localhost", timeout)
        .await
        .unwrap();
    assert!(agreed.contains("http/1.1"), "{agreed}");

    // The newcomer's certificate, itself in ca_file: refused, and said so in words.
    let (cert, key) = self_signed_ca_as_server();
    let own_ca = write(dir.path(), "self-signed.pem", &cert);
    let bad = serving(dir.path(), "self-signed", (&cert, &key)).await;
    let error = probe(trusting(&own_ca), &bad.to_string(), "localhost", timeout)
        .await
        .unwrap_err();
    let said = error.to_string();
    assert!(said.starts_with("TLS handshake failed: "), "{said}");
    assert!(
        said.contains("is a CA certificate used as a server certificate")
            && said.contains("make a CA and a leaf certificate signed by it"),
        "{said}"
    );

    // A leaf of a CA the gateway was not told of.
    let other = Ca::new("someone else's CA");
    let (cert, key, _) = other.leaf(&["localhost"]);
    let stranger = serving(dir.path(), "stranger", (&cert, &key)).await;
    let said = probe(
        trusting(&ca_file),
        &stranger.to_string(),
        "localhost",
        timeout,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        said.contains("not signed by a CA this gateway trusts"),
        "{said}"
    );

    // The good server under a name its certificate does not hold.
    let said = probe(
        trusting(&ca_file),
        &good.to_string(),
        "example.com",
        timeout,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        said.contains("not for the name") && said.contains("example.com"),
        "{said}"
    );

    // A plain HTTP server behind an https:// address.
    let plain = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let plain_addr = plain.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = plain.accept().await {
            let mut buffer = [0u8; 1024];
            let _ = stream.read(&mut buffer).await;
            let _ = stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n")
                .await;
        }
    });
    let said = probe(
        trusting(&ca_file),
        &plain_addr.to_string(),
        "localhost",
        timeout,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(said.contains("is not TLS: is it `http://`?"), "{said}");

    // Nothing listening.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_addr = closed.local_addr().unwrap();
    drop(closed);
    let error = probe(
        trusting(&ca_file),
        &closed_addr.to_string(),
        "localhost",
        timeout,
    )
    .await
    .unwrap_err();
    assert!(matches!(error, ProbeError::Connect { .. }), "{error}");
}

#[test]
fn a_rustls_error_is_found_through_the_io_errors_that_carry_it() {
    let refused = rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer);
    // tokio-rustls wraps it in an io::Error, hyper-rustls that in another.
    let inner = std::io::Error::new(std::io::ErrorKind::InvalidData, refused);
    let outer = std::io::Error::other(inner);
    let why = handshake_failure(&outer).expect("the rustls error is found");
    assert!(
        why.contains("not signed by a CA this gateway trusts"),
        "{why}"
    );
    assert_eq!(handshake_failure(&std::io::Error::other("reset")), None);
}
