//! A server's HTTP/1.1 connections, each driven by the request that holds it: no task per
//! connection and no channel between the connection and its reader.
//!
//! hyper's pooled client runs every connection in a task of its own and hands the reply over
//! through channels, one body frame per turn of that task: a streamed reply of a dozen chunks
//! costs two dozen task switches on the gateway's core. Here the connection's driver
//! ([`hyper::client::conn::http1::Connection`]) is polled in the consumer's own poll, right
//! before the body, so what one socket read brought is decoded and handed out in one turn.
//! hyper still does all of HTTP/1.1 (framing, chunked encoding, keep-alive); this module only
//! decides which connection a request uses and when one goes back to the pool.
//!
//! A [`Lease`] holds one connection for one request. It goes back to the idle list only when
//! its reply was read to the end and hyper says it is ready for the next request; a lease
//! dropped before that closes its connection, which is how a server learns that a reply is
//! no longer wanted. Idle connections are checked before reuse (one poll of the driver sees a
//! close the server sent meanwhile) and pruned after `pool_idle_timeout`. HTTP/2 is not here:
//! its connections are shared by many requests, so they keep hyper's own client.
//!
//! An `https://` server's connections are the same over rustls: the handshake (SNI and the
//! name checked against the certificate) is part of opening one, within the connect timeout.
//!
//! This module must not read or judge replies (the reader does), nor count failures for the
//! server's health (the worker does).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{HOST, HeaderValue};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

/// A connection's socket: plain, or TLS over it.
type Stream = Either<TcpStream, TlsStream<TcpStream>>;
type Driver = Connection<TokioIo<Stream>, Full<Bytes>>;

/// How an `https://` server's connections do their handshake.
#[derive(Clone)]
pub(super) struct Tls {
    /// The client configuration (roots, client certificate, ALPN `http/1.1`).
    pub(super) connector: TlsConnector,
    /// The name sent as SNI and checked against the server's certificate.
    pub(super) name: ServerName<'static>,
}

/// Why a request could not be sent or answered.
#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    /// No connection could be opened.
    #[error("cannot connect to {authority}: {why}")]
    Connect {
        /// `HOST:PORT`.
        authority: String,
        /// What failed.
        why: String,
        /// Whether the connect timed out.
        timeout: bool,
    },
    /// The connection failed while sending the request or reading the reply's headers.
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// One open connection: the handle requests are sent through and the driver that does the
/// connection's reading and writing whenever it is polled.
struct Conn {
    send: SendRequest<Full<Bytes>>,
    driver: Driver,
    /// The driver finished (the connection closed or failed); it must not be polled again.
    closed: bool,
}

impl Conn {
    /// Lets the connection read and write what it can now. A closed connection is left alone.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if !self.closed && Pin::new(&mut self.driver).poll(cx).is_ready() {
            self.closed = true;
        }
    }

    /// Whether a new request can be sent on it now (driving it once first, so that a close
    /// the server sent while it was idle is seen).
    fn is_usable(&mut self, cx: &mut Context<'_>) -> bool {
        self.drive(cx);
        !self.closed && !self.send.is_closed() && self.send.is_ready()
    }
}

/// An idle connection and since when.
struct Idle {
    conn: Conn,
    since: Instant,
}

/// The HTTP/1.1 connections to one server.
pub(super) struct Http1Pool {
    authority: String,
    tls: Option<Tls>,
    host: HeaderValue,
    connect_timeout: Duration,
    max_idle: usize,
    idle_timeout: Duration,
    /// Most recently used last: the warmest connection is reused first.
    idle: Mutex<Vec<Idle>>,
    opened: AtomicU64,
}

impl std::fmt::Debug for Http1Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Http1Pool")
            .field("authority", &self.authority)
            .field("tls", &self.tls.is_some())
            .field("idle", &self.idle_count())
            .field("opened", &self.opened())
            .finish()
    }
}

impl Http1Pool {
    /// Connections to `authority` (`HOST:PORT`), over TLS when `tls` says how.
    pub(super) fn new(
        authority: &str,
        tls: Option<Tls>,
        connect_timeout: Duration,
        max_idle: usize,
        idle_timeout: Duration,
    ) -> Arc<Self> {
        Arc::new(Self {
            authority: authority.to_owned(),
            tls,
            host: HeaderValue::from_str(authority)
                .unwrap_or_else(|_| HeaderValue::from_static("invalid.invalid")),
            connect_timeout,
            max_idle,
            idle_timeout,
            idle: Mutex::new(Vec::new()),
            opened: AtomicU64::new(0),
        })
    }

    /// Connections opened so far.
    pub(super) fn opened(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    /// Connections idle now.
    pub(super) fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Sends `request` (origin-form URI; the `Host` header is set here) on a pooled connection
    /// or a new one, and returns the reply's headers with the lease whose driving reads the
    /// body. A reused connection that turns out closed before the request went out is
    /// replaced by a new one, once.
    pub(super) async fn send(
        self: &Arc<Self>,
        mut request: http::Request<Full<Bytes>>,
    ) -> Result<(http::Response<Incoming>, Lease), ConnError> {
        request.headers_mut().insert(HOST, self.host.clone());
        let (mut lease, reused) = match self.checkout().await {
            Some(lease) => (lease, true),
            None => (self.connect().await?, false),
        };
        // A retry needs the request again: keep a copy only for a reused connection (the body
        // is reference-counted bytes).
        let again = reused.then(|| clone_request(&request));
        match (lease.send_on(request).await, again) {
            (Ok(response), _) => Ok((response, lease)),
            (Err(e), Some(again)) if e.is_canceled() => {
                drop(lease);
                let mut lease = self.connect().await?;
                let response = lease.send_on(again).await?;
                Ok((response, lease))
            }
            (Err(e), _) => Err(e.into()),
        }
    }

    /// The warmest idle connection that is still usable, dropping any that expired or closed.
    async fn checkout(self: &Arc<Self>) -> Option<Lease> {
        std::future::poll_fn(|cx| {
            let now = Instant::now();
            let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
            while let Some(mut candidate) = idle.pop() {
                if now.duration_since(candidate.since) < self.idle_timeout
                    && candidate.conn.is_usable(cx)
                {
                    return Poll::Ready(Some(Lease {
                        conn: candidate.conn,
                        pool: self.clone(),
                    }));
                }
            }
            Poll::Ready(None)
        })
        .await
    }

    /// A new connection (within the connect timeout).
    async fn connect(self: &Arc<Self>) -> Result<Lease, ConnError> {
        let failed = |why: String, timeout: bool| ConnError::Connect {
            authority: self.authority.clone(),
            why,
            timeout,
        };
        let open = async {
            let tcp = TcpStream::connect(self.authority.as_str())
                .await
                .map_err(|e| e.to_string())?;
            // Small writes (a request, a reply's chunks) go out at once.
            let _ = tcp.set_nodelay(true);
            match &self.tls {
                None => Ok(Either::Left(tcp)),
                Some(tls) => tls
                    .connector
                    .connect(tls.name.clone(), tcp)
                    .await
                    .map(Either::Right)
                    .map_err(|e| {
                        // Said once, whether or not rustls said why.
                        let text = super::error_chain(&e);
                        if text.starts_with(super::TLS_FAILED) {
                            text
                        } else {
                            format!("{}{text}", super::TLS_FAILED)
                        }
                    }),
            }
        };
        let stream = tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|_| {
                failed(
                    format!("no connection within {:?}", self.connect_timeout),
                    true,
                )
            })?
            .map_err(|why| failed(why, false))?;
        let (send, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| failed(super::error_chain(&e), false))?;
        self.opened.fetch_add(1, Ordering::Relaxed);
        Ok(Lease {
            conn: Conn {
                send,
                driver,
                closed: false,
            },
            pool: self.clone(),
        })
    }

    /// Takes a connection back, if there is room and it can carry another request.
    fn put_back(&self, mut conn: Conn) {
        let mut cx = Context::from_waker(Waker::noop());
        if !conn.is_usable(&mut cx) {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        if idle.len() < self.max_idle {
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }

    /// Closes idle connections that expired or that the server closed (called from the
    /// server's background poll, so that idle sockets do not linger half-closed).
    pub(super) fn prune(&self) {
        let now = Instant::now();
        let mut cx = Context::from_waker(Waker::noop());
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain_mut(|entry| {
            now.duration_since(entry.since) < self.idle_timeout && entry.conn.is_usable(&mut cx)
        });
    }
}

/// One connection, held by one request until its reply is read. Dropped, it closes the
/// connection; [`Lease::finished`] gives it back instead.
pub(super) struct Lease {
    conn: Conn,
    pool: Arc<Http1Pool>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("authority", &self.pool.authority)
            .field("closed", &self.conn.closed)
            .finish()
    }
}

impl Lease {
    /// Lets the connection read and write what it can: call it before polling the reply's
    /// body, in the same poll, so that the body finds what the socket had.
    pub(super) fn drive(&mut self, cx: &mut Context<'_>) {
        self.conn.drive(cx);
    }

    /// The reply's body was read to its end: the connection goes back to the pool now.
    pub(super) fn finished(self) {
        let Self { conn, pool } = self;
        pool.put_back(conn);
    }

    /// Sends `request` and waits for the reply's headers, driving the connection meanwhile.
    async fn send_on(
        &mut self,
        request: http::Request<Full<Bytes>>,
    ) -> Result<http::Response<Incoming>, hyper::Error> {
        let conn = &mut self.conn;
        let mut response = std::pin::pin!(conn.send.send_request(request));
        std::future::poll_fn(|cx| {
            conn.drive(cx);
            response.as_mut().poll(cx)
        })
        .await
    }
}

/// A copy of a request to send again (method, URI, headers and the shared body bytes).
fn clone_request(request: &http::Request<Full<Bytes>>) -> http::Request<Full<Bytes>> {
    let mut copy = http::Request::new(request.body().clone());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.headers_mut() = request.headers().clone();
    copy
}

/// The body's next data (trailers are skipped), driving `lease` before each read; `None` at
/// its end.
///
/// Cancel safety: cancel-safe; a frame is never lost if the future is dropped.
pub(super) async fn next_data(
    body: &mut Incoming,
    lease: Option<&mut Lease>,
) -> Option<Result<Bytes, hyper::Error>> {
    use hyper::body::Body;
    let mut lease = lease;
    std::future::poll_fn(|cx| {
        loop {
            if let Some(lease) = lease.as_deref_mut() {
                lease.drive(cx);
            }
            match std::task::ready!(Pin::new(&mut *body).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Poll::Ready(Some(Ok(data)));
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => return Poll::Ready(None),
            }
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server that answers every request on a connection with `reply`, counting the
    /// connections it accepted; with `close_after`, it closes each connection after that
    /// many replies.
    async fn server(
        reply: &'static [u8],
        close_after: Option<usize>,
    ) -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buffer = vec![0u8; 64 * 1024];
                    let mut seen = Vec::new();
                    let mut answered = 0;
                    loop {
                        let n = match socket.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        seen.extend_from_slice(&buffer[..n]);
                        // One request per blank line (the test requests have no body).
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            if socket.write_all(reply).await.is_err() {
                                return;
                            }
                            answered += 1;
                            if close_after == Some(answered) {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (authority, accepted)
    }

    fn get() -> http::Request<Full<Bytes>> {
        http::Request::get("/x").body(Full::default()).unwrap()
    }

    async fn read_all(pool: &Arc<Http1Pool>) -> Vec<u8> {
        let (response, mut lease) = pool.send(get()).await.unwrap();
        let mut body = response.into_body();
        let mut bytes = Vec::new();
        while let Some(chunk) = next_data(&mut body, Some(&mut lease)).await {
            bytes.extend_from_slice(&chunk.unwrap());
        }
        lease.finished();
        bytes
    }

    const CHUNKED: &[u8] =
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";

    #[tokio::test]
    async fn sequential_requests_reuse_one_connection() {
        let (authority, accepted) = server(CHUNKED, None).await;
        let pool = Http1Pool::new(
            &authority,
            None,
            Duration::from_secs(1),
            8,
            Duration::from_secs(60),
        );
        for _ in 0..20 {
            assert_eq!(read_all(&pool).await, b"abcde");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
        assert_eq!(pool.opened(), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_reply_dropped_before_its_end_closes_its_connection() {
        let (authority, accepted) = server(CHUNKED, None).await;
        let pool = Http1Pool::new(
            &authority,
            None,
            Duration::from_secs(1),
            8,
            Duration::from_secs(60),
        );
        let (response, lease) = pool.send(get()).await.unwrap();
        drop((response, lease));
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(read_all(&pool).await, b"abcde");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_the_server_closed_while_idle_is_replaced() {
        let (authority, accepted) = server(CHUNKED, Some(1)).await;
        let pool = Http1Pool::new(
            &authority,
            None,
            Duration::from_secs(1),
            8,
            Duration::from_secs(60),
        );
        for _ in 0..5 {
            assert_eq!(read_all(&pool).await, b"abcde");
            // Let the server's close arrive.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
        pool.prune();
        assert_eq!(pool.idle_count(), 0, "closed connections are pruned");
    }

    #[tokio::test]
    async fn idle_connections_expire() {
        let (authority, _) = server(CHUNKED, None).await;
        let pool = Http1Pool::new(
            &authority,
            None,
            Duration::from_secs(1),
            8,
            Duration::from_millis(50),
        );
        read_all(&pool).await;
        assert_eq!(pool.idle_count(), 1);
        tokio::time::sleep(Duration::from_millis(80)).await;
        pool.prune();
        assert_eq!(pool.idle_count(), 0);
        read_all(&pool).await;
        assert_eq!(pool.opened(), 2);
    }

    #[tokio::test]
    async fn no_more_idle_connections_than_allowed() {
        let (authority, _) = server(CHUNKED, None).await;
        let pool = Http1Pool::new(
            &authority,
            None,
            Duration::from_secs(1),
            2,
            Duration::from_secs(60),
        );
        let mut held = Vec::new();
        for _ in 0..4 {
            let (response, mut lease) = pool.send(get()).await.unwrap();
            let mut body = response.into_body();
            while next_data(&mut body, Some(&mut lease)).await.is_some() {}
            held.push(lease);
        }
        assert_eq!(pool.opened(), 4);
        for lease in held {
            lease.finished();
        }
        assert_eq!(pool.idle_count(), 2);
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let authority = listener.local_addr().unwrap().to_string();
        drop(listener);
        let pool = Http1Pool::new(
            &authority,
            None,
            Duration::from_secs(1),
            2,
            Duration::from_secs(60),
        );
        let err = pool.send(get()).await.unwrap_err();
        assert!(
            matches!(err, ConnError::Connect { timeout: false, .. }),
            "{err}"
        );
    }
}
