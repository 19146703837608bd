//! Phase 4, attempt: the generation starts on the routed server. When it fails before the
//! first token in a way another server can fix (see
//! [`ringmaster_pool::remote::RemoteError::is_retryable`]), the next routable server on the
//! ring is tried, up to `[retry] attempts` within its deadline. A remote server's body is
//! encoded once per kind of server ([`UpstreamRequest`]): the client's own body, relayed with
//! only the model and the volatile lines changed, to a server that speaks the door's API;
//! the engines' request translated into the server's API otherwise. Every attempt on a server
//! of the same kind sends the same bytes; a local engine takes the request over. The fields
//! the server never saw are named with the answer.

use std::time::Duration;

use ringmaster_api::relay::RelayEdits;
use ringmaster_api::{ApiError, ErrorKind, FieldNotes, UnknownFields};
use ringmaster_gpu_runtime::{EngineError, GenerateRequest};
use ringmaster_pool::remote::{Endpoint, ReplyMode, UpstreamRequest};
use ringmaster_pool::{Backend, BackendError, Decision, Generation, InFlight};
use ringmaster_wire::Api;
use tracing::debug;

use super::legs::Encoded;
use super::{AdapterUse, Call};
use crate::metrics::AttemptLabels;
use ringmaster_slots::router::Routed;
use ringmaster_slots::router::pair::PrefillLeg;

/// A generation under way: its stream, the server it runs on, and how many attempts it took.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) generation: Generation,
    pub(crate) decision: Decision,
    pub(crate) in_flight: InFlight,
    pub(crate) attempts: u32,
    /// The successful attempt's span, when the request is traced.
    pub(crate) span: Option<tracing::Span>,
    /// The fields of the client's request the server never saw (the door noted them; a
    /// relayed body keeps them), by name.
    pub(crate) dropped: Vec<String>,
}

impl Call {
    /// How a remote server of `api` is asked for its reply: whole for a client that wants one
    /// message, streamed otherwise; and relayed as the server sent it (the whole answer, or a
    /// chat stream's own chunks) to a client of the server's API where nothing in it has to
    /// change: the same model name, no filter that may hold text back, not a split request's
    /// (its usage is the gateway's), and not a Responses reply (the gateway stores those
    /// under its own id).
    fn reply_mode(&self, api: Api, paired: bool) -> ReplyMode {
        let door = self.request.door;
        let as_sent = !paired
            && self.served_model == self.request.model
            && self.gateway.safety.slot.current().is_none();
        if !self.request.stream {
            if as_sent && door != ringmaster_api::Door::Responses && self.relays_to(api) {
                ReplyMode::WholeRelayed
            } else {
                ReplyMode::Whole
            }
        } else if as_sent && door.relays_chat_chunks() && api == Api::Chat {
            ReplyMode::Relayed
        } else {
            ReplyMode::Stream
        }
    }

    /// The request in the engines' terms. The prompt moves out of the call: routing is done
    /// with it, and the generation takes it over instead of copying it.
    fn generate_request(&mut self) -> GenerateRequest {
        let request = &mut self.request;
        let mut messages = std::mem::take(&mut request.messages);
        let prompt = if request.raw_prompt {
            messages.pop().map(|m| m.text)
        } else {
            None
        };
        GenerateRequest {
            prompt,
            priority: self.policy.priority,
            request_id: self.id.clone(),
            system: request.system.take(),
            messages,
            max_tokens: request.max_tokens,
            stop_sequences: std::mem::take(&mut request.stop_sequences),
            tools: request.tools.take(),
            sampling: request.sampling.clone(),
            effort: request.effort,
            output_format: request.output_format.take(),
        }
    }

    /// Phase 4: see the module's documentation.
    pub(crate) async fn attempt(&mut self, routed: Routed) -> Result<Started, ApiError> {
        let generate = self.generate_request();
        self.start(
            generate,
            (routed.decision, routed.in_flight),
            routed.pair.prefill,
        )
        .await
    }

    /// A LoRA adapter's request on `worker`: the adapter's use recorded, and loaded there
    /// first when the request was routed on the base model's pool (`[lora] load_on_demand`).
    async fn ready_adapter(
        &self,
        worker: &ringmaster_pool::remote::RemoteWorker,
    ) -> Result<(), ringmaster_pool::remote::RemoteError> {
        match &self.adapter {
            AdapterUse::None => Ok(()),
            AdapterUse::Held => {
                worker.touch_adapter(&self.served_model);
                Ok(())
            }
            AdapterUse::Load(source) => {
                worker
                    .ensure_adapter(&self.served_model, source, &self.gateway.config.lora)
                    .await
            }
        }
    }

    /// Whether a server of `api` gets the client's own body (it speaks the door's API, and
    /// the body was kept for it).
    fn relays_to(&self, api: Api) -> bool {
        self.body.is_some() && self.request.door.api() == api
    }

    /// The request for `server` (a remote one), encoded once per kind of server: the
    /// client's body relayed to a server of the door's API, else the engines' request
    /// translated into the server's API.
    pub(super) fn upstream_for(
        &self,
        server: &ringmaster_pool::Server,
        generate: &GenerateRequest,
        encoded: &mut Encoded,
        paired: bool,
    ) -> Result<UpstreamRequest, ApiError> {
        let target = server.target();
        let keep_volatile = server.protocol().keep_volatile;
        if let Some((_, _, _, request)) = encoded
            .iter()
            .find(|(t, keep, p, _)| *t == target && *keep == keep_volatile && *p == paired)
        {
            return Ok(request.clone());
        }
        let mode = self.reply_mode(target.api, paired);
        let request = match (&self.body, self.relays_to(target.api)) {
            (Some(body), true) => {
                let drops = self.request.fields.relay_drops(self.gateway.unknown_fields);
                let edits = RelayEdits {
                    model: &self.served_model,
                    volatile: (self.request.volatile.is_some() && !keep_volatile)
                        .then_some(&self.gateway.volatile),
                    drop: &drops,
                    stream_usage: true,
                    usage_stats: target.vllm,
                    prior_items: self
                        .request
                        .responses
                        .as_deref()
                        .and_then(|c| c.prior_items.as_deref()),
                    clamped: self.request.clamped,
                };
                let relayed = ringmaster_api::relay::relay_body(self.request.door, body, &edits)?;
                let endpoint = if self.request.door == ringmaster_api::Door::Completions {
                    Endpoint::Completions
                } else {
                    Endpoint::of(target.api)
                };
                let headers = if target.api == Api::Messages {
                    self.relay_headers.clone()
                } else {
                    Vec::new()
                };
                UpstreamRequest::relayed(
                    endpoint,
                    bytes::Bytes::from(relayed),
                    mode,
                    self.id.clone(),
                    headers,
                )
            }
            _ => UpstreamRequest::encode_for(generate, &self.served_model, mode, target),
        };
        encoded.push((target, keep_volatile, paired, request.clone()));
        Ok(request)
    }

    /// The fields the request dropped on `server`: of a relayed body's, the reserved ones
    /// (always) and the unknown ones `[api] unknown_fields = "drop"` takes out; every one the
    /// translation into the engines' request left behind otherwise.
    fn dropped_on(&self, server: &ringmaster_pool::Server) -> Vec<String> {
        let fields = &self.request.fields;
        match server.engine() {
            Backend::Remote(_) if self.relays_to(server.api()) => FieldNotes {
                unknown: match self.gateway.unknown_fields {
                    UnknownFields::Drop => fields.unknown.clone(),
                    UnknownFields::Pass | UnknownFields::Refuse => Vec::new(),
                },
                reserved: fields.reserved.clone(),
                ..FieldNotes::default()
            }
            .dropped(true),
            Backend::Remote(_) => fields.dropped(server.protocol().reasoning),
            Backend::Local(_) => fields.dropped(false),
        }
    }

    async fn start(
        &self,
        generate: GenerateRequest,
        (mut decision, mut in_flight): (Decision, InFlight),
        mut prefill: Option<PrefillLeg>,
    ) -> Result<Started, ApiError> {
        let gateway = &self.gateway;
        let retry = &gateway.config.retry;
        // A local engine takes the request over; a remote one reads the bytes encoded once
        // for its kind of server.
        let mut generate = Some(generate);
        let mut encoded: Encoded = Vec::new();
        let mut tried: Vec<String> = Vec::new();
        let mut attempts = 0u32;
        let mut retry_reason: Option<String> = None;
        loop {
            attempts += 1;
            let span = self
                .trace
                .as_ref()
                .map(|parent| attempt_span(parent, &decision, attempts, retry_reason.as_deref()));
            // Only the first attempt is split: a retry is served whole.
            let leg = prefill.take();
            if let (Some(span), Some(_)) = (&span, &leg) {
                use ringmaster_telemetry::SpanExt;
                span.attribute(ringmaster_telemetry::semconv::LEG, "decode");
            }
            let result = match decision.server.engine() {
                Backend::Local(engine) => match generate.take() {
                    Some(request) => match leg {
                        Some(leg) => self.local_pair(engine, request, leg).await,
                        None => engine
                            .submit(request)
                            .map(Generation::from)
                            .map_err(BackendError::Engine),
                    },
                    None => Err(BackendError::Engine(EngineError::Stopped)),
                },
                Backend::Remote(worker) => {
                    let paired = leg.is_some();
                    let upstream = match generate.as_ref() {
                        Some(request) => {
                            let mut upstream =
                                self.upstream_for(&decision.server, request, &mut encoded, paired)?;
                            upstream.set_trace_context(self.trace_context_for(span.as_ref()));
                            Some(upstream)
                        }
                        None => None,
                    };
                    let encoded = &mut encoded;
                    let server = &decision.server;
                    let submitted = async {
                        let (Some(request), Some(generate)) =
                            (upstream.as_ref(), generate.as_ref())
                        else {
                            return Err(BackendError::Engine(EngineError::Stopped));
                        };
                        self.ready_adapter(worker)
                            .await
                            .map_err(BackendError::Remote)?;
                        match leg {
                            Some(leg) => {
                                self.remote_pair(
                                    (server, worker),
                                    request,
                                    leg,
                                    (generate, encoded),
                                )
                                .await
                            }
                            None => worker.submit(request).await.map_err(BackendError::Remote),
                        }
                    };
                    match &span {
                        Some(span) => {
                            use tracing::Instrument;
                            submitted.instrument(span.clone()).await
                        }
                        None => submitted.await,
                    }
                }
            };
            let error = match result {
                Ok(generation) => {
                    gateway
                        .metrics
                        .upstream_attempts
                        .get_or_create(&AttemptLabels { outcome: "ok" })
                        .inc();
                    if let Some(span) = &span {
                        use ringmaster_telemetry::SpanExt;
                        span.attribute(ringmaster_telemetry::semconv::ATTEMPT_OUTCOME, "ok");
                    }
                    let dropped = self.dropped_on(&decision.server);
                    return Ok(Started {
                        generation,
                        decision,
                        in_flight,
                        attempts,
                        span,
                        dropped,
                    });
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
            if let Some(span) = &span {
                use ringmaster_telemetry::SpanExt;
                span.attribute(ringmaster_telemetry::semconv::ATTEMPT_OUTCOME, outcome);
                span.attribute(ringmaster_telemetry::semconv::ERROR_TYPE, outcome);
                span.failed(error.to_string());
            }
            retry_reason = Some(format!("{outcome}: {error}"));
            if !retryable || attempts >= retry.attempts || self.started.elapsed() >= retry.deadline
            {
                return Err(backend_error(error, attempts));
            }
            tried.push(decision.server.id().to_owned());
            // Release the failed server's slot before the next choice counts loads.
            drop(in_flight);
            match gateway.pool.reassign(&self.pool, &self.input, &tried) {
                Some((next, mut next_in_flight)) => {
                    next_in_flight.charge_prefill(u64::from(self.request.estimated_tokens));
                    (decision, in_flight) = (next, next_in_flight);
                }
                None => return Err(backend_error(error, attempts)),
            }
        }
    }
}

impl Call {
    /// The trace context a server is sent: this attempt's span when the request is traced,
    /// else the client's own as it came (`[telemetry] propagate = false`: none).
    pub(super) fn trace_context_for(
        &self,
        span: Option<&tracing::Span>,
    ) -> Vec<(http::HeaderName, http::HeaderValue)> {
        if !self.gateway.config.telemetry.propagate {
            return Vec::new();
        }
        match span {
            Some(span) => ringmaster_telemetry::context_headers(span),
            None => self.trace_context.clone(),
        }
    }
}

/// One upstream attempt's span: the server, the attempt's number, why it is a retry.
fn attempt_span(
    parent: &tracing::Span,
    decision: &Decision,
    attempt: u32,
    retry_reason: Option<&str>,
) -> tracing::Span {
    use ringmaster_telemetry::SpanExt;
    use ringmaster_telemetry::semconv as k;
    let span = tracing::info_span!(parent: parent, "upstream", otel.kind = "client");
    span.attribute(k::SERVER_ADDRESS, decision.server.id().to_owned());
    span.attribute(k::ATTEMPT, i64::from(attempt));
    if let Some(reason) = retry_reason {
        span.attribute(k::RETRY_REASON, reason.to_owned());
    }
    span
}

fn backend_error(error: BackendError, attempts: u32) -> ApiError {
    use ringmaster_pool::remote::RemoteError;
    let tries = if attempts > 1 {
        format!(" (after {attempts} attempts on different servers)")
    } else {
        String::new()
    };
    match error {
        BackendError::Engine(e) => engine_error(e),
        BackendError::Remote(RemoteError::Refused { message }) => ApiError::invalid(message),
        BackendError::Remote(e) => ApiError::new(
            ErrorKind::Unavailable,
            format!("GPU server unavailable{tries}: {e}"),
        )
        .with_retry_after(Duration::from_secs(1)),
    }
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
