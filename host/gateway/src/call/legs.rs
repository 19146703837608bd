//! Phase 4 for a split request: its prefill and decode legs on their servers, as the pair's
//! connector says (the bodies are `ringmaster_pool::remote::legs`'s):
//!
//! - vLLM NIXL and `ringmaster worker`s: the prefill leg first, whole; the decode leg with the
//!   `kv_transfer_params` it returned (none returned: the decode server computes the prompt);
//! - SGLang: both legs at once with one bootstrap room; a transport failure on either ends the
//!   other (the survivor would wait for a bootstrap that never comes).
//!
//! A prefill that fails before it answers is tried on the next prefill server
//! (`[disaggregation] on_prefill_failure = "retry"`, within `[retry] attempts`), else the
//! decode server serves the request whole. A decode that fails is the attempt's failure, which
//! the attempt loop retries whole on the next server as for any request. The client's reply
//! counts the prefill's cached tokens (the decode server reports the transferred prompt as its
//! own); dropping the reply ends both legs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use ringmaster_config::{Connector, PrefillFailure};
use ringmaster_gpu_runtime::{EventSource, GenerateEvent, GenerateRequest, GenerationStream};
use ringmaster_pool::remote::legs::DP_RANK_HEADER;
use ringmaster_pool::remote::{
    Bootstrap, PrefillAnswer, RemoteError, RemoteWorker, Target, UpstreamRequest,
};
use ringmaster_pool::{Backend, BackendError, Generation, Server};
use tracing::{Instrument, debug};

use super::Call;
use crate::metrics::OutcomeLabels;
use ringmaster_slots::router::pair::{PrefillLeg, next_prefill};

/// The prefill's cached tokens before its answer is in.
const UNKNOWN: u32 = u32::MAX;

/// The encodings of one request made so far, one per kind of server (see
/// [`Call::upstream_for`]).
pub(super) type Encoded = Vec<(Target, bool, bool, UpstreamRequest)>;

impl Call {
    /// Starts a split request: its prefill leg on `leg`'s server, its decode leg on
    /// `decode` (whose request for this request, whole, is `base`). The reply is the decode
    /// leg's.
    pub(super) async fn remote_pair(
        &self,
        (decode, decode_worker): (&Arc<Server>, &RemoteWorker),
        base: &UpstreamRequest,
        leg: PrefillLeg,
        (generate, encoded): (&GenerateRequest, &mut Encoded),
    ) -> Result<Generation, BackendError> {
        let base = match decode.role().dp_rank {
            Some(rank) if leg.connector != Connector::Sglang => {
                base.clone().with_header(DP_RANK_HEADER, &rank.to_string())
            }
            _ => base.clone(),
        };
        match leg.connector {
            Connector::VllmNixl | Connector::Ringmaster => {
                self.nixl_pair((decode, decode_worker), &base, leg, (generate, encoded))
                    .await
            }
            Connector::Sglang => {
                self.sglang_pair((decode, decode_worker), &base, leg, (generate, encoded))
                    .await
            }
        }
    }

    /// vLLM NIXL's sequence: the prefill leg, then the decode leg with its parameters.
    async fn nixl_pair(
        &self,
        (decode, decode_worker): (&Arc<Server>, &RemoteWorker),
        base: &UpstreamRequest,
        leg: PrefillLeg,
        (generate, encoded): (&GenerateRequest, &mut Encoded),
    ) -> Result<Generation, BackendError> {
        // `ringmaster worker`s take a leg only with the gateway's credential for it.
        let secret = match leg.connector {
            Connector::Ringmaster => self.gateway.worker_secret.as_ref(),
            Connector::VllmNixl | Connector::Sglang => None,
        };
        let mut leg = Some(leg);
        let mut tried: Vec<String> = Vec::new();
        let answer: Option<PrefillAnswer> = loop {
            let Some(current) = leg.take() else {
                break None;
            };
            let PrefillLeg {
                server,
                mut in_flight,
                ..
            } = current;
            let Backend::Remote(worker) = server.engine() else {
                break None;
            };
            let mut request = self
                .upstream_for(&server, generate, encoded, true)
                .map_err(refused)?
                .nixl_prefill(&self.id, secret)
                .map_err(|e| refused_text(e.to_string()))?;
            if let Some(rank) = server.role().dp_rank {
                request = request.with_header(DP_RANK_HEADER, &rank.to_string());
            }
            let span = self.leg_span(&server, "prefill");
            request.set_trace_context(self.trace_context_for(span.as_ref()));
            let result = match &span {
                Some(span) => worker.prefill(&request).instrument(span.clone()).await,
                None => worker.prefill(&request).await,
            };
            in_flight.prefilled();
            drop(in_flight);
            match result {
                Ok(answer) => {
                    let outcome = if answer.kv_transfer_params.is_some() {
                        "ok"
                    } else {
                        "no_params"
                    };
                    self.count_prefill(outcome, span.as_ref(), None);
                    break Some(answer);
                }
                Err(RemoteError::Refused { message }) => {
                    self.count_prefill("refused", span.as_ref(), Some(&message));
                    return Err(BackendError::Remote(RemoteError::Refused { message }));
                }
                Err(error) => {
                    self.count_prefill("failed", span.as_ref(), Some(&error.to_string()));
                    debug!(prefill = server.id(), error = %error, "pair.prefill_failed");
                    tried.push(server.id().to_owned());
                    leg = self.next_prefill_after(decode, &tried, &error);
                }
            }
        };
        let (request, cached) = match &answer {
            Some(PrefillAnswer {
                kv_transfer_params: Some(params),
                cached_tokens,
                ..
            }) => (
                base.nixl_decode(params, &self.id, secret)
                    .map_err(|e| refused_text(e.to_string()))?,
                cached_tokens.unwrap_or(UNKNOWN),
            ),
            // No parameters, or no prefill: the decode server computes the prompt itself.
            _ => (base.clone(), UNKNOWN),
        };
        let stream = decode_worker
            .submit(&request)
            .await
            .map_err(BackendError::Remote)?;
        Ok(paired(stream, Arc::new(AtomicU32::new(cached)), None))
    }

    /// SGLang's: both legs at once, one bootstrap room; a failed prefill leg ends the decode
    /// leg and the pair is tried again with the next prefill server, or the decode server
    /// serves the request whole.
    async fn sglang_pair(
        &self,
        (decode, decode_worker): (&Arc<Server>, &RemoteWorker),
        base: &UpstreamRequest,
        leg: PrefillLeg,
        (generate, encoded): (&GenerateRequest, &mut Encoded),
    ) -> Result<Generation, BackendError> {
        let mut leg = Some(leg);
        let mut tried: Vec<String> = Vec::new();
        loop {
            let Some(PrefillLeg {
                server, in_flight, ..
            }) = leg.take()
            else {
                // The decode server alone, whole.
                return decode_worker
                    .submit(base)
                    .await
                    .map_err(BackendError::Remote);
            };
            let Backend::Remote(prefill_worker) = server.engine() else {
                continue;
            };
            let bootstrap = Bootstrap::new(
                &server.address().host().unwrap_or_default(),
                server.role().bootstrap_port,
            );
            let prefill_rank = server.role().dp_rank;
            let mut prefill_request = self
                .upstream_for(&server, generate, encoded, true)
                .map_err(refused)?
                .sglang_leg(&bootstrap, prefill_rank, None)
                .map_err(|e| refused_text(e.to_string()))?;
            let decode_request = base
                .sglang_leg(&bootstrap, decode.role().dp_rank, prefill_rank)
                .map_err(|e| refused_text(e.to_string()))?;
            let span = self.leg_span(&server, "prefill");
            prefill_request.set_trace_context(self.trace_context_for(span.as_ref()));
            let cached = Arc::new(AtomicU32::new(UNKNOWN));
            let prefill = tokio::spawn(
                drain_prefill(
                    prefill_worker.clone(),
                    prefill_request,
                    (in_flight, cached.clone()),
                    (self.gateway.metrics.prefill_legs.clone(), span.clone()),
                )
                .instrument(span.clone().unwrap_or_else(tracing::Span::none)),
            );
            let mut prefill = AbortOnDrop(prefill);
            let decoded = decode_worker.submit(&decode_request);
            tokio::pin!(decoded);
            let mut prefill_done = false;
            let failure = loop {
                tokio::select! {
                    result = &mut decoded => {
                        let stream = result.map_err(BackendError::Remote)?;
                        return Ok(paired(stream, cached, (!prefill_done).then_some(prefill)));
                    }
                    joined = &mut prefill.0, if !prefill_done => {
                        prefill_done = true;
                        match joined {
                            Ok(Ok(())) => {}
                            Ok(Err(error)) => break error,
                            Err(join) => break RemoteError::Broken {
                                url: server.id().to_owned(),
                                why: format!("the prefill leg ended: {join}"),
                            },
                        }
                    }
                }
            };
            // The decode leg waits for a bootstrap that will never come: ended here.
            if let RemoteError::Refused { message } = failure {
                return Err(BackendError::Remote(RemoteError::Refused { message }));
            }
            debug!(prefill = server.id(), error = %failure, "pair.prefill_failed");
            tried.push(server.id().to_owned());
            leg = self.next_prefill_after(decode, &tried, &failure);
        }
    }

    /// After a prefill leg failed with `error`: the next prefill server to try, when the
    /// rules allow one (`None`: the decode server serves the request whole).
    fn next_prefill_after(
        &self,
        decode: &Arc<Server>,
        tried: &[String],
        error: &RemoteError,
    ) -> Option<PrefillLeg> {
        let rule = self.gateway.router.pair_rule();
        let attempts = self.gateway.config.retry.attempts as usize;
        if rule.on_prefill_failure != PrefillFailure::Retry
            || !error.is_retryable()
            || tried.len() >= attempts
            || self.started.elapsed() >= self.gateway.config.retry.deadline
        {
            return None;
        }
        next_prefill(
            &self.gateway.pool,
            &self.pool,
            decode,
            tried,
            (&self.input, self.chat()),
            self.policy.prompt_tokens,
        )
    }

    /// A prefill leg's span, a child of the request's (`None` when it is not traced).
    pub(super) fn leg_span(&self, server: &Server, leg: &'static str) -> Option<tracing::Span> {
        use ringmaster_telemetry::SpanExt;
        use ringmaster_telemetry::semconv as k;
        let parent = self.trace.as_ref()?;
        let span = tracing::info_span!(parent: parent, "upstream", otel.kind = "client");
        span.attribute(k::SERVER_ADDRESS, server.id().to_owned());
        span.attribute(k::LEG, leg);
        Some(span)
    }

    /// Counts a prefill leg's `outcome`, on its span too.
    pub(super) fn count_prefill(
        &self,
        outcome: &'static str,
        span: Option<&tracing::Span>,
        error: Option<&str>,
    ) {
        self.gateway
            .metrics
            .prefill_legs
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
        if let Some(span) = span {
            use ringmaster_telemetry::SpanExt;
            span.attribute(ringmaster_telemetry::semconv::ATTEMPT_OUTCOME, outcome);
            if let Some(error) = error {
                span.failed(error.to_owned());
            }
        }
    }
}

/// Runs an SGLang prefill leg to its end: its slot released once it began answering, its
/// cached tokens kept for the pair's usage, its outcome counted (on its span too).
async fn drain_prefill(
    worker: Arc<RemoteWorker>,
    request: UpstreamRequest,
    (mut in_flight, cached): (ringmaster_pool::InFlight, Arc<AtomicU32>),
    (legs, span): (
        prometheus_client::metrics::family::Family<
            OutcomeLabels,
            prometheus_client::metrics::counter::Counter,
        >,
        Option<tracing::Span>,
    ),
) -> Result<(), RemoteError> {
    let result = async {
        let mut stream = worker.submit(&request).await?;
        in_flight.prefilled();
        while let Some(event) = stream.next().await {
            match event {
                GenerateEvent::Started { cached_tokens, .. }
                | GenerateEvent::Finished { cached_tokens, .. } => {
                    cached.store(cached_tokens, Ordering::Relaxed);
                }
                GenerateEvent::Failed { message } => {
                    return Err(RemoteError::Broken {
                        url: worker.url().to_owned(),
                        why: message,
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }
    .await;
    drop(in_flight);
    let (outcome, error) = match &result {
        Ok(()) => ("ok", None),
        Err(RemoteError::Refused { message }) => ("refused", Some(message.clone())),
        Err(error) => ("failed", Some(error.to_string())),
    };
    legs.get_or_create(&OutcomeLabels { outcome }).inc();
    if let Some(span) = &span {
        use ringmaster_telemetry::SpanExt;
        span.attribute(ringmaster_telemetry::semconv::ATTEMPT_OUTCOME, outcome);
        if let Some(error) = error {
            span.failed(error);
        }
    }
    result
}

fn refused(error: ringmaster_api::ApiError) -> BackendError {
    refused_text(error.message().to_owned())
}

fn refused_text(message: String) -> BackendError {
    BackendError::Remote(RemoteError::Refused { message })
}

/// Aborts a task when dropped (an SGLang prefill leg, with its reply).
pub(super) struct AbortOnDrop(tokio::task::JoinHandle<Result<(), RemoteError>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A split request's reply: the decode leg's events, its usage with the prefill's cached
/// tokens (once known), and the SGLang prefill leg that ends with it.
struct PairedReply {
    decode: Generation,
    prefill_cached: Arc<AtomicU32>,
    _prefill: Option<AbortOnDrop>,
}

/// A split request's reply is never relayed (its usage is the gateway's: see
/// `Call::reply_mode`), so the decode leg's relay, which it never kept, is not carried over.
pub(super) fn paired(
    decode: Generation,
    prefill_cached: Arc<AtomicU32>,
    prefill: Option<AbortOnDrop>,
) -> Generation {
    GenerationStream::from_source(Box::new(PairedReply {
        decode,
        prefill_cached,
        _prefill: prefill,
    }))
    .into()
}

impl EventSource for PairedReply {
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<GenerateEvent>> {
        let mut event = std::task::ready!(self.decode.poll_next(cx));
        let known = self.prefill_cached.load(Ordering::Relaxed);
        if known != UNKNOWN
            && let Some(
                GenerateEvent::Started {
                    cached_tokens,
                    prompt_tokens,
                }
                | GenerateEvent::Finished {
                    cached_tokens,
                    prompt_tokens,
                    ..
                },
            ) = &mut event
        {
            *cached_tokens = known.min(*prompt_tokens);
        }
        Poll::Ready(event)
    }
}
