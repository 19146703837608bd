//! A fake OpenAI-compatible server on loopback, for the end-to-end tests and the overhead
//! benchmark: it answers at once, in the stream shape of a chosen real server, or with a
//! chosen fault. It also answers Anthropic's `/v1/messages` and OpenAI's `/v1/responses`
//! (for a proxy that passes requests through unchanged, like HAProxy in the benchmark, and
//! for servers of those APIs behind the gateway) and counts the connections it accepted, so a
//! test can tell whether a client reuses them. [`Behavior::Strict`] refuses, as OpenAI does,
//! every chat field OpenAI does not define.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ringmaster_wire::models::ModelList;
use ringmaster_wire::{anthropic, openai, sse};
use tokio::net::TcpListener;

/// How the fake server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// vLLM with `continuous_usage_stats`: usage in every chunk, then a usage chunk, `[DONE]`.
    Vllm,
    /// OpenAI's `include_usage`: no usage in the chunks, a usage chunk of its own, `[DONE]`.
    OpenAi,
    /// TGI and llama.cpp's server: usage (and llama.cpp's `timings`) in the finishing chunk.
    UsageInFinish,
    /// Ollama without `stream_options`: no usage at all, `[DONE]`.
    NoUsage,
    /// A stream that ends with the body (EOF), without `[DONE]`.
    EofOnly,
    /// A whole JSON answer where a stream was asked.
    Whole,
    /// `finish_reason: "tool_calls"`.
    ToolCalls,
    /// vLLM's stream, after 600 ms without a byte (a long prefill behind a queue).
    SlowStart,
    /// No text: a call of the first tool the request offers (`get_weather` if none), its
    /// arguments `{"city": "Paris"}` in three pieces, as vLLM streams calls (or whole).
    CallsTool,
    /// HTTP 500 with an OpenAI error body.
    Status500,
    /// HTTP 429.
    Status429,
    /// Accepts the connection, reads the request, never answers.
    Hang,
    /// A stream of malformed JSON.
    Garbage,
    /// One token, then the connection is cut.
    CloseAfterToken,
    /// The headers, then the connection is cut before any event.
    CloseBeforeFirst,
    /// One token, then an error object in the stream.
    ErrorMidStream,
    /// A `data:` line that never ends.
    EndlessLine,
    /// vLLM's stream at a decode's pace: one token every [`PACE`] (a stream long enough to
    /// cut in the middle).
    Paced,
    /// OpenAI's own strictness: a chat request with a field (or a `stream_options` field)
    /// OpenAI does not define is refused with a 400 naming it; else OpenAI's stream shape.
    Strict,
    /// A reasoning model (vLLM with a reasoning parser): `reasoning_content` deltas, then the
    /// text.
    Reasons,
}

/// The fields of OpenAI's chat completions request (and of `stream_options`): what
/// [`Behavior::Strict`] takes.
pub const OPENAI_CHAT_FIELDS: [&str; 37] = [
    "model",
    "messages",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
    "include_obfuscation",
    "include_usage",
];

/// Why a strict server refuses `body`, if it does: the first field OpenAI does not define.
pub fn openai_strict_refusal(body: &[u8]) -> Option<String> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let object = value.as_object()?;
    let known = |key: &str| OPENAI_CHAT_FIELDS[..35].contains(&key);
    if let Some(key) = object.keys().find(|k| !known(k)) {
        return Some(format!("Unrecognized request argument supplied: {key}"));
    }
    let options = object.get("stream_options").and_then(|o| o.as_object())?;
    options
        .keys()
        .find(|k| !OPENAI_CHAT_FIELDS[35..].contains(&k.as_str()))
        .map(|key| format!("Unrecognized request argument supplied: stream_options.{key}"))
}

/// The gap between tokens of [`Behavior::Paced`].
pub const PACE: Duration = Duration::from_millis(20);

/// The models a fake server lists: ids with their `parent`.
pub type Listed = Vec<(String, Option<String>)>;

/// What a fake server demands beyond HTTP: TLS with its own certificate (and, as that
/// configuration says, a client certificate), and headers every request must carry (an API
/// key, an organisation), refused with 401 otherwise.
#[derive(Clone, Debug, Default)]
pub struct Demands {
    /// Serve HTTPS with this configuration.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `(name, value)` pairs every request must carry.
    pub headers: Vec<(String, String)>,
}

/// How many of the last generation requests [`FakeUpstream::received`] keeps.
pub const KEPT_RECEIVED: usize = 256;

/// One generation request as the fake server got it.
#[derive(Clone, Debug)]
pub struct Received {
    /// Its path (`/v1/chat/completions`).
    pub path: String,
    /// Its headers.
    pub headers: http::HeaderMap,
    /// Its body.
    pub body: Bytes,
}

/// A running fake server; it stops when dropped.
#[derive(Debug)]
pub struct FakeUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub connections: Arc<AtomicUsize>,
    /// Requests answered so far (chat, completions and messages).
    pub requests: Arc<AtomicUsize>,
    /// The body of the last request (chat, completions and messages).
    pub last_request: Arc<std::sync::Mutex<Bytes>>,
    /// Each generation request's `traceparent` header, in order of arrival.
    pub traceparents: Arc<std::sync::Mutex<Vec<Option<String>>>>,
    /// The last [`KEPT_RECEIVED`] generation requests' paths, headers and bodies, in order of
    /// arrival.
    pub received: Arc<std::sync::Mutex<Vec<Received>>>,
    /// What `GET /metrics` answers (Prometheus text); `None`: no such endpoint.
    pub metrics: Arc<std::sync::Mutex<Option<String>>>,
    /// What `GET /v1/models` lists: ids with their `parent` (a LoRA adapter's base model).
    pub models: Arc<std::sync::Mutex<Listed>>,
    /// Requests refused for a missing or wrong header its [`Demands`] named.
    pub unauthorized: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeUpstream {
    /// Starts a server on 127.0.0.1 (port 0) that answers with `behavior`, streaming `tokens`
    /// text chunks.
    pub async fn start(behavior: Behavior, tokens: usize) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(listener, behavior, tokens)
    }

    /// Serves `listener` with `behavior`.
    pub fn serve(listener: TcpListener, behavior: Behavior, tokens: usize) -> Self {
        Self::serve_demanding(listener, behavior, tokens, Demands::default())
    }

    /// Serves `listener` with `behavior` to clients that meet `demands`.
    pub fn serve_demanding(
        listener: TcpListener,
        behavior: Behavior,
        tokens: usize,
        demands: Demands,
    ) -> Self {
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(AtomicUsize::new(0));
        let last_request = Arc::new(std::sync::Mutex::new(Bytes::new()));
        let traceparents = Arc::new(std::sync::Mutex::new(Vec::new()));
        let received = Arc::new(std::sync::Mutex::new(Vec::new()));
        let metrics = Arc::new(std::sync::Mutex::new(None));
        let models = Arc::new(std::sync::Mutex::new(vec![("fake".to_owned(), None)]));
        let state = State {
            requests: requests.clone(),
            connections: connections.clone(),
            last_request: last_request.clone(),
            traceparents: traceparents.clone(),
            received: received.clone(),
            metrics: metrics.clone(),
            models: models.clone(),
        };
        let unauthorized = Arc::new(AtomicUsize::new(0));
        let refused = unauthorized.clone();
        let required = Arc::new(demands.headers);
        let acceptor = demands.tls.map(tokio_rustls::TlsAcceptor::from);
        let task = tokio::spawn(async move {
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            while let Ok((stream, _)) = listener.accept().await {
                state.connections.fetch_add(1, Ordering::Relaxed);
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                let builder = builder.clone();
                let (required, refused) = (required.clone(), refused.clone());
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let state = state.clone();
                        let missing = required
                            .iter()
                            .find(|(name, value)| {
                                req.headers()
                                    .get(name.as_str())
                                    .and_then(|v| v.to_str().ok())
                                    != Some(value.as_str())
                            })
                            .map(|(name, _)| name.clone());
                        if missing.is_some() {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        async move {
                            Ok::<_, Infallible>(match missing {
                                Some(name) => json(
                                    StatusCode::UNAUTHORIZED,
                                    &serde_json::json!({"error": {
                                        "message": format!("missing or wrong {name}"),
                                        "type": "authentication_error"}}),
                                ),
                                None => answer(req, behavior, tokens, &state).await,
                            })
                        }
                    });
                    match acceptor {
                        None => {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                        Some(acceptor) => {
                            if let Ok(tls) = acceptor.accept(stream).await {
                                let _ = builder.serve_connection(TokioIo::new(tls), service).await;
                            }
                        }
                    }
                });
            }
        });
        Self {
            addr,
            connections,
            requests,
            last_request,
            traceparents,
            received,
            metrics,
            models,
            unauthorized,
            task,
        }
    }

    /// Lists `models` at `GET /v1/models` from now on: `(id, parent)`, a parent naming a LoRA
    /// adapter's base model as vLLM lists it.
    pub fn set_models(&self, models: &[(&str, Option<&str>)]) {
        *self
            .models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = models
            .iter()
            .map(|(id, parent)| ((*id).to_owned(), parent.map(str::to_owned)))
            .collect();
    }

    /// Answers `GET /metrics` with `text` from now on (`None`: as a server without it).
    pub fn set_metrics(&self, text: Option<&str>) {
        *self
            .metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = text.map(str::to_owned);
    }

    /// The last request's body as JSON (`null` before any).
    pub fn last_request_json(&self) -> serde_json::Value {
        let body = self
            .last_request
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null)
    }

    /// The last [`KEPT_RECEIVED`] generation requests received.
    pub fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `https://localhost:PORT`, the name a test certificate is made for.
    pub fn https_url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, std::io::Error>;

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(
        Full::new(body.into())
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    response
}

fn sse(frames: Vec<Result<Bytes, std::io::Error>>) -> Response<Body> {
    // A cut waits a moment, so that what came before it is on the wire first (hyper drops
    // what it has buffered when a body fails).
    let frames = futures_util::StreamExt::then(stream::iter(frames), |frame| async move {
        if frame.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        frame.map(Frame::data)
    });
    let body = StreamBody::new(frames);
    let mut response = Response::new(BodyExt::boxed(body));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
}

fn data(value: &impl serde::Serialize) -> Result<Bytes, std::io::Error> {
    let mut frame = Vec::with_capacity(192);
    sse::data(&mut frame, value);
    Ok(Bytes::from(frame))
}

fn json(status: StatusCode, value: &impl serde::Serialize) -> Response<Body> {
    full(
        status,
        "application/json",
        serde_json::to_vec(value).unwrap_or_default(),
    )
}

fn cut() -> Result<Bytes, std::io::Error> {
    Err(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "cut by the fake server",
    ))
}

fn done() -> Result<Bytes, std::io::Error> {
    Ok(Bytes::from_static(openai::DONE))
}

/// What the server counts and keeps of its requests, and what it answers at `/metrics`.
#[derive(Clone, Debug)]
struct State {
    metrics: Arc<std::sync::Mutex<Option<String>>>,
    models: Arc<std::sync::Mutex<Listed>>,
    requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    last_request: Arc<std::sync::Mutex<Bytes>>,
    traceparents: Arc<std::sync::Mutex<Vec<Option<String>>>>,
    received: Arc<std::sync::Mutex<Vec<Received>>>,
}

/// vLLM's runtime LoRA endpoints (`VLLM_ALLOW_RUNTIME_LORA_UPDATING`): a load adds the adapter
/// to `/v1/models` with `fake` as its parent, an unload takes it off; as vLLM, 400 for an
/// adapter already loaded or not there.
fn lora_adapter(path: &str, body: &[u8], models: &std::sync::Mutex<Listed>) -> Response<Body> {
    let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let Some(name) = request["lora_name"].as_str() else {
        return full(
            StatusCode::BAD_REQUEST,
            "text/plain",
            "lora_name is required",
        );
    };
    let mut models = models
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let held = models.iter().any(|(id, _)| id == name);
    match (path, held) {
        ("/v1/load_lora_adapter", false) => {
            models.push((name.to_owned(), Some("fake".to_owned())));
            full(
                StatusCode::OK,
                "text/plain",
                format!("Success: LoRA adapter '{name}' added successfully."),
            )
        }
        ("/v1/load_lora_adapter", true) => full(
            StatusCode::BAD_REQUEST,
            "application/json",
            format!(
                r#"{{"object":"error","message":"The lora adapter '{name}' has already been loaded.","code":400}}"#
            ),
        ),
        (_, true) => {
            models.retain(|(id, _)| id != name);
            full(
                StatusCode::OK,
                "text/plain",
                format!("Success: LoRA adapter '{name}' removed successfully."),
            )
        }
        (_, false) => full(
            StatusCode::BAD_REQUEST,
            "application/json",
            format!(
                r#"{{"object":"error","message":"The lora adapter '{name}' cannot be found.","code":400}}"#
            ),
        ),
    }
}

/// The fake's prompt and cache counts: 12 prompt tokens, 4 of them cached.
fn usage(completion: usize) -> openai::Usage {
    openai::Usage::new(12, 4, u32::try_from(completion).unwrap_or(u32::MAX))
}

/// The answers' shapes for one request.
struct Shapes {
    completions: bool,
}

impl Shapes {
    fn chunk<'a>(
        &self,
        content: &'a str,
        finish: Option<&'a str>,
        usage: Option<openai::Usage>,
    ) -> openai::Chunk<'a> {
        let choice = if self.completions {
            openai::Choice {
                text: Some(content.into()),
                finish_reason: finish.map(Into::into),
                ..openai::Choice::default()
            }
        } else {
            openai::Choice {
                delta: Some(openai::Delta {
                    content: Some(content.into()),
                    ..openai::Delta::default()
                }),
                finish_reason: finish.map(Into::into),
                ..openai::Choice::default()
            }
        };
        openai::Chunk {
            id: Some("chatcmpl-fake".into()),
            object: Some(openai::CHAT_CHUNK.into()),
            created: Some(0),
            model: Some("fake".into()),
            choices: vec![choice],
            usage,
            ..openai::Chunk::default()
        }
    }

    fn usage_chunk(&self, tokens: usize) -> openai::Chunk<'static> {
        openai::Chunk {
            id: Some("chatcmpl-fake".into()),
            object: Some(openai::CHAT_CHUNK.into()),
            usage: Some(usage(tokens)),
            ..openai::Chunk::default()
        }
    }

    /// A whole OpenAI answer with `tokens` text tokens.
    fn whole(&self, tokens: usize, finish: &str, with_usage: bool) -> Response<Body> {
        self.whole_with(tokens, finish, with_usage, None)
    }

    /// A whole chat answer with its reasoning (vLLM's `reasoning_content`) and `tokens` text
    /// tokens, the reasoning counted as 2 more.
    fn whole_reasoning(&self, tokens: usize) -> Response<Body> {
        self.whole_with(tokens, "stop", true, Some("Let me think."))
    }

    fn whole_with(
        &self,
        tokens: usize,
        finish: &str,
        with_usage: bool,
        reasoning: Option<&str>,
    ) -> Response<Body> {
        let text = "tok ".repeat(tokens);
        let choice = if self.completions {
            openai::Choice {
                text: Some(text.as_str().into()),
                finish_reason: Some(finish.into()),
                ..openai::Choice::default()
            }
        } else {
            openai::Choice {
                message: Some(openai::ReplyMessage {
                    role: Some("assistant".into()),
                    content: Some(text.as_str().into()),
                    reasoning_content: reasoning.map(Into::into),
                    ..openai::ReplyMessage::default()
                }),
                finish_reason: Some(finish.into()),
                ..openai::Choice::default()
            }
        };
        let counted = tokens + if reasoning.is_some() { 2 } else { 0 };
        json(
            StatusCode::OK,
            &openai::Chunk {
                id: Some("x".into()),
                // What vLLM names each endpoint's answer.
                object: Some(
                    if self.completions {
                        openai::TEXT_COMPLETION
                    } else {
                        openai::CHAT_COMPLETION
                    }
                    .into(),
                ),
                choices: vec![choice],
                usage: with_usage.then(|| usage(counted)),
                ..openai::Chunk::default()
            },
        )
    }
}

/// vLLM's answer to a NixlConnector prefill leg: one token, and the `kv_transfer_params` that
/// tell the decode server where to pull the blocks from.
fn nixl_prefill(body: &[u8]) -> Response<Body> {
    let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let prompt = request.to_string().len() / 4;
    json(
        StatusCode::OK,
        &serde_json::json!({
            "id": "chatcmpl-prefill",
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": "tok"}}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": 1,
                      "total_tokens": prompt + 1},
            "kv_transfer_params": {
                "do_remote_prefill": true, "do_remote_decode": false,
                "remote_block_ids": [0, 1, 2], "remote_engine_id": "fake-prefill-engine",
                "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1,
            },
        }),
    )
}

/// A call of `name` with `arguments`: the first piece names it.
fn call<'a>(name: Option<&'a str>, arguments: &'a str) -> openai::ToolCall<'a> {
    openai::ToolCall {
        index: Some(0),
        id: name.map(|_| "call_fake_1".into()),
        kind: name.map(|_| "function".into()),
        function: Some(openai::FunctionCall {
            name: name.map(Into::into),
            arguments: Some(openai::Arguments::Text(arguments.into())),
        }),
    }
}

/// A streamed piece of a tool call.
fn call_piece<'a>(call: openai::ToolCall<'a>) -> openai::Chunk<'a> {
    openai::Chunk {
        id: Some("chatcmpl-fake".into()),
        object: Some(openai::CHAT_CHUNK.into()),
        model: Some("fake".into()),
        choices: vec![openai::Choice {
            delta: Some(openai::Delta {
                tool_calls: Some(vec![call]),
                ..openai::Delta::default()
            }),
            ..openai::Choice::default()
        }],
        ..openai::Chunk::default()
    }
}

/// The arguments every fake call carries, as vLLM streams them: in pieces.
const CALL_ARGUMENTS: [&str; 2] = ["{\"city\": ", "\"Paris\"}"];

async fn answer(
    req: Request<Incoming>,
    behavior: Behavior,
    tokens: usize,
    state: &State,
) -> Response<Body> {
    let State {
        requests,
        connections,
        last_request,
        traceparents,
        received,
        metrics,
        models,
    } = state;
    let path = req.uri().path().to_owned();
    let headers = req.headers().clone();
    let traceparent = req
        .headers()
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if req.method() == hyper::Method::GET {
        let served_metrics = metrics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if path == "/metrics"
            && let Some(text) = served_metrics
        {
            return full(StatusCode::OK, "text/plain; version=0.0.4", text);
        }
        return match path.as_str() {
            // For the benchmark: connections accepted and requests answered so far.
            "/stats" => json(
                StatusCode::OK,
                &serde_json::json!({
                    "connections": connections.load(Ordering::Relaxed),
                    "requests": requests.load(Ordering::Relaxed),
                }),
            ),
            // A `ringmaster worker`'s own endpoints: an ordinary OpenAI server has none.
            "/load" | "/tokenizer" | "/kv/events" => json(
                StatusCode::NOT_FOUND,
                &openai::ErrorResponse::new("not_found_error", "not found", None),
            ),
            // `/health`, `/v1/models`, and what the peer routers ask of a worker at start
            // (SGLang's `/get_model_info`, `/get_server_info`): one answer that satisfies each.
            _ => {
                let models = models
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                let ids: Vec<String> = models.iter().map(|(id, _)| id.clone()).collect();
                let mut list = ModelList::new(&ids, "fake");
                for (entry, (_, parent)) in list.data.iter_mut().zip(&models) {
                    entry.parent = parent.as_deref().map(Into::into);
                }
                let mut listed = serde_json::to_value(list).unwrap_or_default();
                for (key, value) in [
                    ("model_path", serde_json::json!("fake")),
                    ("tokenizer_path", serde_json::json!("fake")),
                    ("is_generation", serde_json::json!(true)),
                ] {
                    listed[key] = value;
                }
                json(StatusCode::OK, &listed)
            }
        };
    }
    let body = req.into_body().collect().await.map(|b| b.to_bytes());
    let Ok(body) = body else {
        return full(StatusCode::BAD_REQUEST, "application/json", "{}");
    };
    if path == "/v1/load_lora_adapter" || path == "/v1/unload_lora_adapter" {
        return lora_adapter(&path, &body, models);
    }
    requests.fetch_add(1, Ordering::Relaxed);
    traceparents
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(traceparent);
    *last_request
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = body.clone();
    {
        let mut received = received
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // A benchmark sends this server millions of requests: the tests need the last few.
        if received.len() >= KEPT_RECEIVED {
            received.remove(0);
        }
        received.push(Received {
            path: path.clone(),
            headers,
            body: body.clone(),
        });
    }
    if path == "/v1/messages" {
        let streamed = serde_json::from_slice::<anthropic::Request<'_>>(&body)
            .ok()
            .and_then(|r| r.stream)
            .unwrap_or(false);
        return messages(streamed, tokens);
    }
    if path == "/v1/responses" {
        let request: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        return responses(request["stream"] == true, tokens);
    }
    if behavior == Behavior::Strict
        && let Some(refusal) = openai_strict_refusal(&body)
    {
        return json(
            StatusCode::BAD_REQUEST,
            &openai::ErrorResponse::new("invalid_request_error", &refusal, None),
        );
    }
    let request = serde_json::from_slice::<openai::Request<'_>>(&body).unwrap_or_default();
    let streamed = request.stream.unwrap_or(false);
    // The name of the first tool the request offers (`get_weather` if none).
    let offered = request
        .tools
        .as_ref()
        .and_then(|tools| tools.first()?.function.as_ref()?.name.as_deref())
        .unwrap_or("get_weather")
        .to_owned();
    let shapes = Shapes {
        completions: path == "/v1/completions",
    };
    // A vLLM prefill leg (NixlConnector: `kv_transfer_params.do_remote_decode`) gets the
    // parameters a decode leg needs back, as vLLM's `request_finished` returns them
    // (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py), with the one token.
    if behavior == Behavior::Vllm && body.windows(16).any(|w| w == b"do_remote_decode") {
        return nixl_prefill(&body);
    }
    // A request that does not ask for a stream gets one JSON answer, as real servers do.
    if !streamed {
        match behavior {
            Behavior::Vllm
            | Behavior::UsageInFinish
            | Behavior::EofOnly
            | Behavior::Whole
            | Behavior::Paced
            | Behavior::SlowStart => return shapes.whole(tokens, "stop", true),
            Behavior::Reasons => return shapes.whole_reasoning(tokens),
            Behavior::OpenAi | Behavior::Strict => return shapes.whole(tokens, "length", true),
            Behavior::ToolCalls => return shapes.whole(tokens, "tool_calls", true),
            Behavior::CallsTool => return whole_tool_call(&offered),
            Behavior::NoUsage => return shapes.whole(tokens, "stop", false),
            _ => {}
        }
    }
    let mut frames = Vec::new();
    let body_tokens = |frames: &mut Vec<_>, usage_so_far: bool| {
        for i in 0..tokens {
            let mut chunk = shapes.chunk("tok ", None, usage_so_far.then(|| usage(i + 1)));
            if i == 0
                && let Some(delta) = chunk.choices[0].delta.as_mut()
            {
                // As TGI and llama.cpp's server do: the role comes with the first text.
                delta.role = Some("assistant".into());
            }
            frames.push(data(&chunk));
        }
    };
    match behavior {
        Behavior::Vllm | Behavior::SlowStart | Behavior::Paced => {
            if behavior == Behavior::SlowStart {
                tokio::time::sleep(Duration::from_millis(600)).await;
            }
            body_tokens(&mut frames, true);
            frames.push(data(&shapes.chunk("", Some("stop"), Some(usage(tokens)))));
            frames.push(data(&shapes.usage_chunk(tokens)));
            frames.push(done());
        }
        Behavior::OpenAi | Behavior::Strict => {
            body_tokens(&mut frames, false);
            frames.push(data(&shapes.chunk("", Some("length"), None)));
            frames.push(data(&shapes.usage_chunk(tokens)));
            frames.push(done());
        }
        Behavior::Reasons => {
            for thought in ["Let me ", "think."] {
                let mut chunk = shapes.chunk("", None, None);
                if let Some(delta) = chunk.choices[0].delta.as_mut() {
                    delta.content = None;
                    delta.reasoning_content = Some(thought.into());
                }
                frames.push(data(&chunk));
            }
            body_tokens(&mut frames, false);
            frames.push(data(&shapes.chunk("", Some("stop"), None)));
            frames.push(data(&shapes.usage_chunk(tokens + 2)));
            frames.push(done());
        }
        Behavior::UsageInFinish => {
            body_tokens(&mut frames, false);
            let mut finish = shapes.chunk("", Some("stop"), None);
            finish.created = None;
            finish.usage = Some(openai::Usage {
                prompt_tokens: Some(12),
                completion_tokens: Some(u32::try_from(tokens).unwrap_or(u32::MAX)),
                ..openai::Usage::default()
            });
            finish.timings = Some(openai::Timings { cache_n: Some(4) });
            frames.push(data(&finish));
            frames.push(done());
        }
        Behavior::NoUsage => {
            body_tokens(&mut frames, false);
            frames.push(data(&shapes.chunk("", Some("stop"), None)));
            frames.push(done());
        }
        Behavior::EofOnly => {
            body_tokens(&mut frames, false);
            frames.push(data(&shapes.chunk("", Some("stop"), None)));
        }
        Behavior::ToolCalls => {
            body_tokens(&mut frames, false);
            frames.push(data(&shapes.chunk("", Some("tool_calls"), None)));
            frames.push(done());
        }
        Behavior::CallsTool => {
            let mut first = shapes.chunk("", None, None);
            if let Some(delta) = first.choices[0].delta.as_mut() {
                delta.role = Some("assistant".into());
            }
            frames.push(data(&first));
            frames.push(data(&call_piece(call(Some(&offered), ""))));
            for piece in CALL_ARGUMENTS {
                frames.push(data(&call_piece(call(None, piece))));
            }
            frames.push(data(&shapes.chunk("", Some("tool_calls"), None)));
            frames.push(data(&openai::Chunk {
                usage: Some(usage(9)),
                ..openai::Chunk::default()
            }));
            frames.push(done());
        }
        Behavior::Whole => return shapes.whole(tokens, "stop", true),
        Behavior::Status500 => {
            return json(
                StatusCode::INTERNAL_SERVER_ERROR,
                &openai::ErrorResponse::new("server_error", "the fake server fails", None),
            );
        }
        Behavior::Status429 => {
            return json(
                StatusCode::TOO_MANY_REQUESTS,
                &openai::ErrorResponse::new("rate_limit", "slow down", None),
            );
        }
        Behavior::Hang => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Behavior::Garbage => {
            frames.push(Ok(Bytes::from_static(
                b"data: {\"choices\": [{\"delta\": nope\n\n",
            )));
            frames.push(done());
        }
        Behavior::CloseAfterToken => {
            frames.push(data(&shapes.chunk("tok ", None, None)));
            frames.push(cut());
        }
        Behavior::CloseBeforeFirst => {
            frames.push(cut());
        }
        Behavior::ErrorMidStream => {
            frames.push(data(&shapes.chunk("tok ", None, None)));
            frames.push(data(&openai::ErrorResponse::new(
                "server_error",
                "the fake server ran out of memory",
                None,
            )));
            frames.push(done());
        }
        Behavior::EndlessLine => {
            let line = futures_util::StreamExt::chain(
                stream::once(async { Ok(Frame::data(Bytes::from_static(b"data: "))) }),
                stream::repeat_with(|| Ok(Frame::data(Bytes::from(vec![b'x'; 64 * 1024])))),
            );
            let mut response = Response::new(BodyExt::boxed(StreamBody::new(line)));
            response
                .headers_mut()
                .insert("content-type", "text/event-stream".parse().unwrap());
            return response;
        }
    }
    if behavior == Behavior::Paced {
        return paced(frames);
    }
    sse(frames)
}

/// `frames` as a stream, one every [`PACE`].
fn paced(frames: Vec<Result<Bytes, std::io::Error>>) -> Response<Body> {
    let frames = futures_util::StreamExt::then(stream::iter(frames), |frame| async move {
        tokio::time::sleep(PACE).await;
        frame.map(Frame::data)
    });
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(frames)));
    response
        .headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    response
}

/// A whole answer that calls `name`.
fn whole_tool_call(name: &str) -> Response<Body> {
    let arguments = CALL_ARGUMENTS.concat();
    let call = openai::ToolCall {
        index: None,
        ..call(Some(name), &arguments)
    };
    json(
        StatusCode::OK,
        &openai::Chunk {
            id: Some("x".into()),
            object: Some(openai::CHAT_COMPLETION.into()),
            choices: vec![openai::Choice {
                message: Some(openai::ReplyMessage {
                    role: Some("assistant".into()),
                    content: None,
                    tool_calls: Some(vec![call]),
                    ..openai::ReplyMessage::default()
                }),
                finish_reason: Some("tool_calls".into()),
                ..openai::Choice::default()
            }],
            usage: Some(usage(9)),
            ..openai::Chunk::default()
        },
    )
}

/// An OpenAI Responses answer, plain or streamed: `tokens` text tokens, 12 prompt tokens of
/// which 4 cached.
fn responses(streamed: bool, tokens: usize) -> Response<Body> {
    let text = "tok ".repeat(tokens);
    let usage = serde_json::json!({
        "input_tokens": 12, "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12 + tokens,
    });
    let item = serde_json::json!({
        "type": "message", "id": "msg_fake", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    });
    let response = serde_json::json!({
        "id": "resp_fake", "object": "response", "status": "completed", "model": "fake",
        "output": [item], "usage": usage,
    });
    if !streamed {
        return json(StatusCode::OK, &response);
    }
    let event = |value: serde_json::Value| {
        let mut frame = Vec::new();
        let name = value["type"].as_str().unwrap_or_default().to_owned();
        sse::event(&mut frame, &name, &value);
        Ok(Bytes::from(frame))
    };
    let mut frames = vec![
        event(
            serde_json::json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": "resp_fake", "object": "response", "status": "in_progress", "output": []}}),
        ),
        event(
            serde_json::json!({"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
            "item": {"type": "message", "id": "msg_fake", "status": "in_progress", "role": "assistant", "content": []}}),
        ),
    ];
    for _ in 0..tokens {
        frames.push(event(
            serde_json::json!({"type": "response.output_text.delta", "sequence_number": 2,
            "item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": "tok "}),
        ));
    }
    frames.push(event(
        serde_json::json!({"type": "response.output_item.done", "sequence_number": 3,
        "output_index": 0, "item": item}),
    ));
    frames.push(event(
        serde_json::json!({"type": "response.completed", "sequence_number": 4,
        "response": response}),
    ));
    sse(frames)
}

/// An Anthropic Messages answer (for a pass-through proxy), plain or streamed.
fn messages(streamed: bool, tokens: usize) -> Response<Body> {
    let counted = anthropic::Usage {
        input_tokens: 12,
        output_tokens: u32::try_from(tokens).unwrap_or(u32::MAX),
        ..anthropic::Usage::default()
    };
    if !streamed {
        let text = "tok ".repeat(tokens);
        let message = anthropic::MessageResponse {
            content: vec![anthropic::ContentBlock::Text { text: &text }],
            stop_reason: Some(anthropic::StopReason::EndTurn),
            ..anthropic::MessageResponse::empty("msg_fake", "fake", counted)
        };
        return json(StatusCode::OK, &message);
    }
    let mut out = Vec::new();
    anthropic::StreamEvent::MessageStart {
        message: anthropic::MessageResponse::empty(
            "msg_fake",
            "fake",
            anthropic::Usage {
                output_tokens: 1,
                ..counted
            },
        ),
    }
    .write_sse(&mut out);
    anthropic::StreamEvent::ContentBlockStart {
        index: 0,
        content_block: anthropic::ContentBlock::Text { text: "" },
    }
    .write_sse(&mut out);
    let mut frames = vec![Ok(Bytes::from(std::mem::take(&mut out)))];
    anthropic::StreamEvent::ContentBlockDelta {
        index: 0,
        delta: anthropic::BlockDelta::TextDelta { text: "tok " },
    }
    .write_sse(&mut out);
    let token = Bytes::from(std::mem::take(&mut out));
    frames.extend(std::iter::repeat_n(token, tokens).map(Ok));
    anthropic::StreamEvent::ContentBlockStop { index: 0 }.write_sse(&mut out);
    anthropic::StreamEvent::MessageDelta {
        delta: anthropic::MessageDelta {
            stop_reason: anthropic::StopReason::EndTurn,
            stop_sequence: None,
        },
        usage: counted,
    }
    .write_sse(&mut out);
    anthropic::StreamEvent::MessageStop.write_sse(&mut out);
    frames.push(Ok(Bytes::from(out)));
    sse(frames)
}
