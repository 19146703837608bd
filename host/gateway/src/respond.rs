//! Building responses and reading request bodies, shared by every handler: JSON answers,
//! errors in their door's shape (with `retry-after` and `x-should-retry`), and JSON bodies
//! under the configured size limit (the doors' declared as JSON, the admin API's taken for
//! what they are whatever they declare).
//!
//! An error answered before the request's body was read (a wrong key, a body too large or not
//! JSON, a shed request) over HTTP/2 first reads the rest of the body and throws it away
//! ([`refuse_unread`]): the stream is otherwise reset under a client that is still sending,
//! and a client such as curl 7.88 then reports "stream error in the HTTP/2 framing layer" and
//! loses the answer, although hyper resets with NO_ERROR after the whole answer as RFC 9113
//! §8.1 allows. A client that has sent its body has nothing to lose. Over HTTP/1.1 hyper reads
//! what has arrived and closes the connection after the answer itself, and a client that
//! asked `Expect: 100-continue` has sent nothing and is told by the answer not to.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use ringmaster_api::{ApiError, Door, ErrorKind};

use crate::body::{ResponseBody, full};
use crate::state::Gateway;

/// The gateway's own response headers, named once: `insert` with a `&str` parses and hashes
/// the name again on every request.
pub(crate) mod header_names {
    use http::header::HeaderName;

    /// The request's id, on every response.
    pub(crate) static REQUEST_ID: HeaderName = HeaderName::from_static("request-id");
    /// The server that answered.
    pub(crate) static SERVER: HeaderName = HeaderName::from_static("x-ringmaster-server");
    /// How many servers were tried.
    pub(crate) static ATTEMPTS: HeaderName = HeaderName::from_static("x-ringmaster-attempts");
    /// The router variant that decided.
    pub(crate) static VARIANT: HeaderName = HeaderName::from_static("x-ringmaster-variant");
    /// The router version that decided.
    pub(crate) static POLICY_VERSION: HeaderName =
        HeaderName::from_static("x-ringmaster-policy-version");
    /// A resumable stream's id (`GET /v1/streams/{id}`).
    pub(crate) static STREAM_ID: HeaderName = HeaderName::from_static("x-ringmaster-stream-id");
    /// Anthropic's hint to its SDKs.
    pub(crate) static SHOULD_RETRY: HeaderName = HeaderName::from_static("x-should-retry");
    /// The `[[fallback]]` pool a request spilled to.
    pub(crate) static FALLBACK: HeaderName = HeaderName::from_static("x-ringmaster-fallback");
    /// The fields of the request its server never saw.
    pub(crate) static DROPPED: HeaderName = HeaderName::from_static("x-ringmaster-dropped");
    /// An output limit above the gateway's, served at it: `max_tokens=32000->8192`.
    pub(crate) static CLAMPED: HeaderName = HeaderName::from_static("x-ringmaster-clamped");
}

/// A JSON response with `status`.
pub fn json_response(status: StatusCode, value: &impl serde::Serialize) -> Response<ResponseBody> {
    let mut response = Response::new(full(serde_json::to_vec(value).unwrap_or_default()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// The error response for `error` in `door`'s terms (Anthropic's for every path that is no
/// OpenAI door).
pub(crate) fn error_response(door: Door, error: &ApiError) -> Response<ResponseBody> {
    let mut response = Response::new(full(door.error_body(error)));
    *response.status_mut() = door.error_status(error);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    for (name, value) in error.headers() {
        response.headers_mut().insert(name.clone(), value.clone());
    }
    stamp_retry(response, error)
}

/// `retry-after` and `x-should-retry`, when the error says so.
fn stamp_retry(mut response: Response<ResponseBody>, error: &ApiError) -> Response<ResponseBody> {
    if let Some(after) = error.retry_after() {
        response.headers_mut().insert(
            "retry-after",
            HeaderValue::from_str(&after.as_secs().max(1).to_string()).expect("digits"),
        );
    }
    if error.kind().is_retryable() {
        response.headers_mut().insert(
            &header_names::SHOULD_RETRY,
            HeaderValue::from_static("true"),
        );
    }
    response
}

/// Reads a JSON request body under the configured size limit: the doors', whose clients are
/// SDKs that say `application/json`, as Anthropic's and OpenAI's APIs ask (415 otherwise).
pub async fn read_json_body(gateway: &Gateway, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let content_type = content_type(&req);
    if !declares_json(&content_type) {
        return Err(refuse_unread(req, not_json(&content_type)).await);
    }
    read_body_under(
        gateway,
        req,
        gateway.config.max_body_bytes,
        "request body is larger than this gateway's limit of",
    )
    .await
}

/// Reads a request body that is JSON whatever content type it declares, under the configured
/// size limit: the admin API's, whose callers are operators at a shell, and `curl -d` sends
/// `application/x-www-form-urlencoded` unless told otherwise. A body that does not parse is
/// refused with 415 when its content type did not say JSON either; when it did, the handler's
/// own parse says what is wrong with it (400).
pub async fn read_any_json_body(
    gateway: &Gateway,
    req: Request<Incoming>,
) -> Result<Bytes, ApiError> {
    let content_type = content_type(&req);
    let body = read_body_under(
        gateway,
        req,
        gateway.config.max_body_bytes,
        "request body is larger than this gateway's limit of",
    )
    .await?;
    if !declares_json(&content_type)
        && let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body)
    {
        return Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            format!(
                "the body must be JSON, and it is not ({e}); its content-type is {:?}",
                shown(&content_type)
            ),
        ));
    }
    Ok(body)
}

/// The request's `content-type`, empty when absent or not text.
fn content_type(req: &Request<Incoming>) -> String {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned()
}

/// Whether `content_type` is `application/json` (parameters such as a charset aside).
fn declares_json(content_type: &str) -> bool {
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    media_type.eq_ignore_ascii_case("application/json")
}

/// The doors' 415: the body is not declared JSON.
fn not_json(content_type: &str) -> ApiError {
    ApiError::new(
        ErrorKind::UnsupportedMediaType,
        format!(
            "content-type must be application/json, got {:?}",
            shown(content_type)
        ),
    )
}

/// A content type as an error names it.
fn shown(content_type: &str) -> &str {
    if content_type.is_empty() {
        "(none)"
    } else {
        content_type
    }
}

/// Reads a whole request body of at most `limit` bytes (413, saying `too_large` and the
/// limit, past it) within the body read timeout (408 past it, counted): JSON bodies and the
/// admin API's component uploads alike, so that no route holds a connection that trickles.
pub async fn read_body_under(
    gateway: &Gateway,
    req: Request<Incoming>,
    limit: usize,
    too_large: &str,
) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            ErrorKind::RequestTooLarge,
            format!("{too_large} {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(refuse_unread(req, too_large()).await);
    }
    let drain_past_limit = needs_drain(&req);
    let mut body = req.into_body();
    let read = Limited::new(&mut body, limit).collect();
    let read = match gateway.config.client.body_read_timeout {
        Some(timeout) => match tokio::time::timeout(timeout, read).await {
            Ok(read) => read,
            Err(_) => {
                gateway.metrics.body_read_timeouts.inc();
                return Err(ApiError::new(
                    ErrorKind::RequestTimeout,
                    format!(
                        "the request body did not arrive within {} ms",
                        timeout.as_millis()
                    ),
                ));
            }
        },
        None => read.await,
    };
    match read {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            if drain_past_limit {
                drain(body).await;
            }
            Err(too_large())
        }
        Err(e) => Err(ApiError::invalid(format!(
            "could not read the request body: {e}"
        ))),
    }
}

/// Most bytes of a request's body read and thrown away before an error is answered
/// ([`refuse_unread`]): past them the answer goes anyway (and the stream is reset under the
/// client), so that a client cannot hold the gateway reading forever.
pub const DRAIN_LIMIT_BYTES: u64 = 64 << 20;

/// Longest a request's body is read and thrown away before an error is answered.
pub const DRAIN_TIME: Duration = Duration::from_secs(5);

/// `error`, once `req`'s body has been read to its end and thrown away (at most
/// [`DRAIN_LIMIT_BYTES`], for at most [`DRAIN_TIME`]) when it came over HTTP/2: for an error
/// answered before the body was read, so that the client has sent all of it when the answer
/// comes (see the module's documentation). A body already at its end costs nothing.
pub async fn refuse_unread<B>(req: Request<B>, error: ApiError) -> ApiError
where
    B: hyper::body::Body + Unpin,
{
    if needs_drain(&req) {
        drain(req.into_body()).await;
    }
    error
}

/// Whether an unread body must be read before an error is answered: over HTTP/2, unless the
/// client waits to be asked for it (`Expect: 100-continue`).
fn needs_drain<B>(req: &Request<B>) -> bool {
    let waits = req
        .headers()
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    req.version() == http::Version::HTTP_2 && !waits
}

/// Reads `body` to its end and throws it away, within [`DRAIN_LIMIT_BYTES`] and
/// [`DRAIN_TIME`]; a body that breaks off ends it too.
async fn drain<B>(mut body: B)
where
    B: hyper::body::Body + Unpin,
{
    if body.is_end_stream() {
        return;
    }
    let read = async {
        let mut seen = 0u64;
        while let Some(Ok(frame)) = body.frame().await {
            if let Some(data) = frame.data_ref() {
                seen += bytes::Buf::remaining(data) as u64;
                if seen > DRAIN_LIMIT_BYTES {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, read).await;
}
