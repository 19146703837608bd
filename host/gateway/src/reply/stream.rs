//! A streamed reply as a response body: each poll takes every event the generation has
//! ready (a remote server's reply is read right here, in the connection's task) and hands
//! them to the door's writer, so that what the server sent together goes to the client in one
//! write, with no task or channel between the two sockets.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_TYPE, HeaderValue};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};
use ringmaster_api::reply::{ReplyEvent, StreamWriter};
use ringmaster_gpu_runtime::GenerateEvent;
use ringmaster_pool::{Generation, InFlight};
use tracing::debug;

use super::{EARLY_KEEP_ALIVE, Ended, Frames, ReplyMachine};
use crate::body::ResponseBody;
use crate::track::Tracker;
use ringmaster_responses::Saver;

/// The reply as server-sent events, produced as the client's connection asks for them. With
/// `relayed` (a server reply kept for a relay, to a client of the server's API), the server's
/// own content chunks go out as they came, and only what they lack is written here.
pub(crate) fn response(
    tracker: Tracker,
    mut writer: StreamWriter,
    (generation, relayed): (Generation, bool),
    in_flight: InFlight,
    saver: Option<Saver>,
) -> Response<ResponseBody> {
    if relayed {
        writer.relay_from(false);
    }
    let machine = ReplyMachine::new(&tracker);
    let ping = tracker.gateway.config.stream_ping.map(|every| Ping {
        every,
        timer: Box::pin(tokio::time::sleep(every)),
        last_sent: tokio::time::Instant::now(),
    });
    let cancelled = saver
        .as_ref()
        .map(|saver| Box::pin(saver.cancel.clone().cancelled_owned()));
    let body = SseReply {
        saver,
        cancelled,
        writer,
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

/// A streamed reply as a response body. When the client goes away, hyper drops the body, and
/// with it the generation, which cancels it on its server.
struct SseReply {
    /// A Responses reply's store and cancellation (`None` on the other doors).
    saver: Option<Saver>,
    /// Fires when the response is cancelled (`POST /v1/responses/{id}/cancel`).
    cancelled: Option<Pin<Box<tokio_util::sync::WaitForCancellationFutureOwned>>>,
    /// Writes the door's events.
    writer: StreamWriter,
    tracker: Tracker,
    machine: ReplyMachine,
    /// `None` once the reply ended (dropped at once: that frees the server's connection).
    generation: Option<Generation>,
    in_flight: Option<InFlight>,
    /// The door's frames written and not yet sent.
    out: Vec<u8>,
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
        if self.ended.is_none()
            && let Some(cancelled) = self.cancelled.as_mut()
            && cancelled.as_mut().poll(cx).is_ready()
        {
            self.cancelled = None;
            let mut frames = Frames {
                writer: &mut self.writer,
                out: &mut self.out,
            };
            let cancel = GenerateEvent::Failed {
                message: ringmaster_responses::CANCELLED.to_owned(),
            };
            self.ended = self.machine.on(&self.tracker, Some(cancel), &mut frames);
        }
        let mut took = false;
        while self.ended.is_none() {
            match generation.poll_next(cx) {
                Poll::Ready(event) => {
                    took = true;
                    match &event {
                        Some(GenerateEvent::Started { .. }) => {
                            if let Some(in_flight) = self.in_flight.as_mut() {
                                in_flight.prefilled();
                            }
                        }
                        // A relay's finishing chunk, if the server sent one, went out with
                        // its content: the writer adds only what it lacks.
                        Some(GenerateEvent::Finished { .. }) if self.relayed.is_some() => {
                            if let Some(state) = generation.relay_state() {
                                self.writer.relay_from(state.finish_relayed);
                            }
                        }
                        _ => {}
                    }
                    let mut frames = Frames {
                        writer: &mut self.writer,
                        out: &mut self.out,
                    };
                    self.ended = self.machine.on(&self.tracker, event, &mut frames);
                }
                Poll::Pending if took => break,
                Poll::Pending => return Poll::Pending,
            }
        }
        if let Some(relayed) = self.relayed.as_mut()
            && let Some(frames) = generation.take_relayed()
        {
            relayed.extend_from_slice(&frames);
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
            if let (Some(saver), Some(response)) =
                (self.saver.take(), self.writer.finished_response())
            {
                saver.finished(&response);
            }
            return Poll::Ready(true);
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
                                EARLY_KEEP_ALIVE,
                            )))));
                        }
                        this.writer.write(&ReplyEvent::Ping, &mut this.out);
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

/// The frames written (emptying `out`), after the server's own frames in `relayed` (emptied
/// too), as one frame for one write.
fn frame(out: &mut Vec<u8>, relayed: Option<&mut Vec<u8>>) -> Bytes {
    match relayed {
        Some(relayed) if !relayed.is_empty() => {
            let mut frame = std::mem::take(relayed);
            frame.extend_from_slice(out);
            out.clear();
            Bytes::from(frame)
        }
        _ => Bytes::from(std::mem::replace(out, Vec::with_capacity(512))),
    }
}
