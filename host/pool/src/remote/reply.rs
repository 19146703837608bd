//! One streamed reply read from its server's socket by whoever consumes it: the response
//! body, the [`ReplyReader`] and the events one read completed, with no task and no channel
//! in between (the client's writer polls, this reads).
//!
//! Backpressure needs no buffer: nothing more is read until the consumer asks for the next
//! event, so a slow client slows the reading of the server's socket, and what is held at any
//! time is the events of one read. The gap between two reads is bounded by
//! `chunk_gap_timeout`. Once the reply has finished, what is left of the body (`[DONE]`, the
//! chunked terminator) is read so that the connection goes back to the pool; dropping the
//! reply before it finished drops the body, which closes the connection, which is how the
//! server learns to cancel the generation. This module must not decide anything about the
//! events themselves (the reader does) nor about the server's health (the caller does).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::{Body, Incoming};
use ringmaster_gpu_runtime::{EventSource, GenerateEvent};
use tokio::time::{Instant, Sleep};
use tracing::debug;

use super::conn::{Lease, next_data};
use super::{DRAIN_LIMIT_BYTES, ReplyReader, UpstreamSettings, error_chain};
use crate::generation::{RelaySource, RelayState};

/// A server's streamed reply, read on demand.
pub(super) struct RemoteReply {
    /// `None` once the body ended (or was handed to a drain).
    body: Option<Incoming>,
    /// The HTTP/1.1 connection the body comes from, driven before each read of it; given
    /// back once the body ended, dropped (closed) with a body that did not (`None` over
    /// HTTP/2, and once given back or dropped).
    lease: Option<Lease>,
    reader: ReplyReader,
    ready: VecDeque<GenerateEvent>,
    scratch: Vec<GenerateEvent>,
    gap: Duration,
    /// Fires when the server has been silent for `gap`: armed when a read finds nothing (a
    /// reply that is all there never arms a timer), re-armed after data came.
    silence: Option<Pin<Box<Sleep>>>,
    /// Data came since `silence` was armed.
    heard: bool,
    url: String,
    request_id: String,
}

impl RemoteReply {
    /// The reply is in `api`'s events; with `relay`, a chat server's content chunks are kept
    /// for a client that speaks its API.
    pub(super) fn new(
        body: Incoming,
        lease: Option<Lease>,
        settings: &UpstreamSettings,
        (api, relay): (ringmaster_wire::Api, bool),
        ids: (String, String),
    ) -> Self {
        let gap = settings.chunk_gap_timeout;
        let (url, request_id) = ids;
        let reader = if relay {
            ReplyReader::relaying(settings.max_event_bytes)
        } else {
            ReplyReader::of(api, settings.max_event_bytes)
        };
        Self {
            body: Some(body),
            lease,
            reader,
            ready: VecDeque::new(),
            scratch: Vec::new(),
            gap,
            silence: None,
            heard: false,
            url,
            request_id,
        }
    }

    /// Reads until the events of one read are ready, the reply is done, or the body has
    /// nothing more for now.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while self.ready.is_empty() && !self.reader.is_done() {
            let Some(body) = self.body.as_mut() else {
                self.reader.end(&mut self.scratch);
                break;
            };
            if let Some(lease) = self.lease.as_mut() {
                lease.drive(cx);
            }
            match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.reader.feed(&data, &mut self.scratch);
                        self.heard = true;
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    self.body = None;
                    self.lease = None;
                    self.reader.fail(
                        format!("the reply broke off: {}", error_chain(&e)),
                        &mut self.scratch,
                    );
                }
                Poll::Ready(None) => {
                    self.body_ended();
                    self.reader.end(&mut self.scratch);
                }
                Poll::Pending => {
                    if self.silent(cx) {
                        self.body = None;
                        self.lease = None;
                        self.reader.fail(
                            format!("the server sent nothing for {:?}", self.gap),
                            &mut self.scratch,
                        );
                    } else {
                        return Poll::Pending;
                    }
                }
            }
            self.ready.extend(self.scratch.drain(..));
        }
        self.ready.extend(self.scratch.drain(..));
        if self.reader.is_done() {
            self.finish_body(cx);
        }
        Poll::Ready(())
    }

    /// Whether the server has now been silent for `gap` (else the timer is armed with `cx`).
    fn silent(&mut self, cx: &mut Context<'_>) -> bool {
        let gap = self.gap;
        let silence = self
            .silence
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
        if std::mem::take(&mut self.heard) {
            silence.as_mut().reset(Instant::now() + gap);
        }
        silence.as_mut().poll(cx).is_ready()
    }

    /// Reads what is already there of a finished reply's rest, so that in the common case
    /// (the whole rest came with the last event) the connection is back in the pool before
    /// the last event is handed out.
    fn finish_body(&mut self, cx: &mut Context<'_>) {
        let mut read = 0;
        while let Some(body) = self.body.as_mut() {
            if let Some(lease) = self.lease.as_mut() {
                lease.drive(cx);
            }
            match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    read += frame.data_ref().map_or(0, |d| d.len());
                    if read > DRAIN_LIMIT_BYTES {
                        self.body = None;
                        self.lease = None;
                    }
                }
                Poll::Ready(None) => self.body_ended(),
                Poll::Ready(Some(Err(_))) => {
                    self.body = None;
                    self.lease = None;
                }
                Poll::Pending => return,
            }
        }
    }

    /// The body was read to its end: its connection goes back to the pool.
    fn body_ended(&mut self) {
        self.body = None;
        if let Some(lease) = self.lease.take() {
            lease.finished();
        }
    }
}

impl EventSource for RemoteReply {
    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<GenerateEvent>> {
        if self.ready.is_empty() {
            std::task::ready!(self.poll_read(cx));
        }
        Poll::Ready(self.ready.pop_front())
    }
}

impl RelaySource for RemoteReply {
    fn take_relayed(&mut self) -> Option<Vec<u8>> {
        self.reader.take_relayed()
    }

    fn relay_state(&self) -> Option<RelayState> {
        self.reader.relay_state()
    }
}

impl Drop for RemoteReply {
    fn drop(&mut self) {
        if !self.reader.is_done() {
            if self.body.is_some() {
                // Dropping the body closes the connection, which cancels the generation.
                debug!(request_id = %self.request_id, server = %self.url, "remote.cancelled");
            }
            return;
        }
        if self.reader.counted_output() {
            debug!(request_id = %self.request_id, server = %self.url, "remote.usage_counted");
        }
        // The rest did not come with the last event: read it elsewhere, so that the
        // connection still goes back to the pool.
        if let Some(body) = self.body.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(drain(body, self.lease.take(), self.gap));
        }
    }
}

/// Reads what is left of a finished reply so that its connection goes back to the pool;
/// gives up (closing it) past [`DRAIN_LIMIT_BYTES`] or a gap.
async fn drain(mut body: Incoming, mut lease: Option<Lease>, gap: Duration) {
    let mut read = 0;
    loop {
        match tokio::time::timeout(gap, next_data(&mut body, lease.as_mut())).await {
            Ok(Some(Ok(chunk))) => {
                read += chunk.len();
                if read > DRAIN_LIMIT_BYTES {
                    return;
                }
            }
            Ok(None) => {
                if let Some(lease) = lease {
                    lease.finished();
                }
                return;
            }
            Ok(Some(Err(_))) | Err(_) => return,
        }
    }
}
