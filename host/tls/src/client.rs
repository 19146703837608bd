//! TLS to servers: a client configuration that trusts the system's roots or one CA file,
//! always verifies the server's name against its certificate (SNI is the address's host),
//! and presents a client certificate where the server demands one (mutual TLS).
//!
//! Built once per server when it starts; what is sent over it (requests, credentials) is the
//! pool's business, not this module's.

use std::path::PathBuf;
use std::sync::Arc;

use rustls::RootCertStore;

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
