//! Client connections: how many may be open, how long one may take to send a request's head,
//! and how long one may sit idle between requests (`[limits]`'s client part).
//!
//! Every accepted connection takes a [`ConnectionSlot`] from [`Connections`]; past
//! `max_connections` a new one is answered `503` with `retry-after` and closed, while the
//! connections already open keep being served. Each open connection has an [`Activity`]: its
//! phase (reading a request head, busy with requests, idle) and since when. The reader
//! ([`Watched`]) moves an idle HTTP/1 connection to "reading a head" on its first byte, the
//! service moves it to "busy" when a request's head is complete and back to "idle" when the
//! last response body on it has been sent in full ([`InFlight`] dropped). [`watchdog`] ends
//! the connection when a phase outlives its timeout: a slowloris client sending half a header,
//! or one that connects and says nothing, is closed `header_read_timeout` after it began; a
//! keep-alive connection no request used for `idle_timeout` is closed. A busy connection is
//! never timed here (a long generation may be silent; the send timeout and the body read
//! timeout watch those).
//!
//! HTTP/2 connections (prior knowledge: the first bytes are its preface) read frames while
//! idle, so for them only the opening and the idle phases are timed, not a head per request;
//! their streams are capped by hyper (`max_concurrent_streams`).
//!
//! This module knows nothing of routes, doors or the pool.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many refused connections may be in the middle of their 503 at once; past it a refused
/// connection is closed without one (a flood must not turn the refusals into a cost).
const MAX_REFUSING: usize = 256;
/// How long a refused connection is given to take its 503.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);
/// The answer a connection over the cap gets.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
retry-after: 1\r\nconnection: close\r\ncontent-length: 96\r\n\r\n\
{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"too many connections, retry\"}}";
/// The HTTP/2 connection preface's first bytes.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0";

/// Why the gateway ended a client connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CloseLabels {
    /// `header_timeout`, `idle_timeout` or `refused` (over `max_connections`).
    pub reason: &'static str,
}

/// The connections' metrics.
#[derive(Clone, Debug, Default)]
pub struct ConnectionMetrics {
    /// Client connections open now.
    pub open: Gauge,
    /// Client connections the gateway ended, by reason.
    pub closed: Family<CloseLabels, Counter>,
}

/// The open client connections and their cap.
#[derive(Debug)]
pub struct Connections {
    open: AtomicUsize,
    refusing: Arc<AtomicUsize>,
    max: Option<usize>,
    metrics: ConnectionMetrics,
}

impl Connections {
    /// At most `max` open at once (`None`: no cap).
    pub fn new(max: Option<usize>, metrics: ConnectionMetrics) -> Self {
        Self {
            open: AtomicUsize::new(0),
            refusing: Arc::new(AtomicUsize::new(0)),
            max,
            metrics,
        }
    }

    /// The cap.
    pub fn max(&self) -> Option<usize> {
        self.max
    }

    /// How many are open.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A slot for a new connection, or `None` when the cap is reached.
    pub fn try_open(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let mut open = self.open.load(Ordering::Relaxed);
        loop {
            if self.max.is_some_and(|max| open >= max) {
                return None;
            }
            match self.open.compare_exchange_weak(
                open,
                open + 1,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => open = now,
            }
        }
        self.metrics.open.inc();
        Some(ConnectionSlot(self.clone()))
    }

    /// Answers a connection over the cap with a 503 and closes it, without holding the
    /// accept loop: the answer is written by a short task of its own, or not at all when
    /// many refusals are already in flight.
    pub fn refuse(&self, stream: TcpStream) {
        self.metrics
            .closed
            .get_or_create(&CloseLabels { reason: "refused" })
            .inc();
        if self.refusing.fetch_add(1, Ordering::AcqRel) >= MAX_REFUSING {
            self.refusing.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        let refusing = self.refusing.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REFUSAL_LINGER, answer_refusal(stream)).await;
            refusing.fetch_sub(1, Ordering::AcqRel);
        });
    }

    fn closed(&self, reason: &'static str) {
        self.metrics
            .closed
            .get_or_create(&CloseLabels { reason })
            .inc();
    }
}

/// Writes the 503, then reads what the client sent until it closes: closing a socket with
/// unread bytes resets it, and a reset can drop the answer before the client reads it.
async fn answer_refusal(mut stream: TcpStream) {
    use tokio::io::AsyncReadExt;
    if stream.write_all(REFUSAL).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    while let Ok(n) = stream.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
}

/// One open connection's place under the cap; dropping it frees the place.
#[derive(Debug)]
pub struct ConnectionSlot(Arc<Connections>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.metrics.open.dec();
    }
}

/// What a connection is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Opened, or began a request, and has not sent the whole head yet.
    Head = 0,
    /// One or more requests in flight.
    Busy = 1,
    /// No request in flight and no byte of the next one.
    Idle = 2,
}

#[derive(Debug)]
struct State {
    phase: Phase,
    since: Instant,
    in_flight: usize,
    /// Bumped at every change, so the watchdog can tell a phase it timed from a new one.
    epoch: u64,
}

/// One connection's phase, shared by its reader, its requests and its watchdog.
#[derive(Debug)]
pub struct Activity {
    state: Mutex<State>,
    /// The phase, readable without the lock on every read.
    phase_hint: AtomicU8,
    /// HTTP/2 (read off the first bytes): its reads do not start heads.
    http2: std::sync::atomic::AtomicBool,
    changed: Notify,
}

impl Activity {
    /// A connection just opened (reading its first head).
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                phase: Phase::Head,
                since: Instant::now(),
                in_flight: 0,
                epoch: 0,
            }),
            phase_hint: AtomicU8::new(Phase::Head as u8),
            http2: std::sync::atomic::AtomicBool::new(false),
            changed: Notify::new(),
        })
    }

    fn set(&self, state: &mut State, phase: Phase) {
        state.phase = phase;
        state.since = Instant::now();
        state.epoch += 1;
        self.phase_hint.store(phase as u8, Ordering::Relaxed);
        self.changed.notify_one();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock leaves a consistent state (every write is whole).
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A request's head arrived: the connection is busy until the returned guard drops.
    pub fn request_started(self: &Arc<Self>) -> InFlight {
        let mut state = self.lock();
        state.in_flight += 1;
        if state.phase != Phase::Busy {
            self.set(&mut state, Phase::Busy);
        }
        InFlight(self.clone())
    }

    fn request_finished(&self) {
        let mut state = self.lock();
        state.in_flight = state.in_flight.saturating_sub(1);
        if state.in_flight == 0 {
            self.set(&mut state, Phase::Idle);
        }
    }

    /// Bytes arrived: on an idle HTTP/1 connection they begin the next request's head.
    fn bytes_read(&self, first: &[u8], at_start: bool) {
        if at_start && first.starts_with(H2_PREFACE) {
            self.http2.store(true, Ordering::Relaxed);
        }
        if self.phase_hint.load(Ordering::Relaxed) != Phase::Idle as u8
            || self.http2.load(Ordering::Relaxed)
        {
            return;
        }
        let mut state = self.lock();
        if state.phase == Phase::Idle {
            self.set(&mut state, Phase::Head);
        }
    }

    fn snapshot(&self) -> (Phase, Instant, u64) {
        let state = self.lock();
        (state.phase, state.since, state.epoch)
    }

    fn epoch(&self) -> u64 {
        self.lock().epoch
    }
}

/// A request in flight on its connection; dropped when its response has gone out in full (or
/// the client went away).
#[derive(Debug)]
pub struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.request_finished();
    }
}

/// Why [`watchdog`] ended a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expired {
    /// A request head (or the first bytes) took longer than `header_read_timeout`.
    Head,
    /// No request for `idle_timeout`.
    Idle,
}

/// Resolves when the connection has spent too long reading a head or idle; never while it is
/// busy. Cancel safe: it holds nothing but a view of `activity`.
pub async fn watchdog(
    activity: &Activity,
    connections: &Connections,
    header_read_timeout: Option<Duration>,
    idle_timeout: Option<Duration>,
) -> Expired {
    loop {
        let changed = activity.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let (phase, since, epoch) = activity.snapshot();
        let limit = match phase {
            Phase::Head => header_read_timeout.map(|t| (t, Expired::Head)),
            Phase::Idle => idle_timeout.map(|t| (t, Expired::Idle)),
            Phase::Busy => None,
        };
        let Some((timeout, expired)) = limit else {
            changed.await;
            continue;
        };
        tokio::select! {
            () = tokio::time::sleep_until(since + timeout) => {
                if activity.epoch() == epoch {
                    connections.closed(match expired {
                        Expired::Head => "header_timeout",
                        Expired::Idle => "idle_timeout",
                    });
                    tracing::debug!(?expired, timeout_ms = timeout.as_millis() as u64, "connection.expired");
                    return expired;
                }
            }
            () = &mut changed => {}
        }
    }
}

/// A connection's reads, reported to its [`Activity`].
#[derive(Debug)]
pub struct Watched<T> {
    inner: T,
    activity: Arc<Activity>,
    started: bool,
}

impl<T> Watched<T> {
    /// `inner`, its reads reported to `activity`.
    pub fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self {
            inner,
            activity,
            started: false,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = result
            && buf.filled().len() > before
        {
            let at_start = !self.started;
            self.started = true;
            self.activity.bytes_read(&buf.filled()[before..], at_start);
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The soft limit on open files (`/proc/self/limits`), when it can be read.
pub fn open_files_limit() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// The connection cap when none is configured: three quarters of the open-files limit (the
/// rest for servers, Redis, policy files and logs), as HAProxy derives `maxconn`.
pub fn default_max_connections() -> usize {
    match open_files_limit() {
        Some(n) if n < u64::MAX / 4 => (n as usize / 4 * 3).max(64),
        _ => ringmaster_config::limits::FALLBACK_MAX_CONNECTIONS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connections(max: Option<usize>) -> Arc<Connections> {
        Arc::new(Connections::new(max, ConnectionMetrics::default()))
    }

    #[test]
    fn the_cap_holds_and_a_closed_connection_frees_its_place() {
        let all = connections(Some(2));
        let a = all.try_open().unwrap();
        let _b = all.try_open().unwrap();
        assert!(all.try_open().is_none());
        assert_eq!(all.open(), 2);
        drop(a);
        assert!(all.try_open().is_some());
        assert!(connections(None).try_open().is_some());
    }

    #[test]
    fn phases_follow_requests_and_bytes() {
        let activity = Activity::new();
        assert_eq!(activity.snapshot().0, Phase::Head);
        let first = activity.request_started();
        let second = activity.request_started();
        assert_eq!(activity.snapshot().0, Phase::Busy);
        drop(first);
        assert_eq!(activity.snapshot().0, Phase::Busy, "one still in flight");
        drop(second);
        assert_eq!(activity.snapshot().0, Phase::Idle);
        activity.bytes_read(b"POST /v1/mess", false);
        assert_eq!(activity.snapshot().0, Phase::Head);
    }

    #[test]
    fn http2_reads_do_not_start_heads() {
        let activity = Activity::new();
        activity.bytes_read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", true);
        drop(activity.request_started());
        activity.bytes_read(b"\x00\x00\x08\x06", false);
        assert_eq!(activity.snapshot().0, Phase::Idle);
    }

    #[tokio::test(start_paused = true)]
    async fn the_watchdog_times_heads_and_idleness_but_never_a_busy_connection() {
        let all = connections(None);
        let activity = Activity::new();
        let head = Some(Duration::from_secs(10));
        let idle = Some(Duration::from_secs(60));
        let started = Instant::now();
        assert_eq!(watchdog(&activity, &all, head, idle).await, Expired::Head);
        assert_eq!(started.elapsed(), Duration::from_secs(10));

        let activity = Activity::new();
        let busy = activity.request_started();
        let timed = tokio::time::timeout(
            Duration::from_secs(3600),
            watchdog(&activity, &all, head, idle),
        );
        assert!(timed.await.is_err(), "a busy connection is never timed");
        drop(busy);
        let started = Instant::now();
        assert_eq!(watchdog(&activity, &all, head, idle).await, Expired::Idle);
        assert_eq!(started.elapsed(), Duration::from_secs(60));
        assert!(
            tokio::time::timeout(
                Duration::from_secs(3600),
                watchdog(&activity, &all, None, None)
            )
            .await
            .is_err()
        );
    }

    #[test]
    fn the_open_files_limit_is_read() {
        assert!(open_files_limit().is_some_and(|n| n > 0));
        assert!(default_max_connections() >= 64);
    }
}
