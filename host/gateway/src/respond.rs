//! Building responses and reading request bodies, shared by every handler: JSON answers,
//! errors in their door's shape (with `retry-after` and `x-should-retry`), and JSON bodies
//! under the configured size limit.

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

/// Reads a JSON request body under the configured size limit.
pub async fn read_json_body(gateway: &Gateway, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    let content_type = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let media_type = content_type.split(';').next().unwrap_or("").trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::new(
            ErrorKind::UnsupportedMediaType,
            format!(
                "content-type must be application/json, got {:?}",
                if content_type.is_empty() {
                    "(none)"
                } else {
                    content_type
                }
            ),
        ));
    }
    read_body_under(
        gateway,
        req,
        gateway.config.max_body_bytes,
        "request body is larger than this gateway's limit of",
    )
    .await
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
        return Err(too_large());
    }
    let read = Limited::new(req.into_body(), limit).collect();
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
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(e) => Err(ApiError::invalid(format!(
            "could not read the request body: {e}"
        ))),
    }
}
