//! A connection that gives up on a client that stops reading.
//!
//! hyper times out a request head that does not arrive, but nothing times out a response the
//! client does not read: once the socket's buffers are full, the connection (its file
//! descriptor, its place under the connection cap) would wait for ever. Here a write that makes
//! no progress for the stall time fails, and hyper closes the connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// `inner`, whose writes fail with `TimedOut` after `stall` without progress.
pub struct StallGuard<T> {
    inner: T,
    stall: Duration,
    /// Running while a write or flush waits on the client; reset by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<T> StallGuard<T> {
    /// Guards `inner` with a stall time of `stall`.
    pub fn new(inner: T, stall: Duration) -> StallGuard<T> {
        StallGuard {
            inner,
            stall,
            stalled: None,
        }
    }

    /// What a write that returned `outcome` becomes: progress resets the clock, waiting runs it.
    fn watch<R>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match outcome {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => {
                let stall = self.stall;
                let clock = self
                    .stalled
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
                match clock.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the client stopped reading",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for StallGuard<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for StallGuard<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.watch(cx, outcome)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let outcome = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.watch(cx, outcome)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch(cx, outcome)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test]
    async fn a_write_the_peer_never_reads_fails_after_the_stall_time() {
        let (writer, _reader_that_never_reads) = tokio::io::duplex(1024);
        let mut guarded = StallGuard::new(writer, Duration::from_millis(100));
        let started = std::time::Instant::now();
        let error = guarded.write_all(&[0; 64 * 1024]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_slow_but_steady_reader_is_served_in_full() {
        use tokio::io::AsyncReadExt;
        let (writer, mut reader) = tokio::io::duplex(1024);
        let mut guarded = StallGuard::new(writer, Duration::from_millis(200));
        let reading = tokio::spawn(async move {
            let mut total = 0;
            let mut buf = [0; 512];
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                match reader.read(&mut buf).await.unwrap() {
                    0 => return total,
                    n => total += n,
                }
            }
        });
        guarded.write_all(&[1; 16 * 1024]).await.unwrap();
        drop(guarded);
        assert_eq!(reading.await.unwrap(), 16 * 1024);
    }
}
