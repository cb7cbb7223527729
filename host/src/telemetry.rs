//! The `telemetry` WIT interface: the guest's spans and log events become `tracing` spans and
//! events inside the request's server span, so they are exported and logged with its ids.

use opentelemetry::{KeyValue, Value as OtelValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use wasmtime::component::Resource;

use crate::bindings::telemetry::{Attribute, Host, HostSpan, Level, Value};
use crate::request_state::RequestState;

/// The `target` of every log event and span the guest reports.
pub const GUEST_TARGET: &str = "guest";

/// A span the guest opened; it ends when the guest drops its handle.
pub struct GuestSpan {
    // Held only so the span stays open until the guest drops it.
    _span: tracing::Span,
}

impl RequestState {
    /// The innermost span of this request that is still open.
    pub(crate) fn innermost_span(&self) -> &tracing::Span {
        self.open_spans
            .last()
            .map_or(&self.request_span, |(_, span)| span)
    }
}

impl HostSpan for RequestState {
    fn new(
        &mut self,
        name: String,
        attributes: Vec<Attribute>,
    ) -> wasmtime::Result<Resource<GuestSpan>> {
        let span = if self.telemetry_enabled {
            tracing::info_span!(
                target: GUEST_TARGET,
                parent: self.innermost_span(),
                "guest span",
                otel.name = name,
            )
        } else {
            tracing::Span::none()
        };
        for attribute in attributes {
            set_attribute(&span, attribute);
        }
        let handle = self.table.push(GuestSpan {
            _span: span.clone(),
        })?;
        self.open_spans.push((handle.rep(), span));
        Ok(handle)
    }

    fn set_attribute(
        &mut self,
        handle: Resource<GuestSpan>,
        attribute: Attribute,
    ) -> wasmtime::Result<()> {
        if let Some((_, span)) = self.open_spans.iter().find(|(rep, _)| *rep == handle.rep()) {
            set_attribute(span, attribute);
        }
        Ok(())
    }

    fn drop(&mut self, handle: Resource<GuestSpan>) -> wasmtime::Result<()> {
        self.open_spans.retain(|(rep, _)| *rep != handle.rep());
        self.table.delete(handle)?;
        Ok(())
    }
}

impl Host for RequestState {
    fn log(
        &mut self,
        level: Level,
        message: String,
        attributes: Vec<Attribute>,
    ) -> wasmtime::Result<()> {
        if !self.telemetry_enabled {
            return Ok(());
        }
        let fields =
            crate::logs::guest_fields(attributes.into_iter().map(|a| (a.key, json_value(a.value))));
        let _inside = self.innermost_span().enter();
        match level {
            Level::Trace => {
                tracing::trace!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
            Level::Info => {
                tracing::info!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
            Level::Error => {
                tracing::error!(target: GUEST_TARGET, guest_fields = %fields, "{message}")
            }
        }
        Ok(())
    }
}

fn set_attribute(span: &tracing::Span, Attribute { key, value }: Attribute) {
    let value = match value {
        Value::Text(text) => OtelValue::from(text),
        Value::Integer(number) => OtelValue::I64(number),
        Value::Float(number) => OtelValue::F64(number),
        Value::Boolean(flag) => OtelValue::Bool(flag),
    };
    let KeyValue { key, value } = KeyValue::new(key, value);
    span.set_attribute(key, value);
}

fn json_value(value: Value) -> serde_json::Value {
    match value {
        Value::Text(text) => text.into(),
        Value::Integer(number) => number.into(),
        Value::Float(number) => number.into(),
        Value::Boolean(flag) => flag.into(),
    }
}
