//! The host's errors: [`Error`], what stops the host from starting or a guest from loading
//! (reported once, at start or on a reload), and [`RequestError`], why one request's guest gave
//! no response (answered with a status). Each keeps its cause as its `source`.

use std::path::PathBuf;

/// What stops the host from starting, or a new guest from serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The guest file could not be read.
    #[error("cannot read guest component {path} (run `make build` to build it)")]
    GuestUnreadable {
        /// The path that was tried.
        path: PathBuf,
        /// Why reading failed.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a component this host can serve.
    #[error("invalid guest component {path} (run `make build` to rebuild it)")]
    GuestInvalid {
        /// The path that was tried.
        path: PathBuf,
        /// Why wasmtime refused it.
        #[source]
        source: wasmtime::Error,
    },
    /// The component breaks a rule of this host that wasmtime does not check.
    #[error("guest component {path} is refused")]
    GuestRefused {
        /// The path that was tried.
        path: PathBuf,
        /// Which rule it breaks.
        #[source]
        source: Refusal,
    },
    /// The new guest did not answer its probe request 200 in time.
    #[error("probe GET {path} answered {status}")]
    ProbeAnswered {
        /// The probe path.
        path: String,
        /// What it answered instead of 200.
        status: http::StatusCode,
    },
    /// The new guest gave no response to its probe request.
    #[error("probe GET {path} failed")]
    ProbeFailed {
        /// The probe path.
        path: String,
        /// Why no response came.
        #[source]
        source: RequestError,
    },
    /// The new guest's probe took longer than its time.
    #[error("probe GET {path} timed out")]
    ProbeTimedOut {
        /// The probe path.
        path: String,
    },
    /// Setting up the wasm runtime failed.
    #[error("cannot set up the wasm runtime")]
    Runtime(#[source] wasmtime::Error),
    /// The task that loads a guest off the async threads failed.
    #[error("the guest loading task failed")]
    LoadTask(#[source] tokio::task::JoinError),
    /// `--store` is neither `memory` nor a usable PostgreSQL URL. Never holds the URL itself.
    #[error("invalid {setting}: {reason}")]
    StoreSetting {
        /// The flag or the variable the URL came from, whichever was set.
        setting: String,
        /// What is wrong with it.
        reason: String,
    },
    /// An OpenTelemetry environment variable holds a value the host cannot use. Never holds the
    /// value itself: headers carry API keys.
    #[error("{variable}: {reason}")]
    TelemetrySetting {
        /// The variable's name.
        variable: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// PostgreSQL answered, but the database the URL names does not exist. The host does not
    /// create it: which server, owner and settings a database gets is the operator's choice.
    #[error(
        "the user store's database does not exist: {target}; create it first (`createdb` with \
         the URL's host, port, user and database name, or `CREATE DATABASE` in psql)"
    )]
    StoreDatabaseMissing {
        /// `postgres://host:port/database`, without credentials.
        target: String,
    },
    /// PostgreSQL answered, but refused this host's role: its login, or the right to set up the
    /// tables. Retrying would not help.
    #[error(
        "the user store at {target} refused this host: {reason}; check the URL's user and \
         password, and that the role may create tables in the database"
    )]
    StoreRefused {
        /// `postgres://host:port/database`, without credentials.
        target: String,
        /// PostgreSQL's message, on one line.
        reason: String,
    },
    /// PostgreSQL could not be reached, or its schema set up, at start.
    #[error("cannot reach the user store at {target} (waited {:.1} s): {reason}", waited.as_secs_f64())]
    StoreUnreachable {
        /// `postgres://host:port/database`, without credentials.
        target: String,
        /// How long start-up kept trying.
        waited: std::time::Duration,
        /// The last failure, on one line.
        reason: String,
    },
}

/// Why one request's guest gave no response. Each is answered by the host itself.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The guest ran past the request's deadline and was stopped: 503.
    #[error("the guest ran past the request deadline")]
    Timeout,
    /// Every guest instance slot stayed busy for longer than a request may wait: 503.
    #[error("no guest instance slot came free in time")]
    Busy,
    /// The guest memory budget could not give the instance what it needed (linear memory, or
    /// room for the objects it made on the host's side): 503.
    #[error("the guest memory budget is spent")]
    OverBudget(#[source] wasmtime::Error),
    /// The guest trapped (a panic, a wasm fault) or a host call it made failed: 500.
    #[error("the guest failed")]
    Trapped(#[source] wasmtime::Error),
    /// The guest trapped after its own memory limit refused it memory (most guests abort when
    /// an allocation fails): 500.
    #[error("the guest failed after its memory limit (--guest-memory-mb) refused it more")]
    OverLimit(#[source] wasmtime::Error),
    /// The request could not be handed to the guest: 500.
    #[error("cannot hand the request to the guest")]
    Setup(#[source] wasmtime::Error),
    /// The guest answered with a `wasi:http` error code instead of a response: 500.
    #[error("the guest answered with error code {0}")]
    ErrorCode(String),
    /// The guest returned without sending a response: 500.
    #[error("the guest returned without sending a response")]
    NoResponse,
    /// The task running the guest ended abnormally: 500.
    #[error("the guest's task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// An error and each of its causes, on one line: `probe GET /x failed: the guest failed: wasm
/// trap: unreachable`. For log lines and the start-up error, which are one line each.
pub fn one_line(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Some errors repeat their cause in their own message.
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The most of a guest's `wasi:http` error code the host writes in its log line.
pub const MAX_ERROR_CODE_TEXT: usize = 512;

/// `value`'s `Debug` text, cut after `max` bytes (and marked so): a guest's error code may
/// carry a string as large as its memory, which is never escaped whole.
pub fn bounded_debug(value: &impl std::fmt::Debug, max: usize) -> String {
    use std::fmt::Write;
    /// Text that takes `max` bytes, then refuses more, which stops the formatting.
    struct Bounded {
        text: String,
        max: usize,
    }
    impl Write for Bounded {
        fn write_str(&mut self, piece: &str) -> std::fmt::Result {
            let room = self.max - self.text.len();
            if piece.len() > room {
                self.text
                    .push_str(&piece[..piece.floor_char_boundary(room)]);
                return Err(std::fmt::Error);
            }
            self.text.push_str(piece);
            Ok(())
        }
    }
    let mut bounded = Bounded {
        text: String::new(),
        max,
    };
    if write!(bounded, "{value:?}").is_err() {
        bounded.text.push_str("...");
    }
    bounded.text
}

/// Why a component is refused before it is linked.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A canonical function passes strings to the host in UTF-16 or latin1+UTF-16. wasmtime
    /// would transcode each such string into a new host `String` before the host's length
    /// checks see it: a 64-byte id could cost up to twice the guest's memory per call. With
    /// UTF-8 the host reads a string where it lies, and only when its quota allows.
    #[error(
        "it passes strings to the host as {encoding} (canonical function {index}); this host \
         accepts only UTF-8 strings from a guest"
    )]
    StringEncoding {
        /// `UTF-16` or `latin1+UTF-16`.
        encoding: &'static str,
        /// The index of the offending canonical function, in the order they are declared.
        index: usize,
    },
    /// The binary, which wasmtime accepted, could not be read through to its end here: nothing
    /// unread is trusted.
    #[error("its canonical functions could not be read: {0}")]
    Unreadable(#[from] wasmparser::BinaryReaderError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_debug_text_past_its_bound_is_cut_at_a_character_and_marked() {
        assert_eq!(bounded_debug(&Some("ab"), 100), "Some(\"ab\")");
        let long = Some("é".repeat(1000));
        let cut = bounded_debug(&long, 10);
        assert!(cut.len() <= 13 && cut.ends_with("..."), "{cut}");
        assert!(cut.starts_with("Some(\"é"), "{cut}");
    }

    #[test]
    fn one_line_names_every_cause_once_without_newlines() {
        let error = Error::ProbeFailed {
            path: "/api/health".to_string(),
            source: RequestError::Trapped(wasmtime::format_err!("wasm trap:\n  unreachable")),
        };
        assert_eq!(
            one_line(&error),
            "probe GET /api/health failed: the guest failed: wasm trap: unreachable"
        );
    }
}
