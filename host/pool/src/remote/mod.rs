//! Remote servers as pool servers: any OpenAI-compatible server (vLLM, SGLang, TGI, llama.cpp's
//! server, Ollama), a `ringmaster worker`, or a server of Anthropic's Messages API or OpenAI's
//! Responses API, reached over HTTP or HTTPS ([`RemoteAccess`]: TLS files and credentials).
//!
//! A request goes to the endpoint of the server's API ([`request::Endpoint`]):
//! `/v1/chat/completions` (or `/v1/completions` for a raw prompt), streamed, asking for usage
//! (`stream_options.include_usage`, and vLLM's `continuous_usage_stats` so that cached-token
//! counts arrive with the first token); `/v1/messages`; `/v1/responses`. The reply is read as
//! bytes ([`sse`]) and decoded with typed, borrowing structs ([`chunks`], [`dialects`]) into
//! the same [`GenerateEvent`]s a local engine sends, so the rest of the gateway does not know
//! the difference. Every stream shape those servers send is handled; see the README's table.
//!
//! Connections are pooled per server and reused: the body of every reply is read to its end
//! (after the last event has gone to the client) so that its connection goes back to the pool.
//! Dropping the stream before it finished drops the response, which closes that connection,
//! which is how a server learns to cancel the generation.
//!
//! Three timeouts, each in `[upstream]`: connecting, the reply's headers (first byte), and the
//! gap between two reads of the body. [`RemoteWorker::submit`] returns only once the reply's
//! first event is in, so every failure before the first token (refused, reset, 5xx, 429, a
//! stream that breaks or errs before it starts) is an `Err` the gateway can retry elsewhere.
//! The reply is read by whoever consumes its stream ([`reply`]), with no task or channel in
//! between: a slow client slows the reading of the server's socket instead of growing a
//! buffer.
//!
//! Health: the load poll (`/load` every [`LOAD_POLL_INTERVAL`]; a 404 there means an ordinary
//! OpenAI server, which is up whenever it answers) is the active check; consecutive request
//! failures eject the server for a backoff that doubles with each ejection ([`Health`]). While
//! unreachable or ejected, the server is not routable and its load reads as full, and why is
//! kept for the operator ([`RemoteWorker::health_report`]): a failed TLS handshake says what is
//! wrong with the server's certificate ([`ringmaster_tls::handshake_failure`]).
//!
//! A `ringmaster worker`'s prefix cache is mirrored from its own reports ([`follow`]): its
//! tokenizer (`/tokenizer`) and its event stream (`/kv/events`) feed a [`ReportedCache`].
//! A server without these endpoints is asked again only every [`KV_UNSUPPORTED_RETRY`].

pub mod adapters;
mod chunks;
mod conn;
pub mod dialects;
pub mod engine_events;
pub mod engine_metrics;
mod follow;
mod health;
pub mod legs;
mod reader;
mod reply;
mod request;
mod side;
mod sse;
mod tally;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::body::Incoming;
use ringmaster_gpu_runtime::{GenerateEvent, GenerationStream, LoadReport};
use tracing::warn;

pub use chunks::{ChunkKind, DecodeError, ReplyDecoder, error_message};
pub use follow::LoadSource;
pub use health::{Health, HealthReport, LastError, RemoteError};
pub use legs::{Bootstrap, LegError, PrefillAnswer};
pub use reader::ReplyReader;
pub use request::{Endpoint, Target, UpstreamRequest};
pub use sse::{SseDecoder, SseError};

use conn::{ConnError, Http1Pool, Lease};
use reply::RemoteReply;

use crate::generation::Generation;
use crate::kv_view::ReportedCache;
pub use ringmaster_config::UpstreamSettings;

/// Longest wait between attempts to reconnect to a worker's KV event stream.
pub const KV_RECONNECT_MAX: Duration = Duration::from_secs(5);

/// How often a worker without `/tokenizer` or `/kv/events` is asked again.
pub const KV_UNSUPPORTED_RETRY: Duration = Duration::from_secs(60);

/// How often a follower of a removed worker's event stream notices and stops.
const KV_FOLLOW_CHECK: Duration = Duration::from_secs(1);

/// How often a server's load is fetched (the active health check).
pub const LOAD_POLL_INTERVAL: Duration = Duration::from_millis(250);

/// Most bytes read from a reply after its last event, to hand its connection back to the
/// pool; a server that sends more than this after finishing loses the connection instead.
pub(super) const DRAIN_LIMIT_BYTES: usize = 64 * 1024;

/// How the gateway wants a server's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyMode {
    /// One whole JSON answer (for a client that wants one message: one read and one parse
    /// instead of one per token); its events come together when it is done.
    Whole,
    /// One whole JSON answer, read into events and also kept as the server sent it, for a
    /// client that speaks the server's API ([`Generation::take_answer`]).
    WholeRelayed,
    /// A stream, read into events.
    Stream,
    /// A stream, read into events, with the server's own content chunks kept for a client
    /// that speaks the server's API ([`Generation::take_relayed`]).
    Relayed,
}

impl ReplyMode {
    /// Whether the server is asked for one whole JSON answer.
    pub fn is_whole(self) -> bool {
        matches!(self, Self::Whole | Self::WholeRelayed)
    }
}

/// A client of one server.
#[derive(Debug)]
pub struct RemoteWorker {
    url: String,
    /// The server's credentials (API key, extra headers), sent with every request; marked
    /// sensitive, so that no log or debug output shows them.
    credentials: Vec<(http::HeaderName, http::HeaderValue)>,
    /// The endpoints, parsed once (origin-form for HTTP/1.1, absolute for HTTP/2).
    chat_url: http::Uri,
    completions_url: http::Uri,
    messages_url: http::Uri,
    responses_url: http::Uri,
    /// For the health polls, the models, the KV event stream and adapter loads.
    side: side::SideClient,
    /// For requests.
    transport: Transport,
    settings: UpstreamSettings,
    load: Mutex<LoadReport>,
    load_source: Mutex<LoadSource>,
    reachable: AtomicBool,
    /// Why the last load poll failed (`None`: it reached the server): the reason it is not
    /// routable.
    poll_error: Mutex<Option<String>>,
    health: Health,
    kv: Arc<ReportedCache>,
    /// The engine's own KV event stream, when configured (then `/kv/events` is not asked).
    engine_feed: Option<Arc<engine_events::EngineFeed>>,
    /// What `/v1/models` lists (empty until known), and whom to tell when it changes.
    models: Mutex<Vec<String>>,
    /// Of those, the LoRA adapters, each with its base model.
    adapters: Mutex<BTreeMap<String, String>>,
    /// When each adapter was last asked for here (`[lora] load_on_demand`).
    adapter_use: Mutex<std::collections::HashMap<String, tokio::time::Instant>>,
    /// Held while an adapter is being loaded here.
    adapter_loads: tokio::sync::Mutex<()>,
    adapter_counts: Mutex<adapters::AdapterCounts>,
    models_epoch: Option<Arc<AtomicU64>>,
}

impl RemoteWorker {
    /// A client of the server at `url` (`http://HOST:PORT`) with `settings`, polling its load
    /// in the background while the client lives. Needs a tokio runtime.
    pub fn start_with(
        url: &str,
        settings: UpstreamSettings,
    ) -> Result<Arc<Self>, ringmaster_tls::TlsError> {
        Self::start_in_pool(url, settings, &RemoteAccess::default(), None, None)
    }

    /// A client of the server at `url` (`http://` or `https://`) with `settings`, reached as
    /// `access` says, that also follows the models it serves (`/v1/models`), bumping
    /// `models_epoch` when they change. `Err`: the TLS files could not be used.
    pub fn start_in_pool(
        url: &str,
        settings: UpstreamSettings,
        access: &RemoteAccess,
        models_epoch: Option<Arc<AtomicU64>>,
        engine: Option<(
            ringmaster_config::KvEventsSpec,
            Option<ringmaster_config::TokenizerSource>,
        )>,
    ) -> Result<Arc<Self>, ringmaster_tls::TlsError> {
        let url = url.trim_end_matches('/').to_owned();
        let tls = url.starts_with("https://");
        let credentials = access.headers();
        let h2 = settings.http2_prior_knowledge;
        let alpn: &[u8] = if h2 { b"h2" } else { b"http/1.1" };
        let tls_config = if tls {
            ringmaster_tls::client_config(&access.tls, &[alpn])?
        } else {
            ringmaster_tls::untrusting_client_config()?
        };
        let side = side::SideClient::new(
            side::connector(tls_config.clone(), settings.connect_timeout, h2),
            &url,
            credentials.clone(),
            &settings,
        );
        // The config checked the address; one that still fails to parse gets a placeholder,
        // and every request to it fails as unreachable.
        let parsed = url
            .parse::<http::Uri>()
            .ok()
            .filter(|uri| uri.authority().is_some())
            .unwrap_or_else(|| http::Uri::from_static("http://invalid.invalid"));
        let authority = parsed.authority().map_or("invalid.invalid", |a| a.as_str());
        let host = parsed.host().unwrap_or("invalid.invalid");
        let scheme = if tls { "https" } else { "http" };
        let base_path = parsed.path().trim_end_matches('/').to_owned();
        let transport = if h2 {
            Transport::Http2(Box::new(
                hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                    .pool_idle_timeout(settings.pool_idle_timeout)
                    .pool_max_idle_per_host(settings.pool_max_idle)
                    .http2_only(true)
                    .build(side::connector(tls_config, settings.connect_timeout, true)),
            ))
        } else {
            let tls = if tls {
                // IPv6 literals come bracketed in a URI; SNI and the check want them bare.
                let name = rustls::pki_types::ServerName::try_from(
                    host.trim_start_matches('[')
                        .trim_end_matches(']')
                        .to_owned(),
                )
                .map_err(|e| ringmaster_tls::TlsError::ServerName {
                    name: host.to_owned(),
                    why: e.to_string(),
                })?;
                Some(conn::Tls {
                    connector: tokio_rustls::TlsConnector::from(Arc::new(tls_config)),
                    name,
                })
            } else {
                None
            };
            Transport::Http1(Http1Pool::new(
                authority,
                tls,
                settings.connect_timeout,
                settings.pool_max_idle,
                settings.pool_idle_timeout,
            ))
        };
        let endpoint = |path: &str| {
            let text = match transport {
                Transport::Http1(_) => format!("{base_path}{path}"),
                Transport::Http2(_) => format!("{scheme}://{authority}{base_path}{path}"),
            };
            text.parse::<http::Uri>()
                .unwrap_or_else(|_| http::Uri::from_static("/invalid"))
        };
        let worker = Arc::new(Self {
            credentials,
            chat_url: endpoint("/v1/chat/completions"),
            completions_url: endpoint("/v1/completions"),
            messages_url: endpoint("/v1/messages"),
            responses_url: endpoint("/v1/responses"),
            url,
            side,
            transport,
            settings,
            load: Mutex::new(LoadReport::default()),
            load_source: Mutex::new(LoadSource::Unknown),
            // Unknown until the first poll: assume reachable so the first requests are tried.
            reachable: AtomicBool::new(true),
            poll_error: Mutex::new(None),
            health: Health::default(),
            kv: Arc::new(ReportedCache::default()),
            engine_feed: engine
                .map(|(spec, tokenizer)| Arc::new(engine_events::EngineFeed::new(spec, tokenizer))),
            models: Mutex::new(Vec::new()),
            adapters: Mutex::new(BTreeMap::new()),
            adapter_use: Mutex::new(std::collections::HashMap::new()),
            adapter_loads: tokio::sync::Mutex::new(()),
            adapter_counts: Mutex::new(adapters::AdapterCounts::default()),
            models_epoch,
        });
        tokio::spawn(follow::poll_load(Arc::downgrade(&worker)));
        match &worker.engine_feed {
            Some(feed) => {
                tokio::spawn(engine_events::follow(
                    Arc::downgrade(&worker),
                    worker.kv.clone(),
                    feed.clone(),
                ));
            }
            None => {
                tokio::spawn(follow::follow_kv(Arc::downgrade(&worker)));
            }
        }
        Ok(worker)
    }

    /// The engine's KV event feed, when the server has one configured.
    pub fn engine_feed(&self) -> Option<&engine_events::EngineFeed> {
        self.engine_feed.as_deref()
    }

    /// The server's prefix cache as its event stream reports it.
    pub fn kv(&self) -> &ReportedCache {
        &self.kv
    }

    /// The models the server lists at `/v1/models`; `None` until known (or when it lists none).
    pub fn models(&self) -> Option<Vec<String>> {
        let models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        (!models.is_empty()).then(|| models.clone())
    }

    /// The LoRA adapters the server lists, each with its base model.
    pub fn adapters(&self) -> BTreeMap<String, String> {
        self.adapters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether the server lists `model` as a LoRA adapter.
    pub fn has_adapter(&self, model: &str) -> bool {
        self.adapters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains_key(model)
    }

    /// Records what `/v1/models` listed (ids with their `parent`); tells the pool when it
    /// changed.
    pub(crate) fn set_models(&self, listed: Vec<(String, Option<String>)>) {
        let adapters: BTreeMap<String, String> = listed
            .iter()
            .filter_map(|(id, parent)| {
                parent
                    .as_ref()
                    .filter(|p| *p != id)
                    .map(|p| (id.clone(), p.clone()))
            })
            .collect();
        let mut ids: Vec<String> = listed.into_iter().map(|(id, _)| id).collect();
        ids.sort();
        ids.dedup();
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let mut held = self.adapters.lock().unwrap_or_else(PoisonError::into_inner);
        if *models != ids || *held != adapters {
            tracing::info!(server = %self.url, models = ?ids, adapters = ?adapters, "remote.models");
            *models = ids;
            *held = adapters;
            if let Some(epoch) = &self.models_epoch {
                epoch.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// The server's base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where the server's load figures come from.
    pub fn load_source(&self) -> LoadSource {
        *self
            .load_source
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn set_load_source(&self, source: LoadSource) {
        let mut held = self
            .load_source
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *held != source {
            tracing::info!(server = %self.url, from = ?*held, to = ?source, "remote.load_source");
            *held = source;
        }
    }

    /// The server's passive health.
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// The server's last reported load; full while it is unreachable or ejected.
    pub fn load(&self) -> LoadReport {
        let mut load = self
            .load
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if !self.is_reachable() {
            load.waiting = u32::MAX;
        }
        load
    }

    /// Whether requests should go there: the last poll reached it and it is not ejected.
    pub fn is_reachable(&self) -> bool {
        self.reachable.load(Ordering::Relaxed) && !self.health.is_ejected()
    }

    /// Its health with the reasons: whether it is reachable or ejected, why requests do not
    /// go there, and its last failure.
    pub fn health_report(&self) -> HealthReport {
        let reachable = self.reachable.load(Ordering::Relaxed);
        let ejected = self.health.is_ejected();
        let last_error = self.health.last_error();
        let poll_error = self
            .poll_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let reason = match (poll_error, &last_error) {
            (Some(why), _) if !reachable => Some(format!("its load poll fails: {why}")),
            (_, Some(last)) if ejected => Some(format!(
                "ejected after failures in a row, the last: {}",
                last.message
            )),
            _ => None,
        };
        HealthReport {
            reachable,
            ejected,
            reason,
            last_error,
        }
    }

    /// The load poll's outcome: `Err` keeps why it failed, as the reason the server is not
    /// routable and as its last failure.
    fn polled(&self, outcome: Result<(), String>) {
        let mut held = self
            .poll_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match outcome {
            Ok(()) => *held = None,
            Err(why) => {
                self.health.note_error(why.clone());
                *held = Some(why);
            }
        }
    }

    /// Starts `request` on the server. Returns once the reply's first event is in; the stream
    /// yields its events as a local engine would.
    ///
    /// Cancel safety: dropping the future drops the request, which closes its connection.
    pub async fn submit(&self, request: &UpstreamRequest) -> Result<Generation, RemoteError> {
        let result = self.start_reply(request).await;
        self.account(&result);
        result
    }

    /// Runs a prefill leg (a whole answer, asked for with [`UpstreamRequest::nixl_prefill`])
    /// and reads what the decode leg needs of it.
    ///
    /// Cancel safety: dropping the future drops the request, which closes its connection
    /// (the server aborts the prefill and frees its blocks).
    pub async fn prefill(&self, request: &UpstreamRequest) -> Result<PrefillAnswer, RemoteError> {
        let result = self.prefill_reply(request).await;
        self.account(&result);
        result
    }

    /// The server's health after an answer: a success, or a failure that counts towards
    /// ejecting it (a refusal is the request's fault, not the server's).
    fn account<T>(&self, result: &Result<T, RemoteError>) {
        match result {
            Ok(_) => self.health.success(),
            Err(RemoteError::Refused { .. }) => {}
            Err(e) => {
                self.health.note_error(e.to_string());
                if let Some(backoff) = self.health.failure(&self.settings) {
                    warn!(server = %self.url, error = %e, backoff_ms = backoff.as_millis() as u64, "remote.ejected");
                }
            }
        }
    }

    async fn prefill_reply(&self, request: &UpstreamRequest) -> Result<PrefillAnswer, RemoteError> {
        let (response, mut lease) = self
            .post(request, self.settings.whole_answer_timeout)
            .await?;
        let bytes = read_body(response.into_body(), &mut lease, &self.settings)
            .await
            .map_err(|why| RemoteError::Broken {
                url: self.url.clone(),
                why,
            })?;
        Ok(PrefillAnswer::read(&bytes, request.endpoint))
    }

    /// Posts `request` and waits up to `headers_timeout` for the answer's headers: the
    /// answer when it is a success, else the error its status and body say.
    async fn post(
        &self,
        request: &UpstreamRequest,
        headers_timeout: std::time::Duration,
    ) -> Result<(http::Response<Incoming>, Option<Lease>), RemoteError> {
        let whole = request.mode.is_whole();
        let endpoint = match request.endpoint {
            Endpoint::Chat => self.chat_url.clone(),
            Endpoint::Completions => self.completions_url.clone(),
            Endpoint::Messages => self.messages_url.clone(),
            Endpoint::Responses => self.responses_url.clone(),
        };
        let mut http_request = http::Request::post(endpoint)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(
                http::header::ACCEPT,
                if whole {
                    "application/json"
                } else {
                    "text/event-stream"
                },
            )
            .body(http_body_util::Full::new(request.body.clone()))
            .map_err(|e| RemoteError::Broken {
                url: self.url.clone(),
                why: format!("could not build the request: {e}"),
            })?;
        // The server's own credentials last: a client's header of the same name never
        // replaces them.
        for (name, value) in request
            .trace_context
            .iter()
            .chain(&request.headers)
            .chain(&self.credentials)
        {
            http_request
                .headers_mut()
                .insert(name.clone(), value.clone());
        }
        if request.endpoint == Endpoint::Messages
            && !http_request.headers().contains_key("anthropic-version")
        {
            // Every Messages server requires the version; the one Claude Code sends.
            http_request.headers_mut().insert(
                "anthropic-version",
                http::HeaderValue::from_static("2023-06-01"),
            );
        }
        let (response, mut lease) = tokio::time::timeout(headers_timeout, self.send(http_request))
            .await
            .map_err(|_| RemoteError::Unreachable {
                url: self.url.clone(),
                why: format!("no answer within {headers_timeout:?}"),
                timeout: true,
            })??;
        let status = response.status();
        if !status.is_success() {
            // An error body that cannot be read leaves the status as the message.
            let bytes = read_body(response.into_body(), &mut lease, &self.settings)
                .await
                .unwrap_or_default();
            let message = error_message(&bytes).unwrap_or_else(|| status.to_string());
            return Err(if status.as_u16() == 400 {
                RemoteError::Refused { message }
            } else {
                RemoteError::Failed {
                    url: self.url.clone(),
                    status: status.as_u16(),
                    message,
                }
            });
        }
        Ok((response, lease))
    }

    async fn start_reply(&self, request: &UpstreamRequest) -> Result<Generation, RemoteError> {
        let headers_timeout = if request.mode.is_whole() {
            self.settings.whole_answer_timeout
        } else {
            self.settings.first_byte_timeout
        };
        let (response, lease) = self.post(request, headers_timeout).await?;
        // One JSON answer (asked for, or sent where a stream was asked): read here, with no
        // reader task and no relay.
        let json_answer = response
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/json"));
        if json_answer {
            let keep = request.mode == ReplyMode::WholeRelayed;
            let (events, kept) = read_whole(
                response,
                lease,
                &self.settings,
                (request.endpoint.api(), keep),
            )
            .await;
            let generation = Generation::from(GenerationStream::from_events(events));
            return self
                .started(match kept {
                    Some(body) => generation.with_answer(body),
                    None => generation,
                })
                .await;
        }
        let relayed = request.mode == ReplyMode::Relayed;
        let reply = RemoteReply::new(
            response.into_body(),
            lease,
            &self.settings,
            (request.endpoint.api(), relayed),
            (self.url.clone(), request.request_id.clone()),
        );
        self.started(if relayed {
            Generation::relayed(Box::new(reply))
        } else {
            GenerationStream::from_source(Box::new(reply)).into()
        })
        .await
    }

    /// Sends `request` over the server's transport: the reply's headers, and for HTTP/1.1 the
    /// connection's lease, which the body's reader drives.
    async fn send(
        &self,
        request: http::Request<http_body_util::Full<bytes::Bytes>>,
    ) -> Result<(http::Response<Incoming>, Option<Lease>), RemoteError> {
        let unreachable = |why: String, timeout: bool| RemoteError::Unreachable {
            url: self.url.clone(),
            why,
            timeout,
        };
        match &self.transport {
            Transport::Http1(pool) => match pool.send(request).await {
                Ok((response, lease)) => Ok((response, Some(lease))),
                Err(ConnError::Connect { why, timeout, .. }) => Err(unreachable(why, timeout)),
                Err(ConnError::Http(e)) => Err(unreachable(error_chain(&e), false)),
            },
            Transport::Http2(client) => client
                .request(request)
                .await
                .map(|response| (response, None))
                .map_err(|e| unreachable(error_chain(&e), false)),
        }
    }

    /// Connections opened to the server so far over HTTP/1.1 (`None` over HTTP/2).
    pub fn connections_opened(&self) -> Option<u64> {
        match &self.transport {
            Transport::Http1(pool) => Some(pool.opened()),
            Transport::Http2(_) => None,
        }
    }

    /// Closes idle connections that expired or that the server closed.
    fn prune_idle(&self) {
        if let Transport::Http1(pool) = &self.transport {
            pool.prune();
        }
    }

    /// The reply's stream once its first event is in (within `first_token_timeout`), or why
    /// it never began.
    async fn started(&self, mut generation: Generation) -> Result<Generation, RemoteError> {
        let first = tokio::time::timeout(self.settings.first_token_timeout, generation.next())
            .await
            .map_err(|_| RemoteError::Unreachable {
                url: self.url.clone(),
                why: format!(
                    "no reply began within {:?}",
                    self.settings.first_token_timeout
                ),
                timeout: true,
            })?;
        match first {
            Some(GenerateEvent::Failed { message }) => Err(RemoteError::Broken {
                url: self.url.clone(),
                why: message,
            }),
            None => Err(RemoteError::Broken {
                url: self.url.clone(),
                why: "the reply ended with nothing in it".into(),
            }),
            Some(first) => Ok(generation.with_front(first)),
        }
    }
}

/// A whole JSON answer's events, its body read to the end (and its connection given back).
async fn read_whole(
    response: http::Response<Incoming>,
    mut lease: Option<Lease>,
    settings: &UpstreamSettings,
    (api, keep): (ringmaster_wire::Api, bool),
) -> (Vec<GenerateEvent>, Option<Vec<u8>>) {
    let mut decoder = if keep {
        dialects::Decoder::relaying(api)
    } else {
        dialects::Decoder::of(api)
    };
    let mut events = Vec::new();
    match read_body(response.into_body(), &mut lease, settings).await {
        Ok(bytes) => {
            decoder.whole(&bytes, &mut events);
            // Only an answer that decoded to a finish is worth relaying; a failure goes to
            // the client in the door's own error shape.
            let finished = matches!(events.last(), Some(GenerateEvent::Finished { .. }));
            return (events, (keep && finished).then_some(bytes));
        }
        Err(why) => decoder.fail(why, &mut events),
    }
    (events, None)
}

/// A body read to its end, at most `max_event_bytes` of it, with `chunk_gap_timeout` between
/// reads; else what went wrong. A body read to its end gives its connection back; one that
/// was not drops it.
async fn read_body(
    mut body: Incoming,
    lease: &mut Option<Lease>,
    settings: &UpstreamSettings,
) -> Result<Vec<u8>, String> {
    let gap = settings.chunk_gap_timeout;
    let mut bytes = Vec::new();
    let result = loop {
        match tokio::time::timeout(gap, conn::next_data(&mut body, lease.as_mut())).await {
            Ok(Some(Ok(chunk))) => {
                bytes.extend_from_slice(&chunk);
                if bytes.len() > settings.max_event_bytes {
                    break Err(format!(
                        "the server's answer is larger than {} bytes",
                        settings.max_event_bytes
                    ));
                }
            }
            Ok(Some(Err(e))) => break Err(format!("the reply broke off: {}", error_chain(&e))),
            Ok(None) => {
                if let Some(lease) = lease.take() {
                    lease.finished();
                }
                break Ok(bytes);
            }
            Err(_) => break Err(format!("the server sent nothing for {gap:?}")),
        }
    };
    *lease = None;
    result
}

/// How requests reach a server.
#[derive(Debug)]
enum Transport {
    /// HTTP/1.1: connections driven by the requests that hold them ([`conn`]).
    Http1(Arc<Http1Pool>),
    /// HTTP/2 with prior knowledge: hyper's pooled client, whose shared connections run in
    /// tasks of their own (one connection carries many requests).
    Http2(Box<RequestClient>),
}

/// How a remote server is reached beyond its URL: an `https://` server's TLS files, and the
/// credentials sent with every request.
#[derive(Clone, Debug, Default)]
pub struct RemoteAccess {
    /// The CA to trust (default: the system's roots) and a client certificate.
    pub tls: ringmaster_tls::ClientTlsFiles,
    /// The API key: `x-api-key` for a Messages server, `Authorization: Bearer` otherwise.
    pub api_key: Option<ringmaster_config::Secret>,
    /// Whether the server speaks Anthropic's Messages (which takes its key as `x-api-key`).
    pub messages_api: bool,
    /// Extra headers (lower-case names).
    pub headers: Vec<(String, ringmaster_config::Secret)>,
}

impl RemoteAccess {
    /// How the configured server `spec` is reached.
    pub fn of(spec: &ringmaster_config::ServerSpec) -> Self {
        let access = &spec.access;
        Self {
            tls: ringmaster_tls::ClientTlsFiles {
                ca_file: access.ca_file.clone(),
                client_cert: access.client_cert.clone(),
            },
            api_key: access.api_key.as_ref().map(|(_, key)| key.clone()),
            messages_api: spec.protocol.api == ringmaster_config::ServerApi::Messages,
            headers: access.headers.clone(),
        }
    }

    /// The credential headers, each marked sensitive (the config checked every name and
    /// value; one that still does not convert is left out).
    fn headers(&self) -> Vec<(http::HeaderName, http::HeaderValue)> {
        let secret = |text: &str| {
            http::HeaderValue::from_str(text).ok().map(|mut value| {
                value.set_sensitive(true);
                value
            })
        };
        let key = self.api_key.as_ref().and_then(|key| {
            if self.messages_api {
                Some((
                    http::HeaderName::from_static("x-api-key"),
                    secret(key.expose())?,
                ))
            } else {
                let bearer = format!("Bearer {}", key.expose());
                Some((http::header::AUTHORIZATION, secret(&bearer)?))
            }
        });
        key.into_iter()
            .chain(self.headers.iter().filter_map(|(name, value)| {
                Some((
                    http::HeaderName::from_bytes(name.as_bytes()).ok()?,
                    secret(value.expose())?,
                ))
            }))
            .collect()
    }
}

/// The pooled client HTTP/2 requests go through.
type RequestClient =
    hyper_util::client::legacy::Client<side::Connector, http_body_util::Full<bytes::Bytes>>;

/// An error with its sources, which is where the client says what actually failed. A failed
/// TLS handshake says first, in words, what is wrong with the server's certificate and what
/// to do (`ringmaster_tls::handshake_failure`), then rustls's own terms.
pub(super) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    match ringmaster_tls::handshake_failure(error) {
        Some(why) => format!("{TLS_FAILED}{why} ({text})"),
        None => text,
    }
}

/// How every message of a failed TLS handshake with a server begins.
pub(super) const TLS_FAILED: &str = "TLS handshake failed: ";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::RelayState;
    use proptest::prelude::*;
    use request::{Target, wire_request};
    use ringmaster_gpu_runtime::GenerateRequest;

    /// What the relay does with a reply's bytes, read `split` bytes at a time.
    fn read_reply(bytes: &[u8], split: usize, limit: usize) -> Vec<GenerateEvent> {
        let mut reader = ReplyReader::new(limit);
        let mut events = Vec::new();
        for piece in bytes.chunks(split.max(1)) {
            reader.feed(piece, &mut events);
        }
        reader.end(&mut events);
        events
    }

    fn ends(events: &[GenerateEvent]) -> usize {
        events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    GenerateEvent::Finished { .. } | GenerateEvent::Failed { .. }
                )
            })
            .count()
    }

    proptest! {
        /// Any bytes, split anywhere, end exactly once, last; nothing panics.
        #[test]
        fn any_reply_bytes_end_exactly_once(
            bytes in proptest::collection::vec(any::<u8>(), 0..2048),
            split in 1usize..64,
        ) {
            let events = read_reply(&bytes, split, 512);
            prop_assert_eq!(ends(&events), 1);
            let last_ends = matches!(
                events.last(),
                Some(GenerateEvent::Finished { .. } | GenerateEvent::Failed { .. })
            );
            prop_assert!(last_ends);
        }

        /// A well-formed stream gives the same events however it is split.
        #[test]
        fn a_stream_reads_the_same_at_any_split(split in 1usize..200, tokens in 0usize..20) {
            let mut stream = String::new();
            for i in 0..tokens {
                stream.push_str(&format!(
                    "data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i} \\u00e9\"}}}}]}}\r\n\r\n"
                ));
            }
            stream.push_str("data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n");
            stream.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\ndata: [DONE]\n\n");
            let whole = read_reply(stream.as_bytes(), stream.len(), 4096);
            let split_up = read_reply(stream.as_bytes(), split, 4096);
            prop_assert_eq!(&whole, &split_up);
            prop_assert_eq!(whole.len(), tokens + 2);
            let finished = matches!(
                whole.last(),
                Some(GenerateEvent::Finished { output_tokens: 7, prompt_tokens: 5, .. })
            );
            prop_assert!(finished);
        }
    }

    #[test]
    fn a_relaying_reader_keeps_the_content_chunks_as_sent_and_nothing_else() {
        let content = [
            r#"{"id":"chatcmpl-7","choices":[{"delta":{"role":"assistant","content":"Hi"}}]}"#,
            r#"{"id":"chatcmpl-7","choices":[{"delta":{"content":" there"}}],"usage":{"prompt_tokens":3,"completion_tokens":2}}"#,
            r#"{"id":"chatcmpl-7","choices":[{"delta":{},"finish_reason":"stop"}]}"#,
        ];
        let mut stream = String::new();
        for chunk in content {
            stream.push_str(&format!("data: {chunk}\r\n\r\n"));
        }
        stream.push_str("data: {\"id\":\"chatcmpl-7\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n");
        let mut reader = ReplyReader::relaying(4096);
        let mut events = Vec::new();
        let (first, rest) = stream.as_bytes().split_at(40);
        reader.feed(first, &mut events);
        reader.feed(rest, &mut events);
        reader.end(&mut events);
        let relayed = String::from_utf8(reader.take_relayed().unwrap()).unwrap();
        let expected: String = content.iter().map(|c| format!("data: {c}\n\n")).collect();
        assert_eq!(
            relayed, expected,
            "the usage chunk and [DONE] are not relayed"
        );
        assert_eq!(reader.take_relayed(), None, "taken once");
        assert_eq!(
            reader.relay_state(),
            Some(RelayState {
                reply_id: Some("chatcmpl-7".into()),
                finish_relayed: true
            })
        );
        assert!(matches!(
            events.last(),
            Some(GenerateEvent::Finished {
                output_tokens: 2,
                ..
            })
        ));
        // The relay's events count the tokens and copy no text: the server's bytes carry it.
        let tokens: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                GenerateEvent::Token { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(tokens, ["", ""]);
        // Without a relay nothing is kept, and the events carry the text.
        let mut plain = ReplyReader::new(4096);
        let mut events = Vec::new();
        plain.feed(stream.as_bytes(), &mut events);
        assert!(
            events
                .iter()
                .any(|e| matches!(e, GenerateEvent::Token { text } if text == " there"))
        );
        assert_eq!(plain.take_relayed(), None);
        assert_eq!(plain.relay_state(), None);
    }

    fn raw_prompt_request() -> GenerateRequest {
        GenerateRequest {
            request_id: "r".into(),
            system: None,
            messages: Vec::new(),
            max_tokens: 1,
            stop_sequences: Vec::new(),
            sampling: Default::default(),
            prompt: Some("x".into()),
            priority: 0,
            tools: None,
            effort: None,
            output_format: None,
        }
    }

    #[tokio::test]
    async fn a_hung_server_is_unreachable_after_the_first_byte_timeout() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                held.push(conn);
            }
        });
        let settings = UpstreamSettings {
            first_byte_timeout: Duration::from_millis(300),
            ..UpstreamSettings::default()
        };
        let worker = RemoteWorker::start_with(&url, settings).unwrap();
        let request = UpstreamRequest::encode(&raw_prompt_request(), "m", ReplyMode::Stream);
        let err = worker.submit(&request).await.unwrap_err();
        assert!(matches!(err, RemoteError::Unreachable { .. }), "{err}");
        assert!(err.to_string().contains("no answer within"), "{err}");
        assert!(err.is_retryable());
        assert_eq!(err.outcome(), "timeout");
    }

    #[tokio::test]
    async fn a_server_that_fails_says_why_until_it_answers_and_keeps_its_last_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap();
        drop(listener);
        let settings = UpstreamSettings {
            eject_after_failures: 1,
            ..UpstreamSettings::default()
        };
        let worker = RemoteWorker::start_with(&format!("http://{address}"), settings).unwrap();
        assert_eq!(worker.health_report().reason, None, "nothing known yet");
        // A request fails: it is ejected, and says why (unless the load poll, running
        // meanwhile, failed first: then that is why).
        let request = UpstreamRequest::encode(&raw_prompt_request(), "m", ReplyMode::Stream);
        let err = worker.submit(&request).await.unwrap_err();
        let report = worker.health_report();
        assert!(report.ejected, "{report:?}");
        let reason = report.reason.unwrap_or_default();
        assert!(
            reason == format!("ejected after failures in a row, the last: {err}")
                || reason.starts_with("its load poll fails: "),
            "{reason}"
        );
        // Its load poll fails too: that is the reason now, and the last failure.
        tokio::time::sleep(LOAD_POLL_INTERVAL * 3).await;
        let report = worker.health_report();
        assert!(!report.reachable, "{report:?}");
        let reason = report.reason.unwrap_or_default();
        assert!(reason.starts_with("its load poll fails: "), "{reason}");
        let last = report.last_error.expect("the last failure is kept");
        assert!(reason.ends_with(&last.message), "{reason} / {last:?}");
        assert!(last.at_unix_ms > 0);
    }

    #[test]
    fn consecutive_failures_eject_for_a_growing_backoff_and_success_resets_it() {
        let settings = UpstreamSettings {
            eject_after_failures: 2,
            eject_base: Duration::from_millis(40),
            eject_max: Duration::from_millis(100),
            ..UpstreamSettings::default()
        };
        let health = Health::default();
        assert_eq!(health.failure(&settings), None);
        assert!(!health.is_ejected());
        assert_eq!(health.failure(&settings), Some(Duration::from_millis(40)));
        assert!(health.is_ejected());
        health.failure(&settings);
        assert_eq!(health.failure(&settings), Some(Duration::from_millis(80)));
        health.failure(&settings);
        assert_eq!(health.failure(&settings), Some(Duration::from_millis(100)));
        std::thread::sleep(Duration::from_millis(110));
        assert!(!health.is_ejected(), "the ejection ends by itself");
        health.success();
        health.failure(&settings);
        assert_eq!(health.failure(&settings), Some(Duration::from_millis(40)));
        assert_eq!(health.ejections_total(), 4);
    }

    #[test]
    fn retryable_errors_are_the_ones_another_server_can_fix() {
        let failed = |status| RemoteError::Failed {
            url: "u".into(),
            status,
            message: "m".into(),
        };
        assert!(failed(500).is_retryable());
        assert!(failed(503).is_retryable());
        assert!(failed(429).is_retryable());
        assert!(!failed(404).is_retryable());
        assert!(
            !RemoteError::Refused {
                message: "m".into()
            }
            .is_retryable()
        );
        assert_eq!(failed(503).outcome(), "status-503");
    }

    #[test]
    fn a_raw_prompt_goes_to_completions_and_a_chat_to_chat_completions() {
        let mut request = GenerateRequest {
            request_id: "r".into(),
            system: Some("Be brief.".into()),
            messages: vec![ringmaster_gpu_runtime::ChatMessage {
                role: ringmaster_gpu_runtime::Role::User,
                text: "Hi".into(),
                ..Default::default()
            }],
            max_tokens: 9,
            stop_sequences: vec!["x".into()],
            sampling: Default::default(),
            prompt: None,
            priority: 3,
            tools: None,
            effort: Some(ringmaster_gpu_runtime::Effort::High),
            output_format: None,
        };
        let (path, body) = wire_request(&request, "served-name", false, Target::default());
        let body = serde_json::to_value(body).unwrap();
        assert_eq!(path, Endpoint::Chat);
        assert_eq!(body["model"], "served-name");
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][1]["content"], "Hi");
        assert!(
            body.get("ringmaster_priority").is_none(),
            "only a ringmaster worker is told its priority"
        );
        assert!(
            body.get("reasoning_effort").is_none(),
            "only a reasoning server is told the effort"
        );
        let worker = Target {
            ringmaster: true,
            reasoning: true,
            vllm: true,
            ..Target::default()
        };
        let (_, body) = wire_request(&request, "served-name", false, worker);
        let body = serde_json::to_value(body).unwrap();
        assert_eq!(body["ringmaster_priority"], 3);
        assert_eq!(body["reasoning_effort"], "high");
        assert_eq!(body["stop"], serde_json::json!(["x"]));
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert!(body.get("temperature").is_none());
        request.prompt = Some("Once".into());
        let (path, body) = wire_request(&request, "m", false, Target::default());
        let body = serde_json::to_value(body).unwrap();
        assert_eq!(path, Endpoint::Completions);
        assert_eq!(body["prompt"], "Once");
        assert!(body.get("messages").is_none());
    }
}
