//! One request's events as its consumer reads them ([`GenerationStream`]), whoever produces
//! them: a local engine's channel, a source read in the consumer's own task ([`EventSource`]: a
//! remote server's reply), or events that are all here already. Dropping the stream before its
//! end cancels the request. It must not know how an engine schedules or how a server is read,
//! nor hold what a relay of a server's own bytes needs (the pool's `Generation` does).

use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::{Notify, mpsc};

use crate::request::GenerateEvent;

/// The events of one request. Dropping it before `Finished` cancels the request.
#[derive(Debug)]
pub struct GenerationStream {
    events: Events,
    /// An event already taken off the stream and put back ([`GenerationStream::with_front`]),
    /// handed out first.
    front: Option<GenerateEvent>,
    /// Wakes the local engine when the stream is dropped early; `None` for a stream fed by
    /// something else (a remote worker's client).
    wake: Option<Arc<Notify>>,
    finished: bool,
}

/// Something that produces a stream's events when polled, in the consumer's own task: a
/// remote server's reply read straight from its socket, with no task or channel in between.
/// Backpressure is natural: nothing is read until the consumer asks.
pub trait EventSource: Send + Unpin + 'static {
    /// The next event, `Pending` (with the waker registered) until one is there, `None` once
    /// the source has nothing more.
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<GenerateEvent>>;
}

impl GenerationStream {
    /// A local engine's stream: its events come from the engine's channel, and dropping it
    /// early wakes the engine through `wake` to reap the request.
    pub(crate) fn from_engine(
        events: mpsc::UnboundedReceiver<GenerateEvent>,
        wake: Arc<Notify>,
    ) -> Self {
        Self {
            events: Events::Unbounded(events),
            front: None,
            wake: Some(wake),
            finished: false,
        }
    }

    /// A stream read from `source` by whoever consumes it.
    pub fn from_source(source: Box<dyn EventSource>) -> Self {
        Self {
            events: Events::Source(source),
            front: None,
            wake: None,
            finished: false,
        }
    }

    /// The stream with `event` put back in front (a remote client looks at the first event
    /// before it commits to a server).
    pub fn with_front(mut self, event: GenerateEvent) -> Self {
        self.front = Some(event);
        self.finished = false;
        self
    }

    /// A stream of events that are all here already (a server's whole JSON answer).
    pub fn from_events(events: Vec<GenerateEvent>) -> Self {
        Self {
            events: Events::Ready(events.into()),
            front: None,
            wake: None,
            finished: false,
        }
    }

    /// The next event; `None` after `Finished` (or if the engine died).
    ///
    /// Cancel safety: this method is cancel-safe; an event is never lost if the future is
    /// dropped before it completes.
    pub async fn next(&mut self) -> Option<GenerateEvent> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// The next event, or `Pending` with `cx`'s waker registered; `None` after `Finished` (or
    /// if the producer went away).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<GenerateEvent>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let event = match self.front.take() {
            Some(event) => Some(event),
            None => std::task::ready!(self.events.poll_recv(cx)),
        };
        if event.as_ref().is_none_or(GenerateEvent::is_last) {
            self.finished = true;
        }
        Poll::Ready(event)
    }
}

/// Where a stream's events come from.
enum Events {
    /// A local engine's thread, which must never block on a send.
    Unbounded(mpsc::UnboundedReceiver<GenerateEvent>),
    /// Read on demand by the consumer.
    Source(Box<dyn EventSource>),
    /// All here already.
    Ready(std::collections::VecDeque<GenerateEvent>),
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unbounded(_) => f.write_str("Events::Unbounded"),
            Self::Source(_) => f.write_str("Events::Source"),
            Self::Ready(events) => write!(f, "Events::Ready({} left)", events.len()),
        }
    }
}

impl Events {
    fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<GenerateEvent>> {
        match self {
            Self::Unbounded(rx) => rx.poll_recv(cx),
            Self::Source(source) => source.poll_event(cx),
            Self::Ready(events) => Poll::Ready(events.pop_front()),
        }
    }

    fn close(&mut self) {
        match self {
            Self::Unbounded(rx) => rx.close(),
            // Dropping the source (with the stream) is what stops it.
            Self::Source(_) | Self::Ready(_) => {}
        }
    }
}

impl Drop for GenerationStream {
    fn drop(&mut self) {
        if !self.finished {
            // Close first so that the woken engine already sees the channel closed.
            self.events.close();
            if let Some(wake) = &self.wake {
                wake.notify_one();
            }
        }
    }
}
