//! `[tls]` (the public listener) and the TLS keys of `[admin]` (the admin API's own listener,
//! `crate::admin`): the PEM files a TLS listener reads. Only the keys are checked here; the files are read where the listener
//! starts (`ringmaster-tls`), so that `check-config` and start-up say which file is wrong.

use std::path::PathBuf;

use serde::Deserialize;

use crate::error::{ConfigError, invalid};

/// `[tls]`, and the TLS keys of `[admin]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    /// The certificate chain, PEM (the listener's certificate first).
    pub cert: Option<PathBuf>,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1; ECDSA, RSA or Ed25519).
    pub key: Option<PathBuf>,
    /// For mutual TLS: the CA certificates (PEM) a client's certificate must chain to.
    pub client_ca: Option<PathBuf>,
}

/// A listener's TLS files, as configured (read when the listener starts, and again when they
/// change).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsSettings {
    /// The certificate chain.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
    /// The CA of the client certificates required (`None`: no client certificate asked).
    pub client_ca: Option<PathBuf>,
}

/// `[tls]` (or `[admin]`'s TLS keys, under `section`) validated: `None` when neither file is
/// named; both must be, and a client CA alone is an error.
pub(crate) fn settings(
    section: &str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<TlsSettings>, ConfigError> {
    let empty = |p: &Option<PathBuf>| p.as_ref().is_none_or(|p| p.as_os_str().is_empty());
    match (empty(&cert), empty(&key)) {
        (true, true) if client_ca.is_some() => Err(invalid(
            format!("{section}.client_ca"),
            "needs cert and key: client certificates are asked for in a TLS handshake",
        )),
        (true, true) => Ok(None),
        (false, true) => Err(invalid(
            format!("{section}.key"),
            "is required with cert (the certificate's private key, PEM)",
        )),
        (true, false) => Err(invalid(
            format!("{section}.cert"),
            "is required with key (the certificate chain, PEM)",
        )),
        (false, false) => Ok(Some(TlsSettings {
            cert: cert.unwrap_or_default(),
            key: key.unwrap_or_default(),
            client_ca: client_ca.filter(|p| !p.as_os_str().is_empty()),
        })),
    }
}

/// `[tls]` validated.
pub(crate) fn public(raw: RawTls) -> Result<Option<TlsSettings>, ConfigError> {
    settings("tls", raw.cert, raw.key, raw.client_ca)
}
