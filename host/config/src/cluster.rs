//! `[cluster]`: joining other gateway replicas on Redis (`url`, the replica's `name`, the key
//! `namespace`, the request path's `deadline_ms` and `fail_open`). Absent: one process alone.

use std::time::Duration;

use crate::error::{ConfigError, invalid};
use crate::raw::RawCluster;

/// `[cluster]`, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSettings {
    /// `redis://HOST:PORT/DB`, `rediss://…` or `redis+unix:///path`.
    pub url: String,
    /// This replica's name (`None`: the gateway's listen address, host:port).
    pub name: Option<String>,
    /// Prefix of every key (`ringmaster`).
    pub namespace: String,
    /// How long the request path waits for Redis (5 ms).
    pub deadline: Duration,
    /// Admit on local buckets while Redis is away (`true`), or refuse (`false`).
    pub fail_open: bool,
    /// A `rediss://` Redis's CA file (`None`: the system's roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key, for a Redis that asks for one.
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// Validates `[cluster]`.
pub(crate) fn cluster_settings(raw: RawCluster) -> Result<ClusterSettings, ConfigError> {
    let url = raw.url.ok_or_else(|| {
        invalid(
            "cluster.url",
            "required: the Redis the replicas share (or pass --cluster URL)",
        )
    })?;
    check_url(&url).map_err(|reason| invalid("cluster.url", reason))?;
    let namespace = raw.namespace.unwrap_or_else(|| "ringmaster".into());
    if namespace.is_empty() || namespace.contains(char::is_whitespace) {
        return Err(invalid(
            "cluster.namespace",
            "must be a non-empty word without spaces",
        ));
    }
    if let Some(name) = &raw.name
        && (name.is_empty() || name.contains(char::is_whitespace) || name.contains('*'))
    {
        return Err(invalid(
            "cluster.name",
            "must be non-empty, without spaces or '*'",
        ));
    }
    let tls = url.starts_with("rediss://");
    let path = |field: &str, value: Option<String>| match value {
        Some(_) if !tls => Err(invalid(
            format!("cluster.{field}"),
            "TLS files need a rediss:// url",
        )),
        Some(p) if p.trim().is_empty() => {
            Err(invalid(format!("cluster.{field}"), "must not be empty"))
        }
        other => Ok(other.map(std::path::PathBuf::from)),
    };
    let ca_file = path("ca_file", raw.ca_file)?;
    let client_cert = match (
        path("client_cert", raw.client_cert)?,
        path("client_key", raw.client_key)?,
    ) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => {
            return Err(invalid(
                "cluster.client_cert",
                "client_cert and client_key go together",
            ));
        }
    };
    let deadline_ms = raw.deadline_ms.unwrap_or(5);
    if deadline_ms == 0 || deadline_ms > 10_000 {
        return Err(invalid(
            "cluster.deadline_ms",
            "must be between 1 and 10000",
        ));
    }
    Ok(ClusterSettings {
        url,
        name: raw.name,
        namespace,
        deadline: Duration::from_millis(deadline_ms),
        fail_open: raw.fail_open.unwrap_or(true),
        ca_file,
        client_cert,
    })
}

/// Whether `url` names a Redis the client can reach (the scheme only: the connection says
/// the rest at start).
pub fn check_url(url: &str) -> Result<(), String> {
    const SCHEMES: [&str; 4] = ["redis://", "rediss://", "redis+unix://", "unix://"];
    if SCHEMES
        .iter()
        .any(|s| url.starts_with(s) && url.len() > s.len())
    {
        Ok(())
    } else {
        Err(format!(
            "{url:?} is not a Redis URL: use redis://HOST:PORT/DB or redis+unix:///path/to/socket"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checks_the_url_and_fills_defaults() {
        let settings = cluster_settings(RawCluster {
            url: Some("redis://127.0.0.1:6379/0".into()),
            ..RawCluster::default()
        })
        .unwrap();
        assert_eq!(settings.namespace, "ringmaster");
        assert_eq!(settings.deadline, Duration::from_millis(5));
        assert!(settings.fail_open);
        let err = cluster_settings(RawCluster {
            url: Some("http://x".into()),
            ..RawCluster::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("cluster.url"), "{err}");
        assert!(check_url("redis+unix:///tmp/r.sock").is_ok());
        assert!(check_url("redis://").is_err());
    }
}
