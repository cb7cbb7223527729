//! The `wasi:otel` records as a guest passes them, lifted without copying: every string and list
//! stays in guest memory (its bounds checked) until the host decides to read it, within the
//! request's quotas. The shapes are the proposal's (wit/deps/otel.wit), field for field.

// Every field is part of the shape a guest's value is checked against; the host reads only
// those it keeps.
#![allow(dead_code)]

use wasmtime::component::{ComponentType, Lift, WasmList, WasmStr};

use crate::interfaces::bindings::wasi::otel::metrics::{MetricNumber, Temporality};
use crate::interfaces::bindings::wasi::otel::tracing::{Datetime, SpanKind, TraceFlags};

/// `types.key-value`: the value is JSON text.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireKeyValue {
    pub key: WasmStr,
    pub value: WasmStr,
}

/// `types.resource`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireResource {
    pub attributes: WasmList<WireKeyValue>,
    #[component(name = "schema-url")]
    pub schema_url: Option<WasmStr>,
}

/// `types.instrumentation-scope`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireScope {
    pub name: WasmStr,
    pub version: Option<WasmStr>,
    #[component(name = "schema-url")]
    pub schema_url: Option<WasmStr>,
    pub attributes: WasmList<WireKeyValue>,
}

/// `tracing.span-context`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireSpanContext {
    #[component(name = "trace-id")]
    pub trace_id: WasmStr,
    #[component(name = "span-id")]
    pub span_id: WasmStr,
    #[component(name = "trace-flags")]
    pub trace_flags: TraceFlags,
    #[component(name = "is-remote")]
    pub is_remote: bool,
    #[component(name = "trace-state")]
    pub trace_state: WasmList<(WasmStr, WasmStr)>,
}

/// `tracing.span-data`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireSpanData {
    #[component(name = "span-context")]
    pub span_context: WireSpanContext,
    #[component(name = "parent-span-id")]
    pub parent_span_id: WasmStr,
    #[component(name = "span-kind")]
    pub span_kind: SpanKind,
    pub name: WasmStr,
    #[component(name = "start-time")]
    pub start_time: Datetime,
    #[component(name = "end-time")]
    pub end_time: Datetime,
    pub attributes: WasmList<WireKeyValue>,
    pub events: WasmList<WireEvent>,
    pub links: WasmList<WireLink>,
    pub status: WireStatus,
    #[component(name = "instrumentation-scope")]
    pub instrumentation_scope: WireScope,
    #[component(name = "dropped-attributes")]
    pub dropped_attributes: u32,
    #[component(name = "dropped-events")]
    pub dropped_events: u32,
    #[component(name = "dropped-links")]
    pub dropped_links: u32,
}

/// `tracing.event`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireEvent {
    pub name: WasmStr,
    pub time: Datetime,
    pub attributes: WasmList<WireKeyValue>,
}

/// `tracing.link`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireLink {
    #[component(name = "span-context")]
    pub span_context: WireSpanContext,
    pub attributes: WasmList<WireKeyValue>,
}

/// `tracing.status`.
#[derive(ComponentType, Lift)]
#[component(variant)]
pub enum WireStatus {
    #[component(name = "unset")]
    Unset,
    #[component(name = "ok")]
    Ok,
    #[component(name = "error")]
    Error(WasmStr),
}

/// `logs.log-record`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireLogRecord {
    pub timestamp: Option<Datetime>,
    #[component(name = "observed-timestamp")]
    pub observed_timestamp: Option<Datetime>,
    #[component(name = "severity-text")]
    pub severity_text: Option<WasmStr>,
    #[component(name = "severity-number")]
    pub severity_number: Option<u8>,
    pub body: Option<WasmStr>,
    pub attributes: Option<WasmList<WireKeyValue>>,
    #[component(name = "event-name")]
    pub event_name: Option<WasmStr>,
    #[component(name = "resource")]
    pub resource: Option<WireResource>,
    #[component(name = "instrumentation-scope")]
    pub instrumentation_scope: Option<WireScope>,
    #[component(name = "trace-id")]
    pub trace_id: Option<WasmStr>,
    #[component(name = "span-id")]
    pub span_id: Option<WasmStr>,
    #[component(name = "trace-flags")]
    pub trace_flags: Option<TraceFlags>,
}

/// `metrics.resource-metrics`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireResourceMetrics {
    #[component(name = "resource")]
    pub resource: WireResource,
    #[component(name = "scope-metrics")]
    pub scope_metrics: WasmList<WireScopeMetrics>,
}

/// `metrics.scope-metrics`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireScopeMetrics {
    pub scope: WireScope,
    pub metrics: WasmList<WireMetric>,
}

/// `metrics.metric`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireMetric {
    pub name: WasmStr,
    pub description: WasmStr,
    pub unit: WasmStr,
    pub data: WireMetricData,
}

/// `metrics.metric-data`.
#[derive(ComponentType, Lift)]
#[component(variant)]
pub enum WireMetricData {
    #[component(name = "f64-gauge")]
    F64Gauge(WireGauge),
    #[component(name = "f64-sum")]
    F64Sum(WireSum),
    #[component(name = "f64-histogram")]
    F64Histogram(WireHistogram),
    #[component(name = "f64-exponential-histogram")]
    F64ExponentialHistogram(WireExponentialHistogram),
    #[component(name = "u64-gauge")]
    U64Gauge(WireGauge),
    #[component(name = "u64-sum")]
    U64Sum(WireSum),
    #[component(name = "u64-histogram")]
    U64Histogram(WireHistogram),
    #[component(name = "u64-exponential-histogram")]
    U64ExponentialHistogram(WireExponentialHistogram),
    #[component(name = "s64-gauge")]
    S64Gauge(WireGauge),
    #[component(name = "s64-sum")]
    S64Sum(WireSum),
    #[component(name = "s64-histogram")]
    S64Histogram(WireHistogram),
    #[component(name = "s64-exponential-histogram")]
    S64ExponentialHistogram(WireExponentialHistogram),
}

/// `metrics.gauge`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireGauge {
    #[component(name = "data-points")]
    pub data_points: WasmList<WirePoint>,
    #[component(name = "start-time")]
    pub start_time: Option<Datetime>,
    pub time: Datetime,
}

/// `metrics.gauge-data-point` and `metrics.sum-data-point`, which have the same shape.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WirePoint {
    pub attributes: WasmList<WireKeyValue>,
    pub value: MetricNumber,
    pub exemplars: WasmList<WireExemplar>,
}

/// `metrics.sum`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireSum {
    #[component(name = "data-points")]
    pub data_points: WasmList<WirePoint>,
    #[component(name = "start-time")]
    pub start_time: Datetime,
    pub time: Datetime,
    pub temporality: Temporality,
    #[component(name = "is-monotonic")]
    pub is_monotonic: bool,
}

/// `metrics.histogram`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireHistogram {
    #[component(name = "data-points")]
    pub data_points: WasmList<WireHistogramPoint>,
    #[component(name = "start-time")]
    pub start_time: Datetime,
    pub time: Datetime,
    pub temporality: Temporality,
}

/// `metrics.histogram-data-point`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireHistogramPoint {
    pub attributes: WasmList<WireKeyValue>,
    pub count: u64,
    pub bounds: WasmList<f64>,
    #[component(name = "bucket-counts")]
    pub bucket_counts: WasmList<u64>,
    pub min: Option<MetricNumber>,
    pub max: Option<MetricNumber>,
    pub sum: MetricNumber,
    pub exemplars: WasmList<WireExemplar>,
}

/// `metrics.exponential-histogram`: checked to be well formed, never read further (the host
/// records no exponential histograms).
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireExponentialHistogram {
    #[component(name = "data-points")]
    pub data_points: WasmList<WireExponentialPoint>,
    #[component(name = "start-time")]
    pub start_time: Datetime,
    pub time: Datetime,
    pub temporality: Temporality,
}

/// `metrics.exponential-histogram-data-point`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireExponentialPoint {
    pub attributes: WasmList<WireKeyValue>,
    pub count: u64,
    pub min: Option<MetricNumber>,
    pub max: Option<MetricNumber>,
    pub sum: MetricNumber,
    pub scale: i8,
    #[component(name = "zero-count")]
    pub zero_count: u64,
    #[component(name = "positive-bucket")]
    pub positive_bucket: WireExponentialBucket,
    #[component(name = "negative-bucket")]
    pub negative_bucket: WireExponentialBucket,
    #[component(name = "zero-threshold")]
    pub zero_threshold: f64,
    pub exemplars: WasmList<WireExemplar>,
}

/// `metrics.exponential-bucket`.
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireExponentialBucket {
    pub offset: i32,
    pub counts: WasmList<u64>,
}

/// `metrics.exemplar`: never read (the host keeps no exemplars).
#[derive(ComponentType, Lift)]
#[component(record)]
pub struct WireExemplar {
    #[component(name = "filtered-attributes")]
    pub filtered_attributes: WasmList<WireKeyValue>,
    pub time: Datetime,
    pub value: MetricNumber,
    #[component(name = "span-id")]
    pub span_id: WasmStr,
    #[component(name = "trace-id")]
    pub trace_id: WasmStr,
}
