//! A connection closed after an answer that left part of its request unread.
//!
//! Closing a socket that still holds bytes the host did not read makes the kernel reset the
//! connection instead of ending it. A client still sending the rest of a body over the limit
//! then has its write fail (a broken pipe, or a reset that can discard the answer it has not
//! read yet), and never sees the 413 it was sent. So, like a web server's lingering close, such a
//! connection first ends its own side, then reads and discards what the client still sends,
//! until the client closes, [`MAX_DRAINED_BYTES`] are discarded or [`LINGER_TIME`] has passed,
//! whichever comes first. Only then is the socket closed.
//!
//! A connection lingers only when the host marked it ([`DrainOnClose`]). Idle connections closed
//! at shutdown, which owe nothing, close at once.

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// How long a closing connection goes on discarding what its client sends, at most.
pub const LINGER_TIME: Duration = Duration::from_secs(5);
/// How many bytes a closing connection discards, at most: far above any body the limit lets
/// through, so that a client that sends one whole is answered, while one that keeps sending
/// is cut off.
pub const MAX_DRAINED_BYTES: u64 = 64 << 20;

/// Bytes read and discarded per read while draining; on the task's stack, nothing is kept.
const DRAIN_CHUNK: usize = 16 * 1024;

/// Told by the request path that the connection will close with part of a request unread.
/// Clones share the mark.
#[derive(Clone, Debug, Default)]
pub struct DrainOnClose(Arc<AtomicBool>);

impl DrainOnClose {
    /// Marks the connection: its close will drain what the client still sends.
    pub fn mark(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn is_marked(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// How long and how much a closing connection drains.
#[derive(Clone, Copy, Debug)]
pub struct Linger {
    /// The longest drain.
    pub time: Duration,
    /// The most bytes discarded.
    pub max_bytes: u64,
}

impl Default for Linger {
    fn default() -> Linger {
        Linger {
            time: LINGER_TIME,
            max_bytes: MAX_DRAINED_BYTES,
        }
    }
}

/// `inner`, whose shutdown drains the client's unsent rest first when [`DrainOnClose`] is marked.
pub struct LingeringClose<T> {
    inner: T,
    drain_on_close: DrainOnClose,
    linger: Linger,
    /// Set once the host's side is shut: the drain under way.
    draining: Option<Draining>,
}

struct Draining {
    deadline: Pin<Box<Sleep>>,
    discarded: u64,
}

impl<T> LingeringClose<T> {
    /// Wraps `inner`; `drain_on_close` is the mark the request path sets.
    pub fn new(inner: T, drain_on_close: DrainOnClose, linger: Linger) -> LingeringClose<T> {
        LingeringClose {
            inner,
            drain_on_close,
            linger,
            draining: None,
        }
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> LingeringClose<T> {
    /// Reads and discards until the client closes or errs, or a bound is reached.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(draining) = self.draining.as_mut() else {
            return Poll::Ready(());
        };
        let mut chunk = [MaybeUninit::<u8>::uninit(); DRAIN_CHUNK];
        loop {
            if draining.discarded >= self.linger.max_bytes
                || draining.deadline.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(());
            }
            let mut buf = ReadBuf::uninit(&mut chunk);
            // tokio's cooperative budget returns `Pending` now and then, so a client that sends
            // fast cannot keep this task from yielding.
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(()),
                Poll::Ready(Ok(())) => draining.discarded += buf.filled().len() as u64,
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for LingeringClose<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for LingeringClose<T> {
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
        let this = &mut *self;
        if this.draining.is_none() {
            // The answer is flushed: end the host's side, so the client reads it to its end.
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            if !this.drain_on_close.is_marked() {
                return Poll::Ready(Ok(()));
            }
            this.draining = Some(Draining {
                deadline: Box::pin(tokio::time::sleep(this.linger.time)),
                discarded: 0,
            });
        }
        this.poll_drain(cx).map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    const SHORT: Linger = Linger {
        time: Duration::from_millis(300),
        max_bytes: 1 << 20,
    };

    fn marked(inner: DuplexStream, linger: Linger) -> LingeringClose<DuplexStream> {
        let drain_on_close = DrainOnClose::default();
        drain_on_close.mark();
        LingeringClose::new(inner, drain_on_close, linger)
    }

    #[tokio::test]
    async fn a_marked_connection_takes_the_clients_whole_rest_then_closes() {
        let (host_side, mut client) = tokio::io::duplex(4096);
        let mut host_side = marked(host_side, SHORT);
        let client = tokio::spawn(async move {
            // More than the pipe holds: without the drain, this write would never finish.
            client.write_all(&[7; 100 * 1024]).await.unwrap();
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            // The client reads the host's end, and closes in turn.
        });
        host_side.shutdown().await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), client)
            .await
            .expect("the client's write or read never ended")
            .unwrap();
        assert_eq!(host_side.draining.unwrap().discarded, 100 * 1024);
    }

    #[tokio::test]
    async fn a_client_that_keeps_sending_is_cut_off_at_the_byte_bound() {
        let (host_side, mut client) = tokio::io::duplex(4096);
        let mut host_side = marked(host_side, SHORT);
        let sending =
            tokio::spawn(async move { while client.write_all(&[7; 1024]).await.is_ok() {} });
        host_side.shutdown().await.unwrap();
        let discarded = host_side.draining.as_ref().unwrap().discarded;
        assert!((SHORT.max_bytes..SHORT.max_bytes + 16 * 1024).contains(&discarded));
        drop(host_side);
        sending.await.unwrap();
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_and_stays_is_cut_off_at_the_time_bound() {
        let (host_side, _silent_client) = tokio::io::duplex(4096);
        let mut host_side = marked(host_side, SHORT);
        let started = Instant::now();
        host_side.shutdown().await.unwrap();
        let waited = started.elapsed();
        assert!(waited >= SHORT.time, "{waited:?}");
        assert!(waited < SHORT.time * 10, "{waited:?}");
    }

    #[tokio::test]
    async fn an_unmarked_connection_closes_at_once_without_reading() {
        let (host_side, mut client) = tokio::io::duplex(4096);
        client.write_all(b"unread").await.unwrap();
        let mut host_side = LingeringClose::new(host_side, DrainOnClose::default(), SHORT);
        let started = Instant::now();
        host_side.shutdown().await.unwrap();
        assert!(started.elapsed() < SHORT.time);
        assert!(host_side.draining.is_none());
    }
}
