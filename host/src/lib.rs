//! The native host: serves the tutorial service's guest component over HTTP.
//!
//! The host is stable; the guest is replaceable. Each request gets a fresh wasm instance of the
//! guest, pre-instantiated once at start. What outlives a request lives here, in host state:
//!
//! - [`config`]: flags and environment variables, validated before anything binds;
//! - [`otel_env`]: the OpenTelemetry SDK's variables: which exporter, where, what resource;
//! - [`bindings`]: the one `bindgen!` of the service's WIT world;
//! - [`error`]: what stops the host or a new guest ([`error::Error`]), and why one request got no
//!   response ([`error::RequestError`]), each keeping its cause;
//! - [`guest`]: the engine and its slots, loading a component, its probe, and running one
//!   request through a fresh instance;
//! - [`cache`]: compiled components on disk, keyed by their bytes and the engine;
//! - [`reload`]: swapping the guest on `SIGHUP` or file change, after its probe;
//! - [`request_body`]: the request body as the guest gets it, read within the limits;
//! - [`request_state`]: what one request's wasm store holds, and what the guest may reach;
//! - [`users`]: the `users` WIT interface, implemented on [`user_store::UserStore`];
//! - [`telemetry`]: the `telemetry` WIT interface: the guest's spans and logs;
//! - [`instrument`]: telemetry set-up, the request span and its names;
//! - [`logs`]: the JSON log line format;
//! - [`server`]: the accept loop and the per-request path (request ids, limits, errors);
//! - [`connections`]: the connection table, and which connection gives way when it is full;
//! - [`stall`]: connections that give up on a client that stops reading;
//! - [`metrics`]: every metric name, and the `/metrics` page;
//! - [`routes`]: the route templates the guest names, a bounded set of labels per guest;
//! - [`responses`]: the one place that builds the host's own responses.
#![warn(missing_docs)]

pub mod bindings;
pub mod cache;
pub mod config;
pub mod connections;
pub mod error;
pub mod guest;
pub mod instrument;
pub mod logs;
pub mod metrics;
pub mod otel_env;
pub mod reload;
pub mod request_body;
pub mod request_state;
pub mod responses;
pub mod routes;
pub mod server;
pub mod stall;
pub mod telemetry;
pub mod user_store;
pub mod users;
