//! `[[servers]]` (and `POST /admin/servers`): what a pool server is, as the configuration
//! names it: its address (simulated, a model on this machine, or a remote server), ring id,
//! weight and models; where model servers run. Plain validated values, no I/O.

/// Where model (`gguf:`) servers run when not on the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuPlacement {
    /// The CUDA device ordinal.
    pub ordinal: usize,
    /// KV blocks per server; `None` sizes the pool from the GPU's free memory.
    pub kv_blocks: Option<u32>,
}

/// Where a GPU server is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerAddress {
    /// A simulated server in this process: `sim://NAME`, or `sim://NAME?slowdown=F` for one
    /// that takes `F` times as long for everything (a slower or busier machine in a fleet).
    Simulated {
        /// The name after `sim://`.
        name: String,
        /// How much slower than the simulator's model it runs, in percent (100: as modelled).
        slowdown_percent: u32,
    },
    /// A llama GGUF model run on this machine's CPU: `gguf:PATH`.
    Model {
        /// The GGUF file.
        path: std::path::PathBuf,
        /// The ring id it defaults to (the file name without its extensions).
        name: String,
    },
    /// A `ringmaster worker` (or another OpenAI-compatible server with the same extensions):
    /// `http://HOST:PORT`.
    Remote {
        /// The base URL, without a trailing slash.
        url: String,
        /// The ring id it defaults to (`HOST:PORT`).
        name: String,
    },
}

impl ServerAddress {
    /// Parses `sim://NAME[?slowdown=F]`, `gguf:PATH` or `http://HOST:PORT`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(rest) = text.strip_prefix("sim://") {
            let (name, slowdown_percent) = match rest.split_once('?') {
                None => (rest, 100),
                Some((name, query)) => {
                    let factor = query
                        .strip_prefix("slowdown=")
                        .and_then(|f| f.parse::<f64>().ok())
                        .filter(|f| (0.1..=100.0).contains(f))
                        .ok_or_else(|| {
                            format!(
                                "{text:?}: the only option of a sim:// address is \
                                 `?slowdown=F`, F between 0.1 and 100"
                            )
                        })?;
                    (name, (factor * 100.0).round() as u32)
                }
            };
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
            {
                return Err(format!(
                    "{text:?}: the name after sim:// must be non-empty ASCII letters, digits, '-', '_' or '.'"
                ));
            }
            return Ok(Self::Simulated {
                name: name.to_owned(),
                slowdown_percent,
            });
        }
        if let Some(path) = text.strip_prefix("gguf:") {
            let path = std::path::PathBuf::from(path);
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.split('.').next())
                .filter(|n| !n.is_empty())
                .ok_or_else(|| format!("{text:?}: expected gguf:PATH to a .gguf file"))?
                .to_owned();
            return Ok(Self::Model { path, name });
        }
        if let Some(rest) = text.strip_prefix("http://") {
            let host_port = rest.trim_end_matches('/');
            let valid = !host_port.is_empty()
                && !host_port.contains('/')
                && host_port
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
            if !valid {
                return Err(format!(
                    "{text:?}: expected http://HOST:PORT (a worker's address, no path)"
                ));
            }
            return Ok(Self::Remote {
                url: format!("http://{host_port}"),
                name: host_port.to_owned(),
            });
        }
        if text.starts_with("https://") {
            return Err(format!(
                "{text:?}: workers are reached over plain http:// inside the cluster; put TLS in front of the gateway instead"
            ));
        }
        Err(format!(
            "{text:?}: expected sim://NAME, gguf:PATH or http://HOST:PORT"
        ))
    }

    /// The default ring id for this address.
    pub fn default_id(&self) -> &str {
        match self {
            Self::Simulated { name, .. } | Self::Model { name, .. } | Self::Remote { name, .. } => {
                name
            }
        }
    }
}

impl std::fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Simulated {
                name,
                slowdown_percent: 100,
            } => write!(f, "sim://{name}"),
            Self::Simulated {
                name,
                slowdown_percent,
            } => write!(
                f,
                "sim://{name}?slowdown={}",
                f64::from(*slowdown_percent) / 100.0
            ),
            Self::Model { path, .. } => write!(f, "gguf:{}", path.display()),
            Self::Remote { url, .. } => f.write_str(url),
        }
    }
}

/// A GPU server to start with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerSpec {
    /// Ring id.
    pub id: String,
    /// Where it is.
    pub address: ServerAddress,
    /// Ring weight.
    pub weight: u32,
    /// The models it serves, when the config says; `None`: discovered, or any.
    pub models: Option<Vec<String>>,
}

impl ServerSpec {
    /// Validates one server entry (the config file's and `POST /admin/servers`'): its
    /// address, and optionally its ring id, weight and models.
    pub fn new(
        address: &str,
        id: Option<&str>,
        weight: Option<u32>,
        models: Option<&[String]>,
    ) -> Result<Self, String> {
        let address = ServerAddress::parse(address.trim())?;
        let id = id.map_or_else(|| address.default_id().to_owned(), str::to_owned);
        if id.is_empty() || id.len() > 128 || id.chars().any(|c| c.is_control() || c == '/') {
            return Err(format!(
                "id {id:?}: must be 1–128 characters, no '/' or control characters"
            ));
        }
        let weight = weight.unwrap_or(1);
        if weight == 0 || weight > 100 {
            return Err(format!("weight {weight}: must be between 1 and 100"));
        }
        let models = match models {
            None => None,
            Some(models) if models.is_empty() || models.iter().any(|m| m.trim().is_empty()) => {
                return Err("models: list at least one non-empty model name".to_owned());
            }
            Some(models) => Some(models.to_vec()),
        };
        Ok(Self {
            id,
            address,
            weight,
            models,
        })
    }
}

/// Validates one `[[servers]]` entry (the config file's and `POST /admin/servers`').
pub fn server_spec(raw: &crate::RawServer) -> Result<ServerSpec, String> {
    ServerSpec::new(
        &raw.address,
        raw.id.as_deref(),
        raw.weight,
        raw.models.as_deref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_simulated_server_may_be_slowed_down() {
        let slow = ServerAddress::parse("sim://gpu-3?slowdown=2.5").unwrap();
        assert_eq!(
            slow,
            ServerAddress::Simulated {
                name: "gpu-3".into(),
                slowdown_percent: 250
            }
        );
        assert_eq!(slow.default_id(), "gpu-3");
        assert_eq!(slow.to_string(), "sim://gpu-3?slowdown=2.5");
        assert_eq!(
            ServerAddress::parse("sim://gpu-3").unwrap().to_string(),
            "sim://gpu-3"
        );
        for bad in [
            "sim://a?slowdown=0",
            "sim://a?slowdown=x",
            "sim://a?speed=2",
            "sim://?slowdown=2",
        ] {
            assert!(ServerAddress::parse(bad).is_err(), "{bad}");
        }
    }
}
