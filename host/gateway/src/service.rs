//! The HTTP front: accepting connections, dispatching paths, and the Messages handler.
//!
//! Every response, success or error, carries a `request-id` header, and every log line of a
//! request carries the same id through a `tracing` span. Errors are built as [`ApiError`]s and
//! turned into Anthropic's JSON in one place ([`error_response`]). A streamed reply is produced
//! by a task that feeds a [`ChannelBody`]; if the client goes away, the task drops the engine's
//! stream, which cancels the generation and frees its KV blocks.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use ringmaster_gpu_runtime::{
    EngineError, FinishReason, GenerateEvent, GenerateRequest, GenerationStream, SamplingParams,
};
use serde_json::json;
use tokio::net::TcpListener;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::Gateway;
use crate::api::{
    self, MessageDeltaBody, MessageResponse, MessagesRequest, Role, StopReason, StreamEvent,
    TextBlock, Usage,
};
use crate::body::{ChannelBody, ResponseBody, full};
use crate::error::{ApiError, ErrorKind};
use crate::metrics::{AttemptLabels, DecisionLabels, FaultLabels, ResponseLabels, VariantLabel};
use crate::policy::{RouteOutcome, Routed, Variant};
use crate::routing::{MAX_SESSION_ID_BYTES, RoutingInput, routing_input};
use crate::safety::Blocked;
use ringmaster_policy_engine::{PolicyFault, PolicyRequest};
use ringmaster_pool::kv_view::ChatPrompt;
use ringmaster_pool::{Decision, DecisionReason, InFlight, PoolSnapshot};
use std::sync::atomic::Ordering;

/// Frames buffered between the stream producer and a slow client.
const SSE_CHANNEL_FRAMES: usize = 64;
/// How often drained servers are looked at for removal.
const REAP_INTERVAL: Duration = Duration::from_millis(200);

/// Serves the gateway on `listener` until `shutdown` resolves, then gives in-flight requests
/// the configured grace period.
pub async fn serve(
    gateway: Arc<Gateway>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let graceful = GracefulShutdown::new();
    let builder = auto::Builder::new(TokioExecutor::new());
    let reaper = tokio::spawn(reap_drained(Arc::downgrade(&gateway)));
    let watcher = tokio::spawn(crate::watch_policy_files(Arc::downgrade(&gateway)));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        warn!(error = %e, "accept.failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let gateway = gateway.clone();
                let service = hyper::service::service_fn(move |req| {
                    let gateway = gateway.clone();
                    async move { Ok::<_, Infallible>(handle(gateway, req, peer).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        debug!(error = %e, %peer, "connection.closed_with_error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    info!(
        grace_s = gateway.config.shutdown_grace.as_secs(),
        "gateway.draining"
    );
    tokio::select! {
        () = graceful.shutdown() => info!("gateway.drained"),
        () = tokio::time::sleep(gateway.config.shutdown_grace) => warn!("gateway.grace_expired"),
    }
    reaper.abort();
    watcher.abort();
    Ok(())
}

async fn reap_drained(gateway: std::sync::Weak<Gateway>) {
    let mut tick = tokio::time::interval(REAP_INTERVAL);
    loop {
        tick.tick().await;
        let Some(gateway) = gateway.upgrade() else {
            return;
        };
        let reaped = gateway.pool.reap_drained();
        if reaped > 0 {
            info!(reaped, "pool.drained_servers_removed");
        }
    }
}

/// Handles one request: routes by path, turns errors into responses, stamps the request id.
async fn handle(
    gateway: Arc<Gateway>,
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Response<ResponseBody> {
    let request_id = format!("req_{}", uuid::Uuid::new_v4().simple());
    let span = info_span!("request", request_id = %request_id);
    async move {
        let started = Instant::now();
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let route = route_name(&path);
        let result = dispatch(&gateway, req, started, &request_id).await;
        let mut response = result.unwrap_or_else(|e| {
            if e.kind() == ErrorKind::Api {
                warn!(error = %e, "request.internal_error");
            }
            error_response(&e)
        });
        response.headers_mut().insert(
            "request-id",
            HeaderValue::from_str(&request_id).expect("request ids are ASCII"),
        );
        let status = response.status().as_u16();
        gateway
            .metrics
            .responses
            .get_or_create(&ResponseLabels { route, status })
            .inc();
        if gateway.config.access_log {
            info!(%method, path, status, %peer, elapsed_ms = started.elapsed().as_millis() as u64, "request.done");
        } else {
            debug!(%method, path, status, %peer, elapsed_ms = started.elapsed().as_millis() as u64, "request.done");
        }
        response
    }
    .instrument(span)
    .await
}

fn route_name(path: &str) -> &'static str {
    match path {
        "/v1/messages" => "messages",
        p if p.starts_with("/v1/models") => "models",
        "/healthz" | "/readyz" => "health",
        "/metrics" => "metrics",
        p if p.starts_with("/admin/") => "admin",
        _ => "other",
    }
}

async fn dispatch(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    started: Instant,
    request_id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let allow = |allowed: &[Method]| -> Result<(), ApiError> {
        if allowed.contains(&method) {
            Ok(())
        } else {
            Err(ApiError::new(
                ErrorKind::MethodNotAllowed,
                format!("method {method} is not allowed on {path}"),
            ))
        }
    };
    match path.as_str() {
        "/v1/messages" => {
            allow(&[Method::POST])?;
            messages(gateway, req, started, request_id).await
        }
        "/v1/models" => {
            allow(&[Method::GET])?;
            gateway.auth.check(req.headers())?;
            Ok(json_response(StatusCode::OK, &models_json(gateway)))
        }
        p if p.starts_with("/v1/models/") => {
            allow(&[Method::GET])?;
            gateway.auth.check(req.headers())?;
            let id = &p["/v1/models/".len()..];
            if gateway.pool.snapshot().accepted.iter().any(|m| m == id) {
                Ok(json_response(StatusCode::OK, &model_json(id)))
            } else {
                Err(ApiError::not_found(format!(
                    "model: {id:?} is not served here"
                )))
            }
        }
        "/healthz" => {
            allow(&[Method::GET, Method::HEAD])?;
            Ok(json_response(StatusCode::OK, &json!({"status": "ok"})))
        }
        "/readyz" => {
            allow(&[Method::GET, Method::HEAD])?;
            let servers = gateway.pool.snapshot().servers.len();
            if servers == 0 {
                Err(ApiError::new(
                    ErrorKind::Unavailable,
                    "no GPU servers in the pool",
                ))
            } else {
                Ok(json_response(
                    StatusCode::OK,
                    &json!({"status": "ready", "servers": servers}),
                ))
            }
        }
        "/metrics" => {
            allow(&[Method::GET])?;
            let mut response = Response::new(full(gateway.metrics.encode()));
            response.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(response)
        }
        p if p.starts_with("/admin/") => crate::admin::handle(gateway, req).await,
        _ => Err(ApiError::not_found(format!("no route for {method} {path}"))),
    }
}

fn models_json(gateway: &Gateway) -> serde_json::Value {
    let snapshot = gateway.pool.snapshot();
    let data: Vec<_> = snapshot.accepted.iter().map(|m| model_json(m)).collect();
    json!({
        "data": data,
        "has_more": false,
        "first_id": snapshot.accepted.first(),
        "last_id": snapshot.accepted.last(),
    })
}

fn model_json(id: &str) -> serde_json::Value {
    json!({"type": "model", "id": id, "display_name": id, "created_at": "2026-01-01T00:00:00Z"})
}

/// A JSON response with `status`.
pub(crate) fn json_response(
    status: StatusCode,
    value: &serde_json::Value,
) -> Response<ResponseBody> {
    let mut response = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The Anthropic error response for `error`.
pub(crate) fn error_response(error: &ApiError) -> Response<ResponseBody> {
    let mut response = json_response(error.kind().status(), &error.body());
    if let Some(after) = error.retry_after() {
        response.headers_mut().insert(
            "retry-after",
            HeaderValue::from_str(&after.as_secs().max(1).to_string()).expect("digits"),
        );
    }
    if error.kind().is_retryable() {
        response
            .headers_mut()
            .insert("x-should-retry", HeaderValue::from_static("true"));
    }
    response
}

/// Reads a JSON request body under the configured size limit.
pub(crate) async fn read_json_body(
    gateway: &Gateway,
    req: Request<Incoming>,
) -> Result<Bytes, ApiError> {
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            format!(
                "content-type must be application/json, got {:?}",
                if content_type.is_empty() {
                    "(none)"
                } else {
                    content_type
                }
            ),
        ));
    }
    let limit = gateway.config.max_body_bytes;
    let too_large = || {
        ApiError::new(
            ErrorKind::RequestTooLarge,
            format!("request body is larger than this gateway's limit of {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(ApiError::invalid(format!(
            "could not read the request body: {e}"
        ))),
    }
}

async fn messages(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    started: Instant,
    request_id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let caller = gateway.auth.check(req.headers())?;
    let session = session_header(req.headers())?;
    let passed_headers = passed_headers(req.headers(), &gateway.config.policies.pass_headers);
    let body = read_json_body(gateway, req).await?;
    // The request's one view of the pool: admission, the router, assignment and the metrics
    // all decide on it.
    let snapshot = gateway.pool.snapshot();
    let request = api::parse_messages_request(&body, gateway.limits(&snapshot))?;
    drop(body);
    let (served_model, model_pool) = resolve_model(&snapshot, &request.model)?;
    let served_model = served_model.to_owned();
    if gateway.safety.slot.current().is_some() {
        gateway
            .safety
            .check_input(&gateway.metrics, &prompt_text(&request))?;
    }
    let mut input = routing_input(&request, session.as_deref(), gateway.config.prefix_hashing);
    let snapshot = model_pool;
    if snapshot.servers.is_empty() && !gateway.pool.snapshot().servers.is_empty() {
        return Err(ApiError::new(
            ErrorKind::Unavailable,
            format!("no GPU server serves the model {served_model:?} now; retry shortly"),
        )
        .with_retry_after(Duration::from_secs(1)));
    }
    if !snapshot.servers.is_empty() && snapshot.servers.iter().all(|s| !s.engine().is_reachable()) {
        return Err(ApiError::new(
            ErrorKind::Unavailable,
            "no GPU server can be reached (every worker is down); retry shortly",
        )
        .with_retry_after(Duration::from_secs(1)));
    }
    if !snapshot.servers.is_empty()
        && snapshot
            .servers
            .iter()
            .all(|s| s.engine().load().waiting >= gateway.config.max_waiting_per_server)
    {
        return Err(ApiError::new(
            ErrorKind::Overloaded,
            "every GPU server's queue is full; retry shortly",
        )
        .with_retry_after(Duration::from_secs(1)));
    }
    let mut policy_request = policy_request(
        &request,
        &input,
        &caller.tier,
        session.as_deref(),
        request_id,
    );
    policy_request.headers = passed_headers;
    let waited = gateway
        .admission
        .admit(
            &gateway.pool,
            &snapshot,
            &gateway.metrics,
            &input,
            &mut policy_request,
        )
        .await?;
    // After a wait in the queue the pool has moved on: decide on what it is now.
    let snapshot = if waited {
        resolve_model(&gateway.pool.snapshot(), &request.model)?.1
    } else {
        snapshot
    };
    let routing_started = Instant::now();
    let routed = match gateway
        .router
        .route(&gateway.pool, &snapshot, &input, &policy_request)
    {
        RouteOutcome::Routed(routed) => *routed,
        RouteOutcome::Rejected { variant, reason } => {
            variant.stats.errors.fetch_add(1, Ordering::Relaxed);
            return Err(ApiError::new(
                ErrorKind::Overloaded,
                format!("the router policy declined the request: {reason}"),
            )
            .with_retry_after(Duration::from_secs(1)));
        }
        RouteOutcome::NoServers => {
            return Err(
                ApiError::new(ErrorKind::Overloaded, "no GPU servers in the pool")
                    .with_retry_after(Duration::from_secs(5)),
            );
        }
    };
    let Routed {
        decision,
        in_flight,
        variant,
        fault,
    } = routed;
    let tracker = Tracker {
        gateway: gateway.clone(),
        label: VariantLabel {
            variant: variant
                .as_ref()
                .map_or_else(|| "native".to_owned(), |v| v.name.to_string()),
        },
        variant,
        started,
    };
    record_decision(
        gateway,
        &tracker,
        &decision,
        fault.as_ref(),
        decision.preferred.as_ref().map(|s| s.id()),
        routing_started.elapsed(),
    );
    debug!(
        server = decision.server.id(),
        reason = decision.reason.as_str(),
        variant = %tracker.label.variant,
        key_source = input.source.as_str(),
        prefix_hashes = input.prefix_hashes.len(),
        tier = %caller.tier,
        key = %caller.key_label,
        "request.routed"
    );
    // Routing is done with the chat: the generation takes it over instead of copying the
    // prompt a second time.
    let chat =
        Arc::try_unwrap(std::mem::take(&mut input.chat)).unwrap_or_else(|shared| (*shared).clone());
    let generate = generate_request(chat, &request, request_id, policy_request.priority);
    let target = Target {
        pool: &snapshot,
        model: &served_model,
        input: &input,
    };
    let (generation, decision, in_flight, attempts) =
        match start_generation(gateway, target, generate, decision, in_flight, started).await {
            Ok(started) => started,
            Err(e) => {
                tracker.failed();
                return Err(e);
            }
        };
    let message_id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let server_id = decision.server.id().to_owned();
    let variant_name = tracker.label.variant.clone();
    let variant_hash = tracker
        .variant
        .as_ref()
        .map(|v| v.policy.info().hash.clone());
    let mut response = if request.stream {
        stream_reply(tracker, request, generation, in_flight, message_id)
    } else {
        let reply = collect_reply(&tracker, &request, generation, message_id).await?;
        drop(in_flight);
        json_response(
            StatusCode::OK,
            &serde_json::to_value(reply).unwrap_or_default(),
        )
    };
    if let Ok(value) = HeaderValue::from_str(&server_id) {
        response.headers_mut().insert("x-ringmaster-server", value);
    }
    response
        .headers_mut()
        .insert("x-ringmaster-attempts", HeaderValue::from(attempts));
    if let Ok(value) = HeaderValue::from_str(&variant_name) {
        response.headers_mut().insert("x-ringmaster-variant", value);
    }
    // The router version that decided (absent when the native ring decided alone).
    if let Some(value) = variant_hash.and_then(|h| HeaderValue::from_str(&h).ok()) {
        response
            .headers_mut()
            .insert("x-ringmaster-policy-version", value);
    }
    Ok(response)
}

/// Where a request is to run: its model's pool, the name that model is served under, and
/// the request's routing values.
#[derive(Clone, Copy)]
struct Target<'a> {
    pool: &'a PoolSnapshot,
    model: &'a str,
    input: &'a RoutingInput,
}

/// The pool of the model a request names, and the name it is served under.
fn resolve_model<'a>(
    snapshot: &'a PoolSnapshot,
    model: &str,
) -> Result<(&'a str, Arc<PoolSnapshot>), ApiError> {
    snapshot
        .model(model)
        .map(|(served, pool)| (served, pool.clone()))
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "model: {model:?} is not served here; available models: {}",
                snapshot.accepted.join(", ")
            ))
        })
}

/// Starts the generation on the routed server; when that fails before the first token in a
/// way another server can fix (see [`ringmaster_pool::remote::RemoteError::is_retryable`]), tries the
/// next routable server on the ring, up to `[retry] attempts` within its deadline. Returns the
/// stream, the server it runs on, and how many attempts it took.
async fn start_generation(
    gateway: &Gateway,
    target: Target<'_>,
    generate: GenerateRequest,
    mut decision: Decision,
    mut in_flight: InFlight,
    started: Instant,
) -> Result<(GenerationStream, Decision, InFlight, u32), ApiError> {
    use ringmaster_pool::{Backend, BackendError};
    let retry = &gateway.config.retry;
    // A local engine takes the request over; a remote one only reads it, so it stays here for
    // the next attempt.
    let mut generate = Some(generate);
    let mut tried: Vec<String> = Vec::new();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        let result = match decision.server.engine() {
            Backend::Local(engine) => match generate.take() {
                Some(request) => engine.submit(request).map_err(BackendError::Engine),
                None => Err(BackendError::Engine(EngineError::Stopped)),
            },
            Backend::Remote(worker) => match generate.as_ref() {
                Some(request) => worker
                    .submit(request, target.model)
                    .await
                    .map_err(BackendError::Remote),
                None => Err(BackendError::Engine(EngineError::Stopped)),
            },
        };
        let error = match result {
            Ok(generation) => {
                gateway
                    .metrics
                    .upstream_attempts
                    .get_or_create(&AttemptLabels { outcome: "ok" })
                    .inc();
                return Ok((generation, decision, in_flight, attempts));
            }
            Err(error) => error,
        };
        let (outcome, retryable) = match &error {
            BackendError::Remote(e) => (e.outcome(), e.is_retryable()),
            BackendError::Engine(_) => ("engine", false),
        };
        gateway
            .metrics
            .upstream_attempts
            .get_or_create(&AttemptLabels { outcome })
            .inc();
        debug!(server = decision.server.id(), attempt = attempts, outcome, error = %error, "upstream.attempt_failed");
        if !retryable || attempts >= retry.attempts || started.elapsed() >= retry.deadline {
            return Err(backend_error(error, attempts));
        }
        tried.push(decision.server.id().to_owned());
        // Release the failed server's slot before the next choice counts loads.
        drop(in_flight);
        match gateway.pool.reassign(target.pool, target.input, &tried) {
            Some((next, next_in_flight)) => {
                (decision, in_flight) = (next, next_in_flight);
            }
            None => return Err(backend_error(error, attempts)),
        }
    }
}

/// The configured headers a request carries, for policies (lower-case names, visible ASCII
/// values only).
fn passed_headers(headers: &http::HeaderMap, names: &[String]) -> Vec<(String, String)> {
    names
        .iter()
        .filter_map(|name| {
            let value = headers.get(name.as_str())?.to_str().ok()?;
            Some((name.clone(), value.to_owned()))
        })
        .collect()
}

/// The prompt as the safety filter reads it: the system prompt and every message, in order.
fn prompt_text(request: &MessagesRequest) -> String {
    let mut text = request.system.clone().unwrap_or_default();
    for message in &request.messages {
        if !text.is_empty() {
            text.push_str("\n\n");
        }
        text.push_str(&message.text);
    }
    text
}

fn session_header(headers: &http::HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("x-session-id") else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::invalid("x-session-id: must be visible ASCII"))?;
    if text.len() > MAX_SESSION_ID_BYTES {
        return Err(ApiError::invalid(format!(
            "x-session-id: longer than {MAX_SESSION_ID_BYTES} bytes"
        )));
    }
    Ok(Some(text.to_owned()).filter(|s| !s.is_empty()))
}

fn record_decision(
    gateway: &Gateway,
    tracker: &Tracker,
    decision: &Decision,
    fault: Option<&PolicyFault>,
    owner: Option<&str>,
    elapsed: Duration,
) {
    let reason = match (fault, decision.reason) {
        (Some(_), _) => "fallback",
        (None, DecisionReason::Policy) => {
            if owner.is_some_and(|owner| owner == decision.server.id()) {
                "affinity"
            } else {
                "policy-other"
            }
        }
        (None, reason) => reason.as_str(),
    };
    gateway
        .metrics
        .routing_decisions
        .get_or_create(&DecisionLabels {
            variant: tracker.label.variant.clone(),
            reason,
        })
        .inc();
    gateway
        .metrics
        .routing_seconds
        .get_or_create(&tracker.label)
        .observe(elapsed.as_secs_f64());
    if let Some(fault) = fault {
        gateway
            .metrics
            .policy_faults
            .get_or_create(&FaultLabels {
                slot: "router",
                variant: tracker.label.variant.clone(),
                kind: fault.kind(),
            })
            .inc();
    }
    if let Some(capacity) = decision.capacity {
        gateway
            .metrics
            .routing_load_to_cap
            .observe(decision.load_after as f64 / capacity.max(1) as f64);
    }
}

/// What a router policy sees of a request.
fn policy_request(
    request: &MessagesRequest,
    input: &RoutingInput,
    tier: &str,
    session: Option<&str>,
    request_id: &str,
) -> PolicyRequest {
    let prompt_bytes = request.system.as_ref().map_or(0, String::len)
        + request.messages.iter().map(|m| m.text.len()).sum::<usize>();
    PolicyRequest {
        id: request_id.to_owned(),
        model: request.model.clone(),
        tier: tier.to_owned(),
        session_id: session
            .map(str::to_owned)
            .or_else(|| request.user_id.clone()),
        routing_key: input.key,
        prefix_hashes: input.prefix_hashes.clone(),
        // About four bytes of English text per token; the engine counts exactly later.
        prompt_tokens: u32::try_from(prompt_bytes / 4).unwrap_or(u32::MAX),
        max_tokens: request.max_tokens,
        priority: 0,
        stream: request.stream,
        headers: Vec::new(),
    }
}

/// Per-request bookkeeping that ends in the variant's statistics and the latency histograms.
struct Tracker {
    gateway: Arc<Gateway>,
    variant: Option<Arc<Variant>>,
    label: VariantLabel,
    started: Instant,
}

impl Tracker {
    fn first_token(&self) {
        let ttft = self.started.elapsed().as_secs_f64();
        self.gateway
            .metrics
            .ttft_seconds
            .get_or_create(&self.label)
            .observe(ttft);
        if let Some(variant) = &self.variant {
            variant.stats.record_ttft(ttft);
        }
    }

    fn finished(&self, prompt_tokens: u32, cached_tokens: u32) {
        self.gateway
            .metrics
            .request_duration_seconds
            .get_or_create(&self.label)
            .observe(self.started.elapsed().as_secs_f64());
        if let Some(variant) = &self.variant {
            variant
                .stats
                .prompt_tokens
                .fetch_add(u64::from(prompt_tokens), Ordering::Relaxed);
            variant
                .stats
                .cached_tokens
                .fetch_add(u64::from(cached_tokens), Ordering::Relaxed);
        }
    }

    fn failed(&self) {
        if let Some(variant) = &self.variant {
            variant.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn generate_request(
    chat: ChatPrompt,
    request: &MessagesRequest,
    request_id: &str,
    priority: u8,
) -> GenerateRequest {
    GenerateRequest {
        prompt: None,
        priority,
        request_id: request_id.to_owned(),
        system: chat.system,
        messages: chat.messages,
        max_tokens: request.max_tokens,
        stop_sequences: request.stop_sequences.clone(),
        sampling: SamplingParams {
            temperature: request.temperature,
            top_p: request.top_p,
            top_k: request.top_k,
            seed: None,
        },
    }
}

fn backend_error(error: ringmaster_pool::BackendError, attempts: u32) -> ApiError {
    use ringmaster_pool::remote::RemoteError;
    let tries = if attempts > 1 {
        format!(" (after {attempts} attempts on different servers)")
    } else {
        String::new()
    };
    match error {
        ringmaster_pool::BackendError::Engine(e) => engine_error(e),
        ringmaster_pool::BackendError::Remote(RemoteError::Refused { message }) => {
            ApiError::invalid(message)
        }
        ringmaster_pool::BackendError::Remote(e) => ApiError::new(
            ErrorKind::Unavailable,
            format!("GPU server unavailable{tries}: {e}"),
        )
        .with_retry_after(Duration::from_secs(1)),
    }
}

fn engine_error(error: EngineError) -> ApiError {
    match error {
        EngineError::PromptTooLong { .. }
        | EngineError::ContextTooLong { .. }
        | EngineError::EmptyPrompt => ApiError::invalid(format!("prompt is too long: {error}")),
        EngineError::Stopped => ApiError::new(
            ErrorKind::Overloaded,
            "the GPU server is shutting down; retry",
        )
        .with_retry_after(Duration::from_secs(1)),
        other => ApiError::internal(format!("GPU server error: {other}")),
    }
}

fn stop_of(reason: &FinishReason) -> (StopReason, Option<String>) {
    match reason {
        FinishReason::EndOfTurn => (StopReason::EndTurn, None),
        FinishReason::MaxTokens => (StopReason::MaxTokens, None),
        FinishReason::StopSequence(s) => (StopReason::StopSequence, Some(s.clone())),
        FinishReason::ToolCalls => (StopReason::ToolUse, None),
        FinishReason::ContentFilter => (StopReason::Refusal, None),
    }
}

fn usage(prompt_tokens: u32, cached_tokens: u32, output_tokens: u32) -> Usage {
    Usage {
        input_tokens: prompt_tokens.saturating_sub(cached_tokens),
        output_tokens,
        cache_read_input_tokens: cached_tokens,
        cache_creation_input_tokens: 0,
    }
}

fn empty_message(model: &str, id: &str, usage: Usage) -> MessageResponse {
    MessageResponse {
        id: id.to_owned(),
        kind: "message",
        role: Role::Assistant,
        model: model.to_owned(),
        content: Vec::new(),
        stop_reason: None,
        stop_sequence: None,
        usage,
    }
}

/// Counts a client disconnect if a non-streaming reply is dropped before it is complete:
/// hyper drops the handler's future when the connection goes away, and with it the engine's
/// stream, which cancels the generation.
struct UnfinishedReply<'a> {
    tracker: &'a Tracker,
    finished: bool,
}

impl Drop for UnfinishedReply<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.tracker.gateway.metrics.client_disconnects.inc();
            debug!("request.client_disconnected");
        }
    }
}

async fn collect_reply(
    tracker: &Tracker,
    request: &MessagesRequest,
    mut generation: GenerationStream,
    message_id: String,
) -> Result<MessageResponse, ApiError> {
    let mut guard = UnfinishedReply {
        tracker,
        finished: false,
    };
    let metrics = &tracker.gateway.metrics;
    let mut filter = tracker.gateway.safety.output();
    let mut text = String::new();
    let (mut prompt, mut cached, mut generated) = (0, 0, 0u32);
    let refusal = |text: String, prompt: u32, cached: u32, generated: u32, why: Blocked| {
        info!(reason = %why.reason, "request.output_blocked");
        tracker.finished(prompt, cached);
        let mut reply = empty_message(
            &request.model,
            &message_id,
            usage(prompt, cached, generated),
        );
        reply.content = vec![TextBlock::new(text)];
        reply.stop_reason = Some(StopReason::Refusal);
        reply
    };
    while let Some(event) = generation.next().await {
        match event {
            GenerateEvent::Started {
                prompt_tokens,
                cached_tokens,
            } => {
                tracker.first_token();
                (prompt, cached) = (prompt_tokens, cached_tokens);
            }
            GenerateEvent::Token { text: piece } => {
                generated += 1;
                match filter.as_mut().map(|f| f.push(metrics, &piece)) {
                    None => text.push_str(&piece),
                    Some(Ok(allowed)) => text.push_str(&allowed),
                    Some(Err(why)) => {
                        // Dropping the stream cancels the generation.
                        drop(generation);
                        guard.finished = true;
                        return Ok(refusal(text, prompt, cached, generated, why));
                    }
                }
            }
            GenerateEvent::Failed { message } => {
                guard.finished = true;
                warn!(%message, "request.server_failed");
                return Err(ApiError::new(
                    ErrorKind::Api,
                    format!("the GPU server failed during the reply: {message}"),
                ));
            }
            GenerateEvent::Finished {
                reason,
                prompt_tokens,
                cached_tokens,
                output_tokens,
            } => {
                guard.finished = true;
                if let Some(filter) = filter.as_mut() {
                    match filter.finish(metrics) {
                        Ok(allowed) => text.push_str(&allowed),
                        Err(why) => {
                            return Ok(refusal(
                                text,
                                prompt_tokens,
                                cached_tokens,
                                output_tokens,
                                why,
                            ));
                        }
                    }
                }
                tracker.finished(prompt_tokens, cached_tokens);
                let (stop_reason, stop_sequence) = stop_of(&reason);
                let mut reply = empty_message(
                    &request.model,
                    &message_id,
                    usage(prompt_tokens, cached_tokens, output_tokens),
                );
                reply.content = vec![TextBlock::new(text)];
                reply.stop_reason = Some(stop_reason);
                reply.stop_sequence = stop_sequence;
                return Ok(reply);
            }
        }
    }
    Err(ApiError::internal(
        "the GPU server stopped before finishing the reply",
    ))
}

fn stream_reply(
    tracker: Tracker,
    request: MessagesRequest,
    generation: GenerationStream,
    in_flight: InFlight,
    message_id: String,
) -> Response<ResponseBody> {
    let (tx, body) = ChannelBody::channel(SSE_CHANNEL_FRAMES);
    let task = produce_stream(tracker, request, generation, in_flight, message_id, tx);
    tokio::spawn(task.in_current_span());
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

/// Why a stream ended early.
enum StreamEnd {
    ClientGone,
    /// The server stopped, with what it said if anything.
    EngineGone(Option<String>),
}

async fn produce_stream(
    tracker: Tracker,
    request: MessagesRequest,
    mut generation: GenerationStream,
    in_flight: InFlight,
    message_id: String,
    tx: tokio::sync::mpsc::Sender<Bytes>,
) {
    let started = tracker.started;
    let send = |event: StreamEvent| {
        let tx = tx.clone();
        async move {
            tx.send(Bytes::from(event.to_sse()))
                .await
                .map_err(|_| StreamEnd::ClientGone)
        }
    };
    let metrics = &tracker.gateway.metrics;
    let mut filter = tracker.gateway.safety.output();
    let (mut prompt, mut cached, mut generated) = (0, 0, 0u32);
    // Ends the reply at a block: the held-back window is dropped, the generation cancelled.
    let refuse = |why: Blocked, prompt: u32, cached: u32, generated: u32| {
        let send = &send;
        let tracker = &tracker;
        async move {
            info!(reason = %why.reason, "stream.output_blocked");
            tracker.finished(prompt, cached);
            send(StreamEvent::ContentBlockStop { index: 0 }).await?;
            send(StreamEvent::MessageDelta {
                delta: MessageDeltaBody {
                    stop_reason: StopReason::Refusal,
                    stop_sequence: None,
                },
                usage: usage(prompt, cached, generated),
            })
            .await?;
            send(StreamEvent::MessageStop).await?;
            Ok(generated)
        }
    };
    let result: Result<u32, StreamEnd> = async {
        loop {
            let event = tokio::select! {
                event = generation.next() => event,
                () = tx.closed() => return Err(StreamEnd::ClientGone),
            };
            match event {
                None => return Err(StreamEnd::EngineGone(None)),
                Some(GenerateEvent::Failed { message }) => {
                    return Err(StreamEnd::EngineGone(Some(message)));
                }
                Some(GenerateEvent::Started {
                    prompt_tokens,
                    cached_tokens,
                }) => {
                    tracker.first_token();
                    (prompt, cached) = (prompt_tokens, cached_tokens);
                    let message = empty_message(
                        &request.model,
                        &message_id,
                        usage(prompt_tokens, cached_tokens, 1),
                    );
                    send(StreamEvent::MessageStart { message }).await?;
                    send(StreamEvent::ContentBlockStart {
                        index: 0,
                        content_block: TextBlock::new(String::new()),
                    })
                    .await?;
                    send(StreamEvent::Ping).await?;
                }
                Some(GenerateEvent::Token { text }) => {
                    generated += 1;
                    match filter.as_mut().map(|f| f.push(metrics, &text)) {
                        None => send(StreamEvent::text(text)).await?,
                        Some(Ok(allowed)) if allowed.is_empty() => {}
                        Some(Ok(allowed)) => send(StreamEvent::text(allowed)).await?,
                        Some(Err(why)) => {
                            return refuse(why, prompt, cached, generated).await;
                        }
                    }
                }
                Some(GenerateEvent::Finished {
                    reason,
                    prompt_tokens,
                    cached_tokens,
                    output_tokens,
                }) => {
                    if let Some(filter) = filter.as_mut() {
                        match filter.finish(metrics) {
                            Ok(allowed) if allowed.is_empty() => {}
                            Ok(allowed) => send(StreamEvent::text(allowed)).await?,
                            Err(why) => {
                                return refuse(why, prompt_tokens, cached_tokens, output_tokens)
                                    .await;
                            }
                        }
                    }
                    tracker.finished(prompt_tokens, cached_tokens);
                    let (stop_reason, stop_sequence) = stop_of(&reason);
                    send(StreamEvent::ContentBlockStop { index: 0 }).await?;
                    send(StreamEvent::MessageDelta {
                        delta: MessageDeltaBody {
                            stop_reason,
                            stop_sequence,
                        },
                        usage: usage(prompt_tokens, cached_tokens, output_tokens),
                    })
                    .await?;
                    send(StreamEvent::MessageStop).await?;
                    return Ok(output_tokens);
                }
            }
        }
    }
    .await;
    let server = in_flight.server().id().to_owned();
    match result {
        Ok(output_tokens) => {
            debug!(
                server,
                output_tokens,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "stream.done"
            );
        }
        Err(StreamEnd::ClientGone) => {
            drop(generation);
            tracker.gateway.metrics.client_disconnects.inc();
            debug!(server, "stream.client_disconnected");
        }
        Err(StreamEnd::EngineGone(message)) => {
            warn!(
                server,
                message = message.as_deref().unwrap_or(""),
                "stream.engine_stopped"
            );
            tracker.failed();
            let error = ApiError::internal(match message {
                Some(message) => format!("the GPU server failed during the reply: {message}"),
                None => "the GPU server stopped before finishing the reply".to_owned(),
            });
            let _ = send(StreamEvent::Error {
                error: error.body()["error"].clone(),
            })
            .await;
        }
    }
    drop(in_flight);
}
