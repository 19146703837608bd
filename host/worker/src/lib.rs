//! Worker mode: one inference engine served over HTTP, so an operator runs `ringmaster worker`
//! on each GPU box and a gateway in front.
//!
//! # Endpoints
//!
//! - `POST /v1/chat/completions` and `POST /v1/completions`: OpenAI-compatible, plain JSON or
//!   server-sent events (`"stream": true`, ending with `data: [DONE]`; `stream_options.
//!   include_usage` adds a usage chunk). Usage reports `prompt_tokens_details.cached_tokens`,
//!   the prompt tokens served from the prefix cache.
//! - `GET /health`: 200 while the engine runs, 503 once it has stopped.
//! - `GET /v1/models`: the one model served.
//! - `GET /load`: the engine's load report (running, waiting, KV blocks used, cached and total,
//!   cumulative token and step counters), for a gateway's routing.
//! - `GET /kv/events`: server-sent events. The first is `{"type":"snapshot","hashes":[…]}`,
//!   every block hash the prefix cache holds; then one per change from that moment:
//!   `{"type":"stored","hash":"<16 hex digits>"}` or `"evicted"`, by the block's chained hash
//!   (see `ringmaster_gpu_runtime::block::chain_hash`). The snapshot and the subscription are
//!   taken together, so applying the changes in order to the snapshot tracks the cache
//!   exactly. A subscriber that falls behind gets `{"type":"lagged","missed":N}`: its view is
//!   stale and it should reconnect.
//! - `GET /tokenizer`: `{"block_size":16,"fingerprint":"<hex>","tokenizer":{…}}`, the
//!   engine's tokenizer as data (`ringmaster_gpu_runtime::TokenizerSpec`), so a gateway can
//!   compute the block hashes of a prompt as this worker will and match them against the
//!   events.
//! - `GET /kv/transfer/{id}`: the KV blocks a prefill leg computed here, once, for the decode
//!   worker of the same request (see [`transfer`]: a chat or completions request with
//!   `kv_transfer_params` is a split request's prefill or decode leg, as vLLM's
//!   `NixlConnector` defines them). Legs and fetches carry the credential the workers share
//!   with their gateways; without it a leg is served whole and a fetch answered 403.
//! - `GET /metrics`: Prometheus text: `ringmaster_kv_import_refused_total{reason}` (a
//!   transfer refused for its `credential` or its `peer`, blocks refused for their `hash`,
//!   `tokens` or `shape`), `ringmaster_kv_export_refused_total` (fetches without the
//!   credential) and `ringmaster_kv_fetch_failures_total`.
//!
//! A client that disconnects cancels its generation: the engine frees its KV blocks at once.
//! This crate owns the HTTP surface only; the engine, its executor and its model are the
//! engine crate's, built by the caller.

pub mod openai;
pub mod transfer;

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use ringmaster_gpu_runtime::{EngineError, EngineHandle, FinishReason, GenerateEvent, KvEvent};
use ringmaster_wire::models::ModelList;
use ringmaster_wire::reserved::LEG_CREDENTIAL_HEADER;
use ringmaster_wire::worker::{self as wire, HexHash, TokenizerDescription};
use ringmaster_wire::{openai as openai_wire, sse};
use tokio::net::TcpListener;
use tokio::sync::{broadcast, mpsc};
use tracing::{debug, warn};

use crate::openai::{Endpoint, Invalid, Reply};

/// Largest request body, bytes.
pub const MAX_BODY_BYTES: usize = 4 << 20;

/// How long in-flight requests get to finish at shutdown.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Every response's body type.
type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// The engine a worker serves and the name it serves it as.
#[derive(Debug)]
pub struct Worker {
    engine: EngineHandle,
    model: String,
    /// The `/tokenizer` body, built on first use (about 2 MB for a 49k-token vocabulary).
    tokenizer_body: std::sync::OnceLock<Bytes>,
    /// The blocks its prefill legs computed for decode workers.
    transfers: transfer::Transfers,
}

impl Worker {
    /// A worker serving `engine` as the model `model`, taking whole requests and either leg
    /// of a split one.
    pub fn new(engine: EngineHandle, model: impl Into<String>) -> Arc<Self> {
        Self::with_role(engine, model, transfer::Role::Both)
    }

    /// A worker of `role` in a disaggregated fleet (`ringmaster worker --role`) that trusts
    /// no gateway: it serves every leg whole.
    pub fn with_role(
        engine: EngineHandle,
        model: impl Into<String>,
        role: transfer::Role,
    ) -> Arc<Self> {
        Self::trusting(engine, model, role, transfer::Trust::default())
    }

    /// A worker of `role` taking the legs `trust` vouches for.
    pub fn trusting(
        engine: EngineHandle,
        model: impl Into<String>,
        role: transfer::Role,
        trust: transfer::Trust,
    ) -> Arc<Self> {
        Arc::new(Self {
            engine,
            model: model.into(),
            tokenizer_body: std::sync::OnceLock::new(),
            transfers: transfer::Transfers::trusting(role, trust),
        })
    }

    /// The blocks its prefill legs computed and keep for decode workers.
    pub fn transfers(&self) -> &transfer::Transfers {
        &self.transfers
    }

    /// The model name requests must use (or omit).
    pub fn model(&self) -> &str {
        &self.model
    }
}

/// Serves `worker` on `listener` until `shutdown` completes, then gives in-flight requests
/// [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    worker: Arc<Worker>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = ringmaster_serve::accept_until(listener, shutdown, |stream, peer, graceful| {
        let worker = worker.clone();
        let service = hyper::service::service_fn(move |req| {
            let worker = worker.clone();
            async move { Ok::<_, Infallible>(handle(worker, req).await) }
        });
        let conn = graceful.watch(
            builder
                .serve_connection(TokioIo::new(stream), service)
                .into_owned(),
        );
        Some(async move {
            if let Err(e) = conn.await {
                debug!(error = %e, %peer, "worker.connection_closed_with_error");
            }
        })
    })
    .await;
    ringmaster_serve::drain(graceful, SHUTDOWN_GRACE, "worker").await;
    Ok(())
}

async fn handle(worker: Arc<Worker>, req: http::Request<Incoming>) -> Response<ResponseBody> {
    let request_id = format!("{:032x}", uuid::Uuid::new_v4().as_u128());
    let (method, path) = (req.method().clone(), req.uri().path().to_owned());
    let response = match (&method, path.as_str()) {
        (&Method::GET, "/health") => health(&worker),
        (&Method::GET, "/v1/models") => models(&worker),
        (&Method::GET, "/load") => json_response(StatusCode::OK, &worker.engine.load()),
        (&Method::GET, "/kv/events") => kv_events(&worker),
        (&Method::GET, "/tokenizer") => tokenizer(&worker),
        (&Method::GET, "/metrics") => metrics(&worker),
        (&Method::GET, path) if path.starts_with("/kv/transfer/") => kv_transfer(
            &worker,
            &path["/kv/transfer/".len()..],
            req.headers()
                .get(LEG_CREDENTIAL_HEADER)
                .and_then(|v| v.to_str().ok()),
        ),
        (&Method::POST, "/v1/chat/completions") => {
            generate(&worker, req, Endpoint::Chat, &request_id).await
        }
        (&Method::POST, "/v1/completions") => {
            generate(&worker, req, Endpoint::Completions, &request_id).await
        }
        (
            _,
            "/health"
            | "/v1/models"
            | "/load"
            | "/kv/events"
            | "/tokenizer"
            | "/metrics"
            | "/v1/chat/completions"
            | "/v1/completions",
        ) => error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            &format!("{method} is not allowed on {path}"),
        ),
        _ => error_response(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("no route for {method} {path}"),
        ),
    };
    debug!(request_id = %request_id, %method, %path, status = response.status().as_u16(), "worker.response");
    response
}

/// `GET /kv/transfer/{id}`: a prefill's blocks, once, to a fetch with the fleet's credential.
fn kv_transfer(worker: &Worker, id: &str, credential: Option<&str>) -> Response<ResponseBody> {
    if !worker.transfers.may_fetch(id, credential) {
        warn!(transfer = id, "worker.kv_export_refused");
        return error_response(
            StatusCode::FORBIDDEN,
            "permission_error",
            "a fetch of KV blocks needs the credential the fleet's workers share \
             (x-ringmaster-leg-credential)",
        );
    }
    match worker.transfers.take(id) {
        Some(bytes) => Response::builder()
            .status(StatusCode::OK)
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(full(bytes))
            .unwrap_or_else(|_| Response::new(full(Bytes::new()))),
        None => error_response(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!(
                "no KV blocks kept for {id:?} (never prefilled here, fetched already, or older \
                 than {} s)",
                transfer::KV_LEASE.as_secs()
            ),
        ),
    }
}

/// `GET /metrics`: the transfers refused here, in Prometheus's text format.
fn metrics(worker: &Worker) -> Response<ResponseBody> {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::registry::Registry;
    use std::sync::atomic::Ordering::Relaxed;
    let transfers = &worker.transfers;
    let load = worker.engine.load();
    let refused = Family::<Vec<(&'static str, &'static str)>, Counter>::default();
    for (reason, count) in [
        (
            transfer::TransferRefusal::Credential.as_str(),
            transfers.refused_credential.load(Relaxed),
        ),
        (
            transfer::TransferRefusal::Peer.as_str(),
            transfers.refused_peer.load(Relaxed),
        ),
        ("hash", load.kv_import_refused_hash),
        ("tokens", load.kv_import_refused_tokens),
        ("shape", load.kv_import_refused_shape),
    ] {
        refused
            .get_or_create(&vec![("reason", reason)])
            .inc_by(count);
    }
    let exports = Counter::<u64>::default();
    exports.inc_by(transfers.export_refused.load(Relaxed));
    let failures = Counter::<u64>::default();
    failures.inc_by(transfers.fetch_failures.load(Relaxed));
    let mut registry = Registry::with_prefix("ringmaster");
    registry.register(
        "kv_import_refused",
        "KV transfers this worker refused, by reason: credential (the leg's credential missing or wrong), peer (a prefill worker outside --kv-peer), hash, tokens or shape (blocks that are not the request's own); each request was served computing its prompt here",
        refused,
    );
    registry.register(
        "kv_export_refused",
        "Fetches of kept KV blocks refused for a missing or wrong credential",
        exports,
    );
    registry.register(
        "kv_fetch_failures",
        "Decode legs whose blocks could not be fetched (their prompts were computed here)",
        failures,
    );
    let mut text = String::new();
    if prometheus_client::encoding::text::encode(&mut text, &registry).is_err() {
        text.clear();
    }
    Response::builder()
        .status(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )
        .body(full(Bytes::from(text)))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

fn health(worker: &Worker) -> Response<ResponseBody> {
    if worker.engine.is_stopped() {
        error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            "the engine has stopped",
        )
    } else {
        json_response(
            StatusCode::OK,
            &wire::Health {
                status: "ok",
                model: &worker.model,
            },
        )
    }
}

fn models(worker: &Worker) -> Response<ResponseBody> {
    json_response(
        StatusCode::OK,
        &ModelList::new(std::slice::from_ref(&worker.model), "ringmaster"),
    )
}

/// One KV event as its SSE frame.
pub fn kv_event_frame(event: &KvEvent) -> Bytes {
    sse_data(&match event {
        KvEvent::Stored(stored) => wire::KvEvent::Stored {
            hash: HexHash(stored.hash.0),
        },
        KvEvent::Evicted(h) => wire::KvEvent::Evicted { hash: HexHash(h.0) },
    })
}

/// Most events sent in one batch of frames.
pub const KV_BATCH_MAX: usize = 4_096;

/// Events in order as SSE frames in one chunk: each run of stores (or evictions) one
/// `stored_many` (`evicted_many`) frame, a run of one its single-block frame.
pub fn kv_batch_frames(events: &[KvEvent]) -> Bytes {
    let mut out = bytes::BytesMut::new();
    let mut rest = events;
    while let Some(first) = rest.first() {
        let stored = matches!(first, KvEvent::Stored(_));
        let run = rest
            .iter()
            .take_while(|e| matches!(e, KvEvent::Stored(_)) == stored)
            .count();
        let (now, later) = rest.split_at(run);
        if run == 1 {
            out.extend_from_slice(&kv_event_frame(first));
        } else {
            let hashes = now.iter().map(|e| HexHash(e.hash().0)).collect();
            out.extend_from_slice(&sse_data(&if stored {
                wire::KvEvent::StoredMany { hashes }
            } else {
                wire::KvEvent::EvictedMany { hashes }
            }));
        }
        rest = later;
    }
    out.freeze()
}

fn tokenizer(worker: &Worker) -> Response<ResponseBody> {
    let body = worker.tokenizer_body.get_or_init(|| {
        let spec = worker.engine.tokenizer().spec();
        let description = TokenizerDescription {
            block_size: ringmaster_gpu_runtime::BLOCK_SIZE,
            fingerprint: format!("{:016x}", spec.fingerprint()),
            tokenizer: spec,
        };
        Bytes::from(serde_json::to_vec(&description).unwrap_or_default())
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(body.clone()))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

/// The `snapshot` frame that opens `/kv/events`: every block hash the prefix cache holds.
pub fn kv_snapshot_frame(hashes: &[ringmaster_gpu_runtime::block::BlockHash]) -> Bytes {
    sse_data(&wire::KvEvent::Snapshot {
        hashes: hashes.iter().map(|h| HexHash(h.0)).collect(),
    })
}

fn kv_events(worker: &Worker) -> Response<ResponseBody> {
    let (snapshot, mut events) = worker.engine.kv_subscribe();
    let (tx, body) = ChannelBody::channel(64);
    tokio::spawn(async move {
        if tx.send(kv_snapshot_frame(&snapshot)).await.is_err() {
            return;
        }
        loop {
            // One engine step stores or evicts many blocks: send what is ready as one batch.
            let frame = match events.recv().await {
                Ok(event) => {
                    let mut batch = vec![event];
                    while batch.len() < KV_BATCH_MAX {
                        match events.try_recv() {
                            Ok(event) => batch.push(event),
                            // A lag or a close is met again by the next `recv`.
                            Err(_) => break,
                        }
                    }
                    kv_batch_frames(&batch)
                }
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    sse_data(&wire::KvEvent::Lagged { missed })
                }
                Err(broadcast::error::RecvError::Closed) => break,
            };
            if tx.send(frame).await.is_err() {
                break;
            }
        }
    });
    sse_response(body)
}

async fn generate(
    worker: &Worker,
    req: http::Request<Incoming>,
    endpoint: Endpoint,
    request_id: &str,
) -> Response<ResponseBody> {
    // A prefill leg's blocks are named by the id its proxy gave both legs, and found where
    // the proxy reached this worker.
    let pair_id = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .filter(|id| !id.is_empty() && id.len() <= 256 && !id.contains('/'))
        .map_or_else(|| request_id.to_owned(), str::to_owned);
    let credential = req
        .headers()
        .get(LEG_CREDENTIAL_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let reached_at = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|host| host.parse::<http::uri::Authority>().ok())
        .map(|authority| {
            (
                authority.host().to_owned(),
                authority.port_u16().unwrap_or(80),
            )
        });
    let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return error_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                &format!(
                    "the request body could not be read (at most {MAX_BODY_BYTES} bytes): {e}"
                ),
            );
        }
    };
    let request = match openai::Request::parse(&body, endpoint, &worker.model, request_id) {
        Ok(request) => request,
        Err(Invalid(message)) => {
            return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &message);
        }
    };
    let leg = match transfer::leg_of(&body, worker.transfers.role) {
        Ok(leg) => leg,
        Err(message) => {
            return error_response(StatusCode::BAD_REQUEST, "invalid_request_error", &message);
        }
    };
    // Only a leg the gateway vouches for moves blocks; any other is served whole (the answer
    // is the same, the prompt computed here).
    let leg = match worker.transfers.admit(
        leg,
        transfer::params_of(&body),
        credential.as_deref(),
        &pair_id,
    ) {
        Ok(leg) => leg,
        Err(reason) => {
            warn!(request_id = %request_id, reason = reason.as_str(), "worker.kv_transfer_refused");
            transfer::Leg::Whole
        }
    };
    let mut handoff = None;
    let submitted = match leg {
        transfer::Leg::Whole => worker.engine.submit(request.generate),
        transfer::Leg::Prefill => match worker.engine.submit_prefill(request.generate) {
            Ok((stream, kept)) => {
                handoff = Some(kept);
                Ok(stream)
            }
            Err(e) => Err(e),
        },
        transfer::Leg::Decode(remote) => match fetch_blocks(worker, &remote).await {
            Ok(blocks) => worker.engine.submit_with_kv(request.generate, blocks),
            Err(why) => {
                worker.transfers.fetch_failed();
                warn!(request_id = %request_id, prefill = %remote.remote_host, error = %why, "worker.kv_fetch_failed");
                worker.engine.submit(request.generate)
            }
        },
    };
    if let Some(handoff) = handoff {
        return match submitted {
            Ok(stream) => {
                prefill_reply(
                    worker,
                    stream,
                    handoff,
                    (endpoint, request_id),
                    (&pair_id, reached_at),
                )
                .await
            }
            Err(e) => engine_error(e),
        };
    }
    let mut stream = match submitted {
        Ok(stream) => stream,
        Err(e) => return engine_error(e),
    };
    let reply = Reply {
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-{request_id}"),
            Endpoint::Completions => format!("cmpl-{request_id}"),
        },
        endpoint,
        model: worker.model.clone(),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    if !request.stream {
        let mut text = String::new();
        while let Some(event) = stream.next().await {
            match event {
                GenerateEvent::Started { .. } => {}
                GenerateEvent::Token { text: piece } => text.push_str(&piece),
                // The engine takes no tools, so it calls none, and it does not reason apart.
                GenerateEvent::ToolCall { .. } | GenerateEvent::Reasoning { .. } => {}
                // Local engines never fail mid-stream; the stream ends below.
                GenerateEvent::Failed { .. } => break,
                GenerateEvent::Finished {
                    reason,
                    prompt_tokens,
                    cached_tokens,
                    output_tokens,
                } => {
                    let usage = openai::usage(prompt_tokens, cached_tokens, output_tokens);
                    return json_response(
                        StatusCode::OK,
                        &reply.whole(&text, openai::finish_reason(&reason), usage),
                    );
                }
            }
        }
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            "the engine stopped before the reply finished",
        );
    }
    let (tx, body) = ChannelBody::channel(64);
    let include_usage = request.include_usage;
    let continuous = request.continuous_usage;
    tokio::spawn(async move {
        // Dropping `stream` (when the client is gone and a send fails) cancels the generation.
        let (mut prompt, mut cached, mut output) = (0, 0, 0u32);
        let so_far =
            |prompt, cached, output| continuous.then(|| openai::usage(prompt, cached, output));
        while let Some(event) = stream.next().await {
            let frame = match event {
                GenerateEvent::Started {
                    prompt_tokens,
                    cached_tokens,
                } => {
                    (prompt, cached) = (prompt_tokens, cached_tokens);
                    sse_data(&reply.chunk(Some(""), None, so_far(prompt, cached, 0)))
                }
                GenerateEvent::Token { text } => {
                    output += 1;
                    sse_data(&reply.chunk(Some(&text), None, so_far(prompt, cached, output)))
                }
                GenerateEvent::Finished {
                    reason,
                    prompt_tokens,
                    cached_tokens,
                    output_tokens,
                } => {
                    // vLLM's extension: which stop sequence ended the reply.
                    let matched = match &reason {
                        FinishReason::StopSequence(matched) => Some(matched.as_str()),
                        _ => None,
                    };
                    let mut last = vec![sse_data(&reply.chunk(
                        None,
                        Some((openai::finish_reason(&reason), matched)),
                        so_far(prompt_tokens, cached_tokens, output_tokens),
                    ))];
                    if include_usage {
                        last.push(sse_data(&reply.usage_chunk(openai::usage(
                            prompt_tokens,
                            cached_tokens,
                            output_tokens,
                        ))));
                    }
                    last.push(Bytes::from_static(openai_wire::DONE));
                    for frame in last {
                        if tx.send(frame).await.is_err() {
                            return;
                        }
                    }
                    return;
                }
                GenerateEvent::Failed { message } => {
                    let _ = tx
                        .send(sse_data(&openai::error("server_error", &message)))
                        .await;
                    return;
                }
                // The engine takes no tools, so it calls none, and it does not reason apart.
                GenerateEvent::ToolCall { .. } | GenerateEvent::Reasoning { .. } => continue,
            };
            if tx.send(frame).await.is_err() {
                return;
            }
        }
    });
    sse_response(body)
}

/// A decode leg's blocks, fetched with the fleet's credential (an admitted leg always has
/// the secret it was admitted with).
async fn fetch_blocks(
    worker: &Worker,
    remote: &transfer::RemoteBlocks,
) -> Result<ringmaster_gpu_runtime::KvHandoff, String> {
    match worker.transfers.secret() {
        Some(secret) => transfer::fetch(remote, secret).await,
        None => Err("this worker has no secret to fetch with".to_owned()),
    }
}

/// An engine's refusal as the client's error: its status and OpenAI's shape.
fn engine_error(error: EngineError) -> Response<ResponseBody> {
    match error {
        e @ EngineError::Stopped => error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            &e.to_string(),
        ),
        e @ (EngineError::PromptTooLong { .. }
        | EngineError::ContextTooLong { .. }
        | EngineError::EmptyPrompt
        | EngineError::ToolsUnsupported
        | EngineError::ImagesUnsupported) => error_response(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            &e.to_string(),
        ),
        e => error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "api_error",
            &e.to_string(),
        ),
    }
}

/// A prefill leg's answer: the whole reply (one token) with the `kv_transfer_params` that
/// name the blocks it keeps for the decode worker.
async fn prefill_reply(
    worker: &Worker,
    mut stream: ringmaster_gpu_runtime::GenerationStream,
    handoff: tokio::sync::oneshot::Receiver<ringmaster_gpu_runtime::KvHandoff>,
    (endpoint, request_id): (Endpoint, &str),
    (pair_id, reached_at): (&str, Option<(String, u16)>),
) -> Response<ResponseBody> {
    let reply = Reply {
        id: match endpoint {
            Endpoint::Chat => format!("chatcmpl-{request_id}"),
            Endpoint::Completions => format!("cmpl-{request_id}"),
        },
        endpoint,
        model: worker.model.clone(),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let mut text = String::new();
    let mut finished = None;
    while let Some(event) = stream.next().await {
        match event {
            GenerateEvent::Token { text: piece } => text.push_str(&piece),
            GenerateEvent::Finished {
                reason,
                prompt_tokens,
                cached_tokens,
                output_tokens,
            } => {
                finished = Some((
                    reason,
                    openai::usage(prompt_tokens, cached_tokens, output_tokens),
                ))
            }
            _ => {}
        }
    }
    let (Some((reason, usage)), Ok(handoff)) = (finished, handoff.await) else {
        return error_response(
            StatusCode::SERVICE_UNAVAILABLE,
            "overloaded_error",
            "the engine stopped before the prefill finished",
        );
    };
    let whole = serde_json::to_vec(&reply.whole(&text, openai::finish_reason(&reason), usage))
        .unwrap_or_default();
    let (host, port) = reached_at.unwrap_or_else(|| ("127.0.0.1".to_owned(), 80));
    let params = worker.transfers.keep(pair_id, &handoff, (&host, port));
    debug!(request_id = %request_id, pair_id, blocks = handoff.blocks.len(), "worker.prefilled");
    let Ok(top) = ringmaster_wire::object::TopLevel::parse(&whole) else {
        return json_response(StatusCode::OK, &params);
    };
    let mut out = ringmaster_wire::object::ObjectWriter::with_capacity(whole.len() + 512);
    for (key, value) in &top.0 {
        out.field(key, value.get());
    }
    out.field("kv_transfer_params", &params.to_string());
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(Bytes::from(out.finish())))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

fn sse_data(value: &impl serde::Serialize) -> Bytes {
    let mut frame = Vec::with_capacity(128);
    sse::data(&mut frame, value);
    Bytes::from(frame)
}

fn sse_response(body: ResponseBody) -> Response<ResponseBody> {
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<ResponseBody> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(full(Bytes::from(
            serde_json::to_vec(value).unwrap_or_default(),
        )))
        .unwrap_or_else(|_| Response::new(full(Bytes::new())))
}

fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<ResponseBody> {
    json_response(status, &openai::error(kind, message))
}

fn full(bytes: Bytes) -> ResponseBody {
    Full::new(bytes).boxed_unsync()
}

/// A body fed by a channel; when the client goes away hyper drops it, and the producer's
/// next send fails.
#[derive(Debug)]
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    fn channel(capacity: usize) -> (mpsc::Sender<Bytes>, ResponseBody) {
        let (tx, rx) = mpsc::channel(capacity);
        (tx, Self { rx }.boxed_unsync())
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|frame| frame.map(|b| Ok(Frame::data(b))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_gpu_runtime::StoredBlock;
    use ringmaster_gpu_runtime::block::BlockHash;

    fn stored(hash: u64) -> KvEvent {
        KvEvent::Stored(StoredBlock {
            hash: BlockHash(hash),
            parent: None,
            tokens: [7; ringmaster_gpu_runtime::BLOCK_SIZE],
        })
    }

    #[test]
    fn a_batch_of_events_is_one_frame_per_run_in_order() {
        let events = [
            stored(1),
            stored(2),
            KvEvent::Evicted(BlockHash(3)),
            stored(4),
        ];
        let text = String::from_utf8(kv_batch_frames(&events).to_vec()).unwrap();
        let frames: Vec<wire::KvEvent> = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        assert_eq!(
            frames,
            [
                wire::KvEvent::StoredMany {
                    hashes: vec![HexHash(1), HexHash(2)]
                },
                wire::KvEvent::Evicted { hash: HexHash(3) },
                wire::KvEvent::Stored { hash: HexHash(4) },
            ]
        );
    }
}
