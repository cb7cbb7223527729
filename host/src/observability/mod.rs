//! What the host tells about itself and its guests: spans, log lines and metrics.
//!
//! - [`pipeline`], [`settings`]: installs the log writers and exporters, from their settings;
//! - [`jaeger_agent`], [`otlp`]: the exporters;
//! - [`request_span`]: each request's server span and its log fields;
//! - [`logs`], [`log_writer`]: the JSON log line, and its way to stdout and the log file;
//! - [`metrics`], [`routes`]: every instrument, and the bounded set of route labels;
//! - [`record`]: what the host learns of a request while serving it, for its span, line and
//!   metrics.

pub mod jaeger_agent;
pub mod log_writer;
pub mod logs;
pub mod metrics;
pub mod otlp;
pub mod pipeline;
pub mod record;
pub mod request_span;
pub mod routes;
pub mod settings;
