//! The log lines' way out: appended to a bounded buffer in memory per output (stdout, the log
//! file), each written by a thread of its own, in batches.
//!
//! Why not a `tracing_appender::non_blocking` writer per output: each line then goes through a
//! channel to a thread that wakes for it and writes it with a system call of its own; under
//! load that was two wake-ups and two writes for each request's line. Here an output's thread
//! writes what gathered, lingers [`LINGER`], and writes again; it parks only when a linger brought
//! nothing, and only then does a line wake it. Under load no line wakes a thread: a wake-up is a
//! system call on the request's path, and on a busy machine the woken thread takes the core the
//! request was running on. An output that stalls (a pipe nobody reads, a disk that hangs)
//! holds up only its own thread, loses only its own lines past [`MAX_PENDING_BYTES`], and
//! delays the exit by at most [`EXIT_DEADLINE`].

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// Bytes of log lines waiting for one output, at most (about 40,000 request lines, two seconds
/// of the host's full load): past it a line is dropped for that output and counted, so an
/// output that stalls costs at most this much memory, and as much again for the batch its
/// thread is stuck writing.
pub const MAX_PENDING_BYTES: usize = 16 << 20;

/// How long an output's thread lets lines gather before it writes them, between two batches and
/// once woken: the most a line waits to be written, beside the writes themselves. Each linger ends
/// in a wake-up that takes a core from a request (bench/PROFILE.md, section 16).
pub const LINGER: Duration = Duration::from_millis(10);

/// How long the exit waits for the outputs to write what is pending; an output still stuck
/// then is left behind.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(1);

/// Capacity a thread's batch buffer keeps between batches; a larger one, left by a burst, is
/// given back.
const KEPT_BATCH_CAPACITY: usize = 1 << 20;

/// Where the log layer writes: each line is appended, whole, to every output's buffer, or
/// dropped whole for an output whose buffer is full. Clones write to the same outputs.
#[derive(Clone)]
pub struct LogWriter {
    outputs: Vec<Arc<Output>>,
}

/// Owns the outputs' threads: dropping it has them write what is pending and stop, waiting at
/// most [`EXIT_DEADLINE`].
#[must_use = "dropping the guard stops the log writer"]
pub struct LogWriterGuard {
    outputs: Vec<Arc<Output>>,
    /// Disconnected once every output's thread has ended.
    finished: mpsc::Receiver<()>,
}

/// One output: its pending lines and what its thread is told.
struct Output {
    name: &'static str,
    pending: Mutex<Pending>,
    /// Signalled when a line comes while the thread is parked, and at close.
    ready: Condvar,
    max_pending: usize,
    /// [`LINGER`], but in tests.
    linger: Duration,
    /// Lines dropped since the output's thread started.
    dropped_total: AtomicU64,
    /// Times a line woke the parked thread.
    wake_ups: AtomicU64,
}

struct Pending {
    lines: Vec<u8>,
    /// Lines dropped since the thread last said so.
    dropped: u64,
    /// The thread waits on `ready` for a line (not lingering): the next line must wake it.
    parked: bool,
    closing: bool,
}

/// Starts a thread for each named output, with at most `max_pending` bytes waiting for each.
pub fn start(
    outputs: Vec<(&'static str, Box<dyn Write + Send>)>,
    max_pending: usize,
) -> io::Result<(LogWriter, LogWriterGuard)> {
    start_lingering(outputs, max_pending, LINGER)
}

/// [`start`], the outputs' threads lingering `linger` between batches.
fn start_lingering(
    outputs: Vec<(&'static str, Box<dyn Write + Send>)>,
    max_pending: usize,
    linger: Duration,
) -> io::Result<(LogWriter, LogWriterGuard)> {
    let (done, finished) = mpsc::channel::<()>();
    let mut shared = Vec::new();
    for (name, target) in outputs {
        let output = Arc::new(Output {
            name,
            pending: Mutex::new(Pending {
                lines: Vec::new(),
                dropped: 0,
                parked: false,
                closing: false,
            }),
            ready: Condvar::new(),
            max_pending,
            linger,
            dropped_total: AtomicU64::new(0),
            wake_ups: AtomicU64::new(0),
        });
        std::thread::Builder::new()
            .name(format!("log-{name}"))
            .spawn({
                let output = Arc::clone(&output);
                let done = done.clone();
                move || {
                    write_batches(&output, target);
                    drop(done);
                }
            })?;
        shared.push(output);
    }
    let writer = LogWriter {
        outputs: shared.clone(),
    };
    let guard = LogWriterGuard {
        outputs: shared,
        finished,
    };
    Ok((writer, guard))
}

impl LogWriter {
    /// Lines each output dropped because its buffer was full, since the writer started.
    pub fn dropped_by_output(&self) -> Vec<(&'static str, u64)> {
        self.outputs
            .iter()
            .map(|output| (output.name, output.dropped_total.load(Ordering::Relaxed)))
            .collect()
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
        for output in &self.outputs {
            output.append(line);
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Output {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // A panic while holding the lock leaves only bytes in a buffer: still usable.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits [`LINGER`] for lines to gather, or less if the guard closes the output meanwhile:
    /// the exit does not wait for a linger to end.
    fn linger<'a>(&'a self, pending: MutexGuard<'a, Pending>) -> MutexGuard<'a, Pending> {
        self.ready
            .wait_timeout_while(pending, self.linger, |pending| !pending.closing)
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    /// Appends `line` whole if it fits within `max_pending`; counts it dropped otherwise.
    fn append(&self, line: &[u8]) {
        let mut pending = self.lock();
        let needed = pending.lines.len() + line.len();
        if needed > self.max_pending {
            pending.dropped += 1;
            self.dropped_total.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if needed > pending.lines.capacity() {
            // Grown by doubling, but never past the limit.
            let capacity = (pending.lines.capacity() * 2).clamp(needed, self.max_pending);
            let additional = capacity - pending.lines.len();
            pending.lines.reserve_exact(additional);
        }
        pending.lines.extend_from_slice(line);
        let wake = std::mem::take(&mut pending.parked);
        drop(pending);
        if wake {
            self.wake_ups.fetch_add(1, Ordering::Relaxed);
            self.ready.notify_one();
        }
    }
}

/// An output's thread: writes what gathered, lingers, and writes again; parks when a linger
/// brought nothing, and lingers once woken, so a burst is written at once. Once the guard
/// closes the buffer it writes what is pending once more and ends.
fn write_batches(output: &Output, mut target: Box<dyn Write + Send>) {
    let mut batch = Vec::new();
    // Whether the last write failed, maybe halfway through a line: the next batch then starts
    // on a line of its own.
    let mut cut = false;
    let mut pending = output.lock();
    loop {
        if pending.lines.is_empty() && !pending.closing {
            while pending.lines.is_empty() && !pending.closing {
                pending.parked = true;
                pending = output
                    .ready
                    .wait(pending)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            pending.parked = false;
            pending = output.linger(pending);
        }
        std::mem::swap(&mut pending.lines, &mut batch);
        let dropped = std::mem::take(&mut pending.dropped);
        let closing = pending.closing;
        drop(pending);
        if !batch.is_empty() {
            let newline: &[u8] = if cut { b"\n" } else { b"" };
            cut = target
                .write_all(newline)
                .and_then(|()| target.write_all(&batch))
                .and_then(|()| target.flush())
                .is_err();
        }
        batch.clear();
        if batch.capacity() > KEPT_BATCH_CAPACITY {
            batch = Vec::new();
        }
        if dropped > 0 {
            // Through the log layer like any line, so into the next batch of every output.
            tracing::warn!(
                dropped,
                output = output.name,
                "log lines were dropped: they came faster than this output took them"
            );
        }
        if closing {
            break;
        }
        // What comes meanwhile waits for the next batch, and wakes nobody.
        pending = output.linger(output.lock());
    }
}

impl Drop for LogWriterGuard {
    fn drop(&mut self) {
        for output in &self.outputs {
            output.lock().closing = true;
            output.ready.notify_one();
        }
        // Every thread's sender dropped: all have written what was pending. An output still
        // stuck in a write past the deadline is left to the process's exit.
        let _ = self.finished.recv_timeout(EXIT_DEADLINE);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    /// Lines dropped for any output, since the writer started.
    fn dropped_lines(writer: &LogWriter) -> u64 {
        writer
            .dropped_by_output()
            .iter()
            .map(|(_, lines)| lines)
            .sum()
    }

    /// An output that hands every write to the test, and may be told to hold writes back.
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

    struct Recorded {
        written: Arc<Mutex<Vec<u8>>>,
        writes: Arc<AtomicU64>,
    }

    fn recorder(gate: Option<mpsc::Receiver<()>>) -> (Box<dyn Write + Send>, Recorded) {
        let written = Arc::new(Mutex::new(Vec::new()));
        let writes = Arc::new(AtomicU64::new(0));
        let target = Recorder {
            written: Arc::clone(&written),
            writes: Arc::clone(&writes),
            gate,
        };
        (Box::new(target), Recorded { written, writes })
    }

    #[test]
    fn every_line_reaches_every_output_whole_in_few_writes() {
        let (stdout, to_stdout) = recorder(None);
        let (file, to_file) = recorder(None);
        let (writer, guard) = start(vec![("stdout", stdout), ("file", file)], 1 << 20).unwrap();
        let writer = Arc::new(writer);
        let producers: Vec<_> = (0..4)
            .map(|thread| {
                let writer = Arc::clone(&writer);
                std::thread::spawn(move || {
                    for n in 0..500 {
                        let line = format!("{{\"thread\":{thread},\"n\":{n}}}\n");
                        (&*writer).write_all(line.as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for producer in producers {
            producer.join().unwrap();
        }
        let closing = Instant::now();
        drop(guard);
        assert!(
            closing.elapsed() < EXIT_DEADLINE / 2,
            "outputs that keep up end at once, not at the deadline"
        );
        for recorded in [&to_stdout, &to_file] {
            let written = String::from_utf8(recorded.written.lock().unwrap().clone()).unwrap();
            let seen: Vec<(u64, u64)> = written
                .lines()
                .map(|line| {
                    let line: serde_json::Value = serde_json::from_str(line).unwrap();
                    (
                        line["thread"].as_u64().unwrap(),
                        line["n"].as_u64().unwrap(),
                    )
                })
                .collect();
            // Each producer's lines in its own order, none lost, none twice.
            for thread in 0..4 {
                let own: Vec<u64> = seen
                    .iter()
                    .filter(|(from, _)| *from == thread)
                    .map(|(_, n)| *n)
                    .collect();
                assert_eq!(own, (0..500).collect::<Vec<_>>());
            }
            assert_eq!(seen.len(), 2000);
        }
        let writes = to_stdout.writes.load(Ordering::Relaxed);
        assert!(writes < 1000, "2,000 lines in {writes} writes");
        assert_eq!(dropped_lines(&writer), 0);
    }

    /// Waits, for 10 s at most, until `done` holds.
    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "waited 10 s for {what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn closing_ends_a_linger_at_once_and_writes_what_gathered() {
        let (file, to_file) = recorder(None);
        let linger = Duration::from_secs(600);
        let (writer, guard) = start_lingering(vec![("file", file)], 1 << 20, linger).unwrap();
        let output = Arc::clone(&writer.outputs[0]);
        wait_until("the thread parked", || output.lock().parked);
        (&writer).write_all(b"{\"n\":0}\n").unwrap();
        // Woken, the thread lets lines gather for ten minutes before it writes: given the time
        // to wake and start its linger (were it still parked, the close would end that alone).
        std::thread::sleep(Duration::from_millis(200));
        let closing = Instant::now();
        drop(guard);
        assert!(closing.elapsed() < EXIT_DEADLINE, "{:?}", closing.elapsed());
        assert_eq!(to_file.written.lock().unwrap().as_slice(), b"{\"n\":0}\n");
    }

    #[test]
    fn a_line_wakes_the_outputs_thread_only_when_it_has_parked() {
        let (open_gate, gate) = mpsc::channel();
        let (file, to_file) = recorder(Some(gate));
        let (writer, guard) = start(vec![("file", file)], 1 << 20).unwrap();
        let output = Arc::clone(&writer.outputs[0]);
        let wake_ups = || output.wake_ups.load(Ordering::Relaxed);
        (&writer).write_all(b"{\"n\":0}\n").unwrap();
        // The thread takes the line and is held in its write: busy, not parked.
        wait_until("the first batch taken", || output.lock().lines.is_empty());
        let before = wake_ups();
        for n in 1..=100 {
            (&writer)
                .write_all(format!("{{\"n\":{n}}}\n").as_bytes())
                .unwrap();
        }
        assert_eq!(wake_ups(), before, "lines for a busy thread wake nobody");
        // Released, the thread writes the rest, finds nothing in a linger, and parks.
        drop(open_gate);
        wait_until("the thread parked", || output.lock().parked);
        assert_eq!(
            to_file
                .written
                .lock()
                .unwrap()
                .iter()
                .filter(|b| **b == b'\n')
                .count(),
            101
        );
        (&writer).write_all(b"{\"n\":101}\n").unwrap();
        assert_eq!(
            wake_ups(),
            before + 1,
            "a line for a parked thread wakes it"
        );
        wait_until("the line after the park written", || {
            to_file.written.lock().unwrap().ends_with(b"{\"n\":101}\n")
        });
        drop(guard);
    }

    #[test]
    fn lines_past_the_pending_limit_are_dropped_whole_and_counted() {
        let (open_gate, gate) = mpsc::channel();
        let (stalled, to_stalled) = recorder(Some(gate));
        let (writer, guard) = start(vec![("stalled", stalled)], 1050).unwrap();
        // The first line is taken by the output's thread, which then waits at the gate.
        (&writer).write_all(&[b'a'; 99]).unwrap();
        wait_until("the first line taken", || {
            writer.outputs[0].lock().lines.is_empty()
        });
        for _ in 0..30 {
            (&writer).write_all(&[b'b'; 100]).unwrap();
        }
        let pending = writer.outputs[0].lock().lines.len();
        assert_eq!(
            pending, 1000,
            "ten whole lines wait, no part of an eleventh"
        );
        assert!(writer.outputs[0].lock().lines.capacity() <= 1050);
        assert_eq!(dropped_lines(&writer), 20);
        drop(open_gate);
        drop(guard);
        let stalled = to_stalled.written.lock().unwrap();
        assert_eq!(stalled.len(), 99 + 1000);
        assert!(stalled[99..].iter().all(|byte| *byte == b'b'));
    }

    #[test]
    fn an_output_stuck_in_a_write_costs_the_others_nothing_and_the_exit_the_deadline_at_most() {
        let (_never_opened, gate) = mpsc::channel();
        let (stuck, _) = recorder(Some(gate));
        let (file, to_file) = recorder(None);
        let (writer, guard) = start(vec![("stuck", stuck), ("file", file)], 1 << 20).unwrap();
        (&writer).write_all(b"{\"n\":1}\n").unwrap();
        let started = Instant::now();
        drop(guard);
        assert!(started.elapsed() < EXIT_DEADLINE + Duration::from_millis(500));
        assert_eq!(*to_file.written.lock().unwrap(), b"{\"n\":1}\n");
    }

    /// An output whose writes fail once, halfway through.
    struct FailsOnce {
        failed: bool,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for FailsOnce {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if !self.failed && bytes.len() > 4 {
                self.failed = true;
                self.written.lock().unwrap().extend_from_slice(&bytes[..4]);
                return Err(io::Error::other("disk full"));
            }
            self.written.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn after_a_write_cut_short_the_next_line_starts_on_a_line_of_its_own() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let output = FailsOnce {
            failed: false,
            written: Arc::clone(&written),
        };
        let (writer, guard) = start(vec![("file", Box::new(output))], 1 << 20).unwrap();
        (&writer).write_all(b"{\"n\":1}\n").unwrap();
        wait_until("the first write", || !written.lock().unwrap().is_empty());
        (&writer).write_all(b"{\"n\":2}\n").unwrap();
        drop(guard);
        let written = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        assert_eq!(written, "{\"n\"\n{\"n\":2}\n");
    }
}
