//! TLS for Ringmaster's listeners: a certificate chain and its key (ECDSA, RSA or Ed25519) and,
//! for mutual TLS, the CA whose client certificates a listener accepts, read from PEM files.
//! [`ServerTls`] holds the current pair behind an atomic swap: new handshakes use whatever is
//! current, connections already open keep theirs, so a certificate rotates without a restart
//! or a dropped connection. [`ServerTls::reload_if_changed`] (called every second by
//! [`ServerTls::watch`]) and [`ServerTls::reload`] (SIGHUP) read the files again; a new pair
//! that does not load is refused with a log line and the old one kept.
//!
//! TLS 1.2 and 1.3 with rustls and the `ring` provider; ALPN offers `h2` and `http/1.1`. The
//! other direction, to servers behind `https://`, is [`client_config`]. This crate knows files
//! and handshakes, never what is served over them.
//!
//! [`credential`] is the other half of what a gateway and its `ringmaster worker`s trust each
//! other by: the secret they share, and the tags a split request's legs carry.

#![deny(missing_docs)]

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{info, warn};

mod client;
pub mod credential;
pub use client::{
    ClientTlsFiles, ProbeError, client_config, handshake_failure, probe, untrusting_client_config,
};

/// How often [`ServerTls::watch`] looks at the files.
pub const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The files a TLS listener reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, PEM, the listener's own certificate first.
    pub cert: PathBuf,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// For mutual TLS: the CA certificates (PEM) a client's certificate must chain to; a
    /// client without one is refused in the handshake.
    pub client_ca: Option<PathBuf>,
}

/// Why a listener's TLS files could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file holds no PEM object of the kind expected, or a broken one.
    #[error("{path}: {why}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A server's host is not a name (or IP address) a certificate can be checked against.
    #[error("{name:?} is not a name TLS can verify: {why}")]
    ServerName {
        /// The host.
        name: String,
        /// Why.
        why: String,
    },
    /// rustls refused the pair (the key does not match the certificate, an unsupported key
    /// type) or the client CA.
    #[error("{what}: {source}")]
    Rustls {
        /// What was being set up.
        what: String,
        /// rustls's reason.
        source: rustls::Error,
    },
}

/// A TLS listener's current configuration, swapped whole when its files change.
#[derive(Debug)]
pub struct ServerTls {
    files: TlsFiles,
    current: ArcSwap<rustls::ServerConfig>,
    /// The files' contents' hash when last loaded (or last refused), so that a pair refused
    /// once is not tried and logged again every second until it changes.
    seen: Mutex<u64>,
}

impl ServerTls {
    /// Reads `files` and builds the listener's configuration.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let (config, hash) = read(&files)?;
        Ok(Arc::new(Self {
            files,
            current: ArcSwap::from_pointee(config),
            seen: Mutex::new(hash),
        }))
    }

    /// The files it reads.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// Completes a TLS handshake on `stream` with the current certificate (`Err` for a client
    /// that does not speak TLS, offers nothing in common, or lacks a certificate a mutual-TLS
    /// listener demands).
    pub async fn accept(&self, stream: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        TlsAcceptor::from(self.current.load_full())
            .accept(stream)
            .await
    }

    /// The protocol the client and the listener agreed on by ALPN (`h2`, `http/1.1`), if any.
    pub fn negotiated(stream: &TlsStream<TcpStream>) -> Option<&[u8]> {
        stream.get_ref().1.alpn_protocol()
    }

    /// Reads the files again now (SIGHUP). `Ok(true)`: a new pair is in use; `Err`: the new
    /// files did not load, and the pair in use stays.
    pub fn reload(&self) -> Result<bool, TlsError> {
        self.reload_when(|_| true)
    }

    /// Reads the files again if their contents changed since the last load (or refusal).
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        self.reload_when(|changed| changed)
    }

    fn reload_when(&self, wanted: impl FnOnce(bool) -> bool) -> Result<bool, TlsError> {
        let hash = files_hash(&self.files);
        let mut seen = self
            .seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !wanted(hash != *seen) {
            return Ok(false);
        }
        *seen = hash;
        drop(seen);
        let (config, _) = read(&self.files)?;
        self.current.store(Arc::new(config));
        Ok(true)
    }

    /// Every [`WATCH_INTERVAL`] while `tls` lives: [`Self::reload_if_changed`], logging what
    /// happened (`tls.reloaded`, or `tls.reload_refused` with why, the old pair kept).
    pub async fn watch(tls: Weak<Self>) {
        let mut tick = tokio::time::interval(WATCH_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(tls) = tls.upgrade() else {
                return;
            };
            tls.log_reload(tls.reload_if_changed());
        }
    }

    /// Logs a reload's outcome.
    pub fn log_reload(&self, outcome: Result<bool, TlsError>) {
        match outcome {
            Ok(true) => info!(cert = %self.files.cert.display(), "tls.reloaded"),
            Ok(false) => {}
            Err(e) => warn!(error = %e, "tls.reload_refused"),
        }
    }
}

/// The files' contents hashed together (a file that cannot be read hashes as empty: the
/// load that follows says why).
fn files_hash(files: &TlsFiles) -> u64 {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    for path in [
        Some(&files.cert),
        Some(&files.key),
        files.client_ca.as_ref(),
    ]
    .into_iter()
    .flatten()
    {
        hasher.update(&std::fs::read(path).unwrap_or_default());
        hasher.update(&[0xff]);
    }
    hasher.digest()
}

/// The listener's configuration from its files, and their hash.
fn read(files: &TlsFiles) -> Result<(rustls::ServerConfig, u64), TlsError> {
    let hash = files_hash(files);
    let chain = certificates(&files.cert)?;
    let key = private_key(&files.key)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|source| TlsError::Rustls {
            what: "TLS versions".into(),
            source,
        })?;
    let builder = match &files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(path)? {
                roots.add(cert).map_err(|source| TlsError::Rustls {
                    what: format!("client_ca {}", path.display()),
                    source,
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                .build()
                .map_err(|e| TlsError::Pem {
                    path: path.clone(),
                    why: format!("not a usable client CA: {e}"),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Rustls {
            what: format!(
                "the key {} with the certificate {}",
                files.key.display(),
                files.cert.display()
            ),
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok((config, hash))
}

/// Every certificate in a PEM file (at least one).
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            why: format!("not a PEM certificate file: {e}"),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            why: "no CERTIFICATE in it".into(),
        });
    }
    Ok(certs)
}

/// The private key in a PEM file.
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::Pem {
        path: path.to_owned(),
        why: format!("no usable PRIVATE KEY in it: {e}"),
    })
}

#[cfg(test)]
mod tests;
