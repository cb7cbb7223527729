//! `wasi:cli`'s stdout and stderr: each line a guest prints becomes a log line of its request,
//! stdout at INFO and stderr at WARN, written inside the request's span so that it carries the
//! request and trace ids. For a Python or JavaScript guest these streams are the only debugging
//! channel (a traceback, an uncaught exception).
//!
//! Bounded: a line longer than [`MAX_LINE_BYTES`] is cut there (`truncated: true`), and one
//! request writes at most [`MAX_LINES_PER_REQUEST`] lines and [`MAX_BYTES_PER_REQUEST`] bytes of
//! them; the lines past that are dropped, counted in `guest_telemetry_dropped_total{signal=
//! "output"}` and said once in a WARN line. Writing never fails and never waits, so a guest
//! that prints in a loop is neither stopped nor slowed by the host's log.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use tokio::io::AsyncWrite;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

use crate::observability::metrics::{DroppedGuestTelemetry, Metrics};
use crate::observability::request_report::RequestSpan;

/// The longest line logged; the rest of a longer line is left out.
pub const MAX_LINE_BYTES: usize = 4096;
/// Lines one request's guest may have logged, both streams together.
pub const MAX_LINES_PER_REQUEST: usize = 256;
/// Bytes of lines one request's guest may have logged, both streams together.
pub const MAX_BYTES_PER_REQUEST: usize = 64 << 10;
/// The most a guest may hand over in one write: what `check-write` grants.
const WRITE_PERMIT_BYTES: usize = 64 << 10;

/// Which of the guest's streams a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// stdout: logged at INFO.
    Stdout,
    /// stderr: logged at WARN.
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What one request's guest printed, shared by its two streams; the last line without a
/// newline is logged, and the dropped lines counted, when the instance is gone.
pub struct GuestOutput {
    printed: Arc<Mutex<Printed>>,
}

impl GuestOutput {
    /// Output logged inside `span` and counted in `metrics`; `None` for the host's own probes,
    /// whose output is dropped unlogged and uncounted.
    pub fn new(reporting: Option<(RequestSpan, Arc<Metrics>)>) -> GuestOutput {
        GuestOutput {
            printed: Arc::new(Mutex::new(Printed {
                reporting,
                lines: Lines::default(),
                logged: Logged::default(),
            })),
        }
    }

    /// The guest's `stream`, for its WASI context.
    pub fn stream(&self, stream: Stream) -> GuestStream {
        GuestStream {
            printed: Arc::clone(&self.printed),
            stream,
        }
    }
}

/// The lines of one request: where they go, the ones still open, and the bounds used.
struct Printed {
    /// Where lines are logged and drops counted; `None` drops everything.
    reporting: Option<(RequestSpan, Arc<Metrics>)>,
    lines: Lines,
    logged: Logged,
}

impl Printed {
    /// Takes `bytes` written to `stream`: every completed line is logged or dropped.
    fn take(&mut self, stream: Stream, bytes: &[u8]) {
        let Some((span, _)) = &self.reporting else {
            return;
        };
        let logged = &mut self.logged;
        self.lines.split(stream, bytes, |line, truncated| {
            logged.log(span, stream, &line, truncated)
        });
    }
}

impl Drop for Printed {
    fn drop(&mut self) {
        let Some((span, metrics)) = &self.reporting else {
            return;
        };
        for stream in [Stream::Stdout, Stream::Stderr] {
            if let Some((line, truncated)) = self.lines.rest(stream) {
                self.logged.log(span, stream, &line, truncated);
            }
        }
        if self.logged.dropped > 0 {
            metrics.observe_dropped_guest_telemetry(DroppedGuestTelemetry {
                output_lines: self.logged.dropped,
                ..DroppedGuestTelemetry::default()
            });
        }
    }
}

/// Each stream's line so far, cut at [`MAX_LINE_BYTES`].
#[derive(Default)]
struct Lines {
    /// The bytes of each stream's open line, without its newline.
    open: [Vec<u8>; 2],
    /// Whether each stream's open line lost bytes past [`MAX_LINE_BYTES`].
    truncated: [bool; 2],
}

impl Lines {
    /// Adds `bytes` to `stream`'s open line; hands `on_line` each line a newline ends (without
    /// it, or a carriage return before it) and whether it was cut.
    fn split(&mut self, stream: Stream, mut bytes: &[u8], mut on_line: impl FnMut(Vec<u8>, bool)) {
        let at = stream.index();
        while !bytes.is_empty() {
            let (piece, rest) = match bytes.iter().position(|&byte| byte == b'\n') {
                Some(newline) => (&bytes[..newline], Some(&bytes[newline + 1..])),
                None => (bytes, None),
            };
            let room = MAX_LINE_BYTES - self.open[at].len();
            self.open[at].extend_from_slice(&piece[..piece.len().min(room)]);
            self.truncated[at] |= piece.len() > room;
            let Some(rest) = rest else {
                return;
            };
            let (mut line, truncated) = self.take(at);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            on_line(line, truncated);
            bytes = rest;
        }
    }

    /// `stream`'s open line, if it has any bytes: the guest ended without its newline.
    fn rest(&mut self, stream: Stream) -> Option<(Vec<u8>, bool)> {
        let at = stream.index();
        (!self.open[at].is_empty()).then(|| self.take(at))
    }

    fn take(&mut self, at: usize) -> (Vec<u8>, bool) {
        (
            std::mem::take(&mut self.open[at]),
            std::mem::take(&mut self.truncated[at]),
        )
    }
}

/// How much of its bounds one request's output has used.
#[derive(Default)]
struct Logged {
    lines: usize,
    bytes: usize,
    dropped: u64,
}

impl Logged {
    /// Whether a line of `len` bytes still fits the request's bounds; counts it either way.
    fn admit(&mut self, len: usize) -> bool {
        if self.lines >= MAX_LINES_PER_REQUEST || self.bytes + len > MAX_BYTES_PER_REQUEST {
            self.dropped += 1;
            return false;
        }
        self.lines += 1;
        self.bytes += len;
        true
    }

    /// Logs `line` of `stream` inside `span`, if the bounds hold it; the first one dropped is
    /// said in a WARN line.
    fn log(&mut self, span: &RequestSpan, stream: Stream, line: &[u8], truncated: bool) {
        if !self.admit(line.len()) {
            if self.dropped == 1 {
                span.in_scope(|| {
                    tracing::warn!(
                        max_lines = MAX_LINES_PER_REQUEST,
                        max_bytes = MAX_BYTES_PER_REQUEST,
                        "the guest's output is past its bounds for this request: the rest is dropped"
                    )
                });
            }
            return;
        }
        let text = String::from_utf8_lossy(line);
        let name = stream.name();
        span.in_scope(|| match (stream, truncated) {
            (Stream::Stdout, false) => tracing::info!(stream = name, "{text}"),
            (Stream::Stdout, true) => tracing::info!(stream = name, truncated, "{text}"),
            (Stream::Stderr, false) => tracing::warn!(stream = name, "{text}"),
            (Stream::Stderr, true) => tracing::warn!(stream = name, truncated, "{text}"),
        });
    }
}

/// One of a guest's two output streams: every write is taken at once, whole.
#[derive(Clone)]
pub struct GuestStream {
    printed: Arc<Mutex<Printed>>,
    stream: Stream,
}

impl GuestStream {
    fn take(&self, bytes: &[u8]) {
        self.printed
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take(self.stream, bytes);
    }
}

impl IsTerminal for GuestStream {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestStream {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for GuestStream {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.take(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(WRITE_PERMIT_BYTES)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestStream {
    async fn ready(&mut self) {}
}

impl AsyncWrite for GuestStream {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.take(bytes);
        Poll::Ready(Ok(bytes.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split_all(writes: &[(Stream, &[u8])]) -> (Vec<(Stream, String, bool)>, Lines) {
        let mut lines = Lines::default();
        let mut ended = Vec::new();
        for &(stream, bytes) in writes {
            lines.split(stream, bytes, |line, truncated| {
                ended.push((stream, String::from_utf8(line).unwrap(), truncated))
            });
        }
        (ended, lines)
    }

    #[test]
    fn a_line_ends_at_its_newline_whatever_the_writes_and_each_stream_keeps_its_own() {
        let (ended, mut lines) = split_all(&[
            (Stream::Stdout, b"one\ntw"),
            (Stream::Stderr, b"err"),
            (Stream::Stdout, b"o\r\n\nthree"),
            (Stream::Stderr, b"or\n"),
        ]);
        let expected = [
            (Stream::Stdout, "one", false),
            (Stream::Stdout, "two", false),
            (Stream::Stdout, "", false),
            (Stream::Stderr, "error", false),
        ];
        let expected: Vec<_> = expected
            .into_iter()
            .map(|(stream, line, cut)| (stream, line.to_string(), cut))
            .collect();
        assert_eq!(ended, expected);
        assert_eq!(lines.rest(Stream::Stdout), Some((b"three".to_vec(), false)));
        assert_eq!(lines.rest(Stream::Stderr), None);
    }

    #[test]
    fn a_line_past_its_bound_is_cut_there_and_says_so() {
        let long = vec![b'x'; MAX_LINE_BYTES + 10];
        let (ended, _) = split_all(&[(Stream::Stderr, &long), (Stream::Stderr, b"yz\nnext\n")]);
        assert_eq!(ended.len(), 2);
        assert_eq!(ended[0].1.len(), MAX_LINE_BYTES);
        assert!(ended[0].2, "the long line is marked cut");
        assert_eq!(ended[1], (Stream::Stderr, "next".to_string(), false));
    }

    #[test]
    fn a_request_logs_at_most_its_lines_and_bytes_and_counts_the_rest() {
        let mut logged = Logged::default();
        let admitted = (0..MAX_LINES_PER_REQUEST + 5)
            .filter(|_| logged.admit(10))
            .count();
        assert_eq!(admitted, MAX_LINES_PER_REQUEST);
        assert_eq!(logged.dropped, 5);

        let mut logged = Logged::default();
        assert!(logged.admit(MAX_BYTES_PER_REQUEST - 1));
        assert!(!logged.admit(2), "past the bytes");
        assert!(logged.admit(1), "a line that still fits");
    }
}
