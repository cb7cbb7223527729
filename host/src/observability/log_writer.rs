//! The log lines' way out: each output (stdout, the log file) written by a
//! `tracing_appender::non_blocking` worker of its own, within a byte bound per output.
//!
//! tracing-appender bounds a queue by lines, and a line can be 256 KiB (a guest's log line at
//! its quota), so the lines and bytes waiting for each output are counted here: a line past
//! either bound is dropped for that output, counted, and said in a WARN line once the output
//! writes again. The worker gathers what its queue holds and writes it in one call when the
//! queue runs empty. An output that stalls holds up only its own worker and delays the exit by
//! about a second, tracing-appender's wait for its worker. Why the crate's worker and not a
//! thread of our own: bench/PROFILE.md, section 32.

use std::io::{self, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tracing_appender::non_blocking::{NonBlocking, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::MakeWriter;

/// Bytes of log lines waiting for one output, at most (about 40,000 request lines, two seconds
/// of the host's full load): past it a line is dropped for that output and counted, so an
/// output that stalls costs at most this much memory.
pub const MAX_PENDING_BYTES: usize = 16 << 20;

/// Lines waiting for one output, at most. tracing-appender allocates its queue whole, 32 bytes
/// a line, with one place more: its request to stop always fits.
const MAX_PENDING_LINES: usize = 1 << 15;

/// Bytes a worker gathers before it writes even though its queue is not empty yet.
const MAX_BATCH_BYTES: usize = 1 << 20;

/// Where the log layer writes: each line is queued, whole, for every output, or dropped whole
/// for an output that has too much waiting. Clones write to the same outputs.
#[derive(Clone)]
pub struct LogWriter {
    outputs: Arc<[Output]>,
}

/// Owns the outputs' workers: dropping it has them write what is waiting and stop.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogWriterGuard {
    workers: Vec<WorkerGuard>,
}

/// One output, as the log layer sees it.
struct Output {
    name: &'static str,
    queue: NonBlocking,
    waiting: Arc<Waiting>,
}

/// What waits for one output: counted when a line is queued, given back once written.
struct Waiting {
    lines: AtomicUsize,
    bytes: AtomicUsize,
    max_bytes: usize,
    /// Lines dropped since the writer started.
    dropped_total: AtomicU64,
    /// Lines dropped that no WARN line has said yet.
    dropped_unsaid: AtomicU64,
}

/// Starts a worker for each named output, with at most `max_pending` bytes waiting for each.
pub fn start(
    outputs: Vec<(&'static str, Box<dyn Write + Send>)>,
    max_pending: usize,
) -> (LogWriter, LogWriterGuard) {
    let mut workers = Vec::new();
    let outputs = outputs
        .into_iter()
        .map(|(name, target)| {
            let waiting = Arc::new(Waiting {
                lines: AtomicUsize::new(0),
                bytes: AtomicUsize::new(0),
                max_bytes: max_pending,
                dropped_total: AtomicU64::new(0),
                dropped_unsaid: AtomicU64::new(0),
            });
            let written = Written {
                name,
                target,
                batch: Vec::new(),
                batch_lines: 0,
                waiting: Arc::clone(&waiting),
                cut: false,
            };
            let (queue, worker) = NonBlockingBuilder::default()
                .buffered_lines_limit(MAX_PENDING_LINES + 1)
                .lossy(true)
                .thread_name(&format!("log-{name}"))
                .finish(written);
            workers.push(worker);
            Output {
                name,
                queue,
                waiting,
            }
        })
        .collect();
    (LogWriter { outputs }, LogWriterGuard { workers })
}

impl LogWriter {
    /// Lines each output dropped because too much was waiting for it, since the writer started.
    pub fn dropped_by_output(&self) -> Vec<(&'static str, u64)> {
        self.outputs
            .iter()
            .map(|output| {
                let dropped = output.waiting.dropped_total.load(Ordering::Relaxed);
                (output.name, dropped)
            })
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
        for output in self.outputs.iter() {
            if output.waiting.admit(line.len()) {
                // Never refused: at most MAX_PENDING_LINES are queued, and the queue holds one
                // more.
                let _ = output.queue.clone().write(line);
            }
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Waiting {
    /// Counts a line of `bytes` as waiting, unless it would pass a bound: it is then counted
    /// as dropped instead.
    fn admit(&self, bytes: usize) -> bool {
        let room_for = |bound: usize, more: usize| {
            move |now: usize| now.checked_add(more).filter(|after| *after <= bound)
        };
        let admitted = self
            .bytes
            .fetch_update(
                Ordering::AcqRel,
                Ordering::Acquire,
                room_for(self.max_bytes, bytes),
            )
            .is_ok();
        if admitted {
            let line = self.lines.fetch_update(
                Ordering::AcqRel,
                Ordering::Acquire,
                room_for(MAX_PENDING_LINES, 1),
            );
            if line.is_ok() {
                return true;
            }
            self.bytes.fetch_sub(bytes, Ordering::AcqRel);
        }
        self.dropped(1);
        false
    }

    /// Counts `lines` lines as dropped, to be said in the next WARN line.
    fn dropped(&self, lines: u64) {
        self.dropped_total.fetch_add(lines, Ordering::Relaxed);
        self.dropped_unsaid.fetch_add(lines, Ordering::Relaxed);
    }

    /// Gives back `lines` lines of `bytes` bytes in all.
    fn written(&self, lines: usize, bytes: usize) {
        self.lines.fetch_sub(lines, Ordering::AcqRel);
        self.bytes.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// An output as its worker writes it: the lines its queue held, gathered and written in one
/// call when the queue runs empty.
struct Written {
    name: &'static str,
    target: Box<dyn Write + Send>,
    batch: Vec<u8>,
    batch_lines: usize,
    waiting: Arc<Waiting>,
    /// Whether the last write failed, maybe halfway through a line: the next batch then starts
    /// on a line of its own.
    cut: bool,
}

impl Write for Written {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        self.write_all(line).map(|()| line.len())
    }

    /// The worker hands over each line with one call.
    fn write_all(&mut self, line: &[u8]) -> io::Result<()> {
        // Written before the batch would pass its bound, so its buffer never grows past it
        // (but for a single longer line).
        let flushed = if self.batch.len() + line.len() > MAX_BATCH_BYTES {
            self.flush()
        } else {
            Ok(())
        };
        self.batch.extend_from_slice(line);
        self.batch_lines += 1;
        flushed
    }

    /// Called by the worker when its queue is empty.
    fn flush(&mut self) -> io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let newline: &[u8] = if self.cut { b"\n" } else { b"" };
        let written = self
            .target
            .write_all(newline)
            .and_then(|()| self.target.write_all(&self.batch))
            .and_then(|()| self.target.flush());
        self.cut = written.is_err();
        if self.cut {
            self.waiting.dropped(self.batch_lines as u64);
        }
        self.waiting.written(self.batch_lines, self.batch.len());
        self.batch.clear();
        self.batch_lines = 0;
        if self.batch.capacity() > MAX_BATCH_BYTES {
            self.batch = Vec::new();
        }
        let dropped = self.waiting.dropped_unsaid.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            // Through the log layer like any line, so into the next batch of every output.
            tracing::warn!(
                dropped,
                output = self.name,
                "log lines were dropped: they came faster than this output took them"
            );
        }
        written
    }
}

impl Drop for LogWriterGuard {
    /// Each worker's guard waits up to a second for its worker to write what is waiting: the
    /// guards are dropped side by side, so outputs that are stuck delay the exit that once.
    fn drop(&mut self) {
        let waits: Vec<_> = self
            .workers
            .drain(..)
            .filter_map(|worker| std::thread::Builder::new().spawn(move || drop(worker)).ok())
            .collect();
        for wait in waits {
            let _ = wait.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Mutex, mpsc};
    use std::time::{Duration, Instant};

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
        gate: Option<mpsc::Receiver<()>>,
    }

    impl Write for Recorder {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            if let Some(gate) = &self.gate {
                let _ = gate.recv();
            }
            self.written.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    struct Recorded {
        written: Arc<Mutex<Vec<u8>>>,
    }

    fn recorder(gate: Option<mpsc::Receiver<()>>) -> (Box<dyn Write + Send>, Recorded) {
        let written = Arc::new(Mutex::new(Vec::new()));
        let target = Recorder {
            written: Arc::clone(&written),
            gate,
        };
        (Box::new(target), Recorded { written })
    }

    #[test]
    fn every_line_reaches_every_output_whole_and_in_order() {
        let (stdout, to_stdout) = recorder(None);
        let (file, to_file) = recorder(None);
        let (writer, guard) = start(vec![("stdout", stdout), ("file", file)], 1 << 20);
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
            closing.elapsed() < Duration::from_millis(500),
            "outputs that keep up end at once, not after the guard's wait"
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
    fn lines_past_the_pending_limit_are_dropped_whole_and_counted() {
        let (open_gate, gate) = mpsc::channel();
        let (stalled, to_stalled) = recorder(Some(gate));
        let (writer, guard) = start(vec![("stalled", stalled)], 1050);
        // The first line waits until its write, which waits at the gate, is done.
        (&writer).write_all(&[b'a'; 99]).unwrap();
        for _ in 0..30 {
            (&writer).write_all(&[b'b'; 100]).unwrap();
        }
        // 99 + 9 × 100 bytes wait: no part of a tenth line of b's.
        assert_eq!(dropped_lines(&writer), 21);
        drop(open_gate);
        let written = Arc::clone(&to_stalled.written);
        wait_until("the waiting lines written", || {
            written.lock().unwrap().len() == 99 + 900
        });
        // What was written is given back: the bound admits as much again.
        for _ in 0..10 {
            (&writer).write_all(&[b'c'; 100]).unwrap();
        }
        drop(guard);
        assert_eq!(dropped_lines(&writer), 21);
        let stalled = to_stalled.written.lock().unwrap();
        assert_eq!(stalled.len(), 99 + 900 + 1000);
        assert!(stalled[99..999].iter().all(|byte| *byte == b'b'));
        assert!(stalled[999..].iter().all(|byte| *byte == b'c'));
    }

    #[test]
    fn outputs_stuck_in_a_write_cost_the_others_nothing_and_the_exit_a_second_or_so() {
        let (_never_opened, gate) = mpsc::channel();
        let (stuck, _) = recorder(Some(gate));
        let (_never_opened_either, other_gate) = mpsc::channel();
        let (also_stuck, _) = recorder(Some(other_gate));
        let (file, to_file) = recorder(None);
        let outputs = vec![("stuck", stuck), ("also stuck", also_stuck), ("file", file)];
        let (writer, guard) = start(outputs, 1 << 20);
        (&writer).write_all(b"{\"n\":1}\n").unwrap();
        let started = Instant::now();
        drop(guard);
        // tracing-appender's guard waits 1 s for a worker, and 100 ms to ask it to stop: two
        // stuck outputs waited for one after the other would take 2.2 s.
        assert!(started.elapsed() < Duration::from_millis(1800));
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
        let (writer, guard) = start(vec![("file", Box::new(output))], 1 << 20);
        (&writer).write_all(b"{\"n\":1}\n").unwrap();
        wait_until("the first write", || !written.lock().unwrap().is_empty());
        (&writer).write_all(b"{\"n\":2}\n").unwrap();
        drop(guard);
        let written = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        assert_eq!(written, "{\"n\"\n{\"n\":2}\n");
        assert_eq!(
            dropped_lines(&writer),
            1,
            "the line cut short counts as dropped"
        );
    }
}
