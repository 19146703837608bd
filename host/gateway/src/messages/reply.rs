//! One reply, one state machine: engine events in, Anthropic stream events out. A streamed
//! reply sends those events as SSE as they come; a collected reply folds the same events into
//! one message. Both outputs therefore agree on every rule: when the message starts, how the
//! safety filter holds text back and refuses, how usage is counted, how a failure ends it.
//!
//! Cancel safety: dropping the generation (the client went away, or the filter refused)
//! cancels it on the server; both drivers drop it as soon as nothing more is wanted.

use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_TYPE, HeaderValue};
use ringmaster_gpu_runtime::{FinishReason, GenerateEvent, GenerationStream};
use ringmaster_pool::InFlight;
use tracing::{Instrument, debug, info, warn};

use super::Tracker;
use crate::api::{
    MessageDeltaBody, MessageResponse, MessagesRequest, Role, StopReason, StreamEvent, TextBlock,
    Usage,
};
use crate::body::{ChannelBody, ResponseBody};
use crate::error::ApiError;
use crate::safety::{Blocked, OutputFilter};

/// Frames buffered between the stream producer and a slow client.
const SSE_CHANNEL_FRAMES: usize = 64;

/// How a reply ended.
enum Ended {
    /// The generation finished.
    Finished { output_tokens: u32 },
    /// The safety filter refused the rest.
    Blocked,
    /// The server failed or went away; the error for the client.
    Failed(ApiError),
}

/// The state of one reply.
struct ReplyMachine {
    model: String,
    message_id: String,
    filter: Option<OutputFilter>,
    prompt: u32,
    cached: u32,
    generated: u32,
}

impl ReplyMachine {
    fn new(tracker: &Tracker, request: &MessagesRequest, message_id: String) -> Self {
        Self {
            model: request.model.clone(),
            message_id,
            filter: tracker.gateway.safety.output(),
            prompt: 0,
            cached: 0,
            generated: 0,
        }
    }

    /// One engine event (`None`: the stream ended without a finish). Pushes what the client
    /// is to see; returns how the reply ended once it has.
    fn on(
        &mut self,
        tracker: &Tracker,
        event: Option<GenerateEvent>,
        out: &mut Vec<StreamEvent>,
    ) -> Option<Ended> {
        let metrics = &tracker.gateway.metrics;
        match event {
            Some(GenerateEvent::Started {
                prompt_tokens,
                cached_tokens,
            }) => {
                tracker.first_token();
                (self.prompt, self.cached) = (prompt_tokens, cached_tokens);
                let message = empty_message(
                    &self.model,
                    &self.message_id,
                    usage(prompt_tokens, cached_tokens, 1),
                );
                out.push(StreamEvent::MessageStart { message });
                out.push(StreamEvent::ContentBlockStart {
                    index: 0,
                    content_block: TextBlock::new(String::new()),
                });
                out.push(StreamEvent::Ping);
                None
            }
            Some(GenerateEvent::Token { text }) => {
                self.generated += 1;
                match self.filter.as_mut().map(|f| f.push(metrics, &text)) {
                    None => out.push(StreamEvent::text(text)),
                    Some(Ok(allowed)) if allowed.is_empty() => {}
                    Some(Ok(allowed)) => out.push(StreamEvent::text(allowed)),
                    Some(Err(why)) => return Some(self.refuse(tracker, why, out)),
                }
                None
            }
            Some(GenerateEvent::Finished {
                reason,
                prompt_tokens,
                cached_tokens,
                output_tokens,
            }) => {
                (self.prompt, self.cached, self.generated) =
                    (prompt_tokens, cached_tokens, output_tokens);
                if let Some(filter) = self.filter.as_mut() {
                    match filter.finish(metrics) {
                        Ok(allowed) if allowed.is_empty() => {}
                        Ok(allowed) => out.push(StreamEvent::text(allowed)),
                        Err(why) => return Some(self.refuse(tracker, why, out)),
                    }
                }
                tracker.finished(prompt_tokens, cached_tokens);
                let (stop_reason, stop_sequence) = stop_of(&reason);
                out.push(StreamEvent::ContentBlockStop { index: 0 });
                out.push(StreamEvent::MessageDelta {
                    delta: MessageDeltaBody {
                        stop_reason,
                        stop_sequence,
                    },
                    usage: usage(prompt_tokens, cached_tokens, output_tokens),
                });
                out.push(StreamEvent::MessageStop);
                Some(Ended::Finished { output_tokens })
            }
            Some(GenerateEvent::Failed { message }) => {
                warn!(%message, "reply.server_failed");
                Some(self.fail(
                    tracker,
                    format!("the GPU server failed during the reply: {message}"),
                    out,
                ))
            }
            None => {
                warn!("reply.server_stopped");
                Some(self.fail(
                    tracker,
                    "the GPU server stopped before finishing the reply".to_owned(),
                    out,
                ))
            }
        }
    }

    /// Ends the reply at a block: the held-back window is dropped.
    fn refuse(&self, tracker: &Tracker, why: Blocked, out: &mut Vec<StreamEvent>) -> Ended {
        info!(reason = %why.reason, "reply.output_blocked");
        tracker.finished(self.prompt, self.cached);
        out.push(StreamEvent::ContentBlockStop { index: 0 });
        out.push(StreamEvent::MessageDelta {
            delta: MessageDeltaBody {
                stop_reason: StopReason::Refusal,
                stop_sequence: None,
            },
            usage: usage(self.prompt, self.cached, self.generated),
        });
        out.push(StreamEvent::MessageStop);
        Ended::Blocked
    }

    fn fail(&self, tracker: &Tracker, message: String, out: &mut Vec<StreamEvent>) -> Ended {
        tracker.failed();
        let error = ApiError::internal(message);
        out.push(StreamEvent::Error {
            error: error.body()["error"].clone(),
        });
        Ended::Failed(error)
    }
}

/// Folds a reply's stream events into the one message a non-streamed request gets.
#[derive(Default)]
struct Collector {
    message: Option<MessageResponse>,
    text: String,
}

impl Collector {
    fn push(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::MessageStart { message } => self.message = Some(message),
            StreamEvent::ContentBlockDelta { delta, .. } => self.text.push_str(&delta.text),
            StreamEvent::MessageDelta { delta, usage } => {
                if let Some(message) = self.message.as_mut() {
                    message.stop_reason = Some(delta.stop_reason);
                    message.stop_sequence = delta.stop_sequence;
                    message.usage = usage;
                }
            }
            StreamEvent::ContentBlockStart { .. }
            | StreamEvent::ContentBlockStop { .. }
            | StreamEvent::Ping
            | StreamEvent::MessageStop
            | StreamEvent::Error { .. } => {}
        }
    }

    fn finish(self, model: &str, id: &str) -> MessageResponse {
        let mut message = self
            .message
            .unwrap_or_else(|| empty_message(model, id, Usage::default()));
        message.content = vec![TextBlock::new(self.text)];
        message
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

/// The whole reply as one message.
pub(super) async fn collect(
    tracker: &Tracker,
    request: &MessagesRequest,
    mut generation: GenerationStream,
    message_id: String,
) -> Result<MessageResponse, ApiError> {
    let mut guard = UnfinishedReply {
        tracker,
        finished: false,
    };
    let mut machine = ReplyMachine::new(tracker, request, message_id);
    let mut collector = Collector::default();
    let mut out = Vec::new();
    loop {
        let event = generation.next().await;
        let ended = machine.on(tracker, event, &mut out);
        for event in out.drain(..) {
            collector.push(event);
        }
        if let Some(ended) = ended {
            guard.finished = true;
            // Dropping the stream cancels what is left of the generation (after a refusal).
            drop(generation);
            return match ended {
                Ended::Failed(error) => Err(error),
                Ended::Finished { .. } | Ended::Blocked => {
                    Ok(collector.finish(&machine.model, &machine.message_id))
                }
            };
        }
    }
}

/// The reply as server-sent events, produced by a task as the generation goes.
pub(super) fn stream(
    tracker: Tracker,
    request: &MessagesRequest,
    generation: GenerationStream,
    in_flight: InFlight,
    message_id: String,
) -> Response<ResponseBody> {
    let (tx, body) = ChannelBody::channel(SSE_CHANNEL_FRAMES);
    let mut machine = ReplyMachine::new(&tracker, request, message_id);
    // What is already here (the event the server's client looked at first, and any that came
    // with it) is the body's first frame before the response leaves, so that the headers and
    // the first frame go out in one write.
    let mut generation = generation;
    let mut out = Vec::new();
    let mut ended = None;
    take_ready(
        &tracker,
        &mut machine,
        &mut generation,
        &mut ended,
        &mut out,
    );
    if !out.is_empty() {
        // A new channel has room: this cannot fail for want of space.
        let _ = tx.try_send(frame(&mut out));
    }
    let task = produce(tracker, machine, generation, in_flight, tx, ended);
    tokio::spawn(task.in_current_span());
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

async fn produce(
    tracker: Tracker,
    mut machine: ReplyMachine,
    mut generation: GenerationStream,
    in_flight: InFlight,
    tx: tokio::sync::mpsc::Sender<Bytes>,
    ended: Option<Ended>,
) {
    let started = tracker.started;
    let server = in_flight.server().id().to_owned();
    let mut out = Vec::new();
    let ended = if ended.is_some() {
        ended
    } else {
        loop {
            let event = tokio::select! {
                event = generation.next() => event,
                () = tx.closed() => break None,
            };
            let mut ended = machine.on(&tracker, event, &mut out);
            ended = gather(&tracker, &mut machine, &mut generation, ended, &mut out).await;
            if !send_frame(&tx, &mut out).await {
                break None;
            }
            if ended.is_some() {
                break ended;
            }
        }
    };
    match ended {
        Some(Ended::Finished { output_tokens }) => debug!(
            server,
            output_tokens,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "stream.done"
        ),
        Some(Ended::Blocked | Ended::Failed(_)) => {}
        None => {
            drop(generation);
            tracker.gateway.metrics.client_disconnects.inc();
            debug!(server, "stream.client_disconnected");
        }
    }
    drop(in_flight);
}

/// Most times a batch waits for the server's reader to hand over more of what it has read.
const GATHER_ROUNDS: usize = 16;

/// Adds to `out` what else the server sent together with the last event: what the stream
/// has ready now, and what its reader hands over after a yield (a server's burst comes as
/// several reads of one buffer). What the server sent together then goes to the client
/// together: one frame, one write.
async fn gather(
    tracker: &Tracker,
    machine: &mut ReplyMachine,
    generation: &mut GenerationStream,
    mut ended: Option<Ended>,
    out: &mut Vec<StreamEvent>,
) -> Option<Ended> {
    for round in 0..GATHER_ROUNDS {
        let took = take_ready(tracker, machine, generation, &mut ended, out);
        if ended.is_some() || (round > 0 && !took) {
            break;
        }
        tokio::task::yield_now().await;
    }
    ended
}

/// Feeds `machine` what `generation` has ready now, until the reply ends; whether there was
/// anything.
fn take_ready(
    tracker: &Tracker,
    machine: &mut ReplyMachine,
    generation: &mut GenerationStream,
    ended: &mut Option<Ended>,
    out: &mut Vec<StreamEvent>,
) -> bool {
    let mut took = false;
    while ended.is_none() {
        let Some(event) = generation.try_next() else {
            break;
        };
        took = true;
        *ended = machine.on(tracker, Some(event), out);
    }
    took
}

/// `out`'s events as one SSE frame (emptying `out`).
fn frame(out: &mut Vec<StreamEvent>) -> Bytes {
    let mut frame = Vec::with_capacity(256 * out.len());
    for event in out.drain(..) {
        event.write_sse(&mut frame);
    }
    Bytes::from(frame)
}

/// Sends `out` as one frame; `false` when the client is gone.
async fn send_frame(tx: &tokio::sync::mpsc::Sender<Bytes>, out: &mut Vec<StreamEvent>) -> bool {
    out.is_empty() || tx.send(frame(out)).await.is_ok()
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
