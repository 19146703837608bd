//! A client connection with a send timeout (nginx's `send_timeout`): a client that accepts
//! nothing of what the gateway writes for `[limits] client_send_timeout_ms` is cut off.
//!
//! A streamed reply needs no buffer of its own: hyper holds at most its write buffer, stops
//! asking the reply for more while that is full, and the reply stops reading its server (or
//! the engine's events wait in its stream). What it cannot tell is a slow client from a gone
//! one that never closed: this wrapper can, because a write that stays `Pending` for the whole
//! timeout means the client took nothing. The write then fails, hyper closes the connection,
//! the reply is dropped, and the generation is cancelled on its server. Idle keep-alive
//! connections write nothing and are never timed. This module must not know about requests.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// `inner` with its writes timed.
#[derive(Debug)]
pub struct SendTimeout<T> {
    inner: T,
    /// `None`: writes are not timed.
    timeout: Option<Duration>,
    /// Armed when a write found the client's window full; created on the first such write.
    stall: Option<Pin<Box<Sleep>>>,
    armed: bool,
    /// Counts the connections cut off.
    cut_off: Counter,
}

impl<T> SendTimeout<T> {
    /// `inner`, cut off once a write makes no progress for `timeout` (`None`: never).
    pub fn new(inner: T, timeout: Option<Duration>, cut_off: Counter) -> Self {
        Self {
            inner,
            timeout,
            stall: None,
            armed: false,
            cut_off,
        }
    }

    /// What a write that returned `result` means: progress disarms the timer; no progress
    /// arms it (once) and fails the write when it has run out.
    fn timed<R>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        let Some(timeout) = self.timeout else {
            return result;
        };
        if result.is_ready() {
            self.armed = false;
            return result;
        }
        let deadline = Instant::now() + timeout;
        let stall = self
            .stall
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            stall.as_mut().reset(deadline);
            self.armed = true;
        }
        if stall.as_mut().poll(cx).is_ready() {
            self.cut_off.inc();
            tracing::debug!(timeout_ms = timeout.as_millis() as u64, "client.too_slow");
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client accepted nothing for {timeout:?}"),
            )));
        }
        Poll::Pending
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for SendTimeout<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for SendTimeout<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.timed(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.timed(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.inner).poll_flush(cx);
        this.timed(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_reader_that_reads_is_never_cut_off_and_one_that_stops_is() {
        // A small pipe: the writer blocks as soon as the reader stops reading.
        let (client, server) = tokio::io::duplex(1024);
        let cut_off = Counter::default();
        let mut writer =
            SendTimeout::new(server, Some(Duration::from_millis(100)), cut_off.clone());
        let mut reader = client;
        let reading = tokio::spawn(async move {
            let mut buf = vec![0u8; 512];
            let mut total = 0;
            // Reads slowly but steadily for a while, then stops for good.
            while total < 16 * 1024 {
                tokio::time::sleep(Duration::from_millis(5)).await;
                total += reader.read(&mut buf).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(reader);
        });
        let chunk = vec![b'x'; 256];
        let mut written = 0usize;
        let err = loop {
            match writer.write_all(&chunk).await {
                Ok(()) => written += chunk.len(),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            written >= 16 * 1024,
            "a slow but steady reader kept up: {written}"
        );
        assert_eq!(cut_off.get(), 1);
        reading.abort();
    }
}
