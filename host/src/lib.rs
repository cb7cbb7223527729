//! The native host: serves the tutorial service's guest component over HTTP.
//!
//! The host is stable; the guest is replaceable. Each folder is one capability, and each
//! imports only from those listed after it:
//!
//! - [`config`]: every setting, flag and environment variable, validated before anything binds;
//! - [`edge`]: the accept loop, connections, request ids, bodies, the host's own responses;
//! - [`runtime`]: the engine, the guest's instances, their limits, the probe and the reloader;
//! - [`interfaces`]: the WIT interfaces the host gives each guest instance;
//! - [`observability`]: spans, JSON log lines, metrics and their exporters;
//! - [`user_store`]: the users themselves, in memory or on PostgreSQL;
//! - [`error`], [`machine`]: why something failed, and the memory this process may use.
#![warn(missing_docs)]

pub mod config;
pub mod edge;
pub mod error;
pub mod interfaces;
pub mod machine;
pub mod observability;
pub mod runtime;
pub mod user_store;
