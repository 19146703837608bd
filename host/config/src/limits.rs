//! `[limits]`: what one request may be and ask (the body's size, `max_tokens`), how a stream
//! keeps alive and resumes, how a refusal and a slow client are held, the servers' queues,
//! the grace period at shutdown, and what one client connection may hold and for how long
//! ([`ClientLimits`]: the head and body read timeouts, the idle timeout, header caps, the
//! connection cap, HTTP/2 streams, and the overload bounds past which new requests are shed).
//!
//! The defaults follow what production proxies ship with (Envoy, HAProxy, nginx), each named
//! below with its anchor. Bounds that depend on the machine (open files, memory) are
//! [`Bound::Auto`] here and resolved by the gateway when it starts: this crate reads no files.

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

/// How long a connection may take to send a request head after its first byte (or after it
/// opened): HAProxy's `timeout http-request`, 10 s in its documented configurations. A
/// slowloris client (a few bytes of header every few seconds) is closed after this.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a keep-alive connection may carry no request (nginx's `keepalive_timeout` is
/// 75 s; 60 s sits under the 65-120 s that cloud load balancers keep idle connections).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request body may take to arrive whole after its head (nginx's
/// `client_body_timeout` is 60 s between reads; this is for the whole body, so a slow POST
/// trickling a byte at a time is cut off too): 16 MiB in a minute is 280 KB/s.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Largest request head, bytes (Envoy's `max_request_headers_kb` is 60 KiB).
pub const DEFAULT_MAX_HEADER_BYTES: usize = 64 * 1024;
/// Most headers in one request (Envoy's `max_headers_count` and hyper's default, 100).
pub const DEFAULT_MAX_HEADERS: usize = 100;
/// The connection cap when the open-files limit cannot be read (HAProxy derives `maxconn`
/// from `ulimit -n`; so does the gateway, keeping a quarter of the descriptors for servers,
/// Redis and files).
pub const FALLBACK_MAX_CONNECTIONS: usize = 10_000;
/// Most concurrent streams on one HTTP/2 connection (nginx's `http2_max_concurrent_streams`).
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 128;
/// Requests inside the gateway past which new ones are shed (each holds its body, a parsed
/// request and a queue slot; 10,000 is far past what a pool of servers drains in a second).
pub const DEFAULT_MAX_PENDING_REQUESTS: usize = 10_000;
/// The share of the memory the process may use (its cgroup's `memory.max`, else the
/// machine's) past which new requests are shed: Envoy's overload manager examples stop
/// accepting requests at 95 % of the heap bound; 90 % leaves room for what is in flight.
pub const DEFAULT_MEMORY_SHARE: f64 = 0.90;

/// A bound the machine decides by default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound<T> {
    /// Derived by the gateway at start (open files, memory).
    Auto,
    /// Configured.
    At(T),
    /// No bound (configured as 0).
    Off,
}

impl<T: Copy> Bound<T> {
    /// The bound, with `auto` standing for [`Bound::Auto`]; `None` when off.
    pub fn resolve(self, auto: impl FnOnce() -> T) -> Option<T> {
        match self {
            Self::Auto => Some(auto()),
            Self::At(value) => Some(value),
            Self::Off => None,
        }
    }
}

/// What one client connection may hold and for how long, and the gateway's overload bounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClientLimits {
    /// Time to send a whole request head (`None`: unbounded).
    pub header_read_timeout: Option<Duration>,
    /// Time a keep-alive connection may carry no request (`None`: unbounded).
    pub idle_timeout: Option<Duration>,
    /// Time to send a whole request body after the head (`None`: unbounded).
    pub body_read_timeout: Option<Duration>,
    /// Largest request head, bytes.
    pub max_header_bytes: usize,
    /// Most headers in one request.
    pub max_headers: usize,
    /// Most client connections open at once.
    pub max_connections: Bound<usize>,
    /// Most concurrent streams on one HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// Requests inside the gateway past which new ones are shed (`None`: unbounded).
    pub max_pending_requests: Option<usize>,
    /// Resident bytes past which new requests are shed.
    pub max_memory_bytes: Bound<u64>,
}

impl Default for ClientLimits {
    fn default() -> Self {
        Self {
            header_read_timeout: Some(DEFAULT_HEADER_READ_TIMEOUT),
            idle_timeout: Some(DEFAULT_IDLE_TIMEOUT),
            body_read_timeout: Some(DEFAULT_BODY_READ_TIMEOUT),
            max_header_bytes: DEFAULT_MAX_HEADER_BYTES,
            max_headers: DEFAULT_MAX_HEADERS,
            max_connections: Bound::Auto,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            max_pending_requests: Some(DEFAULT_MAX_PENDING_REQUESTS),
            max_memory_bytes: Bound::Auto,
        }
    }
}

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
    pub(crate) client: ClientLimits,
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
    let client = client_limits(&limits)?;
    Ok(Limits {
        client,
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

/// The client-connection part of `[limits]`.
fn client_limits(limits: &RawLimits) -> Result<ClientLimits, ConfigError> {
    let header_read_timeout = optional_ms(
        limits.header_read_timeout_ms,
        "limits.header_read_timeout_ms",
        Some(DEFAULT_HEADER_READ_TIMEOUT),
        3_600_000,
    )?;
    let idle_timeout = optional_ms(
        limits.idle_timeout_ms,
        "limits.idle_timeout_ms",
        Some(DEFAULT_IDLE_TIMEOUT),
        86_400_000,
    )?;
    let body_read_timeout = optional_ms(
        limits.body_read_timeout_ms,
        "limits.body_read_timeout_ms",
        Some(DEFAULT_BODY_READ_TIMEOUT),
        3_600_000,
    )?;
    let max_header_bytes = limits.max_header_bytes.unwrap_or(DEFAULT_MAX_HEADER_BYTES);
    // hyper's read buffer cannot be smaller than 8 KiB; a head over 1 MiB is no client's.
    if !(8192..=1024 * 1024).contains(&max_header_bytes) {
        return Err(invalid(
            "limits.max_header_bytes",
            "must be from 8192 to 1048576",
        ));
    }
    let max_headers = limits.max_headers.unwrap_or(DEFAULT_MAX_HEADERS);
    if !(8..=10_000).contains(&max_headers) {
        return Err(invalid("limits.max_headers", "must be from 8 to 10000"));
    }
    let max_connections = match limits.max_connections {
        None => Bound::Auto,
        Some(0) => Bound::Off,
        Some(n) => Bound::At(n),
    };
    let max_concurrent_streams = limits
        .max_concurrent_streams
        .unwrap_or(DEFAULT_MAX_CONCURRENT_STREAMS);
    if max_concurrent_streams == 0 {
        return Err(invalid(
            "limits.max_concurrent_streams",
            "must be at least 1",
        ));
    }
    let max_pending_requests = match limits.max_pending_requests {
        None => Some(DEFAULT_MAX_PENDING_REQUESTS),
        Some(0) => None,
        Some(n) => Some(n),
    };
    let max_memory_bytes = match limits.max_memory_mb {
        None => Bound::Auto,
        Some(0) => Bound::Off,
        Some(mb) if mb < 64 => {
            return Err(invalid(
                "limits.max_memory_mb",
                "must be at least 64 (or 0 for no bound)",
            ));
        }
        Some(mb) => Bound::At(mb.saturating_mul(1024 * 1024)),
    };
    Ok(ClientLimits {
        header_read_timeout,
        idle_timeout,
        body_read_timeout,
        max_header_bytes,
        max_headers,
        max_connections,
        max_concurrent_streams,
        max_pending_requests,
        max_memory_bytes,
    })
}
