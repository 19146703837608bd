//! The API error: what went wrong, who is to blame, and whether trying again can help.
//!
//! Every error a client can see is an [`ApiError`]. Its [`ErrorKind`] decides, in this one place,
//! the HTTP status and the Anthropic error `type` ([`crate::Door`] writes each door's body and
//! OpenAI's status), so handlers never pick status codes by hand.
//! The message is written for the client: it names the field or value that is wrong and never
//! contains a prompt, an API key or an internal path.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

/// The class of an API error, after Anthropic's error types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or asks for something impossible (400).
    InvalidRequest,
    /// The request body is not JSON (415).
    UnsupportedMediaType,
    /// The method is not allowed on the path (405).
    MethodNotAllowed,
    /// The resource exists but the request conflicts with its state (409).
    Conflict,
    /// No API key, or an unknown one (401).
    Authentication,
    /// The key may not do this (a model outside its list) (403).
    PermissionDenied,
    /// The path, model or server does not exist (404).
    NotFound,
    /// The body is over the configured limit (413).
    RequestTooLarge,
    /// The body did not arrive in time (408).
    RequestTimeout,
    /// The key's rate limit is used up (429).
    RateLimit,
    /// A failure inside the gateway or a GPU server (500).
    Api,
    /// No GPU server can take the request now (529).
    Overloaded,
    /// The gateway is not ready to serve (503).
    Unavailable,
}

impl ErrorKind {
    /// The HTTP status for this kind.
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidRequest => StatusCode::BAD_REQUEST,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict => StatusCode::CONFLICT,
            Self::Authentication => StatusCode::UNAUTHORIZED,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::RateLimit => StatusCode::TOO_MANY_REQUESTS,
            Self::Api => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Overloaded => overloaded_status(),
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The Anthropic error `type` string.
    pub fn anthropic_type(self) -> &'static str {
        match self {
            Self::InvalidRequest
            | Self::UnsupportedMediaType
            | Self::MethodNotAllowed
            | Self::Conflict
            | Self::RequestTimeout => "invalid_request_error",
            Self::Authentication => "authentication_error",
            Self::PermissionDenied => "permission_error",
            Self::NotFound => "not_found_error",
            Self::RequestTooLarge => "request_too_large",
            Self::RateLimit => "rate_limit_error",
            Self::Api => "api_error",
            Self::Overloaded | Self::Unavailable => "overloaded_error",
        }
    }

    /// Whether sending the same request again later can succeed.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            Self::RateLimit | Self::Api | Self::Overloaded | Self::Unavailable
        )
    }
}

/// Anthropic's non-standard "overloaded" status.
fn overloaded_status() -> StatusCode {
    StatusCode::from_u16(529).expect("529 is a valid status code")
}

/// An error shown to an API client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    kind: ErrorKind,
    message: String,
    retry_after: Option<Duration>,
    /// Headers the answer carries besides the error's own (a 429's rate-limit headers).
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
}

impl ApiError {
    /// An error of `kind` with a client-facing `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
            headers: Vec::new(),
        }
    }

    /// 400 `invalid_request_error`.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidRequest, message)
    }

    /// 404 `not_found_error`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// 500 `api_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Api, message)
    }

    /// Adds a `retry-after` hint.
    pub fn with_retry_after(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// Adds headers the answer carries (a refusal's rate-limit headers).
    pub fn with_headers(mut self, headers: Vec<(http::HeaderName, http::HeaderValue)>) -> Self {
        self.headers.extend(headers);
        self
    }

    /// The headers the answer carries besides the error's own.
    pub fn headers(&self) -> &[(http::HeaderName, http::HeaderValue)] {
        &self.headers
    }

    /// The error's kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The client-facing message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// How long the client should wait before retrying, when known.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.anthropic_type(), self.message)
    }
}

impl std::error::Error for ApiError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_anthropic_statuses_and_types() {
        let table = [
            (ErrorKind::InvalidRequest, 400, "invalid_request_error"),
            (ErrorKind::Authentication, 401, "authentication_error"),
            (ErrorKind::PermissionDenied, 403, "permission_error"),
            (ErrorKind::NotFound, 404, "not_found_error"),
            (ErrorKind::RequestTooLarge, 413, "request_too_large"),
            (ErrorKind::RequestTimeout, 408, "invalid_request_error"),
            (
                ErrorKind::UnsupportedMediaType,
                415,
                "invalid_request_error",
            ),
            (ErrorKind::RateLimit, 429, "rate_limit_error"),
            (ErrorKind::Api, 500, "api_error"),
            (ErrorKind::Overloaded, 529, "overloaded_error"),
        ];
        for (kind, status, name) in table {
            assert_eq!(kind.status().as_u16(), status, "{kind:?}");
            assert_eq!(kind.anthropic_type(), name, "{kind:?}");
        }
    }
}
