//! One reply, one state machine: engine events in, Anthropic stream events out. A streamed
//! reply sends those events as SSE as they come; a collected reply folds the same events into
//! one message. Both outputs therefore agree on every rule: when the message starts, how the
//! safety filter holds text and tool-call arguments back and refuses, how usage is counted,
//! how a failure ends it.
//!
//! Cancel safety: dropping the generation (the client went away, or the filter refused)
//! cancels it on the server; both drivers drop it as soon as nothing more is wanted.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_TYPE, HeaderValue};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use ringmaster_gpu_runtime::{FinishReason, GenerateEvent, GenerationStream};
use ringmaster_pool::InFlight;
use tracing::{debug, info, warn};

use super::Tracker;
use crate::api::{
    BlockDelta, ContentBlock, MessageDeltaBody, MessageResponse, MessagesRequest, Role, StopReason,
    StreamEvent, Usage,
};
use crate::body::ResponseBody;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::openai::ChunkWriter;
use crate::safety::{Blocked, OutputFilter};

/// How a reply ended.
enum Ended {
    /// The generation finished.
    Finished { output_tokens: u32 },
    /// The safety filter refused the rest.
    Blocked,
    /// The server failed or went away; the error for the client.
    Failed(ApiError),
}

/// The content block a reply is writing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OpenBlock {
    /// Text, at this block index.
    Text(u32),
    /// A tool call: the server's index of the call, and the block index.
    Tool { call: u32, block: u32 },
}

impl OpenBlock {
    fn index(self) -> u32 {
        match self {
            Self::Text(block) | Self::Tool { block, .. } => block,
        }
    }
}

/// The state of one reply.
struct ReplyMachine {
    model: String,
    message_id: String,
    filter: Option<OutputFilter>,
    /// The filter over the open tool call's arguments (a fresh one per call: a call's JSON is
    /// read as text of its own, apart from the reply's text).
    call_filter: Option<OutputFilter>,
    prompt: u32,
    cached: u32,
    generated: u32,
    /// The block being written (`None` before the start and after the end).
    open: Option<OpenBlock>,
    /// The index the next block gets.
    next_block: u32,
}

impl ReplyMachine {
    fn new(tracker: &Tracker, request: &MessagesRequest, message_id: String) -> Self {
        Self {
            model: request.model.clone(),
            message_id,
            filter: tracker.gateway.safety.output(),
            call_filter: None,
            prompt: 0,
            cached: 0,
            generated: 0,
            open: None,
            next_block: 0,
        }
    }

    /// Opens `block` (closing the one open before it) and returns its index.
    fn open(
        &mut self,
        block: ContentBlock,
        tool_call: Option<u32>,
        out: &mut Vec<StreamEvent>,
    ) -> u32 {
        self.close(out);
        let index = self.next_block;
        self.next_block += 1;
        self.open = Some(match tool_call {
            Some(call) => OpenBlock::Tool { call, block: index },
            None => OpenBlock::Text(index),
        });
        out.push(StreamEvent::ContentBlockStart {
            index,
            content_block: block,
        });
        index
    }

    fn close(&mut self, out: &mut Vec<StreamEvent>) {
        if let Some(open) = self.open.take() {
            out.push(StreamEvent::ContentBlockStop {
                index: open.index(),
            });
        }
    }

    /// Text for the client: into the open text block, or a new one after a tool call.
    fn text(&mut self, text: String, out: &mut Vec<StreamEvent>) {
        let index = match self.open {
            Some(OpenBlock::Text(index)) => index,
            _ => self.open(ContentBlock::text(String::new()), None, out),
        };
        out.push(StreamEvent::text(index, text));
    }

    /// A piece of a tool call: a new `tool_use` block at its first piece, then its input.
    fn tool_call(
        &mut self,
        call: u32,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
        out: &mut Vec<StreamEvent>,
    ) {
        let index = match self.open {
            Some(OpenBlock::Tool { call: open, block }) if open == call => block,
            _ => {
                let id = id.unwrap_or_else(|| format!("toolu_{}", uuid::Uuid::new_v4().simple()));
                let block = ContentBlock::ToolUse {
                    id,
                    name: name.unwrap_or_default(),
                    input: serde_json::json!({}),
                };
                self.open(block, Some(call), out)
            }
        };
        if !arguments.is_empty() {
            out.push(StreamEvent::ContentBlockDelta {
                index,
                delta: BlockDelta::InputJsonDelta {
                    partial_json: arguments,
                },
            });
        }
    }

    /// Checks the rest of the open tool call's arguments (the call is complete: the reply
    /// moves on) and writes what passes into the call's block.
    fn settle_call(
        &mut self,
        metrics: &Metrics,
        out: &mut Vec<StreamEvent>,
    ) -> Result<(), Blocked> {
        let Some(mut filter) = self.call_filter.take() else {
            return Ok(());
        };
        let allowed = filter.finish(metrics)?;
        if !allowed.is_empty()
            && let Some(OpenBlock::Tool { block, .. }) = self.open
        {
            out.push(StreamEvent::ContentBlockDelta {
                index: block,
                delta: BlockDelta::InputJsonDelta {
                    partial_json: allowed,
                },
            });
        }
        Ok(())
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
                tracker.counted_prompt(prompt_tokens);
                (self.prompt, self.cached) = (prompt_tokens, cached_tokens);
                let message = empty_message(
                    &self.model,
                    &self.message_id,
                    usage(prompt_tokens, cached_tokens, 1),
                );
                out.push(StreamEvent::MessageStart { message });
                self.open(ContentBlock::text(String::new()), None, out);
                out.push(StreamEvent::Ping);
                None
            }
            Some(GenerateEvent::Token { text }) => {
                self.generated += 1;
                tracker.generated(1);
                if let Err(why) = self.settle_call(metrics, out) {
                    return Some(self.refuse(tracker, why, out));
                }
                match self.filter.as_mut().map(|f| f.push(metrics, &text)) {
                    None => self.text(text, out),
                    Some(Ok(allowed)) if allowed.is_empty() => {}
                    Some(Ok(allowed)) => self.text(allowed, out),
                    Some(Err(why)) => return Some(self.refuse(tracker, why, out)),
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
                        Ok(allowed) => self.text(allowed, out),
                        Err(why) => return Some(self.refuse(tracker, why, out)),
                    }
                }
                let same_call =
                    matches!(self.open, Some(OpenBlock::Tool { call, .. }) if call == index);
                if !same_call {
                    if let Err(why) = self.settle_call(metrics, out) {
                        return Some(self.refuse(tracker, why, out));
                    }
                    self.call_filter = tracker.gateway.safety.output();
                }
                let arguments = match self
                    .call_filter
                    .as_mut()
                    .map(|f| f.push(metrics, &arguments))
                {
                    None => arguments,
                    Some(Ok(allowed)) => allowed,
                    Some(Err(why)) => return Some(self.refuse(tracker, why, out)),
                };
                self.tool_call(index, id, name, arguments, out);
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
                (self.prompt, self.cached, self.generated) =
                    (prompt_tokens, cached_tokens, output_tokens);
                if let Err(why) = self.settle_call(metrics, out) {
                    return Some(self.refuse(tracker, why, out));
                }
                if let Some(filter) = self.filter.as_mut() {
                    match filter.finish(metrics) {
                        Ok(allowed) if allowed.is_empty() => {}
                        Ok(allowed) => self.text(allowed, out),
                        Err(why) => return Some(self.refuse(tracker, why, out)),
                    }
                }
                tracker.finished(prompt_tokens, cached_tokens, output_tokens);
                let (stop_reason, stop_sequence) = stop_of(&reason);
                self.close(out);
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
    fn refuse(&mut self, tracker: &Tracker, why: Blocked, out: &mut Vec<StreamEvent>) -> Ended {
        info!(reason = %why.reason, "reply.output_blocked");
        tracker.finished(self.prompt, self.cached, self.generated);
        self.close(out);
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
        tracker.failed(&message);
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
    /// The blocks so far, each tool call's input as the JSON text its pieces made.
    blocks: Vec<(ContentBlock, String)>,
}

impl Collector {
    fn push(&mut self, event: StreamEvent) {
        match event {
            StreamEvent::MessageStart { message } => self.message = Some(message),
            StreamEvent::ContentBlockStart { content_block, .. } => {
                self.blocks.push((content_block, String::new()));
            }
            StreamEvent::ContentBlockDelta { delta, .. } => match (delta, self.blocks.last_mut()) {
                (BlockDelta::TextDelta { text: more }, Some((ContentBlock::Text { text }, _))) => {
                    text.push_str(&more);
                }
                (BlockDelta::InputJsonDelta { partial_json }, Some((_, input))) => {
                    input.push_str(&partial_json);
                }
                _ => {}
            },
            StreamEvent::MessageDelta { delta, usage } => {
                if let Some(message) = self.message.as_mut() {
                    message.stop_reason = Some(delta.stop_reason);
                    message.stop_sequence = delta.stop_sequence;
                    message.usage = usage;
                }
            }
            StreamEvent::ContentBlockStop { .. }
            | StreamEvent::Ping
            | StreamEvent::MessageStop
            | StreamEvent::Error { .. } => {}
        }
    }

    /// The message, each tool call's input parsed from its JSON text; a server whose tool
    /// call arguments are not a JSON object fails the reply (the client could not use them).
    fn finish(self, model: &str, id: &str) -> Result<MessageResponse, ApiError> {
        let mut message = self
            .message
            .unwrap_or_else(|| empty_message(model, id, Usage::default()));
        // A refused reply's calls are left out: the filter may have cut their input off, and
        // the reply stopped for a refusal, not to use tools.
        let refused = message.stop_reason == Some(StopReason::Refusal);
        let has_tools = self
            .blocks
            .iter()
            .any(|(b, _)| matches!(b, ContentBlock::ToolUse { .. }));
        let mut content = Vec::with_capacity(self.blocks.len().max(1));
        for (block, arguments) in self.blocks {
            match block {
                // An empty text block before a tool call says nothing.
                ContentBlock::Text { text } if text.is_empty() && has_tools => {}
                ContentBlock::ToolUse { .. } if refused => {}
                ContentBlock::ToolUse { id, name, .. } => {
                    let input = if arguments.trim().is_empty() {
                        serde_json::json!({})
                    } else {
                        match serde_json::from_str::<serde_json::Value>(&arguments) {
                            Ok(input @ serde_json::Value::Object(_)) => input,
                            _ => {
                                return Err(ApiError::internal(format!(
                                    "the GPU server called the tool {name:?} with arguments that \
                                     are not a JSON object: {arguments:?}"
                                )));
                            }
                        }
                    };
                    content.push(ContentBlock::ToolUse { id, name, input });
                }
                block => content.push(block),
            }
        }
        if content.is_empty() {
            content.push(ContentBlock::text(String::new()));
        }
        message.content = content;
        Ok(message)
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
    in_flight: &mut InFlight,
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
        if matches!(event, Some(GenerateEvent::Started { .. })) {
            in_flight.prefilled();
        }
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
                    collector.finish(&machine.model, &machine.message_id)
                }
            };
        }
    }
}

/// The reply as server-sent events, produced as the client's connection asks for them. With
/// `relayed` (a server reply kept for a relay, to a client of the server's API), the server's
/// own content chunks go out as they came, and only what they lack is written here.
pub(super) fn stream(
    tracker: Tracker,
    request: &MessagesRequest,
    (generation, relayed): (GenerationStream, bool),
    in_flight: InFlight,
    message_id: String,
) -> Response<ResponseBody> {
    let openai = request.format.is_openai().then(|| {
        let mut writer =
            ChunkWriter::new(message_id.clone(), request.model.clone(), request.format);
        if relayed {
            writer.relay_from(false);
        }
        writer
    });
    let machine = ReplyMachine::new(&tracker, request, message_id);
    let ping = tracker.gateway.config.stream_ping.map(|every| Ping {
        every,
        timer: Box::pin(tokio::time::sleep(every)),
        last_sent: tokio::time::Instant::now(),
    });
    let body = SseReply {
        openai,
        ping,
        tracker,
        machine,
        generation: Some(generation),
        in_flight: Some(in_flight),
        out: Vec::new(),
        relayed: relayed.then(Vec::new),
        ended: None,
        gather_rounds: 0,
        idle_rounds: 0,
        sent_first: false,
        span: tracing::Span::current(),
    };
    let mut response = Response::new(body.boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    response
}

/// Most turns a frame waits for the server's reader to hand over more of what it read.
const GATHER_ROUNDS: usize = 32;

/// Turns in a row that brought nothing after which the frame goes out (the reader hands over
/// one body frame every second turn).
const IDLE_ROUNDS: usize = 2;

/// A streamed reply as a response body: each poll takes every event the generation has
/// ready (a remote server's reply is read right here, in the connection's task) and hands
/// them out as one frame, so what the server sent together goes to the client in one write,
/// with no task or channel between the two sockets. When the client goes away, hyper drops
/// the body, and with it the generation, which cancels it on its server.
struct SseReply {
    /// Writes OpenAI's chunks (`None`: Anthropic's events).
    openai: Option<ChunkWriter>,
    tracker: Tracker,
    machine: ReplyMachine,
    /// `None` once the reply ended (dropped at once: that frees the server's connection).
    generation: Option<GenerationStream>,
    in_flight: Option<InFlight>,
    out: Vec<StreamEvent>,
    /// The server's own frames taken with `out`'s events, to go out before them (`None`: no
    /// relay).
    relayed: Option<Vec<u8>>,
    ended: Option<Ended>,
    /// Turns given to the server's reader for the frame being gathered.
    gather_rounds: usize,
    /// Of those, the last ones in a row that brought nothing.
    idle_rounds: usize,
    /// The first frame (the message's start and what came with it) is out.
    sent_first: bool,
    /// The keep-alive: a `ping` after this long with nothing sent (`None`: off).
    ping: Option<Ping>,
    /// The request's span, entered on every poll: the body is polled by hyper, outside the
    /// handler.
    span: tracing::Span,
}

/// A stream's keep-alive timer. The timer is not reset on every frame (that would be a timer
/// operation per write): when it fires, it looks at when the last frame went out and either
/// pings or waits out the rest of the interval.
struct Ping {
    every: std::time::Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
    last_sent: tokio::time::Instant,
}

impl Ping {
    /// Whether a ping is due now (else the timer is set for when it would be).
    fn poll_due(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = self.last_sent + self.every;
            if due <= tokio::time::Instant::now() {
                self.timer
                    .as_mut()
                    .reset(tokio::time::Instant::now() + self.every);
                // Registers the new deadline's wake-up.
                let _ = self.timer.as_mut().poll(cx);
                return true;
            }
            self.timer.as_mut().reset(due);
        }
    }
}

impl SseReply {
    /// Feeds the machine what the generation has ready; `Pending` only when it had nothing,
    /// else whether it had anything.
    fn poll_events(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let Some(generation) = self.generation.as_mut() else {
            return Poll::Ready(false);
        };
        let mut took = false;
        while self.ended.is_none() {
            match generation.poll_next(cx) {
                Poll::Ready(event) => {
                    took = true;
                    if let (Some(GenerateEvent::Started { .. }), Some(in_flight)) =
                        (&event, self.in_flight.as_mut())
                    {
                        in_flight.prefilled();
                    }
                    self.ended = self.machine.on(&self.tracker, event, &mut self.out);
                }
                Poll::Pending if took => break,
                Poll::Pending => return Poll::Pending,
            }
        }
        if let Some(relayed) = self.relayed.as_mut() {
            if let Some(frames) = generation.take_relayed() {
                relayed.extend_from_slice(&frames);
            }
            let finish_relayed = generation
                .relay_state()
                .is_some_and(|state| state.finish_relayed);
            if let Some(writer) = self.openai.as_mut() {
                writer.relay_from(finish_relayed);
            }
        }
        if let Some(ended) = &self.ended {
            if let Ended::Finished { output_tokens } = ended {
                debug!(
                    server = self.in_flight.as_ref().map(|f| f.server().id()),
                    output_tokens,
                    elapsed_ms = self.tracker.started.elapsed().as_millis() as u64,
                    "stream.done"
                );
            }
            self.generation = None;
            self.in_flight = None;
        }
        Poll::Ready(took)
    }
}

impl Body for SseReply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let _entered = this.span.clone().entered();
        loop {
            let took = match this.poll_events(cx) {
                Poll::Ready(took) => took,
                Poll::Pending if this.out.is_empty() => {
                    if this.ping.as_mut().is_some_and(|p| p.poll_due(cx)) {
                        if !this.sent_first {
                            // Before the reply's first event (queued, or prefilling) a ping
                            // event would come before `message_start`, which no client
                            // expects: an SSE comment keeps the connection alive instead.
                            return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                                b": ping\n\n",
                            )))));
                        }
                        this.out.push(StreamEvent::Ping);
                        continue;
                    }
                    return Poll::Pending;
                }
                // Nothing new this turn.
                Poll::Pending => false,
            };
            if !this.out.is_empty() {
                // A server's burst reaches the stream one body frame per two turns of its
                // connection's task: give that task turns while they bring more, so that what
                // the server sent together goes to the client together (one frame, one write).
                if took {
                    this.idle_rounds = 0;
                } else {
                    this.idle_rounds += 1;
                }
                // The first frame goes at once, with the headers, in one write: the first
                // token's latency is the one the client measures.
                if this.sent_first
                    && this.ended.is_none()
                    && this.gather_rounds < GATHER_ROUNDS
                    && this.idle_rounds < IDLE_ROUNDS
                {
                    this.gather_rounds += 1;
                    // Tokio's yield: the wake is deferred until the tasks already woken (the
                    // reader) have run; a plain self-wake would run this task first again.
                    // The first poll of `yield_now` registers exactly that deferred wake.
                    let _ = std::pin::pin!(tokio::task::yield_now()).poll(cx);
                    return Poll::Pending;
                }
                (this.gather_rounds, this.idle_rounds) = (0, 0);
                this.sent_first = true;
                if let Some(ping) = this.ping.as_mut() {
                    ping.last_sent = tokio::time::Instant::now();
                }
                return Poll::Ready(Some(Ok(Frame::data(frame(
                    &mut this.out,
                    this.openai.as_mut(),
                    this.relayed.as_mut(),
                )))));
            }
            if this.ended.is_some() {
                return Poll::Ready(None);
            }
        }
    }
}

impl Drop for SseReply {
    fn drop(&mut self) {
        if self.ended.is_none() {
            let _entered = self.span.enter();
            self.tracker.gateway.metrics.client_disconnects.inc();
            debug!(
                server = self.in_flight.as_ref().map(|f| f.server().id()),
                "stream.client_disconnected"
            );
        }
    }
}

/// `out`'s events as one SSE frame (emptying `out`), in OpenAI's chunks when `openai` is set,
/// after the server's own frames in `relayed` (emptied too).
fn frame(
    out: &mut Vec<StreamEvent>,
    mut openai: Option<&mut ChunkWriter>,
    relayed: Option<&mut Vec<u8>>,
) -> Bytes {
    let relayed = relayed.map(std::mem::take).unwrap_or_default();
    let mut frame = Vec::with_capacity(relayed.len() + 256 * out.len());
    frame.extend_from_slice(&relayed);
    for event in out.drain(..) {
        match openai.as_deref_mut() {
            Some(writer) => writer.write(&event, &mut frame),
            None => event.write_sse(&mut frame),
        }
    }
    Bytes::from(frame)
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
