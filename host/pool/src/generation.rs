//! A started generation as the pool hands it over ([`Generation`]): the events of one request,
//! as a [`GenerationStream`] yields them, and, for a client that speaks the server's own API,
//! what a relay passes on as the server sent it: the whole JSON answer
//! ([`Generation::take_answer`]), or a streamed reply's own content frames
//! ([`Generation::take_relayed`], read from a [`RelaySource`]).
//!
//! The relay lives here, not in the stream, because only a remote server's reply has bytes of
//! its own to pass on: an engine's stream never does, and the crate that defines what a
//! generation is must not know about HTTP replies. This module decides nothing about when to
//! relay (the gateway asks for it in the request) and reads no socket (the source does).
//!
//! The events keep the stream's rules: `None` after `Finished` or `Failed`, and dropping the
//! generation before its end cancels the request (a relayed reply's source closes its
//! connection when dropped).

use std::task::{Context, Poll};

use ringmaster_gpu_runtime::{EventSource, GenerateEvent, GenerationStream};

/// What a relay of a server's own frames has passed on so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayState {
    /// The server's id of the reply, once a frame named it.
    pub reply_id: Option<String>,
    /// A frame carried the finish (so the client has it already).
    pub finish_relayed: bool,
}

/// A server's streamed reply whose own frames are kept for a relay, read in the consumer's
/// task like any [`EventSource`].
pub trait RelaySource: EventSource {
    /// The server's own frames for the content read so far and not yet taken (`None`:
    /// nothing new, or the source keeps none).
    fn take_relayed(&mut self) -> Option<Vec<u8>>;

    /// What the relay has passed on (`None`: the source keeps no frames).
    fn relay_state(&self) -> Option<RelayState>;
}

/// One started generation: its events, and what a relay of the server's own answer needs.
/// Dropping it before its last event cancels the request.
#[derive(Debug)]
pub struct Generation {
    events: Events,
    /// A server's whole answer as it sent it, kept for a client of the server's own API
    /// ([`Generation::with_answer`]).
    answer: Option<Vec<u8>>,
}

/// Where a generation's events come from.
#[derive(Debug)]
enum Events {
    /// An engine's stream, a whole answer's events, a reply read without a relay.
    Stream(GenerationStream),
    /// A streamed reply whose own frames are kept.
    Relayed(RelayedReply),
}

/// A relayed reply's source, with the stream's rules around it: an event put back in front,
/// and nothing after the last event.
struct RelayedReply {
    source: Box<dyn RelaySource>,
    front: Option<GenerateEvent>,
    finished: bool,
}

impl std::fmt::Debug for RelayedReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayedReply")
            .field("front", &self.front)
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl RelayedReply {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<GenerateEvent>> {
        if self.finished {
            return Poll::Ready(None);
        }
        let event = match self.front.take() {
            Some(event) => Some(event),
            None => std::task::ready!(self.source.poll_event(cx)),
        };
        if event.as_ref().is_none_or(GenerateEvent::is_last) {
            self.finished = true;
        }
        Poll::Ready(event)
    }
}

impl From<GenerationStream> for Generation {
    fn from(stream: GenerationStream) -> Self {
        Self {
            events: Events::Stream(stream),
            answer: None,
        }
    }
}

impl Generation {
    /// A streamed reply read from `source`, its own frames kept for a relay.
    pub fn relayed(source: Box<dyn RelaySource>) -> Self {
        Self {
            events: Events::Relayed(RelayedReply {
                source,
                front: None,
                finished: false,
            }),
            answer: None,
        }
    }

    /// The generation with the server's whole answer (`body`, its events already decoded into
    /// the stream) kept, to go to a client of the server's API as it came.
    pub fn with_answer(mut self, body: Vec<u8>) -> Self {
        self.answer = Some(body);
        self
    }

    /// The generation with `event` put back in front (a remote client looks at the first
    /// event before it commits to a server).
    pub fn with_front(self, event: GenerateEvent) -> Self {
        let events = match self.events {
            Events::Stream(stream) => Events::Stream(stream.with_front(event)),
            Events::Relayed(mut reply) => {
                reply.front = Some(event);
                reply.finished = false;
                Events::Relayed(reply)
            }
        };
        Self { events, ..self }
    }

    /// The server's whole answer as it sent it, when it was kept ([`Self::with_answer`]).
    pub fn take_answer(&mut self) -> Option<Vec<u8>> {
        self.answer.take()
    }

    /// The server's own frames for the content read so far and not yet taken, when the
    /// generation is a relayed server reply (see [`RelaySource::take_relayed`]).
    pub fn take_relayed(&mut self) -> Option<Vec<u8>> {
        match &mut self.events {
            Events::Relayed(reply) => reply.source.take_relayed(),
            Events::Stream(_) => None,
        }
    }

    /// What a relayed server reply has passed on (`None`: not a relay).
    pub fn relay_state(&self) -> Option<RelayState> {
        match &self.events {
            Events::Relayed(reply) => reply.source.relay_state(),
            Events::Stream(_) => None,
        }
    }

    /// The next event; `None` after `Finished` or `Failed` (or if the producer went away).
    ///
    /// Cancel safety: this method is cancel-safe; an event is never lost if the future is
    /// dropped before it completes.
    pub async fn next(&mut self) -> Option<GenerateEvent> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// The next event, or `Pending` with `cx`'s waker registered; `None` after `Finished` or
    /// `Failed` (or if the producer went away).
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<GenerateEvent>> {
        match &mut self.events {
            Events::Stream(stream) => stream.poll_next(cx),
            Events::Relayed(reply) => reply.poll_next(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_gpu_runtime::FinishReason;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    fn finished() -> GenerateEvent {
        GenerateEvent::Finished {
            reason: FinishReason::EndOfTurn,
            prompt_tokens: 3,
            cached_tokens: 0,
            output_tokens: 1,
        }
    }

    fn token(text: &str) -> GenerateEvent {
        GenerateEvent::Token { text: text.into() }
    }

    /// A relay source over events that are all here, keeping one frame per event; it marks
    /// `dropped` when it goes.
    struct Frames {
        events: std::collections::VecDeque<GenerateEvent>,
        kept: Vec<u8>,
        dropped: Arc<AtomicBool>,
    }

    impl EventSource for Frames {
        fn poll_event(&mut self, _: &mut Context<'_>) -> Poll<Option<GenerateEvent>> {
            let event = self.events.pop_front();
            if event.is_some() {
                self.kept.extend_from_slice(b"data: {}\n\n");
            }
            Poll::Ready(event)
        }
    }

    impl RelaySource for Frames {
        fn take_relayed(&mut self) -> Option<Vec<u8>> {
            (!self.kept.is_empty()).then(|| std::mem::take(&mut self.kept))
        }

        fn relay_state(&self) -> Option<RelayState> {
            Some(RelayState {
                reply_id: Some("chatcmpl-1".into()),
                finish_relayed: false,
            })
        }
    }

    fn relayed(events: Vec<GenerateEvent>) -> (Generation, Arc<AtomicBool>) {
        let dropped = Arc::new(AtomicBool::new(false));
        let source = Frames {
            events: events.into(),
            kept: Vec::new(),
            dropped: dropped.clone(),
        };
        (Generation::relayed(Box::new(source)), dropped)
    }

    impl Drop for Frames {
        fn drop(&mut self) {
            self.dropped.store(true, Ordering::Relaxed);
        }
    }

    #[tokio::test]
    async fn a_relayed_reply_yields_nothing_after_its_last_event() {
        let (mut generation, _) = relayed(vec![token("a"), finished(), token("late")]);
        assert_eq!(generation.next().await, Some(token("a")));
        assert_eq!(generation.next().await, Some(finished()));
        assert_eq!(generation.next().await, None);
        assert_eq!(generation.next().await, None);
    }

    #[tokio::test]
    async fn a_relayed_reply_hands_over_its_frames_once_and_its_state() {
        let (mut generation, _) = relayed(vec![token("a"), token("b"), finished()]);
        generation.next().await;
        generation.next().await;
        assert_eq!(
            generation.take_relayed().as_deref(),
            Some(&b"data: {}\n\ndata: {}\n\n"[..])
        );
        assert_eq!(generation.take_relayed(), None, "taken once");
        assert_eq!(
            generation.relay_state().and_then(|s| s.reply_id).as_deref(),
            Some("chatcmpl-1")
        );
    }

    #[tokio::test]
    async fn an_event_put_back_comes_first_even_after_the_last() {
        let (mut generation, _) = relayed(vec![]);
        assert_eq!(generation.next().await, None);
        let mut generation = generation.with_front(finished());
        assert_eq!(generation.next().await, Some(finished()));
        assert_eq!(generation.next().await, None);

        let mut stream: Generation = GenerationStream::from_events(vec![finished()]).into();
        let first = stream.next().await.unwrap();
        let mut stream = stream.with_front(first);
        assert_eq!(stream.next().await, Some(finished()));
        assert_eq!(stream.next().await, None);
    }

    #[tokio::test]
    async fn dropping_a_relayed_reply_drops_its_source() {
        let (mut generation, dropped) = relayed(vec![token("a"), finished()]);
        generation.next().await;
        assert!(!dropped.load(Ordering::Relaxed));
        drop(generation);
        assert!(
            dropped.load(Ordering::Relaxed),
            "the connection closes with it"
        );
    }

    #[tokio::test]
    async fn a_plain_stream_keeps_no_relay_but_may_keep_an_answer() {
        let mut generation: Generation = GenerationStream::from_events(vec![finished()]).into();
        assert_eq!(generation.relay_state(), None);
        assert_eq!(generation.take_relayed(), None);
        assert_eq!(generation.take_answer(), None);
        let mut generation = generation.with_answer(b"{}".to_vec());
        assert_eq!(generation.take_answer().as_deref(), Some(&b"{}"[..]));
        assert_eq!(generation.take_answer(), None);
        assert_eq!(generation.next().await, Some(finished()));
    }
}
