//! What the host tells about itself and its guests: spans, log lines and metrics.
//!
//! - [`pipeline`], [`settings`]: installs the log writers and exporters, from their settings;
//! - [`jaeger_agent`], [`otlp`]: the exporters;
//! - [`request_report`]: each request's server span, its log fields and its record (route,
//!   fault, cost), for its span, line and metrics;
//! - [`logs`], [`log_writer`]: the JSON log line, and its way to stdout and the log file;
//! - [`metrics`], [`routes`]: every instrument, and the bounded sets of route and method
//!   labels.

pub mod jaeger_agent;
pub mod log_writer;
pub mod logs;
pub mod metrics;
pub mod otlp;
pub mod pipeline;
pub mod request_report;
pub mod routes;
pub mod settings;
