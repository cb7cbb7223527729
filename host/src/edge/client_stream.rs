//! The socket of one client's connection, and what the host asks of it beyond reading and
//! writing.
//!
//! - **Write stalls.** Nothing in hyper times out a response the client does not read. Once a
//!   write finds the socket full, the client must take [`MIN_RESPONSE_RATE`] bytes a second
//!   (Kestrel's minimum response data rate) over the stall time, or the connection is closed.
//! - **Lingering close.** A socket closed with unread bytes is reset, and a client still sending
//!   an over-limit body would lose the 413 it was sent. A connection the request path marked
//!   ([`DrainOnClose`]) ends its own side first, then discards what the client sends, within
//!   [`LINGER_IDLE`], [`MAX_DRAINED_BYTES`] and [`LINGER_TIME`].
//! - **hyper's own answers.** A request hyper cannot parse gets hyper's bare head. When that is
//!   the first thing written on the connection, it goes out in the contract's form, with a
//!   request id and a JSON error body ([`responses::contract_form_of_hypers_own_answer`]).

use std::future::Future;
use std::io;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::edge::responses;

/// How long a closing connection waits for the client's next bytes.
pub const LINGER_IDLE: Duration = Duration::from_secs(5);
/// How long a closing connection goes on discarding what its client sends, at most: a client
/// sending at 10 Mbit/s gets 35 MiB through.
pub const LINGER_TIME: Duration = Duration::from_secs(30);
/// How many bytes beyond the body limit a closing connection discards, at most: a body over
/// the limit by less than this, sent whole, gets its answer read.
pub const MAX_DRAINED_BYTES: u64 = 64 << 20;

/// The fewest bytes a second a client whose socket is full must take of a response, over the
/// stall time: Kestrel's `MinResponseDataRate`.
pub const MIN_RESPONSE_RATE: u64 = 240;

/// Bytes read and discarded per read while draining; on the task's stack, nothing is kept.
const DRAIN_CHUNK: usize = 16 * 1024;
/// The longest write looked at as one of hyper's own answers: those are heads of a few lines.
const MAX_OWN_ANSWER_BYTES: usize = 512;

/// Set by the request path when the connection will close with part of a request unread.
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
    /// The longest wait for the client's next bytes.
    pub idle: Duration,
    /// The longest drain.
    pub total: Duration,
    /// The most bytes discarded.
    pub max_bytes: u64,
}

impl Linger {
    /// The bounds of a host whose request bodies may be `max_body_bytes` long.
    pub fn for_body_limit(max_body_bytes: usize) -> Linger {
        Linger {
            idle: LINGER_IDLE,
            total: LINGER_TIME,
            max_bytes: (max_body_bytes as u64).saturating_add(MAX_DRAINED_BYTES),
        }
    }
}

/// A client's socket `inner`, whose writes fail with `TimedOut` after a stall, and whose shutdown
/// drains the client's unsent rest first when [`DrainOnClose`] is marked.
pub struct ClientStream<T> {
    inner: T,
    /// How long a write may make no progress.
    write_stall: Duration,
    /// Started by a write that could not proceed, dropped once the client has taken enough.
    stalled: Option<Stall>,
    drain_on_close: DrainOnClose,
    linger: Linger,
    /// Set once the host's side is shut: the drain under way.
    draining: Option<Draining>,
    /// One of hyper's own answers being written in the contract's form instead.
    rewriting: Option<Rewriting>,
    /// Whether anything was written on the connection yet.
    wrote_any: bool,
    /// Set when a write stall closes the connection, for the response body it cut to say so.
    stall_mark: Option<Arc<AtomicBool>>,
}

/// A socket found full: the client must take `needed` bytes before `clock` runs out.
struct Stall {
    clock: Pin<Box<Sleep>>,
    taken: u64,
    needed: u64,
}

struct Rewriting {
    /// What is written instead.
    bytes: Vec<u8>,
    /// How much of it is written.
    written: usize,
    /// How many of hyper's bytes it stands for: the count hyper is told once it is all written.
    replaces: usize,
}

struct Draining {
    /// The end of the whole drain.
    deadline: Pin<Box<Sleep>>,
    /// The end of the wait for the client's next bytes, moved on by each read.
    idle: Pin<Box<Sleep>>,
    discarded: u64,
}

impl<T> ClientStream<T> {
    /// Wraps `inner`: a write fails after `write_stall` without progress; `drain_on_close` is
    /// the mark the request path sets, `linger` the bounds of the drain it asks for.
    pub fn new(
        inner: T,
        write_stall: Duration,
        drain_on_close: DrainOnClose,
        linger: Linger,
    ) -> ClientStream<T> {
        ClientStream {
            inner,
            write_stall,
            stalled: None,
            drain_on_close,
            linger,
            draining: None,
            rewriting: None,
            wrote_any: false,
            stall_mark: None,
        }
    }

    /// The same stream, setting `mark` when a write stall closes it.
    pub fn marking_stalls(self, mark: Arc<AtomicBool>) -> ClientStream<T> {
        ClientStream {
            stall_mark: Some(mark),
            ..self
        }
    }

    /// Passes on the `outcome` of a write of `offered` bytes (a flush offers none); once a write
    /// has found the socket full, one still pending when the stall time is over, the client
    /// having taken less than its minimum rate since, fails instead.
    fn watch_stall<R: Taken>(
        &mut self,
        cx: &mut Context<'_>,
        outcome: Poll<io::Result<R>>,
        offered: usize,
    ) -> Poll<io::Result<R>> {
        match outcome {
            Poll::Ready(result) => {
                if let (Some(stall), Ok(taken)) = (self.stalled.as_mut(), &result) {
                    stall.taken += taken.bytes() as u64;
                    // Taken whole, the write found room: the socket is full no more.
                    let room = offered > 0 && taken.bytes() == offered;
                    if room || stall.taken >= stall.needed {
                        self.stalled = None;
                    }
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                let write_stall = self.write_stall;
                let stall = self.stalled.get_or_insert_with(|| Stall {
                    clock: Box::pin(tokio::time::sleep(write_stall)),
                    taken: 0,
                    needed: (MIN_RESPONSE_RATE * write_stall.as_millis() as u64 / 1000).max(1),
                });
                match stall.clock.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        if let Some(mark) = &self.stall_mark {
                            mark.store(true, Ordering::Relaxed);
                        }
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the client stopped reading",
                        )))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

/// What a finished write or flush gave the client, in bytes.
trait Taken {
    fn bytes(&self) -> usize;
}

impl Taken for usize {
    fn bytes(&self) -> usize {
        *self
    }
}

impl Taken for () {
    fn bytes(&self) -> usize {
        0
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> ClientStream<T> {
    /// Starts writing the contract's form of the write `parts` instead, when they are one of
    /// hyper's own answers and the first bytes of the connection (checked only for short
    /// writes that look like a whole head).
    fn rewrite_if_hypers_own<B: std::ops::Deref<Target = [u8]>>(&mut self, parts: &[B]) {
        // Every write after the first one ends here, before a byte is looked at.
        if self.wrote_any || self.rewriting.is_some() {
            return;
        }
        let total: usize = parts.iter().map(|part| part.len()).sum();
        let looks_like_a_head = total <= MAX_OWN_ANSWER_BYTES
            && parts
                .first()
                .is_some_and(|first| first.starts_with(b"HTTP/1."))
            && parts.last().is_some_and(|last| last.ends_with(b"\r\n\r\n"));
        if !looks_like_a_head {
            return;
        }
        let whole: Vec<u8> = parts.iter().flat_map(|part| part.iter().copied()).collect();
        if let Some(answer) = responses::contract_form_of_hypers_own_answer(&whole) {
            tracing::warn!(
                status = answer.status,
                request_id = answer.request_id.as_str(),
                error = answer.message,
                "request refused"
            );
            self.rewriting = Some(Rewriting {
                bytes: answer.bytes,
                written: 0,
                replaces: total,
            });
        }
    }

    /// Writes the rest of the answer being rewritten in place of a write of `offered` bytes;
    /// ready with the count of hyper's bytes it stands for once all of it is written.
    fn poll_rewriting(&mut self, cx: &mut Context<'_>, offered: usize) -> Poll<io::Result<usize>> {
        loop {
            let Some(rewriting) = self.rewriting.as_mut() else {
                return Poll::Ready(Ok(0));
            };
            // hyper offers the same bytes again after a pending write; fewer are not what is
            // being replaced.
            if offered < rewriting.replaces {
                self.rewriting = None;
                return Poll::Ready(Err(io::ErrorKind::InvalidInput.into()));
            }
            if rewriting.written == rewriting.bytes.len() {
                let replaces = rewriting.replaces;
                self.rewriting = None;
                self.wrote_any = true;
                return Poll::Ready(Ok(replaces));
            }
            let rest = &rewriting.bytes[rewriting.written..];
            let offered = rest.len();
            let outcome = Pin::new(&mut self.inner).poll_write(cx, rest);
            match std::task::ready!(self.watch_stall(cx, outcome, offered)) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(written) => {
                    if let Some(rewriting) = self.rewriting.as_mut() {
                        rewriting.written += written;
                    }
                }
                Err(error) => {
                    self.rewriting = None;
                    return Poll::Ready(Err(error));
                }
            }
        }
    }

    /// Reads and discards until the client closes or errs, or a bound is reached.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(draining) = self.draining.as_mut() else {
            return Poll::Ready(());
        };
        let mut chunk = [MaybeUninit::<u8>::uninit(); DRAIN_CHUNK];
        loop {
            if draining.discarded >= self.linger.max_bytes
                || draining.deadline.as_mut().poll(cx).is_ready()
                || draining.idle.as_mut().poll(cx).is_ready()
            {
                return Poll::Ready(());
            }
            let mut buf = ReadBuf::uninit(&mut chunk);
            // tokio's cooperative budget returns `Pending` now and then, so a client that sends
            // fast cannot keep this task from yielding.
            match Pin::new(&mut self.inner).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(()),
                Poll::Ready(Ok(())) => {
                    draining.discarded += buf.filled().len() as u64;
                    draining
                        .idle
                        .as_mut()
                        .reset(Instant::now() + self.linger.idle);
                }
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ClientStream<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for ClientStream<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.rewrite_if_hypers_own(&[buf]);
        if self.rewriting.is_some() {
            return self.poll_rewriting(cx, buf.len());
        }
        let outcome = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote_any |= matches!(outcome, Poll::Ready(Ok(written)) if written > 0);
        self.watch_stall(cx, outcome, buf.len())
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.rewrite_if_hypers_own(bufs);
        if self.rewriting.is_some() {
            let offered = bufs.iter().map(|part| part.len()).sum();
            return self.poll_rewriting(cx, offered);
        }
        let outcome = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote_any |= matches!(outcome, Poll::Ready(Ok(written)) if written > 0);
        let offered = bufs.iter().map(|part| part.len()).sum();
        self.watch_stall(cx, outcome, offered)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let outcome = Pin::new(&mut self.inner).poll_flush(cx);
        self.watch_stall(cx, outcome, 0)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.draining.is_none() {
            // The answer is flushed: end the host's side first, so the client reads it to its
            // end while the drain runs.
            std::task::ready!(Pin::new(&mut this.inner).poll_shutdown(cx))?;
            if !this.drain_on_close.is_marked() {
                return Poll::Ready(Ok(()));
            }
            this.draining = Some(Draining {
                deadline: Box::pin(tokio::time::sleep(this.linger.total)),
                idle: Box::pin(tokio::time::sleep(this.linger.idle)),
                discarded: 0,
            });
        }
        this.poll_drain(cx).map(Ok)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
    use tokio::time::timeout;

    use super::*;

    // The tests run on tokio's paused clock: time moves only when every task waits, so the
    // bounds are met exactly, however loaded the machine.
    const SHORT: Linger = Linger {
        idle: Duration::from_secs(1),
        total: Duration::from_secs(4),
        max_bytes: 1 << 20,
    };
    /// Far past every bound: a drain still running then never ends.
    const NEVER: Duration = Duration::from_secs(600);

    fn marked(inner: DuplexStream) -> ClientStream<DuplexStream> {
        let drain_on_close = DrainOnClose::default();
        drain_on_close.mark();
        ClientStream::new(inner, NEVER, drain_on_close, SHORT)
    }

    #[tokio::test]
    async fn hypers_bare_error_head_goes_out_in_the_contracts_form_and_counts_as_written() {
        let (host_side, mut client_side) = tokio::io::duplex(64 * 1024);
        let mut connection = ClientStream::new(host_side, NEVER, DrainOnClose::default(), SHORT);
        let bare = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        let slices = [io::IoSlice::new(&bare[..20]), io::IoSlice::new(&bare[20..])];
        let written = connection.write_vectored(&slices).await.unwrap();
        assert_eq!(written, bare.len(), "hyper is told its bytes were written");
        connection.write_all(b"HTTP/1.1 200 OK\r\n").await.unwrap();
        // Once anything was written, the same bytes may be a guest's body: they pass unchanged.
        connection.write_all(bare).await.unwrap();
        drop(connection);
        let mut received = String::new();
        client_side.read_to_string(&mut received).await.unwrap();
        let (rewritten, passed_on) = received.split_once("}").unwrap();
        assert!(
            rewritten.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{received}"
        );
        assert!(
            rewritten.ends_with(r#"{"error":"Malformed request""#),
            "{received}"
        );
        assert!(rewritten.contains("\r\nx-request-id: "), "{received}");
        // What is not one of hyper's own answers passes unchanged.
        assert_eq!(
            passed_on.as_bytes(),
            [&b"HTTP/1.1 200 OK\r\n"[..], bare].concat()
        );
    }

    fn discarded(connection: &ClientStream<DuplexStream>) -> u64 {
        connection
            .draining
            .as_ref()
            .map_or(0, |draining| draining.discarded)
    }

    #[tokio::test(start_paused = true)]
    async fn a_marked_connection_ends_its_side_first_then_takes_the_clients_whole_rest() {
        let (host_side, mut client) = tokio::io::duplex(4096);
        let mut host_side = marked(host_side);
        let started = Instant::now();
        let client = tokio::spawn(async move {
            // More than the pipe holds: without the drain, this write would never finish.
            client.write_all(&[7; 100 * 1024]).await.unwrap();
            let mut answer = Vec::new();
            client.read_to_end(&mut answer).await.unwrap();
            // The client read the host's end, and closes in turn.
        });
        timeout(NEVER, host_side.shutdown()).await.unwrap().unwrap();
        timeout(NEVER, client).await.unwrap().unwrap();
        assert_eq!(discarded(&host_side), 100 * 1024);
        // Had the host drained before ending its side, the client would have read its end
        // only once the drain gave up.
        assert!(started.elapsed() < SHORT.idle, "{:?}", started.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_keeps_sending_is_cut_off_at_the_byte_bound() {
        let (host_side, mut client) = tokio::io::duplex(4096);
        let mut host_side = marked(host_side);
        let sending =
            tokio::spawn(async move { while client.write_all(&[7; 1024]).await.is_ok() {} });
        timeout(NEVER, host_side.shutdown()).await.unwrap().unwrap();
        let discarded = discarded(&host_side);
        assert!(
            (SHORT.max_bytes..SHORT.max_bytes + DRAIN_CHUNK as u64).contains(&discarded),
            "{discarded}"
        );
        drop(host_side);
        sending.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_sends_nothing_and_stays_is_cut_off_once_idle() {
        let (host_side, _silent_client) = tokio::io::duplex(4096);
        let mut host_side = marked(host_side);
        let started = Instant::now();
        timeout(NEVER, host_side.shutdown()).await.unwrap().unwrap();
        assert_eq!(started.elapsed(), SHORT.idle);
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_trickles_is_cut_off_at_the_time_bound() {
        let (host_side, mut client) = tokio::io::duplex(4096);
        let mut host_side = marked(host_side);
        let trickling = tokio::spawn(async move {
            loop {
                tokio::time::sleep(SHORT.idle / 2).await;
                if client.write_all(b"x").await.is_err() {
                    return;
                }
            }
        });
        let started = Instant::now();
        timeout(NEVER, host_side.shutdown()).await.unwrap().unwrap();
        assert_eq!(started.elapsed(), SHORT.total);
        assert!(discarded(&host_side) >= 7, "{}", discarded(&host_side));
        drop(host_side);
        trickling.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_unmarked_connection_closes_at_once_without_reading() {
        let (host_side, mut client) = tokio::io::duplex(4096);
        client.write_all(b"unread").await.unwrap();
        let mut host_side = unmarked(host_side, NEVER);
        let started = Instant::now();
        timeout(NEVER, host_side.shutdown()).await.unwrap().unwrap();
        assert_eq!(started.elapsed(), Duration::ZERO);
        assert!(host_side.draining.is_none());
    }

    #[test]
    fn the_byte_bound_is_beyond_the_body_limit() {
        let linger = Linger::for_body_limit(10 << 20);
        assert_eq!(linger.max_bytes, (10 << 20) + MAX_DRAINED_BYTES);
        assert_eq!(Linger::for_body_limit(usize::MAX).max_bytes, u64::MAX);
    }

    /// `inner` with a write stall of `write_stall`, never marked to drain.
    fn unmarked(inner: DuplexStream, write_stall: Duration) -> ClientStream<DuplexStream> {
        ClientStream::new(inner, write_stall, DrainOnClose::default(), SHORT)
    }

    #[tokio::test]
    async fn a_write_the_peer_never_reads_fails_after_the_stall_time() {
        let (writer, _reader_that_never_reads) = tokio::io::duplex(1024);
        let mut guarded = unmarked(writer, Duration::from_millis(100));
        let started = std::time::Instant::now();
        let error = guarded.write_all(&[0; 64 * 1024]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_reader_that_takes_less_than_the_minimum_rate_fails_after_the_stall_time() {
        let (writer, mut reader) = tokio::io::duplex(1024);
        // 240 bytes owed in the second; 16 every 200 ms is 80.
        let mut guarded = unmarked(writer, Duration::from_secs(1));
        let trickling = tokio::spawn(async move {
            let mut buf = [0; 16];
            while reader.read(&mut buf).await.is_ok_and(|read| read > 0) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        let started = std::time::Instant::now();
        let error = guarded.write_all(&[0; 64 * 1024]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() < Duration::from_secs(3));
        trickling.abort();
    }

    #[tokio::test]
    async fn a_slow_but_steady_reader_is_served_in_full() {
        let (writer, mut reader) = tokio::io::duplex(1024);
        let mut guarded = unmarked(writer, Duration::from_millis(200));
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
