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
