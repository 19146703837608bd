//! The Messages handler: one request from its headers to its reply. Parsed once, rendered
//! once, hashed once, decided on one pool snapshot (the request's model's pool), started on
//! the routed server with retries before the first token, and answered by the reply state
//! machine ([`reply`]) as a stream or as one message.

mod early;
mod reply;
pub(crate) mod resume;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use ringmaster_gpu_runtime::{EngineError, GenerateRequest, GenerationStream, SamplingParams};
use ringmaster_policy_engine::{Outcome, PolicyFault, PolicyRequest};
use ringmaster_pool::kv_view::ChatPrompt;
use ringmaster_pool::{Decision, DecisionReason, InFlight, PoolSnapshot};
use tracing::debug;

use crate::Gateway;
use crate::api::{self, MessagesRequest, ReplyFormat};
use crate::body::ResponseBody;
use crate::error::{ApiError, ErrorKind};
use crate::metrics::{AttemptLabels, DecisionLabels, FaultLabels, VariantLabel};
use crate::policy::{RouteOutcome, Routed, Variant};
use crate::respond::{header_names, json_response, read_json_body};
use crate::routing::{MAX_SESSION_ID_BYTES, RoutingInput, routing_input};

/// Which API a request came in by: the body is parsed, and the reply written, in its terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/messages`.
    #[default]
    Messages,
    /// `POST /v1/chat/completions`.
    ChatCompletions,
    /// `POST /v1/completions`.
    Completions,
}

/// `POST /v1/messages`, `/v1/chat/completions` and `/v1/completions`.
pub(crate) async fn messages(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
    api: Api,
    started: Instant,
    request_id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let caller = gateway.auth.check(req.headers())?;
    let session = session_header(req.headers(), &gateway.config.session_headers)?;
    let passed_headers = passed_headers(req.headers(), &gateway.config.policies.pass_headers);
    let queue_timeout = queue_timeout_header(req.headers())?;
    let body = read_json_body(gateway, req).await?;
    let mut call = MessagesCall {
        api,
        queue_timeout,
        body,
        session,
        caller,
        passed_headers,
        streamed: None,
    };
    let Some(every) = gateway.config.stream_ping else {
        return handle(gateway, call, started, request_id).await;
    };
    // A streamed reply that is not ready within a ping interval starts early ([`early`]).
    let streamed = Arc::new(std::sync::OnceLock::new());
    call.streamed = Some(streamed.clone());
    let (owned_gateway, owned_id) = (gateway.clone(), request_id.to_owned());
    let mut pending: early::Pending =
        Box::pin(async move { handle(&owned_gateway, call, started, &owned_id).await });
    // The first poll parses the request and runs until its first wait: only a stream that
    // then waits needs the timer.
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(pending.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(reply) = first {
        return reply;
    }
    if streamed.get().is_none() {
        return pending.await;
    }
    let interval = tokio::time::sleep(every);
    tokio::pin!(interval);
    tokio::select! {
        biased;
        reply = &mut pending => return reply,
        () = &mut interval => {}
    }
    match streamed.get() {
        Some(&format) => {
            debug!("stream.started_early");
            let stream_id = gateway.streams.enabled().then_some(request_id);
            Ok(early::response(
                pending,
                format,
                every,
                stream_id,
                tracing::Span::current(),
            ))
        }
        None => pending.await,
    }
}

/// `POST /v1/messages/count_tokens`: the prompt rendered with the chat template and counted
/// with the tokenizer of the model's pool (a server that reports its tokenizer: a local model
/// server, a `ringmaster worker`). A pool of servers that report none is estimated (four bytes
/// a token over text, tool calls and the tools offered, a bound per image), and the answer
/// says so in `x-ringmaster-token-count: estimated`.
pub(crate) async fn count_tokens(
    gateway: &Arc<Gateway>,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ApiError> {
    let caller = gateway.auth.check(req.headers())?;
    let body = read_json_body(gateway, req).await?;
    let fleet = gateway.pool.snapshot();
    let request = api::parse_count_tokens_request(&body, gateway.limits(&fleet))?;
    caller.may_use(&request.model)?;
    let (_, pool) = resolve_model(&fleet, &request.model)?;
    let scheme = pool.servers.iter().find_map(|s| s.cache_scheme());
    // Only Ringmaster's own engines report a tokenizer, and they serve neither tools nor
    // images: a count of a prompt they would refuse would only mislead.
    if scheme.is_some()
        && let Some(refusal) = unserved_in_process(&request)
    {
        return Err(refusal);
    }
    let chat = crate::routing::chat_prompt(&request);
    let (tokens, exact) = match scheme {
        Some(scheme) => (
            scheme
                .tokenizer
                .encode_chat(chat.system.as_deref(), &chat.messages)
                .len(),
            true,
        ),
        None => (estimated_tokens(&chat, request.tools.as_deref()), false),
    };
    let mut response = json_response(
        StatusCode::OK,
        &serde_json::json!({ "input_tokens": tokens }),
    );
    response.headers_mut().insert(
        "x-ringmaster-token-count",
        HeaderValue::from_static(if exact { "exact" } else { "estimated" }),
    );
    Ok(response)
}

/// Tokens per image in an estimate: the most one image costs Claude after its resize (about
/// 1.15 megapixels at 750 pixels a token), so an estimate errs high, as a budget should.
const ESTIMATED_TOKENS_PER_IMAGE: usize = 1_600;

/// A prompt's size for servers that report no tokenizer: four bytes a token over everything
/// the server reads (text, tool calls, tool results, the tools offered), plus a bound per image.
fn estimated_tokens(chat: &ChatPrompt, tools: Option<&ringmaster_gpu_runtime::ToolOffer>) -> usize {
    let calls = |m: &ringmaster_gpu_runtime::ChatMessage| {
        m.tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len())
            .sum::<usize>()
    };
    let offered = tools.map_or(0, |offer| {
        offer
            .tools
            .iter()
            .map(|t| {
                t.name.len()
                    + t.description.as_ref().map_or(0, String::len)
                    + t.parameters.to_string().len()
            })
            .sum()
    });
    let bytes = chat.system.as_ref().map_or(0, String::len)
        + offered
        + chat
            .messages
            .iter()
            .map(|m| m.text.len() + calls(m))
            .sum::<usize>();
    let images: usize = chat.messages.iter().map(|m| m.images.len()).sum();
    bytes.div_ceil(4) + images * ESTIMATED_TOKENS_PER_IMAGE
}

/// `GET /v1/streams/{id}`: a resumable stream again, from after its `Last-Event-ID` (from the
/// start without one). 404 once the stream is gone, or when another key started it.
pub(crate) fn resume_stream(
    gateway: &Arc<Gateway>,
    req: &Request<Incoming>,
    id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let caller = gateway.auth.check(req.headers())?;
    if !gateway.streams.enabled() {
        return Err(ApiError::not_found(
            "streams are not resumable on this gateway ([limits] resume_window_ms is 0)",
        ));
    }
    let last = match req.headers().get("last-event-id") {
        None => 0,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or_else(|| ApiError::invalid("last-event-id: must be an event id (a number)"))?,
    };
    let body = gateway
        .streams
        .resume(id, &caller.key_label, last)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "stream {id:?} is not known here (finished and expired, or never started)"
            ))
        })?;
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// A Messages request as the handler's core takes it: the body as read, and what the HTTP
/// layer took from the headers. In-process callers (the trace replay) build it directly.
#[derive(Debug)]
pub struct MessagesCall {
    /// The API it speaks.
    pub api: Api,
    /// The JSON body.
    pub body: bytes::Bytes,
    /// The session id (`x-session-id`), if any.
    pub session: Option<String>,
    /// Who sent it.
    pub caller: crate::auth::Caller,
    /// The headers passed on to policies.
    pub passed_headers: Vec<(String, String)>,
    /// The request's own limit on its wait in the admission queue
    /// (`x-ringmaster-queue-timeout-ms`), when it sets one.
    pub queue_timeout: Option<Duration>,
    /// Set to the reply's format once the body is known to ask for a stream (`None`: nobody
    /// asks), so that a reply still waiting can start early.
    pub streamed: Option<Arc<std::sync::OnceLock<ReplyFormat>>>,
}

/// The Messages handler from a parsed call on: what `POST /v1/messages` does after the HTTP
/// layer, with the same routing, admission, retries and reply. `started` is when the request
/// arrived.
pub async fn handle(
    gateway: &Arc<Gateway>,
    call: MessagesCall,
    started: Instant,
    request_id: &str,
) -> Result<Response<ResponseBody>, ApiError> {
    let MessagesCall {
        api,
        queue_timeout,
        body,
        session,
        caller,
        passed_headers,
        streamed,
    } = call;
    // The request's one view of the pool: admission, the router, assignment and the metrics
    // all decide on it.
    let fleet = gateway.pool.snapshot();
    let limits = gateway.limits(&fleet);
    let request = match api {
        Api::Messages => api::parse_messages_request(&body, limits)?,
        Api::ChatCompletions => crate::openai::parse_chat_request(&body, limits)?,
        Api::Completions => crate::openai::parse_completion_request(&body, limits)?,
    };
    drop(body);
    if request.stream
        && let Some(streamed) = &streamed
    {
        let _ = streamed.set(request.format);
    }
    let (served_model, model_pool) = resolve_model(&fleet, &request.model)?;
    let served_model = served_model.to_owned();
    let in_process = model_pool
        .servers
        .iter()
        .any(|s| matches!(s.engine(), ringmaster_pool::Backend::Local(_)));
    if in_process && let Some(refusal) = unserved_in_process(&request) {
        return Err(refusal);
    }
    if gateway.safety.slot.current().is_some() {
        gateway
            .safety
            .check_input(&gateway.metrics, &prompt_text(&request))?;
    }
    let mut input = routing_input(&request, session.as_deref(), gateway.config.prefix_hashing);
    let snapshot = model_pool;
    if snapshot.servers.is_empty() && !fleet.servers.is_empty() {
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
    caller.admit(&request.model, policy_request.prompt_tokens)?;
    let asked_tokens = u64::from(policy_request.prompt_tokens) + u64::from(request.max_tokens);
    let waited = gateway
        .admission
        .admit(
            &gateway.pool,
            &snapshot,
            &gateway.metrics,
            &input,
            &mut policy_request,
            crate::admission::Asking {
                tenant: &caller.tenant,
                tokens: asked_tokens,
                deadline: queue_timeout,
            },
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
    // A learning router hears how each request it decided went (`observe`).
    let observation = variant
        .as_ref()
        .filter(|v| v.policy.learns() && fault.is_none())
        .map(|_| Observation {
            request_id: request_id.to_owned(),
            routing_key: policy_request.routing_key,
            decided: matches!(decision.reason, DecisionReason::Policy)
                .then(|| decision.server.id().to_owned()),
            server: decision.server.id().to_owned(),
            ttft_us: AtomicU64::new(u64::MAX),
        });
    let mut tracker = Tracker {
        gateway: gateway.clone(),
        charged: caller
            .is_limited()
            .then(|| (caller.clone(), policy_request.prompt_tokens)),
        fair_share: gateway.admission.is_active().then(|| caller.tenant.clone()),
        observation,
        label: VariantLabel {
            variant: variant
                .as_ref()
                .map_or_else(|| "native".to_owned(), |v| v.name.to_string()),
        },
        variant,
        started,
        record: gateway.recorder().map(|r| {
            r.start(
                started,
                &input.prefix_hashes,
                gateway.config.prefix_hashing.chunk_bytes,
            )
        }),
    };
    record_decision(
        gateway,
        &tracker,
        &decision,
        fault.as_ref(),
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
    // A client that speaks its server's API gets the server's own chunks where nothing in
    // them has to change: the same model name, and no filter that may hold text back.
    let mode = match (request.stream, request.format) {
        (false, _) => ringmaster_pool::remote::ReplyMode::Whole,
        (true, ReplyFormat::OpenAiChat { .. } | ReplyFormat::OpenAiCompletion { .. })
            if served_model == request.model && gateway.safety.slot.current().is_none() =>
        {
            ringmaster_pool::remote::ReplyMode::Relayed
        }
        (true, _) => ringmaster_pool::remote::ReplyMode::Stream,
    };
    let target = Target {
        mode,
        pool: &snapshot,
        model: &served_model,
        input: &input,
        prompt_tokens: policy_request.prompt_tokens,
    };
    let (generation, decision, in_flight, attempts) =
        match start_generation(gateway, target, generate, decision, in_flight, started).await {
            Ok(started) => started,
            Err(e) => {
                tracker.failed(e.message());
                return Err(e);
            }
        };
    if let Some(observation) = tracker.observation.as_mut() {
        decision.server.id().clone_into(&mut observation.server);
    }
    let relay = generation.relay_state();
    let message_id = match (
        request.format,
        relay.as_ref().and_then(|r| r.reply_id.clone()),
    ) {
        // A relayed reply keeps the server's id, which its relayed chunks carry.
        (ReplyFormat::OpenAiChat { .. } | ReplyFormat::OpenAiCompletion { .. }, Some(id)) => id,
        (ReplyFormat::Messages, _) => format!("msg_{}", uuid::Uuid::new_v4().simple()),
        (ReplyFormat::OpenAiChat { .. }, None) => {
            format!("chatcmpl-{}", uuid::Uuid::new_v4().simple())
        }
        (ReplyFormat::OpenAiCompletion { .. }, None) => {
            format!("cmpl-{}", uuid::Uuid::new_v4().simple())
        }
    };
    let server_id = decision.server.id().to_owned();
    let variant_name = tracker.label.variant.clone();
    let variant_hash = tracker
        .variant
        .as_ref()
        .map(|v| v.policy.info().hash.clone());
    let mut response = if request.stream {
        let relayed = relay.is_some();
        let response = reply::stream(
            tracker,
            &request,
            (generation, relayed),
            in_flight,
            message_id,
        );
        if gateway.streams.enabled() {
            let (mut parts, body) = response.into_parts();
            // The stream is known by its request's id, which a stream that started early
            // (before this point) already named in its headers.
            let body = gateway.streams.adopt(request_id, &caller.key_label, body);
            if let Ok(value) = HeaderValue::from_str(request_id) {
                parts.headers.insert(&header_names::STREAM_ID, value);
            }
            Response::from_parts(parts, body)
        } else {
            response
        }
    } else {
        let mut in_flight = in_flight;
        let reply =
            reply::collect(&tracker, &request, generation, &mut in_flight, message_id).await?;
        drop(in_flight);
        match request.format {
            ReplyFormat::Messages => json_response(StatusCode::OK, &reply),
            ReplyFormat::OpenAiChat { .. } => json_response(
                StatusCode::OK,
                &crate::openai::whole_body(&reply, true, crate::openai::unix_now()),
            ),
            ReplyFormat::OpenAiCompletion { .. } => json_response(
                StatusCode::OK,
                &crate::openai::whole_body(&reply, false, crate::openai::unix_now()),
            ),
        }
    };
    if let Ok(value) = HeaderValue::from_str(&server_id) {
        response.headers_mut().insert(&header_names::SERVER, value);
    }
    response
        .headers_mut()
        .insert(&header_names::ATTEMPTS, HeaderValue::from(attempts));
    if let Ok(value) = HeaderValue::from_str(&variant_name) {
        response.headers_mut().insert(&header_names::VARIANT, value);
    }
    caller.rate_limit_headers(response.headers_mut(), request.format.is_openai());
    // The router version that decided (absent when the native ring decided alone).
    if let Some(value) = variant_hash.and_then(|h| HeaderValue::from_str(&h).ok()) {
        response
            .headers_mut()
            .insert(&header_names::POLICY_VERSION, value);
    }
    Ok(response)
}

/// Where a request is to run: its model's pool, the name that model is served under, and
/// the request's routing values.
#[derive(Clone, Copy)]
struct Target<'a> {
    /// How a remote server is asked for its reply.
    mode: ringmaster_pool::remote::ReplyMode,
    pool: &'a PoolSnapshot,
    model: &'a str,
    input: &'a RoutingInput,
    /// The prompt's estimated tokens (charged to a retry's server as its prefill backlog).
    prompt_tokens: u32,
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
                    .submit(request, target.model, target.mode)
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
            Some((next, mut next_in_flight)) => {
                next_in_flight.charge_prefill(u64::from(target.prompt_tokens));
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

/// The longest a request lets itself wait in the admission queue.
fn queue_timeout_header(headers: &http::HeaderMap) -> Result<Option<Duration>, ApiError> {
    const NAME: &str = "x-ringmaster-queue-timeout-ms";
    let Some(value) = headers.get(NAME) else {
        return Ok(None);
    };
    let ms = value
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|ms| *ms > 0)
        .ok_or_else(|| {
            ApiError::invalid(format!("{NAME}: must be a positive number of milliseconds"))
        })?;
    Ok(Some(Duration::from_millis(ms)))
}

/// The session id from the first of `names` the request carries.
fn session_header(
    headers: &http::HeaderMap,
    names: &[http::HeaderName],
) -> Result<Option<String>, ApiError> {
    let Some((name, value)) = names
        .iter()
        .find_map(|name| headers.get(name).map(|value| (name, value)))
    else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| ApiError::invalid(format!("{name}: must be visible ASCII")))?;
    if text.len() > MAX_SESSION_ID_BYTES {
        return Err(ApiError::invalid(format!(
            "{name}: longer than {MAX_SESSION_ID_BYTES} bytes"
        )));
    }
    Ok(Some(text.to_owned()).filter(|s| !s.is_empty()))
}

fn record_decision(
    gateway: &Gateway,
    tracker: &Tracker,
    decision: &Decision,
    fault: Option<&PolicyFault>,
    elapsed: Duration,
) {
    let reason = match (fault, decision.reason) {
        (Some(_), _) => "fallback",
        (None, DecisionReason::Policy) => {
            // `preferred` is the key's owner on the ring.
            if decision
                .preferred
                .as_ref()
                .is_some_and(|owner| owner.id() == decision.server.id())
            {
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

/// What a learning router is told about a request it decided, gathered as the request runs.
struct Observation {
    request_id: String,
    routing_key: u64,
    /// The server the router chose (`None`: the host's ring chose, over its cap).
    decided: Option<String>,
    /// The server that served it (after retries).
    server: String,
    /// Microseconds to the first token (`u64::MAX`: none yet).
    ttft_us: AtomicU64,
}

/// Per-request bookkeeping that ends in the variant's statistics and the latency histograms.
struct Tracker {
    gateway: Arc<Gateway>,
    /// The caller whose token buckets the reply charges, with the input tokens charged on
    /// the estimate (`None`: no bucket applies).
    charged: Option<(crate::auth::Caller, u32)>,
    /// The tenant whose virtual token counter the output is counted to (`None`: no admission
    /// policy, so no queue to order).
    fair_share: Option<String>,
    variant: Option<Arc<Variant>>,
    /// Set when the deciding variant learns.
    observation: Option<Observation>,
    label: VariantLabel,
    started: Instant,
    /// The request's start as the traffic recording has it, when recording.
    record: Option<crate::record::RecordStart>,
}

impl Tracker {
    /// The server counted the prompt: the input charge is corrected to its count.
    fn counted_prompt(&self, prompt_tokens: u32) {
        if let Some((caller, estimated)) = &self.charged {
            caller.settle_input(*estimated, prompt_tokens);
        }
    }

    /// `tokens` more generated tokens, charged to the output buckets as they stream.
    fn generated(&self, tokens: u32) {
        if tokens == 0 {
            return;
        }
        if let Some((caller, _)) = &self.charged {
            caller.charge_output(tokens);
        }
        if let Some(tenant) = &self.fair_share {
            self.gateway
                .admission
                .order
                .served(tenant, tokens, crate::queue::OUTPUT_WEIGHT);
        }
    }

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
        if let Some(observation) = &self.observation {
            let micros = u64::try_from(self.started.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
            observation.ttft_us.store(micros, Ordering::Relaxed);
        }
    }

    /// Tells a learning router how the request went. Runs once the last token (or the failure)
    /// is in, before the reply's closing events or body go out; a fault is counted like a
    /// routing fault.
    fn observe(&self, tokens: (u32, u32, u32), error: Option<&str>) {
        let (Some(variant), Some(observation)) = (&self.variant, &self.observation) else {
            return;
        };
        let ttft = observation.ttft_us.load(Ordering::Relaxed);
        let outcome = Outcome {
            request_id: observation.request_id.clone(),
            routing_key: observation.routing_key,
            server: observation.server.clone(),
            as_decided: observation.decided.as_deref() == Some(observation.server.as_str()),
            ttft_us: (ttft != u64::MAX).then_some(ttft),
            prompt_tokens: tokens.0,
            cached_tokens: tokens.1,
            output_tokens: tokens.2,
            error: error.map(str::to_owned),
        };
        if let Err(fault) = variant.policy.observe(&outcome) {
            debug!(variant = %variant.name, kind = fault.kind(), "policy.observe_fault");
            variant.stats.faults.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn finished(&self, prompt_tokens: u32, cached_tokens: u32, output_tokens: u32) {
        if let (Some(recorder), Some(start)) = (self.gateway.recorder(), &self.record) {
            recorder.finish(start, prompt_tokens, output_tokens);
        }
        self.gateway
            .metrics
            .request_duration_seconds
            .get_or_create(&self.label)
            .observe(self.started.elapsed().as_secs_f64());
        if let Some(variant) = &self.variant {
            variant.stats.record_cache(cached_tokens, prompt_tokens);
        }
        self.observe((prompt_tokens, cached_tokens, output_tokens), None);
    }

    fn failed(&self, why: &str) {
        if let Some(variant) = &self.variant {
            variant.stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.observe((0, 0, 0), Some(why));
    }
}

fn generate_request(
    chat: ChatPrompt,
    request: &MessagesRequest,
    request_id: &str,
    priority: u8,
) -> GenerateRequest {
    GenerateRequest {
        prompt: request.raw_prompt.clone(),
        priority,
        request_id: request_id.to_owned(),
        system: chat.system,
        messages: chat.messages,
        max_tokens: request.max_tokens,
        stop_sequences: request.stop_sequences.clone(),
        tools: request.tools.clone(),
        sampling: SamplingParams {
            temperature: request.temperature,
            top_p: request.top_p,
            top_k: request.top_k,
            seed: request.seed,
            ignore_eos: request.ignore_eos,
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

/// The 400 for what an engine of this crate cannot serve (tools, images), naming the feature;
/// `None` when the request asks for neither. Such engines run in the gateway's process or in
/// a `ringmaster worker`; pools of OpenAI-compatible servers serve both features.
fn unserved_in_process(request: &MessagesRequest) -> Option<ApiError> {
    if request.uses_tools() {
        return Some(ApiError::invalid(format!(
            "tools: tool use (tool calling) is not supported for the model {:?}: its servers run \
             Ringmaster's own engine, which does not call tools (the feature is served by pools of \
             OpenAI-compatible servers with tool calling); leave tools out",
            request.model
        )));
    }
    if request.uses_images() {
        return Some(ApiError::invalid(format!(
            "image input is not supported for the model {:?}: its servers run Ringmaster's own \
             engine, which reads text only (images are served by pools of OpenAI-compatible \
             servers with a vision model); send text only",
            request.model
        )));
    }
    None
}

fn engine_error(error: EngineError) -> ApiError {
    match error {
        EngineError::PromptTooLong { .. } | EngineError::ContextTooLong { .. } => {
            ApiError::invalid(format!("prompt is too long: {error}"))
        }
        EngineError::EmptyPrompt => ApiError::invalid(format!("prompt: {error}")),
        EngineError::ToolsUnsupported => ApiError::invalid(format!("tools: {error}")),
        EngineError::ImagesUnsupported => ApiError::invalid(error.to_string()),
        EngineError::Stopped => ApiError::new(
            ErrorKind::Overloaded,
            "the GPU server is shutting down; retry",
        )
        .with_retry_after(Duration::from_secs(1)),
        other => ApiError::internal(format!("GPU server error: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_session_header_present_wins() {
        let names: Vec<http::HeaderName> = crate::routing::DEFAULT_SESSION_HEADERS
            .iter()
            .map(|h| http::HeaderName::from_static(h))
            .collect();
        let mut headers = http::HeaderMap::new();
        assert_eq!(session_header(&headers, &names).unwrap(), None);
        headers.insert("x-claude-code-session-id", "cc-1".parse().unwrap());
        assert_eq!(
            session_header(&headers, &names).unwrap().as_deref(),
            Some("cc-1")
        );
        headers.insert("x-session-id", "generic".parse().unwrap());
        assert_eq!(
            session_header(&headers, &names).unwrap().as_deref(),
            Some("generic")
        );
        headers.insert(
            "x-session-id",
            "a".repeat(MAX_SESSION_ID_BYTES + 1).parse().unwrap(),
        );
        let err = session_header(&headers, &names).unwrap_err();
        assert!(
            err.message().starts_with("x-session-id: longer than"),
            "{}",
            err.message()
        );
        // Only the configured names count.
        let only: Vec<http::HeaderName> = vec![http::HeaderName::from_static("x-team-session")];
        assert_eq!(session_header(&headers, &only).unwrap(), None);
    }
}
