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
    /// A `ringmaster worker`, an inference engine, or a hosted provider with an OpenAI or
    /// Anthropic API: `http://HOST:PORT` or `https://HOST[:PORT]`.
    Remote {
        /// The base URL, without a trailing slash.
        url: String,
        /// The ring id it defaults to (`HOST:PORT`).
        name: String,
        /// Reached over TLS (`https://`).
        tls: bool,
    },
}

impl ServerAddress {
    /// Parses `sim://NAME[?slowdown=F]`, `gguf:PATH`, `http://HOST:PORT` or
    /// `https://HOST[:PORT]` (443 by default).
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
        for (scheme, tls) in [("http://", false), ("https://", true)] {
            let Some(rest) = text.strip_prefix(scheme) else {
                continue;
            };
            let host_port = rest.trim_end_matches('/');
            let host_port = match host_port.rsplit_once(':') {
                // A bracketed IPv6 address without a port ends in ']'.
                Some((_, port)) if !port.ends_with(']') => host_port.to_owned(),
                _ if tls => format!("{host_port}:443"),
                _ => String::new(),
            };
            let valid = !host_port.contains('/')
                && host_port
                    .rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
                && format!("{scheme}{host_port}").parse::<http::Uri>().is_ok();
            if !valid {
                return Err(format!(
                    "{text:?}: expected http://HOST:PORT or https://HOST[:PORT] (a server's \
                     address, no path)"
                ));
            }
            return Ok(Self::Remote {
                url: format!("{scheme}{host_port}"),
                name: host_port,
                tls,
            });
        }
        Err(format!(
            "{text:?}: expected sim://NAME, gguf:PATH, http://HOST:PORT or https://HOST[:PORT]"
        ))
    }

    /// A remote server's host (its bootstrap host for SGLang's decode servers).
    pub fn host(&self) -> Option<String> {
        match self {
            Self::Remote { url, .. } => url
                .parse::<http::Uri>()
                .ok()
                .and_then(|uri| uri.host().map(str::to_owned)),
            Self::Simulated { .. } | Self::Model { .. } => None,
        }
    }

    /// Whether it runs in this process (`sim://`, `gguf:`), not behind a URL.
    pub fn is_in_process(&self) -> bool {
        !matches!(self, Self::Remote { .. })
    }

    /// The ring id it defaults to.
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

/// Whose KV event wire a server speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvEventsFormat {
    /// vLLM's `ZmqEventPublisher`.
    #[default]
    Vllm,
    /// SGLang's (a copy of vLLM's, with pages for blocks).
    Sglang,
}

impl KvEventsFormat {
    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        }
    }
}

/// How routing learns what this process's own engines (simulated and `gguf:` servers) hold:
/// `[simulator] cache_view`. Anything but the default exists to measure the other views on
/// servers whose cache is known exactly (the replay compares them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LocalCacheView {
    /// Read from the engine directly (the default).
    #[default]
    InProcess,
    /// Each engine publishes its changes as vLLM's KV event batches (msgpack, positional),
    /// and routing reads the index the gateway builds from them, as for a real vLLM server.
    VllmEvents,
    /// Routing reads nothing from the engine: the estimate from where prefixes were sent.
    RoutingHistory,
}

impl LocalCacheView {
    /// Every view, in the order the configuration documents them.
    pub const ALL: [Self; 3] = [Self::InProcess, Self::VllmEvents, Self::RoutingHistory];

    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Self::InProcess => "in_process",
            Self::VllmEvents => "vllm_events",
            Self::RoutingHistory => "routing_history",
        }
    }

    /// The view of this name.
    pub fn parse(name: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|v| v.name() == name)
            .ok_or_else(|| {
                format!("{name:?} is not one of in_process, vllm_events, routing_history")
            })
    }
}

/// Where an engine publishes its KV-cache events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventsSpec {
    /// The publisher: `tcp://HOST:PORT`.
    pub endpoint: String,
    /// The replay socket, if the engine has one.
    pub replay: Option<String>,
    /// The wire.
    pub format: KvEventsFormat,
}

/// How a server tokenizes, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenizerSource {
    /// The simulated servers' tokenizer.
    Sim,
    /// A GGUF file's tokenizer (and its ChatML rendering).
    Gguf(std::path::PathBuf),
    /// A Hugging Face model folder (`tokenizer.json`, `tokenizer_config.json`).
    HuggingFace(std::path::PathBuf),
}

impl TokenizerSource {
    /// Parses `sim`, a `.gguf` file's path, or a folder's.
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text == "sim" {
            return Ok(Self::Sim);
        }
        if text.is_empty() {
            return Err("tokenizer: expected a model folder, a .gguf file or \"sim\"".into());
        }
        let path = std::path::PathBuf::from(text);
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            Ok(Self::Gguf(path))
        } else {
            Ok(Self::HuggingFace(path))
        }
    }
}

impl std::fmt::Display for TokenizerSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sim => f.write_str("sim"),
            Self::Gguf(path) | Self::HuggingFace(path) => write!(f, "{}", path.display()),
        }
    }
}

/// Checks a ZeroMQ `tcp://HOST:PORT` endpoint.
fn zmq_endpoint(field: &str, text: &str) -> Result<String, String> {
    let text = text.trim();
    let valid = text.strip_prefix("tcp://").is_some_and(|rest| {
        rest.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
        })
    });
    if valid {
        Ok(text.to_owned())
    } else {
        Err(format!("{field} {text:?}: expected tcp://HOST:PORT"))
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
    /// Its engine's KV event stream (remote servers only).
    pub kv_events: Option<KvEventsSpec>,
    /// How its engine tokenizes (remote servers only).
    pub tokenizer: Option<TokenizerSource>,
    /// The API it speaks, and what it does with reasoning and volatile lines.
    pub protocol: ServerProtocol,
    /// Its part in a disaggregated fleet (whole requests unless configured).
    pub role: crate::ServerRole,
    /// TLS and credentials (a remote server's only).
    pub access: ServerAccess,
    /// The spill-over pool it belongs to (`None`: the fleet's own, routed by model).
    pub pool: Option<String>,
}

/// A value that must never be shown: its `Debug` says `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How a remote server is reached beyond its address: the TLS files of an `https://` server
/// and the credentials sent with every request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerAccess {
    /// The CA certificates its certificate must chain to (`None`: the system's roots).
    pub ca_file: Option<std::path::PathBuf>,
    /// A client certificate and its key (mutual TLS).
    pub client_cert: Option<(std::path::PathBuf, std::path::PathBuf)>,
    /// The API key: the environment variable it was read from, and the key.
    pub api_key: Option<(String, Secret)>,
    /// Extra headers (lower-case names), values kept secret.
    pub headers: Vec<(String, Secret)>,
}

/// Headers a server's `headers` may not set: the gateway writes them itself.
const RESERVED_HEADERS: [&str; 6] = [
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
    "upgrade",
];

/// The API a server speaks (`api = "…"`). The pool maps it onto the wire formats'
/// `ringmaster_wire::Api`; this crate is a leaf and names the choice only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ServerApi {
    /// OpenAI's chat completions (and completions for a raw prompt).
    #[default]
    Chat,
    /// Anthropic's Messages.
    Messages,
    /// OpenAI's Responses.
    Responses,
}

impl ServerApi {
    /// Its name in the config, in metrics and in `/admin/servers`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Messages => "messages",
            Self::Responses => "responses",
        }
    }

    /// The API named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        [Self::Chat, Self::Messages, Self::Responses]
            .into_iter()
            .find(|api| api.as_str() == name)
    }
}

/// How a server is spoken to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerProtocol {
    /// Its API (OpenAI chat completions unless configured; in-process servers speak none).
    pub api: ServerApi,
    /// A reasoning model: it is told the reasoning effort and returns its reasoning.
    pub reasoning: bool,
    /// It gets the volatile system-prompt lines back (Anthropic's own API).
    pub keep_volatile: bool,
}

impl ServerProtocol {
    /// Validates `api`, `reasoning` and `keep_volatile` of one server entry.
    pub fn new(
        api: Option<&str>,
        reasoning: Option<bool>,
        keep_volatile: Option<bool>,
    ) -> Result<Self, String> {
        let api = match api.map(str::trim) {
            None => ServerApi::Chat,
            Some(name) => ServerApi::parse(name).ok_or_else(|| {
                format!("api {name:?}: expected \"chat\", \"messages\" or \"responses\"")
            })?,
        };
        Ok(Self {
            api,
            reasoning: reasoning.unwrap_or(false),
            keep_volatile: keep_volatile.unwrap_or(false),
        })
    }
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
            kv_events: None,
            tokenizer: None,
            protocol: ServerProtocol::default(),
            role: crate::ServerRole::default(),
            access: ServerAccess::default(),
            pool: None,
        })
    }

    /// Adds TLS files and credentials (a remote server's only; TLS files need `https://`).
    /// `env` reads the API key's variable.
    pub fn with_access(
        mut self,
        raw: &crate::RawServer,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, String> {
        let tls = match &self.address {
            ServerAddress::Remote { tls, .. } => *tls,
            _ => {
                let any = raw.ca_file.is_some()
                    || raw.client_cert.is_some()
                    || raw.client_key.is_some()
                    || raw.api_key_env.is_some()
                    || raw.headers.is_some();
                if any {
                    return Err(format!(
                        "{}: ca_file, client_cert, client_key, api_key_env and headers describe \
                         a remote server; this server runs in the gateway",
                        self.address
                    ));
                }
                return Ok(self);
            }
        };
        let path = |field: &str, value: &Option<String>| -> Result<_, String> {
            match value.as_deref().map(str::trim) {
                None => Ok(None),
                Some("") => Err(format!("{field}: must not be empty")),
                Some(_) if !tls => Err(format!(
                    "{field}: {} is plain http://; TLS files need an https:// address",
                    self.address
                )),
                Some(p) => Ok(Some(std::path::PathBuf::from(p))),
            }
        };
        let ca_file = path("ca_file", &raw.ca_file)?;
        let client_cert = match (
            path("client_cert", &raw.client_cert)?,
            path("client_key", &raw.client_key)?,
        ) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((cert, key)),
            _ => return Err("client_cert and client_key go together".into()),
        };
        let api_key = match raw.api_key_env.as_deref().map(str::trim) {
            None => None,
            Some(var) => {
                let key = env(var).filter(|k| !k.trim().is_empty()).ok_or_else(|| {
                    format!("api_key_env: the environment variable {var:?} is not set")
                })?;
                if http::HeaderValue::from_str(&format!("Bearer {}", key.trim())).is_err() {
                    return Err(format!(
                        "api_key_env: {var:?} holds characters a header cannot carry"
                    ));
                }
                Some((var.to_owned(), Secret::new(key.trim())))
            }
        };
        let mut headers = Vec::new();
        for (name, value) in raw.headers.iter().flatten() {
            let name = name.trim().to_ascii_lowercase();
            if http::HeaderName::from_bytes(name.as_bytes()).is_err()
                || RESERVED_HEADERS.contains(&name.as_str())
            {
                return Err(format!(
                    "headers: {name:?} is not a header name a server's requests may carry"
                ));
            }
            if http::HeaderValue::from_str(value).is_err() {
                return Err(format!(
                    "headers.{name}: the value holds characters a header cannot carry"
                ));
            }
            headers.push((name, Secret::new(value.as_str())));
        }
        self.access = ServerAccess {
            ca_file,
            client_cert,
            api_key,
            headers,
        };
        Ok(self)
    }

    /// Adds the engine's KV event stream and tokenizer (a remote server's only).
    pub fn with_engine(
        mut self,
        kv_events: Option<&str>,
        replay: Option<&str>,
        format: Option<&str>,
        tokenizer: Option<&str>,
    ) -> Result<Self, String> {
        let remote = matches!(self.address, ServerAddress::Remote { .. });
        let any =
            kv_events.is_some() || replay.is_some() || format.is_some() || tokenizer.is_some();
        if any && !remote {
            return Err(format!(
                "{}: kv_events, kv_events_replay, kv_events_format and tokenizer describe a \
                 remote engine (http://HOST:PORT); this server's cache is read directly",
                self.address
            ));
        }
        let format = match format.map(str::trim) {
            None | Some("vllm") => KvEventsFormat::Vllm,
            Some("sglang") => KvEventsFormat::Sglang,
            Some(other) => {
                return Err(format!(
                    "kv_events_format {other:?}: expected \"vllm\" or \"sglang\""
                ));
            }
        };
        self.kv_events = match (kv_events, replay) {
            (None, Some(_)) => {
                return Err("kv_events_replay needs kv_events (the publisher it repairs)".into());
            }
            (None, None) => None,
            (Some(endpoint), replay) => Some(KvEventsSpec {
                endpoint: zmq_endpoint("kv_events", endpoint)?,
                replay: replay
                    .map(|r| zmq_endpoint("kv_events_replay", r))
                    .transpose()?,
                format,
            }),
        };
        if tokenizer.is_some() && self.kv_events.is_none() {
            return Err(
                "tokenizer matches prompts against the engine's KV events: set kv_events too"
                    .into(),
            );
        }
        self.tokenizer = tokenizer.map(TokenizerSource::parse).transpose()?;
        Ok(self)
    }
}

/// Validates one `[[servers]]` entry (the config file's and `POST /admin/servers`'), reading
/// an API key's variable from this process's environment.
pub fn server_spec(raw: &crate::RawServer) -> Result<ServerSpec, String> {
    server_spec_with_env(raw, &|name| std::env::var(name).ok())
}

/// [`server_spec`] with an explicit environment.
pub fn server_spec_with_env(
    raw: &crate::RawServer,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<ServerSpec, String> {
    ServerSpec::new(
        &raw.address,
        raw.id.as_deref(),
        raw.weight,
        raw.models.as_deref(),
    )?
    .with_engine(
        raw.kv_events.as_deref(),
        raw.kv_events_replay.as_deref(),
        raw.kv_events_format.as_deref(),
        raw.tokenizer.as_deref(),
    )?
    .with_protocol(raw.api.as_deref(), raw.reasoning, raw.keep_volatile)?
    .with_role(
        raw.role.as_deref(),
        raw.disaggregation.as_deref(),
        raw.bootstrap_port,
        raw.dp_rank,
    )?
    .with_access(raw, env)?
    .in_pool(raw.pool.as_deref())
}

impl ServerSpec {
    /// Puts the server in a spill-over pool (`[[fallback]]`), out of the model pools.
    pub fn in_pool(mut self, pool: Option<&str>) -> Result<Self, String> {
        self.pool = pool
            .map(|name| crate::fallback::pool_name("pool", name))
            .transpose()?;
        if self.pool.is_some() && self.role != crate::ServerRole::default() {
            return Err(
                "pool: a spill-over pool's servers take whole requests (role \"both\")".into(),
            );
        }
        Ok(self)
    }
}

impl ServerSpec {
    /// Adds the API the server speaks and how (a remote server's only: the others are this
    /// process's own engines).
    pub fn with_protocol(
        mut self,
        api: Option<&str>,
        reasoning: Option<bool>,
        keep_volatile: Option<bool>,
    ) -> Result<Self, String> {
        let any = api.is_some() || reasoning.is_some() || keep_volatile.is_some();
        if any && !matches!(self.address, ServerAddress::Remote { .. }) {
            return Err(format!(
                "{}: api, reasoning and keep_volatile describe a remote server \
                 (http://HOST:PORT); this server runs in the gateway",
                self.address
            ));
        }
        self.protocol = ServerProtocol::new(api, reasoning, keep_volatile)?;
        Ok(self)
    }

    /// Adds its part in a disaggregated fleet (see [`crate::ServerRole::new`]).
    pub fn with_role(
        mut self,
        role: Option<&str>,
        connector: Option<&str>,
        bootstrap_port: Option<u16>,
        dp_rank: Option<u32>,
    ) -> Result<Self, String> {
        let in_process = self.address.is_in_process();
        self.role = crate::ServerRole::new(role, connector, bootstrap_port, dp_rank, in_process)?;
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_https_server_takes_tls_files_and_credentials_that_never_show() {
        let address = ServerAddress::parse("https://api.example.com").unwrap();
        assert_eq!(
            address,
            ServerAddress::Remote {
                url: "https://api.example.com:443".into(),
                name: "api.example.com:443".into(),
                tls: true,
            }
        );
        assert_eq!(
            ServerAddress::parse("https://[::1]:8443/")
                .unwrap()
                .default_id(),
            "[::1]:8443"
        );
        assert!(ServerAddress::parse("http://10.0.0.1").is_err());
        let raw = crate::RawServer {
            address: "https://llm.internal:8443".into(),
            ca_file: Some("/etc/ringmaster/llm-ca.pem".into()),
            client_cert: Some("/etc/ringmaster/client.pem".into()),
            client_key: Some("/etc/ringmaster/client.key".into()),
            api_key_env: Some("LLM_KEY".into()),
            headers: Some([("OpenAI-Organization".to_owned(), "org-1".to_owned())].into()),
            ..Default::default()
        };
        let env = |name: &str| (name == "LLM_KEY").then(|| " sk-secret ".to_owned());
        let spec = server_spec_with_env(&raw, &env).unwrap();
        assert_eq!(spec.id, "llm.internal:8443");
        let access = &spec.access;
        assert_eq!(
            access.ca_file.as_deref(),
            Some("/etc/ringmaster/llm-ca.pem".as_ref())
        );
        assert_eq!(access.api_key.as_ref().unwrap().1.expose(), "sk-secret");
        assert_eq!(access.headers[0].0, "openai-organization");
        let shown = format!("{spec:?}");
        assert!(
            !shown.contains("sk-secret") && !shown.contains("org-1"),
            "{shown}"
        );
        assert!(shown.contains("<redacted>"));
    }

    #[test]
    fn an_engine_feed_is_checked() {
        let remote = || ServerSpec::new("http://10.0.0.5:8000", None, None, None).unwrap();
        let spec = remote()
            .with_engine(
                Some("tcp://10.0.0.5:5557"),
                Some("tcp://10.0.0.5:5558"),
                Some("sglang"),
                Some("/models/qwen"),
            )
            .unwrap();
        let feed = spec.kv_events.unwrap();
        assert_eq!(feed.endpoint, "tcp://10.0.0.5:5557");
        assert_eq!(feed.replay.as_deref(), Some("tcp://10.0.0.5:5558"));
        assert_eq!(feed.format, KvEventsFormat::Sglang);
        assert_eq!(
            spec.tokenizer,
            Some(TokenizerSource::HuggingFace("/models/qwen".into()))
        );
        assert_eq!(
            TokenizerSource::parse("/m/SmolLM2.Q4_1.gguf").unwrap(),
            TokenizerSource::Gguf("/m/SmolLM2.Q4_1.gguf".into())
        );
        assert_eq!(TokenizerSource::parse("sim").unwrap(), TokenizerSource::Sim);
        for (events, replay, format) in [
            (Some("10.0.0.5:5557"), None, None),
            (Some("tcp://10.0.0.5"), None, None),
            (Some("tcp://:5557"), None, None),
            (Some("tcp://h:0"), None, None),
            (None, Some("tcp://h:5558"), None),
            (Some("tcp://h:1"), None, Some("tgi")),
        ] {
            assert!(
                remote().with_engine(events, replay, format, None).is_err(),
                "{events:?} {replay:?} {format:?}"
            );
        }
        assert!(remote().with_engine(None, None, None, Some("sim")).is_err());
        let sim = ServerSpec::new("sim://a", None, None, None).unwrap();
        assert!(
            sim.with_engine(Some("tcp://h:1"), None, None, None)
                .is_err()
        );
    }

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
