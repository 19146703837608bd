//! The server loop both of Ringmaster's HTTP servers run (the gateway and `ringmaster
//! worker`), and what protects the gateway's front: connection limits and timeouts
//! ([`conn`]), the client send timeout ([`send_timeout`]), one connection served under them,
//! after its TLS handshake when the listener has TLS ([`http`]), load shedding under overload
//! ([`overload`]), and resumable streams, a reply's events logged for a client that reconnects
//! ([`resume`]).
//!
//! [`accept_until`] takes connections until shutdown, backing off on accept errors (out of
//! descriptors) instead of spinning; [`drain`] then gives the connections still open their
//! grace. What a connection serves (routes, doors, the engine) is the caller's: this crate
//! knows sockets, hyper's connections and counters, never a route or a request body.

#![deny(missing_docs)]

pub mod conn;
pub mod http;
pub mod overload;
pub mod resume;
pub mod send_timeout;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tracing::{info, warn};

/// How long the loop waits after a failed accept before it tries again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Accepts connections on `listener` until `shutdown` resolves, handing each (with
/// `TCP_NODELAY` set) to `serve`, which watches it with the given [`GracefulShutdown`] and
/// returns the future that runs it (spawned here), or `None` when it answered the connection
/// itself (refused at the connection limit). Returns the [`GracefulShutdown`] for [`drain`];
/// the listener is closed by then.
pub async fn accept_until<F, Fut>(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    mut serve: F,
) -> GracefulShutdown
where
    F: FnMut(TcpStream, SocketAddr, &GracefulShutdown) -> Option<Fut>,
    Fut: Future<Output = ()> + Send + 'static,
{
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of descriptors (EMFILE) or a connection reset before it was
                        // taken: wait a little instead of spinning on the error.
                        warn!(error = %e, "accept.failed");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                if let Some(connection) = serve(stream, peer, &graceful) {
                    tokio::spawn(connection);
                }
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful
}

/// Gives the connections `graceful` watches up to `grace` to finish their requests; logs
/// `{server}.drained` when they did, `{server}.grace_expired` when time ran out first.
pub async fn drain(graceful: GracefulShutdown, grace: Duration, server: &'static str) {
    info!(grace_s = grace.as_secs(), "{server}.draining");
    tokio::select! {
        () = graceful.shutdown() => info!("{server}.drained"),
        () = tokio::time::sleep(grace) => warn!("{server}.grace_expired"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn every_connection_is_served_until_shutdown_and_then_the_listener_is_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(accept_until(
            listener,
            async {
                let _ = stopped.await;
            },
            |mut stream: TcpStream, _peer, _graceful: &GracefulShutdown| {
                Some(async move {
                    let _ = stream.write_all(b"hello").await;
                })
            },
        ));
        for _ in 0..3 {
            let mut client = TcpStream::connect(addr).await.unwrap();
            let mut text = String::new();
            client.read_to_string(&mut text).await.unwrap();
            assert_eq!(text, "hello");
        }
        stop.send(()).unwrap();
        let graceful = server.await.unwrap();
        drain(graceful, Duration::from_secs(1), "test").await;
        assert!(
            TcpStream::connect(addr).await.is_err(),
            "the listener is closed"
        );
    }
}
