//! Resumable streams (`[limits] resume_window_ms`, off by default): a streamed reply is driven
//! by its own task into a log of events, each stamped with an SSE `id` (1, 2, 3, …), and
//! clients read the log. A client that loses its connection reconnects to
//! `GET /v1/streams/{id}` (the id is the reply's `x-ringmaster-stream-id`) with `Last-Event-ID`
//! and gets the events after it, then the rest as they come; the generation goes on meanwhile.
//! Once no client has read a stream for the window, its generation is cancelled (the window
//! bounds the GPU time a departed client costs); a finished stream's log is kept for the window,
//! then dropped. Without the window, streams are not logged: the client's connection drives
//! the generation directly and a disconnect cancels it at once (the gateway's reply machine).
//!
//! The log holds one reply's events, so it is bounded by `max_tokens`; a reader sends all that
//! is pending in one write. This module does not know the events' API: it splits frames at SSE
//! event boundaries and leaves comments (`: ping`) unnumbered.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::{Instrument, debug};

/// A reply body, as the gateway answers with (`ringmaster_gateway::ResponseBody`).
type ResponseBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// One stream's events and who reads them.
#[derive(Debug)]
pub struct StreamLog {
    state: Mutex<LogState>,
    changed: Notify,
    /// The key that started the stream (only it may resume it).
    owner: String,
}

#[derive(Debug, Default)]
struct LogState {
    /// Event `i` has SSE id `i + 1`; comments are kept between them, unnumbered.
    events: Vec<Bytes>,
    /// SSE ids given so far.
    numbered: u64,
    /// For each entry of `events`, the id of the last numbered event up to it.
    ids: Vec<u64>,
    done: bool,
    readers: usize,
    /// When the last reader left (`None` while one reads).
    unread_since: Option<Instant>,
}

impl StreamLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one frame of the reply, split into its events, each numbered.
    fn append(&self, frame: &[u8]) {
        let mut state = self.lock();
        for event in frame.split_inclusive_events() {
            let mut stamped = BytesMut::with_capacity(event.len() + 16);
            if event.starts_with(b":") {
                stamped.extend_from_slice(event);
            } else {
                state.numbered += 1;
                stamped.extend_from_slice(format!("id: {}\n", state.numbered).as_bytes());
                stamped.extend_from_slice(event);
            }
            let numbered = state.numbered;
            state.events.push(stamped.freeze());
            state.ids.push(numbered);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    fn finish(&self) {
        self.lock().done = true;
        self.changed.notify_waiters();
    }

    /// The index of the first entry after SSE id `last`.
    fn after(&self, last: u64) -> usize {
        let state = self.lock();
        state.ids.partition_point(|id| *id <= last)
    }

    /// Resolves once no reader has read for `window` in a row.
    async fn abandoned(&self, window: Duration) {
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let since = self.lock().unread_since;
            match since {
                Some(since) if since.elapsed() >= window => return,
                Some(since) => {
                    let _ = tokio::time::timeout_at(since + window, notified).await;
                }
                None => notified.await,
            }
        }
    }
}

/// Splitting a frame at SSE event boundaries (each piece keeps its closing blank line).
trait SplitEvents {
    fn split_inclusive_events(&self) -> Vec<&[u8]>;
}

impl SplitEvents for [u8] {
    fn split_inclusive_events(&self) -> Vec<&[u8]> {
        let mut out = Vec::new();
        let mut start = 0;
        let mut i = 0;
        while i + 1 < self.len() {
            if self[i] == b'\n' && self[i + 1] == b'\n' {
                out.push(&self[start..i + 2]);
                start = i + 2;
                i += 2;
            } else {
                i += 1;
            }
        }
        if start < self.len() {
            out.push(&self[start..]);
        }
        out
    }
}

/// Counts a reader while it lives.
struct Reader(Arc<StreamLog>);

impl Reader {
    fn new(log: Arc<StreamLog>) -> Self {
        {
            let mut state = log.lock();
            state.readers += 1;
            state.unread_since = None;
        }
        log.changed.notify_waiters();
        Self(log)
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.readers -= 1;
        if state.readers == 0 {
            state.unread_since = Some(Instant::now());
        }
        drop(state);
        self.0.changed.notify_waiters();
    }
}

/// The resumable streams of one gateway.
#[derive(Debug)]
pub struct Streams {
    logs: Mutex<HashMap<String, Arc<StreamLog>>>,
    window: Option<Duration>,
}

impl Streams {
    /// `window`: how long a stream outlives its last reader (`None`: streams are not logged).
    pub fn new(window: Option<Duration>) -> Arc<Self> {
        Arc::new(Self {
            logs: Mutex::new(HashMap::new()),
            window,
        })
    }

    /// Whether streams are resumable.
    pub fn enabled(&self) -> bool {
        self.window.is_some()
    }

    /// Takes over a streamed reply's body: a task drives it into the log under `id`, and the
    /// body returned reads the log from the start.
    pub fn adopt(self: &Arc<Self>, id: &str, owner: &str, mut reply: ResponseBody) -> ResponseBody {
        let window = self.window.unwrap_or_default();
        let log = Arc::new(StreamLog {
            state: Mutex::new(LogState::default()),
            changed: Notify::new(),
            owner: owner.to_owned(),
        });
        self.logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), log.clone());
        let body = read(log.clone(), 0);
        let streams = self.clone();
        let id = id.to_owned();
        tokio::spawn(
            async move {
                loop {
                    tokio::select! {
                        frame = reply.frame() => match frame {
                            Some(Ok(frame)) => {
                                if let Ok(data) = frame.into_data() {
                                    log.append(&data);
                                }
                            }
                            Some(Err(never)) => match never {},
                            None => break,
                        },
                        () = log.abandoned(window) => {
                            debug!(stream = %id, "stream.abandoned_cancelled");
                            break;
                        }
                    }
                }
                // Dropping the reply cancels what is left of its generation.
                drop(reply);
                log.finish();
                log.abandoned(window).await;
                streams
                    .logs
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
            }
            .instrument(tracing::Span::current()),
        );
        body
    }

    /// A reader of stream `id` from after SSE id `last` on, if the stream is known and `owner`
    /// started it.
    pub fn resume(&self, id: &str, owner: &str, last: u64) -> Option<ResponseBody> {
        let log = self
            .logs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()?;
        if log.owner != owner {
            return None;
        }
        let start = log.after(last);
        Some(read(log, start))
    }
}

/// A body that sends the log's entries from `next` on, all that is pending in one write, until
/// the stream is done.
fn read(log: Arc<StreamLog>, next: usize) -> ResponseBody {
    let reader = Reader::new(log);
    let stream = futures_util::stream::unfold((reader, next), |(reader, mut next)| async move {
        loop {
            let log = reader.0.clone();
            let notified = log.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let state = log.lock();
                if next < state.events.len() {
                    let pending = &state.events[next..];
                    let mut chunk = BytesMut::with_capacity(pending.iter().map(Bytes::len).sum());
                    for event in pending {
                        chunk.extend_from_slice(event);
                    }
                    next = state.events.len();
                    drop(state);
                    return Some((
                        Ok::<_, Infallible>(Frame::data(chunk.freeze())),
                        (reader, next),
                    ));
                }
                if state.done {
                    return None;
                }
            }
            notified.await;
        }
    });
    StreamBody::new(stream).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_into_numbered_events_and_comments_stay_unnumbered() {
        let log = StreamLog {
            state: Mutex::new(LogState::default()),
            changed: Notify::new(),
            owner: "k".into(),
        };
        log.append(b"event: a\ndata: {}\n\n: ping\n\nevent: b\ndata: {}\n\n");
        log.append(b"data: [DONE]\n\n");
        let state = log.lock();
        let texts: Vec<&[u8]> = state.events.iter().map(|b| b.as_ref()).collect();
        assert_eq!(
            texts,
            [
                &b"id: 1\nevent: a\ndata: {}\n\n"[..],
                b": ping\n\n",
                b"id: 2\nevent: b\ndata: {}\n\n",
                b"id: 3\ndata: [DONE]\n\n",
            ]
        );
        drop(state);
        assert_eq!(log.after(0), 0);
        // After id 1 comes id 2 (the comment between them is not sent again).
        assert_eq!(log.after(1), 2);
        assert_eq!(log.after(2), 3);
        assert_eq!(log.after(3), 4);
    }
}
