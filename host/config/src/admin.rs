//! `[admin]`: the admin API's own listener (its address and TLS files) and its scoped
//! operator tokens (`[[admin.tokens]]`), kept as SHA-256 digests like API keys. The top-level
//! `admin_token` stays: it is a token named `admin` with every scope.

use std::net::SocketAddr;

use crate::MIN_ADMIN_TOKEN_CHARS;
use crate::error::{ConfigError, invalid};
use crate::keys::key_digest;
pub use crate::raw::{RawAdmin, RawAdminToken};
use crate::tls::{self, TlsSettings};

/// What an operator token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Look: status, servers, metrics, policies, experiments, route explanations, the audit.
    Read,
    /// Change the fleet: add and drain servers, weights, rollbacks, rollouts, recording.
    Operate,
    /// Upload policy components.
    Policies,
}

impl Scope {
    /// Every scope.
    pub const ALL: [Self; 3] = [Self::Read, Self::Operate, Self::Policies];

    /// Its name in the config and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Operate => "operate",
            Self::Policies => "policies",
        }
    }

    fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }
}

/// An operator token, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminToken {
    /// Who holds it.
    pub name: String,
    /// SHA-256 of the secret.
    pub digest: [u8; 32],
    /// What it may do.
    pub scopes: Vec<Scope>,
}

impl AdminToken {
    /// Whether it may do what `scope` covers.
    pub fn may(&self, scope: Scope) -> bool {
        self.scopes.contains(&scope)
    }
}

/// The admin API's own listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdminListener {
    /// Its address.
    pub listen: SocketAddr,
    /// Its TLS (`None`: plain HTTP).
    pub tls: Option<TlsSettings>,
}

/// `[admin]` validated: its listener (`None`: the admin API is on the public one; then its TLS
/// keys are an error) and its tokens.
pub(crate) fn admin(
    raw: RawAdmin,
) -> Result<(Option<AdminListener>, Vec<AdminToken>), ConfigError> {
    let tokens = tokens(raw.tokens.unwrap_or_default())?;
    let tls = tls::settings("admin", raw.cert, raw.key, raw.client_ca)?;
    let Some(listen) = raw.listen.filter(|l| !l.is_empty()) else {
        return match tls {
            Some(_) => Err(invalid(
                "admin.cert",
                "needs admin.listen: without a listener of its own the admin API is served \
                 on the public one, with [tls]",
            )),
            None => Ok((None, tokens)),
        };
    };
    let listen = listen.parse().map_err(|e| {
        invalid(
            "admin.listen",
            format!("{listen:?} is not an address like 127.0.0.1:9090: {e}"),
        )
    })?;
    Ok((Some(AdminListener { listen, tls }), tokens))
}

fn tokens(raw: Vec<RawAdminToken>) -> Result<Vec<AdminToken>, ConfigError> {
    let mut tokens: Vec<AdminToken> = Vec::with_capacity(raw.len());
    for (i, raw) in raw.into_iter().enumerate() {
        let at = format!("admin.tokens[{i}]");
        let name = raw
            .name
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| invalid(format!("{at}.name"), "field required (who holds it)"))?;
        let digest = match (raw.token, raw.token_sha256) {
            (Some(token), None) => {
                if token.chars().count() < MIN_ADMIN_TOKEN_CHARS
                    || token.chars().any(|c| c.is_whitespace() || c.is_control())
                {
                    return Err(invalid(
                        format!("{at}.token"),
                        format!(
                            "must be at least {MIN_ADMIN_TOKEN_CHARS} characters with no whitespace"
                        ),
                    ));
                }
                key_digest(&token)
            }
            (None, Some(hex_digest)) => {
                let mut digest = [0u8; 32];
                hex::decode_to_slice(hex_digest.trim(), &mut digest).map_err(|_| {
                    invalid(
                        format!("{at}.token_sha256"),
                        "must be 64 hexadecimal digits (a SHA-256)",
                    )
                })?;
                digest
            }
            (Some(_), Some(_)) => return Err(invalid(at, "give token or token_sha256, not both")),
            (None, None) => {
                return Err(invalid(
                    format!("{at}.token"),
                    "field required (or token_sha256)",
                ));
            }
        };
        let mut scopes = Vec::new();
        for scope in raw.scopes.unwrap_or_else(|| vec!["read".to_owned()]) {
            let parsed = Scope::parse(&scope).ok_or_else(|| {
                invalid(
                    format!("{at}.scopes"),
                    format!("{scope:?} is not a scope: read, operate or policies"),
                )
            })?;
            if !scopes.contains(&parsed) {
                scopes.push(parsed);
            }
        }
        scopes.sort();
        if tokens.iter().any(|t| t.name == name) {
            return Err(invalid(
                format!("{at}.name"),
                format!("{name:?} is used twice"),
            ));
        }
        if tokens.iter().any(|t| t.digest == digest) {
            return Err(invalid(at, "the same secret as another token"));
        }
        tokens.push(AdminToken {
            name,
            digest,
            scopes,
        });
    }
    Ok(tokens)
}
