//! One reply, one state machine: engine events in, door-neutral reply events
//! ([`ReplyEvent`]) out. A streamed reply ([`stream`]) writes those events as its door's SSE
//! as they come; a collected reply ([`collect`]) folds the same events into one
//! [`WholeReply`] that its door writes whole. Both outputs therefore agree on every rule:
//! when the reply starts, how the safety filter holds text and tool-call arguments back and
//! refuses, how usage is counted, how a failure ends it.
//!
//! A streamed reply that has to wait starts early ([`early`]); a stream can be resumed by its
//! request's id (`crate::resume`).
//!
//! Cancel safety: dropping the generation (the client went away, or the filter refused)
//! cancels it on the server; both drivers drop it as soon as nothing more is wanted.

pub(crate) mod collect;
pub(crate) mod early;
pub(crate) mod stream;

use ringmaster_api::reply::{ReplyEvent, StopReason, StreamWriter, Usage, WholeReply};
use ringmaster_api::{ApiError, Door};
use ringmaster_gpu_runtime::{FinishReason, GenerateEvent};
use tracing::{info, warn};

use crate::metrics::Metrics;
use crate::safety::{Blocked, OutputFilter};
use crate::track::Tracker;

/// Where a reply's events go: a door's stream writer, or a whole reply being folded.
pub(crate) trait Sink {
    /// One more event.
    fn event(&mut self, event: ReplyEvent<'_>);
}

impl Sink for WholeReply {
    fn event(&mut self, event: ReplyEvent<'_>) {
        self.push(&event);
    }
}

/// A stream writer and the buffer it writes into.
pub(crate) struct Frames<'a> {
    pub(crate) writer: &'a mut StreamWriter,
    pub(crate) out: &'a mut Vec<u8>,
}

impl Sink for Frames<'_> {
    fn event(&mut self, event: ReplyEvent<'_>) {
        self.writer.write(&event, self.out);
    }
}

/// How a reply ended.
pub(crate) enum Ended {
    /// The generation finished.
    Finished { output_tokens: u32 },
    /// The safety filter refused the rest.
    Blocked,
    /// The server failed or went away; the error for the client.
    Failed(ApiError),
}

/// The state of one reply.
pub(crate) struct ReplyMachine {
    filter: Option<OutputFilter>,
    /// The filter over the open tool call's arguments (a fresh one per call: a call's JSON is
    /// read as text of its own, apart from the reply's text).
    call_filter: Option<OutputFilter>,
    usage: Usage,
    /// Tokens generated so far.
    generated: u32,
    /// The tool call being written (the server's index of it), if the last thing written was
    /// a piece of a call.
    open_call: Option<u32>,
}

impl ReplyMachine {
    pub(crate) fn new(tracker: &Tracker) -> Self {
        Self {
            filter: tracker.gateway.safety.output(),
            call_filter: None,
            usage: Usage::default(),
            generated: 0,
            open_call: None,
        }
    }

    fn text(&mut self, text: &str, sink: &mut impl Sink) {
        self.open_call = None;
        sink.event(ReplyEvent::Text(text));
    }

    /// Checks the rest of the open tool call's arguments (the call is complete: the reply
    /// moves on) and writes what passes.
    fn settle_call(&mut self, metrics: &Metrics, sink: &mut impl Sink) -> Result<(), Blocked> {
        let Some(mut filter) = self.call_filter.take() else {
            return Ok(());
        };
        let allowed = filter.finish(metrics)?;
        if !allowed.is_empty() && self.open_call.is_some() {
            sink.event(ReplyEvent::ToolArguments(&allowed));
        }
        Ok(())
    }

    /// One engine event (`None`: the stream ended without a finish). Hands the client's
    /// events to `sink`; returns how the reply ended once it has.
    pub(crate) fn on(
        &mut self,
        tracker: &Tracker,
        event: Option<GenerateEvent>,
        sink: &mut impl Sink,
    ) -> Option<Ended> {
        let metrics = &tracker.gateway.metrics;
        match event {
            Some(GenerateEvent::Started {
                prompt_tokens,
                cached_tokens,
            }) => {
                tracker.first_token();
                tracker.counted_prompt(prompt_tokens);
                self.usage.prompt_tokens = prompt_tokens;
                self.usage.cached_tokens = cached_tokens;
                sink.event(ReplyEvent::Start { usage: self.usage });
                None
            }
            // Reasoning is the model's own working: shown where the client asked, counted,
            // never held back by the filter (which judges what the client is answered).
            Some(GenerateEvent::Reasoning { text }) => {
                self.generated += 1;
                tracker.generated(1);
                sink.event(ReplyEvent::Reasoning(&text));
                None
            }
            Some(GenerateEvent::Token { text }) => {
                self.generated += 1;
                tracker.generated(1);
                if let Err(why) = self.settle_call(metrics, sink) {
                    return Some(self.refuse(tracker, why, sink));
                }
                match self.filter.as_mut().map(|f| f.push(metrics, &text)) {
                    None => self.text(&text, sink),
                    Some(Ok(allowed)) if allowed.is_empty() => {}
                    Some(Ok(allowed)) => self.text(&allowed, sink),
                    Some(Err(why)) => return Some(self.refuse(tracker, why, sink)),
                }
                None
            }
            Some(GenerateEvent::ToolCall {
                index,
                id,
                name,
                arguments,
            }) => {
                self.generated += 1;
                tracker.generated(1);
                // What the text filter holds back goes out (or is refused) before the call.
                if let Some(filter) = self.filter.as_mut() {
                    match filter.flush(metrics) {
                        Ok(allowed) if allowed.is_empty() => {}
                        Ok(allowed) => self.text(&allowed, sink),
                        Err(why) => return Some(self.refuse(tracker, why, sink)),
                    }
                }
                if self.open_call != Some(index) {
                    if let Err(why) = self.settle_call(metrics, sink) {
                        return Some(self.refuse(tracker, why, sink));
                    }
                    self.call_filter = tracker.gateway.safety.output();
                    let id =
                        id.unwrap_or_else(|| format!("toolu_{}", uuid::Uuid::new_v4().simple()));
                    sink.event(ReplyEvent::ToolCallStart {
                        id: &id,
                        name: name.as_deref().unwrap_or_default(),
                    });
                    self.open_call = Some(index);
                }
                let arguments = match self
                    .call_filter
                    .as_mut()
                    .map(|f| f.push(metrics, &arguments))
                {
                    None => arguments,
                    Some(Ok(allowed)) => allowed,
                    Some(Err(why)) => return Some(self.refuse(tracker, why, sink)),
                };
                if !arguments.is_empty() {
                    sink.event(ReplyEvent::ToolArguments(&arguments));
                }
                None
            }
            Some(GenerateEvent::Finished {
                reason,
                prompt_tokens,
                cached_tokens,
                output_tokens,
            }) => {
                // A server's text chunk may hold several tokens: its count settles the charge.
                tracker.generated(output_tokens.saturating_sub(self.generated));
                self.generated = output_tokens;
                self.usage = Usage {
                    prompt_tokens,
                    cached_tokens,
                    output_tokens,
                };
                if let Err(why) = self.settle_call(metrics, sink) {
                    return Some(self.refuse(tracker, why, sink));
                }
                if let Some(filter) = self.filter.as_mut() {
                    match filter.finish(metrics) {
                        Ok(allowed) if allowed.is_empty() => {}
                        Ok(allowed) => self.text(&allowed, sink),
                        Err(why) => return Some(self.refuse(tracker, why, sink)),
                    }
                }
                let (reason, stop_sequence, finish) = match &reason {
                    FinishReason::EndOfTurn => (StopReason::EndTurn, None, "end_turn"),
                    FinishReason::MaxTokens => (StopReason::MaxTokens, None, "max_tokens"),
                    FinishReason::StopSequence(s) => {
                        (StopReason::StopSequence, Some(s.as_str()), "stop_sequence")
                    }
                    FinishReason::ToolCalls => (StopReason::ToolUse, None, "tool_use"),
                    FinishReason::ContentFilter => (StopReason::Refusal, None, "refusal"),
                };
                tracker.finished((prompt_tokens, cached_tokens, output_tokens), finish);
                sink.event(ReplyEvent::Stop {
                    reason,
                    stop_sequence,
                    usage: self.usage,
                });
                Some(Ended::Finished { output_tokens })
            }
            Some(GenerateEvent::Failed { message }) => {
                warn!(%message, "reply.server_failed");
                Some(self.fail(
                    tracker,
                    format!("the GPU server failed during the reply: {message}"),
                    sink,
                ))
            }
            None => {
                warn!("reply.server_stopped");
                Some(self.fail(
                    tracker,
                    "the GPU server stopped before finishing the reply".to_owned(),
                    sink,
                ))
            }
        }
    }

    /// Ends the reply at a block: the held-back window is dropped.
    fn refuse(&mut self, tracker: &Tracker, why: Blocked, sink: &mut impl Sink) -> Ended {
        info!(reason = %why.reason, "reply.output_blocked");
        self.usage.output_tokens = self.generated;
        tracker.finished(
            (
                self.usage.prompt_tokens,
                self.usage.cached_tokens,
                self.generated,
            ),
            "refusal",
        );
        sink.event(ReplyEvent::Stop {
            reason: StopReason::Refusal,
            stop_sequence: None,
            usage: self.usage,
        });
        Ended::Blocked
    }

    fn fail(&self, tracker: &Tracker, message: String, sink: &mut impl Sink) -> Ended {
        tracker.failed(&message);
        let error = ApiError::internal(message);
        sink.event(ReplyEvent::Error(&error));
        Ended::Failed(error)
    }
}

/// The keep-alive a stream sends before its reply's first event (while queued, or
/// prefilling): an SSE comment, as no client expects an event before `message_start`.
pub(crate) const EARLY_KEEP_ALIVE: &[u8] = ringmaster_wire::sse::KEEP_ALIVE;

/// Which door's error event a stream that began ends with.
pub(crate) fn error_event(door: Door, error: &ApiError) -> bytes::Bytes {
    let mut frame = Vec::with_capacity(256);
    door.error_event(error, &mut frame);
    bytes::Bytes::from(frame)
}
