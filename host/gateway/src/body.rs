//! Response bodies: the one body type every handler answers with, and whole buffers.
//!
//! A streamed reply is its own body type (`crate::reply`), polled by hyper in the
//! connection's task; when the client disconnects hyper drops it, and with it the engine's
//! stream: that is how a disconnect reaches the engine and frees its KV blocks.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};

/// The body type of every gateway response.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// A complete body.
pub fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).boxed_unsync()
}

/// `response` with `guard` held until its body has been sent in full or dropped (a client
/// that went away): how a connection and the overload guard know a request has ended.
pub(crate) fn hold_until_sent<G: Send + Unpin + 'static>(
    response: http::Response<ResponseBody>,
    guard: G,
) -> http::Response<ResponseBody> {
    response.map(|inner| {
        Holding {
            inner,
            _guard: guard,
        }
        .boxed_unsync()
    })
}

/// A body and what it keeps alive.
struct Holding<G> {
    inner: ResponseBody,
    _guard: G,
}

impl<G> hyper::body::Body for Holding<G>
where
    G: Send + Unpin + 'static,
{
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}
