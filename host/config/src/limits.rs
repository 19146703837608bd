//! `[limits]`: what one request may be and ask (the body's size, `max_tokens`), how a stream
//! keeps alive and resumes, how a refusal and a slow client are held, the servers' queues,
//! and the grace period at shutdown.

use std::time::Duration;

use crate::error::{ConfigError, invalid};
use crate::raw::RawLimits;

/// Default body limit (Anthropic's own limit for the Messages API is 32 MB; 16 MiB leaves room
/// for long contexts while bounding memory per connection).
pub const DEFAULT_MAX_BODY_BYTES: usize = 16 * 1024 * 1024;
/// Default ceiling on `max_tokens`.
pub const DEFAULT_MAX_OUTPUT_TOKENS: u32 = 8192;
/// Default number of requests waiting inside one GPU server before the gateway calls it full;
/// when every server is full, new requests get 529 `overloaded_error`.
pub const DEFAULT_MAX_WAITING_PER_SERVER: u32 = 1024;
/// Default time given to in-flight requests at shutdown.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// How long a streamed reply may send nothing before it sends a `ping`, unless configured.
pub const DEFAULT_STREAM_PING: Duration = Duration::from_secs(5);
/// How long a 429 is held before it goes out, unless configured.
pub const DEFAULT_RATE_LIMIT_DELAY: Duration = Duration::from_millis(250);
/// How long a client may take nothing of a reply before it is cut off (nginx's
/// `send_timeout` is 60 s; a streamed token reply that stalls half that is already broken).
pub const DEFAULT_CLIENT_SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// `[limits]`, validated.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) max_body_bytes: usize,
    pub(crate) max_output_tokens: u32,
    pub(crate) max_waiting_per_server: u32,
    pub(crate) stream_ping: Option<Duration>,
    pub(crate) resume_window: Option<Duration>,
    pub(crate) rate_limit_delay: Option<Duration>,
    pub(crate) client_send_timeout: Option<Duration>,
    pub(crate) shutdown_grace: Duration,
}

/// A duration in milliseconds where 0 turns the feature off: `default` when absent, at most
/// `max_ms`.
fn optional_ms(
    value: Option<u64>,
    field: &str,
    default: Option<Duration>,
    max_ms: u64,
) -> Result<Option<Duration>, ConfigError> {
    match value {
        None => Ok(default),
        Some(0) => Ok(None),
        Some(ms) if ms > max_ms => Err(invalid(field, format!("must be at most {max_ms}"))),
        Some(ms) => Ok(Some(Duration::from_millis(ms))),
    }
}

/// Validates `[limits]`.
pub(crate) fn limits(limits: RawLimits) -> Result<Limits, ConfigError> {
    let max_body_bytes = limits.max_body_bytes.unwrap_or(DEFAULT_MAX_BODY_BYTES);
    if max_body_bytes < 1024 {
        return Err(invalid("limits.max_body_bytes", "must be at least 1024"));
    }
    let max_output_tokens = limits
        .max_output_tokens
        .unwrap_or(DEFAULT_MAX_OUTPUT_TOKENS);
    if max_output_tokens == 0 {
        return Err(invalid("limits.max_output_tokens", "must be at least 1"));
    }
    let stream_ping = optional_ms(
        limits.stream_ping_ms,
        "limits.stream_ping_ms",
        Some(DEFAULT_STREAM_PING),
        600_000,
    )?;
    let resume_window = optional_ms(
        limits.resume_window_ms,
        "limits.resume_window_ms",
        None,
        3_600_000,
    )?;
    let rate_limit_delay = optional_ms(
        limits.rate_limit_delay_ms,
        "limits.rate_limit_delay_ms",
        Some(DEFAULT_RATE_LIMIT_DELAY),
        60_000,
    )?;
    let client_send_timeout = optional_ms(
        limits.client_send_timeout_ms,
        "limits.client_send_timeout_ms",
        Some(DEFAULT_CLIENT_SEND_TIMEOUT),
        3_600_000,
    )?;
    let max_waiting_per_server = limits
        .max_waiting_per_server
        .unwrap_or(DEFAULT_MAX_WAITING_PER_SERVER);
    if max_waiting_per_server == 0 {
        return Err(invalid(
            "limits.max_waiting_per_server",
            "must be at least 1",
        ));
    }
    let shutdown_grace = limits
        .shutdown_grace_seconds
        .map_or(DEFAULT_SHUTDOWN_GRACE, Duration::from_secs);
    Ok(Limits {
        max_body_bytes,
        max_output_tokens,
        max_waiting_per_server,
        stream_ping,
        resume_window,
        rate_limit_delay,
        client_send_timeout,
        shutdown_grace,
    })
}
