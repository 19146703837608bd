//! Response bodies: whole buffers, and a channel-fed body for server-sent events.
//!
//! [`ChannelBody`] yields the frames a producer task sends. When the client disconnects, hyper
//! drops the body, the channel closes, and the producer sees it at its next send or through
//! `Sender::closed()`: that is how a disconnect reaches the engine and frees its KV blocks.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame};
use tokio::sync::mpsc;

/// The body type of every gateway response.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

/// A complete body.
pub fn full(bytes: impl Into<Bytes>) -> ResponseBody {
    Full::new(bytes.into()).boxed_unsync()
}

/// A body fed by a channel, frame by frame.
#[derive(Debug)]
pub struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl ChannelBody {
    /// A body and the sender that feeds it, buffering up to `capacity` frames.
    pub fn channel(capacity: usize) -> (mpsc::Sender<Bytes>, ResponseBody) {
        let (tx, rx) = mpsc::channel(capacity);
        (tx, Self { rx }.boxed_unsync())
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx
            .poll_recv(cx)
            .map(|frame| frame.map(|b| Ok(Frame::data(b))))
    }
}
