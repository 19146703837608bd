//! A streamed reply that has to wait (in the admission queue, or for a server's prefill) for
//! longer than `[limits] stream_ping_ms` starts at once instead: the client gets the SSE
//! headers and a keep-alive comment (`: ping`) every interval while the wait goes on, then the
//! reply's own events, or an `error` event if the wait ended in an error. Proxies and load
//! balancers that cut idle connections then never see an idle stream.
//!
//! A request that is ready within the interval (nearly all) is answered as before, with its
//! status and every header. One that starts early has already sent `200 OK`, so what goes
//! wrong later (a queue timeout, servers that all failed) arrives as the API's error event,
//! and the headers known only once a server was chosen (`x-ringmaster-server`,
//! `x-ringmaster-attempts`, the variant) are not sent. The stream id for a resume is the
//! request's own, so it is sent.
//!
//! This module only relays: it must not decide anything about the request.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http::header::{CONTENT_TYPE, HeaderValue};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame};

use ringmaster_api::{ApiError, Door};

use crate::body::ResponseBody;

/// The reply being prepared: what the handler answers once its wait is over.
pub(crate) type Pending =
    Pin<Box<dyn Future<Output = Result<Response<ResponseBody>, ApiError>> + Send>>;

/// The streamed response for a reply still being prepared, pinging `every` interval, with the
/// id it will be resumable by (when streams are resumable).
pub(crate) fn response(
    pending: Pending,
    door: Door,
    every: Duration,
    stream_id: Option<&str>,
    span: tracing::Span,
) -> Response<ResponseBody> {
    let body = EarlyReply {
        pending: Some(pending),
        reply: None,
        door,
        every,
        ping: Box::pin(tokio::time::sleep(every)),
        span,
    };
    let mut response = Response::new(body.boxed_unsync());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    if let Some(value) = stream_id.and_then(|id| HeaderValue::from_str(id).ok()) {
        headers.insert(&crate::respond::header_names::STREAM_ID, value);
    }
    response
}

/// Comments while the reply is prepared, then the reply's own body.
struct EarlyReply {
    /// `None` once it resolved.
    pending: Option<Pending>,
    /// The prepared reply's body, relayed once it is there.
    reply: Option<ResponseBody>,
    door: Door,
    every: Duration,
    ping: Pin<Box<tokio::time::Sleep>>,
    span: tracing::Span,
}

impl Body for EarlyReply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(reply) = this.reply.as_mut() {
            return Pin::new(reply).poll_frame(cx);
        }
        let Some(pending) = this.pending.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = {
            let _entered = this.span.enter();
            pending.as_mut().poll(cx)
        };
        match polled {
            Poll::Ready(Ok(response)) => {
                this.pending = None;
                let reply = this.reply.insert(response.into_body());
                Pin::new(reply).poll_frame(cx)
            }
            Poll::Ready(Err(error)) => {
                this.pending = None;
                Poll::Ready(Some(Ok(Frame::data(super::error_event(this.door, &error)))))
            }
            Poll::Pending => {
                if this.ping.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let next = tokio::time::Instant::now() + this.every;
                this.ping.as_mut().reset(next);
                // Registers the next ping's wake-up.
                let _ = this.ping.as_mut().poll(cx);
                // A comment: no client expects an event before the reply's first.
                Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
                    super::EARLY_KEEP_ALIVE,
                )))))
            }
        }
    }
}
