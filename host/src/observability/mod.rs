//! What the host tells about itself and its guests: spans, log lines and metrics.
//!
//! - [`pipeline`]: installs the log writers and the exporters, flushes them at shutdown;
//! - [`jaeger_agent`]: the exporter of spans to a Jaeger agent, Thrift over UDP;
//! - [`otlp`]: the OTLP exporters of spans, metrics and log records;
//! - [`settings`]: the log and export settings, and the start-up check of the OpenTelemetry SDK's
//!   variables;
//! - [`request_span`]: each request's server span and what its answer records on it, and the
//!   host's spans inside it, built on the OpenTelemetry SDK;
//! - [`request_fields`]: the fields every log line of a request carries, and which request a
//!   thread serves;
//! - [`logs`]: the JSON log line format;
//! - [`log_writer`]: the lines' way to stdout and the log file, batched by one thread;
//! - [`metrics`]: every instrument, and the `/metrics` page;
//! - [`routes`]: the route templates guests name, a bounded set of labels per guest;
//! - [`record`]: what the host learns of each request while serving it (its route, a host
//!   fault, its instance's cost), for its span, log line and metrics.

pub mod jaeger_agent;
pub mod log_writer;
pub mod logs;
pub mod metrics;
pub mod otlp;
pub mod pipeline;
pub mod record;
pub mod request_fields;
pub mod request_span;
pub mod routes;
pub mod settings;
