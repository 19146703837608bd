//! TLS to servers: a client configuration that trusts the system's roots or one CA file,
//! always verifies the server's name against its certificate (SNI is the address's host),
//! and presents a client certificate where the server demands one (mutual TLS).
//!
//! Built once per server when it starts; what is sent over it (requests, credentials) is the
//! pool's business, not this module's.
//!
//! What can go wrong is said in words an operator can act on ([`handshake_failure`]): rustls
//! names a refused certificate by a variant (`CaUsedAsEndEntity`, `UnknownIssuer`), which in
//! a log line beside a client's 503 told a newcomer nothing of which server failed or how to
//! mend it. [`probe`] does one handshake as a request would, for `check-config --probe`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls::{AlertDescription, CertificateError, RootCertStore};
use tokio::net::TcpStream;

use crate::{TlsError, certificates, private_key};

/// The files a server's TLS client reads; every one optional.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// The CA certificates (PEM) the server's certificate must chain to; `None`: the system's
    /// roots (`SSL_CERT_FILE`, `SSL_CERT_DIR`, else the distribution's bundle).
    pub ca_file: Option<PathBuf>,
    /// A client certificate chain (PEM) and its key, for a server that asks for one.
    pub client_cert: Option<(PathBuf, PathBuf)>,
}

/// A TLS client configuration for one server from `files`, offering the `alpn` protocols
/// (`h2` for HTTP/2, `http/1.1` otherwise).
pub fn client_config(
    files: &ClientTlsFiles,
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, TlsError> {
    let roots = match &files.ca_file {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(path)? {
                roots.add(cert).map_err(|source| TlsError::Rustls {
                    what: format!("ca_file {}", path.display()),
                    source,
                })?;
            }
            roots
        }
        None => system_roots()?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions".into(),
            source,
        })?
        .with_root_certificates(roots);
    let mut config = match &files.client_cert {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(certificates(cert)?, private_key(key)?)
            .map_err(|source| TlsError::Rustls {
                what: format!(
                    "the client key {} with the certificate {}",
                    key.display(),
                    cert.display()
                ),
                source,
            })?,
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(config)
}

/// A client configuration that trusts nothing, for the type's sake where no handshake is
/// ever made (a plain `http://` server's connector): reading the system's roots for it would
/// cost a start, and fail on a machine without any.
pub fn untrusting_client_config() -> Result<rustls::ClientConfig, TlsError> {
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .map_err(|source| TlsError::Rustls {
        what: "TLS versions".into(),
        source,
    })?
    .with_root_certificates(RootCertStore::empty())
    .with_no_client_auth())
}

/// The system's trusted roots (certificates that fail to parse are skipped; none at all is
/// an error, since every handshake would then fail).
fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let why = found
            .errors
            .first()
            .map_or_else(|| "none found".to_owned(), ToString::to_string);
        return Err(TlsError::Pem {
            path: PathBuf::from("(the system's CA certificates)"),
            why: format!("no trusted roots ({why}): install ca-certificates or set ca_file"),
        });
    }
    Ok(roots)
}

/// Why a TLS handshake with a server failed, in words that say what to mend, when `error` is
/// rustls's or wraps it (through `std::io::Error`s and error sources, as hyper's clients and
/// tokio-rustls hand it on); `None` when TLS is not what failed.
pub fn handshake_failure(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    rustls_error(error).map(explain)
}

/// The rustls error in `error`'s chain. An `io::Error`'s `source()` skips the error it wraps
/// (it answers that error's own source), so each one is opened with `get_ref` as well.
fn rustls_error<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(wrapped) = error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            && let Some(tls) = rustls_error(wrapped)
        {
            return Some(tls);
        }
        next = error.source();
    }
    None
}

/// What is wrong with the server's TLS, and what to do.
fn explain(error: &rustls::Error) -> String {
    use rustls::Error as E;
    match error {
        E::InvalidCertificate(refused) => refused_certificate(refused),
        E::NoCertificatesPresented => "the server presented no certificate".to_owned(),
        E::AlertReceived(alert) => match alert {
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
            | AlertDescription::HandshakeFailure => format!(
                "the server refused the handshake ({alert:?}): it may want a client \
                 certificate from a CA it trusts (the server's `client_cert` and `client_key`)"
            ),
            AlertDescription::NoApplicationProtocol => format!(
                "the server refused the handshake ({alert:?}): it speaks neither HTTP/1.1 nor \
                 (with `[upstream] http2`) HTTP/2 over TLS"
            ),
            _ => format!("the server refused the handshake ({alert:?})"),
        },
        E::InvalidMessage(_) => "the server's answer is not TLS: is it `http://`?".to_owned(),
        E::PeerIncompatible(why) => format!(
            "the server's TLS has nothing in common with this gateway's (TLS 1.2 or 1.3): \
             {why:?}"
        ),
        E::NoApplicationProtocol => "the server agreed on no protocol the gateway offers \
            (ALPN: `h2` with `[upstream] http2`, else `http/1.1`)"
            .to_owned(),
        other => format!("TLS failed: {other}"),
    }
}

/// What is wrong with the server's certificate, and what to do.
fn refused_certificate(refused: &CertificateError) -> String {
    let certificate = |why: &str| format!("the server's certificate {why}");
    match refused {
        CertificateError::UnknownIssuer => certificate(
            "is not signed by a CA this gateway trusts: name the CA that signed it in the \
             server's `ca_file` (a self-signed server certificate cannot be trusted so: \
             make a CA and a server certificate signed by it, see docs/deploying.md)",
        ),
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            let presented = match refused {
                CertificateError::NotValidForNameContext {
                    expected,
                    presented,
                } => format!(
                    " ({expected:?}; it names {})",
                    if presented.is_empty() {
                        "none".to_owned()
                    } else {
                        presented.join(", ")
                    }
                ),
                _ => String::new(),
            };
            certificate(&format!(
                "is not for the name the gateway connects to{presented}: address the \
                 server by a name its certificate holds, or make it one whose \
                 subjectAltName holds this name"
            ))
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            certificate("has expired: renew it")
        }
        CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
            certificate("is not valid yet: check the clocks of both machines")
        }
        CertificateError::BadSignature => {
            certificate("chain has a signature that does not verify: re-issue it")
        }
        CertificateError::BadEncoding => certificate("cannot be parsed"),
        CertificateError::Revoked => certificate("is revoked"),
        // rustls hands on the verifier's own errors that it has no variant for; they are
        // matched by name, not by type, so that no second copy of the verifier's crate
        // (whose version must be rustls's own for a downcast to work) is needed.
        CertificateError::Other(other) => {
            let name = other.to_string();
            if name.contains("CaUsedAsEndEntity") {
                certificate(
                    "is a CA certificate used as a server certificate (made self-signed \
                     with CA:TRUE): make a CA and a leaf certificate signed by it, serve \
                     the leaf, and name the CA in the server's `ca_file` (docs/deploying.md)",
                )
            } else if name.contains("EndEntityUsedAsCa") {
                certificate(
                    "is signed by a certificate that is not a CA (CA:FALSE): sign it with \
                     a CA certificate, and name that CA in the server's `ca_file`",
                )
            } else if name.contains("RequiredEkuNotFound") {
                certificate(
                    "is not made for a TLS server (its extended key usage lacks \
                     serverAuth): make it with extendedKeyUsage = serverAuth",
                )
            } else {
                certificate(&format!("was refused: {name}"))
            }
        }
        other => certificate(&format!("was refused: {other:?}")),
    }
}

/// Why [`probe`] found no working TLS.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// No TCP connection.
    #[error("cannot connect to {authority}: {why}")]
    Connect {
        /// `HOST:PORT`.
        authority: String,
        /// What failed.
        why: String,
    },
    /// No connection and handshake within the time given.
    #[error("no TLS handshake with {authority} within {timeout:?}")]
    Timeout {
        /// `HOST:PORT`.
        authority: String,
        /// The time given.
        timeout: Duration,
    },
    /// The host is no name a certificate can be checked against.
    #[error("{name:?} is not a name TLS can verify: {why}")]
    ServerName {
        /// The host.
        name: String,
        /// Why.
        why: String,
    },
    /// The handshake failed: why, in words ([`handshake_failure`]) where rustls said.
    #[error("TLS handshake failed: {why}")]
    Handshake {
        /// Why.
        why: String,
    },
}

/// Connects to `authority` (`HOST:PORT`) and does the handshake a request to the server
/// would, with `config`, as `host` (sent as SNI and checked against the certificate), all
/// within `timeout`. `Ok`: the TLS version and the protocol agreed (`TLSv1_3, h2`).
///
/// Cancel safety: cancel-safe; dropping the future closes the connection.
pub async fn probe(
    config: rustls::ClientConfig,
    authority: &str,
    host: &str,
    timeout: Duration,
) -> Result<String, ProbeError> {
    // IPv6 literals come bracketed in a URL; SNI and the check want them bare.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let name = ServerName::try_from(bare.to_owned()).map_err(|e| ProbeError::ServerName {
        name: host.to_owned(),
        why: e.to_string(),
    })?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let handshake = async {
        let tcp = TcpStream::connect(authority)
            .await
            .map_err(|e| ProbeError::Connect {
                authority: authority.to_owned(),
                why: e.to_string(),
            })?;
        connector
            .connect(name, tcp)
            .await
            .map_err(|e| ProbeError::Handshake {
                why: handshake_failure(&e).unwrap_or_else(|| e.to_string()),
            })
    };
    let stream = tokio::time::timeout(timeout, handshake)
        .await
        .map_err(|_| ProbeError::Timeout {
            authority: authority.to_owned(),
            timeout,
        })??;
    let (_, session) = stream.get_ref();
    let version = session
        .protocol_version()
        .map_or_else(|| "TLS".to_owned(), |v| format!("{v:?}"));
    let alpn = session.alpn_protocol().map_or_else(
        || "no ALPN".to_owned(),
        |p| String::from_utf8_lossy(p).into_owned(),
    );
    Ok(format!("{version}, {alpn}"))
}
