//! The host's one error type: what can go wrong loading or running a guest, or opening its
//! user store.

use std::path::PathBuf;

/// A failure of the host's own making or of the guest it runs.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The guest file could not be read.
    #[error("cannot read guest component {path}: {io_error} (run `make build` to build it)")]
    GuestUnreadable {
        /// The path that was tried.
        path: PathBuf,
        /// Why reading failed.
        io_error: std::io::Error,
    },
    /// The file is not a component this host can serve.
    #[error("invalid guest component {path}: {reason} (run `make build` to rebuild it)")]
    GuestInvalid {
        /// The path that was tried.
        path: PathBuf,
        /// Why it was refused, on one line.
        reason: String,
    },
    /// The guest trapped or otherwise failed before producing a response.
    #[error("guest failed: {0}")]
    GuestFailed(String),
    /// The guest ran past the request's deadline and was stopped.
    #[error("the guest ran past the request deadline")]
    Timeout,
    /// Every guest instance slot stayed busy for longer than a request may wait.
    #[error("no guest instance slot came free in time")]
    Busy,
    /// Setting up the wasm runtime failed.
    #[error("wasm runtime: {0}")]
    Runtime(String),
    /// `--store` is neither `memory` nor a usable PostgreSQL URL. Never holds the URL itself.
    #[error("invalid --store / USER_STORE / DATABASE_URL: {0}")]
    StoreSetting(String),
    /// An OpenTelemetry environment variable holds a value the host cannot use. Never holds the
    /// value itself: headers carry API keys.
    #[error("{variable}: {reason}")]
    TelemetrySetting {
        /// The variable's name.
        variable: &'static str,
        /// What is wrong with it.
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

/// A wasmtime error as one line: its whole chain of causes, without newlines.
pub(crate) fn one_line(error: wasmtime::Error) -> String {
    let text = format!("{:#}", anyhow::Error::from(error));
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
