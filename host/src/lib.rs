//! The native host: serves the tutorial service's guest component over HTTP.
//!
//! The host is stable; the guest is replaceable. Each request gets a fresh wasm instance of the
//! guest, pre-instantiated once at start. What outlives a request lives here, in host state.
//! Each folder is one capability, and each imports only from those listed after it:
//!
//! - [`config`]: every setting, flag and environment variable, gathered from the groups each
//!   capability declares beside its code, validated before anything binds;
//! - [`edge`]: the HTTP edge: the accept loop, the connection table, request ids, bodies read
//!   within their limits, and the host's own responses;
//! - [`runtime`]: the guest runtime: the engine, compiled-component cache, admission, memory
//!   pools and slots, the store each request's instance gets, the probe and the reloader;
//! - [`interfaces`]: the WIT interfaces the host gives each guest instance, `users` and
//!   `telemetry`, each on a state of its own, and the bounded lifting of what a guest passes;
//! - [`observability`]: the telemetry pipeline (exporters, log writers), the request span, the
//!   JSON log format, every metric, and the bounded set of route labels;
//! - [`user_store`]: the users themselves, in memory or on PostgreSQL;
//! - [`error`]: what stops the host or a new guest, and why one request got no response;
//! - [`machine`]: the memory this process may use, which several defaults share out.
#![warn(missing_docs)]

pub mod config;
pub mod edge;
pub mod error;
pub mod interfaces;
pub mod machine;
pub mod observability;
pub mod runtime;
pub mod user_store;
