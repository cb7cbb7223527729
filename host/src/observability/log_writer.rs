//! The log lines' way out: appended to one bounded buffer in memory, and written to stdout and
//! the log file by one thread, in batches.
//!
//! Why not a `tracing_appender::non_blocking` writer per target: each line then goes through a
//! channel to a thread that wakes for it, writes it with a system call of its own and sleeps
//! again; under load that was two wake-ups and two writes for each request's line, a visible
//! share of the host's CPU (bench/PROFILE.md). Here the first line into an empty buffer wakes
//! the writer, which lets the burst gather for [`LINGER`] and then writes all of it at once, to
//! each target in turn.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// Bytes of log lines waiting to be written, at most: past it a line is dropped and counted
/// (about 40,000 request lines, two seconds of the host's full load), so a stalled disk or a
/// stdout nobody reads costs memory only up to here.
pub const MAX_PENDING_BYTES: usize = 16 << 20;

/// How long the writer lets lines gather once the first of a batch came: the most a line waits
/// to be written, beside the write itself.
pub const LINGER: Duration = Duration::from_millis(2);

/// Capacity the writer's batch buffer keeps between batches; a larger one, left by a burst, is
/// given back.
const KEPT_BATCH_CAPACITY: usize = 1 << 20;

/// Where the log layer writes: each line is appended to the pending buffer, whole, or dropped
/// whole when the buffer is full.
pub struct LogWriter {
    shared: Arc<Shared>,
}

/// Owns the writer thread: dropping it writes what is pending and stops the thread.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogWriterGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    pending: Mutex<Pending>,
    /// Signalled when a line lands in an empty buffer, and at close.
    ready: Condvar,
    max_pending: usize,
    /// Lines dropped since the writer started.
    dropped_total: AtomicU64,
}

struct Pending {
    lines: Vec<u8>,
    /// Lines dropped since the writer last said so.
    dropped: u64,
    closing: bool,
}

/// Starts the writer thread for `targets`, with at most `max_pending` bytes waiting.
pub fn start(
    targets: Vec<Box<dyn Write + Send>>,
    max_pending: usize,
) -> io::Result<(LogWriter, LogWriterGuard)> {
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending {
            lines: Vec::new(),
            dropped: 0,
            closing: false,
        }),
        ready: Condvar::new(),
        max_pending,
        dropped_total: AtomicU64::new(0),
    });
    let thread = std::thread::Builder::new()
        .name("log-writer".into())
        .spawn({
            let shared = Arc::clone(&shared);
            move || write_batches(&shared, targets)
        })?;
    let writer = LogWriter {
        shared: Arc::clone(&shared),
    };
    let guard = LogWriterGuard {
        shared,
        thread: Some(thread),
    };
    Ok((writer, guard))
}

impl LogWriter {
    /// Lines dropped because the buffer was full, since the writer started.
    pub fn dropped_lines(&self) -> u64 {
        self.shared.dropped_total.load(Ordering::Relaxed)
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = &'a LogWriter;

    fn make_writer(&'a self) -> &'a LogWriter {
        self
    }
}

// The log layer writes each formatted line with one `write_all`: a line is one `write`.
impl Write for &LogWriter {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        let shared = &self.shared;
        let mut pending = shared.lock();
        if pending.lines.len() + line.len() > shared.max_pending {
            pending.dropped += 1;
            shared.dropped_total.fetch_add(1, Ordering::Relaxed);
            return Ok(line.len());
        }
        let first = pending.lines.is_empty();
        pending.lines.extend_from_slice(line);
        drop(pending);
        if first {
            shared.ready.notify_one();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding the lock leaves only bytes in a buffer: still usable.
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The writer thread: waits for a first line, lets more gather, writes them all to every
/// target, until the guard closes the buffer and it is empty.
fn write_batches(shared: &Shared, mut targets: Vec<Box<dyn Write + Send>>) {
    let mut batch = Vec::new();
    loop {
        let mut pending = shared.lock();
        while pending.lines.is_empty() && !pending.closing {
            pending = shared
                .ready
                .wait(pending)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        if !pending.closing {
            drop(pending);
            std::thread::sleep(LINGER);
            pending = shared.lock();
        }
        std::mem::swap(&mut pending.lines, &mut batch);
        let dropped = std::mem::take(&mut pending.dropped);
        let done = pending.closing && batch.is_empty();
        drop(pending);
        if done {
            break;
        }
        // A target that fails (a closed stdout, a full disk) loses this batch; the others
        // still get it.
        for target in &mut targets {
            let _ = target.write_all(&batch).and_then(|()| target.flush());
        }
        batch.clear();
        if batch.capacity() > KEPT_BATCH_CAPACITY {
            batch = Vec::new();
        }
        if dropped > 0 {
            // Written through the log layer like any line, into the next batch.
            tracing::warn!(
                dropped,
                "log lines were dropped: they came faster than stdout and the log file took them"
            );
        }
    }
}

impl Drop for LogWriterGuard {
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.ready.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    /// A target that hands every write to the test, and may be told to hold writes back.
    struct Recorder {
        written: Arc<Mutex<Vec<u8>>>,
        writes: Arc<AtomicU64>,
        gate: Option<mpsc::Receiver<()>>,
    }

    impl Write for Recorder {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if let Some(gate) = &self.gate {
                let _ = gate.recv();
            }
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.written.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn recorder(
        gate: Option<mpsc::Receiver<()>>,
    ) -> (Recorder, Arc<Mutex<Vec<u8>>>, Arc<AtomicU64>) {
        let written = Arc::new(Mutex::new(Vec::new()));
        let writes = Arc::new(AtomicU64::new(0));
        let target = Recorder {
            written: Arc::clone(&written),
            writes: Arc::clone(&writes),
            gate,
        };
        (target, written, writes)
    }

    #[test]
    fn every_line_reaches_every_target_whole_and_in_order_in_few_writes() {
        let (stdout, to_stdout, stdout_writes) = recorder(None);
        let (file, to_file, _) = recorder(None);
        let (writer, guard) = start(vec![Box::new(stdout), Box::new(file)], 1 << 20).unwrap();
        let lines: Vec<String> = (0..1000).map(|n| format!("{{\"n\":{n}}}\n")).collect();
        for line in &lines {
            (&writer).write_all(line.as_bytes()).unwrap();
        }
        drop(guard);
        let expected = lines.concat().into_bytes();
        assert_eq!(*to_stdout.lock().unwrap(), expected);
        assert_eq!(*to_file.lock().unwrap(), expected);
        assert!(
            stdout_writes.load(Ordering::Relaxed) < 100,
            "1,000 lines in {} writes",
            stdout_writes.load(Ordering::Relaxed)
        );
        assert_eq!(writer.dropped_lines(), 0);
    }

    #[test]
    fn lines_past_the_pending_limit_are_dropped_whole_and_counted() {
        let (open_gate, gate) = mpsc::channel();
        let (target, written, _) = recorder(Some(gate));
        let (writer, guard) = start(vec![Box::new(target)], 1000).unwrap();
        // The first line is taken by the writer, which then waits at the closed gate.
        (&writer).write_all(&[b'a'; 99]).unwrap();
        while !writer.shared.lock().lines.is_empty() {
            std::thread::sleep(Duration::from_millis(1));
        }
        for _ in 0..30 {
            (&writer).write_all(&[b'b'; 100]).unwrap();
        }
        assert_eq!(writer.shared.lock().lines.len(), 1000, "ten lines wait");
        assert_eq!(writer.dropped_lines(), 20);
        drop(open_gate);
        drop(guard);
        let written = written.lock().unwrap();
        assert_eq!(written.len(), 99 + 1000);
        assert!(written[99..].iter().all(|byte| *byte == b'b'));
    }
}
