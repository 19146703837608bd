//! One accepted connection served over HTTP/1.1 or HTTP/2 (hyper's auto builder, set from
//! `[limits]`), under the front's protections: the TLS handshake first when the listener has a
//! certificate (within the head's read timeout, with the pair current then), the client send
//! timeout, and the watchdog that ends a connection whose head or idle time outlives its limit
//! ([`crate::conn`]). What a request gets is the caller's to say.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::Watcher;
use prometheus_client::metrics::counter::Counter;
use ringmaster_config::limits::{ClientLimits, DEFAULT_MAX_HEADERS};
use ringmaster_tls::ServerTls;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tracing::debug;

use crate::conn::{Activity, Connections, InFlight, Watched, watchdog};
use crate::send_timeout::SendTimeout;

/// How one listener's connections are served: hyper's settings, the limits, the counters, the
/// listener's TLS. Cloned for each connection.
#[derive(Clone)]
pub struct Front {
    builder: auto::Builder<TokioExecutor>,
    client: ClientLimits,
    send_timeout: Option<Duration>,
    slow_clients: Counter,
    tls_failures: Counter,
    connections: Arc<Connections>,
    tls: Option<Arc<ServerTls>>,
}

impl std::fmt::Debug for Front {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Front")
            .field("client", &self.client)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// The counters a [`Front`] keeps.
#[derive(Clone, Debug, Default)]
pub struct FrontCounters {
    /// Clients cut off for taking nothing of a reply for the send timeout.
    pub slow_clients: Counter,
    /// TLS handshakes that failed.
    pub tls_failures: Counter,
}

impl Front {
    /// A listener's front: `client`'s limits, `send_timeout` for replies, the open
    /// `connections` it counts against, and its `tls` (`None`: plain HTTP).
    pub fn new(
        client: ClientLimits,
        send_timeout: Option<Duration>,
        connections: Arc<Connections>,
        counters: FrontCounters,
        tls: Option<Arc<ServerTls>>,
    ) -> Self {
        Self {
            builder: connection_builder(&client),
            client,
            send_timeout,
            slow_clients: counters.slow_clients,
            tls_failures: counters.tls_failures,
            connections,
            tls,
        }
    }

    /// Serves `stream` (after its TLS handshake when the listener has TLS) until the client
    /// closes it, the watchdog ends it, or shutdown's grace (`watcher`) runs out; each request
    /// is `handle`d with its [`InFlight`] mark.
    pub async fn serve<F, Fut, B>(
        self,
        stream: TcpStream,
        peer: SocketAddr,
        watcher: Watcher,
        handle: F,
    ) where
        F: Fn(Request<Incoming>, InFlight) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<B>> + Send + 'static,
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let Some(tls) = self.tls.clone() else {
            self.run(stream, peer, watcher, handle).await;
            return;
        };
        let handshake = tls.accept(stream);
        let result = match self.client.header_read_timeout {
            Some(timeout) => tokio::time::timeout(timeout, handshake)
                .await
                .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into())),
            None => handshake.await,
        };
        match result {
            Ok(stream) => self.run(stream, peer, watcher, handle).await,
            Err(e) => {
                self.tls_failures.inc();
                debug!(error = %e, %peer, "connection.tls_handshake_failed");
            }
        }
    }

    async fn run<S, F, Fut, B>(self, stream: S, peer: SocketAddr, watcher: Watcher, handle: F)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        F: Fn(Request<Incoming>, InFlight) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Response<B>> + Send + 'static,
        B: hyper::body::Body + Send + 'static,
        B::Data: Send,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let activity = Activity::new();
        let requests = activity.clone();
        let handle = Arc::new(handle);
        let service = hyper::service::service_fn(move |req| {
            let in_flight = requests.request_started();
            let answer = handle(req, in_flight);
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let stream = SendTimeout::new(stream, self.send_timeout, self.slow_clients.clone());
        let stream = Watched::new(stream, activity.clone());
        let conn = self
            .builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        let conn = watcher.watch(conn);
        let watchdog = watchdog(
            &activity,
            &self.connections,
            self.client.header_read_timeout,
            self.client.idle_timeout,
        );
        // A connection the watchdog ends is dropped: its socket closes. It is reading a head
        // or idle then, so no request is cut short.
        tokio::select! {
            result = conn => if let Err(e) = result {
                debug!(error = %e, %peer, "connection.closed_with_error");
            },
            expired = watchdog => debug!(?expired, %peer, "connection.ended"),
        }
    }
}

/// hyper's connection settings from `[limits]`: the head's size and header count (431 past
/// either), HTTP/2's streams per connection and header list. The head's read timeout is the
/// connection watchdog's ([`crate::conn`]), not hyper's: hyper's would also run while a
/// keep-alive connection is idle and close it at the head timeout, not the idle one.
pub fn connection_builder(limits: &ClientLimits) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    {
        let mut http1 = builder.http1();
        http1
            .header_read_timeout(None)
            .max_buf_size(limits.max_header_bytes.max(8192));
        // hyper keeps up to 100 headers on the stack; any other count moves them to the heap.
        if limits.max_headers != DEFAULT_MAX_HEADERS {
            http1.max_headers(limits.max_headers);
        }
    }
    builder
        .http2()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    builder
}
