//! Phase 4, attempt: the generation starts on the routed server. When it fails before the
//! first token in a way another server can fix (see
//! [`ringmaster_pool::remote::RemoteError::is_retryable`]), the next routable server on the
//! ring is tried, up to `[retry] attempts` within its deadline. A remote server's body is
//! encoded once ([`UpstreamRequest`]) and every attempt sends the same bytes; a local engine
//! takes the request over.

use std::time::Duration;

use ringmaster_api::{ApiError, ErrorKind};
use ringmaster_gpu_runtime::{EngineError, GenerateRequest, GenerationStream};
use ringmaster_pool::remote::{ReplyMode, UpstreamRequest};
use ringmaster_pool::{Backend, BackendError, Decision, InFlight};
use tracing::debug;

use super::{AdapterUse, Call};
use crate::metrics::AttemptLabels;
use crate::policy::Routed;

/// A generation under way: its stream, the server it runs on, and how many attempts it took.
#[derive(Debug)]
pub(crate) struct Started {
    pub(crate) generation: GenerationStream,
    pub(crate) decision: Decision,
    pub(crate) in_flight: InFlight,
    pub(crate) attempts: u32,
    /// The successful attempt's span, when the request is traced.
    pub(crate) span: Option<tracing::Span>,
}

impl Call {
    /// How a remote server is asked for its reply: whole for a client that wants one message;
    /// streamed, and relayed as it came to a client that speaks the server's API where
    /// nothing in its chunks has to change (the same model name, and no filter that may hold
    /// text back).
    fn reply_mode(&self) -> ReplyMode {
        if !self.request.stream {
            ReplyMode::Whole
        } else if self.request.door.is_openai()
            && self.served_model == self.request.model
            && self.gateway.safety.slot.current().is_none()
        {
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
        }
    }

    /// Phase 4: see the module's documentation.
    pub(crate) async fn attempt(&mut self, routed: Routed) -> Result<Started, ApiError> {
        let mode = self.reply_mode();
        let generate = self.generate_request();
        self.start(generate, mode, routed.decision, routed.in_flight)
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

    async fn start(
        &self,
        generate: GenerateRequest,
        mode: ReplyMode,
        mut decision: Decision,
        mut in_flight: InFlight,
    ) -> Result<Started, ApiError> {
        let gateway = &self.gateway;
        let retry = &gateway.config.retry;
        // A local engine takes the request over; a remote one reads the bytes encoded once.
        let mut generate = Some(generate);
        let mut upstream: Option<UpstreamRequest> = None;
        let mut tried: Vec<String> = Vec::new();
        let mut attempts = 0u32;
        let mut retry_reason: Option<String> = None;
        loop {
            attempts += 1;
            let span = self
                .trace
                .as_ref()
                .map(|parent| attempt_span(parent, &decision, attempts, retry_reason.as_deref()));
            let result = match decision.server.engine() {
                Backend::Local(engine) => match generate.take() {
                    Some(request) => engine.submit(request).map_err(BackendError::Engine),
                    None => Err(BackendError::Engine(EngineError::Stopped)),
                },
                Backend::Remote(worker) => {
                    if upstream.is_none()
                        && let Some(request) = generate.as_ref()
                    {
                        upstream = Some(UpstreamRequest::encode(request, &self.served_model, mode));
                    }
                    if let Some(request) = upstream.as_mut() {
                        request.set_trace_context(self.trace_context_for(span.as_ref()));
                    }
                    let submitted = async {
                        match upstream.as_ref() {
                            Some(request) => match self.ready_adapter(worker).await {
                                Ok(()) => {
                                    worker.submit(request).await.map_err(BackendError::Remote)
                                }
                                Err(error) => Err(BackendError::Remote(error)),
                            },
                            None => Err(BackendError::Engine(EngineError::Stopped)),
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
                    return Ok(Started {
                        generation,
                        decision,
                        in_flight,
                        attempts,
                        span,
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
    fn trace_context_for(
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
