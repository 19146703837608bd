//! `[upstream]` and `[retry]`: how the gateway talks to remote servers and when it tries
//! another one. The raw sections as written, and their conversion into the validated
//! [`UpstreamSettings`] (how the pool's client of remote servers behaves) and [`RetryPolicy`].

use std::time::Duration;

use serde::Deserialize;

/// How one server's client behaves: timeouts, limits, connection pooling and ejection.
/// `[upstream]` in the config; every value has a default fit for loopback and LAN fleets.
#[derive(Clone, Debug, PartialEq)]
pub struct UpstreamSettings {
    /// Connecting (TCP) to a server (`connect_timeout_ms`, default 2 s).
    pub connect_timeout: Duration,
    /// From sending a request to the reply's headers (`first_byte_timeout_ms`, default 10 s).
    /// A server answers a streamed request at once, so this only catches a hung server.
    pub first_byte_timeout: Duration,
    /// From the headers to the reply's first event (`first_token_timeout_ms`, default 60 s):
    /// the prefill of a long prompt, behind the server's queue.
    pub first_token_timeout: Duration,
    /// A whole (non-streamed) answer's longest wait for its headers, which come only once the
    /// whole reply is generated (`whole_answer_timeout_ms`, 10 min).
    pub whole_answer_timeout: Duration,
    /// Longest silence between two reads of a reply's body (`chunk_gap_timeout_ms`, 60 s).
    pub chunk_gap_timeout: Duration,
    /// Largest SSE line or event, and largest whole JSON answer (`max_event_bytes`, 4 MiB).
    pub max_event_bytes: usize,
    /// Idle connections kept per server (`pool_max_idle_per_server`, 1024).
    pub pool_max_idle: usize,
    /// How long an idle connection is kept (`pool_idle_timeout_ms`, 90 s).
    pub pool_idle_timeout: Duration,
    /// Speak HTTP/2 without negotiation (`http2 = true`), for servers known to serve h2c;
    /// otherwise HTTP/1.1 (cleartext has no negotiation).
    pub http2_prior_knowledge: bool,
    /// Consecutive failed requests that eject a server (`eject_after_failures`, 5; 0 = never).
    pub eject_after_failures: u32,
    /// The first ejection's length; each one after doubles it (`eject_base_ms`, 5 s).
    pub eject_base: Duration,
    /// The longest ejection (`eject_max_ms`, 5 min).
    pub eject_max: Duration,
}

impl Default for UpstreamSettings {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            first_byte_timeout: Duration::from_secs(10),
            first_token_timeout: Duration::from_secs(60),
            whole_answer_timeout: Duration::from_secs(600),
            chunk_gap_timeout: Duration::from_secs(60),
            max_event_bytes: 4 * 1024 * 1024,
            pool_max_idle: 1024,
            pool_idle_timeout: Duration::from_secs(90),
            http2_prior_knowledge: false,
            eject_after_failures: 5,
            eject_base: Duration::from_secs(5),
            eject_max: Duration::from_secs(300),
        }
    }
}

use super::error::{ConfigError, duration_ms, invalid};

/// Most attempts a request may get, the first included (`[retry] attempts`).
pub const MAX_ATTEMPTS: u32 = 10;

/// `[upstream]` as written; every key is optional.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    /// `connect_timeout_ms`.
    pub connect_timeout_ms: Option<f64>,
    /// `first_byte_timeout_ms`: to the reply's headers.
    pub first_byte_timeout_ms: Option<f64>,
    /// `first_token_timeout_ms`: to the reply's first event.
    pub first_token_timeout_ms: Option<f64>,
    /// `whole_answer_timeout_ms`: to a non-streamed answer's headers.
    pub whole_answer_timeout_ms: Option<f64>,
    /// `chunk_gap_timeout_ms`: between two reads of a reply.
    pub chunk_gap_timeout_ms: Option<f64>,
    /// `max_event_bytes`: largest SSE event or whole answer.
    pub max_event_bytes: Option<usize>,
    /// `pool_max_idle_per_server`: idle connections kept per server.
    pub pool_max_idle_per_server: Option<usize>,
    /// `pool_idle_timeout_ms`.
    pub pool_idle_timeout_ms: Option<f64>,
    /// `http2`: HTTP/2 with prior knowledge (h2c).
    pub http2: Option<bool>,
    /// `eject_after_failures`: consecutive failures that eject a server (0 = never).
    pub eject_after_failures: Option<u32>,
    /// `eject_base_ms`: the first ejection's length.
    pub eject_base_ms: Option<f64>,
    /// `eject_max_ms`: the longest ejection.
    pub eject_max_ms: Option<f64>,
}

/// `[retry]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    /// `attempts`: most servers a request is tried on, the first included (1 = no retry).
    pub attempts: Option<u32>,
    /// `deadline_ms`: no new attempt starts this long after the request arrived.
    pub deadline_ms: Option<f64>,
}

/// When a request that failed before its first token is tried on the next server.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Most attempts, the first included.
    pub attempts: u32,
    /// No attempt starts later than this after the request arrived.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            deadline: Duration::from_secs(30),
        }
    }
}

fn positive_ms(key: &str, value: Option<f64>, default: Duration) -> Result<Duration, ConfigError> {
    match value {
        None => Ok(default),
        Some(ms) if ms > 0.0 => duration_ms(key, ms),
        Some(ms) => Err(invalid(key, format!("{ms} must be more than 0 ms"))),
    }
}

/// Validates `[upstream]`.
pub fn upstream_settings(raw: RawUpstream) -> Result<UpstreamSettings, ConfigError> {
    let d = UpstreamSettings::default();
    let settings = UpstreamSettings {
        connect_timeout: positive_ms(
            "upstream.connect_timeout_ms",
            raw.connect_timeout_ms,
            d.connect_timeout,
        )?,
        first_byte_timeout: positive_ms(
            "upstream.first_byte_timeout_ms",
            raw.first_byte_timeout_ms,
            d.first_byte_timeout,
        )?,
        first_token_timeout: positive_ms(
            "upstream.first_token_timeout_ms",
            raw.first_token_timeout_ms,
            d.first_token_timeout,
        )?,
        whole_answer_timeout: positive_ms(
            "upstream.whole_answer_timeout_ms",
            raw.whole_answer_timeout_ms,
            d.whole_answer_timeout,
        )?,
        chunk_gap_timeout: positive_ms(
            "upstream.chunk_gap_timeout_ms",
            raw.chunk_gap_timeout_ms,
            d.chunk_gap_timeout,
        )?,
        max_event_bytes: raw.max_event_bytes.unwrap_or(d.max_event_bytes),
        pool_max_idle: raw.pool_max_idle_per_server.unwrap_or(d.pool_max_idle),
        pool_idle_timeout: positive_ms(
            "upstream.pool_idle_timeout_ms",
            raw.pool_idle_timeout_ms,
            d.pool_idle_timeout,
        )?,
        http2_prior_knowledge: raw.http2.unwrap_or(d.http2_prior_knowledge),
        eject_after_failures: raw.eject_after_failures.unwrap_or(d.eject_after_failures),
        eject_base: positive_ms("upstream.eject_base_ms", raw.eject_base_ms, d.eject_base)?,
        eject_max: positive_ms("upstream.eject_max_ms", raw.eject_max_ms, d.eject_max)?,
    };
    if settings.max_event_bytes < 1024 {
        return Err(invalid("upstream.max_event_bytes", "must be at least 1024"));
    }
    if settings.eject_max < settings.eject_base {
        return Err(invalid(
            "upstream.eject_max_ms",
            "must be at least eject_base_ms",
        ));
    }
    Ok(settings)
}

/// Validates `[retry]`.
pub fn retry_policy(raw: RawRetry) -> Result<RetryPolicy, ConfigError> {
    let d = RetryPolicy::default();
    let attempts = raw.attempts.unwrap_or(d.attempts);
    if !(1..=MAX_ATTEMPTS).contains(&attempts) {
        return Err(invalid(
            "retry.attempts",
            format!("{attempts}: must be between 1 (no retry) and {MAX_ATTEMPTS}"),
        ));
    }
    Ok(RetryPolicy {
        attempts,
        deadline: positive_ms("retry.deadline_ms", raw.deadline_ms, d.deadline)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_hold_and_bad_values_name_their_key() {
        assert_eq!(
            upstream_settings(RawUpstream::default()).unwrap(),
            UpstreamSettings::default()
        );
        let e = upstream_settings(RawUpstream {
            chunk_gap_timeout_ms: Some(0.0),
            ..RawUpstream::default()
        })
        .unwrap_err();
        assert!(
            e.to_string().contains("upstream.chunk_gap_timeout_ms"),
            "{e}"
        );
        let e = retry_policy(RawRetry {
            attempts: Some(0),
            ..RawRetry::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("retry.attempts"), "{e}");
        assert_eq!(retry_policy(RawRetry::default()).unwrap().attempts, 3);
    }
}
